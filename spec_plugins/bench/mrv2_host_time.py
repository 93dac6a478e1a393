"""Host time of our vLLM 0.34 speculator's `propose` (Model Runner V2) beside the V1 `custom_class` adapter, in one run.

    python -m spec_plugins.bench.mrv2_host_time --save-streams streams.npz        # in .venv (SmolLM2's tokenizer)
    .venv-vllm034/bin/python -m spec_plugins.bench.mrv2_host_time --streams streams.npz [--batches 1,16,64,256]

B code-edit requests (`step_overhead.rewrite_streams`: standard-library files of 2-4k tokens, SmolLM2 tokens) are
added to vLLM 0.34's own `RequestState` on CPU tensors and stepped as the runner steps them: each step appends the
next 1-4 true tokens of every request to the token history (what `post_update` writes) and calls `propose` with
`num_sampled`, and the V1 adapter (`spec_plugins.vllm.SuffixTree`) on the same contexts, in turns (each first every
other step). Both run the
same drafting layer and compiled core, so the difference is what MRV2 adds on the host: the host mirror of the
lengths, the filler and the [B, K] matrix, the pinned-buffer copy (here a memcpy).

What this leaves out, and a GPU adds (written beside the numbers in docs/results.md): the one device sync a step (the
wait for the step's sampling, which under async scheduling is time the host would otherwise spend preparing the next
step), and the latencies of the two small copies (`num_sampled`, B x 4 bytes, and the drafts, B x K x 8 bytes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

FORMAT = "spec-plugins-mrv2-host-time/1"


def load_streams(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def engine_config(k: int, policy: str) -> SimpleNamespace:
    """What our speculator and the V1 adapter read of vLLM's config: a Llama-3.1-8B-shaped target."""
    from spec_plugins.bench.step_overhead import MAX_MODEL_LEN, vllm_config

    # the adaptive policy costs steps on the H200 roofline, as step_overhead's adaptive rows (no GPU to ask here)
    section = {"policy": policy, "policy_options": {"hardware": "h200"}} if policy != "fixed" else {}
    cfg = vllm_config(k, {"spec_plugins": {"proposer": "suffix_tree", **section}})
    cfg.speculative_config.speculator_options = section or None
    cfg.speculative_config.custom_method = "spec_plugins_suffix_tree"
    cfg.speculative_config.enable_adaptive_verification = policy != "fixed"
    # "cpu": no work left running between steps (the suffix tree's append_ahead, on beside an accelerator), as in
    # step_overhead's plain rows: such work would run across the next contender's timing
    cfg.device_config = SimpleNamespace(device_type="cpu")
    cfg.model_config.max_model_len = MAX_MODEL_LEN
    return cfg


def measure(streams: list[np.ndarray], batches: list[int], steps: int, warmup: int, k: int, policy: str,
            seed: int = 0) -> list[dict[str, Any]]:
    import torch
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.states import RequestState

    from spec_plugins.bench.step_overhead import MAX_MODEL_LEN, Batch, keep_drafting, rewrite_streams
    from spec_plugins.vllm import SuffixTree
    from spec_plugins.vllm.mrv2.speculator import SuffixTreeSpeculator

    from spec_plugins.bench.vllm034_suffix import cpu_buffers

    cpu_buffers()
    device = torch.device("cpu")
    rows = []
    for b in batches:
        rng = np.random.default_rng(seed + b)
        chosen = [streams[i % len(streams)] for i in range(b)]
        batch = Batch(rewrite_streams(chosen, seed=b), rng, MAX_MODEL_LEN, start=(2048, 3800))
        cfg = engine_config(k, policy)
        req_states = RequestState(max_num_reqs=b, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=8192,
                                  num_speculative_steps=k, vocab_size=49152, device=device)
        mrv2 = SuffixTreeSpeculator(cfg, device, req_states)
        v1 = SuffixTree(cfg)
        keep_drafting(mrv2.drafting)  # drafting steps, not paused ones
        keep_drafting(v1.drafting)
        history = mrv2.history
        for i, rid in enumerate(batch.req_ids):
            n = int(batch.num_tokens[i])
            req_states.add_request(rid, n - 1, batch.token_ids_cpu[i, : n - 1].tolist(), 0, 4096)
            slot = req_states.req_id_to_index[rid]
            history[slot, : n - 1] = batch.token_ids_cpu[i, : n - 1]
            mrv2.add_request(slot)
        slots = np.array([req_states.req_id_to_index[r] for r in batch.req_ids], dtype=np.intp)
        ib = InputBatch.make_dummy(b, b, InputBuffers(max_num_reqs=b, max_num_tokens=max(b, 16), device=device))
        ib = dataclasses.replace(ib, req_ids=list(batch.req_ids), idx_mapping_np=slots,
                                 idx_mapping=torch.from_numpy(slots.astype(np.int64)))
        v1.row_req_ids = list(batch.req_ids)
        v1_us, mrv2_us, same = [], [], True
        sampled_counts = np.ones(b, dtype=np.int32)  # the first step: the prefill's one sampled token
        for step in range(warmup + steps):
            # the step's sampled tokens into the history, as post_update writes them
            for i in range(b):
                n, c = int(batch.num_tokens[i]), int(sampled_counts[i])
                history[slots[i], n - c: n] = batch.token_ids_cpu[i, n - c: n]
            num_sampled = torch.from_numpy(sampled_counts.copy())
            # every slot verified (adaptive verification admitting all): num_logits - num_sampled, as vLLM counts
            num_rejected = torch.from_numpy(np.maximum(k + 1 - sampled_counts, 0).astype(np.int32) * (step > 0))
            took = {}
            for who in ("mrv2", "v1") if step % 2 else ("v1", "mrv2"):  # in turns, each first every other step
                t0 = time.perf_counter()
                if who == "mrv2":
                    out = mrv2.propose(ib, {}, {}, None, None, num_sampled, num_rejected, None, None, None, None,
                                       num_speculative_tokens=k)
                else:
                    old = v1.propose(batch.sampled, batch.num_tokens, batch.token_ids_cpu)
                took[who] = (time.perf_counter() - t0) * 1e6
            same = same and all(list(out[i, : len(d)].tolist()) == list(d) for i, d in enumerate(old))
            if step >= warmup:
                mrv2_us.append(took["mrv2"])
                v1_us.append(took["v1"])
            batch.advance()
            sampled_counts = np.array([len(s) for s in batch.sampled], dtype=np.int32)
        m2, m1 = statistics.median(mrv2_us), statistics.median(v1_us)
        rows.append({"batch": b, "k": k, "policy": policy, "mrv2_us": round(m2, 1), "v1_us": round(m1, 1),
                     "mrv2_over_v1": round(m2 / m1, 3), "mrv2_minus_v1_us": round(m2 - m1, 1),
                     "same_drafts": same, "steps": steps})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save-streams", type=Path, help="write the token streams here and stop (run in .venv)")
    ap.add_argument("--streams", type=Path, help="token streams written by --save-streams")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--policies", default="fixed,adaptive")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.save_streams:
        from spec_plugins.bench.step_overhead import code_token_streams

        streams = code_token_streams(64, 4096)
        np.savez_compressed(args.save_streams, **{f"stream_{i}": s for i, s in enumerate(streams)})
        print(f"wrote {len(streams)} streams to {args.save_streams}")
        return 0
    if args.streams is None:
        raise SystemExit("--streams: required (write them with --save-streams in .venv)")
    streams = load_streams(args.streams)
    batches = [int(x) for x in args.batches.split(",")]
    rows = []
    for policy in args.policies.split(","):
        rows += measure(streams, batches, args.steps, args.warmup, args.k, policy)
    print(f"{'policy':9} {'B':>4} {'MRV2 propose us':>16} {'V1 propose us':>14} {'MRV2 / V1':>10} {'same drafts':>12}")
    for r in rows:
        print(f"{r['policy']:9} {r['batch']:>4} {r['mrv2_us']:>16} {r['v1_us']:>14} {r['mrv2_over_v1']:>10} "
              f"{str(r['same_drafts']):>12}")
    if args.json:
        import vllm

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"format": FORMAT, "vllm": vllm.__version__, "host": platform.processor()
                                         or platform.machine(), "date": time.strftime("%Y-%m-%d"), "rows": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
