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
- Causality is read as vLLM (0.32) resolves it, not as speculators' trainer does (see
  `speculators_layer_causal`): `transformer_layer_config.is_causal`, when set, applies to every layer; else
  DFlash takes `not sliding_window_non_causal` (absent = true = bidirectional) for *every* layer, full or
  sliding, while DSpark ignores that field and makes exactly the `sliding_attention` layers causal.
  speculators 0.9.0 itself writes `sliding_window_non_causal: false` by default and keeps full-attention
  layers bidirectional regardless, so such a checkpoint runs causally in vLLM, and loads causally here.
- Sliding windows: speculators trains with an anchor-relative window (block rows see the context positions
  [anchor - window, anchor) and their whole block); ours (like a standard SWA kernel) is per query row,
  q_pos - k_pos < window. They agree only while window >= context + block length; shorter windows diverge.
- No input-embedding scale, output multiplier or logit soft-capping (speculators' draft applies none).
- Extra tensors it may carry from the verifier (`embed_tokens`, `lm_head`, `verifier_norm`, `verifier_lm_head`)
  are ignored: the draft uses the target's. A reduced draft vocabulary (`t2d`/`d2t`) is refused.

DeepSpec format (deepseek-ai/DeepSpec, `Qwen3DSparkModel`; its DFlash drafts are the same model with
`markov_rank: 0` and `enable_confidence_head: false`): a copy of the target's Qwen3 config with the draft
fields at the top level (`block_size`, `target_layer_ids`, `mask_token_id`, `num_target_layers`,
`num_anchors`, `markov_rank`, `markov_head_type`, `enable_confidence_head`, `confidence_head_with_markov`,
`layer_types`, `tie_word_embeddings: false`). Tensors are saved without prefix under the z-lab names above,
plus the draft's own frozen copies of the target's `embed_tokens.weight` [V, d] and `lm_head.weight` [V, d]
and, for DSpark, `markov_head.*` / `confidence_head.*`. Differences from z-lab:

- Every row of the block drafts (the anchor predicts the next token, gamma = block_size drafts), like DSpark:
  a DeepSpec DFlash draft runs under `DSparkDrafter` / `DSparkProposer` with no Markov head, never under
  `DFlashDrafter` (which drops row 0 and would shift every draft by one). So `load_dflash` refuses the
  layout and `load_deepspec_dflash` returns it with the embedding / head copies (`DeepSpecDraft`).
- The copies are loaded and checked against the target's vocabulary and hidden size; the caller may use
  them or the target's own (they are the frozen target weights, so either gives the same drafts; dropping
  them with `keep_embeddings=False` saves 2 x V x d of memory).
- Attention is bidirectional in every layer (DeepSpec never passes `is_causal`); sliding-window layers and
  tap id -1 (DeepSpec's name for the embedding output) are refused rather than guessed.

Errors are one-line ValueErrors naming the field or tensor: wrong tensor shapes (expected vs got), missing
config fields, tap ids outside the target's layers, a vocabulary or hidden size that differs from the
target's (`target_vocab_size` / `target_hidden_size` / `target_config`), and DSpark checkpoints in any
layout ("... marks a DSpark checkpoint, not DFlash: use load_dspark / load_deepspec_dspark").
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

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
# Config keys that only DSpark checkpoints carry, at the top level or in dflash_config (DeepSpec, speculators,
# ModelOpt's DSparkExporter). DeepSpec's DFlash drafts carry markov_rank 0 / enable_confidence_head false.
_DSPARK_KEYS = ("markov_rank", "markov_head", "markov_head_type", "confidence_head", "enable_confidence_head",
                "confidence_head_with_markov", "use_confidence_head", "sample_from_anchor", "dspark_config")
# DeepSpec draft-only (training) fields, dropped before the rest is read as a Qwen3 / z-lab config.
_DEEPSPEC_FIELDS = ("num_anchors", "markov_rank", "markov_head_type", "enable_confidence_head",
                    "confidence_head_with_markov")
_DEEPSPEC_HEADS = ("markov_head.", "confidence_head.")


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


def speculators_config(raw: Mapping[str, Any], *, num_target_layers: int | None = None,
                       causality: str = "dflash") -> DFlashConfig:
    """DFlashConfig from a speculators-format config.json (see the module docstring for the mapping).

    causality: whose vLLM causality rule applies, "dflash" or "dspark" (a DSpark backbone read through this
    DFlash reader), see `speculators_layer_causal`."""
    kind = raw.get("speculators_model_type")
    if kind != "dflash":
        if kind in _SPECULATORS_FOREIGN:
            hint = ": use load_dspark" if kind == "dspark" else ""
            raise ValueError(f"DFlash config field 'speculators_model_type': {kind!r} marks a {_SPECULATORS_FOREIGN[kind]} checkpoint, not DFlash{hint}")
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
        zlab_like.pop(name, None)  # z-lab meanings that speculators' draft does not have (causality: below)
    zlab_like.update(
        block_size=raw.get("block_size", 8),  # speculators' own default
        mask_token_id=need("mask_token_id"),
        target_layer_ids=[s - 1 for s in aux],
    )
    config = DFlashConfig.from_dict(zlab_like, num_target_layers=num_target_layers)

    # Windows: a layer slides only if layer_types says so *and* a window is set (else it is a full layer).
    window = full.get("sliding_window")
    types = full.get("layer_types") or ["full_attention"] * config.num_hidden_layers
    sliding = [t == SLIDING_ATTENTION and window is not None for t in types]
    return dataclasses.replace(
        config,
        layer_causal=speculators_layer_causal(raw, config.num_hidden_layers, kind=causality),
        layer_window=tuple(window if sl else None for sl in sliding),
    )


def speculators_layer_causal(raw: Mapping[str, Any], num_layers: int, *, kind: str = "dflash") -> tuple[bool, ...]:
    """Per-layer causality of a speculators-format draft, exactly as vLLM 0.32 serves it (kind: "dflash" or
    "dspark", the vLLM method whose reading applies).

    vLLM builds the draft's config from the raw `transformer_layer_config` plus its per-method updater, then
    resolves each layer with `qwen3_dflash._dflash_layer_causal`: `is_causal` if set, else
    `dflash_config.causal` if set, else causal iff `layer_types[i] == "sliding_attention"` (no layer_types:
    bidirectional). For DFlash, `algos.update_dflash` always sets `dflash_config.causal =
    not config.get("sliding_window_non_causal", True)`, so that one field decides every layer (absent means
    bidirectional; an explicit null means causal, as Python's `not None`). `update_dspark` sets no
    `dflash_config`, so a DSpark draft falls through to the layer types and the field means nothing there.
    """
    tl = raw.get("transformer_layer_config") or {}
    forced = tl.get("is_causal")
    if forced is not None:
        if not isinstance(forced, bool):
            raise ValueError(f"DFlash config field 'transformer_layer_config.is_causal': expected true or false, got {forced!r}")
        return (forced,) * num_layers
    if kind == "dflash":
        non_causal = raw.get("sliding_window_non_causal", True)
        if non_causal is not None and not isinstance(non_causal, bool):
            raise ValueError(f"DFlash config field 'sliding_window_non_causal': expected true or false, got {non_causal!r}")
        return (not non_causal,) * num_layers
    if kind != "dspark":
        raise ValueError(f"speculators_layer_causal: kind must be 'dflash' or 'dspark', got {kind!r}")
    types = tl.get("layer_types")
    if not types:
        return (False,) * num_layers
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(f"DFlash config field 'transformer_layer_config.layer_types': expected a list of {num_layers} entries, got {types!r}")
    return tuple(t == SLIDING_ATTENTION for t in types)


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


# ----------------------------------------------------------------------------------------------------------
# Target dimensions and layout detection


@dataclasses.dataclass(frozen=True)
class TargetDims:
    """What the draft must agree with: the target's decoder layer count, hidden size and vocabulary."""

    num_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None


def target_dims(target_config: Any = None, *, num_target_layers: int | None = None,
                target_hidden_size: int | None = None, target_vocab_size: int | None = None) -> TargetDims:
    """Merge explicit target sizes with a target config (a transformers config or a plain dict; multimodal
    configs are read through `get_text_config()`). An explicit value that contradicts the config is an error."""
    explicit = {"num_hidden_layers": num_target_layers, "hidden_size": target_hidden_size, "vocab_size": target_vocab_size}
    if target_config is not None:
        cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        for name, given in explicit.items():
            value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
            if given is not None and value is not None and given != value:
                raise ValueError(f"DFlash target: explicit {name}={given} contradicts target_config.{name}={value}")
            if given is None:
                explicit[name] = value
    return TargetDims(explicit["num_hidden_layers"], explicit["hidden_size"], explicit["vocab_size"])


def is_deepspec_config(raw: Any) -> bool:
    """DeepSpec's `Qwen3DSparkModel` layout: architectures say so, or DeepSpec's own top-level fields are
    there without z-lab's `dflash_config` or speculators' markers."""
    if not isinstance(raw, Mapping) or is_speculators_config(raw):
        return False
    archs = raw.get("architectures") or []
    if any(isinstance(a, str) and a.endswith("DSparkModel") for a in archs):
        return True
    return "dflash_config" not in raw and ("num_anchors" in raw or "enable_confidence_head" in raw)


def deepspec_has_heads(raw: Mapping[str, Any]) -> bool:
    """A DeepSpec config with a Markov or confidence head (DSpark) rather than plain DFlash."""
    rank = raw.get("markov_rank", 0)
    return bool(raw.get("enable_confidence_head", False)) or (isinstance(rank, (int, float)) and rank > 0)


def dspark_marker(raw: Any) -> str | None:
    """One-line reason when config.json describes a DSpark checkpoint (any layout), else None."""
    if not isinstance(raw, Mapping):
        return None
    if is_speculators_config(raw):
        if raw.get("speculators_model_type") == "dspark":
            return "DFlash config field 'speculators_model_type': 'dspark' marks a DSpark checkpoint, not DFlash: use load_dspark"
        return None
    if is_deepspec_config(raw):
        if not deepspec_has_heads(raw):
            return None  # a DeepSpec DFlash draft (markov_rank 0, no confidence head)
        field = "markov_rank" if raw.get("markov_rank", 0) else "enable_confidence_head"
        return f"DFlash config field '{field}': {raw[field]!r} marks a DSpark checkpoint, not DFlash: use load_deepspec_dspark"
    dflash = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), Mapping) else {}
    for block in (dflash, raw):
        for name in _DSPARK_KEYS:
            if name in block:
                return f"DFlash config field '{name}' marks a DSpark checkpoint, not DFlash: use load_dspark"
        if block.get("projector_type") == "dspark":  # ModelOpt's DSparkExporter
            return "DFlash config field 'projector_type': 'dspark' marks a DSpark checkpoint, not DFlash: use load_dspark"
    return None


def _check_tensor_kinds(tensors: Mapping[str, Tensor], *, deepspec: bool) -> None:
    for name in tensors:
        for marker, kind in _FOREIGN:
            if marker in name:
                hint = "" if kind != "DSpark" else ": use load_deepspec_dspark" if deepspec else ": use load_dspark"
                raise ValueError(f"DFlash checkpoint: tensor '{name}' marks a {kind} checkpoint, not DFlash{hint}")
        if name in ("t2d", "d2t"):
            raise ValueError(f"DFlash checkpoint: tensor '{name}' marks a reduced draft vocabulary (not supported)")


def _check_target(config: DFlashConfig, target: TargetDims) -> None:
    if target.hidden_size is not None and target.hidden_size != config.hidden_size:
        raise ValueError(
            f"DFlash config field 'hidden_size': {config.hidden_size} != target hidden size {target.hidden_size} "
            "(the draft shares the target's embedding and LM head)"
        )
    if target.vocab_size is not None and target.vocab_size != config.vocab_size:
        raise ValueError(
            f"DFlash config field 'vocab_size': draft checkpoint has {config.vocab_size}, target has {target.vocab_size} "
            "(the draft embeds and predicts target token ids)"
        )


def _build_model(config: DFlashConfig, tensors: Mapping[str, Tensor], *, ignore: tuple[str, ...],
                 dtype: torch.dtype | None, device: str | torch.device) -> DFlashDraftModel:
    """DFlashDraftModel from z-lab-named backbone tensors; `ignore` lists names (without `model.`) to skip."""
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    expected = model.state_dict()  # meta tensors: names and shapes only
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        ours = zlab_to_ours(name)
        if ours is None:
            if name.removeprefix("model.") in ignore:
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


def load_dflash(
    folder: str | os.PathLike,
    *,
    num_target_layers: int | None = None,
    target_hidden_size: int | None = None,
    target_vocab_size: int | None = None,
    target_config: Any = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> DFlashDraftModel:
    """Build the draft model from a local z-lab or speculators style folder (told apart by config.json).

    num_target_layers / target_hidden_size / target_vocab_size, or target_config (the target's transformers
    config or its dict): the target's, to check the taps, the shared hidden size and the vocabulary against.
    dtype: cast to this (default: keep the checkpoint's). DeepSpec folders are refused with a pointer to
    `load_deepspec_dflash` (their rows predict the next token), DSpark folders with one to the DSpark loaders.
    """
    folder = Path(folder)
    target = target_dims(target_config, num_target_layers=num_target_layers,
                         target_hidden_size=target_hidden_size, target_vocab_size=target_vocab_size)
    raw = read_config_json(folder / "config.json")
    reason = dspark_marker(raw)
    if reason is not None:
        raise ValueError(reason)
    if is_deepspec_config(raw):
        raise ValueError(
            "DFlash config field 'architectures': DeepSpec layout (Qwen3DSparkModel), whose rows predict the next "
            "token rather than their own position: use load_deepspec_dflash and a DSpark drafter without Markov head"
        )
    speculators = is_speculators_config(raw)
    if speculators:
        config = speculators_config(raw, num_target_layers=target.num_layers)
    else:
        config = DFlashConfig.from_dict(raw, num_target_layers=target.num_layers)
    _check_target(config, target)
    tensors = read_safetensors(folder)
    _check_tensor_kinds(tensors, deepspec=False)
    return _build_model(config, tensors, ignore=_SPECULATORS_SHARED if speculators else _SHARED, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------------------
# DeepSpec layout


def deepspec_config(raw: Mapping[str, Any], *, num_target_layers: int | None = None) -> DFlashConfig:
    """DFlashConfig of the backbone of a DeepSpec `Qwen3DSparkModel` config.json (heads are the caller's)."""
    archs = raw.get("architectures") or []
    unsupported = [a for a in archs if a != "Qwen3DSparkModel"]
    if unsupported:
        raise ValueError(f"DFlash config field 'architectures': {unsupported[0]!r} is not supported (DeepSpec Qwen3 drafts only)")
    for name in ("block_size", "target_layer_ids", "mask_token_id"):
        if raw.get(name) is None:
            raise ValueError(f"DFlash config: missing field '{name}' (DeepSpec format)")
    taps = raw["target_layer_ids"]
    if isinstance(taps, list) and -1 in taps:
        raise ValueError("DFlash config field 'target_layer_ids': tap id -1 (DeepSpec's embedding output) is not supported")
    layer_types = raw.get("layer_types")
    if isinstance(layer_types, list) and SLIDING_ATTENTION in layer_types:
        raise ValueError("DFlash config field 'layer_types': sliding-window layers are not supported in the DeepSpec format")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"DFlash config field 'hidden_act': only 'silu' is supported, got {raw['hidden_act']!r}")

    zlab_like = {k: v for k, v in raw.items() if k not in _DEEPSPEC_FIELDS}
    for name in ("dflash_config", "use_sliding_window", "sliding_window", "input_embedding_scale",
                 "output_multiplier", "final_logit_softcapping"):
        zlab_like.pop(name, None)  # the target's values or z-lab meanings; DeepSpec's draft uses none of them
    zlab_like["is_causal"] = False  # DeepSpec's block attends bidirectionally in every layer
    return DFlashConfig.from_dict(zlab_like, num_target_layers=num_target_layers)


@dataclasses.dataclass
class DeepSpecDraft:
    """A loaded DeepSpec checkpoint.

    model: the backbone; its block is [anchor, mask * (block_size - 1)] and every row drafts the token after
        its own position (drive it with DSparkDrafter / DSparkProposer, never DFlashDrafter).
    embed_tokens / lm_head: the checkpoint's copies of the target's embedding and LM head, [vocab, hidden]
        (checked against the target's sizes; None when absent or dropped with keep_embeddings=False).
    head_tensors: the DSpark head tensors (`markov_head.*`, `confidence_head.*`) as saved; empty for DFlash.
    raw_config: config.json as read.
    """

    model: DFlashDraftModel
    embed_tokens: Tensor | None
    lm_head: Tensor | None
    head_tensors: dict[str, Tensor]
    raw_config: dict[str, Any]


def read_deepspec(
    folder: str | os.PathLike,
    *,
    num_target_layers: int | None = None,
    target_hidden_size: int | None = None,
    target_vocab_size: int | None = None,
    target_config: Any = None,
    keep_embeddings: bool = True,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> DeepSpecDraft:
    """Backbone, embedding / head copies and raw head tensors of a DeepSpec folder (DFlash or DSpark)."""
    folder = Path(folder)
    target = target_dims(target_config, num_target_layers=num_target_layers,
                         target_hidden_size=target_hidden_size, target_vocab_size=target_vocab_size)
    raw = read_config_json(folder / "config.json")
    if not isinstance(raw, Mapping):
        raise ValueError("DFlash config: expected a JSON object")
    if is_speculators_config(raw) or "dflash_config" in raw:
        kind = "speculators" if is_speculators_config(raw) else "z-lab"
        raise ValueError(f"DFlash config: this is a {kind} checkpoint, not DeepSpec: use load_dflash" +
                         (" / load_dspark" if dspark_marker(raw) else ""))
    config = deepspec_config(raw, num_target_layers=target.num_layers)
    _check_target(config, target)
    tensors = read_safetensors(folder)

    backbone: dict[str, Tensor] = {}
    heads: dict[str, Tensor] = {}
    copies: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        short = name.removeprefix("model.")
        if short.startswith(_DEEPSPEC_HEADS):
            heads[short] = tensor
        elif short in _SHARED:
            copies[short] = tensor
        elif short == "rotary_emb.inv_freq":
            continue  # a derived buffer some exports persist
        else:
            backbone[name] = tensor
    _check_tensor_kinds(backbone, deepspec=True)
    expected = [config.vocab_size, config.hidden_size]
    for name, tensor in copies.items():
        if list(tensor.shape) != expected:
            raise ValueError(
                f"DFlash checkpoint: tensor '{name}' has shape {list(tensor.shape)}, expected {expected} "
                "(the target's vocab_size x hidden_size)"
            )
    model = _build_model(config, backbone, ignore=(), dtype=dtype, device=device)
    dtype = next(model.parameters()).dtype

    def copy(name: str) -> Tensor | None:
        t = copies.get(name)
        return None if t is None or not keep_embeddings else t.to(device=device, dtype=dtype)

    return DeepSpecDraft(model=model, embed_tokens=copy("embed_tokens.weight"), lm_head=copy("lm_head.weight"),
                         head_tensors=heads, raw_config=dict(raw))


def load_deepspec_dflash(folder: str | os.PathLike, **options: Any) -> DeepSpecDraft:
    """A DeepSpec DFlash draft (`markov_rank: 0`, no confidence head): backbone plus the embedding / head
    copies. Use it as `DSparkDrafter(d.model, embed, lm_head, markov=None)` with the copies or the target's.
    options: those of `read_deepspec` (target sizes or config, keep_embeddings, dtype, device)."""
    raw = read_config_json(Path(folder) / "config.json")
    if isinstance(raw, Mapping) and is_deepspec_config(raw) and deepspec_has_heads(raw):
        raise ValueError(dspark_marker(raw))
    draft = read_deepspec(folder, **options)
    if draft.head_tensors:
        name = sorted(draft.head_tensors)[0]
        raise ValueError(f"DFlash checkpoint: tensor '{name}' marks a DSpark checkpoint, not DFlash: use load_deepspec_dspark")
    return draft
