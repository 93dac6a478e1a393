"""What an engine adapter is told to build: a proposer and a draft-length policy, by registry name.

vLLM reads it from `--additional-config '{"spec_plugins": {...}}'` (`spec_plugins.vllm.settings`),
TensorRT-LLM from the `spec_plugins:` section of its YAML (`spec_plugins.trtllm.settings`); both validate
it here, so a bad key or option reads the same in both engines, prefixed with where it came from.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic

from spec_plugins.registry import create_policy, create_proposer



class ProposerSettings(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    proposer: str = "suffix_tree"  # a registered proposer (`spec_plugins.proposers` entry points)
    proposer_options: dict[str, Any] = pydantic.Field(default_factory=dict)  # checked against its Options
    policy: str = "fixed"  # the draft-length policy: fixed (draft up to K) or adaptive
    policy_options: dict[str, Any] = pydantic.Field(default_factory=dict)  # checked against its Options

    def build(self, where: str):
        """The proposer and policy these settings name; a bad name or option is one ValueError
        prefixed with `where` (the section's path in the engine's config)."""
        try:
            return create_proposer(self.proposer, self.proposer_options), create_policy(self.policy, self.policy_options)
        except ValueError as exc:  # registry errors start with the field; say where it came from
            raise ValueError(f"{where}.{exc}") from None


S = TypeVar("S", bound=ProposerSettings)


def parse_settings(cls: type[S], section: dict, where: str) -> S:
    """`cls(**section)`; every problem is one ValueError naming the field under `where`."""
    try:
        return cls(**section)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ValueError(f"{where}.{loc}: unknown key (expected {', '.join(cls.model_fields)})") from None
        raise ValueError(f"{where}.{loc}: {err['msg']} (got {err.get('input')!r})") from None
