"""Load a DSpark checkpoint in the `speculators` format (config.json + model.safetensors).

The backbone is DFlash's (same config fields and tensor names, read with proposers/dflash/loader.py); on top:

    config.json   speculators_model_type "dspark", sample_from_anchor (true: anchor predicts next),
                  markov_rank (0 = no Markov head), markov_head_type (vanilla | gated | rnn),
                  enable_confidence_head, confidence_head_with_markov
    tensors       markov_head.markov_w1.weight [V, r], markov_head.markov_w2.weight [V, r],
                  markov_head.gate_proj.* (gated), markov_head.joint_proj.* (rnn),
                  confidence_head.proj.weight [1, d (+ r)], confidence_head.proj.bias [1]

Attention causality is read as vLLM serves a DSpark draft: `transformer_layer_config.is_causal` if set, else
the `sliding_attention` layers are causal and the rest bidirectional; `sliding_window_non_causal` is not read
(vLLM's `update_dspark` ignores it), see `speculators_layer_causal` in proposers/dflash/loader.py.

`markov_rank` is required here (speculators would silently default it to 256); the other DSpark fields take
speculators' defaults (vanilla, confidence head on, reading the Markov embedding). Every problem is one
line: a ValueError starting "DSpark config" or "DSpark checkpoint".
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from spec_plugins.proposers.dflash.loader import (
    is_speculators_config,
    read_config_json,
    read_safetensors,
    speculators_config,
    zlab_to_ours,
)
from spec_plugins.proposers.dflash.model import DFlashDraftModel
from spec_plugins.proposers.dspark.heads import MARKOV_HEAD_TYPES, ConfidenceHead, MarkovHead

# The verifier's weights may ride along in a speculators checkpoint; the draft always uses the target's.
_IGNORED = ("embed_tokens.weight", "lm_head.weight", "verifier_norm.weight", "verifier_lm_head.weight")
_FOREIGN_KINDS = {"dflash": "DFlash", "dflash2": "DFlash 2", "eagle3": "EAGLE-3", "eagle": "EAGLE"}


def _error(message: str) -> ValueError:
    return ValueError(message.replace("\n", " "))


def _dspark_fields(raw) -> tuple[int, str, bool, bool]:
    kind = raw.get("speculators_model_type")
    if kind != "dspark":
        if kind in _FOREIGN_KINDS:
            raise _error(f"DSpark config field 'speculators_model_type': {kind!r} marks a {_FOREIGN_KINDS[kind]} checkpoint, not DSpark")
        raise _error(f"DSpark config field 'speculators_model_type': expected 'dspark', got {kind!r}")
    spec = raw.get("speculators_config")
    if isinstance(spec, dict) and spec.get("algorithm") != "dspark":
        raise _error(f"DSpark config field 'speculators_config.algorithm': expected 'dspark', got {spec.get('algorithm')!r}")
    if not raw.get("sample_from_anchor", True):
        raise _error("DSpark config field 'sample_from_anchor': false (anchor as bonus, mask rows predict) is not supported; "
                     "our DSpark drafts from the anchor row")
    rank = raw.get("markov_rank")
    if rank is None:
        raise _error("DSpark config: missing field 'markov_rank' (0 for no Markov head)")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise _error(f"DSpark config field 'markov_rank': expected an integer >= 0, got {rank!r}")
    head_type = raw.get("markov_head_type", "vanilla")
    if head_type not in MARKOV_HEAD_TYPES:
        raise _error(f"DSpark config field 'markov_head_type': unknown head type {head_type!r} (expected one of {MARKOV_HEAD_TYPES})")
    with_confidence = raw.get("enable_confidence_head", True)
    with_markov = raw.get("confidence_head_with_markov", True)
    for name, value in (("enable_confidence_head", with_confidence), ("confidence_head_with_markov", with_markov)):
        if not isinstance(value, bool):
            raise _error(f"DSpark config field '{name}': expected true or false, got {value!r}")
    if with_confidence and with_markov and rank == 0:
        raise _error("DSpark config field 'confidence_head_with_markov': true needs markov_rank > 0")
    return rank, head_type, with_confidence, with_markov


def load_module_tensors(module: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str, *,
                        who: str = "DSpark checkpoint", dtype=None, device=None, assign: bool = False) -> None:
    """Load `tensors` (names relative to `what`) into `module` exactly: an unexpected, missing or misshapen
    tensor is one ValueError starting with `who`. dtype/device: cast to these (default: the module's)."""
    expected = module.state_dict()
    for name, tensor in tensors.items():
        if name not in expected:
            raise _error(f"{who}: unexpected tensor '{what}.{name}' for this config")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise _error(f"{who}: tensor '{what}.{name}' has shape {list(tensor.shape)}, "
                         f"config implies {list(expected[name].shape)}")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise _error(f"{who}: missing tensor(s) {[f'{what}.{m}' for m in missing[:3]]}")
    ref = next(iter(expected.values()))
    dtype, device = dtype or ref.dtype, device or ref.device
    module.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, strict=True,
                           assign=assign)


def load_dspark(path: str | os.PathLike, *, num_target_layers: int | None = None, map_location: str | torch.device = "cpu",
                dtype: torch.dtype | None = None) -> tuple[DFlashDraftModel, MarkovHead | None, ConfidenceHead | None]:
    """(backbone, Markov head or None, confidence head or None) from a speculators DSpark folder.

    The backbone's block_size is gamma: all its rows draft (DSparkProposer / DSparkDrafter layout).
    num_target_layers: the target's decoder layer count, to range-check the taps. dtype: cast to this
    (default: the checkpoint's).
    """
    folder = Path(path)
    try:
        raw = read_config_json(folder / "config.json")
    except ValueError as e:
        raise _error(str(e).replace("DFlash config", "DSpark config", 1)) from None
    if not is_speculators_config(raw):
        raise _error("DSpark config: not a speculators checkpoint (no 'speculators_model_type'; expected 'dspark')")
    rank, head_type, with_confidence, with_markov = _dspark_fields(raw)

    # The backbone fields are DFlash's: read them with the DFlash reader, as a DFlash config with the same
    # dimensions (its errors keep their wording, renamed to DSpark). Causality follows vLLM's DSpark reading,
    # which ignores sliding_window_non_causal (causal layers only from transformer_layer_config).
    as_dflash = dict(raw, speculators_model_type="dflash", sample_from_anchor=False)
    if isinstance(raw.get("speculators_config"), dict):
        as_dflash["speculators_config"] = dict(raw["speculators_config"], algorithm="dflash")
    try:
        config = speculators_config(as_dflash, num_target_layers=num_target_layers, causality="dspark")
    except ValueError as e:
        raise _error(str(e).replace("DFlash config", "DSpark config", 1)) from None

    tensors = read_safetensors(folder) if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists() else None
    if tensors is None:
        raise _error(f"DSpark checkpoint: no model.safetensors (or index) in {folder}")
    backbone, heads = {}, {"markov_head": {}, "confidence_head": {}}
    for name, tensor in tensors.items():
        head, _, rest = name.partition(".")
        if head in heads:
            heads[head][rest] = tensor
        elif name in ("t2d", "d2t"):
            raise _error(f"DSpark checkpoint: tensor '{name}' marks a reduced draft vocabulary (not supported)")
        elif name.removeprefix("model.") in _IGNORED:
            continue
        else:
            ours = zlab_to_ours(name)
            if ours is None:
                raise _error(f"DSpark checkpoint: unexpected tensor '{name}'")
            backbone[ours] = tensor
    if dtype is None:
        dtype = next(iter(tensors.values())).dtype

    with torch.device("meta"):
        model = DFlashDraftModel(config)
    load_module_tensors(model, backbone, "backbone", dtype=dtype, device=map_location, assign=True)

    markov = None
    if rank > 0:
        with torch.device("meta"):
            markov = MarkovHead(config.vocab_size, rank, config.hidden_size, head_type)
        load_module_tensors(markov, heads["markov_head"], "markov_head", dtype=dtype, device=map_location,
                            assign=True)
    elif heads["markov_head"]:
        raise _error("DSpark checkpoint: markov_head tensors present but markov_rank is 0")
    confidence = None
    if with_confidence:
        with torch.device("meta"):
            confidence = ConfidenceHead(config.hidden_size, rank if with_markov else 0)
        load_module_tensors(confidence, heads["confidence_head"], "confidence_head", dtype=dtype,
                            device=map_location, assign=True)
    elif heads["confidence_head"]:
        raise _error("DSpark checkpoint: confidence_head tensors present but enable_confidence_head is false")
    return model.eval(), None if markov is None else markov.eval(), None if confidence is None else confidence.eval()
