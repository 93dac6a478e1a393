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


def write_spec_bench(path: Path, turns: list[str]) -> Path:
    """A Spec-Bench `question.jsonl` in its own format: one JSON object a line, the first turn the prompt."""
    rows = [{"question_id": 100 + i, "category": "writing", "turns": [t, "a second turn, never sent"]}
            for i, t in enumerate(turns)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a trailing blank line is skipped
    return path


def test_spec_bench_sends_each_questions_first_turn_and_picks_ids(tmp_path):
    questions = write_spec_bench(tmp_path / "question.jsonl", ["first?", "second?", "third?"])
    assert spec_bench(questions) == ["first?", "second?", "third?"]
    assert spec_bench(questions, ids=[102, 100]) == ["third?", "first?"]
    with pytest.raises(ValueError, match=r"spec_bench ids: \[7\] not found"):
        spec_bench(questions, ids=[100, 7])
    # The demo interleaves the given questions with the code rewrites.
    assert demo_prompts(questions)[:4] == ["first?", code_rewrites()[0], "second?", code_rewrites()[1]]


def test_e2e_mix_workload_holds_the_prompts_policy_e2e_sends(tmp_path):
    """benchmarks/workloads/e2e_mix.jsonl is the text policy_e2e's engines verify: its prompts are policy_e2e's
    list for the shipped workloads and Spec-Bench, interleaved in that order (a change to either shows here). The
    full Spec-Bench file is not in the repository: its questions here are the mix's own rows that come from
    neither workload, so what is checked is that each workload's prompts are all there, in order, where
    policy_e2e's interleaving puts them."""
    workloads = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads"
    rows = [json.loads(line) for line in (workloads / "e2e_mix.jsonl").read_text().splitlines()]
    completion = workload_prompts(workloads / "code_completion.jsonl")
    edits = workload_prompts(workloads / "code_edits.jsonl")
    known = set(completion) | set(edits)
    questions = write_spec_bench(tmp_path / "question.jsonl", [r["prompt"] for r in rows if r["prompt"] not in known])
    sent = interleaved([completion, edits, spec_bench(questions)])
    assert [r["prompt"] for r in rows] == sent[: len(rows)]
    assert {r["prompt"] for r in rows} & set(completion) and {r["prompt"] for r in rows} & set(edits)
    assert spec_bench(questions)  # all three sets reach the mix
    assert len(rows) >= 44 and all(r["chat"] and r["response"] for r in rows)  # one policy_e2e round: 4 + 8 + 32


def test_rendered_prompts_skip_the_chat_template(tmp_path):
    """A `"chat": false` row (already in the model's chat format, the agentic workload) goes to the engine as it is;
    the others are wrapped in the chat template, as the replay tokenises them."""
    from types import SimpleNamespace

    from spec_plugins.bench.prompts import Rendered, workload_prompts
    from spec_plugins.bench.vllm_run import _prompt_inputs

    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "<|im_start|>user\nhi<|im_end|>\n", "chat": False}) + "\n"
                    + json.dumps({"id": "b", "prompt": "hi", "chat": True}) + "\n")
    raw, plain = workload_prompts(path)
    assert isinstance(raw, Rendered) and not isinstance(plain, Rendered)

    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return f"[{messages[0]['content']}]"

    llm = SimpleNamespace(get_tokenizer=Tok)
    assert _prompt_inputs(llm, SimpleNamespace(chat=True), [raw, plain]) == [raw, "[hi]"]
