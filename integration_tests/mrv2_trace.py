"""A recorded runner trace for our vLLM 0.34 speculator, driven with vLLM 0.34's own `RequestState` and
`InputBatch` on CPU tensors (runs in `.venv-vllm034`, from `vllm_contract_probe.py mrv2`).

The driver does what Model Runner V2 does around `propose` (`v1/worker/gpu/model_runner.py`), in its order:
finished requests to `on_requests_finished`, then their slots freed; preempted slots freed with no call; new and
re-sent requests through `RequestState.add_request`, then `add_request(slot)`; after the forward, the sampled
tokens written into the token history and `propose` called with `num_sampled` (0 for a prefill chunk in progress,
accepted drafts + 1 otherwise). What vLLM does there with Triton kernels (`apply_staged_writes`, `post_update`) is
done here with numpy writes into the same host view of `all_token_ids`, the memory those kernels write.

Verification is greedy against a known continuation (each request's `truth`), over all K slots, as MRV2 verifies;
under adaptive verification over the slots a stand-in for vLLM's budget admits (each draft's prefix whose survival,
the running product of the speculator's confidences, stays at or above `ADMIT`), with `num_rejected` as vLLM's
`get_num_sampled_and_rejected` gives it (verified slots + 1 - sampled).
The same steps are handed to the V1 `custom_class` proposer (`spec_plugins.vllm.SuffixTree`): its rows, its
`sampled_token_ids` and its finishes, so both see the same contexts and their drafts can be compared (the suffix
tree's with `fill` on: on MRV2 its `auto` fills every slot, on V1 it does not).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from spec_plugins.bench.vllm034_suffix import cpu_buffers

K = 8
ADMIT = 0.25  # under adaptive verification: the least survival of an admitted slot
MAX_REQS = 8
MAX_LEN = 1024


def workload(seed: int = 0, n: int = 14, vocab: int = 300) -> list[dict]:
    """Requests whose continuations repeat their own prompts and earlier answers (what suffix decoding drafts from),
    with edits so drafts are also rejected."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(5, vocab, 60)
    out = []
    for i in range(n):
        prompt = np.concatenate([rng.integers(5, vocab, 20 + 7 * (i % 5)), shared[: 20 + i]])
        pieces = []
        for _ in range(6):
            a = int(rng.integers(0, len(prompt) - 12))
            piece = prompt[a: a + int(rng.integers(6, 12))].copy()
            if rng.random() < 0.5:
                piece[int(rng.integers(0, len(piece)))] = int(rng.integers(5, vocab))
            pieces.append(piece)
            pieces.append(rng.integers(5, vocab, int(rng.integers(1, 4))))
        if i >= 3:  # a repeat of an earlier answer: the cross-request cache's case
            pieces.append(out[i - 3]["truth"][:15])
        out.append({"id": f"req-{i}", "prompt": prompt.astype(np.int64), "truth": np.concatenate(pieces).astype(np.int64)})
    return out


@dataclass
class Live:
    req: dict
    slot: int
    prefill: np.ndarray  # tokens handed in at add_request (prompt, or prompt + output after preemption)
    done_prefill: int = 0
    out_len: int = 0  # response tokens committed
    draft: np.ndarray | None = None  # the last [K] row proposed
    admitted: int = K  # slots of it that will be verified
    steps: int = 0


@dataclass
class Record:
    steps: int = 0
    drafted_rows: int = 0  # rows with at least one drafted (not filler) token
    compared_rows: int = 0
    mismatches: list = field(default_factory=list)
    padding_mismatches: list = field(default_factory=list)
    accepted: int = 0
    warmup: dict = field(default_factory=dict)  # what the warm-up left behind
    resent: list = field(default_factory=list)  # re-sent requests: (id, tokens handed in again)
    drafts: list = field(default_factory=list)  # every step's [n, K] matrix, as lists
    confidences: list = field(default_factory=list)  # under adaptive verification: every step's [n, K] confidences
    confidence_problems: list = field(default_factory=list)  # a confidence outside [0, 1], or above 0 on filler
    trimmed_rows: int = 0  # under adaptive verification: rows verified over fewer than their drafted tokens


def run(vllm_config: Any, *, v1: bool = True, chunk: int = 40, preempt: tuple[str, int] = ("req-2", 6),
        seed: int = 0, device_copy: bool = False, stream_jitter: int | None = None) -> Record:
    """One pass of the trace. device_copy: the speculator's output and confidences go through buffers of their own,
    as on a GPU (there a device tensor filled by a copy from the pinned host buffer; here a second CPU tensor).
    stream_jitter: draft in stream order (`host_drafting: stream`), the stream played by `QueuedStreamOrder` with
    random delays of up to 2 ms before each entry (this seed); the trace's own writes into the token history go
    through the same order, as vLLM's kernels do, and it reads results only after the stream has caught up."""
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.spec_decode import init_speculator
    from vllm.v1.worker.gpu.states import RequestState

    cpu_buffers()
    device = torch.device("cpu")
    req_states = RequestState(max_num_reqs=MAX_REQS, max_model_len=MAX_LEN, max_num_batched_tokens=2048,
                              num_speculative_steps=K, vocab_size=512, device=device)
    spec = init_speculator(vllm_config, device, req_states)
    if device_copy:
        spec._out = torch.zeros_like(spec._host_out)
        if spec.enable_adaptive_verification:
            spec.draft_token_confidence_probs = torch.zeros_like(spec._host_conf)
    history = spec.history
    order = None
    if stream_jitter is not None:
        from spec_plugins.vllm.mrv2.stream_order import QueuedStreamOrder

        jitter = np.random.default_rng(stream_jitter)
        order = spec.stream_order = QueuedStreamOrder(delay=lambda i: time.sleep(float(jitter.uniform(0, 0.002))))

    def on_device(write: Any) -> None:  # a write of vLLM's kernels: in the stream's order where there is one
        if order is None:
            write()
        else:
            order.launch(write)

    buffers = InputBuffers(max_num_reqs=MAX_REQS, max_num_tokens=2048, device=device)
    old = None
    if v1:
        from spec_plugins.vllm import Ngram, SuffixTree

        v1_class = SuffixTree if spec.proposer_name == "suffix_tree" else Ngram
        section = dict(vllm_config.speculative_config.speculator_options or {})
        if spec.proposer_name == "suffix_tree":  # `fill: auto` fills on MRV2 (every slot verified), not on V1
            section["proposer_options"] = {"fill": True, **dict(section.get("proposer_options") or {})}
        old = v1_class(SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=K, num_speculative_tokens_per_batch_size=None),
            model_config=vllm_config.model_config, device_config=vllm_config.device_config,
            additional_config={"spec_plugins": section}))
    rec = Record()
    reqs = workload(seed)
    waiting = list(reqs)
    live: dict[str, Live] = {}
    finished: set[str] = set()
    preempted_once = False

    def add(req: dict, prefill: np.ndarray, out_len: int) -> None:
        req_states.add_request(req["id"], len(req["prompt"]), prefill.tolist(), 0, 4096)
        slot = req_states.req_id_to_index[req["id"]]
        on_device(lambda: history.__setitem__((slot, slice(0, len(prefill))), prefill))  # apply_staged_writes
        spec.add_request(slot)
        live[req["id"]] = Live(req, slot, prefill, out_len=out_len)

    # Kernel warm-up (`_warmup_kernels`): fake requests, a decode step, their finish, then reset_state.
    warm = {"id": "_warmup_0_", "prompt": np.arange(5, 45, dtype=np.int64), "truth": np.arange(45, 60)}
    add(warm, warm["prompt"], 0)
    _result(spec, _propose(spec, buffers, InputBatch, [live["_warmup_0_"]], [1], [0]))
    rec.warmup["tracked_during_warmup"] = spec.drafting.num_tracked
    spec.on_requests_finished({"_warmup_0_"})
    req_states.remove_request("_warmup_0_")
    del live["_warmup_0_"]
    spec.reset_state()
    rec.warmup["context_warmup_tracked"] = 0

    def settle(pending: tuple | None) -> None:
        """The last step's drafts (and confidences) as the GPU reads them, and what the record counts of them."""
        if pending is None:
            return
        step, batch, sampled, contexts, drafts_out, v1_drafts, keep = pending
        drafts = _result(spec, drafts_out)
        if spec.enable_adaptive_verification:
            conf = spec.draft_token_confidence_probs[: len(batch)].numpy().copy()
            rec.confidences.append(conf.round(6).tolist())
            lengths = np.zeros(len(batch), dtype=np.int64)
            drafted_rows, drafted = spec.last_drafted
            lengths[drafted_rows] = drafted
            for lv, c, d in zip(batch, conf, lengths):
                lv.admitted = int((np.cumprod(c) >= ADMIT).sum())
                rec.trimmed_rows += int(lv.admitted < d)
                if (c[d:] != 0).any() or (c[:d] <= 0).any() or (c[:d] > 1).any():
                    rec.confidence_problems.append({"step": step, "req": lv.req["id"], "conf": c.tolist(),
                                                    "drafted": int(d)})
        rec.warmup["context_warmup_tracked"] += spec.drafting.is_tracked("_context_warmup_0_")
        rec.steps += 1
        rec.drafts.append(drafts.tolist())
        rec.accepted += sum(max(0, s - 1) for s in sampled)
        for j, i in enumerate(keep):
            d = v1_drafts[j]
            row = drafts[i]
            rec.compared_rows += 1
            if list(row[: len(d)]) != list(d):
                rec.mismatches.append({"step": step, "req": batch[i].req["id"], "v1": list(d), "mrv2": row.tolist()})
            filler = contexts[i][-1]
            if any(int(t) != int(filler) for t in row[len(d):]):
                rec.padding_mismatches.append({"step": step, "req": batch[i].req["id"], "v1": list(d),
                                               "mrv2": row.tolist()})
        for lv, ns, row, context in zip(batch, sampled, drafts, contexts):
            lv.draft = row.copy()
            if ns and np.any(row != context[-1]):
                rec.drafted_rows += 1

    pending = None
    step = 0
    while waiting or live:
        step += 1
        # 1. finishes of the last step, before their slots are freed
        if finished:
            spec.on_requests_finished(set(finished))
            for rid in sorted(finished):
                req_states.remove_request(rid)
                if old is not None:
                    old.finish(rid)
            finished.clear()
        # 2. a preemption: the slot is freed with no callback; the request waits to be re-sent in full
        if not preempted_once and preempt[0] in live and live[preempt[0]].steps >= preempt[1]:
            preempted_once = True
            lv = live.pop(preempt[0])
            req_states.remove_request(preempt[0])
            if old is not None:
                old.finish(preempt[0], why="preempted")
            waiting.insert(0, dict(lv.req, resume=lv.out_len))
        # 3. new and re-sent requests, as slots allow; after the reset, a context warm-up request is ignored
        if step == 3:
            ctx = {"id": "_context_warmup_0_", "prompt": np.arange(7, 30, dtype=np.int64),
                   "truth": np.arange(30, 34, dtype=np.int64)}
            waiting.insert(0, ctx)
        while waiting and len(live) < MAX_REQS - 1:
            req = waiting.pop(0)
            out_len = req.get("resume", 0)
            if out_len:
                rec.resent.append([req["id"], len(req["prompt"]) + out_len])
            add(req, np.concatenate([req["prompt"], req["truth"][:out_len]]), out_len)
        # 4. the forward: prefill chunks, then verification of the last drafts over all K slots
        settle(pending)
        pending = None
        batch, sampled, rejected = [], [], []
        for lv in live.values():
            batch.append(lv)
            left = len(lv.prefill) - lv.done_prefill
            if left > 0:
                take = min(left, chunk)
                lv.done_prefill += take
                if take < left:
                    sampled.append(0)  # a prefill chunk in progress
                    rejected.append(0)
                    continue
                sampled.append(1)
                rejected.append(0)
            else:
                truth = lv.req["truth"][lv.out_len:]
                n = lv.admitted
                match = lv.draft[:n] == truth[:n] if len(truth) >= n else np.r_[lv.draft[: len(truth)] == truth, False]
                acc = int(np.argmin(match)) if not match.all() else n
                sampled.append(min(acc + 1, len(truth)))
                rejected.append(max(n + 1 - sampled[-1], 0))
        # 5. the sampled tokens into the history (post_update), then propose
        contexts = []
        for lv, ns in zip(batch, sampled):
            base = len(lv.req["prompt"]) + lv.out_len
            tokens = lv.req["truth"][lv.out_len: lv.out_len + ns]
            on_device(lambda s=lv.slot, b=base, t=tokens: history.__setitem__((s, slice(b, b + len(t))), t))
            lv.out_len += ns
            contexts.append(np.concatenate([lv.req["prompt"], lv.req["truth"][: lv.out_len]]))
        drafts_out = _propose(spec, buffers, InputBatch, batch, sampled, rejected)
        v1_drafts, keep = None, []
        if old is not None:  # the V1 proposer on the same step, now: before the runner's next calls reach it
            ids = [lv.req["id"] for lv in batch]
            keep = [i for i, r in enumerate(ids) if not r.startswith("_")]
            old.row_req_ids = [ids[i] for i in keep]
            token_ids_cpu = np.zeros((len(keep), MAX_LEN), dtype=np.int32)  # the V1 runner's rows
            lens = np.zeros(len(keep), dtype=np.int32)
            for j, i in enumerate(keep):
                token_ids_cpu[j, : len(contexts[i])] = contexts[i]
                lens[j] = len(contexts[i])
            sampled_lists = [contexts[i][len(contexts[i]) - sampled[i]:].tolist() if sampled[i] else [] for i in keep]
            v1_drafts = old.propose(sampled_lists, lens, token_ids_cpu)
        for lv in batch:
            lv.steps += 1
            if lv.out_len >= len(lv.req["truth"]) and lv.done_prefill >= len(lv.prefill):
                finished.add(lv.req["id"])
                del live[lv.req["id"]]
        # The drafts are read when the next step's verification needs them: after the runner's next calls, which
        # with `host_drafting: stream` may come while this step's drafting still runs.
        pending = (step, batch, sampled, contexts, drafts_out, v1_drafts, keep)
    settle(pending)
    spec.on_requests_finished(set(finished))  # the empty step that drains the batch
    rec.warmup["tracked_at_end"] = spec.drafting.num_tracked
    rec.warmup["stats_at_end"] = spec.drafting.stats()
    spec.reset_state()
    rec.warmup["stats_after_a_reset"] = spec.drafting.stats()
    return rec


def _propose(spec: Any, buffers: Any, input_batch_cls: Any, batch: list[Live], sampled: list[int],
             rejected: list[int]) -> torch.Tensor:
    n = len(batch)
    ib = input_batch_cls.make_dummy(n, max(n, 1), buffers)
    slots = np.array([lv.slot for lv in batch], dtype=np.intp)
    ib = dataclasses.replace(ib, req_ids=[lv.req["id"] for lv in batch], idx_mapping_np=slots,
                             idx_mapping=torch.from_numpy(slots.astype(np.int64)))
    out = spec.propose(ib, {}, {}, None, None, torch.tensor(sampled, dtype=torch.int32),
                       torch.tensor(rejected, dtype=torch.int32), None, None, None, None, num_speculative_tokens=K)
    assert out.dtype == torch.int64 and tuple(out.shape) == (n, K), (out.dtype, out.shape)
    return out


def _result(spec: Any, out: torch.Tensor) -> np.ndarray:
    """`propose`'s result as the device reads it: after the stream has caught up, where there is one."""
    if spec.stream_order is not None:
        spec.stream_order.synchronize()
    return out.numpy().copy()
