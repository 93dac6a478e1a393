"""The compiled column work of every step (spec_plugins/_contract.cpp, _ledger.cpp, vllm/_rows.cpp) against plain
Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugins import _contract, _ledger
from spec_plugins.vllm import _rows
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
        assert _contract.draft_lists(t, o) == [[int(x) for x in t[a:b]] for a, b in zip(o[:-1], o[1:])]


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
    slots, unknown = _ledger.lookup_slots({"a": 4, ("t", 1): 2}, ["a", "z", ("t", 1)])
    assert slots.tolist() == [4, -1, 2] and unknown
    assert _ledger.lookup_slots({"a": 0}, ["a"])[1] is False
    with pytest.raises(TypeError):
        _ledger.lookup_slots({}, [["unhashable"]])
    drafted = np.array([0, 3, 5, 2], dtype=np.int64)
    ids, d, a = _ledger.ledger_reports(["a", "b", "c", "d"], np.array([1, 2, 0, 3]), np.array([7, -1, 2, 1]),
                                        drafted)
    assert (ids, d.tolist(), a.tolist()) == (["a", "d"], [3, 2], [3, 1])  # slot 2 still pending
    assert drafted.tolist() == [0, 0, 5, 0]  # reported once
    last, seen = np.zeros(4, dtype=np.int64), np.array([0, 10, 10, 10])
    grown = _ledger.ledger_seen(np.array([1, 2, 3]), np.array([False, False, True]), 7, np.array([12, 8, 5]),
                                 None, last, seen)
    assert grown.tolist() == [2, 8, 5] and last.tolist() == [0, 7, 7, 7] and seen.tolist() == [0, 12, 8, 5]
    assert _ledger.first_over(np.array([1, 4, 2]), np.array([1, 3, 1])) == 1
    assert _contract.count_and_sum(np.array([0, 3, 0, 5])) == (2, 8)


def test_request_slots_slots_of_and_columns():
    from spec_plugins.slots import RequestSlots

    slots = RequestSlots(n=((), np.int64, 7))
    cols = slots.columns
    assert slots.slots_of(["a", "b"], create=False).tolist() == [-1, -1] and len(slots) == 0
    got = slots.slots_of(["a", "b"])
    assert got.tolist() == slots.lookup(["a", "b"])[0].tolist() and len(slots) == 2
    cols["n"][got] = [1, 2]
    more = slots.slots_of([f"r{i}" for i in range(100)])  # the columns grow: the same dict holds the new arrays
    assert slots.columns is cols and cols["n"] is slots["n"] and cols["n"][got].tolist() == [1, 2]
    assert cols["n"][more].tolist() == [7] * 100


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_ledger_step_equals_lookup_reports_and_seen(data):
    """The one-call ledger step writes and returns what the three separate calls do."""
    capacity = data.draw(st.integers(1, 10))
    index = {f"r{s}": s for s in data.draw(st.lists(st.integers(0, capacity - 1), unique=True, max_size=capacity))}
    ids = data.draw(st.lists(st.sampled_from(sorted(index) + ["new"]), max_size=6))
    lens = np.array(data.draw(st.lists(st.integers(0, 50), min_size=len(ids), max_size=len(ids))), dtype=np.int64)
    num_new = data.draw(st.none() | st.just(np.minimum(lens, 3)))
    accepted = data.draw(st.none() | st.just(np.array([(i % 4) - 1 for i in range(len(ids))], dtype=np.int64)))
    cols = [np.array(data.draw(st.lists(st.integers(0, 9), min_size=capacity, max_size=capacity)), dtype=np.int64)
            for _ in range(3)]
    mine = [c.copy() for c in cols]
    if "new" in ids:
        assert _ledger.ledger_step(index, ids, 7, lens, num_new, accepted, *mine) is None
        assert all((a == b).all() for a, b in zip(cols, mine))  # nothing written
        return
    if len(set(ids)) != len(ids):
        with pytest.raises(ValueError, match="a request id appears twice in one step"):
            _ledger.ledger_step(index, ids, 7, lens, num_new, accepted, *mine)
        assert all((a == b).all() for a, b in zip(cols, mine))
        return
    slots, grown, reports = _ledger.ledger_step(index, ids, 7, lens, num_new, accepted, *mine)
    want_slots, _ = _ledger.lookup_slots(index, ids)
    last, seen, drafted = cols
    want_reports = None if accepted is None else _ledger.ledger_reports(ids, want_slots, accepted, drafted)
    want_grown = _ledger.ledger_seen(want_slots, np.zeros(len(ids), dtype=bool), 7, lens, num_new, last, seen)
    assert slots.tolist() == want_slots.tolist() and grown.tolist() == want_grown.tolist()
    assert (reports is None) == (want_reports is None)
    if reports is not None:
        assert reports[0] == want_reports[0] and all(x is y for x, y in zip(reports[0], want_reports[0]))
        assert [r.tolist() for r in reports[1:]] == [r.tolist() for r in want_reports[1:]]
    assert all((a == b).all() for a, b in zip(cols, mine))


def test_vllm_rows_and_batch_columns():
    sampled, accepted, lens, caps, decoding = _rows.from_runner(
        [[1, 2, 3], [], [4]], np.array([10, 7, 4094, 99], dtype=np.int32), 4096, 4)
    assert sampled.tolist() == [3, 0, 1] and accepted.tolist() == [2, -1, 0] and decoding == 2
    assert lens.tolist() == [10, 7, 4094] and caps.tolist() == [4, 4, 1]  # room before max_model_len - 1
    assert _rows.from_runner([[1]], np.array([5000]), 4096, 4)[3].tolist() == [0]
    with pytest.raises(ValueError, match="num_tokens_no_spec: expected one length per row"):
        _rows.from_runner([[1], [2]], np.array([3]), 4096, 4)
    m = np.zeros((2, 8), dtype=np.int32)
    lens = np.array([3, 4])
    assert _contract.batch_columns(2, lens, lens - 1, lens, np.array([0, 1]), 2, 8)  # int64 vectors: as they are
    assert not _contract.batch_columns(2, lens.astype(np.int32), lens, lens, None, 0, 0)  # converted by DraftBatch
    batch = DraftBatch(["a", "b"], m, lens.astype(np.int32), [1, 1], (2, 2), rows=[0, 1])
    assert batch.context_lens.dtype == np.int64 and batch.max_draft.tolist() == [2, 2]
    with pytest.raises(ValueError, match="DraftBatch.num_new: row 1 has 5 new tokens in a context of 4"):
        DraftBatch(["a", "b"], m, lens, np.array([1, 5]), lens, rows=np.array([0, 1]))
    with pytest.raises(ValueError, match=r"DraftBatch.max_draft: expected 2 integers, got float64"):
        DraftBatch(["a", "b"], m, lens, lens, np.array([1.0, 2.0]), rows=np.array([0, 1]))


@settings(max_examples=60, deadline=None)
@given(lengths_lists, st.sampled_from(["<i8", ">i8", "<i4", "strided", "f8"]))
def test_compiled_calls_take_every_layout_their_numpy_conversion_takes(lengths, layout):
    """Arrays already int64, native, contiguous are read as they are (fast_array.hpp); every other layout goes
    through numpy's conversion as before: byte-swapped, narrower, strided and float columns give the same
    answers, and the caller's array is never written."""
    from spec_plugins.policy import _trim
    from spec_plugins.proposers.ngram import NgramProposer
    from spec_plugins.proposers.suffix_tree import SuffixTreeProposer

    _, offsets = flat_drafts(lengths)
    caps = np.full(len(lengths), 3, dtype=np.int64)

    def as_layout(a):
        if layout == "strided":
            b = np.zeros(2 * len(a), dtype=np.int64)
            b[::2] = a
            return b[::2]
        return a.astype(layout)

    lengths_col = np.asarray(lengths, dtype=np.int64)
    want_over = _ledger.first_over(lengths_col, caps)
    if layout == "f8":  # refused by the int64 parameters that do not force a cast (as before)
        with pytest.raises(TypeError):
            _ledger.first_over(as_layout(lengths_col), caps)
    else:
        assert _ledger.first_over(as_layout(lengths_col), as_layout(caps)) == want_over
        assert _contract.draft_lengths(as_layout(offsets), int(offsets[-1])).tolist() == list(lengths)
    # Forcing a cast (the policy's walk): floats and byte orders are read by value.
    gain = np.linspace(1.0, 0.1, 2 * len(lengths) + 1)
    assert _trim.ranking(gain.tolist()) == _trim.ranking(gain.astype(">f8").tolist())
    # The proposers' column readers: the same drafts from any integer layout of lens and caps.
    if layout != "f8" and lengths:
        ctx = [list(range(10)) * 2 for _ in lengths]
        lens = np.array([len(c) for c in ctx], dtype=np.int64)
        batch = NgramProposer(min_ngram=1, max_ngram=3)._batch
        assert [a.tolist() for a in batch.propose(ctx, None, as_layout(lens), as_layout(caps))] == \
            [a.tolist() for a in batch.propose(ctx, None, lens, caps)]
        cache = SuffixTreeProposer()._core
        keys = np.arange(len(lengths), dtype=np.int64)
        got = cache.step_batch(as_layout(keys), ctx, None, as_layout(lens), as_layout(lens), as_layout(caps))
        fresh = SuffixTreeProposer()._core
        want = fresh.step_batch(keys, ctx, None, lens, lens, caps)
        assert [g.tolist() for g in got[:3]] == [w.tolist() for w in want[:3]]
        assert keys.tolist() == list(range(len(lengths)))
