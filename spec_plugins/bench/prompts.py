"""Prompt sets for the demo and end-to-end benchmarks.

- Spec-Bench rows (Apache-2.0, Xia et al. 2024): a few are bundled in `spec_plugins/data/`; pass the
  full `question.jsonl` to use others.
- Code-rewrite prompts: real code nobody here wrote, from the Python standard library, with an
  instruction to rewrite it. Rewrites copy most of their input, the case speculation exists for.
"""

from __future__ import annotations

import inspect
import itertools
import json
from importlib import resources
from pathlib import Path

BUNDLED_SPEC_BENCH = "spec_bench_demo.jsonl"

# (module, function, instruction): short, well-known functions so a 135M model can follow along.
CODE_REWRITES = [
    ("textwrap", "indent", "Rewrite this Python function, renaming the parameter `prefix` to `margin`. "
     "Output the complete function."),
    ("shlex", "quote", "Add type hints to this Python function. Output the complete function."),
    ("fnmatch", "filter", "Rewrite this Python function, renaming the variable `result` to `matches`. "
     "Output the complete function."),
    ("string", "capwords", "Add type hints to this Python function. Output the complete function."),
    ("textwrap", "dedent", "Rewrite this Python function, renaming the variable `margin` to `common`. "
     "Output the complete function."),
    ("base64", "b64encode", "Add type hints to this Python function. Output the complete function."),
    ("difflib", "get_close_matches", "Rewrite this Python function, renaming the parameter `possibilities` to "
     "`candidates`. Output the complete function."),
    ("glob", "has_magic", "Add type hints and a docstring to this Python function. Output the complete function."),
]


def spec_bench(path: str | Path | None = None, ids: list[int] | None = None) -> list[str]:
    """First-turn prompts of Spec-Bench rows (the bundled sample when no path is given)."""
    if path is None:
        text = resources.files("spec_plugins.data").joinpath(BUNDLED_SPEC_BENCH).read_text()
    else:
        text = Path(path).read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if ids is not None:
        by_id = {r["question_id"]: r for r in rows}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"spec_bench ids: {missing} not found in {path or BUNDLED_SPEC_BENCH}")
        rows = [by_id[i] for i in ids]
    return [r["turns"][0] for r in rows]


def code_rewrites() -> list[str]:
    prompts = []
    for module, func, instruction in CODE_REWRITES:
        source = inspect.getsource(getattr(__import__(module), func))
        prompts.append(f"{instruction}\n\n```python\n{source}```")
    return prompts


def demo_prompts(spec_bench_path: str | Path | None = None) -> list[str]:
    """Spec-Bench questions and code rewrites, interleaved (so any slice mixes both)."""
    return interleaved([spec_bench(spec_bench_path), code_rewrites()])


def prompt_rounds(prompts: list, rounds: int) -> list[list]:
    """`rounds` disjoint, equal slices of `prompts` (the remainder is left out)."""
    per = len(prompts) // rounds
    if per < 1:
        raise ValueError(f"--repeats: {rounds} rounds of distinct prompts need at least {rounds} prompts, "
                         f"got {len(prompts)}")
    return [prompts[r * per:(r + 1) * per] for r in range(rounds)]


def interleaved(sets: list[list]) -> list:
    """One item of each set in turn (a, b, c, a, b, c, ...), the shorter sets dropping out as they run out: any slice
    of the result mixes every set."""
    return [p for group in itertools.zip_longest(*sets) for p in group if p is not None]


class Rendered(str):
    """A prompt already in the model's chat format (a workload row with `"chat": false`, e.g. a multi-turn agentic
    conversation): engine runs send it as it is, where they wrap plain prompts in the chat template."""


def workload_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """The `prompt` texts of a replay workload (`benchmarks/workloads/*.jsonl`); rows with `"chat": false` as
    `Rendered`."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows or "prompt" not in rows[0]:
        raise ValueError(f"--workload: expected JSON lines with a 'prompt' field in {path}")
    return [Rendered(r["prompt"]) if r.get("chat") is False else r["prompt"] for r in rows[:limit]]
