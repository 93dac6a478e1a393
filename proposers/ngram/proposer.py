"""Prompt-lookup n-gram proposer: the honest baseline.

Find the longest n-gram (max_ngram down to min_ngram tokens) ending the context that also occurs
earlier in the context, take its earliest occurrence (as vLLM's ngram proposer does), and draft the
tokens that followed it. Stateless: every call looks at the whole context.

`propose_batch`, the serving path, runs the same rule for the whole batch in one compiled call
(`_core.cpp`: GIL released, rows spread over threads from `parallel_from` rows up); `lookup` is the
numpy reference it is tested against.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pydantic

from spec_plugins.core import BatchDrafts, Draft, DraftBatch, DraftRequest

try:
    from spec_plugins.proposers.ngram import _core
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "spec_plugins.proposers.ngram._core is not built; install the package with `pip install -e .` "
        f"(needs a C++17 compiler): {exc}"
    ) from exc


class NgramProposer:
    name = "ngram"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        min_ngram: int = pydantic.Field(default=2, ge=1)
        max_ngram: int = pydantic.Field(default=5, ge=1)
        threads: int = pydantic.Field(default=-1, ge=-1, le=256, description="-1: one per extra core, <= 7; 0: none")
        parallel_from: int = pydantic.Field(default=64, ge=1, description="batch size from which threads are used")
        confidence: bool = pydantic.Field(
            default=True, description="per-token confidences from the match length (for the adaptive policy)")

        @pydantic.model_validator(mode="after")
        def _ordered(self) -> "NgramProposer.Options":
            if self.min_ngram > self.max_ngram:
                raise ValueError(f"min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")
            return self

    def __init__(self, min_ngram: int = 2, max_ngram: int = 5, threads: int = -1, parallel_from: int = 64,
                 confidence: bool = True) -> None:
        opts = self.Options(min_ngram=min_ngram, max_ngram=max_ngram, threads=threads, parallel_from=parallel_from,
                            confidence=confidence)
        self.min_ngram, self.max_ngram, self.confidence = opts.min_ngram, opts.max_ngram, opts.confidence
        self._batch = _core.NgramBatch(opts.min_ngram, opts.max_ngram, opts.threads, opts.parallel_from)

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            tokens, match = self.match(np.asarray(r.tokens), r.max_draft)
            conf = [float(match_confidence(match))] * len(tokens) if self.confidence else None
            out.append(Draft(tokens, None, conf))
        return out

    def propose_batch(self, batch: DraftBatch) -> BatchDrafts:
        contexts = batch.contexts
        if batch.rows is None:
            contexts = [np.asarray(c) for c in contexts]
        tokens, offsets, match = self._batch.propose(contexts, batch.rows, batch.context_lens, batch.max_draft)
        if not self.confidence:
            return BatchDrafts(tokens, offsets)
        lengths = offsets[1:] - offsets[:-1]
        return BatchDrafts(tokens, offsets, np.repeat(match_confidence(match), lengths))

    def finish(self, req_id) -> None:
        pass

    def lookup(self, tokens: np.ndarray, max_draft: int) -> list[int]:
        return self.match(tokens, max_draft)[0]

    def match(self, tokens: np.ndarray, max_draft: int) -> tuple[list[int], int]:
        """(draft, length of the n-gram matched): the numpy reference of the compiled batch."""
        n = len(tokens)
        if max_draft <= 0 or n <= self.min_ngram:
            return [], 0
        # Candidate ends j < n-1 whose token equals the last token; extend each match backwards.
        ends = np.flatnonzero(tokens[: n - 1] == tokens[n - 1])
        if ends.size == 0:
            return [], 0
        match_len = np.ones(ends.size, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for d in range(1, min(self.max_ngram, n - 1)):
            back = ends - d
            alive &= back >= 0
            alive[alive] &= tokens[back[alive]] == tokens[n - 1 - d]
            if not alive.any():
                break
            match_len += alive
        best = int(match_len.max())
        if best < self.min_ngram:
            return [], 0
        start = ends[np.argmax(match_len == best)] + 1  # earliest occurrence of the longest match
        draft = tokens[start : start + max_draft].tolist()
        return draft, best if draft else 0


def match_confidence(match_len):
    """Per-token confidence of a draft that continues an n-gram match of `match_len` tokens: the copy-draft
    reliability h(m) = 1 - c / (m + d) the suffix tree uses, with its constants (spec_plugins/copy_hazard.hpp,
    through `_core`), kept within [0.05, 0.95]. Distinct match lengths land in distinct calibration bins, so the
    adaptive policy learns acceptance by match length and draft position instead of from each request's history
    alone."""
    return np.clip(1.0 - _core.HAZARD_C / (np.asarray(match_len, dtype=np.float64) + _core.HAZARD_D), 0.05, 0.95)
