"""One prompt at a time on warm engines: where a concurrency-1 run's time goes, prompt by prompt.

    python benchmarks/per_prompt.py --workload benchmarks/workloads/code_completion.jsonl \
        --workload benchmarks/workloads/history_edits.jsonl --spec-bench PATH/TO/spec_bench/question.jsonl \
        --prompts 6 --native ngram --native-k 8 --json OUT.json

The first `--prompts` of the interleaved mix (the prompts `spec_plugins.bench.policy_e2e` runs at concurrency 1 with
the same files) go one by one to each engine in turn: no speculation, ours (suffix tree + adaptive, K <= 16, no
options) with its step trace on, and vLLM's native methods. Per prompt and engine: the prefill (the engine's first
step), the decode (the other steps), drafts, drafted and accepted tokens. For ours, from its trace: per drafted
length, how many steps drafted it, the tokens accepted a draft and the median step interval, and the policy's
fitted step time (`policy_stats`). One round only: a suffix tree remembers the answers it saw, so the same prompts
again on the same engines are no measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", required=True, help="replay workload JSONL(s)")
    ap.add_argument("--spec-bench", help="also the first-turn prompts of a Spec-Bench question.jsonl")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--native", default="ngram", help="vLLM's own methods (comma-separated: ngram, suffix)")
    ap.add_argument("--native-k", default="8")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json")
    args = ap.parse_args()

    from spec_plugins.bench.policy_e2e import configurations, warm_prompts
    from spec_plugins.bench.prompts import interleaved, spec_bench, workload_prompts
    from spec_plugins.bench.vllm_run import Engine, EngineRun
    from spec_plugins.models import smollm2_path

    sets = [workload_prompts(w, None) for w in args.workload]
    if args.spec_bench:
        sets.append(spec_bench(args.spec_bench))
    prompts = interleaved(sets)[: args.prompts]
    natives = [m for m in args.native.split(",") if m]
    configs = configurations("suffix_tree", [], 16, {}, natives, [int(k) for k in args.native_k.split(",")])
    trace = tempfile.NamedTemporaryFile(prefix="spec-plugins-trace-", suffix=".jsonl", delete=False).name
    engines = {}
    for name, (spec, extra) in configs.items():
        env = {"SPEC_PLUGINS_TRACE_FILE": trace} if "adaptive" in name else None
        engines[name] = Engine(EngineRun(model=str(smollm2_path()), prompts=prompts[:1], max_tokens=8, chat=True,
                                         speculative_config=spec, additional_config=extra), env=env)
        engines[name].generate(warm_prompts(1), 16)
    runs = {name: [] for name in engines}
    try:
        for i, prompt in enumerate(prompts):
            for name, engine in engines.items():
                t0 = time.perf_counter()  # CLOCK_MONOTONIC: the engine process's trace `t` is on the same clock
                x = engine.generate([prompt], args.max_tokens)
                runs[name].append({"prompt": i, "seconds": x.seconds, "tokens": x.output_tokens,
                                   "prefill_ms": x.step_seconds[0] * 1e3, "decode_ms": sum(x.step_seconds[1:]) * 1e3,
                                   "drafts": x.num_drafts, "draft_tokens": x.num_draft_tokens,
                                   "accepted": x.num_accepted_tokens, "t0": t0, "t1": time.perf_counter()})
            print(f"prompt {i}: " + ", ".join(f"{n} {r[-1]['tokens'] / r[-1]['seconds']:.1f}" for n, r in runs.items()),
                  flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    ours = next(n for n in runs if "adaptive" in n)
    with open(trace) as f:
        steps = [e for e in map(json.loads, f) if "step" in e and "t" in e]
    os.unlink(trace)
    for run in runs[ours]:
        mine = [e for e in steps if run["t0"] <= e["t"] <= run["t1"]]
        by_len: dict[int, list] = defaultdict(list)
        for a, b in zip(mine, mine[1:]):  # a step's drafts are verified before the next step's drafting begins
            by_len[sum(a["drafted"])].append((sum(b["accepted"]), (b["t"] - a["t"]) * 1e3))
        run["by_drafted"] = {k: {"steps": len(v), "accepted_a_draft": sum(a for a, _ in v) / len(v),
                                 "interval_ms_median": statistics.median(t for _, t in v)}
                             for k, v in sorted(by_len.items())}
        run["policy_stats"] = [e["policy_stats"] for e in mine if "policy_stats" in e]
    print(f"{'prompt':>6} " + " ".join(f"{n[:22]:>24}" for n in runs) + "   (prefill + decode ms)")
    for i in range(len(prompts)):
        print(f"{i:>6} " + " ".join(f"{r[i]['prefill_ms']:>10.0f} + {r[i]['decode_ms']:>9.0f}  " for r in runs.values()))
    print(f"{'total':>6} " + " ".join(f"{sum(x['prefill_ms'] for x in r):>10.0f} + {sum(x['decode_ms'] for x in r):>9.0f}  "
                                     for r in runs.values()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"format": "spec-plugins-per-prompt/1", "prompts": len(prompts), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
