"""Do identical vLLM engine processes run at the same speed? N engines, one configuration, timed in turns.

    python benchmarks/engine_bias.py [--engines 4] [--rounds 4] [--concurrency 8] [--max-tokens 128] [--json OUT]

Every engine gets the same prompts each round; rounds take the engines in a rotated order
(`vllm_run.round_order`), so each engine holds each position once in N rounds. Printed: tokens/s per engine and
per position (mean and range over rounds), and a permutation test of "the engine explains the spread": the
F statistic of the per-engine groups against the same statistic with the engine labels shuffled within each
round, 10,000 times. A small p says that keeping one process per configuration for a whole benchmark builds a
per-process bias into every round, which more rounds do not remove.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def group_f(values: np.ndarray) -> float:
    """Between-engine over within-engine variance of a rounds x engines table."""
    means = values.mean(axis=0)
    between = values.shape[0] * np.sum((means - values.mean()) ** 2) / (values.shape[1] - 1)
    within = np.sum((values - means) ** 2) / (values.size - values.shape[1])
    return float(between / within) if within > 0 else float("inf")


def permutation_p(values: np.ndarray, trials: int = 10_000, seed: int = 0) -> float:
    """P(F >= observed) with engine labels shuffled within each round (rounds keep their own level)."""
    rng = np.random.default_rng(seed)
    observed = group_f(values)
    hits = sum(group_f(np.array([rng.permutation(row) for row in values])) >= observed for _ in range(trials))
    return (hits + 1) / (trials + 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.engines < 2 or args.rounds < 2 or args.concurrency < 1 or args.max_tokens < 1:
        ap.error("--engines and --rounds: expected >= 2; --concurrency and --max-tokens: expected >= 1")

    from rich.console import Console
    from rich.table import Table

    from spec_plugins.bench.prompts import demo_prompts
    from spec_plugins.bench.vllm_run import Engine, EngineRun, round_order
    from spec_plugins.models import smollm2_path

    err = Console(stderr=True)
    prompts = (demo_prompts(None) * args.concurrency)[: args.concurrency]
    names = [str(i) for i in range(args.engines)]
    table = np.zeros((args.rounds, args.engines))
    position = np.zeros((args.rounds, args.engines), dtype=int)
    engines: list[Engine] = []
    try:
        with err.status("starting engines") as status:
            for i in range(args.engines):
                status.update(f"starting engine {i + 1}/{args.engines}")
                engines.append(Engine(EngineRun(model=str(smollm2_path()), prompts=prompts[:1], max_tokens=8, chat=True)))
            for r in range(args.rounds):
                for pos, name in enumerate(round_order(names, r)):
                    i = int(name)
                    status.update(f"round {r + 1}/{args.rounds}: engine {i}")
                    table[r, i] = engines[i].generate(prompts, args.max_tokens).tokens_per_s
                    position[r, i] = pos
    finally:
        for e in engines:
            e.close()

    out = Console(width=120)
    t = Table(title=f"{args.engines} identical engines (no speculation), concurrency {args.concurrency}, tokens/s")
    for col in ("engine (start order)", "mean", "min-max", "per round"):
        t.add_column(col, justify="right")
    for i in range(args.engines):
        col = table[:, i]
        t.add_row(str(i), f"{col.mean():.1f}", f"{col.min():.1f}-{col.max():.1f}", " / ".join(f"{x:.1f}" for x in col))
    out.print(t)
    by_pos = [table[position == p].mean() for p in range(args.engines)]
    out.print("mean by position in the round: " + " / ".join(f"{x:.1f}" for x in by_pos))
    p = permutation_p(table)
    spread = table.mean(axis=0).max() / table.mean(axis=0).min()
    out.print(f"fastest / slowest engine mean: {spread:.3f}x; permutation p (engine explains the spread) = {p:.4f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "tokens_per_s": table.tolist(),
                                         "position": position.tolist(), "permutation_p": p}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
