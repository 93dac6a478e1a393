"""The DSpark training objective on the DFlash backbone (anchor predicts next; see proposers/dflash/train.py).

Per anchored block [x_a, M, ..., M] of gamma rows, row k (0-based) predicts x_{a+k+1}. With teacher forcing
the Markov head's predecessor of row k is the data token x_{a+k} (row 0: the anchor), exactly what the
sequential walk sees when every earlier draft was accepted:

    logits_k = lm_head(h_k) + B_k(W1[x_{a+k}], h_k, state)        (heads.teacher_forced)
    p_d,k = softmax(logits_k),  p_t,k = softmax(target logits predicting x_{a+k+1})   (T = 1)

    L = ce_alpha * CE + tv_alpha * TV + confidence_alpha * BCE                (0.1 / 0.9 / 1.0, DeepSpec)

each a weighted mean over valid rows with w_k = exp(-k / gamma) (row 0 is the first draft):

- CE of logits_k against x_{a+k+1} (or the target's greedy token with label_source "target").
- TV = 1 - sum_v min(p_d, p_t) = 1/2 ||p_d - p_t||_1: one minus the rejection-sampling acceptance rate.
  (DeepSpec sums the full L1 norm, twice this; speculators uses this form.)
- Confidence c_k is P(draft k accepted | drafts < k accepted), so its label is conditional on the
  teacher-forced prefix: "tv" (default, DeepSpec / speculators): the soft label 1 - TV_k, detached, i.e. the
  acceptance probability under sampling; "greedy": 1 if argmax p_d,k equals the target's greedy token, the
  acceptance event at temperature 0. Prefix survival a_k = prod c_i then follows at inference. Training c_k
  on the prefix event itself would count earlier rejections twice in that product.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from spec_plugins.proposers.dflash.model import DFlashDraftModel
from spec_plugins.proposers.dflash.train import (
    AnchorBlocks,
    TargetFeatures,
    decay_weights,
    draft_hidden,
    target_logits_at,
    weighted_mean,
)
from spec_plugins.proposers.dspark.heads import ConfidenceHead, MarkovHead, teacher_forced

CONFIDENCE_LABELS = ("tv", "greedy")


def init_markov_(markov: MarkovHead) -> MarkovHead:
    """Small W1 (as speculators: std 0.01), so the bigram bias starts near zero and the backbone leads."""
    with torch.no_grad():
        markov.markov_w1.weight.normal_(0.0, 0.01)
    return markov


class DSparkObjective:
    kind = "dspark"
    anchor_predicts_next = True

    def __init__(self, model: DFlashDraftModel, markov: MarkovHead | None, confidence: ConfidenceHead | None,
                 embed_weight: Tensor, lm_head_weight: Tensor, *, gamma: float = 4.0, ce_alpha: float = 0.1,
                 tv_alpha: float = 0.9, confidence_alpha: float = 1.0, confidence_label: str = "tv",
                 label_source: str = "data") -> None:
        if confidence_label not in CONFIDENCE_LABELS:
            raise ValueError(f"confidence_label: expected one of {CONFIDENCE_LABELS}, got {confidence_label!r}")
        if label_source not in ("data", "target"):
            raise ValueError(f"label_source: expected 'data' or 'target', got {label_source!r}")
        if confidence is not None and confidence.with_markov and markov is None:
            raise ValueError("DSparkObjective: a confidence head that reads the Markov embedding needs a Markov head")
        self.model, self.markov, self.confidence = model, markov, confidence
        self.embed_weight, self.lm_head_weight = embed_weight, lm_head_weight
        self.gamma, self.ce_alpha, self.tv_alpha, self.confidence_alpha = gamma, ce_alpha, tv_alpha, confidence_alpha
        self.confidence_label, self.label_source = confidence_label, label_source

    def parameters(self) -> list[torch.nn.Parameter]:
        params = list(self.model.parameters())
        for head in (self.markov, self.confidence):
            if head is not None:
                params += list(head.parameters())
        return params

    def block_outputs(self, features: TargetFeatures, blocks: AnchorBlocks) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced (logits [b, n, g, V] fp32, confidence logits [b, n, g] or None)."""
        hidden = draft_hidden(self.model, features, blocks, self.embed_weight)
        b, n, g, d = hidden.shape
        base = self.model.logits(hidden, self.lm_head_weight.to(hidden.dtype))
        # Predecessor of row k = the data token at the row's own position a + k: the anchor for row 0, else
        # row k - 1's label (clamped labels past the sequence end only feed rows that are not trained).
        prev = torch.cat([blocks.block_ids[..., :1], blocks.labels[..., :-1]], dim=-1)
        logits, conf = teacher_forced(hidden.reshape(b * n, g, d), base.reshape(b * n, g, -1), prev.reshape(b * n, g),
                                      self.markov, self.confidence)
        return logits.view(b, n, g, -1), None if conf is None else conf.view(b, n, g)

    def loss(self, target: Any, features: TargetFeatures, blocks: AnchorBlocks) -> tuple[Tensor, dict[str, float]]:
        logits, conf_logits = self.block_outputs(features, blocks)
        target_logits = target_logits_at(target, features, blocks.label_pos)
        labels = blocks.labels if self.label_source == "data" else target_logits.argmax(-1)
        w = decay_weights(logits.shape[2], self.gamma, True, logits.device) * blocks.valid

        ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view_as(labels)
        tv = 1.0 - torch.minimum(logits.softmax(-1), target_logits.softmax(-1)).sum(-1)
        loss_ce, loss_tv = weighted_mean(ce, w), weighted_mean(tv, w)
        loss = self.ce_alpha * loss_ce + self.tv_alpha * loss_tv
        info = {"ce": loss_ce.item(), "tv": loss_tv.item()}
        if conf_logits is not None:
            if self.confidence_label == "tv":
                label = (1.0 - tv).detach()
            else:
                label = (logits.argmax(-1) == target_logits.argmax(-1)).float()
            bce = F.binary_cross_entropy_with_logits(conf_logits.float(), label, reduction="none")
            loss_conf = weighted_mean(bce, w)
            loss = loss + self.confidence_alpha * loss_conf
            info["confidence_bce"] = loss_conf.item()
        with torch.no_grad():
            valid = blocks.valid.float()
            info["acc"] = weighted_mean((logits.argmax(-1) == labels).float(), valid).item()
            info["accept"] = weighted_mean(1.0 - tv, valid).item()
        return loss, info
