"""DSpark as a `Proposer`: the DFlash backbone with anchor-predicts-next rows, Markov head and confidences.

One request at a time per instance, with the same feature and cache handling as `DFlashProposer`.
"""

from __future__ import annotations

from typing import Callable

import torch

from spec_plugins.core import Draft, DraftRequest
from spec_plugins.proposers.dflash.model import DFlashDraftModel
from spec_plugins.proposers.dflash.proposer import _OneRequest
from spec_plugins.proposers.dspark.heads import ConfidenceHead, DSparkDrafter, MarkovHead


class DSparkProposer(_OneRequest):
    """Up to gamma (= the backbone's block_size) drafts a step, walked left to right through the Markov head.

    draft_topk: only the k best backbone candidates of a row get the Markov bias (vLLM's `dspark_draft_topk`).
    temperature 0: greedy drafts, `Draft.probs` None; temperature > 0: sampled drafts with their exact
    proposal in `Draft.probs`. `Draft.confidence` holds sigmoid(confidence logits) (after `calibrate`, e.g. a
    fitted SequentialTemperatureScaling, when given): draft k's value reads the tokens before it only.
    """

    def __init__(self, model: DFlashDraftModel, markov: MarkovHead | None = None,
                 confidence: ConfidenceHead | None = None, *, temperature: float = 0.0, seed: int = 0,
                 calibrate: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 draft_topk: int | None = None) -> None:
        super().__init__(temperature, seed)
        if draft_topk is not None and draft_topk < 1:
            raise ValueError(f"DSparkProposer: draft_topk must be >= 1, got {draft_topk}")
        self.draft_topk = draft_topk
        self.model = model.eval()
        self.markov = None if markov is None else markov.eval()
        self.confidence = None if confidence is None else confidence.eval()
        self.calibrate = calibrate
        self.target_taps = list(model.config.target_layer_ids)

    def _make_drafter(self, embed: torch.Tensor, lm_head: torch.Tensor) -> DSparkDrafter:
        return DSparkDrafter(self.model, embed, lm_head, self.markov, self.confidence)

    def _propose_one(self, req: DraftRequest) -> Draft:
        context = self._context(req)
        if req.max_draft == 0:
            self.drafter.extend(context)
            return Draft()
        anchor = torch.tensor([int(req.tokens[-1])], device=context.device)
        walk = self.drafter.propose_block(context, anchor, self.temperature, self.generator, self.draft_topk)
        n = min(req.max_draft, walk.tokens.shape[1])
        confidence = None
        if walk.confidence_logits is not None:
            logits = walk.confidence_logits[0, :n]
            conf = self.calibrate(logits) if self.calibrate is not None else torch.sigmoid(logits)
            confidence = [float(c) for c in conf]
        probs = None if self.temperature == 0 else walk.probs[0, :n].cpu().double()
        return Draft(walk.tokens[0, :n].tolist(), probs=probs, confidence=confidence)
