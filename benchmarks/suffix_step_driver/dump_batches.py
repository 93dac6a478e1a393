"""Write the step_overhead benchmark's batches to a file for `driver.cpp` (the suffix tree's C++ step without Python).

    python benchmarks/suffix_step_driver/dump_batches.py [--batch 256] [--steps 60] [--out /tmp/batches.bin]

Same inputs as `python -m spec_plugins.bench.step_overhead`: B standard-library source files (SmolLM2 tokens),
each request's context 2-4k tokens at the start, 1-4 new tokens per request and step. Layout (int32): B, steps,
the B starting lengths, steps x B new-token counts, then per request its length and its tokens.
"""

import argparse

import numpy as np

from spec_plugins.bench.step_overhead import code_token_streams

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--out", default="/tmp/batches.bin")
args = ap.parse_args()
streams = code_token_streams(args.batch, 4096 + 4 * (args.steps + 10) + 256, progress=False)
rng = np.random.default_rng(0)
start = np.array([rng.integers(2048, min(4096, len(s) - 200) + 1) for s in streams], dtype=np.int32)
new = rng.integers(1, 5, size=(args.steps, args.batch)).astype(np.int32)
with open(args.out, "wb") as f:
    np.array([args.batch, args.steps], dtype=np.int32).tofile(f)
    start.tofile(f)
    new.tofile(f)
    for s in streams:
        np.array([len(s)], dtype=np.int32).tofile(f)
        s.astype(np.int32).tofile(f)
print(f"{args.out}: {args.batch} requests, {args.steps} steps, {int(new.sum())} new tokens")
