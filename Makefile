# The two entry points of the README. Both install everything they need into .venv first
# (scripts/setup_env.sh is idempotent: a second run takes seconds).
PY := .venv/bin/python

.PHONY: setup demo test unit

setup:
	bash scripts/setup_env.sh dev,vllm

demo: setup
	.venv/bin/spec-plugins demo

# Two test processes: most of a real-engine test is its single-threaded start-up, so two overlap well even on
# two cores (the whole suite: ~39 min in one process, ~29 min in two). PYTEST_WORKERS=0 runs them in this one.
PYTEST_WORKERS ?= 2

# --durations: the slowest tests are listed at the end, so a run that grows slower says where.
test: setup
	$(PY) -m pytest -q --timeout=1200 -n $(PYTEST_WORKERS) --durations=15

unit: setup
	$(PY) -m pytest -q tests
