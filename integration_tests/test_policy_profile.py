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
    assert 0 < cost.speedup(2, 3, 1.0, 32) <= 1.0  # drafts of which none are accepted: no gain


def test_profile_records_the_model_shape_and_refuses_another_model(tiny_llama, tmp_path):
    import json
    from pathlib import Path

    from spec_plugins.policy.adaptive import AdaptiveLength

    profile = profile_engine(tiny_llama, batch_sizes=[1], draft_lens=[0, 1], context_len=32, steps=8, repeats=1,
                             progress=False, command="test")
    config = json.loads((Path(tiny_llama) / "config.json").read_text())
    assert profile["model_shape"]["layers"] == config["num_hidden_layers"]
    path = save_profile(profile, tmp_path / "tiny.json")
    policy = AdaptiveLength(profile=str(path))
    policy.bind_model(config)  # its own model
    llama = json.loads((Path(__file__).resolve().parents[1] / "configs" / "models" / "llama-3.1-8b.json").read_text())
    with pytest.raises(ValueError, match=r"^policy_options.profile: measured for another model"):
        AdaptiveLength(profile=str(path)).bind_model(llama)


def test_engine_host_time_splits_real_steps(tiny_llama):
    from spec_plugins.bench.engine_host_time import measure

    rows = measure(tiny_llama, drafts=[0, 2], batches=[1, 3], steps=8, dtype="float32")
    assert [(r["draft"], r["batch"]) for r in rows] == [(0, 1), (0, 3), (2, 1), (2, 3)]
    for r in rows:
        assert r["steps"] >= 4 and r["tokens_per_request"] == 1 + r["draft"]
        # Every timed vLLM method was reached (a renamed one would read 0), and the parts make up the step.
        for part in ("scheduler", "input_prep", "model", "sampling", "bookkeeping", "output"):
            assert r[f"{part}_us"] > 0, (part, r)
        assert r["drafting_us"] > 0  # the fixed_draft proposer's propose() ran every step
        assert 0 < r["engine_us"] < r["host_us"] < r["step_us"]
