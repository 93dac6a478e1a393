"""DSpark on vLLM's V1 DFlash path, without an engine: the DFlashProposer hooks, the policy over engine
drafts, and the walk's per-request temperatures and draft_topk (plain objects; the real engine is in
integration_tests/test_vllm_dflash.py)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from spec_plugins.core import BatchDrafts, FixedLength
from spec_plugins.drafting import DraftingLayer, EngineDrafts
from spec_plugins.proposers.dspark import ConfidenceHead, MarkovHead, markov_walk
from spec_plugins.vllm import plugin


def proposer_class():
    """A stand-in for DFlashProposer: rows 1..K of each block of K + 1 are sampled, argmax per row."""

    class Proposer:
        _enable_probabilistic_draft_probs = True

        def __init__(self, model, k=3):
            self.model, self.k = model, k

        def set_inputs_first_pass(self, *, target_token_ids, next_token_ids, **rest):
            b = len(next_token_ids)
            indices = (torch.arange(b)[:, None] * (self.k + 1) + torch.arange(1, self.k + 1)).reshape(-1)
            return b * (self.k + 1), indices, "cad"

        def _sample_draft_tokens(self, hidden_states, sampling_metadata):
            return hidden_states.argmax(-1), None

    return Proposer


class Block(plugin.BlockDrafter):
    def __init__(self, anchor_rows):
        self.anchor_rows = anchor_rows
        self.anchors = None
        self.sampled = []

    def begin_block(self, next_token_ids):
        self.anchors = next_token_ids

    def sample_block(self, hidden_states, sampling_metadata, probabilistic):
        self.sampled.append(probabilistic)
        return torch.full((hidden_states.shape[0],), 7), "probs"


def test_block_hooks_shift_rows_and_walk_only_for_anchor_row_models():
    Proposer = proposer_class()
    orig_inputs, orig_sample = Proposer.set_inputs_first_pass, Proposer._sample_draft_tokens
    assert plugin.install_block_drafting(Proposer) and plugin.install_block_drafting(Proposer)  # idempotent
    assert Proposer.__dict__["_spec_plugins_orig_set_inputs_first_pass"] is orig_inputs
    assert Proposer.__dict__["_spec_plugins_orig__sample_draft_tokens"] is orig_sample
    assert Proposer.set_inputs_first_pass.__wrapped__ is orig_inputs

    dspark = Block(anchor_rows=True)
    p = Proposer(dspark)
    _, indices, _ = p.set_inputs_first_pass(target_token_ids=None, next_token_ids=torch.tensor([11, 12]))
    assert indices.tolist() == [0, 1, 2, 4, 5, 6]  # rows 0..K-1 of each block: the anchor predicts next
    assert dspark.anchors.tolist() == [11, 12]
    tokens, probs = p._sample_draft_tokens(torch.zeros(6, 5), None)
    assert tokens.tolist() == [7] * 6 and probs == "probs" and dspark.sampled == [True]

    for model in (Block(anchor_rows=False), SimpleNamespace()):  # vLLM's own DFlash and other models
        p = Proposer(model)
        _, indices, _ = p.set_inputs_first_pass(target_token_ids=None, next_token_ids=torch.tensor([11]))
        assert indices.tolist() == [1, 2, 3]
        hidden = torch.eye(5)[[1, 2, 3]]
        assert p._sample_draft_tokens(hidden, None)[0].tolist() == [1, 2, 3]


def test_block_drafting_patch_never_raises():
    class Broken:  # no DFlash methods at all
        pass

    assert plugin.install_block_drafting(Broken) is False


def test_engine_drafts_go_through_the_policy():
    given = EngineDrafts()
    layer = DraftingLayer(given, FixedLength(max_draft=2), who="draft model 'dspark'")
    ctx = np.arange(40).reshape(2, 20)
    given.give(BatchDrafts(np.array([1, 2, 3, 4, 5, 6]), np.array([0, 3, 6]), np.full(6, 0.5)))
    out = layer.step(["a", "b"], ctx, [10, 12], rows=np.array([0, 1]), max_draft=3)
    assert out.lists() == [[1, 2], [4, 5]] and out.confidence.tolist() == [0.5] * 4
    with pytest.raises(ValueError, match="expected 2 drafts handed over"):
        layer.step(["a", "b"], ctx, [11, 13], rows=np.array([0, 1]), max_draft=3)
    assert layer.finish("a") and not layer.finish("a")


def _heads(head_type="gated", vocab=11, d=6, rank=3):
    torch.manual_seed(0)
    return MarkovHead(vocab, rank, d, head_type), ConfidenceHead(d, rank)


def test_walk_takes_one_temperature_per_row():
    markov, conf = _heads()
    hidden, base = torch.randn(3, 4, 6), torch.randn(3, 4, 11) * 3
    anchor = torch.tensor([1, 2, 3])
    greedy = markov_walk(hidden, base, anchor, markov, conf, 0.0)
    mixed = markov_walk(hidden, base, anchor, markov, conf, torch.tensor([0.0, 0.8, 0.0]),
                        generator=torch.Generator().manual_seed(0))
    for row in (0, 2):  # greedy rows of a mixed batch: the greedy walk, with a one-hot proposal
        assert torch.equal(mixed.tokens[row], greedy.tokens[row])
        assert torch.equal(mixed.probs[row], greedy.probs[row])
    p = mixed.probs[1]
    assert torch.allclose(p.sum(-1), torch.ones(4)) and (p < 1).all()  # a real proposal for the sampled row
    assert torch.allclose(p, torch.softmax(mixed.logits[1] / 0.8, -1))
    with pytest.raises(ValueError, match="one value or one per row"):
        markov_walk(hidden, base, anchor, markov, conf, torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_draft_topk_keeps_the_walk_among_the_backbone_candidates(head_type):
    markov, conf = _heads(head_type)
    with torch.no_grad():
        markov.markov_w2.weight.mul_(50)  # the bias alone would pick outside the top-k
    hidden, base = torch.randn(2, 5, 6), torch.randn(2, 5, 11)
    walk = markov_walk(hidden, base, torch.tensor([4, 5]), markov, conf, 0.0, draft_topk=2)
    top = base.topk(2, dim=-1).indices
    assert (walk.tokens[..., None] == top).any(-1).all()
    assert torch.isinf(walk.logits).sum(-1).eq(11 - 2).all()
    full = markov_walk(hidden, base, torch.tensor([4, 5]), markov, conf, 0.0, draft_topk=11)
    plain = markov_walk(hidden, base, torch.tensor([4, 5]), markov, conf, 0.0)
    assert torch.equal(full.tokens, plain.tokens)


def test_register_maps_the_draft_architectures_inside_vllm():
    pytest.importorskip("vllm")
    code = """
import vllm
from spec_plugins.vllm import plugin
plugin._vllm_version = lambda: "0.32.0"
plugin.register()
from vllm.model_executor.models.registry import ModelRegistry
for arch, cls in plugin.DRAFTERS.items():
    entry = ModelRegistry.models[arch]
    assert (entry.module_name, entry.class_name) == ("spec_plugins.vllm.drafters", cls), (arch, entry)
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
