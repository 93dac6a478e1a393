"""The profiling proposer: exactly `length` drafts (capped), repeating one token."""

from __future__ import annotations

import numpy as np
import pytest

from spec_plugins.core import DraftRequest, check_drafts
from spec_plugins.proposers.fixed_draft import FixedDraftProposer
from spec_plugins.registry import create_proposer, proposer_class


def req(tokens, max_draft, req_id="a"):
    return DraftRequest(req_id, tokens, len(tokens), max_draft=max_draft)


def test_repeats_the_last_token_up_to_length():
    p = FixedDraftProposer(length=3)
    requests = [req([1, 2, 7], 5), req(np.array([4, 9]), 8, "b")]
    drafts = p.propose(requests)
    check_drafts(requests, drafts)
    assert [d.tokens for d in drafts] == [[7, 7, 7], [9, 9, 9]]
    assert all(type(t) is int for t in drafts[1].tokens)  # plain ints, not numpy scalars
    assert drafts[0].probs is None and drafts[0].confidence is None


def test_capped_by_max_draft():
    drafts = FixedDraftProposer(length=6, token=11).propose([req([1, 2], 2), req([3], 0, "b")])
    assert [d.tokens for d in drafts] == [[11, 11], []]


def test_fixed_token_and_zero_length():
    assert FixedDraftProposer(length=2, token=0).propose([req([5, 6], 4)])[0].tokens == [0, 0]
    assert FixedDraftProposer(length=0).propose([req([5, 6], 4)])[0].tokens == []


def test_empty_context_without_token_drafts_nothing():
    assert FixedDraftProposer(length=2).propose([req([], 4)])[0].tokens == []


def test_registered_and_options_validated():
    assert proposer_class("fixed_draft") is FixedDraftProposer
    assert create_proposer("fixed_draft", {"length": 4}).length == 4
    with pytest.raises(ValueError, match=r"proposer_options\[fixed_draft\]\.length: Input should be greater than"):
        create_proposer("fixed_draft", {"length": -1})
    with pytest.raises(ValueError, match=r"proposer_options\[fixed_draft\]\.length: Field required"):
        create_proposer("fixed_draft", {})
    with pytest.raises(ValueError, match=r"proposer_options\[fixed_draft\]\.tokn: unknown option"):
        create_proposer("fixed_draft", {"length": 1, "tokn": 3})
    p = FixedDraftProposer(length=1)
    before = p.propose([req([1, 2], 3)])[0].tokens
    p.finish("a")  # stateless: nothing to free, and the next drafts are the same
    assert p.propose([req([1, 2], 3)])[0].tokens == before == [2]


def test_max_requests_drafts_for_the_first_requests_only():
    drafts = FixedDraftProposer(length=2, token=7, max_requests=1).propose([req([1], 4), req([2], 4, "b")])
    assert [d.tokens for d in drafts] == [[7, 7], []]
    with pytest.raises(ValueError, match=r"max_requests: Input should be greater than or equal to 0"):
        create_proposer("fixed_draft", {"length": 1, "max_requests": -1})
