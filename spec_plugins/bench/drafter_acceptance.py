"""Acceptance length of trained DFlash / DSpark drafters against the suffix tree and n-gram, same prompts.

    python -m spec_plugins.bench.drafter_acceptance --dflash drafts/smollm2-dflash --dspark drafts/smollm2-dspark \
        --workloads benchmarks/workloads/spec_bench_smollm2.jsonl,benchmarks/workloads/code_completion.jsonl \
        --limit 20 --max-new 128 --k 8 --json benchmarks/drafters/acceptance.json

Every proposer decodes every prompt greedily in the reference engine (`spec_plugins.reference`) on the
target (default: SmolLM2-135M-Instruct, float32, CPU), the model-based drafters reading the target's tap
features; prompts with `"chat": true` go through the chat template. Reported per workload and proposer:
acceptance length = mean tokens committed per verification step (accepted drafts + 1; the prefill step
is not counted), and whether every proposer's output equals the no-speculation run's (it must: the
engine is lossless). The suffix tree keeps its global tree across the prompts of a run, as in serving.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

DEFAULT_WORKLOADS = "benchmarks/workloads/spec_bench_smollm2.jsonl,benchmarks/workloads/code_completion.jsonl"


def decode_acceptance(steps: list) -> float:
    """Mean accepted + 1 over the verification steps (the first step is the prefill, which drafts nothing)."""
    verify = steps[1:]
    return sum(s.accepted + 1 for s in verify) / len(verify) if verify else 1.0


def load_rows(paths: list[str], limit: int | None) -> dict[str, list[dict]]:
    out = {}
    for path in paths:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        out[Path(path).stem] = rows[:limit] if limit else rows
    return out


def proposer_makers(args: argparse.Namespace, target_model: Any) -> dict[str, Callable[[], Any]]:
    """name -> a fresh proposer (one per workload, so trees and caches start empty there)."""
    from spec_plugins.registry import create_proposer

    makers: dict[str, Callable[[], Any]] = {"none": lambda: create_proposer("fixed_draft", {"length": 0})}
    for name in ("suffix_tree", "ngram"):
        makers[name] = lambda name=name: create_proposer(name)
    layers = target_model.config.num_hidden_layers
    if args.dflash:
        from spec_plugins.proposers.dflash import DFlashProposer, load_dflash

        def dflash():
            p = DFlashProposer(load_dflash(args.dflash, num_target_layers=layers).float())
            p.load(target_model)
            return p
        makers["dflash"] = dflash
    if args.dspark:
        from spec_plugins.proposers.dspark import DSparkProposer
        from spec_plugins.proposers.dspark.loader import load_dspark

        def dspark():
            model, markov, conf = load_dspark(args.dspark, num_target_layers=layers, dtype=None)
            p = DSparkProposer(model.float(), None if markov is None else markov.float(),
                               None if conf is None else conf.float())
            p.load(target_model)
            return p
        makers["dspark"] = dspark
    return makers


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="HF model folder (default: SmolLM2-135M-Instruct, converted on first use)")
    ap.add_argument("--dflash", help="a DFlash checkpoint folder (speculators or z-lab format)")
    ap.add_argument("--dspark", help="a DSpark checkpoint folder (speculators format)")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS, help="comma-separated replay workload JSONL files")
    ap.add_argument("--limit", type=int, default=20, help="first N prompts of each workload (default 20)")
    ap.add_argument("--max-new", type=int, default=128, help="new tokens per prompt (default 128)")
    ap.add_argument("--k", type=int, default=8, help="most drafts per step for every proposer (default 8)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spec_plugins.models import prompt_ids
    from spec_plugins.reference import HFTarget, generate

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.target is None:
        from spec_plugins.models import smollm2_path

        args.target = str(smollm2_path())
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    makers = proposer_makers(args, model)
    workloads = load_rows([w for w in args.workloads.split(",") if w.strip()], args.limit)

    results: dict[str, Any] = {"command": "python -m spec_plugins.bench.drafter_acceptance " + " ".join(argv or sys.argv[1:]),
                               "target": Path(args.target).name, "k": args.k, "max_new": args.max_new, "workloads": {}}
    for wname, rows in workloads.items():
        per: dict[str, dict] = {}
        outputs: dict[str, list[list[int]]] = {}
        for pname, make in makers.items():
            proposer = make()
            accept, new_tokens, seconds = [], 0, time.perf_counter()
            outputs[pname] = []
            for i, row in enumerate(tqdm(rows, desc=f"{wname} / {pname}", file=sys.stderr)):
                ids = prompt_ids(tokenizer, row["prompt"], bool(row.get("chat")))
                with torch.inference_mode():
                    res = generate(HFTarget(model), proposer, ids, args.max_new, max_draft=args.k,
                                   eos_token_id=tokenizer.eos_token_id, req_id=f"{wname}-{i}")
                outputs[pname].append(res.tokens)
                accept.extend(s.accepted + 1 for s in res.steps[1:])
                new_tokens += len(res.tokens)
            seconds = time.perf_counter() - seconds
            per[pname] = {"acceptance_length": sum(accept) / max(1, len(accept)), "steps": len(accept),
                          "new_tokens": new_tokens, "seconds": round(seconds, 1)}
        identical = {p: outputs[p] == outputs["none"] for p in outputs}
        for p in per:
            per[p]["identical_to_none"] = identical[p]
        results["workloads"][wname] = per

    table = Table(title=f"acceptance length (accepted + 1 per verification step), {results['target']}, greedy, K={args.k}")
    table.add_column("workload")
    names = [n for n in makers if n != "none"]
    for n in names:
        table.add_column(n, justify="right")
    table.add_column("outputs identical")
    for wname, per in results["workloads"].items():
        table.add_row(wname, *[f"{per[n]['acceptance_length']:.2f}" for n in names],
                      "yes" if all(p["identical_to_none"] for p in per.values()) else "NO")
    Console().print(table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
