"""The drafting layer every engine adapter calls: one step of a whole batch, in columns.

    layer = DraftingLayer(proposer, policy, who="proposer 'suffix_tree'")
    drafts = layer.step(req_ids, token_matrix, context_lens, rows=rows, num_new=..., accepted=..., max_draft=caps)
    drafts.lists()  # [[tok, ...], ...] per request

What an engine adapter would otherwise write for itself lives here once:

* the per-request ledger: ids seen, context length last handed to the proposer (-> `num_new`), the
  length of the last draft until its verification is reported (-> `policy.observe`), the last step a
  request was in the batch;
* finishing exactly once (`finish`), whichever path sees an end first, and a bound on stale state: a
  request absent from the batch for more than `stale_steps` steps is finished (engines do not report
  every end to their drafter);
* caps -> propose -> check -> trim, through the batched paths the proposer and the policy declare
  (`core.BatchProposer`, `core.BatchPolicy`), else through their per-request methods;
* with a clock (engines pass one; replays and simulators do not), the engine's measured step intervals
  to a policy that learns from them (`core.ObservesStepTime`).

The ledger is columnar (request -> slot, numpy columns per slot) so a step costs a few numpy calls
plus one dict lookup per request: on a GPU this host time sits between two verification steps.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from spec_plugins import _ledger
from spec_plugins.core import (
    BatchDrafts, BatchPolicy, BatchProposer, BindsModel, DraftBatch, DraftLengthPolicy, DraftRequest, HasStats,
    FixedLength, LoadsTarget, ObservesStepTime, PausesDrafting, Proposer, RatesDrafts, ReqId, RunsBesideEngine,
    ShapesDraftsForRunner, TrimsDrafts, apply_policy, check_cap, check_drafts, probe_stand_ins,
)
from spec_plugins.slots import RequestSlots


_NEVER_STALE = np.iinfo(np.int64).max


class DraftingLayer:
    """Per-request ledger and one drafting step per engine step, shared by every engine adapter.

    who:        names the proposer in errors ("proposer 'ngram'").
    stale_steps: a request absent from this many steps in a row is finished.
    on_finish:  called as on_finish(req_id, why) after a request's state is freed (traces).
    clock:      seconds (time.perf_counter) for the step intervals an `ObservesStepTime` policy learns
                from; None: the layer keeps no time (deterministic replays, simulators).
    """

    def __init__(self, proposer: Proposer, policy: DraftLengthPolicy, *, who: str = "proposer",
                 stale_steps: int = 16, on_finish: Callable[[ReqId, str], None] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.clock = clock
        self._timed_at: float | None = None  # when the last timed step began, and its batch size
        self._timed_n = -1
        self.proposer = proposer
        self.policy = policy
        self.who = who
        self.stale_steps = check_cap(stale_steps, "stale_steps")
        self.on_finish = on_finish
        # last_step: the last step the request was in the batch; seen_len: the context length last handed
        # to the proposer; drafted: the last draft's length, until its verification is reported; unseen: tokens
        # appended while drafting was paused (core.PausesDrafting), handed to the proposer when it next drafts.
        self._ledger = RequestSlots(last_step=((), np.int64, 0), seen_len=((), np.int64, 0),
                                    drafted=((), np.int64, 0), unseen=((), np.int64, 0))
        self._has_unseen = False
        self.step_count = 0
        self.num_finished = 0  # requests whose state was freed (finished, preempted or stale)
        # With time_proposer on (the vLLM trace, the step-overhead benchmark), proposer_seconds is the last step's
        # time inside the proposer's drafting call and the check of what it returned: what separates the
        # proposer's own cost from the ledger's, the policy's and the adapter's in the host time an engine waits
        # for. Needs a clock.
        self.time_proposer = False
        self.proposer_seconds = 0.0

    @property
    def proposer(self) -> Proposer:
        return self._proposer

    @proposer.setter
    def proposer(self, proposer: Proposer) -> None:
        self._proposer = proposer
        self._batch_proposer = isinstance(proposer, BatchProposer)  # optional hooks: resolved once, here

    @property
    def policy(self) -> DraftLengthPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: DraftLengthPolicy) -> None:
        self._policy = policy
        self._batch_policy = isinstance(policy, BatchPolicy)
        self._rates_drafts = self._batch_policy and isinstance(policy, RatesDrafts)  # step(rated=True) asks it
        self._pauses = isinstance(policy, PausesDrafting)
        self._times_drafting = self._pauses and self.clock is not None  # its host seconds, for the pause
        # The engines' default (`fixed` without a cap of its own) caps nothing, trims nothing and learns nothing:
        # its three calls a step are skipped (at batch 1 the step is a few microseconds of such calls).
        self._passes_through = type(policy) is FixedLength and policy.max_draft is None
        self._times_steps = (self.clock is not None and isinstance(policy, ObservesStepTime)
                             and policy.observes_step_time)

    # ---- what adapters hand through -------------------------------------------------------------

    def bind_model(self, model: Any, source: str, device: str | None = None) -> None:
        """Hand the engine's model config and device type to a policy that costs them (`adaptive`)."""
        if isinstance(self.policy, BindsModel):
            self.policy.bind_model(model, source=source, device=device)

    def engine_on_accelerator(self, on_accelerator: bool) -> None:
        """Tell the proposer whether the engine's forward runs on an accelerator (core.RunsBesideEngine)."""
        if isinstance(self.proposer, RunsBesideEngine):
            self.proposer.engine_on_accelerator(on_accelerator)

    def runner_verifies_all(self, verifies_all: bool) -> None:
        """Tell the proposer whether the runner verifies every draft slot (core.ShapesDraftsForRunner)."""
        if isinstance(self.proposer, ShapesDraftsForRunner):
            self.proposer.runner_verifies_all(verifies_all)

    def load(self, target: Any) -> None:
        """Hand the target model to a drafter that needs it."""
        if isinstance(self.proposer, LoadsTarget):
            self.proposer.load(target)

    def stats(self) -> dict[str, Any] | None:
        return self.proposer.stats() if isinstance(self.proposer, HasStats) else None

    def policy_stats(self) -> dict[str, Any] | None:
        return self.policy.stats() if isinstance(self.policy, HasStats) else None

    @property
    def num_tracked(self) -> int:
        """Requests whose per-request state is held (handed to the proposer, not finished yet)."""
        return len(self._ledger)

    def is_tracked(self, req_id: ReqId) -> bool:
        return req_id in self._ledger

    def tracked(self) -> list[ReqId]:
        return list(self._ledger)

    # ---- the step ---------------------------------------------------------------------------------

    def step(
        self,
        req_ids: Sequence[ReqId],
        contexts: Any,
        context_lens: Sequence[int] | np.ndarray,
        *,
        max_draft: Sequence[int] | np.ndarray | int,
        rows: np.ndarray | None = None,
        num_new: np.ndarray | None = None,
        accepted: np.ndarray | None = None,
        features: Sequence[Any] | None = None,
        present: Sequence[ReqId] = (),
        verified: np.ndarray | None = None,
        rated: bool = False,
    ) -> BatchDrafts:
        """Draft for every request of this engine step.

        contexts, rows, context_lens, features: as in `DraftBatch` (a token matrix + rows, or sequences).
        max_draft:  the engine's cap per request (or one for all); the policy may lower it.
        num_new:    tokens appended since each request was last seen, where the engine knows it (vLLM's
                    sampled tokens); otherwise the context's growth since then. A request seen for the
                    first time always gets its whole context.
        accepted:   drafted tokens the engine accepted in each request's last verification, or -1 where
                    that draft has not been verified yet (it stays pending); None: report nothing now.
        present:    requests in the engine's batch that do not draft this step (a prefill chunk); they
                    are not stale.
        verified:   slots the engine verified of each request's last draft, where it may verify fewer than
                    were drafted (vLLM's adaptive verification); the report then covers only those, since the
                    rest were never tried. None: every drafted token was verified.
        rated:      the engine trims by confidence itself (vLLM's adaptive verification): where the policy rates
                    drafts (core.RatesDrafts), the drafts come back with its calibrated conditional acceptance
                    estimates as their confidences, from the trim's own survival. Otherwise ignored.
        """
        self.step_count += 1
        n = len(req_ids)
        lens = np.ascontiguousarray(context_lens, dtype=np.int64)
        if num_new is not None:
            num_new = np.ascontiguousarray(num_new, dtype=np.int64)
        if accepted is not None:
            accepted = np.ascontiguousarray(accepted, dtype=np.int64)
        ledger = self._ledger
        cols = ledger.columns
        if verified is not None:
            verified = np.ascontiguousarray(verified, dtype=np.int64)
        try:  # the usual step, every request known: the whole ledger step in one compiled call
            known = _ledger.ledger_step(ledger.index, req_ids, self.step_count, lens, num_new, accepted,
                                         cols["last_step"], cols["seen_len"], cols["drafted"], verified)
        except ValueError as exc:
            raise ValueError(f"{self.who}: {exc}") from None
        if known is not None:
            slots, grown, reports = known
            new = None
        else:  # some request is new: slots are created first
            if verified is not None:  # the known ones' last drafts were verified this far
                at = ledger.slots_of(req_ids, create=False)
                seen = at >= 0
                cols["drafted"][at[seen]] = np.minimum(cols["drafted"][at[seen]], verified[seen])
            if len(set(req_ids)) != n:
                raise ValueError(f"{self.who}: a request id appears twice in one step")
            slots, new = ledger.lookup(req_ids)
            # Each draft is reported once (see verified).
            reports = None if accepted is None else _ledger.ledger_reports(req_ids, slots, accepted, cols["drafted"])
            # First sight, or a context that shrank (recomputed): the whole context is new.
            grown = _ledger.ledger_seen(slots, new, self.step_count, lens, num_new, cols["last_step"],
                                         cols["seen_len"])
        if self._times_steps:
            self._time_step(n, new, present)
        passes_through = self._passes_through
        if reports is not None and not passes_through and len(reports[0]):
            self._report(*reports)
        if len(ledger) > n + (self.touch(present) if present else 0):  # a tracked request is absent from this step
            self.sweep()
        sample = self.policy.drafting_rows(n) if self._pauses and n else None
        if sample is not None:  # drafting paused for some requests (all, or all but a probe's sample)
            waits = np.ones(n, dtype=bool)
            waits[sample] = False
            cols["unseen"][slots[waits]] += grown[waits]
            self._has_unseen = True
            if not len(sample):  # paused: nothing runs, nothing drafts
                cols["drafted"][slots] = 0
                return BatchDrafts(np.zeros(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64))
        catches_up = False  # some request hands the proposer tokens appended while it did not draft
        if self._has_unseen:  # what was appended while a request did not draft reaches the proposer now
            unseen = cols["unseen"]
            drafting = slots if sample is None else slots[sample]
            backlog = unseen[drafting]
            catches_up = bool(backlog.any())
            if sample is None:
                grown = np.minimum(grown + backlog, lens)
            else:
                grown = grown.copy()
                grown[sample] = np.minimum(grown[sample] + backlog, lens[sample])
            unseen[drafting] = 0
            self._has_unseen = bool(unseen.any())
        caps = np.asarray(max_draft, dtype=np.int64)
        if caps.ndim == 0:  # one cap for all
            caps = np.full(n, caps)
        batch = DraftBatch(req_ids, contexts, lens, grown, caps, rows=rows, features=features)
        if n == 0:
            return BatchDrafts(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64))
        timed = self._times_drafting
        start = self.clock() if timed else 0.0
        if passes_through:
            drafts = self._propose(batch, None)
        elif sample is not None:
            # A probe: the sample drafts; the policy trims the whole step as if every request drafted as one of the
            # sample did (how it weighs whether drafting pays) and keeps drafts for the sample alone.
            self._caps(batch)
            if isinstance(self.proposer, EngineDrafts):  # the engine drafted every request already
                self.proposer.select(sample)
            own = self._propose(batch.select(sample), None)
            drafts = self._trim(batch, own.select(probe_stand_ins(sample, n)), None, rated)
            keep = np.zeros(n, dtype=np.int64)
            keep[sample] = drafts.lengths[sample]
            drafts = drafts.truncated(keep)
        else:
            # The per-request view is built at most once a step, after the caps: proposers and policies
            # without a batched path all see the same DraftRequests.
            requests = self._caps(batch)
            drafts = self._trim(batch, self._propose(batch, requests), requests, rated)
        if timed and not catches_up:  # what a paused step does not spend (a catch-up is the pause's, not the step's)
            self.policy.observe_drafting_seconds(self.clock() - start)
        cols["drafted"][slots] = drafts.lengths
        return drafts

    def verified(self, req_ids: Sequence[ReqId], accepted: Sequence[int] | np.ndarray) -> None:
        """Report verification results now (an engine that knows them right after its forward)."""
        slots = self._ledger.slots_of(req_ids, create=False)
        accepted = np.ascontiguousarray(accepted, dtype=np.int64)
        known = slots >= 0
        if not known.all():
            req_ids = [r for r, k in zip(req_ids, known) if k]
            slots, accepted = slots[known], accepted[known]
        # Each draft is reported once, with what was accepted capped at what was drafted.
        ids, drafted, acc = _ledger.ledger_reports(req_ids, slots, accepted, self._ledger["drafted"])
        if ids:
            self._report(ids, drafted, acc)

    def touch(self, req_ids: Sequence[ReqId]) -> int:
        """These requests are in the engine's batch without drafting this step: keep them fresh.
        Returns how many of them are tracked."""
        if not req_ids:
            return 0
        slots = self._ledger.slots_of(req_ids, create=False)
        known = slots[slots >= 0]
        self._ledger["last_step"][known] = self.step_count
        return len(known)

    def finish(self, req_id: ReqId, why: str = "finished") -> bool:
        """Free `req_id`'s state in the proposer and the policy, once; unknown ids are ignored."""
        slot = self._ledger.release(req_id)
        if slot is None:
            return False
        self._ledger["last_step"][slot] = _NEVER_STALE  # a free slot is not swept again
        self._ledger["unseen"][slot] = 0
        self.proposer.finish(req_id)
        self.policy.finish(req_id)
        self.num_finished += 1
        if self.on_finish is not None:
            self.on_finish(req_id, why)
        return True

    def sweep(self) -> None:
        """Finish every request absent from the batch for more than `stale_steps` steps.

        Engines do not report every end to their drafter (vLLM: the finishes of the step that drains
        the batch, or of steps where the runner skips the drafter; TensorRT-LLM: none at all), so state
        is bounded by the requests seen in the last `stale_steps` steps. A running request left
        unscheduled that long just starts over if it comes back.
        """
        limit = self.step_count - self.stale_steps
        ledger = self._ledger
        for slot in np.flatnonzero(ledger["last_step"][: ledger.capacity] < limit).tolist():
            self.finish(ledger.id_at(slot), why="stale")

    # ---- internals --------------------------------------------------------------------------------

    def _time_step(self, n: int, new: np.ndarray | None, present: Sequence[ReqId]) -> None:
        now = self.clock()
        # Only the interval between two steps over the same requests is one engine step of the batch the
        # policy drafted for: a request that joins (its prefill), a prefill chunk alongside, or a batch
        # that shrank or grew make it something else. new: which requests joined (None: none did).
        if self._timed_at is not None and n == self._timed_n and not present and (new is None or not new.any()):
            self.policy.observe_step_interval(now - self._timed_at)
        self._timed_at, self._timed_n = now, -1 if present else n

    def _report(self, ids: list[ReqId], drafted: np.ndarray, acc: np.ndarray) -> None:
        if self._batch_policy:
            self.policy.observe_batch(ids, drafted, acc)
        else:
            for r, d, a in zip(ids, drafted.tolist(), acc.tolist()):
                self.policy.observe(r, d, a)

    def _caps(self, batch: DraftBatch) -> list[DraftRequest] | None:
        """Lower batch.max_draft to the policy's caps; returns the DraftRequests if they were built."""
        if not self._batch_policy:
            requests = apply_policy(self.policy, batch.requests())
            batch.max_draft = np.fromiter((r.max_draft for r in requests), dtype=np.int64, count=len(requests))
            return requests
        caps = self.policy.caps_batch(batch)
        if caps is batch.max_draft:  # the engine's caps as they are (`fixed`, `adaptive`)
            return None
        caps = np.asarray(caps)
        if caps.shape != (len(batch),) or (caps.size and (caps.dtype.kind not in "iu" or caps.min() < 0)):
            raise ValueError(f"policy: caps_batch must return {len(batch)} integers >= 0")
        batch.max_draft = np.minimum(batch.max_draft, caps.astype(np.int64, copy=False))
        return None

    def _propose(self, batch: DraftBatch, requests: list[DraftRequest] | None) -> BatchDrafts:
        if self.time_proposer and self.clock is not None:
            start = self.clock()
            drafts = self._propose_untimed(batch, requests)
            self.proposer_seconds = self.clock() - start
            return drafts
        return self._propose_untimed(batch, requests)

    def _propose_untimed(self, batch: DraftBatch, requests: list[DraftRequest] | None) -> BatchDrafts:
        if not self._batch_proposer:
            requests = batch.requests() if requests is None else requests
            drafts = self.proposer.propose(requests)
            check_drafts(requests, drafts, who=self.who)
            return BatchDrafts.from_drafts(drafts)
        drafts = self.proposer.propose_batch(batch)
        if not isinstance(drafts, BatchDrafts):
            raise ValueError(f"{self.who}: propose_batch returned {type(drafts).__name__}, expected BatchDrafts")
        if len(drafts.offsets) != len(batch.req_ids) + 1:
            raise ValueError(f"{self.who}: returned {len(drafts)} drafts for {len(batch)} requests")
        i = _ledger.first_over(drafts.lengths, batch.max_draft)
        if i >= 0:
            raise ValueError(f"{self.who}: draft for request {batch.req_ids[i]!r} has {drafts.lengths[i]} tokens, "
                             f"cap is {batch.max_draft[i]}")
        return drafts

    def _trim(self, batch: DraftBatch, drafts: BatchDrafts, requests: list[DraftRequest] | None,
              rated: bool = False) -> BatchDrafts:
        if rated and self._rates_drafts:
            keep, conditional = self.policy.trim_rated(batch, drafts)
            drafts = BatchDrafts(drafts.tokens, drafts.offsets, conditional, drafts.probs)
        elif self._batch_policy:
            keep = self.policy.trim_batch(batch, drafts)
        elif isinstance(self.policy, TrimsDrafts):
            keep = self.policy.trim(batch.requests() if requests is None else requests, drafts.drafts())
        else:
            return drafts
        if keep is None:
            return drafts
        if len(keep) != len(batch):
            raise ValueError(f"policy: trim returned {len(keep)} lengths for {len(batch)} drafts")
        if not isinstance(keep, np.ndarray) or keep.dtype.kind not in "iu":
            keep = np.array([check_cap(k, f"policy trim length for request {r!r}", allow_zero=True)
                             for r, k in zip(batch.req_ids, keep)], dtype=np.int64)
        return drafts.truncated(keep)  # a negative length is refused there


class EngineDrafts:
    """The proposer of a step whose drafts the engine's own draft model already made (vLLM's `dflash`
    method drafting a DSpark checkpoint): the layer then applies only the policy -- caps, trims and the
    verification reports -- to them. Hand the step's drafts to `give` right before `DraftingLayer.step`.
    """

    name = "engine"

    def __init__(self) -> None:
        self._given: BatchDrafts | None = None

    def give(self, drafts: BatchDrafts) -> None:
        self._given = drafts

    def select(self, rows: np.ndarray) -> None:
        """The next step drafts only the requests at `rows` of the drafts given (a probe's sample)."""
        if self._given is not None:
            self._given = self._given.select(rows)

    def propose_batch(self, batch: DraftBatch) -> BatchDrafts:
        drafts, self._given = self._given, None
        if drafts is None or len(drafts) != len(batch):
            raise ValueError(f"engine drafts: expected {len(batch)} drafts handed over before the step, got "
                             f"{'none' if drafts is None else len(drafts)}")
        return drafts.truncated(np.minimum(drafts.lengths, batch.max_draft))

    def propose(self, requests: Sequence[DraftRequest]) -> list:
        return self.propose_batch(DraftBatch.from_requests(requests)).drafts()

    def finish(self, req_id: ReqId) -> None:
        pass  # the engine's draft model holds no per-request state of ours

