"""Which vLLM is this: the version-guard test shared by the plugin's patches (no vLLM import)."""

from __future__ import annotations

import re


def version_in(found: str | None, versions: tuple[tuple[int, int], ...]) -> bool:
    """True when `found` (e.g. "0.32.0", "0.33.1+cpu") is one of the (major, minor) releases in `versions`."""
    match = re.match(r"(\d+)\.(\d+)", found or "")
    return bool(match) and (int(match[1]), int(match[2])) in versions
