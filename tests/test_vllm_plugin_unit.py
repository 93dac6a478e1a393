"""The vLLM general plugin with fake runners (the real engine runs in integration_tests/test_vllm_plugin.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from spec_plugins.core import Draft
from spec_plugins.vllm import SpecPluginsProposer, plugin


@pytest.fixture(autouse=True)
def fresh_plugin(monkeypatch):
    """Each test starts as a new process would: not registered, nothing warned, vLLM 0.32.0."""
    monkeypatch.setattr(plugin, "_enabled", False)
    monkeypatch.setattr(plugin, "_warned", False)
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.32.0+cpu")
    monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)


def vllm_config(k=3, max_model_len=64):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        additional_config=None,
    )


class Recorder:
    """Stands in for the proposer: records what it is asked and what it frees."""

    def __init__(self):
        self.seen: list[tuple] = []
        self.finished: list = []

    def propose(self, requests):
        self.seen.append([(r.req_id, r.num_new) for r in requests])
        return [Draft([]) for _ in requests]

    def finish(self, req_id):
        self.finished.append(req_id)


def runner_class():
    """A fresh stand-in for GPUModelRunner: its method calls the drafter the way vLLM 0.32 does."""

    class Runner:
        def __init__(self, drafter, rows):
            self.drafter = drafter
            self.set_rows(rows)

        def set_rows(self, rows: dict):
            ids = np.zeros((len(rows) + 1, 64), dtype=np.int32)
            num = np.zeros(len(rows) + 1, dtype=np.int32)
            for i, toks in enumerate(rows.values()):
                ids[i, : len(toks)] = toks
                num[i] = len(toks)
            self.input_batch = SimpleNamespace(req_ids=list(rows), num_tokens_no_spec=num, token_ids_cpu=ids)

        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *rest, slot_mappings=None):
            return self.drafter.propose(sampled_token_ids, self.input_batch.num_tokens_no_spec,
                                        self.input_batch.token_ids_cpu, slot_mappings=slot_mappings)

    return Runner


def step(finished=(), preempted=None):
    return SimpleNamespace(finished_req_ids=set(finished), preempted_req_ids=preempted)


@pytest.fixture
def fake_runner_module(monkeypatch):
    """Puts a fake `vllm.v1.worker.gpu_model_runner` in sys.modules, as inside a vLLM worker."""
    module = types.ModuleType(plugin.RUNNER_MODULE)
    module.GPUModelRunner = runner_class()
    monkeypatch.setitem(sys.modules, plugin.RUNNER_MODULE, module)
    return module.GPUModelRunner


def test_register_twice_and_two_proposers_wrap_once(fake_runner_module):
    Runner = fake_runner_module
    orig = Runner.__dict__["propose_draft_token_ids"]
    plugin.register()
    plugin.register()
    SpecPluginsProposer(vllm_config())  # vLLM builds the drafter inside the runner's constructor
    SpecPluginsProposer(vllm_config())
    assert plugin.install() and plugin.install(Runner)
    wrapped = Runner.__dict__["propose_draft_token_ids"]
    assert wrapped is not orig and wrapped.__wrapped__ is orig
    assert Runner.__dict__[plugin.ORIG] is orig


def test_nothing_is_patched_without_register_or_outside_a_runner(fake_runner_module):
    Runner = fake_runner_module
    orig = Runner.__dict__["propose_draft_token_ids"]
    SpecPluginsProposer(vllm_config())  # register() never ran in this "process"
    assert Runner.__dict__["propose_draft_token_ids"] is orig
    plugin.register()
    sys.modules.pop(plugin.RUNNER_MODULE)
    assert plugin.install() is False  # no vLLM runner imported: nothing to patch


def test_wrapper_passes_through_for_other_drafters():
    Runner = runner_class()
    plugin.register()
    assert plugin.install(Runner)

    class VllmNgram:
        row_req_ids = "untouched"

        def propose(self, sampled, num, ids, slot_mappings=None):
            return [[7]] * len(sampled)

    drafter = VllmNgram()
    runner = Runner(drafter, {"a": [1, 2, 3]})
    assert runner.propose_draft_token_ids(step(finished={"zz"}), [[3]], None) == [[7]]
    assert drafter.row_req_ids == "untouched"


def test_request_ids_arrive_and_finished_requests_are_freed():
    Runner = runner_class()
    plugin.register()
    assert plugin.install(Runner)
    prop = SpecPluginsProposer(vllm_config())
    prop.proposer = rec = Recorder()
    runner = Runner(prop, {"a": [1, 2, 3, 4], "b": [5, 6, 7], "c": [8, 9]})
    runner.propose_draft_token_ids(step(), [[4], [7], []], None)  # c is still in prefill
    assert rec.seen[-1] == [("a", 4), ("b", 3)]  # first step: num_new is the whole context
    assert prop.row_req_ids == ["a", "b", "c"]

    # b finished; condense() moved c into b's row; a new request d took row 2.
    runner.set_rows({"a": [1, 2, 3, 4, 5, 6], "c": [8, 9, 10], "d": [11, 12]})
    runner.propose_draft_token_ids(step(finished={"b"}), [[5, 6], [10], [12]], None)
    assert rec.finished == ["b"]
    assert rec.seen[-1] == [("a", 2), ("c", 3), ("d", 2)]
    assert prop.num_finished == 1

    # a preempted (vLLM recomputes it from scratch later, so it starts over here too);
    # an unknown id finishing is ignored.
    runner.set_rows({"c": [8, 9, 10, 11], "d": [11, 12, 13]})
    runner.propose_draft_token_ids(step(finished={"never-seen"}, preempted={"a"}), [[11], [13]], None)
    assert rec.finished == ["b", "a"]
    assert rec.seen[-1] == [("c", 1), ("d", 1)]


def test_absent_requests_are_finished_after_stale_steps():
    prop = SpecPluginsProposer(vllm_config())
    prop.proposer = rec = Recorder()
    num, ids = np.array([3, 3]), np.array([[1, 2, 3], [4, 5, 6]])
    prop.row_req_ids = ["a", "b"]
    prop.propose([[3], [6]], num, ids)
    prop.row_req_ids = ["b"]  # a left without a finish (e.g. the batch drained)
    for _ in range(prop.stale_steps):
        prop.propose([[6]], num, ids)
    assert rec.finished == []
    prop.propose([[6]], num, ids)
    assert rec.finished == ["a"] and prop.drafting.tracked() == ["b"]


def test_without_the_plugin_rows_stand_for_requests():
    prop = SpecPluginsProposer(vllm_config())
    prop.proposer = rec = Recorder()
    prop.propose([[3], [6]], np.array([3, 3]), np.array([[1, 2, 3], [4, 5, 6]]))
    assert [r for r, _ in rec.seen[-1]] == ["row-0", "row-1"]


def test_unsupported_version_warns_once_and_patches_nothing(monkeypatch, caplog):
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.35.1")
    Runner = runner_class()
    orig = Runner.__dict__["propose_draft_token_ids"]
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        plugin.register()
        plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "vLLM 0.35.1 is not supported (supported: 0.32.x, 0.33.x, 0.34.x)" in warnings[0]
    assert "not registered" in warnings[0]
    assert plugin.install(Runner) is False
    assert Runner.__dict__["propose_draft_token_ids"] is orig


@pytest.mark.parametrize("found, ok", [("0.33.0", True), ("0.32.0+cpu", True), ("0.34.0", True), ("0.31.9", False),
                                       ("0.35.0", False),
                                       ("1.32.0", False), ("dev", False), (None, False)])
def test_version_range(found, ok):
    assert plugin._supported(found) is ok


def test_switch_off_patches_nothing(monkeypatch):
    monkeypatch.setenv(plugin.ENV_SWITCH, "0")
    Runner = runner_class()
    plugin.register()
    assert plugin.install(Runner) is False and plugin.ORIG not in Runner.__dict__


def test_register_never_raises(monkeypatch, caplog):
    def boom():
        raise RuntimeError("metadata broken")

    monkeypatch.setattr(plugin, "_vllm_version", boom)
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        plugin.register()
    assert plugin.install(runner_class()) is False
    assert "metadata broken" in caplog.text


def test_trace_file_records_rows_and_finishes(monkeypatch, tmp_path):
    import json

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SPEC_PLUGINS_TRACE_FILE", str(trace))
    prop = SpecPluginsProposer(vllm_config())
    prop.row_req_ids = ["a"]
    prop.propose([[3]], np.array([3]), np.array([[1, 2, 3]]))
    prop.propose([[4, 5]], np.array([5]), np.array([[1, 2, 3, 4, 5]]))  # one drafted token accepted, one bonus
    prop.finish("a")
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[1]["us"] > 0 and lines[1]["t"] > 0
    # The proposer's own call is part of the step, and timed only with the trace on.
    assert 0 < lines[1]["proposer_us"] < lines[1]["us"]
    assert [{k: v for k, v in e.items() if k not in ("pid", "t", "us", "proposer_us")} for e in lines] == [
        {"start": "ngram", "policy": "fixed", "k": 3},
        {"step": 1, "rows": ["a"], "tracked": 1, "drafted": [0], "accepted": [0]},
        {"step": 2, "rows": ["a"], "tracked": 1, "drafted": [0], "accepted": [1]},
        {"finish": "a", "why": "finished", "tracked": 0}]


def test_trace_carries_the_adaptive_policys_step_fit(monkeypatch, tmp_path):
    import json

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SPEC_PLUGINS_TRACE_FILE", str(trace))
    from spec_plugins.vllm.proposer import StepTrace

    monkeypatch.setattr(StepTrace, "stats_every", 2)
    cfg = vllm_config()
    cfg.model_config.hf_config = SimpleNamespace(to_dict=dict)  # the profile costs the steps; the model is unused
    cfg.additional_config = {"spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive", "policy_options": {
        "profile": "vllm-cpu-smollm2-135m", "step_overhead": "measured"}}}
    prop = SpecPluginsProposer(cfg)
    prop.row_req_ids = ["a"]
    tokens = np.array([[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]])
    for n in (6, 7, 8, 9):  # one sampled token a step, the same request: intervals the policy fits
        prop.propose([[int(tokens[0, n - 1])]], np.array([n]), tokens)
    steps = [json.loads(line) for line in trace.read_text().splitlines() if '"step"' in line]
    assert "policy_stats" not in steps[0] and steps[1]["policy_stats"]["step_fits"] >= 1
    assert steps[3]["policy_stats"]["step_fits"] == pytest.approx(1 + 0.95 + 0.95 ** 2)
    assert steps[3]["policy_stats"]["step_offset_ms"] >= 0.0


def test_register_imports_neither_numba_nor_torch_nor_vllm():
    code = ("import sys; from spec_plugins.vllm import plugin; plugin.register(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite', 'vllm', 'torch')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_real_vllm_runner_is_patched_once_and_the_cpu_runner_inherits_it():
    """Against the installed vLLM (imports the runner modules, ~10 s; no engine)."""
    pytest.importorskip("vllm")
    code = """
import inspect, sys
from spec_plugins.vllm import plugin
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
orig = GPUModelRunner.propose_draft_token_ids
params = list(inspect.signature(orig).parameters)
assert params[:3] == ["self", "scheduler_output", "sampled_token_ids"], params
src = inspect.getsource(orig)
assert "self.input_batch.num_tokens_no_spec" in src and "custom_class" in src
numba_before = "numba" in sys.modules
plugin.register(); plugin.register()
assert plugin.install() and plugin.install()
assert GPUModelRunner.__dict__[plugin.ORIG] is orig
assert GPUModelRunner.propose_draft_token_ids.__wrapped__ is orig
assert "propose_draft_token_ids" not in CPUModelRunner.__dict__
assert CPUModelRunner.propose_draft_token_ids is GPUModelRunner.propose_draft_token_ids
assert ("numba" in sys.modules) == numba_before
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


def test_front_end_check_stops_a_bad_section_where_the_config_is_built():
    """`vllm serve` builds its VllmConfig in the API server: our section is checked there, before any engine
    process starts, with the worker's own ValueError (the field path included)."""

    class EngineArgs:
        def __init__(self, config):
            self.config = config

        def create_engine_config(self, usage_context=None):
            return self.config

    def config(extra, method="custom_class", model="spec_plugins.vllm.SpecPluginsProposer"):
        cfg = vllm_config(k=4)
        cfg.speculative_config.method, cfg.speculative_config.model = method, model
        cfg.additional_config = extra
        cfg.model_config.hf_config = SimpleNamespace(to_dict=lambda: {})
        return cfg

    assert plugin.install_front_end_check(EngineArgs) and plugin.install_front_end_check(EngineArgs)
    assert EngineArgs.create_engine_config.__wrapped__ is vars(EngineArgs)[plugin.CHECK_ORIG]
    good = config({"spec_plugins": {"proposer": "suffix_tree"}})
    assert EngineArgs(good).create_engine_config() is good
    bad = {"spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive", "policy_options": {"hardware": "h900"}}}
    with pytest.raises(ValueError, match=r"^additional_config\.spec_plugins\.policy_options\.hardware: unknown "
                                         r"profile 'h900'"):
        EngineArgs(config(bad)).create_engine_config()
    with pytest.raises(ValueError, match=r"^additional_config\.spec_plugins\.proposer: this class serves 'ngram'"):
        EngineArgs(config({"spec_plugins": {"proposer": "suffix_tree"}}, model="spec_plugins.vllm.Ngram")
                   ).create_engine_config()
    with pytest.raises(ValueError, match=r"^additional_config\.spec_plugins\.proposer: the DSpark checkpoint"):
        EngineArgs(config({"spec_plugins": {"proposer": "ngram"}}, method="dflash", model="/ckpt")).create_engine_config()
    # Other methods and other custom classes are not ours to check.
    other = config(bad, method="ngram", model=None)
    assert EngineArgs(other).create_engine_config() is other
    foreign = config(bad, model="my_pkg.MyProposer")
    assert EngineArgs(foreign).create_engine_config() is foreign


# ---------------------------------------------------------------- front end and runner choice (vLLM 0.33 paths)

POLICY = {"spec_plugins": {"policy": "adaptive", "policy_options": {"hardware": "h100"}}}


def _engine_args(async_scheduling=None, additional_config=POLICY, method="dflash"):
    return SimpleNamespace(speculative_config={"method": method, "model": "/ckpt", "num_speculative_tokens": 6},
                           additional_config=additional_config, async_scheduling=async_scheduling)


def test_a_cutting_policy_turns_default_async_scheduling_off():
    args = _engine_args()
    plugin.prepare_engine_args(args)
    assert args.async_scheduling is False


def test_a_cutting_policy_refuses_explicit_async_scheduling():
    with pytest.raises(ValueError, match=r"^scheduler_config\.async_scheduling: .*--async-scheduling"):
        plugin.prepare_engine_args(_engine_args(async_scheduling=True))


@pytest.mark.parametrize("args", [_engine_args(additional_config={}), _engine_args(method="custom_class"),
                                  _engine_args(additional_config={"spec_plugins": {"policy": "fixed"}})])
def test_async_scheduling_left_to_vllm_without_a_cutting_policy(args):
    plugin.prepare_engine_args(args)
    assert args.async_scheduling is None


def _built(schedule=None, dp=1, model="spec_plugins.vllm.Ngram"):
    spec = SimpleNamespace(method="custom_class", model=model, num_speculative_tokens_per_batch_size=schedule)
    return SimpleNamespace(speculative_config=spec, additional_config={"spec_plugins": {"policy": "fixed"}},
                           parallel_config=SimpleNamespace(data_parallel_size=dp))


def test_a_schedule_vllm_dropped_travels_in_our_section():
    given = SimpleNamespace(speculative_config={"num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 64, 2]]})
    config = _built()
    plugin.keep_batch_schedule(given, config)
    assert config.additional_config["spec_plugins"] == {
        "policy": "fixed", "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 64, 2]]}
    for kept_as_is in (_built(schedule=[[1, 64, 3]]), _built(dp=2), _built(model="my.Proposer")):
        plugin.keep_batch_schedule(given, kept_as_is)
        assert kept_as_is.additional_config == {"spec_plugins": {"policy": "fixed"}}


def test_dspark_under_dflash_is_unsupported_on_model_runner_v2(monkeypatch):
    class Config:
        def __init__(self, method, archs):
            self.speculative_config = SimpleNamespace(method=method,
                                                      draft_model_config=SimpleNamespace(architectures=archs))

        def _get_v2_model_runner_unsupported_features(self):
            return ["something else"]

    monkeypatch.setattr(plugin, "_enabled", True)
    assert plugin.install_runner_choice(Config) and plugin.install_runner_choice(Config)  # idempotent
    assert Config("dflash", ["Qwen3DSparkModel"])._get_v2_model_runner_unsupported_features() == [
        "something else", plugin.DSPARK_V1_REASON]
    for untouched in (Config("dflash", ["DFlashDraftModel"]), Config("dspark", ["Qwen3DSparkModel"])):
        assert untouched._get_v2_model_runner_unsupported_features() == ["something else"]
    monkeypatch.setattr(plugin, "_enabled", False)  # SPEC_PLUGINS_VLLM_PLUGIN=0: vLLM's choice stands
    assert Config("dflash", ["Qwen3DSparkModel"])._get_v2_model_runner_unsupported_features() == ["something else"]
