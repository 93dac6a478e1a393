"""vLLM adapter: `custom_class` proposers. Point `--speculative-config`'s "model" at one of these.

`spec_plugins.vllm.plugin:register` is the package's `vllm.general_plugins` entry point: it hands
the runner's request ids and finished requests to these proposers (see plugin.py).
"""

from spec_plugins.vllm.proposer import Ngram, SpecPluginsProposer, SuffixTree

__all__ = ["Ngram", "SpecPluginsProposer", "SuffixTree"]
