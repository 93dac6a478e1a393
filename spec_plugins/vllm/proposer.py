"""vLLM `custom_class` proposers serving any registered spec-plugins proposer.

    vllm serve MODEL \
      --speculative-config '{"method":"custom_class","model":"spec_plugins.vllm.Ngram","num_speculative_tokens":8}' \
      --additional-config '{"spec_plugins":{"proposer_options":{"max_ngram":4}}}'

vLLM (MRV1) calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` after each step's
bookkeeping: row i's committed context is `token_ids_cpu[i, :num_tokens_no_spec[i]]`, and
`len(sampled_token_ids[i]) - 1` drafts of that row were accepted in the previous step. The adapter
turns rows into DraftRequests, lets the policy cap them (never above num_speculative_tokens: the
scheduler does not clamp), calls the proposer, lets the policy trim the drafts (`policy: adaptive`
keeps the goodput-optimal prefix of each) and returns plain lists.

Batch-size schedules: vLLM computes `num_speculative_tokens_per_batch_size` for every method but hands
it only to its own proposers, so a custom_class proposer applies it here: with B requests in the batch
no draft is longer than the schedule's K for B (same ranges and carry-forward as vLLM's lookup).

Request ids: vLLM passes none. With the `vllm.general_plugins` entry point (`plugin.py`) the runner
sets `row_req_ids` before every call and calls `finish(req_id)` for finished and preempted requests;
without it rows stand for requests ("row-3"). Either way per-request state is bounded: see `_sweep`.

`SPEC_PLUGINS_TRACE_FILE=PATH` appends one JSON line per step (`{"pid", "step", "rows", "tracked"}`;
every `trace_stats_every` steps also `"stats"`: the proposer's `stats()`, if it has one) and per freed
request (`{"pid", "finish", "why"}`) to PATH; the integration tests and benchmarks/soak.py read it.

This module must not import numba/llvmlite (it breaks vLLM's CPU engine start) nor vLLM itself.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar, Sequence

import numpy as np

from spec_plugins.core import DraftRequest, apply_policy, apply_trim, check_cap, check_drafts
from spec_plugins.vllm.settings import settings_from_additional_config

TRACE_ENV = "SPEC_PLUGINS_TRACE_FILE"


class SpecPluginsProposer:
    """Serves the proposer named in `additional_config.spec_plugins.proposer`."""

    fixed_proposer: ClassVar[str | None] = None
    # A request absent from the batch for more than this many steps is finished (see _sweep).
    stale_steps: ClassVar[int] = 16
    # With the trace on, every this many steps the step line also carries the proposer's `stats()`.
    trace_stats_every: ClassVar[int] = 20

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = check_cap(
            getattr(spec, "num_speculative_tokens", None), "speculative_config.num_speculative_tokens"
        )
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.settings = settings_from_additional_config(
            getattr(vllm_config, "additional_config", None), self.fixed_proposer
        )
        self.proposer, self.policy = self.settings.build()
        self.batch_schedule = batch_size_schedule(getattr(spec, "num_speculative_tokens_per_batch_size", None))
        bind_model = getattr(self.policy, "bind_model", None)
        if bind_model is not None:  # `policy: adaptive` with `hardware` alone: cost the engine's own model
            bind_model(vllm_config.model_config.hf_config.to_dict(), source="vLLM model_config.hf_config")
        # Request ids per batch row, set by the plugin's runner wrapper before each propose(). Without
        # them a row stands for its request; rows are reused and reordered between steps, which only
        # blurs per-request state (our proposers see the whole context every step).
        self.row_req_ids: Sequence[Any] | None = None
        self._drafted: dict[Any, int] = {}
        # Every id handed to the proposer and not finished yet -> the last step it was in the batch.
        self._last_seen: dict[Any, int] = {}
        self._step = 0
        self.num_finished = 0  # requests whose state was freed (finished, preempted or stale)
        trace = os.environ.get(TRACE_ENV)
        self._trace = open(trace, "a", buffering=1) if trace else None
        # vLLM builds us inside GPUModelRunner.__init__: let the plugin (if registered in this
        # process) wrap the runner now, before its first step.
        from spec_plugins.vllm.plugin import install

        install()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        # The CPU runner calls this unconditionally; model-free proposers need nothing from the target.
        load = getattr(self.proposer, "load", None)
        if load is not None and args:
            load(args[0])

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        rows, requests = [], []
        self._step += 1
        k = self.num_speculative_tokens
        if self.batch_schedule:
            k = min(k, schedule_lookup(self.batch_schedule, len(sampled_token_ids)))
        for i, sampled in enumerate(sampled_token_ids):
            req_id = self._req_id(i)
            if not sampled:  # a prefill chunk in progress: nothing to draft from yet
                if req_id in self._last_seen:
                    self._last_seen[req_id] = self._step
                continue
            first = req_id not in self._last_seen
            self._last_seen[req_id] = self._step
            drafted = self._drafted.pop(req_id, None)
            if drafted is not None:
                self.policy.observe(req_id, drafted, min(len(sampled) - 1, drafted))
            n = int(num_tokens_no_spec[i])
            room = max(0, self.max_model_len - n - 1)
            rows.append(i)
            requests.append(
                DraftRequest(
                    req_id=req_id,
                    tokens=token_ids_cpu[i, :n],
                    num_new=n if first else len(sampled),
                    max_draft=min(k, room),
                )
            )
        self._sweep()
        if self._trace is not None:
            ids = [self._req_id(i) for i in range(len(sampled_token_ids))]
            event = {"step": self._step, "rows": ids, "tracked": len(self._last_seen)}
            stats = getattr(self.proposer, "stats", None)
            if stats is not None and self._step % self.trace_stats_every == 0:
                event["stats"] = stats()  # e.g. the suffix tree's cached requests, nodes, bytes
            self._write(event)
        if not requests:
            return out
        apply_policy(self.policy, requests)
        drafts = self.proposer.propose(requests)
        check_drafts(requests, drafts, who=f"proposer {self.settings.proposer!r}")
        drafts = apply_trim(self.policy, requests, drafts)
        for i, req, draft in zip(rows, requests, drafts):
            out[i] = [int(t) for t in draft.tokens]
            if out[i]:
                self._drafted[req.req_id] = len(out[i])
        return out

    def finish(self, req_id: Any, why: str = "finished") -> None:
        """Free `req_id`'s state in the proposer and the policy (ids never proposed for are ignored)."""
        if self._last_seen.pop(req_id, None) is None:
            return
        self._drafted.pop(req_id, None)
        self.proposer.finish(req_id)
        self.policy.finish(req_id)
        self.num_finished += 1
        if self._trace is not None:
            self._write({"finish": req_id, "why": why})

    def _sweep(self) -> None:
        # vLLM does not report every end to a propose() call: the finishes carried by the empty step
        # that drains the batch reach the runner but not the drafter, steps where the runner skips the
        # drafter drop theirs, and without the plugin nothing is reported at all. So anything absent
        # from the batch for more than `stale_steps` steps is finished here; state is then bounded by
        # the requests seen in the last `stale_steps` steps. A running request left unscheduled that
        # long (rare: V1 schedules running requests first) just starts over if it comes back.
        limit = self._step - self.stale_steps
        for req_id in [r for r, last in self._last_seen.items() if last < limit]:
            self.finish(req_id, why="stale")

    def _write(self, event: dict) -> None:
        self._trace.write(json.dumps({"pid": os.getpid(), **event}) + "\n")

    def _req_id(self, row: int) -> Any:
        ids = self.row_req_ids
        return ids[row] if ids is not None and row < len(ids) else f"row-{row}"


def batch_size_schedule(value: Any) -> list[tuple[int, int, int]] | None:
    """vLLM's `num_speculative_tokens_per_batch_size` as sorted (start, end, K) ranges, or None."""
    if not value:
        return None
    try:
        ranges = sorted((int(a), int(b), int(k)) for a, b, k in value)
    except (TypeError, ValueError):
        raise ValueError("speculative_config.num_speculative_tokens_per_batch_size: expected [[start, end, K], ...], "
                         f"got {value!r}") from None
    return ranges


def schedule_lookup(ranges: list[tuple[int, int, int]], batch: int) -> int:
    """K for `batch` requests: its range's K; in a gap or past the end, the K of the range before."""
    k = ranges[0][2]
    for start, end, value in ranges:
        if start > batch:
            break
        k = value
    return k


class Ngram(SpecPluginsProposer):
    """Prompt-lookup n-gram proposer (`proposers/ngram`)."""

    fixed_proposer = "ngram"


class SuffixTree(SpecPluginsProposer):
    """Suffix-tree proposer (`proposers/suffix_tree`): per-request and global trees, adaptive length."""

    fixed_proposer = "suffix_tree"
