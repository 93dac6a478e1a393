"""Fixed-length drafts for profiling: every step verifies exactly 1 + length tokens per request."""
from spec_plugins.proposers.fixed_draft.proposer import FixedDraftProposer

__all__ = ["FixedDraftProposer"]
