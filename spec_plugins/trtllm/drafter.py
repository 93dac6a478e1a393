"""TensorRT-LLM 1.2 `Drafter` for model-free spec-plugins proposers (the `UserProvided` path).

    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi import UserProvidedDecodingConfig
    from spec_plugins.trtllm import SpecPluginsDrafter

    drafter = SpecPluginsDrafter(max_draft_len=4, proposer="suffix_tree", policy="fixed")
    llm = LLM(model, speculative_config=UserProvidedDecodingConfig(max_draft_len=4, drafter=drafter),
              disable_overlap_scheduler=True)

What the executor does with a drafter (`PyExecutor`, 1.2), and what this adapter does in return:

* Each iteration, when the drafter has a `draft_len_schedule`, the executor calls
  `get_draft_len_for_batch_size(active batch size)` and `update_max_total_draft_tokens(k)`; k = 0 would
  turn speculation off for the step and, in 1.2, for good for the requests it schedules, so ours returns
  at least 1 and cuts drafts per request to the resolved K (0 included). So `self.max_draft_len` is the
  engine's cap for this step. A policy
  that is not `fixed` always gets a schedule (`{1: max_draft_len}` by default) so it is asked every step.
* `prepare_draft_tokens(batch)` writes each generation request's `py_draft_tokens`: the adapter hands the
  step's contexts (`get_tokens(0)`; cap: this step's `max_draft_len`, and the request's remaining
  `py_max_new_tokens`) to the drafting layer (`spec_plugins.drafting`: ledger, policy caps, proposer,
  checks, trim) and writes plain int lists, often shorter than the cap; the base class pads them with
  token 0 to the static maximum, and verification (TorchSampler, greedy exact match) rewinds the rest.
* Acceptance: the sampler leaves `py_num_accepted_draft_tokens` on the request; the next
  `prepare_draft_tokens` hands it to `policy.observe(req_id, drafted, accepted)`, where `drafted` is
  what the proposer drafted (not the padded length) and `accepted` is clamped to it (a pad token 0 can
  match the target's token; that is luck, not the proposer's).
* Ends: the executor does not tell a drafter that a request ended. Per-request state is freed (once) by
  `finish(req_id)`, called by the optional `SpecPluginsResourceManager.free_resources` the moment the
  executor frees the request, or else at the next `prepare_draft_tokens` when the request's state is
  GENERATION_COMPLETE, when its id comes back as a new context request (ids may be reused), or when it
  has been absent from the batch for more than `stale_steps` calls.

The executor may run in another process: the drafter pickles as its configuration (names, options,
ints) and rebuilds its proposer and policy on first use there; learned state (the suffix tree's cache
of finished responses, the adaptive policy's acceptance history) starts empty in the new process.

Drafts are deterministic: no randomness per request or per step.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Hashable, Optional, Sequence

import numpy as np

from spec_plugins.core import BatchCapped, check_cap
from spec_plugins.drafting import DraftingLayer
from spec_plugins.registry import create_policy, create_proposer

DRAFTER_MODULE = "tensorrt_llm._torch.speculative.drafter"
RESOURCE_MANAGER_MODULE = "tensorrt_llm._torch.pyexecutor.resource_manager"

# `LlmRequestState` names of a request that has ended.
_FINISHED_STATES = frozenset({"GENERATION_COMPLETE"})


def _import_trtllm(module: str, attr: str) -> Any:
    """`module.attr` from TensorRT-LLM, or a one-line ImportError saying what is missing."""
    try:
        mod = __import__(module, fromlist=[attr])
    except (ImportError, OSError) as exc:  # OSError: bindings without libcuda/libmpi on this host
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ImportError(
            f"spec_plugins.trtllm needs TensorRT-LLM >= 1.2 (pip install 'spec-plugins[trtllm]' on a CUDA "
            f"host); importing {module} failed: {first}"
        ) from None
    return getattr(mod, attr)


class DrafterLogic:
    """Everything the TensorRT-LLM drafter does, engine-free; `drafter_class()` mixes it into
    TensorRT-LLM's `Drafter` (this class comes first in the MRO, so its `super()` is the `Drafter`)."""

    # Drafters verified by TorchSampler set this on TensorRT-LLM main (>= 1.3) so the KV cache is
    # extended for the padding; 1.2 does not read it.
    _needs_padding_kv_extension: ClassVar[bool] = True
    # A request absent from the batch for more than this many prepare_draft_tokens calls is finished.
    stale_steps: ClassVar[int] = 16

    def __init__(
        self,
        max_draft_len: int,
        *,
        proposer: str = "suffix_tree",
        proposer_options: Optional[dict] = None,
        policy: str = "fixed",
        policy_options: Optional[dict] = None,
        draft_len_schedule: Optional[dict] = None,
        max_concurrency: Optional[int] = None,
    ) -> None:
        config = _validated_config(max_draft_len, proposer, proposer_options, policy, policy_options,
                                   draft_len_schedule, max_concurrency)
        self._config = config
        self._model: Optional[tuple[Any, str]] = None  # what bind_model() was given, to re-bind after pickling
        super().__init__(
            max_draft_len=config["max_draft_len"],
            max_total_draft_tokens=config["max_draft_len"],  # linear drafts: UserProvided forces this too
            max_concurrency=config["max_concurrency"],
            draft_len_schedule=config["draft_len_schedule"],
        )
        self._init_runtime()
        self._build()  # validates the options now, in the caller's process

    # ---- public -----------------------------------------------------------------------------------

    @property
    def proposer(self) -> Any:
        self._build()
        return self._proposer

    @property
    def policy(self) -> Any:
        self._build()
        return self._policy

    @property
    def config(self) -> dict:
        """The validated constructor arguments (what pickling carries)."""
        return dict(self._config)

    @property
    def num_tracked(self) -> int:
        """Requests whose per-request state is held (handed to the proposer, not finished yet)."""
        return 0 if self._drafting is None else self._drafting.num_tracked

    @property
    def num_finished(self) -> int:
        return 0 if self._drafting is None else self._drafting.num_finished

    def bind_model(self, model: Any, source: str = "TensorRT-LLM model config") -> None:
        """Hand the target's config (a Hugging Face config dict) to a policy that costs it (`adaptive`
        with `hardware` alone). The executor never shows a drafter the model, so the launcher calls this."""
        self._model = (model, source)
        if self._drafting is not None:
            self._drafting.bind_model(model, source)

    def finish(self, req_id: Hashable) -> None:
        """Free `req_id`'s state in the proposer and the policy; ids not tracked are ignored, so every
        request is finished at most once whichever path (resource manager, state, sweep) sees it first."""
        if self._drafting is not None:
            self._drafting.finish(req_id)

    # ---- Drafter --------------------------------------------------------------------------------

    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        self._build()
        layer = self._drafting
        # A context request is new (or recomputed from scratch): any state under its id is stale.
        idle = [r.py_request_id for r in scheduled_requests.context_requests]
        for req_id in idle:
            layer.finish(req_id)
        targets, contexts, caps, accepted = [], [], [], []
        for req in _batch_order(scheduled_requests.generation_requests):
            req_id = req.py_request_id
            self._requests[req_id] = req
            if _state_name(req) in _FINISHED_STATES or req.py_disable_speculative_decoding:
                layer.verified([req_id], [self._accepted(req)])  # its last draft still counts
                if _state_name(req) in _FINISHED_STATES:
                    layer.finish(req_id)
                else:
                    idle.append(req_id)
                continue
            tokens = list(req.get_tokens(0))
            # Every step emits the accepted drafts plus one token; stay within max_new_tokens.
            room = req.py_orig_prompt_len + req.py_max_new_tokens - len(tokens) - 1
            targets.append(req)
            contexts.append(tokens)
            caps.append(max(0, min(int(self.max_draft_len), self._step_cap, room)))
            accepted.append(self._accepted(req))
        self._sweep_finished({r.py_request_id for r in scheduled_requests.generation_requests})
        drafts = layer.step([r.py_request_id for r in targets], contexts, [len(c) for c in contexts],
                            max_draft=np.array(caps, dtype=np.int64), accepted=np.array(accepted, dtype=np.int64),
                            present=idle)
        for req, tokens in zip(targets, drafts.lists()):
            req.py_draft_tokens = tokens
            self._draft_iter[req.py_request_id] = getattr(req, "py_decoding_iter", 0)

    def get_draft_len_for_batch_size(self, batch_size: int) -> int:
        """The schedule's K for this batch size, lowered to the policy's per-step cap if it has one.

        The engine pads every draft to the static maximum, so a shorter engine-wide K saves drafter
        time, and K = 0 skips the step's speculation (and its padded verification) altogether. The
        policy can only lower the schedule's value: the schedule is the operator's limit, and the
        engine sized its buffers for `max_draft_len`.

        Never 0: in 1.2 a step whose K is 0 marks every request it schedules
        `py_disable_speculative_decoding`, and nothing clears the flag, so those requests would never
        speculate again (and the drafter's state for them goes stale). A K of 0 from the schedule or
        the policy is therefore returned as 1 and applied per request instead: `prepare_draft_tokens`
        cuts every draft of that step to 0 tokens (the engine verifies one pad token per request).
        """
        if self.draft_len_schedule is None:
            k = self._config["max_draft_len"]
        else:
            k = super().get_draft_len_for_batch_size(batch_size)
        cap = policy_batch_cap(self.policy, batch_size)
        k = k if cap is None else min(k, cap)
        self._step_cap = k
        return max(k, 1)

    # ---- pickling ---------------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        return {"config": dict(self._config), "model": self._model,
                "max_draft_len": self.max_draft_len, "max_total_draft_tokens": self.max_total_draft_tokens}

    def __setstate__(self, state: dict) -> None:
        config = state["config"]
        self._config = config
        self._model = state["model"]
        super().__init__(
            max_draft_len=config["max_draft_len"],
            max_total_draft_tokens=config["max_draft_len"],
            max_concurrency=config["max_concurrency"],
            draft_len_schedule=config["draft_len_schedule"],
        )
        self.max_draft_len = state["max_draft_len"]
        self.max_total_draft_tokens = state["max_total_draft_tokens"]
        self._init_runtime()  # the proposer and policy are built on first use

    # ---- helpers ------------------------------------------------------------------------------------

    def _init_runtime(self) -> None:
        self._drafting: Optional[DraftingLayer] = None
        # This step's K as the schedule and policy resolved it (0 included; the engine is told at least 1).
        self._step_cap = 2**31 - 1
        # TensorRT-LLM's own request objects, to read a request's state once it has left the batch, and
        # the `py_decoding_iter` at which each request's last draft was written (to tell when it is verified).
        self._requests: dict[Hashable, Any] = {}
        self._draft_iter: dict[Hashable, int] = {}

    @property
    def _proposer(self) -> Any:
        return None if self._drafting is None else self._drafting.proposer

    @property
    def _policy(self) -> Any:
        return None if self._drafting is None else self._drafting.policy

    def _build(self) -> None:
        if self._drafting is not None:
            return
        c = self._config
        proposer = create_proposer(c["proposer"], c["proposer_options"])
        policy = create_policy(c["policy"], c["policy_options"])
        self._drafting = DraftingLayer(proposer, policy, who=f"proposer {c['proposer']!r}",
                                       stale_steps=self.stale_steps, on_finish=self._forget,
                                       clock=time.perf_counter)
        self._drafting.engine_on_accelerator(True)  # TensorRT-LLM's forward always runs on the GPU
        # The engine pads every draft with token 0 to the static maximum and verifies the pads: a filled draft's
        # guesses cost nothing more and beat token 0.
        self._drafting.runner_verifies_all(True)
        if self._model is not None:
            self._drafting.bind_model(*self._model)

    def _forget(self, req_id: Hashable, why: str) -> None:
        self._requests.pop(req_id, None)
        self._draft_iter.pop(req_id, None)

    def _accepted(self, req: Any) -> int:
        """Drafted tokens the sampler accepted in the request's last verification, or -1 if its last
        draft has not been through the target yet (the layer keeps it pending)."""
        written = self._draft_iter.get(req.py_request_id)
        if written is None or getattr(req, "py_decoding_iter", written + 1) <= written:
            return -1
        return int(req.py_num_accepted_draft_tokens or 0)

    def _sweep_finished(self, scheduled: set) -> None:
        # Requests that left the batch finished (the executor does not tell the drafter); the drafting
        # layer's own sweep frees the ones that simply stopped coming back. A request object is kept only
        # while the layer tracks its id or it is in this step.
        for req_id, req in list(self._requests.items()):
            if _state_name(req) in _FINISHED_STATES:
                self._drafting.finish(req_id)
                self._forget(req_id, "finished")
            elif req_id not in scheduled and not self._drafting.is_tracked(req_id):
                self._forget(req_id, "untracked")


def _validated_config(max_draft_len: Any, proposer: Any, proposer_options: Any, policy: Any,
                      policy_options: Any, draft_len_schedule: Any, max_concurrency: Any) -> dict:
    """The constructor's arguments, checked; each problem is one ValueError naming the field."""
    from spec_plugins.policy.planner import check_trtllm_schedule

    k = check_cap(max_draft_len, "max_draft_len")
    if max_concurrency is not None:
        max_concurrency = check_cap(max_concurrency, "max_concurrency")
    for name, value in (("proposer", proposer), ("policy", policy)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: expected a registered name, got {value!r}")
    for name, value in (("proposer_options", proposer_options), ("policy_options", policy_options)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{name}: expected a dict of options, got {value!r}")
    if draft_len_schedule is not None:
        if not isinstance(draft_len_schedule, dict):
            raise ValueError("draft_len_schedule: expected a dict {batch size: draft length}, "
                             f"got {draft_len_schedule!r}")
        check_trtllm_schedule(draft_len_schedule, k)
        # Sorted by batch size, as TensorRT-LLM's config validator leaves it: the lookup bisects the keys.
        draft_len_schedule = dict(sorted(draft_len_schedule.items()))
    elif policy != "fixed":
        # The executor consults get_draft_len_for_batch_size only when a schedule exists.
        draft_len_schedule = {1: k}
    return {
        "max_draft_len": k,
        "proposer": proposer,
        "proposer_options": dict(proposer_options or {}),
        "policy": policy,
        "policy_options": dict(policy_options or {}),
        "draft_len_schedule": draft_len_schedule,
        "max_concurrency": max_concurrency,
    }


def policy_batch_cap(policy: Any, batch_size: int) -> Optional[int]:
    """The most draft tokens one request may get this step by the policy's own batch-level limit
    (`core.BatchCapped`), or None."""
    if not isinstance(policy, BatchCapped):
        return None
    cap = policy.batch_cap(batch_size)
    return None if cap is None else check_cap(cap, "policy batch_cap", allow_zero=True)


def _batch_order(requests: Sequence[Any]) -> list:
    # The order TensorRT-LLM's own drafters use: batch index, else request id (disaggregated serving
    # drafts before py_batch_idx is assigned). Deterministic either way.
    return sorted(requests, key=lambda r: (getattr(r, "py_batch_idx", None) is None,
                                           getattr(r, "py_batch_idx", None) or r.py_request_id))


def _state_name(request: Any) -> Optional[str]:
    # LlmRequestState is a C++ enum in TensorRT-LLM; compare by name so no binding import is needed.
    state = getattr(request, "state", None)
    return getattr(state, "name", None)


# ---- the classes TensorRT-LLM sees, built on first use -----------------------------------------------

_classes: dict[tuple[str, int], type] = {}


def drafter_class() -> type:
    """`SpecPluginsDrafter`: `DrafterLogic` over the importable TensorRT-LLM `Drafter` (built once per base)."""
    base = _import_trtllm(DRAFTER_MODULE, "Drafter")
    key = ("drafter", id(base))
    if key not in _classes:
        _classes[key] = type(base)("SpecPluginsDrafter", (DrafterLogic, base), {
            "__module__": __name__, "__qualname__": "SpecPluginsDrafter", "__doc__": _DRAFTER_DOC,
        })
    return _classes[key]


_DRAFTER_DOC = """A TensorRT-LLM `Drafter` serving a spec-plugins proposer and draft-length policy.

    SpecPluginsDrafter(max_draft_len, *, proposer="suffix_tree", proposer_options=None, policy="fixed",
                       policy_options=None, draft_len_schedule=None, max_concurrency=None)

    max_draft_len:      K, the longest draft (UserProvidedDecodingConfig.max_draft_len must match).
    proposer, policy:   registered names (spec_plugins.registry); *_options are validated there.
    draft_len_schedule: {batch size: K} with 1 -> max_draft_len (TensorRT-LLM 1.2's rule); a policy that
                        is not `fixed` gets {1: max_draft_len} so the engine asks it every step.
    max_concurrency:    speculation off above this many requests (TensorRT-LLM's should_use_spec_decode).
"""


def resource_manager_class() -> type:
    """`SpecPluginsResourceManager`: frees a drafter's per-request state when the executor frees the request.

    Optional; pass it as `UserProvidedDecodingConfig(resource_manager=drafter_rm)` next to the drafter
    (pickled together, it keeps pointing at the same drafter).
    """
    base = _import_trtllm(RESOURCE_MANAGER_MODULE, "BaseResourceManager")
    key = ("resource_manager", id(base))
    if key not in _classes:
        _classes[key] = type(base)("SpecPluginsResourceManager", (_ResourceManagerLogic, base), {
            "__module__": __name__, "__qualname__": "SpecPluginsResourceManager",
            "__doc__": resource_manager_class.__doc__,
        })
    return _classes[key]


class _ResourceManagerLogic:
    def __init__(self, drafter: Any, max_num_requests: int = 2**31 - 1) -> None:
        self.drafter = drafter
        self.max_num_requests = max_num_requests

    def get_max_resource_count(self) -> int:
        return self.max_num_requests

    def get_needed_resource_to_completion(self, request: Any) -> int:
        return 0  # holds no engine resources

    def free_resources(self, request: Any) -> None:
        self.drafter.finish(request.py_request_id)


def __getattr__(name: str) -> Any:
    # `SpecPluginsDrafter` and `SpecPluginsResourceManager` resolve here, so importing this module (and
    # unpickling a drafter in a worker) imports TensorRT-LLM only when a class is needed.
    if name == "SpecPluginsDrafter":
        return drafter_class()
    if name == "SpecPluginsResourceManager":
        return resource_manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

