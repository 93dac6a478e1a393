"""Engine version strings as (major, minor): the one parser the vLLM and TensorRT-LLM version guards share."""

from __future__ import annotations

import re

_MAJOR_MINOR = re.compile(r"^\s*(\d+)\.(\d+)")


def major_minor(version: object) -> tuple[int, int] | None:
    """(major, minor) of "0.32.0", "0.33.1+cpu", "1.3.0rc5", ...; None when it does not start like that."""
    m = _MAJOR_MINOR.match(str(version or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None
