"""Load a DeepSpec DSpark checkpoint (deepseek-ai/DeepSpec, `Qwen3DSparkModel`) into our DSpark pieces.

Layout, from DeepSpec's `deepspec/modeling/dspark/{qwen3/config.py, qwen3/modeling.py, common.py}` (its
`markov_head.py` was not available; the Markov variants' tensor names and shapes below follow the reference
notes and SGLang's port of that file, which mirrors it):

    config.json   a copy of the target's Qwen3 config plus, at the top level,
                  block_size (gamma), target_layer_ids, mask_token_id, num_target_layers, num_anchors,
                  markov_rank (0 = no Markov head), markov_head_type (required when markov_rank > 0:
                  vanilla | gated | rnn), enable_confidence_head, confidence_head_with_markov (required when
                  the confidence head is on), layer_types, tie_word_embeddings: false
    tensors       backbone under z-lab's names (see proposers/dflash/loader.py), no prefix, plus
                  embed_tokens.weight, lm_head.weight                  [V, d] copies of the target's
                  markov_head.markov_w1.weight                          [V, r]   (Embedding)
                  markov_head.markov_w2.weight                          [V, r]   (Linear r -> V, no bias)
                  markov_head.gate_proj.{weight,bias}                   [r, d + r], [r]      gated only
                  markov_head.joint_proj.{weight,bias}                  [3r, 2r + d], [3r]   rnn only
                  confidence_head.proj.{weight,bias}                    [1, d (+ r)], [1]

which map one to one onto `MarkovHead` / `ConfidenceHead` (proposers/dspark/heads.py: same module names
without the `markov_head.` / `confidence_head.` prefix, same input orders [h; e] and [s; e; h]). The
confidence head reads [h; W1[prev]] when `confidence_head_with_markov`, else h alone.

Every row of the block drafts (anchor predicts next): drive the result with `DSparkDrafter` /
`DSparkProposer`. The embedding / LM head copies are available through `load_deepspec_dspark_checkpoint`;
`load_deepspec_dspark` drops them (the target's own weights give the same drafts).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import torch
from torch import Tensor

from spec_plugins.proposers.dflash.loader import read_deepspec
from spec_plugins.proposers.dflash.model import DFlashDraftModel
from spec_plugins.proposers.dspark.heads import MARKOV_HEAD_TYPES, ConfidenceHead, MarkovHead


@dataclasses.dataclass
class DeepSpecDSpark:
    model: DFlashDraftModel
    markov: MarkovHead | None
    confidence: ConfidenceHead | None
    embed_tokens: Tensor | None  # the checkpoint's copy of the target embedding [V, d], or None
    lm_head: Tensor | None       # the checkpoint's copy of the target LM head [V, d], or None


def _int_field(raw: Mapping[str, Any], name: str, default: Any = KeyError, *, minimum: int = 0) -> int:
    if name not in raw or raw[name] is None:
        if default is KeyError:
            raise ValueError(f"DSpark config: missing field '{name}' (DeepSpec format)")
        return default
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"DSpark config field '{name}': expected an integer >= {minimum}, got {value!r}")
    return value


def _bool_field(raw: Mapping[str, Any], name: str, default: Any = KeyError) -> bool:
    if name not in raw or raw[name] is None:
        if default is KeyError:
            raise ValueError(f"DSpark config: missing field '{name}' (DeepSpec format)")
        return default
    if not isinstance(raw[name], bool):
        raise ValueError(f"DSpark config field '{name}': expected true or false, got {raw[name]!r}")
    return raw[name]


def _fill(module: torch.nn.Module, prefix: str, tensors: dict[str, Tensor], dtype: torch.dtype, device) -> None:
    """Load `prefix` + parameter name tensors into `module`, checking names and shapes; consumed tensors
    are removed from `tensors` so leftovers can be reported."""
    state = {}
    for name, param in module.state_dict().items():
        full = prefix + name
        if full not in tensors:
            raise ValueError(f"DSpark checkpoint: missing tensor '{full}'")
        tensor = tensors.pop(full)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"DSpark checkpoint: tensor '{full}' has shape {list(tensor.shape)}, config implies {list(param.shape)}")
        state[name] = tensor.to(device=device, dtype=dtype)
    module.load_state_dict(state, strict=True, assign=True)


def load_deepspec_dspark_checkpoint(path: str | os.PathLike, **options: Any) -> DeepSpecDSpark:
    """Backbone, heads and the embedding / LM head copies of a DeepSpec DSpark (or DFlash) folder.

    options: those of `read_deepspec` (num_target_layers, target_vocab_size, target_hidden_size, target_config,
    keep_embeddings, dtype, device). The target's sizes (explicit or from `target_config`) are checked against
    the checkpoint: taps within its layers, equal hidden size and vocabulary. Errors are one-line ValueErrors
    naming the field / tensor.
    """
    draft = read_deepspec(path, **options)
    device = next(draft.model.parameters()).device
    raw, config = draft.raw_config, draft.model.config
    dtype = next(draft.model.parameters()).dtype
    tensors = dict(draft.head_tensors)

    rank = _int_field(raw, "markov_rank", 0)
    markov = None
    if rank > 0:
        if "markov_head_type" not in raw:
            raise ValueError("DSpark config: missing field 'markov_head_type' (required when markov_rank > 0)")
        head_type = str(raw["markov_head_type"]).lower()
        if head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"DSpark config field 'markov_head_type': {raw['markov_head_type']!r} not in {MARKOV_HEAD_TYPES}")
        with torch.device("meta"):
            markov = MarkovHead(config.vocab_size, rank, config.hidden_size, head_type)
        _fill(markov, "markov_head.", tensors, dtype, device)
        markov.eval()

    confidence = None
    if _bool_field(raw, "enable_confidence_head", False):
        with_markov = _bool_field(raw, "confidence_head_with_markov")
        if with_markov and markov is None:
            raise ValueError("DSpark config field 'confidence_head_with_markov': true needs a Markov head (markov_rank > 0)")
        with torch.device("meta"):
            confidence = ConfidenceHead(config.hidden_size, rank if with_markov else 0)
        _fill(confidence, "confidence_head.", tensors, dtype, device)
        confidence.eval()

    if tensors:
        # e.g. markov_head.gate_proj.* with markov_head_type vanilla, or confidence_head.* with the head off
        name = sorted(tensors)[0]
        raise ValueError(f"DSpark checkpoint: tensor '{name}' does not fit the config (markov_head_type / enable_confidence_head)")
    return DeepSpecDSpark(draft.model, markov, confidence, draft.embed_tokens, draft.lm_head)


def load_deepspec_dspark(path: str | os.PathLike, **options: Any) -> tuple[DFlashDraftModel, MarkovHead | None, ConfidenceHead | None]:
    """(backbone, Markov head or None, confidence head or None) of a DeepSpec folder, ready for
    `DSparkProposer(model, markov, confidence)`; the embedding / head copies are dropped (the target's own
    are used). See `load_deepspec_dspark_checkpoint` for the arguments."""
    d = load_deepspec_dspark_checkpoint(path, **{**options, "keep_embeddings": False})
    return d.model, d.markov, d.confidence
