"""vLLM adapter: `custom_class` proposers. Point `--speculative-config`'s "model" at one of these."""

from spec_plugins.vllm.proposer import Ngram, SpecPluginsProposer

__all__ = ["Ngram", "SpecPluginsProposer"]
