"""The Triton kernels of spec_plugins.kernels, run on CPU by Triton's interpreter (TRITON_INTERPRET=1), against
their torch references: verification attention over the (G, D) grid with ragged batches, contiguous and
paged KV, KV splits and every output element written; the DSpark walk token for token against
`markov_walk` (vanilla, gated, rnn; full vocabulary and draft_topk); and a dry run of the GPU script.
Shapes are tiny: the interpreter runs every program one after another in numpy."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# triton.jit picks the interpreter when a function is decorated: for triton.language's own helpers that is when
# triton is imported, for the kernels when their modules are. So TRITON_INTERPRET=1 goes first, and it is
# restored right after (and set again while each test runs, see `_interpreter`). That makes Triton interpreted
# for the rest of this process, so it is done only on a machine without CUDA and only if nobody imported
# triton yet; otherwise `test_kernels_in_a_fresh_process` runs this file in a new process.
_before = os.environ.get("TRITON_INTERPRET")
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
try:
    triton = pytest.importorskip("triton", reason="triton is not installed: the Triton kernels cannot be run")
    from triton.runtime.interpreter import InterpretedFunction

    IN_PROCESS = isinstance(triton.language.sum, InterpretedFunction)
    if IN_PROCESS:
        from spec_plugins.kernels import _triton as common_mod
        from spec_plugins.kernels import dspark_walk as walk_mod
        from spec_plugins.kernels import verify_attention as attn_mod

        for _mod in (common_mod, attn_mod, walk_mod):  # the shared module first: the kernels read its switch
            if not _mod.INTERPRET:  # imported earlier by someone else, without the interpreter
                importlib.reload(_mod)
finally:
    if _before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _before

interpreted = pytest.mark.skipif(not IN_PROCESS, reason="Triton is not interpreted in this process (imported "
                                 "before, or a CUDA machine): test_kernels_in_a_fresh_process runs these tests")

from spec_plugins.proposers.dflash.model import grouped_attention  # noqa: E402
from spec_plugins.proposers.dspark.heads import MarkovHead, markov_walk  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _interpreter(one_torch_thread, monkeypatch):
    """One torch thread, and TRITON_INTERPRET=1 while a test runs (triton reads it again at launch)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


# ------------------------------------------------------------------------------------ verification attention


def ragged_batch(drafts, contexts, num_kv_heads, group, head_dim=16, dtype=torch.float32, seed=0):
    """q [total_q, H, hd] for requests with 1 + drafts[r] queries after contexts[r] context tokens, and
    contiguous k, v [total_kv, KV, hd] with their cu_seqlens."""
    gen = torch.Generator().manual_seed(seed)
    q_lens = [1 + d for d in drafts]
    kv_lens = [c + n for c, n in zip(contexts, q_lens)]
    cu_q = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + kv_lens).cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(sum(kv_lens), num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(sum(kv_lens), num_kv_heads, head_dim, generator=gen).to(dtype)
    return q, k, v, cu_q, cu_k


def poisoned(q):
    return torch.full_like(q, float("nan"))


def check_attention(q, k, v, cu_q, cu_k=None, **kw):
    want = attn_mod.verify_attention_reference(q, k, v, cu_q, cu_k, seq_lens_k=kw.get("seq_lens_k"),
                                               block_table=kw.get("block_table"))
    out = poisoned(q)
    got = attn_mod.verify_attention(q, k, v, cu_q, cu_k, out=out, **kw)
    assert got is out
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} output elements never written"
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.float(), want.float(), atol=tol, rtol=tol)


@interpreted
def test_interpreter_is_what_dispatch_runs():
    assert attn_mod.INTERPRET and walk_mod.INTERPRET
    assert attn_mod.use_triton(torch.zeros(1)) and walk_mod.use_triton(torch.zeros(1))


@interpreted
def test_reference_is_grouped_causal_attention():
    """The reference against the drafter's own SDPA path (grouped heads, causal within the last n keys)."""
    q, k, v, cu_q, cu_k = ragged_batch([3], [5], num_kv_heads=2, group=4)
    n, kv_len = 4, 9
    mask = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - n, kv_len)[:, None]
    sdpa = grouped_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask,
                             16 ** -0.5)[0].transpose(0, 1)
    ref = attn_mod.verify_attention_reference(q, k, v, cu_q, cu_k)
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5)


@interpreted
def test_verify_attention_over_groups_and_draft_lengths():
    """G in {1, 4, 8, 16} x D in {0, 1, 3, 7, 15, 31}: each batch is ragged (the other requests have other
    draft lengths, one has no context at all, one a context longer than several KV blocks)."""
    for group in (1, 4, 8, 16):
        for d in (0, 1, 3, 7, 15, 31):
            drafts = [d, (d * 5 + 2) % 32, 0]
            contexts = [37, 0, 5 + d]
            q, k, v, cu_q, cu_k = ragged_batch(drafts, contexts, num_kv_heads=2 if group <= 4 else 1, group=group,
                                               seed=group * 100 + d)
            try:
                check_attention(q, k, v, cu_q, cu_k)
            except AssertionError as err:
                raise AssertionError(f"G={group} D={d}: {err}") from None


@interpreted
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_verify_attention_half_precision(dtype):
    q, k, v, cu_q, cu_k = ragged_batch([7, 0, 15], [20, 3, 40], num_kv_heads=2, group=4, head_dim=32, dtype=dtype)
    check_attention(q, k, v, cu_q, cu_k)


@interpreted
def test_verify_attention_splits_and_tiles():
    """KV splits (the last split of a tile merges) and tile sizes that cut a token's heads across tiles."""
    q, k, v, cu_q, cu_k = ragged_batch([15, 2, 31], [70, 1, 33], num_kv_heads=1, group=8)
    for config in ({"num_splits": 3}, {"block_m": 32, "block_n": 32, "num_splits": 2}):
        check_attention(q, k, v, cu_q, cu_k, **config)


@interpreted
def test_verify_attention_paged_kv():
    """Pages of 8 positions in a shuffled pool; the last page of each request only partly used."""
    drafts, contexts, kv_heads, group, hd, page = [3, 15, 0], [29, 2, 12], 2, 4, 16, 8
    q, k_flat, v_flat, cu_q, cu_k = ragged_batch(drafts, contexts, kv_heads, group, hd, torch.bfloat16, seed=3)
    lens = (cu_k[1:] - cu_k[:-1]).tolist()
    pages_per = [-(-n // page) for n in lens]
    pool = torch.randperm(sum(pages_per) + 3, generator=torch.Generator().manual_seed(1))
    k = torch.randn(len(pool), page, kv_heads, hd).to(torch.bfloat16)
    v = torch.randn(len(pool), page, kv_heads, hd).to(torch.bfloat16)
    table = torch.zeros(len(lens), max(pages_per) + 1, dtype=torch.int32)
    used = 0
    for r, n in enumerate(lens):
        for p in range(pages_per[r]):
            blk = int(pool[used])
            used += 1
            table[r, p] = blk
            rows = slice(int(cu_k[r]) + p * page, min(int(cu_k[r]) + (p + 1) * page, int(cu_k[r + 1])))
            m = rows.stop - rows.start
            k[blk, :m], v[blk, :m] = k_flat[rows], v_flat[rows]
    seq = torch.tensor(lens, dtype=torch.int32)
    contiguous = attn_mod.verify_attention_reference(q, k_flat, v_flat, cu_q, cu_k)
    paged = attn_mod.verify_attention_reference(q, k, v, cu_q, seq_lens_k=seq, block_table=table)
    torch.testing.assert_close(paged, contiguous, atol=0, rtol=0)
    for splits in (1, 2):
        check_attention(q, k, v, cu_q, seq_lens_k=seq, block_table=table, num_splits=splits)


@interpreted
def test_verify_attention_rejects_bad_inputs():
    q, k, v, cu_q, cu_k = ragged_batch([1], [3], num_kv_heads=2, group=2)
    cases = [
        (dict(q=q.double()), "q must be float16, bfloat16 or float32"),
        (dict(k=k[:, :1]), "k and v must have the same shape"),
        (dict(q=q[:, :3]), r"num_q_heads \(3\) must be a multiple of num_kv_heads \(2\)"),
        (dict(cu_k=None), "exactly one of cu_seqlens_k"),
        (dict(cu_q=cu_q.float()), "cu_seqlens_q must be int32 or int64"),
        (dict(cu_k=cu_k[:-1]), r"cu_seqlens_k must have shape \(2,\)"),
        (dict(out=torch.empty(2, 4, 8)), "out must match q"),
    ]
    for change, message in cases:
        args = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, out=None) | change
        with pytest.raises(ValueError, match=message):
            attn_mod.verify_attention(args["q"], args["k"], args["v"], args["cu_q"], args["cu_k"], out=args["out"])
    q24, k24, v24, cu_q24, cu_k24 = ragged_batch([1], [3], num_kv_heads=1, group=1, head_dim=24)
    with pytest.raises(ValueError, match=r"head_dim must be a power of two in \[16, 256\]"):
        attn_mod.verify_attention_triton(q24, k24, v24, cu_q24, cu_k24)


# ------------------------------------------------------------------------------------------------ DSpark walk


def walk_inputs(head_type, batch=2, g=5, vocab=96, rank=12, d=16, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    markov = MarkovHead(vocab, rank, d, head_type).eval()
    with torch.no_grad():
        for p in markov.parameters():  # a bias strong enough to move the argmax away from the backbone's
            p.normal_(0, 1.0)
    markov = markov.to(dtype)
    hidden = torch.randn(batch, g, d).to(dtype)
    base = (torch.randn(batch, g, vocab) * 3).to(dtype)
    anchor = torch.randint(0, vocab, (batch,))
    return hidden, base, anchor, markov


@interpreted
@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_walk_matches_markov_walk(head_type):
    hidden, base, anchor, markov = walk_inputs(head_type)
    plain = base.float().argmax(-1)
    for topk in (None, 1, 5, 96):  # 96 = vocab: no restriction, the full-vocabulary kernel (64-wide tiles)
        want = markov_walk(hidden, base, anchor, markov, None, 0.0, draft_topk=topk).tokens
        got = walk_mod.dspark_walk(hidden, base, anchor, markov, topk)
        assert got.dtype == torch.int64 and torch.equal(got, want), f"draft_topk={topk}:\n{got}\n{want}"
        if topk != 1:  # the head really steers the walk in these inputs (else the test proves little)
            assert not torch.equal(want, plain)


@interpreted
@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
def test_fused_walk_block_is_the_walk(head_type):
    """walk_block with the kernel (opt-in): the kernel's tokens and one teacher-forced pass give the walk's
    WalkResult -- tokens, logits (draft_topk mask included), one-hot proposal and confidences."""
    from spec_plugins.proposers.dspark.heads import ConfidenceHead, walk_block

    hidden, base, anchor, markov = walk_inputs(head_type)
    confidence = ConfidenceHead(hidden.shape[-1], markov.rank).eval()
    for topk in (None, 5):
        want = markov_walk(hidden, base, anchor, markov, confidence, 0.0, draft_topk=topk)
        got = walk_block(hidden, base, anchor, markov, confidence, 0.0, draft_topk=topk, fused=True)
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.probs, want.probs)
        torch.testing.assert_close(got.logits, want.logits)
        torch.testing.assert_close(got.confidence_logits, want.confidence_logits)
    # A sampled block takes the walk itself (the kernel is greedy): the same draws from the same generator.
    want = markov_walk(hidden, base, anchor, markov, confidence, 1.0, torch.Generator().manual_seed(3))
    got = walk_block(hidden, base, anchor, markov, confidence, 1.0, torch.Generator().manual_seed(3), fused=True)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.probs, want.probs)


@interpreted
def test_fused_walk_default_is_cuda_only(monkeypatch):
    """fused=None takes the kernel only for CUDA tensors (never the interpreter for CPU tensors, which would
    slow every CPU drafter down), and SPEC_PLUGINS_FUSED_WALK=0 turns it off; fused=True takes it."""
    from spec_plugins.proposers.dspark import heads

    hidden, base, anchor, markov = walk_inputs("vanilla")
    calls = []
    monkeypatch.setattr(walk_mod, "dspark_walk", lambda *a, **k: calls.append(1) or markov_walk(*a[:4], None, 0.0).tokens)
    for env in ("1", "0", None):
        if env is None:
            monkeypatch.delenv(heads.FUSED_WALK_ENV, raising=False)
        else:
            monkeypatch.setenv(heads.FUSED_WALK_ENV, env)
        heads.walk_block(hidden, base, anchor, markov)
    assert calls == []
    heads.walk_block(hidden, base, anchor, markov, fused=True)
    assert calls == [1]


@interpreted
def test_walk_matches_in_bfloat16_and_with_wide_chunks():
    """bf16 head and logits (the bias rounded to bf16 before the add, as nn.Linear's output is), a rank that
    is a power of two, and vocabulary chunks of other sizes."""
    hidden, base, anchor, markov = walk_inputs("vanilla", g=4, vocab=160, rank=16, dtype=torch.bfloat16)
    for topk, config in ((None, {"block_v": 128}), (4, {"block_v": 32}), (4, {"block_v": 512})):
        want = markov_walk(hidden, base, anchor, markov, None, 0.0, draft_topk=topk).tokens
        assert torch.equal(walk_mod.dspark_walk(hidden, base, anchor, markov, topk, **config), want), (topk, config)


@interpreted
def test_walk_topk_paths():
    """The walking program with each position's candidates loaded per step (preload=False: large k or long
    blocks) and with wider sub-blocks; k = 1 (a plain argmax of the backbone) and a k past 16."""
    hidden, base, anchor, markov = walk_inputs("gated", vocab=80)
    for topk, config in ((5, {"preload": False}), (3, {"sub_block": 16, "block_v": 64}), (1, {}), (17, {})):
        want = markov_walk(hidden, base, anchor, markov, None, 0.0, draft_topk=topk).tokens
        assert torch.equal(walk_mod.dspark_walk(hidden, base, anchor, markov, topk, **config), want), (topk, config)
    assert torch.equal(walk_mod.dspark_walk(hidden, base, anchor, markov, 1), base.argmax(-1))


@interpreted
def test_walk_breaks_ties_like_argmax():
    """Integer logits and a zero head: every position is a tie, settled towards the smallest token id."""
    hidden, base, anchor, markov = walk_inputs("vanilla", vocab=150)
    with torch.no_grad():
        markov.markov_w2.weight.zero_()
    base = torch.randint(0, 3, base.shape).float()
    want = markov_walk(hidden, base, anchor, markov, None, 0.0).tokens
    assert torch.equal(walk_mod.dspark_walk(hidden, base, anchor, markov), want)
    assert torch.equal(walk_mod.dspark_walk(hidden, base, anchor, None), base.argmax(-1))


@interpreted
def test_walk_rejects_bad_inputs():
    hidden, base, anchor, markov = walk_inputs("vanilla", vocab=50)
    with pytest.raises(ValueError, match=r"base_logits must be \[batch, g, vocab\]"):
        walk_mod.dspark_walk(hidden, base[0], anchor, markov)
    with pytest.raises(ValueError, match=r"anchor must be integer token ids \[batch=2\]"):
        walk_mod.dspark_walk(hidden, base, anchor.float(), markov)
    with pytest.raises(ValueError, match=r"base_logits' vocab \(40\) must be markov_w2's out_features \(50\)"):
        walk_mod.dspark_walk(hidden, base[..., :40], anchor, markov)
    with pytest.raises(ValueError, match="draft_topk must be >= 1"):
        walk_mod.dspark_walk(hidden, base, anchor, markov, 0)
    big = walk_inputs("vanilla", batch=1, g=1, vocab=600)
    with pytest.raises(ValueError, match="draft_topk must be <= 256 for the kernel"):
        walk_mod.dspark_walk(*big, 300)


# ------------------------------------------------------------------------------------------------- GPU script


@interpreted
def test_gpu_script_dry_run(tmp_path):
    """benchmarks/gpu_kernels.py --dry-run: the whole script on tiny CPU shapes through the interpreter."""
    env = dict(os.environ, OUT=str(tmp_path), TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_kernels.py", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_kernels.json").read_text())
    assert report["dry_run"] and report["correctness"] and all(c["ok"] for c in report["correctness"])
    assert (tmp_path / "gpu_kernels.md").read_text().startswith("#")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA this would run the whole benchmark")
def test_gpu_script_without_cuda_says_so_in_one_line(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, "benchmarks/gpu_kernels.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout.count("\n") == 1 and "no CUDA device" in proc.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(IN_PROCESS, reason="the kernel tests ran in this process")
def test_kernels_in_a_fresh_process():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
