"""The engine-free core: what a proposer sees, what it returns, and the protocols.

Per request: a `DraftRequest` in, a `Draft` out. Per step, columnar: a `DraftBatch` in (request ids,
a token matrix or sequences, lengths, caps), `BatchDrafts` out (flat tokens + offsets), which is what
the drafting layer (`spec_plugins.drafting`) hands a proposer or policy that declares a batched path.
The engine adapters (vLLM, TensorRT-LLM, the reference engine) only translate their step into that
layer. Optional hooks are declared here as protocols, checked once when the layer is built.
Nothing here imports an engine or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np
import pydantic

from spec_plugins import _contract  # compiled with the package (setup.py)

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


@dataclass(slots=True)  # built once per engine step: slots make it and its reads cheaper
class DraftBatch:
    """One drafting step of a whole batch, in columns (row i is one request).

    contexts:     a 2-D token matrix whose row `rows[i]` starts with request i's context (vLLM's
                  `token_ids_cpu`; read in place), or, with rows=None, one token sequence per request.
    context_lens: committed tokens of each request (prompt + accepted output).
    num_new:      tokens appended since the request was last seen (its whole length the first time).
    max_draft:    each request's cap this step; a proposer may return fewer tokens.
    features:     per-request target hidden states for model-based drafters, or None.
    """

    req_ids: Sequence[ReqId]
    contexts: Any
    context_lens: np.ndarray
    num_new: np.ndarray
    max_draft: np.ndarray
    rows: np.ndarray | None = None
    features: Sequence[Any] | None = None

    def __post_init__(self) -> None:
        # Checked in one compiled pass over the columns: this is built once per engine step.
        n = len(self.req_ids)
        height = width = 0
        if self.rows is not None:
            if getattr(self.contexts, "ndim", 0) != 2:
                raise ValueError("DraftBatch.rows: expected one row index per request into a 2-D token matrix")
            height, width = self.contexts.shape
        elif len(self.contexts) != n:
            raise ValueError(f"DraftBatch.contexts: expected {n} sequences, got {len(self.contexts)}")
        # Columns that already are int64 vectors (what the drafting layer builds) are checked as they are.
        if not _contract.batch_columns(n, self.context_lens, self.num_new, self.max_draft, self.rows, height, width):
            for name in ("context_lens", "num_new", "max_draft"):
                col = np.asarray(getattr(self, name))
                if col.shape != (n,) or (n and col.dtype.kind not in "iu"):
                    raise ValueError(f"DraftBatch.{name}: expected {n} integers, got {col.dtype} of shape {col.shape}")
                setattr(self, name, np.ascontiguousarray(col, dtype=np.int64))
            if self.rows is not None:
                self.rows = np.ascontiguousarray(self.rows, dtype=np.int64)
                if self.rows.shape != (n,):
                    raise ValueError("DraftBatch.rows: expected one row index per request into a 2-D token matrix")
            _contract.check_batch(self.context_lens, self.num_new, self.max_draft, self.rows, height, width)
        if self.features is not None and len(self.features) != n:
            raise ValueError(f"DraftBatch.features: expected {n} entries, got {len(self.features)}")

    def __len__(self) -> int:
        return len(self.req_ids)

    def context(self, i: int) -> Sequence[int]:
        """Request i's committed context (a view where the input allows one)."""
        if self.rows is None:
            return self.contexts[i]
        return self.contexts[self.rows[i], : self.context_lens[i]]

    @classmethod
    def from_requests(cls, requests: Sequence["DraftRequest"]) -> "DraftBatch":
        """The step of per-request DraftRequests as one batch (their token sequences, no features)."""
        n = len(requests)
        return cls([r.req_id for r in requests], [r.tokens for r in requests],
                   np.fromiter((len(r.tokens) for r in requests), dtype=np.int64, count=n),
                   np.fromiter((r.num_new for r in requests), dtype=np.int64, count=n),
                   np.fromiter((r.max_draft for r in requests), dtype=np.int64, count=n))

    def select(self, rows: np.ndarray) -> "DraftBatch":
        """The requests at `rows` (increasing) as a batch of their own: the same token matrix, their columns."""
        feats = self.features
        return DraftBatch([self.req_ids[i] for i in rows.tolist()],
                          self.contexts if self.rows is not None else [self.contexts[i] for i in rows.tolist()],
                          self.context_lens[rows], self.num_new[rows], self.max_draft[rows],
                          None if self.rows is None else self.rows[rows],
                          None if feats is None else [feats[i] for i in rows.tolist()])

    def requests(self) -> list[DraftRequest]:
        """The same step as DraftRequests, for proposers and policies without a batched path."""
        feats = self.features
        return [
            DraftRequest(r, self.context(i), int(self.num_new[i]), int(self.max_draft[i]),
                         None if feats is None else feats[i])
            for i, r in enumerate(self.req_ids)
        ]


@dataclass(slots=True)
class BatchDrafts:
    """The drafts of one step: request i drafted tokens[offsets[i]:offsets[i + 1]].

    confidence: per-token conditional acceptance estimates, flat like tokens, or None.
    probs:      per-request draft distributions ([len, vocab] or None each), or None for one-hot drafts.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    confidence: np.ndarray | None = None
    probs: list[Any] | None = None
    lengths: np.ndarray = field(init=False, repr=False)  # offsets[i + 1] - offsets[i]

    def __post_init__(self) -> None:
        # Arrays that already are what they must be (a compiled proposer's) are taken as they are.
        if type(self.tokens) is not np.ndarray:
            self.tokens = np.asarray(self.tokens)
        self.offsets = np.ascontiguousarray(self.offsets, dtype=np.int64)
        self.lengths = _contract.draft_lengths(self.offsets, len(self.tokens))
        if self.confidence is not None:
            if type(self.confidence) is not np.ndarray or self.confidence.dtype != np.float64:
                self.confidence = np.asarray(self.confidence, dtype=np.float64)
            if self.confidence.shape != self.tokens.shape:
                raise ValueError(f"BatchDrafts.confidence: expected {len(self.tokens)} entries, got "
                                 f"{self.confidence.shape}")
        if self.probs is not None and len(self.probs) != len(self.offsets) - 1:
            raise ValueError(f"BatchDrafts.probs: expected {len(self.offsets) - 1} entries, got {len(self.probs)}")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lists(self) -> list[list[int]]:
        """Each request's draft as a list of Python ints (what vLLM and TensorRT-LLM take)."""
        return _contract.draft_lists(np.ascontiguousarray(self.tokens), self.offsets)

    def with_survival(self, survival: np.ndarray) -> "BatchDrafts":
        """These drafts with their confidences replaced by the conditional acceptance probabilities that prefix
        survival `survival` ([n, width]) implies: survival[i, j] / survival[i, j - 1], 0 past `width`."""
        n = len(self)
        surv = np.asarray(survival, dtype=np.float64).reshape(n, -1)
        prev = np.concatenate([np.ones((n, 1)), surv[:, :-1]], axis=1)
        cond = np.divide(surv, prev, out=np.zeros_like(surv), where=prev > 0)
        which = np.repeat(np.arange(n), self.lengths)
        col = np.arange(len(self.tokens)) - np.repeat(self.offsets[:-1], self.lengths)
        inside = col < surv.shape[1]
        conf = np.zeros(len(self.tokens))
        conf[inside] = cond[which[inside], col[inside]]
        return type(self)(self.tokens, self.offsets, conf, self.probs)

    def draft(self, i: int) -> Draft:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return Draft(
            tokens=self.tokens[a:b].tolist(),
            probs=None if self.probs is None else self.probs[i],
            confidence=None if self.confidence is None else self.confidence[a:b].tolist(),
        )

    def drafts(self) -> list[Draft]:
        return [self.draft(i) for i in range(len(self))]

    @classmethod
    def from_drafts(cls, drafts: Sequence[Draft]) -> "BatchDrafts":
        lengths = [len(d.tokens) for d in drafts]
        offsets = np.zeros(len(drafts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.fromiter((int(t) for d in drafts for t in d.tokens), dtype=np.int64, count=int(offsets[-1]))
        confidence = None
        if drafts and any(d.confidence is not None for d in drafts):
            if not all(d.confidence is not None or len(d.tokens) == 0 for d in drafts):
                raise ValueError("drafts: confidences given for some drafts but not others")
            confidence = np.fromiter((float(c) for d in drafts for c in (d.confidence or ())), dtype=np.float64,
                                     count=int(offsets[-1]))
        probs = [d.probs for d in drafts] if any(d.probs is not None for d in drafts) else None
        return cls(tokens, offsets, confidence, probs)

    def select(self, rows: np.ndarray) -> "BatchDrafts":
        """The drafts at `rows` (any rows, repeated or not), in that order."""
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = (np.repeat(self.offsets[:-1][rows] - offsets[:-1], lengths) + np.arange(offsets[-1])).astype(np.int64)
        return BatchDrafts(self.tokens[index], offsets, None if self.confidence is None else self.confidence[index],
                           None if self.probs is None else [self.probs[i] for i in rows.tolist()])

    def truncated(self, keep: np.ndarray) -> "BatchDrafts":
        """The first keep[i] tokens of each draft (never more than it has)."""
        cut = _contract.cut_drafts(self.offsets, np.ascontiguousarray(keep, dtype=np.int64))
        if cut is None:
            return self
        index, offsets = cut
        probs = None if self.probs is None else [
            None if p is None else p[: b - a] for p, a, b in zip(self.probs, offsets[:-1].tolist(), offsets[1:].tolist())]
        return BatchDrafts(self.tokens[index], offsets,
                           None if self.confidence is None else self.confidence[index], probs)


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens for a batch of requests. Engine-free; state is keyed by req_id.

    Optional hooks are the protocols below (`BatchProposer`, `LoadsTarget`, `TapsTarget`, `HasStats`,
    `Configurable`).
    """

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]: ...

    def finish(self, req_id: ReqId) -> None: ...


@runtime_checkable
class BatchProposer(Protocol):
    """A proposer with a batched path: one call per step, identical drafts to `propose` for the same
    histories (tests/test_batched_drafting.py)."""

    def propose_batch(self, batch: DraftBatch) -> BatchDrafts: ...


@runtime_checkable
class LoadsTarget(Protocol):
    """A drafter that needs the target model (shared embeddings, LM head) before its first step."""

    def load(self, target: Any) -> None: ...


@runtime_checkable
class TapsTarget(Protocol):
    """A model-based drafter fed target hidden states: the decoder-layer ids whose outputs it reads
    (`DraftRequest.features`)."""

    target_taps: Sequence[int]


@runtime_checkable
class HasStats(Protocol):
    """A proposer or policy that reports its state for traces and soaks (a proposer: cached requests, nodes,
    bytes; the adaptive policy: its fitted step overhead)."""

    def stats(self) -> dict[str, Any]: ...


@runtime_checkable
class ReportsDraftKind(Protocol):
    """A proposer with several kinds of candidate that says which one the request's last draft came from
    (the suffix tree: "copy" or "count"); replays record it so confidences are calibrated per kind."""

    def draft_kind(self, req_id: ReqId) -> str: ...


@runtime_checkable
class RunsBesideEngine(Protocol):
    """A proposer with work it can leave running between two steps (the suffix tree's `append_ahead`), worth it
    only where the engine's step leaves the host idle: the adapter says whether the engine runs its forward on
    an accelerator, and the proposer's "auto" options follow it (engine-free use leaves them off)."""

    def engine_on_accelerator(self, on_accelerator: bool) -> None: ...


@runtime_checkable
class ShapesDraftsForRunner(Protocol):
    """A proposer whose drafts depend on how the runner verifies them (the suffix tree's `fill`): the adapter says
    whether every one of the K slots is verified whatever the draft's length (vLLM 0.34's Model Runner V2 pads a
    short draft with the last token, TensorRT-LLM with token 0), so a longer draft costs nothing, or only the
    drafted tokens are (vLLM's V1 runner)."""

    def runner_verifies_all(self, verifies_all: bool) -> None: ...


@runtime_checkable
class Configurable(Protocol):
    """A proposer or policy class whose keyword options are a pydantic model (validated by the registry)."""

    Options: type[pydantic.BaseModel]


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


@runtime_checkable
class TrimsDrafts(Protocol):
    """A policy that chooses after drafting, from the drafts' own confidences: the length to keep of each."""

    def trim(self, requests: Sequence[DraftRequest], drafts: Sequence[Draft]) -> list[int]: ...


@runtime_checkable
class ResolvesCost(Protocol):
    """A policy that can settle its step-cost model now, where it would otherwise do so at its first step (reading
    the engine's device): an engine whose steps run where device calls are not allowed asks for it up front."""

    def resolve_cost(self) -> None: ...


@runtime_checkable
class RatesDrafts(Protocol):
    """A policy that estimates, for a step's drafts, the probability that each prefix is accepted (calibrated
    against the verifications it has observed): (prefix survival [n, width], usable lengths [n], raw confidences
    or None). Engines that trim by confidence themselves (vLLM's adaptive verification) are handed these.
    `trim_rated` is the batched trim (BatchPolicy.trim_batch) that also returns each drafted token's conditional
    acceptance estimate (flat, as `drafts`): what `BatchDrafts.with_survival` makes of `survival_batch`, from the
    trim's own survival (the drafting layer's `step(rated=True)`)."""

    def survival_batch(self, req_ids: Sequence[ReqId], drafts: "BatchDrafts"
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]: ...

    def trim_rated(self, batch: "DraftBatch", drafts: "BatchDrafts") -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class BatchPolicy(Protocol):
    """A policy with a batched path (the drafting layer uses it instead of caps/trim/observe). A policy
    that does not trim returns None from `trim_batch`."""

    def caps_batch(self, batch: DraftBatch) -> np.ndarray: ...

    def trim_batch(self, batch: DraftBatch, drafts: BatchDrafts) -> np.ndarray | None: ...

    def observe_batch(self, req_ids: Sequence[ReqId], drafted: np.ndarray, accepted: np.ndarray) -> None: ...


@runtime_checkable
class ObservesStepTime(Protocol):
    """A policy that learns from the engine's measured step time. A drafting layer given a clock reports
    the seconds between the starts of two consecutive steps over the same requests: the engine's whole
    step as its drafter sees it (verification, sampling, scheduling, the serving front end, drafting).
    `observes_step_time` False (an option left off): the layer keeps no time for it."""

    observes_step_time: bool

    def observe_step_interval(self, seconds: float) -> None: ...


def probe_stand_ins(sample: np.ndarray, size: int) -> np.ndarray:
    """For a probe of the rows `sample` (increasing) of a step of `size` requests: each row's index into the sample of
    the draft the whole step is costed with, a sampled row's own and the others' the sample's in turn (what the
    drafting layer hands the policy's trim, and the simulator likewise)."""
    like = np.arange(size) % len(sample)
    like[sample] = np.arange(len(sample))
    return like


@runtime_checkable
class PausesDrafting(Protocol):
    """A policy that pauses drafting where drafting at all does not pay for the drafting step's own host time. The
    drafting layer asks `drafting_rows(batch_size)` before its proposer runs: None, and every request drafts (the
    usual step); no rows, and neither the proposer nor the trim runs and no request drafts; some rows (increasing),
    and only those requests are handed to the proposer (a probe of a sample of the batch), the trim still seeing the
    whole step. The tokens a request appended while it did not draft reach the proposer at its next step that
    drafts (its `num_new`). A layer given a clock reports the host seconds of the proposer and trim of each step
    that handed the proposer no such backlog (`observe_drafting_seconds`): a catch-up is the pause's cost, not the
    drafting step's."""

    def drafting_rows(self, batch_size: int) -> np.ndarray | None: ...

    def observe_drafting_seconds(self, seconds: float) -> None: ...


@runtime_checkable
class BatchCapped(Protocol):
    """A policy with a batch-level limit: the most draft tokens one request may get at this batch size
    (None: no limit). Engines that set one draft length for the whole step (TensorRT-LLM) read it."""

    def batch_cap(self, batch_size: int) -> int | None: ...


@runtime_checkable
class BindsModel(Protocol):
    """A policy that costs the engine's own model: engines hand it their model config (a dict) and, where they
    know it, their device type ("cuda", "cpu"; None: the policy reads it where it first costs a step)."""

    def bind_model(self, model: Any, source: str = ..., device: str | None = ...) -> None: ...


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

    # Batched path (BatchPolicy): nothing to learn, nothing to trim.
    def caps_batch(self, batch: DraftBatch) -> np.ndarray:
        return batch.max_draft if self.max_draft is None else np.minimum(batch.max_draft, self.max_draft)

    def trim_batch(self, batch: DraftBatch, drafts: BatchDrafts) -> None:
        return None

    def observe_batch(self, req_ids: Sequence[ReqId], drafted: np.ndarray, accepted: np.ndarray) -> None:
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
    if not isinstance(policy, TrimsDrafts):
        return drafts
    lengths = policy.trim(requests, drafts)
    if len(lengths) != len(drafts):
        raise ValueError(f"policy: trim returned {len(lengths)} lengths for {len(drafts)} drafts")
    out = []
    for req, draft, n in zip(requests, drafts, lengths):
        n = check_cap(n, f"policy trim length for request {req.req_id!r}", allow_zero=True)
        out.append(truncate(draft, n))
    return out
