"""Load a z-lab DFlash checkpoint (a folder with config.json + model.safetensors) into DFlashDraftModel.

z-lab tensor names (optionally prefixed `model.`) map onto ours:

    fc.weight, hidden_norm.weight, norm.weight                     -> same names
    layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}              -> layers.{i}.attention.{wq,wk,wv,wo}.*
    layers.{i}.self_attn.{q,k}_norm.weight                         -> layers.{i}.attention.{q,k}_norm.weight
    layers.{i}.input_layernorm / post_attention_layernorm.weight   -> layers.{i}.attention_norm / ffn_norm.weight
    layers.{i}.mlp.{gate,up,down}_proj.weight                      -> layers.{i}.feed_forward.{w1,w3,w2}.weight

There is no embedding or LM head: both are the target's. Taps: id k is the output of target decoder layer k,
which is HF `output_hidden_states[k + 1]` (see model.select_taps) and vLLM aux-hidden-state layer k + 1.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from spec_plugins.proposers.dflash.config import DFlashConfig
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
    """Build the draft model from a local z-lab style folder.

    num_target_layers / target_hidden_size: the target's, to check the taps and the shared hidden size
    against. dtype: cast to this (default: keep the checkpoint's).
    """
    folder = Path(folder)
    config = DFlashConfig.from_json(folder / "config.json", num_target_layers=num_target_layers)
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

    with torch.device("meta"):
        model = DFlashDraftModel(config)
    expected = model.state_dict()  # meta tensors: names and shapes only
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        ours = zlab_to_ours(name)
        if ours is None:
            if name.removeprefix("model.") in _SHARED:
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
