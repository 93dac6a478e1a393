"""vLLM 0.34+ (Model Runner V2): our proposers as registered speculative methods.

    vllm serve MODEL --speculative-config \
      '{"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8, "speculator_options": {"policy": "adaptive"}}'

- `config.py`: the `SpeculatorConfig` of each method (read in every vLLM process: imports nothing heavy) and the
  names the general plugin registers them under (`METHODS`).
- `speculator.py`: the `BaseSpeculator` the runner builds in each worker; it translates a runner step into the
  drafting layer (`spec_plugins.drafting`) the V1 `custom_class` proposers call too.

Nothing here touches the runner: vLLM calls us through its own interface (`register_speculative_method`,
`init_speculator`, `BaseSpeculator`), and `spec_plugins/vllm/patches.py` lists the names we rely on.
"""
