"""Our proposers inside a real vLLM engine through `custom_class`: lossless, measured, served.

Each engine runs in a fresh process (spec_plugins.bench.vllm_run), as in the benchmarks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from spec_plugins.bench.prompts import code_rewrites, spec_bench
from spec_plugins.bench.vllm_run import EngineRun, run
from spec_plugins.demo import custom_class_config

from .conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]

K = 4
# Token-id prompts with repeated spans, so prompt lookup finds matches even on a random model.
REPEATING_PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7],
    [20, 21, 22, 23, 20, 21, 22, 23, 20, 21],
    [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 40, 41, 42, 43],
    [100, 3, 100, 3, 100, 3, 100],
]


_baselines: dict[str, object] = {}


def _baseline(spec: EngineRun):
    """No-speculation outputs, computed once per configuration for all proposers."""
    key = json.dumps(spec.__dict__, sort_keys=True)
    if key not in _baselines:
        _baselines[key] = run(spec)
    return _baselines[key]


def _spec_run(model: str, prompts: list, proposer: str = "ngram", **kw) -> EngineRun:
    spec, extra = custom_class_config(proposer, K)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_vllm_serve_answers_like_offline_engine(tiny_llama, tmp_path, proposer):
    spec, extra = custom_class_config(proposer, K)
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    # `vllm` is the console script; the CPU setup gives it the metadata it needs.
    vllm_cli = os.path.join(os.path.dirname(sys.executable), "vllm")
    proc = subprocess.Popen(
        [vllm_cli, "serve", tiny_llama, "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
         "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(extra)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vllm serve did not become healthy in 300 s"
            time.sleep(2)
        prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
        served = _post(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": tiny_llama, "prompt": prompt, "max_tokens": 32, "temperature": 0},
        )["choices"][0]["text"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "vllm:spec_decode_num_drafts" in metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # stop the server and its engine process by PID
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    offline = run(_spec_run(tiny_llama, [prompt], proposer, max_tokens=32, max_model_len=512))
    assert served == offline.texts[0]
