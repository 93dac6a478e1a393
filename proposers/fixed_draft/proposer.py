"""Always draft `length` copies of one token (capped by the step's max_draft).

This proposer makes no attempt to be accepted: it exists so that a profiler can make the engine
verify a chosen number of tokens per request and step (1 + length) and time that step. Its drafts
are almost always rejected, so a request still advances about one token per step.
"""

from __future__ import annotations

from typing import Sequence

import pydantic

from spec_plugins.core import Draft, DraftRequest


class FixedDraftProposer:
    name = "fixed_draft"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        length: int = pydantic.Field(ge=0)
        # The token id to repeat; None repeats each request's last token.
        token: int | None = pydantic.Field(default=None, ge=0)
        # Draft for at most this many requests of each step (the first ones); None: all. Times a step where
        # only some requests draft (whether drafting at all costs per request or per batch).
        max_requests: int | None = pydantic.Field(default=None, ge=0)

    def __init__(self, length: int, token: int | None = None, max_requests: int | None = None) -> None:
        opts = self.Options(length=length, token=token, max_requests=max_requests)
        self.length, self.token, self.max_requests = opts.length, opts.token, opts.max_requests

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        drafts = []
        for i, r in enumerate(requests):
            n = min(self.length, r.max_draft)
            if self.max_requests is not None and i >= self.max_requests:
                n = 0
            if n == 0 or (self.token is None and len(r.tokens) == 0):
                drafts.append(Draft())  # nothing to repeat in an empty context
                continue
            token = self.token if self.token is not None else int(r.tokens[-1])
            drafts.append(Draft([token] * n))
        return drafts

    def finish(self, req_id) -> None:
        pass
