"""The acceptance-trace format: per request and step, what a proposer offered and how much was accepted.

The replay benchmark writes traces (`python -m spec_plugins.bench.replay --trace-out DIR`); the planner
(`spec-plugins plan --acceptance`) and the policy simulator (`spec_plugins.bench.policy_sim`) read them.
Writer and readers share this module so the format is defined once, and so the policy side reads traces
without importing the benchmark (its proposers, baselines and tokenizer).

One file per workload and proposer, ``DIR/<workload>/<proposer>.json``, one JSON object::

    {"format": "spec-plugins-replay-trace/1", "workload": str, "file": str, "proposer": str,
     "options": {...}, "max_draft": K,
     "requests": [{"id": str, "prompt_len": int, "response_len": int,
                   "steps": [{"pos": i, "drafted": d, "accepted": a, "confidence": [c, ...]}, ...]}]}

``pos`` is the number of response tokens before the step (context = prompt + response[:pos]);
``drafted`` the draft length (<= max_draft); ``accepted`` <= drafted; ``confidence`` is present
only when the proposer's `Draft` carries per-token confidences (one per drafted token); ``kind`` only
when the proposer has several kinds of candidate (`core.ReportsDraftKind`: the suffix tree's "copy" or
"count").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Sequence

import pydantic

TRACE_FORMAT = "spec-plugins-replay-trace/1"


def request_record(id: str, prompt_len: int, response_len: int, pos: Sequence[int], drafted: Sequence[int],
                   accepted: Sequence[int], confidence: Sequence[Sequence[float] | None],
                   kind: Sequence[str | None] | None = None) -> dict[str, Any]:
    """One entry of ``requests``: the steps of one request, given per step as parallel sequences."""
    steps = []
    for k, (p, d, a) in enumerate(zip(pos, drafted, accepted)):
        step: dict[str, Any] = {"pos": p, "drafted": d, "accepted": a}
        if confidence[k] is not None:
            step["confidence"] = [round(float(c), 5) for c in confidence[k]]
        if kind is not None and kind[k] is not None:
            step["kind"] = kind[k]
        steps.append(step)
    return {"id": id, "prompt_len": prompt_len, "response_len": response_len, "steps": steps}


def trace_document(*, workload: str, file: str, proposer: str, options: dict[str, Any], max_draft: int,
                   requests: list[dict[str, Any]], accounting: str = "drafted") -> dict[str, Any]:
    """A whole trace file's object, for `write_trace`. accounting: `drafted` (only drafted tokens verified) or
    `mrv2` (every draft padded to max_draft with the last token and all of it verified, so `accepted` may count
    filler the target happened to accept, beyond `drafted`)."""
    return {"format": TRACE_FORMAT, "workload": workload, "file": file, "proposer": proposer,
            "options": options, "max_draft": max_draft, "accounting": accounting, "requests": requests}


def write_trace(path: str | Path, doc: dict[str, Any]) -> Path:
    out = Path(path)
    out.write_text(json.dumps(doc, separators=(",", ":")))  # compact: one entry per step of every request
    return out


class _Step(pydantic.BaseModel):
    pos: pydantic.NonNegativeInt
    drafted: pydantic.NonNegativeInt
    accepted: pydantic.NonNegativeInt
    confidence: list[float] | None = None
    kind: str | None = None


class _Request(pydantic.BaseModel):
    id: str
    prompt_len: pydantic.NonNegativeInt
    response_len: pydantic.NonNegativeInt
    steps: list[_Step]


class _Trace(pydantic.BaseModel):
    format: str
    proposer: str = ""
    max_draft: pydantic.PositiveInt
    accounting: Literal["drafted", "mrv2"] = "drafted"
    requests: list[_Request]


def read_trace(path: str | Path) -> dict[str, Any]:
    """Load a trace file, checking its format tag, its shape and its step fields (one-line ValueErrors)."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("format") != TRACE_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{path}: not a replay trace (format {found!r}, expected {TRACE_FORMAT!r})")
    try:
        _Trace.model_validate(doc)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{path}: {loc}: {err['msg'].lower()} (got {err.get('input')!r:.60})") from None
    padded = doc.get("accounting") == "mrv2"  # filler is verified too: accepted may pass drafted
    for req in doc["requests"]:
        for s in req["steps"]:
            if not (0 <= s["drafted"] <= doc["max_draft"] and 0 <= s["accepted"] <= doc["max_draft"]
                    and (padded or s["accepted"] <= s["drafted"])):
                raise ValueError(f"{path}: request {req['id']!r}: bad step {s} (expected accepted <= "
                                 f"{'max_draft' if padded else 'drafted'} and drafted <= max_draft {doc['max_draft']})")
    return doc


def load_traces(paths: Sequence[str | Path]) -> list[dict]:
    """Read the planner's `--acceptance` traces (the simulator's `--traces` too); one-line errors."""
    if not paths:
        raise ValueError("--acceptance: expected at least one trace file")
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ValueError(f"--acceptance {p}: no such file")
        try:
            doc = read_trace(path)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--acceptance {p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not any(req["steps"] for req in doc["requests"]):
            raise ValueError(f"--acceptance {p}: the trace has no steps")
        out.append(doc)
    return out
