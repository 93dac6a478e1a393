"""The n-gram baseline against a brute-force oracle."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugins.core import DraftRequest
from spec_plugins.proposers.ngram import NgramProposer


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Longest n-gram suffix (max_n..min_n) with an earlier occurrence; earliest occurrence wins."""
    n = len(tokens)
    for size in range(min(max_n, n - 1), min_n - 1, -1):
        tail = tokens[n - size:]
        for start in range(0, n - size):  # occurrence must end before the last token
            if tokens[start:start + size] == tail:
                return tokens[start + size:start + size + k]
    return []


@settings(max_examples=400, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=0, max_size=40),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 3),
    k=st.integers(0, 6),
)
def test_matches_brute_force(tokens, min_n, extra, k):
    p = NgramProposer(min_ngram=min_n, max_ngram=min_n + extra)
    assert p.lookup(np.array(tokens, dtype=np.int64), k) == brute_force(tokens, min_n, min_n + extra, k)


def test_copies_the_continuation_of_a_repeated_span():
    ctx = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4]
    draft = NgramProposer(min_ngram=2, max_ngram=3).propose([DraftRequest("a", ctx, len(ctx), max_draft=3)])
    assert draft[0].tokens == [5, 6, 7]
    assert draft[0].probs is None  # one-hot drafts


def test_no_match_and_zero_cap_give_empty_drafts():
    p = NgramProposer()
    assert p.propose([DraftRequest("a", [1, 2, 3, 4], 4, max_draft=4)])[0].tokens == []
    assert p.propose([DraftRequest("a", [1, 2, 1, 2], 4, max_draft=0)])[0].tokens == []


def test_confidence_is_the_copy_hazard_of_the_match_length():
    from spec_plugins.proposers.ngram.proposer import match_confidence

    m = np.arange(0, 40)
    assert match_confidence(m).tolist() == np.clip(1.0 - 1.3 / (m + 0.8), 0.05, 0.95).tolist()
