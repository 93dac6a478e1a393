"""A CPU stand-in for what a TensorRT-LLM 1.2 `Drafter` touches, and an executor loop that drives one.

Follows the published source of NVIDIA/TensorRT-LLM (same signatures and semantics):

* `tensorrt_llm/_torch/speculative/drafter.py`, 1.2 line (`Drafter.__init__(max_draft_len,
  max_total_draft_tokens, max_concurrency, draft_len_schedule)`, `_static_max_total_draft_tokens`);
* `tensorrt_llm/_torch/pyexecutor/py_executor.py` and `speculative/ngram.py` at commit
  0249976575050d2c624a5f285683c66de311a3b7 (`__version__ = "1.2.0rc3"`): `_prepare_and_schedule_batch`,
  `_prepare_draft_requests`, `_executor_loop`, `NGramDrafter`;
* `pyexecutor/llm_request.py` (the `py_*` fields), `pyexecutor/scheduler.py` (`ScheduledRequests`),
  `pyexecutor/resource_manager.py` (`BaseResourceManager`), `pyexecutor/sampler.py` (TorchSampler's
  greedy draft acceptance, `py_num_accepted_draft_tokens`, `py_rewind_len`).

`install(monkeypatch)` puts these under TensorRT-LLM's module names when TensorRT-LLM is not importable.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import logging
import sys
import types
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, final

logger = logging.getLogger("tensorrt_llm")


# ---- pyexecutor/llm_request.py ----------------------------------------------------------------------


class LlmRequestState(enum.Enum):
    CONTEXT_INIT = 2
    DISAGG_GENERATION_INIT = 8
    GENERATION_IN_PROGRESS = 10
    GENERATION_TO_COMPLETE = 11
    GENERATION_COMPLETE = 12


def get_draft_token_length(request: Any) -> int:
    return 0 if request.py_draft_tokens is None else len(request.py_draft_tokens)


class LlmRequest:
    """The fields and methods of TensorRT-LLM's LlmRequest that drafters and this executor use."""

    def __init__(self, request_id: int, prompt: List[int], max_new_tokens: int, end_id: Optional[int] = None):
        self.request_id = request_id
        self.py_request_id = request_id
        self.py_orig_prompt_len = len(prompt)
        self.py_prompt_len = len(prompt)
        self.py_max_new_tokens = max_new_tokens
        self.py_end_id = end_id
        self.py_batch_idx: Optional[int] = None
        self.py_draft_pages_allocated = 0
        self.py_rewind_len = 0
        self.draft_tokens: List[int] = []
        self.py_draft_tokens: List[int] = []
        self.py_last_draft_tokens: Optional[List[int]] = None
        self.py_num_accepted_draft_tokens = 0
        self.py_decoding_iter = 0
        self.py_disable_speculative_decoding = False
        self.state = LlmRequestState.CONTEXT_INIT
        self._tokens = [list(prompt)]

    def get_tokens(self, beam: int) -> List[int]:
        return list(self._tokens[beam])

    def get_num_tokens(self, beam: int) -> int:
        return len(self._tokens[beam])

    def add_new_token(self, token: int, beam: int) -> None:
        self._tokens[beam].append(token)

    @property
    def is_generation_only_request(self) -> bool:
        return False


# ---- pyexecutor/scheduler.py ----------------------------------------------------------------------------


class ScheduledRequests:
    def __init__(self) -> None:
        self.context_requests: List[LlmRequest] = []
        self.generation_requests: List[LlmRequest] = []
        self.paused_requests: List[LlmRequest] = []

    @property
    def can_run_cuda_graph(self) -> bool:
        return not self.context_requests

    @property
    def batch_size(self) -> int:
        return len(self.context_requests) + len(self.generation_requests)

    def all_requests(self) -> List[LlmRequest]:
        return self.context_requests + self.generation_requests


# ---- pyexecutor/resource_manager.py ---------------------------------------------------------------------


class ResourceManagerType(enum.Enum):
    KV_CACHE_MANAGER = "KV_CACHE_MANAGER"
    DRAFT_KV_CACHE_MANAGER = "DRAFT_KV_CACHE_MANAGER"
    PEFT_CACHE_MANAGER = "PEFT_CACHE_MANAGER"
    SEQ_SLOT_MANAGER = "SEQ_SLOT_MANAGER"
    SPEC_RESOURCE_MANAGER = "SPEC_RESOURCE_MANAGER"


class BaseResourceManager(ABC):
    @abstractmethod
    def get_max_resource_count(self) -> int:
        raise NotImplementedError

    @abstractmethod
    def get_needed_resource_to_completion(self, request: LlmRequest) -> int:
        raise NotImplementedError

    def add_dummy_requests(self, request_ids: List[int]):
        pass

    def prepare_resources(self, scheduled_batch: ScheduledRequests):
        pass

    def update_resources(self, scheduled_batch: ScheduledRequests):
        pass

    def free_resources(self, request: LlmRequest):
        pass

    def shutdown(self):
        pass


class ResourceManager:
    """The executor's container of resource managers (only the calls the loop makes)."""

    def __init__(self, resource_managers: Dict[ResourceManagerType, BaseResourceManager]):
        self.resource_managers = dict(resource_managers)

    def get_resource_manager(self, name: ResourceManagerType) -> Optional[BaseResourceManager]:
        return self.resource_managers.get(name)

    def prepare_resources(self, scheduled_batch: ScheduledRequests) -> None:
        for manager in self.resource_managers.values():
            manager.prepare_resources(scheduled_batch)

    def update_resources(self, scheduled_batch: ScheduledRequests) -> None:
        for manager in self.resource_managers.values():
            manager.update_resources(scheduled_batch)

    def free_resources(self, request: LlmRequest) -> None:
        for manager in reversed(list(self.resource_managers.values())):
            manager.free_resources(request)


# ---- speculative/drafter.py (1.2) -----------------------------------------------------------------------


class Drafter(ABC):
    """Abstract base class for all drafter implementations."""

    def __init__(self,
                 max_draft_len: int = None,
                 max_total_draft_tokens: int = None,
                 max_concurrency: Optional[int] = None,
                 draft_len_schedule: Optional[Dict[int, int]] = None) -> None:
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_total_draft_tokens
        self._static_max_total_draft_tokens = max_total_draft_tokens  # what padding extends to
        self.max_concurrency = max_concurrency
        self.draft_len_schedule = draft_len_schedule

    @abstractmethod
    def prepare_draft_tokens(self, scheduled_requests: ScheduledRequests,
                             resource_manager: Optional[ResourceManager] = None) -> None:
        raise NotImplementedError

    @final
    def should_use_spec_decode(self, requests: List[LlmRequest], max_batch_size: int, max_num_tokens: int,
                               max_total_draft_tokens: int) -> bool:
        if self.max_concurrency is None:
            return True
        if not requests or max_batch_size <= 0 or max_num_tokens <= 0:
            return False
        fitting = max_num_tokens // (1 + max_total_draft_tokens)
        if fitting <= 0:
            return False
        return min(len(requests), max_batch_size, fitting) <= self.max_concurrency

    @final
    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests: ScheduledRequests) -> None:
        for req in scheduled_requests.generation_requests:
            missing = self._static_max_total_draft_tokens - get_draft_token_length(req)
            req.py_draft_tokens.extend([0] * max(0, missing))

    def get_draft_len_for_batch_size(self, batch_size: int) -> int:
        # Largest threshold <= batch_size; the config validator sorted the keys.
        thresholds = list(self.draft_len_schedule.keys())
        idx = bisect_right(thresholds, batch_size)
        if idx == 0:
            logger.warning(f"get_draft_len_for_batch_size called with batch_size={batch_size} < 1")
            return 0
        return self.draft_len_schedule[thresholds[idx - 1]]

    def update_max_total_draft_tokens(self, new_max_total_draft_tokens: int) -> None:
        self.max_total_draft_tokens = new_max_total_draft_tokens
        self.max_draft_len = new_max_total_draft_tokens

    def run_drafter_post(self, scheduled_requests: ScheduledRequests,
                         resource_manager: Optional[ResourceManager] = None, is_warmup: bool = False) -> None:
        pass


# ---- speculative/drafter.py (main line, 1.3/1.4) -----------------------------------------------------------
# What the main line changes in `Drafter`, as read in TensorRT-LLM's public sources without a commit id
# (drafter.py after PR #10860, which added `OneModelDrafter`) and in shared/reference/trtllm-extension-points.md
# section 1.3: three hooks with no-op defaults for the two-model `ModelDrafter`, a `resource_manager` argument
# for the (still final) padding, and `_needs_padding_kv_extension` for drafters verified by TorchSampler.
# `run_drafter_post` is gone in the newest sources; the executor here never calls it either way.


class MainLineDrafter(Drafter):
    _needs_padding_kv_extension: bool = False

    @final
    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests: ScheduledRequests,
                                        resource_manager: Optional[ResourceManager] = None) -> None:
        for req in scheduled_requests.generation_requests:
            missing = self._static_max_total_draft_tokens - get_draft_token_length(req)
            req.py_draft_tokens.extend([0] * max(0, missing))

    def cleanup_previous_draft_resources(self) -> None:
        pass

    def should_forward_draft_model(self, scheduled_batch: ScheduledRequests) -> bool:
        return True

    def generate_draft_tokens_with_overlap(self, *args: Any, **kwargs: Any) -> None:
        pass


# ---- installing under TensorRT-LLM's module names --------------------------------------------------------

MODULES: Dict[str, Dict[str, Any]] = {
    "tensorrt_llm": {},
    "tensorrt_llm.logger": {"logger": logger},
    "tensorrt_llm._torch": {},
    "tensorrt_llm._torch.speculative": {},
    "tensorrt_llm._torch.speculative.drafter": {"Drafter": Drafter},
    "tensorrt_llm._torch.pyexecutor": {},
    "tensorrt_llm._torch.pyexecutor.llm_request": {
        "LlmRequest": LlmRequest, "LlmRequestState": LlmRequestState, "get_draft_token_length": get_draft_token_length},
    "tensorrt_llm._torch.pyexecutor.resource_manager": {
        "BaseResourceManager": BaseResourceManager, "ResourceManager": ResourceManager,
        "ResourceManagerType": ResourceManagerType},
    "tensorrt_llm._torch.pyexecutor.scheduler": {"ScheduledRequests": ScheduledRequests},
}


def trtllm_installed() -> bool:
    if "tensorrt_llm" in sys.modules:
        return getattr(sys.modules["tensorrt_llm"], "__stub__", False) is False
    return importlib.util.find_spec("tensorrt_llm") is not None


def install(monkeypatch: Any, drafter_base: type = Drafter) -> bool:
    """Insert the stub modules (undone by monkeypatch) unless TensorRT-LLM is importable; True if installed.
    `drafter_base`: the `Drafter` to stand in (1.2's, or `MainLineDrafter`)."""
    if trtllm_installed():
        return False
    modules = {}
    for name, attrs in {**MODULES, "tensorrt_llm._torch.speculative.drafter": {"Drafter": drafter_base}}.items():
        mod = types.ModuleType(name, "TensorRT-LLM 1.2 stand-in (tests/trtllm_stub.py)")
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        mod.__stub__ = True
        for key, value in attrs.items():
            setattr(mod, key, value)
        modules[name] = mod
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, mod)
        monkeypatch.setitem(sys.modules, name, mod)
    return True


# ---- the executor loop (py_executor.py, synchronous loop, 1.2) -------------------------------------------


@dataclass
class StepRecord:
    step: int
    active: int  # len(active_requests) the schedule lookup saw
    k: int  # max_total_draft_tokens for the step
    use_spec_decode: bool
    drafts: Dict[int, List[int]] = field(default_factory=dict)  # request id -> draft as the drafter wrote it
    padded: Dict[int, int] = field(default_factory=dict)  # request id -> len(py_draft_tokens) after padding
    room: Dict[int, int] = field(default_factory=dict)  # request id -> tokens it may still emit - 1
    accepted: Dict[int, int] = field(default_factory=dict)  # request id -> py_num_accepted_draft_tokens


class StubExecutor:
    """`PyExecutor._executor_loop` (disable_overlap_scheduler=True) around a fake greedy target.

    The target emits, for each request, the next token of a fixed reference continuation; verification
    accepts the longest draft prefix equal to the target's tokens (TorchSampler, greedy), so output
    with speculation must equal output without.
    """

    def __init__(self, drafter: Any = None, *, max_batch_size: int = 4, max_num_tokens: int = 8192,
                 spec_resource_manager: Any = None,
                 unschedule: Optional[Callable[[int, LlmRequest], bool]] = None) -> None:
        self.drafter = drafter
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        managers = {}
        if spec_resource_manager is not None:
            managers[ResourceManagerType.SPEC_RESOURCE_MANAGER] = spec_resource_manager
        self.resource_manager = ResourceManager(managers)
        self.max_total_draft_tokens = drafter.max_total_draft_tokens if drafter is not None else 0
        self.use_spec_decode = False
        self.unschedule = unschedule  # (step, request) -> True keeps a generation request out of the step
        self.waiting: deque = deque()  # (arrival step, request)
        self.active: List[LlmRequest] = []
        self.references: Dict[int, List[int]] = {}  # id(request) -> reference continuation
        self.finished: List[LlmRequest] = []
        self.log: List[StepRecord] = []
        self.step_count = 0

    # -- requests --
    def submit(self, request_id: int, prompt: List[int], reference: List[int], max_new_tokens: int,
               arrival: int = 0, end_id: Optional[int] = None) -> LlmRequest:
        if len(reference) < max_new_tokens:
            raise ValueError("reference continuation shorter than max_new_tokens")
        req = LlmRequest(request_id, prompt, max_new_tokens, end_id)
        self.references[id(req)] = list(reference)
        self.waiting.append((arrival, req))
        return req

    def output(self, req: LlmRequest) -> List[int]:
        return req.get_tokens(0)[req.py_orig_prompt_len:]

    # -- loop --
    def run(self, max_steps: int = 100_000, between_steps: Optional[Callable[["StubExecutor"], None]] = None) -> None:
        while self.waiting or self.active:
            if self.step_count >= max_steps:
                raise RuntimeError("executor did not finish")
            self.step()
            if between_steps is not None:
                between_steps(self)

    def step(self) -> None:
        self.step_count += 1
        self._admit()
        record = StepRecord(self.step_count, len(self.active), self.max_total_draft_tokens, False)
        if self.drafter is not None:
            self._setup_drafter(record)
        batch = self._schedule()
        if self.drafter is not None and not self.use_spec_decode:
            for req in batch.all_requests():
                req.py_disable_speculative_decoding = True
        self.resource_manager.prepare_resources(batch)
        if self.drafter is not None and self.use_spec_decode:
            self.drafter.prepare_draft_tokens(batch, self.resource_manager)
            for req in batch.generation_requests:
                record.drafts[req.py_request_id] = list(req.py_draft_tokens)
                record.room[req.py_request_id] = (req.py_orig_prompt_len + req.py_max_new_tokens
                                                  - req.get_num_tokens(0) - 1)
            self.drafter.pad_draft_tokens_for_cuda_graph(batch)
            record.padded = {r.py_request_id: len(r.py_draft_tokens) for r in batch.generation_requests}
        self._forward_and_sample(batch, record)
        self._handle_responses()
        self.resource_manager.update_resources(batch)
        self.log.append(record)

    def _admit(self) -> None:
        # New requests join the active list in arrival order while there is room.
        still = deque()
        while self.waiting:
            arrival, req = self.waiting.popleft()
            if arrival <= self.step_count and len(self.active) < self.max_batch_size:
                self.active.append(req)
            else:
                still.append((arrival, req))
        self.waiting = still

    def _setup_drafter(self, record: StepRecord) -> None:
        drafter = self.drafter
        if drafter.draft_len_schedule is not None:
            self.max_total_draft_tokens = drafter.get_draft_len_for_batch_size(len(self.active))
            drafter.update_max_total_draft_tokens(self.max_total_draft_tokens)
        if drafter.draft_len_schedule is not None and self.max_total_draft_tokens == 0:
            self.use_spec_decode = False
        else:
            self.use_spec_decode = drafter.should_use_spec_decode(
                self.active, self.max_batch_size, self.max_num_tokens, self.max_total_draft_tokens)
        record.k, record.use_spec_decode = self.max_total_draft_tokens, self.use_spec_decode
        for req in self.active:
            if req.state in (LlmRequestState.GENERATION_IN_PROGRESS, LlmRequestState.DISAGG_GENERATION_INIT):
                req.draft_tokens = [0] * self.max_total_draft_tokens if self.max_total_draft_tokens > 0 else []
        self._prepare_draft_requests()

    def _prepare_draft_requests(self) -> None:
        # Placeholder drafts make the scheduler and the KV cache reserve room for the real ones.
        for req in self.active:
            if req.state not in (LlmRequestState.GENERATION_IN_PROGRESS, LlmRequestState.DISAGG_GENERATION_INIT):
                continue
            req.py_last_draft_tokens = req.py_draft_tokens
            k = self.max_total_draft_tokens
            if k > 0 and self.use_spec_decode and not req.py_disable_speculative_decoding:
                req.py_draft_tokens = [0] * k
                req.py_draft_pages_allocated = k
            else:
                req.py_draft_tokens = []
                req.py_draft_pages_allocated = 0

    def _schedule(self) -> ScheduledRequests:
        batch = ScheduledRequests()
        for req in self.active:
            if req.state == LlmRequestState.CONTEXT_INIT:
                batch.context_requests.append(req)
            elif req.state == LlmRequestState.GENERATION_IN_PROGRESS:
                if self.unschedule is None or not self.unschedule(self.step_count, req):
                    batch.generation_requests.append(req)
        return batch

    def _target(self, req: LlmRequest) -> int:
        """Greedy next token: the reference continuation at the request's current length."""
        done = self.output(req)
        reference = self.references[id(req)]
        assert done == reference[: len(done)], "output left the reference continuation"
        return reference[len(done)]

    def _stop(self, req: LlmRequest, token: int) -> bool:
        if len(self.output(req)) >= req.py_max_new_tokens or token == req.py_end_id:
            req.state = LlmRequestState.GENERATION_COMPLETE
            return True
        return False

    def _forward_and_sample(self, batch: ScheduledRequests, record: StepRecord) -> None:
        for idx, req in enumerate(batch.all_requests()):
            req.py_batch_idx = idx
        for req in batch.context_requests:  # prefill: the first output token
            token = self._target(req)
            req.add_new_token(token, 0)
            req.state = LlmRequestState.GENERATION_IN_PROGRESS
            self._stop(req, token)
            req.py_decoding_iter += 1
        for req in batch.generation_requests:
            if req.state == LlmRequestState.GENERATION_COMPLETE:
                continue
            token = self._target(req)
            req.add_new_token(token, 0)
            stop = self._stop(req, token)
            if not stop and len(req.py_draft_tokens) > 0:
                accepted = 0
                for draft_token in req.py_draft_tokens:
                    if draft_token != token:
                        break
                    accepted += 1
                    token = self._target(req)
                    req.add_new_token(token, 0)
                    if self._stop(req, token):
                        break
                req.py_num_accepted_draft_tokens = accepted
                req.py_rewind_len = req.py_draft_pages_allocated - accepted
                record.accepted[req.py_request_id] = accepted
            req.py_decoding_iter += 1

    def _handle_responses(self) -> None:
        for req in [r for r in self.active if r.state == LlmRequestState.GENERATION_COMPLETE]:
            self.active.remove(req)
            self.finished.append(req)
            self.resource_manager.free_resources(req)
