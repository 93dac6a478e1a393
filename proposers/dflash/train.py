"""Training pieces for DFlash-family drafters (engine-free; shared by DFlash and DSpark).

One training step, for a batch of token rows with a loss mask:

1. **Target features.** The frozen HF target runs the rows once with hidden states: the tap features
   (tap id k = HF hidden_states[k + 1]) at every position, and its final-normed last hidden state, from which
   target logits are taken only where a loss needs them.
2. **Anchors.** Per row, `num_anchors` random positions a whose first label x_{a+1} lies in the loss mask
   (e.g. response tokens only). Anchor a forms the block [x_a, M, ..., M] at positions a .. a+B-1.
3. **Training forward.** All blocks of a row in one pass over the draft's own layers: block b attends to the
   context features of positions < a_b and to its own block (bidirectionally), nothing else — a dense
   boolean mask [rows, 1, anchors*B, T + anchors*B]. For one anchor this is exactly the inference forward
   (`DFlashDraftModel.forward` with the features of positions < a as context); tests check that.
4. **Loss.** DFlash: row k >= 1 predicts x_{a+k} (its own position), CE weighted w_k = exp(-(k-1)/gamma).
   DSpark (proposers/dspark/train.py): row k >= 0 predicts x_{a+k+1}. Rows past the sequence end or
   outside the loss mask are dropped, and so is every later row of the block (a draft after a dropped
   position is never verified).

`train` runs AdamW with gradient clipping and a warmup + cosine (or constant) schedule over any objective
with `parameters()` and `loss(batch, features, blocks)`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from spec_plugins.proposers.dflash.model import DFlashDraftModel, apply_rope, grouped_attention, rope_cos_sin, select_taps

# ----------------------------------------------------------------------------------------------- data


@dataclasses.dataclass
class Example:
    """One training row: token ids and which positions may be labels (1 = train on predicting it)."""

    ids: list[int]
    loss_mask: list[int]


@dataclasses.dataclass
class Batch:
    input_ids: Tensor       # [b, T] long, right-padded
    attention_mask: Tensor  # [b, T] long, 1 on real tokens
    loss_mask: Tensor       # [b, T] bool, 0 on padding and on positions not to be predicted

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device))


def chunk_examples(examples: Iterable[Example], seq_len: int, min_len: int = 3) -> list[Example]:
    """Cut long examples into windows of at most seq_len tokens; drop windows too short to train on."""
    out = []
    for ex in examples:
        for start in range(0, len(ex.ids), seq_len):
            ids, mask = ex.ids[start:start + seq_len], ex.loss_mask[start:start + seq_len]
            if len(ids) >= min_len and any(mask[1:]):
                out.append(Example(ids, mask))
    return out


def collate(examples: Sequence[Example], pad_id: int = 0) -> Batch:
    length = max(len(ex.ids) for ex in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), length), dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.bool)
    for i, ex in enumerate(examples):
        n = len(ex.ids)
        ids[i, :n] = torch.tensor(ex.ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(ex.loss_mask, dtype=torch.bool)
    return Batch(ids, attn, mask)


# ----------------------------------------------------------------------------------------------- target


@dataclasses.dataclass
class TargetFeatures:
    taps: Tensor         # [b, T, num_taps * hidden]
    last_hidden: Tensor  # [b, T, hidden], final-normed: lm_head(last_hidden[p]) predicts token p + 1


def check_taps(taps: Sequence[int], num_target_layers: int) -> None:
    """Taps must be decoder layers 0 .. L-2: HF's entry for the last layer is post-norm (see select_taps)."""
    if not taps:
        raise ValueError("taps: expected at least one target layer id")
    if len(set(taps)) != len(taps):
        raise ValueError(f"taps: duplicate layer ids in {list(taps)}")
    for t in taps:
        if not 0 <= t <= num_target_layers - 2:
            raise ValueError(f"taps: layer id {t} out of range [0, {num_target_layers - 2}] "
                             f"(target has {num_target_layers} layers; the last one is not tappable through HF)")


@torch.no_grad()
def extract_features(target: Any, batch: Batch, taps: Sequence[int]) -> TargetFeatures:
    """Run the frozen target's decoder (no LM head over every position) and keep the taps."""
    decoder = target.get_decoder()
    out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True,
                  use_cache=False)
    return TargetFeatures(select_taps(out.hidden_states, taps), out.last_hidden_state)


@torch.no_grad()
def cache_features(target: Any, examples: Sequence[Example], taps: Sequence[int], *, device: str | torch.device = "cpu",
                   batch_size: int = 8, pad_id: int = 0, progress: bool = True) -> list[TargetFeatures]:
    """Every example's target features, computed once and kept on the CPU ([T, ...] per example).

    The target is frozen, so its features never change: caching them turns each later step into a draft-only
    step (on a CPU the target's forward is nearly all of a step). Costs (num_taps + 1) * hidden floats per
    token of memory. Examples of similar length run together to waste little on padding; right padding
    leaves a causal target's features of the real tokens unchanged."""
    from tqdm.auto import tqdm

    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    cached: list[TargetFeatures | None] = [None] * len(examples)
    for start in tqdm(range(0, len(order), batch_size), desc="target features", disable=not progress, dynamic_ncols=True):
        rows = order[start:start + batch_size]
        features = extract_features(target, collate([examples[i] for i in rows], pad_id).to(device), taps)
        for j, i in enumerate(rows):
            n = len(examples[i].ids)
            cached[i] = TargetFeatures(features.taps[j, :n].cpu(), features.last_hidden[j, :n].cpu())
    return cached


def collate_features(features: Sequence[TargetFeatures], device: str | torch.device) -> TargetFeatures:
    """Cached per-example features padded to one batch (zeros past each example's end, as `collate` pads ids)."""
    length = max(f.taps.shape[0] for f in features)

    def stack(parts: list[Tensor]) -> Tensor:
        out = parts[0].new_zeros(len(parts), length, parts[0].shape[-1])
        for i, part in enumerate(parts):
            out[i, : part.shape[0]] = part
        return out.to(device)

    return TargetFeatures(stack([f.taps for f in features]), stack([f.last_hidden for f in features]))


@torch.no_grad()
def target_logits_at(target: Any, features: TargetFeatures, positions: Tensor) -> Tensor:
    """Target logits predicting the tokens at `positions` [b, ...] (>= 1): the LM head at positions - 1."""
    b, d = features.last_hidden.shape[0], features.last_hidden.shape[-1]
    idx = (positions - 1).clamp(min=0).reshape(b, -1, 1).expand(-1, -1, d)
    hidden = features.last_hidden.gather(1, idx)
    return target.get_output_embeddings()(hidden).reshape(*positions.shape, -1).float()


# ----------------------------------------------------------------------------------------------- blocks


@dataclasses.dataclass
class AnchorBlocks:
    anchors: Tensor    # [b, n] anchor positions (invalid anchors: 0, with valid all False)
    block_ids: Tensor  # [b, n, B] query block [x_a, mask, ...]
    label_pos: Tensor  # [b, n, B] position of each row's label (clamped into the row)
    labels: Tensor     # [b, n, B] the data token at label_pos
    valid: Tensor      # [b, n, B] bool: row trains (in range, in the loss mask, and all earlier rows too)


def sample_anchors(loss_mask: Tensor, num_anchors: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Per row, up to num_anchors distinct positions a >= 1 with loss_mask[a + 1] set, sorted.
    Returns (anchors [b, n], anchor_valid [b, n]); rows with fewer candidates pad with invalid anchor 0.

    a >= 1 keeps at least one context position, as at inference (the prompt's features precede the bonus).
    """
    b, length = loss_mask.shape
    anchors = torch.zeros(b, num_anchors, dtype=torch.long)
    valid = torch.zeros(b, num_anchors, dtype=torch.bool)
    candidate = torch.zeros_like(loss_mask, dtype=torch.bool, device="cpu")
    candidate[:, 1:length - 1] = loss_mask[:, 2:].cpu()
    for i in range(b):
        pool = candidate[i].nonzero().squeeze(-1)
        k = min(num_anchors, pool.numel())
        chosen = pool[torch.randperm(pool.numel(), generator=generator)[:k]].sort().values
        anchors[i, :k] = chosen
        valid[i, :k] = True
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def make_blocks(batch: Batch, anchors: Tensor, anchor_valid: Tensor, *, block_size: int, mask_token_id: int,
                anchor_predicts_next: bool) -> AnchorBlocks:
    """Query blocks and labels for the anchors. DFlash (anchor_predicts_next False): row k predicts x_{a+k},
    row 0 nothing. DSpark (True): row k predicts x_{a+k+1}."""
    ids, mask = batch.input_ids, batch.loss_mask
    length = ids.shape[1]
    rows = torch.arange(block_size, device=ids.device)
    label_pos = anchors[..., None] + rows + (1 if anchor_predicts_next else 0)  # [b, n, B]
    in_range = label_pos < length
    label_pos = label_pos.clamp(max=length - 1)
    flat = label_pos.flatten(1)
    labels = ids.gather(1, flat).view_as(label_pos)
    valid = in_range & mask.gather(1, flat).view_as(label_pos) & anchor_valid[..., None]
    if not anchor_predicts_next:
        valid[..., 0] = False
        valid[..., 1:] = valid[..., 1:].int().cumprod(-1).bool()
    else:
        valid = valid.int().cumprod(-1).bool()
    block_ids = torch.full_like(label_pos, mask_token_id)
    block_ids[..., 0] = ids.gather(1, anchors)
    return AnchorBlocks(anchors, block_ids, label_pos, labels, valid)


def decay_weights(block_size: int, gamma: float, anchor_predicts_next: bool, device=None) -> Tensor:
    """Per-row loss weights: DFlash w_0 = 0, w_k = exp(-(k-1)/gamma); DSpark w_k = exp(-k/gamma) (row 0 is the
    first draft there). The first draft weighs 1 either way: early drafts gate every later one."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    if anchor_predicts_next:
        return torch.exp(-k / gamma)
    w = torch.exp(-(k - 1).clamp(min=0) / gamma)
    w[0] = 0.0
    return w


def weighted_mean(values: Tensor, weights: Tensor) -> Tensor:
    return (values * weights).sum() / weights.sum().clamp_min(1e-8)


# ----------------------------------------------------------------------------------------------- forward


def training_mask(anchors: Tensor, context_len: int, block_size: int, causal: bool) -> Tensor:
    """[b, 1, n*B, T + n*B] bool: block b's rows see context positions < a_b and their own block only."""
    b, n = anchors.shape
    device = anchors.device
    q_block = torch.arange(n * block_size, device=device) // block_size          # block of each query row
    ctx = torch.arange(context_len, device=device)
    sees_ctx = ctx[None, None, :] < anchors.repeat_interleave(block_size, dim=1)[..., None]  # [b, nB, T]
    same = q_block[:, None] == q_block[None, :]                                      # [nB, nB]
    if causal:
        offset = torch.arange(n * block_size, device=device) % block_size
        same = same & (offset[None, :] <= offset[:, None])
    mask = torch.cat([sees_ctx, same.expand(b, -1, -1)], dim=-1)
    return mask[:, None]


def training_forward(model: DFlashDraftModel, taps: Tensor, block_embeds: Tensor, anchors: Tensor) -> Tensor:
    """Draft hidden states for all anchored blocks at once, with the model's own weights.

    taps [b, T, num_taps * hidden] features of every position; block_embeds [b, n*B, hidden] the embedded
    blocks in anchor order; anchors [b, n]. Returns final-normed rows [b, n*B, hidden]. Per block this is
    `model.forward(taps[:, :a], block)` (no cache): same layers, norms and RoPE positions, plus a mask.
    """
    config = model.config
    if any(w is not None for w in config.layer_window):
        raise ValueError("training_forward: sliding-window draft layers are not supported (train full-attention layers)")
    b, length, _ = taps.shape
    B = config.block_size
    n = anchors.shape[1]
    dtype = block_embeds.dtype
    context = model.hidden_norm(model.fc(taps.to(model.fc.weight.dtype)))
    cos_c, sin_c = rope_cos_sin(torch.arange(length, device=taps.device), config.head_dim, config.rope_theta, context.dtype)
    positions = (anchors[..., None] + torch.arange(B, device=anchors.device)).reshape(-1)
    cos_b, sin_b = rope_cos_sin(positions, config.head_dim, config.rope_theta, dtype)
    rope_block = (cos_b.view(b, 1, n * B, -1), sin_b.view(b, 1, n * B, -1))  # per-row positions broadcast over heads
    masks = {c: training_mask(anchors, length, B, c) for c in set(config.layer_causal)}

    x = block_embeds
    for layer in model.layers:
        attn = layer.attention
        h = layer.attention_norm(x)
        ctx_k, ctx_v = attn.context_kv(context, cos_c, sin_c)
        # The block's own K/V go through the very same projection + k_norm + RoPE as the context's.
        blk_k, blk_v = attn.context_kv(h, *rope_block)
        q = attn.q_norm(attn.wq(h).view(b, n * B, attn.n_heads, attn.head_dim)).transpose(1, 2)
        q = apply_rope(q, *rope_block)
        k, v = torch.cat([ctx_k, blk_k], dim=2), torch.cat([ctx_v, blk_v], dim=2)
        out = grouped_attention(q, k, v, masks[attn.causal], attn.head_dim**-0.5)
        x = x + attn.wo(out.transpose(1, 2).reshape(b, n * B, -1))
        x = x + layer.feed_forward(layer.ffn_norm(x))
    return model.norm(x)


def draft_hidden(model: DFlashDraftModel, features: TargetFeatures, blocks: AnchorBlocks, embed_weight: Tensor) -> Tensor:
    """[b, n, B, hidden] final-normed draft rows for the anchored blocks."""
    b, n, B = blocks.block_ids.shape
    embeds = model.embed_block(blocks.block_ids.reshape(b, n * B), embed_weight).to(model.fc.weight.dtype)
    return training_forward(model, features.taps, embeds, blocks.anchors).view(b, n, B, -1)


# ----------------------------------------------------------------------------------------------- objectives


class Objective(Protocol):
    kind: str
    anchor_predicts_next: bool
    model: DFlashDraftModel

    def parameters(self) -> list[torch.nn.Parameter]: ...

    def loss(self, target: Any, features: TargetFeatures, blocks: AnchorBlocks) -> tuple[Tensor, dict[str, float]]: ...


class DFlashObjective:
    """Decayed CE of the mask rows against the data tokens (label_source "data") or the target's greedy
    tokens at the same positions ("target": self-distillation, for data the target did not write)."""

    kind = "dflash"
    anchor_predicts_next = False

    def __init__(self, model: DFlashDraftModel, embed_weight: Tensor, lm_head_weight: Tensor, *, gamma: float = 4.0,
                 label_source: str = "data") -> None:
        if label_source not in ("data", "target"):
            raise ValueError(f"label_source: expected 'data' or 'target', got {label_source!r}")
        self.model, self.embed_weight, self.lm_head_weight = model, embed_weight, lm_head_weight
        self.gamma, self.label_source = gamma, label_source

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def labels(self, target: Any, features: TargetFeatures, blocks: AnchorBlocks) -> Tensor:
        if self.label_source == "data":
            return blocks.labels
        return target_logits_at(target, features, blocks.label_pos).argmax(-1)

    def loss(self, target: Any, features: TargetFeatures, blocks: AnchorBlocks) -> tuple[Tensor, dict[str, float]]:
        hidden = draft_hidden(self.model, features, blocks, self.embed_weight)
        logits = self.model.logits(hidden, self.lm_head_weight.to(hidden.dtype)).float()
        labels = self.labels(target, features, blocks)
        ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view_as(labels)
        w = decay_weights(logits.shape[2], self.gamma, False, logits.device) * blocks.valid
        loss = weighted_mean(ce, w)
        with torch.no_grad():
            acc = weighted_mean((logits.argmax(-1) == labels).float(), blocks.valid.float())
        return loss, {"ce": loss.item(), "acc": acc.item()}


# ----------------------------------------------------------------------------------------------- loop


@dataclasses.dataclass
class TrainSettings:
    steps: int = 200
    batch_size: int = 8
    num_anchors: int = 16
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup: float = 0.04        # fraction of steps with linear warmup
    schedule: str = "cosine"    # or "constant" (after warmup)
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cpu"
    bf16: bool = False          # autocast the draft in bf16 (CUDA)
    cache_features: bool = False  # run the target once over all examples up front (see cache_features)
    progress: bool = True


@dataclasses.dataclass
class TrainResult:
    losses: list[float]
    metrics: list[dict[str, float]]
    seconds: float

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(1, len(self.losses))


def lr_factor(step: int, settings: TrainSettings) -> float:
    warm = int(settings.warmup * settings.steps)
    if step < warm:
        return (step + 1) / warm
    if settings.schedule == "constant":
        return 1.0
    progress = (step - warm) / max(1, settings.steps - warm)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def train(objective: Objective, target: Any, examples: Sequence[Example], taps: Sequence[int],
          settings: TrainSettings, *, pad_id: int = 0, on_step: Callable[[int, float, dict], None] | None = None) -> TrainResult:
    """Train `objective`'s parameters (the target stays frozen) for settings.steps steps, each on a random
    batch of `examples` with freshly sampled anchors. Seeded: same inputs and seed -> same run (on CPU)."""
    from tqdm.auto import tqdm

    if settings.schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule: expected 'cosine' or 'constant', got {settings.schedule!r}")
    if not examples:
        raise ValueError("train: no usable examples (each needs >= 3 tokens with a label in its loss mask)")
    generator = torch.Generator().manual_seed(settings.seed)
    target.requires_grad_(False)
    params = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, settings))
    config = objective.model.config
    device = torch.device(settings.device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.bf16)

    cached = None
    if settings.cache_features:
        cached = cache_features(target, examples, taps, device=device, batch_size=settings.batch_size, pad_id=pad_id,
                                progress=settings.progress)
    losses, metrics = [], []
    start = time.perf_counter()
    bar = tqdm(range(settings.steps), desc=f"train {objective.kind}", disable=not settings.progress, dynamic_ncols=True)
    for step in bar:
        rows = torch.randint(len(examples), (settings.batch_size,), generator=generator).tolist()
        batch = collate([examples[i] for i in rows], pad_id).to(device)
        if cached is None:
            features = extract_features(target, batch, taps)
        else:
            features = collate_features([cached[i] for i in rows], device)
        anchors, anchor_valid = sample_anchors(batch.loss_mask, settings.num_anchors, generator)
        blocks = make_blocks(batch, anchors, anchor_valid, block_size=config.block_size,
                             mask_token_id=config.mask_token_id, anchor_predicts_next=objective.anchor_predicts_next)
        with autocast:
            loss, info = objective.loss(target, features, blocks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        metrics.append(info)
        bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if on_step is not None:
            on_step(step, losses[-1], info)
    bar.close()
    return TrainResult(losses, metrics, time.perf_counter() - start)
