"""vLLM adapters. Which files serve which vLLM:

- every version: `plugin.py` (the `vllm.general_plugins` entry point: picks the path by version), `patches.py` (every
  vLLM name we replace or rely on, per version), `settings.py` (our settings, one model for every version).
- vLLM 0.34+, Model Runner V2: `mrv2/` (our registered methods: `config.py`, `speculator.py`; `stream_order.py` for
  `host_drafting: stream`).
- vLLM 0.32 / 0.33, the V1 runner: `proposer.py` (the `custom_class` proposers exported here: point
  `--speculative-config`'s "model" at one of them), `drafters.py` (our DFlash / DSpark draft models), and the
  mends `cpu_sampler_fix.py`, `min_tokens_fix.py`; `_rows.cpp` (the V1 runner's row arguments).
"""

from spec_plugins.vllm.proposer import Ngram, SpecPluginsProposer, SuffixTree

__all__ = ["Ngram", "SpecPluginsProposer", "SuffixTree"]
