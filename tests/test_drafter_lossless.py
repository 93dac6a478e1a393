"""DFlash and DSpark as proposers in the reference engine: lossless, whatever their weights.

The target is a tiny random Qwen3 (float64, 4 layers); the drafts read its layers 0 and 2 through the
engine's `target_taps` feature path. Greedy output must equal HF's greedy decoding token for token;
sampled output must follow the target's distribution (chi-square on randomized PIT values, since the target
is not a Markov chain); the draft cache must end one short of the committed length after every step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from spec_plugins.proposers.dflash import DFlashConfig, DFlashDraftModel, DFlashProposer
from spec_plugins.proposers.dspark import ConfidenceHead, DSparkProposer, MarkovHead
from spec_plugins.reference import HFTarget, generate, verify
from drafter_weights import randomize_

HIDDEN, TAPS, RANK = 64, [0, 2], 8
NEW_TOKENS = 40
PROMPTS = [[5, 6, 7, 8] * 4, [3, 1, 4, 1, 5, 9, 2, 6] * 3, list(range(10, 40))]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny_qwen3(vocab, *, seed=1, head_std=None):
    """As tests/test_reference.py's, with 4 layers so taps [0, 2] avoid HF's post-norm last entry.
    head_std: re-draw the LM head with this std, so a tiny vocabulary gets peaked, context-dependent rows."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128,
    )
    model = Qwen3ForCausalLM(config).double().eval()
    if head_std is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.normal_(0.0, 0.15)
            model.lm_head.weight.normal_(0.0, head_std)
    return model


def _backbone(vocab, block_size, seed):
    cfg = DFlashConfig.from_dict({
        "model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": block_size, "num_target_layers": 4,
        "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": TAPS},
    })
    torch.manual_seed(seed)
    model = randomize_(DFlashDraftModel(cfg).double().eval())
    return model


def _dflash(vocab, temperature=0.0, seed=0):
    return DFlashProposer(_backbone(vocab, 8, seed), temperature=temperature, seed=seed + 10)


def _dspark(vocab, temperature=0.0, seed=0, markov_scale=1.0):
    torch.manual_seed(seed + 1)
    markov = MarkovHead(vocab, RANK, HIDDEN, "vanilla").double()
    with torch.no_grad():
        markov.markov_w2.weight.mul_(markov_scale)
    conf = ConfidenceHead(HIDDEN, RANK).double()
    return DSparkProposer(_backbone(vocab, 7, seed), markov, conf, temperature=temperature, seed=seed + 10)


MAKERS = {"dflash": _dflash, "dspark": _dspark}


def _hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _run_checked(model, proposer, prompt, n, **kw):
    """generate() with the target and draft cache invariants asserted at every step."""
    target = HFTarget(model)
    proposer.load(model)
    drafter = proposer.drafter
    proposed_at = []  # context length of every propose call
    propose = proposer.propose

    def checked_propose(requests):
        drafts = propose(requests)
        # Having consumed the new features, the draft cache covers exactly the positions the target ran:
        # every committed token but the newest (which enters the block as its bonus / anchor).
        assert drafter.length == len(requests[0].tokens) - 1 == target.num_cached
        proposed_at.append(len(requests[0].tokens))
        if drafts[0].confidence is not None:
            assert all(0.0 <= c <= 1.0 for c in drafts[0].confidence)
        return drafts

    def on_step(tokens, stats):
        assert target.num_cached == len(tokens) - 1
        # This step's commits reach the draft cache with the next request's features, not before, and the
        # rejected rows never do.
        assert drafter.length == (proposed_at[-1] - 1 if proposed_at else 0)

    proposer.propose = checked_propose
    try:
        result = generate(target, proposer, prompt, n, on_step=on_step, **kw)
    finally:
        del proposer.propose
    assert drafter.length == 0  # finish() dropped the request's cache
    return result, proposed_at


# --- (a) greedy identity and (c) cache bookkeeping --------------------------------------------


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_greedy_random_drafts_match_hf(kind):
    model = _tiny_qwen3(256)
    for i, prompt in enumerate(PROMPTS):
        ref = _hf_greedy(model, prompt, NEW_TOKENS)
        result, calls = _run_checked(model, MAKERS[kind](256, seed=i), prompt, NEW_TOKENS, max_draft=8)
        assert result.tokens == ref
        assert len(calls) == len(result.steps) - 1
        assert sum(s.drafted for s in result.steps) > 0


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_greedy_agreeing_drafts_accept_whole_blocks(kind):
    # A zero LM head makes every target row all-zero logits, argmax 0; the drafts share that head (and
    # DSpark's Markov bias is zeroed), so they draft 0 everywhere too: every draft is accepted.
    model = _tiny_qwen3(256)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    kw = {"markov_scale": 0.0} if kind == "dspark" else {}
    block = 7  # DFlash: block 8 -> 7 drafts; DSpark: gamma 7 -> 7 drafts
    for prompt in PROMPTS:
        ref = _hf_greedy(model, prompt, NEW_TOKENS)
        assert ref == [0] * NEW_TOKENS
        result, _ = _run_checked(model, MAKERS[kind](256, **kw), prompt, NEW_TOKENS, max_draft=16)
        assert result.tokens == ref
        assert all(s.accepted == s.drafted for s in result.steps)
        assert max(s.drafted for s in result.steps) == block  # the block bound, under max_draft=16
        assert len(result.steps) == 1 + -(-(NEW_TOKENS - 1) // (block + 1))


def test_greedy_partial_acceptance_rolls_back_the_draft_cache():
    # A target head that is zero but for token 1: the argmax is 0 wherever token 1's logit is negative
    # (about half the positions), so the draft's constant zeros are accepted in part, rejected in part.
    model = _tiny_qwen3(256)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[1].normal_(0.0, 0.2)
    for kind in ("dflash", "dspark"):
        kw = {"markov_scale": 0.0} if kind == "dspark" else {}
        for prompt in PROMPTS:
            ref = _hf_greedy(model, prompt, NEW_TOKENS)
            proposer = MAKERS[kind](256, **kw)
            with torch.no_grad():  # the draft's own head: zero, so it always drafts token 0
                proposer.model.norm.weight.zero_()
            result, _ = _run_checked(model, proposer, prompt, NEW_TOKENS, max_draft=6)
            assert result.tokens == ref
        accepted = {s.accepted for s in result.steps[1:]}
        assert len(accepted) >= 2, accepted


# --- (b), (d) sampled exactness on a tiny vocabulary --------------------------------------------

V = 8
EPISODES, EPISODE_TOKENS = 40, 250  # 10^4 sampled tokens per test


def _pit_pvalue(model, prompts, outputs, temperature, seed=0):
    """Chi-square p-value of randomized PIT values u_t = F_t(x_t - 1) + U * p_t(x_t), with p_t the
    target's own next-token distribution (one plain forward over each finished sequence). Under the null
    the u_t are i.i.d. uniform, whatever the context dependence of p_t."""
    rng = np.random.default_rng(seed)
    us = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
            p = verify.target_probs(logits, temperature).numpy()
            x = np.array(out)
            px = p[np.arange(len(x)), x]
            below = np.cumsum(p, axis=1)[np.arange(len(x)), x] - px
            us.append(below + rng.random(len(x)) * px)
    counts, _ = np.histogram(np.concatenate(us), bins=20, range=(0.0, 1.0))
    return chisquare(counts).pvalue


def _sample_episodes(kind, temperature=1.0, policy_factory=None, max_draft=6):
    model = _tiny_qwen3(V, head_std=0.3)
    rng = np.random.default_rng(5)
    prompts, outputs, steps = [], [], []
    for ep in range(EPISODES):
        prompt = rng.integers(0, V, size=4).tolist()
        proposer = MAKERS[kind](V, temperature=temperature, seed=ep)
        kw = {} if policy_factory is None else {"policy": policy_factory()}
        result = generate(HFTarget(model), _loaded(proposer, model), prompt, EPISODE_TOKENS, max_draft=max_draft,
                          temperature=1.0, seed=1000 + ep, **kw)
        assert len(result.tokens) == EPISODE_TOKENS
        prompts.append(prompt)
        outputs.append(result.tokens)
        steps.extend(result.steps[1:])
    return model, prompts, outputs, steps


def _loaded(proposer, model):
    proposer.load(model)
    return proposer


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_sampled_output_follows_target(kind):
    model, prompts, outputs, steps = _sample_episodes(kind)
    assert _pit_pvalue(model, prompts, outputs, 1.0) > 1e-3
    # Per judged position (the accepted ones plus the first rejection): the drafts were really mixed.
    judged = sum(min(s.accepted + 1, s.drafted) for s in steps)
    rate = sum(s.accepted for s in steps) / judged
    assert 0.1 < rate < 0.95, rate




def test_dspark_sampled_exact_under_the_adaptive_policy():
    # Sampled DSpark drafts carry probs and confidences, so AdaptiveLength trims them with its
    # non-anticipating search; the output distribution must not move.
    from spec_plugins.policy.adaptive import AdaptiveLength

    from test_reference import _RowCost  # each verified token costs a third of a step's fixed part

    model, prompts, outputs, steps = _sample_episodes("dspark", policy_factory=lambda: AdaptiveLength(cost=_RowCost()))
    assert _pit_pvalue(model, prompts, outputs, 1.0) > 1e-3
    assert len({s.drafted for s in steps}) >= 3  # the policy really varied the draft length


def test_pit_catches_a_broken_verifier(monkeypatch):
    # Power check of the statistic: accepting every draft makes the output follow the draft, not the target.
    def accept_always(target_logits, draft_tokens, draft_probs, temperature, generator):
        bonus = verify.sample_token(target_logits[len(draft_tokens)], temperature, generator)
        return list(draft_tokens) + [bonus], len(draft_tokens)

    monkeypatch.setattr(verify, "verify_sampled", accept_always)
    model, prompts, outputs, _ = _sample_episodes("dflash")
    assert _pit_pvalue(model, prompts, outputs, 1.0) < 1e-6


def test_dspark_confidence_reads_only_earlier_tokens():
    # Same context, different sampled walks: confidence k agrees wherever drafts 1..k-1 agree, whatever
    # draft k itself is (a confidence that read its own token would let a trimming policy bias the output).
    from spec_plugins.core import DraftRequest

    model = _tiny_qwen3(V, head_std=0.3)
    prompt = [1, 2, 3, 4, 5]
    _, features = HFTarget(model).prefill(prompt[:-1], taps=TAPS)
    drafts = []
    for seed in range(40):
        proposer = _loaded(_dspark(V, temperature=1.0, seed=0), model)
        proposer.generator.manual_seed(seed)
        drafts.append(proposer.propose([DraftRequest("r", prompt, len(prompt), 7, features=features)])[0])
    compared = 0
    for a in drafts:
        for b in drafts:
            for k in range(7):
                if a.tokens[:k] != b.tokens[:k]:
                    break
                assert a.confidence[k] == pytest.approx(b.confidence[k], abs=1e-12)
                compared += a.tokens[k] != b.tokens[k]
    assert compared > 0  # some pairs differed at the very position compared
