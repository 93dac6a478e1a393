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

From the engine's config it reads `speculative_config` (K, the per-batch-size schedule),
`model_config.max_model_len`, `additional_config.spec_plugins` and `device_config.device_type` (an engine on
an accelerator turns on the proposers' "auto" work between steps, e.g. the suffix tree's `append_ahead`).

Batch-size schedules: vLLM computes `num_speculative_tokens_per_batch_size` for every method but hands
it only to its own proposers, so a custom_class proposer applies it here: with B requests in the batch
no draft is longer than the schedule's K for B (same ranges and carry-forward as vLLM's lookup).

Request ids: vLLM passes none. With the `vllm.general_plugins` entry point (`plugin.py`) the runner
sets `row_req_ids` before every call and calls `finish(req_id)` for finished and preempted requests;
without it rows stand for requests ("row-3"). Either way per-request state is bounded: see `_sweep`.

`SPEC_PLUGINS_TRACE_FILE=PATH` (`StepTrace`) appends to PATH, after one `{"pid", "start", "policy", "k"}` line per
engine, one JSON line per step (`{"pid", "step", "rows", "tracked", "drafted", "accepted", "t", "us", "proposer_us"}`:
`drafted` the draft lengths of the rows that drafted, `accepted` how many of each one's previous draft the engine
accepted (in the same order; beside the last step's `drafted` it is the realised acceptance), `t` when the step's
drafting began, `us` the host time it took, `proposer_us` the part of it inside the proposer's drafting call (the
rest is the ledger, the policy and this adapter); every `StepTrace.stats_every` steps also `"stats"` and `"policy_stats"`: the proposer's and the policy's
`stats()`, where they have one) and one per freed request (`{"pid", "finish", "why", "tracked"}`: `tracked` the
requests still held after it). Our DSpark draft model's policy writes the same lines. The integration tests and
benchmarks/soak.py read them.

This module must not import numba/llvmlite (it breaks vLLM's CPU engine start) nor vLLM itself.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, ClassVar

import numpy as np

from spec_plugins.vllm import _rows
from spec_plugins.core import BindsModel, check_cap
from spec_plugins.drafting import DraftingLayer
from spec_plugins.slots import RowRange
from spec_plugins.vllm.plugin import RequestIdAware, install
from spec_plugins.vllm.settings import VllmSettings, settings_from_additional_config

# A child of vLLM's logger: vLLM configures "vllm" (INFO, its format), so start-up lines show in its log.
logger = logging.getLogger("vllm.spec_plugins")
# The engine-free modules (the policy) log to "spec_plugins": inside vLLM their lines go where vLLM's go.
_engine_free = logging.getLogger("spec_plugins")
if not _engine_free.handlers:
    _engine_free.handlers = list(logging.getLogger("vllm").handlers)
    _engine_free.setLevel(logging.INFO)
    _engine_free.propagate = False
TRACE_ENV = "SPEC_PLUGINS_TRACE_FILE"


def engine_device(vllm_config: Any) -> str:
    """vLLM's DeviceConfig.device_type ("cuda", "cpu", ...)."""
    return getattr(getattr(vllm_config, "device_config", None), "device_type", None) or "cpu"


class SpecPluginsProposer(RequestIdAware):
    """Serves the proposer named in `additional_config.spec_plugins.proposer`."""

    fixed_proposer: ClassVar[str | None] = None
    # A request absent from the batch for more than this many steps is finished (DraftingLayer.sweep).
    stale_steps: ClassVar[int] = 16

    def __init__(self, vllm_config: Any) -> None:
        self.num_speculative_tokens, self.settings, proposer, policy, self.batch_schedule = self.build(vllm_config)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self._trace = StepTrace.from_env()
        self.drafting = DraftingLayer(proposer, policy, who=f"proposer {self.settings.proposer!r}",
                                      stale_steps=self.stale_steps,
                                      on_finish=self._trace.finish if self._trace else None,
                                      clock=time.perf_counter)
        # vLLM's DeviceConfig.device_type ("cuda", "cpu", ...): work a proposer leaves running between steps is
        # free beside an accelerator's forward, and competes with the forward on a CPU engine.
        self.drafting.engine_on_accelerator(engine_device(vllm_config) != "cpu")
        self.drafting.runner_verifies_all(False)  # the V1 runner verifies each request's drafted tokens only
        # Request ids per batch row, set by the plugin's runner wrapper before each propose(). Without
        # them a row stands for its request; rows are reused and reordered between steps, which only
        # blurs per-request state (our proposers see the whole context every step).
        self.row_req_ids = None
        self._all_rows = RowRange()  # 0, 1, 2, ...: the rows of a step where every row drafts
        # vLLM builds us inside GPUModelRunner.__init__: let the plugin (if registered in this
        # process) wrap the runner now, before its first step.
        hooked = install()
        s = self.settings
        if self._trace is not None:
            self._trace.start(self.drafting, s.proposer, s.policy, self.num_speculative_tokens)
        logger.info("spec-plugins: proposer %r %s, policy %r %s, K = %d%s; %s; runner hook %s", s.proposer,
                    s.proposer_options or "(defaults)", s.policy, s.policy_options or "(defaults)",
                    self.num_speculative_tokens,
                    f", per batch size {self.batch_schedule} (applied by spec-plugins)" if self.batch_schedule else "",
                    runner_summary(vllm_config),
                    "installed (request ids and finishes reach the proposer)" if hooked else
                    "not installed (rows stand for requests)")

    @classmethod
    def build(cls, vllm_config: Any) -> tuple[int, VllmSettings, Any, Any, list | None]:
        """Everything this class reads from vLLM's config, checked: (K, settings, proposer, policy, schedule).
        The plugin runs it in vLLM's front-end process too, so a bad section stops the server before its
        engine starts, with one line naming the field."""
        spec = vllm_config.speculative_config
        k = check_cap(getattr(spec, "num_speculative_tokens", None), "speculative_config.num_speculative_tokens")
        settings = settings_from_additional_config(getattr(vllm_config, "additional_config", None),
                                                   cls.fixed_proposer)
        proposer, policy = settings.build()
        # vLLM 0.33 drops the schedule for custom_class on V1; the plugin's front-end check keeps it in our section.
        schedule = batch_size_schedule(settings.num_speculative_tokens_per_batch_size
                                       or getattr(spec, "num_speculative_tokens_per_batch_size", None))
        if isinstance(policy, BindsModel):  # `policy: adaptive`: cost the engine's model on its device
            policy.bind_model(vllm_config.model_config.hf_config.to_dict(), source="vLLM model_config.hf_config",
                              device=engine_device(vllm_config))
        return k, settings, proposer, policy, schedule

    @property
    def proposer(self) -> Any:
        return self.drafting.proposer

    @proposer.setter
    def proposer(self, proposer: Any) -> None:
        self.drafting.proposer = proposer

    @property
    def policy(self) -> Any:
        return self.drafting.policy

    @policy.setter
    def policy(self, policy: Any) -> None:
        self.drafting.policy = policy

    @property
    def num_finished(self) -> int:
        """Requests whose state was freed (finished, preempted or stale)."""
        return self.drafting.num_finished

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        # The CPU runner calls this unconditionally; model-free proposers need nothing from the target.
        if args:
            self.drafting.load(args[0])

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        start = time.perf_counter() if self._trace is not None else 0.0
        num_rows = len(sampled_token_ids)
        ids = self._row_ids(num_rows)
        k = self.num_speculative_tokens
        if self.batch_schedule:
            k = min(k, schedule_lookup(self.batch_schedule, num_rows))
        # Per row: tokens sampled, drafts accepted, committed length, cap min(k, room before max_model_len - 1).
        sampled, accepted, lens, caps, decoding = _rows.from_runner(sampled_token_ids, num_tokens_no_spec,
                                                                     self.max_model_len, k)
        if decoding == num_rows:  # the usual step: every row decodes
            live, live_ids, present = self._all_rows(num_rows), ids, ()
        else:  # a row with nothing sampled is a prefill chunk in progress
            live = np.flatnonzero(sampled)
            live_ids = [ids[i] for i in live.tolist()]
            present = [ids[i] for i in np.flatnonzero(sampled == 0).tolist()]
            lens, sampled, accepted, caps = lens[live], sampled[live], accepted[live], caps[live]
        drafts = self.drafting.step(live_ids, token_ids_cpu, lens, rows=live, num_new=sampled,
                                    accepted=accepted, max_draft=caps, present=present)
        if self._trace is not None:
            self._trace.step(ids, start, drafts.lengths, accepted)
        if len(live) == num_rows:
            return drafts.lists()
        out: list[list[int]] = [[] for _ in range(num_rows)]
        for i, tokens in zip(live.tolist(), drafts.lists()):
            out[i] = tokens
        return out

    def finish(self, req_id: Any, why: str = "finished") -> None:
        """Free `req_id`'s state in the proposer and the policy (ids never proposed for are ignored)."""
        self.drafting.finish(req_id, why)

    def _row_ids(self, num_rows: int) -> list[Any]:
        ids = self.row_req_ids
        if ids is not None and len(ids) >= num_rows:
            return list(ids[:num_rows])
        return [ids[i] if ids is not None and i < len(ids) else f"row-{i}" for i in range(num_rows)]


class StepTrace:
    """`SPEC_PLUGINS_TRACE_FILE`'s lines for one engine's drafting layer (the format is in the module docstring)."""

    # Every this many steps the step line also carries the proposer's and the policy's `stats()`.
    stats_every: ClassVar[int] = 20

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self.drafting: DraftingLayer | None = None

    @classmethod
    def from_env(cls) -> "StepTrace | None":
        path = os.environ.get(TRACE_ENV)
        return cls(path) if path else None

    def start(self, drafting: DraftingLayer, proposer: str, policy: str, k: int) -> None:
        self.drafting = drafting
        drafting.time_proposer = True
        self.write({"start": proposer, "policy": policy, "k": k})  # which engine a process's step lines belong to

    def step(self, ids: list[Any], start: float, drafted: np.ndarray, accepted: np.ndarray) -> None:
        # t: when this step's drafting began (perf_counter, s), us: its host time; the gaps between steps' t
        # are the engine's step times as the worker saw them.
        drafting = self.drafting
        event = {"step": drafting.step_count, "rows": ids, "tracked": drafting.num_tracked,
                 "drafted": drafted.tolist(), "accepted": accepted.tolist(), "t": round(start, 6),
                 "us": round((time.perf_counter() - start) * 1e6, 1),
                 "proposer_us": round(drafting.proposer_seconds * 1e6, 1)}
        if drafting.step_count % self.stats_every == 0:
            stats = drafting.stats()
            if stats is not None:
                event["stats"] = stats  # e.g. the suffix tree's cached requests, nodes, bytes
            stats = drafting.policy_stats()
            if stats is not None:
                event["policy_stats"] = stats  # e.g. the adaptive policy's fitted step overhead
        self.write(event)

    def finish(self, req_id: Any, why: str) -> None:
        """DraftingLayer.on_finish: one line per freed request, with what is still tracked after it."""
        self.write({"finish": req_id, "why": why,
                    "tracked": None if self.drafting is None else self.drafting.num_tracked})

    def write(self, event: dict) -> None:
        self._file.write(json.dumps({"pid": os.getpid(), **event}) + "\n")


def runner_summary(vllm_config: Any) -> str:
    """Which model runner and scheduling the engine chose, as vLLM's config says: e.g. "V1 model runner,
    synchronous scheduling" (custom_class runs on V1, where vLLM turns async scheduling off for it)."""
    try:
        v2 = bool(vllm_config.use_v2_model_runner)
    except Exception:  # a vLLM without the property has only the V1 runner
        v2 = False
    sched = getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", None)
    return (f"{'V2' if v2 else 'V1'} model runner, "
            f"{'async' if sched else 'synchronous'} scheduling")


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
