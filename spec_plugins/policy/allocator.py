"""Per-request draft lengths that maximise expected tokens per second of one engine step.

Request r keeps the first l_r of its drafted tokens. Position j of r survives verification with
probability a[r][j] (prefix survival, non-increasing in j), so the step is expected to emit
tau = sum_r (1 + sum_{j < l_r} a[r][j]) tokens in `cost.step_time(l, context_lens)` seconds; the
allocator maximises Theta = tau / step_time. Ranking every (r, j) by a[r][j] gives an order that
respects prefixes (a request's position j+1 never ranks above its position j), so each prefix of the
ranking is a valid allocation, and the search reads tokens and time along it as cumulative sums
(`allocate_batch`: one sort and a few array operations per step, whatever the batch size):

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

from typing import Callable, Literal, Protocol, Sequence, runtime_checkable

import numpy as np

try:  # built with the package (setup.py); without it the same walk runs in numpy
    from spec_plugins.policy import _trim
except ImportError:  # pragma: no cover - only without a build
    _trim = None


class StepCost(Protocol):
    """What the allocator costs a step with: the tokens' linear work and each request's attention apart. The
    richer forms below, where a cost model has them, replace Python calls per candidate with arrays and let
    the compiled walk read whole curves."""

    overhead_s: float

    def linear_time(self, rows: int) -> float: ...

    def attention_time(self, draft_len: int, context_len: int) -> float: ...

    def draft_time(self, draft_lens: Sequence[int]) -> float: ...


@runtime_checkable
class VectorStepCost(StepCost, Protocol):
    """A StepCost whose parts also come as arrays, the same values element by element (every CostModel)."""

    def linear_times(self, rows: np.ndarray) -> np.ndarray: ...

    def attention_times(self, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class CurvedStepCost(VectorStepCost, Protocol):
    """A modelled cost the compiled walk reads as curves (RooflineCost): the linear curve over rows, the
    attention model's parameters, and the attention one more draft row adds."""

    def linear_curve(self, size: int) -> np.ndarray: ...

    def attention_params(self) -> tuple: ...

    def attention_steps(self, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class ProfiledStepCost(StepCost, Protocol):
    """A measured profile (MeasuredCost): it knows the verification time of `batch` requests and `rows` tokens
    in all directly, which replaces linear_time plus the requests' attention_time; with `has_contexts` (a
    profile at several context lengths) `context_terms` prices each request at its own context."""

    has_contexts: bool

    def batch_time(self, batch: int, rows: float, context: float | None = None) -> float: ...

    def batch_times(self, batch: int, rows: np.ndarray, context: float | None = None) -> np.ndarray: ...

    def batch_curve(self, batch: int, size: int, context: float | None = None) -> np.ndarray: ...

    def context_terms(self, batch: int, size: int, context_lens: Sequence[int] | np.ndarray) -> tuple: ...


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
    lengths = np.array([len(s) for s in survival], dtype=np.int64)
    dense = np.zeros((n, int(lengths.max()) if n else 0))
    for r, surv in enumerate(survival):
        dense[r, : lengths[r]] = surv
    out = allocate_batch(dense, lengths, np.asarray(context_lens, dtype=np.int64), cost, search=search,
                         drafted=None if drafted is None else np.asarray(drafted, dtype=np.int64),
                         min_gain=min_gain, rate=rate, budget=budget)
    return out.tolist()


def allocate_batch(
    survival: np.ndarray,
    lengths: np.ndarray,
    context_lens: np.ndarray,
    cost: StepCost,
    *,
    search: Literal["global", "greedy"] = "global",
    drafted: np.ndarray | None = None,
    min_gain: float = 0.0,
    rate: float | None = None,
    budget: int | None = None,
    extra_s: float = 0.0,
    compiled: bool = True,
) -> np.ndarray:
    """`allocate` on a whole step at once: survival[r, :lengths[r]] is request r's prefix survival
    (entries past its length are ignored). The ranking is one lexsort, tokens and step times along it
    are cumulative sums over the cost curves (cached per batch size by the cost models), and the
    search picks its stop on the whole array: the same lengths as walking the ranking one candidate
    at a time (tests/test_batched_policy.py checks this against that walk). `extra_s`: seconds every step
    pays beyond the cost model (the engine's measured overhead), sunk like the model's own. With a cost model that
    exposes its curves (`batch_curve`, or `linear_curve` + `attention_params`) the walk runs compiled
    (`compiled=False` forces the numpy path; both give the same lengths)."""
    if budget is not None and budget < 0:
        raise ValueError(f"allocate.budget: expected >= 0, got {budget}")
    if search not in ("global", "greedy"):
        raise ValueError(f"allocate.search: expected 'global' or 'greedy', got {search!r}")
    survival = np.asarray(survival, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if survival.ndim != 2 or survival.shape[0] != n or (n and lengths.max() > survival.shape[1]):
        raise ValueError(f"allocate: survival of shape {survival.shape} for draft lengths up to "
                         f"{lengths.max() if n else 0} of {n} requests")
    if len(context_lens) != n:
        raise ValueError(f"allocate: {len(context_lens)} context lengths for {n} requests")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    valid = np.arange(survival.shape[1])[None, :] < lengths[:, None]
    if survival.shape[1] > 1:
        rising = (np.diff(survival, axis=1) > 1e-12) & valid[:, 1:]
        if rising.any():
            r = int(np.flatnonzero(rising.any(axis=1))[0])
            raise ValueError(f"allocate: survival of request {r} increases along the draft; expected prefix survival")
    offered = lengths if drafted is None else np.asarray(drafted, dtype=np.int64)
    sunk = cost.overhead_s + extra_s + cost.draft_time(offered)
    curves = _compiled_curves(cost, n, n + int(lengths.sum()) + 1, context_lens) if compiled else None
    if curves is not None:  # the same walk in one compiled call (policy/_trim.cpp)
        curve, attention = curves
        return _trim.walk(survival, lengths, sunk, search == "greedy", min_gain, rate,
                          -1 if budget is None else budget, curve, attention)

    # Candidates ranked by survival; ties broken by request, then position (prefix order, deterministic).
    rows_of, pos_of = np.nonzero(valid & (survival > 0.0))  # in (request, position) order
    gain = survival[rows_of, pos_of]
    order = np.argsort(-gain, kind="stable")  # stable: equal survivals keep (request, position) order
    if budget is not None:
        order = order[:budget]
    rows_of, pos_of, gain = rows_of[order], pos_of[order], gain[order]
    tau = np.cumsum(np.concatenate(([float(n)], gain)))
    time = sunk + _verify_times(cost, n, rows_of, pos_of, np.asarray(context_lens, dtype=np.int64))
    theta = tau / time if rate is None else tau - rate * time

    if search == "greedy":
        # Stop at the first admission that does not improve Theta; nothing after it is read.
        worse = np.flatnonzero(theta[1:] <= theta[:-1])
        best_k = int(worse[0]) if worse.size else len(gain)
    elif min_gain == 0.0:
        best_k = int(np.argmax(theta))  # the first maximum: a later equal Theta is no improvement
    else:
        best_k = 0
        while True:  # the next allocation that beats the best so far by the margin
            best = theta[best_k]
            ahead = np.flatnonzero(theta[best_k + 1:] > best + abs(best) * min_gain)
            if not ahead.size:
                break
            best_k += 1 + int(ahead[0])
    # The admitted candidates of a request are its first positions, so counting them is its length.
    return np.bincount(rows_of[:best_k], minlength=n).astype(np.int64)


def curve_source(cost: StepCost) -> Callable[[int, int, np.ndarray], tuple] | None:
    """How the compiled walk reads `cost`'s curves, resolved once per cost model: a function of (requests,
    curve length, context lengths) -> (verify curve by rows, attention parameters or None), or None to walk
    in numpy (no build, or a cost model without curves)."""
    if _trim is None:
        return None
    if isinstance(cost, ProfiledStepCost):
        if cost.has_contexts:  # a profile at several contexts: each request at its own
            def per_request(n: int, size: int, context: np.ndarray) -> tuple:
                curve, base, delta, alpha = cost.context_terms(n, size, context)
                return curve, ("per_request", base, delta, alpha)
            return per_request
        return lambda n, size, context: (cost.batch_curve(n, size), None)
    if isinstance(cost, CurvedStepCost):
        return lambda n, size, context: (cost.linear_curve(size), (*cost.attention_params(), context))
    return None


def _compiled_curves(cost: StepCost, n: int, size: int, context_lens: np.ndarray) -> tuple | None:
    source = curve_source(cost)
    return None if source is None else source(n, size, np.asarray(context_lens, dtype=np.int64))


def _verify_times(cost: StepCost, n: int, rows_of: np.ndarray, pos_of: np.ndarray,
                  context_lens: np.ndarray) -> np.ndarray:
    """Verification seconds after admitting 0, 1, ..., len(rows_of) candidates of the ranking."""
    rows = n + np.arange(len(rows_of) + 1)
    # A measured profile knows the step time of n requests verifying `rows` tokens directly (its grid has
    # a batch axis); a model costs the tokens and each request's attention apart.
    if isinstance(cost, ProfiledStepCost):
        if cost.has_contexts:
            return _per_request_times(cost, n, rows_of, context_lens)
        return cost.batch_times(n, rows)
    if isinstance(cost, VectorStepCost):
        linear = cost.linear_times(rows)
    else:
        linear = np.array([cost.linear_time(int(r)) for r in rows])
    attention = _attention_times(cost, np.zeros(n, dtype=np.int64), context_lens)
    ctx = context_lens[rows_of]
    # Admitting position j of request r moves its attention from 1 + j to 2 + j query rows.
    if isinstance(cost, CurvedStepCost):
        delta = cost.attention_steps(pos_of, ctx)
    else:
        delta = _attention_times(cost, pos_of + 1, ctx) - _attention_times(cost, pos_of, ctx)
    totals = np.cumsum(np.concatenate(([float(sum(attention.tolist()))], delta)))
    return linear + totals


def _per_request_times(cost: StepCost, n: int, rows_of: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
    # MeasuredCost.context_terms: after k admissions whose requests' weights sum to W_g, the reference curve
    # plus the base share plus Σ_g W_g · (Δ_g[n + k] - Δ_g[n]) / k (the compiled walk's operations, in order).
    m = len(rows_of)
    curve, base, delta, alpha = cost.context_terms(n, n + m + 1, context_lens)
    weights = np.cumsum(np.concatenate((np.zeros((1, alpha.shape[1])), alpha[rows_of]), axis=0), axis=0)
    k = np.arange(1, m + 1, dtype=np.float64)
    extra = np.full(m + 1, base)
    for g in range(alpha.shape[1]):
        extra[1:] = extra[1:] + weights[1:, g] * ((delta[g, n + 1 : n + m + 1] - delta[g, n]) / k)
    return curve[n : n + m + 1] + extra


def _attention_times(cost: StepCost, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
    if isinstance(cost, VectorStepCost):
        return cost.attention_times(draft_lens, context_lens)
    return np.array([cost.attention_time(int(d), int(c)) for d, c in zip(draft_lens, context_lens)], dtype=np.float64)


def expected_tokens(survival: Sequence[Sequence[float]], lengths: Sequence[int]) -> float:
    """tau: expected tokens emitted by the step (one bonus/correction token per request + survivals)."""
    return float(sum(1.0 + float(np.sum(s[:l])) for s, l in zip(survival, lengths)))
