"""Per engine process of a `SPEC_PLUGINS_TRACE_FILE` trace: how long its steps took and how much of that was ours.

    SPEC_PLUGINS_TRACE_FILE=trace.jsonl spec-plugins sweep ...   # or vllm serve / LLM(...)
    python benchmarks/step_trace.py trace.jsonl [--rows 1]

Each step line carries `t` (when its drafting began, perf_counter seconds), `us` (our host time) and
`drafted` (the draft lengths). The interval between two consecutive steps of one process is the engine's
whole step as the worker saw it (verification forward, sampling, scheduling, our drafting); steps more than
1 s apart (idle between requests) are left out. `--rows N` keeps steps with exactly N drafting rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def summarize(path: str, rows: int | None = None, idle_s: float = 1.0) -> list[dict]:
    steps: dict[int, list[dict]] = defaultdict(list)
    engine: dict[int, str] = {}
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if "start" in e:
                engine[e["pid"]] = f"{e['start']} {e['policy']} K={e['k']}"
            elif "step" in e and "t" in e:
                steps[e["pid"]].append(e)
    out = []
    for pid, es in steps.items():
        es.sort(key=lambda e: e["t"])
        gaps = [(b["t"] - a["t"]) * 1e3 for a, b in zip(es, es[1:]) if b["t"] - a["t"] < idle_s
                and (rows is None or len(a.get("drafted", ())) == rows)]
        kept = [e for e in es if rows is None or len(e.get("drafted", ())) == rows]
        drafted = [d for e in kept for d in e.get("drafted", ())]
        out.append({"pid": pid, "engine": engine.get(pid, "?"), "steps": len(kept), "interval_ms_median": statistics.median(gaps) if gaps else None,
                    "ours_us_median": statistics.median(e["us"] for e in kept) if kept else None,
                    "drafted_mean": sum(drafted) / len(drafted) if drafted else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--rows", type=int, help="only steps with exactly this many drafting rows")
    args = ap.parse_args()
    print(f"{'pid':>8} {'engine':>28} {'steps':>6} {'step interval ms':>17} {'ours µs':>8} {'drafted/row':>11}")
    for r in summarize(args.trace, args.rows):
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        print(f"{r['pid']:>8} {r['engine']:>28} {r['steps']:>6} {fmt(r['interval_ms_median'], '17.2f')} {fmt(r['ours_us_median'], '8.1f')} "
              f"{fmt(r['drafted_mean'], '11.2f')}")


if __name__ == "__main__":
    main()
