"""`--additional-config '{"spec_plugins": {...}}'`: what our vLLM proposers read, validated.

vLLM forbids unknown keys in `--speculative-config`, so every option of ours travels in
`additional_config`, which vLLM hands to the proposer's constructor inside the worker.
"""

from __future__ import annotations

import json
from typing import Any

from spec_plugins.settings import ProposerSettings, parse_settings

SECTION = "spec_plugins"
DEFAULT_PROPOSER = "ngram"


# vLLM 0.33 drops speculative_config.num_speculative_tokens_per_batch_size for custom_class on the V1 runner;
# the plugin's front-end check carries it here for our proposers (a user may also set it here directly).
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


class VllmSettings(ProposerSettings):
    proposer: str = DEFAULT_PROPOSER
    # [[first batch, last batch, K], ...]: vLLM's batch-size schedule, applied by our proposers themselves
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None

    def build(self, where: str = f"additional_config.{SECTION}"):
        return super().build(where)


def section_of(additional_config: Any) -> dict:
    """`additional_config[SECTION]` as a dict (either may arrive as JSON text); one ValueError naming the field."""
    if additional_config is None:
        additional_config = {}
    if isinstance(additional_config, str):
        try:
            additional_config = json.loads(additional_config) if additional_config.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"additional_config: expected a JSON object, got invalid JSON ({exc.msg})") from None
    if not isinstance(additional_config, dict):
        raise ValueError(f"additional_config: expected a JSON object, got {type(additional_config).__name__}")
    section = additional_config.get(SECTION, {})
    if isinstance(section, str):
        try:
            section = json.loads(section)
        except json.JSONDecodeError as exc:
            raise ValueError(f"additional_config.{SECTION}: expected a JSON object, got invalid JSON ({exc.msg})") from None
    if not isinstance(section, dict):
        raise ValueError(f"additional_config.{SECTION}: expected a JSON object, got {section!r}")
    return section


def settings_from_additional_config(additional_config: Any, fixed_proposer: str | None = None) -> VllmSettings:
    """Parse `additional_config[SECTION]`; every problem is one ValueError naming the field."""
    section = section_of(additional_config)
    if fixed_proposer is not None:
        named = section.get("proposer", fixed_proposer)
        if named != fixed_proposer:
            raise ValueError(
                f"additional_config.{SECTION}.proposer: this class serves {fixed_proposer!r}, got {named!r} "
                "(use spec_plugins.vllm.SpecPluginsProposer to choose the proposer by name)"
            )
        section = {**section, "proposer": fixed_proposer}
    return parse_settings(VllmSettings, section, f"additional_config.{SECTION}")


def block_policy(additional_config: Any) -> Any:
    """The spec-plugins policy for vLLM's own `dflash` method (our DSpark / DFlash draft models), or None when
    the section names vLLM's fixed draft length. The front-end check and the draft model both build it here."""
    from spec_plugins.registry import create_policy

    settings = settings_from_additional_config(additional_config)
    if "proposer" in settings.model_fields_set:
        raise ValueError(f"additional_config.{SECTION}.proposer: the DSpark checkpoint drafts under method 'dflash'; "
                         "name only a policy here (policy, policy_options)")
    if settings.policy == "fixed" and not settings.policy_options:
        return None  # vLLM's own draft length is already the fixed policy
    try:
        return create_policy(settings.policy, settings.policy_options)
    except ValueError as exc:  # registry errors start with the field
        raise ValueError(f"additional_config.{SECTION}.{exc}") from None
