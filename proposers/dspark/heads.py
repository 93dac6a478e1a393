"""DSpark heads on the DFlash backbone (DeepSeek's DSpark; speculators' `dspark` model for tensor names).

Layout (anchor predicts next): the query block is [anchor, mask * (gamma - 1)] as in DFlash, but *every* row
drafts, row k predicting the token after its own position, so gamma rows give gamma drafts (DFlash: B rows,
B - 1 drafts). Getting this wrong shifts every proposal by one.

Rows are numbered k = 1..gamma below, x_0 = anchor (the last committed token), x_k = draft k:

    U_k        = lm_head(h_k)                          backbone logits of row k (h_k final-normed)
    e_k        = W1[x_{k-1}]                           embedding of the predecessor (row 1: the anchor)
    logits_k   = U_k + B_k(e_k, h_k, state)            Markov (sequential) head: rank-r bias
    c_k        = sigmoid(w . [h_k; e_k] + b)           confidence: P(draft k survives | drafts < k accepted)
    a_k        = prod_{i <= k} c_i                     prefix survival

Drafting is left to right: x_k is greedy/sampled from logits_k, then becomes the predecessor of row k + 1.
Each step's proposal is an exact softmax, so rejection sampling against the target stays lossless.
Note c_k reads e_k = W1[x_{k-1}] but never x_k: the confidence of draft k is known before draft k is
drawn (non-anticipation, which a causal verify-length scheduler relies on).
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from spec_plugins.proposers.dflash.model import DFlashDrafter

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
_GREEDY_EPS = 1e-5  # vLLM's sampler treats temperatures below this as greedy


class MarkovHead(nn.Module):
    """Sequential logit bias B_k, rank r. Tensor names follow speculators / DeepSpec:
    `markov_w1` (Embedding [V_target, r]), `markov_w2` (Linear r -> V_draft, no bias),
    `gate_proj` (gated: d + r -> r), `joint_proj` (rnn: 2r + d -> 3r).

    vanilla: B = W2 e                      a rank-r bigram table; cheapest (one gather + one r x V GEMV)
    gated:   B = W2 (sigmoid(G [h; e]) * e)  the backbone row decides how much of the bigram to trust
    rnn:     s_k = g * s_{k-1} + (1 - g) * tanh(c), B = W2 tanh(o), [g, c, o] = J [s_{k-1}; e; h]
             with g = sigmoid(.), s_0 = 0: memory of the whole drafted prefix, not just the last token
    """

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, head_type: str = "vanilla",
                 draft_vocab_size: int | None = None) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"MarkovHead: markov_rank must be > 0 (0 means plain DFlash, no head), got {rank}")
        if head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"MarkovHead: markov_head_type {head_type!r} not in {MARKOV_HEAD_TYPES}")
        self.head_type, self.rank = head_type, rank
        # W1 is indexed by the previous token in the *target* vocabulary (that is what gets committed);
        # W2 writes onto the draft logits (draft vocabulary, equal to the target's without a d2t map).
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size or vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def prev_embedding(self, prev_tokens: Tensor) -> Tensor:
        """e = W1[prev]; shared with the confidence head."""
        return self.markov_w1(prev_tokens.long())

    def initial_state(self, batch: int, like: Tensor) -> Tensor | None:
        return like.new_zeros(batch, self.rank) if self.head_type == "rnn" else None

    def step(self, hidden: Tensor, prev_emb: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One row: hidden [b, d], prev_emb [b, r] -> (bias [b, V], next state). The only function that
        knows the variants; both the sequential walk and the teacher-forced block use it, so they agree."""
        if self.head_type == "vanilla":
            return self.markov_w2(prev_emb), state
        if self.head_type == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, prev_emb], dim=-1)))
            return self.markov_w2(gate * prev_emb), state
        g, c, o = self.joint_proj(torch.cat([state, prev_emb, hidden], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        state = g * state + (1.0 - g) * torch.tanh(c)
        return self.markov_w2(torch.tanh(o)), state

    def block_bias(self, hidden: Tensor, prev_tokens: Tensor) -> Tensor:
        """Teacher-forced bias for a whole block: hidden [b, g, d], prev_tokens [b, g] -> [b, g, V]
        (training-style; prev_tokens = [anchor, x_1 .. x_{g-1}])."""
        prev_emb = self.prev_embedding(prev_tokens)
        state = self.initial_state(hidden.shape[0], prev_emb)
        out = []
        for k in range(hidden.shape[1]):
            bias, state = self.step(hidden[:, k], prev_emb[:, k], state)
            out.append(bias)
        return torch.stack(out, dim=1)


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(proj([h_k; W1[x_{k-1}]])) as a logit (sigmoid and calibration are the caller's).
    `proj` is Linear(d + r, 1) with bias, or Linear(d, 1) when trained without the Markov embedding."""

    def __init__(self, hidden_size: int, rank: int = 0) -> None:
        super().__init__()
        self.with_markov = rank > 0
        self.proj = nn.Linear(hidden_size + rank, 1)

    def forward(self, hidden: Tensor, prev_emb: Tensor | None) -> Tensor:
        if self.with_markov:
            if prev_emb is None:
                raise ValueError("ConfidenceHead: trained with the Markov embedding, but none was given")
            hidden = torch.cat([hidden, prev_emb.to(hidden.dtype)], dim=-1)
        return self.proj(hidden).squeeze(-1)


def prefix_survival(confidence: Tensor) -> Tensor:
    """a_k = prod_{i <= k} c_i along the last axis: P(drafts 1..k all accepted) if c is calibrated."""
    return torch.cumprod(confidence, dim=-1)


@dataclasses.dataclass
class WalkResult:
    tokens: Tensor                    # [b, g] drafted tokens
    logits: Tensor                    # [b, g, V] fp32 logits each token was drawn from (backbone + bias)
    probs: Tensor                     # [b, g, V] the proposal q (softmax(logits / T); one-hot when greedy)
    confidence_logits: Tensor | None  # [b, g] raw confidence logits (apply STS to these), or None


def add_bias(logits: Tensor, bias: Tensor, draft_topk: int | None) -> Tensor:
    """fp32 backbone logits [..., V] plus the Markov bias; with draft_topk (< V) only the k best backbone
    candidates of each row get it and the rest are impossible (-inf)."""
    if draft_topk is None or draft_topk >= logits.shape[-1]:
        return logits + bias.float()
    keep = logits.topk(draft_topk, dim=-1).indices
    return logits.new_full(logits.shape, float("-inf")).scatter_(
        -1, keep, logits.gather(-1, keep) + bias.float().gather(-1, keep))


def markov_walk(hidden: Tensor, base_logits: Tensor, anchor: Tensor, markov: MarkovHead | None,
                confidence: ConfidenceHead | None = None, temperature: float | Tensor = 0.0,
                generator: torch.Generator | None = None, draft_topk: int | None = None) -> WalkResult:
    """Turn backbone rows into drafts, left to right.

    hidden [b, g, d] final-normed backbone rows; base_logits [b, g, V] = lm_head(hidden); anchor [b] the
    last committed token (row 0's predecessor). temperature: one for all rows or one per row [b]; <= 0 (below
    1e-5, as vLLM's sampler) drafts greedily, otherwise x_k ~ softmax(logits/T) drawn with `generator`.
    draft_topk: only the k best backbone candidates of each row get the Markov bias; the rest are impossible
    (vLLM's `dspark_draft_topk`). Without a Markov head this is plain DFlash with anchor-predicts-next rows.
    """
    if markov is not None and markov.markov_w2.out_features != markov.markov_w1.num_embeddings:
        # Drafted ids would index W1 in the draft vocabulary; a d2t map to target ids is not wired yet.
        raise NotImplementedError("markov_walk: reduced draft vocabularies (d2t) are not supported yet")
    b, g, vocab = base_logits.shape
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=base_logits.device).reshape(-1)
    if temps.numel() == 1:
        temps = temps.expand(b)
    if temps.shape != (b,):
        raise ValueError(f"markov_walk: temperature must be one value or one per row ({b}), got {tuple(temps.shape)}")
    greedy = temps < _GREEDY_EPS
    all_greedy = bool(greedy.all())
    scale = torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    prev = anchor.long()
    state = markov.initial_state(b, hidden) if markov is not None else None
    tokens, logits_out, probs_out, conf_out = [], [], [], []
    for k in range(g):
        prev_emb = markov.prev_embedding(prev) if markov is not None else None
        logits = base_logits[:, k].float()
        if markov is not None:
            bias, state = markov.step(hidden[:, k], prev_emb, state)
            logits = add_bias(logits, bias, draft_topk)
        # The confidence reads only x_{k-1} (prev), before x_k is drawn below.
        if confidence is not None:
            conf_out.append(confidence(hidden[:, k], prev_emb).float())
        if all_greedy:
            token = logits.argmax(dim=-1)
            probs = F.one_hot(token, vocab).float()
        else:
            probs = torch.softmax(logits / scale, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            if greedy.any():  # greedy rows of a mixed batch: the argmax, drawn with certainty
                top = logits.argmax(dim=-1)
                token = torch.where(greedy, top, token)
                probs = torch.where(greedy[:, None], F.one_hot(top, vocab).float(), probs)
        tokens.append(token)
        logits_out.append(logits)
        probs_out.append(probs)
        prev = token
    return WalkResult(
        tokens=torch.stack(tokens, dim=1),
        logits=torch.stack(logits_out, dim=1),
        probs=torch.stack(probs_out, dim=1),
        confidence_logits=torch.stack(conf_out, dim=1) if conf_out else None,
    )


FUSED_WALK_ENV = "SPEC_PLUGINS_FUSED_WALK"  # =0: greedy blocks on CUDA take the torch walk, not the fused kernel


def walk_block(hidden: Tensor, base_logits: Tensor, anchor: Tensor, markov: MarkovHead | None,
               confidence: ConfidenceHead | None = None, temperature: float | Tensor = 0.0,
               generator: torch.Generator | None = None, draft_topk: int | None = None,
               fused: bool | None = None) -> WalkResult:
    """`markov_walk`, or for a greedy block where the fused kernel runs (`kernels/dspark_walk.py`: CUDA
    tensors with Triton) the kernel's tokens plus one teacher-forced pass for their logits and confidences:
    the same WalkResult. fused: None takes the kernel for CUDA tensors unless SPEC_PLUGINS_FUSED_WALK=0 (on an
    H200 the fused block is 1.7-5.5x faster than this walk at batch 8, `benchmarks/gpu_kernels.py`); True also
    takes it under Triton's CPU interpreter (tests)."""
    if fused is None:
        fused = base_logits.is_cuda and os.environ.get(FUSED_WALK_ENV, "1").strip() != "0"
    # Triton is imported only where the kernel can run: CUDA tensors, or the CPU interpreter in tests.
    use_kernel = (fused and markov is not None and (base_logits.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
                  and bool((torch.as_tensor(temperature).reshape(-1) < _GREEDY_EPS).all()))
    if use_kernel:
        from spec_plugins.kernels.dspark_walk import dspark_walk, use_triton

        use_kernel = use_triton(base_logits)
    if not use_kernel:
        return markov_walk(hidden, base_logits, anchor, markov, confidence, temperature, generator, draft_topk)
    tokens = dspark_walk(hidden, base_logits, anchor, markov, draft_topk)
    prev = torch.cat([anchor.long()[:, None], tokens[:, :-1]], dim=1)
    logits = add_bias(base_logits.float(), markov.block_bias(hidden, prev), draft_topk)  # as the walk adds them
    conf = confidence(hidden, markov.prev_embedding(prev)).float() if confidence is not None else None
    return WalkResult(tokens=tokens, logits=logits, probs=F.one_hot(tokens, logits.shape[-1]).float(),
                      confidence_logits=conf)


def teacher_forced(hidden: Tensor, base_logits: Tensor, prev_tokens: Tensor, markov: MarkovHead | None,
                   confidence: ConfidenceHead | None = None) -> tuple[Tensor, Tensor | None]:
    """Training-style block outputs for given predecessors prev_tokens [b, g] = [anchor, x_1 .. x_{g-1}]:
    (logits [b, g, V], confidence logits [b, g] or None). Equals the walk's when fed the walked tokens."""
    logits = base_logits
    prev_emb = markov.prev_embedding(prev_tokens) if markov is not None else None
    if markov is not None:
        logits = logits + markov.block_bias(hidden, prev_tokens)
    conf = confidence(hidden, prev_emb) if confidence is not None else None
    return logits.float(), conf


class DSparkDrafter(DFlashDrafter):
    """DSpark drafting on our DFlash backbone (a thin wrapper: proposers/dflash is unchanged).

    The backbone is the same network; only the layout differs: the block [anchor, mask * (gamma - 1)] is
    built with `block_size = gamma`, and all gamma rows draft (DFlashDrafter drops row 0). Cache handling is
    DFlashDrafter's: `extend` / `trim` / `length`, context K/V only.
    """

    def __init__(self, model, embed_weight: Tensor, lm_head_weight: Tensor, markov: MarkovHead | None,
                 confidence: ConfidenceHead | None = None) -> None:
        super().__init__(model, embed_weight, lm_head_weight)  # a DFlashDraftModel and its context cache
        self.markov = markov
        self.confidence = confidence

    def backbone(self, context_taps: Tensor, anchor: Tensor) -> tuple[Tensor, Tensor]:
        """Final-normed rows [b, gamma, d] and their backbone logits [b, gamma, V], all rows kept."""
        model = self.model
        hidden = model(context_taps, model.embed_block(model.block_ids(anchor), self.embed_weight), self.cache)
        return hidden, model.logits(hidden, self.lm_head_weight)

    @torch.no_grad()
    def propose_block(self, context_taps: Tensor, anchor: Tensor, temperature: float | Tensor = 0.0,
                      generator: torch.Generator | None = None, draft_topk: int | None = None) -> WalkResult:
        """context_taps [b, c, taps * d] of newly committed positions (c may be 0), anchor [b] the token at
        the next position (the target's bonus). Returns gamma drafts for the positions after the anchor."""
        hidden, base_logits = self.backbone(context_taps, anchor)
        return walk_block(hidden, base_logits, anchor, self.markov, self.confidence, temperature, generator,
                          draft_topk)
