"""The suffix tree's batched step with its appends interleaved across requests, against not, in one run.

Several `SuffixTreeProposer`s that differ only in `interleave` (how many requests' appends a batched step
takes in turns) are fed the same vLLM-shaped batches (the step_overhead benchmark's: standard-library source
files of 2-4k tokens, 1-4 new tokens per request and step) in alternating order; each step's drafts are
checked equal, and the compiled `step_batch` call is timed. Ratios are to the first `--interleave` value.

    python benchmarks/suffix_interleave.py [--batch 256] [--steps 40] [--threads 0] [--interleave 1,16,32] [--k 16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from spec_plugins.bench.step_overhead import Batch, code_token_streams
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0, help="worker threads (0: the calling thread only)")
    ap.add_argument("--interleave", default="1,16,32", help="values to compare, the first is the baseline")
    ap.add_argument("--k", type=int, default=16, help="draft cap (0: appends only)")
    args = ap.parse_args()
    groups = [int(g) for g in args.interleave.split(",")]
    b = args.batch
    batch = Batch(code_token_streams(b, 4096 + 4 * args.steps + 256, progress=False), np.random.default_rng(0),
                  4096 + 4 * args.steps + 512)
    cores = {g: SuffixTreeProposer(threads=args.threads, interleave=g)._core for g in groups}
    keys, rows = np.arange(b, dtype=np.int64), np.arange(b, dtype=np.int64)
    caps = np.full(b, args.k, dtype=np.int64)
    lens = batch.num_tokens.astype(np.int64)
    for core in cores.values():  # the prompts
        core.step_batch(keys, batch.token_ids_cpu, rows, lens, lens, caps)
    times: dict[int, list[float]] = {g: [] for g in groups}
    for step in range(args.steps):
        batch.advance()
        new = np.array([len(s) for s in batch.sampled], dtype=np.int64)
        lens = batch.num_tokens.astype(np.int64)
        order = groups if step % 2 == 0 else groups[::-1]
        drafts = {}
        for g in order:
            t0 = time.perf_counter()
            drafts[g] = cores[g].step_batch(keys, batch.token_ids_cpu, rows, lens, new, caps)
            times[g].append(time.perf_counter() - t0)
        for g in groups[1:]:
            if not all(np.array_equal(x, y) for x, y in zip(drafts[groups[0]], drafts[g])):
                raise SystemExit(f"interleave {g}: drafts differ from interleave {groups[0]} at step {step}")
    base = statistics.median(times[groups[0]])
    for g in groups:
        med = statistics.median(times[g])
        print(f"B = {b}, threads {args.threads}, K = {args.k}, interleave {g:2d}: median {med * 1e6:7.0f} µs "
              f"({med / base:.3f}x), min {min(times[g]) * 1e6:7.0f} µs")


if __name__ == "__main__":
    main()
