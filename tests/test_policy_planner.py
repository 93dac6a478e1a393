"""Planner outputs (vLLM JSON, TensorRT-LLM YAML, plot, table), the policy simulator and their CLIs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from spec_plugins.bench import policy_sim
from spec_plugins.bench.host_time import DEFAULT as HOST_DEFAULT, HostTime
from spec_plugins.cli import main as cli_main
from spec_plugins.policy import planner
from spec_plugins.policy.cost import DraftCost, RooflineCost, step_cost
from spec_plugins.traces import load_traces

TRACE_FORMAT = "spec-plugins-replay-trace/1"


def make_trace(tmp_path, name="t", max_draft=8, n_requests=6, steps=40, seed=0, confidence=True):
    """A replay trace: per request some steps with high acceptance, some with none."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_requests):
        pos, out = 0, []
        good = r % 2 == 0
        for _ in range(steps):
            drafted = int(rng.integers(0, max_draft + 1))
            accepted = int(min(drafted, rng.integers(drafted // 2, drafted + 1) if good else 0))
            step = {"pos": pos, "drafted": drafted, "accepted": accepted}
            if confidence:
                step["confidence"] = [0.9 if good else 0.2] * drafted
            out.append(step)
            pos += accepted + 1
        reqs.append({"id": f"r{r}", "prompt_len": 100, "response_len": pos, "steps": out})
    doc = {"format": TRACE_FORMAT, "workload": name, "file": "x.jsonl", "proposer": "p", "options": {},
           "max_draft": max_draft, "requests": reqs}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def uniform_trace(tmp_path, max_draft, drafted, accepted, confidence=0.95):
    """make_trace's requests with every step drafting `drafted` tokens and accepting `accepted` of them."""
    path = make_trace(tmp_path, max_draft=max_draft)
    doc = json.loads(path.read_text())
    for r in doc["requests"]:
        for s in r["steps"]:
            s.update(drafted=drafted, accepted=accepted, confidence=[confidence] * drafted)
    path.write_text(json.dumps(doc))
    return path


class FlatCost:
    """Memory-bound: a step costs the same whatever is verified."""

    overhead_s = 0.0

    def linear_time(self, rows):
        return 1e-3

    def attention_time(self, draft_len, context_len):
        return 0.0

    def draft_time(self, draft_lens):
        return 0.0

    def step_time(self, draft_lens, context_lens):
        return 1e-3


class ProportionalCost(FlatCost):
    """Compute-bound: time proportional to verified tokens."""

    def linear_time(self, rows):
        return 1e-3 * rows

    def step_time(self, draft_lens, context_lens):
        return self.linear_time(sum(1 + d for d in draft_lens))


def test_plan_drafts_long_when_memory_bound_and_not_when_compute_bound(tmp_path):
    stats = planner.AcceptanceStats.from_traces(load_traces([make_trace(tmp_path)]))
    flat = planner.plan(FlatCost(), stats, 8, max_batch=16)
    assert set(flat.chosen) == {8}
    assert flat.schedule_ranges() == [[1, 16, 8]]
    busy = planner.plan(ProportionalCost(), stats, 8, max_batch=16)
    assert set(busy.chosen) == {0}
    assert any("does not pay" in n for n in busy.notes)


def test_plan_on_h200_shortens_drafts_with_batch_and_emits_valid_configs(tmp_path):
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    stats = planner.AcceptanceStats.from_traces(load_traces([make_trace(tmp_path, max_draft=16)]))
    cost = RooflineCost("h200", "llama-3.1-8b")
    p = planner.plan(cost, stats, 16, max_batch=256)
    assert p.chosen[0] >= p.chosen[-1] and max(p.chosen) == p.chosen[0]
    assert p.chosen[-1] < p.chosen[0]  # compute-bound at 256 requests: shorter drafts
    ranges = p.schedule_ranges()
    assert ranges[0][0] == 1 and ranges[-1][1] == 256
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no overlap
    for mech in planner.MECHANISMS:
        conf = planner.vllm_speculative_config(p, mech)
        assert conf["num_speculative_tokens"] == p.chosen[0]
        validate_and_normalize_dynamic_sd_schedule(conf["num_speculative_tokens_per_batch_size"])  # vLLM's own check
        trt = planner.trtllm_config(p, mech)["speculative_config"]
        planner.check_trtllm_schedule(trt["draft_len_schedule"], trt["max_draft_len"])
    out = planner.write_plan(p, cost, stats, "ngram", tmp_path / "plan", "test")
    doc = yaml.safe_load(out["trtllm"].read_text())
    assert doc["speculative_config"]["decoding_type"] == "NGram"
    assert doc["speculative_config"]["draft_len_schedule"][1] == doc["speculative_config"]["max_draft_len"]
    assert json.loads(out["vllm"].read_text())["method"] == "ngram"
    assert out["png"].stat().st_size > 10_000
    table = out["table"].read_text()
    assert "compute-bound" in table or "tile" in table


@pytest.mark.parametrize("schedule,max_len,match", [
    ({1: 4, 8: 2}, 4, None),
    ({2: 4}, 4, "must map batch size 1"),
    ({1: 3, 4: 2}, 4, "must map batch size 1"),
    ({1: 4, 8: 5}, 4, "exceeds max_draft_len"),
    ({1: 4, 0: 2}, 4, "keys must be batch sizes >= 1"),
    ({1: 4, 8: -1}, 4, "expected a draft length >= 0"),
])
def test_trtllm_schedule_rules(schedule, max_len, match):
    if match is None:
        planner.check_trtllm_schedule(schedule, max_len)
    else:
        with pytest.raises(ValueError, match=match):
            planner.check_trtllm_schedule(schedule, max_len)


def test_simulator_policies_and_json(tmp_path):
    path = make_trace(tmp_path, max_draft=8)
    out = tmp_path / "sim.json"
    rc = policy_sim.main(["--hardware", "h200", "--model-config", "llama-3.1-8b", "--traces", str(path),
                          "--batch-sizes", "1,16,64", "--steps", "40", "--json", str(out), "--png", str(tmp_path / "s.png"),
                          "--host-time", "none"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["host_time"] is None
    assert doc["batch_sizes"] == [1, 16, 64]
    g = doc["goodput"]
    assert set(g) == {"adaptive", "hindsight", "schedule", *(f"static_{d}" for d in range(9))}
    assert all(len(v) == 3 for v in g.values())
    for i in range(3):
        best_static = max(g[f"static_{d}"][i] for d in range(9))
        assert g["hindsight"][i] >= 0.99 * best_static  # drafting exactly what is accepted is hard to beat
        assert g["adaptive"][i] >= 0.9 * best_static


def test_simulator_takes_the_adaptive_policys_options(tmp_path, capsys):
    path = make_trace(tmp_path, max_draft=8)
    out = tmp_path / "sim.json"
    args = ["--hardware", "h200", "--model-config", "llama-3.1-8b", "--traces", str(path), "--batch-sizes", "1,16",
            "--steps", "40", "--host-time", "none", "--json", str(out)]
    # No drafted token allowed in a step: the adaptive policy is the static draft length 0.
    assert policy_sim.main(args + ["--policy-options", '{"max_draft_tokens_per_step": 0}']) == 0
    g = json.loads(out.read_text())["goodput"]
    assert g["adaptive"] == pytest.approx(g["static_0"]) and g["adaptive"][1] < max(g["static_4"][1], g["static_8"][1])
    for bad, said in (('{"min_gain": 2}', "--policy-options.min_gain"), ("[1]", "--policy-options: expected a JSON"),
                      ("{oops", "--policy-options: expected a JSON object")):
        assert policy_sim.main(args + ["--policy-options", bad]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1


def write_host_time(path, us_per_step: dict[str, float]):
    """A step_overhead --json measurement: each proposer row's time a step at batch 1, per request beyond."""
    path.write_text(json.dumps({"rows": [{"proposer": name, "batch": b, "us_per_step": us * b}
                                         for name, us in us_per_step.items() for b in (1, 256)]}))
    return path


def test_simulator_charges_measured_host_time(tmp_path, capsys):
    path = make_trace(tmp_path, max_draft=8)
    args = ["--hardware", "h200", "--model-config", "llama-3.1-8b", "--traces", str(path), "--batch-sizes", "1,64",
            "--steps", "30"]
    # The trace's proposer ("p") has no measured host time: one line saying so.
    assert policy_sim.main(args) == 2
    assert "no rows for 'p fixed'" in capsys.readouterr().err
    doc = json.loads(path.read_text())
    doc["proposer"] = "suffix_tree"
    path.write_text(json.dumps(doc))
    traces = load_traces([path])
    cost = RooflineCost("h200", "llama-3.1-8b", drafter=DraftCost(kind="model_free", per_request_us=0.0))
    cheap = write_host_time(tmp_path / "cheap.json", {"suffix_tree fixed": 100.0, "suffix_tree adaptive": 100.0})
    dear = write_host_time(tmp_path / "dear.json", {"suffix_tree fixed": 100.0, "suffix_tree adaptive": 5000.0})
    free = policy_sim.run(traces, cost, [1, 64], 8, 30, 0)["goodput"]
    charged = policy_sim.run(traces, cost, [1, 64], 8, 30, 0, host=HostTime.load(cheap, "suffix_tree"))["goodput"]
    for name in ("adaptive", "static_4", "hindsight"):
        assert all(c < f for c, f in zip(charged[name], free[name]))
    # The adaptive policy is charged the adaptive path's rows, the static lengths the fixed path's.
    dearer = policy_sim.run(traces, cost, [1, 64], 8, 30, 0, host=HostTime.load(dear, "suffix_tree"))["goodput"]
    assert dearer["static_4"] == charged["static_4"]
    assert all(d < c for d, c in zip(dearer["adaptive"], charged["adaptive"]))
    out = tmp_path / "sim.json"
    assert policy_sim.main(args + ["--traces", str(path), "--json", str(out), "--host-time", str(cheap)]) == 0
    assert json.loads(out.read_text())["host_time"] == str(cheap)
    # Without --host-time the CLI charges the shipped measurement.
    assert policy_sim.main(args + ["--traces", str(path), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["host_time"] == str(HOST_DEFAULT)


def test_simulator_tells_the_policy_each_steps_whole_time(tmp_path):
    from spec_plugins.bench.host_time import EngineHostTime

    traces = load_traces([make_trace(tmp_path, max_draft=8)])
    cost = step_cost(profile="vllm-cpu-smollm2-135m")  # a CPU engine: verified tokens dear, the trim at work
    # 60 ms of engine host time a step, which the cost model leaves out: a verified token is cheaper against the
    # real step than modelled. The default policy learns it from the steps' times; one told nothing does not.
    engine = EngineHostTime([{"batch": 1, "tokens_per_request": 1, "engine_us": 60000.0}])
    fitted = policy_sim.run(traces, cost, [16], 8, 80, 0, engine=engine)["goodput"]
    blind = policy_sim.run(traces, cost, [16], 8, 80, 0, engine=engine,
                           policy_options={"step_overhead": "model"})["goodput"]
    assert fitted["adaptive"][0] > blind["adaptive"][0]
    assert fitted["static_8"] == blind["static_8"]  # the static lengths learn nothing


def test_simulator_empty_drafts_cost_nothing(tmp_path):
    # Every step drafts nothing: every policy equals no speculation exactly.
    traces = load_traces([uniform_trace(tmp_path, 4, drafted=0, accepted=0)])
    res = policy_sim.run(traces, RooflineCost("h200", "llama-3.1-8b"), [4], 4, 30, 0)["goodput"]
    assert len({round(v[0], 6) for v in res.values()}) == 1


def test_plan_cli_and_bad_input(tmp_path, capsys):
    trace = make_trace(tmp_path)
    out = tmp_path / "out"
    rc = cli_main(["plan", "--hardware", "h200", "--model-config", "llama-3.1-8b", "--acceptance", str(trace),
                   "--mechanism", "suffix_tree", "--max-draft", "8", "--max-batch", "64", "--out", str(out)])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"vllm_speculative_config.json", "trtllm_llm_api.yaml", "speedup.png",
                                                "guidelines.txt", "plan.json"}
    bad_trace = tmp_path / "bad.json"
    bad_trace.write_text("{not json")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"format": TRACE_FORMAT, "max_draft": 4, "requests": [{"id": "a", "prompt_len": 1,
                                                                                        "response_len": 0, "steps": []}]}))
    base = ["plan", "--model-config", "llama-3.1-8b", "--acceptance", str(trace), "--mechanism", "ngram",
            "--max-draft", "8", "--out", str(out)]
    cases = [
        (["--hardware", "h900"], "hardware: unknown profile 'h900'"),
        (["--hardware", "h200", "--max-draft", "0"], "--max-draft: expected 1..128"),
        (["--hardware", "h200", "--mechanism", "medusa"], "--mechanism: expected one of"),
        (["--hardware", "h200", "--acceptance", str(bad_trace)], "not valid JSON"),
        (["--hardware", "h200", "--acceptance", str(empty)], "the trace has no steps"),
        (["--hardware", "h200", "--acceptance", str(tmp_path / "nope.json")], "no such file"),
        (["--hardware", "h200", "--tpot-ms", "-1"], "--tpot-ms: expected > 0"),
        ([], "expected exactly one of --hardware"),
    ]
    for extra, msg in cases:
        capsys.readouterr()
        assert cli_main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert msg in err and "\n" not in err, (extra, err)


def test_model_config_missing_field_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    rc = cli_main(["plan", "--hardware", "h200", "--model-config", str(cfg), "--acceptance",
                   str(make_trace(tmp_path)), "--mechanism", "ngram", "--max-draft", "4", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "missing field" in err and "\n" not in err


def test_policy_e2e_configurations_and_bad_input(capsys):
    from spec_plugins.bench import policy_e2e

    confs = policy_e2e.configurations("suffix_tree", [2, 8], 16, {"profile": "vllm-cpu-smollm2-135m"},
                                      ["suffix", "ngram"], [4, 8])
    assert list(confs) == ["none", "suffix_tree K=2", "suffix_tree K=8", "suffix_tree+adaptive K<=16",
                           "vllm:suffix K=4", "vllm:suffix K=8", "vllm:ngram K=4", "vllm:ngram K=8"]
    assert confs["vllm:ngram K=4"][0]["num_speculative_tokens"] == 4
    spec, extra = confs["suffix_tree+adaptive K<=16"]
    assert spec["num_speculative_tokens"] == 16 and extra["spec_plugins"]["policy"] == "adaptive"
    assert confs["vllm:suffix K=8"][0]["method"] == "suffix"
    two = policy_e2e.configurations("suffix_tree", [], 16, [{"profile": "p"}, {"profile": "p", "step_overhead": "model"}],
                                    [], [])
    assert list(two) == ["none", "suffix_tree+adaptive K<=16", "suffix_tree+adaptive K<=16 step_overhead=model"]
    assert two["suffix_tree+adaptive K<=16 step_overhead=model"][1]["spec_plugins"]["policy_options"]["step_overhead"] == "model"
    # An option the later set leaves out is named too (its engine would otherwise replace the first one's).
    back = policy_e2e.configurations("suffix_tree", [], 16, [{"profile": "p", "search": "global"},
                                                             {"profile": "p"}], [], [])
    assert list(back) == ["none", "suffix_tree+adaptive K<=16", "suffix_tree+adaptive K<=16 search=default"]
    with pytest.raises(ValueError, match="two sets of options make the same engine"):
        policy_e2e.configurations("suffix_tree", [], 16, [{"profile": "p"}, {"profile": "p"}], [], [])
    # Proposer options: one adaptive engine per (policy, proposer) pair, named by what each changes.
    pairs = policy_e2e.configurations("suffix_tree", [], 16, [{"profile": "p"}], [], [],
                                      [{}, {"copy_min_prob": 0.3}])
    assert list(pairs) == ["none", "suffix_tree+adaptive K<=16", "suffix_tree+adaptive K<=16 proposer.copy_min_prob=0.3"]
    assert "proposer_options" not in pairs["suffix_tree+adaptive K<=16"][1]["spec_plugins"]
    assert pairs["suffix_tree+adaptive K<=16 proposer.copy_min_prob=0.3"][1]["spec_plugins"]["proposer_options"] == {
        "copy_min_prob": 0.3}
    # Bad input fails before any engine starts, in one line.
    P = '{"profile": "vllm-cpu-smollm2-135m"}'
    for argv, msg in ((["--concurrency", "0"], "--concurrency"), (["--static-k", "0"], "--static-k"),
                      (["--static-k", ""], "none is allowed only beside --native"),
                      (["--proposer", "sufix"], "unknown name 'sufix'"),
                      (["--native", "eagle"], "--native: expected ngram and/or suffix"),
                      (["--native", "suffix", "--native-k", "0"], "--native-k"),
                      (["--policy-options", '{"profile": "nope"}'], "no file or shipped profile 'nope'"),
                      (["--policy-options", P, "--policy-options", P], "make the same engine"),
                      (["--proposer-options", '{"copy_min_prob": 2}'], "copy_min_prob"),
                      (["--proposer-options", "{}", "--proposer-options", "{}"], "make the same engine")):
        assert policy_e2e.main(argv) == 2
        assert msg in capsys.readouterr().err


def test_policy_e2e_round_order_rotates():
    from spec_plugins.bench.policy_e2e import warm_prompts
    from spec_plugins.bench.vllm_run import round_order

    names = ["none", "ours", "vllm:suffix K=2", "vllm:ngram K=2"]
    orders = [round_order(names, r) for r in range(5)]
    assert orders[0] == names and orders[4] == names  # every configuration starts one round in len(names)
    assert [o[0] for o in orders[:4]] == names
    assert all(sorted(o) == sorted(names) for o in orders)
    assert round_order([], 3) == []
    warm = warm_prompts(32)
    assert len(warm) == 32 and all(len(p) == 64 for p in warm) and len({tuple(p) for p in warm}) == 32


def test_policy_e2e_says_when_figures_rest_on_too_few_rounds():
    from spec_plugins.bench.policy_e2e import MIN_ROUNDS, rounds_note

    assert "rests on 2 round(s)" in rounds_note(2) and f"--repeats {MIN_ROUNDS}" in rounds_note(1)
    assert rounds_note(MIN_ROUNDS) is None and rounds_note(MIN_ROUNDS + 2) is None


def test_shipped_cpu_profile_loads():
    """The demo's and the CPU engine's default cost prior (its interpolation: tests/test_policy_profile.py)."""
    from spec_plugins.policy.measured import MeasuredCost, load_profile, profile_path

    profile = load_profile(profile_path("vllm-cpu-smollm2-135m"))
    assert profile["model"] == "smollm2" and profile["points"]
    assert MeasuredCost(profile).linear_time(8) > 0


def test_demo_runs_a_proposer_under_a_policy():
    from spec_plugins.demo import plugin_config

    spec, extra = plugin_config("suffix_tree+adaptive", 8)
    assert spec["num_speculative_tokens"] == 8
    assert extra == {"spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive"}}
    assert plugin_config("suffix_tree+adaptive", 8, {"hardware": "h200"})[1]["spec_plugins"][
        "policy_options"] == {"hardware": "h200"}
    assert plugin_config("ngram", 4)[1] == {"spec_plugins": {"proposer": "ngram"}}
    # vLLM 0.34+: our registered method, the same settings in speculator_options, no additional_config
    assert plugin_config("suffix_tree+adaptive", 8, vllm_version="0.34.0") == (
        {"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8, "speculator_options": {"policy": "adaptive"}},
        None)
    assert plugin_config("ngram", 4, vllm_version="0.34.1") == ({"method": "spec_plugins_ngram",
                                                                 "num_speculative_tokens": 4}, None)
    assert plugin_config("ngram", 4, vllm_version="0.33.0")[0]["method"] == "custom_class"


def test_shipped_engine_configs_pass_the_engines_rules():
    from pathlib import Path

    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    # The planner's outputs (GPU-model-mechanism); tests/test_trtllm_configs.py checks every file.
    root = Path(__file__).resolve().parents[1] / "configs"
    vllm_files = sorted((root / "vllm").glob("*-llama-*.json"))
    trt_files = sorted((root / "trtllm").glob("*-llama-*.yaml"))
    assert vllm_files and trt_files
    for f in vllm_files:
        conf = json.loads(f.read_text())
        assert conf["num_speculative_tokens"] >= 1
        validate_and_normalize_dynamic_sd_schedule(conf["num_speculative_tokens_per_batch_size"])
    for f in trt_files:
        spec = yaml.safe_load(f.read_text())["speculative_config"]
        planner.check_trtllm_schedule(spec["draft_len_schedule"], spec["max_draft_len"])


def test_schedule_is_non_increasing_and_has_the_fewest_ranges_within_one_percent():
    from spec_plugins.policy.planner import stable_schedule

    batches = [1, 2, 4, 8, 16, 32, 64]
    tpot = {d: [0.01] * len(batches) for d in range(5)}
    # D = 4 and 3 trade places by under 1% at every batch size; D = 1 wins clearly from batch 32 on.
    speed = {0: [1.0] * 7, 1: [1.1, 1.1, 1.1, 1.1, 1.1, 1.6, 1.7], 2: [1.2] * 7,
             3: [2.000, 1.995, 2.0, 1.990, 1.8, 1.3, 1.2], 4: [1.995, 2.0, 1.992, 2.0, 1.78, 1.2, 1.1]}
    chosen, notes = stable_schedule(batches, speed, tpot)
    # D = 3 is within 1% of the best up to batch 16: one range there, then D = 1 (never up again).
    assert chosen == [3, 3, 3, 3, 3, 1, 1] and not notes
    # The best D grows with the batch: the schedule may not follow it up. Least total shortfall beyond the
    # margin: keep D = 2 from batch 1 (25% below D = 1 there) rather than lose 24% and 66% later; noted.
    speed = {0: [1.0] * 3, 1: [2.0, 1.5, 1.0], 2: [1.5, 2.0, 3.0]}
    chosen, notes = stable_schedule([1, 8, 64], speed, {d: [0.01] * 3 for d in range(3)})
    assert chosen == [2, 2, 2] and notes == ["batch sizes [1]: more than 1% below the best D there, to keep "
                                             "the schedule non-increasing"]
    # A TPOT limit that only long drafts meet at a large batch cannot raise D either.
    tpot = {0: [0.01, 0.01, 0.09], 1: [0.01, 0.01, 0.09], 2: [0.01, 0.01, 0.01]}
    chosen, notes = stable_schedule([1, 8, 64], {0: [1.0] * 3, 1: [2.0, 2.0, 2.0], 2: [1.0, 1.0, 1.0]}, tpot,
                                    tpot_ms=50)
    assert chosen[0] >= chosen[1] >= chosen[2]


class LinearCost(FlatCost):
    """A fixed time a step plus a time a verified token."""

    def linear_time(self, rows):
        return 1e-3 + 1e-6 * rows

    def step_time(self, draft_lens, context_lens):
        return self.linear_time(sum(1 + d for d in draft_lens))


def test_plan_keeps_one_range_where_the_longest_draft_is_best_at_every_batch(tmp_path):
    """Every draft of 16 accepted: a step of B requests at D emits B (1 + D) tokens in 1 ms + B (1 + D) us, so the
    speed-up (1 + D)(1 + B/1000) / (1 + B (1 + D)/1000) grows with D at every B (at B = 256: 3.99x at D = 16, 3.94x
    at D = 15). The plan is D = 16 everywhere, one range (the plan of a real trace once split into five)."""
    path = uniform_trace(tmp_path, 16, drafted=16, accepted=16)
    p = planner.plan(LinearCost(), planner.AcceptanceStats.from_traces(load_traces([path])), 16)
    assert set(p.chosen) == {16}
    assert p.schedule_ranges() == [[1, 256, 16]]


def test_versus_native_compares_each_at_its_best_and_charges_engine_host_time(tmp_path, capsys):
    from spec_plugins.bench import versus_native

    # One workload whose three traces are the same requests: ours can only win through the adaptive policy.
    for proposer in ("suffix_tree", "arctic", "vllm_ngram"):
        doc = json.loads(make_trace(tmp_path, max_draft=8).read_text())
        doc["proposer"] = proposer
        (tmp_path / "w").mkdir(exist_ok=True)
        (tmp_path / "w" / f"{proposer}.json").write_text(json.dumps(doc))
    out = tmp_path / "vs.json"
    args = ["--hardware", "h200", "--model-config", "llama-3.1-8b", "--traces-dir", str(tmp_path), "--workloads", "w",
            "--batch-sizes", "1,64", "--steps", "30", "--json", str(out), "--runners", "v1"]
    assert versus_native.main(args + ["--host-time", "none"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 64]
    for r in rows:  # same traces, same steps, no host time: ours at its best static equals the natives' best
        assert r["static_vs_native"] == pytest.approx(1.0)
        assert r["arctic_best"] == pytest.approx(r["vllm_ngram_best"])
    # Each method charged its own host time from one measurement: the natives' dearer, ours ahead; ours dearer, behind.
    ours_us = {"suffix_tree fixed": 20.0, "suffix_tree adaptive": 20.0}
    natives_us = {"vLLM suffix (ArcticInference)": 400.0, "vLLM ngram (numba)": 400.0}
    natives_dear = write_host_time(tmp_path / "natives_dear.json", {**ours_us, **natives_us})
    assert versus_native.main(args + ["--host-time", str(natives_dear)]) == 0
    assert all(r["static_vs_native"] > 1.0 for r in json.loads(out.read_text())["rows"])
    ours_dear = write_host_time(tmp_path / "ours_dear.json",
                                {**{k: 400.0 for k in ours_us}, **{k: 20.0 for k in natives_us}})
    assert versus_native.main(args + ["--host-time", str(ours_dear)]) == 0
    assert all(r["static_vs_native"] < 1.0 for r in json.loads(out.read_text())["rows"])
    # vLLM 0.33 on a GPU: ngram and no speculation on MRV2 async pay no host time, ours and suffix on V1 pay the
    # engine's (here 4 ms a step): with the same drafts ours falls behind, and hiding that time recovers it.
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps({"rows": [{"batch": b, "tokens_per_request": t, "engine_us": 4000.0}
                                           for b in (1, 256) for t in (1, 8)]}))
    gpu = [a for a in args if a != "v1" and a != "--runners"] + ["--engine-host-time", str(engine), "--host-time", "none"]
    assert versus_native.main(gpu) == 0
    doc = json.loads(out.read_text())
    assert doc["runners"] == "gpu" and doc["engine_host_time"] == str(engine)
    for r in doc["rows"]:
        assert r["best_native"] in ("none (MRV2 async)", "vLLM ngram (MRV2 async)")
        assert r["static_vs_native"] < 1.0 and r["adaptive_vs_native"] < r["adaptive_engine_host_hidden_vs_native"]
        assert r["adaptive_engine_host_hidden_vs_native"] == pytest.approx(rows[doc["rows"].index(r)]["adaptive_vs_native"],
                                                                          rel=0.05)
    assert versus_native.main(gpu + ["--engine-host-time", "none"]) == 2
    assert "--engine-host-time" in capsys.readouterr().err
    assert versus_native.main(args + ["--workloads", "missing"]) == 2
    assert "no trace" in capsys.readouterr().err
    assert versus_native.main(args + ["--policy-options", '{"max_draft_tokens_per_step": 0}', "--host-time", "none"]) == 0
    undrafted = json.loads(out.read_text())["rows"]  # ours + adaptive drafting nothing: behind the natives' best
    assert all(r["adaptive_vs_native"] < 1.0 for r in undrafted)
    assert versus_native.main(args + ["--policy-options", '{"search": "best"}']) == 2
    assert "--policy-options.search" in capsys.readouterr().err


def test_batch_schedule_covers_the_whole_workload():
    """The simulator's schedule runs until every request of the workload has been taken and has ended (at batch 1 a
    fixed number of steps covered a few requests, and not the same ones for proposers that emit more a step)."""
    from spec_plugins.bench.policy_sim import TraceRequest, batch_schedule

    lengths = [5, 40, 3, 17, 9, 60]
    reqs = [TraceRequest(id=f"r{i}", prompt_len=10, pos=np.arange(n), drafted=np.zeros(n, dtype=int),
                         accepted=np.zeros(n, dtype=int), confidence=[None] * n) for i, n in enumerate(lengths)]
    for b in (1, 2, 4, 16):
        steps = batch_schedule(reqs, b, 3, seed=1)
        ended = {key for _, ends in steps for key in ends}
        assert {f"r{i}#1" for i in range(len(reqs))} <= ended, b
        assert all(len(batch) == b for batch, _ in steps)
    served: dict[str, list[int]] = {}
    steps = batch_schedule(reqs, 1, 3, seed=1)
    for batch, _ in steps:
        for key, i, k in batch:
            served.setdefault(key, []).append(k)
    first = steps[0][0][0][0]  # the first slot starts inside its request (a steady state); the rest run whole
    assert all(ks == list(range(lengths[int(key[1:].split("#")[0])])) for key, ks in served.items() if key != first)
    assert len(served) == len(reqs)
    assert len(batch_schedule(reqs, 1, 3, seed=1, whole=False)) == 3
