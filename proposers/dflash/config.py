"""DFlash draft configuration, read from a z-lab style `config.json`.

A z-lab checkpoint config is a Qwen3 config (dimensions, rope, norms) plus DFlash fields, which may sit
either inside `dflash_config` or at the top level (z-lab's `_draft_value` looks in `dflash_config` first):

    {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], "block_size": 16, "num_target_layers": 36,
     "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
     "hidden_size": 4096, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, ...}

Every problem is reported as a one-line ValueError that names the offending field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

# Fields that only DSpark (DeepSeek's sequential/Markov head) or DFlash 2 checkpoints carry: loading one of
# those as plain DFlash would silently drop its extra head, so it is refused instead.
_DSPARK_FIELDS = ("markov_rank", "markov_head", "confidence_head", "sample_from_anchor", "dspark_config")
_DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """z-lab's default taps: spread evenly over layers 1 .. L-3 (36 layers, 5 taps -> [1, 9, 17, 25, 33])."""
    if num_taps == 1:
        return [num_target_layers // 2]
    span = (num_target_layers - 3) - 1
    return [round(1 + i * span / (num_taps - 1)) for i in range(num_taps)]


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    # Draft decoder stack (Qwen3 style). hidden_size equals the target's: embedding and LM head are shared.
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    # DFlash specifics.
    block_size: int  # query block = [bonus, mask * (block_size - 1)]: block_size - 1 drafts
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # tap k = output of target decoder layer k = HF hidden_states[k + 1]
    num_target_layers: int | None
    # Per draft layer: causal within the block or not, and the sliding window (None = unbounded).
    layer_causal: tuple[bool, ...]
    layer_window: tuple[int | None, ...]
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def num_drafts(self) -> int:
        return self.block_size - 1

    @classmethod
    def from_json(cls, path: str | os.PathLike, *, num_target_layers: int | None = None) -> "DFlashConfig":
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"DFlash config: no config.json at {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"DFlash config: {path} is not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(raw, num_target_layers=num_target_layers)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, num_target_layers: int | None = None) -> "DFlashConfig":
        """`num_target_layers`: the target's decoder layer count, to range-check the taps against (defaults to
        the config's own `num_target_layers`; a mismatch between the two is an error)."""
        if not isinstance(raw, Mapping):
            raise ValueError("DFlash config: expected a JSON object")
        dflash = raw.get("dflash_config") or {}
        if not isinstance(dflash, Mapping):
            raise ValueError("DFlash config field 'dflash_config': expected an object")

        def lookup(name: str, default: Any = KeyError) -> Any:
            # Same precedence as z-lab: dflash_config first, then the top level.
            if name in dflash:
                return dflash[name]
            if name in raw:
                return raw[name]
            if default is KeyError:
                raise ValueError(f"DFlash config: missing field '{name}'")
            return default

        for name in _DSPARK_FIELDS:
            if name in dflash or name in raw:
                raise ValueError(f"DFlash config: field '{name}' marks a DSpark checkpoint, not DFlash")
        for name in _DFLASH2_FIELDS:
            if name in dflash or name in raw:
                raise ValueError(f"DFlash config: field '{name}' marks a DFlash 2 checkpoint (unsupported)")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"DFlash config field 'hidden_act': only 'silu' is supported, got {raw['hidden_act']!r}")

        hidden = _int(lookup("hidden_size"), "hidden_size")
        heads = _int(lookup("num_attention_heads"), "num_attention_heads")
        kv_heads = _int(lookup("num_key_value_heads", heads) or heads, "num_key_value_heads")
        if heads % kv_heads:
            raise ValueError(f"DFlash config field 'num_key_value_heads': {kv_heads} does not divide {heads} heads")
        head_dim = raw.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ValueError(f"DFlash config field 'head_dim': missing and hidden_size {hidden} % {heads} heads != 0")
            head_dim = hidden // heads
        head_dim = _int(head_dim, "head_dim")
        if head_dim % 2:
            raise ValueError(f"DFlash config field 'head_dim': must be even for RoPE, got {head_dim}")
        num_layers = _int(lookup("num_hidden_layers"), "num_hidden_layers")
        vocab = _int(lookup("vocab_size"), "vocab_size")

        rope_theta = _rope_theta(raw)

        block_size = _int(lookup("block_size", 16), "block_size")
        if block_size < 2:
            raise ValueError(f"DFlash config field 'block_size': must be >= 2 (bonus + at least one draft), got {block_size}")
        mask_token_id = _int(lookup("mask_token_id"), "mask_token_id", minimum=0)
        if mask_token_id >= vocab:
            raise ValueError(f"DFlash config field 'mask_token_id': {mask_token_id} is outside the vocabulary [0, {vocab})")

        config_target_layers = lookup("num_target_layers", None)
        if config_target_layers is not None:
            config_target_layers = _int(config_target_layers, "num_target_layers")
        if num_target_layers is not None and config_target_layers is not None and num_target_layers != config_target_layers:
            raise ValueError(
                f"DFlash config field 'num_target_layers': checkpoint was trained on {config_target_layers} target layers, "
                f"the target has {num_target_layers}"
            )
        target_layers = num_target_layers if num_target_layers is not None else config_target_layers

        taps = lookup("target_layer_ids", None)
        if taps is None:
            if target_layers is None:
                raise ValueError("DFlash config: missing field 'target_layer_ids' (and no 'num_target_layers' to derive it)")
            # z-lab's default: as many taps as draft layers.
            taps = default_target_layer_ids(target_layers, num_layers)
        if not isinstance(taps, (list, tuple)) or not taps or not all(isinstance(t, int) and not isinstance(t, bool) for t in taps):
            raise ValueError(f"DFlash config field 'target_layer_ids': expected a non-empty list of ints, got {taps!r}")
        if len(set(taps)) != len(taps):
            raise ValueError(f"DFlash config field 'target_layer_ids': duplicate tap ids in {list(taps)}")
        for t in taps:
            if t < 0 or (target_layers is not None and t >= target_layers):
                bound = f"[0, {target_layers})" if target_layers is not None else ">= 0"
                raise ValueError(f"DFlash config field 'target_layer_ids': tap id {t} out of range {bound} of the target's layers")

        layer_causal, layer_window = _attention_layout(raw, dflash, num_layers)

        softcap = lookup("final_logit_softcapping", None)
        return cls(
            hidden_size=hidden,
            intermediate_size=_int(lookup("intermediate_size"), "intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            attention_bias=bool(raw.get("attention_bias", False)),
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=tuple(taps),
            num_target_layers=target_layers,
            layer_causal=layer_causal,
            layer_window=layer_window,
            input_embedding_scale=float(lookup("input_embedding_scale", 1.0)),
            output_multiplier=float(lookup("output_multiplier", 1.0)),
            final_logit_softcapping=float(softcap) if softcap is not None and float(softcap) > 0 else None,
        )


def _int(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"DFlash config field '{name}': expected an integer >= {minimum}, got {value!r}")
    return value


def _rope_theta(raw: Mapping[str, Any]) -> float:
    # transformers 4.x writes rope_theta (+ rope_scaling); 5.x writes rope_parameters {rope_type, rope_theta}.
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for name, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise ValueError(f"DFlash config field '{name}': rope type {kind!r} is not supported (plain RoPE only)")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))  # 10000: transformers' Qwen3 default
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ValueError(f"DFlash config field 'rope_theta': expected a positive number, got {theta!r}")
    return float(theta)


def _attention_layout(raw: Mapping[str, Any], dflash: Mapping[str, Any], num_layers: int):
    """Per-layer (causal, window), with transformers' Qwen3Config rules for the window, which is what the
    z-lab model sees: `sliding_window` counts only when `use_sliding_window` is set, and without explicit
    `layer_types` layers >= `max_window_layers` slide. Causality: `is_causal`, else `dflash_config.causal`,
    else sliding layers are causal and full-attention layers bidirectional."""
    window = raw.get("sliding_window") if raw.get("use_sliding_window", False) else None
    if window is not None:
        window = _int(window, "sliding_window")
    layer_types = raw.get("layer_types")
    if layer_types is None:
        first_sliding = raw.get("max_window_layers", 28)
        layer_types = [SLIDING_ATTENTION if window is not None and i >= first_sliding else FULL_ATTENTION for i in range(num_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(f"DFlash config field 'layer_types': expected a list of {num_layers} entries, got {layer_types!r}")
    for t in layer_types:
        if t not in (FULL_ATTENTION, SLIDING_ATTENTION):
            raise ValueError(f"DFlash config field 'layer_types': unknown layer type {t!r}")

    forced = raw.get("is_causal")
    if forced is None:
        forced = dflash.get("causal")
    causal = tuple(bool(forced) if forced is not None else t == SLIDING_ATTENTION for t in layer_types)
    windows = tuple(window if t == SLIDING_ATTENTION else None for t in layer_types)
    return causal, windows
