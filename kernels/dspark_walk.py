"""The DSpark Markov walk of one block as one Triton launch (greedy; vanilla, gated and rnn heads).

`markov_walk` (proposers/dspark/heads.py) drafts a block left to right: for position j = 0 .. g - 1,

    e_j      = W1[x_{j-1}]                       (x_{-1} = the anchor)
    bias_j   = W2 u_j,  u_j = e_j (vanilla) | sigmoid(G [h_j; e_j] + b) * e_j (gated) | tanh(o_j) (rnn)
    logits_j = base_j + bias_j                   (draft_topk: only the k best base_j entries, the rest -inf)
    x_j      = argmax logits_j                   (ties: the smallest token id, as torch.argmax)

In torch that is ~5 small launches per position (gather, GEMV, add, top-k, argmax), g times, each waiting
for the previous one. Here the whole loop is one launch, in one of two shapes:

top-k (draft_topk < vocab)  The candidates do not depend on the walk: only base_j's top-k does. Programs
    (vocab chunk, row) rank the maxima of their chunk's 64-entry sub-blocks (about an argmax's work: a
    sorting network over every entry would cost ~100x that); the last chunk of a row to finish (an atomic
    counter) takes the row's k best sub-blocks, which hold its k best entries, and picks those; the last row
    of a request to finish walks it: per position a k x r projection of the candidates' W2 rows. What the
    walk loads does not depend on the walk (the candidates' W1 rows give the next position's e), so the
    candidates of all positions are loaded up front and the g steps run from registers.
full vocabulary  Every position needs W2 @ u over the whole vocabulary, and the next position needs its
    argmax: NUM_PROGRAMS programs (one per SM, a cooperative launch so all are resident) split the
    vocabulary in BLOCK_V tiles, each keeps its best (logit, id) per request, and a grid barrier (atomic
    counter) after each position lets every program reduce the partial maxima to the same token. W2 is
    streamed once per position for all requests of the batch (a [batch, r] x [r, BLOCK_V] tile product).

Numerics follow the torch path: the bias is computed with fp32 accumulation and rounded to the head's dtype
before it is added to the fp32 base logits, as the nn.Linear output is; gated/rnn round after every op as
torch does in bf16/fp16. The hidden-state halves of gate_proj / joint_proj do not depend on the walk and
are computed up front for all positions in one GEMM. (max, argmax) pairs are reduced as int64 keys
(orderable float bits << 32 | (2^31 - 1 - id)), so every reduction breaks ties towards the smallest id;
masked entries get LOWEST_KEY = key(-inf, id 2^31 - 1), below every real entry.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spec_plugins.kernels._triton import INTERPRET, dot as _dot, jit as _jit, tl, triton

HEAD_CODES = {"vanilla": 0, "gated": 1, "rnn": 2}
MAX_TOPK = 256          # candidates per row kept in registers by the walking program
MAX_BATCH_PER_LAUNCH = 64  # full-vocabulary shape: batch rows per program tile (larger batches: more launches)




@_jit
def _pack(value, index):
    """(value, index) -> int64 key, ordered by value, then by smaller index."""
    bits = (value + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 and 0.0 compare equal, as in torch
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)          # float order as signed int order
    return (key.to(tl.int64) << 32) | (0x7FFFFFFF - index).to(tl.int64)


@_jit
def _unpack_index(key):
    return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@_jit
def _round(x, ref):
    """x rounded (to nearest even) to the element type of pointer `ref` (the head's dtype), back in fp32.
    bf16 by integer arithmetic: the same bits as the GPU's cvt.rn, and the interpreter's cast truncates."""
    if ref.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(ref.dtype.element_ty).to(tl.float32)


@_jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)  # saturates cleanly at +-1 for large |x|


@_jit
def _matvec(W, stride_w, row0, x, RANK: tl.constexpr, R_PAD: tl.constexpr):
    """W[row0 : row0 + RANK, :RANK] @ x for one request (x [R_PAD] fp32, zero beyond RANK)."""
    o = tl.arange(0, R_PAD)
    i = tl.arange(0, R_PAD)
    w = tl.load(W + (row0 + o)[:, None] * stride_w + i[None, :], mask=(o[:, None] < RANK) & (i[None, :] < RANK),
                other=0.0).to(tl.float32)
    return tl.sum(w * x[None, :], 1)


@_jit
def _matmul(W, stride_w, row0, x, RANK: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """x @ W[row0 : row0 + RANK, :RANK]^T for a tile of requests (x [BLOCK_B, R_PAD] fp32)."""
    i = tl.arange(0, R_PAD)
    o = tl.arange(0, R_PAD)
    w_t = tl.load(W + (row0 + o)[None, :] * stride_w + i[:, None], mask=(i[:, None] < RANK) & (o[None, :] < RANK),
                  other=0.0)
    return _dot(x.to(W.dtype.element_ty), w_t, DOT_PRECISION)


@_jit
def _project(W, stride_w, row0, x, RANK: tl.constexpr, R_PAD: tl.constexpr, TILE: tl.constexpr,
             DOT_PRECISION: tl.constexpr):
    if TILE:
        return _matmul(W, stride_w, row0, x, RANK, R_PAD, DOT_PRECISION)
    else:
        return _matvec(W, stride_w, row0, x, RANK, R_PAD)


@_jit
def _head_step(e, state, pre, W2, WE, WS, stride_wh, HEAD: tl.constexpr, RANK: tl.constexpr, R_PAD: tl.constexpr,
               TILE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """u (what W2 multiplies) and the next rnn state from e = W1[prev] and the precomputed hidden part `pre`
    (gated: [r], rnn: [3r] as three [r] chunks g | c | o; biases included). TILE: e is [BLOCK_B, R_PAD]
    (tensor-core products), else one request's [R_PAD]. Rounded op by op as torch evaluates it."""
    if HEAD == 0:
        return e, state
    elif HEAD == 1:
        z = _project(WE, stride_wh, 0, e, RANK, R_PAD, TILE, DOT_PRECISION)
        gate = _round(tl.sigmoid(_round(z + pre, W2)), W2)
        return _round(gate * e, W2), state
    else:
        pg, pc, po = pre
        zg = _project(WS, stride_wh, 0, state, RANK, R_PAD, TILE, DOT_PRECISION) \
            + _project(WE, stride_wh, 0, e, RANK, R_PAD, TILE, DOT_PRECISION)
        zc = _project(WS, stride_wh, RANK, state, RANK, R_PAD, TILE, DOT_PRECISION) \
            + _project(WE, stride_wh, RANK, e, RANK, R_PAD, TILE, DOT_PRECISION)
        zo = _project(WS, stride_wh, 2 * RANK, state, RANK, R_PAD, TILE, DOT_PRECISION) \
            + _project(WE, stride_wh, 2 * RANK, e, RANK, R_PAD, TILE, DOT_PRECISION)
        g = _round(tl.sigmoid(_round(zg + pg, W2)), W2)
        # state = g * state + (1 - g) * tanh(c)
        kept = _round(g * state, W2)
        new = _round(_round(1.0 - g, W2) * _round(_tanh(_round(zc + pc, W2)), W2), W2)
        state = _round(kept + new, W2)
        return _round(_tanh(_round(zo + po, W2)), W2), state


@_jit
def _load_pre(PRE, base, offs_r, mask, HEAD: tl.constexpr, RANK: tl.constexpr):
    """The hidden part of the head's pre-activation at `base` (+ offs_r): gated [r], rnn three chunks."""
    if HEAD == 1:
        return tl.load(PRE + base + offs_r, mask=mask, other=0.0)
    elif HEAD == 2:
        return (tl.load(PRE + base + offs_r, mask=mask, other=0.0),
                tl.load(PRE + base + RANK + offs_r, mask=mask, other=0.0),
                tl.load(PRE + base + 2 * RANK + offs_r, mask=mask, other=0.0))
    else:
        return 0.0


@_jit
def _barrier(BAR, target):
    """Grid barrier for a cooperative launch: arrive, then spin until `target` programs have arrived."""
    tl.debug_barrier()  # this program's partials are written (by all of its threads) before it arrives
    tl.atomic_add(BAR, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(BAR, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < 4194304):  # ~seconds: give up (wrong tokens) rather than hang
        seen = tl.atomic_add(BAR, 0, sem="acquire", scope="gpu")
        spins += 1
    tl.debug_barrier()


@_jit
def _walk_full(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, PART, BAR,
               stride_bb, stride_bg, stride_w1, stride_w2, stride_wh, stride_pb, stride_pg,
               batch, g, vocab,
               HEAD: tl.constexpr, RANK: tl.constexpr, R_PAD: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_V: tl.constexpr, NUM_PROGRAMS: tl.constexpr, P_PAD: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    offs_r = tl.arange(0, R_PAD)
    r_ok = offs_r < RANK
    tile_ok = row_ok[:, None] & r_ok[None, :]
    prev = tl.load(ANCHOR + rows, mask=row_ok, other=0).to(tl.int64)
    state = tl.zeros([BLOCK_B, R_PAD], dtype=tl.float32)
    n_tiles = tl.cdiv(vocab, BLOCK_V)
    progs = tl.arange(0, P_PAD)
    for j in range(g):
        # Every program derives the same u from the same tokens (identical arithmetic, no exchange needed).
        e = tl.load(W1 + prev[:, None] * stride_w1 + offs_r[None, :], mask=tile_ok, other=0.0).to(tl.float32)
        pre = _load_pre(PRE, rows[:, None] * stride_pb + j * stride_pg, offs_r[None, :], tile_ok, HEAD, RANK)
        u, state = _head_step(e, state, pre, W2, WE, WS, stride_wh, HEAD, RANK, R_PAD, True, DOT_PRECISION)
        u = u.to(W2.dtype.element_ty)
        best = tl.full([BLOCK_B], -9187343244130779136, tl.int64)  # LOWEST_KEY
        for t in range(pid, n_tiles, NUM_PROGRAMS):
            offs_v = t * BLOCK_V + tl.arange(0, BLOCK_V)
            v_ok = offs_v < vocab
            w2 = tl.load(W2 + offs_v[:, None].to(tl.int64) * stride_w2 + offs_r[None, :],
                         mask=v_ok[:, None] & r_ok[None, :], other=0.0)
            bias = _round(_dot(u, tl.trans(w2), DOT_PRECISION), W2)  # [BLOCK_B, BLOCK_V]
            mask = row_ok[:, None] & v_ok[None, :]
            base = tl.load(BASE + rows[:, None].to(tl.int64) * stride_bb + j * stride_bg + offs_v[None, :],
                           mask=mask, other=0.0).to(tl.float32)
            key = tl.where(mask, _pack(base + bias, offs_v[None, :]), -9187343244130779136)
            best = tl.maximum(best, tl.max(key, 1))
        # One slot per (position, program): a fast program never overwrites what a slow one still reads.
        slot = PART + (j * NUM_PROGRAMS) * BLOCK_B
        tl.store(slot + pid * BLOCK_B + rows, best)
        _barrier(BAR, (j + 1) * NUM_PROGRAMS)
        parts = tl.load(slot + progs[:, None] * BLOCK_B + rows[None, :], mask=progs[:, None] < NUM_PROGRAMS,
                        other=-9187343244130779136, volatile=True)
        token = _unpack_index(tl.max(parts, 0))
        if pid == 0:
            tl.store(OUT + rows * g + j, token.to(tl.int64), mask=row_ok)
        prev = token.to(tl.int64)
    # The barrier counter is cached between calls: the last program out resets it.
    done = tl.atomic_add(BAR + 1, 1, sem="acq_rel", scope="gpu")
    if done == NUM_PROGRAMS - 1:
        tl.atomic_xchg(BAR, 0)
        tl.atomic_xchg(BAR + 1, 0)


@_jit
def _candidate_token(e, state, pre, w2c, base_c, cand, slot_ok, W2, WE, WS, stride_wh, HEAD: tl.constexpr,
                     RANK: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One position of one request over its candidates: (best key, next rnn state). e = W1[x_{j-1}] [R_PAD];
    w2c [K_PAD, R_PAD] and base_c [K_PAD] belong to the candidates `cand` (valid where slot_ok)."""
    u, state = _head_step(e, state, pre, W2, WE, WS, stride_wh, HEAD, RANK, R_PAD, False, DOT_PRECISION)
    bias = _round(tl.sum(w2c * u[None, :], 1), W2)
    key = tl.where(slot_ok, _pack(base_c + bias, cand), -9187343244130779136)
    return tl.max(key, 0), state


@_jit
def _walk_topk(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, PART, CAND, COUNTS,
               stride_bb, stride_bg, stride_w1, stride_w2, stride_wh, stride_pb, stride_pg,
               batch, g, vocab,
               HEAD: tl.constexpr, RANK: tl.constexpr, R_PAD: tl.constexpr, TOPK: tl.constexpr,
               K_PAD: tl.constexpr, BLOCK_V: tl.constexpr, N_CHUNKS: tl.constexpr, C_PAD: tl.constexpr,
               SUB: tl.constexpr, G_PAD: tl.constexpr, PRELOAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    chunk = tl.program_id(0)
    row = tl.program_id(1)  # request * g + position
    request = row // g
    base_row = BASE + request.to(tl.int64) * stride_bb + (row % g) * stride_bg
    # 1. The chunk's K_PAD best sub-blocks of SUB entries, ranked by their maximum. A sorting network over
    #    every entry would cost ~100x an argmax; the maxima cost about what an argmax does, and the row's
    #    top-k entries all lie in its top-k sub-blocks (a sub-block outside them has k better maxima above
    #    each of its entries), which in turn lie among the chunks' top-k sub-blocks.
    subs = tl.arange(0, BLOCK_V // SUB)
    offs = chunk * BLOCK_V + subs[:, None] * SUB + tl.arange(0, SUB)[None, :]
    vals = tl.load(base_row + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
    sub_max, arg = tl.max(vals, 1, return_indices=True, return_indices_tie_break_left=True)
    sub_start = chunk * BLOCK_V + subs * SUB
    keys = tl.where(sub_start < vocab, _pack(sub_max, sub_start + arg), -9187343244130779136)
    tl.store(PART + (row * N_CHUNKS + chunk) * K_PAD + tl.arange(0, K_PAD), tl.topk(keys, K_PAD))
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTS + row, 1, sem="acq_rel", scope="gpu")
    if arrived == N_CHUNKS - 1:
        # 2. The row's last chunk to finish: the row's best sub-blocks, then the best entries inside them.
        tl.debug_barrier()
        tl.atomic_xchg(COUNTS + row, 0)  # counters are cached between calls
        c = tl.arange(0, C_PAD)
        k = tl.arange(0, K_PAD)
        parts = tl.load(PART + (row * N_CHUNKS + c[:, None]) * K_PAD + k[None, :], mask=c[:, None] < N_CHUNKS,
                        other=-9187343244130779136, volatile=True)
        best_subs = tl.topk(tl.reshape(parts, [C_PAD * K_PAD]), K_PAD)
        sub_ok = best_subs != -9187343244130779136
        starts = (_unpack_index(best_subs) // SUB) * SUB
        # (new names: a Triton `if` may not rebind an outer variable to another shape)
        cand_offs = starts[:, None] + tl.arange(0, SUB)[None, :]
        cand_ok = sub_ok[:, None] & (cand_offs < vocab)
        cand_vals = tl.load(base_row + cand_offs, mask=cand_ok, other=float("-inf")).to(tl.float32)
        cand_keys = tl.where(cand_ok, _pack(cand_vals, cand_offs), -9187343244130779136)
        top = tl.topk(tl.reshape(cand_keys, [K_PAD * SUB]), K_PAD)  # best first: the first TOPK are the row's
        tl.store(CAND + row * K_PAD + k, _unpack_index(top))
        tl.debug_barrier()
        rows_done = tl.atomic_add(COUNTS + batch * g + request, 1, sem="acq_rel", scope="gpu")
        if rows_done == g - 1:
            # 3. The request's last row to finish walks it.
            tl.debug_barrier()
            tl.atomic_xchg(COUNTS + batch * g + request, 0)
            _walk_request(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, CAND, request, stride_bb, stride_bg, stride_w1,
                          stride_w2, stride_wh, stride_pb, stride_pg, g, HEAD, RANK, R_PAD, TOPK, K_PAD, G_PAD,
                          PRELOAD, DOT_PRECISION)


@_jit
def _walk_request(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, CAND, request, stride_bb, stride_bg, stride_w1,
                  stride_w2, stride_wh, stride_pb, stride_pg, g, HEAD: tl.constexpr, RANK: tl.constexpr,
                  R_PAD: tl.constexpr, TOPK: tl.constexpr, K_PAD: tl.constexpr, G_PAD: tl.constexpr,
                  PRELOAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The sequential walk of one request over its per-position candidates. Nothing it loads depends on the
    walk (the candidates' W1 rows give the next e), so with PRELOAD everything is loaded up front and the
    g steps run from registers; otherwise each step loads its own position's candidates."""
    slots = tl.arange(0, K_PAD)
    slot_ok = slots < TOPK
    offs_r = tl.arange(0, R_PAD)
    r_ok = offs_r < RANK
    base_req = BASE + request.to(tl.int64) * stride_bb
    anchor = tl.load(ANCHOR + request).to(tl.int64)
    e = tl.load(W1 + anchor * stride_w1 + offs_r, mask=r_ok, other=0.0).to(tl.float32)
    state = tl.zeros([R_PAD], dtype=tl.float32)
    if PRELOAD:
        pos = tl.arange(0, G_PAD)
        ok2 = (pos < g)[:, None] & slot_ok[None, :]
        ok3 = ok2[:, :, None] & r_ok[None, None, :]
        cand = tl.load(CAND + (request * g + pos)[:, None] * K_PAD + slots[None, :], mask=ok2, other=0,
                       volatile=True)
        cand64 = cand.to(tl.int64)
        base_c = tl.load(base_req + pos[:, None] * stride_bg + cand64, mask=ok2, other=0.0).to(tl.float32)
        w2c = tl.load(W2 + cand64[:, :, None] * stride_w2 + offs_r[None, None, :], mask=ok3, other=0.0)
        w1c = tl.load(W1 + cand64[:, :, None] * stride_w1 + offs_r[None, None, :], mask=ok3, other=0.0)
        for j in range(g):
            at = (pos == j)[:, None]  # position j's slice, picked out exactly (one non-zero term per sum)
            pre = _load_pre(PRE, request * stride_pb + j * stride_pg, offs_r, r_ok, HEAD, RANK)
            best, state = _candidate_token(e, state, pre, tl.sum(tl.where(at[:, :, None], w2c, 0.0), 0).to(tl.float32),
                                           tl.sum(tl.where(at, base_c, 0.0), 0), tl.sum(tl.where(at, cand, 0), 0),
                                           slot_ok, W2, WE, WS, stride_wh, HEAD, RANK, R_PAD, DOT_PRECISION)
            token = _unpack_index(best)
            tl.store(OUT + request * g + j, token.to(tl.int64))
            hit = at & (cand == token) & slot_ok[None, :]  # the chosen candidate: its W1 row is the next e
            e = tl.sum(tl.sum(tl.where(hit[:, :, None], w1c, 0.0), 0), 0).to(tl.float32)
    else:
        for j in range(g):
            cand = tl.load(CAND + (request * g + j) * K_PAD + slots, mask=slot_ok, other=0, volatile=True)
            cand64 = cand.to(tl.int64)
            base_c = tl.load(base_req + j * stride_bg + cand64, mask=slot_ok, other=0.0).to(tl.float32)
            w2c = tl.load(W2 + cand64[:, None] * stride_w2 + offs_r[None, :], mask=slot_ok[:, None] & r_ok[None, :],
                          other=0.0).to(tl.float32)
            pre = _load_pre(PRE, request * stride_pb + j * stride_pg, offs_r, r_ok, HEAD, RANK)
            best, state = _candidate_token(e, state, pre, w2c, base_c, cand, slot_ok, W2, WE, WS, stride_wh, HEAD,
                                           RANK, R_PAD, DOT_PRECISION)
            token = _unpack_index(best)
            tl.store(OUT + request * g + j, token.to(tl.int64))
            e = tl.load(W1 + token.to(tl.int64) * stride_w1 + offs_r, mask=r_ok, other=0.0).to(tl.float32)


@_jit(do_not_specialize=["batch"])  # one compiled variant for every batch size
def _dspark_walk_kernel(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, PART, CAND, COUNTS,
                        stride_bb, stride_bg, stride_w1, stride_w2, stride_wh, stride_pb, stride_pg,
                        batch, g, vocab,
                        HEAD: tl.constexpr, RANK: tl.constexpr, R_PAD: tl.constexpr, TOPK: tl.constexpr,
                        K_PAD: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
                        N_CHUNKS: tl.constexpr, C_PAD: tl.constexpr, SUB: tl.constexpr, G_PAD: tl.constexpr,
                        PRELOAD: tl.constexpr, NUM_PROGRAMS: tl.constexpr, P_PAD: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """TOPK > 0: grid (N_CHUNKS, batch * g), `_walk_topk`; TOPK == 0: grid (NUM_PROGRAMS,), `_walk_full`."""
    if TOPK > 0:
        _walk_topk(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, PART, CAND, COUNTS,
                   stride_bb, stride_bg, stride_w1, stride_w2, stride_wh, stride_pb, stride_pg, batch, g, vocab,
                   HEAD, RANK, R_PAD, TOPK, K_PAD, BLOCK_V, N_CHUNKS, C_PAD, SUB, G_PAD, PRELOAD, DOT_PRECISION)
    else:
        _walk_full(BASE, ANCHOR, W1, W2, PRE, WE, WS, OUT, PART, COUNTS,
                   stride_bb, stride_bg, stride_w1, stride_w2, stride_wh, stride_pb, stride_pg, batch, g, vocab,
                   HEAD, RANK, R_PAD, BLOCK_B, BLOCK_V, NUM_PROGRAMS, P_PAD, DOT_PRECISION)


# --------------------------------------------------------------------------------------------- host side


def _fail(what: str) -> None:
    raise ValueError(f"dspark_walk: {what}")


def _check(hidden: Tensor, base_logits: Tensor, anchor: Tensor, markov, draft_topk: int | None) -> None:
    if base_logits.dim() != 3:
        _fail(f"base_logits must be [batch, g, vocab], got shape {tuple(base_logits.shape)}")
    b, g, vocab = base_logits.shape
    if not base_logits.is_floating_point():
        _fail(f"base_logits must be a floating-point tensor, got {base_logits.dtype}")
    if hidden.dim() != 3 or tuple(hidden.shape[:2]) != (b, g):
        _fail(f"hidden must be [batch={b}, g={g}, hidden_size], got shape {tuple(hidden.shape)}")
    if tuple(anchor.shape) != (b,) or anchor.is_floating_point():
        _fail(f"anchor must be integer token ids [batch={b}], got {anchor.dtype} of shape {tuple(anchor.shape)}")
    if draft_topk is not None and draft_topk < 1:
        _fail(f"draft_topk must be >= 1 or None, got {draft_topk}")
    if markov is None:
        return
    if markov.head_type not in HEAD_CODES:
        _fail(f"markov.head_type must be one of {tuple(HEAD_CODES)}, got {markov.head_type!r}")
    if markov.markov_w2.out_features != markov.markov_w1.num_embeddings:
        raise NotImplementedError("dspark_walk: reduced draft vocabularies (d2t) are not supported yet")
    if markov.markov_w2.out_features != vocab:
        _fail(f"base_logits' vocab ({vocab}) must be markov_w2's out_features ({markov.markov_w2.out_features})")
    for t, name in ((hidden, "hidden"), (base_logits, "base_logits"), (anchor, "anchor")):
        if t.device != markov.markov_w1.weight.device:
            _fail(f"{name} must be on the head's device ({markov.markov_w1.weight.device}), got {t.device}")


@torch.no_grad()
def dspark_walk_reference(hidden: Tensor, base_logits: Tensor, anchor: Tensor, markov,
                          draft_topk: int | None = None) -> Tensor:
    """The project's walk (`markov_walk`, greedy, no confidence head): drafted tokens [batch, g] int64."""
    from spec_plugins.proposers.dspark.heads import markov_walk

    _check(hidden, base_logits, anchor, markov, draft_topk)
    return markov_walk(hidden, base_logits, anchor, markov, None, 0.0, draft_topk=draft_topk).tokens


LOWEST_KEY = -9187343244130779136  # the literal in the kernels (a jit function reads no plain globals)
_WORKSPACE: dict[tuple, Tensor] = {}


def _counters(device: torch.device, n: int) -> Tensor:
    """Zeroed int32 counters; the kernel leaves them at zero, so on CUDA they are cached per device and
    stream (two streams in flight must not share them). Under the interpreter: fresh ones."""
    if device.type != "cuda":
        return torch.zeros(n, dtype=torch.int32, device=device)
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _WORKSPACE[key] = buf
    return buf


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _head_operands(hidden: Tensor, markov) -> tuple[int, Tensor, Tensor, Tensor, int]:
    """(head code, PRE [b, g, r | 3r] fp32, WE, WS, row stride of WE/WS): the hidden-state part of the
    gate / joint projection for every position (one GEMM: it does not depend on the walk), and the views
    of the weight columns that multiply e (and the rnn state)."""
    head = HEAD_CODES[markov.head_type]
    w1 = markov.markov_w1.weight
    if head == 0:
        return head, w1, w1, w1, 0  # unused pointers
    rank, d = markov.rank, hidden.shape[-1]
    proj = markov.gate_proj if head == 1 else markov.joint_proj
    weight = proj.weight  # gated: [r, d + r] on [h; e]; rnn: [3r, 2r + d] on [s; e; h]
    for name, t in (("markov_w2", markov.markov_w2.weight), ("projection", weight)):
        if t.dtype != w1.dtype:
            _fail(f"all Markov head weights must share markov_w1's dtype ({w1.dtype}), {name} is {t.dtype}")
    hidden_cols = weight[:, :d] if head == 1 else weight[:, 2 * rank :]
    pre = hidden.float() @ hidden_cols.float().t()
    if proj.bias is not None:
        pre = pre + proj.bias.float()
    if head == 1:
        return head, pre.contiguous(), weight[:, d:], weight[:, d:], weight.stride(0)
    return head, pre.contiguous(), weight[:, rank : 2 * rank], weight[:, :rank], weight.stride(0)


@torch.no_grad()
def dspark_walk_triton(hidden: Tensor, base_logits: Tensor, anchor: Tensor, markov,
                       draft_topk: int | None = None, *, num_programs: int | None = None,
                       block_v: int | None = None, sub_block: int | None = None, preload: bool | None = None,
                       num_warps: int | None = None) -> Tensor:
    """The walk as one Triton launch (CUDA tensors, or any under TRITON_INTERPRET=1): tokens [batch, g] int64.

    num_programs (full vocabulary only): co-resident programs sharing the vocabulary (None: one per SM;
    always 1 under the interpreter, which runs programs one after another and could not pass a barrier).
    block_v: vocabulary tile (None: 128 full / 16384 top-k chunks on GPU, 64 under the interpreter).
    sub_block, preload (top-k only): entries per ranked sub-block (None: 64 on GPU, 4 under the interpreter),
    and whether the walking program loads all positions' candidates up front (None: not on a GPU, where
    loading them per step measured faster for the vanilla and rnn heads and level for gated; under the
    interpreter when they fit, so the tests cover that path)."""
    if triton is None:
        raise RuntimeError("dspark_walk_triton: triton is not installed")
    _check(hidden, base_logits, anchor, markov, draft_topk)
    if markov is None:  # plain DFlash rows: nothing sequential
        return base_logits.argmax(-1)
    b, g, vocab = base_logits.shape
    device = base_logits.device
    out = torch.empty((b, g), dtype=torch.int64, device=device)
    if b == 0 or g == 0:
        return out
    if base_logits.stride(-1) != 1:
        base_logits = base_logits.contiguous()
    w1, w2 = markov.markov_w1.weight, markov.markov_w2.weight
    if w1.stride(-1) != 1 or w2.stride(-1) != 1:
        _fail("markov_w1 / markov_w2 weights must be contiguous in the rank dimension")
    for name, value in (("block_v", block_v), ("sub_block", sub_block)):
        if value is not None and (value < 1 or value & (value - 1)):
            _fail(f"{name} must be a power of two, got {value}")
    head, pre, we, ws, stride_wh = _head_operands(hidden, markov)
    rank = markov.rank
    r_pad = max(16, _pow2(rank))
    on_gpu = device.type == "cuda" and not INTERPRET
    # fp32: full-precision products, not TF32; under the interpreter see `_dot`. No FMA contraction either
    # (enable_fp_fusion=False below): torch rounds every product of the gated/rnn updates.
    dot_precision = "interpret" if INTERPRET else "ieee" if w1.dtype == torch.float32 else "tf32"
    anchor = anchor.contiguous()
    common = dict(HEAD=head, RANK=rank, R_PAD=r_pad, DOT_PRECISION=dot_precision)
    strides = (base_logits.stride(0), base_logits.stride(1), w1.stride(0), w2.stride(0), stride_wh,
               pre.stride(0) if head else 0, pre.stride(1) if head else 0)

    if draft_topk is not None and draft_topk < vocab:
        if draft_topk > MAX_TOPK:
            _fail(f"draft_topk must be <= {MAX_TOPK} for the kernel, got {draft_topk}")
        k_pad = _pow2(draft_topk)
        # GPU: ~10 fat chunks per row of a 152k vocabulary (few programs, 32 KB of bf16 in flight each)
        sub = sub_block or (64 if on_gpu else 4)
        block = max(block_v or (16384 if on_gpu else 64), sub * k_pad)  # >= k_pad sub-blocks per chunk
        n_chunks = triton.cdiv(vocab, block)
        g_pad = _pow2(g)
        if preload is None:  # the candidates' W2 and W1 rows of all positions in registers: slower on an H200
            preload = not on_gpu and g_pad * k_pad * r_pad <= 16384  # (0.15 / 0.34 ms against 0.10 / 0.19)
        part = torch.empty((b * g, n_chunks, k_pad), dtype=torch.int64, device=device)
        cand = torch.empty((b * g, k_pad), dtype=torch.int32, device=device)
        counts = _counters(device, b * g + b)
        _dspark_walk_kernel[(n_chunks, b * g)](
            base_logits, anchor, w1, w2, pre, we, ws, out, part, cand, counts, *strides, b, g, vocab,
            TOPK=draft_topk, K_PAD=k_pad, BLOCK_B=16, BLOCK_V=block, N_CHUNKS=n_chunks, C_PAD=_pow2(n_chunks),
            SUB=sub, G_PAD=g_pad, PRELOAD=bool(preload), NUM_PROGRAMS=1, P_PAD=1, num_warps=num_warps or 8,
            enable_fp_fusion=False, **common)
        return out

    # Full vocabulary: one cooperative launch per MAX_BATCH_PER_LAUNCH requests.
    block = block_v or (128 if on_gpu else 64)
    n_tiles = triton.cdiv(vocab, block)
    if on_gpu:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        programs = min(num_programs or sms, sms, n_tiles)
    else:
        programs = 1
    for lo in range(0, b, MAX_BATCH_PER_LAUNCH):
        hi = min(b, lo + MAX_BATCH_PER_LAUNCH)
        block_b = max(16, _pow2(hi - lo))
        part = torch.empty((g, programs, block_b), dtype=torch.int64, device=device)
        bar = _counters(device, 2)
        sub_pre = pre[lo:hi] if head else pre
        _dspark_walk_kernel[(programs,)](
            base_logits[lo:hi], anchor[lo:hi], w1, w2, sub_pre, we, ws, out[lo:hi], part, part, bar, *strides,
            hi - lo, g, vocab, TOPK=0, K_PAD=1, BLOCK_B=block_b, BLOCK_V=block, N_CHUNKS=1, C_PAD=1, SUB=1,
            G_PAD=1, PRELOAD=False, NUM_PROGRAMS=programs, P_PAD=_pow2(programs), num_warps=num_warps or 4,
            launch_cooperative_grid=on_gpu, enable_fp_fusion=False, **common)
    return out


def use_triton(t: Tensor) -> bool:
    """The dispatch rule: Triton for CUDA tensors, or for any tensor when imported under TRITON_INTERPRET=1."""
    return triton is not None and (t.is_cuda or INTERPRET)


def dspark_walk(hidden: Tensor, base_logits: Tensor, anchor: Tensor, markov, draft_topk: int | None = None,
                **config) -> Tensor:
    """Greedy DSpark drafts of one block per request, tokens [batch, g] int64 (= `markov_walk(...).tokens` at
    temperature 0): the Triton kernel where `use_triton` holds, the torch walk otherwise. hidden [b, g, d]
    final-normed backbone rows, base_logits [b, g, V] = lm_head(hidden), anchor [b] the last committed
    tokens, markov a `MarkovHead` (or None: plain argmax). `config` goes to the kernel only."""
    if use_triton(base_logits):
        return dspark_walk_triton(hidden, base_logits, anchor, markov, draft_topk, **config)
    return dspark_walk_reference(hidden, base_logits, anchor, markov, draft_topk)
