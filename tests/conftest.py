"""Hypothesis profiles: HYPOTHESIS_PROFILE=slow runs 10^4 cases per property test (default: Hypothesis's 100)."""

import os

from hypothesis import settings

settings.register_profile("slow", max_examples=10_000, deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
