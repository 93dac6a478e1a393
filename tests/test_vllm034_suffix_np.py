"""The numpy replay of vLLM 0.34's `suffix` speculator on plain inputs (its step-by-step match with vLLM's own kernels
is the contract test `test_vllm_0_34_suffix_numpy_replay_matches_its_kernels_step_by_step`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugins.bench.vllm034_suffix_np import (BUCKET_SLOTS, SuffixCorpus, Vllm034SuffixReplay, key_buckets,
                                                 len_bucket, local_match)
from spec_plugins.core import DraftRequest


def brute_local(seq: list[int], depth: int) -> tuple[int, int]:
    """The local scan kernel's rule, position by position: longest match, then the latest end."""
    n, best = len(seq), (0, 0)
    for end in range(1, n):
        length = 0
        while length < depth and end - 1 - length >= 0 and seq[end - 1 - length] == seq[n - 1 - length]:
            length += 1
        if length and (length, end) > best:
            best = (length, end)
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=60), st.integers(1, 8))
def test_local_match_is_the_kernels_rule(seq, depth):
    assert local_match(np.array(seq, dtype=np.int64), depth) == brute_local(seq, depth)


def test_len_buckets():
    assert [len_bucket(n) for n in (1, 6, 7, 10, 11, 20, 21, 99)] == [0, 5, 6, 6, 7, 7, 8, 8]


def test_ingested_positions_are_found_under_their_preceding_tokens():
    corpus = SuffixCorpus(capacity=64, max_depth=24)
    doc = np.array([5, 6, 7, 8, 9, 10, 11], dtype=np.int64)
    corpus.ingest(doc)
    b2, b4 = key_buckets(doc[:5], corpus.num_buckets)  # position 5 (token 10) follows 8, 9 and 6, 7, 8, 9
    assert corpus.table[0, b4, 0] == 5 and corpus.table[1, b2, 0] == 5
    assert corpus.tokens[7] == -1 and corpus.head == 8 and corpus.doc_seq == 1


def test_corpus_votes_for_the_most_frequent_continuation():
    corpus = SuffixCorpus(capacity=256, max_depth=24)
    for cont in ([1, 2, 3], [1, 2, 4], [1, 2, 4], [9, 9, 9]):
        corpus.ingest(np.array([50, 51, 52, 53, *cont], dtype=np.int64))
    # Four candidates match 50..53; two of three agree on 1, 2, then 4 beats 3; the [9, 9, 9] one is outvoted.
    match_len, draft = corpus.draft(np.array([70, 50, 51, 52, 53], dtype=np.int64), 8)
    assert match_len == 4 and draft == [1, 2, 4]


def test_ring_wraps_whole_documents_and_slots_keep_the_newest_documents():
    corpus = SuffixCorpus(capacity=20, max_depth=24)
    for i in range(BUCKET_SLOTS + 2):
        corpus.ingest(np.array([1, 2, 3, 4, 100 + i], dtype=np.int64))
        assert corpus.head <= 20
    b2, b4 = key_buckets([1, 2, 3, 4], corpus.num_buckets)
    docs = sorted(int(v) >> 32 for v in corpus.table[0, b4])
    assert docs == list(range(2, BUCKET_SLOTS + 2))  # the last 8 documents, one slot each
    # Only the documents still in the ring verify: the draft is the newest one's continuation.
    assert corpus.draft(np.array([1, 2, 3, 4]), 4) == (4, [100 + BUCKET_SLOTS + 1])


def test_confidences_follow_the_statistics_under_every_slot_verified():
    p = Vllm034SuffixReplay(corpus_tokens=0, adaptive_verification=True)
    own = [5, 6, 7, 8] * 4
    first = p.propose([DraftRequest("a", own, len(own), 4)])[0]
    assert first.tokens == [5, 6, 7, 8] and first.confidence == [0.5] * 4  # (0 + 1) / (0 + 2)
    # Two of the four accepted: positions 0, 1 accepted, position 2 observed as the rejection, 3 unobserved.
    nxt = own + [5, 6, 9]
    second = p.propose([DraftRequest("a", nxt, 3, 4)])[0]
    bucket = len_bucket(12)  # the match of the first step: 12 tokens of its own history
    assert p.stats[bucket, :, 0].tolist() == [1, 1, 0, 0] and p.stats[bucket, :, 1].tolist() == [1, 1, 1, 0]
    assert second.tokens == [] and second.confidence == []


def test_options_are_checked():
    with pytest.raises(ValueError):
        Vllm034SuffixReplay(verified="some")
    p = Vllm034SuffixReplay()
    p.propose([DraftRequest("a", [1, 2, 1, 2], 4, 8)])
    with pytest.raises(ValueError, match="one K per replay"):
        p.propose([DraftRequest("b", [1, 2], 2, 4)])


def brute_ngram(seq: list[int], min_n: int, max_n: int) -> tuple[int, int]:
    """vLLM 0.34's ngram scan, window by window: the largest (n, pos) whose window equals the last n tokens."""
    best = (0, 0)
    for n in range(min_n, max_n + 1):
        for pos in range(0, len(seq) - n):
            if seq[pos: pos + n] == seq[len(seq) - n:]:
                best = max(best, (n, pos))
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=50), st.integers(1, 4), st.integers(0, 3))
def test_ngram_match_is_the_kernels_rule(seq, min_n, extra):
    from spec_plugins.bench.vllm034_suffix_np import ngram_match

    assert ngram_match(np.array(seq, dtype=np.int64), min_n, min_n + extra) == brute_ngram(seq, min_n, min_n + extra)


def test_ngram_replay_drafts_what_followed_and_checks_its_options():
    from spec_plugins.bench.vllm034_suffix_np import Vllm034NgramReplay

    p = Vllm034NgramReplay(min_n=2, max_n=3)
    seq = [1, 2, 3, 4, 9, 2, 3, 4, 7, 8, 2, 3, 4]
    assert p.propose([DraftRequest("a", seq, len(seq), 3)])[0].tokens == [7, 8, 2]  # the latest 3-gram 2, 3, 4
    with pytest.raises(ValueError):
        Vllm034NgramReplay(min_n=4, max_n=2)
