"""Calibration of a proposer's per-token confidences on replay traces: predicted against observed acceptance.

    python -m spec_plugins.bench.calibration --traces benchmarks/traces/code_edits/suffix_tree.json,... \\
        [--bins 10] [--json OUT.json] [--png OUT.png]

A trace step records what the proposer drafted, its per-token confidences (P(token k is accepted | the
tokens before it were)) and how many tokens greedy verification accepted. Token k of a draft was *tried*
when every token before it was accepted (k <= accepted, k < drafted) and succeeded when k < accepted, so the
observed conditional acceptance at k is successes / tries: exactly what the confidence predicts.

Reported per trace, per kind of candidate (all; and "copy" / "count" where the trace records `kind`, the
suffix tree's copy drafts and tree drafts) and per draft position bucket: tries, mean predicted, observed,
and the expected calibration error (ECE: |predicted - observed| per confidence bin, weighted by tries), and the
log-loss of the confidences (the mean of -[y log p + (1 - y) log(1 - p)], p clipped to [1e-6, 1 - 1e-6]; lower is
better) beside that of the trace's own acceptance rate at each position (a predictor with no per-step
information; a confidence worth having beats it). Traces replayed with `--accounting mrv2` count filler the
target happened to accept in `accepted`; only drafted tokens are scored, so that does not enter.
The reliability diagram draws observed against predicted per bin (bins of >= 20 tries), for positions 0 and 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from spec_plugins.traces import load_traces

FORMAT = "spec-plugins-calibration/1"
EPS = 1e-6
POSITION_BUCKETS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 1 << 30))
MIN_PLOTTED_TRIES = 20


def tried_tokens(trace: dict) -> dict[str, np.ndarray]:
    """Every tried draft token of a trace: position, confidence, accepted (0/1), kind ("" when unrecorded)."""
    pos, conf, ok, kind = [], [], [], []
    for req in trace["requests"]:
        for s in req["steps"]:
            c = s.get("confidence")
            if not c:
                continue
            tried = min(s["accepted"] + 1, s["drafted"])
            pos.extend(range(tried))
            conf.extend(c[:tried])
            ok.extend([1.0] * min(s["accepted"], tried) + [0.0] * (tried - min(s["accepted"], tried)))
            kind.extend([s.get("kind") or ""] * tried)
    return {"pos": np.array(pos, dtype=np.int64), "conf": np.array(conf, dtype=float),
            "ok": np.array(ok, dtype=float), "kind": np.array(kind, dtype=object)}


def log_loss(p: np.ndarray, ok: np.ndarray) -> float:
    p = np.clip(p, EPS, 1 - EPS)
    return float(-np.mean(np.where(ok > 0, np.log(p), np.log1p(-p))))


def reliability(conf: np.ndarray, ok: np.ndarray, bins: int, base_rate: np.ndarray | None = None) -> dict[str, Any]:
    """Tries, mean predicted, observed rate, ECE over equal-width confidence bins, and log-loss (and, given each
    token's base-rate prediction, its log-loss)."""
    if not len(conf):
        return {"tries": 0, "predicted": None, "observed": None, "ece": None, "log_loss": None,
                "base_rate_log_loss": None, "bins": []}
    which = np.minimum((conf * bins).astype(int), bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        m = which == b
        if m.any():
            p, o = float(conf[m].mean()), float(ok[m].mean())
            table.append({"bin": b, "tries": int(m.sum()), "predicted": p, "observed": o})
            ece += m.sum() * abs(p - o)
    return {"tries": int(len(conf)), "predicted": float(conf.mean()), "observed": float(ok.mean()),
            "ece": ece / len(conf), "log_loss": log_loss(conf, ok),
            "base_rate_log_loss": None if base_rate is None else log_loss(base_rate, ok), "bins": table}


def calibrate(trace: dict, bins: int = 10) -> list[dict[str, Any]]:
    t = tried_tokens(trace)
    # the trace's acceptance rate at each position, as a prediction for each tried token there
    rate = np.array([t["ok"][t["pos"] == j].mean() for j in range(int(t["pos"].max()) + 1)]) if len(t["pos"]) else None
    base = None if rate is None else rate[t["pos"]]
    kinds = ["all"] + sorted(k for k in set(t["kind"].tolist()) if k)
    rows = []
    for kind in kinds:
        in_kind = np.ones(len(t["pos"]), dtype=bool) if kind == "all" else t["kind"] == kind
        for lo, hi in ((0, 1 << 30), *POSITION_BUCKETS):
            m = in_kind & (t["pos"] >= lo) & (t["pos"] <= hi)
            label = "all" if (lo, hi) == (0, 1 << 30) else (str(lo) if lo == hi else f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+")
            rows.append({"workload": trace.get("workload", "?"), "proposer": trace.get("proposer", "?"), "kind": kind,
                         "positions": label,
                         **reliability(t["conf"][m], t["ok"][m], bins, None if base is None else base[m])})
    return rows


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    several = len({r["proposer"] for r in rows}) > 1

    def who(r: dict) -> str:  # the proposer, where traces of several are drawn together
        return f"{r['proposer']}: " if several else ""

    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for r in rows:
            if r["workload"] != w or r["positions"] not in ("0", "1") or not r["bins"]:
                continue
            shown = [b for b in r["bins"] if b["tries"] >= MIN_PLOTTED_TRIES]  # a sparse bin is noise
            ax.plot([b["predicted"] for b in shown], [b["observed"] for b in shown],
                    "o-" if r["positions"] == "0" else "s--", label=f"{who(r)}{r['kind']}, position {r['positions']} "
                    f"(ECE {r['ece']:.3f})", ms=3)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8)
        ax.set_title(w)
        ax.set_xlabel("predicted (confidence)")
        ax.set_ylabel("observed acceptance")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True, help="comma-separated replay trace files (with confidences)")
    ap.add_argument("--bins", type=int, default=10)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    err = Console(stderr=True, soft_wrap=True)
    try:
        if args.bins < 1:
            raise ValueError(f"--bins: expected >= 1, got {args.bins}")
        traces = load_traces([p for p in args.traces.split(",") if p.strip()])
        rows = [r for t in traces for r in calibrate(t, args.bins)]
        if not any(r["tries"] for r in rows):
            raise ValueError("--traces: no step carries confidences (replay a proposer that gives them)")
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    t = Table(title="per-token confidence against observed conditional acceptance")
    for col in ("workload", "proposer", "kind", "positions", "tries", "predicted", "observed", "ECE", "log-loss",
                "base-rate log-loss"):
        t.add_column(col, justify="right")
    for r in rows:
        if r["tries"]:
            t.add_row(r["workload"], r["proposer"], r["kind"], r["positions"], str(r["tries"]), f"{r['predicted']:.3f}",
                      f"{r['observed']:.3f}", f"{r['ece']:.3f}", f"{r['log_loss']:.4f}", f"{r['base_rate_log_loss']:.4f}")
    Console(width=170).print(t)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(sys.argv), "rows": rows}, indent=1))
    if args.png:
        plot(args.png, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
