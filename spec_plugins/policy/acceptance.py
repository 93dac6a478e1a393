"""Live acceptance estimates: P(draft position j is accepted | positions before it were).

Two sources, both learnt online from what verification accepted:

Both take a whole step at once (`observe_batch`/`observe_dense`, `conditional_batch`/`calibrate_dense`).
The history's compiled update (`_observe.cpp`) applies a step's observations one at a time, in order
(tests/policy_reference.py keeps a closed-form numpy update that gives the same counts up to rounding).

* `HistoryEstimator` -- counts per draft position, per request, shrunk towards the pooled counts of
  all requests (a Beta prior whose mean is the pooled rate). Old steps fade (`decay`), so a request
  that moves from copying code to writing new code stops being trusted after a few steps.
* `ConfidenceCalibrator` -- maps a proposer's own per-token confidence (suffix-tree path
  probabilities, DSpark's confidence head) to an acceptance probability by histogram binning per
  position bucket; an empty bin trusts the raw confidence, a full one trusts what was observed.

An observation is one verified draft: `drafted` tokens offered, `accepted` of them taken. Positions
0..accepted-1 succeeded, position `accepted` (if drafted) failed, later positions were never tried
(their conditional acceptance is unobserved, not zero).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from spec_plugins.slots import RequestSlots

from spec_plugins.policy import _observe  # the observation updates one at a time, compiled with the package


def conditional_outcomes(drafted: int, accepted: int) -> tuple[int, int]:
    """(positions tried, positions accepted) of one verified draft."""
    if not 0 <= accepted <= drafted:
        raise ValueError(f"observation: expected 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
    return min(accepted + 1, drafted), accepted


def check_outcomes(drafted: np.ndarray, accepted: np.ndarray) -> None:
    """`conditional_outcomes`' one-line error for the first verified draft with accepted outside [0, drafted]."""
    bad = (accepted < 0) | (accepted > drafted)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        conditional_outcomes(int(drafted[i]), int(accepted[i]))


def outcome_masks(drafted: np.ndarray, accepted: np.ndarray, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """(tried, succeeded) as [m, positions] 0/1 matrices for m verified drafts (checked like
    `conditional_outcomes`)."""
    drafted = np.asarray(drafted, dtype=np.int64)
    accepted = np.asarray(accepted, dtype=np.int64)
    check_outcomes(drafted, accepted)
    tried = np.minimum(accepted + 1, drafted)
    j = np.arange(positions)[None, :]
    return (j < tried[:, None]).astype(np.float64), (j < accepted[:, None]).astype(np.float64)


class HistoryEstimator:
    """Per-request conditional acceptance per position from past verifications.

    Per-request counts live in slot columns (`RequestSlots`); one step's observations are applied as
    one array operation (`observe_batch`), and `conditional_batch` reads many requests at once.
    """

    @staticmethod
    def columns(max_positions: int) -> dict[str, tuple]:
        """The per-request columns it keeps, for a `RequestSlots` shared with another estimator."""
        return {"trials": ((max_positions,), np.float64, 0.0), "successes": ((max_positions,), np.float64, 0.0)}

    def __init__(self, max_positions: int, *, decay: float = 0.9, request_prior_weight: float = 3.0,
                 pooled_decay: float = 0.999, pooled_prior: float = 0.5, pooled_prior_weight: float = 2.0,
                 slots: RequestSlots | None = None) -> None:
        self.max_positions = max_positions
        self.decay = decay
        self.request_prior_weight = request_prior_weight
        self.pooled_decay = pooled_decay
        self.pooled_trials = np.zeros(max_positions)
        self.pooled_successes = np.zeros(max_positions)
        self.pooled_prior = np.full(max_positions, pooled_prior)
        self.pooled_prior_weight = pooled_prior_weight
        # slots: a RequestSlots with `columns(max_positions)` among its own, whose owner also frees them.
        self.requests = RequestSlots(**self.columns(max_positions)) if slots is None else slots

    def observe(self, req_id: Hashable, drafted: int, accepted: int) -> None:
        self.observe_batch([req_id], np.array([drafted]), np.array([accepted]))

    def observe_batch(self, req_ids: Sequence[Hashable], drafted: np.ndarray, accepted: np.ndarray) -> None:
        """One verified draft per request (distinct requests; drafts of 0 tokens are ignored)."""
        drafted = np.asarray(drafted, dtype=np.int64)
        keep = drafted > 0
        if not keep.any():
            return
        if not keep.all():
            req_ids = [r for r, k in zip(req_ids, keep.tolist()) if k]
            drafted, accepted = drafted[keep], np.asarray(accepted)[keep]
        accepted = np.asarray(accepted, dtype=np.int64)
        check_outcomes(drafted, accepted)  # before any state changes
        slots, _ = self.requests.lookup(req_ids)
        _observe.history_observe(self.pooled_trials, self.pooled_successes, self.requests["trials"],
                                 self.requests["successes"], slots, drafted, accepted, self.decay, self.pooled_decay)

    def pooled_rates(self) -> np.ndarray:
        return (self.pooled_successes + self.pooled_prior_weight * self.pooled_prior) / (
            self.pooled_trials + self.pooled_prior_weight)

    def conditional(self, req_id: Hashable) -> np.ndarray:
        """Conditional acceptance per position, shape [max_positions]."""
        return self.conditional_batch([req_id])[0]

    def conditional_batch(self, req_ids: Sequence[Hashable]) -> np.ndarray:
        """[len(req_ids), max_positions]: each request's own rates shrunk to the pooled ones (the pooled
        rates for a request never observed)."""
        return self.conditional_slots(self.requests.lookup(req_ids, create=False)[0])

    def conditional_slots(self, slots: np.ndarray) -> np.ndarray:
        """conditional_batch by slot (-1: a request never observed)."""
        pooled = self.pooled_rates()
        out = np.broadcast_to(pooled, (len(slots), self.max_positions)).copy()
        seen = slots >= 0
        if seen.any():
            idx = slots[seen]
            w = self.request_prior_weight
            out[seen] = (self.requests["successes"][idx] + w * pooled) / (self.requests["trials"][idx] + w)
        return out

    def finish(self, req_id: Hashable) -> None:
        self.requests.release(req_id)


def position_bucket(j: int) -> int:
    """Draft positions 0, 1, 2-3, 4-7, 8+ (calibration differs most near the start of a draft)."""
    return 0 if j == 0 else min(4, int(np.log2(j)) + 1)


_BUCKETS = np.array([position_bucket(j) for j in range(4097)])  # max_positions is at most 4096


class ConfidenceCalibrator:
    """Histogram-binned calibration of a proposer's conditional per-token confidences.

    The dense forms take a step's drafts as a [n, K] matrix (row r's first lengths[r] entries count). Trials
    and successes are [5, bins]: one row per position bucket.
    """

    def __init__(self, bins: int = 20, prior_weight: float = 4.0, decay: float = 0.9999) -> None:
        self.bins = bins
        self.prior_weight = prior_weight
        self.decay = decay
        self.trials = np.zeros((5, bins))
        self.successes = np.zeros((5, bins))

    def _cells(self, c: np.ndarray) -> np.ndarray:
        """Flat (position bucket, bin) cell of every entry of a clipped confidence matrix [n, K]."""
        b = np.minimum((c * self.bins).astype(np.int64), self.bins - 1)
        return _BUCKETS[: c.shape[1]] * self.bins + b

    def calibrate(self, confidence: Sequence[float]) -> np.ndarray:
        """Calibrated conditional acceptance for each drafted position."""
        if len(confidence) == 0:
            return np.zeros(0)
        return self.calibrate_dense(np.asarray(confidence, dtype=float)[None, :])[0]

    def calibrate_dense(self, confidence: np.ndarray) -> np.ndarray:
        """calibrate() of every row of a [n, K] matrix (entries past a draft's end are read but unused)."""
        c = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
        cell = self._cells(c)
        t, s = self.trials.ravel()[cell], self.successes.ravel()[cell]
        return (s + self.prior_weight * c) / (t + self.prior_weight)

    def observe(self, confidence: Sequence[float], accepted: int) -> None:
        """One verified draft whose kept positions had these raw confidences."""
        conf = np.asarray(confidence, dtype=float)
        self.observe_dense(conf[None, :], np.array([len(conf)]), np.array([accepted]))

    def observe_dense(self, confidence: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """m verified drafts at once: row i's first drafted[i] raw confidences, accepted[i] accepted."""
        drafted = np.asarray(drafted, dtype=np.int64)
        keep = drafted > 0
        if not keep.any():
            return
        confidence, drafted, accepted = confidence[keep], drafted[keep], np.asarray(accepted)[keep]
        tried, ok = outcome_masks(drafted, accepted, confidence.shape[1])
        cell = self._cells(np.clip(confidence, 0.0, 1.0)).ravel()
        m = len(drafted)
        # Observation i is decayed by the m - 1 - i observations after it, as one at a time would be.
        weight = np.repeat(self.decay ** np.arange(m - 1, -1, -1, dtype=np.float64), confidence.shape[1])
        add_t = np.bincount(cell, weights=weight * tried.ravel(), minlength=self.trials.size)
        add_s = np.bincount(cell, weights=weight * ok.ravel(), minlength=self.trials.size)
        scale = self.decay ** np.full((5, 1), float(m))  # every cell decays once per observation
        self.trials[...] = self.trials * scale + add_t.reshape(self.trials.shape)
        self.successes[...] = self.successes * scale + add_s.reshape(self.trials.shape)

    def state(self) -> dict[str, Any]:
        return {"trials": self.trials.tolist(), "successes": self.successes.tolist()}


def survival(conditional: Sequence[float] | np.ndarray) -> np.ndarray:
    """Prefix survival a_j = prod_{i<=j} p_i: the expected contribution of draft position j."""
    return np.cumprod(np.clip(np.asarray(conditional, dtype=float), 0.0, 1.0))
