"""The robustness grid (`spec_plugins.bench.robustness`): its workloads, its cells and its summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spec_plugins.bench import robustness

ROOT = Path(__file__).resolve().parents[1]


def test_spec_bench_splits_by_prompt_shape_cover_the_file_once():
    by_name = {w.name: w for w in robustness.WORKLOADS}
    long = robustness.workload_rows(by_name["chat_long_context"])
    short = robustness.workload_rows(by_name["chat_short_context"])
    everything = [line for line in (ROOT / "benchmarks/workloads/spec_bench_smollm2.jsonl").read_text().splitlines()
                  if line.strip()]
    assert len(long) + len(short) == len(everything) and not set(long) & set(short)
    groups = {json.loads(line)["source"]["group"] for line in long}
    assert groups == {"summarization", "rag"}
    # The long split's prompts are longer: what it is there to test.
    mean = lambda rows: sum(len(json.loads(r)["prompt"]) for r in rows) / len(rows)
    assert mean(long) > 3 * mean(short)


def test_grid_runs_every_cell_names_the_worst_and_writes_json(tmp_path, capsys):
    # Traces already in place are used as they are (no replay): the committed K = 16 code-completion trace.
    traces = tmp_path / "traces" / "v1" / "k16" / "code_completion"
    traces.mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks/traces/code_completion/suffix_tree.json", traces / "suffix_tree.json")
    out = tmp_path / "grid.json"
    rc = robustness.main(["--workloads", "code_completion", "--caps", "16", "--batch-sizes", "1,16", "--steps", "60",
                          "--traces-dir", str(tmp_path / "traces"), "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    cells = doc["cells"]
    assert len(cells) == 2 * 2  # two cost models x two batch sizes
    assert {c["cost_model"] for c in cells} == set(robustness.COST_MODELS)
    for c in cells:
        assert c["adaptive_vs_best_static"] == pytest.approx(c["adaptive"] / c["best_static_goodput"])
        assert c["best_static"].startswith("static_") and int(c["best_static"][7:]) <= 16
    worst = min(cells, key=lambda c: c["adaptive_vs_best_static"])
    assert doc["summary"]["worst"] == worst["adaptive_vs_best_static"]
    assert doc["summary"]["worst_cell"]["batch"] == worst["batch"]
    assert "cells: median" in capsys.readouterr().out


def test_bad_grid_arguments_fail_in_one_line(capsys):
    assert robustness.main(["--workloads", "code_edits,nope"]) == 2
    assert robustness.main(["--cost-models", "a100"]) == 2
    err = capsys.readouterr().err
    assert "--workloads: unknown 'nope'" in err and "--cost-models: unknown 'a100'" in err
