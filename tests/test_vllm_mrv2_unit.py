"""vLLM 0.34 (Model Runner V2) logic with plain objects, no vLLM 0.34 needed: our settings in `speculator_options`,
the config forms each vLLM version takes, the front-end check's one-line errors, and the speculator's host step
(the runner's rows as the drafting layer's columns, the fixed-width drafts).
The same pieces against vLLM 0.34.0's own code: integration_tests/test_vllm_contract.py (`-k mrv2`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from spec_plugins.core import BatchDrafts
from spec_plugins.vllm import _rows, plugin
from spec_plugins.vllm.settings import (
    MRV2_CONFIGS, MRV2_METHODS, engine_config, on_model_runner_v2, settings_from_speculator_options,
)


def test_methods_are_ours_and_cannot_collide_with_vllms():
    assert set(MRV2_METHODS) == {"suffix_tree", "ngram"}
    assert all(m.startswith("spec_plugins_") for m in MRV2_METHODS.values())
    assert set(MRV2_CONFIGS) == set(MRV2_METHODS.values())
    assert all(v.startswith("spec_plugins.vllm.mrv2.config.") for v in MRV2_CONFIGS.values())


def test_speculator_options_are_our_settings():
    s = settings_from_speculator_options({"policy": "adaptive", "proposer_options": {"max_depth": 32}}, "suffix_tree")
    assert (s.proposer, s.policy, s.proposer_options) == ("suffix_tree", "adaptive", {"max_depth": 32})
    assert settings_from_speculator_options(None, "ngram").proposer == "ngram"
    proposer, policy = settings_from_speculator_options({"proposer_options": {"max_ngram": 4}}, "ngram").build("x")
    assert proposer.max_ngram == 4 and type(policy).__name__ == "FixedLength"


@pytest.mark.parametrize("options, message", [
    ({"polcy": "adaptive"}, "speculative_config.speculator_options.polcy: unknown key (expected proposer, "
                            "proposer_options, policy, policy_options, host_drafting)"),
    ({"host_drafting": "async"}, "speculative_config.speculator_options.host_drafting: Input should be 'sync' or "
                                 "'stream' (got 'async')"),
    ({"num_speculative_tokens_per_batch_size": [[1, 256, 4]]},
     "speculative_config.speculator_options.num_speculative_tokens_per_batch_size: vLLM 0.34 applies"),
    ({"proposer": "ngram"}, "speculative_config.speculator_options.proposer: method 'spec_plugins_suffix_tree' serves "
                            "'suffix_tree', got 'ngram' (use method 'spec_plugins_ngram')"),
    ([1, 2], "speculative_config.speculator_options: expected a JSON object"),
])
def test_bad_speculator_options_are_one_line(options, message):
    with pytest.raises(ValueError) as err:
        settings_from_speculator_options(options, "suffix_tree")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_proposer_option_names_the_field():
    with pytest.raises(ValueError, match=r"^speculative_config\.speculator_options\.proposer_options"):
        settings_from_speculator_options({"proposer_options": {"max_depth": -1}}, "suffix_tree").build(
            "speculative_config.speculator_options")


def test_each_vllm_version_gets_its_form():
    assert on_model_runner_v2("0.34.0") and on_model_runner_v2("0.35.1") and not on_model_runner_v2("0.33.0")
    assert not on_model_runner_v2("0.32.0+cpu") and not on_model_runner_v2(None)
    assert engine_config("suffix_tree", 8, {"policy": "adaptive"}, "0.34.0") == (
        {"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8, "speculator_options": {"policy": "adaptive"}},
        None)
    assert engine_config("ngram", 4, {}, "0.34.0") == ({"method": "spec_plugins_ngram", "num_speculative_tokens": 4},
                                                       None)
    assert engine_config("ngram", 4, {"policy": "adaptive"}, "0.33.0") == (
        {"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer", "num_speculative_tokens": 4},
        {"spec_plugins": {"proposer": "ngram", "policy": "adaptive"}})


def test_planner_writes_the_form_of_the_version_it_targets():
    from spec_plugins.policy import planner

    plan = SimpleNamespace(chosen=[8, 4], schedule_ranges=lambda: [[1, 4, 8], [5, 256, 4]])
    new = planner.vllm_speculative_config(plan, "suffix_tree")
    assert new == {"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8,
                   "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 256, 4]],
                   "enable_adaptive_verification": True}
    assert planner.vllm_speculative_config(plan, "suffix")["enable_adaptive_verification"] is True
    assert "enable_adaptive_verification" not in planner.vllm_speculative_config(plan, "ngram")
    old = planner.vllm_speculative_config(plan, "suffix_tree", "0.33")
    assert old["method"] == "custom_class" and old["model"] == "spec_plugins.vllm.SuffixTree"
    assert "enable_adaptive_verification" not in old
    assert planner.vllm_speculative_config(plan, "ngram")["method"] == "ngram"  # vLLM's own: every version


def _engine_args(spec, additional=None):
    return SimpleNamespace(speculative_config=spec, additional_config=additional)


@pytest.mark.parametrize("spec, additional, message", [
    ({"method": "custom_class", "model": "spec_plugins.vllm.Ngram", "num_speculative_tokens": 4}, None,
     "has no 'custom_class'; use {\"method\": \"spec_plugins_ngram\""),
    ({"method": "spec_plugins_suffix_tree", "num_speculative_tokens": 4}, {"spec_plugins": {"policy": "adaptive"}},
     "additional_config.spec_plugins: on vLLM"),
    ({"method": "spec_plugins_suffix_tree", "speculator_options": {"policy": "adaptive", "policy_options": {
        "hardware": "z80"}}}, None, "speculative_config.speculator_options.policy_options"),
])
def test_front_end_check_on_0_34_is_one_line(monkeypatch, spec, additional, message):
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.34.0")
    with pytest.raises(ValueError) as err:
        plugin.check_mrv2_args(_engine_args(spec, additional))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_front_end_check_on_0_34_passes_good_and_foreign_configs(monkeypatch):
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.34.0")
    plugin.check_mrv2_args(_engine_args({"method": "spec_plugins_suffix_tree", "speculator_options": {
        "policy": "adaptive"}}))
    plugin.check_mrv2_args(_engine_args({"method": "suffix", "num_speculative_tokens": 8}))
    plugin.check_mrv2_args(_engine_args(None))


def test_gated_dspark_checkpoint_is_refused_on_0_34(monkeypatch, tmp_path):
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.34.0")
    (tmp_path / "config.json").write_text('{"markov_head_type": "rnn"}')
    with pytest.raises(ValueError, match="has a 'rnn' DSpark Markov head; vLLM 0.34.0's dspark runs the vanilla"):
        plugin.check_mrv2_args(_engine_args({"method": "dspark", "model": str(tmp_path)}))
    (tmp_path / "config.json").write_text('{"markov_head_type": "vanilla"}')
    plugin.check_mrv2_args(_engine_args({"method": "dspark", "model": str(tmp_path)}))


def test_one_line_speculative_error_unwraps_only_vllms_single_value_error():
    import pydantic

    class SpeculativeConfig(pydantic.BaseModel):
        x: int

        @pydantic.field_validator("x")
        @classmethod
        def check(cls, v):
            raise ValueError("the draft model is a 'dspark' checkpoint")

    with pytest.raises(pydantic.ValidationError) as err:
        SpeculativeConfig(x=1)
    out = plugin.one_line_speculative_error(err.value)
    assert isinstance(out, ValueError) and str(out) == "speculative_config: the draft model is a 'dspark' checkpoint"
    other = RuntimeError("x")
    assert plugin.one_line_speculative_error(other) is other


def test_write_padded_puts_each_draft_over_its_row_and_keeps_the_filler():
    drafts = BatchDrafts(np.array([7, 8, 9, 4]), np.array([0, 3, 3, 4]), confidence=np.array([0.9, 0.5, 0.2, 0.7]))
    out = np.full((5, 4), -5, dtype=np.int64)
    out[[1, 3, 4]] = np.array([[11], [33], [44]])
    conf = np.zeros((5, 4), dtype=np.float32)
    _rows.write_padded(out, np.array([1, 3, 4]), drafts.tokens, drafts.offsets, drafts.confidence, conf)
    assert out[1].tolist() == [7, 8, 9, 11] and out[3].tolist() == [33] * 4 and out[4].tolist() == [4, 44, 44, 44]
    assert out[0].tolist() == [-5] * 4  # rows not named are untouched
    assert conf[1].tolist() == pytest.approx([0.9, 0.5, 0.2, 0.0]) and conf[4, 0] == pytest.approx(0.7)
    plain = BatchDrafts(np.array([1, 2], dtype=np.int32), np.array([0, 2]))
    out, conf = np.zeros((2, 4), dtype=np.int64), np.zeros((2, 4), dtype=np.float32)
    _rows.write_padded(out, None, plain.tokens, plain.offsets, None, conf)  # rows None: draft i on row i
    assert out[0].tolist() == [1, 2, 0, 0] and conf[0].tolist() == [1.0, 1.0, 0.0, 0.0]  # no confidences: kept
    with pytest.raises(ValueError, match="drafts: a draft longer than the buffer is wide"):
        _rows.write_padded(np.zeros((1, 1), dtype=np.int64), None, plain.tokens, plain.offsets, None, None)
    with pytest.raises(ValueError, match="drafts buffer: expected a writable C-contiguous"):
        _rows.write_padded(np.zeros((2, 4), dtype=np.int32), None, plain.tokens, plain.offsets, None, None)


def test_runner_v2_rows_grow_the_lengths_write_the_filler_and_give_the_layer_its_columns():
    """Model Runner V2's step on the host: slots 0-3 of a runner with max_model_len 8 (history 10 wide), K = 3."""
    history = np.arange(40, dtype=np.int32).reshape(4, 10)
    total = np.array([3, 5, 9, 2], dtype=np.int64)
    warmup = np.array([False, False, False, True])
    out, conf = np.full((5, 3), -1, dtype=np.int64), np.full((5, 3), 0.5, dtype=np.float32)
    # batch row 0: a prefill chunk in progress (nothing sampled); 1, 2: decoding; 3: vLLM's warm-up request
    slots, sampled, rejected = np.array([2, 0, 1, 3]), np.array([0, 2, 1, 1], np.int32), np.array([0, 1, 2, 0], np.int32)
    rows, history_rows, lens, new, accepted, caps, verified, present = _rows.runner_v2_rows(
        slots, sampled, rejected, total, history, warmup, out, conf, 8, 3)
    assert total.tolist() == [5, 6, 9, 3]  # + sampled, at each request's slot
    assert out[:4, 0].tolist() == [28, 4, 15, 32] and (out[:4] == out[:4, :1]).all()  # the last token, all across
    assert out[4].tolist() == [-1] * 3 and (conf[:4] == 0).all() and (conf[4] == 0.5).all()  # only rows 0..n
    assert rows.tolist() == [1, 2] and present.tolist() == [0] and history_rows.tolist() == [0, 1]
    assert lens.tolist() == [5, 6] and new.tolist() == [2, 1] and accepted.tolist() == [1, 0]
    assert caps.tolist() == [2, 1] and verified.tolist() == [2, 2]  # caps: room before max_model_len - 1
    rows, history_rows, *_, verified, present = _rows.runner_v2_rows(
        np.array([0, 1]), np.array([1, 1]), None, total, history, warmup, out, None, 8, 3)
    assert rows is None and present is None and verified is None and history_rows.tolist() == [0, 1]
    before = total.copy()
    with pytest.raises(ValueError, match="slots: request slot out of range"):  # row 1 bad: row 0 not applied either
        _rows.runner_v2_rows(np.array([0, 4]), np.array([1, 1]), None, total, history, warmup, out, None, 8, 3)
    assert total.tolist() == before.tolist()
