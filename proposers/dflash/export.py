"""Write a trained drafter as a `speculators` checkpoint folder: config.json + model.safetensors.

The layout is what speculators 0.9.0's `save_pretrained` writes for its DFlash / DSpark draft models, so
speculators itself, vLLM (`method: dflash` / `dspark` with a speculators checkpoint), our `load_dflash` and
`load_dspark` all read it:

- config.json: `speculators_model_type` "dflash" | "dspark", `architectures` (speculators' class name),
  `transformer_layer_config` (a Qwen3 config dict with the draft's dimensions), `aux_hidden_state_layer_ids`
  (= our tap ids + 1, vLLM / HF hidden_states numbering), `block_size`, `mask_token_id`, `draft_vocab_size`
  (= the target's vocabulary: no reduced draft vocabulary), `target_hidden_size`, `sample_from_anchor`
  (false for DFlash, true for DSpark), `sliding_window_non_causal` (true = bidirectional, false = causal, for
  every layer: see `sliding_window_non_causal`), `speculators_config` {algorithm,
  proposal_methods, default_proposal_method, verifier {name_or_path, architectures}}; DSpark adds
  `markov_rank` (0 = no Markov head), `markov_head_type`, `enable_confidence_head`, `confidence_head_with_markov`.
- model.safetensors: z-lab / HF tensor names (`layers.{i}.self_attn.q_proj.weight`, ...), plus
  `markov_head.*` and `confidence_head.*` for DSpark. No embedding or LM head: both are the target's
  (speculators reloads them from the verifier).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from spec_plugins.proposers.dflash.loader import _LAYER_RENAMES
from spec_plugins.proposers.dflash.model import DFlashDraftModel

SPECULATORS_VERSION = "0.9.0"  # the format version this writer follows
_ARCHITECTURES = {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}
_OURS_TO_HF = {ours: hf for hf, ours in _LAYER_RENAMES.items()}


def speculators_tensor_name(ours: str) -> str:
    """`layers.0.attention.wq.weight` -> `layers.0.self_attn.q_proj.weight`; top-level names are unchanged."""
    if ours.startswith("layers."):
        _, index, rest = ours.split(".", 2)
        module, leaf = rest.rsplit(".", 1)
        return f"layers.{index}.{_OURS_TO_HF[module]}.{leaf}"
    return ours


def _target_dict(target_config: Any) -> dict[str, Any]:
    return dict(target_config) if isinstance(target_config, Mapping) else target_config.to_dict()


def transformer_layer_config(model: DFlashDraftModel, target: Mapping[str, Any]) -> dict[str, Any]:
    c = model.config
    return {
        "model_type": "qwen3",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "attention_bias": c.attention_bias,
        "attention_dropout": 0.0,
        "max_position_embeddings": int(target.get("max_position_embeddings", 32768)),
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "layer_types": ["full_attention"] * c.num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
    }


def sliding_window_non_causal(layer_causal: tuple[bool, ...], kind: str = "dflash") -> bool:
    """The `sliding_window_non_causal` value under which vLLM serves layers with this causality.

    vLLM 0.32 (transformers_utils/configs/speculators/algos.py, `update_dflash`) sets
    `dflash_config.causal = not config.get("sliding_window_non_causal", True)`, and
    model_executor/models/qwen3_dflash.py `_dflash_layer_causal` applies a set `dflash_config.causal` to every
    draft layer, full attention included; the per-layer fallback there (causal iff `layer_types[i]` is
    `sliding_attention`) is reached only when `dflash_config.causal` is unset, which `update_dflash` never
    leaves it, and would tie causality to sliding windows anyway. So the field is one switch for the whole
    draft: true = bidirectional, false = causal, and a mix has no speculators form.

    speculators' trainer reads the field differently (only sliding layers; full layers always bidirectional),
    and so does vLLM for DSpark (`update_dspark` ignores it: with our all-`full_attention` layer_types every
    layer runs bidirectional). All three agree on an all-bidirectional draft, so that is the only DSpark
    causality written; a causal DFlash export runs causally in vLLM, but speculators' own model class would
    run its full-attention layers bidirectionally.
    """
    if all(layer_causal):
        if kind == "dspark":
            raise ValueError(
                "save_speculators: field 'sliding_window_non_causal' cannot make a DSpark draft causal "
                "(vLLM's DSpark reader ignores it and runs full-attention layers bidirectionally)"
            )
        return False
    if any(layer_causal):
        raise ValueError(
            f"save_speculators: field 'sliding_window_non_causal' cannot express layer_causal={tuple(layer_causal)}: "
            "vLLM applies it to every draft layer, so mixed causal / bidirectional layers have no speculators form"
        )
    return True


def save_speculators(out_dir: str | os.PathLike, model: DFlashDraftModel, *, markov=None, confidence=None,
                     target_config: Any, kind: str | None = None, verifier_name_or_path: str | None = None,
                     dtype: torch.dtype | None = None) -> Path:
    """Write `model` (+ DSpark heads) to out_dir in the speculators format; returns the folder.

    target_config: the target's HF config (object or dict), for the verifier entry and max positions.
    kind: "dflash" or "dspark" (default: dspark when a head is given). A DSpark backbone without heads is
    still DSpark (anchor predicts next), so pass kind="dspark" for it. dtype: cast tensors (default: as is).
    """
    kind = kind or ("dspark" if markov is not None or confidence is not None else "dflash")
    if kind not in _ARCHITECTURES:
        raise ValueError(f"save_speculators: kind must be 'dflash' or 'dspark', got {kind!r}")
    if kind == "dflash" and (markov is not None or confidence is not None):
        raise ValueError("save_speculators: a DFlash checkpoint has no Markov or confidence head (use kind='dspark')")
    c = model.config
    if any(w is not None for w in c.layer_window):
        raise ValueError("save_speculators: sliding-window draft layers are not written by this exporter")
    non_causal = sliding_window_non_causal(c.layer_causal, kind)
    if c.input_embedding_scale != 1.0 or c.output_multiplier != 1.0 or c.final_logit_softcapping is not None:
        raise ValueError("save_speculators: embedding scale / output multiplier / soft-capping have no speculators field")
    if confidence is not None and confidence.with_markov and markov is None:
        raise ValueError("save_speculators: the confidence head reads the Markov embedding, but no Markov head is given")
    target = _target_dict(target_config)
    anchor_predicts_next = kind == "dspark"

    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[kind]],
        "speculators_model_type": kind,
        "speculators_version": SPECULATORS_VERSION,
        "aux_hidden_state_layer_ids": [t + 1 for t in c.target_layer_ids],
        "block_size": c.block_size,
        "draft_vocab_size": c.vocab_size,
        "mask_token_id": c.mask_token_id,
        "target_hidden_size": c.hidden_size,
        "sample_from_anchor": anchor_predicts_next,
        "sliding_window_non_causal": non_causal,
        "tie_word_embeddings": False,
        "transformer_layer_config": transformer_layer_config(model, target),
        "speculators_config": {
            "algorithm": kind,
            "default_proposal_method": "greedy",
            "proposal_methods": [{
                "proposal_type": "greedy",
                "speculative_tokens": c.block_size if anchor_predicts_next else c.block_size - 1,
                "accept_tolerance": 0.0,
                "verifier_accept_k": 1,
            }],
            "verifier": {
                "name_or_path": verifier_name_or_path or target.get("_name_or_path") or None,
                "architectures": list(target.get("architectures") or []),
            },
        },
    }
    if kind == "dspark":
        config.update(
            markov_rank=markov.rank if markov is not None else 0,
            markov_head_type=markov.head_type if markov is not None else "vanilla",
            enable_confidence_head=confidence is not None,
            confidence_head_with_markov=bool(confidence is not None and confidence.with_markov),
        )

    tensors = {speculators_tensor_name(k): v for k, v in model.state_dict().items()}
    for prefix, head in (("markov_head.", markov), ("confidence_head.", confidence)):
        if head is not None:
            tensors.update({prefix + k: v for k, v in head.state_dict().items()})
    tensors = {k: (v if dtype is None else v.to(dtype)).detach().cpu().contiguous() for k, v in tensors.items()}
    config["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
