"""The step-profile format, and `MeasuredCost`: the step cost read off a measured profile.

Loaded inside the serving engine (the adaptive policy in the vLLM worker or the TensorRT-LLM drafter,
through `spec_plugins.policy.cost.step_cost`, when its options name a profile), and by the planner and
the simulator. It is apart from the profiler that writes profiles (`spec_plugins.bench.profile`, which
drives a live engine and plots with matplotlib) so that loading a profile imports none of that.

The saved JSON (`load_profile` validates it; readers ignore keys they do not know):

    {"format": "spec-plugins-step-profile/1",
     "engine": "vllm 0.32.0+cpu",           # `vllm <version>` of the engine measured
     "device": "AMD EPYC (2 CPUs)",         # CPU model (and CPU count) or GPU name
     "model": "smollm2",                    # the --model given: a path or "smollm2"
     "model_shape": {"layers": 30, "hidden": 576, ...},  # optional: what `model_shape` reads off its config
     "dtype": "float32", "context_len": 256,
     "steps": 16, "enforce_eager": true,    # optional: N, and whether vLLM ran without compilation
     "points": [{"batch": 1, "draft": 0, "tokens": 1, "step_ms": 7.9, "runs": [7.8, 7.9, 8.1],
                 "drafted_per_step": null, "accepted_per_step": null}, ...],
     "created": "2025-01-01T12:00:00+00:00", "command": "spec-plugins profile ...",
     "contexts": [{"context_len": 2048, "points": [...]}]}   # optional: (another) grid at other contexts

One point per (batch, draft) cell: tokens = batch·(1 + draft) verified per step, step_ms the median
of runs (each the median ms per decode step of one run, one run per repeat). drafted_per_step and
accepted_per_step (optional) are vLLM's spec-decode metrics over the timed runs: draft tokens and
accepted tokens per request-step (null without speculation); drafted_per_step ≈ draft shows that the
engine verified what was drafted. How the steps are timed is in `spec_plugins.bench.profile`.

With `contexts`, a step's cost also depends on each request's context length, so verified tokens over long
contexts pay the attention a profile at one context leaves out. The shortest profiled context is the
reference; every longer one adds its extra time over the reference, Δ_g(batch, rows), made never cheaper for
a longer context or for more rows, and linear in rows from the base step (the chord to the longest draft
profiled): each drafted row over a long context pays the mean extra of the profiled drafts. A request weighs
the Δ_g of the two profiled contexts around its own linearly (nothing below the reference, the last two's trend
beyond the longest), and a step of B requests drafting d_r tokens (R = B + Σ d_r rows) costs

    T_ref(B, R) + Σ_g [ mean_r α_rg · Δ_g(B, B) + (Σ_r α_rg d_r) · (Δ_g(B, R) - Δ_g(B, B)) / (R - B) ]

with α_rg request r's weight on context g: the batch's share of the base step by its requests' mean weight,
the drafted rows' share by whose rows they are. With every request at one context this is the profile
read at that context; with short and long requests mixed, a token drafted over a short context is priced
as short, not at the batch's mean.

`MeasuredCost(profile)` turns a profile into the step-cost interface of the allocator and planner
(`spec_plugins.policy.allocator.StepCost`), the same names as the roofline model in `cost.py`.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pydantic

from spec_plugins import _contract

FORMAT = "spec-plugins-step-profile/1"


# --------------------------------------------------------------------------------------------
# the file format


class ProfilePoint(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    batch: int = pydantic.Field(ge=1)
    draft: int = pydantic.Field(ge=0)
    tokens: int = pydantic.Field(ge=1)
    step_ms: float = pydantic.Field(gt=0)
    runs: list[float] = pydantic.Field(default_factory=list)
    drafted_per_step: float | None = None
    accepted_per_step: float | None = None

    @pydantic.model_validator(mode="after")
    def _tokens_match(self) -> "ProfilePoint":
        if self.tokens != self.batch * (1 + self.draft):
            expected = self.batch * (1 + self.draft)
            raise ValueError(f"expected tokens = batch * (1 + draft) = {expected}, got {self.tokens}")
        return self


class ContextPoints(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    context_len: int = pydantic.Field(ge=1)
    points: list[ProfilePoint]


class StepProfile(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")

    format: str
    engine: str
    device: str
    model: str
    model_shape: dict[str, int] | None = None
    dtype: str
    context_len: int = pydantic.Field(ge=1)
    steps: int | None = None
    enforce_eager: bool | None = None
    points: list[ProfilePoint]
    created: str
    command: str
    contexts: list[ContextPoints] = pydantic.Field(default_factory=list)


def validate_profile(data: Any, where: str = "profile") -> dict:
    """`data` checked against the format (one-line ValueError naming `where` and the field)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ValueError(f"{where}: expected format {FORMAT!r}, got {data.get('format')!r}")
    try:
        profile = StepProfile(**data)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "points"
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}: {loc}: {msg} (got {err.get('input')!r})") from None
    if len(profile.points) < 2:
        raise ValueError(f"{where}: points: expected at least 2 points, got {len(profile.points)}")
    counts = {p.tokens for p in profile.points}
    if len(counts) < 2:  # a line needs two token counts: nothing to interpolate or extrapolate from
        raise ValueError(f"{where}: points: expected at least 2 distinct token counts, got only {counts.pop()}")
    seen = {profile.context_len}
    for i, other in enumerate(profile.contexts):
        if other.context_len in seen:
            raise ValueError(f"{where}: contexts.{i}.context_len: expected a context length not profiled yet, "
                             f"got {other.context_len} again")
        seen.add(other.context_len)
        if len({p.tokens for p in other.points}) < 2:
            raise ValueError(f"{where}: contexts.{i}.points: expected at least 2 distinct token counts")
    data = profile.model_dump()
    if not data["contexts"]:
        del data["contexts"]  # a one-context profile reads and saves as before
    if data["model_shape"] is None:
        del data["model_shape"]
    return data


def add_context(profile: dict, other: dict, where: str = "profile") -> dict:
    """`profile` with `other` (a profile of the same engine, model and dtype at another context length, on
    the same or a coarser grid of cells) as one of its `contexts`."""
    for key in ("engine", "model", "dtype"):
        if profile[key] != other[key]:
            raise ValueError(f"{where}: {key}: expected the same as the profile it joins ({profile[key]!r}), "
                             f"got {other[key]!r}")
    merged = dict(profile)
    joined = {"context_len": other["context_len"], "points": other["points"]}
    merged["contexts"] = [*profile.get("contexts", []), joined]
    if other["command"] != profile["command"]:  # one CLI run of several contexts gives one command
        merged["command"] = f"{profile['command']} ; {other['command']}"
    return validate_profile(merged, where)


def load_profile(path: str | os.PathLike) -> dict:
    """Read and validate a step profile (`spec-plugins profile`, `spec_plugins.bench.stack_profile`)."""
    where = f"profile {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: expected JSON, got invalid JSON ({exc.msg} at line {exc.lineno})") from None
    return validate_profile(data, where)


def save_profile(profile: dict, path: str | os.PathLike) -> Path:
    out = Path(path)
    data = validate_profile(profile, f"profile {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    # One line per key and per point: readable, and a diff of two profiles shows which cells moved.
    head = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items() if k not in ("points", "contexts")]
    points = ",\n".join(f"  {json.dumps(p)}" for p in data["points"])
    parts = [*head, f' "points": [\n{points}\n ]']
    if "contexts" in data:
        blocks = []
        for c in data["contexts"]:
            cp = ",\n".join(f"    {json.dumps(p)}" for p in c["points"])
            blocks.append(f'  {{"context_len": {c["context_len"]}, "points": [\n{cp}\n  ]}}')
        parts.append(' "contexts": [\n' + ",\n".join(blocks) + "\n ]")
    out.write_text("{\n" + ",\n".join(parts) + "\n}\n")
    return out


# --------------------------------------------------------------------------------------------
# the cost model


SHAPE_FIELDS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")


def model_shape(config: dict) -> dict[str, int]:
    """The fields of a Hugging Face config that set a step's cost, as a profile records them (`model_shape`)."""
    from spec_plugins.policy.model import ModelDescriptor

    d = ModelDescriptor.from_config(config)
    return {f: int(getattr(d, f)) for f in SHAPE_FIELDS}


def check_profile_model(profile: dict, config: dict, where: str = "policy_options.profile") -> None:
    """ValueError (one line, naming `where`) when `profile` was measured for a model of another shape than
    `config` (the engine's Hugging Face config). A profile without `model_shape` cannot be checked."""
    recorded = profile.get("model_shape")
    if not recorded:
        return
    try:
        served = model_shape(config)
    except ValueError:  # a config the cost model cannot read (no attention heads, ...): nothing to compare
        return
    differ = [f for f in SHAPE_FIELDS if f in recorded and int(recorded[f]) != served[f]]
    if differ:
        got = ", ".join(f"{f} {recorded[f]}" for f in differ)
        want = ", ".join(f"{f} {served[f]}" for f in differ)
        raise ValueError(f"{where}: measured for another model ({profile.get('model')!r}: {got}); the engine serves "
                         f"{want}: profile this model (spec-plugins profile) or leave the profile out")


def profile_path(name_or_path: str) -> str:
    """A measured profile file, or the name of one shipped in configs/profiles (e.g. vllm-cpu-smollm2-135m)."""
    from spec_plugins.policy.hardware import builtin_config_dir

    if Path(name_or_path).exists() or name_or_path.endswith(".json"):
        return name_or_path
    shipped = builtin_config_dir("profiles")
    path = shipped / f"{name_or_path}.json"
    if not path.is_file():
        names = sorted(p.stem for p in shipped.glob("*.json"))
        raise ValueError(f"policy_options.profile: no file or shipped profile {name_or_path!r}; "
                         f"shipped: {', '.join(names) or 'none'}")
    return str(path)


def _curve_at_many(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """_curve_at element by element (the same operations, so the same values)."""
    x = np.asarray(x, dtype=np.float64)
    if len(xs) == 1:
        return np.full(x.shape, float(ys[0]))
    slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    out = np.interp(x, xs, ys)
    out = np.where(x >= xs[-1], ys[-1] + slope * (x - xs[-1]), out)
    return np.where(x <= xs[0], float(ys[0]), out)


def _curve_at(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """Piecewise-linear through (xs, ys); flat below the first point, the last slope (never negative) beyond."""
    if x <= xs[0] or len(xs) == 1:
        return float(ys[0]) if x <= xs[0] else float(ys[-1])
    if x >= xs[-1]:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        return float(ys[-1] + slope * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _grid(points: list[dict]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """batch -> (draft lengths, step seconds non-decreasing in draft) of one context's points."""
    by_cell: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        by_cell[p["batch"]][p["draft"]].append(p["step_ms"] / 1e3)
    grid = {}
    for b in sorted(by_cell):
        drafts = sorted(by_cell[b])
        secs = [statistics.median(by_cell[b][d]) for d in drafts]
        grid[b] = (np.array(drafts, dtype=np.float64), np.maximum.accumulate(np.array(secs)))
    return grid


class MeasuredCost:
    """Step cost read off a measured profile (seconds), with the allocator's `StepCost` interface.

    A step of B requests verifying `rows` tokens costs `batch_time(B, rows)`: the profile's (batch, draft)
    grid read at the mean draft rows / B - 1, interpolated between the measured batch sizes. Both axes
    matter: 256 tokens as B = 256, D = 0 read 256 KV caches, as B = 16, D = 15 only 16 (18.5 ms against
    9.3 ms on the H200 profile), and on a CPU a bigger batch can be cheaper per token. Attention at the
    profiled context length is inside the measured times; with the profile's `contexts` each request adds
    the extra time of its own context (module docstring). `linear_time(rows)` (medians by token count, for
    callers that do not know the batch) remains.
    """

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        # Model-free drafting (n-gram, suffix tree) costs microseconds per request on the host.
        draft_us_per_request: float = pydantic.Field(default=5.0, ge=0)

    def __init__(self, profile: dict | str | os.PathLike, draft_us_per_request: float = 5.0) -> None:
        try:
            opts = self.Options(draft_us_per_request=draft_us_per_request)
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"MeasuredCost.{err['loc'][0]}: {err['msg']} (got {err.get('input')!r})") from None
        if isinstance(profile, (str, os.PathLike)):
            self.profile = load_profile(profile)
        else:
            self.profile = validate_profile(profile)
        self.draft_us_per_request = opts.draft_us_per_request
        # The fixed part of a step (scheduling, launches, sampling) is inside every measured time.
        self.overhead_s = 0.0
        by_tokens: dict[int, list[float]] = defaultdict(list)
        for p in self.profile["points"]:
            by_tokens[p["tokens"]].append(p["step_ms"] / 1e3)
        self.tokens = np.array(sorted(by_tokens), dtype=np.float64)
        medians = np.array([statistics.median(by_tokens[t]) for t in sorted(by_tokens)])
        # Verifying more tokens never makes a step cheaper; a dip between two points is measurement
        # noise, and an allocator searching for the best length would chase it. Keep the running max.
        self.seconds = np.maximum.accumulate(medians)
        self._cache: dict[float, float] = {}
        # Per profiled context length (the profile's own first), per measured batch size: step seconds
        # against draft length, made non-decreasing likewise.
        grids = [(self.profile["context_len"], self.profile["points"])]
        grids += [(c["context_len"], c["points"]) for c in self.profile.get("contexts", [])]
        self.context_lens = [c for c, _ in grids]
        self._grids = [_grid(points) for _, points in grids]
        self._grid_batches = [sorted(g) for g in self._grids]  # each grid's batch sizes, read every step
        # The longest draft every context profiled at every batch (the contexts' extra is linear up to it).
        self._top_draft = int(min(d.max() for grid in self._grids for d, _ in grid.values()))
        self.batches = self._grid_batches[0]  # the profile's own context's
        self._by_context = sorted(range(len(grids)), key=self.context_lens.__getitem__)  # grids by context
        self._sorted_contexts = [self.context_lens[g] for g in self._by_context]
        self._batch_cache: dict[tuple[int, float], float] = {}  # (batch, rows) at the profile's own context
        self._deltas: dict[int, np.ndarray] = {}  # batch size -> delta_curves
        self._curves: dict[tuple[int, int], np.ndarray] = {}  # (batch size, grid) -> batch_time at rows 0, 1, ...

    @property
    def has_contexts(self) -> bool:
        """Whether the profile has several context lengths (then a request's context changes its cost)."""
        return len(self._grids) > 1

    def context_weights(self, context_lens: Sequence[int] | np.ndarray) -> np.ndarray:
        """α [n, G - 1]: each request's weight on the profiled contexts longer than the reference (shortest),
        in increasing order: (1 - w, w) on the two around its context, w > 1 beyond the longest."""
        c = np.asarray(context_lens, dtype=np.float64)
        ctx = np.asarray(self._sorted_contexts, dtype=np.float64)
        g = len(ctx)
        alpha = np.zeros((len(c), g))
        if g > 1 and len(c):
            i = np.clip(np.searchsorted(ctx, c), 1, g - 1)
            w = np.where(c <= ctx[0], 0.0, (c - ctx[i - 1]) / (ctx[i] - ctx[i - 1]))
            rows = np.arange(len(c))
            alpha[rows, i] = w
            alpha[rows, i - 1] += 1.0 - w
        return np.ascontiguousarray(alpha[:, 1:])

    def delta_curves(self, batch: int, size: int) -> np.ndarray:
        """Δ [G - 1, >= size]: each longer context's extra step time over the reference at rows 0, 1, ...,
        never below a shorter context's nor below its own at fewer rows."""
        size = max(size, batch * (1 + self._top_draft) + 1)  # the chord's end is always in the curves
        hit = self._deltas.get(batch)
        if hit is None or hit.shape[1] < size:
            order = self._by_context
            curves = [self._grid_curve(g, batch, size) for g in order]
            m = min(len(c) for c in curves)
            delta = np.maximum(np.stack([c[:m] for c in curves[1:]]) - curves[0][:m], 0.0)
            delta = np.maximum.accumulate(np.maximum.accumulate(delta, axis=0), axis=1)
            # From the base step on, each context's extra is the chord to the longest profiled draft, continued:
            # every drafted row pays the drafted rows' mean extra. Read as a curve, a concave extra (vLLM-CPU:
            # a long-context request's first drafted row costs 3x a later one) made every row past the first
            # look cheap in the shared chord below, and the policy drafted more on long contexts, not less. A
            # jump per drafting request plus a cheaper slope after it (the profile's shape, and per request)
            # made it draft longer blocks and lost end to end (docs/notes/results-log.md).
            top = min(batch * (1 + self._top_draft), m - 1)
            if top > batch:
                slope = (delta[:, top] - delta[:, batch]) / (top - batch)
                delta[:, batch:] = delta[:, batch, None] + slope[:, None] * np.arange(m - batch, dtype=np.float64)
                delta = np.maximum.accumulate(delta, axis=0)  # a longer context never cheaper
            hit = self._deltas[batch] = np.ascontiguousarray(delta)
        return hit

    def context_terms(self, batch: int, size: int, context_lens: Sequence[int] | np.ndarray
                      ) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        """(reference curve by rows, base extra seconds, Δ curves, α): a step's cost with per-request contexts,
        as the allocator's walk reads it. After admitting k drafted rows whose α sum to W_g it costs
        curve[B + k] + base + Σ_g W_g (Δ_g[B + k] - Δ_g[B]) / k."""
        delta = self.delta_curves(batch, size)
        curve = self._grid_curve(self._by_context[0], batch, size)
        alpha = self.context_weights(context_lens)
        base = float(np.dot(alpha.sum(axis=0) / batch, delta[:, batch])) if len(alpha) else 0.0
        return curve, base, delta, alpha

    def batch_time(self, batch: int, rows: float, context: float | None = None) -> float:
        """Step time (s) of `batch` requests verifying `rows` tokens in all (drafting excluded), all at context
        length `context` (None: the profile's context_len)."""
        if context is not None and self.has_contexts:
            lo = int(np.floor(rows))
            curve = self.batch_curve(batch, lo + 2, context)
            return float(curve[lo] + (rows - lo) * (curve[lo + 1] - curve[lo]))
        key = (batch, rows)
        hit = self._batch_cache.get(key)
        if hit is None:
            hit = self._batch_cache[key] = self._grid_time(0, batch, rows)
        return hit

    def _grid_time(self, g: int, batch: int, rows: float) -> float:
        draft = rows / batch - 1.0
        grid, bs = self._grids[g], self._grid_batches[g]

        def at(b: int) -> float:
            return _curve_at(*grid[b], draft)

        if batch <= bs[0] or len(bs) == 1:
            return at(bs[0]) if batch <= bs[0] else at(bs[-1])
        if batch >= bs[-1]:  # more requests than measured: extend the last two batch sizes' trend
            lo, hi = at(bs[-2]), at(bs[-1])
            return hi + max(0.0, (hi - lo) / (bs[-1] - bs[-2])) * (batch - bs[-1])
        i = int(np.searchsorted(bs, batch))
        b0, b1 = bs[i - 1], bs[i]
        w = (batch - b0) / (b1 - b0)
        return (1 - w) * at(b0) + w * at(b1)

    def batch_times(self, batch: int, rows: np.ndarray, context: float | None = None) -> np.ndarray:
        """batch_time(batch, r, context) for an array of integer row counts, from a curve per batch size
        that is computed once (the allocator reads thousands of points of it per step)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros(0)
        return self.batch_curve(batch, int(rows.max()) + 1, context)[rows]

    def batch_curve(self, batch: int, size: int, context: float | None = None) -> np.ndarray:
        """batch_time(batch, 0, context), batch_time(batch, 1, context), ...: at least `size` entries; each
        profiled context's curve is kept per batch size, a blend of them is not."""
        if context is None or not self.has_contexts:
            return self._grid_curve(0, batch, size)
        delta = self.delta_curves(batch, size)
        curve = self._grid_curve(self._by_context[0], batch, size)[: delta.shape[1]]
        return curve + self.context_weights([context])[0] @ delta

    def _grid_curve(self, g: int, batch: int, size: int) -> np.ndarray:
        curve = self._curves.get((batch, g))
        if curve is None or size > len(curve):
            size = max(size, 2 * (0 if curve is None else len(curve)), 17 * batch + 1)
            curve = self._curves[batch, g] = self._batch_curve(g, batch, np.arange(size, dtype=np.float64))
        return curve

    def _batch_curve(self, g: int, batch: int, rows: np.ndarray) -> np.ndarray:
        """_grid_time on an array of rows: the same operations, element by element."""
        draft = rows / batch - 1.0
        grid, bs = self._grids[g], self._grid_batches[g]

        def at(b: int) -> np.ndarray:
            return _curve_at_many(*grid[b], draft)

        if batch <= bs[0] or len(bs) == 1:
            return at(bs[0]) if batch <= bs[0] else at(bs[-1])
        if batch >= bs[-1]:
            lo, hi = at(bs[-2]), at(bs[-1])
            return hi + np.maximum(0.0, (hi - lo) / (bs[-1] - bs[-2])) * (batch - bs[-1])
        i = int(np.searchsorted(bs, batch))
        b0, b1 = bs[i - 1], bs[i]
        w = (batch - b0) / (b1 - b0)
        return (1 - w) * at(b0) + w * at(b1)

    def attention_times(self, draft_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        return np.zeros(len(draft_lens))  # inside batch_time, as attention_time

    def linear_times(self, rows: np.ndarray) -> np.ndarray:
        return np.array([self.linear_time(float(r)) for r in np.asarray(rows).tolist()], dtype=np.float64)

    def linear_time(self, rows: float) -> float:
        """Step time (s) at `rows` tokens per step: interpolated between measured token counts."""
        if rows <= 0:
            return 0.0
        hit = self._cache.get(rows)  # an allocator asks for the same few row counts thousands of times
        if hit is not None:
            return hit
        # Below the smallest measured step the fixed cost dominates: keep it (flat).
        t = _curve_at(self.tokens, self.seconds, rows)
        self._cache[rows] = t
        return t

    def attention_time(self, draft_len: int, context_len: int) -> float:
        return 0.0  # inside batch_time (and linear_time): the measured steps include attention

    def draft_time(self, draft_lens: Sequence[int]) -> float:
        # Twice a step on the serving path: the requests drafting counted in one compiled call, not three numpy ones.
        drafting, _ = _contract.count_and_sum(np.ascontiguousarray(draft_lens, dtype=np.int64))
        return self.draft_us_per_request * 1e-6 * drafting

    def step_time(self, draft_lens: Sequence[int], context_lens: Sequence[int]) -> float:
        return self._verify_time(draft_lens, context_lens) + self.draft_time(draft_lens)

    def speedup(self, batch: int, draft_len: int, acceptance_length: float, context_len: int) -> float:
        """T_verif(B)·AL / (T_verif(B·(1+D)) + T_draft): modelled speed-up of drafting D for all B requests."""
        if batch < 1:
            raise ValueError(f"speedup.batch: expected an integer >= 1, got {batch}")
        if draft_len < 0:
            raise ValueError(f"speedup.draft_len: expected an integer >= 0, got {draft_len}")
        if acceptance_length < 1.0:
            raise ValueError(f"speedup.acceptance_length: expected a number >= 1, got {acceptance_length}")
        contexts = [context_len] * batch
        base = self._verify_time([0] * batch, contexts)
        drafts = [draft_len] * batch
        return base * acceptance_length / (self._verify_time(drafts, contexts) + self.draft_time(drafts))

    def _verify_time(self, draft_lens: Sequence[int], context_lens: Sequence[int]) -> float:
        if len(draft_lens) != len(context_lens):
            raise ValueError(f"step_time: {len(draft_lens)} draft lengths for {len(context_lens)} context lengths")
        n = len(draft_lens)
        if n == 0:
            return 0.0
        d = np.asarray(draft_lens, dtype=np.int64)
        rows = n + int(d.sum())
        if not self.has_contexts:
            return self.overhead_s + self.batch_time(n, rows)
        curve, base, delta, alpha = self.context_terms(n, rows + 1, context_lens)
        extra = base
        if rows > n:  # the drafted rows' share, by whose rows they are (summed in order, as the walk does)
            for g in range(alpha.shape[1]):
                weight = float(np.cumsum(alpha[:, g] * d)[-1])
                extra += weight * ((delta[g, rows] - delta[g, n]) / float(rows - n))
        return self.overhead_s + float(curve[rows]) + extra
