"""Every ready config under configs/trtllm and configs/vllm against the engine versions it declares, and the
one-line errors of the checkers (no engine needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from spec_plugins.core import Draft, DraftRequest
from spec_plugins.registry import create_policy, create_proposer
from spec_plugins.trtllm import versions
from spec_plugins.trtllm.config_files import check_config_file, split_vllm_file
from spec_plugins.trtllm.launcher import add_trtllm_parser
from spec_plugins.trtllm.settings import load_launch_config, parse_section
from spec_plugins.trtllm.versions import check_trtllm_config, check_vllm_speculative_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRTLLM_FILES = sorted((CONFIGS / "trtllm").glob("*.yaml"))
# configs/vllm: vLLM 0.34 (our registered methods) and vLLM's own methods; configs/vllm/v0.33: custom_class for 0.32 /
# 0.33.
VLLM_FILES = sorted((CONFIGS / "vllm").glob("*.json")) + sorted((CONFIGS / "vllm" / "v0.33").glob("*.json"))
NEW_TRTLLM = ["suffix_tree-adaptive", "ngram-adaptive", "native-ngram", "native-eagle3", "native-draft-target",
              "native-mtp", "native-dflash", "native-dspark", "native-sa"]
NEW_VLLM = ["suffix_tree-adaptive", "ngram-adaptive", "native-ngram", "native-suffix", "native-eagle3",
            "native-dflash", "native-mtp"]


def test_the_ready_configs_exist():
    assert {p.stem for p in TRTLLM_FILES} >= set(NEW_TRTLLM)
    assert {p.stem for p in VLLM_FILES} >= set(NEW_VLLM)


@pytest.mark.parametrize("path", TRTLLM_FILES, ids=lambda p: p.name)
def test_trtllm_config_passes_its_declared_versions(path):
    text = path.read_text()
    declared = versions.declared_trtllm_versions(text)
    for version in declared:
        check_trtllm_config(yaml.safe_load(text), version)
    assert check_config_file(path).startswith("tensorrt-llm")
    if path.stem in NEW_TRTLLM:  # ours carry the header, with a launch line
        assert text.startswith("# engine: tensorrt-llm>=")
        assert "serve" in text


def test_native_configs_declare_the_version_their_decoding_type_needs():
    for name in ("native-dflash", "native-dspark", "native-sa"):
        assert versions.declared_trtllm_versions((CONFIGS / "trtllm" / f"{name}.yaml").read_text())[0] == "1.3"
        with pytest.raises(ValueError, match=r"does not exist in TensorRT-LLM 1\.2 \(it needs 1\.3\+\)"):
            load_launch_config(CONFIGS / "trtllm" / f"{name}.yaml", version="1.2")
    for name in ("native-ngram", "native-eagle3", "native-draft-target", "native-mtp"):
        assert versions.declared_trtllm_versions((CONFIGS / "trtllm" / f"{name}.yaml").read_text()) == [
            "1.2", "1.3", "1.4"]


def test_planner_files_without_a_header_are_read_as_1_2_only():
    text = (CONFIGS / "trtllm" / "h200-llama-3.1-8b-suffix_tree.yaml").read_text()
    assert versions.declared_trtllm_versions(text) == ["1.2"]


@pytest.mark.parametrize("path", VLLM_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_vllm_config_passes_the_versions_of_its_folder(path):
    """configs/vllm/v0.33: vLLM 0.32 and 0.33 (custom_class); configs/vllm: 0.34, and our files nothing older."""
    spec, additional = split_vllm_file(json.loads(path.read_text()))
    old = path.parent.name == "v0.33"
    ours = spec["method"].startswith("spec_plugins_") or spec["method"] == "custom_class"
    for version in ("0.32", "0.33") if old else ("0.34",):
        check_vllm_speculative_config(spec, version)
    if ours and not old:
        with pytest.raises(ValueError, match="vLLM 0.32"):
            check_vllm_speculative_config(spec, "0.32")
    assert check_config_file(path) == ("vllm 0.32, 0.33" if old else "vllm 0.34" if ours else "vllm 0.32, 0.33, 0.34")
    assert (additional is not None) == (old and path.stem.endswith("-adaptive"))
    if ours and not old and path.stem.endswith("-adaptive"):
        assert spec["speculator_options"]["policy"] == "adaptive" and spec["enable_adaptive_verification"] is True


@pytest.mark.parametrize("name", ["suffix_tree-adaptive", "ngram-adaptive"])
def test_our_sections_build_a_real_proposer_and_policy(name):
    _, section = load_launch_config(CONFIGS / "trtllm" / f"{name}.yaml")
    assert section is not None and section.policy == "adaptive"
    proposer = create_proposer(section.proposer, section.proposer_options)
    policy = create_policy(section.policy, section.policy_options)
    assert hasattr(proposer, "propose") and hasattr(policy, "caps")
    # No options: the engine's model and device make the cost model (here a served Llama-3.1-8B on a CPU host).
    assert section.policy_options == {} and policy.cost is None
    policy.bind_model(json.loads((CONFIGS / "models" / "llama-3.1-8b.json").read_text()), device="cpu")
    assert policy.trim([DraftRequest(1, [1, 2, 3], 1, 4)], [Draft([1, 2, 3, 4], confidence=[0.9] * 4)])[0] in range(5)
    assert policy.cost is not None and "prior from the engine's device" in policy.cost_source
    doc = json.loads((CONFIGS / "vllm" / "v0.33" / f"{name}.json").read_text())
    vllm_section = doc["additional_config"]["spec_plugins"]
    assert vllm_section["policy"] == "adaptive" and "policy_options" not in vllm_section
    options = json.loads((CONFIGS / "vllm" / f"{name}.json").read_text())["speculator_options"]
    assert options == vllm_section  # vLLM 0.34: the same settings, in speculator_options


def test_trtllm_and_vllm_adaptive_configs_plan_the_same_k():
    for name in ("suffix_tree-adaptive", "ngram-adaptive"):
        trt, _ = load_launch_config(CONFIGS / "trtllm" / f"{name}.yaml")
        for vllm in (json.loads((CONFIGS / "vllm" / "v0.33" / f"{name}.json").read_text())["speculative_config"],
                     json.loads((CONFIGS / "vllm" / f"{name}.json").read_text())):
            assert trt["speculative_config"]["max_draft_len"] == vllm["num_speculative_tokens"]
            starts = {start: k for start, _, k in vllm["num_speculative_tokens_per_batch_size"]}
            assert starts == trt["speculative_config"]["draft_len_schedule"]


def test_the_vllm_key_lists_match_the_installed_vllm():
    speculative = pytest.importorskip("vllm.config.speculative")
    import typing

    def flat(t):
        return [x for a in typing.get_args(t) for x in ([a] if isinstance(a, str) else flat(a))]

    import vllm

    version = versions.vllm_rule_set(vllm.__version__)
    rules = versions.VLLM_RULES[version]
    assert set(flat(speculative.SpeculativeMethod)) == rules["methods"]
    internal = {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config",
                "tensor_parallel_size"}  # set by vLLM itself, or rejected explicitly
    assert set(speculative.SpeculativeConfig.__dataclass_fields__) - internal == rules["keys"]


# ---- bad input: one clear line naming the field --------------------------------------------------------

def _write(tmp_path, text, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


USER = """# engine: tensorrt-llm>=1.2
speculative_config: {decoding_type: UserProvided, max_draft_len: 4}
"""


def test_unknown_key_under_spec_plugins(tmp_path):
    path = _write(tmp_path, USER + "spec_plugins: {proposer: ngram, foo: 1}\n")
    with pytest.raises(ValueError, match=r"^spec_plugins\.foo: unknown key") as err:
        load_launch_config(path)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"bad\.yaml: spec_plugins\.foo: unknown key"):
        check_config_file(path)


def test_bad_proposer_option_names_the_field(tmp_path):
    path = _write(tmp_path, USER + "spec_plugins: {proposer: ngram, proposer_options: {min_ngram: 0}}\n")
    _, section = load_launch_config(path)
    with pytest.raises(ValueError, match=r"^spec_plugins\.proposer_options\[ngram\]\.min_ngram: "):
        section.build()
    with pytest.raises(ValueError, match=r"spec_plugins\.proposer_options\[ngram\]\.min_ngram"):
        check_config_file(path)
    with pytest.raises(ValueError, match=r"^spec_plugins\.proposer_options: Input should be a valid dictionary"):
        parse_section({"proposer_options": [1]})


def test_user_provided_needs_our_section_and_the_section_needs_user_provided(tmp_path):
    with pytest.raises(ValueError, match=r"^spec_plugins: required with speculative_config\.decoding_type: UserProvided"):
        load_launch_config(_write(tmp_path, USER))
    native = "speculative_config: {decoding_type: NGram, max_draft_len: 4}\nspec_plugins: {proposer: ngram}\n"
    with pytest.raises(ValueError, match=r"^spec_plugins: only read with .*UserProvided, not NGram"):
        load_launch_config(_write(tmp_path, native))
    with pytest.raises(ValueError, match=r"^disable_overlap_scheduler: "):
        load_launch_config(_write(tmp_path, USER + "disable_overlap_scheduler: false\nspec_plugins: {}\n"))


@pytest.mark.parametrize("kind,version", [("DFlash", "1.2"), ("DSpark", "1.2.1"), ("SA", "1.2"),
                                          ("Eagle3", "1.2"), ("PARD", "1.2")])
def test_native_type_missing_from_the_declared_version(kind, version):
    cfg = {"speculative_config": {"decoding_type": kind, "max_draft_len": 4, "speculative_model": "/m"}}
    with pytest.raises(ValueError, match=rf"^speculative_config\.decoding_type: '{kind}' does not exist in "
                                         rf"TensorRT-LLM {version} \(it needs 1\.3\+\)$"):
        check_trtllm_config(cfg, version)
    check_trtllm_config(cfg, "1.3")


def test_unknown_type_and_unknown_field(tmp_path):
    with pytest.raises(ValueError, match=r"^speculative_config\.decoding_type: 'Suffix' does not exist .*expected"):
        check_trtllm_config({"speculative_config": {"decoding_type": "Suffix", "max_draft_len": 4}})
    with pytest.raises(ValueError, match=r"^speculative_config\.max_matching_ngram_size: not a field of decoding_type MTP"):
        check_trtllm_config({"speculative_config": {"decoding_type": "MTP", "max_matching_ngram_size": 3}})
    # 1.3 renamed the acceptance gate's fields
    spec = {"decoding_type": "NGram", "max_draft_len": 4, "acceptance_window": 32}
    check_trtllm_config({"speculative_config": spec}, "1.2")
    with pytest.raises(ValueError, match=r"^speculative_config\.acceptance_window: not a field"):
        check_trtllm_config({"speculative_config": spec}, "1.3")
    # a file claiming >=1.2 must load on every later rule set too
    path = _write(tmp_path, "# engine: tensorrt-llm>=1.2\nspeculative_config: " + json.dumps(spec) + "\n")
    with pytest.raises(ValueError, match=r"acceptance_window: not a field of decoding_type NGram in TensorRT-LLM 1\.3"):
        check_config_file(path)


@pytest.mark.parametrize("kind", ["DraftTarget", "DFlash", "DSpark"])
def test_draft_model_types_need_speculative_model(kind):
    with pytest.raises(ValueError, match=rf"^speculative_config\.speculative_model: required for decoding_type {kind}"):
        check_trtllm_config({"speculative_config": {"decoding_type": kind, "max_draft_len": 4}}, "1.3")
    check_trtllm_config({"speculative_config": {"decoding_type": kind, "max_draft_len": 4,
                                                "speculative_model_dir": "/m"}}, "1.3")


def test_schedule_rule_1_2_key_one_is_max_draft_len():
    cfg = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4, "draft_len_schedule": {1: 3, 8: 2}}}
    with pytest.raises(ValueError, match=r"^speculative_config\.draft_len_schedule: must map batch size 1 to "
                                         r"max_draft_len \(4\), got 3$"):
        check_trtllm_config(cfg, "1.2")
    cfg["speculative_config"]["draft_len_schedule"] = {4: 4, 8: 2}  # fine on 1.3+, not on 1.2
    check_trtllm_config(cfg, "1.3")
    with pytest.raises(ValueError, match=r"draft_len_schedule: must map batch size 1"):
        check_trtllm_config(cfg, "1.2")
    cfg["speculative_config"]["draft_len_schedule"] = {1: 4, 8: 5}
    with pytest.raises(ValueError, match=r"^speculative_config\.draft_len_schedule\[8\]: 5 exceeds max_draft_len 4"):
        check_trtllm_config(cfg, "1.2")


def test_schedule_rule_1_3_smallest_key_is_max_draft_len():
    cfg = {"speculative_config": {"decoding_type": "DFlash", "max_draft_len": 8, "speculative_model": "/m",
                                  "draft_len_schedule": {4: 6, 16: 2}}}
    with pytest.raises(ValueError, match=r"^speculative_config\.draft_len_schedule: the smallest batch size \(4\) "
                                         r"must map to max_draft_len \(8\) in TensorRT-LLM 1\.3\+, got 6$"):
        check_trtllm_config(cfg, "1.3")
    cfg["speculative_config"]["draft_len_schedule"] = {4: 8, 16: 2}
    check_trtllm_config(cfg, "1.4.0rc1")


def test_max_concurrency_and_schedule_exclusive_on_1_3():
    spec = {"decoding_type": "NGram", "max_draft_len": 4, "draft_len_schedule": {1: 4, 8: 2}, "max_concurrency": 16}
    check_trtllm_config({"speculative_config": spec}, "1.2")  # 1.2 allows both
    with pytest.raises(ValueError, match=r"^speculative_config\.max_concurrency: cannot be set together with "
                                         r"draft_len_schedule in TensorRT-LLM 1\.3\+"):
        check_trtllm_config({"speculative_config": spec}, "1.3")


def test_versions_outside_what_we_know():
    with pytest.raises(ValueError, match=r"needs 1\.2\+"):
        check_trtllm_config({}, "1.1")
    assert versions.trtllm_rule_set("1.7.0") == "1.4"
    with pytest.raises(ValueError, match=r"^vLLM version: expected one of 0\.32, 0\.33"):
        check_vllm_speculative_config({"method": "ngram"}, "0.20")


def test_vllm_checker_errors():
    with pytest.raises(ValueError, match=r"^speculative_config\.foo: not a field of vLLM 0\.32"):
        check_vllm_speculative_config({"method": "ngram", "num_speculative_tokens": 4, "foo": 1})
    with pytest.raises(ValueError, match=r"^speculative_config\.method: 'medusa' does not exist in vLLM 0\.33 "
                                         r"\(only in 0\.32\)"):
        check_vllm_speculative_config({"method": "medusa", "model": "/m", "num_speculative_tokens": 2}, "0.33")
    with pytest.raises(ValueError, match=r"^speculative_config\.model: required for method 'dflash'"):
        check_vllm_speculative_config({"method": "dflash", "num_speculative_tokens": 15})
    with pytest.raises(ValueError, match=r"^speculative_config\.num_speculative_tokens_per_batch_size: the first "
                                         r"range must start at batch size 1"):
        check_vllm_speculative_config({"method": "ngram", "num_speculative_tokens": 4,
                                       "num_speculative_tokens_per_batch_size": [[2, 8, 4]]})
    with pytest.raises(ValueError, match=r"rejection_sample_method: 'fly' does not exist in vLLM 0\.32"):
        check_vllm_speculative_config({"method": "ngram", "num_speculative_tokens": 4,
                                       "rejection_sample_method": "fly"})


def test_vllm_wrapper_file_checks_our_additional_config(tmp_path):
    doc = {"speculative_config": {"method": "custom_class", "model": "spec_plugins.vllm.SuffixTree",
                                  "num_speculative_tokens": 8},
           "additional_config": {"spec_plugins": {"policy": "adaptive", "policy_options": {"hardwar": "h200"}}}}
    path = _write(tmp_path, json.dumps(doc), "bad.json")
    with pytest.raises(ValueError, match=r"additional_config\.spec_plugins\.policy_options\.hardwar: unknown option"):
        check_config_file(path)
    doc["engine"] = "vllm"
    with pytest.raises(ValueError, match=r"bad\.json: engine: unknown key"):
        check_config_file(_write(tmp_path, json.dumps(doc), "bad.json"))


def _cli(argv):
    parser = argparse.ArgumentParser(prog="spec-plugins")
    add_trtllm_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_check_command_prints_ok_or_the_error(tmp_path, capsys):
    good = CONFIGS / "trtllm" / "native-ngram.yaml"
    _cli(["trtllm", "check", str(good)])
    assert capsys.readouterr().out.startswith(f"OK   {good} (tensorrt-llm 1.2, 1.3, 1.4)")
    bad = _write(tmp_path, USER + "spec_plugins: {foo: 1}\n")
    with pytest.raises(ValueError, match=r"1 of 2 config\(s\) failed"):
        _cli(["trtllm", "check", str(good), str(bad)])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"FAIL {bad}: spec_plugins.foo: unknown key (expected proposer, proposer_options, policy, policy_options)"
