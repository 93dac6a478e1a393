"""Drafter forward latency: our DFlash draft step vs z-lab's reference (`dflash` 0.1.0), plus DSpark vs DFlash.

One draft step = C newly committed context positions (tap features) + a query block of B tokens, with a
draft KV cache already holding L context positions. Rows, per shape:

    dflash.forward          our DFlashDraftModel.forward  vs  z-lab DFlashDraftModel.forward (block hidden states)
    dflash.forward+head     the same plus the LM head on the draft rows (z-lab: compute_logits)
    dspark.step / dflash    our DSpark step (backbone + LM head + greedy Markov walk + confidence)
                            vs our DFlash step (backbone + LM head + argmax), same backbone

Both models get identical weights (ours randomised, copied into z-lab's under its names) and identical
inputs; a max |difference| column confirms they compute the same thing. The two sides are interleaved
(alternating which goes first) so drift on a noisy machine hits both; medians are reported. Cache growth is
undone between steps outside the timed region (z-lab crops, we trim), as each engine's loop does.

Run from the repository root:

    python -m spec_plugins.bench.drafter_latency --device cpu                        # our venv
    PYTHONPATH=.:<folder holding dflash/> python spec_plugins/bench/drafter_latency.py --device cuda

The second form needs only torch, transformers and the z-lab `dflash` source folder: it runs from a plain
checkout without pydantic (see _import_drafters). `python -m` cannot work there, because running a module
inside `spec_plugins` first executes `spec_plugins/__init__.py`, which imports pydantic.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Callable

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _import_drafters():
    """Our draft network and DSpark heads, with or without the installed package.

    `spec_plugins/__init__.py` imports the core API, which needs pydantic, and `proposers/` lives at the repository
    top (setuptools installs it as `spec_plugins.proposers`). Where the normal import fails (plain checkout, no
    pydantic), register bare package modules that point at the source folders, so only the three modules the
    benchmark needs (dflash/config.py, dflash/model.py, dspark/heads.py; torch only) are executed.
    """
    try:
        from spec_plugins.proposers.dflash import model as dflash_model
        from spec_plugins.proposers.dspark import heads
    except ImportError:
        for name, folder in (("spec_plugins", "spec_plugins"), ("spec_plugins.proposers", "proposers"),
                             ("spec_plugins.proposers.dflash", "proposers/dflash"),
                             ("spec_plugins.proposers.dspark", "proposers/dspark")):
            package = types.ModuleType(name)
            package.__path__ = [str(REPO_ROOT / folder)]
            sys.modules[name] = package
        from spec_plugins.proposers.dflash import model as dflash_model
        from spec_plugins.proposers.dspark import heads
    return dflash_model, heads


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    taps: int
    block: int = 16
    context: int = 4     # C: new tapped positions this step (accepted drafts + bonus)
    cache: int = 512     # L: context already in the draft KV cache
    batch: int = 1
    markov_rank: int = 256
    gpu_only: bool = False


SHAPES = {
    # SmolLM2-135M-sized draft (hidden 576, 9/3 heads), CPU friendly.
    "small": Shape("small", hidden=576, layers=2, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152,
                   taps=2, cache=256),
    # Qwen3-1.7B-sized target, 3-layer draft.
    "medium": Shape("medium", hidden=2048, layers=3, heads=16, kv_heads=8, head_dim=128, intermediate=6144,
                    vocab=151936, taps=3, cache=1024),
    # z-lab/Qwen3-8B-DFlash-b16.
    "qwen3-8b-b16": Shape("qwen3-8b-b16", hidden=4096, layers=5, heads=32, kv_heads=8, head_dim=128,
                          intermediate=12288, vocab=151936, taps=5, cache=2048, gpu_only=True),
    "qwen3-8b-b16-bs8": Shape("qwen3-8b-b16-bs8", hidden=4096, layers=5, heads=32, kv_heads=8, head_dim=128,
                              intermediate=12288, vocab=151936, taps=5, cache=2048, batch=8, gpu_only=True),
}

ROPE_THETA = 1e6


def ours_config(dflash_model, s: Shape):
    return dflash_model.DFlashConfig(
        hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers, num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads, head_dim=s.head_dim, vocab_size=s.vocab, rms_norm_eps=1e-6, rope_theta=ROPE_THETA,
        attention_bias=False, block_size=s.block, mask_token_id=s.vocab - 1, target_layer_ids=tuple(range(s.taps)),
        num_target_layers=None, layer_causal=(False,) * s.layers, layer_window=(None,) * s.layers,
    )


def zlab_config(s: Shape):
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers, num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads, head_dim=s.head_dim, vocab_size=s.vocab, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, max_position_embeddings=32768,
        block_size=s.block, num_target_layers=s.taps + 3,
        dflash_config={"mask_token_id": s.vocab - 1, "target_layer_ids": list(range(s.taps))},
    )


def randomize(module: torch.nn.Module, std: float = 0.02) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)


def timed(fn: Callable[[], object], reset: Callable[[], None], device: str) -> float:
    """Seconds for one call of fn; reset (untimed) restores the cache afterwards."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    reset()
    return elapsed


def interleaved(a, b, *, repeats: int, warmup: int, device: str) -> tuple[list[float], list[float]]:
    """a, b: (fn, reset) pairs. Alternate which runs first so slow drift affects both equally."""
    ta, tb = [], []
    for i in range(warmup + repeats):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        t1 = timed(*first, device)
        t2 = timed(*second, device)
        if i >= warmup:
            (ta if first is a else tb).append(t1)
            (tb if first is a else ta).append(t2)
    return ta, tb


def _zlab_cache(zlab, config):
    try:
        return zlab._make_cache(config)  # DynamicCache + activate_past_recording (transformers >= 5.x)
    except AttributeError:
        from transformers import DynamicCache

        return DynamicCache(config=config)


@torch.inference_mode()
def bench_shape(s: Shape, *, device: str, dtype: torch.dtype, repeats: int, warmup: int, seed: int = 0) -> list[dict]:
    dflash_model, heads = _import_drafters()
    from dflash import model as zlab
    from spec_plugins.proposers.dflash.loader import zlab_to_ours  # noqa: F401  (name map; torch-only module deps)

    torch.manual_seed(seed)
    with torch.device(device):
        ours = dflash_model.DFlashDraftModel(ours_config(dflash_model, s))
        randomize(ours)
        ours = ours.to(dtype).eval()
        theirs = zlab.DFlashDraftModel(zlab_config(s)).to(dtype).eval()
    ours_state = ours.state_dict()
    theirs.load_state_dict({k: ours_state[zlab_to_ours(k)] for k in theirs.state_dict()}, strict=True)
    del ours_state

    g = torch.Generator(device=device).manual_seed(seed + 1)
    d, b, L, C, B = s.hidden, s.batch, s.cache, s.context, s.block
    feats = lambda n: torch.randn(b, n, s.taps * d, device=device, dtype=dtype, generator=g)  # noqa: E731
    prefill, ctx = feats(L), feats(C)
    lm_head = (0.02 * torch.randn(s.vocab, d, device=device, generator=g)).to(dtype)
    embed = lm_head  # values do not matter for latency; one [V, d] table instead of two
    anchor = torch.randint(0, s.vocab - 1, (b,), device=device, generator=g)
    block_ids = ours.block_ids(anchor)
    block_emb = ours.embed_block(block_ids, embed)
    head_lin = torch.nn.Linear(d, s.vocab, bias=False, device=device, dtype=dtype)
    head_lin.weight.copy_(lm_head)

    # Caches holding L context positions. z-lab fills its cache the way its loop does: a forward over the
    # prefix features (+ a block) followed by a crop back to the committed length.
    our_cache = ours.new_cache()
    ours.extend_cache(prefill, our_cache)
    their_cache = _zlab_cache(zlab, theirs.config)
    theirs(target_hidden=prefill, noise_embedding=block_emb, position_ids=torch.arange(L + B, device=device)[None].expand(b, -1),
           past_key_values=their_cache, use_cache=True)
    zlab._crop_to(their_cache, L)
    positions = torch.arange(L, L + C + B, device=device)[None].expand(b, -1)

    def ours_fwd():
        return ours(ctx, block_emb, our_cache)

    def theirs_fwd():
        return theirs(target_hidden=ctx, noise_embedding=block_emb, position_ids=positions,
                      past_key_values=their_cache, use_cache=True)

    def ours_head():
        return ours.logits(ours_fwd()[:, 1:], lm_head)

    def theirs_head():
        return theirs.compute_logits(theirs_fwd()[:, 1:], head_lin)

    def ours_reset():
        our_cache.trim(L)

    def theirs_reset():
        zlab._crop_to(their_cache, L)

    # Same computation? (one step each, then back to L)
    diff_fwd = (ours_fwd().float() - theirs_fwd().float()).abs().max().item()
    ours_reset(), theirs_reset()
    diff_head = (ours_head().float() - theirs_head().float()).abs().max().item()
    ours_reset(), theirs_reset()

    rows = []

    def add(row: str, ta: list[float], tb: list[float], base: str, diff: float | None) -> None:
        ma, mb = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
        rows.append({"shape": s.name, "row": row, "ours_ms": ma, "base": base, "base_ms": mb, "ratio": ma / mb,
                     "ours_min_ms": min(ta) * 1e3, "base_min_ms": min(tb) * 1e3, "max_abs_diff": diff,
                     "batch": b, "context": C, "cache": L, "block": B, "repeats": repeats})

    ta, tb = interleaved((ours_fwd, ours_reset), (theirs_fwd, theirs_reset), repeats=repeats, warmup=warmup, device=device)
    add("dflash.forward", ta, tb, "zlab", diff_fwd)
    ta, tb = interleaved((ours_head, ours_reset), (theirs_head, theirs_reset), repeats=repeats, warmup=warmup, device=device)
    add("dflash.forward+head", ta, tb, "zlab", diff_head)

    # DSpark on our backbone: same block, every row drafts through the Markov walk, confidences on.
    with torch.device(device):
        markov = heads.MarkovHead(s.vocab, s.markov_rank, d, "vanilla")
        confidence = heads.ConfidenceHead(d, s.markov_rank)
    randomize(markov), randomize(confidence)
    markov, confidence = markov.to(dtype).eval(), confidence.to(dtype).eval()
    del theirs, their_cache  # free memory before the DSpark rows

    def dspark_step():
        hidden = ours(ctx, ours.embed_block(block_ids, embed), our_cache)
        return heads.markov_walk(hidden, ours.logits(hidden, lm_head), anchor, markov, confidence, 0.0)

    def dflash_step():
        hidden = ours(ctx, ours.embed_block(block_ids, embed), our_cache)
        return ours.logits(hidden[:, 1:], lm_head).argmax(-1)

    ta, tb = interleaved((dspark_step, ours_reset), (dflash_step, ours_reset), repeats=repeats, warmup=warmup, device=device)
    add("dspark.step", ta, tb, "ours.dflash.step", None)
    return rows


def print_table(rows: list[dict]) -> None:
    head = f"{'shape':<18} {'row':<20} {'ours ms':>9} {'base':>17} {'base ms':>9} {'ratio':>6} {'max|diff|':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        diff = "" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.2e}"
        print(f"{r['shape']:<18} {r['row']:<20} {r['ours_ms']:>9.3f} {r['base']:>17} {r['base_ms']:>9.3f} {r['ratio']:>6.2f} {diff:>10}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--shapes", default=None,
                        help=f"comma-separated, from {', '.join(SHAPES)} (default: all that fit the device; GPU-only shapes "
                             "run on CPU only when named)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", default=None, help="write the rows and the environment to this file")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.shapes:
        names = [n.strip() for n in args.shapes.split(",") if n.strip()]
        unknown = [n for n in names if n not in SHAPES]
        if unknown:
            parser.error(f"unknown shape(s) {unknown}; known: {list(SHAPES)}")
    else:
        names = [n for n, s in SHAPES.items() if args.device == "cuda" or not s.gpu_only]
    dtype = getattr(torch, args.dtype)

    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
           "dtype": args.dtype, "threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    print(json.dumps(env))
    rows = []
    for name in names:
        shape_rows = bench_shape(SHAPES[name], device=args.device, dtype=dtype, repeats=args.repeats, warmup=args.warmup)
        print_table(shape_rows)
        print()
        rows += shape_rows
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print("ratio = ours / base (median over interleaved repeats); < 1 means ours is faster")
    print_table(rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    # Run as a file (python spec_plugins/bench/drafter_latency.py): put the repository root, not this folder,
    # first on sys.path, so sibling modules here cannot shadow top-level names and spec_plugins resolves.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path[0] = str(REPO_ROOT)
    elif str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
