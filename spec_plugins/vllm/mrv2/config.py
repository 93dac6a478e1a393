"""The speculative methods spec-plugins registers on vLLM 0.34+ (Model Runner V2), one `SpeculatorConfig` each.

vLLM reads these in every process (front end, engine core, workers) and asks that they import nothing heavy:
the speculator is named by its qualified name, and our settings are parsed only when vLLM applies the options.

    {"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8,
     "speculator_options": {"proposer_options": {"max_depth": 32}, "policy": "adaptive"}}

`speculator_options` holds the same settings as the `spec_plugins` section of `--additional-config` on vLLM
0.32 / 0.33 (`spec_plugins.vllm.settings.VllmSettings`), less the batch-size schedule, which vLLM 0.34 applies to
every method itself (`num_speculative_tokens_per_batch_size` in `--speculative-config`). A bad option stops
start-up with one ValueError naming the field.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

logger = logging.getLogger("vllm.spec_plugins")

# Without num_speculative_tokens: as vLLM's own `suffix` (every slot is verified on Model Runner V2, so a deep
# default costs throughput at high concurrency).
DEFAULT_K = 8


class SpecPluginsSpeculatorConfig(SpeculatorConfig):
    """A model-free spec-plugins proposer drafting on the host (no draft model, no draft KV cache)."""

    base_method: ClassVar[str | None] = None  # standalone: not a variant of a built-in method
    proposer: ClassVar[str] = ""
    supported_options: ClassVar[frozenset[str]] = frozenset({"speculator_options"})
    # The host reads the token history: keep it in pinned host memory (vLLM's default), not dense on the device.
    prefer_dense_token_history: ClassVar[bool] = False
    # Confidences come from the proposer (its per-position estimates), not from draft logits.
    adaptive_verification_uses_draft_logits: ClassVar[bool] = False

    @classmethod
    def configure(cls, spec: "SpeculativeConfig") -> None:
        super().configure(spec)
        if spec.num_speculative_tokens is None:
            spec.num_speculative_tokens = DEFAULT_K
            logger.warning("spec-plugins: num_speculative_tokens defaulted to %d for %s", DEFAULT_K, spec.custom_method)

    @classmethod
    def apply_options(cls, spec: "SpeculativeConfig") -> None:
        from spec_plugins.vllm.settings import settings_from_speculator_options

        settings_from_speculator_options(spec.speculator_options, cls.proposer).build(
            "speculative_config.speculator_options")


class SuffixTreeConfig(SpecPluginsSpeculatorConfig):
    proposer = "suffix_tree"
    speculator_class = "spec_plugins.vllm.mrv2.speculator.SuffixTreeSpeculator"


class NgramConfig(SpecPluginsSpeculatorConfig):
    proposer = "ngram"
    speculator_class = "spec_plugins.vllm.mrv2.speculator.NgramSpeculator"

