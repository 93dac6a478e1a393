"""The GPU step-profile stack (spec_plugins.bench.stack_profile), checked on the CPU at toy sizes."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from spec_plugins.bench import stack_profile as sp

CONFIG = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
          "num_key_value_heads": 2, "vocab_size": 50, "rms_norm_eps": 1e-5}


def _reference_step(stack: sp.DecoderStack, x: torch.Tensor, batch: int, new: int) -> torch.Tensor:
    """The same layer written the plain way: SDPA with enable_gqa over the cache plus the new rows."""
    s, ctx = stack.s, stack.context
    hd, kvh = s["head_dim"], s["kv_heads"]
    for w in stack.layers:
        h = F.rms_norm(x, (x.shape[-1],), w["n1"], s["eps"])
        q, k, v = (h @ w["wqkv"].T).split([s["heads"] * hd, kvh * hd, kvh * hd], dim=-1)
        keys = torch.cat([w["k"][:batch, :, :ctx], k.view(batch, new, kvh, hd).transpose(1, 2)], dim=2)
        values = torch.cat([w["v"][:batch, :, :ctx], v.view(batch, new, kvh, hd).transpose(1, 2)], dim=2)
        o = F.scaled_dot_product_attention(q.view(batch, new, s["heads"], hd).transpose(1, 2), keys, values,
                                           enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(batch * new, -1) @ w["wo"].T
        h = F.rms_norm(x, (x.shape[-1],), w["n2"], s["eps"])
        gate, up = (h @ w["w13"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ w["w2"].T
    return F.rms_norm(x, (x.shape[-1],), stack.norm, s["eps"]) @ stack.lm_head.T


@pytest.mark.parametrize("batch, draft", [(1, 0), (3, 4)])
def test_step_is_a_decoder_layer_stack_over_the_cache(batch, draft):
    shape = sp.shape_of(CONFIG)
    assert shape["head_dim"] == 8 and shape["kv_heads"] == 2
    stack = sp.DecoderStack(shape, max_batch=4, context=16, max_draft=4, device="cpu", dtype=torch.float64)
    x = torch.randn(batch * (1 + draft), 64, dtype=torch.float64)
    expected = _reference_step(stack, x.clone(), batch, 1 + draft)
    got = stack.step(x, batch, 1 + draft)
    assert got.shape == (batch * (1 + draft), 50)
    torch.testing.assert_close(got, expected)


def test_text_config_and_head_dim_are_read():
    shape = sp.shape_of({"text_config": {**CONFIG, "head_dim": 16}})
    assert shape["head_dim"] == 16 and shape["layers"] == 2


def test_needs_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        sp.main(["--model-config", str(tmp_path / "c.json"), "--out", str(tmp_path / "p.json")])
