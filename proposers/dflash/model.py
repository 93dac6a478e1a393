"""The DFlash draft network (Chen, Liang, Liu, arXiv 2602.06036), engine-free, batch of equal-length rows.

One forward drafts a whole block in parallel:

    context features  c_p = hidden_norm(fc([h_p^(l1); ...; h_p^(lm)]))   for newly committed positions p
    query block       x   = embed([bonus, mask, mask, ..., mask])         at positions start .. start+B-1

Each draft layer is a Qwen3 decoder layer whose attention sees extra keys/values computed from c (the
context path: k/v projections of the *same* layer, k_norm, RoPE at the token's own position; no
input_layernorm, no queries). The block attends to all context K/V plus the whole block, bidirectionally
(unless the layer is causal). Row i >= 1 of the output predicts the token at its own position start+i; row 0
(the bonus) predicts nothing. The target's embedding and LM head are passed in, never owned.

Cache: only context K/V are kept (they depend on committed features alone); block K/V are transient and
recomputed each step, so there is nothing to crop after a forward. `DraftKVCache.trim` rolls back context
that was appended for rows the target later rejected.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from spec_plugins.proposers.dflash.config import DFlashConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 and scale after casting back, as Qwen3 does (matters for bf16 parity).
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin of shape [len, head_dim] for absolute `positions` (neox / rotate-half layout, like Qwen3)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [batch, heads, len, head_dim]; cos/sin: [len, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """SDPA with grouped-query heads: q [b, H, n, hd], k/v [b, KV, L, hd], mask [n, L] or [b, 1, n, L] (True =
    visible) or None. The H / KV query heads that share a KV head are stacked along the query axis, so K/V are
    read as they are (no per-head copies of a long cache) and any SDPA backend runs it."""
    b, h, n, hd = q.shape
    kvh = k.shape[1]
    group = h // kvh
    q = q.reshape(b, kvh, group * n, hd)
    if mask is not None:  # the same rows for every head of a group
        mask = mask.repeat(*([1] * (mask.dim() - 2)), group, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, h, n, hd)


class DraftKVCache:
    """Context K/V per draft layer, [batch, kv_heads, length, head_dim], RoPE already applied.

    Positions are implicit: entry j holds position j, so `length` is also the position of the next context
    token. The committed length only ever grows by context, never by block tokens: a block's K/V are
    written past the end for one forward (`append(..., commit=c)`) and left there. Storage is preallocated
    and grows by doubling, so a step copies only its new rows, not the whole cache.
    """

    def __init__(self, num_layers: int) -> None:
        self._k: list[Tensor | None] = [None] * num_layers
        self._v: list[Tensor | None] = [None] * num_layers
        self._len = [0] * num_layers

    @property
    def length(self) -> int:
        return self._len[0]

    @property
    def keys(self) -> list[Tensor | None]:
        return [None if k is None else k[:, :, :n] for k, n in zip(self._k, self._len)]

    @property
    def values(self) -> list[Tensor | None]:
        return [None if v is None else v[:, :, :n] for v, n in zip(self._v, self._len)]

    def _room(self, layer: int, like: Tensor, needed: int) -> None:
        k = self._k[layer]
        if k is not None and k.shape[2] >= needed:
            return
        capacity = max(needed, 64, 0 if k is None else 2 * k.shape[2])
        shape = (*like.shape[:2], capacity, like.shape[3])
        new_k, new_v = like.new_empty(shape), like.new_empty(shape)
        n = self._len[layer]
        if k is not None:
            new_k[:, :, :n] = k[:, :, :n]
            new_v[:, :, :n] = self._v[layer][:, :, :n]
        self._k[layer], self._v[layer] = new_k, new_v

    def _write(self, layer: int, k: Tensor, v: Tensor) -> int:
        n = self._len[layer]
        end = n + k.shape[2]
        self._room(layer, k, end)
        self._k[layer][:, :, n:end] = k
        self._v[layer][:, :, n:end] = v
        return end

    def append(self, layer: int, k: Tensor, v: Tensor, commit: int | None = None) -> tuple[Tensor, Tensor]:
        """Write K/V rows after the committed context and commit the first `commit` of them (default: all);
        returns the layer's K/V up to the last row written. Rows past the commit (a block's) stay readable
        for this forward only: the next write goes over them."""
        end = self._write(layer, k, v)
        self._len[layer] += k.shape[2] if commit is None else commit
        return self._k[layer][:, :, :end], self._v[layer][:, :, :end]

    def trim(self, length: int) -> None:
        """Drop context beyond `length` (e.g. features of rows the target rejected)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"DraftKVCache.trim: length {length} outside [0, {self.length}]")
        self._len = [min(n, length) for n in self._len]


class Attention(nn.Module):
    def __init__(self, config: DFlashConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.causal = config.layer_causal[layer]
        self.window = config.layer_window[layer]
        bias = config.attention_bias
        d, hd = config.hidden_size, config.head_dim
        self.wq = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.wk = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.wv = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.wo = nn.Linear(self.n_heads * hd, d, bias=bias)
        # Qwen3 per-head norms on q and k, before RoPE. k_norm also applies to the context keys.
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def _kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        b, n, _ = x.shape
        k = self.k_norm(self.wk(x).view(b, n, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.wv(x).view(b, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def context_kv(self, context: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """K/V of the fused context: this layer's k/v projections, k_norm and RoPE at the context's own
        positions. They depend on the committed features only, never on the block, hence cacheable."""
        return self._kv(context, cos, sin)

    def forward(self, x: Tensor, context: Tensor, rope, cache: DraftKVCache | None = None) -> Tensor:
        """x: normed block [b, n, d]; context: the fused features of the new context positions [b, c, d], which
        come right after what `cache` holds (all context when there is no cache); rope: cos/sin for the
        c + n positions. Context and block K/V come out of one projection (the weights are read once);
        the context rows are committed to the cache, the block rows are not."""
        b, n, _ = x.shape
        c = context.shape[1]
        k, v = self._kv(torch.cat([context, x], dim=1), *rope)
        if cache is not None:
            k, v = cache.append(self.layer, k, v, commit=c)
        q = self.q_norm(self.wq(x).view(b, n, self.n_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, rope[0][c:], rope[1][c:])
        out = grouped_attention(q, k, v, self._mask(n, k.shape[2], x.device), self.head_dim**-0.5)
        return self.wo(out.transpose(1, 2).reshape(b, n, -1))

    def _mask(self, q_len: int, kv_len: int, device) -> Tensor | None:
        # Keys are [cached context, new context, block]; position of key j is j (the cache starts at 0),
        # the block occupies the last q_len positions. Context is never in the future of a query, so
        # causality only restricts the block, and a window cuts off old context.
        if not self.causal and self.window is None:
            return None
        q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        k_pos = torch.arange(kv_len, device=device)[None, :]
        visible = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
        if self.causal:
            visible &= k_pos <= q_pos
        if self.window is not None:
            visible &= q_pos - k_pos < self.window
            if not self.causal:  # bidirectional window: symmetric within the block
                visible &= k_pos - q_pos < self.window
        return visible


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x) (Qwen3 gate / down / up)."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DraftLayer(nn.Module):
    def __init__(self, config: DFlashConfig, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config, layer)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: Tensor, context: Tensor, rope, cache: DraftKVCache | None = None) -> Tensor:
        # Only the block goes through attention_norm: the context was normalised once, by hidden_norm.
        x = x + self.attention(self.attention_norm(x), context, rope, cache)
        return x + self.feed_forward(self.ffn_norm(x))


class DFlashDraftModel(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        # Feature fusion: m tapped target layers -> one d-wide context vector per position.
        self.fc = nn.Linear(config.num_taps * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)

    def new_cache(self) -> DraftKVCache:
        return DraftKVCache(self.config.num_hidden_layers)

    def embed_block(self, token_ids: Tensor, embed_weight: Tensor) -> Tensor:
        """Embed the query block [bonus, mask, ...] with the target's (shared) embedding table."""
        return F.embedding(token_ids, embed_weight) * self.config.input_embedding_scale

    def block_ids(self, bonus: Tensor) -> Tensor:
        """[batch] bonus tokens -> [batch, block_size] query block [bonus, mask * (B - 1)]."""
        ids = torch.full((bonus.shape[0], self.config.block_size), self.config.mask_token_id, dtype=torch.long, device=bonus.device)
        ids[:, 0] = bonus
        return ids

    def _context_kv(self, context_taps: Tensor, start: int) -> list[tuple[Tensor, Tensor]]:
        """Per-layer K/V of context features at positions start .. start + c - 1."""
        context = self.hidden_norm(self.fc(context_taps))
        positions = torch.arange(start, start + context.shape[1], device=context.device)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, context.dtype)
        return [layer.attention.context_kv(context, cos, sin) for layer in self.layers]

    def extend_cache(self, context_taps: Tensor, cache: DraftKVCache) -> None:
        """Append context K/V for [batch, c, num_taps * hidden] features at cache.length .. without drafting
        (e.g. all verified rows at once, to be trimmed to the accepted ones afterwards)."""
        for i, (k, v) in enumerate(self._context_kv(context_taps, cache.length)):
            cache.append(i, k, v)

    def forward(self, context_taps: Tensor, block_embeds: Tensor, cache: DraftKVCache | None = None) -> Tensor:
        """Draft one block.

        context_taps: [batch, c, num_taps * hidden], concatenated tap features of the c positions right
            after what the cache holds (positions cache.length .. cache.length + c - 1; 0.. without a cache).
            c may be 0 when nothing new was committed with features.
        block_embeds: [batch, B, hidden], the embedded query block, at the positions following the context.
        cache: context K/V of earlier positions; the new context is appended to it (block K/V are not).
        Returns the final-normed hidden states of the block, [batch, B, hidden]; rows 1.. carry the drafts.
        """
        context = self.hidden_norm(self.fc(context_taps))
        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + context.shape[1] + block_embeds.shape[1], device=block_embeds.device)
        rope = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, block_embeds.dtype)

        x = block_embeds
        for layer in self.layers:
            x = layer(x, context, rope, cache)
        return self.norm(x)

    def logits(self, hidden: Tensor, lm_head_weight: Tensor) -> Tensor:
        """The target's (shared) LM head, plus the optional output multiplier and final soft-capping."""
        logits = F.linear(hidden, lm_head_weight)
        if self.config.output_multiplier != 1.0:  # a full-vocabulary pass; skip it when it changes nothing
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def select_taps(hidden_states, target_layer_ids) -> Tensor:
    """Concatenate tap features from a HF model's `output_hidden_states` tuple.

    hidden_states[0] is the embedding output, so the output of decoder layer k is hidden_states[k + 1].
    Beware tapping the last layer this way: HF's final entry is post-norm, which a draft trained on the raw
    layer output does not expect.
    """
    return torch.cat([hidden_states[k + 1] for k in target_layer_ids], dim=-1)


class DFlashDrafter:
    """One sequence's (or a uniform batch's) drafting state: the draft model, the target's shared embedding
    and LM head weights, and the context cache. The caller owns verification and tells the drafter what was
    committed, z-lab style:

        tokens, probs = drafter.propose_block(features_of_prompt, bonus)          # prefill -> first block
        ...target verifies [bonus, tokens]; a drafts accepted, new bonus sampled...
        tokens, probs = drafter.propose_block(features_of_rows_0_to_a, new_bonus)  # next block

    or, engine style, `drafter.extend(features_of_all_verified_rows)` then `drafter.trim(committed)` and
    `propose_block(empty, new_bonus)`. Either way `drafter.length` is the committed length afterwards.
    """

    def __init__(self, model: DFlashDraftModel, embed_weight: Tensor, lm_head_weight: Tensor) -> None:
        self.model = model
        self.embed_weight = embed_weight
        self.lm_head_weight = lm_head_weight
        self.cache = model.new_cache()

    @property
    def length(self) -> int:
        return self.cache.length

    def extend(self, context_taps: Tensor) -> None:
        self.model.extend_cache(context_taps, self.cache)

    def trim(self, length: int) -> None:
        self.cache.trim(length)

    def reset(self) -> None:
        self.cache = self.model.new_cache()

    @torch.no_grad()
    def propose_block(self, context_taps: Tensor, bonus: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
        """context_taps: [batch, c, num_taps * hidden] features of newly committed positions (c may be 0);
        bonus: [batch] token at the next position. Returns greedy drafts [batch, B-1] and the draft
        distribution softmax(logits / temperature) [batch, B-1, vocab] (fp32; temperature <= 0 -> one-hot
        of the greedy drafts, the exact proposal of a greedy drafter)."""
        model = self.model
        hidden = model(context_taps, model.embed_block(model.block_ids(bonus), self.embed_weight), self.cache)
        logits = model.logits(hidden[:, 1:], self.lm_head_weight).float()  # row 0 is the bonus: no draft
        tokens = logits.argmax(dim=-1)
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
        else:
            probs = F.one_hot(tokens, logits.shape[-1]).float()
        return tokens, probs
