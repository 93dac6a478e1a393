"""GPU check of spec_plugins.kernels: correctness against the torch references, then timings (one run, < 5 min).

Verification attention (Llama-3.1-8B attention: 32 query heads, head_dim 128; G = 32 / num_kv_heads in
{1, 4, 8, 16}) for D in {0, 1, 3, 7, 15, 31} at batch 8 and 32, in two batch shapes: `uniform` (every request
drafts D, context 2048) and `ragged` (D_r drawn from 0..D with one request at D, contexts 1024..4096). Ours
against
  sdpa   torch scaled_dot_product_attention on the batch padded to its longest query block (1 + D) and KV,
         the G query heads of a KV head stacked along the query axis (as the drafter's grouped_attention
         does, no K/V copies) and a boolean mask for causal-within-block; padding done before timing;
  flash  flash_attn_varlen_func(causal=True) on the same ragged layout as ours, when flash_attn imports.
DSpark walk (Qwen3-8B-sized drafter: hidden 4096, vocab 151936, Markov rank 64, block g = 16, bf16) at batch
8: ours (one launch) against the torch walk (`markov_walk`, greedy) and against a DFlash step (one batched
argmax over the vocabulary for the block), per head type, full vocabulary and draft_topk = 8; then the
drafter's whole greedy block (`walk_block`, with a confidence head) fused or not. Then a few kernel
configurations at the target shapes (what to change if a target is missed). Order, after 3 s that bring the
GPU's clocks up: walk, block, uniform grid, configurations, ragged grid; a time budget skips what is left
(listed in the report).

Correctness: attention within bf16 tolerance of the fp32 reference (SDPA's too, which checks the baseline's
mask); walk tokens identical to `markov_walk` with an fp32 head, and with the bf16 heads each drafted token
within 0.05 of the best torch logit along the kernel's own path (a near-tie may round either way).

    python benchmarks/gpu_kernels.py              # on a CUDA machine, from the repository root
    python benchmarks/gpu_kernels.py --dry-run    # tiny shapes on CPU through TRITON_INTERPRET=1 (smoke test)

Writes $OUT/gpu_kernels.json and $OUT/gpu_kernels.md (OUT defaults to ./gpu_kernels_out). Needs torch and
triton only (flash_attn optional); works from a bare checkout (the kernels and the torch walk are imported
from the source tree when spec-plugins is not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 270.0  # stop starting new measurements past this (the whole run stays under 5 minutes)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through TRITON_INTERPRET=1")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_kernels_out"), help="output folder ($OUT)")
    return ap.parse_args()


def import_kernels():
    """(verify_attention module, dspark_walk module, heads module of the DSpark proposer): from the
    installed package, else from the source tree without running the package __init__s (which pull in the
    rest of the project's dependencies)."""
    try:
        from spec_plugins.kernels import dspark_walk, verify_attention
        from spec_plugins.proposers.dspark import heads
    except ImportError:
        for name in [m for m in sys.modules if m == "spec_plugins" or m.startswith("spec_plugins.")]:
            del sys.modules[name]
        for name, path in (("spec_plugins", [ROOT / "spec_plugins", ROOT]), ("spec_plugins.proposers", [ROOT / "proposers"]),
                           ("spec_plugins.proposers.dflash", [ROOT / "proposers" / "dflash"]),
                           ("spec_plugins.proposers.dspark", [ROOT / "proposers" / "dspark"])):
            module = types.ModuleType(name)
            module.__path__ = [str(p) for p in path]
            sys.modules[name] = module
        from spec_plugins.kernels import dspark_walk, verify_attention
        from spec_plugins.proposers.dspark import heads
    return verify_attention, dspark_walk, heads


class Timer:
    """Median milliseconds: triton.testing.do_bench (CUDA events, cache flushed) on GPU, wall clock on CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def __call__(self, fn) -> float:
        if self.cuda:
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median"))
        times = []
        for _ in range(1):  # CPU: a smoke test of the code path, not a measurement
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


# --------------------------------------------------------------------------------------------- attention


def attention_batch(torch, batch, draft, group, mode, shape, device, gen):
    num_q_heads, head_dim = shape["q_heads"], shape["head_dim"]
    num_kv_heads = num_q_heads // group
    if mode == "uniform":
        drafts = [draft] * batch
        contexts = [shape["context"]] * batch
    else:
        drafts = torch.randint(0, draft + 1, (batch,), generator=gen).tolist()
        drafts[0] = draft
        contexts = torch.randint(shape["context_lo"], shape["context_hi"] + 1, (batch,), generator=gen).tolist()
    q_lens = [1 + d for d in drafts]
    kv_lens = [c + n for c, n in zip(contexts, q_lens)]
    cu_q = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + kv_lens, device=device).cumsum(0).to(torch.int32)
    dtype, dgen = shape["dtype"], shape["device_generator"]
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=dgen, device=device).to(dtype)
    k = torch.randn(sum(kv_lens), num_kv_heads, head_dim, generator=dgen, device=device).to(dtype)
    v = torch.randn(sum(kv_lens), num_kv_heads, head_dim, generator=dgen, device=device).to(dtype)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, q_lens=q_lens, kv_lens=kv_lens, group=group)


def sdpa_inputs(torch, b):
    """The engines' baseline layout: padded to the longest query block and KV, grouped heads stacked."""
    q, k, v, group = b["q"], b["k"], b["v"], b["group"]
    n, L = max(b["q_lens"]), max(b["kv_lens"])
    batch, kv_heads, hd = len(b["q_lens"]), k.shape[1], q.shape[2]
    qp = q.new_zeros(batch, kv_heads, group * n, hd)
    kp = k.new_zeros(batch, kv_heads, L, hd)
    vp = v.new_zeros(batch, kv_heads, L, hd)
    mask = torch.zeros(batch, 1, group * n, L, dtype=torch.bool, device=q.device)
    cq, ck = b["cu_q"].tolist(), b["cu_k"].tolist()
    for r in range(batch):
        nr, lr = b["q_lens"][r], b["kv_lens"][r]
        # [n_r, H, hd] -> [KV, G * n, hd]: head h = kv * G + g, rows g * n + i (grouped_attention's order)
        qr = q[cq[r] : cq[r + 1]].view(nr, kv_heads, group, hd).permute(1, 2, 0, 3)
        qp[r].view(kv_heads, group, n, hd)[:, :, :nr] = qr
        kp[r, :, :lr] = k[ck[r] : ck[r + 1]].transpose(0, 1)
        vp[r, :, :lr] = v[ck[r] : ck[r + 1]].transpose(0, 1)
        i = torch.arange(n, device=q.device)
        vis = torch.arange(L, device=q.device)[None, :] <= (lr - nr + torch.clamp(i, max=nr - 1))[:, None]
        mask[r, 0] = vis.repeat(group, 1)  # padded query rows see real keys only: no NaN rows
    return qp, kp, vp, mask


def sdpa_unpack(torch, out_p, b):
    q, group = b["q"], b["group"]
    kv_heads, hd = b["k"].shape[1], q.shape[2]
    n = max(b["q_lens"])
    out = torch.empty_like(q)
    cq = b["cu_q"].tolist()
    for r, nr in enumerate(b["q_lens"]):
        rows = out_p[r].view(kv_heads, group, n, hd)[:, :, :nr]  # [KV, G, n_r, hd]
        out[cq[r] : cq[r + 1]] = rows.permute(2, 0, 1, 3).reshape(nr, kv_heads * group, hd)
    return out


def run_attention(env, report, deadline, mode):
    torch, attn, timer = env["torch"], env["attn"], env["timer"]
    F = torch.nn.functional
    dry = env["dry"]
    device = "cpu" if dry else "cuda"
    shape = dict(env["attn_shape"])
    if dry:
        grid = dict(groups=(1, 4), drafts=(0, 3), batches=(2,))
    else:
        grid = dict(groups=(1, 4, 8, 16), drafts=(0, 1, 3, 7, 15, 31), batches=(8, 32))
    flash = None
    if not dry:
        try:
            from flash_attn import flash_attn_varlen_func as flash
        except Exception:  # noqa: BLE001 - any import problem means: no FlashAttention row
            flash = None
    report["flash_attn"] = flash is not None
    gen = torch.Generator().manual_seed(0)  # lengths
    shape["device_generator"] = torch.Generator(device=device).manual_seed(0)  # tensors, made where they are used
    tol = 3e-2 if shape["dtype"] == torch.bfloat16 else 1e-4
    for batch in grid["batches"]:
        for group in grid["groups"]:
            for draft in grid["drafts"]:
                label = f"attention {mode} B={batch} G={group} D={draft}"
                if time.monotonic() > deadline:
                    report["skipped"].append(label)
                    continue
                row = dict(kernel="verify_attention", mode=mode, batch=batch, G=group, D=draft,
                           q_heads=shape["q_heads"], kv_heads=shape["q_heads"] // group, head_dim=shape["head_dim"])
                try:
                    b = attention_batch(torch, batch, draft, group, mode, shape, device, gen)
                    row["total_q"], row["max_kv"] = int(b["q"].shape[0]), max(b["kv_lens"])
                    ref = attn.verify_attention_reference(b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"])
                    ours = lambda: attn.verify_attention(b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"])  # noqa: E731
                    check = dict(check=label, max_abs_err=(ours().float() - ref.float()).abs().max().item())
                    qp, kp, vp, mask = sdpa_inputs(torch, b)
                    sdpa = lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)  # noqa: E731
                    check["sdpa_max_abs_err"] = (sdpa_unpack(torch, sdpa(), b).float() - ref.float()).abs().max().item()
                    if flash is not None:
                        nq, nk = max(b["q_lens"]), max(b["kv_lens"])
                        fa = lambda: flash(b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"], nq, nk, causal=True)  # noqa: E731
                        check["flash_max_abs_err"] = (fa().float() - ref.float()).abs().max().item()
                    check["ok"] = check["max_abs_err"] <= tol and check["sdpa_max_abs_err"] <= tol
                    report["correctness"].append(check)
                    row["ours_ms"] = timer(ours)
                    row["sdpa_ms"] = timer(sdpa)
                    row["sdpa_over_ours"] = row["sdpa_ms"] / row["ours_ms"]
                    if flash is not None:
                        row["flash_ms"] = timer(fa)
                        row["flash_over_ours"] = row["flash_ms"] / row["ours_ms"]
                except Exception as exc:  # noqa: BLE001 - one failing cell must not lose the rest of the run
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                    report["correctness"].append(dict(check=label, ok=False, error=row["error"]))
                report["attention"].append(row)
                print_row(env, row)


# ------------------------------------------------------------------------------------------------- walk


def walk_consistent(torch, hidden, base, anchor, markov, tokens, topk, tol):
    """Each token is (within `tol`) the argmax of the torch logits along the kernel's own path: the check
    for half-precision heads, where a near-tie may round either way."""
    prev = torch.cat([anchor[:, None], tokens[:, :-1]], dim=1)
    logits = base.float() + markov.block_bias(hidden, prev).float()  # the walk's fp32 add, teacher-forced
    if topk is not None:
        keep = base.float().topk(topk, dim=-1).indices
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, keep, logits.gather(-1, keep))
    chosen = logits.gather(-1, tokens[..., None]).squeeze(-1)
    return bool((chosen >= logits.max(-1).values - tol).all())


def walk_case(env, head_type, dtype, gen):
    """A random Markov head and block inputs (bias and backbone logits of similar spread, so both matter)."""
    torch, MarkovHead = env["torch"], env["heads"].MarkovHead
    device = "cpu" if env["dry"] else "cuda"
    batch, g, vocab, hidden_size, rank = env["walk_shape"]
    markov = MarkovHead(vocab, rank, hidden_size, head_type).to(device, dtype).eval()
    for p in markov.parameters():
        p.copy_(torch.randn(p.shape, generator=gen).to(device, dtype) * (0.5 if p.dim() > 1 else 0.1))
    hidden = torch.randn(batch, g, hidden_size, generator=gen).to(device, dtype) / hidden_size**0.5
    base = (torch.randn(batch, g, vocab, generator=gen) * 2.0).to(device, dtype)
    anchor = torch.randint(0, vocab, (batch,), generator=gen).to(device)
    return hidden, base, anchor, markov


def run_walk(env, report, deadline):
    torch, walk, timer, heads = env["torch"], env["walk"], env["timer"], env["heads"]
    markov_walk = heads.markov_walk
    batch, g, vocab, hidden_size, rank = env["walk_shape"]
    gen = torch.Generator().manual_seed(0)
    # bf16 (deployed; timed, checked along the kernel's own path) for every head; fp32 (exact tokens) for vanilla.
    cases = [("vanilla", torch.bfloat16), ("vanilla", torch.float32), ("gated", torch.bfloat16), ("rnn", torch.bfloat16)]
    if env["dry"]:
        cases = [(h, torch.float32) for h in ("vanilla", "gated", "rnn")]
    for head_type, dtype in cases:
        hidden, base, anchor, markov = walk_case(env, head_type, dtype, gen)
        for topk in (None, 8):
            name = str(dtype).removeprefix("torch.")
            label = f"walk {head_type} {name} topk={topk}"
            if time.monotonic() > deadline:
                report["skipped"].append(label)
                continue
            row = dict(kernel="dspark_walk", head=head_type, dtype=name, draft_topk=topk, batch=batch, g=g,
                       vocab=vocab, hidden=hidden_size, rank=rank)
            try:
                ref = lambda: markov_walk(hidden, base, anchor, markov, None, 0.0, draft_topk=topk).tokens  # noqa: E731
                ours = lambda: walk.dspark_walk(hidden, base, anchor, markov, topk)  # noqa: E731
                want, got = ref(), ours()
                match = float((want == got).float().mean())
                exact = dtype == torch.float32
                consistent = walk_consistent(torch, hidden, base, anchor, markov, got, topk, 0.0 if exact else 0.05)
                report["correctness"].append(dict(check=label, token_match=match, consistent=consistent,
                                                  ok=match == 1.0 if exact else consistent))
                row["token_match"] = match
                if not exact or env["dry"]:
                    row["ours_ms"] = timer(ours)
                    row["torch_walk_ms"] = timer(ref)
                    row["dflash_step_ms"] = timer(lambda: base.argmax(-1))
                    row["ours_over_dflash"] = row["ours_ms"] / row["dflash_step_ms"]
                    row["torch_over_ours"] = row["torch_walk_ms"] / row["ours_ms"]
            except Exception as exc:  # noqa: BLE001 - one failing cell must not lose the rest of the run
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                report["correctness"].append(dict(check=label, ok=False, error=row["error"]))
            if "ours_ms" in row or "error" in row:
                report["walk"].append(row)
                print_row(env, row)


def run_block(env, report, deadline):
    """The drafter's whole greedy block as `walk_block` gives it (tokens, logits, one-hot proposal and a
    confidence head's logits), fused (the kernel plus one teacher-forced pass) against the torch walk: what
    choosing the kernel by default changes for a DSpark drafter."""
    torch, timer, heads = env["torch"], env["timer"], env["heads"]
    batch, g, vocab, hidden_size, rank = env["walk_shape"]
    gen = torch.Generator().manual_seed(3)
    dtype = torch.float32 if env["dry"] else torch.bfloat16
    for head_type in ("vanilla", "gated", "rnn"):
        hidden, base, anchor, markov = walk_case(env, head_type, dtype, gen)
        confidence = heads.ConfidenceHead(hidden_size, rank).to(hidden.device, dtype).eval()
        for topk in (None, 8):
            label = f"block {head_type} topk={topk}"
            if time.monotonic() > deadline:
                report["skipped"].append(label)
                continue
            row = dict(kernel="walk_block", head=head_type, draft_topk=topk, batch=batch, g=g)
            try:
                fused = lambda: heads.walk_block(hidden, base, anchor, markov, confidence, 0.0,  # noqa: E731
                                                 draft_topk=topk, fused=True)
                plain = lambda: heads.walk_block(hidden, base, anchor, markov, confidence, 0.0,  # noqa: E731
                                                 draft_topk=topk, fused=False)
                row["token_match"] = float((fused().tokens == plain().tokens).float().mean())
                row["fused_ms"], row["torch_ms"] = timer(fused), timer(plain)
                row["torch_over_fused"] = row["torch_ms"] / row["fused_ms"]
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            report["block"].append(row)
            print_row(env, row)


def warm_up(torch, seconds: float) -> None:
    """Bring the GPU's clocks up before anything is timed (an idle H200 sits at 345 MHz)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def run_tuning(env, report, deadline):
    """A few kernel configurations at the target shapes (checked, then timed): what to change if a target
    is missed. Runs last, within what is left of the time budget."""
    torch, attn, walk, timer = env["torch"], env["attn"], env["walk"], env["timer"]
    dry = env["dry"]
    device = "cpu" if dry else "cuda"
    shape = dict(env["attn_shape"])
    shape["device_generator"] = torch.Generator(device=device).manual_seed(1)
    gen = torch.Generator().manual_seed(1)
    if dry:
        cells, configs = [("uniform", 2, 4, 3)], [{}, {"num_splits": 2}]
    else:
        cells = [("uniform", 8, 8, 15), ("uniform", 32, 8, 15), ("uniform", 8, 8, 0)]
        configs = [{}, {"num_splits": 1}, {"num_splits": 2}, {"num_splits": 8}, {"block_n": 32}, {"block_m": 64},
                   {"num_stages": 2}]
    for mode, batch, group, draft in cells:
        b = attention_batch(torch, batch, draft, group, mode, shape, device, gen)
        ref = attn.verify_attention_reference(b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"])
        for config in configs:
            label = f"tune attention B={batch} G={group} D={draft} {config or 'default'}"
            if time.monotonic() > deadline:
                report["skipped"].append(label)
                continue
            row = dict(kernel="tuning", target="verify_attention", cell=f"B={batch} G={group} D={draft}",
                       config=json.dumps(config))
            try:
                fn = lambda: attn.verify_attention(b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"], **config)  # noqa: E731
                row["max_abs_err"] = (fn().float() - ref.float()).abs().max().item()
                row["ms"] = timer(fn)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            report["tuning"].append(row)
            print_row(env, row)
    walk_configs = [(None, {"block_v": 256}), (None, {"num_warps": 8}), (8, {"block_v": 4096}),
                    (8, {"block_v": 65536}), (8, {"sub_block": 128}), (8, {"preload": True}), (8, {"preload": False})]
    cases = [("vanilla", topk, config) for topk, config in (walk_configs[:2] if dry else walk_configs)]
    if not dry:  # the top-k walk with its candidates' rows preloaded into registers or not, for every head
        cases += [(head, 8, {"preload": flag}) for head in ("gated", "rnn") for flag in (True, False)]
    inputs = {}
    for head, topk, config in cases:
        if head not in inputs:
            gen = torch.Generator().manual_seed(2)
            inputs[head] = walk_case(env, head, torch.float32 if dry else torch.bfloat16, gen)
        hidden, base, anchor, markov = inputs[head]
        label = f"tune walk {head} topk={topk} {config}"
        if time.monotonic() > deadline:
            report["skipped"].append(label)
            continue
        row = dict(kernel="tuning", target="dspark_walk", cell=f"{head} topk={topk}", config=json.dumps(config))
        try:
            fn = lambda: walk.dspark_walk(hidden, base, anchor, markov, topk, **config)  # noqa: E731
            want = env["heads"].markov_walk(hidden, base, anchor, markov, None, 0.0, draft_topk=topk).tokens
            row["token_match"] = float((fn() == want).float().mean())
            row["ms"] = timer(fn)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        report["tuning"].append(row)
        print_row(env, row)


# ---------------------------------------------------------------------------------------------- output


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


ATTN_COLS = ["mode", "batch", "G", "D", "total_q", "max_kv", "ours_ms", "sdpa_ms", "sdpa_over_ours", "flash_ms",
             "flash_over_ours", "error"]
WALK_COLS = ["head", "dtype", "draft_topk", "batch", "g", "token_match", "ours_ms", "torch_walk_ms",
             "dflash_step_ms", "ours_over_dflash", "torch_over_ours", "error"]


BLOCK_COLS = ["head", "draft_topk", "batch", "g", "token_match", "fused_ms", "torch_ms", "torch_over_fused", "error"]
TUNE_COLS = ["target", "cell", "config", "ms", "max_abs_err", "token_match", "error"]


def print_row(env, row) -> None:
    cols = {"verify_attention": ATTN_COLS, "dspark_walk": WALK_COLS, "walk_block": BLOCK_COLS}.get(row["kernel"], TUNE_COLS)
    print(row["kernel"] + "  " + "  ".join(f"{c}={fmt(row.get(c))}" for c in cols if row.get(c) is not None), flush=True)


def targets(report) -> list[dict]:
    """The issue's targets, checked on what was measured (geometric mean over the cells of each)."""

    def gmean(values):
        values = [v for v in values if v]
        return statistics.geometric_mean(values) if values else None

    attn = [r for r in report["attention"] if "ours_ms" in r]
    walk = [r for r in report["walk"] if "ours_ms" in r and r["head"] == "vanilla"]
    out = []
    for draft, groups, goal, text in ((15, (8,), 1.3, "attention >= 1.3x SDPA at G = 8, D = 15"),
                                      (0, (8,), 1.0, "attention no slower than SDPA at G = 8, D = 0"),
                                      (0, (1, 4, 8, 16), 1.0, "attention no slower than SDPA at D = 0, every G")):
        cells = [r["sdpa_over_ours"] for r in attn if r["D"] == draft and r["G"] in groups]
        got = gmean(cells)
        out.append(dict(target=text + " (SDPA ms / ours ms)", measured=got, cells=len(cells),
                        met=None if got is None else got >= goal))
    for topk in (None, 8):
        got = gmean([r["ours_over_dflash"] for r in walk if r["draft_topk"] == topk])
        out.append(dict(target=f"walk (vanilla, draft_topk={topk}) <= 1.2x a DFlash step at batch 8 (ours / step)",
                        measured=got, cells=1, met=None if got is None else got <= 1.2))
    return out


def markdown(report) -> str:
    lines = [f"# spec_plugins.kernels on {report['device']}", "",
             f"torch {report['torch']}, triton {report['triton']}, flash_attn: {report['flash_attn']}, "
             f"dry run: {report['dry_run']}, {report['seconds']:.0f} s", "", "## Targets", "",
             "Geometric means over the measured cells (both batch sizes, uniform and ragged batches).", "",
             "| target | measured | cells | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {fmt(t['measured'])} | {t['cells']} | {t['met']} |" for t in report["targets"]]
    bad = [c for c in report["correctness"] if not c["ok"]]
    lines += ["", f"## Correctness: {len(report['correctness']) - len(bad)}/{len(report['correctness'])} checks pass", ""]
    lines += [f"- FAIL {c['check']}: {json.dumps({k: v for k, v in c.items() if k != 'check'})}" for c in bad]
    for title, rows, cols in (("Verification attention (ms; ratios > 1: ours faster)", report["attention"], ATTN_COLS),
                              ("DSpark walk (ms; ours_over_dflash: target <= 1.2)", report["walk"], WALK_COLS),
                              ("The drafter's greedy block, `walk_block` fused or not (ms)", report["block"], BLOCK_COLS),
                              ("Kernel configurations at the target shapes", report["tuning"], TUNE_COLS)):
        lines += ["", f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    if report["skipped"]:
        lines += ["", f"Skipped (time budget): {', '.join(report['skipped'])}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    args = parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported (triton.jit reads it then)
    try:
        import torch
        import triton
    except ImportError as exc:
        print(f"gpu_kernels: needs torch and triton ({exc})")
        return 1
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device here; run it on the GPU machine, or use --dry-run for a CPU smoke test")
        return 1
    attn, walk, heads = import_kernels()
    if args.dry_run:
        torch.set_num_threads(1)
    torch.set_grad_enabled(False)  # the torch walk is timed as inference, like ours
    start = time.monotonic()
    env = dict(torch=torch, attn=attn, walk=walk, heads=heads,
               timer=Timer(cuda=not args.dry_run), dry=args.dry_run)
    if args.dry_run:
        env["attn_shape"] = dict(q_heads=4, head_dim=16, context=24, context_lo=8, context_hi=40, dtype=torch.float32)
        env["walk_shape"] = (2, 3, 100, 32, 16)  # batch, g, vocab, hidden, rank
    else:  # Llama-3.1-8B attention; a Qwen3-8B-sized DSpark drafter
        env["attn_shape"] = dict(q_heads=32, head_dim=128, context=2048, context_lo=1024, context_hi=4096,
                                 dtype=torch.bfloat16)
        env["walk_shape"] = (8, 16, 151936, 4096, 64)
    device = "cpu (TRITON_INTERPRET=1)" if args.dry_run else torch.cuda.get_device_name()
    report = dict(device=device, torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                  dry_run=args.dry_run, correctness=[], attention=[], walk=[], block=[], tuning=[], skipped=[])
    print(f"gpu_kernels on {device}: torch {torch.__version__}, triton {triton.__version__}", flush=True)
    # The walk first: it is short, and its cooperative launch is the part most worth seeing on real hardware.
    # Most important first (the budget may cut the end): the walk, the uniform attention grid (the targets'
    # cells), configurations at the target shapes, then the ragged grid.
    if not args.dry_run:
        warm_up(torch, 3.0)
    run_walk(env, report, start + BUDGET_S)
    run_block(env, report, start + BUDGET_S)
    run_attention(env, report, start + BUDGET_S, "uniform")
    run_tuning(env, report, start + BUDGET_S)
    run_attention(env, report, start + BUDGET_S, "ragged")
    report["seconds"] = time.monotonic() - start
    report["targets"] = targets(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_kernels.json").write_text(json.dumps(report, indent=1, default=str))
    md = markdown(report)
    (out / "gpu_kernels.md").write_text(md)
    print()
    print(md)
    print(f"wrote {out / 'gpu_kernels.json'} and {out / 'gpu_kernels.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
