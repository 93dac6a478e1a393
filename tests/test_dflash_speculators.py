"""DFlash in the `speculators` checkpoint format: fp32 parity with speculators' own DFlash draft model, and
loader errors on bad speculators configs / tensors.

speculators' `DFlashDraftModel` is built with a tiny config and random weights, saved with its own
`save_pretrained`, loaded with our `load_dflash`, and both are fed the same target features, token ids and
positions. speculators' forward is its training one (anchored blocks over a packed sequence); with one loss-mask
position per anchor its anchors are exactly the positions we choose, so every anchor block must equal our
one-shot draft of that block given the features of all earlier positions. Tiny random models, no engines.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")

# speculators' package __init__ pulls in its training data pipeline (eagle3/data.py -> train/data.py), which
# imports `datasets` and `hs_connectors` at module level; the DFlash model never uses them. Where they are not
# installed, stand in placeholders for the import only (and remove them again) instead of installing datasets'
# pyarrow / pandas stack.
_PLACEHOLDERS = {"datasets": ("load_from_disk",), "hs_connectors": ("FileTransfer", "HiddenStatesTransfer")}
_added = []
for _name, _attrs in _PLACEHOLDERS.items():
    if importlib.util.find_spec(_name) is None:
        _module = types.ModuleType(_name)
        for _attr in _attrs:
            setattr(_module, _attr, type(_attr, (), {}))
        sys.modules[_name] = _module
        _added.append(_name)
try:
    pytest.importorskip(
        "speculators", reason="speculators' DFlash is the oracle: install with pip install --no-deps speculators==0.9.0"
    )
    from speculators.config import SpeculatorsConfig, VerifierConfig  # noqa: E402
    from speculators.models.dflash import DFlashDraftModel as SpecDFlash  # noqa: E402
    from speculators.models.dflash import DFlashSpeculatorConfig  # noqa: E402
    from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: E402
finally:
    for _name in _added:
        sys.modules.pop(_name, None)

from safetensors.torch import load_file  # noqa: E402

from spec_plugins.proposers.dflash import load_dflash  # noqa: E402
from drafter_weights import edited_checkpoint, randomize_  # noqa: E402

TOL = 1e-4
HIDDEN, VOCAB, TARGET_LAYERS, BLOCK, MASK = 64, 128, 4, 4, 127
SEQ = 13  # packed sequence length; anchors must lie below SEQ - BLOCK
ANCHORS = (1, 4, 8)

TRANSFORMER = {
    "model_type": "qwen3",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
}

# (transformer_layer_config overrides, top-level overrides). aux ids are speculators' (= our tap ids + 1).
# speculators' model keeps full-attention layers bidirectional whatever `sliding_window_non_causal` says;
# vLLM 0.32 (and our loader, which reads as vLLM does) applies `causal = not sliding_window_non_causal` to
# every layer. The bidirectional variants therefore say true, the one reading both agree on.
VARIANTS = {
    "bidirectional": ({}, {"aux_hidden_state_layer_ids": [1, 3], "sliding_window_non_causal": True}),
    "three_taps_bias_rope": ({"attention_bias": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                             {"aux_hidden_state_layer_ids": [1, 2, 4], "sliding_window_non_causal": True}),
    # layer 1 slides (causal within the block); the window covers the whole sequence, see test below.
    "sliding_causal": ({"use_sliding_window": True, "sliding_window": 64, "layer_types": ["full_attention", "sliding_attention"]},
                       {"aux_hidden_state_layer_ids": [2, 4]}),
    "sliding_non_causal": ({"use_sliding_window": True, "sliding_window": 64, "layer_types": ["sliding_attention", "sliding_attention"]},
                           {"aux_hidden_state_layer_ids": [2, 4], "sliding_window_non_causal": True}),
}


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
    """A local verifier config, so speculators resolves its norm convention without the Hub."""
    folder = tmp_path_factory.mktemp("verifier")
    transformers.Qwen3Config(**{**TRANSFORMER, "num_hidden_layers": TARGET_LAYERS}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def shared_weights():
    torch.manual_seed(1)  # O(1) logits, so 1e-4 is a tight bound
    return torch.randn(VOCAB, HIDDEN), 0.5 * torch.randn(VOCAB, HIDDEN)  # target embedding, target LM head


def speculators_model(verifier_dir, shared_weights, tl_overrides=None, top_overrides=None, seed=0):
    top = {"aux_hidden_state_layer_ids": [1, 3], **copy.deepcopy(top_overrides or {})}
    config = DFlashSpeculatorConfig(
        transformer_layer_config={**TRANSFORMER, **copy.deepcopy(tl_overrides or {})},
        draft_vocab_size=VOCAB,
        block_size=BLOCK,
        mask_token_id=MASK,
        speculators_config=SpeculatorsConfig(
            algorithm="dflash",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=BLOCK - 1)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(verifier_dir), architectures=["Qwen3ForCausalLM"]),
        ),
        **top,
    )
    config.transformer_layer_config._attn_implementation = "eager"  # dense float masks: no flex / compile on CPU
    torch.manual_seed(seed)
    model = SpecDFlash(config).float().eval()
    embed, head = shared_weights
    randomize_(model, skip=("embed_tokens", "lm_head", "verifier_"))
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
        model.verifier_lm_head.weight.copy_(head)
        model.verifier_norm.weight.fill_(1.0)
    return model


def speculators_logits(model, taps, input_ids):
    """speculators' anchored-block forward with anchors exactly ANCHORS: [len(ANCHORS), BLOCK, vocab]."""
    loss_mask = torch.zeros(1, SEQ, dtype=torch.long)
    loss_mask[0, list(ANCHORS)] = 1
    _, logits, _, _, _ = model._backbone_forward(
        hidden_states=taps,
        input_ids=input_ids,
        loss_mask=loss_mask,
        verifier_last_hidden_states=torch.zeros(1, SEQ, HIDDEN),
        document_ids=torch.zeros(1, SEQ, dtype=torch.long),
        max_anchors=len(ANCHORS),
    )
    return logits.view(len(ANCHORS), BLOCK, VOCAB)


def ours_logits(model, taps, input_ids, shared_weights):
    embed, head = shared_weights
    out = []
    for a in ANCHORS:
        block = model.block_ids(input_ids[:, a])
        hidden = model(taps[:, :a], model.embed_block(block, embed))
        out.append(model.logits(hidden, head)[0])
    return torch.stack(out)


def inputs(num_taps, seed=2):
    torch.manual_seed(seed)
    return torch.randn(1, SEQ, num_taps * HIDDEN), torch.randint(0, VOCAB - 1, (1, SEQ))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@torch.no_grad()
def test_parity_with_speculators(tmp_path, verifier_dir, shared_weights, variant):
    tl, top = VARIANTS[variant]
    ref = speculators_model(verifier_dir, shared_weights, tl, top)
    ref.save_pretrained(str(tmp_path / "ckpt"))
    raw = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert raw["speculators_model_type"] == "dflash"
    saved = set(load_file(str(tmp_path / "ckpt" / "model.safetensors")))
    assert not saved & {"embed_tokens.weight", "lm_head.weight"}  # full vocabulary: the verifier's, not saved

    ours = load_dflash(tmp_path / "ckpt", num_target_layers=TARGET_LAYERS, target_hidden_size=HIDDEN)
    aux = top["aux_hidden_state_layer_ids"]
    assert ours.config.target_layer_ids == tuple(s - 1 for s in aux)
    assert ours.config.block_size == BLOCK and ours.config.mask_token_id == MASK
    sliding = [i in ref.sliding_window_indices for i in range(len(ref.layers))]
    vllm_causal = not raw.get("sliding_window_non_causal", True)  # vLLM's update_dflash, every layer
    assert ours.config.layer_causal == (vllm_causal,) * len(sliding)
    speculators_causal = tuple(s and not ref.sliding_window_non_causal for s in sliding)

    taps, ids = inputs(len(aux))
    want = speculators_logits(ref, taps, ids)
    got = ours_logits(ours, taps, ids, shared_weights)
    diff = (want - got).abs().max().item()
    if speculators_causal != ours.config.layer_causal:
        # Mixed causal / bidirectional layers have no form vLLM 0.32 reads: we run what vLLM runs,
        # which is not speculators' model (the draft rows see different keys).
        assert diff > 1e-3, f"[{variant}] expected vLLM's all-causal reading to differ from speculators' mixed layers"
        return
    print(f"[{variant}] max abs logit diff vs speculators: {diff:.3e}")
    assert diff <= TOL
    # The draft rows (1..B-1) agree on the greedy tokens too.
    assert torch.equal(want[:, 1:].argmax(-1), got[:, 1:].argmax(-1))


@torch.no_grad()
def test_diffed_transformer_config_takes_qwen3_defaults(tmp_path, verifier_dir, shared_weights):
    """Older transformers write transformer_layer_config diffed against Qwen3Config's defaults: fields left out
    must take those defaults (e.g. rope_theta 10000, rms_norm_eps 1e-6), as speculators' reader does."""
    ref = speculators_model(verifier_dir, shared_weights)
    folder = tmp_path / "ckpt"
    ref.save_pretrained(str(folder))
    raw = json.loads((folder / "config.json").read_text())
    defaults = transformers.Qwen3Config().to_dict()
    raw["transformer_layer_config"] = {
        k: v for k, v in raw["transformer_layer_config"].items() if k == "model_type" or v != defaults.get(k)
    }
    assert "rope_parameters" not in raw["transformer_layer_config"]
    raw["sliding_window_non_causal"] = True  # bidirectional as speculators' model runs it (see VARIANTS)
    (folder / "config.json").write_text(json.dumps(raw))
    ours = load_dflash(folder, num_target_layers=TARGET_LAYERS)
    assert ours.config.rope_theta == 10000.0 and ours.config.rms_norm_eps == 1e-6
    taps, ids = inputs(2)
    assert (speculators_logits(ref, taps, ids) - ours_logits(ours, taps, ids, shared_weights)).abs().max() <= TOL


# ---------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory, verifier_dir, shared_weights):
    folder = tmp_path_factory.mktemp("good") / "ckpt"
    speculators_model(verifier_dir, shared_weights).save_pretrained(str(folder))
    return folder


def variant_ckpt(good_ckpt, tmp_path, edit_config=None, edit_tensors=None):
    return edited_checkpoint(good_ckpt, tmp_path / "bad", edit_config, edit_tensors)


def _set(path, value):
    def edit(raw):
        *parents, last = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return edit


_DELETE = object()

BAD_CONFIGS = {
    "no_mask_token": (_set("mask_token_id", None), "missing field 'mask_token_id'"),
    "no_aux_ids": (_set("aux_hidden_state_layer_ids", _DELETE), "missing field 'aux_hidden_state_layer_ids'"),
    "aux_id_zero": (_set("aux_hidden_state_layer_ids", [0, 3]), "'aux_hidden_state_layer_ids': id 0 out of range [1, 4]"),
    "aux_id_past_target": (_set("aux_hidden_state_layer_ids", [1, 5]), "'aux_hidden_state_layer_ids': id 5 out of range [1, 4]"),
    "aux_ids_duplicate": (_set("aux_hidden_state_layer_ids", [3, 3]), "duplicate ids"),
    "aux_ids_not_ints": (_set("aux_hidden_state_layer_ids", ["1", 3]), "expected a non-empty list of ints"),
    "dspark": (_set("speculators_model_type", "dspark"), "marks a DSpark checkpoint"),
    "eagle3": (_set("speculators_model_type", "eagle3"), "marks a EAGLE-3 checkpoint"),
    "algorithm": (_set("speculators_config.algorithm", "eagle3"), "'speculators_config.algorithm': expected 'dflash'"),
    "no_speculators_config": (_set("speculators_config", _DELETE), "missing field 'speculators_config'"),
    "no_transformer_config": (_set("transformer_layer_config", _DELETE), "missing field 'transformer_layer_config'"),
    "sample_from_anchor": (_set("sample_from_anchor", True), "'sample_from_anchor'"),
    "draft_vocab": (_set("draft_vocab_size", 64), "'draft_vocab_size': 64 != vocab_size 128"),
    "no_draft_vocab": (_set("draft_vocab_size", _DELETE), "missing field 'draft_vocab_size'"),
    "target_hidden": (_set("target_hidden_size", 96), "'target_hidden_size': 96 != draft hidden_size 64"),
    "mask_outside_vocab": (_set("mask_token_id", VOCAB), "'mask_token_id': 128 is outside the vocabulary"),
    "block_size": (_set("block_size", 1), "'block_size': must be >= 2"),
    "gelu": (_set("transformer_layer_config.hidden_act", "gelu"), "'hidden_act': only 'silu'"),
    "rope_yarn": (_set("transformer_layer_config.rope_parameters",
                       {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 64}),
                  "rope type 'yarn' is not supported"),
    "heads": (_set("transformer_layer_config.num_key_value_heads", 3), "'num_key_value_heads': 3 does not divide 4 heads"),
    "unknown_model_type": (_set("transformer_layer_config.model_type", "no_such_model"),
                           "'transformer_layer_config': transformers rejects it"),
    "not_an_object": (_set("transformer_layer_config", [1, 2]), "'transformer_layer_config': expected an object"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_speculators_config(good_ckpt, tmp_path, case):
    edit, message = BAD_CONFIGS[case]
    folder = variant_ckpt(good_ckpt, tmp_path, edit_config=edit)
    with pytest.raises(ValueError, match="^DFlash config") as info:
        load_dflash(folder, num_target_layers=TARGET_LAYERS)
    assert message in str(info.value) and "\n" not in str(info.value)


def _pop(name):
    return lambda t: t.pop(name)


def _add(name, shape):
    return lambda t: t.__setitem__(name, torch.zeros(shape))


BAD_TENSORS = {
    "fc_width": (_set("aux_hidden_state_layer_ids", [1, 2, 3]), None, "tensor 'fc.weight' has shape [64, 128], config implies [64, 192]"),
    "missing": (None, _pop("layers.1.mlp.up_proj.weight"), "missing tensor(s) ['layers.1.feed_forward.w3.weight']"),
    "extra_layer": (None, _add("layers.2.mlp.up_proj.weight", (96, 64)), "does not fit the config"),
    "t2d": (None, _add("t2d", (VOCAB,)), "tensor 't2d' marks a reduced draft vocabulary"),
    "markov": (None, _add("markov_head.weight", (8, 64)), "marks a DSpark checkpoint"),
    "unknown": (None, _add("mystery.weight", (3,)), "unexpected tensor 'mystery.weight'"),
}


@pytest.mark.parametrize("case", sorted(BAD_TENSORS))
def test_bad_speculators_tensors(good_ckpt, tmp_path, case):
    edit_config, edit_tensors, message = BAD_TENSORS[case]
    folder = variant_ckpt(good_ckpt, tmp_path, edit_config, edit_tensors)
    with pytest.raises(ValueError, match="^DFlash checkpoint") as info:
        load_dflash(folder, num_target_layers=TARGET_LAYERS)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_target_hidden_size_argument(good_ckpt):
    with pytest.raises(ValueError, match="'hidden_size': 64 != target hidden size 96"):
        load_dflash(good_ckpt, target_hidden_size=96)


def test_verifier_tensors_are_ignored(good_ckpt, tmp_path):
    """Older / converted speculators checkpoints may carry the verifier's embedding, head and final norm."""
    def add(t):
        t["embed_tokens.weight"] = torch.zeros(VOCAB, HIDDEN)
        t["lm_head.weight"] = torch.zeros(VOCAB, HIDDEN)
        t["verifier_norm.weight"] = torch.ones(HIDDEN)
    folder = variant_ckpt(good_ckpt, tmp_path, edit_tensors=add)
    model = load_dflash(folder, num_target_layers=TARGET_LAYERS)
    assert model.config.target_layer_ids == (0, 2)


def test_taps_unchecked_without_target_layer_count(good_ckpt, tmp_path):
    """Without the target's layer count only the lower bound (id >= 1) can be checked."""
    folder = variant_ckpt(good_ckpt, tmp_path, edit_config=_set("aux_hidden_state_layer_ids", [1, 9]))
    assert load_dflash(folder).config.target_layer_ids == (0, 8)
    folder0 = variant_ckpt(good_ckpt, tmp_path / "zero", edit_config=_set("aux_hidden_state_layer_ids", [0, 9]))
    with pytest.raises(ValueError, match="id 0 out of range >= 1"):
        load_dflash(folder0)
