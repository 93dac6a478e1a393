"""`policy: adaptive` with no options: the prior read off the engine's device, the model from the engine, and
the one-line errors of options that name the wrong thing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spec_plugins.core import BatchDrafts, Draft, DraftBatch, DraftRequest
from spec_plugins.policy.adaptive import AdaptiveLength
from spec_plugins.policy.device import CPU_PRIOR, named_gpu, prior_for_device, roofline_from_properties
from spec_plugins.policy.hardware import load_hardware
from spec_plugins.policy.measured import MeasuredCost, check_profile_model, model_shape
from spec_plugins.registry import create_policy

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMOLLM2 = json.loads((CONFIGS / "models" / "smollm2-135m.json").read_text())
LLAMA_8B = json.loads((CONFIGS / "models" / "llama-3.1-8b.json").read_text())


def one_step(policy: AdaptiveLength, n: int = 8, k: int = 8) -> np.ndarray:
    reqs = [DraftRequest(req_id=i, tokens=list(range(200)), num_new=1, max_draft=k) for i in range(n)]
    drafts = [Draft([1] * k, confidence=[0.9] * k) for _ in range(n)]
    return policy.trim_batch(DraftBatch.from_requests(reqs), BatchDrafts.from_drafts(drafts))


def test_no_options_on_a_cpu_engine_start_from_the_cpu_profile_and_fit_the_steps():
    policy = create_policy("adaptive", {})
    assert policy.cost is None and policy.observes_step_time  # nothing named, the measured steps on
    policy.bind_model(LLAMA_8B, source="engine", device="cpu")  # another model than the prior's: a prior still
    assert policy.cost is None  # chosen where the first step is costed, not in a front end
    assert one_step(policy).sum() > 0
    assert isinstance(policy.cost, MeasuredCost) and policy.cost.profile["model"] == "smollm2"
    assert CPU_PRIOR in policy.cost_source and "cpu engine" in policy.cost_source


def test_no_options_and_no_engine_still_cost_on_the_cpu_prior():
    policy = AdaptiveLength()  # a replay or a unit test: no engine bound, torch's CUDA not initialised
    assert one_step(policy).sum() > 0 and isinstance(policy.cost, MeasuredCost)


def test_explicit_options_win_over_the_device():
    policy = create_policy("adaptive", {"hardware": "h200"})
    policy.bind_model(LLAMA_8B, device="cpu")
    assert policy.cost is not None and policy.cost.hardware.name == "h200" and policy.cost_source == "hardware 'h200'"
    measured = create_policy("adaptive", {"profile": CPU_PRIOR})
    measured.bind_model(SMOLLM2, device="cuda")
    assert isinstance(measured.cost, MeasuredCost) and measured.cost_source == f"profile {CPU_PRIOR!r}"


def test_an_explicit_model_config_wins_over_the_engines_model():
    policy = create_policy("adaptive", {"model_config": "llama-3.1-8b"})
    policy.bind_model(SMOLLM2, device="cpu")  # the engine binds its own model and its device afterwards
    assert policy._engine[0].hidden == 4096 and policy._engine[1] == "cpu"


def test_gpus_by_name_pick_the_shipped_profiles():
    assert named_gpu("NVIDIA H100 80GB HBM3") == "h100" and named_gpu("NVIDIA H100 NVL") == "h100"
    assert named_gpu("NVIDIA H200") == "h200" and named_gpu("NVIDIA B200") == "b200"
    assert named_gpu("NVIDIA A100-SXM4-80GB") == "a100" and named_gpu("NVIDIA L40S") == "l40s"
    assert named_gpu("NVIDIA GeForce RTX 4090") is None and named_gpu("NVIDIA RTX PRO 6000") is None
    kind, prior, how = prior_for_device("cpu")
    assert (kind, prior) == ("profile", CPU_PRIOR) and "cpu" in how


@pytest.mark.parametrize("name, major, minor, sms, clock_mhz, mem_mhz, bus", [
    ("h100", 9, 0, 132, 1830, 2619, 5120),   # the datasheet's peaks come back from the reported properties
    ("a100", 8, 0, 108, 1410, 1593, 5120),
    ("l40s", 8, 9, 142, 2520, 9001, 384),    # GDDR6: the reported clock is half the data rate
])
def test_an_unknown_gpu_gets_a_roofline_from_its_properties(name, major, minor, sms, clock_mhz, mem_mhz, bus):
    shipped = load_hardware(name)
    built = roofline_from_properties(f"like {name}", major, minor, sms, clock_mhz * 1e3, mem_mhz * 1e3, bus)
    assert built.bf16_tflops == pytest.approx(shipped.bf16_tflops, rel=0.03)
    assert built.memory_bandwidth_tbs == pytest.approx(shipped.memory_bandwidth_tbs, rel=0.08)
    assert built.gemm_tile_rows == shipped.gemm_tile_rows
    assert (built.fp8_tflops is None) == (shipped.fp8_tflops is None)


def test_a_profile_of_another_model_is_refused_in_one_line_naming_the_field():
    policy = create_policy("adaptive", {"profile": CPU_PRIOR})
    with pytest.raises(ValueError, match=r"^policy_options.profile: measured for another model \('smollm2': "
                                         r"layers 30, hidden 576.*the engine serves layers 32, hidden 4096") as exc:
        policy.bind_model(LLAMA_8B, device="cpu")
    assert "\n" not in str(exc.value)
    policy.bind_model(SMOLLM2, device="cpu")  # its own model: accepted
    unchecked = dict(policy.cost.profile)
    del unchecked["model_shape"]  # a profile written before shapes were recorded cannot be checked
    check_profile_model(unchecked, LLAMA_8B)
    assert model_shape(SMOLLM2) == policy.cost.profile["model_shape"]


@pytest.mark.parametrize("options, message", [
    ({"hardware": "h900"}, r"^policy_options.hardware: unknown profile 'h900'; expected one of a100, b200, h100"),
    ({"hardware": "h200", "profile": CPU_PRIOR}, r"^policy_options: expected at most one of 'hardware'"),
    ({"profile": "nope"}, r"^policy_options.profile: no file or shipped profile 'nope'"),
])
def test_bad_names_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as exc:
        create_policy("adaptive", options)
    assert "\n" not in str(exc.value)


def test_a_profile_file_of_the_wrong_shape_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    doc = json.loads((CONFIGS / "profiles" / f"{CPU_PRIOR}.json").read_text())
    doc["points"][0]["tokens"] = 7  # batch 1, draft 0 verifies 1 token
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"points.0: expected tokens = batch \* \(1 \+ draft\) = 1, got 7") as exc:
        create_policy("adaptive", {"profile": str(bad)})
    assert "\n" not in str(exc.value)
    bad.write_text(json.dumps({"format": "spec-plugins-step-profile/1", "points": []}))
    with pytest.raises(ValueError, match=r"profile.*: engine: Field required"):
        create_policy("adaptive", {"profile": str(bad)})
