"""The per-request adaptive policy as it was before the batched path: the oracle the vectorised
allocator, estimators and policy are tested against (tests/test_batched_policy.py).

Per (request, position) Python, one observation at a time; kept only here, as the reference.
"""

from __future__ import annotations

from typing import Any, Hashable, Literal, Sequence

import numpy as np

from spec_plugins.core import Draft, DraftRequest
from spec_plugins.policy.acceptance import survival
from spec_plugins.policy.adaptive import AdaptiveLength
from spec_plugins.policy.allocator import StepCost
from spec_plugins.policy.cost import step_cost


def reference_allocate(
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
    """The walk over the ranking, one candidate at a time (see allocator.allocate)."""
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



def conditional_outcomes(drafted: int, accepted: int) -> tuple[int, int]:
    """(positions tried, positions accepted) of one verified draft."""
    if not 0 <= accepted <= drafted:
        raise ValueError(f"observation: expected 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
    return min(accepted + 1, drafted), accepted


class PositionCounts:
    """Exponentially decayed trials and successes per draft position."""

    def __init__(self, max_positions: int, decay: float) -> None:
        self.trials = np.zeros(max_positions)
        self.successes = np.zeros(max_positions)
        self.decay = decay

    def update(self, drafted: int, accepted: int) -> None:
        tried, ok = conditional_outcomes(drafted, accepted)
        tried, ok = min(tried, len(self.trials)), min(ok, len(self.trials))
        self.trials *= self.decay
        self.successes *= self.decay
        self.trials[:tried] += 1.0
        self.successes[:ok] += 1.0

    def rates(self, prior_mean: np.ndarray, prior_weight: float) -> np.ndarray:
        return (self.successes + prior_weight * prior_mean) / (self.trials + prior_weight)


class ReferenceHistory:
    """Per-request conditional acceptance per position from past verifications."""

    def __init__(self, max_positions: int, *, decay: float = 0.9, request_prior_weight: float = 3.0,
                 pooled_decay: float = 0.999, pooled_prior: float = 0.5, pooled_prior_weight: float = 2.0) -> None:
        self.max_positions = max_positions
        self.decay = decay
        self.request_prior_weight = request_prior_weight
        self.pooled = PositionCounts(max_positions, pooled_decay)
        self.pooled_prior = np.full(max_positions, pooled_prior)
        self.pooled_prior_weight = pooled_prior_weight
        self.requests: dict[Hashable, PositionCounts] = {}

    def observe(self, req_id: Hashable, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.pooled.update(drafted, accepted)
        counts = self.requests.get(req_id)
        if counts is None:
            counts = self.requests[req_id] = PositionCounts(self.max_positions, self.decay)
        counts.update(drafted, accepted)

    def conditional(self, req_id: Hashable) -> np.ndarray:
        """Conditional acceptance per position, shape [max_positions]."""
        pooled = self.pooled.rates(self.pooled_prior, self.pooled_prior_weight)
        counts = self.requests.get(req_id)
        return pooled if counts is None else counts.rates(pooled, self.request_prior_weight)

    def finish(self, req_id: Hashable) -> None:
        self.requests.pop(req_id, None)


def position_bucket(j: int) -> int:
    """Draft positions 0, 1, 2-3, 4-7, 8+ (calibration differs most near the start of a draft)."""
    return 0 if j == 0 else min(4, int(np.log2(j)) + 1)


class ReferenceCalibrator:
    """Histogram-binned calibration of a proposer's conditional per-token confidences."""

    def __init__(self, bins: int = 20, prior_weight: float = 4.0, decay: float = 0.9999) -> None:
        self.bins = bins
        self.prior_weight = prior_weight
        self.decay = decay
        self.trials = np.zeros((5, bins))
        self.successes = np.zeros((5, bins))

    def _cells(self, confidence: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
        b = np.minimum((c * self.bins).astype(int), self.bins - 1)
        pos = np.array([position_bucket(j) for j in range(len(c))], dtype=int)
        return pos, b

    def calibrate(self, confidence: Sequence[float]) -> np.ndarray:
        """Calibrated conditional acceptance for each drafted position."""
        if len(confidence) == 0:
            return np.zeros(0)
        c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
        pos, b = self._cells(c)
        t, s = self.trials[pos, b], self.successes[pos, b]
        return (s + self.prior_weight * c) / (t + self.prior_weight)

    def observe(self, confidence: Sequence[float], accepted: int) -> None:
        """One verified draft whose kept positions had these raw confidences."""
        tried, ok = conditional_outcomes(len(confidence), accepted)
        if tried == 0:
            return
        pos, b = self._cells(confidence[:tried])
        self.trials *= self.decay
        self.successes *= self.decay
        np.add.at(self.trials, (pos, b), 1.0)
        np.add.at(self.successes, (pos[:ok], b[:ok]), 1.0)

    def state(self) -> dict[str, Any]:
        return {"trials": self.trials.tolist(), "successes": self.successes.tolist()}



class ReferenceAdaptive:
    """AdaptiveLength before its batched path: per request, per position."""

    name = "adaptive"

    Options = AdaptiveLength.Options

    def __init__(self, *, cost: StepCost | None = None, **options: Any) -> None:
        opts = self.Options(**options)
        self.options = opts
        self.cost = cost
        self.history = ReferenceHistory(opts.max_positions, decay=opts.history_decay)
        self.calibrator = ReferenceCalibrator()
        # What was kept of each request's last draft, to learn from when its verification comes back.
        self._kept_confidence: dict[Hashable, list[float] | None] = {}
        self._request_fit: dict[Hashable, tuple[float, float]] = {}  # decayed (accepted, predicted)
        self._tau = self._time = 0.0  # decayed sums of expected tokens and modelled seconds per step
        if self.cost is None and (opts.hardware is None) == (opts.profile is None):
            raise ValueError("policy_options: expected exactly one of 'hardware' (a GPU profile) or 'profile' "
                             "(a measured step-time profile)")
        if self.cost is None and opts.profile is not None:
            self.cost = step_cost(profile=opts.profile, draft_us_per_request=opts.draft_us_per_request)
        if self.cost is None and opts.model_config_path is not None:
            from spec_plugins.policy.model import load_model_config

            self.bind_model(load_model_config(opts.model_config_path))

    def bind_model(self, model: Any, source: str = "engine model config") -> None:
        """Cost `model` (a ModelDescriptor, or a Hugging Face config dict) on the options' hardware,
        unless a cost model is already set.

        Engines call this with their own model's config, so `hardware` alone is enough in the options.
        """
        if self.cost is not None:
            return
        from spec_plugins.policy.model import ModelDescriptor

        if isinstance(model, dict):
            model = ModelDescriptor.from_config(model, source=source)
        self.cost = step_cost(hardware=self.options.hardware, model=model, dtype=self.options.dtype,
                              draft_us_per_request=self.options.draft_us_per_request)

    # ---- DraftLengthPolicy ----------------------------------------------------------------------

    def caps(self, requests: Sequence[DraftRequest]) -> list[int]:
        # Draft up to the engine's cap; `trim` chooses once the drafts (and their confidences) exist.
        return [r.max_draft for r in requests]

    def trim(self, requests: Sequence[DraftRequest], drafts: Sequence[Draft]) -> list[int]:
        if self.cost is None:
            raise ValueError("policy 'adaptive': no cost model; give policy_options.model_config or let the "
                             "engine bind its model")
        surv = [self.survival(req.req_id, d) for req, d in zip(requests, drafts)]
        search = self.options.search
        if search == "auto":
            search = "greedy" if any(d.probs is not None for d in drafts) else "global"
        context = [len(r.tokens) for r in requests]
        drafted = [len(d) for d in drafts]
        lengths = reference_allocate(surv, context, self.cost, search=search, drafted=drafted,
                           min_gain=self.options.min_gain, rate=self._rate(),
                           budget=self.options.max_draft_tokens_per_step)
        # The long-run goodput the allocator weighs tokens against: modelled, over recent steps.
        d = self.options.rate_decay
        self._tau = d * self._tau + sum(1.0 + float(np.sum(s[:n])) for s, n in zip(surv, lengths))
        self._time = d * self._time + self.cost.step_time(lengths, context)
        for req, d, n in zip(requests, drafts, lengths):
            conf = self._usable(d)
            self._kept_confidence[req.req_id] = None if conf is None else conf[:n]
        return lengths

    def _rate(self) -> float | None:
        if self.options.objective == "per_step" or self._time <= 0.0:
            return None
        return self._tau / self._time

    def survival(self, req_id: Hashable, draft: Draft) -> np.ndarray:
        """Prefix survival of each drafted position of `draft`."""
        n = min(len(draft), self.options.max_positions)
        conf = self._usable(draft)
        if conf is not None:
            cond = self.calibrator.calibrate(conf[:n])
            if self.options.request_correction > 0:
                cond = np.clip(cond * self._correction(req_id), 0.0, 1.0)
        else:
            cond = self.history.conditional(req_id)[:n]
        return survival(cond)

    def _correction(self, req_id: Hashable) -> float:
        # How this request's drafts fared against the calibrated prediction (requests differ: one copies
        # a file, another writes new text); k pseudo-trials keep a new request at factor 1.
        k = self.options.request_correction
        ok, predicted = self._request_fit.get(req_id, (0.0, 0.0))
        return (ok + k) / (predicted + k)

    def observe(self, req_id: Hashable, drafted: int, accepted: int) -> None:
        self.history.observe(req_id, drafted, accepted)
        conf = self._kept_confidence.pop(req_id, None)
        if conf is not None and len(conf) == drafted and drafted > 0:
            tried = min(accepted + 1, drafted)
            predicted = float(np.sum(self.calibrator.calibrate(conf[:tried])))
            ok, pred = self._request_fit.get(req_id, (0.0, 0.0))
            d = self.options.history_decay
            self._request_fit[req_id] = (d * ok + accepted, d * pred + predicted)
            self.calibrator.observe(conf, accepted)

    def finish(self, req_id: Hashable) -> None:
        self.history.finish(req_id)
        self._kept_confidence.pop(req_id, None)
        self._request_fit.pop(req_id, None)

    def _usable(self, draft: Draft) -> list[float] | None:
        if self.options.confidence == "off" or draft.confidence is None:
            return None
        return list(draft.confidence)


# ---- The batched numpy twins of the compiled steps (policy/_trim.cpp, policy/_observe.cpp) ----------------
# The same arithmetic as the compiled code, array by array: the compiled walk, trim and observations are
# checked against these (tests/test_batched_policy.py), and these against the per-request reference above.


def numpy_allocate_batch(survival: np.ndarray, lengths: np.ndarray, context_lens: np.ndarray, cost: StepCost, *,
                         search: Literal["global", "greedy"] = "global", drafted: np.ndarray | None = None,
                         min_gain: float = 0.0, rate: float | None = None, budget: int | None = None,
                         extra_s: float = 0.0) -> np.ndarray:
    """allocator.allocate_batch in numpy: one stable sort, tokens and step times along the ranking as
    cumulative sums, the stop chosen on the whole array."""
    survival = np.asarray(survival, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    context_lens = np.asarray(context_lens, dtype=np.int64)
    n = len(lengths)
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
    # Candidates ranked by survival; ties broken by request, then position (prefix order, deterministic).
    rows_of, pos_of = np.nonzero(valid & (survival > 0.0))  # in (request, position) order
    gain = survival[rows_of, pos_of]
    order = np.argsort(-gain, kind="stable")  # stable: equal survivals keep (request, position) order
    if budget is not None:
        order = order[:budget]
    rows_of, pos_of, gain = rows_of[order], pos_of[order], gain[order]
    tau = np.cumsum(np.concatenate(([float(n)], gain)))
    time = sunk + numpy_verify_times(cost, n, rows_of, pos_of, context_lens)
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


def numpy_verify_times(cost: StepCost, n: int, rows_of: np.ndarray, pos_of: np.ndarray,
                       context_lens: np.ndarray) -> np.ndarray:
    """Verification seconds after admitting 0, 1, ..., len(rows_of) candidates of the ranking."""
    from spec_plugins.policy.allocator import ProfiledStepCost, VectorStepCost

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
        extra[1:] = extra[1:] + weights[1:, g] * ((delta[g, n + 1: n + m + 1] - delta[g, n]) / k)
    return curve[n: n + m + 1] + extra


def _attention_times(cost: StepCost, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
    from spec_plugins.policy.allocator import VectorStepCost

    if isinstance(cost, VectorStepCost):
        return cost.attention_times(draft_lens, context_lens)
    return np.array([cost.attention_time(int(d), int(c)) for d, c in zip(draft_lens, context_lens)], dtype=np.float64)


def decayed_sum(counts: np.ndarray, events: np.ndarray, decay: float) -> np.ndarray:
    """Counts after m observations in order (events [m, w], w <= len(counts): the first w positions),
    each decaying what came before by `decay`: the same as applying them one at a time (exactly so
    for one), in a single array operation."""
    m, w = events.shape
    if m == 1:
        out = counts * decay
        out[:w] += events[0]
        return out
    weights = decay ** np.arange(m - 1, -1, -1, dtype=np.float64)
    out = counts * decay**m
    out[:w] += weights @ events
    return out


def numpy_history_observe(hist: Any, req_ids: Sequence[Hashable], drafted: np.ndarray, accepted: np.ndarray) -> None:
    """HistoryEstimator.observe_batch in closed form: the same counts as one observation at a time, up to
    rounding (distinct requests; drafts of 0 tokens ignored)."""
    from spec_plugins.policy.acceptance import outcome_masks

    drafted = np.asarray(drafted, dtype=np.int64)
    keep = drafted > 0
    if not keep.any():
        return
    req_ids = [r for r, k in zip(req_ids, keep.tolist()) if k]
    drafted, accepted = drafted[keep], np.asarray(accepted, dtype=np.int64)[keep]
    w = min(int(drafted.max()), hist.max_positions)  # only the first max(drafted) positions were tried
    tried, ok = outcome_masks(drafted, accepted, w)
    hist.pooled_trials[...] = decayed_sum(hist.pooled_trials, tried, hist.pooled_decay)
    hist.pooled_successes[...] = decayed_sum(hist.pooled_successes, ok, hist.pooled_decay)
    slots, _ = hist.requests.lookup(req_ids)
    for name, events in (("trials", tried), ("successes", ok)):
        col = hist.requests[name]
        rows = col[slots] * hist.decay
        rows[:, :w] += events
        col[slots] = rows


def no_draft_step_time(cost: StepCost, context_lens: np.ndarray) -> float:
    """Modelled seconds of a step whose requests draft nothing: the cost model's own step_time where it has one,
    else a plain StepCost's parts."""
    n = len(context_lens)
    if hasattr(cost, "step_time"):
        return cost.step_time(np.zeros(n, np.int64), context_lens)
    return (cost.overhead_s + cost.linear_time(n) + sum(cost.attention_time(0, int(c)) for c in context_lens)
            + cost.draft_time([0] * n))


def _dense(flat: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """[n, width] matrix of each row's first lengths[r] values of a flat array (zeros after)."""
    out = np.zeros((len(lengths), width))
    if width:
        j = np.arange(width)[None, :]
        mask = j < lengths[:, None]
        out[mask] = flat[(offsets[:-1, None] + j)[mask]]
    return out


class NumpyAdaptive(AdaptiveLength):
    """AdaptiveLength with its compiled trim and observations replaced by their numpy twins."""

    walk = staticmethod(numpy_allocate_batch)

    def _survival(self, req_ids, slots, drafts):
        if self.options.confidence == "off" or drafts.confidence is None:
            return super()._survival(req_ids, slots, drafts)
        usable = np.minimum(drafts.lengths, self.options.max_positions)
        width = int(usable.max()) if len(usable) else 0
        conf = _dense(drafts.confidence, drafts.offsets, usable, width)
        cond = self.calibrator.calibrate_dense(conf)
        if self.options.request_correction > 0:
            cond = np.clip(cond * self._correction(slots)[:, None], 0.0, 1.0)
        return np.cumprod(np.clip(cond, 0.0, 1.0), axis=1), usable, conf

    def _trim_step(self, slots, drafts, search, context, curves, extra, conditional=None):
        if extra < 0.0:
            extra = max(extra, -self.options.max_offset_cut * no_draft_step_time(self.cost, context))
        req_ids = [self.requests.id_at(int(s)) for s in slots]
        surv, usable, conf = self._survival(req_ids, slots, drafts)
        lengths = self.walk(surv, usable, context, self.cost, search=search, drafted=drafts.lengths,
                            min_gain=self.options.min_gain, rate=self._rate(),
                            budget=self.options.max_draft_tokens_per_step, extra_s=extra)
        kept = np.arange(surv.shape[1])[None, :] < lengths[:, None]
        tau = float(len(lengths) + np.sum(np.where(kept, surv, 0.0)))
        if conditional is not None:  # trim_rated: BatchDrafts.with_survival's arithmetic on this survival
            conditional[:] = drafts.with_survival(surv).confidence
        if conf is None:
            self.requests["kept_len"][slots] = -1
        else:
            self.requests["kept"][slots, : conf.shape[1]] = conf
            self.requests["kept_len"][slots] = lengths
        return lengths, tau, self.cost.step_time(lengths, context), extra, no_draft_step_time(self.cost, context)

    def observe_batch(self, req_ids, drafted, accepted):
        drafted = np.asarray(drafted, dtype=np.int64)
        accepted = np.asarray(accepted, dtype=np.int64)
        numpy_history_observe(self.history, req_ids, drafted, accepted)
        slots, _ = self.requests.lookup(req_ids, create=False)
        known = slots >= 0
        kept_len = self.requests.gather("kept_len", slots, -1)
        due = known & (kept_len == drafted) & (drafted > 0)
        self.requests["kept_len"][slots[known]] = -1  # each kept draft is learnt from once
        if not due.any():
            return
        idx = slots[due]
        d_due, a_due = drafted[due], accepted[due]
        conf = self.requests["kept"][idx, : int(d_due.max())]
        h = self.options.history_decay
        # Predicted accepted tokens of each verified draft: calibrated confidences of the positions tried.
        tried = np.minimum(a_due + 1, d_due)
        calibrated = self.calibrator.calibrate_dense(conf)
        predicted = np.sum(np.where(np.arange(conf.shape[1])[None, :] < tried[:, None], calibrated, 0.0), axis=1)
        self.requests["fit_ok"][idx] = h * self.requests["fit_ok"][idx] + a_due
        self.requests["fit_predicted"][idx] = h * self.requests["fit_predicted"][idx] + predicted
        self.calibrator.observe_dense(conf, d_due, a_due)
