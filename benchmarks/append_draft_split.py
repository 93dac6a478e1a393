"""The suffix tree's batched step split into its appends and its drafts, on the step-overhead batches.

    .venv/bin/python benchmarks/append_draft_split.py [--batch 256] [--steps 40]

Two caches take the same batches (B code streams growing 1-4 tokens a step, as `spec_plugins.bench.step_overhead`):
one runs the whole step (append, then draft), the other the same appends with no drafts, then the drafts with nothing
new. What drafting alone costs bounds what a step would still wait for if the appends ran off it (while the engine
verifies); the drafts-only call reads trees the appends just warmed, so it is a lower bound.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from spec_plugins.bench.step_overhead import Batch, code_token_streams
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer


def measure(b: int, steps: int) -> tuple[dict[str, list[float]], Any, Any]:
    """Seconds per step of each call kind, and the two caches (they end holding the same trees)."""
    streams = code_token_streams(b, 4096 + 4 * steps + 256, progress=False)
    batch = Batch(streams, np.random.default_rng(0), 4096 + 4 * steps + 512)
    whole, split = SuffixTreeProposer()._core, SuffixTreeProposer()._core
    keys = rows = np.arange(b)
    caps, nothing = np.full(b, 16), np.zeros(b, dtype=np.int64)
    lens = batch.num_tokens.astype(np.int64)
    for core in (whole, split):
        core.step_batch(keys, batch.token_ids_cpu, rows, lens, lens, caps)
    times: dict[str, list[float]] = {"whole step": [], "appends only": [], "drafts only": []}
    for _ in range(steps):
        before = lens
        batch.advance()
        lens = batch.num_tokens.astype(np.int64)
        for name, core, new, cap in (("whole step", whole, lens - before, caps), ("appends only", split, lens - before,
                                     nothing), ("drafts only", split, nothing, caps)):
            t = time.perf_counter()
            core.step_batch(keys, batch.token_ids_cpu, rows, lens, new, cap)
            times[name].append(time.perf_counter() - t)
    return times, whole, split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    if args.batch < 1 or args.steps < 1:
        ap.error("--batch and --steps must be positive")
    times, _, _ = measure(args.batch, args.steps)
    med = {name: statistics.median(ts) * 1e6 for name, ts in times.items()}
    print(f"B = {args.batch}, median of {args.steps} steps: " + ", ".join(f"{name} {us:.0f} µs" for name, us in med.items())
          + f"; drafts only / whole step {med['drafts only'] / med['whole step']:.2f}")


if __name__ == "__main__":
    main()
