"""The suffix tree's large arrays on 2 MB pages (`proposers/page_arena.hpp`): the same drafts as on malloc's
memory, through growth, finishes and blocks reused by later requests; `SPEC_PLUGINS_HUGE_PAGES=0` turns it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCENARIO = """
import json
import numpy as np
from spec_plugins.core import DraftBatch
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer

rng = np.random.default_rng(3)
proposer = SuffixTreeProposer(threads=1, parallel_from=1)
live, next_id, out = {}, 0, []
for step in range(40):
    if step % 10 == 5:  # finish half: their blocks go back to the arena for the requests that follow
        for r in list(live)[::2]:
            proposer.finish(r)
            del live[r]
    while len(live) < 8:  # 3-6k tokens of a 40-token vocabulary: arrays of 16 KB and more, repeats to match
        live[f"r{next_id}"] = [rng.integers(0, 40, int(rng.integers(3000, 6000))).tolist(), 0]
        next_id += 1
    ids = list(live)
    for r in ids:
        live[r][0].extend(rng.integers(0, 40, int(rng.integers(1, 30))).tolist())
    lens = np.array([len(live[r][0]) for r in ids], dtype=np.int64)
    new = np.array([len(live[r][0]) - live[r][1] if live[r][1] else len(live[r][0]) for r in ids], dtype=np.int64)
    for r in ids:
        live[r][1] = len(live[r][0])
    drafts = proposer.propose_batch(DraftBatch(ids, [live[r][0] for r in ids], lens, new, np.full(len(ids), 16)))
    out.append([drafts.tokens.tolist(), drafts.offsets.tolist(), drafts.confidence.round(12).tolist()])
print(json.dumps({"drafts": out, "arena_bytes": proposer.stats()["arena_bytes"]}))
"""


def run(huge_pages: str | None) -> dict:
    env = dict(os.environ)
    env.pop("SPEC_PLUGINS_HUGE_PAGES", None)
    if huge_pages is not None:
        env["SPEC_PLUGINS_HUGE_PAGES"] = huge_pages
    out = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_drafts_on_huge_pages_equal_drafts_on_malloc():
    on, off = run(None), run("0")
    assert on["drafts"] == off["drafts"]
    assert off["arena_bytes"] == 0  # switched off: nothing mapped
    if sys.platform == "linux":
        assert on["arena_bytes"] >= 1 << 20  # the trees' arrays are held there
    else:
        pytest.skip("the arena maps memory on Linux only; elsewhere both runs use malloc")


BOUND = """
import json
import numpy as np
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer

rng = np.random.default_rng(5)
proposer = SuffixTreeProposer()
for i in range(12):  # ~8 MB of arrays each: 100k tokens of a 5k-token vocabulary
    proposer.start(f"r{i}", rng.integers(0, 5000, 100_000).tolist())
held_live = proposer.stats()["arena_bytes"]
for i in range(1, 12):
    proposer.finish(f"r{i}")
s = proposer.stats()
print(json.dumps({"held_live": held_live, "held": s["arena_bytes"], "memory": s["memory_bytes"]}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the arena maps memory on Linux only")
def test_memory_held_after_finishes_stays_within_the_bound():
    """Blocks freed by finished requests stay for reuse only up to max(32 MB, a quarter of the bytes in use); the
    rest give their pages back, so a burst of long requests does not stay in the process's memory after they end."""
    out = subprocess.run([sys.executable, "-c", BOUND], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["held_live"] > 80 << 20  # twelve live requests held their arrays here
    # One live request left (memory_bytes: its tree and the global one): what is held is its arrays plus at most
    # 32 MB of free blocks kept for reuse.
    assert r["held"] <= r["memory"] + (32 << 20) + (1 << 20)
