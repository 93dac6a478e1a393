"""The planner: hardware + model + measured acceptance -> the engines' static draft-length configs.

Engines that take one draft length per step (vLLM `num_speculative_tokens_per_batch_size`,
TensorRT-LLM `draft_len_schedule`) get, for each batch size B, the D that maximises modelled speed-up

    speedup(B, D) = [B·AL(D) / T(B, D)] / [B / T(B, 0)]

where AL(D) = mean(1 + min(accepted, D)) over the measured steps (accepted at the maximum draft) and
T(B, D) is the cost model's step time for B requests each verifying 1 + min(drafted, D) tokens: a
request the proposer had nothing for verifies one token under any D. With every request drafting
exactly D this is the seed formula T_verif(B)·AL / (T_verif(B(1+D)) + T_draft(B, D)).

`--tpot-ms` adds a latency bound: only D whose modelled time per output token, T(B, D) / AL(D),
stays under it qualify (if none does, the fastest D is taken and the report says so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from spec_plugins.policy.allocator import StepCost

STABLE_WITHIN = 0.01


@dataclass
class AcceptanceStats:
    """Per-step measurements at the maximum draft: what was offered, what was accepted, context."""

    drafted: np.ndarray
    accepted: np.ndarray
    context: np.ndarray
    max_draft: int
    sources: list[str]

    @classmethod
    def from_traces(cls, traces: Sequence[dict]) -> "AcceptanceStats":
        """Every step of acceptance traces as `spec_plugins.traces.load_traces` returns them."""
        drafted, accepted, context, sources = [], [], [], []
        max_draft = 0
        for t in traces:
            max_draft = max(max_draft, int(t["max_draft"]))
            sources.append(f"{t.get('workload', '?')}/{t.get('proposer', '?')}")
            for req in t["requests"]:
                for s in req["steps"]:
                    drafted.append(s["drafted"])
                    accepted.append(s["accepted"])
                    context.append(req["prompt_len"] + s["pos"])
        if not drafted:
            raise ValueError("acceptance traces: no steps recorded")
        return cls(np.asarray(drafted), np.asarray(accepted), np.asarray(context), max_draft, sources)

    def acceptance_length(self, d: int) -> float:
        return float(np.mean(1 + np.minimum(self.accepted, d)))

    def draft_lengths(self, d: int) -> np.ndarray:
        return np.minimum(self.drafted, d)

    @property
    def mean_context(self) -> int:
        return int(np.mean(self.context))


def batch_grid(max_batch: int) -> list[int]:
    """Batch sizes the planner evaluates: 1, 2, 3, 4, 6, 8, 12, ... (between them the lower one's D holds)."""
    grid, b = [], 1
    while b <= max_batch:
        grid.append(b)
        if b * 3 // 2 <= max_batch and b >= 2 and b * 3 // 2 not in grid:
            grid.append(b * 3 // 2)
        b *= 2
    if grid[-1] != max_batch:
        grid.append(max_batch)
    return sorted(set(grid))


def modelled_speedup(cost: StepCost, stats: AcceptanceStats, batch: int, d: int, samples: int | None = None,
                     seed: int = 0) -> tuple[float, float]:
    """(speed-up over no speculation, modelled seconds per output token of one request).

    Averages over `samples` batches of `batch` measured steps drawn with a fixed seed: tile-quantised
    costs are jagged, so the time of the mean batch is not the mean time of the batches.
    """
    samples = samples or max(32, 4096 // batch)  # about 4k sampled request-steps per batch size
    rng = np.random.default_rng(seed + batch)
    idx = rng.integers(len(stats.drafted), size=(samples, batch))
    tokens = time = time0 = 0.0
    for row in idx:
        ctx = [int(c) for c in stats.context[row]]
        lens = [int(x) for x in np.minimum(stats.drafted[row], d)]
        tokens += float(np.sum(1 + np.minimum(stats.accepted[row], d)))
        time += cost.step_time(lens, ctx)
        time0 += cost.step_time([0] * batch, ctx)
    speedup = (tokens / time) / (samples * batch / time0)
    return speedup, time / tokens * batch


@dataclass
class Plan:
    batch_sizes: list[int]
    max_draft: int
    speedup: dict[int, list[float]]  # D -> speed-up per batch size
    tpot_s: dict[int, list[float]]
    chosen: list[int]  # D per batch size, none above the batch-1 D
    tpot_limit_ms: float | None
    notes: list[str]

    def schedule_ranges(self) -> list[list[int]]:
        """vLLM's inclusive (start, end, K) ranges covering 1..max batch (a planned D holds up to the next)."""
        ranges: list[list[int]] = []
        ends = [b - 1 for b in self.batch_sizes[1:]] + [self.batch_sizes[-1]]
        for b, end, d in zip(self.batch_sizes, ends, self.chosen):
            if ranges and ranges[-1][2] == d:
                ranges[-1][1] = end
            else:
                ranges.append([b, end, d])
        return ranges

    def trtllm_schedule(self) -> dict[int, int]:
        """TensorRT-LLM 1.2 `draft_len_schedule`: batch >= key -> value; key 1 = max_draft_len."""
        out: dict[int, int] = {}
        for start, _, d in self.schedule_ranges():
            out[start] = d
        return out


def plan(cost: StepCost, stats: AcceptanceStats, max_draft: int, max_batch: int = 256,
         tpot_ms: float | None = None) -> Plan:
    """D at each planned batch size (`batch_grid`): within 1% of the best modelled speed-up, non-increasing in
    the batch size and in the fewest ranges (`stable_schedule`); the batch-1 D is the engines' K."""
    if not 1 <= max_draft <= 128:
        raise ValueError(f"--max-draft: expected 1..128, got {max_draft}")
    if max_batch < 1:
        raise ValueError(f"--max-batch: expected >= 1, got {max_batch}")
    if tpot_ms is not None and tpot_ms <= 0:
        raise ValueError(f"--tpot-ms: expected > 0, got {tpot_ms}")
    batches = batch_grid(max_batch)
    speed = {d: [] for d in range(max_draft + 1)}
    tpot = {d: [] for d in range(max_draft + 1)}
    for b in batches:
        for d in range(max_draft + 1):
            s, t = modelled_speedup(cost, stats, b, d)
            speed[d].append(s)
            tpot[d].append(t)
    chosen, notes = stable_schedule(batches, speed, tpot, tpot_ms)
    if chosen[0] == 0:
        notes.append("speculation does not pay at any batch size on this hardware with this acceptance")
    return Plan(batches, max_draft, speed, tpot, chosen, tpot_ms, notes)


def stable_schedule(batches: list[int], speed: dict[int, list[float]], tpot: dict[int, list[float]],
                    tpot_ms: float | None = None, within: float = STABLE_WITHIN) -> tuple[list[int], list[str]]:
    """D per batch size: non-increasing in the batch size, within `within` of the best modelled speed-up at
    every batch size, in the fewest ranges (then the most speed-up over all batch sizes).

    Modelled curves of neighbouring D cross back and forth by fractions of a percent, and an engine's schedule
    should not. Where no D within the margin keeps the schedule non-increasing (the best D grows with the
    batch), the least loss below the best is taken instead, and a note says so.
    """
    ds = sorted(speed)
    notes: list[str] = []
    allowed, loss = [], []  # per batch size: D meeting the TPOT limit; each D's shortfall beyond the margin
    for i, b in enumerate(batches):
        ok = [d for d in ds if tpot_ms is None or tpot[d][i] * 1e3 <= tpot_ms]
        if not ok:
            ok = [min(ds, key=lambda d: tpot[d][i])]
            notes.append(f"batch {b}: no draft length meets tpot {tpot_ms} ms; fastest per token taken")
        best = max(speed[d][i] for d in ok)
        allowed.append(ok)
        loss.append({d: max(0.0, (1.0 - within) * best - speed[d][i]) / best for d in ok})
    # Dynamic programme over batch sizes: state = D at this batch size, cost = (shortfall beyond the margin,
    # ranges, -speed-up), lexicographic; D never rises from one batch size to the next.
    cost = {d: (loss[0][d], 1, -speed[d][0]) for d in allowed[0]}
    back: list[dict[int, int]] = []
    for i in range(1, len(batches)):
        new, prev_of = {}, {}
        for d in allowed[i]:
            options = [(c[0] + loss[i][d], c[1] + (p != d), c[2] - speed[d][i], p) for p, c in cost.items() if p >= d]
            if options:
                *best_cost, p = min(options)
                new[d], prev_of[d] = tuple(best_cost), p
        if not new:  # every allowed D is above every D so far: take the largest D below them all
            d = max(d for d in ds if d <= min(cost))
            p = min(cost)
            new[d], prev_of[d] = (cost[p][0] + 1.0, cost[p][1] + (p != d), cost[p][2] - speed[d][i]), p
            notes.append(f"batch {batches[i]}: the TPOT limit allows only longer drafts than smaller batches; "
                         f"kept D = {d}")
        cost = new
        back.append(prev_of)
    d = min(cost, key=lambda k: cost[k])
    chosen = [d]
    for prev_of in reversed(back):
        d = prev_of[d]
        chosen.append(d)
    chosen.reverse()
    off = [b for i, b in enumerate(batches) if loss[i].get(chosen[i], 1.0) > 0]
    if off:
        notes.append(f"batch sizes {off}: more than {within:.0%} below the best D there, to keep the schedule "
                     "non-increasing")
    return chosen, notes


def schedule_for_batch(p: Plan, batch: int) -> int:
    """D for `batch` requests: that of the largest planned batch size <= batch."""
    d = p.chosen[0]
    for b, c in zip(p.batch_sizes, p.chosen):
        if b > batch:
            break
        d = c
    return d


def to_json(p: Plan) -> dict[str, Any]:
    return {"batch_sizes": p.batch_sizes, "chosen": p.chosen, "ranges": p.schedule_ranges(),
            "speedup": {str(d): v for d, v in p.speedup.items()}, "notes": p.notes}


# ---- what the planner writes ---------------------------------------------------------------------

MECHANISMS = ("ngram", "suffix", "suffix_tree")
# The replay benchmark's proposer names (traces' "proposer") -> the mechanism an engine serves them as.
TRACE_PROPOSERS = {"suffix_tree": "suffix_tree", "arctic": "suffix", "vllm_ngram": "ngram", "ngram": "ngram"}


def trace_mechanism(proposer: str) -> str | None:
    """The mechanism a trace's proposer (`name` or `name@label`) is served as, or None if no engine serves it."""
    return TRACE_PROPOSERS.get(proposer.split("@", 1)[0])


# The vLLM the planner writes for unless told otherwise: what `pip install vllm` gives.
VLLM_TARGET = "0.34"


def vllm_speculative_config(p: Plan, mechanism: str, vllm_version: str = VLLM_TARGET) -> dict[str, Any]:
    """vLLM `--speculative-config` JSON for `vllm_version`: the mechanism, K = the batch-1 draft length, the
    schedule (ours: a registered method on 0.34+, custom_class on 0.32 / 0.33), and on 0.34+ adaptive verification
    for the mechanisms that give confidences (vLLM's `suffix`, ours)."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"--mechanism: expected one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    k = max(1, p.chosen[0])  # vLLM needs K >= 1; a schedule of zeros still turns speculation off
    conf: dict[str, Any]
    if mechanism == "ngram":
        conf = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    elif mechanism == "suffix":
        conf = {"method": "suffix"}
    else:
        from spec_plugins.vllm.settings import engine_config

        conf = engine_config("suffix_tree", None, None, vllm_version)[0]
        if conf["method"] == "custom_class":
            conf["model"] = "spec_plugins.vllm.SuffixTree"  # serves the suffix tree with no additional_config
    conf["num_speculative_tokens"] = k
    conf["num_speculative_tokens_per_batch_size"] = p.schedule_ranges()
    from spec_plugins.vllm.settings import on_model_runner_v2

    if mechanism != "ngram" and on_model_runner_v2(vllm_version):
        # Model Runner V2 verifies every slot unless adaptive verification trims by the drafter's confidences,
        # which vLLM's suffix and ours give: the best configuration there by simulation (docs/results.md).
        conf["enable_adaptive_verification"] = True
    return conf


def check_trtllm_schedule(schedule: dict[int, int], max_draft_len: int) -> None:
    """TensorRT-LLM 1.2's rules for `draft_len_schedule` (`validate_draft_len_schedule_and_sort`)."""
    if not schedule:
        raise ValueError("draft_len_schedule: expected a non-empty mapping")
    for key, value in schedule.items():
        if not isinstance(key, int) or key < 1:
            raise ValueError(f"draft_len_schedule: keys must be batch sizes >= 1, got {key!r}")
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"draft_len_schedule[{key}]: expected a draft length >= 0, got {value!r}")
        if value > max_draft_len:
            raise ValueError(f"draft_len_schedule[{key}]: {value} exceeds max_draft_len {max_draft_len}")
    if schedule.get(1) != max_draft_len:
        raise ValueError(f"draft_len_schedule: must map batch size 1 to max_draft_len ({max_draft_len}), "
                         f"got {schedule.get(1)!r}")


def trtllm_config(p: Plan, mechanism: str) -> dict[str, Any]:
    """TensorRT-LLM 1.2 LLM-API YAML (`--extra_llm_api_options`): NGram natively; our proposers run as
    a `UserProvided` drafter, which YAML cannot carry, so the spec-plugins launcher builds it from the
    `spec_plugins` section."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"--mechanism: expected one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    k = max(1, p.chosen[0])
    schedule = {b: min(d, k) for b, d in p.trtllm_schedule().items()}
    schedule[1] = k
    check_trtllm_schedule(schedule, k)
    if mechanism == "ngram":
        spec: dict[str, Any] = {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": 4}
    else:
        spec = {"decoding_type": "UserProvided", "max_draft_len": k}
    spec["draft_len_schedule"] = schedule
    doc: dict[str, Any] = {"speculative_config": spec}
    if mechanism != "ngram":
        doc["disable_overlap_scheduler"] = True  # user-provided drafters need the synchronous loop
        doc["spec_plugins"] = {"proposer": "suffix_tree"}
    return doc


def guideline_table(p: Plan, cost: StepCost, stats: AcceptanceStats) -> str:
    """Plain-text table: per planned batch size, the chosen D, its modelled speed-up, what binds."""
    from spec_plugins.policy.cost import RooflineCost, binding_guideline

    lines = [f"{'batch':>6} {'D':>3} {'speed-up':>9} {'tpot ms':>8}  binding guideline"]
    ctx = stats.mean_context
    for i, (b, d) in enumerate(zip(p.batch_sizes, p.chosen)):
        if isinstance(cost, RooflineCost):
            # At the max draft: the regime the step is in; below it: what stops D + 1.
            why = binding_guideline(cost, b, min(d + 1, p.max_draft), ctx)
            if d == p.max_draft:
                why = f"K = {d} reached; {why}"
        else:
            why = f"K = {d} reached" if d == p.max_draft else "measured step time grows faster than acceptance"
        lines.append(f"{b:>6} {d:>3} {p.speedup[d][i]:>8.2f}x {p.tpot_s[d][i] * 1e3:>8.2f}  {why}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines) + "\n"


def plot_plan(p: Plan, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    cmap = plt.get_cmap("viridis")
    for d in range(1, p.max_draft + 1):
        ax.plot(p.batch_sizes, p.speedup[d], color=cmap(d / p.max_draft), lw=1, alpha=0.8,
                label=f"D={d}" if d in (1, p.max_draft // 2, p.max_draft) else None)
    chosen = [p.speedup[d][i] for i, d in enumerate(p.chosen)]
    ax.plot(p.batch_sizes, chosen, "ro-", ms=4, lw=1.5, label="planned schedule")
    for b, d, s in zip(p.batch_sizes, p.chosen, chosen):
        ax.annotate(str(d), (b, s), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (requests)")
    ax.set_ylabel("modelled speed-up vs no speculation")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plan(p: Plan, cost: StepCost, stats: AcceptanceStats, mechanism: str, out: Path, title: str,
               vllm_version: str = VLLM_TARGET) -> dict[str, Path]:
    """Write vllm_speculative_config.json, trtllm_llm_api.yaml, speedup.png, guidelines.txt, plan.json."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "vllm": out / "vllm_speculative_config.json",
        "trtllm": out / "trtllm_llm_api.yaml",
        "png": out / "speedup.png",
        "table": out / "guidelines.txt",
        "plan": out / "plan.json",
    }
    paths["vllm"].write_text(json.dumps(vllm_speculative_config(p, mechanism, vllm_version)) + "\n")
    header = (f"# {title}\n# TensorRT-LLM 1.2 semantics: batch >= key drafts value; key 1 = max_draft_len.\n"
              "# (1.3+ reads keys as upper bounds instead: re-plan for those versions.)\n")
    paths["trtllm"].write_text(header + yaml.safe_dump(trtllm_config(p, mechanism), sort_keys=False))
    paths["table"].write_text(f"# {title}\n" + guideline_table(p, cost, stats))
    paths["plan"].write_text(json.dumps({**to_json(p), "title": title, "mechanism": mechanism}, indent=1))
    plot_plan(p, paths["png"], title)
    return paths
