"""The suffix-tree proposer against brute-force oracles.

The oracle counts every substring (length <= max_depth) of the stored sequences directly and builds
drafts from those counts: follow the most frequent continuation (ties: most recent occurrence),
probability = product of count(child) / count(parent), stop below min_token_prob
or at the per-match budget floor(factor * match_len + offset); over match lengths keep the highest
score (sum of probabilities), ties to the longer match; the global tree replaces the per-request
draft only with a strictly higher score.

Copy drafts (on by default) have their own oracle, `RefCopier`: it replays the request's tokens one
by one, finds the longest earlier-occurring tail by brute force, and follows the rules written in
copier.hpp; the copy then competes with the count draft, whose score is
discounted by the copy hazard. HYPOTHESIS_PROFILE=slow runs 10^4 cases per property.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_plugins.core import DraftRequest, check_drafts
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer, _core, _testing
from spec_plugins.proposers.suffix_tree.proposer import _conditional
from spec_plugins.registry import create_proposer

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- oracle -------------------------------------------------------------------------------------
class Table:
    """count and most recent occurrence (order, start) of every substring of length <= depth."""

    def __init__(self, seqs: list[tuple[int, list[int]]], depth: int) -> None:
        self.depth = depth
        self.count: dict[tuple, int] = {}
        self.newest: dict[tuple, tuple[int, int]] = {}
        alphabet = set()
        for order, x in seqs:
            alphabet.update(x)
            for i in range(len(x)):
                for L in range(1, min(depth, len(x) - i) + 1):
                    s = tuple(x[i : i + L])
                    self.count[s] = self.count.get(s, 0) + 1
                    if s not in self.newest or (order, i) > self.newest[s]:
                        self.newest[s] = (order, i)
        self.alphabet = sorted(alphabet)

    def follow(self, s: tuple, room: int, min_prob: float, p: float = 1.0):
        toks, probs, score = [], [], 0.0
        while len(toks) < room:
            kids = [s + (c,) for c in self.alphabet if s + (c,) in self.count]
            if not kids:
                break
            best = max(kids, key=lambda k: (self.count[k], self.newest[k]))
            p *= self.count[best] / self.count[s]
            if p < min_prob:
                break
            toks.append(best[-1])
            probs.append(p)
            score += p
            s = best
        return toks, probs, score

    def draft(self, ctx, max_tokens, factor, offset, min_prob):
        best = ([], [], 0.0, 0)
        for L in range(1, min(len(ctx), self.depth - 1) + 1):
            s = tuple(ctx[len(ctx) - L :])
            if s not in self.count:
                break
            budget = max(0, min(max_tokens, math.floor(L * factor + offset + 1e-6)))
            toks, probs, score = self.follow(s, min(budget, self.depth - L), min_prob)
            if toks and score >= best[2]:
                best = (toks, probs, score, L)
        return best


def repeat_info(x, n: int, depth: int):
    """The longest tail of x[:n] (<= depth) that also occurs earlier (ending before n - 1):
    (length, position after its most recent occurrence, position after its oldest); (0, None, None)."""
    x = np.asarray(x)
    ends = np.flatnonzero(x[: n - 1] == x[n - 1]) if n > 1 else np.zeros(0, dtype=np.int64)
    if ends.size == 0:
        return 0, None, None
    L = 1
    while L < depth:
        e = ends[ends >= L]
        e = e[x[e - L] == x[n - 1 - L]]
        if e.size == 0:
            break
        ends, L = e, L + 1
    return L, int(ends.max()) + 1, int(ends.min()) + 1


COPY_DEFAULTS = dict(
    min_prob=0.05, window=16, near_len=8, anchor_run=3, oldest_from=2, near_bonus=2.0, near_first_bonus=0.5,
    hazard_c=1.3, hazard_d=0.8, disagree_factor=0.7,
)


class RefCopier:
    """Copy-draft state of one request, replayed token by token (copier.hpp, `Copier`)."""

    def __init__(self, x, depth: int, cp: dict) -> None:
        self.cp, self.depth = cp, depth
        self.src, self.len, self.run, self.anchor, self.near = None, 0, 0, None, False
        self.x: list[int] = []
        self.feed(x)

    def feed(self, tokens) -> None:
        for t in tokens:
            self.x.append(int(t))
            self.step(len(self.x))

    def step(self, n: int) -> None:  # x[:n] is the sequence, x[n - 1] just arrived
        x, cp = self.x, self.cp
        if self.src is not None and x[self.src] == x[n - 1]:
            self.src, self.len, self.run = self.src + 1, self.len + 1, self.run + 1
            return
        if self.src is not None and self.run >= cp["anchor_run"]:
            self.anchor = self.src
        self.run = 0
        L, recent, oldest = repeat_info(x, n, self.depth)
        self.near, self.len = False, L
        if L == 0:
            self.src = None
            return
        if L <= cp["near_len"]:
            if self.anchor is not None:
                best = (0, None)
                for p in range(max(self.anchor, 1), min(self.anchor + cp["window"], n)):
                    l = 0
                    while l < L and l < p and x[p - 1 - l] == x[n - 1 - l]:
                        l += 1
                    if l > best[0]:
                        best = (l, p)
                if best[0]:
                    self.src, self.len, self.near = best[1], best[0], True
                    return
            if cp["oldest_from"] and L >= cp["oldest_from"]:
                self.src = oldest
                return
        self.src = recent

    def hazard(self, m: float) -> float:
        h = 1.0 - self.cp["hazard_c"] / (m + self.cp["hazard_d"])
        return h if h > 0.0 else 0.0

    def draft(self, max_tokens: int):
        if self.src is None:
            return [], [], 0.0, 0
        x, n = self.x, len(self.x)
        m = self.len + (self.cp["near_bonus"] if self.near else 0.0)
        m_first = self.len + (self.cp["near_first_bonus"] if self.near else 0.0)
        toks, probs, p, s = [], [], 1.0, 0.0
        for k in range(min(max_tokens, n)):
            p *= self.hazard(m_first if k == 0 else m + k)
            if p < self.cp["min_prob"]:
                break
            pos = self.src + k
            toks.append(x[pos] if pos < n else toks[pos - n])
            probs.append(p)
            s += p
        return toks, probs, s, self.len if toks else 0


def oracle_draft(local: list[int], cached: list[tuple[int, list[int]]], depth, max_tokens, spec, copy=None,
                 fill=False):
    factor, offset, min_prob = spec
    table = Table([(0, local)], depth)
    best = table.draft(local, max_tokens, factor, offset, min_prob)
    if cached:
        other_table = Table(cached, depth)
        other = other_table.draft(local, max_tokens, factor, offset, min_prob)
        if other[2] > best[2]:
            best, table = other, other_table
    filled = continued(table, local, best, depth, max_tokens) if fill else None
    if copy is None:
        return best if filled is None else filled
    return with_copy(best, RefCopier(local, depth, copy), max_tokens, filled)


def continued(table: Table, ctx, draft, depth: int, max_tokens: int):
    """`fill`: the count draft's path followed on with no probability floor and no budget, up to max_tokens or
    the tree's depth (Tree::continue_path)."""
    toks, probs, score, L = draft
    if not toks:
        return draft
    s = tuple(ctx[len(ctx) - L:]) + tuple(toks)
    more, more_p, _ = table.follow(s, min(max_tokens, depth - L) - len(toks), 0.0, p=probs[-1])
    return toks + more, probs + more_p, score, L


def with_copy(best, copier: RefCopier, max_tokens: int, filled=None):
    """The count draft `best` against the copy draft: the count score is discounted by the copy
    hazard of its match length, and the copy wins ties. A count draft that wins carries the same
    reliability in its probabilities: token k's path probability times h(L) * ... * h(L + k). Where both
    candidates exist and start with different tokens, the winner's probabilities are times disagree_factor.
    `filled` (the count draft continued, under `fill`): the winner is filled after the choice, a copy by copying
    on with no floor."""
    score = 0.0
    for k, p in enumerate(best[1]):
        score += p * copier.hazard(best[3] + k)
    mine = copier.draft(max_tokens)
    agreement = copier.cp["disagree_factor"] if best[0] and mine[0] and best[0][0] != mine[0][0] else 1.0
    if mine[0] and mine[2] >= score:
        if filled is not None and len(mine[0]) < max_tokens:
            floor, copier.cp = copier.cp, {**copier.cp, "min_prob": 0.0}
            more = copier.draft(max_tokens)
            copier.cp = floor
            mine = (more[0], more[1], mine[2], more[3])
        return mine[0], [p * agreement for p in mine[1]], mine[2], mine[3]
    if filled is not None:
        best = filled
    probs, h = [], agreement
    for k, p in enumerate(best[1]):
        h *= copier.hazard(best[3] + k)
        probs.append(p * h)
    return best[0], probs, score, best[3]


def core_copy_args(cp: dict | None) -> dict:
    """SuffixCache keyword arguments for copy parameters (None: copy drafts off)."""
    if cp is None:
        return {"copy": False}
    return {"copy": True, **{f"copy_{k}": v for k, v in cp.items()}}


def same(got, want):
    assert list(got[0]) == list(want[0])
    assert list(got[1]) == list(want[1])  # bit-identical: same operations in the same order
    assert got[2] == want[2] and got[3] == want[3]


# ---- strategies ---------------------------------------------------------------------------------
tokens = st.lists(st.integers(0, 3), max_size=24)
copy_params = st.one_of(
    st.none(),
    st.just(COPY_DEFAULTS),
    st.fixed_dictionaries(
        {
            "min_prob": st.sampled_from([0.0, 0.05, 0.3]),
            "window": st.integers(0, 6),
            "near_len": st.integers(0, 4),
            "anchor_run": st.integers(0, 3),
            "oldest_from": st.integers(0, 3),
            "near_bonus": st.sampled_from([0.0, 2.0]),
            "near_first_bonus": st.sampled_from([0.0, 0.5, 2.0]),
            "hazard_c": st.sampled_from([0.0, 1.3, 3.0]),
            "hazard_d": st.sampled_from([0.0, 0.8]),
            "disagree_factor": st.sampled_from([0.0, 0.5, 1.0]),
        }
    ),
)
spec_params = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0, 1.7, 3.0]),
    st.sampled_from([-2.0, 0.0, 0.5, 2.0]),
    st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
)


# ---- the tree on its own: counts, drafts, FIFO eviction, interleaved growth ----------------------
@SETTINGS
@given(
    depth=st.integers(1, 9),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 0), tokens),
            st.tuples(st.just("extend"), st.integers(0, 7), tokens.filter(bool)),
            st.tuples(st.just("evict"), st.integers(0, 0), st.just([])),
        ),
        max_size=10,
    ),
    queries=st.lists(st.tuples(tokens, st.integers(0, 10), spec_params), min_size=1, max_size=4),
)
def test_tree_matches_oracle(depth, ops, queries):
    tree = _testing.SuffixTree(depth)
    live: list[list] = []  # [handle, order, tokens], oldest first
    order = 0
    for kind, idx, toks in ops:
        touched = None
        if kind == "add":
            live.append([tree.add(toks), order, list(toks)])
            order += 1
            touched = live[-1]
        elif kind == "extend" and live:
            entry = live[idx % len(live)]
            tree.extend(entry[0], toks)
            entry[2] += toks
            touched = entry
        elif kind == "evict" and live:
            assert tree.remove_oldest() == live.pop(0)[0]
        tree.check()
        if touched is not None:
            check_repeat(tree, live, touched, depth, exact_oldest=len(live) == 1 and order == 1)
    seqs = [(o, x) for _, o, x in live]
    table = Table(seqs, depth)
    assert tree.num_seqs == len(live)
    for s, c in table.count.items():
        assert tree.count(list(s)) == c
    assert tree.num_nodes <= 2 * sum(len(x) for _, x in seqs) + 1  # at most 2 nodes per suffix
    for ctx, max_tokens, (factor, offset, min_prob) in queries:
        for c in [ctx] + [x[: len(x) // 2] for _, x in seqs[:2]]:
            got = tree.speculate(c, max_tokens, factor, offset, min_prob)
            want = table.draft(c, max_tokens, factor, offset, min_prob) if seqs else ([], [], 0.0, 0)
            same(got, want)


def check_repeat(tree, live, entry, depth, exact_oldest):
    """The tree's longest earlier-occurring tail of `entry` (as of its last append) by brute force
    over all live sequences; the oldest occurrence is exact in a tree that only ever held one sequence."""
    handle, order, x = entry
    got = tree.repeat(handle)
    if not x:
        assert got[0] == 0
        return
    n = len(x)
    occ = []  # (order, start) of other occurrences of the longest tail
    for L in range(min(depth, n), 0, -1):
        tail = x[n - L :]
        occ = [
            (o, s, h)
            for h, o, y in live
            for s in range(len(y) - L + 1)
            if y[s : s + L] == tail and not (h == handle and s == n - L)
        ]
        if occ:
            break
    if not occ:
        assert got[0] == 0
        return
    o, s, h = max(occ)
    assert got[:3] == (L, h, s + L)
    if exact_oldest:
        assert got[3] == min(occ)[1] + L


# ---- requests: per-request tree + global FIFO cache ---------------------------------------------
@SETTINGS
@given(
    depth=st.integers(2, 8),
    max_cached=st.integers(0, 3),
    in_flight=st.booleans(),
    spec=spec_params,
    copy=copy_params,
    ops=st.lists(
        st.tuples(st.sampled_from(["start", "append", "append", "finish"]), st.integers(0, 3), tokens),
        max_size=14,
    ),
    max_tokens=st.integers(0, 8),
    fill=st.booleans(),
)
def test_cache_matches_oracle(depth, max_cached, in_flight, spec, copy, ops, max_tokens, fill):
    factor, offset, min_prob = spec
    core = _core.SuffixCache(depth, max_cached, in_flight, factor, offset, min_prob, **core_copy_args(copy))
    core.set_fill(fill)
    active: dict[int, dict] = {}  # key -> {"tokens", "prompt", "slot"}
    cached: list[dict] = []  # global sequences, oldest first: {"order", "tokens", "owner"}
    order = 0

    def make_room():
        while cached and len(cached) >= max_cached:
            gone = cached.pop(0)
            if gone["owner"] is not None:
                active[gone["owner"]]["slot"] = None

    for kind, key, toks in ops:
        if kind == "start" and key not in active:
            core.start(key, toks)
            active[key] = {"tokens": list(toks), "prompt": len(toks), "slot": None}
            if in_flight and max_cached > 0:
                make_room()
                slot = {"order": order, "tokens": [], "owner": key}
                order += 1
                cached.append(slot)
                active[key]["slot"] = slot
        elif kind == "append" and key in active:
            core.append(key, toks)
            active[key]["tokens"] += toks
            if active[key]["slot"] is not None:
                active[key]["slot"]["tokens"] += toks
        elif kind == "finish":
            assert core.finish(key) == (key in active)
            req = active.pop(key, None)
            if req is not None:
                if req["slot"] is not None:
                    req["slot"]["owner"] = None
                elif not in_flight and max_cached > 0 and len(req["tokens"]) > req["prompt"]:
                    make_room()
                    cached.append({"order": order, "tokens": req["tokens"][req["prompt"] :], "owner": None})
                    order += 1
        _testing.check(core)
        assert core.num_cached == len(cached) and core.num_active == len(active)
        for k, req in active.items():
            want = oracle_draft(
                req["tokens"], [(c["order"], c["tokens"]) for c in cached], depth, max_tokens, spec, copy, fill
            )
            same(core.speculate(k, max_tokens), want)
            if copy is not None:
                ref = RefCopier(req["tokens"], depth, copy)
                assert core._copy_state(k) == (
                    -1 if ref.src is None else ref.src, ref.len, -1 if ref.anchor is None else ref.anchor, ref.near
                )


# ---- the Proposer protocol ----------------------------------------------------------------------
@SETTINGS
@given(
    prompt=tokens,
    steps=st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=4), st.integers(0, 6)), max_size=8),
    as_array=st.booleans(),
)
def test_propose_follows_the_request_lifecycle(prompt, steps, as_array):
    p = SuffixTreeProposer(max_depth=8, max_cached_requests=2)
    p.start("warm", [0, 1, 2, 3, 0, 1, 2, 3])
    p.append("warm", [0, 1, 2])
    p.finish("warm")  # caches the response [0, 1, 2]
    ctx = list(prompt)
    for i, (new, cap) in enumerate([([], 4)] + steps):
        ctx += new
        seen = np.asarray(ctx, dtype=np.int32) if as_array else list(ctx)
        req = DraftRequest("r", seen, num_new=len(ctx) if i == 0 else len(new), max_draft=cap)
        (draft,) = p.propose([req])
        check_drafts([req], [draft])
        want = oracle_draft(ctx, [(0, [0, 1, 2])], 8, cap, (1.0, 0.0, 0.1), COPY_DEFAULTS)
        # Draft.confidence is conditional per position: the oracle's path probabilities, divided stepwise.
        assert draft.tokens == want[0] and draft.confidence == _conditional(want[1]) and draft.probs is None
    p.finish("r")
    stats = p.stats()
    assert stats["active_requests"] == 0 and stats["cached_requests"] == 1 + (len(ctx) > len(prompt))


def test_propose_batches_requests_and_restarts_finished_ids():
    p = create_proposer("suffix_tree", {"max_depth": 16, "copy_drafts": False})  # count drafts only
    a = [5, 6, 7, 8, 5, 6, 7]
    b = [1, 2, 3, 1, 2]
    drafts = p.propose([DraftRequest("a", a, len(a), 3), DraftRequest("b", b, len(b), 0)])
    assert drafts[0].tokens == [8, 5, 6] and drafts[1].tokens == []
    # count([5,6,7,8]) / count([5,6,7]) = 0.5, then a single path: each later token is certain given the last.
    assert drafts[0].confidence == [0.5, 1.0, 1.0]
    assert p.speculate("a", 3)[1] == [0.5, 0.5, 0.5]  # the low-level API gives path probabilities
    p.propose([DraftRequest("a", a + [8, 9], 2, 3)])
    p.finish("a")
    p.finish("never-seen")  # ignored
    # A new request drafts from the finished response (tokens after its prompt: [8, 9]).
    (d,) = p.propose([DraftRequest("a", [4, 8], 2, 3)])
    assert d.tokens == [9] and d.confidence == [1.0]
    # An inconsistent context (3 tokens, but 2 seen + num_new=2) restarts the request instead of failing.
    (d,) = p.propose([DraftRequest("a", [4, 8, 9], 2, 3)])
    # "b" is still active; the replaced "a" had no response beyond its prompt, so nothing new is cached.
    assert p.stats()["active_requests"] == 2 and p.stats()["cached_requests"] == 1


def test_count_drafts_carry_the_match_length_reliability_and_the_kind_is_reported():
    p = create_proposer("suffix_tree", {"max_depth": 16})  # copy drafts on: counts get the same reliability
    ctx = [1, 2, 3, 9, 4, 5, 6, 1, 2, 3, 7]
    # The tail [..., 3, 7] never occurred in the request's own text: no copy. The global tree holds the
    # response [3, 7, 8, 9]: a count draft from the match [3, 7] (length 2, so a budget of 2 tokens).
    p.start("old", [0])
    p.append("old", [3, 7, 8, 9])
    p.finish("old")
    (d,) = p.propose([DraftRequest("r", ctx, len(ctx), 4)])
    assert p.draft_kind("r") == "count" and d.tokens == [8, 9]
    hazard = lambda m: 1.0 - 1.3 / (m + 0.8)  # the copy hazard's defaults, h(m)
    # Count ratios 1 and 1 (one occurrence): the confidences are h(2) and h(3) alone.
    assert d.confidence == pytest.approx([hazard(2), hazard(3)])
    (d,) = p.propose([DraftRequest("r", ctx + [1, 2, 3], 3, 4)])  # a repeat of its own text: a copy
    assert p.draft_kind("r") == "copy" and d.tokens[:1] in ([9], [7])  # after one of its two occurrences
    with pytest.raises(ValueError, match="not active"):
        p.draft_kind("never-seen")


def test_low_level_api_and_stats():
    p = SuffixTreeProposer(max_depth=32, max_cached_requests=1, copy_drafts=False)
    p.start(1, [10, 11, 12, 13])
    p.append(1, [10, 11])
    assert p.speculate(1, 5) == ([12, 13], [0.5, 0.5], 1.0, 2)
    assert p.speculate(1, 0) == ([], [], 0.0, 0)
    p.finish(1)
    p.start(2, [])
    assert p.speculate(2, 5) == ([], [], 0.0, 0)  # empty prompt: empty drafts
    p.append(2, [11])
    assert p.speculate(2, 5) == ([], [], 0.0, 0)  # global holds [10, 11]: nothing follows 11
    p.append(2, [7, 10])
    assert p.speculate(2, 5) == ([11], [1.0], 1.0, 1)
    s = p.stats()
    assert s["active_requests"] == 1 and s["cached_requests"] == 1 and s["nodes"] > 0 and s["memory_bytes"] > 0


def test_max_cached_zero_disables_the_global_tree():
    p = SuffixTreeProposer(max_cached_requests=0)
    p.start("a", [1])
    p.append("a", [2, 3, 4])
    p.finish("a")
    p.start("b", [2, 3])
    assert p.speculate("b", 4) == ([], [], 0.0, 0)
    assert p.stats()["cached_requests"] == 0


def test_drafts_are_deterministic_across_instances():
    rng = random.Random(7)
    seqs = [[rng.randrange(6) for _ in range(300)] for _ in range(5)]
    outs = []
    for _ in range(2):
        p = SuffixTreeProposer(max_depth=24, max_cached_requests=3)
        for i, s in enumerate(seqs):
            p.start(i, s[:100])
            p.append(i, s[100:])
            p.finish(i)
        p.start("q", seqs[0][:50])
        outs.append([p.speculate("q", 8)] + [p.speculate("q", k) for k in range(4)])
    assert outs[0] == outs[1]


# ---- one very long context ----------------------------------------------------------------------
def positions_draft(x: np.ndarray, ctx: np.ndarray, depth, max_tokens, factor, offset, min_prob):
    """The oracle for one long sequence x, with occurrence positions instead of a substring table."""
    n = len(x)
    best = ([], [], 0.0, 0)
    pos = np.arange(n + 1)  # starts of the empty string, including the end
    for L in range(1, min(len(ctx), depth - 1) + 1):
        pos = pos[pos >= 1] - 1
        pos = pos[x[pos] == ctx[len(ctx) - L]]
        if pos.size == 0:
            break
        budget = max(0, min(max_tokens, math.floor(L * factor + offset + 1e-6)))
        cur, d, p, toks, probs, score = pos, L, 1.0, [], [], 0.0
        while len(toks) < min(budget, depth - L):
            ok = cur[cur + d < n]
            if ok.size == 0:
                break
            nxt = x[ok + d]
            counts = np.bincount(nxt)
            top = counts.max()
            winners = np.flatnonzero(counts == top)
            # most recent occurrence among the tied continuations (single sequence: largest start)
            c = max(winners, key=lambda t: ok[nxt == t].max())
            p *= int(top) / cur.size
            if p < min_prob:
                break
            toks.append(int(c))
            probs.append(p)
            score += p
            cur, d = ok[nxt == c], d + 1
        if toks and score >= best[2]:
            best = (toks, probs, score, L)
    return best


def long_text(n: int, seed: int) -> np.ndarray:
    """Random text with many long, slightly edited repeats (as in code edits and agent loops)."""
    rng = np.random.default_rng(seed)
    x = list(rng.integers(0, 50, 200))
    while len(x) < n:
        if rng.random() < 0.7:
            a = int(rng.integers(0, len(x) - 10))
            seg = x[a : a + int(rng.integers(5, 120))]
            x += [int(rng.integers(0, 50)) if rng.random() < 0.03 else t for t in seg]
        else:
            x += list(rng.integers(0, 50, int(rng.integers(1, 30))))
    return np.asarray(x[:n], dtype=np.int64)


def test_very_long_context_matches_oracle():
    x = long_text(120_000, seed=1)
    p = SuffixTreeProposer(
        max_depth=64, max_cached_requests=4, max_spec_factor=2.0, min_token_prob=0.05, copy_drafts=False
    )
    p.start("long", x[:60_000])
    for a in range(60_000, 120_000, 7_500):
        p.append("long", x[a : a + 7_500])
        n = a + 7_500
        got = p.speculate("long", 24)
        same(got, positions_draft(x[:n], x[:n], 64, 24, 2.0, 0.0, 0.05))
    p.finish("long")
    # The response (tokens after the 60k prompt) is in the global tree; draft a fresh context from it.
    resp = x[60_000:]
    ctx = np.concatenate([[7, 7, 7], resp[30_000:30_040]])
    p.start("next", ctx)
    got = p.speculate("next", 24)
    want_local = positions_draft(ctx, ctx, 64, 24, 2.0, 0.0, 0.05)
    want_global = positions_draft(resp, ctx, 64, 24, 2.0, 0.0, 0.05)
    same(got, want_global if want_global[2] > want_local[2] else want_local)
    assert got[3] >= 40  # the whole tail matched
    assert p.stats()["nodes"] <= 2 * (60_000 + len(ctx)) + 2


def test_copy_drafts_on_a_long_edited_context_match_the_oracle():
    x = long_text(3_000, seed=2)
    p = SuffixTreeProposer(max_depth=64, max_cached_requests=0)  # copy drafts on (the default)
    ref = RefCopier(x[:1_000], 64, COPY_DEFAULTS)
    p.start("r", x[:1_000])
    kinds = set()
    for a in range(1_000, 3_000, 97):
        p.append("r", x[a : a + 97])
        ref.feed(x[a : a + 97])
        n = min(a + 97, 3_000)
        tree = positions_draft(x[:n], x[:n], 64, 16, 1.0, 0.0, 0.1)
        same(p.speculate("r", 16), with_copy(tree, ref, 16))
        kinds.add((ref.src is not None, ref.near))
    assert kinds >= {(True, False), (True, True)}  # both ways of choosing the source were exercised


def test_copy_drafts_resume_after_an_edit_and_repeat_loops():
    # A loop: the copy continues past the end of the context by repeating itself.
    p = SuffixTreeProposer(max_depth=16, copy_drafts=True)
    p.start("loop", [1, 2, 3, 1, 2, 3, 1, 2])
    toks, probs, score, match_len = p.speculate("loop", 16)
    assert toks == [3, 1, 2, 3, 1, 2, 3, 1] and match_len == 5  # never longer than the context (8)
    assert probs == sorted(probs, reverse=True) and score == sum(probs)
    # An edit: a rewrite of 0..39 replaces 20 by 99. The prompt also has "21, 7, 7, 7" at its end, so
    # the most recent "21" continues with 7; the copy resumes after the edit point instead.
    prompt = list(range(40)) + [21, 7, 7, 7]
    resumed = []
    for window in (16, 0):
        p = SuffixTreeProposer(copy_window=window, max_cached_requests=0)
        p.start("edit", prompt + list(range(20)))
        assert p.speculate("edit", 4)[0] == [20, 21, 22, 23]  # copying
        p.append("edit", [99, 21])  # the target wrote 99 instead of 20, then went on with 21
        resumed.append(p.speculate("edit", 4)[0])
    assert resumed == [[22, 23, 24, 25], [7, 7, 7, 0]]
    # The resumed copy is a near copy of a one-token match: its first token counts near_first_bonus (0.5)
    # more matches, the next ones near_bonus (2); with the first bonus at 2 it is the old, single-bonus draft.
    h = lambda m: 1.0 - 1.3 / (m + 0.8)
    # The count draft says 7 after 21 (the prompt's end), the copy 22: they disagree, and copy_disagree_factor
    # scales the copy's path probabilities -- the same tokens, the same score.
    for first, disagree, want in ((0.5, 1.0, [h(1.5), h(1.5) * h(4)]), (2.0, 1.0, [h(3), h(3) * h(4)]),
                                  (0.5, 0.5, [h(1.5) / 2, h(1.5) * h(4) / 2])):
        p = SuffixTreeProposer(max_cached_requests=0, copy_near_first_bonus=first, copy_disagree_factor=disagree)
        p.start("edit", prompt + list(range(20)) + [99, 21])
        assert p._core._copy_state(p._key("edit"))[3]  # near
        toks, probs, score, match_len = p.speculate("edit", 2)
        assert toks == [22, 23] and match_len == 1 and probs == pytest.approx(want)
        assert score == pytest.approx(h(1.5) + h(1.5) * h(4) if first == 0.5 else h(3) + h(3) * h(4))


def test_copy_drafts_off_is_the_count_model():
    rng = random.Random(3)
    x = [rng.randrange(5) for _ in range(60)]
    on, off = SuffixTreeProposer(max_depth=12), SuffixTreeProposer(max_depth=12, copy_drafts=False)
    for q in (on, off):
        q.start("a", x[:30])
        q.append("a", x[30:])
    want = oracle_draft(x, [], 12, 6, (1.0, 0.0, 0.1))
    same(off.speculate("a", 6), want)
    same(on.speculate("a", 6), oracle_draft(x, [], 12, 6, (1.0, 0.0, 0.1), COPY_DEFAULTS))


# ---- bounded memory -----------------------------------------------------------------------------
def test_memory_stays_bounded_over_100k_requests():
    max_cached, max_len = 64, 24
    p = SuffixTreeProposer(max_depth=16, max_cached_requests=max_cached)
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 40, size=(512, max_len))
    lens = rng.integers(1, max_len + 1, size=100_000)
    core = p._core
    marks = {}
    for i in range(100_000):
        core.start(i, pool[i % 511, :4])
        core.append(i, pool[(i * 7) % 512, : lens[i]])
        core.finish(i)
        if (i + 1) % 10_000 == 0 or i + 1 == 1_000:
            marks[i + 1] = (core.num_cached, core.global_nodes, core.memory_bytes)
    for cached, nodes, mem in marks.values():
        assert cached == max_cached
        # at most 2 nodes per stored suffix, plus the root
        assert nodes <= 2 * max_cached * max_len + 1
        # per stored token: 2 nodes (40 B) and 2 child-map slots (16 B at load >= 1/4), tokens and
        # endpoints (8 B), doubled for vector growth -> < 400 B
        assert mem <= 400 * max_cached * max_len + 64 * 1024
    assert p.stats()["active_requests"] == 0


# ---- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, field",
    [
        ({"max_depth": 0}, "max_depth"),
        ({"max_depth": 4097}, "max_depth"),
        ({"max_depth": True}, "max_depth"),
        ({"max_depth": "64"}, "max_depth"),
        ({"max_cached_requests": -1}, "max_cached_requests"),
        ({"max_spec_factor": -0.5}, "max_spec_factor"),
        ({"max_spec_factor": float("nan")}, "max_spec_factor"),
        ({"max_spec_offset": float("inf")}, "max_spec_offset"),
        ({"min_token_prob": 1.5}, "min_token_prob"),
        ({"tie_break": "oldest"}, "tie_break"),
        ({"copy_drafts": "yes"}, "copy_drafts"),
        ({"copy_min_prob": 1.5}, "copy_min_prob"),
        ({"copy_window": -1}, "copy_window"),
        ({"copy_hazard_c": float("nan")}, "copy_hazard_c"),
        ({"copy_near_first_bonus": -0.5}, "copy_near_first_bonus"),
        ({"copy_disagree_factor": 1.5}, "copy_disagree_factor"),
        ({"interleave": 0}, "interleave"),
        ({"interleave": 33}, "interleave"),
        ({"max_ngram": 3}, "max_ngram"),
    ],
)
def test_bad_options_fail_with_the_field_name(options, field):
    with pytest.raises(ValueError, match=field):
        SuffixTreeProposer(**options)
    with pytest.raises(ValueError, match=rf"proposer_options\[suffix_tree\]\.{field}"):
        create_proposer("suffix_tree", options)


@pytest.mark.parametrize(
    "bad, msg",
    [
        ([1, -1], r"position 1 must be an integer in \[0, 2\*\*31\), got -1"),
        ([2**31], r"position 0 .* got 2147483648"),
        ([2**70], r"position 0"),
        ([1, 2.5], r"position 1 .* got 2.5"),
        ([True], r"position 0 .* got True"),
        (["7"], r"position 0"),
        ("abc", r"got a string"),
        (5, r"expected a sequence of token ids"),
        (np.array([1.0, 2.0]), r"dtype float64"),
        (np.zeros((2, 2), dtype=np.int64), r"1-D"),
        (np.array([3, -4], dtype=np.int64), r"position 1 .* got -4"),
        (np.array([2**32 - 1], dtype=np.uint32), r"got 4294967295"),
    ],
)
def test_bad_token_ids_raise_before_any_change(bad, msg):
    p = SuffixTreeProposer()
    with pytest.raises(ValueError, match=msg):
        p.start("a", bad)
    assert p.stats()["active_requests"] == 0
    p.start("a", [1, 2])
    with pytest.raises(ValueError, match=msg):
        p.append("a", bad)
    assert p._core.length(0) == 2
    with pytest.raises(ValueError, match=msg):
        _testing.SuffixTree(8).speculate(bad, 4)


def test_accepts_numpy_integer_inputs_of_any_width():
    p = SuffixTreeProposer(max_depth=8)
    p.start("a", np.array([1, 2, 3, 1, 2], dtype=np.int16))
    p.append("a", [np.int64(3), np.uint8(1)])
    p.append("a", np.array([2], dtype=np.uint64))
    assert p._core.length(0) == 8
    assert p.speculate("a", 3)[0] == [3, 1, 2][: len(p.speculate("a", 3)[0])]


def test_misuse_of_the_low_level_api():
    p = SuffixTreeProposer()
    with pytest.raises(ValueError, match=r"request 'x' is not active"):
        p.speculate("x", 3)
    with pytest.raises(ValueError, match=r"request 'x' is not active"):
        p.append("x", [1])
    p.start("x", [1])
    with pytest.raises(ValueError, match=r"already started"):
        p.start("x", [1])
    with pytest.raises(ValueError, match=r"max_tokens: expected an integer >= 0"):
        p.speculate("x", -1)
    with pytest.raises(ValueError, match=r"max_depth: expected an integer in \[1, 4096\]"):
        _testing.SuffixTree(0)
    with pytest.raises(ValueError, match=r"min_token_prob"):
        _testing.SuffixTree(8).speculate([1], 2, 1.0, 0.0, 2.0)
    with pytest.raises(ValueError, match=r"empty"):
        _testing.SuffixTree(8).remove_oldest()
    p.finish("x")
    p.finish("x")  # twice: ignored


def test_the_cores_defaults_are_the_options_defaults():
    """Each knob has one default: the compiled core's (CacheOptions, CopyParams: what the step driver and the
    test-only tree use) is the proposer option's, and the copy hazard is the n-gram proposer's too."""
    from spec_plugins.proposers.ngram import _core as ngram_core

    options = SuffixTreeProposer.Options()
    assert _core.DEFAULTS == {name: getattr(options, name) for name in _core.DEFAULTS}
    assert _testing.SuffixTree().max_depth == options.max_depth == 24
    assert (ngram_core.HAZARD_C, ngram_core.HAZARD_D) == (_core.HAZARD_C, _core.HAZARD_D) == (1.3, 0.8)


def test_the_engines_core_carries_no_test_code():
    """The tree on its own and the invariant checks are in the test-only module, which the proposer never loads."""
    import subprocess
    import sys

    assert not any(hasattr(_core, name) for name in ("SuffixTree", "_check", "_canonical"))
    assert not hasattr(_core.SuffixCache, "_check") and not hasattr(_core.SuffixCache, "_canonical")
    script = ("import sys; from spec_plugins.proposers.suffix_tree import SuffixTreeProposer; SuffixTreeProposer(); "
              "print('spec_plugins.proposers.suffix_tree._testing' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_reused_request_id_with_unrelated_context_starts_over():
    """An engine that keys requests by batch row reuses ids: the proposer must not fail, and the
    old request's response goes to the global tree as if it had finished."""
    from spec_plugins.core import DraftRequest
    from spec_plugins.proposers.suffix_tree import SuffixTreeProposer

    p = SuffixTreeProposer()
    first = [1, 2, 3, 4, 1, 2, 3]
    p.propose([DraftRequest("row-0", first, len(first), max_draft=4)])
    p.propose([DraftRequest("row-0", first + [4], 1, max_draft=4)])
    other = [9, 8, 7, 9, 8]  # a new request in the same row: not first + 1 token
    drafts = p.propose([DraftRequest("row-0", other, 1, max_draft=4)])
    assert drafts[0].tokens == [7, 9, 8, 7][: len(drafts[0].tokens)] and len(drafts[0].tokens) <= 4
    stats = p.stats()
    assert stats["active_requests"] == 1 and stats["cached_requests"] == 1


_DRAFTS_SCRIPT = """
import json, random
from spec_plugins.core import DraftRequest
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer
rng = random.Random(11)
p = SuffixTreeProposer(max_cached_requests=4)
out = []
for r in range(12):
    req = f"request-{r}"  # string ids: their hashes differ between processes
    seq = [rng.randrange(8) for _ in range(200)]
    for n in range(20, 200, 7):
        (d,) = p.propose([DraftRequest(req, seq[:n], n if n == 20 else 7, 8)])
        out.append([d.tokens, [round(c, 12) for c in d.confidence or []]])
    p.finish(req)
print(json.dumps(out))
"""


def test_drafts_identical_across_processes_with_different_hash_seeds():
    # Under tensor parallelism every rank runs its own proposer: drafts must not depend on the
    # process (hash randomisation of string request ids, allocation order).
    import os
    import subprocess
    import sys

    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.append(subprocess.run([sys.executable, "-c", _DRAFTS_SCRIPT], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert outs[0] == outs[1]
    assert sum(len(tokens) > 0 for tokens, _ in json.loads(outs[0])) > 50  # real drafts were compared


def test_fill_continues_the_chosen_draft_where_every_slot_is_verified():
    """`fill` drafts all max_draft tokens: the count draft's path goes on past the budget and the probability
    floor, a copy past copy_min_prob; the confident prefix is the unfilled draft. `auto` follows the runner."""
    p = create_proposer("suffix_tree", {"max_depth": 16, "copy_drafts": False})
    filled = create_proposer("suffix_tree", {"max_depth": 16, "copy_drafts": False, "fill": True})
    for prop in (p, filled):
        prop.start("old", [0])
        prop.append("old", [3, 7, 8, 9, 10, 11, 12, 13])
        prop.finish("old")
    ctx = [1, 2, 3, 7]
    (d,) = p.propose([DraftRequest("r", ctx, len(ctx), 6)])
    (f,) = filled.propose([DraftRequest("r", ctx, len(ctx), 6)])
    assert d.tokens == [8, 9]  # the match [3, 7] has a budget of 2 tokens
    assert f.tokens == [8, 9, 10, 11, 12, 13] and f.confidence == [1.0] * 6
    # A copy of the request's own text, past where its path probability falls under copy_min_prob (0.05).
    loop = [5, 6, 7, 8, 9, 5, 6]
    copies = {fill: create_proposer("suffix_tree", {"fill": fill}) for fill in (False, True)}
    got = {fill: c.propose([DraftRequest("r", loop, len(loop), 12)])[0] for fill, c in copies.items()}
    assert copies[True].draft_kind("r") == "copy"
    short, full = got[False].tokens, got[True].tokens
    assert len(short) < 12 and len(full) == min(12, len(loop)) and full[: len(short)] == short
    assert full == [7, 8, 9, 5, 6, 7, 8][: len(full)]
    conf = got[True].confidence
    assert all(0.0 <= c <= 1.0 for c in conf) and conf[: len(short)] == got[False].confidence
    # auto: off until the adapter says the runner verifies every slot (vLLM 0.34's Model Runner V2), then on.
    auto = create_proposer("suffix_tree", {})
    assert not auto.fills
    auto.runner_verifies_all(True)
    assert auto.fills
    auto.runner_verifies_all(False)
    assert not auto.fills
    off = create_proposer("suffix_tree", {"fill": False})
    off.runner_verifies_all(True)
    assert not off.fills
