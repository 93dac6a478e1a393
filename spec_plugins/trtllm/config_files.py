"""Checking a whole config file under `configs/` (`spec-plugins trtllm check FILE...`), one-line errors.

A TensorRT-LLM YAML is read as the launcher reads it (`spec_plugins.trtllm.settings`) for every rule set its
`# engine:` line declares (`spec_plugins.trtllm.versions`); a vLLM JSON against every vLLM rule set, since
JSON cannot hold that comment and vLLM rejects unknown keys. Our `spec_plugins` sections are built too, so
bad option values fail here rather than at engine start. Apart from `versions.py` because it reads YAML
with `settings.py`, and `settings.py` checks what it reads against `versions.py`: the imports go
config_files -> settings -> versions, never back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spec_plugins.trtllm.settings import load_launch_config
from spec_plugins.trtllm.versions import (
    VLLM_RUNNER_VERSIONS,
    VSPEC,
    check_vllm_speculative_config,
    declared_trtllm_versions,
)


def split_vllm_file(doc: Any) -> tuple[dict, dict | None]:
    """(speculative_config, additional_config or None) of a configs/vllm file.

    Two shapes: a bare `--speculative-config` object, or `{"speculative_config": {...}, "additional_config":
    {...}}`, whose keys are `vllm.LLM`'s keyword arguments (`LLM(model, **json.load(f))`).
    """
    if isinstance(doc, dict) and VSPEC in doc:
        extra = set(doc) - {VSPEC, "additional_config"}
        if extra:
            raise ValueError(f"{sorted(extra)[0]}: unknown key (expected speculative_config, additional_config)")
        return doc[VSPEC], doc.get("additional_config")
    return doc, None


def check_config_file(path: str | Path) -> str:
    """Check one configs/trtllm YAML or configs/vllm JSON file; returns the engine range it was checked for.

    Our `spec_plugins` / `additional_config.spec_plugins` sections are also built (proposer and policy), so
    bad option values fail here rather than at engine start.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        if path.suffix in (".yaml", ".yml"):
            return _check_trtllm_file(path)
        if path.suffix == ".json":
            return _check_vllm_file(path)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(f"{path}:") else f"{path}: {msg}") from None
    raise ValueError(f"{path}: expected a .yaml (TensorRT-LLM) or .json (vLLM) file")


def _check_trtllm_file(path: Path) -> str:
    versions = declared_trtllm_versions(path.read_text())
    for version in versions:
        _, section = load_launch_config(path, version=version)
    if section is not None:
        section.build()
    return f"tensorrt-llm {', '.join(versions)}"


def _check_vllm_file(path: Path) -> str:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    spec, additional = split_vllm_file(doc)
    # A file must pass every version of one runner (0.32 and 0.33 on V1: custom_class; 0.34 on Model Runner V2: our
    # registered methods); vLLM's own methods usually pass both. The error reported is the newest runner's.
    passed, error = [], ""
    for group in VLLM_RUNNER_VERSIONS:
        try:
            for version in group:
                check_vllm_speculative_config(spec, version)
            passed += group
        except ValueError as exc:
            error = str(exc)
    if not passed:
        raise ValueError(error)
    if additional is not None:
        _check_additional_config(spec, additional)
    return f"vllm {', '.join(passed)}"


def _check_additional_config(spec: dict, additional: Any) -> None:
    from spec_plugins.vllm.settings import settings_from_additional_config

    if spec.get("method") != "custom_class" or not str(spec.get("model", "")).startswith("spec_plugins."):
        raise ValueError("additional_config: only read by our custom_class proposers (model spec_plugins.vllm.*)")
    fixed = {"spec_plugins.vllm.Ngram": "ngram", "spec_plugins.vllm.SuffixTree": "suffix_tree"}.get(spec["model"])
    settings_from_additional_config(additional, fixed_proposer=fixed).build()
