"""The compiled proposers' worker pool (`proposers/worker_pool.hpp`) under steps that wake only some workers.

A step with fewer chunks of rows than the pool has workers wakes helpers one by one (`notify_one`). A
notification could reach a worker that had already taken its place in the same loop and gone back to sleep;
it left the place to another worker that was never woken, and the step waited forever (a GPU host's pool
has up to 7 workers, so a batch of 64 requests in 4 groups of 16 took this path). Each stress run below hung
within 500 steps on that pool; it is run in a process of its own, so a hang fails the test instead of
stalling the suite.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

STRESS = """
import numpy as np
from spec_plugins.core import DraftBatch
from spec_plugins.proposers.{module} import {cls}

proposer = {cls}({options})
rng = np.random.default_rng(0)
contexts = [rng.integers(0, 50, 20).tolist() for _ in range({most})]
seen = [0] * {most}
for step in range({steps}):
    n = {fewest} + step % ({most} - {fewest} + 1)  # the batch size, hence the chunks, changes every step
    for c in contexts[:n]:
        c.append(int(rng.integers(0, 50)))
    lens = np.array([len(c) for c in contexts[:n]], dtype=np.int64)
    new = np.array([len(c) - s if s else len(c) for c, s in zip(contexts[:n], seen[:n])], dtype=np.int64)
    seen[:n] = lens.tolist()
    drafts = proposer.propose_batch(DraftBatch([f"r{{i}}" for i in range(n)], contexts[:n], lens, new,
                                               np.full(n, 4, dtype=np.int64)))
    assert len(drafts) == n
print("ok")
"""


@pytest.mark.parametrize("module, cls, options, fewest, most, steps", [
    # One row per chunk (interleave 1): 2-3 rows wake 1-2 of 5 workers.
    ("suffix_tree", "SuffixTreeProposer", "threads=5, parallel_from=1, interleave=1", 2, 3, 5000),
    # Eight rows per chunk: 9-40 rows wake 1-4 of 5 workers (fewer steps: each scans every whole context).
    ("ngram", "NgramProposer", "min_ngram=1, max_ngram=4, threads=5, parallel_from=2", 9, 40, 2500),
])
def test_steps_that_wake_some_workers_always_finish(module, cls, options, fewest, most, steps):
    code = STRESS.format(module=module, cls=cls, options=options, fewest=fewest, most=most, steps=steps)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cls} with 5 workers: a batched step never returned (the worker pool waited forever)")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
