"""Modelled time of one engine step that verifies drafts, and the draft-length guidelines it implies.

A step verifies B requests; request r feeds 1 + D_r query tokens over a context of L_r tokens:

    T = overhead + linear(Σ(1 + D_r)) + Σ attention(D_r, L_r) + draft(D_1..D_B)

`RooflineCost` fills the parts from a hardware profile and a model shape. Each part is a roofline
max(FLOPs / achievable peak, bytes / achievable bandwidth) with the FLOPs counted on whole tiles, so the
guidelines of benchmarks-and-guidelines.md §4 fall out of it: GEMMs stay flat in D until the row count
passes the ridge point (`compute_bound_rows`), attention stays flat until G·(1+D) fills a tile
(`attention_draft_limit`), and costs step at tile boundaries (`tile_aligned_drafts`).
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import pydantic

from spec_plugins import _contract
from spec_plugins.policy.hardware import DTYPE_BYTES, HardwareProfile, canonical_dtype, load_hardware
from spec_plugins.policy.model import ModelDescriptor, load_model_config


def _round_up(rows: int, tile: int) -> int:
    return -(-rows // tile) * tile


class CostModel:
    """Modelled seconds of one engine step. Subclasses define the three parts."""

    overhead_s: float = 0.0

    def linear_time(self, rows: int) -> float:
        """All token-parallel work (every GEMM incl. the LM head, norms) for `rows` query tokens; 0 -> 0.0."""
        raise NotImplementedError

    def attention_time(self, draft_len: int, context_len: int) -> float:
        """One request's decode attention over all layers, 1 + draft_len query positions."""
        raise NotImplementedError

    def draft_time(self, draft_lens: Sequence[int]) -> float:
        """Drafting cost for the batch; requests with draft length 0 do not draft."""
        raise NotImplementedError

    def attention_times(self, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        """attention_time element by element (subclasses compute it on the arrays)."""
        return np.array([self.attention_time(int(d), int(c)) for d, c in zip(draft_lens, context_lens)],
                        dtype=np.float64)

    def linear_times(self, rows: np.ndarray) -> np.ndarray:
        """linear_time element by element."""
        return np.array([self.linear_time(int(r)) for r in np.asarray(rows).tolist()], dtype=np.float64)

    def verify_time(self, draft_lens: Sequence[int], context_lens: Sequence[int]) -> float:
        """The target's part of the step: T_verif of the speedup formula."""
        if len(draft_lens) != len(context_lens):
            raise ValueError(f"step: {len(draft_lens)} draft lengths for {len(context_lens)} context lengths")
        d = np.asarray(draft_lens, dtype=np.int64)
        length = np.asarray(context_lens, dtype=np.int64)
        if d.size and (d.min() < 0 or length.min() < 0):
            i = int(np.flatnonzero((d < 0) | (length < 0))[0])
            raise ValueError(f"step: expected draft and context lengths >= 0, got {d[i]} and {length[i]}")
        rows = int(np.sum(1 + d))
        # Summed in request order as Python floats: the allocator's step times must agree to the last bit.
        attention = sum(self.attention_times(d, length).tolist(), 0.0)
        return self.overhead_s + self.linear_time(rows) + attention

    def step_time(self, draft_lens: Sequence[int], context_lens: Sequence[int]) -> float:
        """overhead + linear_time(Σ(1 + d)) + Σ attention_time(d, L) + draft_time(draft_lens)."""
        return self.verify_time(draft_lens, context_lens) + self.draft_time(draft_lens)

    def speedup(self, batch: int, draft_len: int, acceptance_length: float, context_len: int) -> float:
        """T_verif(B)·AL / (T_verif(B(1+D)) + T_draft(B, D)) for B requests with equal D and L.

        Both times come from `step_time`, so the formula is the cost model's own prediction rather
        than a separate approximation. AL counts accepted drafts plus the bonus token: 1 ≤ AL ≤ 1 + D.
        """
        if batch < 1 or draft_len < 0:
            raise ValueError(f"speedup: expected batch >= 1 and draft_len >= 0, got {batch} and {draft_len}")
        if not 1 <= acceptance_length <= 1 + draft_len:
            raise ValueError(
                f"speedup.acceptance_length: expected a value in [1, {1 + draft_len}], got {acceptance_length}"
            )
        contexts = [context_len] * batch
        baseline = self.verify_time([0] * batch, contexts)  # = step_time of a step that drafts nothing
        return baseline * acceptance_length / self.step_time([draft_len] * batch, contexts)


class DraftCost(pydantic.BaseModel):
    """How drafting costs time. A request with draft length 0 does not draft and costs nothing.

    model_free: n-gram / suffix lookups on the host, measured per request and per drafted token.
    block:      DFlash / DSpark: one forward of a small drafter for the whole block; each drafting
                request feeds `block_size` rows (None: 1 + its draft length, the anchor and D masks).
    sequential: EAGLE / MTP: one small forward per draft position, each over the requests still
                drafting at that position (one row each).
    The drafter's layers have the target's attention shape and a dense MLP of its intermediate width;
    its attention over the context is left out (draft_layers ≪ layers makes it a small share).
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    kind: Literal["model_free", "block", "sequential"] = "model_free"
    per_request_us: float = pydantic.Field(default=5.0, ge=0)
    per_token_us: float = pydantic.Field(default=0.5, ge=0)
    draft_layers: int = pydantic.Field(default=1, ge=1)
    block_size: int | None = pydantic.Field(default=None, ge=1)
    # Rows of the drafter's LM head: None = the target's vocabulary (MTP, DFlash), 0 = none; EAGLE-3
    # heads use a reduced draft vocabulary (32k).
    draft_vocab: int | None = pydantic.Field(default=None, ge=0)
    # Fixed cost per drafter forward (launches not captured in a CUDA graph).
    forward_overhead_us: float = pydantic.Field(default=0.0, ge=0)


class RooflineCost(CostModel):
    """Roofline step cost of `model` on `hardware` with weights and GEMMs in `dtype`.

    kv_dtype: the KV cache's dtype; vLLM's kv_cache_dtype="auto" keeps bf16 KV for fp8 weights.
    overhead_s: fixed seconds per step; None takes the profile's step_overhead_us.
    """

    def __init__(
        self,
        hardware: HardwareProfile | str,
        model: ModelDescriptor | str,
        dtype: str = "bf16",
        drafter: DraftCost | None = None,
        kv_dtype: str = "bf16",
        overhead_s: float | None = None,
    ) -> None:
        self.hardware = load_hardware(hardware)
        self.model = model if isinstance(model, ModelDescriptor) else load_model_config(model)
        self.dtype = canonical_dtype(dtype, "cost.dtype")
        self.kv_dtype = canonical_dtype(kv_dtype, "cost.kv_dtype")
        self.drafter = drafter if drafter is not None else DraftCost()
        self.overhead_s = self.hardware.step_overhead_us * 1e-6 if overhead_s is None else float(overhead_s)
        if self.overhead_s < 0:
            raise ValueError(f"cost.overhead_s: expected >= 0, got {self.overhead_s}")
        hw = self.hardware
        # Achievable rates; peak_flops raises for a dtype the GPU lacks (fp8 on A100).
        self._gemm_rate = hw.peak_flops(self.dtype) * hw.gemm_efficiency
        self._attn_rate = hw.peak_flops(self.kv_dtype) * hw.gemm_efficiency
        self._byte_rate = hw.bandwidth * hw.bandwidth_efficiency
        self._wbytes = DTYPE_BYTES[self.dtype]
        self._kvbytes = DTYPE_BYTES[self.kv_dtype]
        self._linear_cache: dict[int, float] = {}
        self._linear_curve = np.zeros(0)  # linear_time(0), linear_time(1), ...: filled on demand, kept
        self._forward_cache: dict[int, float] = {}
        self._attention_curve = np.zeros(0)  # attention_curve: filled on demand, kept

    # -- linear layers ---------------------------------------------------------------------------

    def _layer_cost(self, rows: int) -> tuple[float, float]:
        """(FLOPs, bytes) of one target decoder layer's GEMMs for `rows` tokens, rows on whole tiles."""
        m = self.model
        tile = self.hardware.gemm_tile_rows
        dense = m.attn_params + m.dense_mlp_params
        flops = 2.0 * dense * _round_up(rows, tile)
        streamed = dense
        touched = m.experts_touched(rows)
        if touched:
            # rows·k token-expert pairs spread evenly over the experts touched; each expert's grouped
            # GEMM is padded to whole tiles on its own.
            per_expert = -(-rows * m.experts_per_token // touched)
            flops += 2.0 * m.expert_params * touched * _round_up(per_expert, tile)
            streamed += touched * m.expert_params
        return flops, streamed * self._wbytes

    def _gemm_cost(self, params: int, rows: int) -> tuple[float, float]:
        """(FLOPs, bytes) of one dense GEMM group of `params` weights for `rows` tokens."""
        return 2.0 * params * _round_up(rows, self.hardware.gemm_tile_rows), params * self._wbytes

    def _time(self, flops: float, nbytes: float) -> float:
        return max(flops / self._gemm_rate, nbytes / self._byte_rate)

    def linear_flops(self, rows: int) -> float:
        """GEMM FLOPs of a `rows`-token step (rows rounded up to tiles), LM head included."""
        if rows <= 0:
            return 0.0
        return self.model.layers * self._layer_cost(rows)[0] + self._gemm_cost(self.model.lm_head_params, rows)[0]

    def linear_bytes(self, rows: int) -> float:
        """Weight bytes a `rows`-token step streams, LM head included."""
        if rows <= 0:
            return 0.0
        return self.model.layers * self._layer_cost(rows)[1] + self._gemm_cost(self.model.lm_head_params, rows)[1]

    def linear_time(self, rows: int) -> float:
        """Each layer is bound by its own roofline: layers · max(compute, bytes) + the LM head's.

        Norms, residual adds and activations are elementwise over rows·hidden values: under 0.1% of the
        weight traffic at decode batch sizes, so they are left out. Cached by rows: allocators call this
        thousands of times per step.
        """
        cached = self._linear_cache.get(rows)
        if cached is not None:
            return cached
        if rows < 0:
            raise ValueError(f"linear_time.rows: expected >= 0, got {rows}")
        t = 0.0
        if rows:
            t = self.model.layers * self._time(*self._layer_cost(rows))
            t += self._time(*self._gemm_cost(self.model.lm_head_params, rows))
        self._linear_cache[rows] = t
        return t

    def linear_times(self, rows: np.ndarray) -> np.ndarray:
        """linear_time for an array of row counts, read off a curve computed once per row count."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros(0)
        if rows.min() < 0:
            raise ValueError(f"linear_time.rows: expected >= 0, got {int(rows.min())}")
        return self.linear_curve(int(rows.max()) + 1)[rows]

    def linear_curve(self, size: int) -> np.ndarray:
        """linear_time(0), linear_time(1), ...: at least `size` entries, computed once and kept."""
        have = len(self._linear_curve)
        if size > have:
            grown = max(size, 2 * have, 256)
            rows = np.arange(have, grown, dtype=np.int64)
            # The cost reads rows only through whole GEMM tiles (and, for MoE, the experts touched and their
            # tiles: _layer_cost), so linear_time runs once per distinct tiling and is read back for every row:
            # a big batch's first step grows the curve by thousands of rows, and the GPU waits for its drafts.
            m, tile = self.model, self.hardware.gemm_tile_rows
            touched = np.minimum(m.num_experts, rows * m.experts_per_token) if m.is_moe else np.zeros_like(rows)
            per_expert = np.where(touched > 0, -(-rows * m.experts_per_token // np.maximum(touched, 1)), 0)
            keys = np.stack([-(-rows // tile), touched, -(-per_expert // tile)], axis=1)
            _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
            values = np.array([self.linear_time(int(rows[i])) for i in first.tolist()])
            self._linear_curve = np.concatenate([self._linear_curve, values[inverse.ravel()]])
        return self._linear_curve

    # -- attention -------------------------------------------------------------------------------

    def attention_tiles(self, draft_len: int) -> int:
        """K/V tile loads per KV head: the G·(1 + D) query rows packed into attention tiles."""
        return -(-self.model.group_size * (1 + draft_len) // self.hardware.attention_tile_rows)

    def attention_curve(self, size: int) -> np.ndarray:
        """Attention seconds per context token of a request verifying D = 0, 1, ... draft rows: at least `size`
        entries, computed once and kept. Per query tile the KV is read once and 4·head_dim FLOPs are done per
        row and token, with the G·(1 + D) rows of each KV head on whole tiles; both grow with the context, so a
        request's attention is its context length times this curve. The compiled walk (policy/_trim.cpp) reads
        the same curve, so both price attention with the same numbers."""
        have = len(self._attention_curve)
        if size > have:
            m, tile_rows = self.model, self.hardware.attention_tile_rows
            d = np.arange(max(size, 2 * have, 64), dtype=np.int64)
            tiles = (-(-m.group_size * (1 + d) // tile_rows)).astype(np.float64)
            kv = 2.0 * m.kv_heads * m.head_dim * self._kvbytes * tiles
            flops = 4.0 * m.kv_heads * tiles * tile_rows * m.head_dim
            self._attention_curve = m.layers * np.maximum(flops / self._attn_rate, kv / self._byte_rate)
        return self._attention_curve

    def attention_time(self, draft_len: int, context_len: int) -> float:
        """KV read once per query tile; FLOPs = 4·heads·head_dim·L·(1+D) with the rows on whole tiles."""
        if context_len <= 0:
            return 0.0
        return float(context_len) * float(self.attention_curve(draft_len + 1)[draft_len])

    def attention_times(self, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        """attention_time on arrays: the same product of context length and curve, element by element."""
        d = np.asarray(draft_lens, dtype=np.int64)
        length = np.asarray(context_lens, dtype=np.int64)
        if d.size == 0:
            return np.zeros(d.shape)
        per_token = self.attention_curve(int(d.max()) + 1)[d]
        return np.where(length > 0, length * per_token, 0.0)

    # -- drafting --------------------------------------------------------------------------------

    def _draft_forward(self, rows: int) -> float:
        """One drafter forward over `rows` tokens: draft_layers dense layers + its LM head."""
        cached = self._forward_cache.get(rows)
        if cached is not None:
            return cached
        m, dc = self.model, self.drafter
        layer = m.attn_params + 3 * m.hidden * m.intermediate
        vocab = m.vocab if dc.draft_vocab is None else dc.draft_vocab
        t = dc.forward_overhead_us * 1e-6 + dc.draft_layers * self._time(*self._gemm_cost(layer, rows))
        if vocab:
            t += self._time(*self._gemm_cost(vocab * m.hidden, rows))
        self._forward_cache[rows] = t
        return t

    def draft_time(self, draft_lens: Sequence[int]) -> float:
        dc = self.drafter
        if dc.kind == "model_free":  # the serving path: no list of the batch's lengths (never negative)
            drafting, tokens = _contract.count_and_sum(np.ascontiguousarray(draft_lens, dtype=np.int64))
            if drafting == 0:
                return 0.0
            return (dc.per_request_us * drafting + dc.per_token_us * tokens) * 1e-6
        drafting = [int(d) for d in draft_lens if d > 0]
        if not drafting:
            return 0.0
        if dc.kind == "block":
            rows = sum(dc.block_size or (1 + d) for d in drafting)
            return self._draft_forward(rows)
        # sequential: forward i carries the requests whose draft is longer than i.
        drafting.sort(reverse=True)
        t, alive = 0.0, len(drafting)
        for i in range(drafting[0]):
            while drafting[alive - 1] <= i:
                alive -= 1
            t += self._draft_forward(alive)
        return t


# -- guideline helpers -----------------------------------------------------------------------------


def compute_bound_rows(hardware: HardwareProfile | str, dtype: str = "bf16") -> float:
    """Rows at which a weight-streaming GEMM turns compute-bound (the roofline ridge), efficiencies applied.

    M rows through P weights of b bytes: 2·P·M FLOPs over P·b bytes, intensity 2M/b FLOP/byte (M for
    bf16). It meets the ridge (peak·gemm_eff)/(bw·bw_eff) at M = ridge·b/2. FP8 doubles the peak and
    halves b, so the row threshold is the same as bf16's (guideline 1).
    """
    hw = load_hardware(hardware)
    dt = canonical_dtype(dtype)
    ridge = hw.peak_flops(dt) * hw.gemm_efficiency / (hw.bandwidth * hw.bandwidth_efficiency)
    return ridge * DTYPE_BYTES[dt] / 2


def attention_draft_limit(group_size: int, tile_rows: int = 128) -> int:
    """Longest draft whose G·(1 + D) query rows fit one K/V tile: tile_rows // G − 1 (guideline 2)."""
    if group_size < 1 or tile_rows < 1:
        raise ValueError(
            f"attention_draft_limit: expected group_size and tile_rows >= 1, got {group_size}, {tile_rows}"
        )
    return max(0, tile_rows // group_size - 1)


def tile_aligned_drafts(batch: int, max_draft: int, tile_rows: int = 128) -> list[int]:
    """Draft lengths D ≤ max_draft after which one more token would start a new tile (guideline 3).

    For each boundary k·tile_rows that is the largest D with batch·(1 + D) ≤ k·tile_rows; exact
    multiples are included. Empty when no boundary is reached within max_draft (then every D up to
    max_draft shares D = 0's last tile). Batch 8, tile 128: D = 15 (128 rows), 31 (256 rows), ...
    """
    if batch < 1 or tile_rows < 1:
        raise ValueError(f"tile_aligned_drafts: expected batch and tile_rows >= 1, got {batch}, {tile_rows}")
    out: list[int] = []
    k = 1
    while (d := k * tile_rows // batch - 1) <= max_draft:
        if d >= 0 and (not out or out[-1] != d):
            out.append(d)
        k += 1
    return out


def binding_guideline(cost: RooflineCost, batch: int, draft_len: int, context_len: int) -> str:
    """Which guideline limits D at this point, for reports. Checked in order of how hard each binds:

    1. the verified rows pass the ridge point: cost grows ∝ (1 + D);
    2. the rows are below the ridge but padding to the GEMM tile pushes them over it;
    3. G·(1 + D) spills into a second attention tile, reading the KV cache twice (needs context);
    4. otherwise the step is memory-bound and extra draft tokens are nearly free.
    """
    hw = cost.hardware
    rows = batch * (1 + draft_len)
    threshold = compute_bound_rows(hw, cost.dtype)
    boundary = _round_up(rows, hw.gemm_tile_rows) - hw.gemm_tile_rows
    if rows > threshold or (_round_up(rows, hw.gemm_tile_rows) > threshold and boundary == 0):
        return f"compute-bound GEMMs above {round(threshold)} rows"
    if _round_up(rows, hw.gemm_tile_rows) > threshold:
        return f"tile boundary at {boundary} rows"
    limit = attention_draft_limit(cost.model.group_size, hw.attention_tile_rows)
    if draft_len > limit and context_len > 0:
        return f"attention tile: D ≤ {hw.attention_tile_rows}/G−1 = {limit}"
    return "memory-bound: long drafts nearly free"


def step_cost(*, hardware: HardwareProfile | str | None = None, model: ModelDescriptor | str | None = None,
              profile: str | None = None, dtype: str = "bf16", draft_us_per_request: float = 5.0) -> CostModel:
    """The step cost for a model-free proposer: a measured profile (a file or a shipped profile's name), or
    `hardware` + `model` on the roofline. What the policy, the planner and the simulator all cost with."""
    if profile is not None:
        from spec_plugins.policy.measured import MeasuredCost, load_profile, profile_path

        return MeasuredCost(load_profile(profile_path(profile)), draft_us_per_request=draft_us_per_request)
    drafter = DraftCost(kind="model_free", per_request_us=draft_us_per_request)
    return RooflineCost(hardware, model, dtype=dtype, drafter=drafter)
