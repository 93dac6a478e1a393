"""The benchmarks' engine process (`spec_plugins.bench.vllm_run.Engine`) on a real vLLM engine."""

from __future__ import annotations

import pytest

from spec_plugins.bench.vllm_run import Engine, EngineRun

from .conftest import REPEATING_PROMPTS, requires_vllm

pytestmark = requires_vllm


def test_max_in_flight_holds_at_most_that_many_requests_and_keeps_outputs(tiny_llama):
    """Closed-loop clients (`max_in_flight`): the same greedy outputs, in prompt order, as one call of all prompts;
    with one request in the engine at a time every request takes its own max_tokens steps, with two about half."""
    prompts, max_tokens = REPEATING_PROMPTS[:5], 8
    with Engine(EngineRun(model=tiny_llama, prompts=prompts, max_tokens=max_tokens, ignore_eos=True)) as engine:
        together = engine.generate(prompts, max_tokens)
        one = engine.generate(prompts, max_tokens, max_in_flight=1)
        two = engine.generate(prompts, max_tokens, max_in_flight=2)
        with pytest.raises(ValueError, match="max_in_flight: expected an integer >= 1"):
            engine.generate(prompts, max_tokens, max_in_flight=0)
    assert one.token_ids == together.token_ids == two.token_ids
    assert all(len(t) == max_tokens for t in together.token_ids)
    # All at once: about max_tokens steps (a prefill step, then one token a step); one at a time: five times that;
    # two at a time: three waves, fewer where a joining request's prefill shares a step with a running decode.
    assert len(together.step_seconds) <= max_tokens + 2
    assert len(one.step_seconds) >= len(prompts) * max_tokens
    assert 2 * max_tokens < len(two.step_seconds) < len(one.step_seconds)
