"""The batched drafting path (`propose_batch`, one compiled call per step) against the per-request path,
and the drafting layer's ledger, with plain objects."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_plugins.core import BatchDrafts, Draft, DraftBatch, DraftRequest, FixedLength
from spec_plugins.drafting import DraftingLayer
from spec_plugins.proposers.ngram import NgramProposer
from spec_plugins.proposers.ngram.proposer import match_confidence
from spec_plugins.proposers.suffix_tree import SuffixTreeProposer, _testing


def scenario(seed: int, steps: int = 25):
    """Engine steps of requests that join, grow by 1-4 tokens, finish, come back under a reused id with
    another context, or show up with a context that does not follow (a recomputed request).

    Yields (step's [(req_id, context)], ids finished before the step)."""
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 12))  # small: plenty of repeats for the trees and n-grams
    live: dict[str, list[int]] = {}
    next_id = 0
    for _ in range(steps):
        finished = []
        for r in list(live):
            if rng.random() < 0.08:
                finished.append(r)
                del live[r]
        reusable = list(finished)
        while len(live) < 12 and rng.random() < 0.5:
            if reusable and rng.random() < 0.3:  # a new request under a finished one's id
                r = reusable.pop()
            else:
                r, next_id = f"req-{next_id}", next_id + 1
            live[r] = rng.integers(0, vocab, size=int(rng.integers(1, 60))).tolist()
        for r, ctx in live.items():
            if rng.random() < 0.05:  # recomputed: a context that is not the old one plus new tokens
                live[r] = rng.integers(0, vocab, size=len(ctx) + 1).tolist()
            else:
                ctx.extend(rng.integers(0, vocab, size=int(rng.integers(1, 5))).tolist())
        order = list(live)
        rng.shuffle(order)
        yield [(r, list(live[r])) for r in order], finished, rng


def num_new(seen: dict, req_id, ctx) -> int:
    return len(ctx) if req_id not in seen else len(ctx) - seen[req_id]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["matrix32", "matrix64", "lists"]), st.sampled_from([0, 1, 5]),
       st.sampled_from([1, 2, 5, 16]))
def test_suffix_tree_batch_drafts_equal_per_request_drafts(seed, layout, threads, interleave):
    """threads 5: most steps have fewer groups of `interleave` requests than workers (only some are woken)."""
    opts = {"max_depth": 12, "max_cached_requests": 5}
    single = SuffixTreeProposer(**opts)
    batched = SuffixTreeProposer(**opts, threads=threads, parallel_from=1, interleave=interleave)
    seen: dict = {}
    for step, finished, rng in scenario(seed):
        for r in finished:
            single.finish(r)
            batched.finish(r)
            seen.pop(r, None)
        ids = [r for r, _ in step]
        ctxs = [c for _, c in step]
        new = [num_new(seen, r, c) for r, c in step]
        caps = rng.integers(0, 9, size=len(step))
        want = single.propose([DraftRequest(r, c, n, int(k)) for r, c, n, k in zip(ids, ctxs, new, caps)])
        got = batched.propose_batch(make_batch(ids, ctxs, new, caps, layout, rng))
        assert got.lists() == [d.tokens for d in want]
        assert got.confidence.tolist() == [c for d in want for c in d.confidence]
        _testing.check(batched._core)  # the trees the interleaved appends built are well formed
        for r, c in step:
            seen[r] = len(c)
    assert batched.stats() == single.stats()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["matrix32", "matrix64", "lists"]), st.sampled_from([1, 5]))
def test_ngram_batch_drafts_equal_per_request_drafts(seed, layout, threads):
    single = NgramProposer(min_ngram=1, max_ngram=4)
    batched = NgramProposer(min_ngram=1, max_ngram=4, parallel_from=2, threads=threads)
    for step, _, rng in scenario(seed, steps=8):
        ids, ctxs = [r for r, _ in step], [c for _, c in step]
        caps = rng.integers(0, 9, size=len(step))
        want = single.propose([DraftRequest(r, c, len(c), int(k)) for r, c, k in zip(ids, ctxs, caps)])
        got = batched.propose_batch(make_batch(ids, ctxs, [len(c) for c in ctxs], caps, layout, rng))
        assert got.lists() == [d.tokens for d in want]
        assert [d.confidence for d in got.drafts()] == [d.confidence for d in want]  # from the match lengths


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.sampled_from(["matrix32", "matrix64", "lists"]))
def test_ngram_batch_equals_the_reference_on_long_sparse_contexts(seed, min_ngram, layout):
    """Hundreds of tokens from larger vocabularies, the end's n-gram often planted earlier: most 32-position
    blocks of the compiled scan hold no candidate and are skipped whole, and drafts still equal the numpy
    reference's (`match`), for every min_ngram (from 2 the scan tests the last two tokens)."""
    rng = np.random.default_rng(seed)
    prop = NgramProposer(min_ngram=min_ngram, max_ngram=min_ngram + int(rng.integers(0, 4)), parallel_from=2)
    ctxs = []
    for _ in range(int(rng.integers(1, 9))):
        ctx = rng.integers(0, int(rng.integers(20, 400)), size=int(rng.integers(1, 700)))
        for _ in range(int(rng.integers(0, 3))):  # copies of the end's last m tokens somewhere before it
            m = int(rng.integers(1, 7))
            if len(ctx) > 2 * m:
                at = int(rng.integers(0, len(ctx) - 2 * m))
                ctx[at : at + m] = ctx[-m:]
        ctxs.append(ctx.tolist())
    caps = rng.integers(0, 9, size=len(ctxs))
    ids = [f"r{i}" for i in range(len(ctxs))]
    got = prop.propose_batch(make_batch(ids, ctxs, [len(c) for c in ctxs], caps, layout, rng))
    want = [prop.match(np.array(c), int(k)) for c, k in zip(ctxs, caps)]
    assert got.lists() == [w[0] for w in want]
    assert [d.confidence for d in got.drafts()] == [[float(match_confidence(m))] * len(t) for t, m in want]


def make_batch(ids, ctxs, new, caps, layout, rng) -> DraftBatch:
    lens = np.array([len(c) for c in ctxs], dtype=np.int64)
    if layout == "lists":
        return DraftBatch(ids, ctxs, lens, np.array(new), caps)
    # vLLM's layout: a wider matrix, rows in any order, stale tokens past each length.
    dtype = np.int32 if layout == "matrix32" else np.int64
    width = int(lens.max()) + 5 if len(lens) else 1
    rows = rng.permutation(len(ctxs) + 2)[: len(ctxs)]
    mat = rng.integers(0, 1000, size=(len(ctxs) + 2, width)).astype(dtype)
    for row, c in zip(rows, ctxs):
        mat[row, : len(c)] = c
    return DraftBatch(ids, mat, lens, np.array(new), caps, rows=rows)


def test_suffix_tree_batch_rejects_bad_tokens_and_duplicate_ids():
    p = SuffixTreeProposer()
    with pytest.raises(ValueError, match=r"suffix_tree: contexts row 1: token id at position 2"):
        p.propose_batch(DraftBatch(["a", "b"], [[1, 2], [1, 2, -3]], np.array([2, 3]), np.array([2, 3]),
                                   np.array([4, 4])))
    with pytest.raises(ValueError, match="DraftBatch.num_new: row 0"):
        DraftBatch(["a"], [[1]], np.array([1]), np.array([2]), np.array([1]))
    layer = DraftingLayer(p, FixedLength(), who="proposer 'suffix_tree'")
    with pytest.raises(ValueError, match="appears twice"):
        layer.step(["a", "a"], [[1, 2], [1, 2]], [2, 2], max_draft=4)
    layer.step(["a", "b"], [[1, 2], [1, 2]], [2, 2], max_draft=4)  # both known from here on
    with pytest.raises(ValueError, match="^proposer 'suffix_tree': a request id appears twice in one step$"):
        layer.step(["b", "a", "b"], [[1, 2, 3]] * 3, [3, 3, 3], max_draft=4)
    assert len(layer.step(["a", "b"], [[1, 2, 1], [1, 2, 1]], [3, 3], max_draft=4)) == 2  # nothing was written


class Recorder:
    """A proposer and a policy that record what the layer hands them."""

    def __init__(self):
        self.requests, self.finished, self.observed = [], [], []

    def propose(self, requests):
        self.requests.append([(r.req_id, len(r.tokens), r.num_new, r.max_draft) for r in requests])
        return [Draft(list(range(r.max_draft))) for r in requests]

    def finish(self, req_id):
        self.finished.append(req_id)

    def caps(self, requests):
        return [min(r.max_draft, 3) for r in requests]

    def observe(self, req_id, drafted, accepted):
        self.observed.append((req_id, drafted, accepted))


def test_layer_ledger_num_new_observations_and_finishing_once():
    prop, pol = Recorder(), Recorder()
    layer = DraftingLayer(prop, pol, stale_steps=2)
    out = layer.step(["a", "b"], [[1, 2, 3], [4]], [3, 1], max_draft=[5, 2])
    assert out.lists() == [[0, 1, 2], [0, 1]]  # policy caps at 3, engine cap 2 for b
    assert prop.requests[-1] == [("a", 3, 3, 3), ("b", 1, 1, 2)]
    # a's draft verified (2 accepted), b's not yet (-1: stays pending); c joins.
    layer.step(["a", "b", "c"], [[1, 2, 3, 9, 9, 9], [4, 5], [7]], [6, 2, 1], max_draft=5, accepted=[2, -1, -1])
    assert prop.requests[-1] == [("a", 6, 3, 3), ("b", 2, 1, 3), ("c", 1, 1, 3)]
    assert pol.observed == [("a", 3, 2)]
    layer.verified(["b"], [9])  # more than drafted: credited only what was drafted
    assert pol.observed[-1] == ("b", 3, 3)
    assert layer.finish("a") and not layer.finish("a") and prop.finished == pol.finished == ["a"]
    for _ in range(3):  # b and c absent: stale after 2 steps
        layer.step(["d"], [[1]], [1], max_draft=1)
    assert sorted(prop.finished) == sorted(pol.finished) == ["a", "b", "c"] and layer.tracked() == ["d"]
    # A reused id starts over: its whole context is new.
    layer.step(["a"], [[5, 6]], [2], max_draft=1)
    assert prop.requests[-1] == [("a", 2, 2, 1)]


def test_layer_reports_only_the_slots_the_engine_verified():
    """vLLM's adaptive verification may verify fewer slots than were drafted: the policy hears of those only."""
    prop, pol = Recorder(), Recorder()
    layer = DraftingLayer(prop, pol)
    layer.step(["a", "b", "c"], [[1, 2, 3], [4, 5, 6], [7, 8, 9]], [3, 3, 3], max_draft=3)  # 3 tokens each
    # a: 2 verified, 1 accepted; b: every slot verified; c: none verified (nothing to report); d: new.
    layer.step(["a", "b", "c", "d"], [[1, 2, 3, 9, 9], [4, 5, 6, 7], [7, 8, 9, 1], [2]], [5, 4, 4, 1], max_draft=3,
               accepted=[1, 3, 0, -1], verified=np.array([2, 5, 0, 0]))
    assert pol.observed == [("a", 2, 1), ("b", 3, 3)]
    # Every request known (the ledger's compiled step): the same rule.
    layer.step(["a", "b", "c", "d"], [[1, 2, 3, 9, 9, 9], [4, 5, 6, 7, 7], [7, 8, 9, 1, 1], [2, 2]], [6, 5, 5, 2],
               max_draft=3, accepted=[0, 2, 1, 3], verified=np.array([1, 3, 0, 9]))
    assert pol.observed[2:] == [("a", 1, 0), ("b", 3, 2), ("d", 3, 3)]


class Pausing(Recorder):
    """A policy that pauses drafting on the steps `paused` names and drafts for a sample on the steps `probes` names
    (step -> rows; core.PausesDrafting)."""

    def __init__(self, paused, probes=None):
        super().__init__()
        self.paused, self.probes, self.asked, self.seconds = set(paused), dict(probes or {}), 0, []
        self.trimmed = []  # the draft lengths each trim saw

    def trim(self, requests, drafts):
        self.trimmed.append([len(d.tokens) for d in drafts])
        return [len(d.tokens) for d in drafts]

    def drafting_rows(self, batch_size):
        self.asked += 1
        if self.asked in self.probes:
            return np.array(self.probes[self.asked], dtype=np.int64)
        return np.zeros(0, dtype=np.int64) if self.asked in self.paused else None

    def observe_drafting_seconds(self, seconds):
        self.seconds.append(seconds)


def test_a_paused_step_runs_no_proposer_and_the_next_hands_it_every_token_since():
    """Steps 2 and 3 paused: no proposer call and no drafts; step 4 gives each request every token appended since
    the proposer last saw it (b, new during the pause: its whole context), and the drafting seconds are reported
    for the steps that drafted and caught nothing up (a catch-up is the pause's cost, not the drafting step's)."""
    prop, pol = Recorder(), Pausing(paused={2, 3})
    ticks = iter(range(100))
    layer = DraftingLayer(prop, pol, clock=lambda: float(next(ticks)))
    layer.step(["a"], [[1, 2, 3]], [3], max_draft=3)
    for ctx in ([[1, 2, 3, 4, 5], [7, 7, 7, 7]], [[1, 2, 3, 4, 5, 6], [7, 7, 7, 7, 8]]):
        out = layer.step(["a", "b"], ctx, [len(c) for c in ctx], num_new=np.array([2, 4]) if len(ctx[0]) == 5
                         else np.array([1, 1]), max_draft=3, accepted=[1, -1])
        assert out.lists() == [[], []]
    assert len(prop.requests) == 1
    assert pol.observed == [("a", 3, 1)]  # the draft before the pause is still reported
    ctx = [[1, 2, 3, 4, 5, 6, 9], [7, 7, 7, 7, 8, 8]]
    out = layer.step(["a", "b"], ctx, [7, 6], num_new=np.array([1, 1]), max_draft=3, accepted=[-1, -1])
    assert prop.requests[-1] == [("a", 7, 4, 3), ("b", 6, 6, 3)] and out.lists() == [[0, 1, 2], [0, 1, 2]]
    layer.step(["a", "b"], [c + [1] for c in ctx], [8, 7], num_new=np.array([1, 1]), max_draft=3)
    assert prop.requests[-1] == [("a", 8, 1, 3), ("b", 7, 1, 3)]  # caught up: one token each again
    assert len(pol.seconds) == 2 and all(s > 0 for s in pol.seconds)  # steps 1 and 5: step 4 caught up


def test_a_probe_hands_its_sample_their_backlog_and_the_rest_keep_theirs():
    """Step 2 paused, step 3 a probe of rows 0 and 2: only a and c are handed to the proposer (with every token since
    it last saw them), the trim sees the whole step with b and d drafting as a and c did and only a and c keep
    drafts (the layer keeps the sample's alone whatever the trim returns); step 4 hands b and d their backlog (three
    steps of tokens) and a and c one token. Neither the probe's drafting time nor step 4's is reported as a drafting
    step's: both include a catch-up."""
    prop, pol = Recorder(), Pausing(paused={2}, probes={3: [0, 2]})
    ids = ["a", "b", "c", "d"]
    ctx = [[1, 2, 3] * 4, [4, 5, 6] * 4, [7, 8, 9] * 4, [2, 3, 4] * 4]
    ticks = iter(range(100))
    layer = DraftingLayer(prop, pol, clock=lambda: float(next(ticks)))
    layer.step(ids, [c[:3] for c in ctx], [3, 3, 3, 3], max_draft=3)
    for length in (4, 5):
        out = layer.step(ids, [c[:length] for c in ctx], [length] * 4, num_new=np.ones(4, dtype=np.int64),
                         max_draft=3, accepted=[-1] * 4)
    assert prop.requests[-1] == [("a", 5, 2, 3), ("c", 5, 2, 3)]
    assert out.lists() == [[0, 1, 2], [], [0, 1, 2], []]
    assert pol.trimmed[-1] == [3, 3, 3, 3]  # the trim saw the whole step, b and d drafting as a and c did
    layer.step(ids, [c[:6] for c in ctx], [6] * 4, num_new=np.ones(4, dtype=np.int64), max_draft=3,
               accepted=[1, -1, 0, -1])
    assert prop.requests[-1] == [("a", 6, 1, 3), ("b", 6, 3, 3), ("c", 6, 1, 3), ("d", 6, 3, 3)]
    assert pol.observed[-2:] == [("a", 3, 1), ("c", 3, 0)]  # the probe's drafts are reported; b and d had none
    assert len(pol.seconds) == 1  # step 1's drafting time: the probe and the step after it caught up
    # An engine's own drafts (EngineDrafts) are narrowed to the sample the same way.
    from spec_plugins.drafting import EngineDrafts

    engine, pol = EngineDrafts(), Pausing(paused=(), probes={1: [1]})
    layer = DraftingLayer(engine, pol)
    engine.give(BatchDrafts.from_drafts([Draft([5, 6]), Draft([7, 8, 9])]))
    assert layer.step(["a", "b"], [[1], [2]], [1, 1], max_draft=3).lists() == [[], [7, 8, 9]]


def test_batch_drafts_and_draft_batches_select_rows():
    drafts = BatchDrafts.from_drafts([Draft([1, 2], confidence=[0.9, 0.8]), Draft([]), Draft([3], confidence=[0.7]),
                                      Draft([4, 5, 6], confidence=[0.6, 0.5, 0.4])])
    rows = np.array([0, 3])
    picked = drafts.select(rows)
    assert picked.lists() == [[1, 2], [4, 5, 6]] and picked.confidence.tolist() == [0.9, 0.8, 0.6, 0.5, 0.4]
    again = drafts.select(np.array([2, 0, 0]))  # any rows, repeated: what a probe's trim sees
    assert again.lists() == [[3], [1, 2], [1, 2]] and again.confidence.tolist() == [0.7, 0.9, 0.8, 0.9, 0.8]
    batch = DraftBatch(["a", "b", "c"], np.arange(12, dtype=np.int32).reshape(3, 4), np.array([4, 3, 2]),
                       np.array([1, 1, 2]), np.array([3, 2, 1]), rows=np.array([2, 0, 1]))
    sub = batch.select(np.array([1, 2]))
    assert sub.req_ids == ["b", "c"] and sub.rows.tolist() == [0, 1] and sub.max_draft.tolist() == [2, 1]
    assert list(sub.context(1)) == [4, 5]


def test_drafting_pauses_where_it_does_not_pay_and_probes_ever_less_often():
    """DraftingPause: after min_steps drafting steps whose expected tokens per second fall short of the same steps
    with no drafter, a pause of `first` steps; a probe that still finds drafting does not pay, a pause twice as
    long (up to `longest`); a probe that finds it pays, drafting again. A batch size twice as large or small starts
    the sums over."""
    from spec_plugins.policy.adaptive import DraftingPause

    pause = DraftingPause(0.9, min_steps=3, first=2, longest=8)
    pause.drafts = lambda: pause.rows(16) is None  # 16 requests: a probe drafts for all of them

    def drafting_steps():
        steps = 0
        while pause.drafts():
            steps += 1
            pause.weigh(16, 17.0, 1.2, 1.0)  # 17 tokens in 1.2 s against 16 in 1.0 s: does not pay
        return steps

    assert drafting_steps() == 3  # min_steps, then the pause
    assert [pause.drafts() for _ in range(2)] == [False, True]
    for length in (4, 8, 8):  # each probe finds it still does not pay
        pause.weigh(16, 17.0, 1.2, 1.0)
        assert [pause.drafts() for _ in range(length)] == [False] * length and pause.drafts()
    pause.weigh(16, 24.0, 1.2, 1.0)  # the probe pays: drafting resumes, the next pause is short again
    assert pause.drafts() and pause.length == 2
    pause.weigh(16, 17.0, 1.2, 1.0)
    pause.weigh(64, 17.0, 1.2, 1.0)  # another load: the sums start over, min_steps again
    pause.weigh(64, 200.0, 1.2, 1.0)
    assert pause.steps == 2 and pause.drafts()
    for _ in range(5):  # drafting that pays (over the steps since the load changed) never pauses
        pause.weigh(64, 200.0, 1.2, 1.0)
        assert pause.drafts()


def test_a_pause_ends_where_the_load_changes_twofold():
    """A pause is weighed at one load and ends at another: drafting resumes and is weighed again there. Kept across
    loads, a pause of 256 steps decided in one burst of 256 requests covered the whole of the next one, never drafting
    (vLLM-CPU, a machine shared with other work: integration_tests/test_matrix.py's mixed cell after its sampled
    one)."""
    from spec_plugins.policy.adaptive import DraftingPause

    pause = DraftingPause(0.9, min_steps=1, first=8, longest=256)
    pause.length = 256
    pause.weigh(256, 256.0, 1.2, 1.0)  # does not pay: a pause of 256 steps
    assert pause.left == 256
    assert all(len(pause.rows(n)) == 0 for n in (256, 200, 129, 300))  # within twofold: the same load
    assert pause.rows(100) is None and pause.left == 0 and pause.length == 8  # the burst drained past half
    pause.weigh(100, 100.0, 1.2, 1.0)  # weighed again at 100: does not pay, a pause of 8 from the first length
    assert pause.left == 8 and len(pause.rows(150)) == 0
    assert pause.rows(256) is None  # the next burst, twice as large: drafting again


def test_a_probe_drafts_for_a_sample_going_round_the_batch_and_keeps_only_its_drafts():
    """Past `probe_requests` requests a probe drafts for that many (the next probe the next ones, round the batch).
    The policy's trim of a probe costs the whole step (every request drafting as one of the sample: what drafting is
    weighed on) and keeps drafts for the sample alone; that costing is not a step the engine runs, so it is neither
    fitted against the measured step nor counted in the running goodput, and no other request keeps a draft."""
    from spec_plugins.policy.adaptive import AdaptiveLength, DraftingPause

    pause = DraftingPause(0.9, min_steps=1, first=2, longest=8, probe_requests=16)
    pause.weigh(64, 64.0, 1.2, 1.0)  # does not pay: a pause of 2
    assert [len(pause.rows(64)) for _ in range(2)] == [0, 0]
    assert pause.rows(64).tolist() == list(range(16)) and pause.sample.tolist() == list(range(16))
    pause.weigh(64, 64.0, 1.2, 1.0)  # the probe does not pay either: a pause of 4, the next sample the next rows
    assert pause.sample is None and [len(pause.rows(64)) for _ in range(4)] == [0] * 4
    assert pause.rows(64).tolist() == list(range(16, 32))
    pause.weigh(40, 40.0, 1.2, 1.0)
    assert [len(pause.rows(40)) for _ in range(8)] == [0] * 8
    assert pause.rows(40).tolist() == [0, 1, 2, 3, 4, 5, 6, 7] + list(range(32, 40))  # 32 onwards, round to 0
    pause.weigh(40, 40.0, 1.2, 1.0)  # a pause of 8 at 40 requests; a quarter of them ends it (weighed at 40)
    assert pause.rows(10) is None and pause.left == 0 and pause.length == 2
    pause.weigh(12, 12.0, 1.2, 1.0)  # does not pay at 12 either: a pause of 2, then a probe of a small batch
    assert [len(pause.rows(10)) for _ in range(2)] == [0, 0] and pause.rows(10) is None  # every row

    policy = AdaptiveLength(hardware="h200", model_config="llama-3.1-8b")
    policy.pause.host_s, policy.pause.left, policy.pause.batch = 0.05, 1, 64  # a pause weighed at 64 requests
    # The whole step costed: every request keeps 2 tokens, 1.5 expected a request, 1.3 s against 1.0 s bare (and
    # 0.05 s of drafting): that pays.
    policy._trim_step = lambda *args, **kwargs: (np.full(64, 2, dtype=np.int64), 96.0, 1.3, 0.0, 1.0)
    batch = DraftBatch.from_requests([DraftRequest(i, range(100), 1, 8) for i in range(64)])
    assert len(policy.drafting_rows(64)) == 0  # the pause's last step
    sample = policy.drafting_rows(64)
    assert len(sample) == 16
    slots = policy.requests.slots_of(batch.req_ids)
    policy.requests.columns["kept_len"][slots] = 2  # what the trim stores for every request it costs
    lengths = policy.trim_batch(batch, BatchDrafts.from_drafts([Draft([1, 2])] * 64))
    assert lengths[sample].tolist() == [2] * 16 and lengths.sum() == 32
    kept_len = policy.requests.columns["kept_len"][slots]
    assert (kept_len[sample] == 2).all() and (np.delete(kept_len, sample) == -1).all()
    assert policy._modelled is None and policy._tau == 0.0  # no step to fit, no running goodput
    assert policy.drafting_rows(64) is None  # the probe paid: drafting resumes


def test_the_pause_reads_step_time_the_fit_cannot_place_as_every_steps_own():
    """Measured steps twice the modelled ones, all alike: the fit cannot tell an engine's per-step host time from a
    slope (it reads a slope). Drafting that gains 45% tokens for 50% more modelled time pays where the unexplained
    time is every step's own (2.5 s against 1.95 s for 1.45x the tokens) and does not where it is a slope: the pause
    takes the reading that favours drafting, so drafting goes on. Where the trim keeps nothing, drafting pauses all
    the same; once the steps have varied enough to measure a slope, the fit's own reading is weighed."""
    from spec_plugins.policy.adaptive import AdaptiveLength

    def run(tau_per_request, varied=False):
        policy = AdaptiveLength(hardware="h200", model_config="llama-3.1-8b")
        policy.pause.host_s = 0.05
        for i in range(20):
            modelled = 1.0 + (0.5 * (i % 2) if varied else 0.0)
            policy.step_fit.add(modelled, 2.0 * modelled)
        policy._trim_step = lambda *args, **kwargs: (np.full(256, 2, dtype=np.int64), 256 * tau_per_request, 1.5,
                                                     policy.step_fit.offset(), 1.0)
        batch = DraftBatch.from_requests([DraftRequest(i, range(100), 1, 8) for i in range(256)])
        drafts = BatchDrafts.from_drafts([Draft([1, 2])] * 256)
        for _ in range(20):
            if policy.drafting_rows(256) is not None:
                return "paused"
            policy.trim_batch(batch, drafts)
        return "drafting"

    assert run(1.45) == "drafting"
    assert run(1.0) == "paused"  # the trim keeps nothing: no reading makes drafting pay
    assert run(1.45, varied=True) == "paused"  # a measured slope of 2: drafting costs what the model says, twice


def test_batch_drafts_with_survival_gives_the_implied_conditional_confidences():
    drafts = BatchDrafts.from_drafts([Draft([5, 6, 7], confidence=[0.9, 0.9, 0.9]), Draft([]), Draft([8, 9], confidence=[0.7, 0.7])])
    rated = drafts.with_survival(np.array([[0.8, 0.4, 0.1], [1.0, 1.0, 1.0], [0.5, 0.0, 0.0]]))
    assert np.allclose(rated.confidence, [0.8, 0.5, 0.25, 0.5, 0.0])
    assert rated.lists() == drafts.lists()
    narrow = drafts.with_survival(np.array([[0.5], [1.0], [0.5]]))  # positions past the survival's width: 0
    assert np.allclose(narrow.confidence, [0.5, 0.0, 0.0, 0.5, 0.0])


def test_layer_keeps_prefill_rows_fresh_and_checks_drafts():
    rec = Recorder()
    layer = DraftingLayer(rec, FixedLength(), stale_steps=1)
    layer.step(["a"], [[1]], [1], max_draft=1)
    for _ in range(3):
        layer.step(["b"], [[1]], [1], max_draft=1, present=["a"])
    assert rec.finished == []

    class TooLong(Recorder):
        def propose(self, requests):
            return [Draft([1, 2, 3]) for _ in requests]

    with pytest.raises(ValueError, match="draft for request 'x' has 3 tokens, cap is 2"):
        DraftingLayer(TooLong(), FixedLength(), who="proposer 'x'").step(["x"], [[1]], [1], max_draft=2)


def test_layer_fixed_policy_caps_and_checks_on_both_paths():
    # `fixed` without a cap of its own passes the engine's caps through (the layer skips its calls); with one it caps.
    for policy, want in ((FixedLength(), [[0, 1, 2, 3], [0, 1]]), (FixedLength(max_draft=3), [[0, 1, 2], [0, 1]])):
        rec = Recorder()
        layer = DraftingLayer(rec, policy)
        for step in range(2):
            # Columns of any numeric type are taken as integers, on the first step and on the known-requests path.
            out = layer.step(["a", "b"], [[1] * (3 + step), [2] * (1 + step)], [3 + step, 1 + step], max_draft=[4, 2],
                             num_new=np.array([3.0, 1.0]) if step == 0 else np.array([1.0, 1.0]),
                             accepted=None if step == 0 else np.array([1.0, 0.0]))
            assert out.lists() == want

    class BatchTooLong:
        def propose_batch(self, batch):
            return BatchDrafts(np.array([5, 6, 7]), np.array([0, 3]))

        def propose(self, requests):
            raise AssertionError("the batched path is used")

        def finish(self, req_id):
            pass

    with pytest.raises(ValueError, match="^proposer 'x': draft for request 'x' has 3 tokens, cap is 2$"):
        DraftingLayer(BatchTooLong(), FixedLength(), who="proposer 'x'").step(["x"], [[1]], [1], max_draft=2)


def test_batch_drafts_truncate_and_round_trip():
    drafts = [Draft([1, 2, 3], None, [0.9, 0.5, 0.1]), Draft([], None, []), Draft([7], None, [0.3])]
    b = BatchDrafts.from_drafts(drafts)
    assert [d.tokens for d in b.drafts()] == [[1, 2, 3], [], [7]]
    t = b.truncated(np.array([1, 0, 5]))
    assert t.lists() == [[1], [], [7]] and t.confidence.tolist() == [0.9, 0.3]
    with pytest.raises(ValueError, match="offsets"):
        BatchDrafts(np.array([1, 2]), np.array([0, 3]))


def test_host_time_benchmarks_keep_the_adaptive_policy_drafting():
    """step_overhead and mrv2_host_time measure drafting steps: keep_drafting stops the pause from ever deciding."""
    from spec_plugins.bench.step_overhead import keep_drafting
    from spec_plugins.policy.adaptive import AdaptiveLength

    layer = DraftingLayer(Recorder(), AdaptiveLength(hardware="h200", model_config="llama-3.1-8b"))
    keep_drafting(layer)
    pause = layer.policy.pause
    for _ in range(50):  # drafting that never pays
        pause.weigh(256, 256.0, 2.0, 1.0)
        assert layer.policy.drafting_rows(256) is None
    keep_drafting(DraftingLayer(Recorder(), FixedLength()))  # a policy that never pauses: nothing to keep
