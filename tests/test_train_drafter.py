"""`spec-plugins train-drafter` end to end on a tiny random Qwen3 target, plus the training pieces.

- The training forward (all anchored blocks at once under a mask) equals the inference forward per block.
- A few dozen CPU steps on repetitive text lower the loss; the speculators-format checkpoint reloads with our
  loaders and drafts losslessly through the reference engine (greedy output == the target's greedy output).
- Writer round trips: speculators' own DFlash / DSpark classes load what we write (same tensors), and our
  `load_dspark` loads what speculators writes; `load_dflash` refuses a DSpark checkpoint.
- Bad input: one-line ValueErrors from the CLI and from `load_dspark`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402

from spec_plugins.tiny_models import build_tiny_model  # noqa: E402
from spec_plugins.proposers.dflash import DFlashConfig, DFlashDraftModel, DFlashProposer, load_dflash  # noqa: E402
from spec_plugins.proposers.dflash.export import save_speculators, speculators_tensor_name  # noqa: E402
from spec_plugins.proposers.dflash.train import (  # noqa: E402
    Batch,
    draft_hidden,
    extract_features,
    make_blocks,
    sample_anchors,
)
from spec_plugins.proposers.dspark import ConfidenceHead, DSparkProposer, MarkovHead  # noqa: E402
from spec_plugins.proposers.dspark.loader import load_dspark  # noqa: E402
from spec_plugins.reference import HFTarget, generate  # noqa: E402
from spec_plugins.training import add_train_parser  # noqa: E402
from drafter_weights import edited_checkpoint, randomize_  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGET_LAYERS, HIDDEN = 4, 64
WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


def _parser():
    parser = argparse.ArgumentParser(prog="spec-plugins")
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def run_cli(*argv):
    args = _parser().parse_args(["train-drafter", *map(str, argv)])
    return args.func(args)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """A tiny random Qwen3 with its 512-token BPE tokenizer. Its embedding and LM head are redrawn at the scale
    of a trained model (HF's std-0.02 init gives logits ~0.2 that a frozen shared head cannot sharpen fast)."""
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path_factory.mktemp("target") / "tiny-qwen3", arch="qwen3", num_layers=TARGET_LAYERS,
                              hidden_size=HIDDEN, intermediate_size=128)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
        model.get_output_embeddings().weight.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def target(target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """Cyclic word sequences (easy to learn) plus prompt/response rows (labels on the response only)."""
    rows = []
    for start in range(len(WORDS)):
        cycle = WORDS[start:] + WORDS[:start]
        rows.append({"text": " ".join(cycle * 4)})
        rows.append({"prompt": "list the words: ", "response": " ".join(cycle * 3)})
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


COMMON = ("--steps", 40, "--batch-size", 4, "--seq-len", 64, "--anchors", 8, "--lr", 1e-2, "--layers", 1,
          "--quiet", "--seed", 0)


@pytest.fixture(scope="module")
def dflash_run(target_dir, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash") / "ckpt"
    log = run_cli("--target", target_dir, "--kind", "dflash", "--data", data_file, "--out", out, "--block-size", 6,
                  "--taps", "0,2", *COMMON)
    return out, log


@pytest.fixture(scope="module")
def dspark_run(target_dir, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("dspark") / "ckpt"
    log = run_cli("--target", target_dir, "--kind", "dspark", "--data", data_file, "--out", out, "--block-size", 5,
                  "--markov-head", "gated", "--markov-rank", 8, *COMMON)
    return out, log


@pytest.mark.parametrize("kind, extra", [("dflash", ("--block-size", 6, "--taps", "0,2")),
                                         ("dspark", ("--block-size", 5, "--markov-head", "gated", "--markov-rank", 8))])
def test_cached_features_train_exactly_like_live_ones(kind, extra, target_dir, data_file, tmp_path):
    # Same seed, same rows and anchors: the cache only moves when the target runs, not what it computes.
    args = ("--target", target_dir, "--kind", kind, "--data", data_file, *extra, *COMMON[:1], 6, *COMMON[2:])
    live = run_cli(*args, "--out", tmp_path / "live")
    cached = run_cli(*args, "--out", tmp_path / "cached", "--cache-features")
    assert len(live["losses"]) == 6
    assert cached["losses"] == pytest.approx(live["losses"], rel=1e-5, abs=1e-6)


# ------------------------------------------------------------------------------------------ training forward


def _backbone(block_size, causal=False, seed=0):
    raw = {"model_type": "qwen3", "hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512,
           "block_size": block_size, "num_target_layers": TARGET_LAYERS,
           "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 2]}}
    if causal:
        raw["is_causal"] = True
    torch.manual_seed(seed)
    model = randomize_(DFlashDraftModel(DFlashConfig.from_dict(raw)).eval())
    return model


@pytest.mark.parametrize("causal", [False, True])
@torch.no_grad()
def test_training_forward_equals_inference_forward(target, causal):
    model = _backbone(4, causal)
    embed = target.get_input_embeddings().weight
    ids = torch.randint(4, 500, (2, 24), generator=torch.Generator().manual_seed(1))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool))
    features = extract_features(target, batch, [0, 2])
    for anchors in (torch.tensor([[7], [13]]), torch.tensor([[1, 6, 11, 19], [2, 3, 9, 18]])):
        valid = torch.ones_like(anchors, dtype=torch.bool)
        blocks = make_blocks(batch, anchors, valid, block_size=4, mask_token_id=3, anchor_predicts_next=False)
        rows = draft_hidden(model, features, blocks, embed)
        for b in range(2):
            for j, a in enumerate(anchors[b].tolist()):
                ref = model(features.taps[b:b + 1, :a], model.embed_block(blocks.block_ids[b:b + 1, j], embed))
                assert (ref[0] - rows[b, j]).abs().max() < 1e-5


def test_blocks_and_anchors_follow_the_layouts():
    ids = torch.arange(100, 112)[None]
    mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)  # response = positions 5..10
    batch = Batch(ids, torch.ones_like(ids), mask)
    anchors, valid = sample_anchors(mask, 10, torch.Generator().manual_seed(0))
    # First label x_{a+1} must be a response token: a in 4..9; fewer candidates than anchors -> padding.
    assert anchors[valid].tolist() == [4, 5, 6, 7, 8, 9] and valid.sum() == 6
    a = torch.tensor([[4, 8]])
    ok = torch.ones_like(a, dtype=torch.bool)
    dflash = make_blocks(batch, a, ok, block_size=4, mask_token_id=1, anchor_predicts_next=False)
    assert dflash.block_ids.tolist() == [[[104, 1, 1, 1], [108, 1, 1, 1]]]
    assert dflash.labels[0, 0, 1:].tolist() == [105, 106, 107]            # row k predicts x_{a+k}
    assert dflash.valid.tolist() == [[[False, True, True, True], [False, True, True, False]]]  # 11 is masked
    dspark = make_blocks(batch, a, ok, block_size=4, mask_token_id=1, anchor_predicts_next=True)
    assert dspark.labels[0, 0].tolist() == [105, 106, 107, 108]           # row k predicts x_{a+k+1}
    assert dspark.valid.tolist() == [[[True, True, True, True], [True, True, False, False]]]


# ------------------------------------------------------------------------------------------ end to end


def _hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _prompts(target_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    return [tok(" ".join(WORDS * 2))["input_ids"], tok("list the words: gamma delta")["input_ids"]]


def _first_last(values):
    return sum(values[:10]) / 10, sum(values[-10:]) / 10


def _assert_learned(log, ratio):
    first, last = _first_last(log["losses"])
    print(f"{log['kind']}: loss {first:.3f} -> {last:.3f}, {1000 * log['seconds_per_step']:.1f} ms/step")
    assert last < ratio * first
    # The CE part alone (DSpark weighs it 0.1 next to TV against a random target's distribution).
    first_ce, last_ce = _first_last([m["ce"] for m in log["metrics"]])
    assert last_ce < 0.7 * first_ce


def test_dflash_trains_and_drafts_losslessly(dflash_run, target, target_dir):
    out, log = dflash_run
    _assert_learned(log, 0.5)
    assert json.loads((out / "training.json").read_text())["losses"] == log["losses"]
    model = load_dflash(out, num_target_layers=TARGET_LAYERS, target_hidden_size=HIDDEN)
    assert model.config.target_layer_ids == (0, 2) and model.config.block_size == 6
    for prompt in _prompts(target_dir):
        proposer = DFlashProposer(model)
        proposer.load(target)
        result = generate(HFTarget(target), proposer, prompt, 30, max_draft=5)
        assert result.tokens == _hf_greedy(target, prompt, 30)
        assert sum(s.drafted for s in result.steps) > 0


def test_dspark_trains_and_drafts_losslessly(dspark_run, target, target_dir):
    out, log = dspark_run
    _assert_learned(log, 0.9)
    assert {"ce", "tv", "confidence_bce"} <= set(log["metrics"][-1])
    model, markov, confidence = load_dspark(out, num_target_layers=TARGET_LAYERS)
    assert markov is not None and markov.head_type == "gated" and markov.rank == 8
    assert confidence is not None and confidence.with_markov
    assert model.config.block_size == 5 and model.config.target_layer_ids == (2,)  # default tap: one draft layer, 4 target layers
    for prompt in _prompts(target_dir):
        proposer = DSparkProposer(model, markov, confidence)
        proposer.load(target)
        seen = []
        propose = proposer.propose

        def checked(requests):
            drafts = propose(requests)
            seen.extend(drafts)
            return drafts

        proposer.propose = checked
        result = generate(HFTarget(target), proposer, prompt, 30, max_draft=5)
        assert result.tokens == _hf_greedy(target, prompt, 30)
        confidences = [c for d in seen for c in (d.confidence or [])]
        assert confidences and all(0.0 <= c <= 1.0 for c in confidences)
        assert all(d.confidence is not None and len(d.confidence) == len(d.tokens) for d in seen if d.tokens)


# ------------------------------------------------------------------------------------------ round trips


def _speculators():
    """speculators' package imports its data pipeline's optional deps; stand in for them for the import only."""
    added = []
    for name, attrs in {"datasets": ("load_from_disk",), "hs_connectors": ("FileTransfer", "HiddenStatesTransfer")}.items():
        if importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            for attr in attrs:
                setattr(module, attr, type(attr, (), {}))
            sys.modules[name] = module
            added.append(name)
    try:
        pytest.importorskip("speculators", reason="pip install --no-deps speculators==0.9.0")
        from speculators.models.dflash import DFlashDraftModel as SpecDFlash
        from speculators.models.dspark import DSparkDraftModel as SpecDSpark
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return SpecDFlash, SpecDSpark


def _dspark_parts(head_type="rnn", rank=8, with_markov_conf=True):
    model = _backbone(5, seed=3)
    torch.manual_seed(4)
    markov = MarkovHead(512, rank, HIDDEN, head_type)
    confidence = ConfidenceHead(HIDDEN, rank if with_markov_conf else 0)
    return model, markov, confidence


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_speculators_loads_what_we_write(kind, target, target_dir, tmp_path):
    SpecDFlash, SpecDSpark = _speculators()
    if kind == "dflash":
        model, markov, confidence = _backbone(6, seed=2), None, None
    else:
        model, markov, confidence = _dspark_parts()
    out = save_speculators(tmp_path / "ckpt", model, markov=markov, confidence=confidence, target_config=target.config,
                           kind=kind, verifier_name_or_path=str(target_dir))
    theirs = (SpecDFlash if kind == "dflash" else SpecDSpark).from_pretrained(str(out))
    assert theirs.config.speculators_model_type == kind
    assert theirs.config.aux_hidden_state_layer_ids == [t + 1 for t in model.config.target_layer_ids]
    assert theirs.config.sample_from_anchor == (kind == "dspark")
    state = theirs.state_dict()
    ours = {speculators_tensor_name(k): v for k, v in model.state_dict().items()}
    for prefix, head in (("markov_head.", markov), ("confidence_head.", confidence)):
        if head is not None:
            ours.update({prefix + k: v for k, v in head.state_dict().items()})
    for name, tensor in ours.items():
        assert torch.equal(state[name], tensor), name
    # ... and our own loaders read it back identically.
    if kind == "dflash":
        back = load_dflash(out, num_target_layers=TARGET_LAYERS)
    else:
        back, back_markov, back_conf = load_dspark(out, num_target_layers=TARGET_LAYERS)
        assert back_markov.head_type == "rnn" and torch.equal(back_conf.proj.weight, confidence.proj.weight)
        for k, v in markov.state_dict().items():
            assert torch.equal(back_markov.state_dict()[k], v)
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)


@pytest.fixture(scope="module")
def speculators_dspark_ckpt(target_dir, tmp_path_factory):
    """A DSpark checkpoint written by speculators itself (gated head, confidence with the Markov embedding)."""
    _, SpecDSpark = _speculators()
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dspark import DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    config = DSparkSpeculatorConfig(
        transformer_layer_config={"model_type": "qwen3", "vocab_size": 512, "hidden_size": HIDDEN, "intermediate_size": 96,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
        draft_vocab_size=512, block_size=7, mask_token_id=3, aux_hidden_state_layer_ids=[1, 3], markov_rank=8,
        markov_head_type="gated",
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=7)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(target_dir), architectures=["Qwen3ForCausalLM"])),
    )
    config.transformer_layer_config._attn_implementation = "eager"
    torch.manual_seed(5)
    folder = tmp_path_factory.mktemp("spec_dspark") / "ckpt"
    SpecDSpark(config).save_pretrained(str(folder))
    return folder


def test_load_dspark_reads_speculators_checkpoint(speculators_dspark_ckpt):
    model, markov, confidence = load_dspark(speculators_dspark_ckpt, num_target_layers=TARGET_LAYERS)
    assert model.config.target_layer_ids == (0, 2) and model.config.block_size == 7 and model.config.mask_token_id == 3
    assert markov.head_type == "gated" and markov.rank == 8 and confidence.with_markov
    saved = load_file(str(speculators_dspark_ckpt / "model.safetensors"))
    for name, value in model.state_dict().items():
        assert torch.equal(saved[speculators_tensor_name(name)], value)
    assert torch.equal(saved["markov_head.gate_proj.weight"], markov.gate_proj.weight)
    assert torch.equal(saved["confidence_head.proj.bias"], confidence.proj.bias)


def test_load_dflash_refuses_a_dspark_checkpoint(speculators_dspark_ckpt):
    with pytest.raises(ValueError, match="'dspark' marks a DSpark checkpoint, not DFlash"):
        load_dflash(speculators_dspark_ckpt)


# ------------------------------------------------------------------------------------------ bad input


BAD_DSPARK = {
    "dflash_checkpoint": (lambda r: r.update(speculators_model_type="dflash"), None, "'dflash' marks a DFlash checkpoint, not DSpark"),
    "no_markov_rank": (lambda r: r.pop("markov_rank"), None, "missing field 'markov_rank'"),
    "unknown_head": (lambda r: r.update(markov_head_type="lstm"), None, "unknown head type 'lstm'"),
    "no_mask_token": (lambda r: r.pop("mask_token_id"), None, "DSpark config: missing field 'mask_token_id'"),
    "bonus_layout": (lambda r: r.update(sample_from_anchor=False), None, "'sample_from_anchor': false"),
    "rank_mismatch": (lambda r: r.update(markov_rank=16), None, "tensor 'markov_head.gate_proj.bias' has shape [8], config implies [16]"),
    "fc_shape": (lambda r: r.update(aux_hidden_state_layer_ids=[1, 2, 3]), None, "has shape [64, 128], config implies [64, 192]"),
    "missing_conf": (None, lambda t: t.pop("confidence_head.proj.bias"), "missing tensor(s) ['confidence_head.proj.bias']"),
    "wrong_head_tensor": (lambda r: r.update(markov_head_type="vanilla"), None, "unexpected tensor 'markov_head.gate_proj"),
}


@pytest.mark.parametrize("case", sorted(BAD_DSPARK))
def test_load_dspark_errors(speculators_dspark_ckpt, tmp_path, case):
    config, tensors, message = BAD_DSPARK[case]
    folder = edited_checkpoint(speculators_dspark_ckpt, tmp_path / "bad", config, tensors)
    with pytest.raises(ValueError, match="^DSpark (config|checkpoint)") as info:
        load_dspark(folder, num_target_layers=TARGET_LAYERS)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_load_dspark_errors_on_non_speculators_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ValueError, match="not a speculators checkpoint"):
        load_dspark(tmp_path)
    with pytest.raises(ValueError, match="^DSpark config: no config.json"):
        load_dspark(tmp_path / "missing")


@pytest.mark.parametrize("extra, message", [
    (("--kind", "eagle"), "--kind: expected one of dflash, dspark, got 'eagle'"),
    (("--block-size", 1), "--block-size: expected >= 2, got 1"),
    (("--taps", "0,3"), "--taps: layer id 3 out of range [0, 2]"),
    (("--taps", "a,b"), "--taps: expected comma-separated integers"),
    (("--data", "MISSING"), "--data: no such file"),
    (("--target", "MISSING"), "--target: MISSING is not a local HF model folder"),
    (("--steps", 0), "--steps: expected an integer >= 1"),
])
def test_cli_bad_input(target_dir, data_file, tmp_path, extra, message):
    args = {"--target": target_dir, "--data": data_file, "--out": tmp_path / "out", "--steps": 1}
    flags = []
    for i in range(0, len(extra), 2):
        args[extra[i]] = extra[i + 1]
    for k, v in args.items():
        flags += [k, v]
    with pytest.raises(ValueError) as info:
        run_cli(*flags, "--quiet")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_cli_bad_data_rows(target_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"question": "no text"}\n')
    with pytest.raises(ValueError, match="line 2: expected a 'text' string"):
        run_cli("--target", target_dir, "--data", bad, "--out", tmp_path / "out", "--quiet")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="expected a .jsonl or .txt file"):
        run_cli("--target", target_dir, "--data", tmp_path / "data.csv", "--out", tmp_path / "out", "--quiet")
