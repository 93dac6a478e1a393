"""Sequential Temperature Scaling (STS) of DSpark confidences (post hoc, from logged acceptance).

The scheduler consumes prefix survivals a_k = prod_{i<=k} sigmoid(l_i / T_k), so what must be calibrated is
the *product*, not each c_k on its own: a per-position temperature fitted in isolation would still let
errors compound along the prefix. STS fits T_1, T_2, ... left to right; T_k is a 1-D grid search that
minimises the ECE of a_k against the logged event "drafts 1..k were all accepted", with T_1..T_{k-1} fixed.

Log format: per proposal, the raw confidence logits [gamma], how many drafts were accepted and (optionally)
how many were verified. Position k is observed only if k <= verified; it survived iff k <= accepted.

Saved as JSON {"sts_temperatures": [T_1, ..., T_gamma]} (TRT-LLM's key; SGLang calls it "temperatures").
"""

from __future__ import annotations

import json
import os

import numpy as np

# Log-spaced grid, with T = 1 (identity) included exactly so a calibrated head is left alone.
DEFAULT_GRID = np.unique(np.concatenate([np.geomspace(0.05, 20.0, 241), [1.0]]))


def expected_calibration_error(pred, outcome, n_bins: int = 10) -> float:
    """Equal-width-bin ECE: sum over bins of (bin share) * |mean predicted - mean observed|."""
    pred = np.asarray(pred, dtype=np.float64).ravel()
    outcome = np.asarray(outcome, dtype=np.float64).ravel()
    if pred.size == 0:
        return 0.0
    bins = np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)
    # Per-bin |sum pred - sum outcome| / N == bin share * |mean pred - mean outcome|.
    gap = np.abs(np.bincount(bins, pred, n_bins) - np.bincount(bins, outcome, n_bins))
    return float(gap.sum() / pred.size)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free


def _survival_labels(num_positions: int, accepted, verified) -> tuple[np.ndarray, np.ndarray]:
    """[N, gamma] survived (k < accepted, 0-based) and observed (k < verified) masks."""
    accepted = np.asarray(accepted).reshape(-1, 1)
    verified = np.full_like(accepted, num_positions) if verified is None else np.asarray(verified).reshape(-1, 1)
    if (accepted > verified).any():
        raise ValueError("STS: a row accepted more drafts than were verified")
    k = np.arange(num_positions)[None, :]
    return k < accepted, k < verified


class SequentialTemperatureScaling:
    def __init__(self, temperatures) -> None:
        temps = [float(t) for t in temperatures]
        if not temps or any(not np.isfinite(t) or t <= 0 for t in temps):
            raise ValueError(f"STS: temperatures must be a non-empty list of positive numbers, got {temps}")
        self.temperatures = temps

    @classmethod
    def fit(cls, confidence_logits, accepted, verified=None, grid=DEFAULT_GRID, n_bins: int = 10):
        """confidence_logits [N, gamma] raw head logits; accepted [N] drafts accepted; verified [N] drafts
        verified (default all gamma). Returns the fitted calibrator."""
        logits = np.asarray(confidence_logits, dtype=np.float64)
        survived, observed = _survival_labels(logits.shape[1], accepted, verified)
        temps: list[float] = []
        prefix = np.ones(logits.shape[0])  # a_{k-1} with earlier temperatures already fixed
        for k in range(logits.shape[1]):
            rows = observed[:, k]
            if not rows.any():  # never verified this deep: nothing to learn, keep the raw head
                temps.append(1.0)
            else:
                eces = [expected_calibration_error(prefix[rows] * _sigmoid(logits[rows, k] / t),
                                                   survived[rows, k], n_bins) for t in grid]
                temps.append(float(grid[int(np.argmin(eces))]))
            prefix = prefix * _sigmoid(logits[:, k] / temps[-1])
        return cls(temps)

    def confidence(self, confidence_logits):
        """Calibrated c_k = sigmoid(l_k / T_k) over the last axis (numpy array or torch tensor)."""
        n = confidence_logits.shape[-1]
        if n > len(self.temperatures):
            raise ValueError(f"STS: {n} positions but only {len(self.temperatures)} temperatures were fitted")
        if hasattr(confidence_logits, "sigmoid"):  # torch, without importing it here
            temps = confidence_logits.new_tensor(self.temperatures[:n])
            return (confidence_logits / temps).sigmoid()
        return _sigmoid(np.asarray(confidence_logits, dtype=np.float64) / np.asarray(self.temperatures[:n]))

    def survival(self, confidence_logits):
        """Calibrated prefix survivals a_k = prod_{i<=k} c_i."""
        c = self.confidence(confidence_logits)
        return c.cumprod(-1) if hasattr(c, "sigmoid") else np.cumprod(c, axis=-1)

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump({"sts_temperatures": self.temperatures}, f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SequentialTemperatureScaling":
        with open(path) as f:
            raw = json.load(f)
        temps = raw.get("sts_temperatures", raw.get("temperatures")) if isinstance(raw, dict) else None
        if temps is None:
            raise ValueError(f"STS: {path} has no 'sts_temperatures' (or 'temperatures') list")
        return cls(temps)
