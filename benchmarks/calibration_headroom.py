"""What better confidences could give the adaptive policy: an in-sample upper bound, in the policy simulator.

    python benchmarks/calibration_headroom.py --traces benchmarks/traces/e2e_mix/suffix_tree.json \\
        --profile configs/profiles/vllm-cpu-smollm2-135m.json --batch-sizes 1,8,32

Each trace's confidences are replaced by the acceptance observed in the same trace for tokens sharing a cell of
features (shrunk towards the confidence by a few pseudo-tries), and the adaptive policy is simulated on the
original and on each recalibrated trace (the same steps; no host time). Cells:

* ``position``: draft position bucket (1, 2, 3-4, 5-8, 9+) x confidence decile -- what the policy's own online
  calibrator already learns, so it should gain ~nothing;
* ``kind``: the same per candidate kind (the suffix tree's copy or count drafts);
* ``previous``: position x decile per outcome of the request's previous draft (none, all accepted, some
  accepted, first token rejected): what the policy itself knows of each request;
* ``kind+previous``: both.

The recalibration sees the outcomes it predicts, so the gains are bounds on what an online calibrator with
those features could reach, not what it would.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from spec_plugins.bench.policy_sim import batch_schedule, simulate, trace_requests
from spec_plugins.policy.adaptive import AdaptiveLength
from spec_plugins.policy.cost import step_cost

CELLS = ("position", "kind", "previous", "kind+previous")
PRIOR_TRIES = 4.0


def _bucket(j: int) -> int:
    return 0 if j == 0 else 1 if j == 1 else 2 if j < 4 else 3 if j < 8 else 4


def _previous(step: dict | None) -> int:
    if step is None:
        return 0
    return 1 if step["accepted"] == step["drafted"] else 2 if step["accepted"] else 3


def recalibrated(trace: dict, cells: str) -> dict:
    """A copy of `trace` whose confidences are the in-sample acceptance of their feature cell."""
    def key(step: dict, j: int, c: float, prev: dict | None) -> tuple:
        k: tuple = (_bucket(j), min(int(c * 10), 9))
        if "kind" in cells:
            k += (step.get("kind"),)
        if "previous" in cells:
            k += (_previous(prev),)
        return k

    def walk(visit) -> None:
        for req in out["requests"]:
            prev = None
            for step in req["steps"]:
                visit(step, prev)
                if step["drafted"]:
                    prev = step

    out = copy.deepcopy(trace)
    tries: dict[tuple, int] = {}
    hits: dict[tuple, int] = {}

    def count(step: dict, prev: dict | None) -> None:
        for j, c in enumerate(step.get("confidence") or []):
            if step["accepted"] < j:  # token j was not tried: an earlier one was rejected
                break
            k = key(step, j, c, prev)
            tries[k] = tries.get(k, 0) + 1
            hits[k] = hits.get(k, 0) + (step["accepted"] > j)

    new: dict[int, list[float]] = {}

    def estimate(step: dict, prev: dict | None) -> None:
        new[id(step)] = [(hits.get(k, 0) + PRIOR_TRIES * c) / (tries.get(k, 0) + PRIOR_TRIES)
                         for j, c in enumerate(step.get("confidence") or []) for k in [key(step, j, c, prev)]]

    walk(count)
    walk(estimate)  # every estimate reads the original confidences and previous steps
    for req in out["requests"]:
        for step in req["steps"]:
            if step.get("confidence"):
                step["confidence"] = new[id(step)]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", required=True, help="comma-separated replay traces (one workload each)")
    ap.add_argument("--profile", default="configs/profiles/vllm-cpu-smollm2-135m.json")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cost = step_cost(profile=args.profile, draft_us_per_request=0.0)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    print(f"adaptive policy, recalibrated / original goodput ({Path(args.profile).name}, in-sample bounds)")
    print(f"{'workload':22s} {'batch':>5s} {'original tok/s':>15s} " + " ".join(f"{c:>14s}" for c in CELLS))
    for path in args.traces.split(","):
        trace = json.loads(Path(path).read_text())
        versions = {"original": trace, **{c: recalibrated(trace, c) for c in CELLS}}
        for b in batches:
            goodput = {}
            for name, t in versions.items():
                requests = trace_requests([t])
                steps = batch_schedule(requests, b, args.steps, args.seed)
                goodput[name] = simulate(requests, steps, cost, {"adaptive": AdaptiveLength(cost=cost)})["adaptive"]
            print(f"{trace['workload']:22s} {b:5d} {goodput['original']:15.1f} "
                  + " ".join(f"{goodput[c] / goodput['original']:13.3f}x" for c in CELLS))


if __name__ == "__main__":
    main()
