"""Ours against vLLM's own model-free methods in the policy simulator, per workload and batch size.

    python -m spec_plugins.bench.versus_native --hardware h200 --model-config configs/models/llama-3.1-8b.json \\
        [--traces-dir benchmarks/traces] [--workloads code_edits,spec_bench_smollm2,code_completion] \\
        [--batch-sizes 1,16,64,256] [--host-time none] [--json OUT.json]

Per workload the replay traces `DIR/<workload>/<proposer>.json` (`python -m spec_plugins.bench.replay
--proposers suffix_tree,arctic,vllm_ngram --trace-out DIR`) are simulated at every batch size on the same
steps (`policy_sim`): ours (`--ours`, the suffix tree by default) with the adaptive policy and at its best
static draft length, against vLLM's `suffix` method (ArcticInference, trace `arctic`) and its `ngram` method
(`vllm_ngram`) each at its own best static draft length, the most a user can get from them. Every proposer is
charged its own measured host time per step (`--host-time`, as in `policy_sim`).

Reported per workload and batch: ours adaptive / the better native, ours best static / the better native.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spec_plugins.bench.policy_sim import add_cost_arguments, build_cost, build_host_time, parse_policy_options, run
from spec_plugins.traces import load_traces

FORMAT = "spec-plugins-versus-native/1"
NATIVES = ("arctic", "vllm_ngram")
WORKLOADS = "code_edits,spec_bench_smollm2,code_completion"


def best_static(goodput: dict[str, list[float]], i: int) -> tuple[str, float]:
    name = max((n for n in goodput if n.startswith("static_")), key=lambda n: goodput[n][i])
    return name.removeprefix("static_"), goodput[name][i]


def compare(args, cost, workload: str, batch_sizes: list[int], policy_options: dict[str, Any],
            progress=None) -> list[dict[str, Any]]:
    def simulate(proposer: str, static_only: bool) -> dict[str, list[float]]:
        traces = load_traces([str(args.traces_dir / workload / f"{proposer}.json")])
        host = build_host_time(args, traces)
        max_draft = max(int(t["max_draft"]) for t in traces)
        out = run(traces, cost, batch_sizes, max_draft, args.steps, args.seed, host=host, static_only=static_only,
                  policy_options=policy_options)
        if progress:
            progress()
        return out["goodput"]

    ours = simulate(args.ours, static_only=False)
    natives = {n: simulate(n, static_only=True) for n in NATIVES}
    rows = []
    for i, b in enumerate(batch_sizes):
        d_ours, g_ours = best_static(ours, i)
        best = {n: best_static(g, i) for n, g in natives.items()}
        native, (d_native, g_native) = max(best.items(), key=lambda kv: kv[1][1])
        rows.append({"workload": workload, "batch": b, "ours_adaptive": ours["adaptive"][i],
                     "ours_best_static": g_ours, "ours_best_static_d": int(d_ours),
                     **{f"{n}_best_static": g for n, (_, g) in best.items()},
                     **{f"{n}_best_static_d": int(d) for n, (d, _) in best.items()},
                     "best_native": native, "best_native_d": int(d_native),
                     "adaptive_vs_native": ours["adaptive"][i] / g_native,
                     "static_vs_native": g_ours / g_native})
    return rows


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.versus_native", description=__doc__.split("\n")[0])
    add_cost_arguments(ap)
    ap.add_argument("--traces-dir", type=Path, default=Path("benchmarks/traces"))
    ap.add_argument("--workloads", default=WORKLOADS)
    ap.add_argument("--ours", default="suffix_tree", choices=["suffix_tree", "ngram"])
    ap.add_argument("--batch-sizes", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=300, help="simulated engine steps per batch size, at least (the "
                    "simulation goes on until every request of the workload has run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy-options", help="our adaptive policy's options, a JSON object (default: its defaults)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    err = Console(stderr=True, soft_wrap=True)
    try:
        batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"--batch-sizes: expected positive integers, got {args.batch_sizes!r}")
        workloads = [w for w in args.workloads.split(",") if w.strip()]
        for w in workloads:
            for p in (args.ours, *NATIVES):
                if not (args.traces_dir / w / f"{p}.json").is_file():
                    raise ValueError(f"--traces-dir: no trace {args.traces_dir / w / (p + '.json')} (write it with "
                                     f"python -m spec_plugins.bench.replay --proposers {args.ours},arctic,vllm_ngram "
                                     f"--trace-out {args.traces_dir})")
        cost = build_cost(args)
        policy_options = parse_policy_options(args.policy_options)
        with Progress(console=err, transient=True) as prog:
            task = prog.add_task("simulating", total=len(workloads) * (1 + len(NATIVES)))
            rows = [r for w in workloads
                    for r in compare(args, cost, w, batch_sizes, policy_options, lambda: prog.advance(task))]
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    t = Table(title=f"ours ({args.ours}) / the better of vLLM's suffix and ngram at their best static K, modelled goodput")
    for col in ("workload", "batch", "best native (K)", "ours static (K)", "ours adaptive / native", "ours static / native"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["workload"], str(r["batch"]), f"{r['best_native']} ({r['best_native_d']})",
                  str(r["ours_best_static_d"]), f"{r['adaptive_vs_native']:.3f}x", f"{r['static_vs_native']:.3f}x")
    Console(width=150).print(t)
    worst = min(rows, key=lambda r: r["adaptive_vs_native"])
    Console().print(f"worst ours adaptive / native: {worst['adaptive_vs_native']:.3f}x ({worst['workload']}, batch "
                    f"{worst['batch']}); host time: {args.host_time}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
