"""The simulator's Model Runner V2 pieces: every slot verified, vLLM 0.34's adaptive verification, our MRV2 host
time, traces replayed with --accounting mrv2 and `versus_native --runners mrv2` on them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spec_plugins.bench import replay, versus_native
from spec_plugins.bench.host_time import DEFAULT as HOST_DEFAULT, MRV2_DEFAULT, HostTime, Mrv2HostTime
from spec_plugins.bench.policy_sim import AdaptiveVerification, VerifiesSlots
from spec_plugins.policy.cost import RooflineCost
from spec_plugins.traces import read_trace


@pytest.fixture(scope="module")
def cost():
    return RooflineCost("h200", "llama-3.1-8b")


def test_every_slot_is_verified_filler_included():
    assert VerifiesSlots(8).verify(["a", "b"], [None, [0.9]], np.array([0, 1]), np.array([0, 3]),
                                   [100, 100]).tolist() == [8, 8]


def _verify(av, confidences, drafted, context):
    n = len(drafted)
    return av.verify([f"r{i}" for i in range(n)], confidences, np.asarray(drafted), np.zeros(n, dtype=np.int64),
                     context)


def test_adaptive_verification_admits_the_most_likely_slots(cost):
    av = AdaptiveVerification(8, cost)
    sure, unsure = [0.99] * 8, [0.05] * 8
    # A small batch is memory-bound: verifying more costs almost nothing, so even unlikely slots are admitted; a
    # request without a draft has only filler, which scores 0 and is never admitted.
    assert _verify(av, [sure, unsure, None], [8, 8, 0], [200] * 3).tolist() == [8, 8, 0]
    # A large batch is compute-bound: nearly certain slots are worth their cost, nearly hopeless ones are not.
    keep = _verify(av, [sure] * 128 + [unsure] * 128, [8] * 256, [200] * 256)
    assert (keep[:128] == 8).all() and (keep[128:] <= 1).all()
    # Survival falls along a draft, so what is admitted of each is a prefix: here the likely head of every draft.
    falling = [0.9, 0.8, 0.6, 0.4, 0.2, 0.1, 0.05, 0.01]
    keep = _verify(av, [falling] * 256, [8] * 256, [200] * 256)
    assert keep.min() >= 1 and keep.max() < 8 and keep.max() - keep.min() <= 1


def test_adaptive_verification_under_our_policy_learns_calibrated_confidences(cost):
    """Our speculator under the adaptive policy hands vLLM calibrated estimates: a drafter that claims 0.99 but is
    always rejected at its first token is soon rated low, and vLLM admits little of it at a compute-bound batch."""
    from spec_plugins.policy.adaptive import AdaptiveLength

    av = AdaptiveVerification(8, cost, AdaptiveLength(cost=cost))
    keys, n = [f"r{i}" for i in range(256)], 256
    first = av.verify(keys, [[0.99] * 8] * n, np.full(n, 8), np.zeros(n, dtype=np.int64), [200] * n)
    for _ in range(30):
        last = av.verify(keys, [[0.99] * 8] * n, np.full(n, 8), np.zeros(n, dtype=np.int64), [200] * n)
    assert first.sum() > last.sum() and last.max() <= 1
    assert av.host_path == "adaptive" and AdaptiveVerification(8, cost).host_path == "fixed"
    raw = AdaptiveVerification(8, cost)
    assert (_verify(raw, [[0.99] * 8] * n, [8] * n, [200] * n) == 8).all()  # raw confidences: all admitted


def test_mrv2_host_time_adds_the_measured_mrv2_cost():
    base = HostTime.load(HOST_DEFAULT, "suffix_tree")
    mrv2 = Mrv2HostTime.load(base, MRV2_DEFAULT)
    rows = {(r["batch"], r["policy"]): r for r in json.loads(MRV2_DEFAULT.read_text())["rows"]}
    for b in (1, 16, 64, 256):
        extra = mrv2.seconds("fixed", b) - base.seconds("fixed", b)
        assert extra == pytest.approx(rows[(b, "fixed")]["mrv2_minus_v1_us"] * 1e-6)
    with pytest.raises(ValueError, match="no rows for the fixed policy"):
        Mrv2HostTime(base, [], source="empty.json")


def _rows() -> list[replay.Row]:
    rng = np.random.default_rng(3)
    phrase = rng.integers(0, 30, size=12)
    out = []
    for i in range(6):
        stream = np.concatenate([phrase, rng.integers(0, 30, size=4)] * 6)
        out.append(replay.Row(f"r{i}", np.array([200 + i, *stream[:16]], dtype=np.int32), stream[16:].astype(np.int32)))
    return out


def test_versus_native_on_mrv2_from_replayed_traces(tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    rows = _rows()
    traces = tmp_path / "traces"
    options = {"vllm034_suffix_np": {"adaptive_verification": True}}
    for name in ("suffix_tree", "vllm034_suffix_np", "vllm034_ngram_np"):
        proposer = replay.make_proposer(name, options.get(name))
        walks = [replay.walk(proposer, row, 8, fill=True) for row in rows]
        result = replay.WorkloadResult(name="w", file=str(workload), rows=rows, walks={name: walks}, updates={},
                                       wall_s={})
        replay.write_traces(traces, result, options, 8, "mrv2")
    doc = read_trace(traces / "w" / "vllm034_suffix_np.json")
    assert doc["accounting"] == "mrv2"
    assert any(s["confidence"] for r in doc["requests"] for s in r["steps"])  # vLLM's adaptive-verification inputs
    out = tmp_path / "vs.json"
    args = ["--hardware", "h200", "--model-config", "llama-3.1-8b", "--traces-dir", str(traces), "--workloads", "w",
            "--batch-sizes", "1,64", "--steps", "40", "--runners", "mrv2", "--json", str(out)]
    assert versus_native.main(args) == 0
    found = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in found] == [1, 64]
    for r in found:
        assert r["best_native"] in versus_native.MRV2_LABELS.values()
        assert r["ours_av_vs_native"] > 0 and r["ours_static_vs_native"] > 0
        # Hiding the runner's next-step preparation can only help ours.
        assert r["prep_hidden_best_vs_native"] >= max(r["ours_av_vs_native"], r["ours_static_vs_native"]) - 1e-9
    # Traces replayed with drafted-only accounting are refused, in one line naming the fix.
    drafted_only = [replay.walk(replay.make_proposer("vllm034_ngram_np"), row, 8) for row in rows]
    replay.write_traces(traces, replay.WorkloadResult(name="w", file=str(workload), rows=rows,
                                                      walks={"vllm034_ngram_np": drafted_only}, updates={},
                                                      wall_s={}), {}, 8)
    assert versus_native.main(args) == 2
    assert "--accounting mrv2" in capsys.readouterr().err
