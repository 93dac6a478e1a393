"""The host time of a drafting step as a function of batch size, read off a `step_overhead` measurement.

    host = HostTime.load("benchmarks/host_time/cpu2-step-overhead.json", proposer="suffix_tree")
    host.seconds("adaptive", batch=64)   # the whole propose() of our vLLM adapter at B = 64

On a GPU the drafting step runs between two verification steps, so a model of goodput that leaves it
out flatters the proposers and policies that cost host time. Between measured batch sizes the time is
interpolated linearly; past the largest it grows by that size's time per request; below the smallest it
is the smallest's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np

DEFAULT = Path(__file__).resolve().parents[2] / "benchmarks" / "host_time" / "cpu2-step-overhead.json"
POLICIES = ("fixed", "adaptive")
# The engines' own proposers, as replay traces name them -> their rows in a step_overhead measurement.
# They run no policy of ours: only their `fixed` path exists.
ENGINE_ROWS = {"arctic": "vLLM suffix (ArcticInference)", "vllm_ngram": "vLLM ngram (numba)"}


class HostTime:
    """Measured seconds per drafting step for one proposer under the `fixed` and `adaptive` policies."""

    def __init__(self, rows: list[dict], proposer: str, source: str = "measurement") -> None:
        self.proposer, self.source = proposer, source
        self._curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        names = {"fixed": ENGINE_ROWS[proposer]} if proposer in ENGINE_ROWS else {p: f"{proposer} {p}" for p in POLICIES}
        for policy, name in names.items():
            points = sorted((int(r["batch"]), float(r["us_per_step"]) * 1e-6) for r in rows if r["proposer"] == name)
            if not points:
                known = sorted({r["proposer"] for r in rows})
                raise ValueError(f"host time {source}: no rows for {name!r}; it has {', '.join(known)}")
            self._curves[policy] = (np.array([b for b, _ in points], dtype=float), np.array([s for _, s in points]))

    @classmethod
    def load(cls, path: str | Path, proposer: str) -> "HostTime":
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"host time {path}: cannot read a step_overhead JSON ({exc})") from None
        rows = doc["rows"] if isinstance(doc, dict) else doc
        return cls(rows, proposer, source=str(path))

    def seconds(self, policy: Literal["fixed", "adaptive"], batch: int) -> float:
        if policy not in self._curves:
            raise ValueError(f"host time: {self.proposer!r} is an engine's own proposer; it runs no {policy} policy")
        batches, secs = self._curves[policy]
        if batch >= batches[-1]:
            return float(secs[-1] / batches[-1] * batch)
        return float(np.interp(batch, batches, secs))
