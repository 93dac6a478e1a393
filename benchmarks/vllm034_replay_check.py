"""A long check of the project's numpy replay of vLLM 0.34's `suffix` against vLLM 0.34's own kernels, on a real
workload: both driven step by step on the same contexts, every draft and every adaptive-verification confidence
compared, the corpus and its hash tables compared after every finish.

    CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 .venv-vllm034/bin/python benchmarks/vllm034_replay_check.py \\
        --workload benchmarks/workloads/agentic_edits.jsonl --limit 60 --corpus-tokens 4096 --json OUT.json

The kernels run in Triton's interpreter (with the project's mend, `spec_plugins/bench/triton_mend.py`), about a
hundred times slower than the replay. A small corpus ring (`--corpus-tokens`) makes it wrap many times, and its
smaller hash tables collide more; both are counted (`wraps`, `rejected`: candidates a lookup threw away as hash
collisions or overwritten documents). The contract test `pytest -m vllm_contract -k numpy_replay` runs a short
version of this on every CI run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--limit", type=int, default=None, help="rows of the workload")
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--corpus-tokens", type=int, default=4096)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from spec_plugins.bench import replay
    from spec_plugins.bench.vllm034_suffix import Vllm034Suffix
    from spec_plugins.bench.vllm034_suffix_np import Vllm034SuffixReplay

    rows = replay.load_workload(args.workload, replay.TextTokenizer(args.tokenizer), args.limit)
    options = {"corpus_tokens": args.corpus_tokens, "adaptive_verification": True}
    kernels = Vllm034Suffix(max_model_len=args.max_model_len, max_requests=args.concurrency + 1, **options)
    ours = Vllm034SuffixReplay(**options)
    out = {"workload": args.workload, "rows": len(rows), "max_draft": args.max_draft, "concurrency": args.concurrency,
           "corpus_tokens": args.corpus_tokens, "engine_steps": 0, "request_steps": 0, "drafts": 0,
           "corpus_drafts": 0, "finishes": 0, "wraps": 0, "mismatches": [], "corpus_mismatches": 0}
    bar = tqdm(total=sum(len(r.response) for r in rows), unit="tok", desc="kernels vs replay")

    class Both:
        def propose(self, requests):
            theirs, mine = kernels.propose(requests), ours.propose(requests)
            for r, a, b in zip(requests, theirs, mine):
                if (a.tokens, a.confidence) != (b.tokens, b.confidence) and len(out["mismatches"]) < 10:
                    out["mismatches"].append({"engine_step": out["engine_steps"], "req": str(r.req_id),
                                              "kernels": [a.tokens, a.confidence], "numpy": [b.tokens, b.confidence]})
                out["drafts"] += bool(a.tokens)
                out["corpus_drafts"] += bool(b.tokens) and ours.draft_kind(r.req_id) == "corpus"
            out["engine_steps"] += 1
            out["request_steps"] += len(requests)
            return theirs

        def finish(self, req_id):
            head = ours.corpus.head
            kernels.finish(req_id)
            ours.finish(req_id)
            out["finishes"] += 1
            out["wraps"] += ours.corpus.head < head
            same = (np.array_equal(kernels.spec.corpus.numpy(), ours.corpus.tokens)
                    and np.array_equal(kernels.spec.table.numpy(), ours.corpus.table))
            out["corpus_mismatches"] += not same
            bar.update(sum(len(r.response) for r in rows if r.id == req_id))

    t0 = time.perf_counter()
    replay.walk_interleaved(Both(), rows, args.max_draft, args.concurrency, fill=True)
    bar.close()
    out["rejected"] = ours.corpus.rejected
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps({k: v for k, v in out.items() if k != "mismatches"}, indent=1))
    if out["mismatches"]:
        print(f"first mismatches: {out['mismatches'][:3]}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if not out["mismatches"] and not out["corpus_mismatches"] else 1


if __name__ == "__main__":
    sys.exit(main())
