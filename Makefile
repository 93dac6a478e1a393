# The two entry points of the README. Both install everything they need into .venv first
# (scripts/setup_env.sh is idempotent: a second run takes seconds).
PY := .venv/bin/python

.PHONY: setup demo test unit

setup:
	bash scripts/setup_env.sh dev,vllm

demo: setup
	.venv/bin/spec-plugins demo

test: setup
	$(PY) -m pytest -q --timeout=1200

unit: setup
	$(PY) -m pytest -q tests
