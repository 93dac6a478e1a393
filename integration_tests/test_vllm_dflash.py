"""DFlash and DSpark checkpoints in real vLLM-CPU, method `dflash`, V1 runner (spec_plugins/vllm/drafters.py).

The target is a tiny random Llama (and, for a few cases, Qwen3; 4 layers; the drafts tap layers 0 and 2). Drafters are built here with
random weights and written by our exporter: 2 draft layers whose K-norm weights differ on purpose (vLLM-CPU's
grouped K-norm would give every layer layer 0's), DSpark with each Markov head type and a confidence head.

Each engine runs in its own child process (`python -m integration_tests.test_vllm_dflash IN OUT`, engine
in-process): five prompts of mixed lengths sharing four batch slots, then each prompt alone. Greedy output
must equal the no-speculation run's; the drafts of every step must equal the reference engine's for the same
contexts and weights (they do only with DSpark's layout, walk and heads, and the per-layer K-norm); a drafter
built to agree with the target is fully accepted and a deliberately wrong one never is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

from .conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[1]
K = 6  # block_size 7 - 1: vLLM's block [anchor, mask * 6] is the block the DSpark drafter was built for
BLOCK = 7
TAPS = [0, 2]
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9], [20, 21, 22, 23, 20, 21], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 40],
           [100, 3, 100, 3, 100], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 60, 61]]
MAX_TOKENS = [24, 10, 20, 16, 12]


# ---------------------------------------------------------------- checkpoints


def _target(folder: Path, constant: bool = False, arch: str = "llama") -> str:
    from spec_plugins.tiny_models import build_tiny_model

    path = build_tiny_model(folder / "target", arch=arch, num_layers=4)
    if not constant:
        return str(path)
    # A target that always says token 0: with its final norm zeroed every logit is 0 (argmax: the first id).
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    out = folder / "constant-target"
    model.save_pretrained(out)
    for f in path.iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            (out / f.name).write_bytes(f.read_bytes())
    return str(out)


def _drafter(folder: Path, target: str, kind: str, head: str = "vanilla", *, seed: int = 0,
             agree: bool | None = None, confidence_bias: float | None = None) -> str:
    """A random 2-layer drafter in the speculators format. agree=True: drafts the constant target's token 0
    (final norm and Markov bias zero); agree=False: drafts token 1 (a Markov bias that always wins)."""
    import torch
    from transformers import AutoConfig

    from spec_plugins.proposers.dflash import DFlashDraftModel
    from spec_plugins.proposers.dflash.export import save_speculators
    from spec_plugins.proposers.dspark import ConfidenceHead, MarkovHead
    from spec_plugins.training import draft_config

    tc = AutoConfig.from_pretrained(target)
    torch.manual_seed(seed)
    block = BLOCK if kind == "dspark" else BLOCK + 1
    model = DFlashDraftModel(draft_config(tc, layers=2, block_size=block, mask_token_id=tc.vocab_size - 1, taps=TAPS))
    extra = {}
    with torch.no_grad():
        for layer in model.layers:  # per-layer K-norms that differ: a shared one changes the drafts
            layer.attention.k_norm.weight.copy_(0.5 + 1.5 * torch.rand_like(layer.attention.k_norm.weight))
        if agree is not None:
            model.norm.weight.zero_()
        if kind == "dspark":
            markov = MarkovHead(tc.vocab_size, 8, tc.hidden_size, head)
            markov.markov_w2.weight.mul_(20)  # a bias strong enough to change what the walk drafts
            if agree is True:
                markov.markov_w2.weight.zero_()
            elif agree is False:
                markov.markov_w1.weight.fill_(1.0)
                markov.markov_w2.weight.zero_()
                markov.markov_w2.weight[1] = 10.0
            confidence = ConfidenceHead(tc.hidden_size, 8)
            if confidence_bias is not None:  # confidences pinned near sigmoid(bias)
                confidence.proj.weight.zero_()
                confidence.proj.bias.fill_(confidence_bias)
            extra = dict(markov=markov, confidence=confidence, kind="dspark")
    name = f"{kind}-{head}" + ("" if agree is None else f"-agree{int(agree)}") + \
        ("" if confidence_bias is None else f"-conf{confidence_bias:g}")
    return str(save_speculators(folder / name, model, target_config=tc, **extra))


def _zlab(speculators_dir: str, dst: Path) -> str:
    """The same DFlash drafter in z-lab's layout: a Qwen3 config with `dflash_config`, the same tensors."""
    raw = json.loads((Path(speculators_dir) / "config.json").read_text())
    config = {**raw["transformer_layer_config"], "architectures": ["DFlashDraftModel"], "block_size": raw["block_size"],
              "num_target_layers": 4, "dflash_config": {"mask_token_id": raw["mask_token_id"],
                                                        "target_layer_ids": [i - 1 for i in raw["aux_hidden_state_layer_ids"]]}}
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(config))
    (dst / "model.safetensors").write_bytes((Path(speculators_dir) / "model.safetensors").read_bytes())
    return str(dst)


# ---------------------------------------------------------------- the child: one engine


def _child(inp: str, out: str) -> None:
    cfg = json.loads(Path(inp).read_text())
    recorded: list[list[list[int]]] = []
    with_probs: list[bool] = []
    if cfg.get("record"):  # each step's drafts, [B][K]
        from spec_plugins.vllm import drafters

        k = cfg["spec"]["num_speculative_tokens"]
        original = drafters.DSparkDraft.sample_block
        compute_logits = drafters.DFlashDraft.compute_logits

        def sample_block(self, *args, **kwargs):
            tokens, probs = original(self, *args, **kwargs)
            recorded.append(tokens.view(-1, k).tolist())
            with_probs.append(probs is not None)
            return tokens, probs

        def dflash_logits(self, hidden_states):  # vLLM's DFlash drafts the argmax of these rows
            logits = compute_logits(self, hidden_states)
            recorded.append(logits.argmax(-1).view(-1, k).tolist())
            return logits

        drafters.DSparkDraft.sample_block = sample_block
        drafters.DFlashDraft.compute_logits = dflash_logits
    from vllm import LLM, SamplingParams

    llm = LLM(model=cfg["model"], dtype="float32", max_model_len=512, enforce_eager=True, seed=0, max_num_seqs=4,
              disable_log_stats=False, speculative_config=cfg["spec"], additional_config=cfg.get("extra") or {})
    temperature = cfg.get("temperature", 0.0)
    params = [SamplingParams(max_tokens=m, temperature=temperature, ignore_eos=True, seed=i)
              for i, m in enumerate(MAX_TOKENS)]
    batch = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    alone, alone_drafts = [], []
    for p, sp in zip(PROMPTS, params):
        recorded.clear()
        o = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)
        alone.append(list(o[0].outputs[0].token_ids))
        alone_drafts.append([step[0] for step in recorded])
    metrics = {m.name.removeprefix("vllm:spec_decode_"): getattr(m, "value", None) for m in llm.get_metrics()
               if m.name.startswith("vllm:spec_decode_") and getattr(m, "value", None) is not None}
    Path(out).write_text(json.dumps({"batch": [list(o.outputs[0].token_ids) for o in batch],
                                     "texts": [o.outputs[0].text for o in batch], "alone": alone,
                                     "alone_drafts": alone_drafts, "with_probs": with_probs, "metrics": metrics}))


def _run(tmp: Path, model: str, spec: dict | None = None, extra: dict | None = None, *, record: bool = False,
         temperature: float = 0.0, expect_failure: bool = False) -> dict | str:
    inp, out = tmp / "in.json", tmp / "out.json"
    inp.write_text(json.dumps({"model": model, "spec": spec, "extra": extra, "record": record,
                               "temperature": temperature}))
    env = {**os.environ, **CPU_ENV_DEFAULTS}
    env.pop("SPEC_PLUGINS_VLLM_PLUGIN", None)
    proc = subprocess.run([sys.executable, "-m", "integration_tests.test_vllm_dflash", str(inp), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if expect_failure:
        assert proc.returncode != 0, "the engine started; expected a start-up error"
        return proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    return json.loads(out.read_text())


def _spec(ckpt: str, **extra) -> dict:
    return {"method": "dflash", "model": ckpt, "num_speculative_tokens": K, **extra}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("dflash-models")
    target = _target(folder)
    out = {"target": target, "dflash": _drafter(folder, target, "dflash")}
    out["dflash-zlab"] = _zlab(out["dflash"], folder / "dflash-zlab")
    for head in ("vanilla", "gated", "rnn"):
        out[f"dspark-{head}"] = _drafter(folder, target, "dspark", head)
    return out


@pytest.fixture(scope="module")
def baseline(models, tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("baseline"), models["target"])


@pytest.fixture(scope="module")
def qwen3_models(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("qwen3-models")
    target = _target(folder, arch="qwen3")
    models = {"target": target, "dflash": _drafter(folder, target, "dflash"),
              "dspark-rnn": _drafter(folder, target, "dspark", "rnn", seed=1)}
    models["baseline"] = _run(folder, target)
    return models


# ---------------------------------------------------------------- greedy: lossless, and the wiring is live


CASES = {
    "dflash": ("dflash", None),
    "dflash-zlab": ("dflash-zlab", None),
    "dspark-vanilla": ("dspark-vanilla", None),
    "dspark-gated": ("dspark-gated", None),
    "dspark-rnn": ("dspark-rnn", None),
    "dspark-gated+adaptive": ("dspark-gated", {"policy": "adaptive", "policy_options": {"hardware": "h200"}}),
    "dspark-gated+fixed3": ("dspark-gated", {"policy": "fixed", "policy_options": {"max_draft": 3}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_output_identical_to_no_speculation(case, models, baseline, tmp_path):
    ckpt, policy = CASES[case]
    res = _run(tmp_path, models["target"], _spec(models[ckpt]), {"spec_plugins": policy} if policy else None)
    assert res["batch"] == baseline["batch"]  # five prompts of mixed lengths, four batch slots
    assert res["alone"] == baseline["alone"]  # each prompt alone
    m = res["metrics"]
    assert m["num_drafts"] > 0 and m["num_draft_tokens"] > 0
    if case.endswith("fixed3"):  # the policy's cap reached vLLM: no draft above 3 tokens
        assert m["num_draft_tokens"] <= 3 * m["num_drafts"]
    else:
        assert m["num_draft_tokens"] <= K * m["num_drafts"]


@pytest.mark.parametrize("ckpt", ["dflash", "dspark-rnn"])
def test_qwen3_target_greedy_output_identical(ckpt, qwen3_models, tmp_path):
    res = _run(tmp_path, qwen3_models["target"], _spec(qwen3_models[ckpt]))
    base = qwen3_models["baseline"]
    assert res["batch"] == base["batch"] and res["alone"] == base["alone"]
    assert res["metrics"]["num_drafts"] > 0


@pytest.mark.parametrize("ckpt", ["dspark-gated", "dflash", "dflash-zlab"])
def test_drafts_equal_the_reference_engine_every_step(ckpt, models, tmp_path):
    """vLLM's drafts of each step (prompt alone) == the reference engine's for the same context and weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from spec_plugins.proposers.dflash import DFlashProposer, load_dflash
    from spec_plugins.proposers.dspark import DSparkProposer
    from spec_plugins.proposers.dspark.loader import load_dspark
    from spec_plugins.reference import HFTarget, generate

    k = K if ckpt.startswith("dspark") else K + 1  # the drafter's block_size - 1 either way
    res = _run(tmp_path, models["target"], {**_spec(models[ckpt]), "num_speculative_tokens": k}, record=True)
    hf = AutoModelForCausalLM.from_pretrained(models["target"], dtype=torch.float32).eval()
    compared = 0
    for i, prompt in enumerate(PROMPTS):
        if ckpt.startswith("dspark"):
            model, markov, confidence = load_dspark(models[ckpt], num_target_layers=hf.config.num_hidden_layers)
            proposer = DSparkProposer(model.float(), markov, confidence)
        else:
            proposer = DFlashProposer(load_dflash(models[ckpt], num_target_layers=hf.config.num_hidden_layers).float())
        proposer.load(hf)
        seen: list[list[int]] = []
        propose = proposer.propose

        def recording(requests, propose=propose, seen=seen):
            drafts = propose(requests)
            seen.extend(d.tokens for d in drafts)
            return drafts

        proposer.propose = recording
        out = generate(HFTarget(hf), proposer, prompt, MAX_TOKENS[i], max_draft=k)
        assert out.tokens == res["alone"][i]
        ours = res["alone_drafts"][i]
        assert len(ours) >= len(seen) > 0
        for step, (want, got) in enumerate(zip(seen, ours)):
            assert got[: len(want)] == want, (i, step)  # the reference caps its last drafts at what is left
            compared += len(want)
    assert compared > 50


def test_agreeing_drafter_is_fully_accepted_and_a_wrong_one_never(tmp_path_factory):
    folder = tmp_path_factory.mktemp("constant")
    target = _target(folder, constant=True)
    (folder / "base").mkdir()
    base = _run(folder / "base", target)
    for agree in (True, False):
        ckpt = _drafter(folder, target, "dspark", "gated", agree=agree)
        (folder / f"run{int(agree)}").mkdir()
        res = _run(folder / f"run{int(agree)}", target, _spec(ckpt))
        assert res["batch"] == base["batch"] and res["alone"] == base["alone"]
        m = res["metrics"]
        assert m["num_draft_tokens"] > 0
        if agree:  # every draft token the scheduler verified was accepted
            assert m["num_accepted_tokens"] >= 0.9 * m["num_draft_tokens"], m
        else:
            assert m["num_accepted_tokens"] == 0, m


def test_adaptive_policy_cuts_drafts_by_dspark_confidences(tmp_path_factory):
    """Confident and right: full drafts; sure to be wrong (and right about it): each step's draft cut from K
    to at most one token (vLLM counts only drafts of at least one token)."""
    folder = tmp_path_factory.mktemp("confidence")
    target = _target(folder, constant=True)
    policy = {"spec_plugins": {"policy": "adaptive", "policy_options": {"hardware": "h200"}}}
    tokens, per_draft = {}, {}
    for agree, bias in ((True, 20.0), (False, -20.0)):
        ckpt = _drafter(folder, target, "dspark", "vanilla", agree=agree, confidence_bias=bias)
        (folder / f"run{int(agree)}").mkdir()
        m = _run(folder / f"run{int(agree)}", target, _spec(ckpt), policy)["metrics"]
        tokens[agree] = m.get("num_draft_tokens", 0)
        per_draft[agree] = tokens[agree] / max(1, m.get("num_drafts", 0))  # vLLM counts drafts of >= 1 token
    assert per_draft[True] > 5.0, per_draft  # ~K tokens per draft
    assert per_draft[False] <= 1.0, (tokens, per_draft)  # cut from 6 to at most 1


def test_sampled_drafts_hand_their_proposal_to_the_rejection_sampler(models, tmp_path):
    res = _run(tmp_path, models["target"], _spec(models["dspark-rnn"], draft_sample_method="probabilistic"),
               record=True, temperature=0.8)
    assert [len(t) for t in res["batch"]] == MAX_TOKENS
    assert res["with_probs"] and all(res["with_probs"])  # the walk's exact proposal, every step
    assert res["metrics"]["num_drafts"] > 0


def test_vllm_serve_answers_as_the_offline_engine(models, baseline, tmp_path):
    from spec_plugins.bench.serve import VllmServer

    args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0", "--max-num-seqs", "4",
            "--speculative-config", json.dumps(_spec(models["dspark-gated"]))]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    with VllmServer(models["target"], args, tmp_path / "serve.log", env=env) as server:
        texts = [server.post("/v1/completions", {"model": models["target"], "prompt": p, "max_tokens": m,
                                                 "temperature": 0, "ignore_eos": True})["choices"][0]["text"]
                 for p, m in zip(PROMPTS[:2], MAX_TOKENS[:2])]
    assert texts == baseline["texts"][:2]


# ---------------------------------------------------------------- bad input: one line at start-up


def _edited(src: str, dst: Path, config=None, drop_prefix: str | None = None) -> str:
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    raw = json.loads((Path(src) / "config.json").read_text())
    if config:
        config(raw)
    (dst / "config.json").write_text(json.dumps(raw))
    tensors = load_file(str(Path(src) / "model.safetensors"))
    if drop_prefix:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(drop_prefix)}
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


BAD = {
    "no_markov_head": (dict(drop_prefix="markov_head."), K, "has no markov_head tensors"),
    "taps_out_of_range": (dict(config=lambda c: c.update(aux_hidden_state_layer_ids=[1, 9])), K,
                          "reaches outside the target's 4 decoder layers"),
    "hidden_size": (dict(config=lambda c: c.update(target_hidden_size=96)), K, "'target_hidden_size' is 96"),
    "too_many_tokens": ({}, BLOCK, "num_speculative_tokens: 7 is more than"),
    "draft_vocabulary": (dict(config=lambda c: c.update(draft_vocab_size=256)), K, "draft_vocab_size 256 is smaller"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_is_one_line_at_start_up(case, models, tmp_path):
    edit, k, message = BAD[case]
    ckpt = _edited(models["dspark-gated"], tmp_path / "ckpt", **edit)
    out = _run(tmp_path, models["target"], {"method": "dflash", "model": ckpt, "num_speculative_tokens": k},
               expect_failure=True)
    assert message in out, out[-3000:]


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
