"""Benchmark prompt sets: the demo's mix, disjoint rounds (no prompt is timed twice), the end-to-end mix."""

import json
from pathlib import Path

import pytest

from spec_plugins.bench.prompts import (
    code_rewrites, demo_prompts, interleaved, prompt_rounds, spec_bench, workload_prompts,
)


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


def test_interleaved_takes_each_set_in_turn_until_it_runs_out():
    assert interleaved([[1, 2, 3], ["a"], [10, 20]]) == [1, "a", 10, 2, 20, 3]
    assert interleaved([]) == []


SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason=f"Spec-Bench questions not found at {SPEC_BENCH}")
def test_e2e_mix_workload_holds_the_prompts_policy_e2e_sends():
    """benchmarks/workloads/e2e_mix.jsonl is the text policy_e2e's engines verify: its prompts are policy_e2e's
    list for the shipped workloads, in order (a change to either shows here)."""
    workloads = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads"
    rows = [json.loads(line) for line in (workloads / "e2e_mix.jsonl").read_text().splitlines()]
    sent = interleaved([workload_prompts(workloads / "code_completion.jsonl"),
                        workload_prompts(workloads / "code_edits.jsonl"), spec_bench(SPEC_BENCH)])
    assert [r["prompt"] for r in rows] == sent[: len(rows)]
    assert len(rows) >= 44 and all(r["chat"] and r["response"] for r in rows)  # one policy_e2e round: 4 + 8 + 32
