"""Random-weight Llama/Qwen3 test models of a few hundred kB, and the small local tokenizer they use.

:func:`build_tiny_model` builds in about a second, without any model hub. These models exercise the
plumbing (loading, shapes, token ids, the proposer API) in unit and integration tests, where only
correctness -- not text quality -- is checked; their acceptance rates mean nothing (real-model
numbers come from SmolLM2, `spec_plugins.models`). Builds are idempotent and atomic, with the
helpers of `spec_plugins.models`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spec_plugins.models import (
    _FORMAT_VERSION,
    _add_torch_dtype_alias,
    _make_tmp_dir,
    _publish,
    _QuietTransformers,
    _read_json,
    _set_tokenizer_config,
    _write_json,
    _write_special_tokens_map,
    smollm2_path,
)

if TYPE_CHECKING:  # heavy imports stay lazy: importing spec_plugins must not import torch
    from transformers import PreTrainedTokenizerFast

__all__ = ["build_local_tokenizer", "build_tiny_model"]

_TINY_ARGS_FILE = "spec_plugins_build.json"

# A plain-text template for the local tokenizer (it has no chat special tokens), so that
# `apply_chat_template` and vLLM's `LLM.chat` work on tiny models too. It starts with BOS because
# chat prompts are tokenised without special tokens, and plain prompts get BOS prepended.
_LOCAL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

# vLLM's CPU attention kernels only accept these head sizes (GPU kernels accept all of them too);
# a tiny model with, e.g., hidden 64 / 4 heads = head_dim 16 would fail to load in vLLM-CPU.
_VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


# --------------------------------------------------------------------------------------------
# local byte-level BPE tokenizer

_LOCAL_SPECIALS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

# Small mixed English + Python corpus: enough for a few hundred merges that make tokens span
# common words and code fragments, so token counts of test prompts look roughly like a real
# tokenizer's. Kept inline (not read from the stdlib) so the vocabulary is identical on every
# Python version.
_CORPUS = [
    """Speculative decoding speeds up text generation from large language models. A small and
fast draft model proposes several tokens ahead, and the large target model checks all of
them in a single forward pass. Tokens that the target model agrees with are accepted, the
first token it disagrees with is replaced by its own choice, and the rest of the draft is
thrown away. Because every accepted token is exactly the token the target model would have
produced, the output does not change; only the time it takes to produce it does.""",
    """The quick brown fox jumps over the lazy dog. The dog sleeps in the sun while the fox
runs into the forest. In the morning the farmer walks to the market to sell bread, milk,
cheese and apples. She asks the baker about the weather, and he says that it will rain in
the afternoon, so she should come home early. Children play in the park after school, and
their parents talk about work, the news and the price of food.""",
    """What is the capital of France? The capital of France is Paris. What is the capital of
Germany? The capital of Germany is Berlin. The largest ocean on Earth is the Pacific Ocean,
and the highest mountain is Mount Everest. Water boils at one hundred degrees Celsius at sea
level. There are seven days in a week, twelve months in a year, and about three hundred and
sixty five days in a year.""",
    """User: Can you help me write a function that sorts a list of numbers?
Assistant: Of course. Here is a simple function in Python that returns a new sorted list.
User: Thank you! Can you also explain how it works?
Assistant: The function uses the built-in sorted function, which compares the items and
returns them in increasing order. The original list is not changed.""",
    '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    result = []
    a, b = 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value

    def __repr__(self) -> str:
        return f"Counter(value={self.value})"


def read_lines(path):
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            yield line
''',
    '''import json
import os
from pathlib import Path


def load_config(path: str | None = None) -> dict:
    if path is None:
        path = os.environ.get("CONFIG_PATH", "config.json")
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object in {path}, got {type(data).__name__}")
    return data


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


if __name__ == "__main__":
    config = load_config()
    print(json.dumps(config, indent=2, sort_keys=True))
''',
    """for (int i = 0; i < n; i++) {
    sum += values[i] * weights[i];
}
if (sum > threshold) {
    return true;
} else {
    return false;
}
SELECT name, COUNT(*) FROM users WHERE active = 1 GROUP BY name ORDER BY name;
$ pip install --upgrade numpy torch transformers
$ python -m pytest tests -q
0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14 2.718 0.5 -1 1e-5
{"id": 42, "name": "example", "tags": ["a", "b", "c"], "enabled": true, "ratio": 0.25}""",
]


def build_local_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 512) -> "PreTrainedTokenizerFast":
    """Train a small byte-level BPE tokenizer on a built-in corpus and save it in HF format.

    Byte-level means any text round-trips exactly (no unknown tokens), which is what the tiny
    test models need; ``vocab_size`` (>= 260: 256 bytes + 4 special tokens) sets how many merges
    are learned. Special tokens: ``<unk>``=0, ``<s>``=1 (BOS, prepended to every encoding like
    Llama tokenizers do), ``</s>``=2 (EOS), ``<pad>``=3. Training is deterministic, so the same
    ``vocab_size`` always gives the same ids. The folder holds tokenizer.json,
    tokenizer_config.json, special_tokens_map.json and chat_template.jinja, loadable by
    ``AutoTokenizer.from_pretrained`` and by vLLM.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = list(_LOCAL_SPECIALS.values())
    n_min = 256 + len(specials)
    if vocab_size < n_min:
        raise ValueError(f"vocab_size must be at least {n_min} (256 bytes + {len(specials)} special tokens)")

    tok = Tokenizer(models.BPE(unk_token=_LOCAL_SPECIALS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    bos = _LOCAL_SPECIALS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tok.token_to_id(bos))],
    )

    return _save_tokenizer(tok, out_dir, add_bos_token=True)


# --------------------------------------------------------------------------------------------
# tiny random-weight models

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def build_word_tokenizer(out_dir: str | os.PathLike, vocab_size: int) -> "PreTrainedTokenizerFast":
    """A word-level tokenizer of exactly ``vocab_size`` ids: the four special tokens of
    :func:`build_local_tokenizer` (same ids), then words ``w4`` ... ``w{vocab_size-1}``, split on
    whitespace. For targets with a vocabulary small enough that a sampled token's distribution can be
    tested cell by cell."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = list(_LOCAL_SPECIALS.values())
    if vocab_size < len(specials) + 2:
        raise ValueError(f"vocab_size must be at least {len(specials) + 2}, got {vocab_size}")
    vocab = {t: i for i, t in enumerate(specials)} | {f"w{i}": i for i in range(len(specials), vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=_LOCAL_SPECIALS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return _save_tokenizer(tok, out_dir, add_bos_token=False)


def _save_tokenizer(tok: Any, out_dir: str | os.PathLike, add_bos_token: bool) -> "PreTrainedTokenizerFast":
    """Write a `tokenizers.Tokenizer` as a Hugging Face tokenizer folder with our specials and chat template."""
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, **_LOCAL_SPECIALS)
    hf_tok.chat_template = _LOCAL_CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)
    _set_tokenizer_config(out, tokenizer_class="PreTrainedTokenizerFast", add_bos_token=add_bos_token)
    _write_special_tokens_map(out, dict(_LOCAL_SPECIALS))
    return hf_tok


def _default_head_dim(hidden_size: int, num_heads: int) -> int:
    """``hidden_size // num_heads`` if vLLM-CPU supports it, else the next supported size."""
    natural = max(1, hidden_size // num_heads)
    for size in _VLLM_CPU_HEAD_SIZES:
        if size >= natural:
            return size
    return natural


def build_tiny_model(
    out_dir: str | os.PathLike,
    arch: Literal["llama", "qwen3"] = "llama",
    tokenizer: Literal["local", "smollm2", "words"] = "local",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: str = "float32",
    head_dim: int | None = None,
    vocab_size: int = 32,
    logit_scale: float = 1.0,
) -> Path:
    """Build (or reuse) a random-weight ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` folder.

    The model is for plumbing tests: it loads in transformers and vLLM, its vocabulary matches
    its tokenizer (``tokenizer="local"``: the 512-token BPE from :func:`build_local_tokenizer`;
    ``"smollm2"``: SmolLM2's 49152-token tokenizer, so prompts tokenise exactly as for
    :func:`smollm2_path`, which is converted first if needed), and the config's bos/eos/pad ids
    are the tokenizer's; ``"words"``: :func:`build_word_tokenizer` with ``vocab_size`` ids, for
    statistical tests of sampling). Weights use the default initialisation from ``seed``, so the output
    is deterministic but meaningless; ``logit_scale`` multiplies the LM head (a random model's next-token
    distribution is nearly uniform; scaled, it is peaked, so drafts are sometimes accepted when sampling).

    ``head_dim`` defaults to ``hidden_size // num_heads`` rounded up to a head size vLLM's CPU
    attention supports (at least 32), which is why the defaults give q/k/v projections wider
    than ``hidden_size``. The folder is reused when it was built with the same arguments
    (recorded in ``spec_plugins_build.json``); otherwise it is rebuilt. A non-empty ``out_dir``
    not made by this function is never deleted: ``FileExistsError`` is raised instead.
    """
    if arch not in ("llama", "qwen3"):
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    if tokenizer not in ("local", "smollm2", "words"):
        raise ValueError(f"tokenizer must be 'local', 'smollm2' or 'words', got {tokenizer!r}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    if head_dim is None:
        head_dim = _default_head_dim(hidden_size, num_heads)

    target = Path(out_dir)
    args = {
        "format": _FORMAT_VERSION,
        "arch": arch,
        "tokenizer": tokenizer,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
        "seed": seed,
        "dtype": dtype,
    }
    if tokenizer == "words":
        args["vocab_size"] = vocab_size
    if logit_scale != 1.0:
        args["logit_scale"] = logit_scale

    def is_valid(p: Path) -> bool:
        return _read_json(p / _TINY_ARGS_FILE) == args

    if is_valid(target):
        return target
    if target.exists() and any(target.iterdir()) and _read_json(target / _TINY_ARGS_FILE) is None:
        raise FileExistsError(f"{target} exists and was not built by build_tiny_model; refusing to overwrite it")

    tmp = _make_tmp_dir(target)
    try:
        _build_tiny(tmp, args)
        _write_json(tmp / _TINY_ARGS_FILE, args)  # last: marks the folder complete
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _publish(tmp, target, is_valid)


def _build_tiny(out: Path, a: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a["tokenizer"] == "local":
        build_local_tokenizer(out)
    elif a["tokenizer"] == "words":
        build_word_tokenizer(out, a["vocab_size"])
    else:
        src = smollm2_path(progress=sys.stderr.isatty())
        for name in _TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, out / name)
    _set_tokenizer_config(out, model_max_length=a["max_position_embeddings"])
    with _QuietTransformers():
        tok = AutoTokenizer.from_pretrained(out)

    common = dict(
        vocab_size=len(tok),
        hidden_size=a["hidden_size"],
        intermediate_size=a["intermediate_size"],
        num_hidden_layers=a["num_layers"],
        num_attention_heads=a["num_heads"],
        num_key_value_heads=a["num_kv_heads"],
        head_dim=a["head_dim"],
        max_position_embeddings=a["max_position_embeddings"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    if a["arch"] == "llama":
        from transformers import LlamaConfig

        config = LlamaConfig(**common)
        config.architectures = ["LlamaForCausalLM"]
    else:
        from transformers import Qwen3Config

        config = Qwen3Config(**common)
        config.architectures = ["Qwen3ForCausalLM"]

    torch_dtype = getattr(torch, a["dtype"])
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's RNG stream
        torch.manual_seed(a["seed"])
        with _QuietTransformers():
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if a.get("logit_scale", 1.0) != 1.0:
            with torch.no_grad():
                model.lm_head.weight.mul_(a["logit_scale"])
    model = model.to(torch_dtype)
    model.config.dtype = a["dtype"]
    with _QuietTransformers():
        model.save_pretrained(out)
    _add_torch_dtype_alias(out / "config.json")
