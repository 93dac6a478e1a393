"""DFlash draft model: fp32 parity with z-lab's reference (`dflash` 0.1.0 on PyPI), cache bookkeeping, loader errors.

Tiny random models only (hidden 64, vocab 128): no checkpoints, no engines.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")
zlab = pytest.importorskip(
    "dflash.model", reason="z-lab's DFlash reference is the oracle: install with pip install --no-deps dflash==0.1.0"
)

from safetensors.torch import save_file  # noqa: E402

from spec_plugins.proposers.dflash import DFlashConfig, load_dflash, select_taps  # noqa: E402
from drafter_weights import randomize_  # noqa: E402

TOL = 1e-4
HIDDEN, VOCAB, TARGET_LAYERS, BLOCK, MASK = 64, 128, 4, 4, 127

BASE_CONFIG = {
    "model_type": "qwen3",
    "architectures": ["DFlashDraftModel"],
    "hidden_size": HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": VOCAB,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "block_size": BLOCK,
    "num_target_layers": TARGET_LAYERS,
    "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]},
}

VARIANTS = {
    "bidirectional": {},
    "three_taps": {"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 1, 2]}, "rope_theta": 1e6},
    # layer 1 slides with a window shorter than the block (causal by the sliding rule); layer 0 stays full.
    "sliding": {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
    "causal_bias": {"is_causal": True, "attention_bias": True},
    "scaled_capped": {"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 2],
                                        "input_embedding_scale": 1.5, "output_multiplier": 0.7,
                                        "final_logit_softcapping": 5.0}},
}


def make_config(**overrides):
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg.update(copy.deepcopy(overrides))
    return cfg


def zlab_model(cfg: dict, seed: int = 0):
    torch.manual_seed(seed)
    return randomize_(zlab.DFlashDraftModel(transformers.Qwen3Config(**cfg)).float().eval())


def save_checkpoint(folder, cfg: dict, state: dict, prefix: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({prefix + k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(1)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
    )
    model = transformers.Qwen3ForCausalLM(config).float().eval()
    with torch.no_grad():  # O(1) logits instead of HF's ~0.02-scale init, so 1e-4 is a tight bound
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.5)
    return model


def zlab_block(model, target, taps, block_ids, positions, cache=None):
    """z-lab draft forward for one block: normed hidden states and logits."""
    emb = zlab._raw_input_embeddings(target, block_ids, float(zlab._draft_value(model.config, "input_embedding_scale", 1.0)))
    hidden = model(target_hidden=taps, noise_embedding=emb, position_ids=positions, past_key_values=cache, use_cache=cache is not None)
    return hidden, model.compute_logits(hidden, zlab._output_head(target))


def ours_block(model, target, taps, block_ids, cache=None):
    emb = model.embed_block(block_ids, target.get_input_embeddings().weight)
    hidden = model(taps, emb, cache)
    return hidden, model.logits(hidden, target.lm_head.weight)


@pytest.mark.parametrize("prefix", ["", "model."])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@torch.no_grad()
def test_one_shot_parity_with_zlab(tmp_path, target, variant, prefix):
    cfg = make_config(**VARIANTS[variant])
    ref = zlab_model(cfg)
    save_checkpoint(tmp_path / "ckpt", cfg, ref.state_dict(), prefix)
    ours = load_dflash(tmp_path / "ckpt", num_target_layers=TARGET_LAYERS, target_hidden_size=HIDDEN)
    assert ours.config.layer_causal == tuple(layer.self_attn.is_causal for layer in ref.layers)
    assert ours.config.layer_window == tuple(layer.self_attn.sliding_window for layer in ref.layers)

    torch.manual_seed(2)
    batch, prompt = 2, 7
    ids = torch.randint(0, VOCAB - 1, (batch, prompt + 1))
    out = target(ids[:, :prompt], output_hidden_states=True)
    taps_ref = zlab.extract_context_feature(out.hidden_states, ref.target_layer_ids)
    taps = select_taps(out.hidden_states, ours.config.target_layer_ids)
    assert torch.equal(taps, taps_ref)  # tap k = hidden_states[k + 1]

    block = ours.block_ids(ids[:, prompt])
    h_ref, logits_ref = zlab_block(ref, target, taps_ref, block, torch.arange(prompt + BLOCK)[None])
    h, logits = ours_block(ours, target, taps, block)
    assert h.shape == (batch, BLOCK, HIDDEN) and logits.shape == (batch, BLOCK, VOCAB)
    assert (h - h_ref).abs().max().item() <= TOL
    assert (logits - logits_ref).abs().max().item() <= TOL


@pytest.mark.parametrize("variant", ["bidirectional", "sliding"])
@torch.no_grad()
def test_cached_decode_loop_matches_zlab_cache(tmp_path, target, variant):
    """Step by step, z-lab style: the context of each step is the features of the rows committed last step."""
    cfg = make_config(**VARIANTS[variant])
    ref = zlab_model(cfg, seed=3)
    save_checkpoint(tmp_path / "ckpt", cfg, ref.state_dict())
    ours = load_dflash(tmp_path / "ckpt")
    torch.manual_seed(4)
    total = 20
    feats = torch.randn(1, total, 2 * HIDDEN)
    tokens = torch.randint(0, VOCAB - 1, (1, total + 1))
    ref_cache, cache = zlab._make_cache(ref.config), ours.new_cache()
    done, start = 0, 6  # features known for [done, start); bonus token at start
    for committed in (1, 3, 1, 4, 2):
        block = ours.block_ids(tokens[:, start])
        _, logits_ref = zlab_block(ref, target, feats[:, done:start], block, torch.arange(done, start + BLOCK)[None], ref_cache)
        zlab._crop_to(ref_cache, start)
        _, logits = ours_block(ours, target, feats[:, done:start], block, cache)
        assert cache.length == start == ref_cache.get_seq_length()
        assert (logits - logits_ref).abs().max().item() <= TOL
        done, start = start, start + committed


@torch.no_grad()
def test_append_then_trim_equals_recompute(tmp_path, target):
    """Append features for every verified row, trim the rejected ones: same drafts as a fresh full forward."""
    cfg = make_config(**VARIANTS["sliding"])
    save_checkpoint(tmp_path / "ckpt", cfg, zlab_model(cfg, seed=5).state_dict())
    ours = load_dflash(tmp_path / "ckpt")
    torch.manual_seed(6)
    feats = torch.randn(1, 32, 2 * HIDDEN)
    tokens = torch.randint(0, VOCAB - 1, (1, 33))
    cache, start = ours.new_cache(), 5
    ours_block(ours, target, feats[:, :start], ours.block_ids(tokens[:, start]), cache)
    for accepted in (0, 2, BLOCK - 1, 1):
        # The target verified rows start .. start+B-1; rows 0..accepted are committed (the last of them is
        # followed by a new bonus token that has no features yet).
        h_before = cache.length
        ours.extend_cache(feats[:, start:start + BLOCK], cache)
        assert cache.length == h_before + BLOCK
        start += accepted + 1
        cache.trim(start)
        assert cache.length == start
        block = ours.block_ids(tokens[:, start])
        _, incremental = ours_block(ours, target, feats[:, :0], block, cache)
        _, scratch = ours_block(ours, target, feats[:, :start], block)
        assert cache.length == start  # block K/V never enter the cache
        assert (incremental - scratch).abs().max().item() <= 1e-5


# ----------------------------------------------------------------------------------------------------------
# Loader / config errors: one line, naming the problem.


def _error(tmp_path, cfg, state, **kwargs) -> str:
    save_checkpoint(tmp_path / "bad", cfg, state)
    with pytest.raises(ValueError) as info:
        load_dflash(tmp_path / "bad", **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def good_state():
    return {k: v.clone() for k, v in zlab_model(BASE_CONFIG).state_dict().items()}


def test_missing_config_field(tmp_path, good_state):
    cfg = make_config(dflash_config={"target_layer_ids": [0, 2]})
    assert "'mask_token_id'" in _error(tmp_path, cfg, good_state)
    cfg = make_config()
    del cfg["hidden_size"]
    assert "'hidden_size'" in _error(tmp_path, cfg, good_state)


def test_tap_out_of_range(tmp_path, good_state):
    cfg = make_config(dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, TARGET_LAYERS]})
    assert "target_layer_ids" in _error(tmp_path, cfg, good_state)
    # Range from the target when the config does not say.
    cfg = make_config(num_target_layers=None)
    del cfg["num_target_layers"]
    msg = _error(tmp_path, cfg, good_state, num_target_layers=2)
    assert "target_layer_ids" in msg and "tap id 2" in msg
    # Config and target disagree on the depth.
    assert "num_target_layers" in _error(tmp_path, make_config(), good_state, num_target_layers=8)


def test_wrong_tensor_shape_and_missing_tensor(tmp_path, good_state):
    state = dict(good_state, **{"fc.weight": torch.zeros(HIDDEN, 3 * HIDDEN)})
    msg = _error(tmp_path, make_config(), state)
    assert "fc.weight" in msg and "shape" in msg
    state = {k: v for k, v in good_state.items() if k != "layers.1.self_attn.k_norm.weight"}
    assert "layers.1.attention.k_norm.weight" in _error(tmp_path, make_config(), state)
    assert "hidden_size" in _error(tmp_path, make_config(), good_state, target_hidden_size=32)


def test_dspark_checkpoint_refused(tmp_path, good_state):
    state = dict(good_state, **{"markov_head.predecessor.weight": torch.zeros(VOCAB, 8)})
    assert "DSpark" in _error(tmp_path, make_config(), state)
    cfg = make_config(dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 2], "markov_rank": 8})
    msg = _error(tmp_path, cfg, good_state)
    assert "DSpark" in msg and "markov_rank" in msg


def test_unexpected_tensor_and_bad_values(tmp_path, good_state):
    assert "unexpected tensor" in _error(tmp_path, make_config(), dict(good_state, **{"extra.weight": torch.zeros(2)}))
    assert "mask_token_id" in _error(tmp_path, make_config(dflash_config={"mask_token_id": VOCAB, "target_layer_ids": [0]}), good_state)
    assert "rope_scaling" in _error(tmp_path, make_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), good_state)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        DFlashConfig.from_dict(make_config(num_key_value_heads=3))


def test_default_taps_follow_zlab():
    from spec_plugins.proposers.dflash import default_target_layer_ids

    assert default_target_layer_ids(36, 5) == zlab.build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(40, 5) == zlab.build_target_layer_ids(40, 5)
    assert default_target_layer_ids(28, 1) == zlab.build_target_layer_ids(28, 1)
    cfg = make_config(dflash_config={"mask_token_id": MASK}, num_target_layers=36)
    assert DFlashConfig.from_dict(cfg).target_layer_ids == (1, 33)  # as many taps as draft layers (2)


@pytest.mark.parametrize("mode", ["random", "all_accept"])
@torch.no_grad()
def test_greedy_loop_matches_zlab_generate(tmp_path, target, monkeypatch, mode):
    """Run z-lab's own decode loop (dflash_generate, greedy) and ours around DFlashDrafter on the same
    target: every step's draft distribution, the acceptance lengths and the output tokens agree. This
    checks the bookkeeping (positions, which rows' features become context, cache length) end to end.
    "random": nearly every step rejects all drafts; "all_accept": identical LM-head rows make every logit
    tie, so target and draft both pick token 0 and whole blocks are committed."""
    from spec_plugins.proposers.dflash import DFlashDrafter

    if mode == "all_accept":
        target = copy.deepcopy(target)
        target.lm_head.weight.copy_(target.lm_head.weight[:1].expand_as(target.lm_head.weight))

    cfg = make_config()
    ref = zlab_model(cfg, seed=7)
    save_checkpoint(tmp_path / "ckpt", cfg, ref.state_dict())
    ours = load_dflash(tmp_path / "ckpt")

    recorded = []  # z-lab's draft logits, one [1, B-1, V] entry per step
    compute_logits = ref.compute_logits

    def record(hidden, head):
        recorded.append(compute_logits(hidden, head))
        return recorded[-1]

    monkeypatch.setattr(ref, "compute_logits", record)
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # CPU: no cuda.synchronize for the stats
    torch.manual_seed(8)
    prompt = torch.randint(0, VOCAB - 1, (1, 6))
    stats = zlab.dflash_generate(ref, target, prompt, max_new_tokens=16, stop_token_ids=None, return_stats=True)

    drafter = DFlashDrafter(ours, target.get_input_embeddings().weight, target.lm_head.weight)
    seq = prompt
    out = target(seq, output_hidden_states=True)
    bonus = out.logits[:, -1].argmax(-1)
    pending = select_taps(out.hidden_states, ours.config.target_layer_ids)  # features of the whole prompt
    accepted_lengths = []
    for ref_logits in recorded[:-1]:  # z-lab's last step may commit fewer rows than verified
        if ref_logits.shape[1] != BLOCK - 1:  # near max_new_tokens z-lab also shortens the block
            break
        start = seq.shape[1]
        drafts, probs = drafter.propose_block(pending, bonus)
        assert drafter.length == start
        assert (probs - torch.softmax(ref_logits, -1)).abs().max().item() <= TOL
        drafts = ref_logits.argmax(-1)  # equal up to TOL; z-lab's argmax rules out near-ties flipping
        block = torch.cat([bonus[:, None], drafts], dim=1)
        out = target(torch.cat([seq, block], dim=1), output_hidden_states=True)  # no target cache: recompute
        posterior = out.logits[:, start:].argmax(-1)
        a = int((drafts == posterior[:, :-1]).cumprod(dim=1).sum())
        # Verified rows 0..a (bonus + accepted drafts) are committed with features; the new bonus has none.
        pending = select_taps(out.hidden_states, ours.config.target_layer_ids)[:, start:start + a + 1]
        seq = torch.cat([seq, block[:, :a + 1]], dim=1)
        bonus = posterior[:, a]
        accepted_lengths.append(a + 1)
    assert len(accepted_lengths) >= 3
    if mode == "all_accept":
        assert accepted_lengths == [BLOCK] * len(accepted_lengths)
    assert accepted_lengths == stats.acceptance_lengths[:len(accepted_lengths)]
    assert torch.equal(seq[0], stats.output_ids[0, :seq.shape[1]])


@torch.no_grad()
def test_drafter_greedy_probs_and_trim(tmp_path, target):
    from spec_plugins.proposers.dflash import DFlashDrafter

    cfg = make_config()
    save_checkpoint(tmp_path / "ckpt", cfg, zlab_model(cfg, seed=9).state_dict())
    ours = load_dflash(tmp_path / "ckpt")
    drafter = DFlashDrafter(ours, target.get_input_embeddings().weight, target.lm_head.weight)
    feats = torch.randn(1, 12, 2 * HIDDEN)
    tokens, probs = drafter.propose_block(feats[:, :8], torch.tensor([3]), temperature=0.7)
    assert tokens.shape == (1, BLOCK - 1) and probs.shape == (1, BLOCK - 1, VOCAB)
    assert torch.allclose(probs.sum(-1), torch.ones(1, BLOCK - 1))
    assert torch.equal(probs.argmax(-1), tokens)
    drafter.extend(feats[:, 8:12])
    assert drafter.length == 12
    drafter.trim(9)
    assert drafter.length == 9
    greedy, onehot = drafter.propose_block(feats[:, :0], torch.tensor([5]), temperature=0.0)
    assert torch.equal(onehot.argmax(-1), greedy) and torch.equal(onehot.sum(-1), torch.ones(1, BLOCK - 1))
    with pytest.raises(ValueError, match="trim"):
        drafter.trim(10)


@torch.no_grad()
def test_bf16_close_to_zlab(tmp_path, target):
    """bf16 weights and activations: same rounding points as z-lab (norms in fp32, RoPE cast to the dtype)."""
    cfg = make_config(**VARIANTS["sliding"])
    ref = zlab_model(cfg, seed=11)
    save_checkpoint(tmp_path / "ckpt", cfg, ref.state_dict())
    ours = load_dflash(tmp_path / "ckpt", dtype=torch.bfloat16)
    ref = ref.to(torch.bfloat16)
    assert next(ours.parameters()).dtype == torch.bfloat16
    torch.manual_seed(12)
    taps = torch.randn(1, 9, 2 * HIDDEN, dtype=torch.bfloat16)
    block = ours.block_ids(torch.tensor([7]))
    emb = target.get_input_embeddings().weight.to(torch.bfloat16)
    h_ref = ref(target_hidden=taps, noise_embedding=torch.nn.functional.embedding(block, emb), position_ids=torch.arange(9 + BLOCK)[None])
    h = ours(taps, ours.embed_block(block, emb))
    assert h.dtype == torch.bfloat16
    assert (h.float() - h_ref.float()).abs().max().item() <= 0.05 * h_ref.float().abs().max().item()
