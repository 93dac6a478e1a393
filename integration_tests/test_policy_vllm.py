"""The draft-length policy and the planner's configs in a real vLLM engine: accepted, applied, lossless."""

from __future__ import annotations

import json

import pytest

from spec_plugins.bench.vllm_run import EngineRun, run
from spec_plugins.policy import planner
from spec_plugins.policy.cost import RooflineCost
from spec_plugins.traces import load_traces

from .conftest import REPEATING_PROMPTS, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]

K = 6
PROMPTS = REPEATING_PROMPTS[:5]
MAX_TOKENS = 40

# A slow, compute-bound GPU for the tiny model: each verified token costs about as much as the fixed
# part of a step, so the adaptive policy keeps confident tokens and drops doubtful ones (mixed lengths).
SLOW_GPU = """
name: slow-test-gpu
bf16_tflops: 0.002
fp8_tflops: null
memory_bandwidth_tbs: 1.0
sm_count: 1
gemm_tile_rows: 1
attention_tile_rows: 128
step_overhead_us: 2000
"""


def two_context_profile(path):
    """A measured-profile file at contexts 16 and 64 tokens (made up, steep per verified row): each request is
    priced at its own context (MeasuredCost.context_terms)."""
    def points(batch_ms, row_ms):
        return [{"batch": b, "draft": d, "tokens": b * (1 + d), "step_ms": 5.0 + batch_ms * b + row_ms * b * d}
                for b in (1, 2, 4, 8) for d in (0, 2, 6)]
    path.write_text(json.dumps({
        "format": "spec-plugins-step-profile/1", "engine": "test", "device": "test", "model": "tiny",
        "dtype": "float32", "context_len": 16, "created": "test", "command": "test",
        "points": points(1.0, 0.3), "contexts": [{"context_len": 64, "points": points(2.0, 1.0)}]}))
    return str(path)


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    return run(EngineRun(model=tiny_llama, prompts=PROMPTS, max_tokens=MAX_TOKENS, warmup=False, max_model_len=512))


def _spec(tiny_llama, speculative_config, additional_config=None):
    return EngineRun(model=tiny_llama, prompts=PROMPTS, max_tokens=MAX_TOKENS, warmup=False, max_model_len=512,
                     speculative_config=speculative_config, additional_config=additional_config)


@pytest.mark.parametrize("proposer, cost", [("suffix_tree", "slow_gpu"), ("ngram", "slow_gpu"),
                                            ("suffix_tree", "two_contexts")])
def test_adaptive_policy_lossless_with_mixed_lengths(tiny_llama, baseline, tmp_path, proposer, cost):
    hw = tmp_path / "slow.yaml"
    hw.write_text(SLOW_GPU)
    # two_contexts: a profile at two contexts, each request priced at its own.
    options = ({"hardware": str(hw)} if cost == "slow_gpu" else
               {"profile": two_context_profile(tmp_path / "profile.json")})
    fixed = run(_spec(tiny_llama, {"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer",
                                   "num_speculative_tokens": K},
                      {"spec_plugins": {"proposer": proposer}}))
    # No model_config: the policy models the engine's own model (vLLM's hf_config).
    adaptive = run(_spec(tiny_llama, {"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer",
                                      "num_speculative_tokens": K},
                         {"spec_plugins": {"proposer": proposer, "policy": "adaptive",
                                           "policy_options": options}}))
    assert fixed.error is None and adaptive.error is None, (fixed.error, adaptive.error)
    assert fixed.token_ids == baseline.token_ids
    assert adaptive.token_ids == baseline.token_ids
    assert adaptive.num_drafts > 0 and adaptive.num_accepted_tokens > 0
    # The policy shortened drafts: fewer tokens verified per draft than the fixed-length run.
    per_draft = lambda r: r.num_draft_tokens / max(r.num_drafts, 1)
    assert per_draft(adaptive) < per_draft(fixed)


def test_planner_config_runs_natively_and_in_our_adapter(tiny_llama, baseline, tmp_path):
    trace = {"format": "spec-plugins-replay-trace/1", "workload": "w", "proposer": "p", "max_draft": K,
             "requests": [{"id": "a", "prompt_len": 50, "response_len": 60,
                           "steps": [{"pos": i, "drafted": K, "accepted": i % (K + 1)} for i in range(60)]}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    stats = planner.AcceptanceStats.from_traces(load_traces([path]))
    p = planner.plan(RooflineCost("h200", "llama-3.1-8b"), stats, K, max_batch=256)
    from spec_plugins.vllm.settings import installed_vllm

    for mechanism in ("ngram", "suffix_tree"):
        conf = planner.vllm_speculative_config(p, mechanism, installed_vllm())  # the form of the engine it runs on
        res = run(_spec(tiny_llama, conf))
        assert res.error is None, res.error
        assert res.token_ids == baseline.token_ids
        assert res.num_drafts > 0 and res.num_accepted_tokens > 0  # speculation ran, and its drafts were accepted


def test_our_adapter_applies_the_batch_size_schedule(tiny_llama, baseline):
    # vLLM hands the schedule only to its own proposers; ours reads it from speculative_config:
    # 5 requests in the batch -> the [2, 256] range -> no drafts while the batch is full.
    conf = {"method": "custom_class", "model": "spec_plugins.vllm.Ngram", "num_speculative_tokens": K,
            "num_speculative_tokens_per_batch_size": [[1, 1, K], [2, 256, 0]]}
    res = run(_spec(tiny_llama, conf))
    assert res.error is None, res.error
    assert res.token_ids == baseline.token_ids
    assert res.num_drafts == 0


def test_fixed_draft_profiling_proposer_is_lossless(tiny_llama, baseline):
    # The profiler's proposer drafts tokens that are almost never right; vLLM must still emit the target's own.
    conf = {"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer", "num_speculative_tokens": 3}
    res = run(_spec(tiny_llama, conf, {"spec_plugins": {"proposer": "fixed_draft", "proposer_options": {"length": 3}}}))
    assert res.error is None, res.error
    assert res.token_ids == baseline.token_ids
    assert res.num_draft_tokens == 3 * res.num_drafts > 0
