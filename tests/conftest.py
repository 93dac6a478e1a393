"""Hypothesis profiles (HYPOTHESIS_PROFILE=slow runs 10^4 cases per property test; default: Hypothesis's 100)
and shared fixtures."""

import os

import pytest
from hypothesis import settings

settings.register_profile("slow", max_examples=10_000, deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models and tensors: extra intra-op threads only contend for the cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
