"""End to end on a live vLLM engine: the adaptive draft-length policy vs every static K, by concurrency.

    python -m spec_plugins.bench.policy_e2e --proposer suffix_tree --static-k 2,4,8,16 --adaptive-k 16 \\
        --concurrency 1,8,32 --workload benchmarks/workloads/code_completion.jsonl [--native suffix,ngram \\
        --native-k 4,8,16] --json OUT.json

One engine per configuration (no speculation, each static K, the adaptive policy with K as its cap,
optionally vLLM's native methods at their own K), all alive at once and timed in turns, so every ratio comes from
one run on one machine state. At concurrency c the engine gets c prompts in one `generate` call (c = 1:
`--sequential` prompts one after another). With `--requests-per-client N` > 1, c clients each send N prompts one
after another instead, the engine holding at most c requests (as `vllm bench serve --max-concurrency c` runs):
a request that finishes early frees its place for the next, where in one call of c prompts the batch only drains
and the slowest request sets the time.

Rounds are replicates: each round starts every engine afresh, warms it up on a batch of its own, takes the
engines in a rotated order, and runs the same prompts as every other round; within a round each concurrency level
takes prompts the engines have not seen (the suffix tree remembers finished responses, and a repeated prompt would
be answered from memory). So neither a process's own speed nor its place in the round follows one configuration
through all rounds, and the rounds differ only by the machine (docs/notes/results-log.md, "Replicates"). With
`--keep-engines` the engines live through all rounds and each round takes new prompts: then rounds also differ by
their prompts (with the workloads interleaved, later rounds run out of the shorter files: on the shipped ones the
last of four rounds was all Spec-Bench and ran 3-4x faster than the first).

Reported per configuration and concurrency: output tokens/s (the median of the rounds, which the ratios use, with
the rounds' range; all rounds' tokens over their time in the JSON), the median over rounds of each round's ratio to
that round's best native ("paired"), mean accepted length, drafted tokens per draft, and whether the greedy outputs
equal the no-speculation run's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from spec_plugins.bench.vllm_run import Engine, EngineRun, RunResult, concat, round_order
from spec_plugins.demo import NATIVE_METHODS, native_config

FORMAT = "spec-plugins-policy-e2e/1"
MIN_ROUNDS = 3  # fewer replicate rounds than this and the runner says the figures rest on too few


def configurations(proposer: str, static_k: list[int], adaptive_k: int, policy_options: dict | list[dict],
                   natives: list[str], native_k: list[int], proposer_options: list[dict] | None = None
                   ) -> dict[str, tuple[dict | None, dict | None]]:
    """name -> (speculative_config, additional_config). Several policy options and/or proposer options: one adaptive
    engine for each pair, the later ones named by the options they add to or change from the first set of each."""
    model = "spec_plugins.vllm.SpecPluginsProposer"
    out: dict[str, tuple[dict | None, dict | None]] = {"none": (None, None)}
    for k in static_k:
        out[f"{proposer} K={k}"] = ({"method": "custom_class", "model": model, "num_speculative_tokens": k},
                                    {"spec_plugins": {"proposer": proposer}})
    variants = [policy_options] if isinstance(policy_options, dict) else policy_options
    drafting = proposer_options or [{}]

    def changes(options: dict, first: dict, prefix: str = "") -> str:
        changed = {k: v for k, v in options.items() if first.get(k, object()) != v}
        dropped = [k for k in first if k not in options]  # left at the default
        return "".join(f" {prefix}{k}={v}" for k, v in changed.items()) + "".join(f" {prefix}{k}=default"
                                                                                  for k in dropped)

    for options in variants:
        for j, own in enumerate(drafting):
            name = (f"{proposer}+adaptive K<={adaptive_k}{changes(options, variants[0])}"
                    f"{changes(own, drafting[0], 'proposer.')}")
            if name in out:
                flag = "--proposer-options" if own in drafting[:j] else "--policy-options"
                raise ValueError(f"{flag}: two sets of options make the same engine ({name!r})")
            extra = {"proposer": proposer, "policy": "adaptive", "policy_options": options}
            if own:
                extra["proposer_options"] = own
            out[name] = ({"method": "custom_class", "model": model, "num_speculative_tokens": adaptive_k},
                         {"spec_plugins": extra})
    for native in natives:
        for k in native_k:
            out[f"vllm:{native} K={k}"] = (native_config(native, k), None)
    return out


def rounds_note(repeats: int) -> str | None:
    """What a user must be told when the figures rest on too few replicate rounds (None: enough)."""
    if repeats >= MIN_ROUNDS:
        return None
    return (f"every figure above rests on {repeats} round(s): too few to tell a configuration's speed from one slow "
            f"or fast round on this machine; run --repeats {MIN_ROUNDS} or more before reading a difference of a few "
            "percent")


def warm_prompts(n: int, length: int = 64) -> list[list[int]]:
    """n token-id prompts of no language: a new engine's first batch runs slower (in one run of four fresh engines
    1.3-2x; benchmarks/engine_bias.py), and what a suffix tree remembers of their answers helps no timed prompt."""
    return [[100 + (37 * i + 11 * j) % 4000 for j in range(length)] for i in range(n)]


def timed(engine: Engine, prompts: list, max_tokens: int, concurrency: int, clients: bool = False) -> RunResult:
    """One round at `concurrency`: all prompts in one call, one by one at concurrency 1, or (clients) at most
    `concurrency` in the engine at once."""
    if clients:
        return engine.generate(prompts, max_tokens, max_in_flight=concurrency)
    if concurrency > 1:
        return engine.generate(prompts, max_tokens)
    return concat([engine.generate([p], max_tokens) for p in prompts])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.policy_e2e", description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="HF model folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--proposer", default="suffix_tree")
    ap.add_argument("--static-k", default="2,4,8,16", help="static draft lengths of the proposer (comma-separated; "
                                                          "may be empty beside --native)")
    ap.add_argument("--adaptive-k", type=int, default=16)
    ap.add_argument("--policy-options", action="append",
                    help="JSON options of the adaptive policy (default {}: none, the prior chosen from the "
                         "engine's device); repeat for one adaptive engine per set")
    ap.add_argument("--proposer-options", action="append",
                    help="JSON options of the proposer of the adaptive engines (default: its defaults); repeat for one "
                         "adaptive engine per set (and per --policy-options set)")
    ap.add_argument("--native", default="", help="also vLLM's own methods (comma-separated: ngram, suffix), each "
                                                 "at every --native-k")
    ap.add_argument("--native-k", default="8", help="draft lengths of the native methods (comma-separated)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--sequential", type=int, default=4, help="prompts run one by one at concurrency 1")
    ap.add_argument("--requests-per-client", type=int, default=1,
                    help="N > 1: c clients send N prompts each, at most c in the engine at once (default 1: the c "
                         "prompts in one call)")
    ap.add_argument("--workload", action="append", help="replay workload JSONL(s) whose prompts to use")
    ap.add_argument("--spec-bench", help="also the first-turn prompts of a Spec-Bench question.jsonl")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--keep-engines", action="store_true",
                    help="start each engine once for all rounds (faster; each round then takes new prompts, so rounds "
                         "are no longer replicates)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    err = Console(stderr=True)
    try:
        static_k = [int(k) for k in args.static_k.split(",") if k.strip()]
        conc = [int(c) for c in args.concurrency.split(",") if c.strip()]
        if (static_k and min(static_k) < 1) or args.adaptive_k < 1:
            raise ValueError("--static-k/--adaptive-k: expected integers >= 1")
        if not conc or min(conc) < 1:
            raise ValueError(f"--concurrency: expected integers >= 1, got {args.concurrency!r}")
        if args.requests_per_client < 1:
            raise ValueError(f"--requests-per-client: expected an integer >= 1, got {args.requests_per_client}")
        clients = args.requests_per_client > 1
        natives = [m.strip() for m in args.native.split(",") if m.strip()]
        if not static_k and not natives:
            raise ValueError("--static-k: expected integers >= 1 (none is allowed only beside --native)")
        bad = [m for m in natives if m not in NATIVE_METHODS]
        if bad:
            raise ValueError(f"--native: expected ngram and/or suffix, got {bad[0]!r}")
        native_k = [int(k) for k in args.native_k.split(",") if k.strip()]
        if natives and (not native_k or min(native_k) < 1):
            raise ValueError(f"--native-k: expected integers >= 1, got {args.native_k!r}")
        policy_options = [json.loads(o) for o in args.policy_options or ["{}"]]
        from spec_plugins.registry import create_policy, proposer_class

        proposer = proposer_class(args.proposer)
        for options in policy_options:
            create_policy("adaptive", options)
        proposer_options = [json.loads(o) for o in args.proposer_options or ["{}"]]
        for options in proposer_options:
            proposer(**options)  # a bad option fails here, before any engine starts
        configs = configurations(args.proposer, static_k, args.adaptive_k, policy_options, natives, native_k,
                                 proposer_options)
        from spec_plugins.bench.prompts import demo_prompts, interleaved, workload_prompts

        # Several workloads are interleaved, so every concurrency level sees a mix of them.
        sets = [workload_prompts(w, None) for w in args.workload or []]
        if args.spec_bench:
            from spec_plugins.bench.prompts import spec_bench

            sets.append(spec_bench(args.spec_bench))
        prompts = interleaved(sets) or demo_prompts(None)
        per_round = [c * args.requests_per_client if clients else args.sequential if c == 1 else c for c in conc]
        need = (args.repeats if args.keep_engines else 1) * sum(per_round)
        if len(prompts) < need:
            raise ValueError(f"prompts: {args.repeats} rounds at concurrency {args.concurrency} need {need} distinct "
                             f"prompts, got {len(prompts)} (add --workload or --spec-bench files)")
    except (ValueError, json.JSONDecodeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    model = args.model
    if model is None:
        from spec_plugins.models import smollm2_path

        model = str(smollm2_path())
    engines: dict[str, Engine] = {}
    rounds: dict[str, dict[int, list[RunResult]]] = {name: {c: [] for c in conc} for name in configs}

    def start(order: list[str], status) -> None:
        for name in order:
            if name in engines:
                continue
            spec, extra = configs[name]
            status.update(f"starting vLLM: {name}")
            engines[name] = Engine(EngineRun(model=model, prompts=prompts[:1], max_tokens=8, dtype=args.dtype,
                                             chat=True, speculative_config=spec, additional_config=extra))

    def close_all() -> None:
        for name in list(engines):
            engines.pop(name).close()

    try:
        with err.status("starting engines") as status:
            cursor = 0
            for r in range(args.repeats):
                order = round_order(list(configs), r)
                if not args.keep_engines:
                    close_all()
                    cursor = 0  # new engines remember nothing: every round runs the same prompts
                start(order, status)
                if not args.keep_engines:
                    for name in order:
                        status.update(f"round {r + 1}/{args.repeats}: warming up {name}")
                        engines[name].generate(warm_prompts(max(conc)), 16)
                for c, n in zip(conc, per_round):
                    batch, cursor = prompts[cursor: cursor + n], cursor + n
                    for name in order:
                        status.update(f"round {r + 1}/{args.repeats}, concurrency {c}: {name}")
                        rounds[name][c].append(timed(engines[name], batch, args.max_tokens, c, clients))
    finally:
        close_all()

    rows = []
    for c in conc:
        base = concat(rounds["none"][c])
        none_rounds = [x.tokens_per_s for x in rounds["none"][c]]
        for name in configs:
            res = concat(rounds[name][c])
            per_round = [x.tokens_per_s for x in rounds[name][c]]
            rows.append({
                "concurrency": c, "config": name, "tokens_per_s": res.tokens_per_s,
                "median_tokens_per_s": statistics.median(per_round), "rounds_tokens_per_s": per_round,
                # Paired with the same round's no-speculation engine: the worst round is what a user may meet.
                "worst_round_vs_none": min(a / b for a, b in zip(per_round, none_rounds)),
                "acceptance_length": res.acceptance_length,
                "draft_tokens_per_draft": res.num_draft_tokens / res.num_drafts if res.num_drafts else 0.0,
                "identical": res.token_ids == base.token_ids,
            })
    out = Console(width=140)
    for c in conc:
        how = f", {args.requests_per_client} requests per client" if clients else ""
        t = Table(title=f"vLLM, {Path(model).name}, greedy, concurrency {c}{how}, {args.max_tokens} tokens/prompt")
        cr = [r for r in rows if r["concurrency"] == c]
        # Ratios compare medians of the rounds: one slow round on a shared machine moves a median least.
        med = "median_tokens_per_s"
        none = next(r[med] for r in cr if r["config"] == "none")
        best_static = max((r[med] for r in cr if " K=" in r["config"] and not r["config"].startswith("vllm:")),
                          default=None)
        native_rows = [r for r in cr if r["config"].startswith("vllm:")]
        best_native = max((r[med] for r in native_rows), default=None)
        # Paired: each round's tokens/s over that round's best native (the engines ran minutes apart at most).
        native_best_rounds = [max(vals) for vals in zip(*(r["rounds_tokens_per_s"] for r in native_rows))]
        cols = ["config", "tokens/s (median)", "rounds min-max", "vs none", "worst round / none",
                *(["vs best static"] if best_static else []),
                *(["vs best native", "paired"] if best_native else []), "accepted len", "drafted/draft",
                "identical"]
        for col in cols:
            t.add_column(col, justify="left" if col == "config" else "right")
        for r in cr:
            spread = f"{min(r['rounds_tokens_per_s']):.1f}-{max(r['rounds_tokens_per_s']):.1f}"
            t.add_row(r["config"], f"{r[med]:.1f}", spread, f"{r[med] / none:.2f}x", f"{r['worst_round_vs_none']:.3f}x",
                      *([f"{r[med] / best_static:.3f}x"] if best_static else []),
                      *([f"{r[med] / best_native:.3f}x",
                         f"{statistics.median(a / b for a, b in zip(r['rounds_tokens_per_s'], native_best_rounds)):.3f}x"]
                        if best_native else []),
                      f"{r['acceptance_length']:.2f}", f"{r['draft_tokens_per_draft']:.2f}",
                      "yes" if r["identical"] else "[red]NO[/]")
        out.print(t)
    note = rounds_note(args.repeats)
    if note:
        err.print(f"[yellow]note:[/yellow] {note}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
