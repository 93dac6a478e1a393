"""TensorRT-LLM adapter: a `UserProvided` drafter serving any registered spec-plugins proposer.

    from spec_plugins.trtllm import SpecPluginsDrafter
    drafter = SpecPluginsDrafter(max_draft_len=4, proposer="suffix_tree", policy="adaptive", ...)
    LLM(model, speculative_config=UserProvidedDecodingConfig(max_draft_len=4, drafter=drafter),
        disable_overlap_scheduler=True)

Importing this package does not import TensorRT-LLM (it needs CUDA to import); the drafter class is
built against TensorRT-LLM's `Drafter` on first use (see drafter.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SpecPluginsDrafter", "SpecPluginsResourceManager", "drafter_class", "resource_manager_class"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from spec_plugins.trtllm import drafter

        return getattr(drafter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
