"""`spec-plugins demo`: real prompts through vLLM with and without our proposers, side by side.

Every configuration runs in its own engine process on the same prompts; the engines are timed in
turns, so speed-ups are ratios from one run on one machine state, and `identical` compares greedy
token ids with the no-speculation run. Each timed round uses prompts of its own (the prompt set is
split over `repeats` rounds): the suffix tree and ArcticInference remember finished responses, and a
repeated prompt would be answered from memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from spec_plugins.bench.prompts import demo_prompts, prompt_rounds
from spec_plugins.bench.vllm_run import EngineRun, run_side_by_side

DEFAULT_PROPOSERS = ["suffix_tree"]


@dataclass
class DemoRow:
    proposer: str
    acceptance_length: float
    tokens_per_s: float
    speedup: float
    identical: bool


def plugin_section(proposer: str, policy_options: dict | None = None) -> tuple[str, dict]:
    """`proposer` (or `proposer+policy`) as (proposer, our settings without it)."""
    name, _, policy = proposer.partition("+")
    section: dict = {}
    if policy:
        section["policy"] = policy
        if policy_options:  # none: the adaptive policy takes its prior from the engine's device
            section["policy_options"] = policy_options
    return name, section


def plugin_config(proposer: str, k: int, policy_options: dict | None = None,
                  vllm_version: str | None = None) -> tuple[dict, dict | None]:
    """The --speculative-config and --additional-config (None on vLLM 0.34+) that serve `proposer` (or
    `proposer+policy`) on `vllm_version` (default: the installed vLLM)."""
    from spec_plugins.vllm.settings import engine_config

    name, section = plugin_section(proposer, policy_options)
    return engine_config(name, k, section, vllm_version)


NATIVE_METHODS = ("ngram", "suffix")


def native_config(method: str, k: int) -> dict:
    """vLLM's own method with settings comparable to ours (n-gram sizes 2..5, as our default)."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    raise ValueError(f"--native: expected one of {', '.join(NATIVE_METHODS)}, got {method!r}")


def run_demo(
    model: str,
    proposers: list[str],
    k: int = 4,
    max_tokens: int = 128,
    spec_bench_path: str | None = None,
    prompts: list[str] | None = None,
    dtype: str = "float32",
    repeats: int = 3,
    native: list[str] = (),
    console: Console | None = None,
    policy_options: dict | None = None,
) -> list[DemoRow]:
    console = console or Console(stderr=True)
    prompts = prompts or demo_prompts(spec_bench_path)
    rounds = prompt_rounds(prompts, repeats)
    base = EngineRun(model=model, prompts=rounds[0], max_tokens=max_tokens, dtype=dtype, chat=True)
    specs = [base]
    for name in proposers:
        spec, extra = plugin_config(name, k, policy_options)
        specs.append(EngineRun(**{**base.__dict__, "speculative_config": spec, "additional_config": extra}))
    for method in native:
        specs.append(EngineRun(**{**base.__dict__, "speculative_config": native_config(method, k)}))
    names = ["none"] + list(proposers) + [f"vllm:{m}" for m in native]
    labels = ["no speculation"] + [f"{name} (K={k})" for name in names[1:]]
    started = iter(labels)
    with console.status(f"starting {len(specs)} vLLM engines, then timing them in turns "
                        f"({repeats} rounds of {len(rounds[0])} new prompts x {max_tokens} tokens)") as status:
        results = run_side_by_side(
            specs, on_start=lambda _: status.update(f"starting vLLM: {next(started)}"), prompt_rounds=rounds)
    baseline = results[0]
    rows = []
    for name, result in zip(names, results):
        rows.append(
            DemoRow(
                proposer=name,
                acceptance_length=result.acceptance_length,
                tokens_per_s=result.tokens_per_s,
                speedup=result.tokens_per_s / baseline.tokens_per_s,
                identical=result.token_ids == baseline.token_ids,
            )
        )
    return rows


def print_rows(rows: list[DemoRow], console: Console | None = None, title: str = "") -> None:
    table = Table(title=title)
    for col in ("proposer", "mean accepted length", "output tokens/s", "speed-up", "identical"):
        table.add_column(col, justify="left" if col == "proposer" else "right")
    for r in rows:
        table.add_row(
            r.proposer, f"{r.acceptance_length:.2f}", f"{r.tokens_per_s:.1f}", f"{r.speedup:.2f}x",
            "yes" if r.identical else "[red]NO[/]",
        )
    (console or Console()).print(table)


def write_json(rows: list[DemoRow], path: str | Path) -> None:
    Path(path).write_text(json.dumps([r.__dict__ for r in rows], indent=2) + "\n")
