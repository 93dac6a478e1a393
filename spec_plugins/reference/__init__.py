"""Reference engine: a readable Hugging Face speculative-decoding loop, the oracle for the real engines."""

from spec_plugins.reference.engine import GenerationResult, HFTarget, StepStats, Target, generate
from spec_plugins.reference.verify import sample_token, verify_greedy, verify_sampled

__all__ = [
    "GenerationResult",
    "HFTarget",
    "StepStats",
    "Target",
    "generate",
    "sample_token",
    "verify_greedy",
    "verify_sampled",
]
