"""Live acceptance estimates: P(draft position j is accepted | positions before it were).

Two sources, both learnt online from what verification accepted:

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


class HistoryEstimator:
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


class ConfidenceCalibrator:
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


def survival(conditional: Sequence[float] | np.ndarray) -> np.ndarray:
    """Prefix survival a_j = prod_{i<=j} p_i: the expected contribution of draft position j."""
    return np.cumprod(np.clip(np.asarray(conditional, dtype=float), 0.0, 1.0))
