"""The engine-free core: what a proposer sees, what it returns, and the two protocols.

Adapters (vLLM, TensorRT-LLM, the reference engine) translate their own per-step state into
`DraftRequest`s, ask a `DraftLengthPolicy` for caps, call a `Proposer`, and check every `Draft`
against its cap with `check_drafts`. Nothing here imports an engine or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np
import pydantic

ReqId = Hashable


@dataclass
class DraftRequest:
    """One request in one drafting step.

    tokens:    the full committed context (prompt + accepted output), oldest first.
    num_new:   tokens appended since this request was last seen (len(tokens) on its first step).
    max_draft: the cap for this step, chosen by the policy; a proposer may return fewer tokens.
    features:  target hidden states for model-based drafters; None for model-free ones.
    """

    req_id: ReqId
    tokens: Sequence[int]
    num_new: int
    max_draft: int
    features: Any = None

    def __post_init__(self) -> None:
        check_cap(self.max_draft, f"DraftRequest({self.req_id!r}).max_draft", allow_zero=True)
        if self.num_new < 0:
            raise ValueError(f"DraftRequest({self.req_id!r}).num_new: expected >= 0, got {self.num_new}")


@dataclass
class Draft:
    """Proposed continuation of one request.

    probs:      draft distribution per position, shape [len(tokens), vocab], or None (one-hot drafts).
    confidence: per-position conditional acceptance estimates in [0, 1], or None.
    """

    tokens: list[int] = field(default_factory=list)
    probs: Any = None
    confidence: list[float] | None = None

    def __len__(self) -> int:
        return len(self.tokens)


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens for a batch of requests. Engine-free; state is keyed by req_id.

    Optional: `load(target)` for drafters that need the target model (shared embeddings, LM head).
    """

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]: ...

    def finish(self, req_id: ReqId) -> None: ...


@runtime_checkable
class DraftLengthPolicy(Protocol):
    """Chooses each request's draft cap for this step and learns from what was accepted."""

    def caps(self, requests: Sequence[DraftRequest]) -> list[int]:
        """Per-request caps (0 allowed: do not draft this request this step).

        `requests[i].max_draft` holds the hard limit (engine K, context room); a cap never exceeds it.
        """
        ...

    def observe(self, req_id: ReqId, drafted: int, accepted: int) -> None: ...

    def finish(self, req_id: ReqId) -> None: ...

    # Optional: `trim(requests, drafts) -> list[int]`, the length to keep of each draft, called after
    # drafting so a policy can use the drafts' own confidences (see `apply_trim`).


def check_cap(value: Any, name: str, *, allow_zero: bool = False) -> int:
    """Validate a draft cap: an int, > 0 (or >= 0 when a policy may skip drafting)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    low = 0 if allow_zero else 1
    if value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value}")
    return int(value)


def check_drafts(requests: Sequence[DraftRequest], drafts: Sequence[Draft], who: str = "proposer") -> None:
    """Raise ValueError unless there is one draft per request and each respects its cap."""
    if len(drafts) != len(requests):
        raise ValueError(f"{who}: returned {len(drafts)} drafts for {len(requests)} requests")
    for req, draft in zip(requests, drafts):
        if len(draft.tokens) > req.max_draft:
            raise ValueError(
                f"{who}: draft for request {req.req_id!r} has {len(draft.tokens)} tokens, cap is {req.max_draft}"
            )
        if draft.probs is not None and len(draft.probs) != len(draft.tokens):
            raise ValueError(
                f"{who}: draft for request {req.req_id!r} has {len(draft.probs)} prob rows for "
                f"{len(draft.tokens)} tokens"
            )
        if draft.confidence is not None and len(draft.confidence) != len(draft.tokens):
            raise ValueError(
                f"{who}: draft for request {req.req_id!r} has {len(draft.confidence)} confidences for "
                f"{len(draft.tokens)} tokens"
            )


class FixedLength:
    """The engines' default: always draft up to the hard cap."""

    name = "fixed"

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        max_draft: int | None = pydantic.Field(default=None, ge=1)

    def __init__(self, max_draft: int | None = None) -> None:
        self.max_draft = None if max_draft is None else check_cap(max_draft, "policy.max_draft")

    def caps(self, requests: Sequence[DraftRequest]) -> list[int]:
        if self.max_draft is None:
            return [r.max_draft for r in requests]
        return [min(self.max_draft, r.max_draft) for r in requests]

    def observe(self, req_id: ReqId, drafted: int, accepted: int) -> None:
        pass

    def finish(self, req_id: ReqId) -> None:
        pass


def apply_policy(policy: DraftLengthPolicy, requests: list[DraftRequest]) -> list[DraftRequest]:
    """Lower each request's max_draft to the policy's cap (never raise it)."""
    caps = policy.caps(requests)
    if len(caps) != len(requests):
        raise ValueError(f"policy: returned {len(caps)} caps for {len(requests)} requests")
    for req, cap in zip(requests, caps):
        cap = check_cap(cap, f"policy cap for request {req.req_id!r}", allow_zero=True)
        req.max_draft = min(req.max_draft, cap)
    return requests


def truncate(draft: Draft, n: int) -> Draft:
    """The first `n` positions of `draft` (tokens, probs and confidences alike)."""
    if n >= len(draft.tokens):
        return draft
    return Draft(
        tokens=list(draft.tokens[:n]),
        probs=None if draft.probs is None else draft.probs[:n],
        confidence=None if draft.confidence is None else list(draft.confidence[:n]),
    )


def apply_trim(policy: DraftLengthPolicy, requests: Sequence[DraftRequest], drafts: list[Draft]) -> list[Draft]:
    """Shorten drafts to the lengths a policy's optional `trim(requests, drafts)` keeps (never lengthen).

    Called after `check_drafts`; policies without `trim` leave the drafts as they are.
    """
    trim = getattr(policy, "trim", None)
    if trim is None:
        return drafts
    lengths = trim(requests, drafts)
    if len(lengths) != len(drafts):
        raise ValueError(f"policy: trim returned {len(lengths)} lengths for {len(drafts)} drafts")
    out = []
    for req, draft, n in zip(requests, drafts, lengths):
        n = check_cap(n, f"policy trim length for request {req.req_id!r}", allow_zero=True)
        out.append(truncate(draft, n))
    return out
