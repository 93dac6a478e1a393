"""`profile_engine` on a real vLLM engine: one measured point per grid cell, and the drafts verified.

The tiny random model keeps this to a few seconds per engine on two cores; timings on it are noise
around a fixed per-step cost, so only structure and positivity are asserted, never ratios.
"""

from __future__ import annotations

import pytest

from spec_plugins.policy.measured import MeasuredCost, load_profile, save_profile
from spec_plugins.bench.profile import profile_engine

from .conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]


def test_profile_tiny_model(tiny_llama, tmp_path):
    profile = profile_engine(tiny_llama, batch_sizes=[1, 2], draft_lens=[0, 3], context_len=32, steps=16,
                             repeats=2, progress=False, command="test")
    loaded = load_profile(save_profile(profile, tmp_path / "profile.json"))
    assert loaded["engine"].startswith("vllm ") and loaded["device"] and loaded["command"] == "test"
    assert loaded["context_len"] == 32 and loaded["dtype"] == "float32"

    cells = {(p["batch"], p["draft"]): p for p in loaded["points"]}
    assert sorted(cells) == [(1, 0), (1, 3), (2, 0), (2, 3)]
    for (batch, draft), p in cells.items():
        assert p["tokens"] == batch * (1 + draft)
        assert p["step_ms"] > 0 and len(p["runs"]) == 2
        if draft == 0:
            assert p["drafted_per_step"] is None
        else:
            # vLLM's own spec-decode metrics: every request-step verified the fixed_draft proposer's
            # `draft` tokens, and (almost) none were accepted, so each step really carried 1 + draft.
            assert p["drafted_per_step"] == pytest.approx(draft, abs=0.25)
            assert p["accepted_per_step"] < 0.5

    cost = MeasuredCost(loaded)
    small, large = cost.linear_time(1), cost.linear_time(1000)
    assert 0 < small <= large
    assert cost.linear_time(8) <= cost.linear_time(64) <= large
    assert cost.speedup(2, 3, 1.0, 32) > 0
