"""Appending drafts ahead (`append_ahead`): the drafts' leading tokens go into the trees tentatively while the
engine verifies; the next step keeps those its new tokens agree with and takes the rest back. Drafts, trees and
copiers must end exactly as without it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugins.core import DraftBatch
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer
from spec_plugins.proposers.suffix_tree import _core, _testing


def engine_tokens(rng, draft: list[int], vocab: int) -> list[int]:
    """What an engine appends after verifying `draft`: an accepted prefix of it and one token of its own
    (which may equal the next draft token), or now and then tokens unrelated to the draft."""
    if rng.random() < 0.2 or not draft:
        return rng.integers(0, vocab, size=int(rng.integers(1, 5))).tolist()
    accepted = int(rng.integers(0, len(draft) + 1))
    return draft[:accepted] + [int(rng.integers(0, vocab))]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([0.0, 0.3, 0.7]), st.booleans())
def test_drafts_and_trees_are_the_same_with_appends_ahead(seed, threads, min_prob, copy):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 10))
    opts = {"max_depth": 10, "max_cached_requests": 4, "copy_drafts": copy}
    plain = SuffixTreeProposer(**opts, threads=1 if threads else 0, parallel_from=1, interleave=3)
    ahead = SuffixTreeProposer(**opts, threads=1 if threads else 0, parallel_from=1, interleave=3,
                               append_ahead=True, ahead_min_prob=min_prob)
    ahead._core.set_ahead(True, min_prob, 1)  # hand over every step's tokens, however few
    contexts: dict[str, list[int]] = {}
    seen: dict[str, int] = {}
    drafts: dict[str, list[int]] = {}
    for step in range(30):
        for r in list(contexts):
            if rng.random() < 0.06:  # finished
                del contexts[r]
                seen.pop(r)
                plain.finish(r)
                ahead.finish(r)
        while len(contexts) < 6 and rng.random() < 0.5:
            r = f"req-{step}-{len(contexts)}"
            contexts[r] = rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist()
        for r in contexts:
            if r in seen:
                new = engine_tokens(rng, drafts.get(r, []), vocab)
                contexts[r].extend(new)
        ids = list(contexts)
        ctxs = [contexts[r] for r in ids]
        lens = np.array([len(c) for c in ctxs], dtype=np.int64)
        new = np.array([len(c) - seen.get(r, 0) if r in seen else len(c) for r, c in zip(ids, ctxs)])
        caps = rng.integers(0, 9, size=len(ids))
        want = plain.propose_batch(DraftBatch(ids, ctxs, lens, new, caps))
        got = ahead.propose_batch(DraftBatch(ids, ctxs, lens, new, caps))
        assert got.lists() == want.lists()
        assert got.confidence.tolist() == want.confidence.tolist()
        drafts = dict(zip(ids, want.lists()))
        seen = {r: len(c) for r, c in zip(ids, ctxs)}
        if step % 5 == 4:  # the per-request view takes every tentative token back: the trees are the same
            for r in ids:
                a, p = ahead._keys[r], plain._keys[r]
                assert _testing.canonical(ahead._core, a).tolist() == _testing.canonical(plain._core, p).tolist()
                assert ahead._core._copy_state(a) == plain._core._copy_state(p)
                assert ahead._core.pending(a) == 0
            _testing.check(ahead._core)
    ahead.wait_ahead()
    different = {k for k, v in ahead.stats().items() if plain.stats()[k] != v}
    assert different <= {"memory_bytes"}  # the journal's reserved capacity aside


def test_agreeing_tokens_are_kept_and_the_rest_taken_back():
    """A request whose tree holds its draft tentatively: new tokens that agree keep those, and the tree then
    equals one that appended the same tokens plainly (the journal restored everything else)."""
    text = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    plain = _core.SuffixCache(max_depth=8)
    ahead = _core.SuffixCache(max_depth=8)
    ahead.set_parallel(0, 1, 1)
    ahead.set_ahead(True, 0.0, 1)
    for cache in (plain, ahead):
        cache.start(7, text)
    lens, num_new, caps = np.array([len(text)]), np.array([0]), np.array([6])
    first = ahead.step_batch(np.array([7]), [text], None, lens, num_new, caps)
    plain.step_batch(np.array([7]), [text], None, lens, num_new, caps)
    draft = first[0].tolist()
    assert draft[:2] == [4, 5]  # the text repeats itself
    ahead.wait_ahead()
    assert ahead.pending(7) == len(draft)  # every draft token is in the tree, tentatively
    grown = text + [4, 5, 9]  # two draft tokens accepted, then the engine's own token
    a = ahead.step_batch(np.array([7]), [grown], None, np.array([len(grown)]), np.array([3]), caps)
    b = plain.step_batch(np.array([7]), [grown], None, np.array([len(grown)]), np.array([3]), caps)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert _testing.canonical(ahead, 7).tolist() == _testing.canonical(plain, 7).tolist()  # also takes the new tentative ones back
    assert ahead.length(7) == plain.length(7) == len(grown)
    _testing.check(ahead)


def test_a_step_with_few_likely_tokens_hands_none_over():
    ahead = _core.SuffixCache(max_depth=8)
    ahead.set_ahead(True, 0.0, SuffixTreeProposer.Options().ahead_min_tokens)  # 8 tokens at least, by default
    text = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    ahead.start(7, text)
    tokens = ahead.step_batch(np.array([7]), [text], None, np.array([len(text)]), np.array([0]), np.array([6]))[0]
    assert 0 < len(tokens) < 8  # it drafted, but too little to hand over
    assert ahead.pending(7) == 0
    with pytest.raises(ValueError, match="ahead_min_tokens"):
        ahead.set_ahead(True, 0.5, -1)


def test_append_ahead_option_checks():
    with pytest.raises(ValueError, match="append_ahead: not with cache_in_flight"):
        SuffixTreeProposer(append_ahead=True, cache_in_flight=True)
    with pytest.raises(ValueError, match="ahead_min_prob"):
        SuffixTreeProposer(append_ahead=True, ahead_min_prob=1.5)


def test_auto_follows_the_engine_the_adapter_names():
    """`append_ahead: auto` (the default): off engine-free; on once an adapter says the engine's forward runs on an
    accelerator (vLLM's device_config.device_type, TensorRT-LLM always), off on a CPU engine; an explicit
    setting and cache_in_flight (which cannot append ahead) are left as they are."""
    from types import SimpleNamespace

    from spec_plugins.drafting import DraftingLayer
    from spec_plugins.core import FixedLength
    from spec_plugins.vllm import SuffixTree

    text = [1, 2, 3, 4, 5, 6, 7, 8, 9] * 4

    def hands_over(prop) -> bool:
        layer = DraftingLayer(prop, FixedLength())
        layer.step(["r"], [text], [len(text)], max_draft=16)
        prop.wait_ahead()
        return prop._core.pending(prop._keys["r"]) > 0

    assert not hands_over(SuffixTreeProposer())
    on = SuffixTreeProposer()
    DraftingLayer(on, FixedLength()).engine_on_accelerator(True)
    assert on.appends_ahead and hands_over(on)
    for options, told, want in (({"append_ahead": False}, True, False), ({"append_ahead": True}, False, True),
                                ({"cache_in_flight": True}, True, False), ({}, False, False)):
        prop = SuffixTreeProposer(**options)
        prop.engine_on_accelerator(told)
        assert prop.appends_ahead is want and hands_over(prop) is want, options
    for device, want in (("cuda", True), ("cpu", False), (None, False)):
        cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                              model_config=SimpleNamespace(max_model_len=4096), additional_config=None)
        if device is not None:
            cfg.device_config = SimpleNamespace(device_type=device)
        assert SuffixTree(cfg).proposer.appends_ahead is want, device
