"""Our proposers as vLLM 0.34+ speculators (Model Runner V2, `BaseSpeculator`): one runner step in, one draft
matrix out, through the same drafting layer and compiled cores as the V1 `custom_class` proposers.

What the runner gives and wants (vLLM 0.34 `v1/worker/gpu/model_runner.py`, `spec_decode/speculator.py`):

- `add_request(slot)` after `RequestState.add_request`: `req_states.index_to_req_id[slot]` names the request and
  `req_states.prefill_len.np[slot]` is its length on the host. A preempted request comes back in full as a new one,
  so a known id starts over.
- `on_requests_finished(ids)`: finished requests only, before their slots are freed; preempted ones get no call
  (the drafting layer's stale bound frees them if they never come back).
- `reset_state()` after the kernel warm-up; warm-up requests run later (`_context_warmup_i_`) are ignored.
- `propose(input_batch, ..., num_sampled, ...)` after sampling, every step: `num_sampled[i]` tokens were appended
  to row i's history (0 for a prefill chunk in progress; accepted drafts + 1 otherwise). It returns a
  `[num_reqs, K]` int64 tensor on the device; every slot is verified, so a short draft is padded.

Host access, and its one sync: the token history (`req_states.all_token_ids`) lives in pinned host memory, mapped
into the device (UVA), as long as the method does not ask for it dense on the device (our configs do not). The
sampled tokens reach it through a device kernel (`post_update`), and `num_sampled` exists only on the device, so
`propose` copies `num_sampled` to the host: that copy waits for the stream, after which every write of this step
is visible in the host view too. It is wrapped in `gpu_sync_allowed()`, as vLLM's sync checker asks. The lengths
are mirrored on the host (`prefill_len` at `add_request`, plus `num_sampled` every step: the rule by which
`post_update` grows `total_len` on the device), so nothing else is copied back. The drafts go to the device in one
non-blocking copy from a pinned buffer; the next step's sync guarantees that copy is done before the buffer is
written again. On vLLM's CPU platform every buffer is host memory and the copies are memcpys.

Adaptive verification (`enable_adaptive_verification`): vLLM trims the batch's drafts by per-position confidences,
which we hand in `draft_token_confidence_probs`. A policy that rates drafts (`core.RatesDrafts`: `adaptive`) hands
its calibrated estimates (the conditional acceptance its prefix survival implies, read off the survival its trim
computed: `DraftingLayer.step(rated=True)`), others the proposer's raw confidences. vLLM may then verify fewer
slots than were drafted: `num_rejected` (copied with `num_sampled`, same sync) gives how many it verified, and the
policy learns from those only.

Under tensor parallelism each rank builds its own speculator and no collective runs: every rank drafts the same
tokens because the drafting layer and the proposers are deterministic in the sequence of calls, which the runner
makes the same on every rank (finished ids are taken in sorted order, as vLLM's own `suffix` does), and because with
more than one rank the adaptive policy is given no clock (its fit to measured step times would differ by rank).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from spec_plugins.core import BindsModel, ResolvesCost
from spec_plugins.drafting import DraftingLayer
from spec_plugins.slots import RowRange
from spec_plugins.vllm import _rows
from spec_plugins.vllm.proposer import StepTrace, engine_device
from spec_plugins.vllm.settings import OPTIONS_FIELD, settings_from_speculator_options

logger = logging.getLogger("vllm.spec_plugins")

# vLLM's fake requests: `_warmup_{i}_`, `_v2_mixed_warmup_decode_`, `_context_warmup_{i}_` (v1/worker/gpu/warmup.py).
WARMUP_ID = re.compile(r"^_\w*warmup")


def host_token_history(req_states: Any) -> np.ndarray:
    """`req_states.all_token_ids` as a host array ([max_num_reqs, max_model_len] int32), without a copy: the pinned
    host side of its UVA buffer, or the tensor itself where the runner keeps it in host memory (CPU platform)."""
    history = req_states.all_token_ids
    uva = getattr(history, "_uva_buf", None)
    if uva is not None:
        return uva.np
    if history.gpu.device.type == "cpu":
        return history.gpu.numpy()
    raise ValueError("speculative_config.method: a spec-plugins speculator drafts on the host and reads the token "
                     "history from pinned host memory, but this runner keeps it on the device only (no UVA on this "
                     "platform); use vLLM's own 'suffix' or 'ngram' here")


class SpecPluginsSpeculator(BaseSpeculator):
    """Serves the proposer its method names (`SuffixTreeSpeculator`, `NgramSpeculator`)."""

    proposer_name: ClassVar[str] = ""
    # A request absent from the batch for more than this many steps is freed (preempted ones get no callback).
    stale_steps: ClassVar[int] = 16

    def __init__(self, vllm_config: Any, device: torch.device, req_states: Any) -> None:
        spec = vllm_config.speculative_config
        self.vllm_config = vllm_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.settings = settings_from_speculator_options(getattr(spec, "speculator_options", None),
                                                         self.proposer_name)
        self.device = torch.device(device)
        self.req_states = req_states
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.history = host_token_history(req_states)
        max_reqs, k = int(req_states.max_num_reqs), self.num_speculative_tokens
        # The host mirror of req_states.total_len (device only): prefill_len at add_request, + num_sampled a step.
        self.total_len = np.zeros(max_reqs, dtype=np.int64)
        # Per slot: vLLM's own warm-up request (never drafted for, never tracked), decided once at add_request.
        self.warmup = np.zeros(max_reqs, dtype=bool)
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed

        self._sync_allowed = gpu_sync_allowed
        pinned = self.device.type != "cpu" and torch.cuda.is_available()
        self._host_device = self.device.type == "cpu"  # vLLM's CPU platform: every tensor is host memory
        self._host_out = torch.zeros((max_reqs, k), dtype=torch.int64, pin_memory=pinned)
        self._out = self._host_out if self.device.type == "cpu" else torch.zeros((max_reqs, k), dtype=torch.int64,
                                                                                   device=self.device)
        # Adaptive verification (GPU, full CUDA graphs): per-position conditional acceptance estimates, batch order.
        self.enable_adaptive_verification = bool(getattr(spec, "enable_adaptive_verification", False))
        if self.enable_adaptive_verification:
            self._host_conf = torch.zeros((max_reqs, k), dtype=torch.float32, pin_memory=pinned)
            self.draft_token_confidence_probs = (
                self._host_conf if self.device.type == "cpu"
                else torch.zeros((max_reqs, k), dtype=torch.float32, device=self.device))
        if self.settings.policy != "fixed" and not self.enable_adaptive_verification:
            # Every one of the K slots is verified here, draft or filler: a cut saves no verification and only
            # replaces drafted tokens by filler. The policy's cuts reach vLLM only as confidences.
            logger.warning("spec-plugins: policy %r not applied: on Model Runner V2 its cuts take effect only through "
                           "adaptive verification (speculative_config.enable_adaptive_verification: true); every "
                           "slot is verified without it", self.settings.policy)
            self.settings = self.settings.model_copy(update={"policy": "fixed", "policy_options": {}})
        self._all_rows = RowRange()  # 0, 1, 2, ...: the rows of a step where every row drafts
        self._trace = StepTrace.from_env()
        # host_drafting: stream -- the step's host part in the stream's order (stream_order.py); the runner's
        # calls that change drafting state wait in _ops for the next step's job; a job's failure in _failure.
        self.stream_order = self._stream_order(self.settings.host_drafting)
        self._host_counts = torch.zeros((2, max_reqs), dtype=torch.int32, pin_memory=pinned)  # sampled, rejected
        self._ops: list[Callable[[], Any]] = []
        self._failure: BaseException | None = None
        self.drafting = self._new_drafting()
        s = self.settings
        logger.info("spec-plugins: %s on Model Runner V2: proposer %r %s, policy %r %s, K = %d, adaptive "
                    "verification %s", spec.custom_method or self.proposer_name, s.proposer,
                    s.proposer_options or "(defaults)", s.policy, s.policy_options or "(defaults)", k,
                    "on (our confidences)" if self.enable_adaptive_verification else "off")

    def _new_drafting(self) -> DraftingLayer:
        proposer, policy = self.settings.build(OPTIONS_FIELD)
        if isinstance(policy, BindsModel):  # `policy: adaptive`: cost the engine's model on its device
            policy.bind_model(self.vllm_config.model_config.hf_config.to_dict(),
                              source="vLLM model_config.hf_config", device=engine_device(self.vllm_config))
        # Under tensor parallelism every rank must draft (and rate) the same tokens, so nothing may depend on this
        # rank's clock: the policy then costs steps by its model alone, without the fit to measured step times.
        tp = int(getattr(getattr(self.vllm_config, "parallel_config", None), "tensor_parallel_size", 1) or 1)
        drafting = DraftingLayer(proposer, policy, who=f"proposer {self.settings.proposer!r}",
                                 stale_steps=self.stale_steps,
                                 on_finish=self._trace.finish if self._trace else None,
                                 clock=time.perf_counter if tp == 1 else None)
        drafting.engine_on_accelerator(engine_device(self.vllm_config) != "cpu")
        drafting.runner_verifies_all(True)  # Model Runner V2 verifies all K slots, padding included
        if self.stream_order is not None and isinstance(policy, ResolvesCost):
            policy.resolve_cost()  # reading the GPU's name is a CUDA call: not allowed later, in stream order
        if self._trace is not None:
            self._trace.start(drafting, self.settings.proposer, self.settings.policy, self.num_speculative_tokens)
        return drafting

    def _stream_order(self, mode: str) -> Any:
        """None: draft in place after one sync; else the stream order `host_drafting: stream` drafts in."""
        if mode != "stream":
            return None
        if self.device.type != "cuda":
            logger.warning("spec-plugins: host_drafting 'stream' needs a CUDA device (this one is %s): drafting in "
                           "place, after one sync per step", self.device.type)
            return None
        from spec_plugins.vllm.mrv2.stream_order import CudaStreamOrder

        return CudaStreamOrder(self.device)

    # ---- what the runner calls besides propose ----------------------------------------------------

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        return  # drafting runs on the host: nothing to capture

    def capture(self) -> None:
        return

    def add_request(self, req_index: int) -> None:
        self._raise_failure()
        req_id = self.req_states.index_to_req_id[req_index]
        prefill_len = int(self.req_states.prefill_len.np[req_index])
        self._run(lambda: self._start(req_index, req_id, prefill_len))

    def _start(self, req_index: int, req_id: str, prefill_len: int) -> None:
        self.drafting.finish(req_id, why="re-sent")  # a preempted request comes back in full: start it over
        self.total_len[req_index] = prefill_len
        self.warmup[req_index] = WARMUP_ID.match(req_id) is not None

    def on_requests_finished(self, finished_req_ids: Any) -> None:
        self._raise_failure()
        ids = sorted(finished_req_ids)  # one order on every rank
        self._run(lambda: [self.drafting.finish(req_id) for req_id in ids])  # into the cross-request cache

    def reset_state(self) -> None:
        """After the kernel warm-up: forget its requests, in the proposer's cross-request cache too."""
        self._raise_failure()
        fresh = self._new_drafting()  # built here, on the runner's thread; swapped in at its place in the order
        self._run(lambda: setattr(self, "drafting", fresh))

    def _run(self, op: Callable[[], Any]) -> None:
        """A call of the runner's that changes drafting state: now, or with `host_drafting: stream` at the next
        step's host job, before its drafting (the order the runner made the calls in, on every rank)."""
        if self.stream_order is None:
            op()
        else:
            self._ops.append(op)

    # ---- the step -------------------------------------------------------------------------------

    def propose(self, input_batch: Any, attn_metadata: Any, slot_mappings: Any, last_hidden_states: Any,
                aux_hidden_states: Any, num_sampled: torch.Tensor, num_rejected: Any, last_sampled: Any,
                next_prefill_tokens: Any, temperature: Any, seeds: Any, dp_sync_state: Any = None,
                dummy_run: bool = False, skip_attn_for_dummy_run: bool = False, mm_inputs: Any = None,
                is_profile: bool = False, num_speculative_tokens: int | None = None) -> torch.Tensor:
        self._raise_failure()
        n = int(input_batch.num_reqs)
        if dummy_run or is_profile:  # profile and DP-sync runs: the result is discarded
            return self._out[:n]
        k = self.num_speculative_tokens if num_speculative_tokens is None else min(self.num_speculative_tokens,
                                                                                   int(num_speculative_tokens))
        slots = np.array(input_batch.idx_mapping_np[:n], dtype=np.int64)
        ids = list(input_batch.req_ids[:n])
        rated = self.enable_adaptive_verification  # vLLM may verify fewer slots than drafted: count them
        order = self.stream_order
        if order is None and self._host_device:  # host memory, written by the step's (synchronous) ops: read it
            self._draft(n, k, slots, ids, num_sampled.numpy(), num_rejected.numpy() if rated else None)
        elif order is None:
            with self._sync_allowed():  # the step's one sync: after it, this step's tokens are in the host history
                if rated:
                    both = torch.stack((num_sampled[:n], num_rejected[:n].to(num_sampled.dtype))).to("cpu").numpy()
                    sampled, rejected = both[0].astype(np.int64), both[1].astype(np.int64)
                else:
                    sampled, rejected = num_sampled[:n].to("cpu").numpy().astype(np.int64), None
            self._draft(n, k, slots, ids, sampled, rejected)
        else:  # everything below runs in stream order, after this step's sampling; the runner goes on meanwhile
            order.copy(self._host_counts[0, :n], num_sampled[:n])
            if rated:
                order.copy(self._host_counts[1, :n], num_rejected[:n])
            ops, self._ops = self._ops, []
            order.launch(lambda: self._stream_job(ops, n, k, slots, ids, rated))
        if self.enable_adaptive_verification and self.draft_token_confidence_probs is not self._host_conf:
            self._copy(self.draft_token_confidence_probs[:n], self._host_conf[:n])
        if self._out is self._host_out:
            return self._out[:n]
        self._copy(self._out[:n], self._host_out[:n])
        return self._out[:n]

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.stream_order is None:
            dst.copy_(src, non_blocking=True)  # the next step's sync finds it done before the buffer is reused
        else:
            self.stream_order.copy(dst, src)

    def _stream_job(self, ops: list, n: int, k: int, slots: np.ndarray, ids: list, rated: bool) -> None:
        """One step's host part in stream order: the runner's calls since the last step, then the drafting. It
        must not raise (the driver's thread would swallow it): a failure leaves filler and is raised at the
        speculator's next call."""
        try:
            for op in ops:
                op()
            counts = self._host_counts.numpy()
            self._draft(n, k, slots, ids, counts[0, :n].astype(np.int64), counts[1, :n].astype(np.int64) if rated
                        else None)
        except BaseException as exc:  # noqa: BLE001  reported at the next call, on the runner's thread
            self._host_out.numpy()[:n] = 0  # a valid token id; verification rejects what it must
            if self.enable_adaptive_verification:
                self._host_conf.numpy()[:n] = 0.0
            self._failure = self._failure or exc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            exc, self._failure = self._failure, None
            raise RuntimeError(f"spec-plugins: drafting in stream order failed: {type(exc).__name__}: {exc}") from exc

    def _draft(self, n: int, k: int, slots: np.ndarray, ids: list, sampled: np.ndarray,
               rejected: np.ndarray | None) -> None:
        """The step's host work, once this step's tokens are in the host history (`sampled`, `rejected`: the
        runner's counts of batch rows 0..n, int32 or int64): the drafts into `_host_out[:n]` (and the confidences
        into `_host_conf[:n]`), filler where there is none."""
        start = time.perf_counter() if self._trace is not None else 0.0
        out = self._host_out.numpy()
        conf = self._host_conf.numpy() if self.enable_adaptive_verification else None
        # the host mirror of the lengths, the filler (the last token, as vLLM's own speculators) and the drafting
        # layer's columns, in one compiled call; rows None: every row decodes (the usual step)
        rows, history_rows, lens, new, accepted, caps, verified, present_rows = _rows.runner_v2_rows(
            slots, sampled, rejected, self.total_len, self.history, self.warmup, out, conf, self.max_model_len, k)
        if rows is None:
            live_ids, present = ids, ()
        else:
            live_ids = [ids[i] for i in rows.tolist()]
            present = [ids[i] for i in present_rows.tolist()]  # prefill chunks in progress
        # rated: a policy that rates drafts (core.RatesDrafts) hands its calibrated estimates, for vLLM's trim
        drafts = self.drafting.step(live_ids, self.history, lens, rows=history_rows, num_new=new, accepted=accepted,
                                    max_draft=caps, present=present, verified=verified, rated=conf is not None)
        _rows.write_padded(out, rows, drafts.tokens, drafts.offsets, drafts.confidence, conf)
        # batch rows that drafted, and how many tokens each (not filler)
        self.last_drafted = (self._all_rows(n) if rows is None else rows, drafts.lengths)
        if self._trace is not None:
            self._trace.step(live_ids, start, drafts.lengths, accepted)


class SuffixTreeSpeculator(SpecPluginsSpeculator):
    """Suffix-tree proposer (`proposers/suffix_tree`): per-request and cross-request trees, method
    `spec_plugins_suffix_tree`."""

    proposer_name = "suffix_tree"


class NgramSpeculator(SpecPluginsSpeculator):
    """Prompt-lookup n-gram proposer (`proposers/ngram`), method `spec_plugins_ngram`."""

    proposer_name = "ngram"
