"""How far a drafter's per-position confidences can be trusted: log-loss and calibration on replay traces.

    python -m spec_plugins.bench.confidence_quality --traces-dir benchmarks/traces-mrv2 \\
        --proposers suffix_tree,vllm034_suffix_np [--workloads code_edits,...] [--json OUT.json] [--png OUT.png]

A confidence is a conditional estimate: position j of a draft is accepted given that positions 0..j-1 were
(`core.Draft.confidence`, and what vLLM's adaptive verification multiplies into survival). So position j is
*tried* at a step when every earlier drafted token was accepted, and its outcome is whether it was accepted too:
tried where j <= accepted and j < drafted. Reported per proposer and workload, over the tried positions of every
step of its own replay trace (each proposer is judged on its own drafts):

* `log_loss`: the mean of -[y log p + (1 - y) log(1 - p)], p clipped to [1e-6, 1 - 1e-6]; lower is better.
  `log_loss_by_position`: the same per position j.
* `base_rate_log_loss`: the log-loss of always predicting the trace's own acceptance rate at that position (a
  predictor with no per-step information); a confidence worth having beats it.
* `calibration`: per tenth of p, the mean predicted and the realised acceptance, and the count.

Traces replayed with `--accounting mrv2` count filler the target happened to accept in `accepted`; only drafted
positions are scored, so that does not enter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from spec_plugins.traces import load_traces

FORMAT = "spec-plugins-confidence-quality/1"
EPS = 1e-6


def tried_positions(trace: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, confidence, accepted?) of every tried drafted position of every step of `trace`."""
    pos, conf, hit = [], [], []
    for req in trace["requests"]:
        for s in req["steps"]:
            c = s.get("confidence")
            if not c or not s["drafted"]:
                continue
            n = min(s["drafted"], s["accepted"] + 1, len(c))
            pos.extend(range(n))
            conf.extend(c[:n])
            hit.extend(j < s["accepted"] for j in range(n))
    return np.asarray(pos, dtype=np.int64), np.asarray(conf, dtype=np.float64), np.asarray(hit, dtype=bool)


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, EPS, 1 - EPS)
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p)))) if len(p) else float("nan")


def quality(trace: dict) -> dict[str, Any]:
    pos, conf, hit = tried_positions(trace)
    if not len(pos):
        raise ValueError(f"trace of {trace.get('proposer')!r} on {trace.get('workload')!r}: no confidences (replay "
                         "a proposer that gives them; vllm034_suffix_np with adaptive_verification: true)")
    width = int(pos.max()) + 1
    rate = np.array([hit[pos == j].mean() for j in range(width)])
    bins = np.minimum((conf * 10).astype(int), 9)
    return {
        "tried": int(len(pos)),
        "acceptance": round(float(hit.mean()), 4),
        "log_loss": round(log_loss(conf, hit), 4),
        "base_rate_log_loss": round(log_loss(rate[pos], hit), 4),
        "log_loss_by_position": [round(log_loss(conf[pos == j], hit[pos == j]), 4) for j in range(width)],
        "calibration": [{"bin": b / 10, "predicted": round(float(conf[bins == b].mean()), 4),
                         "realised": round(float(hit[bins == b].mean()), 4), "count": int((bins == b).sum())}
                        for b in range(10) if (bins == b).any()],
    }


def plot(path: Path, results: dict[str, dict[str, dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 4), squeeze=False)
    for ax, (workload, by_proposer) in zip(axes[0], results.items()):
        ax.plot([0, 1], [0, 1], color="0.7", lw=1)
        for name, q in by_proposer.items():
            cal = q["calibration"]
            ax.plot([c["predicted"] for c in cal], [c["realised"] for c in cal], marker="o", label=name)
        ax.set(title=workload, xlabel="predicted acceptance", ylabel="realised", xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.confidence_quality", description=__doc__.split("\n")[0])
    ap.add_argument("--traces-dir", type=Path, default=Path("benchmarks/traces-mrv2"))
    ap.add_argument("--proposers", default="suffix_tree,vllm034_suffix_np")
    ap.add_argument("--workloads", default="code_edits,spec_bench_smollm2,code_completion")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    err = Console(stderr=True)
    results: dict[str, dict[str, dict]] = {}
    try:
        for w in [w for w in args.workloads.split(",") if w.strip()]:
            for p in [p for p in args.proposers.split(",") if p.strip()]:
                path = args.traces_dir / w / f"{p}.json"
                if not path.is_file():
                    raise ValueError(f"--traces-dir: no trace {path} (python -m spec_plugins.bench.replay --proposers "
                                     f"{p} --trace-out {args.traces_dir})")
                results.setdefault(w, {})[p] = quality(load_traces([str(path)])[0])
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    t = Table(title="confidences against outcomes, per drafted position tried (lower log-loss is better)")
    for col in ("workload", "proposer", "tried", "acceptance", "log-loss", "base-rate log-loss", "by position 0-3"):
        t.add_column(col, justify="right")
    for w, by_proposer in results.items():
        for p, q in by_proposer.items():
            t.add_row(w, p, str(q["tried"]), f"{q['acceptance']:.3f}", f"{q['log_loss']:.4f}",
                      f"{q['base_rate_log_loss']:.4f}", " ".join(f"{v:.3f}" for v in q["log_loss_by_position"][:4]))
    Console(width=160).print(t)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(sys.argv), "results": results}, indent=1))
    if args.png:
        plot(args.png, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
