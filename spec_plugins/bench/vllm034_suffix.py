"""vLLM 0.34's own GPU `suffix` and `ngram` speculators as replay proposers (`vllm034_suffix`, `vllm034_ngram`): their
Triton kernels, run by Triton's interpreter on CPU tensors, so the replay counts exactly what vLLM 0.34 would draft
(only slower: about 0.1 s a step). The benchmarks use the project's numpy replays of both (`vllm034_suffix_np.py`),
which the contract tests check against these step by step.

    CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 .venv-vllm034/bin/python -m spec_plugins.bench.replay \
        --proposers suffix_tree,vllm034_suffix --accounting mrv2 --max-draft 8 \
        --tokenizer "$(.venv/bin/spec-plugins models smollm2)" --workload ...

Driven as Model Runner V2 drives it, one request slot each in vLLM's own `RequestState` (the token history dense, as
vLLM's suffix config asks): a request's first call adds it with its context less the last token as the prefill (the
last token is the first one sampled), later calls append the new tokens as `post_update` does (history, `total_len`,
`last_sampled_tokens`) and call `propose` with `num_sampled`; `finish` ingests the response into vLLM's corpus
(`on_requests_finished`) and frees the slot. The draft returned is vLLM's valid tokens (`suffix`: its `num_valid`;
`ngram`: read off its scan kernel's scores): with `--accounting mrv2` the replay pads it with the last token, which
is vLLM's own filler.

Needs vLLM 0.34.0 and Triton importable (`.venv-vllm034`), `TRITON_INTERPRET=1` set before Triton is imported, and
`CUDA_VISIBLE_DEVICES` set and empty (vLLM keeps Triton on without a GPU driver only then); Triton 3.9's interpreter
needs the mend in `triton_mend.py`.
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace
from typing import Any, Hashable, Sequence

import numpy as np
import pydantic

from spec_plugins.bench.vllm034_suffix_np import Vllm034NgramReplay, Vllm034SuffixReplay
from spec_plugins.core import Draft, DraftRequest


def cpu_buffers() -> None:
    """vLLM 0.34's own CPU stand-in for pinned UVA buffers (`v1/worker/cpu/shm.py` installs the same one)."""
    import vllm.v1.worker.cpu.buffer_utils as cpu_buffer_utils
    import vllm.v1.worker.gpu.buffer_utils as gpu_buffer_utils

    gpu_buffer_utils.UvaBuffer = cpu_buffer_utils.UvaBuffer


class Vllm034Kernels:
    """One of vLLM 0.34's GPU speculators driven through its kernels, interpreted (subclasses say which)."""

    name = ""

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("CUDA_VISIBLE_DEVICES", None) != "":
            raise ValueError(f"proposer {self.name}: runs vLLM 0.34's Triton kernels in Triton's interpreter: set "
                             "TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES= (empty), and run in .venv-vllm034")
        self.spec = None  # built at the first call, when K is known
        self.slot: dict[Hashable, int] = {}
        self.seen: dict[Hashable, int] = {}
        self.verified: dict[Hashable, int] = {}  # slots the target verified of the request's last draft

    def _build(self, k: int) -> None:
        import torch
        import vllm.v1.worker.cpu.shm  # noqa: F401  vLLM's CPU worker imports it first: CPU stand-ins for CUDA calls
        from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
        from vllm.v1.worker.gpu.states import RequestState

        from spec_plugins.bench import triton_mend

        triton_mend.mend()
        cpu_buffers()
        o, cpu = self.options, torch.device("cpu")
        self.k = k
        self.req_states = RequestState(max_num_reqs=o.max_requests, max_model_len=o.max_model_len,
                                       max_num_batched_tokens=o.max_model_len, num_speculative_steps=k,
                                       vocab_size=1 << 20, device=cpu, use_dense_all_token_ids=True)
        cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, **self._spec_fields()),
                              scheduler_config=SimpleNamespace(max_num_seqs=o.max_requests),
                              model_config=SimpleNamespace(max_model_len=o.max_model_len))
        self.spec = self._speculator_class()(cfg, cpu, self.req_states)
        self._batch = InputBatch.make_dummy(1, 1, InputBuffers(max_num_reqs=o.max_requests, max_num_tokens=16,
                                                               device=cpu))
        self._input_batch = InputBatch

    def _append(self, slot: int, tokens: np.ndarray) -> None:
        """What `post_update` does with a step's sampled tokens."""
        rs, n = self.req_states, len(tokens)
        total = int(rs.total_len.gpu[slot])
        rs.all_token_ids.gpu[slot, total: total + n] = rs.all_token_ids.gpu.new_tensor(tokens)
        rs.total_len.gpu[slot] = total + n
        rs.last_sampled_tokens[slot, 0] = int(tokens[-1])

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        import torch

        if self.spec is None:
            self._build(requests[0].max_draft)
        rs = self.req_states
        slots, sampled, rejected = [], [], []
        for r in requests:
            if r.max_draft != self.k:
                raise ValueError(f"proposer {self.name}: one K per replay (built for {self.k}, got {r.max_draft})")
            tokens = np.asarray(r.tokens, dtype=np.int64)
            if len(tokens) >= self.options.max_model_len:
                raise ValueError(f"proposer_options[{self.name}].max_model_len: a context of {len(tokens)} tokens "
                                 f"does not fit {self.options.max_model_len}")
            if r.req_id not in self.slot:  # the prefill; its last token is the first one sampled
                rs.add_request(str(r.req_id), len(tokens) - 1, tokens[:-1].tolist(), 0, self.options.max_model_len)
                rs.apply_staged_writes()
                slot = rs.req_id_to_index[str(r.req_id)]
                self.spec.add_request(slot)
                self.slot[r.req_id], self.seen[r.req_id] = slot, len(tokens) - 1
            slot = self.slot[r.req_id]
            new = tokens[self.seen[r.req_id]:]
            self._append(slot, new)
            self.seen[r.req_id] = len(tokens)
            slots.append(slot)
            sampled.append(len(new))
            rejected.append(max(self.verified.get(r.req_id, 0) - (len(new) - 1), 0))
        n = len(requests)
        idx = np.asarray(slots, dtype=np.int64)
        self._slots = slots
        batch = dataclasses.replace(self._batch, req_ids=[str(r.req_id) for r in requests], num_reqs=n,
                                    idx_mapping_np=idx, idx_mapping=torch.from_numpy(idx))
        out = self.spec.propose(batch, {}, {}, None, None, torch.tensor(sampled, dtype=torch.int32),
                                torch.tensor(rejected, dtype=torch.int32), rs.last_sampled_tokens, rs.next_prefill_tokens,
                                None, None, num_speculative_tokens=self.k)
        valid = self._valid(n)
        conf = self.spec.draft_token_confidence_probs[:n].tolist() if self._confidences() else None
        for r, v in zip(requests, valid):
            self.verified[r.req_id] = self.k if getattr(self.options, "verified", "all") == "all" else v
        return [Draft(out[i, : valid[i]].tolist(), confidence=conf[i][: valid[i]] if conf else None)
                for i in range(n)]

    def finish(self, req_id: Hashable) -> None:
        slot = self.slot.pop(req_id, None)
        if slot is None:
            return
        self.seen.pop(req_id)
        self.verified.pop(req_id, None)
        if hasattr(self.spec, "on_requests_finished"):
            self.spec.on_requests_finished({str(req_id)})
        self.req_states.remove_request(str(req_id))


class KernelOptions(pydantic.BaseModel):
    """The room vLLM's `RequestState` is built with."""

    max_model_len: int = pydantic.Field(default=16384, ge=16, description="longest context replayed")
    max_requests: int = pydantic.Field(default=64, ge=1, description="requests in flight at once")


class Vllm034Suffix(Vllm034Kernels):
    """vLLM 0.34's `suffix` (`vllm/v1/worker/gpu/spec_decode/suffix/speculator.py`) with its defaults."""

    name = "vllm034_suffix"

    class Options(Vllm034SuffixReplay.Options, KernelOptions):
        pass

    def _speculator_class(self) -> type:
        from vllm.v1.worker.gpu.spec_decode.suffix.speculator import SuffixSpeculator

        return SuffixSpeculator

    def _spec_fields(self) -> dict:
        o = self.options
        return {"suffix_decoding_max_tree_depth": o.max_tree_depth, "suffix_decoding_corpus_tokens": o.corpus_tokens,
                "suffix_decoding_max_cached_requests": o.max_cached_requests,
                "enable_adaptive_verification": o.adaptive_verification}

    def _valid(self, n: int) -> list[int]:
        return self.spec.num_valid[:n].tolist()

    def _confidences(self) -> bool:
        return self.options.adaptive_verification


class Vllm034Ngram(Vllm034Kernels):
    """vLLM 0.34's GPU `ngram` (`vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`) with its defaults (n = 5)."""

    name = "vllm034_ngram"

    class Options(Vllm034NgramReplay.Options, KernelOptions):
        pass

    def _speculator_class(self) -> type:
        from vllm.v1.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator

        return NgramGPUSpeculator

    def _spec_fields(self) -> dict:
        return {"prompt_lookup_min": self.options.min_n, "prompt_lookup_max": self.options.max_n}

    def _valid(self, n: int) -> list[int]:
        """Drafted tokens per row, read off the scan kernel's own scores (the finalize kernel pads the rest)."""
        rs, spec = self.req_states, self.spec
        lp1 = spec.max_model_len + 1
        out = []
        for b in range(n):
            score = int(spec.scratch[b, : spec.n_blocks].max())
            if score <= 0:
                out.append(0)
                continue
            best_n, pos = divmod(score - 1, lp1)
            slot = self._slots[b]
            out.append(max(0, min(self.k, int(rs.total_len.gpu[slot]) - (pos + best_n))))
        return out

    def _confidences(self) -> bool:
        return False
