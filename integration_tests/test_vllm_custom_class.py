"""Our proposers inside a real vLLM engine through `custom_class`: lossless, measured, served.

Each engine runs in a fresh process (spec_plugins.bench.vllm_run), as in the benchmarks.
"""

from __future__ import annotations

import json

import pytest

from spec_plugins.bench.prompts import code_rewrites, spec_bench
from spec_plugins.bench.serve import VllmServer
from spec_plugins.bench.vllm_run import EngineRun, run
from spec_plugins.demo import plugin_config

from .conftest import REPEATING_PROMPTS, requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]

K = 4


_baselines: dict[str, object] = {}


def _baseline(spec: EngineRun):
    """No-speculation outputs, computed once per configuration for all proposers."""
    key = json.dumps(spec.__dict__, sort_keys=True)
    if key not in _baselines:
        _baselines[key] = run(spec)
    return _baselines[key]


def _spec_run(model: str, prompts: list, proposer: str = "ngram", **kw) -> EngineRun:
    spec, extra = plugin_config(proposer, K)
    return EngineRun(model=model, prompts=prompts, speculative_config=spec, additional_config=extra, warmup=False, **kw)


PROPOSERS = ["ngram", "suffix_tree"]


@pytest.mark.parametrize("proposer", PROPOSERS)
@pytest.mark.parametrize("batch", [1, 4])
def test_tiny_model_greedy_identical_and_drafts_accepted(tiny_llama, batch, proposer):
    prompts = REPEATING_PROMPTS[:batch]
    base = _baseline(EngineRun(model=tiny_llama, prompts=prompts, max_tokens=48, warmup=False, max_model_len=512))
    spec = run(_spec_run(tiny_llama, prompts, proposer, max_tokens=48, max_model_len=512))
    assert all(len(t) == 48 for t in base.token_ids)
    assert spec.token_ids == base.token_ids
    # vLLM's own spec-decode metrics saw our drafts, and some were accepted.
    assert spec.num_drafts > 0 and spec.num_draft_tokens >= spec.num_drafts
    assert spec.num_accepted_tokens > 0
    assert spec.num_draft_tokens <= K * spec.num_drafts  # capped at num_speculative_tokens


@pytest.mark.smollm2
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_smollm2_real_prompts_batch4_identical(smollm2, proposer):
    prompts = spec_bench()[:2] + code_rewrites()[:2]
    base = _baseline(EngineRun(model=smollm2, prompts=prompts, max_tokens=64, chat=True, warmup=False))
    spec = run(_spec_run(smollm2, prompts, proposer, max_tokens=64, chat=True))
    assert spec.token_ids == base.token_ids
    assert spec.num_accepted_tokens > 0
    assert spec.acceptance_length > 1.0


def test_unknown_proposer_fails_with_field_name(tiny_llama):
    bad = _spec_run(tiny_llama, REPEATING_PROMPTS[:1], proposer="no_such_proposer", max_tokens=4, max_model_len=512)
    with pytest.raises(RuntimeError, match=r"additional_config\.spec_plugins\.proposer|proposer: unknown name 'no_such_proposer'"):
        run(bad)


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_vllm_serve_answers_like_offline_engine(tiny_llama, tmp_path, proposer):
    spec, extra = plugin_config(proposer, K)
    args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
            "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(extra)]
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    with VllmServer(tiny_llama, args, tmp_path / "serve.log", env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}) as server:
        served = server.post("/v1/completions", {"model": tiny_llama, "prompt": prompt, "max_tokens": 32,
                                                 "temperature": 0})["choices"][0]["text"]
        counts = server.spec_decode_counts()
    # The served request was drafted for, and drafts were accepted: speculation ran, not just the server.
    assert counts["drafts"] > 0 and counts["draft_tokens"] > 0 and counts["accepted"] > 0, counts
    assert server.proc.poll() is not None  # stopped by its PID
    offline = run(_spec_run(tiny_llama, [prompt], proposer, max_tokens=32, max_model_len=512))
    assert served == offline.texts[0]
