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
    # A policy without growth rows keeps its base time whatever is appended.
    assert host.seconds("adaptive", 256, 14.5) == host.seconds("adaptive", 256) == pytest.approx(600e-6)


def test_the_shipped_measurements_charge_appends_to_the_suffix_trees_not_to_the_ngram_scan():
    tree, ngram, arctic = (HostTime.load(DEFAULT, p, GROWTH) for p in ("suffix_tree", "ngram", "arctic"))
    assert tree.growth_sources == [str(g) for g in GROWTH]
    for host, policy, times in ((tree, "fixed", 5), (tree, "adaptive", 5), (arctic, "fixed", 3)):
        at = [host.seconds(policy, 256, t) for t in (2.5, 5.0, 9.5, 15.0)]
        assert all(np.diff(at) > 0) and at[-1] > times * at[0]  # rewrites: many times the 1-4-token step
    scan = [ngram.seconds("fixed", 256, t) for t in (2.5, 15.0)]
    assert scan[1] < 1.5 * scan[0]
    assert HostTime.load(DEFAULT, "suffix_tree").seconds("fixed", 256, 15.0) == tree.seconds("fixed", 256)


def test_simulator_charges_more_host_time_when_more_is_accepted(tmp_path):
    """The same trace with every draft accepted against almost none: with growth the accepted-heavy steps pay
    the suffix tree's appends, so the gap between the two is larger than without."""
    from spec_plugins.bench import policy_sim
    from spec_plugins.policy.cost import DraftCost, RooflineCost
    from spec_plugins.traces import load_traces
    from test_policy_planner import make_trace

    cost = RooflineCost("h200", "llama-3.1-8b", drafter=DraftCost(kind="model_free", per_request_us=0.0))
    path = make_trace(tmp_path, max_draft=8)
    doc = json.loads(path.read_text())
    doc["proposer"] = "suffix_tree"
    for r in doc["requests"]:
        for s in r["steps"]:
            s.update(drafted=8, accepted=8, confidence=[0.95] * 8)
    path.write_text(json.dumps(doc))
    traces = load_traces([path])
    plain = HostTime.load(DEFAULT, "suffix_tree")
    grown = HostTime.load(DEFAULT, "suffix_tree", GROWTH)
    g_plain = policy_sim.run(traces, cost, [256], 8, 20, 0, host=plain)["goodput"]
    g_grown = policy_sim.run(traces, cost, [256], 8, 20, 0, host=grown)["goodput"]
    assert g_grown["static_8"][0] < 0.98 * g_plain["static_8"][0]  # 9 tokens a step appended: more host time
    assert g_grown["static_0"][0] >= g_plain["static_0"][0]  # 1 token a step: less than the 1-4-token base


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
