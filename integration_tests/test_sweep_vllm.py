"""`spec-plugins sweep` against real `vllm serve` processes on a tiny model: outputs, and clean shutdown."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import pytest

from spec_plugins.bench import sweep
from spec_plugins.bench.workloads import Prompt
from spec_plugins.cli import main
from spec_plugins.traces import read_trace

SERVE_ARGS = "--dtype float32 --max-model-len 256 --enforce-eager --seed 0 --max-num-seqs 4"
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "Count: 1, 2, 3, 4, 5, 6,", "Name a colour.",
           "The cat sat on the mat. The cat sat on the", "Say hello.", "for i in range(10):\n    print(i)\nfor i in"]


def workload(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "category": "code" if "(" in p else "chat"}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def serve_pids(model: str) -> list[int]:
    """Live processes whose command line names the model (our servers and their engine processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "serve" in cmd and model in cmd:
            pids.append(int(entry.name))
    return pids


def test_sweep_writes_the_frontier_the_best_configs_and_plan_traces(tiny_llama, tmp_path):
    out = tmp_path / "out"
    rc = main(["sweep", "--model", tiny_llama, "--workload", str(workload(tmp_path)), "--methods", "none,suffix_tree",
               "--draft-lengths", "4", "--concurrency", "1,2", "--rounds", "1", "--per-slice", "2", "--max-tokens", "24",
               "--tpot-ms", "10000", "--serve-args", SERVE_ARGS, "--out", str(out)])
    assert rc == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["concurrency"]) for r in rows] == [("none", "1"), ("none", "2"), ("suffix_tree", "1"),
                                                              ("suffix_tree", "2")]
    assert all(r["identical"] == "True" for r in rows)  # greedy output of the speculative server = no speculation
    spec = [r for r in rows if r["method"] == "suffix_tree"]
    assert all(float(r["tokens_per_s"]) > 0 for r in spec)
    assert max(float(r["acceptance_length"]) for r in spec) > 1.0  # the suffix tree's drafts were accepted
    doc = json.loads((out / "results.json").read_text())
    assert doc["format"] == sweep.FORMAT and doc["frontier"]
    assert all(req["output_tokens"] > 0 and req["ttft_s"] <= req["latency_s"] for load in doc["loads"]
               for req in load["requests"])
    best = json.loads((out / "best_configs.json").read_text())
    # every row meets the 10 s target: the pick is the row with the most tokens/s, and its serve arguments
    fastest = max(doc["rows"], key=lambda r: (r["tokens_per_s"], r["tokens_per_s_per_user"]))
    assert (best[0]["config"], best[0]["concurrency"]) == (fastest["config"], fastest["concurrency"])
    assert best[0]["vllm_serve_args"] is not None
    assert (out / "pareto.png").stat().st_size > 10_000
    cats = {(c["config"], c["category"]) for c in csv.DictReader(open(out / "categories.csv"))}
    assert ("suffix_tree K=4", "code") in cats or ("suffix_tree K=4", "chat") in cats
    traces = sorted((out / "traces").glob("**/*.json"))
    assert {t.stem for t in traces} == {"suffix_tree", "ngram"}
    assert all(read_trace(t)["requests"] for t in traces)
    assert serve_pids(tiny_llama) == []  # every server it started is gone


class KillsServerAfterFirst(list):
    """A slice of prompts that kills the server under test once its first prompt is answered."""

    model = ""

    def __iter__(self):
        for i, p in enumerate(list.__iter__(self)):
            if i == 1:
                for pid in serve_pids(self.model):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            yield p


def plan_for(model: str, slices: dict) -> sweep.SweepPlan:
    configs = sweep.parse_methods("suffix_tree", [4], None)[1:]
    return sweep.SweepPlan(model, configs, [1], 1, 16, slices, SERVE_ARGS.split())


def test_a_failed_request_stops_the_server_and_names_the_configuration(tiny_llama, tmp_path):
    too_long = Prompt("long", ["word " * 400])  # past --max-model-len: the server answers 400
    plan = plan_for(tiny_llama, {(0, 1): [Prompt("ok", ["Say hello."]), too_long]})
    with pytest.raises(sweep.SweepError, match=r"suffix_tree K=4, round 1: BadRequestError"):
        sweep.run_sweep(plan, tmp_path)
    assert serve_pids(tiny_llama) == []


def test_a_server_that_dies_mid_run_is_an_error_not_a_hang(tiny_llama, tmp_path):
    prompts = KillsServerAfterFirst([Prompt(f"p{i}", [p]) for i, p in enumerate(PROMPTS[:3])])
    prompts.model = tiny_llama
    plan = plan_for(tiny_llama, {(0, 1): prompts})
    with pytest.raises(sweep.SweepError, match=r"suffix_tree K=4, round 1: APIConnectionError"):
        sweep.run_sweep(plan, tmp_path)
    assert serve_pids(tiny_llama) == []
