"""SuffixDecoding proposer (Oliaro et al., arXiv 2411.04975) on a compiled suffix-tree core.

Each request gets a suffix tree over its own prompt and output; finished responses go into a
global tree bounded to the `max_cached_requests` most recent (FIFO). A draft follows the most
frequent continuation of a suffix of the context; each token's confidence is its path
probability (product of child count / parent count), and the draft with the highest sum of
probabilities (expected accepted tokens) over match lengths and both trees wins. The per-match
budget is floor(max_spec_factor * match_len + max_spec_offset), capped by the engine's cap.

Copy drafts (``copy_drafts``, on by default) add a second kind of candidate: continue the request's
own text from an earlier occurrence of its tail -- near where a copy last broke off (an edit), else
the oldest (short tails) or most recent (long tails) occurrence -- with a per-token probability
calibrated on match length, h(m) = 1 - c / (m + d). The count draft's score is discounted by the
same h before the two compare, and the copy wins ties. This is what lifts code edits and looping
answers (docs/notes/suffix-tree-variants.md); ``copy_min_prob`` trades draft length for acceptance.

All the work is in `_core` (`_core.cpp` over the headers beside it: `tree.hpp` the suffix tree, `copier.hpp` the
copy drafts, `cache.hpp` the requests, the global tree and the batched step, `ahead.hpp` the tokens appended
ahead); this class maps request ids and checks the context.
`propose_batch` is the serving path: one call into the core per engine step for the whole batch
(ingest every request's new tokens, then draft all of them with the GIL released, on worker threads
from `parallel_from` requests up, the appends of `interleave` requests at a time taken in turns so that
one tree's memory loads overlap the others' work); its drafts are the same as `propose`'s for the same
histories. With `append_ahead` each batched step ends by handing the drafts' leading tokens (path probability >=
`ahead_min_prob`) to a thread of its own, which appends them to the trees tentatively (journaled) while the
engine verifies; the next step keeps those that agree with the engine's new tokens and takes the rest back, so
the step appends only what was not guessed (a step with fewer than `ahead_min_tokens` such tokens in all hands
none over: waking the thread would cost more). Drafts are the same with it or without.
"""

from __future__ import annotations

from typing import Any, Hashable, Literal, Sequence

import numpy as np
import pydantic

from spec_plugins import _ledger
from spec_plugins.core import BatchDrafts, Draft, DraftBatch, DraftRequest

try:
    from spec_plugins.proposers.suffix_tree import _core
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "spec_plugins.proposers.suffix_tree._core is not built; install the package with `pip install -e .` "
        f"(needs a C++17 compiler): {exc}"
    ) from exc


class SuffixTreeProposer:
    name = "suffix_tree"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
        # 24, as vLLM's `suffix` method: with copy drafts, depth 64 drafts no better and costs twice as much.
        max_depth: int = pydantic.Field(
            default=24, ge=1, le=4096, description="longest match + count draft, in tokens (copies: match only)"
        )
        max_cached_requests: int = pydantic.Field(
            default=10000, ge=0, le=2**31 - 1, description="finished responses kept (FIFO); 0: no global tree"
        )
        max_spec_factor: float = pydantic.Field(default=1.0, ge=0.0, le=1e6)
        max_spec_offset: float = pydantic.Field(default=0.0, ge=-1e6, le=1e6)
        min_token_prob: float = pydantic.Field(default=0.1, ge=0.0, le=1.0)
        cache_in_flight: bool = pydantic.Field(
            default=False, description="also put responses in the global tree while they are generated"
        )
        # Copy drafts (copier.hpp, where these constants are explained): continue the request's own text from an
        # earlier occurrence of its tail; they compete with the count drafts on expected accepted tokens.
        copy_drafts: bool = pydantic.Field(default=True, description="also draft by copying the request's own text")
        copy_min_prob: float = pydantic.Field(
            default=0.05, ge=0.0, le=1.0, description="copy drafts stop below this path probability"
        )
        copy_window: int = pydantic.Field(
            default=16, ge=0, le=10**6, description="after an edit, look this far past the old position"
        )
        copy_near_len: int = pydantic.Field(
            default=8, ge=0, le=10**6, description="tails up to this long prefer the old position / oldest copy"
        )
        copy_anchor_run: int = pydantic.Field(
            default=3, ge=0, le=10**6, description="a copy this long that breaks off marks the old position"
        )
        copy_oldest_from: int = pydantic.Field(
            default=2, ge=0, le=10**6, description="short tails this long copy their oldest occurrence (0: never)"
        )
        copy_near_bonus: float = pydantic.Field(
            default=2.0, ge=0.0, le=1e6, description="a copy near the old position counts as this many more matches"
        )
        # Fitted on the replays: a near copy's first token is right about as often as after 1.5 matches.
        copy_near_first_bonus: float = pydantic.Field(
            default=0.5, ge=0.0, le=1e6, description="a near copy's first token counts this many more matches "
            "(whether the edit is over at all is uncertain; copy_near_bonus from its second token)"
        )
        # Per-token reliability of a copy after m matched tokens: 1 - c / (m + d), fitted on the replays; the
        # defaults are the n-gram proposer's constants too (spec_plugins/copy_hazard.hpp).
        copy_hazard_c: float = pydantic.Field(default=_core.HAZARD_C, ge=0.0, le=1e6)
        copy_hazard_d: float = pydantic.Field(default=_core.HAZARD_D, ge=0.0, le=1e6)
        copy_disagree_factor: float = pydantic.Field(
            default=0.7, ge=0.0, le=1.0, description="where the copy and the count draft start with different "
            "tokens, the chosen draft's path probabilities times this (the same tokens; 1: off)"
        )
        # Drafts shaped by the runner: vLLM 0.34's Model Runner V2 and TensorRT-LLM verify every one of the K slots,
        # padding a short draft; the tree's own path continued is a better guess than the padding.
        fill: bool | Literal["auto"] = pydantic.Field(
            default="auto", description="draft all max_draft tokens: past where the confidence ends, the chosen "
            "path (or copy) goes on with falling confidences. auto: on where the engine adapter says its runner "
            "verifies every slot (vLLM 0.34's Model Runner V2, TensorRT-LLM), off where only drafted tokens are "
            "verified (vLLM's V1 runner)")
        # Batched drafting on this host: the drafts are the same whatever these are.
        threads: int = pydantic.Field(
            default=-1, ge=-1, le=256, description="worker threads for a batched step (-1: one per extra core, <= 7)"
        )
        parallel_from: int = pydantic.Field(default=64, ge=1, description="batch size from which threads are used")
        interleave: int = pydantic.Field(
            default=16, ge=1, le=32, description="requests whose appends a batched step interleaves (1: none)"
        )
        # Off the engine's step: the drafts' leading tokens go into the trees while the engine verifies them.
        append_ahead: bool | Literal["auto"] = pydantic.Field(
            default="auto", description="after each batched step, append the drafts' likely tokens on a thread of "
            "their own (for a GPU engine: the host is idle while it verifies); the same drafts. auto: on where "
            "the engine adapter says its forward runs on an accelerator, and not with cache_in_flight"
        )
        ahead_min_prob: float = pydantic.Field(
            default=0.5, ge=0.0, le=1.0, description="append ahead the draft tokens whose path probability is >= this"
        )
        # Handing a step's tokens to their thread costs about what appending several tokens does (waking it,
        # taking back what the engine rejects).
        ahead_min_tokens: int = pydantic.Field(
            default=8, ge=0, le=2**31 - 1, description="a step with fewer such tokens in all appends none ahead"
        )

    def __init__(self, **options: Any) -> None:
        try:
            self.options = self.Options(**options)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"SuffixTreeProposer option {where}: {first['msg']} (got {first.get('input')!r})") from None
        o = self.options
        self._core = _core.SuffixCache(
            max_depth=o.max_depth,
            max_cached_requests=o.max_cached_requests,
            cache_in_flight=o.cache_in_flight,
            max_spec_factor=o.max_spec_factor,
            max_spec_offset=o.max_spec_offset,
            min_token_prob=o.min_token_prob,
            copy=o.copy_drafts,
            copy_min_prob=o.copy_min_prob,
            copy_window=o.copy_window,
            copy_near_len=o.copy_near_len,
            copy_anchor_run=o.copy_anchor_run,
            copy_oldest_from=o.copy_oldest_from,
            copy_near_bonus=o.copy_near_bonus,
            copy_near_first_bonus=o.copy_near_first_bonus,
            copy_hazard_c=o.copy_hazard_c,
            copy_hazard_d=o.copy_hazard_d,
            copy_disagree_factor=o.copy_disagree_factor,
        )
        self._core.set_parallel(o.threads, o.parallel_from, o.interleave)
        self._core.set_fill(o.fill is True)
        try:
            self._core.set_ahead(o.append_ahead is True, o.ahead_min_prob, o.ahead_min_tokens)
        except ValueError as exc:
            raise ValueError(f"SuffixTreeProposer option {exc}") from None
        self._keys: dict[Hashable, int] = {}
        self._next_key = 0

    # ---- Proposer protocol ----------------------------------------------------------------------
    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        core, keys, out = self._core, self._keys, []
        for r in requests:
            key = keys.get(r.req_id)
            if key is None:  # first sight: the whole context is the prompt
                key = self._new_key(r.req_id, r.tokens)
                tokens, conf, _, _ = core.speculate(key, r.max_draft)
            else:
                try:
                    tokens, conf, _, _ = core.sync_speculate(key, r.tokens, r.num_new, r.max_draft)
                except ValueError:
                    # The context is not this request's previous context plus num_new tokens: the
                    # id now names another request (an engine that reuses batch rows as ids) or the
                    # request was recomputed. Finish the old one and start over from this context.
                    self.finish(r.req_id)
                    key = self._new_key(r.req_id, r.tokens)
                    tokens, conf, _, _ = core.speculate(key, r.max_draft)
            out.append(Draft(tokens, None, _conditional(conf)))
        return out

    def propose_batch(self, batch: DraftBatch) -> BatchDrafts:
        keys = self._keys
        ks, unknown = _ledger.lookup_slots(keys, batch.req_ids)
        if unknown:  # first sight of some: new keys
            for i in np.flatnonzero(ks < 0).tolist():
                ks[i] = keys[batch.req_ids[i]] = self._next_key
                self._next_key += 1
        try:
            tokens, confidence, offsets, _ = self._core.step_batch(
                ks, batch.contexts, batch.rows, batch.context_lens, batch.num_new, batch.max_draft)
        except ValueError as exc:
            raise ValueError(f"suffix_tree: {exc}") from None
        return BatchDrafts(tokens, offsets, confidence)

    def engine_on_accelerator(self, on_accelerator: bool) -> None:
        """`append_ahead: auto` follows the engine: on beside an accelerator's forward (core.RunsBesideEngine)."""
        o = self.options
        if o.append_ahead == "auto" and not o.cache_in_flight:
            self._core.set_ahead(on_accelerator, o.ahead_min_prob, o.ahead_min_tokens)

    def runner_verifies_all(self, verifies_all: bool) -> None:
        """`fill: auto` follows the runner: on where every draft slot is verified (core.ShapesDraftsForRunner)."""
        if self.options.fill == "auto":
            self._core.set_fill(verifies_all)

    @property
    def fills(self) -> bool:
        """Whether drafts are filled to max_draft now (`fill`, "auto" resolved)."""
        return self._core.fills

    @property
    def appends_ahead(self) -> bool:
        """Whether batched steps append their drafts ahead now (`append_ahead`, "auto" resolved)."""
        return self._core.appends_ahead

    def wait_ahead(self) -> None:
        """Returns once the last batched step's tentative appends (`append_ahead`) are done: what an engine's
        verification step would have to outlast for them to cost the step nothing (benchmarks time it)."""
        self._core.wait_ahead()

    def finish(self, req_id: Hashable) -> None:
        """Moves the response into the global tree and frees the request (unknown ids are ignored)."""
        key = self._keys.pop(req_id, None)
        if key is not None:
            self._core.finish(key)

    # ---- low-level API (replay benchmarks, tests) -----------------------------------------------
    def start(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        if req_id in self._keys:
            raise ValueError(f"suffix_tree: request {req_id!r} is already started")
        self._new_key(req_id, prompt_ids)

    def append(self, req_id: Hashable, token_ids: Sequence[int]) -> None:
        self._core.append(self._key(req_id), token_ids)

    def speculate(self, req_id: Hashable, max_tokens: int) -> tuple[list[int], list[float], float, int]:
        """(draft tokens, path probabilities, score = sum of probabilities, match length)."""
        return self._core.speculate(self._key(req_id), max_tokens)

    def draft_kind(self, req_id: Hashable) -> str:
        """Which candidate the request's last draft came from: "copy" (its own text) or "count" (the trees)."""
        return "copy" if self._core.last_draft_copied(self._key(req_id)) else "count"

    def stats(self) -> dict[str, int]:
        c = self._core
        return {
            "active_requests": c.num_active,
            "cached_requests": c.num_cached,
            "nodes": c.num_nodes,
            "global_nodes": c.global_nodes,
            "memory_bytes": c.memory_bytes,
            # What the process holds for the large arrays of every suffix tree (page_arena.hpp): those arrays' share
            # of memory_bytes rounded up to their size classes, plus blocks freed and kept for reuse.
            "arena_bytes": c.arena_bytes,
        }

    # ---- helpers --------------------------------------------------------------------------------
    def _new_key(self, req_id: Hashable, prompt: Sequence[int]) -> int:
        key = self._next_key
        try:
            self._core.start(key, prompt)
        except ValueError as exc:
            raise ValueError(f"suffix_tree: request {req_id!r}: {exc}") from None
        self._next_key += 1
        self._keys[req_id] = key
        return key

    def _key(self, req_id: Hashable) -> int:
        key = self._keys.get(req_id)
        if key is None:
            raise ValueError(f"suffix_tree: request {req_id!r} is not active (never started, or finished)")
        return key


def _conditional(path_probs: list[float]) -> list[float]:
    """Draft.confidence is per position, given the earlier draft tokens were accepted; the tree
    gives the probability of the whole path up to each token, so divide by the previous one."""
    out, prev = [], 1.0
    for p in path_probs:
        out.append(p / prev if prev > 0 else 0.0)
        prev = p
    return out
