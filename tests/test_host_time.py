"""HostTime: measured host time per drafting step by batch size and by tokens appended per request."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spec_plugins.bench.host_time import BASE_TOKENS, DEFAULT, GROWTH, HostTime


def rows(name: str, points: dict[int, float], tokens: float | None = None) -> list[dict]:
    return [{"proposer": name, "batch": b, "us_per_step": us, "tokens_per_request_step": tokens}
            for b, us in points.items()]


def test_growth_scales_the_base_time_along_the_measured_tokens():
    base = rows("p fixed", {1: 10.0, 16: 40.0, 256: 400.0}) + rows("p adaptive", {1: 20.0, 256: 600.0})
    growth = (rows("p fixed", {1: 9.0, 256: 300.0}, tokens=1.5) + rows("p fixed", {1: 30.0, 256: 4000.0}, tokens=14.5))
    host = HostTime(base, "p", growth_rows=growth)
    us = lambda b, t: host.seconds("fixed", b, t) * 1e6  # noqa: E731
    # At the measured batch sizes the curve goes through every measured point, the base one at BASE_TOKENS.
    assert us(256, None) == pytest.approx(400.0) and us(256, BASE_TOKENS) == pytest.approx(400.0)
    assert us(256, 14.5) == pytest.approx(4000.0) and us(1, 14.5) == pytest.approx(30.0)
    assert us(256, 1.5) == pytest.approx(300.0)
    # Between points: linear in tokens; below the fewest: flat; above the most: the last segment goes on.
    assert us(256, 8.5) == pytest.approx(400.0 + (8.5 - 2.5) / 12 * 3600.0)
    assert us(256, 1.0) == pytest.approx(300.0)
    assert us(256, 20.5) == pytest.approx(4000.0 + 6 / 12 * 3600.0)
    # Between batch sizes the ratio to the base time is interpolated over log2(batch): 16 is halfway.
    ratio = (30.0 / 10.0 + 4000.0 / 400.0) / 2
    assert us(16, 14.5) == pytest.approx(40.0 * ratio)
    # Past the largest batch: per request, with the largest's ratio.
    assert us(512, 14.5) == pytest.approx(2 * 4000.0)
    # The adaptive path is the fixed path plus its policy's measured extra (600 - 400 at 256), which without
    # growth rows of both policies stays what the base measurement says whatever is appended.
    assert host.seconds("adaptive", 256) == pytest.approx(600e-6)
    assert host.seconds("adaptive", 256, 14.5) == pytest.approx((4000.0 + 200.0) * 1e-6)


def test_the_policys_extra_grows_as_its_own_paired_measurements_grow_not_as_the_appends():
    """Growth runs at B = 1 and 256, at another level than the base (the machine's run-to-run spread): within each
    run, adaptive costs the fixed path plus 20 µs at BASE_TOKENS and 26 µs at 15 tokens. At B = 16, between them,
    the policy adds the base's 40 µs grown by 26/20, not the whole adaptive time scaled by the appends' growth
    (which would charge it ~200 µs here)."""
    base = rows("p fixed", {1: 10.0, 16: 40.0, 256: 400.0}) + rows("p adaptive", {1: 30.0, 16: 80.0, 256: 420.0})
    growth = (rows("p fixed", {1: 25.0, 256: 500.0}, tokens=BASE_TOKENS) + rows("p adaptive", {1: 45.0, 256: 520.0}, tokens=BASE_TOKENS)
              + rows("p fixed", {1: 100.0, 256: 5000.0}, tokens=15.0) + rows("p adaptive", {1: 126.0, 256: 5026.0}, tokens=15.0))
    host = HostTime(base, "p", growth_rows=growth)

    def extra(b, t):
        return host.seconds("adaptive", b, t) - host.seconds("fixed", b, t)

    assert extra(1, 15.0) == pytest.approx(26e-6) and extra(256, 15.0) == pytest.approx(26e-6)
    assert extra(16, 15.0) == pytest.approx(40e-6 * 26 / 20)
    assert extra(16, BASE_TOKENS) == pytest.approx(40e-6) and extra(16, None) == pytest.approx(40e-6)
    assert extra(16, 1.0) == pytest.approx(40e-6)  # flat below the fewest tokens measured


def write_measurement(path, data: list[dict], as_list: bool = False):
    """A step_overhead --json measurement: {"rows": [...]} (or the bare list of rows, which is also read)."""
    path.write_text(json.dumps(data if as_list else {"rows": data}))
    return path


def test_load_reads_a_measurement_and_its_growth_files(tmp_path):
    base = write_measurement(tmp_path / "base.json", rows("tree fixed", {1: 10.0, 256: 400.0})
                             + rows("tree adaptive", {1: 20.0, 256: 600.0})
                             + rows("vLLM suffix (ArcticInference)", {1: 50.0, 256: 900.0}))
    growth = write_measurement(tmp_path / "growth.json", rows("tree fixed", {256: 4000.0}, tokens=14.5), as_list=True)
    host = HostTime.load(base, "tree", [growth])
    assert host.growth_sources == [str(growth)] and host.source == str(base)
    assert host.seconds("fixed", 256) == pytest.approx(400e-6) and host.seconds("adaptive", 1) == pytest.approx(20e-6)
    assert host.seconds("fixed", 256, 14.5) == pytest.approx(4000e-6)
    assert HostTime.load(base, "tree").seconds("fixed", 256, 14.5) == pytest.approx(400e-6)  # no growth: base
    # An engine's own proposer reads its named rows, and has only a fixed path.
    arctic = HostTime.load(base, "arctic")
    assert arctic.seconds("fixed", 256) == pytest.approx(900e-6)
    with pytest.raises(ValueError, match="runs no adaptive policy"):
        arctic.seconds("adaptive", 1)
    with pytest.raises(ValueError, match=r"no rows for 'ngram fixed'; it has tree adaptive, tree fixed"):
        HostTime.load(base, "ngram")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read a step_overhead JSON"):
        HostTime.load(tmp_path / "bad.json", "tree")


def test_the_shipped_measurements_load_for_every_proposer_the_simulator_names():
    """The committed measurements are the simulator's defaults: each parses and has every proposer's rows."""
    from spec_plugins.bench.host_time import ENGINE_DEFAULT, ENGINE_ROWS, EngineHostTime

    for proposer in ("suffix_tree", "ngram", *ENGINE_ROWS):
        host = HostTime.load(DEFAULT, proposer, GROWTH)
        assert host.seconds("fixed", 64, 9.5) > 0
    assert EngineHostTime.load(ENGINE_DEFAULT).seconds(64, 4.0) > 0


def test_simulator_charges_host_time_by_the_tokens_each_step_appends(tmp_path):
    """The same trace with every draft accepted: static_8 appends 9 tokens a step, static_1 two. Against the base
    measurement alone, a host time that is 10x at 9 tokens and 0.5x at 2 tokens lowers static_8's goodput and raises
    static_1's; a growth curve at 1x everywhere changes nothing. static_0 is no speculation: no drafter runs, so no
    drafting host time is charged to it at all."""
    from spec_plugins.bench import policy_sim
    from spec_plugins.policy.cost import DraftCost, RooflineCost
    from spec_plugins.traces import load_traces
    from test_policy_planner import uniform_trace

    cost = RooflineCost("h200", "llama-3.1-8b", drafter=DraftCost(kind="model_free", per_request_us=0.0))
    traces = load_traces([uniform_trace(tmp_path, 8, drafted=8, accepted=8)])
    base_us = {1: 200.0, 256: 2000.0}
    base = rows("p fixed", base_us) + rows("p adaptive", base_us)
    grows = [r for t, x in ((2.0, 0.5), (9.0, 10.0)) for p in ("p fixed", "p adaptive")
             for r in rows(p, {b: x * us for b, us in base_us.items()}, tokens=t)]
    flat = [r for t in (2.0, 9.0) for p in ("p fixed", "p adaptive") for r in rows(p, base_us, tokens=t)]

    def goodput(growth_rows):
        host = None if growth_rows is None else HostTime(base, "p", growth_rows=growth_rows)
        return policy_sim.run(traces, cost, [256], 8, 20, 0, host=host)["goodput"]

    plain, grown, untimed = goodput(()), goodput(grows), goodput(None)
    assert grown["static_8"][0] < 0.9 * plain["static_8"][0]  # 9 tokens a step appended: 10x the host time
    assert grown["static_1"][0] > plain["static_1"][0]  # 2 tokens a step: half the base's host time
    assert plain["static_1"][0] < untimed["static_1"][0]  # drafting at all pays the drafting step's host time
    assert grown["static_0"][0] == plain["static_0"][0] == untimed["static_0"][0]  # no speculation: none of it
    assert goodput(flat) == plain


class DraftsByStep:
    """A policy whose drafting rows at step i (from 1) are rows_at(i) (core.PausesDrafting: None, every request; no
    rows, none; some, a probe's sample), that keeps no draft and records the drafting seconds it is told."""

    def __init__(self, rows_at):
        self.rows_at, self.step, self.seconds = rows_at, 0, []

    def drafting_rows(self, batch_size):
        self.step += 1
        return self.rows_at(self.step)

    def observe_drafting_seconds(self, seconds):
        self.seconds.append(seconds)

    def trim(self, requests, drafts):
        return [0] * len(requests)

    def observe(self, req_id, drafted, accepted):
        pass


def catchup_of_0_1_ms_a_token():
    from spec_plugins.bench.host_time import CatchUpTime

    return CatchUpTime([{"batch": 1, "tokens": 1, "over_one_token_ms": 0.0},
                        {"batch": 1, "tokens": 9, "over_one_token_ms": 0.8}])


def test_simulator_charges_a_paused_step_no_drafting_and_the_step_after_it_the_catch_up(tmp_path):
    """A policy that pauses drafting (core.PausesDrafting) for four steps: those steps pay no drafting host time, the
    step that ends the pause pays an ordinary step's plus the catch-up of the four tokens appended meanwhile
    (CatchUpTime, over the ordinary step's one), and the policy is told the seconds of each drafting step that caught
    nothing up, as the drafting layer reports them."""
    from spec_plugins.bench import policy_sim
    from spec_plugins.traces import load_traces
    from test_policy_planner import FlatCost, uniform_trace

    traces = load_traces([uniform_trace(tmp_path, 4, drafted=4, accepted=4)])
    host = HostTime(rows("p fixed", {1: 200.0, 256: 200.0}) + rows("p adaptive", {1: 200.0, 256: 200.0}), "p")
    host.catchup = catchup_of_0_1_ms_a_token()
    requests = policy_sim.trace_requests(traces)
    steps = policy_sim.batch_schedule(requests, 1, 10, 0)[:10]
    assert all(len(batch) == 1 for batch, _ in steps) and not any(ends for _, ends in steps[:7])
    pausing = DraftsByStep(lambda step: np.zeros(0, dtype=np.int64) if 3 <= step <= 6 else None)
    goodput = policy_sim.simulate(requests, steps, FlatCost(), {"p": pausing, "static_0": policy_sim.StaticLength(0)},
                                  host)
    # Six drafting steps, the first after the pause 4 tokens behind (0.4 ms): the policy is told the other five.
    assert pausing.seconds == pytest.approx([200e-6] * 5)
    tokens = 10.0  # neither keeps a draft: one token a step each
    assert tokens / goodput["p"] - tokens / goodput["static_0"] == pytest.approx(6 * 200e-6 + 0.4e-3)


def test_engine_host_time_interpolates_by_batch_and_tokens():
    from spec_plugins.bench.engine_host_time import split
    from spec_plugins.bench.host_time import EngineHostTime

    rows = [{"batch": 1, "tokens_per_request": 1, "engine_us": 1000.0}, {"batch": 64, "tokens_per_request": 1, "engine_us": 5000.0},
            {"batch": 1, "tokens_per_request": 8, "engine_us": 1200.0}, {"batch": 64, "tokens_per_request": 8, "engine_us": 9000.0}]
    eng = EngineHostTime(rows)
    assert eng.seconds(1) == pytest.approx(1e-3) and eng.seconds(64, 8) == pytest.approx(9e-3)
    assert eng.seconds(128, 1) == pytest.approx(10e-3)  # past the largest batch: its time per request
    assert eng.seconds(64, 4.5) == pytest.approx(7e-3)  # between token counts: linear
    assert eng.seconds(64, 20) == pytest.approx(9e-3) and eng.seconds(0, 1) == pytest.approx(1e-3)
    parts = split({"step": 10.0, "schedule": 1.0, "update": 0.5, "execute": 5.0, "forward": 3.0, "logits": 0.5,
                   "sample_tokens": 2.0, "sample": 1.0, "draft": 0.25, "output": 1.0})
    assert parts["scheduler"] == 1.5 and parts["input_prep"] == 1.5 and parts["model"] == 3.5
    assert parts["bookkeeping"] == 0.75 and parts["other"] == 0.5 and parts["host"] == 5.5
    assert parts["engine"] == 4.25  # less the proposer's drafting and the front end's output


def test_engine_host_time_never_falls_with_more_tokens_or_requests():
    """The measured engine host time has a dip (B = 64: 8 verified tokens a request read less than 4), which a policy
    simulation would reward as if verifying more were cheaper; the model charged is monotone in both."""
    import numpy as np

    from spec_plugins.bench.host_time import ENGINE_DEFAULT, EngineHostTime, isotonic

    engine = EngineHostTime.load(ENGINE_DEFAULT)
    for b in (1, 4, 16, 64, 256):
        times = [engine.seconds(b, t) for t in (1, 2, 4, 6, 8)]
        assert all(x <= y + 1e-12 for x, y in zip(times, times[1:])), (b, times)
    for t in (1, 4, 8):
        times = [engine.seconds(b, t) for b in (1, 4, 16, 64, 256)]
        assert all(x <= y + 1e-12 for x, y in zip(times, times[1:])), (t, times)
    assert np.allclose(isotonic(np.array([1.0, 3.0, 2.0, 4.0])), [1.0, 2.5, 2.5, 4.0])
    assert np.allclose(isotonic(np.array([5.0, 1.0])), [3.0, 3.0])


def test_engine_host_time_of_several_runs_charges_each_cell_its_least(tmp_path):
    """A cell one run measured in a busy spell (B = 16 at 8 tokens: 4.86 ms against 2.35 ms in the other run, the
    shipped runs) is charged the quieter run's time, and the default reads both shipped runs."""
    from spec_plugins.bench.host_time import ENGINE_DEFAULT, EngineHostTime

    def cell(batch, tokens, us):
        return {"batch": batch, "tokens_per_request": tokens, "engine_us": us}

    first = write_measurement(tmp_path / "a.json", [cell(16, 4, 2600.0), cell(16, 8, 4860.0)])
    second = write_measurement(tmp_path / "b.json", [cell(16, 4, 2230.0), cell(16, 8, 2350.0)])
    both = EngineHostTime.load([first, second])
    assert both.seconds(16, 8) == pytest.approx(2350e-6) and both.seconds(16, 4) == pytest.approx(2230e-6)
    assert both.source == f"{first},{second}"
    assert EngineHostTime.load(first).seconds(16, 8) == pytest.approx(4860e-6)
    shipped = EngineHostTime.load(ENGINE_DEFAULT)
    assert shipped.seconds(16, 8) < 1.1 * shipped.seconds(16, 4)  # no step between 4 and 8 tokens a request



def test_simulator_charges_a_probe_its_sample_and_each_request_its_own_backlog(tmp_path):
    """A probe that drafts for two of four requests (core.PausesDrafting.drafting_rows) pays the proposer's share of
    the step at two requests and the rest at four (HostTime.sample_seconds), and the catch-up of the sample's backlog
    only; the other two bring theirs (a step more) to the next step that drafts. Drafting every request through the
    pause would have cost the probe twice the catch-up."""
    from spec_plugins.bench import policy_sim
    from spec_plugins.traces import load_traces
    from test_policy_planner import FlatCost, uniform_trace

    traces = load_traces([uniform_trace(tmp_path, 4, drafted=4, accepted=4)])
    per_request = {1: 100.0, 4: 400.0, 256: 25600.0}
    host = HostTime([{**r, "proposer_us": 0.75 * r["us_per_step"]} for r in rows("p fixed", per_request)
                     + rows("p adaptive", per_request)], "p")
    host.catchup = catchup_of_0_1_ms_a_token()
    assert host.sample_seconds("adaptive", 2, 4) == pytest.approx(0.25 * 400e-6 + 0.75 * 200e-6)
    requests = policy_sim.trace_requests(traces)
    steps = policy_sim.batch_schedule(requests, 4, 10, 2)[:10]  # seed 2: no request ends in the first 8 steps
    assert all(len(batch) == 4 for batch, _ in steps) and not any(ends for _, ends in steps[:8])
    probing = DraftsByStep(lambda step: np.array([0, 1]) if step == 7
                           else np.zeros(0, dtype=np.int64) if 3 <= step <= 6 else None)
    goodput = policy_sim.simulate(requests, steps, FlatCost(), {"p": probing}, host)["p"]
    # Ten 1 ms steps, four tokens each (no draft kept); drafting: steps 1, 2; the probe (two requests 4 tokens behind:
    # 0.4 ms each); step 8 (two requests 5 behind, two none); 9, 10. The policy is told the steps that caught nothing up.
    assert 40.0 / goodput == pytest.approx(10e-3 + 4 * 400e-6 + (250e-6 + 0.8e-3) + (400e-6 + 1.0e-3))
    assert probing.seconds == pytest.approx([400e-6] * 4)
