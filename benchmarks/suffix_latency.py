"""Suffix-tree latency at long contexts with a full global cache: ours vs ArcticInference, one run.

Real text (the benchmark workloads, SmolLM2's tokenizer) is cut into 1,000 responses that go
through each proposer and are finished (so they fill the global cache), then requests with
4k-token prompts decode 200 steps each: every step appends what a decoder would accept (here
4 tokens) and drafts up to K. Timed per call: `append` (update, per token) and `propose` of a
request with no new tokens (speculate only), both including the Python call.

    python benchmarks/suffix_latency.py [--cached 1000] [--context 4096] [--requests 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from spec_plugins.bench.replay import TextTokenizer, make_proposer
from spec_plugins.core import DraftRequest

WORKLOADS = Path(__file__).parent / "workloads"


def corpus(tokenizer: TextTokenizer) -> np.ndarray:
    ids: list[int] = []
    for name in ("code_edits.jsonl", "spec_bench_smollm2.jsonl", "code_completion.jsonl"):
        for line in (WORKLOADS / name).read_text().splitlines():
            row = json.loads(line)
            ids += tokenizer.response(row["prompt"]) + tokenizer.response(row["response"])
    return np.asarray(ids, dtype=np.int32)


def measure(name: str, options: dict, tokens: np.ndarray, args: argparse.Namespace) -> dict:
    p = make_proposer(name, options)
    rng = np.random.default_rng(0)
    n = len(tokens)
    for i in range(args.cached):  # fill the global cache with finished responses
        s = int(rng.integers(0, n - 600))
        p.start(f"c{i}", tokens[s : s + 64].tolist())
        p.append(f"c{i}", tokens[s + 64 : s + 576].tolist())
        p.finish(f"c{i}")
    spec_us, update_us, step = [], [], 4
    for r in range(args.requests):
        s = int(rng.integers(0, n - args.context - 1000))
        req = f"r{r}"
        p.start(req, tokens[s : s + args.context].tolist())
        pos = s + args.context
        for _ in range(args.steps):
            new = tokens[pos : pos + step].tolist()
            t0 = time.perf_counter_ns()
            p.append(req, new)
            t1 = time.perf_counter_ns()
            p.propose([DraftRequest(req, tokens[s : pos + step], num_new=0, max_draft=args.k)])
            t2 = time.perf_counter_ns()
            update_us.append((t1 - t0) / 1e3 / step)
            spec_us.append((t2 - t1) / 1e3)
            pos += step
        p.finish(req)
    return {"speculate_us_median": statistics.median(spec_us), "update_us_per_token": statistics.fmean(update_us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cached", type=int, default=1000)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--k", type=int, default=16)
    args = ap.parse_args()
    tokens = corpus(TextTokenizer())
    settings = {"suffix_tree": {"max_cached_requests": args.cached},
                "arctic": {"max_cached_requests": args.cached}}
    rows = {name: measure(name, opts, tokens, args) for name, opts in settings.items()}
    a = rows["arctic"]
    print(f"{len(tokens)} corpus tokens, {args.cached} cached responses, {args.context}-token prompts, K={args.k}")
    print(f"{'proposer':<12} {'speculate us (median)':>22} {'x arctic':>9} {'update us/token':>16} {'x arctic':>9}")
    for name, r in rows.items():
        print(f"{name:<12} {r['speculate_us_median']:>22.2f} {r['speculate_us_median'] / a['speculate_us_median']:>8.2f}x"
              f" {r['update_us_per_token']:>16.2f} {r['update_us_per_token'] / a['update_us_per_token']:>8.2f}x")


if __name__ == "__main__":
    main()
