"""The calibration report: per-token confidences against observed conditional acceptance."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spec_plugins.bench import calibration
from spec_plugins.traces import TRACE_FORMAT


def synthetic_trace(tmp_path, bias: float, n: int = 4000, seed: int = 0):
    """Drafts whose token k is accepted with probability q_k; the trace claims q_k + bias."""
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(n):
        q = rng.uniform(0.2, 0.95, size=6)
        accepted = 0
        while accepted < 6 and rng.random() < q[accepted]:
            accepted += 1
        steps.append({"pos": i, "drafted": 6, "accepted": accepted,
                      "confidence": np.clip(q + bias, 0, 1).tolist(), "kind": "copy" if i % 2 else "count"})
    doc = {"format": TRACE_FORMAT, "workload": "w", "file": "x", "proposer": "p", "options": {}, "max_draft": 6,
           "requests": [{"id": "r", "prompt_len": 1, "response_len": n, "steps": steps}]}
    path = tmp_path / f"t{bias}.json"
    path.write_text(json.dumps(doc))
    return path


def test_calibrated_confidences_have_a_small_error_and_biased_ones_a_large_one(tmp_path):
    out = tmp_path / "c.json"
    rows = {}
    for bias in (0.0, 0.2):
        assert calibration.main(["--traces", str(synthetic_trace(tmp_path, bias)), "--json", str(out)]) == 0
        rows[bias] = {(r["kind"], r["positions"]): r for r in json.loads(out.read_text())["rows"]}
    for key in (("all", "all"), ("all", "0"), ("copy", "all"), ("count", "2-3")):
        assert rows[0.0][key]["ece"] < 0.03
        assert rows[0.2][key]["ece"] > 0.12
    assert rows[0.2][("all", "0")]["predicted"] - rows[0.2][("all", "0")]["observed"] == pytest.approx(0.2, abs=0.03)


def test_traces_without_confidences_are_one_line(tmp_path, capsys):
    path = synthetic_trace(tmp_path, 0.0, n=5)
    doc = json.loads(path.read_text())
    for s in doc["requests"][0]["steps"]:
        del s["confidence"]
    path.write_text(json.dumps(doc))
    assert calibration.main(["--traces", str(path)]) == 2
    assert "no step carries confidences" in capsys.readouterr().err


def _trace(steps: list[dict]) -> dict:
    return {"format": TRACE_FORMAT, "workload": "w", "proposer": "p", "max_draft": 4,
            "requests": [{"id": "r", "prompt_len": 3, "response_len": 20, "steps": steps}]}


def test_only_positions_reached_are_scored_and_the_log_loss():
    steps = [{"pos": 1, "drafted": 4, "accepted": 1, "confidence": [0.9, 0.5, 0.4, 0.3]},  # 0 hit, 1 miss, 2-3 not tried
             {"pos": 3, "drafted": 2, "accepted": 2, "confidence": [0.8, 0.7]},  # both hit; nothing past the draft
             {"pos": 6, "drafted": 0, "accepted": 0, "confidence": []}]
    t = calibration.tried_tokens(_trace(steps))
    assert t["pos"].tolist() == [0, 1, 0, 1] and t["conf"].tolist() == [0.9, 0.5, 0.8, 0.7]
    assert t["ok"].tolist() == [1.0, 0.0, 1.0, 1.0]
    row = calibration.calibrate(_trace(steps))[0]
    expected = -(np.log(0.9) + np.log(0.5) + np.log(0.8) + np.log(0.7)) / 4
    assert row["tries"] == 4 and row["log_loss"] == pytest.approx(expected, abs=1e-9)


def test_informative_confidences_beat_the_base_rate():
    rng = np.random.default_rng(0)
    steps = []
    for i in range(400):
        p = float(rng.choice([0.1, 0.9]))
        steps.append({"pos": i, "drafted": 1, "accepted": int(rng.random() < p), "confidence": [p]})
    row = calibration.calibrate(_trace(steps))[0]
    assert row["log_loss"] < row["base_rate_log_loss"]
    by_bin = {b["bin"]: b for b in row["bins"]}
    assert abs(by_bin[1]["observed"] - 0.1) < 0.07 and abs(by_bin[9]["observed"] - 0.9) < 0.07
