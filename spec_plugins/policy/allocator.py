"""Per-request draft lengths that maximise expected tokens per second of one engine step.

Request r keeps the first l_r of its drafted tokens. Position j of r survives verification with
probability a[r][j] (prefix survival, non-increasing in j), so the step is expected to emit
tau = sum_r (1 + sum_{j < l_r} a[r][j]) tokens in `cost.step_time(l, context_lens)` seconds; the
allocator maximises Theta = tau / step_time. Ranking every (r, j) by a[r][j] gives an order that
respects prefixes (a request's position j+1 never ranks above its position j), so each prefix of the
ranking is a valid allocation, and the search reads tokens and time along it as cumulative sums
(`allocate_batch`: one sort and one pass over the ranking per step, compiled in policy/_trim.cpp, which reads
the cost model's curves; tests/policy_reference.py keeps the same walk in numpy as the reference):

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

from spec_plugins.policy import _trim  # the walk, compiled with the package (setup.py)


class StepCost(Protocol):
    """What the allocator costs a step with: the tokens' linear work and each request's attention apart. The
    richer forms below, where a cost model has them, hand the compiled walk whole curves; a cost model with
    only these methods is tabulated for every step (`curve_source`), one call per entry."""

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
    """A modelled cost the compiled walk reads as curves (RooflineCost): the linear curve over rows and attention
    seconds per context token by draft rows."""

    def linear_curve(self, size: int) -> np.ndarray: ...

    def attention_curve(self, size: int) -> np.ndarray: ...


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
) -> np.ndarray:
    """`allocate` on a whole step at once: survival[r, :lengths[r]] is request r's prefix survival
    (entries past its length are ignored; a survival that rises along a draft is refused). The ranking is one
    stable sort, and the walk reads tokens and step times along it off the cost model's curves (`curve_source`),
    in one compiled call (policy/_trim.cpp): the same lengths as walking the ranking one candidate at a time
    (tests/test_batched_policy.py checks this against that walk and against the same walk in numpy). `extra_s`:
    seconds every step pays beyond the cost model (the engine's measured overhead), sunk like the model's own."""
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
    offered = lengths if drafted is None else np.asarray(drafted, dtype=np.int64)
    sunk = cost.overhead_s + extra_s + cost.draft_time(offered)
    curve, attention = curve_source(cost)(n, n + int(lengths.sum()) + 1, np.asarray(context_lens, dtype=np.int64),
                                          survival.shape[1])
    return _trim.walk(survival, lengths, sunk, search == "greedy", min_gain, rate, -1 if budget is None else budget,
                      curve, attention)


def curve_source(cost: StepCost) -> Callable[[int, int, np.ndarray, int], tuple]:
    """How the compiled walk reads `cost`, resolved once per cost model: a function of (requests, curve length,
    context lengths, longest draft) -> (verify curve by rows, attention terms or None). A measured profile gives
    its curve by rows (at several contexts, each request's terms too); the roofline its linear curve and its
    attention per context token by draft rows; any other StepCost is tabulated: its linear time by rows and each
    request's attention by draft rows (one call per entry where it has no array forms)."""
    if isinstance(cost, ProfiledStepCost):
        if cost.has_contexts:  # a profile at several contexts: each request at its own
            def per_request(n: int, size: int, context: np.ndarray, width: int) -> tuple:
                curve, base, delta, alpha = cost.context_terms(n, size, context)
                return curve, ("per_request", base, delta, alpha)
            return per_request
        return lambda n, size, context, width: (cost.batch_curve(n, size), None)
    if isinstance(cost, CurvedStepCost):  # the walk reads attention one draft row past the longest draft
        return lambda n, size, context, width: (cost.linear_curve(size),
                                                ("per_token", cost.attention_curve(width + 2), context))

    def tabulated(n: int, size: int, context: np.ndarray, width: int) -> tuple:
        # The walk reads the linear curve from n rows (every request verifies at least its own token) on.
        rows, d = np.arange(n, size, dtype=np.int64), np.arange(width + 2, dtype=np.int64)
        linear = np.zeros(size)
        if isinstance(cost, VectorStepCost):
            linear[n:] = cost.linear_times(rows)
            table = cost.attention_times(np.tile(d, n), np.repeat(context, width + 2))
        else:
            linear[n:] = [cost.linear_time(int(r)) for r in rows.tolist()]
            table = np.array([cost.attention_time(int(j), int(c)) for c in context.tolist() for j in d.tolist()],
                             dtype=np.float64)
        return linear, ("per_row", table.reshape(n, width + 2))
    return tabulated


def expected_tokens(survival: Sequence[Sequence[float]], lengths: Sequence[int]) -> float:
    """tau: expected tokens emitted by the step (one bonus/correction token per request + survivals)."""
    return float(sum(1.0 + float(np.sum(s[:l])) for s, l in zip(survival, lengths)))
