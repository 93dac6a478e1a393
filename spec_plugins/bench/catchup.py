"""Host time of the drafting step that ends a pause: the suffix tree handed many tokens a request at once.

    python -m spec_plugins.bench.catchup [--batches 1,16,64,256] [--tokens 1,8,32,128] [--probe] [--json PATH]

While the adaptive policy pauses drafting (`policy/adaptive.py`, DraftingPause) the proposer runs on no step, and
the drafting layer hands it every token appended meanwhile at the next step that drafts. This measures that step:
B requests (standard-library Python files of 2-4k tokens, SmolLM2 tokens, as `step_overhead`), each ingested and
stepped a few tokens at a time, then one step in which every request has g new tokens, through the drafting layer
with the suffix tree and the `fixed` policy, K = 8. Reported per batch size and g: the median milliseconds of that
step over `--repeats` fresh layers, and its excess over g = 1 (what the simulator charges a step after a pause
beyond an ordinary step: `host_time.CatchUpTime`).

With `--probe`, also the step that ends a pause as the adaptive policy takes it (`measure_probe`): the whole batch
handed its backlog against a probe that drafts for a sample, which is what `HostTime.sample_seconds` plus the
sample's catch-up model for the simulator.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

FORMAT = "spec-plugins-catchup/1"


def measure(batches: list[int], tokens: list[int], repeats: int, k: int = 8, progress=None) -> list[dict]:
    from spec_plugins.bench.step_overhead import code_token_streams
    from spec_plugins.drafting import DraftingLayer
    from spec_plugins.registry import create_policy, proposer_class

    longest = max(tokens)
    streams = code_token_streams(max(batches), 2048 + longest + 16, progress=False)
    rows = []
    for b in batches:
        chosen = [streams[i % len(streams)] for i in range(b)]
        width = max(len(s) for s in chosen)
        matrix = np.zeros((b, width), dtype=np.int32)
        for i, s in enumerate(chosen):
            matrix[i, : len(s)] = s
        ids, rows_of = [f"r{i}" for i in range(b)], np.arange(b)
        start = np.array([len(s) - longest - 8 for s in chosen], dtype=np.int64)
        ms = {}
        for g in tokens:
            took = []
            for _ in range(repeats):
                layer = DraftingLayer(proposer_class("suffix_tree")(), create_policy("fixed", {}))
                lens = start.copy()
                layer.step(ids, matrix, lens, rows=rows_of, max_draft=k)  # the prompts
                for _ in range(3):
                    lens = lens + 1
                    layer.step(ids, matrix, lens, rows=rows_of, num_new=np.ones(b, np.int64), max_draft=k)
                t0 = time.perf_counter()
                layer.step(ids, matrix, lens + g, rows=rows_of, num_new=np.full(b, g, np.int64), max_draft=k)
                took.append((time.perf_counter() - t0) * 1e3)
            ms[g] = statistics.median(took)
            if progress:
                progress()
        for g in tokens:
            rows.append({"batch": b, "tokens": g, "ms": round(ms[g], 4),
                         "over_one_token_ms": round(ms[g] - ms[min(tokens)], 4), "repeats": repeats})
    return rows


def measure_probe(batches: list[int], tokens: list[int], repeats: int, k: int = 8, progress=None) -> list[dict]:
    """The step that ends a pause under the adaptive policy (`hardware: h200`, Llama-3.1-8B, as `step_overhead`):
    every request g tokens behind, either all of them drafting (`whole_ms`: each hands the proposer its backlog) or
    a probe of `DraftingPause.probe_requests` (`probe_ms`: the rest keep theirs), beside an ordinary adaptive step
    (`ordinary_ms`, one token a request)."""
    from spec_plugins.bench.step_overhead import code_token_streams, keep_drafting
    from spec_plugins.drafting import DraftingLayer
    from spec_plugins.policy.adaptive import AdaptiveLength
    from spec_plugins.registry import proposer_class

    longest = max(tokens)
    streams = code_token_streams(max(batches), 2048 + longest + 16, progress=False)
    rows = []
    for b in batches:
        chosen = [streams[i % len(streams)] for i in range(b)]
        matrix = np.zeros((b, max(len(s) for s in chosen)), dtype=np.int32)
        for i, s in enumerate(chosen):
            matrix[i, : len(s)] = s
        ids, rows_of = [f"r{i}" for i in range(b)], np.arange(b)
        start = np.array([len(s) - longest - 8 for s in chosen], dtype=np.int64)

        def step_ms(g: int, sample: bool | None) -> float:
            """One fresh layer: prompts, three ordinary steps, then (sample not None) a paused step appending g - 1
            tokens a request; timed: the next step (one token a request more)."""
            layer = DraftingLayer(proposer_class("suffix_tree")(),
                                  AdaptiveLength(hardware="h200", model_config="llama-3.1-8b"))
            keep_drafting(layer)  # the policy never decides to pause: the benchmark sets the pause itself
            pause = layer.policy.pause
            lens = start.copy()
            layer.step(ids, matrix, lens, rows=rows_of, max_draft=k)
            for _ in range(3):
                lens = lens + 1
                layer.step(ids, matrix, lens, rows=rows_of, num_new=np.ones(b, np.int64), max_draft=k)
            if sample is not None:
                pause.left, pause.probe_requests = 1, pause.probe_requests if sample else b
                lens = lens + g - 1
                layer.step(ids, matrix, lens, rows=rows_of, num_new=np.full(b, g - 1, np.int64), max_draft=k)
            t0 = time.perf_counter()
            layer.step(ids, matrix, lens + 1, rows=rows_of, num_new=np.ones(b, np.int64), max_draft=k)
            return (time.perf_counter() - t0) * 1e3

        ordinary = statistics.median(step_ms(1, None) for _ in range(repeats))
        for g in tokens:
            if g == 1:
                continue
            whole = statistics.median(step_ms(g, False) for _ in range(repeats))
            probe = statistics.median(step_ms(g, True) for _ in range(repeats))
            rows.append({"batch": b, "tokens": g, "ordinary_ms": round(ordinary, 4), "whole_ms": round(whole, 4),
                         "probe_ms": round(probe, 4), "repeats": repeats})
            if progress:
                progress()
    return rows


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.catchup", description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--tokens", default="1,8,32,128", help="tokens new a request at the measured step (first: 1)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--probe", action="store_true",
                    help="also the step that ends a pause under the adaptive policy: the whole batch catching up "
                         "against a probe of a sample")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        batches = [int(x) for x in args.batches.split(",") if x.strip()]
        tokens = sorted(int(x) for x in args.tokens.split(",") if x.strip())
        if not batches or min(batches) < 1:
            raise ValueError(f"--batches: expected integers >= 1, got {args.batches!r}")
        if not tokens or tokens[0] != 1:
            raise ValueError(f"--tokens: expected integers >= 1 including 1 (the ordinary step), got {args.tokens!r}")
        if args.repeats < 1:
            raise ValueError(f"--repeats: expected an integer >= 1, got {args.repeats}")
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        return 2
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("measuring", total=len(batches) * len(tokens))
        rows = measure(batches, tokens, args.repeats, progress=lambda: prog.advance(task))
        probes = []
        if args.probe:
            task = prog.add_task("measuring probes", total=len(batches) * (len(tokens) - 1))
            probes = measure_probe(batches, tokens, args.repeats, progress=lambda: prog.advance(task))
    table = Table(title="the step after a pause: suffix tree, fixed policy, K = 8 (ms)")
    for col in ("B", "tokens a request", "ms", "over 1 token"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), str(r["tokens"]), f"{r['ms']:.3f}", f"{r['over_one_token_ms']:.3f}")
    Console().print(table)
    if probes:
        table = Table(title="the step that ends a pause: suffix tree, adaptive policy, K = 8 (ms)")
        for col in ("B", "tokens behind", "ordinary step", "whole batch catches up", "probe of a sample"):
            table.add_column(col, justify="right")
        for r in probes:
            table.add_row(str(r["batch"]), str(r["tokens"]), f"{r['ordinary_ms']:.3f}", f"{r['whole_ms']:.3f}",
                          f"{r['probe_ms']:.3f}")
        Console().print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "host": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
               "rows": rows}
        if probes:
            doc["probe_rows"] = probes
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
