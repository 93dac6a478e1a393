"""The `spec-plugins` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_models(args: argparse.Namespace) -> None:
    from spec_plugins import models, tiny_models

    cache = Path(args.cache_dir) if args.cache_dir else None
    if args.name == "smollm2":
        print(models.smollm2_path(cache))
    else:
        out = Path(args.out or (models.cache_dir() if cache is None else cache) / "models" / f"tiny-{args.name}")
        print(tiny_models.build_tiny_model(out, arch=args.name))


def _cmd_demo(args: argparse.Namespace) -> None:
    from rich.console import Console

    from spec_plugins.demo import print_rows, run_demo, write_json

    if args.k <= 0:
        raise ValueError(f"--k: expected an integer >= 1, got {args.k}")
    if args.max_tokens <= 0:
        raise ValueError(f"--max-tokens: expected an integer >= 1, got {args.max_tokens}")
    if args.repeats <= 0:
        raise ValueError(f"--repeats: expected an integer >= 1, got {args.repeats}")
    from spec_plugins.registry import proposer_class

    proposers = [p.strip() for p in args.proposers.split(",") if p.strip()]
    policy_options = None
    if args.policy_options:
        import json

        try:
            policy_options = json.loads(args.policy_options)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--policy-options: expected a JSON object ({exc.msg})") from None
    from spec_plugins.registry import create_policy

    for name in proposers:
        proposer, _, policy = name.partition("+")
        proposer_class(proposer)  # unknown names fail here, before any engine starts
        if policy:
            create_policy(policy, policy_options or {})
    native = [m.strip() for m in args.native.split(",") if m.strip()]
    from spec_plugins.demo import native_config

    for method in native:
        native_config(method, args.k)
    prompts = None
    if args.workload:
        from spec_plugins.bench.prompts import workload_prompts

        prompts = workload_prompts(args.workload, args.limit)
    model = args.model
    if model is None:
        from spec_plugins.models import smollm2_path

        model = str(smollm2_path())
    rows = run_demo(model, proposers, k=args.k, max_tokens=args.max_tokens,
                    spec_bench_path=args.spec_bench, dtype=args.dtype, repeats=args.repeats, native=native,
                    prompts=prompts, policy_options=policy_options)
    print_rows(rows, Console(), title=f"vLLM, {Path(model).name}, greedy, K={args.k}, {args.max_tokens} tokens/prompt")
    if args.json:
        write_json(rows, args.json)


def build_parser() -> argparse.ArgumentParser:
    from spec_plugins.demo import DEFAULT_PROPOSERS

    parser = argparse.ArgumentParser(prog="spec-plugins", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    m = sub.add_parser("models", help="prepare local models (SmolLM2 from its wheel, tiny random models)")
    m.add_argument("name", choices=["smollm2", "llama", "qwen3"],
                   help="smollm2: convert SmolLM2-135M-Instruct once; llama/qwen3: a tiny random model")
    m.add_argument("--cache-dir", help="default: $SPEC_PLUGINS_CACHE or ~/.cache/spec-plugins")
    m.add_argument("--out", help="output folder for tiny models")
    m.set_defaults(func=_cmd_models)

    d = sub.add_parser("demo", help="vLLM with and without speculation on real prompts: speed and identity")
    d.add_argument("--proposers", default=",".join(DEFAULT_PROPOSERS),
                   help="comma-separated proposer names; NAME+adaptive runs NAME under the adaptive draft-length policy")
    d.add_argument("--policy-options", help="JSON options for the +POLICY runs (default: none; adaptive then "
                   "takes its prior from the engine's device)")
    d.add_argument("--model", help="HF model folder (default: SmolLM2-135M-Instruct, converted on first use)")
    d.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    d.add_argument("--max-tokens", type=int, default=128, help="output tokens per prompt (default 128)")
    d.add_argument("--dtype", default="float32",
                   help="float32 (default) keeps vLLM-CPU's greedy outputs batch-invariant")
    d.add_argument("--repeats", type=int, default=3, help="timed rounds per engine, each on its own share of the prompts (default 3)")
    d.add_argument("--spec-bench", help="a Spec-Bench question.jsonl (default: the bundled sample)")
    d.add_argument("--native", default="", help="also run vLLM's own methods, e.g. ngram or ngram,suffix "
                   "(suffix needs arctic-inference)")
    d.add_argument("--workload", help="use the prompts of a replay workload JSONL instead of the demo's")
    d.add_argument("--limit", type=int, help="first N prompts of --workload (split over the rounds)")
    d.add_argument("--json", help="also write the rows to this JSON file")
    d.set_defaults(func=_cmd_demo)

    from spec_plugins.bench.sweep import add_sweep_parser
    from spec_plugins.bench.profile import add_profile_parser
    from spec_plugins.training import add_train_parser
    from spec_plugins.trtllm.launcher import add_trtllm_parser

    add_profile_parser(sub)
    add_trtllm_parser(sub)
    add_train_parser(sub)
    add_sweep_parser(sub)

    p = sub.add_parser("plan", help="hardware + model + measured acceptance -> vLLM / TensorRT-LLM draft-length configs")
    p.add_argument("--hardware", help="GPU profile (h100, h200, b200, a100, l40s) or a YAML file")
    p.add_argument("--model-config", help="the target's Hugging Face config.json (or its folder)")
    p.add_argument("--profile", help="a measured step-time profile (`spec-plugins profile`) instead of --hardware")
    p.add_argument("--acceptance", required=True,
                   help="comma-separated acceptance traces (`python -m spec_plugins.bench.replay --trace-out`)")
    p.add_argument("--mechanism", required=True, help="ngram, suffix (vLLM's native) or suffix_tree (ours)")
    p.add_argument("--max-draft", type=int, required=True, help="largest draft length to consider (K)")
    p.add_argument("--max-batch", type=int, default=256, help="largest batch size to plan for (default 256)")
    p.add_argument("--tpot-ms", type=float, help="keep modelled time per output token under this")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"], help="weight/GEMM dtype (default bf16)")
    p.add_argument("--draft-us", type=float, default=5.0, help="model-free drafting cost per request, µs")
    p.add_argument("--vllm-version", default="0.34",
                   help="the vLLM the config is for: 0.34 (default; our registered methods) or 0.32 / 0.33 "
                        "(custom_class)")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd_plan)
    return parser


def _cmd_plan(args: argparse.Namespace) -> None:
    from spec_plugins.policy import planner
    from spec_plugins.traces import load_traces

    if args.mechanism not in planner.MECHANISMS:
        raise ValueError(f"--mechanism: expected one of {', '.join(planner.MECHANISMS)}, got {args.mechanism!r}")
    if (args.hardware is None) == (args.profile is None):
        raise ValueError("expected exactly one of --hardware (with --model-config) or --profile")
    if args.vllm_version.strip() not in ("0.32", "0.33", "0.34") and not args.vllm_version.startswith(
            ("0.32.", "0.33.", "0.34.")):
        raise ValueError(f"--vllm-version: expected 0.32, 0.33 or 0.34, got {args.vllm_version!r}")
    if args.draft_us < 0:
        raise ValueError(f"--draft-us: expected >= 0, got {args.draft_us}")
    paths = [a.strip() for a in args.acceptance.split(",") if a.strip()]
    traces = load_traces(paths)
    for path, doc in zip(paths, traces):
        recorded = planner.trace_mechanism(doc.get("proposer", ""))
        if recorded is not None and recorded != args.mechanism:  # None: a proposer no engine serves natively
            raise ValueError(f"--mechanism {args.mechanism}: the trace {path} recorded proposer {doc.get('proposer')!r} "
                             f"(mechanism {recorded!r}); plan a mechanism with its own traces")
        if args.max_draft > doc["max_draft"]:
            raise ValueError(f"--max-draft {args.max_draft}: the trace {path} drafted at most {doc['max_draft']} "
                             f"tokens per step; expected --max-draft <= {doc['max_draft']}")
    stats = planner.AcceptanceStats.from_traces(traces)
    from spec_plugins.policy.cost import step_cost

    if args.profile:
        where = Path(args.profile).stem
        model = None
    else:
        if not args.model_config:
            raise ValueError("--model-config: required with --hardware")
        from spec_plugins.policy.model import load_model_config

        model = load_model_config(args.model_config)
        where = f"{args.hardware} {model.name or Path(args.model_config).stem} {args.dtype}"
    cost = step_cost(hardware=args.hardware, model=model, profile=args.profile, dtype=args.dtype,
                     draft_us_per_request=args.draft_us)
    the_plan = planner.plan(cost, stats, args.max_draft, args.max_batch, args.tpot_ms)
    title = f"{where}, {args.mechanism}, K<={args.max_draft}, acceptance: {', '.join(stats.sources)}"
    paths = planner.write_plan(the_plan, cost, stats, args.mechanism, Path(args.out), title, args.vllm_version)
    print(planner.guideline_table(the_plan, cost, stats), end="")
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, RuntimeError) as exc:  # bad input or a failed engine run: its message, no traceback
        print(f"spec-plugins: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file named on the command line that cannot be read or written
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"spec-plugins: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
