"""spec-plugins: speculative-decoding proposers and draft-length policies for vLLM and TensorRT-LLM."""

from spec_plugins.core import (
    Draft,
    DraftLengthPolicy,
    DraftRequest,
    FixedLength,
    Proposer,
    apply_policy,
    check_cap,
    check_drafts,
)
from spec_plugins.registry import (
    available_policies,
    available_proposers,
    create_policy,
    create_proposer,
    register_policy,
    register_proposer,
)

__version__ = "0.1.0"

__all__ = [
    "Draft",
    "DraftLengthPolicy",
    "DraftRequest",
    "FixedLength",
    "Proposer",
    "apply_policy",
    "available_policies",
    "available_proposers",
    "check_cap",
    "check_drafts",
    "create_policy",
    "create_proposer",
    "register_policy",
    "register_proposer",
]
