"""Start TensorRT-LLM with one of our proposers: `spec-plugins trtllm serve MODEL --config FILE`.

`trtllm-serve --config FILE` cannot do this: a `UserProvided` drafter is a Python object and YAML cannot
carry one. This launcher reads the same YAML, builds `SpecPluginsDrafter` from its `spec_plugins:` section,
wraps it in `UserProvidedDecodingConfig` and serves the `LLM` through TensorRT-LLM's own `OpenAIServer`, as
`trtllm-serve`'s `launch_server` does. Files without the section (native decoding types) go through
unchanged, so one command serves every file in `configs/trtllm`.

TensorRT-LLM is imported only inside these functions: it needs CUDA even to import.
`spec-plugins trtllm check FILE...` validates configs without it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from spec_plugins.core import BindsModel
from spec_plugins.trtllm.config_files import check_config_file
from spec_plugins.trtllm.settings import Settings, load_launch_config
from spec_plugins.trtllm.versions import SPEC, TRTLLM_VERSIONS, trtllm_rule_set

INSTALL_HINT = (
    "TensorRT-LLM 1.2 or newer is needed for this command. It installs only on a Linux CUDA machine: "
    "`pip install tensorrt_llm` (the PyPI package downloads the real wheel from NVIDIA's index, "
    "https://pypi.nvidia.com; CUDA 13 and libopenmpi-dev required), or use the NGC container "
    "nvcr.io/nvidia/tensorrt-llm/release:1.2.x. Keep it apart from vLLM (their torch pins conflict). "
    "`spec-plugins trtllm check FILE` validates configs without it."
)


def import_trtllm() -> Any:
    """`tensorrt_llm`, or one RuntimeError saying what is needed and how it installs."""
    try:
        import tensorrt_llm
    except (ImportError, OSError) as exc:  # OSError: the package is there but libcuda/libmpi are not
        raise RuntimeError(f"tensorrt_llm is not importable ({exc}). {INSTALL_HINT}") from None
    version = getattr(tensorrt_llm, "__version__", None)
    if version is not None:
        try:
            trtllm_rule_set(version)
        except ValueError:
            raise RuntimeError(f"tensorrt_llm {version} is installed. {INSTALL_HINT}") from None
    return tensorrt_llm


def served_model_config(model: str) -> dict | None:
    """The served model's Hugging Face config: its folder's config.json, else what transformers resolves (a hub id
    already in the local cache); None where neither has it."""
    config_json = Path(model) / "config.json"
    if config_json.is_file():
        return json.loads(config_json.read_text())
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model).to_dict()
    except Exception:  # not a hub id, or not cached and no network: the caller says what to give instead
        return None


def build_llm(model: str, config_path: str | Path, **overrides: Any) -> Any:
    """`tensorrt_llm.LLM(model=model, ...)` configured by `config_path`; `overrides` win over the file.

    With a `spec_plugins:` section: our drafter as `UserProvidedDecodingConfig`, overlap scheduler off (the
    user-provided path needs the synchronous loop). Without: the file's keys as TensorRT-LLM reads them.
    """
    trtllm = import_trtllm()
    version = getattr(trtllm, "__version__", None)
    # The installed engine's rules decide; without a version string, those the file declares.
    kwargs, section = load_launch_config(config_path, version=version)
    kwargs.update(overrides)
    if section is None:
        return trtllm.LLM(model=model, **_llm_api_kwargs(kwargs))
    spec = kwargs.pop(SPEC)
    kwargs = _llm_api_kwargs(kwargs)
    kwargs[SPEC] = user_provided_config(spec, section, model)
    kwargs["disable_overlap_scheduler"] = True
    return trtllm.LLM(model=model, **kwargs)


def user_provided_config(spec: dict, section: Settings, model: str | None = None) -> Any:
    """`UserProvidedDecodingConfig` around a `SpecPluginsDrafter` built from the section.

    The executor reads `draft_len_schedule` and `max_concurrency` from the drafter object, and TensorRT-LLM
    validates them on the config, so both get them. The executor never hands a drafter the model's
    config, so a local model folder's config.json is bound here (the adaptive policy costs steps with it).
    """
    from tensorrt_llm.llmapi import UserProvidedDecodingConfig

    drafters = importlib.import_module("spec_plugins.trtllm.drafter")
    k = spec["max_draft_len"]
    drafter = drafters.SpecPluginsDrafter(
        max_draft_len=k,
        proposer=section.proposer,
        proposer_options=dict(section.proposer_options),
        policy=section.policy,
        policy_options=dict(section.policy_options),
        draft_len_schedule=spec.get("draft_len_schedule"),
        max_concurrency=spec.get("max_concurrency"),
    )
    served = served_model_config(model) if model else None
    if served is not None:
        if isinstance(drafter, BindsModel):
            drafter.bind_model(served)
    elif section.policy == "adaptive" and not {"profile", "model_config"} & set(section.policy_options):
        raise ValueError(f"spec_plugins.policy_options.model_config: the served model's config.json was not found "
                         f"for {model!r}; give a configs/models name or a config.json path")
    # Every other base field (acceptance gate, ...) passes through; decoding_type is the class itself.
    fields = {key: value for key, value in spec.items() if key != "decoding_type" and value is not None}
    # The executor never tells a drafter that a request ended; a resource manager frees its state then.
    manager = getattr(drafters, "SpecPluginsResourceManager", None)
    if manager is not None:
        fields["resource_manager"] = manager(drafter)
    return UserProvidedDecodingConfig(**fields, drafter=drafter)


def _llm_api_kwargs(kwargs: dict) -> dict:
    """Nested YAML mappings (kv_cache_config, speculative_config, ...) turned into TensorRT-LLM's config
    objects the way `trtllm-serve --config` does it, where this version has the helper."""
    try:
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
    except ImportError:
        return dict(kwargs)
    return update_llm_args_with_extra_dict({}, dict(kwargs))


def server_kwargs(server_cls: Any, llm: Any, model: str) -> dict:
    """`OpenAIServer` arguments for this version: the engine is `llm` in 1.2, `generator` on 1.3+; the
    routing options `launch_server` passes for a plain (non-disaggregated) server are None."""
    params = inspect.signature(server_cls.__init__).parameters
    engine = "generator" if "generator" in params else "llm"
    wanted: dict[str, Any] = {engine: llm, "model": model, "tool_parser": None, "server_role": None,
                              "metadata_server_cfg": None, "disagg_cluster_config": None,
                              "multimodal_server_config": None, "chat_template": None}
    return {name: value for name, value in wanted.items() if name in params}


def serve(model: str, config_path: str | Path, host: str = "localhost", port: int = 8000) -> None:
    """Serve `model` with the OpenAI-compatible API of `trtllm-serve`, configured by `config_path`."""
    llm = build_llm(model, config_path)
    from tensorrt_llm.serve import OpenAIServer

    server = OpenAIServer(**server_kwargs(OpenAIServer, llm, model))
    asyncio.run(server(host, port))


# ---- the `spec-plugins trtllm` command -----------------------------------------------------------------

def _cmd_serve(args: argparse.Namespace) -> None:
    serve(args.model, args.config, host=args.host, port=args.port)


def _cmd_check(args: argparse.Namespace) -> None:
    failed = 0
    for path in args.files:
        try:
            checked = check_config_file(path)
        except ValueError as exc:
            failed += 1
            print(f"FAIL {exc}")
        else:
            print(f"OK   {path} ({checked})")
    if failed:
        raise ValueError(f"{failed} of {len(args.files)} config(s) failed the check")


def add_trtllm_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`trtllm serve` and `trtllm check` under the `spec-plugins` command."""
    t = subparsers.add_parser("trtllm", help="TensorRT-LLM: serve with our drafters, check configs")
    sub = t.add_subparsers(dest="trtllm_command", required=True)

    s = sub.add_parser("serve", help="trtllm-serve's OpenAI server, with our drafter from the config's "
                       "spec_plugins: section (native configs work too)")
    s.add_argument("model", help="Hugging Face model folder or name")
    s.add_argument("--config", required=True, help="LLM-API YAML, e.g. configs/trtllm/suffix_tree-adaptive.yaml")
    s.add_argument("--host", default="localhost", help="default localhost")
    s.add_argument("--port", type=int, default=8000, help="default 8000")
    s.set_defaults(func=_cmd_serve)

    c = sub.add_parser("check", help="validate TensorRT-LLM YAML (and vLLM JSON) configs against the engine "
                       f"versions they declare ({', '.join(TRTLLM_VERSIONS)}); no engine needed")
    c.add_argument("files", nargs="+", help="config files")
    c.set_defaults(func=_cmd_check)
    return t
