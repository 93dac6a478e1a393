"""The engine's measured step time reaching the adaptive policy: which intervals the drafting layer
reports, and what the policy does with them."""

from __future__ import annotations

import numpy as np
import pytest

from policy_reference import numpy_allocate_batch
from spec_plugins.core import BatchDrafts, DraftBatch, FixedLength, ObservesStepTime
from spec_plugins.drafting import DraftingLayer
from spec_plugins.policy.adaptive import AdaptiveLength, StepTimeFit
from spec_plugins.policy.allocator import allocate_batch
from spec_plugins.policy.cost import step_cost


class TimedFixed(FixedLength):
    def __init__(self, observes: bool = True) -> None:
        super().__init__()
        self.observes_step_time = observes
        self.intervals: list[float] = []

    def observe_step_interval(self, seconds: float) -> None:
        self.intervals.append(seconds)


class Repeat:
    """Drafts the context's last token, twice."""

    def propose(self, requests):
        from spec_plugins.core import Draft

        return [Draft([r.tokens[-1]] * min(2, r.max_draft)) for r in requests]

    def finish(self, req_id):
        pass


def test_layer_reports_only_intervals_between_steps_over_the_same_requests():
    times = iter([0.0, 1.0, 3.0, 6.0, 10.0, 15.0, 21.0, 28.0])
    policy = TimedFixed()
    assert isinstance(policy, ObservesStepTime)
    layer = DraftingLayer(Repeat(), policy, clock=lambda: next(times))
    ctx = {"a": [1, 2, 3], "b": [4, 5]}

    def step(ids, present=()):
        layer.step(ids, [ctx[i] for i in ids], [len(ctx[i]) for i in ids], max_draft=4, present=present)

    step(["a"])                   # t=0: nothing before it
    step(["a"])                   # t=1: reported (1 s)
    step(["a", "b"])              # t=3: b joins (its prefill was in this interval)
    step(["a", "b"])              # t=6: reported (3 s)
    step(["a"], present=["b"])    # t=10: a prefill chunk in the batch, and a different batch
    step(["a", "b"])              # t=15: after a step with a prefill chunk
    step(["a", "b"])              # t=21: reported (6 s)
    step(["a"])                   # t=28: the batch shrank
    assert policy.intervals == [1.0, 3.0, 6.0]


def test_layer_without_a_clock_keeps_no_time():
    policy = TimedFixed()
    layer = DraftingLayer(Repeat(), policy)
    for _ in range(3):
        layer.step(["a"], [[1, 2]], [2], max_draft=4)
    assert policy.intervals == []
    # A policy whose option is off: the layer does not even read the clock.
    off = TimedFixed(observes=False)
    layer = DraftingLayer(Repeat(), off, clock=lambda: pytest.fail("clock read for a policy that keeps no time"))
    for _ in range(3):
        layer.step(["a"], [[1, 2]], [2], max_draft=4)
    assert off.intervals == []
    assert not DraftingLayer(Repeat(), cpu_policy(step_overhead="model"), clock=lambda: 0.0)._times_steps


def cpu_policy(**options):
    return AdaptiveLength(profile="vllm-cpu-smollm2-135m", **{"step_overhead": "measured", **options})


def one_step(policy, n=8, width=8, seed=0):
    """Trim n drafts of `width` tokens whose confidences fall along each draft."""
    rng = np.random.default_rng(seed)
    conf = np.clip(rng.uniform(0.2, 0.9, size=(n, width)) * np.linspace(1.0, 0.3, width), 0.01, 1.0)
    ids = [f"r{i}" for i in range(n)]
    batch = DraftBatch(ids, [[1] * 100] * n, np.full(n, 100), np.ones(n, dtype=np.int64), np.full(n, width))
    drafts = BatchDrafts(np.ones(n * width, dtype=np.int64), np.arange(n + 1) * width, conf.ravel())
    return policy.trim_batch(batch, drafts)


def test_a_measured_offset_over_the_model_keeps_longer_drafts():
    base = cpu_policy()
    kept_model = one_step(base).sum()
    policy = cpu_policy()
    one_step(policy, seed=0)
    for i in range(200):  # every step takes 40 ms more than modelled: a serving front end
        policy.observe_step_interval(policy._modelled + 0.040)
        one_step(policy, seed=i + 1)
    assert policy.measured_overhead_s == pytest.approx(0.040, rel=0.02)
    stats = DraftingLayer(Repeat(), policy).policy_stats()  # what the vLLM adapter's trace lines carry
    assert stats["step_offset_ms"] == pytest.approx(40.0, rel=0.02) and stats["step_fits"] > 19
    lengths = one_step(policy, seed=7)
    assert policy.stats()["modelled_ms"] == pytest.approx(1e3 * policy.cost.step_time(lengths, np.full(8, 100)))
    # Expected tokens of that step: one a request, plus each kept token's chance of being accepted.
    assert 8 < policy.stats()["expected_tokens"] < 8 + lengths.sum()
    assert one_step(policy).sum() > kept_model  # the same tokens are cheaper against a longer step


def test_step_fit_tells_an_offset_from_a_slower_machine():
    rng = np.random.default_rng(1)
    slow, front, flat = StepTimeFit(0.95), StepTimeFit(0.95), StepTimeFit(0.95)
    for _ in range(300):
        m = rng.uniform(0.10, 0.20)          # modelled steps that vary with the drafts kept
        slow.add(m, 3.0 * m * rng.uniform(0.97, 1.03))  # a machine 3x slower than its profile: no offset
        front.add(m, m + 0.040)              # 40 ms a step beyond the model
        mc = rng.uniform(0.0210, 0.0215)     # modelled steps that hardly vary: no slope can be measured
        flat.add(mc, mc + 0.035 + rng.normal(0.0, 0.002))
    assert slow.slope() == pytest.approx(3.0, rel=0.05) and slow.offset() < 0.01
    assert front.slope() == pytest.approx(1.0, abs=1e-6) and front.offset() == pytest.approx(0.040, rel=1e-6)
    # Too alike to tell a per-step cost from a slower machine: read as the machine (a uniform factor, which changes
    # no choice), not as time that would make every drafted token look cheaper.
    assert flat.slope() == pytest.approx(flat.scale, rel=0.01) and flat.offset() == pytest.approx(0.0, abs=1e-3)
    fast = StepTimeFit(0.95)
    for m in np.linspace(0.1, 0.2, 50):  # faster than modelled: no negative price
        fast.add(m, 0.5 * m - 0.01)
    assert fast.offset() == 0.0
    assert StepTimeFit(0.95).offset() == 0.0


def test_step_fit_keeps_its_measured_slope_once_the_steps_stop_varying():
    rng = np.random.default_rng(5)
    fit = StepTimeFit(0.95)
    for _ in range(200):  # drafting: the steps vary, and verified tokens cost twice the model
        m = rng.uniform(0.10, 0.20)
        fit.add(m, 2.0 * (m - 0.05))
    slope, offset = fit.slope(), fit.offset(lowest=-np.inf)
    assert slope == pytest.approx(2.0, rel=0.03) and offset == pytest.approx(-0.05, rel=0.1)
    for _ in range(500):  # drafting stopped: every step the base step, as the same truth prices it
        fit.add(0.10, 2.0 * (0.10 - 0.05))
    # No drift back toward slope 1 (which would read the same steps as a positive offset, make tokens look
    # cheap and restart drafting with nothing new learnt): the same slope, the same negative offset.
    assert fit.slope() == pytest.approx(slope, rel=0.02)
    assert fit.offset(lowest=-np.inf) == pytest.approx(offset, rel=0.05)
    never = StepTimeFit(0.95)
    for _ in range(500):
        never.add(0.10, 0.05)  # never varied: a faster machine, not dearer tokens
    assert never.slope() == pytest.approx(0.5) and never.offset(lowest=-np.inf) == pytest.approx(0.0, abs=1e-9)


def test_an_engine_far_faster_than_its_prior_reads_as_cheap_tokens_not_dear_ones():
    rng = np.random.default_rng(6)
    fit = StepTimeFit(0.95)
    for _ in range(300):  # a tiny model on the CPU prior: 20x faster, and a verified token nearly free
        m = rng.uniform(0.10, 0.20)
        fit.add(m, 0.005 + 0.004 * (m - 0.10))
    # measured = b (modelled + c): b ~ 0.004 and a large positive c, so drafts look as cheap as they are. A
    # fixed floor on the slope (there was one at 0.25) would read the same steps as dear tokens and stop drafting.
    assert fit.slope() == pytest.approx(0.004, rel=0.1) and fit.offset() > 1.0


def test_a_few_noisy_intervals_cannot_run_the_fit_away():
    fit = StepTimeFit(0.95)
    fit.add(0.10, 0.10)
    fit.add(0.30, 9.00)  # a step that paused, right after one that did not
    assert fit.offset(lowest=-np.inf) == 0.0  # too few steps for an offset
    for m, y in ((0.12, 0.05), (0.25, 6.0), (0.11, 0.02)):
        fit.add(m, y)
    assert fit.scale / fit.spread <= fit.slope() <= fit.scale * fit.spread
    rng = np.random.default_rng(8)
    for _ in range(200):  # then the engine as it is: 3x slower than modelled, no offset
        m = rng.uniform(0.10, 0.20)
        fit.add(m, 3.0 * m)
    assert fit.slope() == pytest.approx(3.0, rel=0.02) and abs(fit.offset(lowest=-np.inf)) < 0.005


def test_an_engine_many_times_slower_than_its_prior_is_fitted_not_clipped():
    rng = np.random.default_rng(7)
    fit = StepTimeFit(0.95)
    for _ in range(300):  # 6x slower base step, verified tokens 12x dearer than the prior says
        m = rng.uniform(0.10, 0.20)
        fit.add(m, 6.0 * 0.10 + 12.0 * (m - 0.10))
    # Bounded at four *modelled* steps, the dearest steps (most drafts) would be clipped to 0.4-0.8 s and the fit
    # would read a 4x uniform slowdown; bounded at four predicted ones, it finds both.
    assert fit.slope() == pytest.approx(12.0, rel=0.03)
    assert fit.offset(lowest=-np.inf) == pytest.approx(6.0 * 0.10 / 12.0 - 0.10, abs=0.005)


def test_dearer_tokens_read_as_a_negative_offset_only_where_the_slope_is_measured():
    rng = np.random.default_rng(2)
    dear, fast_flat = StepTimeFit(0.95), StepTimeFit(0.95)
    for _ in range(300):
        m = rng.uniform(0.10, 0.20)
        dear.add(m, 1.5 * (m - 0.03))        # tokens dearer against the base step than modelled
        mc = rng.uniform(0.0210, 0.0215)
        fast_flat.add(mc, 0.5 * mc)          # faster than modelled, steps too alike to tell slope from offset
    assert dear.slope() == pytest.approx(1.5, rel=0.03)  # the ridge pulls it a little toward 1
    assert dear.offset() == 0.0 and dear.offset(lowest=-np.inf) == pytest.approx(-0.03, rel=0.15)
    assert dear.offset(lowest=-0.01) == -0.01
    assert fast_flat.offset(lowest=-np.inf) == 0.0


def test_a_negative_offset_keeps_shorter_drafts_bounded_by_the_base_step():
    kept_model = one_step(cpu_policy(), n=32).sum()
    policy = cpu_policy()
    base = policy.cost.step_time(np.zeros(32, np.int64), np.full(32, 100))
    for m in np.random.default_rng(4).uniform(base, base + 0.06, size=200):
        policy.step_fit.add(m, base + 2.0 * (m - base))  # verified tokens cost twice their modelled time
    assert -0.6 * base < policy.measured_overhead_s < -0.4 * base
    assert one_step(policy, n=32).sum() < kept_model
    bounded = cpu_policy(max_offset_cut=0.0)  # the same fit, never below 0
    bounded.step_fit = policy.step_fit
    assert one_step(bounded, n=32).sum() == kept_model


def test_measured_overhead_off_and_outliers():
    assert AdaptiveLength.Options().step_overhead == "measured"  # on unless turned off
    off = cpu_policy(step_overhead="model")
    one_step(off)
    off.observe_step_interval(10.0)
    assert off.measured_overhead_s == 0.0
    spiky = cpu_policy()
    one_step(spiky)
    modelled = spiky._modelled
    spiky.observe_step_interval(100.0)  # one 100 s pause counts as four modelled steps at most
    assert spiky.step_fit.y == pytest.approx(4.0 * modelled)
    spiky.observe_step_interval(100.0)  # no trim since: nothing to compare with
    assert spiky.step_fit.w == 1.0


def test_allocator_extra_seconds_same_on_both_walks():
    cost = step_cost(hardware="h200", model="llama-3.1-8b")
    rng = np.random.default_rng(3)
    surv = np.cumprod(rng.uniform(0.3, 1.0, size=(64, 16)), axis=1)
    lengths = np.full(64, 16)
    ctx = rng.integers(100, 4000, size=64)
    kept = [allocate_batch(surv, lengths, ctx, cost, extra_s=e).sum() for e in (0.0, 0.005, 0.05)]
    assert kept[0] <= kept[1] <= kept[2] and kept[0] < kept[2]
    for e in (0.0, 0.005):
        assert (allocate_batch(surv, lengths, ctx, cost, extra_s=e).tolist()
                == numpy_allocate_batch(surv, lengths, ctx, cost, extra_s=e).tolist())


def test_a_prior_whose_base_step_follows_context_wrongly_leaves_the_price_of_drafts_alone():
    # One client, short and long requests in turn, on the CPU prior. The engine's base step is 39 ms at any context
    # (the prior's: 20 ms at 200 tokens, 63 ms at 2k), and a drafted token costs what the prior says. Read as one
    # slope, the base steps' spread made drafts look nearly free (slope 0.1, measured on vLLM-CPU), and the policy
    # kept tokens a twentieth as likely to be accepted as a step's time is worth.
    policy = cpu_policy()
    cost = policy.cost
    rng = np.random.default_rng(3)

    def step(req: str, ctx: int, conf: np.ndarray) -> np.ndarray:
        batch = DraftBatch([req], [[1] * ctx], np.array([ctx]), np.ones(1, dtype=np.int64), np.array([len(conf)]))
        drafts = BatchDrafts(np.ones(len(conf), dtype=np.int64), np.array([0, len(conf)]), conf)
        return policy.trim_batch(batch, drafts)

    for r in range(8):
        ctx = 200 if r % 2 == 0 else 2000
        for _ in range(60):
            kept = step(f"q{r}", ctx, np.clip(rng.uniform(0.1, 1.0, 8) * np.linspace(1.0, 0.2, 8), 0.01, 1.0))
            truth = 0.039 + cost.step_time(kept, [ctx]) - cost.step_time([0], [ctx])
            policy.observe_step_interval(truth * rng.uniform(0.97, 1.03))
    assert policy.step_fit.slope() == pytest.approx(1.0, rel=0.2)
    # A one-token draft at 2k tokens, 5% likely to be accepted, costs ~3 ms against a 39 ms step that yields a token.
    assert step("q8", 2000, np.array([0.05])).sum() == 0


def test_before_any_draft_is_measured_drafts_are_priced_as_the_base_step_is_measured():
    # A tiny model on the CPU prior: 45-55 ms steps where the prior models 110-390 ms as the batch and its contexts
    # change, and no draft kept yet (drafts are measured only once kept). Priced at the scale (a uniformly slower
    # machine), drafts kept the prior's price, and at B = 256 the prior keeps few: the engine drafted almost nothing
    # at B = 256 and never measured what drafts cost it. The base step's own measured slope prices them until then.
    rng = np.random.default_rng(9)
    fresh, policy = cpu_policy(), cpu_policy()
    loads = [(256, 20), (256, 60), (180, 40), (120, 30), (64, 20)]
    bare = [policy.cost.step_time(np.zeros(n, np.int64), np.full(n, c)) for n, c in loads]
    for i in range(30):
        b = bare[i % len(bare)]
        policy.step_fit.add(b, 0.045 + 0.02 * b * rng.uniform(0.9, 1.1), b)
    fit = policy.step_fit
    assert fit.anchor is None and fit.slope() < 0.25 * fit.scale and fit.offset(0.0, bare[0]) > 1.0
    policy._bare = bare[0]
    assert one_step(policy, n=256).sum() > 2 * one_step(fresh, n=256).sum()
