"""DeepSpec-layout checkpoints (deepseek-ai/DeepSpec `Qwen3DSparkModel`): loaders for its DFlash and DSpark
drafts, and the one-line loader errors (shapes, missing fields, taps, vocabulary, DSpark-as-DFlash).

Checkpoints are written here from random weights in DeepSpec's layout; the field and tensor names below are
DeepSpec's (`deepspec/modeling/dspark/qwen3/config.py::build_draft_config`, `qwen3/modeling.py`,
`common.py::AcceptRatePredictor`; the Markov head names as in the reference notes). Tiny models, CPU only.
"""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")

from safetensors.torch import save_file  # noqa: E402

from spec_plugins.proposers.dflash.config import DFlashConfig  # noqa: E402
from spec_plugins.proposers.dflash.loader import load_deepspec_dflash, load_dflash  # noqa: E402
from spec_plugins.proposers.dflash.model import DFlashDraftModel  # noqa: E402
from spec_plugins.proposers.dspark.deepspec import load_deepspec_dspark, load_deepspec_dspark_checkpoint  # noqa: E402
from spec_plugins.proposers.dspark.heads import ConfidenceHead, DSparkDrafter, MarkovHead, teacher_forced  # noqa: E402
from drafter_weights import randomize_  # noqa: E402

TOL = 1e-5
HIDDEN, VOCAB, TARGET_LAYERS, GAMMA, MASK, RANK = 64, 128, 4, 7, 127, 8
TAPS = [0, 2]

# Fields DeepSpec's build_draft_config adds to the copied target config (DSpark: markov / confidence on).
DEEPSPEC_DRAFT_FIELDS = {
    "architectures": ["Qwen3DSparkModel"], "num_target_layers": TARGET_LAYERS, "num_hidden_layers": 2,
    "block_size": GAMMA, "tie_word_embeddings": False, "layer_types": ["full_attention"] * 2,
    "mask_token_id": MASK, "target_layer_ids": TAPS, "num_anchors": 512,
}
DSPARK_FIELDS = {"markov_rank": RANK, "markov_head_type": "vanilla", "enable_confidence_head": True,
                 "confidence_head_with_markov": True}
DFLASH_FIELDS = {"markov_rank": 0, "enable_confidence_head": False}


def target_qwen3(**overrides):
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=TARGET_LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False)
    return transformers.Qwen3Config(**dict(fields, **overrides))


def target_config_dict() -> dict:
    """The target's Qwen3 config as transformers writes it (DeepSpec deep-copies the target's config)."""
    return target_qwen3().to_dict()


def deepspec_config(**fields) -> dict:
    cfg = target_config_dict()
    cfg.update(copy.deepcopy(DEEPSPEC_DRAFT_FIELDS))
    cfg.update(copy.deepcopy(fields))
    return cfg


def direct_config(theta: float) -> DFlashConfig:
    """The same backbone built by hand, independently of the loader's config parsing."""
    return DFlashConfig(
        hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=theta, attention_bias=False, block_size=GAMMA,
        mask_token_id=MASK, target_layer_ids=tuple(TAPS), num_target_layers=TARGET_LAYERS,
        layer_causal=(False, False), layer_window=(None, None),
    )


# Our parameter names -> DeepSpec's (= HF Qwen3 / z-lab names), written out here rather than imported.
_OURS_TO_DEEPSPEC = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj", "attention.q_norm": "self_attn.q_norm", "attention.k_norm": "self_attn.k_norm",
    "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
}


def to_deepspec_name(ours: str) -> str:
    if not ours.startswith("layers."):
        return ours
    _, idx, rest = ours.split(".", 2)
    module, leaf = rest.rsplit(".", 1)
    return f"layers.{idx}.{_OURS_TO_DEEPSPEC[module]}.{leaf}"


class Reference:
    """Directly-constructed backbone + heads + embedding / head copies, and their DeepSpec tensors."""

    def __init__(self, head_type: str | None, with_confidence: bool, *, confidence_with_markov: bool = True, seed: int = 0):
        torch.manual_seed(seed)
        theta = target_config_dict().get("rope_parameters", {}).get("rope_theta", 10000.0)
        self.model = DFlashDraftModel(direct_config(theta)).eval()
        randomize_(self.model)
        self.embed = torch.randn(VOCAB, HIDDEN)
        self.lm_head = 0.5 * torch.randn(VOCAB, HIDDEN)
        self.markov = MarkovHead(VOCAB, RANK, HIDDEN, head_type).eval() if head_type else None
        self.confidence = None
        if with_confidence:
            self.confidence = ConfidenceHead(HIDDEN, RANK if confidence_with_markov else 0).eval()
        for head in (self.markov, self.confidence):
            if head is not None:
                randomize_(head)
        self.tensors = {to_deepspec_name(k): v.clone() for k, v in self.model.state_dict().items()}
        self.tensors["embed_tokens.weight"] = self.embed.clone()
        self.tensors["lm_head.weight"] = self.lm_head.clone()
        for prefix, head in (("markov_head.", self.markov), ("confidence_head.", self.confidence)):
            if head is not None:
                self.tensors.update({prefix + k: v.clone() for k, v in head.state_dict().items()})
        fields = dict(DFLASH_FIELDS)
        if head_type:
            fields.update(markov_rank=RANK, markov_head_type=head_type)
        if with_confidence:
            fields.update(enable_confidence_head=True, confidence_head_with_markov=confidence_with_markov)
        self.config = deepspec_config(**fields)


def save(folder, cfg: dict, tensors: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))


def inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(2, 9, len(TAPS) * HIDDEN, generator=g)
    anchor = torch.randint(0, VOCAB - 1, (2,), generator=g)
    return taps, anchor


def walk(model, markov, confidence, embed, lm_head, taps, anchor):
    return DSparkDrafter(model, embed, lm_head, markov, confidence).propose_block(taps, anchor, temperature=0.0)


# ----------------------------------------------------------------------------------------------------------
# Loading reproduces the directly-constructed model


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("confidence_with_markov", [True, False])
@torch.no_grad()
def test_dspark_loader_reproduces_reference(tmp_path, head_type, confidence_with_markov):
    ref = Reference(head_type, True, confidence_with_markov=confidence_with_markov)
    save(tmp_path / "ckpt", ref.config, ref.tensors)
    loaded = load_deepspec_dspark_checkpoint(tmp_path / "ckpt", num_target_layers=TARGET_LAYERS, target_vocab_size=VOCAB)
    assert loaded.markov.head_type == head_type and loaded.confidence.with_markov == confidence_with_markov
    assert torch.equal(loaded.embed_tokens, ref.embed) and torch.equal(loaded.lm_head, ref.lm_head)

    taps, anchor = inputs()
    want = walk(ref.model, ref.markov, ref.confidence, ref.embed, ref.lm_head, taps, anchor)
    got = walk(loaded.model, loaded.markov, loaded.confidence, loaded.embed_tokens, loaded.lm_head, taps, anchor)
    assert got.tokens.shape == (2, GAMMA)  # every row drafts: gamma drafts
    assert (got.logits - want.logits).abs().max().item() <= TOL
    assert (got.confidence_logits - want.confidence_logits).abs().max().item() <= TOL
    assert torch.equal(got.tokens, want.tokens)

    # The tuple form drops the copies and drives the same drafts with the target's weights.
    model, markov, confidence = load_deepspec_dspark(tmp_path / "ckpt")
    again = walk(model, markov, confidence, ref.embed, ref.lm_head, taps, anchor)
    assert (again.logits - want.logits).abs().max().item() <= TOL


@torch.no_grad()
def test_markov_and_confidence_follow_deepspec_formulas(tmp_path):
    """Check the tensor mapping against DeepSpec's formulas written from the raw tensors: vanilla bias
    W2 W1[prev], gated W2(sigmoid(G[h; e] + b) * e), confidence proj([h; e])."""
    for head_type in ("vanilla", "gated"):
        ref = Reference(head_type, True, seed=3)
        save(tmp_path / head_type, ref.config, ref.tensors)
        model, markov, confidence = load_deepspec_dspark(tmp_path / head_type)
        t = ref.tensors
        torch.manual_seed(4)
        hidden = torch.randn(2, GAMMA, HIDDEN)
        base = torch.randn(2, GAMMA, VOCAB)
        prev = torch.randint(0, VOCAB, (2, GAMMA))
        e = t["markov_head.markov_w1.weight"][prev]
        latent = e
        if head_type == "gated":
            gate = torch.sigmoid(torch.cat([hidden, e], -1) @ t["markov_head.gate_proj.weight"].T + t["markov_head.gate_proj.bias"])
            latent = gate * e
        want_logits = base + latent @ t["markov_head.markov_w2.weight"].T
        want_conf = (torch.cat([hidden, e], -1) @ t["confidence_head.proj.weight"].T + t["confidence_head.proj.bias"]).squeeze(-1)
        logits, conf = teacher_forced(hidden, base, prev, markov, confidence)
        assert (logits - want_logits).abs().max().item() <= TOL
        assert (conf - want_conf).abs().max().item() <= TOL


@torch.no_grad()
def test_rnn_head_follows_deepspec_recurrence(tmp_path):
    ref = Reference("rnn", False, seed=5)
    save(tmp_path / "ckpt", ref.config, ref.tensors)
    _, markov, confidence = load_deepspec_dspark(tmp_path / "ckpt")
    assert confidence is None
    t = ref.tensors
    torch.manual_seed(6)
    hidden, base, prev = torch.randn(1, GAMMA, HIDDEN), torch.randn(1, GAMMA, VOCAB), torch.randint(0, VOCAB, (1, GAMMA))
    state, want = torch.zeros(1, RANK), []
    for k in range(GAMMA):  # z = [s; W1[prev]; h]; [g, c, o] = J z + b; s = g s + (1 - g) tanh c; bias = W2 tanh o
        z = torch.cat([state, t["markov_head.markov_w1.weight"][prev[:, k]], hidden[:, k]], -1)
        g, c, o = (z @ t["markov_head.joint_proj.weight"].T + t["markov_head.joint_proj.bias"]).chunk(3, -1)
        g = torch.sigmoid(g)
        state = g * state + (1 - g) * torch.tanh(c)
        want.append(base[:, k] + torch.tanh(o) @ t["markov_head.markov_w2.weight"].T)
    logits, _ = teacher_forced(hidden, base, prev, markov, None)
    assert (logits - torch.stack(want, 1)).abs().max().item() <= TOL


@torch.no_grad()
def test_deepspec_dflash_loads_and_drafts_every_row(tmp_path):
    ref = Reference(None, False)
    save(tmp_path / "ckpt", ref.config, ref.tensors)
    draft = load_deepspec_dflash(tmp_path / "ckpt", target_config=target_qwen3())
    assert draft.head_tensors == {} and draft.model.config.layer_causal == (False, False)
    taps, anchor = inputs(2)
    want = walk(ref.model, None, None, ref.embed, ref.lm_head, taps, anchor)
    got = walk(draft.model, None, None, draft.embed_tokens, draft.lm_head, taps, anchor)
    assert got.tokens.shape == (2, GAMMA) and got.confidence_logits is None
    assert (got.logits - want.logits).abs().max().item() <= TOL
    # The DSpark loader accepts a DeepSpec DFlash folder too: no heads.
    model, markov, confidence = load_deepspec_dspark(tmp_path / "ckpt")
    assert markov is None and confidence is None
    # keep_embeddings=False drops the copies (the target's are used instead).
    assert load_deepspec_dflash(tmp_path / "ckpt", keep_embeddings=False).embed_tokens is None


@torch.no_grad()
def test_bf16_cast(tmp_path):
    ref = Reference("vanilla", True)
    save(tmp_path / "ckpt", ref.config, ref.tensors)
    d = load_deepspec_dspark_checkpoint(tmp_path / "ckpt", dtype=torch.bfloat16)
    dtypes = {p.dtype for m in (d.model, d.markov, d.confidence) for p in m.parameters()}
    assert dtypes == {torch.bfloat16} and d.embed_tokens.dtype == torch.bfloat16


@torch.no_grad()
def test_backbone_matches_zlab_reference(tmp_path):
    """DeepSpec's backbone tensors are z-lab's names and network: z-lab's DFlashDraftModel, built from the
    DeepSpec config.json (top-level target_layer_ids / block_size / mask_token_id), loads them strictly and
    gives the same block hidden states as our loaded backbone."""
    zlab = pytest.importorskip("dflash.model", reason="z-lab's DFlash reference: pip install --no-deps dflash==0.1.0")
    ref = Reference("vanilla", True)
    save(tmp_path / "ckpt", ref.config, ref.tensors)
    model, _, _ = load_deepspec_dspark(tmp_path / "ckpt")
    oracle = zlab.DFlashDraftModel(transformers.Qwen3Config(**ref.config)).float().eval()
    backbone = {k: v for k, v in ref.tensors.items() if not k.startswith(("markov_head.", "confidence_head.", "embed_tokens", "lm_head"))}
    oracle.load_state_dict(backbone, strict=True)
    assert list(oracle.target_layer_ids) == TAPS and oracle.block_size == GAMMA
    taps, anchor = inputs(3)
    block = model.embed_block(model.block_ids(anchor), ref.embed)
    want = oracle(target_hidden=taps, noise_embedding=block, position_ids=torch.arange(taps.shape[1] + GAMMA)[None])
    assert (model(taps, block) - want).abs().max().item() <= 1e-4


# ----------------------------------------------------------------------------------------------------------
# Errors: one line, naming the field or tensor


def _error(fn, folder, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(folder, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def dspark_ref():
    return Reference("vanilla", True)


def test_wrong_tensor_shapes(tmp_path, dspark_ref):
    for name, shape in (("fc.weight", (HIDDEN, 3 * HIDDEN)), ("embed_tokens.weight", (VOCAB - 1, HIDDEN)),
                        ("lm_head.weight", (VOCAB, HIDDEN + 1)), ("markov_head.markov_w1.weight", (VOCAB, RANK + 1)),
                        ("confidence_head.proj.weight", (1, HIDDEN))):
        tensors = dict(dspark_ref.tensors, **{name: torch.zeros(shape)})
        save(tmp_path / name, dspark_ref.config, tensors)
        msg = _error(load_deepspec_dspark, tmp_path / name)
        assert f"'{name}'" in msg and str(list(shape)) in msg, msg
        want = list(dspark_ref.tensors[name].shape)
        assert str(want) in msg, msg  # expected vs got


def test_missing_fields_and_tensors(tmp_path, dspark_ref):
    for field in ("mask_token_id", "target_layer_ids", "block_size", "hidden_size", "markov_head_type",
                  "confidence_head_with_markov"):
        cfg = dict(dspark_ref.config)
        del cfg[field]
        save(tmp_path / field, cfg, dspark_ref.tensors)
        assert f"'{field}'" in _error(load_deepspec_dspark, tmp_path / field)
    tensors = {k: v for k, v in dspark_ref.tensors.items() if k != "markov_head.markov_w2.weight"}
    save(tmp_path / "no_w2", dspark_ref.config, tensors)
    assert "'markov_head.markov_w2.weight'" in _error(load_deepspec_dspark, tmp_path / "no_w2")
    tensors = {k: v for k, v in dspark_ref.tensors.items() if k != "layers.1.self_attn.k_norm.weight"}
    save(tmp_path / "no_knorm", dspark_ref.config, tensors)
    assert "layers.1.attention.k_norm.weight" in _error(load_deepspec_dspark, tmp_path / "no_knorm")


def test_head_tensors_that_do_not_fit(tmp_path, dspark_ref):
    tensors = dict(dspark_ref.tensors, **{"markov_head.gate_proj.weight": torch.zeros(RANK, HIDDEN + RANK)})
    save(tmp_path / "gate", dspark_ref.config, tensors)
    assert "'markov_head.gate_proj.weight'" in _error(load_deepspec_dspark, tmp_path / "gate")
    save(tmp_path / "bad_type", dict(dspark_ref.config, markov_head_type="lstm"), dspark_ref.tensors)
    assert "'markov_head_type'" in _error(load_deepspec_dspark, tmp_path / "bad_type")


def test_taps_out_of_range(tmp_path, dspark_ref):
    save(tmp_path / "high", dict(dspark_ref.config, target_layer_ids=[0, TARGET_LAYERS]), dspark_ref.tensors)
    msg = _error(load_deepspec_dspark, tmp_path / "high")
    assert "target_layer_ids" in msg and f"tap id {TARGET_LAYERS}" in msg
    # The range comes from the target when the config does not say.
    cfg = dict(dspark_ref.config)
    del cfg["num_target_layers"]
    save(tmp_path / "target", cfg, dspark_ref.tensors)
    msg = _error(load_deepspec_dspark, tmp_path / "target", num_target_layers=2)
    assert "target_layer_ids" in msg and "tap id 2" in msg
    # Checkpoint trained on another depth than the target's.
    save(tmp_path / "depth", dspark_ref.config, dspark_ref.tensors)
    assert "'num_target_layers'" in _error(load_deepspec_dspark, tmp_path / "depth", num_target_layers=8)
    # DeepSpec's -1 (embedding output) is refused by name.
    save(tmp_path / "emb", dict(dspark_ref.config, target_layer_ids=[-1, 2]), dspark_ref.tensors)
    assert "-1" in _error(load_deepspec_dspark, tmp_path / "emb")


def test_vocab_and_hidden_mismatch_with_target(tmp_path, dspark_ref):
    save(tmp_path / "ckpt", dspark_ref.config, dspark_ref.tensors)
    msg = _error(load_deepspec_dspark, tmp_path / "ckpt", target_vocab_size=VOCAB + 8)
    assert "'vocab_size'" in msg and str(VOCAB) in msg and str(VOCAB + 8) in msg
    big = target_qwen3(vocab_size=VOCAB * 2)
    assert "'vocab_size'" in _error(load_deepspec_dspark, tmp_path / "ckpt", target_config=big)
    assert "'hidden_size'" in _error(load_deepspec_dspark, tmp_path / "ckpt", target_hidden_size=32)
    # An explicit size contradicting the target config is refused too.
    assert "vocab_size" in _error(load_deepspec_dspark, tmp_path / "ckpt", target_vocab_size=VOCAB + 1,
                                  target_config=target_qwen3())


def test_vocab_mismatch_zlab_layout(tmp_path):
    zlab_cfg = {
        "model_type": "qwen3", "architectures": ["DFlashDraftModel"], "hidden_size": HIDDEN, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": VOCAB, "block_size": 4, "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS},
    }
    ref = Reference(None, False)
    tensors = {k: v for k, v in ref.tensors.items() if not k.startswith(("embed_tokens", "lm_head"))}
    save(tmp_path / "zlab", zlab_cfg, tensors)
    assert load_dflash(tmp_path / "zlab", target_vocab_size=VOCAB).config.vocab_size == VOCAB
    msg = _error(load_dflash, tmp_path / "zlab", target_vocab_size=VOCAB * 2)
    assert "'vocab_size'" in msg and str(VOCAB * 2) in msg
    # A target config (object or dict) of another depth than the checkpoint was trained on.
    target = target_qwen3(num_hidden_layers=2)
    for cfg in (target, target.to_dict()):
        assert "'num_target_layers'" in _error(load_dflash, tmp_path / "zlab", target_config=cfg)


def test_dspark_checkpoint_passed_as_dflash(tmp_path, dspark_ref):
    # DeepSpec DSpark folder -> either DFlash loader.
    save(tmp_path / "deepspec", dspark_ref.config, dspark_ref.tensors)
    for fn in (load_dflash, load_deepspec_dflash):
        msg = _error(fn, tmp_path / "deepspec")
        assert "DSpark checkpoint" in msg and "load_deepspec_dspark" in msg and "'markov_rank'" in msg
    # Confidence head only (markov_rank 0) is DSpark too.
    ref = Reference(None, True, confidence_with_markov=False)
    save(tmp_path / "conf_only", ref.config, ref.tensors)
    msg = _error(load_deepspec_dflash, tmp_path / "conf_only")
    assert "'enable_confidence_head'" in msg and "load_deepspec_dspark" in msg
    # DeepSpec config claiming DFlash but carrying head tensors.
    cfg = deepspec_config(**DFLASH_FIELDS)
    save(tmp_path / "stray_heads", cfg, dspark_ref.tensors)
    msg = _error(load_deepspec_dflash, tmp_path / "stray_heads")
    assert "'confidence_head.proj.bias'" in msg and "load_deepspec_dspark" in msg
    # z-lab layout with DSpark tensors or DSpark config keys, ModelOpt's projector_type, speculators' dspark.
    ref = Reference(None, False)
    backbone = {k: v for k, v in ref.tensors.items() if not k.startswith(("embed_tokens", "lm_head"))}
    zlab_cfg = dict(target_config_dict(), block_size=4, num_target_layers=TARGET_LAYERS, num_hidden_layers=2,
                    layer_types=["full_attention"] * 2, dflash_config={"mask_token_id": MASK, "target_layer_ids": TAPS})
    save(tmp_path / "zlab_tensor", zlab_cfg, dict(backbone, **{"markov_w1.weight": torch.zeros(VOCAB, RANK)}))
    msg = _error(load_dflash, tmp_path / "zlab_tensor")
    assert "'markov_w1.weight'" in msg and "DSpark checkpoint" in msg and "load_dspark" in msg
    for extra in ({"markov_rank": RANK}, {"projector_type": "dspark"}):
        cfg = copy.deepcopy(zlab_cfg)
        cfg["dflash_config"].update(extra)
        save(tmp_path / "zlab_cfg", cfg, backbone)
        msg = _error(load_dflash, tmp_path / "zlab_cfg")
        assert f"'{next(iter(extra))}'" in msg and "DSpark checkpoint" in msg and "load_dspark" in msg
    spec_cfg = {"speculators_model_type": "dspark", "architectures": ["DSparkSpeculator"]}
    save(tmp_path / "speculators", spec_cfg, backbone)
    msg = _error(load_dflash, tmp_path / "speculators")
    assert "DSpark checkpoint" in msg and "load_dspark" in msg


def test_layouts_told_apart(tmp_path):
    # DeepSpec DFlash to the z-lab loader: refused (rows predict the next token), pointing to its loader.
    ref = Reference(None, False)
    save(tmp_path / "deepspec", ref.config, ref.tensors)
    assert "load_deepspec_dflash" in _error(load_dflash, tmp_path / "deepspec")
    # z-lab folder to the DeepSpec loaders: pointed back to load_dflash.
    zlab_cfg = dict(target_config_dict(), block_size=4, num_hidden_layers=2, layer_types=["full_attention"] * 2,
                    dflash_config={"mask_token_id": MASK, "target_layer_ids": TAPS})
    save(tmp_path / "zlab", zlab_cfg, {k: v for k, v in ref.tensors.items() if not k.startswith(("embed", "lm_head"))})
    assert "load_dflash" in _error(load_deepspec_dspark, tmp_path / "zlab")
    # Unsupported DeepSpec variants are named, not guessed.
    save(tmp_path / "gemma", dict(ref.config, architectures=["Gemma4DSparkModel"]), ref.tensors)
    assert "'Gemma4DSparkModel'" in _error(load_deepspec_dflash, tmp_path / "gemma")
    sliding = dict(ref.config, layer_types=["full_attention", "sliding_attention"], sliding_window=4)
    save(tmp_path / "sliding", sliding, ref.tensors)
    assert "'layer_types'" in _error(load_deepspec_dflash, tmp_path / "sliding")
