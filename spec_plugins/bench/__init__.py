"""Tools: engine runners, the step-time profiler (`spec-plugins profile`), replay, simulators, sweeps and benchmarks.

Installed with the package so their commands work from a wheel (`spec-plugins profile`, `spec-plugins sweep`,
`python -m spec_plugins.bench.<tool>`), but apart from the runtime: no module an engine loads
(`spec_plugins.policy`, `.vllm`, `.trtllm`, `.drafting`, `proposers/`) imports from here, which
`tests/test_layers.py` checks. The repository's `benchmarks/` folder holds what these tools measured (JSON,
traces, workloads) and the scripts that reproduce the figures on the results page.
"""
