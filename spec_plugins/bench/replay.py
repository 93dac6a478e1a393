"""Replay benchmark: acceptance and drafting cost of proposers on recorded (prompt, response) text.

    python -m spec_plugins.bench.replay --workload benchmarks/workloads/code_edits.jsonl \\
        --proposers suffix_tree,arctic,vllm_ngram,ngram --max-draft 16 --json out.json [--trace-out DIR]

No model runs: the responses are fixed, so every proposer sees exactly the contexts a greedy
engine would give it, and acceptance is what greedy verification of the same output would accept.
That isolates the drafter (how much it gets right, how long it takes) from engine speed.

Workload rows (JSONL): ``{"id", "prompt", "response"}`` text, plus optional ``"chat": true`` (the
prompt is wrapped in the tokenizer's chat template, as ``vllm_run`` does for chat runs) and any
other fields (sources), which are ignored. Text is tokenised with SmolLM2's tokenizer unless
``--tokenizer`` names another Hugging Face tokenizer folder.

The walk, per row and in file order (like requests arriving one after another):

1. The prefill step emits ``response[0]``; nothing is drafted for it (engines draft after it).
2. At response position ``i >= 1`` the proposer gets ``DraftRequest(tokens=prompt + response[:i],
   num_new=<tokens since its last call>, max_draft=K)`` (its first call has ``num_new = len(tokens)``,
   as engine adapters send it). ``accepted`` is the length of the common prefix of the draft and
   ``response[i:]``; the step emits ``accepted + 1`` tokens (the last one is the target's own token,
   the "bonus"), so ``i += accepted + 1``. The walk ends when the response is used up; the step
   that would emit the end-of-sequence token is not replayed.
3. ``finish(req_id)``: responses enter a proposer's global cache, where it has one.

``--concurrency C`` (C > 1) replays C requests at once, as an engine batches them: each step is one
``propose`` call over every request in flight (each at its own position, steps as above), and a finished
request's slot goes to the next row in file order. A proposer that caches responses while they are generated
(the suffix tree's ``cache_in_flight``) then sees its neighbours' partial responses, and one that caches only
finished ones sees fewer of them than one request at a time does. Each proposer then replays the whole
workload in turn, and the µs columns are per request: one call's time over the requests in it.

Each workload gets fresh proposer instances (one deployment per workload); within a workload the
proposers take turns row by row, so a busy neighbour on a shared machine slows them alike.
Proposers are driven only through the `Proposer` protocol: registered ones by
``spec_plugins.create_proposer``, the baselines ``arctic`` and ``vllm_ngram`` from
`spec_plugins.bench.baselines`.

Numbers reported per proposer (JSON ``workloads.<name>.proposers.<proposer>``, and pooled over
all workloads under ``proposers.<proposer>``):

* ``acceptance_length`` -- mean of ``accepted + 1`` over steps (vLLM's "mean acceptance length").
* ``speculate_us_median`` (also ``_mean``, ``_p90``, ``_p99``) -- one ``propose([request])`` call
  as the caller sees it: Python call, ingesting the ``num_new`` tokens, drafting.
  ``start_us_median``: the first call of each request (it also indexes the prompt).
  ``propose_us_per_token``: all ``propose`` time over response tokens -- the drafting overhead per
  generated token, which the median hides (steps after a rejection ingest 1 token, steps after a
  full acceptance ``K + 1``).
* ``update_us_per_token`` -- the incremental update alone, for proposers exposing
  ``start(req_id, prompt)`` and ``append(req_id, tokens)`` (ours: ``suffix_tree``; Arctic:
  ``add_active_response``, which extends the local and the global tree). Timed in a second pass
  with fresh instances, replaying the same chunks the drafting pass fed; total ``append`` time
  over tokens appended. ``null`` for stateless proposers (their work is all in ``propose``).
* ``finish_us_per_token`` -- ``finish`` time over response tokens (a proposer that inserts a
  response into its global cache only when the request ends pays for it here).

Trace files (``--trace-out DIR``): ``DIR/<workload>/<proposer>.json``, every step of every request
(what was drafted, how much was accepted, the proposer's confidences), in the format of
`spec_plugins.traces`, which also reads them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from spec_plugins.core import (
    BatchProposer, Draft, DraftBatch, DraftRequest, Proposer, ReportsDraftKind, ShapesDraftsForRunner, check_drafts,
)
from spec_plugins.traces import request_record, trace_document, write_trace

RESULT_FORMAT = "spec-plugins-replay/1"
DEFAULT_PROPOSERS = "suffix_tree,arctic,vllm_ngram,ngram"


# ---- workloads ----------------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    prompt: np.ndarray  # int32 token ids
    response: np.ndarray


class TextTokenizer:
    """Tokenises workload text the way `vllm_run` feeds a chat model (template, then encode)."""

    def __init__(self, path: str | Path | None = None) -> None:
        from transformers import AutoTokenizer

        if path is None:
            from spec_plugins.models import smollm2_path

            path = smollm2_path(progress=sys.stderr.isatty())
        path = Path(path)
        if path.is_file():  # a tokenizer.json: its folder holds the config and template
            path = path.parent
        self.path = str(path)
        self.tok = AutoTokenizer.from_pretrained(self.path)

    def prompt(self, text: str, chat: bool) -> list[int]:
        from spec_plugins.models import prompt_ids

        return prompt_ids(self.tok, text, chat)

    def response(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])


def load_workload(path: str | Path, tokenizer: TextTokenizer, limit: int | None = None) -> list[Row]:
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit is not None and len(rows) >= limit:
                break
            try:
                obj = json.loads(line)
                rid, prompt, response = str(obj["id"]), obj["prompt"], obj["response"]
                if not isinstance(prompt, str) or not isinstance(response, str):
                    raise TypeError("prompt and response must be strings")
            except KeyError as exc:
                raise ValueError(f"{path}:{lineno}: missing field {exc.args[0]!r} (expected a JSON object with id, "
                                 "prompt, response)") from None
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with id, prompt, response ({exc})") from None
            rows.append(Row(
                rid,
                np.asarray(tokenizer.prompt(prompt, bool(obj.get("chat", False))), dtype=np.int32),
                np.asarray(tokenizer.response(response), dtype=np.int32),
            ))
    return rows


# ---- proposers ----------------------------------------------------------------------------------


def proposer_names() -> list[str]:
    from spec_plugins.bench.baselines import BASELINES
    from spec_plugins.registry import available_proposers

    return sorted(set(available_proposers()) | set(BASELINES))


def base_name(label: str) -> str:
    """`suffix_tree@d24` -> `suffix_tree`: a label lets one proposer run twice with different options."""
    return label.split("@", 1)[0]


def _factory(name: str) -> Any:
    from spec_plugins.bench.baselines import BASELINES
    from spec_plugins.registry import available_proposers, proposer_class

    base = base_name(name)
    if base in BASELINES:
        return BASELINES[base]
    if base not in available_proposers():
        raise ValueError(f"proposer: unknown name {base!r}; expected one of: {', '.join(proposer_names())}")
    return proposer_class(base)


def make_proposer(name: str, options: dict[str, Any] | None = None, verifies_all: bool = False) -> Proposer:
    """A registered proposer or a baseline (`arctic`, `vllm_ngram`) by name or `name@label`. verifies_all: the
    replayed runner verifies every slot (`--accounting mrv2`), told to the proposer as an engine adapter tells it
    (core.ShapesDraftsForRunner: the suffix tree's `fill: auto`)."""
    from spec_plugins.bench.baselines import BASELINES, create_baseline
    from spec_plugins.registry import create_proposer

    _factory(name)  # unknown names fail here, listing the known ones
    base = base_name(name)
    if base in BASELINES:
        return create_baseline(base, options)
    proposer = create_proposer(base, options)
    if isinstance(proposer, ShapesDraftsForRunner):
        proposer.runner_verifies_all(verifies_all)
    return proposer


def effective_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The options a proposer runs with, defaults filled in (what a trace or result records)."""
    model = getattr(_factory(name), "Options", None)
    return model(**dict(options or {})).model_dump() if model is not None else dict(options or {})


def parse_options(values: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`NAME=JSON` or a JSON dict `{NAME: {...}}`, repeatable; later values update earlier ones."""
    out: dict[str, dict[str, Any]] = {}
    for value in values:
        value = value.strip()
        if value.startswith("{"):
            try:
                obj = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"--options: not valid JSON: {exc}") from None
        else:
            name, sep, text = value.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"--options: expected NAME=JSON or a JSON object, got {value!r}")
            try:
                obj = {name.strip(): json.loads(text)}
            except ValueError as exc:
                raise ValueError(f"--options {name.strip()}: not valid JSON: {exc}") from None
        if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
            raise ValueError(f"--options: expected {{proposer: {{option: value}}}}, got {value!r}")
        for name, opts in obj.items():
            out.setdefault(name, {}).update(opts)
    return out


# ---- the walk -----------------------------------------------------------------------------------


@dataclass
class Walk:
    """One request replayed against one proposer."""

    id: str
    prompt_len: int
    response_len: int
    pos: list[int] = field(default_factory=list)  # response position of each step
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    confidence: list[list[float] | None] = field(default_factory=list)
    kind: list[str | None] = field(default_factory=list)  # which candidate drafted (core.ReportsDraftKind)
    propose_ns: list[int] = field(default_factory=list)
    finish_ns: int = 0

    def record(self, pos: int, draft: Draft, accepted: int, kind: str | None, propose_ns: int) -> None:
        """One step: the draft at response position `pos`, how much of it was accepted, what the call took."""
        self.propose_ns.append(propose_ns)
        self.pos.append(pos)
        self.drafted.append(len(draft.tokens))
        self.accepted.append(accepted)
        self.confidence.append(None if draft.confidence is None else list(draft.confidence))
        self.kind.append(kind)

    def trace(self) -> dict:
        """This request's entry in a trace file."""
        return request_record(self.id, self.prompt_len, self.response_len, self.pos, self.drafted, self.accepted,
                              self.confidence, self.kind)


def accepted_prefix(draft: Sequence[int], truth: np.ndarray) -> int:
    """Length of the common prefix of `draft` and `truth` (greedy verification)."""
    d = np.asarray(draft[: len(truth)], dtype=np.int64)
    miss = np.flatnonzero(d != truth[: len(d)])
    return int(miss[0]) if miss.size else len(d)


def verified(draft: Sequence[int], truth: np.ndarray, fill_to: int | None, last: int) -> int:
    """Tokens accepted of `draft`; with `fill_to`, of the draft padded to that width with `last` (the last committed
    token), as vLLM's Model Runner V2 verifies every one of its K slots, filler included."""
    if fill_to is not None and len(draft) < fill_to:
        draft = list(draft) + [last] * (fill_to - len(draft))
    return accepted_prefix(draft, truth)


def walk(proposer: Proposer, row: Row, max_draft: int, req_id: Hashable | None = None,
         clock: Callable[[], int] = time.perf_counter_ns, batched: bool = False, fill: bool = False) -> Walk:
    """Replay `row` through `proposer` as a greedy engine would (see the module docstring).

    batched: draft through the proposer's batched serving path (`propose_batch`, one row a step) where
    it has one, instead of `propose`; the drafts must be the same.
    fill: count acceptance as Model Runner V2 verifies, every draft padded to `max_draft` with the last token."""
    batch_path = batched and isinstance(proposer, BatchProposer)
    reports_kind = isinstance(proposer, ReportsDraftKind)
    req_id = row.id if req_id is None else req_id
    seq = np.concatenate([row.prompt, row.response]).astype(np.int32)
    p, n = len(row.prompt), len(row.response)
    out = Walk(row.id, p, n)
    seen, i = 0, 1
    while i < n:
        end = p + i
        req = DraftRequest(req_id, seq[:end], end - seen, max_draft)
        t0 = clock()
        if batch_path:
            drafts = proposer.propose_batch(DraftBatch([req_id], [req.tokens], np.array([end]),
                                                       np.array([req.num_new]), np.array([max_draft]))).drafts()
        else:
            drafts = proposer.propose([req])
        took = clock() - t0
        check_drafts([req], drafts)
        draft = drafts[0]
        a = verified(draft.tokens, seq[end:], max_draft if fill else None, int(seq[end - 1]))
        out.record(i, draft, a, proposer.draft_kind(req_id) if reports_kind and draft.tokens else None, took)
        seen = end
        i += a + 1
    if out.pos:
        t0 = clock()
        proposer.finish(req_id)
        out.finish_ns = clock() - t0
    return out


def walk_interleaved(proposer: Proposer, rows: Sequence[Row], max_draft: int, concurrency: int,
                     clock: Callable[[], int] = time.perf_counter_ns, fill: bool = False) -> list[Walk]:
    """Replay `rows` with up to `concurrency` of them in flight, one `propose` call a step over all of them;
    returns their walks in row order (each as `walk` would record it, but for the neighbours it drafted beside)."""
    reports_kind = isinstance(proposer, ReportsDraftKind)
    walks = [Walk(row.id, len(row.prompt), len(row.response)) for row in rows]
    seqs: dict[int, np.ndarray] = {}
    flight: dict[int, list[int]] = {}  # row index -> [response position, tokens seen by the proposer]
    queue = iter(range(len(rows)))
    while True:
        while len(flight) < concurrency and (r := next(queue, None)) is not None:
            if len(rows[r].response) > 1:  # a one-token response is emitted by its prefill alone
                seqs[r] = np.concatenate([rows[r].prompt, rows[r].response]).astype(np.int32)
                flight[r] = [1, 0]
        if not flight:
            return walks
        order = list(flight)
        reqs = []
        for r in order:
            i, seen = flight[r]
            end = len(rows[r].prompt) + i
            reqs.append(DraftRequest(rows[r].id, seqs[r][:end], end - seen, max_draft))
        t0 = clock()
        drafts = proposer.propose(reqs)
        share = (clock() - t0) // len(reqs)
        check_drafts(reqs, drafts)
        for r, req, draft in zip(order, reqs, drafts):
            out, end = walks[r], len(req.tokens)
            a = verified(draft.tokens, seqs[r][end:], max_draft if fill else None, int(seqs[r][end - 1]))
            out.record(flight[r][0], draft, a,
                       proposer.draft_kind(req.req_id) if reports_kind and draft.tokens else None, share)
            flight[r] = [flight[r][0] + a + 1, end]
            if flight[r][0] >= out.response_len:
                t1 = clock()
                proposer.finish(req.req_id)
                out.finish_ns = clock() - t1
                del flight[r], seqs[r]


def update_ns(proposer: Any, rows: Sequence[Row], walks: Sequence[Walk],
              clock: Callable[[], int] = time.perf_counter_ns) -> tuple[int, int]:
    """(ns spent in `append`, tokens appended), feeding each request the chunks its walk fed."""
    total_ns = total_tokens = 0
    for row, w in zip(rows, walks):
        if not w.pos:
            continue
        seq = np.concatenate([row.prompt, row.response]).astype(np.int32)
        ends = [row.prompt.size + i for i in w.pos]
        proposer.start(row.id, seq[: ends[0]])
        for a, b in zip(ends, ends[1:]):
            chunk = seq[a:b]
            t0 = clock()
            proposer.append(row.id, chunk)
            total_ns += clock() - t0
            total_tokens += b - a
        proposer.finish(row.id)
    return total_ns, total_tokens


@runtime_checkable
class UpdatesInPlace(Protocol):
    """A proposer with the low-level per-request API the replay also times (the suffix tree's): `start` a request
    with its prompt, then `append` what it generates."""

    def start(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None: ...

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None: ...


def has_update_path(proposer: Any) -> bool:
    return isinstance(proposer, UpdatesInPlace)


# ---- statistics ---------------------------------------------------------------------------------


def summarize(walks: Sequence[Walk], update: tuple[int, int] | None) -> dict[str, Any]:
    acc = np.array([a for w in walks for a in w.accepted], dtype=np.int64)
    dr = np.array([d for w in walks for d in w.drafted], dtype=np.int64)
    firsts = [w.propose_ns[0] / 1e3 for w in walks if w.propose_ns]
    us = np.array([t / 1e3 for w in walks for t in w.propose_ns], dtype=np.float64)
    steps = int(acc.size)
    response_tokens = sum(w.response_len for w in walks)
    finished = [w for w in walks if w.pos]

    def pct(q: float) -> float | None:
        return round(float(np.percentile(us, q)), 3) if steps else None

    return {
        "requests": len(walks),
        "steps": steps,
        "response_tokens": response_tokens,
        "acceptance_length": round(float((acc + 1).mean()), 4) if steps else None,
        "drafted_tokens": int(dr.sum()),
        "accepted_tokens": int(acc.sum()),
        "acceptance_rate": round(float(acc.sum() / dr.sum()), 4) if dr.sum() else None,
        "mean_draft_len": round(float(dr.mean()), 4) if steps else None,
        "draft_step_fraction": round(float((dr > 0).mean()), 4) if steps else None,
        "speculate_us_median": pct(50),
        "speculate_us_mean": round(float(us.mean()), 3) if steps else None,
        "speculate_us_p90": pct(90),
        "speculate_us_p99": pct(99),
        "start_us_median": round(statistics.median(firsts), 3) if firsts else None,
        "propose_us_per_token": round(float(us.sum()) / response_tokens, 4) if response_tokens else None,
        "update_us_per_token": (round(update[0] / 1e3 / update[1], 4) if update and update[1] else None),
        "update_tokens": update[1] if update else None,
        "finish_us_per_token": (round(sum(w.finish_ns for w in finished) / 1e3 /
                                      max(1, sum(w.response_len for w in finished)), 4)),
        "finish_us_median": (round(statistics.median(w.finish_ns / 1e3 for w in finished), 3) if finished else None),
    }


def update_note(name: str, proposer: Any) -> str:
    if not has_update_path(proposer):
        return "stateless: no incremental state; all work is in propose"
    if name == "arctic":
        return "SuffixDecodingCache.add_active_response (local + global tree), separate pass"
    return f"{type(proposer).__name__}.append, separate pass"


# ---- driver -------------------------------------------------------------------------------------


@dataclass
class WorkloadResult:
    name: str
    file: str
    rows: list[Row]
    walks: dict[str, list[Walk]]
    updates: dict[str, tuple[int, int] | None]
    wall_s: dict[str, float]


def run_workload(name: str, file: str, rows: list[Row], proposers: list[str],
                 options: dict[str, dict[str, Any]], max_draft: int,
                 advance: Callable[[], None] = lambda: None, batched: bool = False,
                 concurrency: int = 1, fill: bool = False) -> WorkloadResult:
    instances = {p: make_proposer(p, options.get(p), verifies_all=fill) for p in proposers}
    walks: dict[str, list[Walk]] = {p: [] for p in proposers}
    wall = {p: 0.0 for p in proposers}
    if concurrency > 1:  # each proposer replays the whole workload in turn, its requests interleaved
        for p, inst in instances.items():
            t0 = time.perf_counter()
            walks[p] = walk_interleaved(inst, rows, max_draft, concurrency, fill=fill)
            wall[p] += time.perf_counter() - t0
            for _ in rows:
                advance()
    else:
        for row in rows:
            for p, inst in instances.items():  # proposers take turns row by row
                t0 = time.perf_counter()
                walks[p].append(walk(inst, row, max_draft, batched=batched, fill=fill))
                wall[p] += time.perf_counter() - t0
                advance()
    updates: dict[str, tuple[int, int] | None] = {}
    for p, inst in instances.items():
        if has_update_path(inst):
            updates[p] = update_ns(make_proposer(p, options.get(p), verifies_all=fill), rows, walks[p])
        else:
            updates[p] = None
        advance()
    return WorkloadResult(name, file, rows, walks, updates, {p: round(w, 3) for p, w in wall.items()})


def workload_json(res: WorkloadResult, notes: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "file": res.file,
        "rows": len(res.rows),
        "prompt_tokens": int(sum(r.prompt.size for r in res.rows)),
        "response_tokens": int(sum(r.response.size for r in res.rows)),
        "proposers": {},
    }
    for p, ws in res.walks.items():
        out["proposers"][p] = {**summarize(ws, res.updates[p]), "wall_s": res.wall_s[p],
                               "update_covers": notes[p]}
    return out


def pooled_json(results: list[WorkloadResult], notes: dict[str, str]) -> dict[str, Any]:
    out = {}
    for p in results[0].walks:
        ws = [w for r in results for w in r.walks[p]]
        ups = [r.updates[p] for r in results]
        up = None if any(u is None for u in ups) else (sum(u[0] for u in ups), sum(u[1] for u in ups))
        out[p] = {**summarize(ws, up), "wall_s": round(sum(r.wall_s[p] for r in results), 3),
                  "update_covers": notes[p]}
    return out


def write_traces(out_dir: Path, res: WorkloadResult, options: dict[str, dict[str, Any]], max_draft: int,
                 accounting: str = "drafted") -> None:
    d = out_dir / res.name
    d.mkdir(parents=True, exist_ok=True)
    for p, ws in res.walks.items():
        write_trace(d / f"{p}.json", trace_document(workload=res.name, file=res.file, proposer=p,
                                                    options=options.get(p, {}), max_draft=max_draft,
                                                    requests=[w.trace() for w in ws], accounting=accounting))


def _fmt(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _ratio(v: float | None, ref: float | None) -> str:
    return "—" if v is None or not ref else f"{v / ref:.2f}×"


def render_table(title: str, stats: dict[str, dict[str, Any]], baseline: str | None) -> Any:
    from rich.table import Table

    ref = stats.get(baseline) if baseline else None
    t = Table(title=title + (f" (× = ratio to {baseline})" if ref else ""), title_justify="left")
    x = "×" if ref else ""
    for col in ("proposer", "steps", "accept len", x, "acc. rate", "spec µs med", x, "spec µs mean", "spec µs p99",
                "propose µs/tok", "update µs/tok", "finish µs/tok"):
        if col == "proposer":
            t.add_column(col, no_wrap=True, min_width=max(map(len, stats), default=8))
        else:
            t.add_column(col, justify="right")
    for p, s in stats.items():
        t.add_row(
            p, str(s["steps"]), _fmt(s["acceptance_length"], 3),
            _ratio(s["acceptance_length"], ref and ref["acceptance_length"]),
            _fmt(s["acceptance_rate"], 3), _fmt(s["speculate_us_median"], 1),
            _ratio(s["speculate_us_median"], ref and ref["speculate_us_median"]),
            _fmt(s["speculate_us_mean"], 1), _fmt(s["speculate_us_p99"], 1), _fmt(s["propose_us_per_token"], 2),
            _fmt(s["update_us_per_token"], 2), _fmt(s["finish_us_per_token"], 2),
        )
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.replay",
                                 description="Replay recorded responses through proposers; report acceptance and cost.")
    ap.add_argument("--workload", action="append", required=True, help="JSONL of {id, prompt, response} (repeatable)")
    ap.add_argument("--proposers", default=DEFAULT_PROPOSERS, help=f"comma-separated (default {DEFAULT_PROPOSERS})")
    ap.add_argument("--max-draft", type=int, default=16, help="draft cap K per step (default 16)")
    ap.add_argument("--options", action="append", default=[], metavar="NAME=JSON",
                    help="proposer options, e.g. suffix_tree='{\"max_depth\":64}', or a JSON {name: {...}}")
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--trace-out", type=Path, help="write per-step traces to DIR/<workload>/<proposer>.json")
    ap.add_argument("--limit", type=int, help="first N rows of each workload")
    ap.add_argument("--tokenizer", help="Hugging Face tokenizer folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--baseline", help="proposer the ratio columns divide by (default: arctic if listed, else the first)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--batched", action="store_true",
                    help="draft through each proposer's batched serving path (propose_batch) where it has one")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="requests in flight at once, interleaved step by step as an engine batches them (default 1)")
    ap.add_argument("--accounting", choices=("drafted", "mrv2"), default="drafted",
                    help="drafted: only drafted tokens are verified (vLLM's V1 runner); mrv2: every draft is padded "
                         "to K with the last token and all K verified (vLLM 0.34's Model Runner V2), and proposers "
                         "that shape their drafts for the runner are told so (the suffix tree's fill: auto)")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    try:
        names = [p.strip() for p in args.proposers.split(",") if p.strip()]
        if not names:
            raise ValueError("--proposers: empty list")
        if len(set(names)) != len(names):
            raise ValueError(f"--proposers: listed twice: {args.proposers}")
        if args.max_draft < 1:
            raise ValueError(f"--max-draft: expected >= 1, got {args.max_draft}")
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit: expected >= 1, got {args.limit}")
        if args.concurrency < 1:
            raise ValueError(f"--concurrency: expected >= 1, got {args.concurrency}")
        if args.concurrency > 1 and args.batched:
            raise ValueError("--batched: one request a call; not with --concurrency > 1")
        options = parse_options(args.options)
        stray = set(options) - set(names)
        if stray:
            raise ValueError(f"--options for proposers not in --proposers: {', '.join(sorted(stray))}")
        baseline = args.baseline or ("arctic" if "arctic" in names else names[0])
        if baseline not in names:
            raise ValueError(f"--baseline {baseline!r} is not in --proposers")
        probes = {p: make_proposer(p, options.get(p)) for p in names}  # fail fast on names and options
        for f in args.workload:
            if not Path(f).is_file():
                raise ValueError(f"--workload {f}: no such file")
        tok = TextTokenizer(args.tokenizer)
        workloads = []
        seen_names: set[str] = set()
        for f in args.workload:
            name = Path(f).stem
            while name in seen_names:
                name += "_"
            seen_names.add(name)
            rows = load_workload(f, tok, args.limit)
            if not rows:
                raise ValueError(f"--workload {f}: no rows (expected JSON lines with id, prompt, response)")
            workloads.append((name, f, rows))
    except (ValueError, ImportError, OSError) as exc:
        err.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 2
    notes = {p: update_note(base_name(p), inst) for p, inst in probes.items()}
    del probes
    options = {p: effective_options(p, options.get(p)) for p in names}

    results: list[WorkloadResult] = []
    total = sum(len(rows) * len(names) + len(names) for _, _, rows in workloads)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=args.no_progress, transient=True) as progress:
        task = progress.add_task("replay", total=total)
        for name, f, rows in workloads:
            progress.update(task, description=f"replay {name}")
            results.append(run_workload(name, f, rows, names, options, args.max_draft,
                                        lambda: progress.advance(task), batched=args.batched,
                                        concurrency=args.concurrency, fill=args.accounting == "mrv2"))

    report: dict[str, Any] = {
        "format": RESULT_FORMAT,
        "config": {"max_draft": args.max_draft, "proposers": names, "options": options, "tokenizer": tok.path,
                   "limit": args.limit, "baseline": baseline, "concurrency": args.concurrency,
                   "accounting": args.accounting},
        "workloads": {r.name: workload_json(r, notes) for r in results},
        "proposers": pooled_json(results, notes),
    }
    out = Console() if sys.stdout.isatty() else Console(width=170)
    for r in results:
        w = report["workloads"][r.name]
        out.print(render_table(f"{r.name}: {w['rows']} requests, {w['response_tokens']} response tokens, "
                               f"K={args.max_draft}" + (f", {args.concurrency} at once" if args.concurrency > 1 else "")
                               + (", all K verified (MRV2)" if args.accounting == "mrv2" else ""),
                               w["proposers"], baseline))
    if len(results) > 1:
        out.print(render_table(f"all workloads, K={args.max_draft}", report["proposers"], baseline))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        err.print(f"wrote {args.json}")
    if args.trace_out:
        for r in results:
            write_traces(args.trace_out, r, options, args.max_draft, args.accounting)
        err.print(f"wrote traces under {args.trace_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
