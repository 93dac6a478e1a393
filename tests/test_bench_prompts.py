"""Benchmark prompt sets: the demo's mix, and disjoint rounds (no prompt is timed twice)."""

import pytest

from spec_plugins.bench.prompts import code_rewrites, demo_prompts, prompt_rounds


def test_demo_prompts_mix_chat_and_code():
    prompts = demo_prompts()
    assert len(prompts) == len(set(prompts)) >= 12
    assert "```python" in prompts[1] and "```python" not in prompts[0]  # interleaved
    assert len(code_rewrites()) == 8


def test_prompt_rounds_are_disjoint():
    rounds = prompt_rounds(list(range(10)), 3)
    assert rounds == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ValueError, match="--repeats: 4 rounds of distinct prompts need at least 4 prompts"):
        prompt_rounds([1, 2, 3], 4)
