"""Proposers and policies by name.

Built-in and third-party proposers are both found through the entry-point group
`spec_plugins.proposers` (name -> class). A third-party package declares, in its pyproject.toml:

    [project.entry-points."spec_plugins.proposers"]
    my_drafter = "my_pkg.drafter:MyDrafter"

A proposer class may define `Options`, a pydantic model of its keyword options; the registry
validates user options against it so a typo fails with the field's name instead of deep inside.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable

import pydantic

from spec_plugins.core import Configurable, DraftLengthPolicy, FixedLength, Proposer

PROPOSER_GROUP = "spec_plugins.proposers"

_proposers: dict[str, Callable[..., Proposer]] = {}
# Policies outside core.py are named by "module:attribute" and imported on first use.
_policies: dict[str, Any] = {"fixed": FixedLength, "adaptive": "spec_plugins.policy.adaptive:AdaptiveLength"}
_entry_points_loaded = False


def register_proposer(name: str, factory: Callable[..., Proposer]) -> None:
    """Register a proposer factory (usually the class) under `name`; later registrations win."""
    if not name or not isinstance(name, str):
        raise ValueError(f"proposer name: expected a non-empty string, got {name!r}")
    _proposers[name] = factory


def register_policy(name: str, factory: Callable[..., DraftLengthPolicy]) -> None:
    if not name or not isinstance(name, str):
        raise ValueError(f"policy name: expected a non-empty string, got {name!r}")
    _policies[name] = factory


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=PROPOSER_GROUP):
        # Entries registered in code take precedence over installed metadata.
        if ep.name not in _proposers:
            _proposers[ep.name] = _LazyEntryPoint(ep)


class _LazyEntryPoint:
    """Imports the entry point's target on first use, so listing names stays cheap."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self._target: Any = None

    def load(self) -> Any:
        if self._target is None:
            self._target = self.ep.load()
        return self._target

    def __call__(self, **options: Any) -> Any:
        return self.load()(**options)


def available_proposers() -> list[str]:
    _load_entry_points()
    return sorted(_proposers)


def available_policies() -> list[str]:
    return sorted(_policies)


def proposer_class(name: str) -> Callable[..., Proposer]:
    _load_entry_points()
    if name not in _proposers:
        raise ValueError(f"proposer: unknown name {name!r}; expected one of: {', '.join(available_proposers())}")
    factory = _proposers[name]
    return factory.load() if isinstance(factory, _LazyEntryPoint) else factory


def validated_options(factory: Callable[..., Any], options: dict[str, Any], field: str) -> dict[str, Any]:
    """`options` checked against the factory's declared Options (if any); a bad one is one ValueError under `field`."""
    model = factory.Options if isinstance(factory, Configurable) else None
    if model is None:
        return options
    try:
        return model(**options).model_dump(by_alias=True)
    except pydantic.ValidationError as exc:
        raise ValueError(_one_line(exc, field)) from None


def _one_line(exc: pydantic.ValidationError, prefix: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        msg = "unknown option" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg} (got {err.get('input')!r})")
    return "; ".join(parts)


def create_proposer(name: str, options: dict[str, Any] | None = None) -> Proposer:
    factory = proposer_class(name)
    return factory(**validated_options(factory, dict(options or {}), f"proposer_options[{name}]"))


def create_policy(name: str, options: dict[str, Any] | None = None) -> DraftLengthPolicy:
    if name not in _policies:
        raise ValueError(f"policy: unknown name {name!r}; expected one of: {', '.join(available_policies())}")
    factory = _policies[name]
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = _policies[name] = getattr(importlib.import_module(module), attr)
    return factory(**validated_options(factory, dict(options or {}), "policy_options"))
