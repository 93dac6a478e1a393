# The two entry points of the README. Both install everything they need into .venv first
# (scripts/setup_env.sh is idempotent: a second run takes seconds).
PY := .venv/bin/python

.PHONY: setup setup-gpu-path demo test unit

setup:
	bash scripts/setup_env.sh dev,vllm

# vLLM 0.33.0's and 0.34.0's own Python (the CUDA wheels without their CUDA libraries) for the contract tests of the
# GPU code paths; where one cannot be built, its tests skip and say why.
setup-gpu-path:
	bash scripts/setup_vllm_gpu_env.sh 0.33.0 || echo "[setup-gpu] could not build .venv-vllm033: the vLLM 0.33 contract tests will skip"
	bash scripts/setup_vllm_gpu_env.sh 0.34.0 || echo "[setup-gpu] could not build .venv-vllm034: the vLLM 0.34 contract tests will skip"

demo: setup
	.venv/bin/spec-plugins demo

# Two test processes: most of a real-engine test is its single-threaded start-up, so two overlap well even on
# two cores (the whole suite: ~39 min in one process, ~29 min in two). PYTEST_WORKERS=0 runs them in this one.
PYTEST_WORKERS ?= 2

# --durations: the slowest tests are listed at the end, so a run that grows slower says where.
test: setup setup-gpu-path
	$(PY) -m pytest -q -rs --timeout=1200 -n $(PYTEST_WORKERS) --durations=15

unit: setup
	$(PY) -m pytest -q -rs tests
