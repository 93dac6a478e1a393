"""The `spec_plugins:` section of a TensorRT-LLM LLM-API YAML, and reading such a file for our launcher.

TensorRT-LLM's YAML (`trtllm-serve --config`) cannot carry a drafter object, so a file that wants one of
our proposers says `speculative_config.decoding_type: UserProvided` and names it in a section of its own:

    speculative_config: {decoding_type: UserProvided, max_draft_len: 8, draft_len_schedule: {1: 8, 16: 4}}
    spec_plugins:
      proposer: suffix_tree
      proposer_options: {max_depth: 24}
      policy: adaptive

`max_draft_len`, `draft_len_schedule` and `max_concurrency` stay in `speculative_config`, where TensorRT-LLM
reads them; everything else in the file is TensorRT-LLM's and is passed on untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from spec_plugins.settings import ProposerSettings, parse_settings
from spec_plugins.trtllm.versions import SECTION, check_trtllm_config, declared_trtllm_versions


class Settings(ProposerSettings):
    def build(self, where: str = SECTION):
        return super().build(where)


def parse_section(section: Any) -> Settings:
    """Validate the `spec_plugins:` mapping; every problem is one ValueError naming the field."""
    if not isinstance(section, dict):
        raise ValueError(f"{SECTION}: expected a mapping, got {section!r}")
    return parse_settings(Settings, section, SECTION)


def read_yaml(path: str | Path) -> tuple[dict, str]:
    """(document, raw text) of a YAML config; one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    text = path.read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}: not valid YAML{where}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping of LLM-API options, got {type(doc).__name__}")
    return doc, text


def load_launch_config(path: str | Path, version: str | None = None) -> tuple[dict, Settings | None]:
    """Read a TensorRT-LLM YAML: (TensorRT-LLM's own keys, our section or None), checked for `version`.

    `version` defaults to the one the file declares (`# engine: tensorrt-llm>=1.2`; none: 1.2). The returned
    dict is the file minus `spec_plugins:`; `speculative_config` in it still says `UserProvided` when our
    section is present, and the launcher replaces it with the drafter config.
    """
    doc, text = read_yaml(path)
    check_trtllm_config(doc, version or declared_trtllm_versions(text)[0])
    trtllm_kwargs = {k: v for k, v in doc.items() if k != SECTION}
    section = parse_section(doc[SECTION]) if SECTION in doc else None
    return trtllm_kwargs, section
