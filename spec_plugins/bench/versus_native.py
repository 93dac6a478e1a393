"""Ours against vLLM's own methods in the policy simulator, as vLLM 0.33 runs each on a GPU, per workload and batch.

    python -m spec_plugins.bench.versus_native --hardware h200 --model-config configs/models/llama-3.1-8b.json \\
        [--traces-dir benchmarks/traces] [--workloads code_edits,spec_bench_smollm2,code_completion] \\
        [--batch-sizes 1,16,64,256] [--runners gpu|v1] [--json OUT.json]

Per workload the replay traces `DIR/<workload>/<proposer>.json` (`python -m spec_plugins.bench.replay
--proposers suffix_tree,arctic,vllm_ngram --trace-out DIR`) are simulated at every batch size on the same
steps (`policy_sim`): ours (`--ours`, the suffix tree by default) with the adaptive policy (its defaults, or
`--policy-options`) and at its best static draft length, against vLLM's methods each at its own best static
draft length, the most a user can get from them.

`--runners gpu` (the default): each method as vLLM 0.33 runs it on a GPU.

* no speculation and vLLM `ngram`: Model Runner V2 with async scheduling, which hides the engine's per-step
  host work behind the GPU step, and runs `ngram` as a GPU kernel: charged the modelled step alone (the
  kernel's own GPU time is charged nothing, which favours `ngram`);
* vLLM `suffix` (ArcticInference) and ours (`custom_class`): the V1 runner with synchronous scheduling, where
  the engine's host time per step (`--engine-host-time`, measured by `engine_host_time`) and the proposer's own
  measured host time (`--host-time`) add to every step.

It also reports ours with the engine's host time hidden (its own drafting time still paid): what a Model
Runner V2 path with async scheduling for our proposers would recover. `--runners v1`: every method on the V1
runner, charged its own drafting host time only (the comparison before vLLM 0.33).

Reported per workload and batch: ours adaptive / the best native, ours best static / the best native.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spec_plugins.bench.policy_sim import (add_cost_arguments, build_cost, build_engine_host_time, build_host_time,
                                           parse_policy_options, run)
from spec_plugins.traces import load_traces

FORMAT = "spec-plugins-versus-native/2"
NATIVES = ("arctic", "vllm_ngram")
WORKLOADS = "code_edits,spec_bench_smollm2,code_completion"
# What each compared method is called in the tables, by runner set.
LABELS = {"gpu": {"none": "none (MRV2 async)", "vllm_ngram": "vLLM ngram (MRV2 async)", "arctic": "vLLM suffix (V1)"},
          "v1": {"none": "none (V1)", "vllm_ngram": "vLLM ngram (V1)", "arctic": "vLLM suffix (V1)"}}


def best_static(goodput: dict[str, list[float]], i: int, least: int = 0) -> tuple[str, float]:
    name = max((n for n in goodput if n.startswith("static_") and int(n.removeprefix("static_")) >= least),
               key=lambda n: goodput[n][i])
    return name.removeprefix("static_"), goodput[name][i]


def compare(args, cost, workload: str, batch_sizes: list[int], policy_options: dict[str, Any],
            progress=None, engine: Any = None) -> list[dict[str, Any]]:
    """engine: the V1 runner's host time per step (an EngineHostTime; None: --runners v1)."""
    def simulate(proposer: str, static_only: bool, own_host: bool, engine_host: Any) -> dict[str, list[float]]:
        traces = load_traces([str(args.traces_dir / workload / f"{proposer}.json")])
        host = build_host_time(args, traces) if own_host else None
        max_draft = max(int(t["max_draft"]) for t in traces)
        out = run(traces, cost, batch_sizes, max_draft, args.steps, args.seed, host=host, static_only=static_only,
                  policy_options=policy_options, engine=engine_host)
        if progress:
            progress()
        return out["goodput"]

    gpu = engine is not None
    ours = simulate(args.ours, False, True, engine)
    arctic = simulate("arctic", True, True, engine)
    # On MRV2 with async scheduling nothing on the host is charged: n-gram drafting is a GPU kernel there.
    ngram = simulate("vllm_ngram", True, not gpu, None)
    ours_hidden = simulate(args.ours, False, True, None) if gpu else None
    labels = LABELS["gpu" if gpu else "v1"]
    rows = []
    for i, b in enumerate(batch_sizes):
        d_ours, g_ours = best_static(ours, i)
        candidates = {"none": ("0", ngram["static_0"][i]), "vllm_ngram": best_static(ngram, i, least=1),
                      "arctic": best_static(arctic, i, least=1)}
        native, (d_native, g_native) = max(candidates.items(), key=lambda kv: kv[1][1])
        row = {"workload": workload, "batch": b, "ours_adaptive": ours["adaptive"][i],
               "ours_best_static": g_ours, "ours_best_static_d": int(d_ours),
               **{f"{n}_best": g for n, (_, g) in candidates.items()},
               **{f"{n}_best_d": int(d) for n, (d, _) in candidates.items()},
               "best_native": labels[native], "best_native_d": int(d_native),
               "adaptive_vs_native": ours["adaptive"][i] / g_native, "static_vs_native": g_ours / g_native}
        if ours_hidden is not None:
            row["adaptive_engine_host_hidden_vs_native"] = ours_hidden["adaptive"][i] / g_native
        rows.append(row)
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
    ap.add_argument("--runners", default="gpu", choices=["gpu", "v1"],
                    help="gpu: each method on the runner vLLM 0.33 gives it on a GPU (no speculation and ngram on Model "
                         "Runner V2 with async scheduling, suffix and ours on V1, paying the engine's host time); v1: "
                         "every method on V1, charged its drafting host time only")
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
        engine = build_engine_host_time(args) if args.runners == "gpu" else None
        if args.runners == "gpu" and engine is None:
            raise ValueError("--engine-host-time: --runners gpu charges the V1 runner's host time; give a measurement "
                             "(or --runners v1)")
        with Progress(console=err, transient=True) as prog:
            task = prog.add_task("simulating", total=len(workloads) * (3 + (args.runners == "gpu")))
            rows = [r for w in workloads
                    for r in compare(args, cost, w, batch_sizes, policy_options, lambda: prog.advance(task), engine)]
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    hidden = args.runners == "gpu"
    where = ("each as vLLM 0.33 runs it on a GPU" if hidden else "every method on the V1 runner")
    t = Table(title=f"ours ({args.ours}) / the best of no speculation and vLLM's ngram and suffix at their best static "
                    f"K, {where}; modelled goodput")
    cols = ["workload", "batch", "best native (K)", "ours static (K)", "ours adaptive / native", "ours static / native"]
    for col in cols + (["engine host hidden"] if hidden else []):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["workload"], str(r["batch"]), f"{r['best_native']} ({r['best_native_d']})",
                  str(r["ours_best_static_d"]), f"{r['adaptive_vs_native']:.3f}x", f"{r['static_vs_native']:.3f}x",
                  *([f"{r['adaptive_engine_host_hidden_vs_native']:.3f}x"] if hidden else []))
    Console(width=170).print(t)
    worst = min(rows, key=lambda r: r["adaptive_vs_native"])
    Console().print(f"worst ours adaptive / native: {worst['adaptive_vs_native']:.3f}x ({worst['workload']}, batch "
                    f"{worst['batch']}); drafting host time: {args.host_time}; engine host time: "
                    f"{engine.source if engine is not None else 'not charged'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(sys.argv), "runners": args.runners,
                                         "engine_host_time": None if engine is None else engine.source,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
