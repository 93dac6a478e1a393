"""The host time of a drafting step as a function of batch size and of the tokens each request appends, read
off `step_overhead` measurements.

    host = HostTime.load("benchmarks/host_time/cpu2-step-overhead.json", proposer="suffix_tree",
                         growth=GROWTH)
    host.seconds("adaptive", batch=64)              # the whole propose() of our vLLM adapter at B = 64
    host.seconds("fixed", batch=256, tokens=9.5)    # ... when each request appends 9.5 tokens a step

On a GPU the drafting step runs between two verification steps, so a model of goodput that leaves it out
flatters the proposers and policies that cost host time. The base measurement appends 1-4 tokens per
request a step (BASE_TOKENS on average); between its batch sizes the time is interpolated linearly, past the
largest it grows by that size's time per request, below the smallest it is the smallest's.

What a request appends changes the step: a suffix tree's appends grow with it (on code edits, where ~15
tokens a step are accepted, ten times the base), an n-gram scan does not. The growth measurements
(`step_overhead --verify`, on code and on code rewrites, at a few batch sizes) give, per batch size, the
time at other token counts; `seconds(..., tokens=t)` scales the base time by the ratio of the time at t to
the time at BASE_TOKENS along the piecewise-linear curve through the measured points (the base one
included; flat below the fewest tokens measured, extrapolated along the last segment above the most),
that ratio interpolated over log2(batch) between the batch sizes measured that way (and held outside them).
The measurements come from different runs of one machine, so the curve mixes their run-to-run spread.

A policy's own work is not the proposer's: the `adaptive` path costs the `fixed` path's time (appends,
drafting, the ledger) plus what its policy adds (costing, trimming, learning from verification), and that part
walks each request's ≤ K draft positions whatever the request appended. So `seconds("adaptive", b, t)` is
`seconds("fixed", b, t)` plus the base measurement's adaptive - fixed at b, grown along tokens only as far as the
growth measurements' own adaptive - fixed grew (paired within each run, so runs at other levels do not mix:
from ~1.8 to ~15 tokens, 1.25x at B = 1 and 1.39x at B = 256, where the fixed path grew 2x and 14x). Scaling
the whole adaptive time by the fixed path's growth would charge the policy ten times its measured cost at
B = 16 on code edits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks" / "host_time"
DEFAULT = FOLDER / "cpu2-step-overhead.json"
GROWTH = (FOLDER / "cpu2-step-overhead-verify.json", FOLDER / "cpu2-step-overhead-rewrite.json")
BASE_TOKENS = 2.5  # tokens a request appends per step in the base measurement (1-4, uniform)
POLICIES = ("fixed", "adaptive")
# The engines' own proposers, as replay traces name them -> their rows in a step_overhead measurement.
# They run no policy of ours: only their `fixed` path exists.
ENGINE_ROWS = {"arctic": "vLLM suffix (ArcticInference)", "vllm_ngram": "vLLM ngram (numba)"}


def _read(path: str | Path) -> list[dict]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"host time {path}: cannot read a step_overhead JSON ({exc})") from None
    return doc["rows"] if isinstance(doc, dict) else doc


class HostTime:
    """Measured seconds per drafting step for one proposer under the `fixed` and `adaptive` policies."""

    def __init__(self, rows: list[dict], proposer: str, source: str = "measurement",
                 growth_rows: Sequence[dict] = (), growth_sources: Sequence[str] = ()) -> None:
        self.proposer, self.source = proposer, source
        self.catchup: CatchUpTime | None = None  # the step after a pause (`catchup_seconds`); None: not charged
        self.growth_sources = list(growth_sources)  # the measurements growth_rows came from
        self._curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._inside: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # policy -> (batches, proposer's share)
        # policy -> (log2 batches, per batch: (tokens, time / the base time) of the curve at that batch)
        self._growth: dict[str, tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]] = {}
        if proposer in ENGINE_ROWS:
            names = {"fixed": ENGINE_ROWS[proposer]}
        else:
            names = {p: f"{proposer} {p}" for p in POLICIES}
        for policy, name in names.items():
            points = sorted((int(r["batch"]), float(r["us_per_step"]) * 1e-6) for r in rows if r["proposer"] == name)
            if not points:
                known = sorted({r["proposer"] for r in rows})
                raise ValueError(f"host time {source}: no rows for {name!r}; it has {', '.join(known)}")
            self._curves[policy] = (np.array([b for b, _ in points], dtype=float), np.array([s for _, s in points]))
            inside = sorted((int(r["batch"]), float(r["proposer_us"]) / float(r["us_per_step"])) for r in rows
                            if r["proposer"] == name and r.get("proposer_us") is not None)
            if inside:  # the share of the step inside the proposer's own drafting call
                self._inside[policy] = (np.array([b for b, _ in inside], dtype=float), np.array([f for _, f in inside]))
            by_batch = _growth_by_batch(growth_rows, name)
            if by_batch:
                batches = sorted(by_batch)
                curves = []
                for b in batches:
                    base = self._base(policy, b)
                    pts = sorted([(float(r["tokens_per_request_step"]), float(r["us_per_step"]) * 1e-6)
                                  for r in by_batch[b]] + [(BASE_TOKENS, base)])
                    curves.append((np.array([t for t, _ in pts]), np.array([s / base for _, s in pts])))
                self._growth[policy] = (np.log2(np.array(batches, dtype=float)), curves)
        self._extra_growth = self._policy_growth(growth_rows, names) if "adaptive" in names else None

    @staticmethod
    def _policy_growth(growth_rows: Sequence[dict], names: dict[str, str]
                       ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]] | None:
        """Per measured batch size, (tokens, the policy's adaptive - fixed at those tokens / at BASE_TOKENS) from the
        growth rows: the i-th fixed and the i-th adaptive row of a batch size are one run's pair. None where no batch
        size has two pairs, or the difference at the fewest tokens is not positive (nothing to scale)."""
        rows = {policy: _growth_by_batch(growth_rows, name) for policy, name in names.items()}
        batches, curves = [], []
        for b in sorted(set(rows["fixed"]) & set(rows["adaptive"])):
            pairs = sorted((float(f["tokens_per_request_step"]), (float(a["us_per_step"]) - float(f["us_per_step"])) * 1e-6)
                           for f, a in zip(rows["fixed"][b], rows["adaptive"][b]))
            if len(pairs) < 2 or pairs[0][1] <= 0.0:
                continue
            tokens, extra = np.array([t for t, _ in pairs]), np.array([max(e, 0.0) for _, e in pairs])
            batches.append(b)
            curves.append((tokens, extra / _along(tokens, extra, BASE_TOKENS)))
        return (np.log2(np.array(batches, dtype=float)), curves) if batches else None

    @classmethod
    def load(cls, path: str | Path, proposer: str, growth: Sequence[str | Path] = ()) -> "HostTime":
        """`path`: the base measurement; `growth`: measurements with tokens per request (none: the base alone)."""
        return cls(_read(path), proposer, source=str(path), growth_rows=[r for g in growth for r in _read(g)],
                   growth_sources=[str(g) for g in growth])

    def catchup_seconds(self, batch: int, backlog: float) -> float:
        """What the step that ends a pause adds for `backlog` tokens a request appended during it (`catchup`, a
        CatchUpTime; 0 without one)."""
        return 0.0 if self.catchup is None else self.catchup.seconds(batch, backlog)

    def seconds(self, policy: Literal["fixed", "adaptive"], batch: int, tokens: float | None = None) -> float:
        """Host seconds of one step of `batch` requests; tokens: what each appends on average this step (None:
        as in the base measurement)."""
        if policy == "adaptive" and "adaptive" in self._curves:
            extra = self._base("adaptive", batch) - self._base("fixed", batch)
            if tokens is not None and self._extra_growth is not None:
                extra *= _interp_log2(batch, *self._extra_growth, tokens)
            return self.seconds("fixed", batch, tokens) + extra
        base = self._base(policy, batch)
        if tokens is None or policy not in self._growth:
            return base
        return base * _interp_log2(batch, *self._growth[policy], tokens)

    def sample_seconds(self, policy: Literal["fixed", "adaptive"], sample: int, batch: int,
                       tokens: float | None = None) -> float:
        """Host seconds of a step of `batch` requests of which only `sample` draft (a probe of the drafting pause):
        the proposer's own drafting call (its measured share of the step, `proposer_us`) at the sample's size, the
        rest (the ledger, the policy's trim of the whole step, the adapter) at the batch's. The whole step's time
        where the measurement does not split it."""
        whole = self.seconds(policy, batch, tokens)
        if policy not in self._inside or sample >= batch:
            return whole
        share = self._inside[policy]
        return (whole * (1.0 - float(np.interp(batch, *share)))
                + self.seconds(policy, sample, tokens) * float(np.interp(sample, *share)))

    def _base(self, policy: str, batch: int) -> float:
        if policy not in self._curves:
            raise ValueError(f"host time: {self.proposer!r} is an engine's own proposer; it runs no {policy} policy")
        batches, secs = self._curves[policy]
        if batch >= batches[-1]:
            return float(secs[-1] / batches[-1] * batch)
        return float(np.interp(batch, batches, secs))


def _growth_by_batch(growth_rows: Sequence[dict], name: str) -> dict[int, list[dict]]:
    """The growth rows of proposer row `name` that say what each request appended, by batch size, in their order."""
    by_batch: dict[int, list[dict]] = {}
    for r in growth_rows:
        if r["proposer"] == name and r.get("tokens_per_request_step") is not None:
            by_batch.setdefault(int(r["batch"]), []).append(r)
    return by_batch


def _interp_log2(batch: int, log_batches: np.ndarray, curves: list[tuple[np.ndarray, np.ndarray]], tokens: float
                 ) -> float:
    """Each measured batch size's curve at `tokens`, interpolated over log2(batch) (held outside them)."""
    return float(np.interp(np.log2(max(batch, 1)), log_batches, [_along(t, r, tokens) for t, r in curves]))


def _along(tokens: np.ndarray, values: np.ndarray, t: float) -> float:
    """The piecewise-linear curve through (tokens, values) at t: flat below the first point, the last segment
    extended above the last (never below a tiny positive value)."""
    if len(tokens) > 1 and t > tokens[-1]:
        slope = (values[-1] - values[-2]) / max(tokens[-1] - tokens[-2], 1e-9)
        return float(max(values[-1] + slope * (t - tokens[-1]), 1e-9))
    return float(np.interp(t, tokens, values))


# Two runs of the same measurement (12 and 36 steps a cell); each cell is charged the lesser (see EngineHostTime).
ENGINE_DEFAULT = (FOLDER / "cpu2-engine-host-time.json", FOLDER / "cpu2-engine-host-time-steps36.json")


class EngineHostTime:
    """The engine core's own host seconds per step on vLLM's V1 runner with synchronous scheduling (scheduler,
    input prep, bookkeeping: `engine_us` of `spec_plugins.bench.engine_host_time`; the proposer's drafting is
    charged apart, the front end's output processing runs in its own process), by batch size and verified
    tokens per request. Between measured batch sizes linear, past the largest by its time per request, below the
    smallest the smallest's; between measured token counts linear, outside them the nearest. A full grid of
    measurements is first made non-decreasing in both (`monotone_grid`).

    Rows of several runs (the same cell measured more than once) give each cell its least median: another process on
    this shared host only ever adds time, and it comes in spells as long as a cell. Two runs of this 2-core host
    differ by up to 2x in a cell (B = 16 with 8 tokens a request: 4.86 ms in one, 2.35 ms in the other; B = 256
    slower throughout the second, its forwards too), more than a cell's steps differ within a run."""

    def __init__(self, rows: list[dict], source: str = "measurement") -> None:
        self.source = source
        least: dict[tuple[int, int], float] = {}
        for r in rows:
            cell = (int(r["tokens_per_request"]), int(r["batch"]))
            least[cell] = min(least.get(cell, np.inf), float(r["engine_us"]) * 1e-6)
        by_tokens: dict[int, list[tuple[int, float]]] = {}
        for (tokens, batch), secs in least.items():
            by_tokens.setdefault(tokens, []).append((batch, secs))
        if not by_tokens:
            raise ValueError(f"engine host time {source}: no rows")
        self._tokens = np.array(sorted(by_tokens), dtype=float)
        self._curves = [(np.array([b for b, _ in sorted(by_tokens[t])], dtype=float),
                         np.array([s for _, s in sorted(by_tokens[t])])) for t in sorted(by_tokens)]
        batches = [tuple(b) for b, _ in self._curves]
        if len(set(batches)) == 1:  # a full grid of batch sizes x token counts: make it monotone
            self._curves = [(self._curves[0][0], row) for row in monotone_grid(np.array([s for _, s in self._curves]))]

    @classmethod
    def load(cls, path: str | Path | Sequence[str | Path]) -> "EngineHostTime":
        """One measurement, or several runs of it (each cell: the least)."""
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        return cls([r for p in paths for r in _read(p)], source=",".join(map(str, paths)))

    def seconds(self, batch: int, tokens_per_request: float = 1.0) -> float:
        at = []
        for batches, secs in self._curves:
            if batch >= batches[-1]:
                at.append(float(secs[-1] / batches[-1] * batch))
            else:
                at.append(float(np.interp(batch, batches, secs)))
        return float(np.interp(tokens_per_request, self._tokens, at))


def isotonic(values: np.ndarray) -> np.ndarray:
    """The least-squares non-decreasing fit of a sequence (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in np.asarray(values, dtype=float).tolist():
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return np.concatenate([np.full(int(c), t / c) for t, c in blocks])


def monotone_grid(seconds: np.ndarray) -> np.ndarray:
    """A [token counts, batch sizes] table of host times made non-decreasing along both: the engine's host work does
    not fall when it verifies more tokens or runs more requests, so a dip in a measurement (at B = 64 on this 2-core
    host, 8 tokens a request read 4.98 ms against 6.85 ms for 4) is its noise, and charging it would reward whatever
    length lands in the dip. Least-squares monotone along tokens, then along batch sizes, then tokens again."""
    out = np.array(seconds, dtype=float)
    for axis in (0, 1, 0):
        out = np.apply_along_axis(isotonic, axis, out)
    return out


MRV2_DEFAULT = FOLDER / "mrv2-propose-cpu2.json"


class Mrv2HostTime:
    """Our drafting host time on vLLM 0.34's Model Runner V2: the V1 adapter's measured time (`base`, a HostTime,
    with its growth by tokens appended) plus what the MRV2 propose path adds to it at the same batch size (the
    `mrv2_minus_v1_us` of `spec_plugins.bench.mrv2_host_time`, measured in turns on the same steps: the sync's host
    side, the host mirror, the padded write; linear between measured batch sizes, the nearest outside them)."""

    def __init__(self, base: HostTime, rows: list[dict], source: str = "measurement") -> None:
        self.base, self.source, self.proposer = base, source, base.proposer
        self._extra: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for policy in POLICIES:
            points = sorted((int(r["batch"]), float(r["mrv2_minus_v1_us"]) * 1e-6) for r in rows if r["policy"] == policy)
            if points:
                self._extra[policy] = (np.array([b for b, _ in points], dtype=float), np.array([s for _, s in points]))
        if "fixed" not in self._extra:
            raise ValueError(f"MRV2 host time {source}: no rows for the fixed policy")

    @classmethod
    def load(cls, base: HostTime, path: str | Path = MRV2_DEFAULT) -> "Mrv2HostTime":
        return cls(base, _read(path), source=str(path))

    def seconds(self, policy: Literal["fixed", "adaptive"], batch: int, tokens: float | None = None) -> float:
        batches, extra = self._extra.get(policy, self._extra["fixed"])
        return self.base.seconds(policy, batch, tokens) + float(np.interp(batch, batches, extra))

    def sample_seconds(self, policy: Literal["fixed", "adaptive"], sample: int, batch: int,
                       tokens: float | None = None) -> float:
        batches, extra = self._extra.get(policy, self._extra["fixed"])  # the runner's rows are the whole batch's
        return self.base.sample_seconds(policy, sample, batch, tokens) + float(np.interp(batch, batches, extra))

    def catchup_seconds(self, batch: int, backlog: float) -> float:
        return self.base.catchup_seconds(batch, backlog)


CATCHUP_DEFAULT = FOLDER / "cpu2-catchup.json"


class CatchUpTime:
    """What the drafting step that ends a pause adds to an ordinary one: the proposer handed `backlog` more tokens a
    request than a step appends (`python -m spec_plugins.bench.catchup`: the step with g tokens new a request over the
    step with 1, at a few batch sizes). Linear in the backlog between the measured counts and along the last segment
    past them; linear in the batch size between those measured, by the largest one's time per request past it, the
    smallest one's below it.

    The growth measurements `HostTime.seconds(..., tokens)` reads come from steps in which ~15 tokens a request
    were accepted, so they hold the deeper searches of long matches as well as the appends: extrapolated to a
    backlog of 128 tokens they charge 105 ms at B = 256, where the measured catch-up is 12 ms."""

    def __init__(self, rows: list[dict], source: str = "measurement") -> None:
        self.source = source
        by_batch: dict[int, list[tuple[float, float]]] = {}
        for r in rows:
            by_batch.setdefault(int(r["batch"]), []).append((float(r["tokens"]) - 1.0, float(r["over_one_token_ms"]) * 1e-3))
        if not by_batch or any(len(v) < 2 for v in by_batch.values()):
            raise ValueError(f"catch-up time {source}: expected at least two token counts at each batch size")
        self._batches = np.array(sorted(by_batch), dtype=float)
        self._curves = [tuple(np.array(x) for x in zip(*sorted(by_batch[int(b)]))) for b in self._batches]

    @classmethod
    def load(cls, path: str | Path = CATCHUP_DEFAULT) -> "CatchUpTime":
        return cls(_read(path), source=str(path))

    def seconds(self, batch: int, backlog: float) -> float:
        if backlog <= 0.0:
            return 0.0
        at = [_along_extrapolated(x, y, backlog) for x, y in self._curves]
        if batch >= self._batches[-1]:
            return at[-1] * batch / self._batches[-1]
        return float(np.interp(batch, self._batches, at))


def _along_extrapolated(x: np.ndarray, y: np.ndarray, at: float) -> float:
    """The piecewise-linear curve through (x, y) at `at`, the last segment continued past the last point."""
    if at <= x[-1]:
        return float(np.interp(at, x, y))
    slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if x[-1] > x[-2] else 0.0
    return float(y[-1] + slope * (at - x[-1]))

