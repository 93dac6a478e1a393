"""Our drafter inside a real TensorRT-LLM engine (`UserProvidedDecodingConfig`): greedy output identical
to no speculation, for both model-free proposers under the fixed and the adaptive policy.

Needs TensorRT-LLM >= 1.2 and a CUDA GPU. `SPEC_PLUGINS_TRTLLM_MODEL=PATH` picks the model (a Hugging
Face checkpoint directory); by default a tiny random Llama is built (greedy identity holds for any weights).
The engine runs its executor in a worker process unless TLLM_WORKER_USE_SINGLE_PROCESS=1, so the drafter
goes there pickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip(
    "tensorrt_llm",
    reason="TensorRT-LLM is not installed (CUDA hosts only: pip install 'spec-plugins[trtllm]' or the NGC "
           "tensorrt-llm container)",
)

from .conftest import REPEATING_PROMPTS  # noqa: E402

K = 4
MAX_TOKENS = 48
PROPOSERS = ["ngram", "suffix_tree"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("TensorRT-LLM needs a CUDA GPU")
    path = os.environ.get("SPEC_PLUGINS_TRTLLM_MODEL")
    if path:
        return path
    from spec_plugins.tiny_models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama"))


def generate(model: str, speculative_config=None) -> list[list[int]]:
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import KvCacheConfig

    llm = LLM(
        model=model,
        speculative_config=speculative_config,
        disable_overlap_scheduler=True,  # user-provided drafters need the synchronous loop
        max_batch_size=4,
        kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=0.3, enable_block_reuse=False),
    )
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)  # greedy by default
        prompts = [{"prompt_token_ids": p} for p in REPEATING_PROMPTS[:4]]
        return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def baseline(model) -> list[list[int]]:
    return generate(model)


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_output_identical_to_no_speculation(model, baseline, proposer, policy):
    from tensorrt_llm.llmapi import UserProvidedDecodingConfig

    from spec_plugins.trtllm import SpecPluginsDrafter

    options = {"hardware": "h200"} if policy == "adaptive" else {}
    drafter = SpecPluginsDrafter(max_draft_len=K, proposer=proposer, policy=policy, policy_options=options)
    if policy == "adaptive":  # the executor never shows a drafter the model: cost it from config.json
        drafter.bind_model(json.loads((Path(model) / "config.json").read_text()))
    spec = UserProvidedDecodingConfig(max_draft_len=K, drafter=drafter)
    assert all(len(t) == MAX_TOKENS for t in baseline)
    assert generate(model, spec) == baseline
