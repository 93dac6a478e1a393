"""The reference engine against its two definitions of correct.

Greedy: token-identical to `model.generate(do_sample=False)` on tiny random float64 transformers,
whatever the proposer drafts. Sampling: the output distribution is the target's, checked with a
chi-square test on a Markov-chain target, and the same check fails once the verifier is broken.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from spec_plugins.core import Draft
from spec_plugins.proposers.ngram import NgramProposer
from spec_plugins.reference import HFTarget, StepStats, generate, verify, verify_greedy, verify_sampled

VOCAB = 256
NEW_TOKENS = 40
# Repeated patterns make the tiny models fall into loops, so the n-gram proposer gets hits.
PROMPTS = [
    [5, 6, 7, 8] * 4,
    [3, 1, 4, 1, 5, 9, 2, 6] * 3,
    list(range(10, 40)),
    [17, 99, 17, 99, 17, 200],
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128,
    )
    return LlamaForCausalLM(config).double().eval()


def _tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128,
    )
    return Qwen3ForCausalLM(config).double().eval()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_and_refs(request):
    """A tiny model in float64 (no argmax ties from rounding) and its plain greedy outputs."""
    model = {"llama": _tiny_llama, "qwen3": _tiny_qwen3}[request.param]()
    refs = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
            eos_token_id=None, pad_token_id=0,
        )
        refs.append(out[0, len(prompt):].tolist())
    return model, refs


class OracleProposer:
    """Drafts from a known greedy continuation: right, always wrong, or wrong from a varying offset."""

    def __init__(self, prompt, greedy, mode):
        self.full = list(prompt) + list(greedy)
        self.mode = mode
        self.calls = 0

    def propose(self, requests):
        req = requests[0]
        n = len(req.tokens)
        assert list(req.tokens) == self.full[:n], "engine context diverged from greedy decoding"
        draft = self.full[n : n + req.max_draft]
        if self.mode == "wrong":
            draft = [(t + 1) % VOCAB for t in draft]
        elif self.mode == "partial" and draft:
            bad = self.calls % (len(draft) + 1)  # == len(draft): all right this time
            draft = draft[:bad] + [(t + 1) % VOCAB for t in draft[bad:]]
        self.calls += 1
        return [Draft(draft)]

    def finish(self, req_id):
        pass


def _run_checked(model, proposer, prompt, n, **kw):
    """generate() with the KV-cache invariant asserted after every step."""
    target = HFTarget(model)

    def check(tokens, stats):
        assert target.num_cached == len(tokens) - 1

    result = generate(target, proposer, prompt, n, on_step=check, **kw)
    assert target.num_cached == len(prompt) + len(result.tokens) - 1
    return result


def test_greedy_ngram_matches_hf(model_and_refs):
    model, refs = model_and_refs
    total_accepted = 0
    for prompt, ref in zip(PROMPTS, refs):
        result = _run_checked(model, NgramProposer(), prompt, NEW_TOKENS)
        assert result.tokens == ref
        assert result.steps[0] == StepStats(0, 0)
        assert sum(s.accepted + 1 for s in result.steps) == NEW_TOKENS
        total_accepted += sum(s.accepted for s in result.steps)
    assert total_accepted > 0


def test_greedy_wrong_drafts_still_match(model_and_refs):
    model, refs = model_and_refs
    for prompt, ref in zip(PROMPTS, refs):
        result = _run_checked(model, OracleProposer(prompt, ref, "wrong"), prompt, NEW_TOKENS, max_draft=4)
        assert result.tokens == ref
        assert all(s.accepted == 0 for s in result.steps)
        assert sum(s.drafted for s in result.steps) > 0
        assert result.acceptance_length == 1.0


def test_greedy_right_and_partial_drafts(model_and_refs):
    model, refs = model_and_refs
    for prompt, ref in zip(PROMPTS, refs):
        right = _run_checked(model, OracleProposer(prompt, ref, "right"), prompt, NEW_TOKENS, max_draft=8)
        assert right.tokens == ref
        assert all(s.accepted == s.drafted for s in right.steps)
        assert right.acceptance_length > 1
        assert len(right.steps) == 1 + -(-(NEW_TOKENS - 1) // 9)  # prefill, then 9 tokens a step

        # Rejections at every offset of the draft exercise partial cache rollback.
        partial = _run_checked(model, OracleProposer(prompt, ref, "partial"), prompt, NEW_TOKENS, max_draft=5)
        assert partial.tokens == ref
        assert {s.accepted for s in partial.steps[1:]} >= {0, 1, 2}


def test_eos_stops_inside_an_accepted_draft(model_and_refs):
    model, refs = model_and_refs
    prompt, ref = PROMPTS[1], refs[1]
    eos = ref[12]
    expected = ref[: ref.index(eos) + 1]
    for proposer in (OracleProposer(prompt, ref, "right"), NgramProposer()):
        result = _run_checked(model, proposer, prompt, NEW_TOKENS, eos_token_id=eos)
        assert result.tokens == expected


def test_sampling_is_reproducible(model_and_refs):
    model, _ = model_and_refs
    runs = [
        _run_checked(model, NgramProposer(), PROMPTS[0], 20, temperature=0.8, seed=seed).tokens for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1]
    assert len(runs[0]) == 20
    assert runs[0] != runs[2]


# --- policy hook and errors --------------------------------------------------------------------


class ScriptedPolicy:
    """Caps cycle through a script; records what the engine reports back."""

    def __init__(self, script):
        self.script = script
        self.calls = 0
        self.hard_caps = []
        self.observed = []
        self.finished = []

    def caps(self, requests):
        self.hard_caps.append(requests[0].max_draft)
        cap = self.script[self.calls % len(self.script)]
        self.calls += 1
        return [cap]

    def observe(self, req_id, drafted, accepted):
        self.observed.append((req_id, drafted, accepted))

    def finish(self, req_id):
        self.finished.append(req_id)


class RecordingProposer(OracleProposer):
    def __init__(self, prompt, greedy):
        super().__init__(prompt, greedy, "partial")
        self.requests = []
        self.finished = []

    def propose(self, requests):
        req = requests[0]
        self.requests.append((len(req.tokens), req.num_new, req.max_draft))
        return super().propose(requests)

    def finish(self, req_id):
        self.finished.append(req_id)


def test_policy_cap_zero_drafts_nothing():
    model = _tiny_llama()
    prompt = PROMPTS[0]
    baseline = _run_checked(model, NgramProposer(), prompt, 24).tokens
    policy = ScriptedPolicy([0])
    result = _run_checked(model, NgramProposer(), prompt, 24, policy=policy)
    assert result.tokens == baseline
    assert all(s.drafted == 0 for s in result.steps)
    assert len(result.steps) == 24


def test_policy_caps_respected_and_observed():
    model = _tiny_llama()
    prompt = PROMPTS[1]
    ref = _run_checked(model, NgramProposer(), prompt, 30).tokens
    policy = ScriptedPolicy([3, 0, 1, 6, 2])
    proposer = RecordingProposer(prompt, ref)
    result = _run_checked(model, proposer, prompt, 30, max_draft=4, policy=policy, req_id="r7")
    assert result.tokens == ref

    for i, ((ctx_len, num_new, cap), hard) in enumerate(zip(proposer.requests, policy.hard_caps)):
        produced = ctx_len - len(prompt)
        assert hard == min(4, 30 - produced - 1)  # engine K and the remaining token budget
        assert cap == min(hard, policy.script[i % len(policy.script)])
        assert num_new == (ctx_len if i == 0 else ctx_len - proposer.requests[i - 1][0])
    drafted = [s.drafted for s in result.steps[1:]]
    assert drafted == [cap for _, _, cap in proposer.requests]  # the oracle always fills its cap
    # Every verified draft is reported once (a step that drafted nothing has nothing to report).
    assert policy.observed == [("r7", s.drafted, s.accepted) for s in result.steps[1:] if s.drafted]
    assert policy.finished == ["r7"] and proposer.finished == ["r7"]


def test_overlong_draft_is_rejected():
    class Greedy:
        def propose(self, requests):
            return [Draft([1] * (r.max_draft + 1)) for r in requests]

        def finish(self, req_id):
            pass

    with pytest.raises(ValueError, match="cap is"):
        generate(MarkovTarget(np.full((4, 4), 0.25)), Greedy(), [0, 1], 10, max_draft=3)


# --- verifier units ----------------------------------------------------------------------------


def test_verify_greedy_units():
    logits = torch.eye(5)[[2, 3, 4, 0]]  # argmax 2, 3, 4, 0
    assert verify_greedy(logits, [2, 3, 4]) == ([2, 3, 4, 0], 3)
    assert verify_greedy(logits, [2, 1, 4]) == ([2, 3], 1)
    assert verify_greedy(logits[:1], []) == ([2], 0)


def test_verify_sampled_units():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, dtype=torch.float64)
    q = torch.softmax(logits[:3], -1).numpy()  # q == p: every draft is accepted
    for _ in range(20):
        emitted, n = verify_sampled(logits, [0, 1, 2], q, 1.0, g)
        assert n == 3 and emitted[:3] == [0, 1, 2] and len(emitted) == 4
    certain = torch.tensor([[0.0, 60.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert verify_sampled(certain, [0], None, 1.0, g) == ([1], 0)  # p(x) ~ 0: rejected, residual picks 1
    assert verify_sampled(certain, [1], None, 1.0, g)[1] == 1


# --- statistical exactness on a Markov target --------------------------------------------------


class MarkovTarget:
    """A bigram model: the next-token distribution depends only on the current token.

    Implements the engine's target interface with a position counter for the 'cache', so the
    engine's bookkeeping is still checked while each step costs microseconds.
    """

    def __init__(self, transition):
        self.logits = torch.log(torch.as_tensor(transition, dtype=torch.float64))
        self.num_cached = 0

    def prefill(self, ids):
        self.num_cached = 0
        return self.extend(ids)

    def extend(self, ids):
        self.num_cached += len(ids)
        return self.logits[list(ids)]

    def crop(self, n):
        assert 0 <= n <= self.num_cached
        self.num_cached = n


class MarkovDrafter:
    """Drafts from a different chain Q: samples it and reports Q's rows as probs, or (one_hot)
    follows Q's most likely token, as a greedy draft model or a lookup table would."""

    def __init__(self, q, seed, one_hot=False):
        self.q = np.asarray(q)
        self.cum = np.cumsum(self.q, axis=1)
        self.rng = np.random.default_rng(seed)
        self.one_hot = one_hot

    def propose(self, requests):
        req = requests[0]
        prev, draft, rows = req.tokens[-1], [], []
        for u in self.rng.random(req.max_draft):
            rows.append(self.q[prev])
            if self.one_hot:
                prev = int(np.argmax(self.q[prev]))
            else:
                prev = min(int(np.searchsorted(self.cum[prev], u)), len(self.q) - 1)
            draft.append(prev)
        probs = None if self.one_hot or not draft else np.stack(rows)
        return [Draft(draft, probs=probs)]

    def finish(self, req_id):
        pass


V = 6
TRANSITION = np.random.default_rng(1).dirichlet(np.ones(V), size=V)
DRAFT_CHAIN = 0.5 * TRANSITION + 0.5 * np.random.default_rng(2).dirichlet(np.ones(V), size=V)


def _min_row_pvalue(one_hot, n_tokens, seed=0, temperature=1.0):
    """Smallest chi-square p-value over the rows of the observed transition counts."""
    prompt = [0]
    result = generate(
        MarkovTarget(TRANSITION), MarkovDrafter(DRAFT_CHAIN, seed + 100, one_hot), prompt, n_tokens,
        max_draft=4, temperature=temperature, seed=seed,
    )
    seq = np.array(prompt + result.tokens)
    assert len(result.tokens) == n_tokens
    counts = np.zeros((V, V))
    np.add.at(counts, (seq[:-1], seq[1:]), 1)
    expected = TRANSITION ** (1 / temperature)  # softmax(log T / temperature)
    expected /= expected.sum(axis=1, keepdims=True)
    pvalues = [chisquare(counts[i], counts[i].sum() * expected[i]).pvalue for i in range(V)]
    return min(pvalues), result


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
def test_sampled_output_follows_target(one_hot):
    pvalue, result = _min_row_pvalue(one_hot, 100_000)
    assert pvalue > 1e-3
    accepted = sum(s.accepted for s in result.steps)
    assert 0.2 < accepted / sum(s.drafted for s in result.steps) < 0.95  # the drafts really were mixed


def test_sampled_output_follows_tempered_target():
    pvalue, _ = _min_row_pvalue(one_hot=False, n_tokens=40_000, temperature=0.6)
    assert pvalue > 1e-3


def _accept_always(target_logits, draft_tokens, draft_probs, temperature, generator):
    bonus = verify.sample_token(target_logits[len(draft_tokens)], temperature, generator)
    return list(draft_tokens) + [bonus], len(draft_tokens)


def _accept_with_p(target_logits, draft_tokens, draft_probs, temperature, generator):
    """The classic mistake: acceptance probability p(x) instead of p(x)/q(x)."""
    p = verify.target_probs(target_logits, temperature)
    q = None if draft_probs is None else torch.as_tensor(draft_probs)
    for i, x in enumerate(draft_tokens):
        if torch.rand((), dtype=torch.float64, generator=generator) >= p[i, x]:
            residual = (p[i] - q[i]).clamp_min(0)
            return list(draft_tokens[:i]) + [int(torch.multinomial(residual, 1, generator=generator))], i
    return list(draft_tokens) + [int(torch.multinomial(p[-1], 1, generator=generator))], len(draft_tokens)


def _residual_without_q(target_logits, draft_tokens, draft_probs, temperature, generator):
    """Another classic mistake: resample from p after a rejection instead of from max(0, p - q)."""
    emitted, n = verify_sampled(target_logits, draft_tokens, draft_probs, temperature, generator)
    if n < len(draft_tokens):
        p = verify.target_probs(target_logits[n], temperature)
        emitted[-1] = int(torch.multinomial(p, 1, generator=generator))
    return emitted, n


@pytest.mark.parametrize(
    "broken",
    [_accept_always, _accept_with_p, _residual_without_q],
    ids=["accept-always", "accept-with-p", "residual-p"],
)
def test_chi_square_catches_a_broken_verifier(monkeypatch, broken):
    monkeypatch.setattr(verify, "verify_sampled", broken)
    pvalue, _ = _min_row_pvalue(one_hot=False, n_tokens=30_000)
    assert pvalue < 1e-6


class ConfidentMarkovDrafter(MarkovDrafter):
    """MarkovDrafter with a confidence per position that depends on the token sampled before it (the
    draft chain's largest probability after it), as DSpark's confidence head does. Like DSpark's, it
    must not look at the position's own token: keeping a token because of its own value biases."""

    def propose(self, requests):
        (draft,) = super().propose(requests)
        prev = requests[0].tokens[-1]
        conf = []
        for t in draft.tokens:
            conf.append(float(self.q[prev].max()))
            prev = t
        return [Draft(draft.tokens, probs=draft.probs, confidence=conf)]


class _RowCost:
    """Each verified token costs a third of a step's fixed part: mid-length drafts win."""

    overhead_s = 3.0

    def linear_time(self, rows):
        return float(rows)

    def attention_time(self, draft_len, context_len):
        return 0.0

    def draft_time(self, draft_lens):
        return 0.0

    def step_time(self, draft_lens, context_lens):
        return self.overhead_s + self.linear_time(sum(1 + d for d in draft_lens))


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
def test_sampled_output_exact_under_the_adaptive_policy(one_hot):
    # Sampled drafts (probs set) are trimmed with the non-anticipating greedy search; deterministic
    # (one-hot) drafts with the global one. Both must leave the output distribution untouched.
    from spec_plugins.policy.adaptive import AdaptiveLength

    policy = AdaptiveLength(cost=_RowCost())
    prompt = [0]
    result = generate(MarkovTarget(TRANSITION), ConfidentMarkovDrafter(DRAFT_CHAIN, 7, one_hot), prompt, 60_000,
                      max_draft=6, temperature=1.0, seed=3, policy=policy)
    seq = np.array(prompt + result.tokens)
    counts = np.zeros((V, V))
    np.add.at(counts, (seq[:-1], seq[1:]), 1)
    pvalues = [chisquare(counts[i], counts[i].sum() * TRANSITION[i]).pvalue for i in range(V)]
    assert min(pvalues) > 1e-3
    lengths = {s.drafted for s in result.steps}
    assert len(lengths) >= 3  # the policy really varied the draft length


def test_greedy_identical_with_the_adaptive_policy_bound_to_the_target(model_and_refs):
    # `adaptive` names only a GPU; the reference engine binds the target's own config.
    from spec_plugins.policy.adaptive import AdaptiveLength

    model, refs = model_and_refs
    policy = AdaptiveLength(hardware="h200")
    for prompt, ref in zip(PROMPTS, refs):
        res = generate(HFTarget(model), NgramProposer(min_ngram=1, max_ngram=3), prompt, len(ref), max_draft=6,
                       policy=policy)
        assert res.tokens == ref
    assert policy.cost is not None and policy.cost.model.layers == model.config.num_hidden_layers
