"""Per-request draft lengths that maximise expected tokens per second of one engine step.

Request r keeps the first l_r of its drafted tokens. Position j of r survives verification with
probability a[r][j] (prefix survival, non-increasing in j), so the step is expected to emit
tau = sum_r (1 + sum_{j < l_r} a[r][j]) tokens in `cost.step_time(l, context_lens)` seconds; the
allocator maximises Theta = tau / step_time. Ranking every (r, j) by a[r][j] gives an order that
respects prefixes (a request's position j+1 never ranks above its position j), so each prefix of the
ranking is a valid allocation and the search walks it once, updating tokens and time incrementally:

* `search="global"` keeps the best prefix of the whole ranking. Tile-quantised step costs are jagged
  (one more row can cost a whole GEMM tile, the next 127 rows nothing), so stopping at the first
  non-improvement would be myopic. Safe when the survivals do not depend on tokens sampled in this
  step: history estimates, or confidences of deterministic drafts (suffix tree, n-gram).
* `search="greedy"` stops at the first admission that does not improve Theta (DSpark, Algorithm 1).
  Needed when a position's confidence depends on the sampled token before it (DSpark drafts sampled
  at T > 0): whether position j is admitted must not depend on tokens after it, or the output
  distribution is biased (DSpark, Appendix A). The ranking is then consumed in order and nothing
  later than the stop is ever read.
"""

from __future__ import annotations

from typing import Literal, Protocol, Sequence

import numpy as np


class StepCost(Protocol):
    """What the allocator costs a step with. A cost model may also have `batch_time(batch, rows)`, the
    verification time of `batch` requests and `rows` tokens in all; then that replaces linear_time plus the
    requests' attention_time (a measured profile knows it directly)."""

    overhead_s: float

    def linear_time(self, rows: int) -> float: ...

    def attention_time(self, draft_len: int, context_len: int) -> float: ...

    def draft_time(self, draft_lens: Sequence[int]) -> float: ...


def allocate(
    survival: Sequence[Sequence[float]],
    context_lens: Sequence[int],
    cost: StepCost,
    *,
    search: Literal["global", "greedy"] = "global",
    drafted: Sequence[int] | None = None,
    min_gain: float = 0.0,
    rate: float | None = None,
    budget: int | None = None,
) -> list[int]:
    """Draft lengths l_r <= len(survival[r]) maximising expected tokens per modelled second.

    survival[r][j]: probability that request r's draft positions 0..j are all accepted.
    context_lens[r]: tokens already in r's context (attention cost).
    drafted: lengths the proposer drafted (drafting cost is paid for those whatever is kept;
        default: len(survival[r])).
    min_gain: a longer allocation must beat the best so far by this relative margin (0.01 = 1%)
        before the global search takes it; keeps lengths stable when Theta is flat.
    rate: the goodput the engine sustains over many steps (tokens/s). Given, the step maximises
        tau - rate * time instead of tau / time: a token is worth its time only if it comes faster
        than the long-run rate, which is what maximises sum(tau) / sum(time) over steps of
        different make-up (Dinkelbach). A step whose base rate is low would otherwise take tokens
        that pay for that step but lower the overall goodput.
    budget: at most this many draft tokens kept over the whole batch (an engine's per-step token
        budget less the batch's own tokens); the search stops when it is spent.
    """
    n = len(survival)
    if len(context_lens) != n:
        raise ValueError(f"allocate: {len(context_lens)} context lengths for {n} requests")
    if budget is not None and budget < 0:
        raise ValueError(f"allocate.budget: expected >= 0, got {budget}")
    if search not in ("global", "greedy"):
        raise ValueError(f"allocate.search: expected 'global' or 'greedy', got {search!r}")
    lengths = [0] * n
    if n == 0:
        return lengths
    offered = [len(s) for s in survival] if drafted is None else list(drafted)
    sunk = cost.overhead_s + cost.draft_time(offered)

    for r, surv in enumerate(survival):
        if len(surv) > 1 and np.any(np.diff(np.asarray(surv, dtype=float)) > 1e-12):
            raise ValueError(f"allocate: survival of request {r} increases along the draft; expected prefix survival")
    # Candidates ranked by survival; ties broken by request, then position (prefix order, deterministic).
    cands = sorted((-float(a), r, j) for r, surv in enumerate(survival) for j, a in enumerate(surv) if a > 0.0)
    rows = n
    attn = [cost.attention_time(0, int(L)) for L in context_lens]
    attn_total = float(sum(attn))
    tau = float(n)

    def objective(tau: float, time: float) -> float:
        return tau / time if rate is None else tau - rate * time

    # A measured profile knows the step time of n requests verifying `rows` tokens directly (its grid has
    # a batch axis); a model costs the tokens and each request's attention apart.
    batch_time = getattr(cost, "batch_time", None)

    def verify_time(rows: int, attn_total: float) -> float:
        return batch_time(n, rows) if batch_time is not None else cost.linear_time(rows) + attn_total

    best = objective(tau, sunk + verify_time(rows, attn_total))
    best_k = 0
    if budget is not None:
        cands = cands[:budget]
    for k, (neg_a, r, j) in enumerate(cands, start=1):
        rows += 1
        new_attn = cost.attention_time(j + 1, int(context_lens[r]))
        attn_total += new_attn - attn[r]
        attn[r] = new_attn
        tau += -neg_a
        theta = objective(tau, sunk + verify_time(rows, attn_total))
        if search == "greedy":
            if theta <= best:
                break
            best, best_k = theta, k
        elif theta > best + abs(best) * min_gain:
            best, best_k = theta, k
    for _, r, j in cands[:best_k]:
        lengths[r] = max(lengths[r], j + 1)
    return lengths


def expected_tokens(survival: Sequence[Sequence[float]], lengths: Sequence[int]) -> float:
    """tau: expected tokens emitted by the step (one bonus/correction token per request + survivals)."""
    return float(sum(1.0 + float(np.sum(s[:l])) for s, l in zip(survival, lengths)))
