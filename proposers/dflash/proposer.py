"""DFlash as a `Proposer`: drafts a block from the target's tapped hidden states (reference engine style).

One request at a time per instance (one draft cache; a second request id is refused until the first
finishes). The engine passes, in `DraftRequest.features`, the tap features of the committed positions it
has not passed before (accepted rows only), so the draft cache grows with committed context alone and
always ends one short of the committed length: the newest token enters the block as its bonus embedding.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from spec_plugins.core import Draft, DraftRequest
from spec_plugins.proposers.dflash.model import DFlashDrafter, DFlashDraftModel


def target_embed_and_head(target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The (shared) input embedding and LM head weights of a HF causal LM."""
    return target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()


class _OneRequest:
    """Shared bookkeeping: one drafter, the request it serves, and the `load(target)` hook."""

    def __init__(self, temperature: float, seed: int) -> None:
        if temperature < 0:
            raise ValueError(f"temperature: expected >= 0, got {temperature}")
        self.temperature = float(temperature)
        self.generator = torch.Generator().manual_seed(seed)
        self.drafter: DFlashDrafter | None = None
        self.req_id: Any = None

    def load(self, target: Any) -> None:
        """Take the target's embedding and LM head (a HF causal LM); required before `propose`."""
        self.drafter = self._make_drafter(*target_embed_and_head(target))

    def _make_drafter(self, embed: torch.Tensor, lm_head: torch.Tensor) -> DFlashDrafter:
        raise NotImplementedError

    @torch.no_grad()
    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [self._propose_one(req) for req in requests]

    def _propose_one(self, req: DraftRequest) -> Draft:
        raise NotImplementedError

    def _context(self, req: DraftRequest) -> torch.Tensor:
        """Consume the request's new features; afterwards the cache ends at the newest token's position."""
        if self.drafter is None:
            raise RuntimeError(f"{type(self).__name__}: call load(target) before propose")
        if self.req_id is None:
            self.req_id = req.req_id
            self.drafter.reset()
        elif req.req_id != self.req_id:
            raise ValueError(f"{type(self).__name__}: serves one request at a time ({self.req_id!r} is active)")
        features = req.features
        if features is None:
            raise ValueError(f"{type(self).__name__}: request {req.req_id!r} carries no target features")
        model = self.drafter.model
        context = torch.as_tensor(features).to(model.fc.weight.dtype).reshape(1, -1, model.fc.in_features)
        if self.drafter.length + context.shape[1] != len(req.tokens) - 1:
            raise ValueError(
                f"{type(self).__name__}: cache holds {self.drafter.length} positions plus {context.shape[1]} new "
                f"features, but the context has {len(req.tokens)} tokens (expected one more than the features)"
            )
        return context

    def finish(self, req_id: Any) -> None:
        if req_id == self.req_id:
            self.req_id = None
            if self.drafter is not None:
                self.drafter.reset()


class DFlashProposer(_OneRequest):
    """Block drafts from a DFlash draft model: up to block_size - 1 tokens a step.

    temperature 0: greedy drafts, `Draft.probs` None (one-hot). temperature > 0: each row is sampled from
    softmax(logits / temperature) and reported in `Draft.probs`. The rows of a block do not depend on one
    another's tokens, so independent draws are an exact proposal for rejection sampling.
    """

    def __init__(self, model: DFlashDraftModel, *, temperature: float = 0.0, seed: int = 0) -> None:
        super().__init__(temperature, seed)
        self.model = model.eval()
        self.target_taps = list(model.config.target_layer_ids)

    def _make_drafter(self, embed: torch.Tensor, lm_head: torch.Tensor) -> DFlashDrafter:
        return DFlashDrafter(self.model, embed, lm_head)

    def _propose_one(self, req: DraftRequest) -> Draft:
        context = self._context(req)
        if req.max_draft == 0:
            self.drafter.extend(context)
            return Draft()
        bonus = torch.tensor([int(req.tokens[-1])], device=context.device)
        greedy, probs = self.drafter.propose_block(context, bonus, temperature=self.temperature)
        n = min(req.max_draft, greedy.shape[1])
        if self.temperature == 0:
            return Draft(greedy[0, :n].tolist())
        probs = probs[0, :n].cpu().double()
        tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        return Draft(tokens.tolist(), probs=probs)
