"""Run one vLLM engine configuration in a fresh process and report outputs, speed and acceptance.

Each configuration gets its own process: vLLM engines do not share a process cleanly (memory,
and an engine started after numba was imported fails on the CPU platform), and a fresh process
makes the timings comparable. The child runs `python -m spec_plugins.bench.vllm_run IN.json OUT.json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

CPU_ENV_DEFAULTS = {
    # Engine core and worker in this process: start-up drops from ~40 s to ~5 s on small CPU hosts.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


@dataclass
class EngineRun:
    """What to run: a model, prompts (text, or token-id lists) and an optional speculative config."""

    model: str
    prompts: list[Any]
    max_tokens: int = 128
    speculative_config: dict | None = None
    additional_config: dict | None = None
    dtype: str = "float32"
    max_model_len: int = 2048
    temperature: float = 0.0
    seed: int = 0
    chat: bool = False  # wrap text prompts in the model's chat template
    warmup: bool = True
    engine_kwargs: dict = field(default_factory=dict)


@dataclass
class RunResult:
    token_ids: list[list[int]]
    texts: list[str]
    seconds: float
    output_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted drafts per drafting step (1.0 without drafts)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


def run(spec: EngineRun, timeout: float = 1800, env: dict | None = None) -> RunResult:
    """Run `spec` in a child process; raise RuntimeError with the child's last lines if it fails."""
    child_env = {**CPU_ENV_DEFAULTS, **os.environ, **(env or {})}
    with tempfile.TemporaryDirectory(prefix="spec-plugins-run-") as tmp:
        inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(inp, "w") as f:
            json.dump(asdict(spec), f)
        proc = subprocess.run(
            [sys.executable, "-m", "spec_plugins.bench.vllm_run", inp, out],
            env=child_env, capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0 or not os.path.exists(out):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
            raise RuntimeError(f"vLLM run failed (rc={proc.returncode}):\n{tail}")
        with open(out) as f:
            data = json.load(f)
    return RunResult(**data)


def _spec_metrics(llm: Any) -> dict[str, int]:
    totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    for metric in llm.get_metrics():
        for key in totals:
            if metric.name == f"vllm:spec_decode_{key}":
                totals[key] += int(getattr(metric, "value", 0))
    return totals


def _child(inp: str, out: str) -> None:
    with open(inp) as f:
        spec = EngineRun(**json.load(f))
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec.model,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        enforce_eager=True,
        seed=spec.seed,
        disable_log_stats=False,
        speculative_config=spec.speculative_config,
        additional_config=spec.additional_config or {},
        **spec.engine_kwargs,
    )
    prompts = []
    for p in spec.prompts:
        if isinstance(p, list):
            prompts.append({"prompt_token_ids": p})
        elif spec.chat:
            text = llm.get_tokenizer().apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            prompts.append(text)
        else:
            prompts.append(p)
    params = SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature, seed=spec.seed,
                            ignore_eos=False)
    if spec.warmup:
        llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
    before = _spec_metrics(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = _spec_metrics(llm)
    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    result = RunResult(
        token_ids=token_ids,
        texts=[o.outputs[0].text for o in outputs],
        seconds=seconds,
        output_tokens=sum(len(t) for t in token_ids),
        **{k: after[k] - before[k] for k in after},
    )
    with open(out, "w") as f:
        json.dump(asdict(result), f)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
