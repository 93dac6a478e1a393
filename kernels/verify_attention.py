"""Verification attention for speculative decoding: GQA-packed, ragged, causal within the query block.

One verification step scores, for each request r, the verified token plus that request's D_r drafts: a
query block of n_r = 1 + D_r tokens at the END of the request's KV (context c_r = kv_len_r - n_r tokens
before it). Query i of the block sees the whole context plus query tokens 0..i, i.e. KV positions
0 .. c_r + i.

Why a kernel of its own: decode kernels tile one query row per head, prefill kernels tile 64-128 query
tokens per head, and the n_r (1..32) rows of a verification block fill neither. With grouped-query
attention the G = num_q_heads / num_kv_heads query heads that share a KV head read the same K/V, so this
kernel packs the G * n_r rows of one (request, KV head) into BLOCK_M-row tiles (row m = token (m // G),
query head kv_head * G + m % G) and reads each KV block once for all of them. Tiles are counted per
request from the actual lengths (no padding to the batch's longest draft): grid axis 0 enumerates the
tiles of every request back to back, and each program finds its request with a prefix sum over the
per-request tile counts (computed in the kernel from cu_seqlens_q; no host synchronisation).

KV layouts (pick one per call):
  contiguous  k, v [total_kv, num_kv_heads, head_dim]; request r owns rows cu_seqlens_k[r] : cu_seqlens_k[r + 1]
  paged       k, v [num_pages, page_size, num_kv_heads, head_dim]; request r's position p lives in page
              block_table[r, p // page_size], slot p % page_size; seq_lens_k[r] positions in all
q is [total_q, num_q_heads, head_dim] with request r's block at rows cu_seqlens_q[r] : cu_seqlens_q[r + 1];
the output has q's shape and dtype. Inputs fp16 / bf16 / fp32, scores and the online softmax in fp32.

Long contexts at small batch split the KV range of a tile over `num_splits` programs (flash-decoding);
the last split to finish (an atomic counter per tile) merges the partial results, so a call is still one
launch. Every query row must see at least one key (kv_len_r >= n_r), which the reference checks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spec_plugins.kernels._triton import INTERPRET, dot as _dot, jit as _jit, tl, triton

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634




@_jit
def _attend_block(acc, m_i, l_i, q, K, V, k_head, v_head, kv_start, req, kv_len, start, last_visible,
                  BLOCK_TABLE, stride_bt, stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One KV block [start, start + BLOCK_N) into the running (acc, m, l) of every packed row."""
    pos = start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = pos < kv_len
    if PAGED:
        if MASKED:
            page = tl.load(BLOCK_TABLE + req * stride_bt + pos // PAGE_SIZE, mask=in_range, other=0)
        else:
            page = tl.load(BLOCK_TABLE + req * stride_bt + pos // PAGE_SIZE)
        slot = (pos % PAGE_SIZE).to(tl.int64)
        k_rows = page.to(tl.int64) * stride_kb + slot * stride_kt
        v_rows = page.to(tl.int64) * stride_vb + slot * stride_vt
    else:
        k_rows = (kv_start + pos).to(tl.int64) * stride_kt
        v_rows = (kv_start + pos).to(tl.int64) * stride_vt
    k_ptrs = K + k_head + k_rows[:, None] + offs_d[None, :]
    v_ptrs = V + v_head + v_rows[:, None] + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=in_range[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0)
    else:  # blocks below every row's causal limit: no mask to build or apply
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    qk = _dot(q, tl.trans(k), DOT_PRECISION) * qk_scale  # log2 units
    if MASKED:
        qk = tl.where(pos[None, :] <= last_visible[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row can see nothing of a block (or of a whole split) yet: keep exp2 away from -inf - -inf.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = m_new
    p = tl.exp2(qk - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION)
    return acc, m_new, l_i


# Batch size, token count and split count change every step: one compiled variant for all of them.
@_jit(do_not_specialize=["batch", "total_q", "num_splits"])
def _verify_attention_kernel(
    Q, K, V, O, O_PART, LSE_PART, COUNTERS,
    CU_Q, CU_K, SEQ_K, BLOCK_TABLE,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_bt,
    batch, total_q, num_splits, qk_scale,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_BATCH: tl.constexpr, SPLIT: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # Which request owns this tile: tiles are numbered request after request, ceil(G * n_r / BLOCK_M) each.
    reqs = tl.arange(0, BLOCK_BATCH)
    in_batch = reqs < batch
    q_lo = tl.load(CU_Q + reqs, mask=in_batch, other=0)
    q_hi = tl.load(CU_Q + reqs + 1, mask=in_batch, other=0)
    n_tiles = tl.where(in_batch, tl.cdiv((q_hi - q_lo) * GROUP, BLOCK_M), 0)
    tiles_end = tl.cumsum(n_tiles, 0)
    req = tl.sum((tiles_end <= tile).to(tl.int32), 0)
    if req >= batch:  # the grid is an upper bound (no host sync to count tiles exactly)
        return
    tile_in_req = tile - tl.sum(tl.where(reqs < req, n_tiles, 0), 0)

    q_start = tl.load(CU_Q + req)
    q_len = tl.load(CU_Q + req + 1) - q_start
    if PAGED:
        kv_start = 0
        kv_len = tl.load(SEQ_K + req)
    else:
        kv_start = tl.load(CU_K + req)
        kv_len = tl.load(CU_K + req + 1) - kv_start
    context = kv_len - q_len

    # Packed rows: token-major, so one token's G heads are adjacent (contiguous in q and out).
    offs_m = tile_in_req * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < q_len * GROUP
    token = tl.minimum(offs_m // GROUP, q_len - 1)  # padding rows borrow the last token (never stored)
    head = kv_head * GROUP + offs_m % GROUP
    last_visible = context + token
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + token).to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    # KV range of the tile: up to the causal limit of its last token; positions below the limit of its
    # first token are visible to every row (no mask).
    first_token = (tile_in_req * BLOCK_M) // GROUP
    last_token = tl.minimum((tile_in_req * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
    hi = context + last_token + 1
    if SPLIT:  # splits are BLOCK_N-aligned, so no block straddles two of them
        chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(hi, lo + chunk)
    else:
        lo = 0
    unmasked_hi = tl.maximum(tl.minimum(hi, ((context + first_token + 1) // BLOCK_N) * BLOCK_N), lo)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_head = kv_head.to(tl.int64) * stride_kh
    v_head = kv_head.to(tl.int64) * stride_vh
    for start in range(lo, unmasked_hi, BLOCK_N):
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, K, V, k_head, v_head, kv_start, req, kv_len, start,
                                      last_visible, BLOCK_TABLE, stride_bt, stride_kb, stride_kt, stride_vb,
                                      stride_vt, qk_scale, HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, False,
                                      DOT_PRECISION)
    for start in range(unmasked_hi, hi, BLOCK_N):
        acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, K, V, k_head, v_head, kv_start, req, kv_len, start,
                                      last_visible, BLOCK_TABLE, stride_bt, stride_kb, stride_kt, stride_vb,
                                      stride_vt, qk_scale, HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, True,
                                      DOT_PRECISION)

    o_rows = (q_start + token).to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
    o_ptrs = O + o_rows[:, None] + offs_d[None, :]
    if not SPLIT:
        tl.store(o_ptrs, (acc / l_i[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        # Partial result of this split, normalised, with its log2-sum-exp (-inf where it saw nothing).
        seen = l_i > 0.0
        part = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        flat = (q_start + token).to(tl.int64) * NUM_Q_HEADS + head  # [total_q, H_q] row of each packed row
        plane = total_q * NUM_Q_HEADS  # int32: the int64 `flat` promotes the offsets below
        tl.store(O_PART + (split * plane + flat)[:, None] * HEAD_DIM + offs_d[None, :], part, mask=row_ok[:, None])
        tl.store(LSE_PART + split * plane + flat, lse, mask=row_ok)
        # The last split of this tile to arrive merges all of them (release: our partials are visible
        # before the count; acquire: theirs are visible to us after it).
        tl.debug_barrier()
        counter = COUNTERS + tile * NUM_KV_HEADS + kv_head
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            tl.debug_barrier()
            m_all = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            w_all = tl.zeros([BLOCK_M], dtype=tl.float32)
            out = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            for s in range(num_splits):
                lse_s = tl.load(LSE_PART + s * plane + flat, mask=row_ok, other=float("-inf"), volatile=True)
                part_s = tl.load(O_PART + (s * plane + flat)[:, None] * HEAD_DIM + offs_d[None, :],
                                 mask=row_ok[:, None], other=0.0, volatile=True)
                m_new = tl.maximum(m_all, lse_s)
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_all - m_use)
                w = tl.exp2(lse_s - m_use)
                out = out * alpha[:, None] + part_s * w[:, None]
                w_all = w_all * alpha + w
                m_all = m_new
            w_all = tl.where(w_all > 0.0, w_all, 1.0)
            tl.store(o_ptrs, (out / w_all[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
            tl.atomic_xchg(counter, 0)  # ready for the next call (the counters are cached per device)


# ----------------------------------------------------------------------------------------------- checks


def _fail(what: str) -> None:
    raise ValueError(f"verify_attention: {what}")


def _check(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor | None,
           seq_lens_k: Tensor | None, block_table: Tensor | None, out: Tensor | None) -> tuple[int, int, int, bool]:
    """Shapes, dtypes and devices of a call -> (batch, num_kv_heads, group, paged)."""
    if q.dim() != 3:
        _fail(f"q must be [total_q, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if q.dtype not in _DTYPES:
        _fail(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            _fail(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), got {t.dtype} on {t.device}")
    if k.shape != v.shape:
        _fail(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    paged = block_table is not None
    if paged == (cu_seqlens_k is not None):
        _fail("pass exactly one of cu_seqlens_k (contiguous KV) or block_table (paged KV)")
    if paged:
        if k.dim() != 4:
            _fail(f"paged k must be [num_pages, page_size, num_kv_heads, head_dim], got shape {tuple(k.shape)}")
        if seq_lens_k is None:
            _fail("paged KV needs seq_lens_k [batch] (KV positions per request, query block included)")
    elif k.dim() != 3:
        _fail(f"k must be [total_kv, num_kv_heads, head_dim], got shape {tuple(k.shape)}")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[-2]
    if k.shape[-1] != head_dim:
        _fail(f"k's head_dim must be q's ({head_dim}), got {k.shape[-1]}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        _fail(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 2:
        _fail(f"cu_seqlens_q must be 1-D [batch + 1], got shape {tuple(cu_seqlens_q.shape)}")
    batch = cu_seqlens_q.numel() - 1
    index_tensors = [("cu_seqlens_q", cu_seqlens_q, (batch + 1,))]
    if paged:
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            _fail(f"block_table must be [batch={batch}, max_pages], got shape {tuple(block_table.shape)}")
        index_tensors += [("block_table", block_table, None), ("seq_lens_k", seq_lens_k, (batch,))]
    else:
        index_tensors.append(("cu_seqlens_k", cu_seqlens_k, (batch + 1,)))
    for name, t, shape in index_tensors:
        if t.dtype not in (torch.int32, torch.int64):
            _fail(f"{name} must be int32 or int64, got {t.dtype}")
        if shape is not None and tuple(t.shape) != shape:
            _fail(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        if t.device != q.device:
            _fail(f"{name} must be on q's device ({q.device}), got {t.device}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        _fail(f"out must match q ({tuple(q.shape)}, {q.dtype}, {q.device}), got "
              f"{tuple(out.shape)}, {out.dtype}, {out.device}")
    return batch, num_kv_heads, num_q_heads // num_kv_heads, paged


# -------------------------------------------------------------------------------------------- reference


def verify_attention_reference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                               cu_seqlens_k: Tensor | None = None, *, seq_lens_k: Tensor | None = None,
                               block_table: Tensor | None = None, softmax_scale: float | None = None,
                               out: Tensor | None = None) -> Tensor:
    """Plain torch, one request at a time, fp32 math: the definition the kernel is tested against."""
    batch, _, group, paged = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seq_lens_k, block_table, out)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.empty_like(q) if out is None else out
    cu_q = cu_seqlens_q.tolist()
    for r in range(batch):
        n = cu_q[r + 1] - cu_q[r]
        if paged:
            kv_len = int(seq_lens_k[r])
            pages = block_table[r, : -(-kv_len // k.shape[1])].long()
            kr = k[pages].flatten(0, 1)[:kv_len]
            vr = v[pages].flatten(0, 1)[:kv_len]
        else:
            lo, hi = int(cu_seqlens_k[r]), int(cu_seqlens_k[r + 1])
            kr, vr = k[lo:hi], v[lo:hi]
            kv_len = hi - lo
        if n == 0:
            continue
        if kv_len < n:
            _fail(f"request {r}: kv length {kv_len} is shorter than its query block ({n})")
        kr = kr.float().repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        vr = vr.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[cu_q[r] : cu_q[r + 1]].float(), kr) * scale
        q_pos = torch.arange(kv_len - n, kv_len, device=q.device)[:, None]
        visible = torch.arange(kv_len, device=q.device)[None, :] <= q_pos
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[cu_q[r] : cu_q[r + 1]] = torch.einsum("hnl,lhd->nhd", probs, vr).to(q.dtype)
    return out


# ------------------------------------------------------------------------------------------------ Triton

_COUNTERS: dict[tuple, Tensor] = {}


def _counters(device: torch.device, n: int) -> Tensor:
    """Zeroed int32 counters for the split merge; the kernel leaves them at zero again, so they are cached
    (per device and stream: two streams in flight must not share them)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n or device.type != "cuda":  # CPU (interpreter): fresh, it is cheap
        buf = torch.zeros(max(n, 1024) if device.type == "cuda" else n, dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _default_config(device: torch.device, dtype: torch.dtype, rows_per_request: float,
                    head_dim: int) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages). Under the interpreter: small tiles (it is slow per element).
    On GPU: BLOCK_M = 128 once the packed rows of a request fill it, 64 or 16 for short blocks (a plain
    decode step, D = 0, packs only G rows per KV head); three sizes keep the compiled variants few. The
    tiles fit sm_90's registers without spilling at head_dim 128 (bf16/fp16); fp32 (tf32x3 products) gets
    narrower KV blocks."""
    if device.type != "cuda" or INTERPRET:
        return 16, 16, 4, 1
    block_m = 128 if rows_per_request > 64 else 64 if rows_per_request > 16 else 16
    if dtype == torch.float32:
        return min(block_m, 64), 32, 4, 2
    block_n = 64 if head_dim <= 128 else 32
    return block_m, block_n, 8 if block_m >= 64 else 4, 3 if head_dim <= 128 else 2


def verify_attention_triton(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                            cu_seqlens_k: Tensor | None = None, *, seq_lens_k: Tensor | None = None,
                            block_table: Tensor | None = None, softmax_scale: float | None = None,
                            out: Tensor | None = None, num_splits: int | None = None, block_m: int | None = None,
                            block_n: int | None = None, num_warps: int | None = None,
                            num_stages: int | None = None) -> Tensor:
    """The Triton kernel (CUDA tensors, or any tensors when imported under TRITON_INTERPRET=1).

    num_splits: KV splits per tile (None: enough to fill the GPU at small batch, 1 under the interpreter).
    block_m / block_n / num_warps / num_stages: tile configuration (None: `_default_config`)."""
    if triton is None:
        raise RuntimeError("verify_attention_triton: triton is not installed")
    batch, num_kv_heads, group, paged = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seq_lens_k, block_table, out)
    total_q, num_q_heads, head_dim = q.shape
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        _fail(f"head_dim must be a power of two in [16, 256] for the kernel, got {head_dim}")
    for name, t in (("q", q), ("k", k), ("v", v)) + ((("out", out),) if out is not None else ()):
        if t.stride(-1) != 1:
            _fail(f"{name} must be contiguous in head_dim (stride 1), got stride {t.stride(-1)}")
    out = torch.empty_like(q) if out is None else out
    if total_q == 0:
        return out
    cfg = _default_config(q.device, q.dtype, group * total_q / batch, head_dim)
    block_m = block_m or cfg[0]
    block_n = block_n or cfg[1]
    num_warps = num_warps or cfg[2]
    num_stages = num_stages or cfg[3]
    if block_m < 16 or block_n < 16 or block_m & (block_m - 1) or block_n & (block_n - 1):
        _fail(f"block_m and block_n must be powers of two >= 16, got {block_m} and {block_n}")
    # Upper bound on the tiles of all requests: sum_r ceil(G n_r / BM) <= ceil(G total_q / BM) + batch.
    grid_tiles = triton.cdiv(group * total_q, block_m) + batch
    if num_splits is None:
        num_splits = 1
        if q.is_cuda and not INTERPRET:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            ctas = max(triton.cdiv(group * total_q, block_m), batch) * num_kv_heads
            mean_kv = k.shape[0] // batch if not paged else block_table.shape[1] * k.shape[1]
            num_splits = max(1, min(sms // max(ctas, 1), mean_kv // 512, 16))
    if num_splits < 1:
        _fail(f"num_splits must be >= 1, got {num_splits}")

    if paged:
        stride_kb, stride_kt, stride_kh = k.stride(0), k.stride(1), k.stride(2)
        stride_vb, stride_vt, stride_vh = v.stride(0), v.stride(1), v.stride(2)
        page_size = k.shape[1]
        cu_k, seq_k, table, stride_bt = cu_seqlens_q, seq_lens_k, block_table, block_table.stride(0)
    else:
        stride_kb, stride_kt, stride_kh = 0, k.stride(0), k.stride(1)
        stride_vb, stride_vt, stride_vh = 0, v.stride(0), v.stride(1)
        page_size = 1
        cu_k, seq_k, table, stride_bt = cu_seqlens_k, cu_seqlens_k, cu_seqlens_k, 0  # unused pointers
    if num_splits > 1:
        o_part = torch.empty((num_splits, total_q, num_q_heads, head_dim), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((num_splits, total_q, num_q_heads), dtype=torch.float32, device=q.device)
        counters = _counters(q.device, grid_tiles * num_kv_heads)
    else:
        o_part = lse_part = counters = out  # unused pointers
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    grid = (grid_tiles, num_kv_heads, num_splits)
    _verify_attention_kernel[grid](
        q, k, v, out, o_part, lse_part, counters,
        cu_seqlens_q, cu_k, seq_k, table,
        q.stride(0), q.stride(1), stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
        out.stride(0), out.stride(1), stride_bt,
        batch, total_q, num_splits, scale * _LOG2E,
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_BATCH=max(64, triton.next_power_of_2(batch + 1)),
        SPLIT=num_splits > 1, PAGED=paged, PAGE_SIZE=page_size,
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def _dot_precision(dtype: torch.dtype) -> str:
    if INTERPRET:
        return "interpret"
    # fp32: three-pass TF32 on the tensor cores (about fp32 accuracy; plain "ieee" spills registers)
    return "tf32x3" if dtype == torch.float32 else "tf32"


def use_triton(t: Tensor) -> bool:
    """The dispatch rule: Triton for CUDA tensors, or for any tensor when imported under TRITON_INTERPRET=1."""
    return triton is not None and (t.is_cuda or INTERPRET)


def verify_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor | None = None, *,
                     seq_lens_k: Tensor | None = None, block_table: Tensor | None = None,
                     softmax_scale: float | None = None, out: Tensor | None = None, **config) -> Tensor:
    """Verification attention (see the module docstring for layouts): the Triton kernel where `use_triton`
    holds, the torch reference otherwise. `config` (num_splits, block_m, ...) goes to the kernel only."""
    if use_triton(q):
        return verify_attention_triton(q, k, v, cu_seqlens_q, cu_seqlens_k, seq_lens_k=seq_lens_k,
                                       block_table=block_table, softmax_scale=softmax_scale, out=out, **config)
    return verify_attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, seq_lens_k=seq_lens_k,
                                      block_table=block_table, softmax_scale=softmax_scale, out=out)
