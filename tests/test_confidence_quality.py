"""Log-loss and calibration of a drafter's confidences on replay traces (`bench.confidence_quality`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spec_plugins.bench import confidence_quality as cq


def _trace(steps: list[dict], proposer: str = "p") -> dict:
    return {"format": "spec-plugins-replay-trace/1", "workload": "w", "proposer": proposer, "max_draft": 4,
            "requests": [{"id": "r", "prompt_len": 3, "response_len": 20, "steps": steps}]}


def test_only_positions_reached_are_scored():
    steps = [{"pos": 1, "drafted": 4, "accepted": 1, "confidence": [0.9, 0.5, 0.4, 0.3]},  # 0 hit, 1 miss, 2-3 not tried
             {"pos": 3, "drafted": 2, "accepted": 2, "confidence": [0.8, 0.7]},  # both hit; nothing past the draft
             {"pos": 6, "drafted": 0, "accepted": 0, "confidence": []}]
    pos, conf, hit = cq.tried_positions(_trace(steps))
    assert pos.tolist() == [0, 1, 0, 1] and conf.tolist() == [0.9, 0.5, 0.8, 0.7]
    assert hit.tolist() == [True, False, True, True]
    q = cq.quality(_trace(steps))
    expected = -(math.log(0.9) + math.log(0.5) + math.log(0.8) + math.log(0.7)) / 4
    assert q["tried"] == 4 and q["log_loss"] == pytest.approx(expected, abs=1e-4)


def test_informative_confidences_beat_the_base_rate_and_calibration_bins():
    rng = np.random.default_rng(0)
    steps = []
    for i in range(400):
        p = float(rng.choice([0.1, 0.9]))
        steps.append({"pos": i, "drafted": 1, "accepted": int(rng.random() < p), "confidence": [p]})
    q = cq.quality(_trace(steps))
    assert q["log_loss"] < q["base_rate_log_loss"]
    by_bin = {c["bin"]: c for c in q["calibration"]}
    assert abs(by_bin[0.1]["realised"] - 0.1) < 0.07 and abs(by_bin[0.9]["realised"] - 0.9) < 0.07


def test_cli_and_a_trace_without_confidences(tmp_path, capsys):
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(_trace([{"pos": 1, "drafted": 1, "accepted": 1, "confidence": [0.6]}])))
    (folder / "b.json").write_text(json.dumps(_trace([{"pos": 1, "drafted": 1, "accepted": 1}], "b")))
    out = tmp_path / "q.json"
    assert cq.main(["--traces-dir", str(tmp_path), "--workloads", "w", "--proposers", "a", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"]["w"]["a"]["tried"] == 1
    assert cq.main(["--traces-dir", str(tmp_path), "--workloads", "w", "--proposers", "b"]) == 2
    assert "no confidences" in capsys.readouterr().err
