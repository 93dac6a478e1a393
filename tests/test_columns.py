"""The drafting contract's compiled column work (spec_plugins/_columns.cpp) against plain Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugins import _columns
from spec_plugins.core import BatchDrafts, DraftBatch

lengths_lists = st.lists(st.integers(0, 6), min_size=0, max_size=12)


def flat_drafts(lengths, dtype=np.int64):
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    return np.arange(100, 100 + offsets[-1], dtype=dtype), offsets


@settings(max_examples=200, deadline=None)
@given(lengths_lists, st.data())
def test_truncated_and_lists_equal_slicing(lengths, data):
    tokens, offsets = flat_drafts(lengths)
    conf = np.linspace(0, 1, len(tokens))
    drafts = BatchDrafts(tokens, offsets, conf)
    keep = data.draw(st.lists(st.integers(0, 8), min_size=len(lengths), max_size=len(lengths)))
    cut = drafts.truncated(np.array(keep, dtype=np.int64))
    want = [tokens[a:b][:k].tolist() for a, b, k in zip(offsets[:-1], offsets[1:], keep)]
    assert cut.lists() == want
    assert cut.confidence.tolist() == [c for a, b, k in zip(offsets[:-1], offsets[1:], keep) for c in conf[a:b][:k]]
    assert (cut is drafts) == all(k >= n for k, n in zip(keep, lengths))
    for dtype in (np.int32, np.int64, np.float64):
        t, o = flat_drafts(lengths, dtype)
        assert _columns.draft_lists(t, o) == [[int(x) for x in t[a:b]] for a, b in zip(o[:-1], o[1:])]


def test_bad_columns_get_one_line_errors():
    m = np.zeros((2, 8), dtype=np.int32)
    with pytest.raises(ValueError, match="DraftBatch.context_lens: expected integers >= 0"):
        DraftBatch(["a"], m, [-1], [0], [1], rows=[0])
    with pytest.raises(ValueError, match="DraftBatch.max_draft: expected integers >= 0"):
        DraftBatch(["a"], m, [3], [0], [-2], rows=[0])
    with pytest.raises(ValueError, match="DraftBatch.num_new: row 1 has 5 new tokens in a context of 4"):
        DraftBatch(["a", "b"], m, [3, 4], [1, 5], [1, 1], rows=[0, 1])
    with pytest.raises(ValueError, match="DraftBatch.rows: a row or a length falls outside"):
        DraftBatch(["a"], m, [3], [1], [1], rows=[2])
    with pytest.raises(ValueError, match="DraftBatch.rows: a row or a length falls outside"):
        DraftBatch(["a"], m, [9], [1], [1], rows=[0])
    with pytest.raises(ValueError, match="BatchDrafts.offsets: expected 0, non-decreasing"):
        BatchDrafts(np.zeros(3), [0, 2, 1, 3])
    with pytest.raises(ValueError, match="BatchDrafts.offsets"):
        BatchDrafts(np.zeros(3), [0, 2])
    with pytest.raises(ValueError, match="a trim length must be an integer >= 0"):
        BatchDrafts(np.zeros(3), [0, 3]).truncated(np.array([-1]))


def test_lookup_slots_and_the_ledger_reports():
    slots, unknown = _columns.lookup_slots({"a": 4, ("t", 1): 2}, ["a", "z", ("t", 1)])
    assert slots.tolist() == [4, -1, 2] and unknown
    assert _columns.lookup_slots({"a": 0}, ["a"])[1] is False
    with pytest.raises(TypeError):
        _columns.lookup_slots({}, [["unhashable"]])
    drafted = np.array([0, 3, 5, 2], dtype=np.int64)
    rows, d, a = _columns.ledger_reports(np.array([1, 2, 0, 3]), np.array([7, -1, 2, 1]), drafted)
    assert (rows.tolist(), d.tolist(), a.tolist()) == ([0, 3], [3, 2], [3, 1])  # slot 2 still pending
    assert drafted.tolist() == [0, 0, 5, 0]  # reported once
    last, seen = np.zeros(4, dtype=np.int64), np.array([0, 10, 10, 10])
    grown = _columns.ledger_seen(np.array([1, 2, 3]), np.array([False, False, True]), 7, np.array([12, 8, 5]),
                                 None, last, seen)
    assert grown.tolist() == [2, 8, 5] and last.tolist() == [0, 7, 7, 7] and seen.tolist() == [0, 12, 8, 5]
    assert _columns.first_over(np.array([1, 4, 2]), np.array([1, 3, 1])) == 1
