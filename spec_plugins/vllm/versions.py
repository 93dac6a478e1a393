"""Which vLLM is this: the version-guard test shared by the plugin's patches (no vLLM import)."""

from __future__ import annotations

from spec_plugins.versions import major_minor


def version_in(found: str | None, versions: tuple[tuple[int, int], ...]) -> bool:
    """True when `found` (e.g. "0.32.0", "0.33.1+cpu") is one of the (major, minor) releases in `versions`."""
    return major_minor(found) in versions
