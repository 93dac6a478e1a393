"""DSpark heads on our DFlash backbone: fp32 parity with speculators' DSpark heads, STS calibration.

speculators (0.9.0) is the oracle for the Markov and confidence heads. Its package __init__ pulls training
dependencies (datasets, openai, hs_connectors) that the heads do not need, so only
`speculators/models/dspark/model_definitions.py` (torch only) is loaded, by file path.
speculators' DSpark forward is training-only (teacher forcing: slot k's predecessor is the token at the
slot's own position, i.e. [anchor, x_1 .. x_{g-1}]); an exact sequential walk must reproduce it when fed
the tokens it walked. Tiny random models only: no checkpoints, no engines.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
_spec = importlib.util.find_spec("speculators")
if _spec is None or _spec.origin is None:
    pytest.skip("speculators' DSpark is the oracle: pip install --no-deps speculators==0.9.0", allow_module_level=True)
_defs = pathlib.Path(_spec.origin).parent / "models" / "dspark" / "model_definitions.py"
if not _defs.exists():
    pytest.skip(f"speculators without a DSpark head ({_defs} missing)", allow_module_level=True)
_mod_spec = importlib.util.spec_from_file_location("_speculators_dspark_heads", _defs)
ref = importlib.util.module_from_spec(_mod_spec)
_mod_spec.loader.exec_module(ref)
transformers = pytest.importorskip("transformers")
_layer_spec = importlib.util.spec_from_file_location(
    "_speculators_dflash_layers", pathlib.Path(_spec.origin).parent / "models" / "dflash" / "model_definitions.py")
ref_layers = importlib.util.module_from_spec(_layer_spec)
_layer_spec.loader.exec_module(ref_layers)

from spec_plugins.proposers.dflash import DFlashConfig, DFlashDrafter, DFlashDraftModel  # noqa: E402
from spec_plugins.proposers.dspark import (  # noqa: E402
    ConfidenceHead,
    DSparkDrafter,
    MarkovHead,
    SequentialTemperatureScaling,
    expected_calibration_error,
    markov_walk,
    prefix_survival,
    teacher_forced,
)
from drafter_weights import randomize_  # noqa: E402

TOL = 1e-4
HIDDEN, VOCAB, GAMMA, MASK, RANK, TAPS = 64, 128, 7, 127, 8, 2


def backbone(seed: int = 0) -> tuple[DFlashDraftModel, torch.Tensor, torch.Tensor]:
    cfg = DFlashConfig.from_dict({
        "model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": GAMMA, "num_target_layers": 4,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]},
    })
    torch.manual_seed(seed)
    model = randomize_(DFlashDraftModel(cfg).float().eval())
    embed = torch.randn(VOCAB, HIDDEN)
    lm_head = 0.5 * torch.randn(VOCAB, HIDDEN)
    return model, embed, lm_head


def reference_heads(head_type: str, seed: int = 3):
    torch.manual_seed(seed)
    markov = ref.MarkovHead(verifier_vocab_size=VOCAB, draft_vocab_size=VOCAB, markov_rank=RANK,
                            hidden_size=HIDDEN, head_type=head_type)
    conf = ref.ConfidenceHead(HIDDEN + RANK)
    with torch.no_grad():  # O(1) biases, so the Markov head actually changes the argmax
        for p in [*markov.parameters(), *conf.parameters()]:
            p.normal_(0.0, 0.5)
    return markov.eval(), conf.eval()


def our_heads(ref_markov, ref_conf, head_type: str):
    markov = MarkovHead(VOCAB, RANK, HIDDEN, head_type)
    conf = ConfidenceHead(HIDDEN, RANK)
    # strict: same tensor names and shapes as speculators (markov_w1/w2, gate_proj, joint_proj, proj).
    markov.load_state_dict(ref_markov.state_dict(), strict=True)
    conf.load_state_dict(ref_conf.state_dict(), strict=True)
    return markov, conf


def inputs(batch: int = 3, ctx: int = 6, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, ctx, TAPS * HIDDEN, generator=g), torch.randint(0, VOCAB - 1, (batch,), generator=g)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@torch.no_grad()
def test_walk_parity_with_speculators(head_type, temperature, record_property):
    model, embed, lm_head = backbone()
    ref_markov, ref_conf = reference_heads(head_type)
    markov, conf = our_heads(ref_markov, ref_conf, head_type)
    taps, anchor = inputs()
    drafter = DSparkDrafter(model, embed, lm_head, markov, conf)
    out = drafter.propose_block(taps, anchor, temperature, torch.Generator().manual_seed(7))
    assert out.tokens.shape == (3, GAMMA) and drafter.length == taps.shape[1]

    # speculators, teacher-forced on the walked tokens: slot k's predecessor is [anchor, x_1..x_{g-1}][k].
    hidden, base = DSparkDrafter(model, embed, lm_head, None).backbone(taps, anchor)
    prev = torch.cat([anchor[:, None], out.tokens[:, :-1]], dim=1)
    ref_logits = base + ref_markov.block_bias(prev_token_ids=prev, hidden_states=hidden)
    ref_conf_logits = ref_conf(torch.cat([hidden, ref_markov.prev_embeddings(prev)], dim=-1))

    logit_diff = (out.logits - ref_logits).abs().max().item()
    conf_diff = (out.confidence_logits - ref_conf_logits).abs().max().item()
    surv_diff = (prefix_survival(out.confidence_logits.sigmoid()) - ref_conf_logits.sigmoid().cumprod(-1)).abs().max().item()
    record_property("max_abs_diff", {"logits": logit_diff, "confidence_logits": conf_diff, "survival": surv_diff})
    print(f"{head_type} T={temperature}: logits {logit_diff:.2e} confidence {conf_diff:.2e} survival {surv_diff:.2e}")
    assert logit_diff <= TOL and conf_diff <= TOL and surv_diff <= TOL

    # The walked tokens: greedy = argmax of the reference logits; sampled = the same draws from them.
    if temperature == 0:
        expected = ref_logits.argmax(-1)
        assert torch.equal(out.probs, torch.nn.functional.one_hot(expected, VOCAB).float())
    else:
        gen = torch.Generator().manual_seed(7)
        probs = torch.softmax(ref_logits / temperature, dim=-1)
        expected = torch.stack([torch.multinomial(probs[:, k], 1, generator=gen).squeeze(-1) for k in range(GAMMA)], 1)
        assert (out.probs - probs).abs().max().item() <= TOL
    assert torch.equal(out.tokens, expected)
    # The Markov head matters here (otherwise the test would not exercise the walk).
    assert not torch.equal(out.logits.argmax(-1), base.argmax(-1))


@torch.no_grad()
def test_layout_anchor_predicts_next():
    """Same backbone, same block [anchor, mask...]: DSpark keeps row 0 as a draft, DFlash drops it."""
    model, embed, lm_head = backbone()
    taps, anchor = inputs()
    dflash_tokens, _ = DFlashDrafter(model, embed, lm_head).propose_block(taps, anchor, temperature=0)
    out = DSparkDrafter(model, embed, lm_head, None, None).propose_block(taps, anchor)
    assert out.tokens.shape == (3, GAMMA) and dflash_tokens.shape == (3, GAMMA - 1)
    assert torch.equal(out.tokens[:, 1:], dflash_tokens) and out.confidence_logits is None


# Our module names -> speculators' Qwen3DFlashDecoderLayer names.
_LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj", "attention.q_norm": "self_attn.q_norm", "attention.k_norm": "self_attn.k_norm",
    "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
}


@torch.no_grad()
def speculators_rows(model: DFlashDraftModel, embed, taps, anchor):
    """speculators' DSpark backbone math for one anchor block (its training layout, which inference shares):
    context = hidden_norm(fc(taps)) at positions 0..c-1, block [anchor, mask...] at c..c+g-1, every block
    query sees all context before the anchor and the whole block (non-causal). Returns normed rows."""
    cfg = transformers.Qwen3Config(hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0)
    cfg._attn_implementation = "eager"
    ours = model.state_dict()
    hidden_norm = transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm(HIDDEN, eps=1e-6)
    hidden_norm.weight.copy_(ours["hidden_norm.weight"])
    norm = transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm(HIDDEN, eps=1e-6)
    norm.weight.copy_(ours["norm.weight"])
    context = hidden_norm(taps @ ours["fc.weight"].T)
    block = torch.full((anchor.shape[0], GAMMA), MASK)
    block[:, 0] = anchor
    x = torch.nn.functional.embedding(block, embed)
    positions = torch.arange(taps.shape[1] + GAMMA)[None]
    rope = transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding(cfg)(x, positions)
    for i in range(cfg.num_hidden_layers):
        layer = ref_layers.Qwen3DFlashDecoderLayer(cfg, i).eval()
        prefix = f"layers.{i}."
        mapped = {}
        for name, value in ours.items():
            if name.startswith(prefix):
                module, leaf = name[len(prefix):].rsplit(".", 1)
                mapped[f"{_LAYER_NAMES[module]}.{leaf}"] = value
        layer.load_state_dict(mapped, strict=True)
        x = layer(target_hidden=context, hidden_states=x, attention_mask=None, position_embeddings=rope)
    return norm(x)


@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
@torch.no_grad()
def test_end_to_end_parity_with_speculators_layers(head_type, record_property):
    """Backbone rows computed with speculators' own decoder layers, then its heads teacher-forced on our walk."""
    model, embed, lm_head = backbone(seed=5)
    ref_markov, ref_conf = reference_heads(head_type)
    taps, anchor = inputs()
    out = DSparkDrafter(model, embed, lm_head, *our_heads(ref_markov, ref_conf, head_type)).propose_block(taps, anchor)
    hidden = speculators_rows(model, embed, taps, anchor)
    prev = torch.cat([anchor[:, None], out.tokens[:, :-1]], dim=1)
    ref_logits = hidden @ lm_head.T + ref_markov.block_bias(prev_token_ids=prev, hidden_states=hidden)
    ref_conf_logits = ref_conf(torch.cat([hidden, ref_markov.prev_embeddings(prev)], dim=-1))
    logit_diff = (out.logits - ref_logits).abs().max().item()
    conf_diff = (out.confidence_logits - ref_conf_logits).abs().max().item()
    print(f"end-to-end {head_type}: logits {logit_diff:.2e} confidence {conf_diff:.2e}")
    record_property("max_abs_diff", {"logits": logit_diff, "confidence_logits": conf_diff})
    assert logit_diff <= TOL and conf_diff <= TOL
    assert torch.equal(out.tokens, ref_logits.argmax(-1))


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@torch.no_grad()
def test_non_anticipation(head_type):
    """Confidence (and logits) at position k never depend on the token drafted at k or later."""
    model, embed, lm_head = backbone()
    markov, conf = our_heads(*reference_heads(head_type), head_type)
    taps, anchor = inputs()
    hidden, base = DSparkDrafter(model, embed, lm_head, None).backbone(taps, anchor)
    walked = markov_walk(hidden, base, anchor, markov, conf, temperature=1.0, generator=torch.Generator().manual_seed(1))
    prev = torch.cat([anchor[:, None], walked.tokens[:, :-1]], dim=1)
    logits, conf_logits = teacher_forced(hidden, base, prev, markov, conf)
    assert (conf_logits - walked.confidence_logits).abs().max() <= TOL
    for k in range(GAMMA - 1):
        changed = prev.clone()
        changed[:, k + 1] = (changed[:, k + 1] + 1 + torch.arange(3)) % VOCAB  # a different x_k
        logits2, conf2 = teacher_forced(hidden, base, changed, markov, conf)
        assert torch.equal(conf2[:, : k + 1], conf_logits[:, : k + 1])
        assert torch.equal(logits2[:, : k + 1], logits[:, : k + 1])
        assert not torch.equal(conf2[:, k + 1], conf_logits[:, k + 1])  # ... but c_{k+1} does read x_k


def synthetic_log(n: int = 20000, gamma: int = 5, scale: float = 3.0, seed: int = 0):
    """True conditional acceptance sigmoid(z_k); the head reports scale * z_k (overconfident for scale > 1)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(1.0, 1.2, size=(n, gamma)) - 0.3 * np.arange(gamma)
    survive = rng.random((n, gamma)) < 1 / (1 + np.exp(-z))
    accepted = np.where(survive.all(1), gamma, np.argmin(survive, axis=1))  # first rejection
    return scale * z, accepted


def survival_ece(survival, accepted) -> float:
    k = np.arange(survival.shape[1])[None, :]
    return expected_calibration_error(survival, k < np.asarray(accepted)[:, None])


def test_sts_lowers_ece():
    logits, accepted = synthetic_log()
    raw = survival_ece(np.cumprod(1 / (1 + np.exp(-logits)), axis=1), accepted)
    sts = SequentialTemperatureScaling.fit(logits, accepted)
    fitted = survival_ece(sts.survival(logits), accepted)
    print(f"STS: ECE {raw:.4f} -> {fitted:.4f}, temperatures {np.round(sts.temperatures, 2).tolist()}")
    assert fitted < 0.5 * raw and fitted < 0.02
    assert all(2.0 < t < 4.5 for t in sts.temperatures)  # recovers the 3x overconfidence
    # Torch path gives the same calibrated survivals.
    torch_surv = sts.survival(torch.tensor(logits))
    assert np.abs(torch_surv.numpy() - sts.survival(logits)).max() < 1e-9


def test_sts_partial_verification_and_identity():
    logits, accepted = synthetic_log(scale=1.0, seed=1)
    verified = np.full_like(accepted, 3)  # only 3 drafts verified: positions 4..5 never observed
    accepted = np.minimum(accepted, verified)
    sts = SequentialTemperatureScaling.fit(logits, accepted, verified)
    assert sts.temperatures[3:] == [1.0, 1.0]
    assert all(0.7 < t < 1.4 for t in sts.temperatures[:3])  # already calibrated: stays near 1
    with pytest.raises(ValueError, match="accepted more"):
        SequentialTemperatureScaling.fit(logits, verified + 1, verified)


def test_sts_json_round_trip(tmp_path):
    sts = SequentialTemperatureScaling([1.5, 2.0, 0.75])
    path = tmp_path / "sts.json"
    sts.save(path)
    assert json.loads(path.read_text()) == {"sts_temperatures": [1.5, 2.0, 0.75]}
    loaded = SequentialTemperatureScaling.load(path)
    assert loaded.temperatures == sts.temperatures
    x = np.array([[0.3, -1.0, 2.0]])
    assert np.allclose(loaded.confidence(x), 1 / (1 + np.exp(-x / np.array([1.5, 2.0, 0.75]))))
    (tmp_path / "sglang.json").write_text(json.dumps({"temperatures": [1.0, 2.0]}))
    assert SequentialTemperatureScaling.load(tmp_path / "sglang.json").temperatures == [1.0, 2.0]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="sts_temperatures"):
        SequentialTemperatureScaling.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="only 3 temperatures"):
        sts.confidence(np.zeros((1, 4)))
