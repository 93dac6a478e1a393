"""Load a DFlash checkpoint (a folder with config.json + model.safetensors) into DFlashDraftModel.

Two layouts, told apart by config.json: a `speculators_model_type` field means the `speculators` format
(what `DFlashDraftModel.save_pretrained` / `DFlashConverter` in vllm-project/speculators write), anything
else is read as z-lab's. Both use the same tensor names (below).

z-lab tensor names (optionally prefixed `model.`) map onto ours:

    fc.weight, hidden_norm.weight, norm.weight                     -> same names
    layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}              -> layers.{i}.attention.{wq,wk,wv,wo}.*
    layers.{i}.self_attn.{q,k}_norm.weight                         -> layers.{i}.attention.{q,k}_norm.weight
    layers.{i}.input_layernorm / post_attention_layernorm.weight   -> layers.{i}.attention_norm / ffn_norm.weight
    layers.{i}.mlp.{gate,up,down}_proj.weight                      -> layers.{i}.feed_forward.{w1,w3,w2}.weight

There is no embedding or LM head: both are the target's. Taps: id k is the output of target decoder layer k,
which is HF `output_hidden_states[k + 1]` (see model.select_taps) and vLLM aux-hidden-state layer k + 1.

speculators format: the Qwen3-style dimensions sit in `transformer_layer_config` (a transformers config
dict, possibly diffed against its class defaults, so it is re-expanded with transformers); the DFlash fields
sit at the top level: `block_size` (default 8, as in speculators), `mask_token_id`, `draft_vocab_size`,
`aux_hidden_state_layer_ids`, `sliding_window_non_causal`, `sample_from_anchor`, `target_hidden_size`, and
`speculators_config.algorithm`. Differences from z-lab:

- `aux_hidden_state_layer_ids` are vLLM aux ids = HF hidden_states indices = our tap ids + 1 (valid 1..L).
- Causality per layer: full-attention layers are bidirectional; sliding layers (those with a window) are
  causal unless `sliding_window_non_causal`. `is_causal` / `dflash_config.causal` mean nothing there.
- Sliding windows: speculators trains with an anchor-relative window (block rows see the context positions
  [anchor - window, anchor) and their whole block); ours (like a standard SWA kernel) is per query row,
  q_pos - k_pos < window. They agree only while window >= context + block length; shorter windows diverge.
- No input-embedding scale, output multiplier or logit soft-capping (speculators' draft applies none).
- Extra tensors it may carry from the verifier (`embed_tokens`, `lm_head`, `verifier_norm`, `verifier_lm_head`)
  are ignored: the draft uses the target's. A reduced draft vocabulary (`t2d`/`d2t`) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from spec_plugins.proposers.dflash.config import SLIDING_ATTENTION, DFlashConfig
from spec_plugins.proposers.dflash.model import DFlashDraftModel

_LAYER_RENAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "self_attn.q_norm": "attention.q_norm",
    "self_attn.k_norm": "attention.k_norm",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
}
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)")
# Present in some exports (e.g. a copy of the target's), never used: the draft shares the target's.
_SHARED = ("embed_tokens.weight", "lm_head.weight")
# speculators checkpoints may also carry the verifier's final norm / head (filled from the verifier on save).
_SPECULATORS_SHARED = _SHARED + ("verifier_norm.weight", "verifier_lm_head.weight")
_SPECULATORS_FOREIGN = {"dspark": "DSpark", "dflash2": "DFlash 2", "eagle3": "EAGLE-3", "eagle": "EAGLE"}
# Tensors that only DSpark (Markov / confidence heads) or DFlash 2 (convolutions, candidate selector) have.
_FOREIGN = (("markov", "DSpark"), ("confidence", "DSpark"), ("attention_conv", "DFlash 2"),
            ("mlp_conv", "DFlash 2"), ("candidate_selector", "DFlash 2"))


def zlab_to_ours(name: str) -> str | None:
    """Our parameter name for a z-lab tensor name, or None for one we do not know."""
    if name.startswith("model."):
        name = name[len("model."):]
    if name in ("fc.weight", "hidden_norm.weight", "norm.weight"):
        return name
    m = _LAYER_NAME.fullmatch(name)
    if m and m.group(2) in _LAYER_RENAMES:
        return f"layers.{m.group(1)}.{_LAYER_RENAMES[m.group(2)]}.{m.group(3)}"
    return None


def read_config_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"DFlash config: no config.json at {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"DFlash config: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None


def is_speculators_config(raw: Any) -> bool:
    return isinstance(raw, Mapping) and "speculators_model_type" in raw


def _expand_transformer_config(tl: Mapping[str, Any]) -> dict[str, Any]:
    """transformer_layer_config as speculators sees it: instantiated with its transformers config class (Qwen3
    without `model_type`), so fields a diffed dict leaves out take that class's defaults."""
    from transformers import AutoConfig, Qwen3Config

    try:
        cls = AutoConfig.for_model(tl["model_type"]).__class__ if tl.get("model_type") else Qwen3Config
        return cls(**tl).to_dict()
    except Exception as e:  # noqa: BLE001 - any transformers complaint becomes one line naming the field
        msg = " ".join(str(e).split())
        raise ValueError(f"DFlash config field 'transformer_layer_config': transformers rejects it ({type(e).__name__}: {msg[:200]})") from None


def speculators_config(raw: Mapping[str, Any], *, num_target_layers: int | None = None) -> DFlashConfig:
    """DFlashConfig from a speculators-format config.json (see the module docstring for the mapping)."""
    kind = raw.get("speculators_model_type")
    if kind != "dflash":
        if kind in _SPECULATORS_FOREIGN:
            raise ValueError(f"DFlash config field 'speculators_model_type': {kind!r} marks a {_SPECULATORS_FOREIGN[kind]} checkpoint, not DFlash")
        raise ValueError(f"DFlash config field 'speculators_model_type': expected 'dflash', got {kind!r}")

    def need(name: str) -> Any:
        if raw.get(name) is None:
            raise ValueError(f"DFlash config: missing field '{name}' (speculators format)")
        return raw[name]

    spec = need("speculators_config")
    if not isinstance(spec, Mapping):
        raise ValueError("DFlash config field 'speculators_config': expected an object")
    if spec.get("algorithm") != "dflash":
        raise ValueError(f"DFlash config field 'speculators_config.algorithm': expected 'dflash', got {spec.get('algorithm')!r}")
    if raw.get("sample_from_anchor", False):
        raise ValueError(
            "DFlash config field 'sample_from_anchor': true means the anchor predicts the next token "
            "(DSpark-style labels); DFlash mask rows predict their own position"
        )
    tl = need("transformer_layer_config")
    if not isinstance(tl, Mapping):
        raise ValueError("DFlash config field 'transformer_layer_config': expected an object")
    for name in ("dflash_config", "speculators_model_type"):
        if name in tl:
            raise ValueError(f"DFlash config field 'transformer_layer_config': unexpected field '{name}' inside it")
    full = _expand_transformer_config(tl)
    rope = full.get("rope_parameters") or {}
    if isinstance(rope, Mapping) and any(isinstance(v, Mapping) for v in rope.values()):
        raise ValueError("DFlash config field 'transformer_layer_config.rope_parameters': per-layer-type RoPE is not supported")

    vocab = full.get("vocab_size")
    draft_vocab = need("draft_vocab_size")
    if draft_vocab != vocab:
        raise ValueError(
            f"DFlash config field 'draft_vocab_size': {draft_vocab} != vocab_size {vocab} "
            "(a reduced draft vocabulary with t2d/d2t is not supported)"
        )
    target_hidden = raw.get("target_hidden_size")
    if target_hidden is not None and target_hidden != full.get("hidden_size"):
        raise ValueError(
            f"DFlash config field 'target_hidden_size': {target_hidden} != draft hidden_size {full.get('hidden_size')} "
            "(the draft shares the target's embedding and LM head)"
        )

    aux = need("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux or not all(isinstance(t, int) and not isinstance(t, bool) for t in aux):
        raise ValueError(f"DFlash config field 'aux_hidden_state_layer_ids': expected a non-empty list of ints, got {aux!r}")
    if len(set(aux)) != len(aux):
        raise ValueError(f"DFlash config field 'aux_hidden_state_layer_ids': duplicate ids in {aux}")
    for s in aux:
        # speculators / vLLM aux id s = HF hidden_states[s] = output of target decoder layer s - 1.
        if s < 1 or (num_target_layers is not None and s > num_target_layers):
            bound = f"[1, {num_target_layers}]" if num_target_layers is not None else ">= 1"
            raise ValueError(
                f"DFlash config field 'aux_hidden_state_layer_ids': id {s} out of range {bound} "
                "(speculators ids are target decoder layer + 1; 0 would be the embedding output)"
            )

    zlab_like = dict(full)
    for name in ("is_causal", "dflash_config", "num_target_layers", "input_embedding_scale", "output_multiplier",
                 "final_logit_softcapping"):
        zlab_like.pop(name, None)  # z-lab meanings that speculators' draft does not have
    zlab_like.update(
        block_size=raw.get("block_size", 8),  # speculators' own default
        mask_token_id=need("mask_token_id"),
        target_layer_ids=[s - 1 for s in aux],
    )
    config = DFlashConfig.from_dict(zlab_like, num_target_layers=num_target_layers)

    # speculators' per-layer attention: a layer slides only if layer_types says so *and* a window is set (else
    # it is a full, bidirectional layer); sliding layers are causal in the block unless sliding_window_non_causal.
    window = full.get("sliding_window")
    types = full.get("layer_types") or ["full_attention"] * config.num_hidden_layers
    non_causal = bool(raw.get("sliding_window_non_causal", False))
    sliding = [t == SLIDING_ATTENTION and window is not None for t in types]
    return dataclasses.replace(
        config,
        layer_causal=tuple(sl and not non_causal for sl in sliding),
        layer_window=tuple(window if sl else None for sl in sliding),
    )


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.exists():
        return load_file(single)
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(load_file(folder / shard))
        return tensors
    raise ValueError(f"DFlash checkpoint: no model.safetensors (or index) in {folder}")


def load_dflash(
    folder: str | os.PathLike,
    *,
    num_target_layers: int | None = None,
    target_hidden_size: int | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> DFlashDraftModel:
    """Build the draft model from a local z-lab or speculators style folder (told apart by config.json).

    num_target_layers / target_hidden_size: the target's, to check the taps and the shared hidden size
    against. dtype: cast to this (default: keep the checkpoint's).
    """
    folder = Path(folder)
    raw = read_config_json(folder / "config.json")
    speculators = is_speculators_config(raw)
    if speculators:
        config = speculators_config(raw, num_target_layers=num_target_layers)
    else:
        config = DFlashConfig.from_dict(raw, num_target_layers=num_target_layers)
    shared = _SPECULATORS_SHARED if speculators else _SHARED
    if target_hidden_size is not None and target_hidden_size != config.hidden_size:
        raise ValueError(
            f"DFlash config field 'hidden_size': {config.hidden_size} != target hidden size {target_hidden_size} "
            "(the draft shares the target's embedding and LM head)"
        )
    tensors = read_safetensors(folder)

    for name in tensors:
        for marker, kind in _FOREIGN:
            if marker in name:
                raise ValueError(f"DFlash checkpoint: tensor '{name}' marks a {kind} checkpoint, not DFlash")
        if name in ("t2d", "d2t"):
            raise ValueError(f"DFlash checkpoint: tensor '{name}' marks a reduced draft vocabulary (not supported)")

    with torch.device("meta"):
        model = DFlashDraftModel(config)
    expected = model.state_dict()  # meta tensors: names and shapes only
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        ours = zlab_to_ours(name)
        if ours is None:
            if name.removeprefix("model.") in shared:
                continue
            raise ValueError(f"DFlash checkpoint: unexpected tensor '{name}'")
        if ours not in expected:  # e.g. layers.7.* in a 5-layer config, or a bias with attention_bias off
            raise ValueError(f"DFlash checkpoint: tensor '{name}' does not fit the config (no parameter '{ours}')")
        if ours in state:
            raise ValueError(f"DFlash checkpoint: tensor '{name}' appears twice (with and without 'model.' prefix)")
        if tuple(tensor.shape) != tuple(expected[ours].shape):
            raise ValueError(
                f"DFlash checkpoint: tensor '{name}' has shape {list(tensor.shape)}, config implies {list(expected[ours].shape)}"
            )
        state[ours] = tensor
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"DFlash checkpoint: missing tensor(s) {missing[:3]}{' ...' if len(missing) > 3 else ''} (our names)")

    if dtype is None:
        dtype = next(iter(state.values())).dtype
    # assign=True swaps the meta parameters for the loaded tensors: no second copy of the weights.
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True)
    return model.eval()
