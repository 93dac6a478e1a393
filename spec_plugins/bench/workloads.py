"""Prompt sets for the sweep: SPEED-Bench parquet, Spec-Bench JSONL, plain JSONL, code rewrites.

    load_workload("speed:/data/speed/qualitative")                     # a parquet file or a folder of them
    load_workload("../shared/data/spec_bench/question.jsonl", categories=["coding", "math"], limit=20)
    load_workload("prompts.jsonl")                                     # {"id", "prompt"[, "response"]} per line
    load_workload("code")                                              # standard-library rewrites (prompts.py)
    load_workload("spec_bench")                                        # the Spec-Bench rows bundled with us

Every row becomes a `Prompt`: its user turns (a multi-turn conversation is replayed turn by turn through
the model's chat template, each answer fed back), its category, and a reference response where the file
has one. A malformed file gets one error line naming the file and row.

SPEED-Bench (NVIDIA, arXiv 2604.09557) publishes its prompts with placeholders where the source datasets'
licences forbid redistribution; NVIDIA's `prepare_data.py` (Model-Optimizer `examples/specdec_bench`)
rebuilds the text. A file whose turns are still placeholders is refused with that instruction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

SPEED_BENCH_COLUMNS = ("question_id", "category", "turns")
# Text SPEED-Bench's public parquet holds in place of a prompt it may not redistribute.
_PLACEHOLDER = re.compile(r"^\s*[<\[{(]*\s*(placeholder|to be (filled|populated|rebuilt)|redacted|see source)\b",
                          re.IGNORECASE)


@dataclass
class Prompt:
    """One workload item: user turns in order (one for single-turn prompts)."""

    id: str
    turns: list[str]
    category: str | None = None
    response: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.turns[0]


def load_workload(spec: str, *, categories: Sequence[str] | None = None, limit: int | None = None,
                  turns: str = "first") -> list[Prompt]:
    """The prompts of a workload (see the module docstring for the forms of `spec`).

    categories: keep these categories only (case-insensitive); unknown names are an error.
    limit:      at most this many prompts, taken round-robin over the categories kept (so a small
                limit still covers every category).
    turns:      "first" keeps each conversation's first turn; "all" keeps every turn (multi-turn).
    """
    if turns not in ("first", "all"):
        raise ValueError(f"workload turns: expected 'first' or 'all', got {turns!r}")
    kind, path = _kind(spec)
    if kind == "code":
        from spec_plugins.bench.prompts import code_rewrites

        rows = [Prompt(f"code-{i}", [p], "code_rewrite") for i, p in enumerate(code_rewrites())]
    elif kind == "spec_bench_bundled":
        from importlib import resources

        from spec_plugins.bench.prompts import BUNDLED_SPEC_BENCH

        text = resources.files("spec_plugins.data").joinpath(BUNDLED_SPEC_BENCH).read_text()
        rows = _jsonl_rows(text, BUNDLED_SPEC_BENCH)
    elif kind == "speed":
        rows = _speed_bench(path)
    else:
        rows = _jsonl_rows(_read(path), str(path))
    if turns == "first":
        for r in rows:
            r.turns = r.turns[:1]
    rows = _filter(rows, categories, spec)
    if limit is not None:
        if limit < 1:
            raise ValueError(f"workload limit: expected a positive count, got {limit}")
        rows = _round_robin(rows, limit)
    if not rows:
        raise ValueError(f"workload {spec}: no prompts")
    return rows


def _kind(spec: str) -> tuple[str, Path | None]:
    if spec == "code":
        return "code", None
    if spec == "spec_bench":
        return "spec_bench_bundled", None
    if spec.startswith("speed:"):
        return "speed", Path(spec[len("speed:"):])
    path = Path(spec)
    if path.is_dir() or path.suffix == ".parquet":
        return "speed", path
    if not path.exists():
        raise ValueError(f"workload {spec}: no such file (expected a .jsonl or .parquet file, a folder of "
                         "parquet files, 'code' or 'spec_bench')")
    return "jsonl", path


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"workload {path}: cannot read it ({exc})") from None


def _jsonl_rows(text: str, where: str) -> list[Prompt]:
    """Spec-Bench rows ({"question_id", "category", "turns"}) or plain ones ({"id", "prompt"[, "response"]})."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"workload {where}: row {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"workload {where}: row {n}: expected a JSON object")
        rows.append(_prompt(row, f"workload {where}: row {n}"))
    return rows


def _prompt(row: dict, where: str) -> Prompt:
    if "turns" in row:  # Spec-Bench / SPEED-Bench
        turns = row["turns"]
        if hasattr(turns, "tolist"):
            turns = turns.tolist()
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        pid = row.get("question_id", row.get("id"))
        if pid is None:
            raise ValueError(f"{where}: expected a 'question_id' or 'id'")
        meta = {k: row[k] for k in ("sub_category", "source", "src_id", "difficulty", "multiturn") if k in row}
        return Prompt(str(pid), list(turns), row.get("category"), None, meta)
    if "prompt" in row:
        prompt, response = row["prompt"], row.get("response")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        if response is not None and not isinstance(response, str):
            raise ValueError(f"{where}: 'response' must be a string")
        if "id" not in row:
            raise ValueError(f"{where}: expected an 'id'")
        return Prompt(str(row["id"]), [prompt], row.get("category"), response)
    raise ValueError(f"{where}: expected 'turns' (Spec-Bench, SPEED-Bench) or 'prompt' (plain JSONL)")


def _speed_bench(path: Path) -> list[Prompt]:
    """SPEED-Bench parquet: one file, or a folder of them (a config's split)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("workload: reading SPEED-Bench parquet needs pyarrow (pip install 'spec-plugins[bench]')") from None
    files = sorted(path.glob("**/*.parquet")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise ValueError(f"workload {path}: no parquet files")
    rows: list[Prompt] = []
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as exc:  # pyarrow raises several types for a broken file
            raise ValueError(f"workload {f}: not a readable parquet file ({exc})") from None
        missing = [c for c in SPEED_BENCH_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"workload {f}: missing SPEED-Bench columns {missing} (has {table.column_names})")
        for n, row in enumerate(table.to_pylist(), start=1):
            rows.append(_prompt(row, f"workload {f}: row {n}"))
    held = [r for r in rows if any(_PLACEHOLDER.match(t) for t in r.turns)]
    if held:
        raise ValueError(
            f"workload {path}: {len(held)} of {len(rows)} prompts are placeholders (e.g. question {held[0].id}: "
            f"{held[0].turns[0][:60]!r}); SPEED-Bench's public files hold them until NVIDIA's prepare_data.py "
            "rebuilds the text: run `python prepare_data.py --dataset speed --config all` from Model-Optimizer's "
            "examples/specdec_bench and point --workload at its output")
    return rows


def _filter(rows: list[Prompt], categories: Sequence[str] | None, spec: str) -> list[Prompt]:
    if not categories:
        return rows
    have = {(r.category or "").lower() for r in rows}
    wanted = [c.lower() for c in categories]
    unknown = [c for c in wanted if c not in have]
    if unknown:
        raise ValueError(f"workload {spec}: no category {unknown}; it has {sorted(c for c in have if c)}")
    return [r for r in rows if (r.category or "").lower() in wanted]


def _round_robin(rows: list[Prompt], limit: int) -> list[Prompt]:
    by_cat: dict[str, list[Prompt]] = {}
    for r in rows:
        by_cat.setdefault(r.category or "", []).append(r)
    out: list[Prompt] = []
    queues = [list(v) for v in by_cat.values()]
    while len(out) < limit and any(queues):
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    return out
