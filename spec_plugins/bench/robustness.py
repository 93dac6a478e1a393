"""The adaptive draft-length policy against the best static K on workloads it was not tuned on: a robustness grid.

    python -m spec_plugins.bench.robustness --json benchmarks/robustness/grid.json --png benchmarks/robustness/grid.png

Every cell is one (workload, cost model, cap on K, batch size): the simulator (`spec_plugins.bench.policy_sim`) runs
the suffix tree's replay trace of the workload through every static K up to the cap, the adaptive policy with that
cap, and hindsight, with the drafting host time and the engine's own host time charged as `policy_sim` charges
them by default. Reported per cell: adaptive / best static K, and the share of hindsight's headroom over the best
static K the adaptive policy captured. The worst cell is named, the median over all cells given.

Workloads (`WORKLOADS`): the project's replay workloads, and subsets of them by row source where one file mixes
prompts of different shapes (Spec-Bench's long-context tasks, summarization and RAG, apart from its short ones).
Traces are replayed when missing (`--traces-dir`, one folder per cap: `k8/`, `k16/`, as `bench.replay
--trace-out` writes them), so one command runs the grid from the workloads alone.

Cost models (`COST_MODELS`): the measured H200 profile of a Llama-3.1-8B-shaped stack, and the H200 roofline with
the Llama-3.1-8B config. `--mrv2` runs the MRV2 form instead: every slot verified, the policy's confidences handed
to vLLM 0.34's adaptive verification (`policy_sim.AdaptiveVerification`), against static K with every slot verified.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FORMAT = "spec-plugins-robustness/1"
WORKLOAD_DIR = ROOT / "benchmarks" / "workloads"


@dataclass(frozen=True)
class GridWorkload:
    name: str
    file: str                                   # under benchmarks/workloads/
    groups: tuple[str, ...] = ()                # keep rows whose source.group is one of these (none: all rows)
    what: str = ""


WORKLOADS = (
    GridWorkload("code_edits", "code_edits.jsonl", what="PyPI releases of 12 packages (the policy's tuning set)"),
    GridWorkload("history_edits", "history_edits.jsonl", what="single commits of six other repositories"),
    GridWorkload("agentic_edits", "agentic_edits.jsonl", what="tool-calling sessions on those repositories"),
    GridWorkload("chat_long_context", "spec_bench_smollm2.jsonl", ("summarization", "rag"),
                 "Spec-Bench summarization and RAG, SmolLM2's answers (long prompts)"),
    GridWorkload("chat_short_context", "spec_bench_smollm2.jsonl", ("mt_bench", "translation", "qa", "math_reasoning"),
                 "Spec-Bench MT-bench, translation, QA, math, SmolLM2's answers (short prompts)"),
    GridWorkload("code_completion", "code_completion.jsonl", what="standard-library functions, SmolLM2's completions"),
    GridWorkload("e2e_mix", "e2e_mix.jsonl", what="the end-to-end runs' prompts, SmolLM2's 128-token answers"),
    GridWorkload("agentic_smollm2", "agentic_smollm2.jsonl",
                 what="agentic conversations, SmolLM2's own 128-token continuations"),
)
COST_MODELS = {
    "h200_profile": {"profile": str(ROOT / "benchmarks" / "profiles" / "h200-llama-3.1-8b-stack.json")},
    "h200_roofline": {"hardware": "h200", "model_config": str(ROOT / "configs" / "models" / "llama-3.1-8b.json")},
}


def workload_rows(w: GridWorkload) -> list[str]:
    """The JSONL lines of a grid workload (its file's rows, filtered by source group)."""
    path = WORKLOAD_DIR / w.file
    if not path.is_file():
        raise ValueError(f"workload {w.name}: no {path} (build it with python benchmarks/build_workloads.py)")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if w.groups:
        lines = [line for line in lines if json.loads(line).get("source", {}).get("group") in w.groups]
    if not lines:
        raise ValueError(f"workload {w.name}: no rows of groups {list(w.groups)} in {path}")
    return lines


def ensure_traces(w: GridWorkload, cap: int, traces_dir: Path, proposer: str, accounting: str,
                  tokenizer: str | None) -> Path:
    """The workload's replay trace at this cap, replayed now if missing."""
    out = traces_dir / f"k{cap}" / w.name / f"{proposer}.json"
    if out.is_file():
        return out
    from spec_plugins.bench import replay

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{w.name}.jsonl"
        path.write_text("\n".join(workload_rows(w)) + "\n")
        rows = replay.load_workload(path, replay.TextTokenizer(tokenizer))
        res = replay.run_workload(w.name, f"benchmarks/workloads/{w.file}", rows, [proposer], {}, cap,
                                  fill=accounting == "mrv2")
    replay.write_traces(traces_dir / f"k{cap}", res, {proposer: replay.effective_options(proposer, {})}, cap,
                        accounting)
    return out


def cost_args(model: dict[str, str]) -> argparse.Namespace:
    """The arguments policy_sim's builders read, for one cost model (host times: policy_sim's defaults)."""
    return argparse.Namespace(profile=model.get("profile"), hardware=model.get("hardware"),
                              model_config=model.get("model_config"), dtype="bf16", draft_us=5.0,
                              host_time="default", engine_host_time="default", host_growth="default")


def run_cell_rows(trace: dict, cost: Any, host: Any, engine: Any, batch_sizes: list[int], cap: int, steps: int,
                  seed: int, mrv2: bool) -> list[dict]:
    """adaptive / best static K (and hindsight, headroom captured) at every batch size for one trace."""
    from spec_plugins.bench import policy_sim

    if mrv2:
        return mrv2_rows(trace, cost, host, batch_sizes, cap, steps, seed)
    result = policy_sim.run([trace], cost, batch_sizes, cap, steps, seed, host=host, engine=engine)
    return policy_sim.summarize(batch_sizes, result["goodput"], cap)["rows"]


def mrv2_rows(trace: dict, cost: Any, host: Any, batch_sizes: list[int], cap: int, steps: int,
              seed: int) -> list[dict]:
    """The MRV2 form: every slot verified. Static K against vLLM 0.34's adaptive verification fed the adaptive
    policy's calibrated confidences (`adaptive`, the policy's MRV2 form) and fed the suffix tree's own confidences
    (`av`, the fixed policy with AV: the configuration the docs advise on 0.34), and hindsight (exactly the
    accepted tokens verified)."""
    from spec_plugins.bench import policy_sim
    from spec_plugins.policy.adaptive import AdaptiveLength

    requests = policy_sim.trace_requests([trace])
    rows = []
    for b in batch_sizes:
        sched = policy_sim.batch_schedule(requests, b, steps, seed)
        policies: dict[str, Any] = {f"static_{d}": policy_sim.VerifiesSlots(d) for d in range(cap + 1)}
        policies["adaptive"] = policy_sim.AdaptiveVerification(cap, cost, policy=AdaptiveLength(cost=cost))
        policies["av"] = policy_sim.AdaptiveVerification(cap, cost)
        policies["hindsight"] = lambda dr, ac: ac
        res = policy_sim.simulate(requests, sched, cost, policies, host, None)
        statics = {k: v for k, v in res.items() if k.startswith("static_")}
        best_name = max(statics, key=statics.get)
        best, ada, hind = statics[best_name], res["adaptive"], res["hindsight"]
        rows.append({"batch": b, "best_static": best_name, "best_static_goodput": best, "adaptive": ada,
                     "av": res["av"], "hindsight": hind, "adaptive_vs_best_static": ada / best,
                     "av_vs_best_static": res["av"] / best, "hindsight_vs_best_static": hind / best,
                     "headroom_captured": (ada - best) / (hind - best) if hind > best else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.robustness", description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS),
                    help="comma-separated grid workloads (default: all of " + ", ".join(w.name for w in WORKLOADS) + ")")
    ap.add_argument("--cost-models", default=",".join(COST_MODELS), help="comma-separated: " + ", ".join(COST_MODELS))
    ap.add_argument("--caps", default="8,16", help="caps on K (comma-separated)")
    ap.add_argument("--batch-sizes", default="1,4,16,64,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--proposer", default="suffix_tree")
    ap.add_argument("--mrv2", action="store_true", help="the MRV2 form: every slot verified, adaptive verification")
    ap.add_argument("--traces-dir", type=Path, default=ROOT / "benchmarks" / "traces-grid")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress

    err = Console(stderr=True, soft_wrap=True)
    try:
        by_name = {w.name: w for w in WORKLOADS}
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        bad = [n for n in names if n not in by_name]
        if bad:
            raise ValueError(f"--workloads: unknown {bad[0]!r}; expected some of {', '.join(by_name)}")
        models = [m.strip() for m in args.cost_models.split(",") if m.strip()]
        bad = [m for m in models if m not in COST_MODELS]
        if bad:
            raise ValueError(f"--cost-models: unknown {bad[0]!r}; expected some of {', '.join(COST_MODELS)}")
        caps = [int(c) for c in args.caps.split(",") if c.strip()]
        batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        if not caps or min(caps) < 1 or not batch_sizes or min(batch_sizes) < 1:
            raise ValueError("--caps / --batch-sizes: expected positive integers")
        from spec_plugins.bench import policy_sim
        from spec_plugins.traces import load_traces

        accounting = "mrv2" if args.mrv2 else "drafted"
        traces_dir = args.traces_dir / ("mrv2" if args.mrv2 else "v1")
        cells = []
        with Progress(console=err, transient=True) as prog:
            task = prog.add_task("replaying", total=len(names) * len(caps))
            traces = {}
            for n in names:
                for cap in caps:
                    path = ensure_traces(by_name[n], cap, traces_dir, args.proposer, accounting, args.tokenizer)
                    traces[n, cap] = load_traces([path])[0]
                    prog.advance(task)
            task = prog.add_task("simulating", total=len(names) * len(caps) * len(models))
            for m in models:
                cargs = cost_args(COST_MODELS[m])
                cost = policy_sim.build_cost(cargs)
                engine = None if args.mrv2 else policy_sim.build_engine_host_time(cargs)
                for n in names:
                    host = policy_sim.build_host_time(cargs, [traces[n, caps[0]]])
                    if args.mrv2:
                        from spec_plugins.bench.host_time import Mrv2HostTime

                        host = Mrv2HostTime.load(host)
                    for cap in caps:
                        for r in run_cell_rows(traces[n, cap], cost, host, engine, batch_sizes, cap, args.steps,
                                               args.seed, args.mrv2):
                            cells.append({"workload": n, "cost_model": m, "cap": cap, **r})
                        prog.advance(task)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    summary = summarize(cells)
    print_grid(cells, summary, names, models, caps, batch_sizes, args.mrv2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(["python -m spec_plugins.bench.robustness",
                                                                                *sys.argv[1:]]),
                                         "mrv2": args.mrv2, "workloads": {n: by_name[n].what for n in names},
                                         "summary": summary, "cells": cells}, indent=1) + "\n")
    if args.png:
        plot(args.png, cells, names, models, caps, batch_sizes, args.mrv2)
    return 0


def summarize(cells: list[dict]) -> dict[str, Any]:
    ratios = [c["adaptive_vs_best_static"] for c in cells]
    worst = min(cells, key=lambda c: c["adaptive_vs_best_static"])
    captured = [c["headroom_captured"] for c in cells
                if c["headroom_captured"] is not None and c["hindsight_vs_best_static"] > 1.05]
    return {"cells": len(cells), "median": statistics.median(ratios), "worst": worst["adaptive_vs_best_static"],
            "worst_cell": {k: worst[k] for k in ("workload", "cost_model", "cap", "batch", "best_static")},
            "below_0_99": int(sum(r < 0.99 for r in ratios)),
            "mean_headroom_captured": statistics.mean(captured) if captured else None,
            "cells_with_headroom_over_5pct": len(captured)}


def print_grid(cells, summary, names, models, caps, batch_sizes, mrv2: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    for m in models:
        t = Table(title=f"adaptive / best static K, {m}" + (" (MRV2: every slot verified, adaptive verification)"
                                                             if mrv2 else "") + "; bold: below 0.99x")
        t.add_column("workload")
        for cap in caps:
            for b in batch_sizes:
                t.add_column(f"K≤{cap} B={b}", justify="right")
        for n in names:
            row = []
            for cap in caps:
                for b in batch_sizes:
                    c = next(c for c in cells if (c["workload"], c["cost_model"], c["cap"], c["batch"]) == (n, m, cap, b))
                    v = c["adaptive_vs_best_static"]
                    row.append(f"[bold red]{v:.3f}[/]" if v < 0.99 else f"{v:.3f}")
            t.add_row(n, *row)
        con.print(t)
    w = summary["worst_cell"]
    cap_text = "-" if summary["mean_headroom_captured"] is None else f"{100 * summary['mean_headroom_captured']:.0f}%"
    con.print(f"{summary['cells']} cells: median {summary['median']:.3f}x, worst {summary['worst']:.3f}x "
              f"({w['workload']}, {w['cost_model']}, K≤{w['cap']}, B={w['batch']}, best static {w['best_static']}), "
              f"{summary['below_0_99']} below 0.99x; hindsight headroom captured {cap_text} "
              f"(mean over the {summary['cells_with_headroom_over_5pct']} cells with >5% headroom)")


def plot(path: Path, cells, names, models, caps, batch_sizes, mrv2: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cols = [(cap, b) for cap in caps for b in batch_sizes]
    fig, axes = plt.subplots(1, len(models), figsize=(1.0 + 0.55 * len(cols) * len(models), 0.45 * len(names) + 1.6),
                             squeeze=False)
    for ax, m in zip(axes[0], models):
        grid = np.array([[next(c["adaptive_vs_best_static"] for c in cells
                               if (c["workload"], c["cost_model"], c["cap"], c["batch"]) == (n, m, cap, b))
                          for cap, b in cols] for n in names])
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0.95, vmax=1.15, aspect="auto")
        for i in range(len(names)):
            for j in range(len(cols)):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        fontweight="bold" if grid[i, j] < 0.99 else "normal")
        ax.set_xticks(range(len(cols)), [f"K≤{cap}\nB={b}" for cap, b in cols], fontsize=7)
        ax.set_yticks(range(len(names)), names if ax is axes[0][0] else [""] * len(names), fontsize=8)
        ax.set_title(m + (" (MRV2)" if mrv2 else ""), fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="adaptive / best static K")
    fig.suptitle("The adaptive policy against the best static K, every cell (bold: below 0.99x)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
