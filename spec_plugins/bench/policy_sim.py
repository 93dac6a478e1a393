"""Modelled goodput of draft-length policies on recorded acceptance traces.

    python -m spec_plugins.bench.policy_sim --hardware h200 --model-config configs/models/llama-3.1-8b.json \\
        --traces T1.json,T2.json --batch-sizes 1,4,16,64,256 --json OUT.json [--png OUT.png]
    python -m spec_plugins.bench.policy_sim --profile configs/profiles/vllm-cpu-smollm2-135m.json ...

Traces come from `python -m spec_plugins.bench.replay ... --trace-out DIR`: per request, per step,
what the proposer offered at the maximum draft (`drafted`), how many of those tokens verification
accepted (`accepted`) and, when the proposer gives them, its per-token confidences.

At batch size B, B slots run requests from the traces side by side (each slot starts at a seeded
random step of its first request, then takes the next request in turn, cycling, so large batches do
not run copies in lockstep). One simulated engine step takes the current step record of every slot;
a policy keeps l_r <= drafted_r tokens of each, the step emits 1 + min(accepted_r, l_r) tokens per
request and costs `cost.step_time(l, contexts)`. Every policy sees the same records in the same
order. Goodput = emitted tokens / modelled seconds. Policies:

* `static_<D>`: l = min(D, drafted) for D in 0..max draft;
* `schedule`: the planner's batch-size schedule (`spec_plugins.policy.planner`), from the same traces;
* `adaptive`: `spec_plugins.policy.adaptive.AdaptiveLength`, learning online as the steps go by;
* `hindsight`: l = accepted (drafts exactly what will be accepted; an upper reference, not a bound
  under every jagged cost).

Records are replayed as samples: a policy that keeps fewer tokens still moves on to the next record,
so all policies see identical inputs (the approximation every trace-driven simulator makes).

Host time: every step is also charged the measured host time of the drafting step at its batch size
(`--host-time`, a `python -m spec_plugins.bench.step_overhead --json` measurement; by default the one in
`benchmarks/host_time/`): the `fixed` path's for the static policies, the schedule and hindsight, the
`adaptive` path's for the adaptive policy, for the traces' proposer, scaled to the tokens each request
appends at that step (what the policy's previous step emitted per request; `--host-growth`, see
`spec_plugins.bench.host_time`): a suffix tree's appends, and vLLM `suffix`'s, cost more when more is
accepted; the adaptive policy's own work over the `fixed` path grows only as its paired measurements show. It
replaces the cost model's own per-request drafting estimate (`--draft-us`), which then applies
only with `--host-time none`. `static_0` is no speculation: no drafter runs, so it is charged no drafting host
time (the engine's own, below, it pays as every policy does).

The engine's own host time: every step is also charged what vLLM's V1 runner with synchronous scheduling
spends between two forwards (`--engine-host-time`, a `python -m spec_plugins.bench.engine_host_time`
measurement) at its batch size and verified tokens per request: where our proposers and vLLM's `suffix` run on
a GPU under vLLM 0.33, that time adds to every step. The adaptive policy learns it from the steps' simulated
times (`step_overhead: measured`), as it does from an engine's measured ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from spec_plugins.core import BatchDrafts, Draft, DraftBatch, DraftRequest, PausesDrafting, probe_stand_ins
from spec_plugins.policy.planner import AcceptanceStats, plan, schedule_for_batch
from spec_plugins.traces import load_traces

FORMAT = "spec-plugins-policy-sim/1"


@dataclass
class TraceRequest:
    id: str
    prompt_len: int
    pos: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    confidence: list[list[float] | None]


def trace_requests(traces: Sequence[dict]) -> list[TraceRequest]:
    out = []
    for t in traces:
        tag = f"{t.get('workload', '?')}/{t.get('proposer', '?')}"
        for req in t["requests"]:
            steps = req["steps"]
            if not steps:
                continue
            out.append(TraceRequest(
                id=f"{tag}/{req['id']}", prompt_len=int(req["prompt_len"]),
                pos=np.array([s["pos"] for s in steps]), drafted=np.array([s["drafted"] for s in steps]),
                accepted=np.array([s["accepted"] for s in steps]),
                confidence=[s.get("confidence") for s in steps],
            ))
    return out


def batch_schedule(requests: list[TraceRequest], batch: int, num_steps: int, seed: int = 0, whole: bool = True):
    """For each engine step, the (slot request key, request, step index) of every slot, and the keys whose request
    ended there. The batch starts full (each slot at a random step of its first request: an engine in its steady
    state) and a slot whose request ends takes the next of a fixed permutation from its first step, cycling.

    whole: run past `num_steps` until every request of the permutation has been taken and has ended, so every
    proposer's traces are simulated over the whole workload (at batch 1, `num_steps` alone would cover a few
    requests, and not the same ones for a proposer that emits more tokens a step)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(requests))
    next_req = 0
    copies: dict[int, int] = {}
    slots = []
    open_first = set()  # keys of the first pass's requests still in a slot

    def take(first: bool):
        nonlocal next_req
        i = int(order[next_req % len(order)])
        copies[i] = copies.get(i, 0) + 1
        key = f"{requests[i].id}#{copies[i]}"
        if next_req < len(order):
            open_first.add(key)
        next_req += 1
        start = int(rng.integers(len(requests[i].pos))) if first else 0
        return [key, i, start]

    for _ in range(batch):
        slots.append(take(True))
    steps = []
    while len(steps) < num_steps or (whole and (next_req < len(order) or open_first)):
        step = [(key, i, k) for key, i, k in slots]
        ends = []
        for s, (key, i, k) in enumerate(slots):
            if k + 1 < len(requests[i].pos):
                slots[s][2] = k + 1
            else:
                ends.append(key)
                open_first.discard(key)
                slots[s] = take(False)
        steps.append((step, ends))
    return steps


class StaticLength:
    """`static_<D>`: every request's draft cut to D tokens; D = 0 is no speculation (no drafter runs: no drafting
    host time)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.host_path = "fixed" if width > 0 else None

    def __call__(self, drafted: np.ndarray, accepted: np.ndarray) -> np.ndarray:
        return np.full(len(drafted), self.width)


class VerifiesSlots(StaticLength):
    """Model Runner V2 without adaptive verification: every one of the `width` slots is verified, filler included
    (vLLM 0.34 pads a short draft with the last token). Traces for it come from `replay --accounting mrv2`, whose
    `accepted` counts filler the target happened to accept; a narrower width than the trace's takes the first
    `width` slots of each step (the drafter's first tokens at a smaller K, which a voting drafter such as vLLM's
    `suffix` may choose differently)."""

    def verify(self, keys: Sequence[str], confidences: Sequence[list[float] | None], drafted: np.ndarray,
               accepted: np.ndarray, context: list[int]) -> np.ndarray:
        return np.full(len(drafted), self.width)


class AdaptiveVerification(VerifiesSlots):
    """vLLM 0.34's adaptive verification (`v1/worker/gpu/spec_decode/adaptive_verification.py`): every slot scored by
    its survival (the running product of the drafter's per-position confidences; filler 0), the batch's draft budget
    chosen as the one that maximises expected emitted tokens over step cost, the best slots admitted (ties in
    request order). Differences from vLLM, both in its favour: the step cost is this simulator's own model, and the
    budget is chosen on this step's confidences where vLLM reads the step before's (async scheduling).

    policy: our speculator's policy under adaptive verification (`AdaptiveLength`): it trims each draft first and
    hands vLLM its calibrated conditional acceptance estimates instead of the drafter's raw confidences, then
    learns from the slots vLLM verified (`vllm/mrv2/speculator.py`)."""

    def __init__(self, width: int, cost: Any, policy: Any = None) -> None:
        super().__init__(width)
        self.cost, self.policy = cost, policy
        self.host_path = "fixed" if policy is None else "adaptive"  # which measured drafting host time applies

    def verify(self, keys: Sequence[str], confidences: Sequence[list[float] | None], drafted: np.ndarray,
               accepted: np.ndarray, context: list[int]) -> np.ndarray:
        b, w = len(drafted), self.width
        lengths = np.minimum(drafted, w)
        if self.policy is not None:  # (a pause is the simulator's: `drafted` is 0 where a request does not draft)
            drafts = BatchDrafts.from_drafts([Draft([0] * int(n), confidence=None if c is None else c[:n])
                                              for c, n in zip(confidences, lengths.tolist())])
            reqs = [DraftRequest(key, range(c), 1, w) for key, c in zip(keys, context)]
            lengths, conditional = self.policy.trim_rated(DraftBatch.from_requests(reqs), drafts)  # as the speculator
            kept = BatchDrafts(drafts.tokens, drafts.offsets, conditional).truncated(lengths)
            confidences, lengths = [d.confidence for d in kept.drafts()], kept.lengths
        conf = np.zeros((b, w))
        for i, (c, n) in enumerate(zip(confidences, lengths.tolist())):
            conf[i, :n] = 1.0 if c is None else c[:n]
        flat = np.cumprod(conf, axis=1).ravel()
        order = np.argsort(-flat, kind="stable")  # survival falls along a request, so each request's slots in order
        req, pos = order // w, order % w
        lens = np.arange(w + 1)
        attention = self.cost.attention_times(np.tile(lens, b), np.repeat(np.asarray(context), w + 1)).reshape(b, w + 1)
        extra = np.diff(attention, axis=1)[req, pos]
        seconds = (self.cost.overhead_s + self.cost.linear_times(b + np.arange(b * w + 1)) + attention[:, 0].sum()
                   + np.concatenate([[0.0], np.cumsum(extra)]) + self.cost.draft_time([w] * b))
        expected = b + np.concatenate([[0.0], np.cumsum(flat[order])])
        budget = int(np.argmax(expected / seconds))
        keep = np.bincount(req[:budget], minlength=b)
        if self.policy is not None:  # it learns from the slots verified, of what it kept
            tried = np.minimum(lengths, keep)
            self.policy.observe_batch(list(keys), tried, np.minimum(accepted, tried))
        return keep

    def finish(self, key: str) -> None:
        if self.policy is not None:
            self.policy.finish(key)


def simulate(requests: list[TraceRequest], steps, cost, policies: dict[str, Any],
             host: Any = None, engine: Any = None) -> dict[str, float]:
    """Goodput (tokens per modelled second) of each policy over the same steps; `host` (a HostTime) adds
    the drafting step's host time to every step the drafter runs, for the tokens each request appends there (what
    that policy emitted for it since its drafter last ran: the step before's, or everything since a pause began);
    `engine` (an EngineHostTime) the engine's own host time of a step of that many requests and verified tokens. A
    policy that learns from measured step times (`step_overhead: measured`) is told each of its steps' whole
    simulated time, as an engine would tell it."""
    tokens = {name: 0.0 for name in policies}
    seconds = {name: 0.0 for name in policies}
    # per policy, per request: the tokens emitted since its drafter last ran (what the next drafting step appends),
    # and at its last step (what an ordinary step appends; the rest is a pause's backlog)
    unseen: dict[str, dict[str, float]] = {name: {} for name in policies}
    last: dict[str, dict[str, float]] = {name: {} for name in policies}
    for batch, ends in steps:
        recs = [(key, requests[i], k) for key, i, k in batch]
        drafted = np.array([r.drafted[k] for _, r, k in recs])
        accepted = np.array([r.accepted[k] for _, r, k in recs])
        context = [int(r.prompt_len + r.pos[k]) for _, r, k in recs]
        for name, pol in policies.items():
            # A pausing policy (its own, or the one under adaptive verification) says which requests draft: None,
            # all of them; no rows, none (no drafter runs); some, a probe's sample (the rest draft nothing).
            rater = getattr(pol, "policy", pol)
            pauses = isinstance(rater, PausesDrafting)
            sample = rater.drafting_rows(len(recs)) if pauses else None
            paused = sample is not None and not len(sample)
            drafting = np.ones(len(recs), dtype=bool)
            # what the policy's trim sees: every request's own draft, or on a probe every request drafting as one of
            # the sample (the layer's rule; the policy keeps drafts for the sample alone)
            like = np.arange(len(recs))
            if sample is not None and len(sample):
                drafting[:] = False
                drafting[sample] = True
                like = np.asarray(sample)[probe_stand_ins(np.asarray(sample), len(recs))]
            offered = drafted[like]
            confidences = [recs[j][1].confidence[recs[j][2]] for j in like.tolist()]
            if paused:
                keep = np.zeros(len(recs), dtype=int)
            elif isinstance(pol, VerifiesSlots):  # Model Runner V2: verified slots, filler included
                keep = pol.verify([key for key, _, _ in recs], confidences, offered, accepted, context)
            elif callable(pol):
                keep = np.minimum(np.asarray(pol(drafted, accepted), dtype=int), drafted)
            else:
                reqs = [DraftRequest(req_id=key, tokens=range(c), num_new=1, max_draft=int(d))
                        for (key, _, _), c, d in zip(recs, context, offered)]
                drafts = [Draft(tokens=[0] * int(d), confidence=c) for c, d in zip(confidences, offered)]
                keep = np.asarray(pol.trim(reqs, drafts), dtype=int)
                for (key, _, _), n, a in zip(recs, keep, accepted):
                    pol.observe(key, int(n), int(min(a, n)))
            emitted = 1 + np.minimum(accepted, keep)
            tokens[name] += float(np.sum(emitted))
            step = cost.step_time([int(x) for x in keep], context)
            # this step's drafting appended, for each request that drafts, what it emitted since it last drafted;
            # host_path None: no drafter runs (no speculation, or drafting paused)
            path = None if paused else getattr(pol, "host_path", "adaptive" if getattr(pol, "trim", None) else "fixed")
            pending, latest = unseen[name], last[name]
            if path is None:
                drafting[:] = False
            if host is not None and path is not None:
                keys = [key for (key, _, _), d in zip(recs, drafting.tolist()) if d]
                known = [key for key in keys if key in pending]  # a request new here: its prompt, not modelled
                ordinary = float(np.mean([latest[key] for key in known])) if known else None
                drafting_s = (host.seconds(path, len(recs), ordinary) if len(keys) == len(recs)
                              else host.sample_seconds(path, len(keys), len(recs), ordinary))  # a probe's sample
                backlog = float(np.mean([pending[key] - latest[key] for key in known])) if known else 0.0
                if backlog > 0.0:  # a step after a pause
                    drafting_s += host.catchup_seconds(len(keys), backlog)
                step += drafting_s
                if pauses and backlog <= 0.0:  # as the drafting layer reports it: not a step that catches up
                    rater.observe_drafting_seconds(drafting_s)
            if engine is not None:
                step += engine.seconds(len(recs), 1.0 + float(np.mean(keep)))
            if getattr(pol, "observes_step_time", False):
                pol.observe_step_interval(step)
            seconds[name] += step
            for (key, _, _), e, d in zip(recs, emitted.tolist(), drafting.tolist()):
                pending[key] = e + (0.0 if d else pending.get(key, 0.0))
                latest[key] = e
        for name, pol in policies.items():
            for key in ends:
                unseen[name].pop(key, None)
                last[name].pop(key, None)
            if getattr(pol, "finish", None):
                for key in ends:
                    pol.finish(key)
    return {name: tokens[name] / seconds[name] for name in policies}


def build_host_time(args, traces: list[dict]) -> Any:
    """The HostTime to charge (None with --host-time none), for the traces' proposer."""
    if args.host_time.strip().lower() == "none":
        return None
    from spec_plugins.bench.host_time import DEFAULT, GROWTH, CatchUpTime, HostTime

    proposers = {t.get("proposer") for t in traces}
    if len(proposers) != 1 or None in proposers:
        raise ValueError(f"--host-time: the traces come from {sorted(map(str, proposers))}; charge one proposer's "
                         "host time at a time, or pass --host-time none")
    growth_arg = args.host_growth.strip()
    if growth_arg.lower() == "none":
        growth: tuple = ()
    elif growth_arg.lower() == "default":
        growth = GROWTH if args.host_time == "default" else ()
    else:
        growth = tuple(p for p in growth_arg.split(",") if p.strip())
    try:
        host = HostTime.load(DEFAULT if args.host_time == "default" else args.host_time, proposer := proposers.pop(),
                             growth)
        if args.host_time == "default" and proposer == "suffix_tree":  # the step after a pause (measured for it)
            host.catchup = CatchUpTime.load()
        return host
    except ValueError as exc:
        raise ValueError(f"--host-time: {exc} (measure it with python -m spec_plugins.bench.step_overhead --json, "
                         "or pass --host-time none)") from None


def add_cost_arguments(ap: argparse.ArgumentParser) -> None:
    """The step cost and host time options (`build_cost`, `build_host_time`)."""
    ap.add_argument("--hardware", help="GPU profile name (h100, h200, b200, a100, l40s) or YAML path")
    ap.add_argument("--model-config", help="the target's Hugging Face config.json")
    ap.add_argument("--profile", help="a measured step-time profile instead of --hardware")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--draft-us", type=float, default=5.0,
                    help="model-free drafting cost per request (µs), with --host-time none")
    ap.add_argument("--host-time", default="default",
                    help="step_overhead JSON whose measured host time per step is charged ('default': the one in "
                         "benchmarks/host_time/; 'none': charge --draft-us instead)")
    ap.add_argument("--engine-host-time", default="default",
                    help="engine_host_time JSON (comma-separated: runs of it, each cell the least): the engine's own "
                         "host time per step on vLLM's V1 runner (scheduler, input prep, output processing), charged "
                         "to every step ('default': the two runs in benchmarks/host_time/; 'none': not charged)")
    ap.add_argument("--host-growth", default="default",
                    help="step_overhead --verify JSONs (comma-separated) giving host time by tokens appended per "
                         "request ('default': the code and rewrite ones in benchmarks/host_time/ with the default "
                         "--host-time; 'none': the base measurement's 1-4 tokens for every step)")


def build_engine_host_time(args) -> Any:
    """The EngineHostTime to charge (None with --engine-host-time none)."""
    choice = args.engine_host_time.strip()
    if choice.lower() == "none":
        return None
    from spec_plugins.bench.host_time import ENGINE_DEFAULT, EngineHostTime

    path = ENGINE_DEFAULT if choice == "default" else [Path(c.strip()) for c in choice.split(",") if c.strip()]
    try:
        return EngineHostTime.load(path)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"--engine-host-time: {exc} (measure it with python -m spec_plugins.bench.engine_host_time "
                         "--json, or pass --engine-host-time none)") from None


def build_cost(args) -> Any:
    if (args.profile is None) == (args.hardware is None):
        raise ValueError("expected exactly one of --hardware (with --model-config) or --profile")
    if args.hardware and not args.model_config:
        raise ValueError("--model-config: required with --hardware")
    from spec_plugins.policy.cost import step_cost
    from spec_plugins.policy.model import load_model_config

    model = load_model_config(args.model_config) if args.hardware else None
    # Measured host time replaces the modelled per-request drafting cost.
    draft_us = args.draft_us if args.host_time.strip().lower() == "none" else 0.0
    return step_cost(hardware=args.hardware, model=model, profile=args.profile, dtype=args.dtype,
                     draft_us_per_request=draft_us)


def parse_policy_options(text: str | None) -> dict[str, Any]:
    """--policy-options: a JSON object of the adaptive policy's options, checked as the engines check
    `policy_options` (registry.validated_options), so a bad one is reported before the simulation starts."""
    from spec_plugins.policy.adaptive import AdaptiveLength
    from spec_plugins.registry import validated_options

    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--policy-options: expected a JSON object ({exc.msg})") from None
    if not isinstance(options, dict):
        raise ValueError(f"--policy-options: expected a JSON object, got {text!r}")
    return validated_options(AdaptiveLength, options, "--policy-options")


def run(traces: list[dict], cost, batch_sizes: list[int], max_draft: int, num_steps: int, seed: int,
        progress=None, host: Any = None, static_only: bool = False,
        policy_options: dict[str, Any] | None = None, engine: Any = None) -> dict[str, Any]:
    """Goodput of every policy at each batch size; static_only: the static draft lengths alone (an engine's
    own proposer, which runs no policy of ours); policy_options: the adaptive policy's (its defaults if None)."""
    from spec_plugins.policy.adaptive import AdaptiveLength

    requests = trace_requests(traces)
    the_plan = None if static_only else plan(cost, AcceptanceStats.from_traces(traces), max_draft,
                                             max_batch=max(batch_sizes))
    goodput: dict[str, list[float]] = {}
    for b in batch_sizes:
        steps = batch_schedule(requests, b, num_steps, seed)
        policies: dict[str, Any] = {f"static_{d}": StaticLength(d) for d in range(max_draft + 1)}
        if not static_only:
            policies["schedule"] = lambda dr, ac, d=schedule_for_batch(the_plan, b): np.full(len(dr), d)
            policies["hindsight"] = lambda dr, ac: ac
            policies["adaptive"] = AdaptiveLength(cost=cost, **(policy_options or {}))
        res = simulate(requests, steps, cost, policies, host, engine)
        for name, v in res.items():
            goodput.setdefault(name, []).append(v)
        if progress:
            progress(b)
    return {"goodput": goodput,
            "schedule": None if static_only else [schedule_for_batch(the_plan, b) for b in batch_sizes]}


def summarize(batch_sizes: list[int], goodput: dict[str, list[float]], max_draft: int) -> dict[str, Any]:
    statics = [f"static_{d}" for d in range(max_draft + 1)]
    rows = []
    captured = []
    for i, b in enumerate(batch_sizes):
        best_name = max(statics, key=lambda n: goodput[n][i])
        best = goodput[best_name][i]
        hind = goodput["hindsight"][i]
        ada = goodput["adaptive"][i]
        headroom = hind / best - 1.0
        cap = (ada - best) / (hind - best) if hind > best else None
        if headroom > 0.05:
            captured.append(cap)
        rows.append({"batch": b, "best_static": best_name, "best_static_goodput": best, "adaptive": ada,
                     "hindsight": hind, "schedule": goodput["schedule"][i], "adaptive_vs_best_static": ada / best,
                     "hindsight_vs_best_static": hind / best, "headroom_captured": cap})
    return {"rows": rows, "worst_adaptive_vs_best_static": min(r["adaptive_vs_best_static"] for r in rows),
            "mean_headroom_captured": float(np.mean(captured)) if captured else None,
            "batches_with_headroom_over_5pct": [r["batch"] for r in rows if r["hindsight_vs_best_static"] > 1.05]}


def render(summary: dict[str, Any], title: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("batch", "best static", "goodput", "schedule", "adaptive", "hindsight", "adaptive/best", "hindsight/best", "captured"):
        t.add_column(col, justify="right")
    for r in summary["rows"]:
        cap = "-" if r["headroom_captured"] is None else f"{100 * r['headroom_captured']:.0f}%"
        t.add_row(str(r["batch"]), r["best_static"].removeprefix("static_"), f"{r['best_static_goodput']:.1f}",
                  f"{r['schedule']:.1f}", f"{r['adaptive']:.1f}", f"{r['hindsight']:.1f}",
                  f"{r['adaptive_vs_best_static']:.3f}x", f"{r['hindsight_vs_best_static']:.3f}x", cap)
    return t


def plot(path: Path, batch_sizes: list[int], goodput: dict[str, list[float]], max_draft: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    statics = [f"static_{d}" for d in range(max_draft + 1)]
    best = np.array([max(goodput[n][i] for n in statics) for i in range(len(batch_sizes))])
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, style in (("adaptive", "o-"), ("hindsight", "k--"), ("schedule", "s:")):
        ax.plot(batch_sizes, np.array(goodput[name]) / best, style, label=name)
    ax.plot(batch_sizes, goodput["static_0"] / best, "x-", color="grey", label="no speculation")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("goodput / best static D")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.policy_sim", description=__doc__.split("\n")[0])
    add_cost_arguments(ap)
    ap.add_argument("--traces", required=True, help="comma-separated replay trace files")
    ap.add_argument("--batch-sizes", default="1,4,16,64,256")
    ap.add_argument("--steps", type=int, default=300, help="simulated engine steps per batch size, at least; the simulation "
                    "goes on until every request of the traces has run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy-options", help="the adaptive policy's options, a JSON object (default: its defaults)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress

    err = Console(stderr=True, soft_wrap=True)  # an error stays one line
    try:
        batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"--batch-sizes: expected positive integers, got {args.batch_sizes!r}")
        if args.steps < 1:
            raise ValueError(f"--steps: expected >= 1, got {args.steps}")
        traces = load_traces([p for p in args.traces.split(",") if p.strip()])
        cost = build_cost(args)
        host = build_host_time(args, traces)
        engine = build_engine_host_time(args)
        policy_options = parse_policy_options(args.policy_options)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    max_draft = max(int(t["max_draft"]) for t in traces)
    with Progress(console=err, transient=True) as prog:
        task = prog.add_task("simulating", total=len(batch_sizes))
        result = run(traces, cost, batch_sizes, max_draft, args.steps, args.seed, lambda b: prog.advance(task), host,
                     policy_options=policy_options, engine=engine)
    summary = summarize(batch_sizes, result["goodput"], max_draft)
    Console(width=150).print(render(summary, f"modelled goodput, tokens/s ({', '.join(t.get('workload', '?') + '/' + t.get('proposer', '?') for t in traces)})"))
    Console().print(f"worst adaptive / best static: {summary['worst_adaptive_vs_best_static']:.3f}x; "
                    f"headroom captured (batches with >5% headroom {summary['batches_with_headroom_over_5pct']}): "
                    + ("-" if summary["mean_headroom_captured"] is None else f"{100 * summary['mean_headroom_captured']:.0f}%"))
    if host is None:
        charged = f"not measured; modelled as {args.draft_us} µs per drafting request"
    else:
        charged = (f"measured, {host.proposer} ({host.source}"
                   + "".join(f" + {Path(g).name}" for g in host.growth_sources) + ")")
    Console().print("host time per step: " + charged + "; the engine's own: " +
                    ("not charged" if engine is None else f"measured, V1 runner ({engine.source})"))
    if args.json:
        doc = {"format": FORMAT, "command": " ".join(sys.argv), "traces": args.traces.split(","),
               "host_time": None if host is None else host.source,
               "host_growth": [] if host is None else host.growth_sources,
               "engine_host_time": None if engine is None else engine.source,
               "batch_sizes": batch_sizes, "goodput": result["goodput"], "schedule_draft_lens": result["schedule"],
               "summary": summary}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    if args.png:
        plot(args.png, batch_sizes, result["goodput"], max_draft)
    return 0


if __name__ == "__main__":
    sys.exit(main())
