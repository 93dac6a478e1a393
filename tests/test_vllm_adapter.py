"""The vLLM custom_class adapter with plain objects (the real engine runs in integration_tests/)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from spec_plugins.core import Draft
from spec_plugins.vllm import Ngram, SpecPluginsProposer


def vllm_config(k=4, additional_config=None, max_model_len=64):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        additional_config=additional_config,
    )


def batch(rows: list[list[int]], max_model_len=64):
    token_ids = np.zeros((len(rows) + 1, max_model_len), dtype=np.int32)  # vLLM passes max_num_reqs rows
    num = np.zeros(len(rows) + 1, dtype=np.int32)
    for i, r in enumerate(rows):
        token_ids[i, : len(r)] = r
        num[i] = len(r)
    return num, token_ids


def test_drafts_per_row_capped_at_k_and_empty_for_prefill_rows():
    prop = Ngram(vllm_config(k=3))
    rows = [[1, 2, 3, 4, 5, 6, 1, 2], [9, 8, 7], [1, 2, 3, 4, 5, 6, 1, 2]]
    num, ids = batch(rows)
    out = prop.propose([[2], [7], []], num, ids)
    assert out == [[3, 4, 5], [], []]
    assert all(isinstance(t, int) for t in out[0])


def test_context_room_limits_drafts():
    prop = Ngram(vllm_config(k=8, max_model_len=12))
    num, ids = batch([[1, 2, 3, 4, 5, 6, 1, 2, 3]], max_model_len=12)
    assert prop.propose([[3]], num, ids) == [[4, 5]]  # 9 + 2 + 1 bonus token = 12


def test_generic_class_uses_additional_config_and_policy():
    cfg = vllm_config(k=6, additional_config={"spec_plugins": {
        "proposer": "ngram", "proposer_options": {"min_ngram": 1, "max_ngram": 2},
        "policy": "fixed", "policy_options": {"max_draft": 2}}})
    prop = SpecPluginsProposer(cfg)
    num, ids = batch([[5, 6, 7, 8, 5]])
    assert prop.propose([[5]], num, ids) == [[6, 7]]


def test_policy_observes_accepted_counts():
    seen = []

    class Recorder:
        def caps(self, requests):
            return [r.max_draft for r in requests]

        def observe(self, req_id, drafted, accepted):
            seen.append((req_id, drafted, accepted))

        def finish(self, req_id):
            pass

    prop = Ngram(vllm_config(k=3))
    prop.policy = Recorder()
    prop.row_req_ids = ["req-a"]
    num, ids = batch([[1, 2, 3, 4, 5, 6, 1, 2]])
    assert prop.propose([[2]], num, ids) == [[3, 4, 5]]
    num, ids = batch([[1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 9]])  # 2 drafts accepted + 1 bonus
    prop.propose([[3, 4, 9]], num, ids)
    assert seen == [("req-a", 3, 2)]


def test_a_proposer_exceeding_its_cap_is_an_error():
    prop = Ngram(vllm_config(k=2))

    class TooLong:
        def propose(self, requests):
            return [Draft([1, 2, 3]) for _ in requests]

    prop.proposer = TooLong()
    num, ids = batch([[1, 2]])
    with pytest.raises(ValueError, match=r"proposer 'ngram': draft for request 'row-0' has 3 tokens, cap is 2"):
        prop.propose([[2]], num, ids)


@pytest.mark.parametrize(
    "k, extra, message",
    [
        (0, None, r"^speculative_config\.num_speculative_tokens: expected an integer >= 1, got 0$"),
        (-1, None, r"^speculative_config\.num_speculative_tokens: expected an integer >= 1, got -1$"),
        (4, {"spec_plugins": {"proposer": "nope"}}, r"^additional_config\.spec_plugins\.proposer: unknown name 'nope'; expected one of: "),
        (4, "{not json", r"^additional_config: expected a JSON object, got invalid JSON"),
        (4, {"spec_plugins": [1, 2]}, r"^additional_config\.spec_plugins: expected a JSON object, got \[1, 2\]$"),
        (4, {"spec_plugins": {"propser": "ngram"}}, r"^additional_config\.spec_plugins\.propser: unknown key"),
        (4, {"spec_plugins": {"proposer_options": {"max_ngram": "x"}}},
         r"^additional_config\.spec_plugins\.proposer_options\[ngram\]\.max_ngram: Input should be a valid integer"),
    ],
)
def test_bad_input_is_one_line_value_error_naming_the_field(k, extra, message):
    with pytest.raises(ValueError, match=message) as info:
        SpecPluginsProposer(vllm_config(k=k, additional_config=extra))
    assert "\n" not in str(info.value)


def test_fixed_class_refuses_another_proposer():
    with pytest.raises(ValueError, match=r"additional_config\.spec_plugins\.proposer: this class serves 'ngram'"):
        Ngram(vllm_config(additional_config={"spec_plugins": {"proposer": "other"}}))


def test_import_pulls_in_neither_numba_nor_vllm():
    code = ("import sys, spec_plugins.vllm; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('numba', 'llvmlite', 'vllm', 'torch')]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
