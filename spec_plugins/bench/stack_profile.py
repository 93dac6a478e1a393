"""Step time of a model-shaped decoder stack on a GPU, per (batch, draft length), as a step profile.

    python -m spec_plugins.bench.stack_profile --model-config configs/models/llama-3.1-8b.json \
        --out benchmarks/profiles/h200-llama-3.1-8b-stack.json

What it measures: one verification step of B requests that each carry D drafts, i.e. B·(1 + D) rows
through every decoder layer (fused QKV, attention over a KV cache of `--context` tokens plus the new
rows, output projection, SwiGLU MLP, RMSNorms) and the LM head over all rows — the work a target does
to verify drafts. Weights are random bf16 at the model's real shapes; each (B, D) step is captured in a
CUDA graph, so the times hold no Python or launch overhead (a serving engine adds its own scheduling,
sampling and rejection on top). It writes the `spec-plugins-step-profile/1` format of
`spec_plugins.policy.measured`, which `spec-plugins plan --profile FILE` reads, and so measures what the
roofline model in `spec_plugins.policy.cost` predicts from datasheet figures.

Left out on purpose: RoPE and the causal mask among the new rows (element-wise work and a mask that
changes no tile count), and paged KV indexing (the cache is one contiguous tensor per layer).
Grouped-query attention runs as plain attention with the query heads of one KV head stacked along the
sequence axis, which is exact without a mask and lets any SDPA backend run it.

Needs only torch and a CUDA device (no pydantic, no engine), so it runs from a source checkout:
`PYTHONPATH=. python -m spec_plugins.bench.stack_profile ...`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

DEFAULT_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
DEFAULT_DRAFTS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15]


def shape_of(config: dict) -> dict:
    text = config.get("text_config", config)
    heads = text["num_attention_heads"]
    return {
        "hidden": text["hidden_size"],
        "intermediate": text["intermediate_size"],
        "layers": text["num_hidden_layers"],
        "heads": heads,
        "kv_heads": text.get("num_key_value_heads", heads),
        "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
        "vocab": text["vocab_size"],
        "eps": text.get("rms_norm_eps", 1e-6),
    }


class DecoderStack:
    """Random weights at the model's shapes and a preallocated KV cache for max_batch requests."""

    def __init__(self, s: dict, max_batch: int, context: int, max_draft: int, device: str, dtype) -> None:
        self.s, self.context = s, context
        d, hd = s["hidden"], s["head_dim"]
        q_out, kv_out = s["heads"] * hd, s["kv_heads"] * hd
        g = torch.Generator(device=device).manual_seed(0)

        def weight(*shape):
            return (torch.randn(*shape, generator=g, device=device, dtype=dtype) * 0.02)

        self.layers = [
            {
                "wqkv": weight(q_out + 2 * kv_out, d),
                "wo": weight(d, q_out),
                "w13": weight(2 * s["intermediate"], d),
                "w2": weight(d, s["intermediate"]),
                "n1": torch.ones(d, device=device, dtype=dtype),
                "n2": torch.ones(d, device=device, dtype=dtype),
                # Separate caches per layer: one shared cache would sit in L2 at small batches.
                "k": weight(max_batch, s["kv_heads"], context + max_draft + 1, hd),
                "v": weight(max_batch, s["kv_heads"], context + max_draft + 1, hd),
            }
            for _ in range(s["layers"])
        ]
        self.norm = torch.ones(d, device=device, dtype=dtype)
        self.lm_head = weight(s["vocab"], d)

    def step(self, x: torch.Tensor, batch: int, new: int) -> torch.Tensor:
        """x: [batch·new, hidden] → logits for every row."""
        s, ctx = self.s, self.context
        hd, kvh, group = s["head_dim"], s["kv_heads"], s["heads"] // s["kv_heads"]
        q_out, kv_out = s["heads"] * hd, kvh * hd
        for w in self.layers:
            h = F.rms_norm(x, (x.shape[-1],), w["n1"], s["eps"])
            q, k, v = (h @ w["wqkv"].T).split([q_out, kv_out, kv_out], dim=-1)
            w["k"][:batch, :, ctx:ctx + new] = k.view(batch, new, kvh, hd).transpose(1, 2)
            w["v"][:batch, :, ctx:ctx + new] = v.view(batch, new, kvh, hd).transpose(1, 2)
            # [B, new, H, hd] → [B, KV, group·new, hd]: the queries of one KV head share its keys.
            q = q.view(batch, new, kvh, group, hd).permute(0, 2, 3, 1, 4).reshape(batch, kvh, group * new, hd)
            o = F.scaled_dot_product_attention(q, w["k"][:batch, :, :ctx + new], w["v"][:batch, :, :ctx + new])
            o = o.view(batch, kvh, group, new, hd).permute(0, 3, 1, 2, 4).reshape(batch * new, q_out)
            x = x + o @ w["wo"].T
            h = F.rms_norm(x, (x.shape[-1],), w["n2"], s["eps"])
            gate, up = (h @ w["w13"].T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ w["w2"].T
        return F.rms_norm(x, (x.shape[-1],), self.norm, s["eps"]) @ self.lm_head.T


def time_cell(stack: DecoderStack, batch: int, draft: int, replays: int, dtype) -> list[float]:
    """Milliseconds per replay of the CUDA graph of one (batch, draft) step."""
    new = 1 + draft
    x = torch.randn(batch * new, stack.s["hidden"], device="cuda", dtype=dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up picks the kernels before capture
        for _ in range(2):
            stack.step(x, batch, new)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stack.step(x, batch, new)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-config", required=True, help="a config.json (e.g. configs/models/llama-3.1-8b.json)")
    ap.add_argument("--out", required=True, help="profile JSON to write")
    ap.add_argument("--context", type=int, default=1024, help="KV-cache length per request (default 1024)")
    ap.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    ap.add_argument("--drafts", default=",".join(map(str, DEFAULT_DRAFTS)))
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("stack_profile: needs a CUDA device (torch.cuda.is_available() is False)")
    batches = [int(b) for b in args.batches.split(",")]
    drafts = [int(d) for d in args.drafts.split(",")]
    config = json.loads(Path(args.model_config).read_text())
    shape, dtype = shape_of(config), torch.bfloat16
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    stack = DecoderStack(shape, max(batches), args.context, max(drafts), "cuda", dtype)
    points = []
    with torch.inference_mode():
        for batch in batches:
            for draft in drafts:
                runs = time_cell(stack, batch, draft, args.replays, dtype)
                ms = statistics.median(runs)
                points.append({"batch": batch, "draft": draft, "tokens": batch * (1 + draft), "step_ms": round(ms, 4),
                               "runs": [round(r, 4) for r in runs], "drafted_per_step": None, "accepted_per_step": None})
                print(f"B={batch:4d} D={draft:3d} rows={batch * (1 + draft):5d} step {ms:8.3f} ms", flush=True)
    profile = {
        "format": "spec-plugins-step-profile/1",
        "engine": f"torch {torch.__version__} decoder stack in CUDA graphs (no serving engine)",
        "device": torch.cuda.get_device_name(0),
        "model": Path(args.model_config).stem,
        # the fields `spec_plugins.policy.measured.model_shape` records (this module imports no pydantic)
        "model_shape": {"layers": shape["layers"], "hidden": shape["hidden"], "intermediate": shape["intermediate"],
                        "heads": shape["heads"], "kv_heads": shape["kv_heads"], "vocab": shape["vocab"]},
        "dtype": "bfloat16",
        "context_len": args.context,
        "steps": args.replays,
        "enforce_eager": False,
        "points": points,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m spec_plugins.bench.stack_profile " + shlex.join(argv if argv is not None else sys.argv[1:]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
