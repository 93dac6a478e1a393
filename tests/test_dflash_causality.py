"""Draft-layer causality in the speculators format, read and written as vLLM 0.32 serves it.

vLLM's `update_dflash` turns `sliding_window_non_causal` into `dflash_config.causal = not value` (absent:
true, so bidirectional) and `_dflash_layer_causal` applies that to every draft layer; for DSpark the field
is ignored and causality comes from `transformer_layer_config` (is_causal, else sliding layers). The writer
must pick the value that makes vLLM run the drafter as trained, and our loaders must read what vLLM runs.
Where vLLM is installed its own config code is the oracle (config dicts only: no GPU, no engine).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("transformers")

from spec_plugins.proposers.dflash import DFlashConfig, DFlashDraftModel, load_dflash  # noqa: E402
from spec_plugins.proposers.dflash.export import save_speculators, sliding_window_non_causal  # noqa: E402
from spec_plugins.proposers.dflash.loader import speculators_config, speculators_layer_causal  # noqa: E402
from spec_plugins.proposers.dspark.loader import load_dspark  # noqa: E402

LAYERS, TARGET_LAYERS = 3, 4
DRAFTERS = Path(__file__).resolve().parent.parent / "benchmarks" / "drafters"
TARGET = {"max_position_embeddings": 256, "architectures": ["Qwen3ForCausalLM"], "_name_or_path": "tiny-target"}


def zlab_raw(**extra):
    return {"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": LAYERS,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64,
            "block_size": 4, "num_target_layers": TARGET_LAYERS,
            "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2]}, **extra}


def drafter(layer_causal):
    config = dataclasses.replace(DFlashConfig.from_dict(zlab_raw()), layer_causal=tuple(layer_causal))
    torch.manual_seed(0)
    return DFlashDraftModel(config).eval()


def speculators_raw(kind="dflash", **top):
    """A minimal speculators config.json for the config readers (no tensors needed)."""
    raw = {"speculators_model_type": kind, "speculators_config": {"algorithm": kind},
           "aux_hidden_state_layer_ids": [1, 3], "mask_token_id": 3, "draft_vocab_size": 64, "block_size": 4,
           "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 48,
                                        "num_hidden_layers": LAYERS, "num_attention_heads": 2,
                                        "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64}}
    raw.update(top)
    return raw


BIDIRECTIONAL, CAUSAL, MIXED = (False,) * LAYERS, (True,) * LAYERS, (True, False, False)


# ------------------------------------------------------------------------------------------------ writer


@pytest.mark.parametrize("layer_causal, value", [(BIDIRECTIONAL, True), (CAUSAL, False)])
def test_export_writes_the_field_vllm_reads(tmp_path, layer_causal, value):
    out = save_speculators(tmp_path / "ckpt", drafter(layer_causal), target_config=TARGET, kind="dflash")
    raw = json.loads((out / "config.json").read_text())
    assert raw["sliding_window_non_causal"] is value
    assert "is_causal" not in raw["transformer_layer_config"]


def test_export_refuses_mixed_causality(tmp_path):
    with pytest.raises(ValueError, match="^save_speculators: field 'sliding_window_non_causal' cannot express") as info:
        save_speculators(tmp_path / "ckpt", drafter(MIXED), target_config=TARGET, kind="dflash")
    assert "every draft layer" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "ckpt").exists()


def test_export_dspark_bidirectional_only(tmp_path):
    out = save_speculators(tmp_path / "ok", drafter(BIDIRECTIONAL), target_config=TARGET, kind="dspark")
    assert json.loads((out / "config.json").read_text())["sliding_window_non_causal"] is True
    with pytest.raises(ValueError, match="cannot make a DSpark draft causal"):
        save_speculators(tmp_path / "causal", drafter(CAUSAL), target_config=TARGET, kind="dspark")
    with pytest.raises(ValueError, match="cannot express"):
        sliding_window_non_causal(MIXED, "dspark")


def test_export_still_refuses_windows(tmp_path):
    model = drafter(BIDIRECTIONAL)
    model.config = dataclasses.replace(model.config, layer_window=(None, 64, None))
    with pytest.raises(ValueError, match="sliding-window draft layers are not written"):
        save_speculators(tmp_path / "ckpt", model, target_config=TARGET)


# ------------------------------------------------------------------------------------------------ reader


@pytest.mark.parametrize("top, want", [
    ({"sliding_window_non_causal": True}, BIDIRECTIONAL),
    ({"sliding_window_non_causal": False}, CAUSAL),  # full-attention layers too, as vLLM runs them
    ({}, BIDIRECTIONAL),  # absent: vLLM's default is non-causal
    ({"sliding_window_non_causal": None}, CAUSAL),  # vLLM: not None
])
def test_loader_reads_the_field_for_every_layer(top, want):
    assert speculators_config(speculators_raw(**top)).layer_causal == want


def test_loader_applies_the_field_to_sliding_and_full_layers():
    raw = speculators_raw(sliding_window_non_causal=False)
    raw["transformer_layer_config"].update(use_sliding_window=True, sliding_window=64,
                                           layer_types=["full_attention", "sliding_attention", "full_attention"])
    config = speculators_config(raw)
    assert config.layer_causal == CAUSAL and config.layer_window == (None, 64, None)
    raw["sliding_window_non_causal"] = True
    assert speculators_config(raw).layer_causal == BIDIRECTIONAL


@pytest.mark.parametrize("is_causal", [True, False])
def test_loader_is_causal_overrides_the_field(is_causal):
    raw = speculators_raw(sliding_window_non_causal=is_causal)  # the opposite of is_causal
    raw["transformer_layer_config"]["is_causal"] = is_causal
    assert speculators_config(raw).layer_causal == (is_causal,) * LAYERS


def test_loader_refuses_non_boolean_field():
    with pytest.raises(ValueError, match="^DFlash config field 'sliding_window_non_causal': expected true or false"):
        speculators_config(speculators_raw(sliding_window_non_causal="false"))


def test_dspark_reader_ignores_the_field():
    raw = speculators_raw("dspark", sliding_window_non_causal=False)
    assert speculators_layer_causal(raw, LAYERS, kind="dspark") == BIDIRECTIONAL
    raw["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention", "full_attention"]
    assert speculators_layer_causal(raw, LAYERS, kind="dspark") == MIXED
    raw["transformer_layer_config"]["is_causal"] = True
    assert speculators_layer_causal(raw, LAYERS, kind="dspark") == CAUSAL


@pytest.mark.parametrize("extra, want", [
    ({}, BIDIRECTIONAL),
    ({"is_causal": True}, CAUSAL),
    ({"dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2], "causal": True}}, CAUSAL),
    ({"use_sliding_window": True, "sliding_window": 64,
      "layer_types": ["sliding_attention", "full_attention", "full_attention"]}, MIXED),
])
def test_zlab_reader(extra, want):
    assert DFlashConfig.from_dict(zlab_raw(**extra)).layer_causal == want


# ------------------------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize("layer_causal", [BIDIRECTIONAL, CAUSAL])
def test_round_trip_keeps_causality(tmp_path, layer_causal):
    model = drafter(layer_causal)
    out = save_speculators(tmp_path / "ckpt", model, target_config=TARGET, kind="dflash")
    back = load_dflash(out, num_target_layers=TARGET_LAYERS)
    assert back.config.layer_causal == layer_causal
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)


def test_round_trip_dspark(tmp_path):
    out = save_speculators(tmp_path / "ckpt", drafter(BIDIRECTIONAL), target_config=TARGET, kind="dspark")
    back, markov, confidence = load_dspark(out, num_target_layers=TARGET_LAYERS)
    assert back.config.layer_causal == BIDIRECTIONAL and markov is None and confidence is None


# ------------------------------------------------------------------------------------------------ checked-in drafters


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in DRAFTERS.glob("*/config.json")))
def test_checked_in_drafter_configs_describe_the_trained_model(folder):
    """The repository's drafters are trained by train-drafter, whose draft_config has no causal layers."""
    raw = json.loads((DRAFTERS / folder / "config.json").read_text())
    training = json.loads((DRAFTERS / folder / "training.json").read_text())
    assert raw["speculators_model_type"] == training["kind"]
    assert raw["sliding_window_non_causal"] is True
    assert speculators_layer_causal(raw, raw["transformer_layer_config"]["num_hidden_layers"], kind=training["kind"]) \
        == (False,) * training["settings"]["layers"]


# ------------------------------------------------------------------------------------------------ vLLM as oracle


def _exported(tmp_path, layer_causal, kind="dflash"):
    out = save_speculators(tmp_path / kind, drafter(layer_causal), target_config=TARGET, kind=kind)
    return json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("layer_causal", [BIDIRECTIONAL, CAUSAL])
def test_vllm_update_dflash_agrees_with_our_loader(tmp_path, layer_causal):
    algos = pytest.importorskip("vllm.transformers_utils.configs.speculators.algos")
    raw = _exported(tmp_path, layer_causal)
    pre = copy.deepcopy(raw["transformer_layer_config"])
    algos.update_dflash(config_dict=raw, pre_trained_config=pre)
    ours = speculators_config(raw).layer_causal
    assert ours == layer_causal
    assert (pre["dflash_config"]["causal"],) * LAYERS == ours
    assert pre["dflash_config"]["target_layer_ids"] == list(drafter(layer_causal).config.target_layer_ids)


@pytest.mark.parametrize("kind, raw", [
    ("dflash", speculators_raw(sliding_window_non_causal=True)),
    ("dflash", speculators_raw(sliding_window_non_causal=False)),
    ("dflash", speculators_raw()),
    ("dflash", speculators_raw(sliding_window_non_causal=None)),
    ("dspark", speculators_raw("dspark", sliding_window_non_causal=False)),
    ("dspark", speculators_raw("dspark", transformer_layer_config={
        **speculators_raw()["transformer_layer_config"], "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention", "full_attention"]})),
])
def test_vllm_per_layer_causality_matches_our_reader(kind, raw):
    """vLLM's full path: SpeculatorsConfig from the dict, then qwen3_dflash's per-layer resolver."""
    pytest.importorskip("vllm.transformers_utils.configs.speculators.algos")
    try:
        from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal
        from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
    except ImportError as e:  # pragma: no cover - depends on the vLLM build
        pytest.skip(f"vLLM's DFlash model module does not import here: {e}")
    raw = dict(raw, markov_rank=0) if kind == "dspark" else raw
    hf = SpeculatorsConfig(**SpeculatorsConfig.extract_transformers_pre_trained_config(copy.deepcopy(raw)))
    theirs = tuple(_dflash_layer_causal(hf, i) for i in range(LAYERS))
    assert speculators_layer_causal(raw, LAYERS, kind=kind) == theirs


@pytest.mark.parametrize("extra", [
    {},
    {"is_causal": True},
    {"dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2], "causal": True}},
    {"use_sliding_window": True, "sliding_window": 64,
     "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
    {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1},  # derived layer_types
])
def test_vllm_zlab_causality_matches_our_reader(extra):
    """z-lab layout: vLLM wraps the Qwen3Config in an EAGLEConfig and resolves each layer the same way."""
    pytest.importorskip("vllm.transformers_utils.configs.eagle")
    try:
        from vllm.model_executor.models.qwen3_dflash import _dflash_layer_causal
        from vllm.transformers_utils.configs.eagle import EAGLEConfig
    except ImportError as e:  # pragma: no cover - depends on the vLLM build
        pytest.skip(f"vLLM's DFlash model module does not import here: {e}")
    from transformers import Qwen3Config

    raw = zlab_raw(architectures=["DFlashDraftModel"], **extra)
    hf = EAGLEConfig(Qwen3Config(**copy.deepcopy(raw)), method="dflash")
    assert DFlashConfig.from_dict(raw).layer_causal == tuple(_dflash_layer_causal(hf, i) for i in range(LAYERS))
