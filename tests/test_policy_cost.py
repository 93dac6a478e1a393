"""Hardware profiles, model shapes and the roofline step-cost model, against hand-computed numbers.

Every expected value is worked out in the comments from datasheet figures and config.json fields, not
by calling the code under test. H200 rates used throughout (bf16, default efficiencies):
    achievable FLOP/s = 989e12 · 0.7  = 692.3e12
    achievable B/s    = 4.8e12 · 0.85 = 4.08e12
Llama-3.1-8B GEMM weights (hidden 4096, 32 q heads / 8 kv heads of 128, intermediate 14336, vocab 128256):
    attention  4096·128·(2·32 + 2·8)        =  41,943,040
    MLP        3·4096·14336                  = 176,160,768
    per layer                                = 218,103,808;  · 32 layers = 6,979,321,856
    LM head    128256·4096                   = 525,336,576
    all GEMMs                                = 7,504,658,432 params = 15,009,316,864 bytes in bf16
"""

import pytest

from spec_plugins.policy.cost import (
    DraftCost,
    RooflineCost,
    attention_draft_limit,
    binding_guideline,
    compute_bound_rows,
    tile_aligned_drafts,
)
from spec_plugins.policy.hardware import available_hardware, builtin_config_dir, load_hardware
from spec_plugins.policy.model import ModelDescriptor, available_models, load_model_config

GEMM_PARAMS_8B = 7_504_658_432
GEMM_BYTES_8B = 15_009_316_864
FLOP_RATE_H200 = 989e12 * 0.7
BYTE_RATE_H200 = 4.8e12 * 0.85


@pytest.fixture(scope="module")
def h200_8b():
    return RooflineCost("h200", "llama-3.1-8b")


# -- hardware profiles -------------------------------------------------------------------------------


def test_every_builtin_profile_loads():
    assert available_hardware() == ["a100", "b200", "h100", "h200", "l40s"]
    datasheet = {  # bf16, fp8, TB/s, SMs
        "h100": (989, 1979, 3.35, 132),
        "h200": (989, 1979, 4.8, 132),
        "b200": (2250, 4500, 8.0, 148),
        "a100": (312, None, 2.039, 108),
        "l40s": (362, 733, 0.864, 142),
    }
    for name, (bf16, fp8, bw, sms) in datasheet.items():
        hw = load_hardware(name.upper())  # names are case-insensitive
        assert (hw.name, hw.bf16_tflops, hw.fp8_tflops, hw.memory_bandwidth_tbs, hw.sm_count) == (
            name, bf16, fp8, bw, sms
        )
        assert hw.gemm_efficiency == 0.7 and hw.bandwidth_efficiency == 0.85
    assert load_hardware("h100").attention_tile_rows == 128
    assert load_hardware("a100").attention_tile_rows == 64


def test_configs_found_relative_to_package():
    assert (builtin_config_dir("hardware") / "h200.yaml").is_file()
    assert (builtin_config_dir("models") / "llama-3.1-8b.json").is_file()


def test_unknown_hardware_name():
    with pytest.raises(ValueError) as e:
        load_hardware("x")
    assert str(e.value) == (
        "hardware: unknown profile 'x'; expected one of a100, b200, h100, h200, l40s or a path to a YAML file"
    )


def test_yaml_missing_field(tmp_path):
    path = tmp_path / "mygpu.yaml"
    path.write_text("bf16_tflops: 100\nfp8_tflops: null\nsm_count: 10\ngemm_tile_rows: 64\nattention_tile_rows: 64\n")
    with pytest.raises(ValueError) as e:
        load_hardware(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "'memory_bandwidth_tbs'" in msg


def test_yaml_bad_field(tmp_path):
    good = load_hardware("h200").model_dump()
    path = tmp_path / "typo.yaml"
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in good.items()) + "bandwith: 3\n")
    with pytest.raises(ValueError, match=r"typo.yaml: field 'bandwith'"):
        load_hardware(str(path))
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in {**good, "sm_count": 0}.items()))
    with pytest.raises(ValueError, match=r"field 'sm_count'"):
        load_hardware(str(path))
    # A user profile without a name takes the file's stem.
    path.write_text("".join(f"{k}: {'null' if v is None else v}\n" for k, v in good.items() if k != "name"))
    assert load_hardware(path).name == "typo"


def test_fp8_on_a100_is_an_error():
    with pytest.raises(ValueError, match="a100: no fp8"):
        RooflineCost("a100", "llama-3.1-8b", dtype="fp8")


# -- model descriptors -------------------------------------------------------------------------------


def test_builtin_models_and_group_size():
    assert available_models() == ["llama-3.1-70b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-8b", "smollm2-135m"]
    # G = num_attention_heads / num_key_value_heads from each config.json.
    expected_g = {"llama-3.1-8b": 4, "llama-3.1-70b": 8, "qwen3-8b": 4, "mixtral-8x7b": 4, "smollm2-135m": 3}
    for name, g in expected_g.items():
        assert load_model_config(name).group_size == g


def test_llama_8b_shape():
    m = load_model_config("llama-3.1-8b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.vocab) == (32, 4096, 32, 8, 128, 128256)
    assert m.dtype == "bf16" and not m.is_moe and not m.tie_word_embeddings
    assert m.layer_params == 218_103_808
    # 6,979,321,856 layer params + 2 · 525,336,576 (untied embedding and LM head) = 8,029,995,008;
    # the published 8,030,261,248 adds the RMSNorm weights, (2·32 + 1)·4096 = 266,240, left out here.
    assert m.param_count == 8_029_995_008
    assert m.param_bytes() == 2 * 8_029_995_008 and m.param_bytes("fp8") == 8_029_995_008
    # K and V: 2 · 32 layers · 8 kv heads · 128 · 2 bytes = 131,072 bytes per token.
    assert m.kv_bytes_per_token() == 131_072


def test_smollm2_tied_and_head_dim_default():
    m = load_model_config("smollm2-135m")
    assert m.head_dim == 64  # 576 / 9, no head_dim field in the config
    # per layer: 576·64·(18 + 6) = 884,736 + 3·576·1536 = 2,654,208 -> 3,538,944; · 30 = 106,168,320;
    # tied embedding 49152·576 = 28,311,552 once -> 134,479,872 ("135M").
    assert m.param_count == 134_479_872


def test_mixtral_moe_fields():
    m = load_model_config("mixtral-8x7b")
    assert (m.num_experts, m.experts_per_token, m.expert_intermediate) == (8, 2, 14336)
    # Experts touched = min(8, rows · 2).
    assert [m.experts_touched(r) for r in (0, 1, 3, 4, 100)] == [0, 2, 6, 8, 8]
    # 46.7B total: 32 · (41,943,040 attn + 32,768 router + 8 · 176,160,768) + 2 · 32000·4096.
    assert m.param_count == 46_702_526_464


def test_load_from_folder_and_moe_intermediate(tmp_path):
    # A Qwen-MoE-style config: experts under num_experts, their width under moe_intermediate_size.
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256, "moe_intermediate_size": 32,'
        ' "num_attention_heads": 4, "vocab_size": 100, "num_experts": 16, "num_experts_per_tok": 4,'
        ' "dtype": "float16"}'
    )
    m = load_model_config(tmp_path)
    assert m.name == tmp_path.name and m.kv_heads == 4 and m.head_dim == 16 and m.dtype == "fp16"
    assert (m.num_experts, m.experts_per_token, m.expert_intermediate) == (16, 4, 32)
    assert m.expert_params == 3 * 64 * 32


def test_model_config_errors(tmp_path):
    good = '"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256, "vocab_size": 100'
    path = tmp_path / "config.json"

    path.write_text("{" + good + "}")
    with pytest.raises(ValueError) as e:
        load_model_config(path)
    assert str(e.value) == f"model config {path}: missing field 'num_attention_heads'"

    path.write_text("{" + good + ', "num_attention_heads": 4, "num_key_value_heads": 3}')
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) not divisible by num_key_value_heads \(3\)"):
        load_model_config(path)

    path.write_text("{" + good + ', "num_attention_heads": 0}')
    with pytest.raises(ValueError, match=r"field 'num_attention_heads': expected an integer >= 1, got 0"):
        load_model_config(path)

    path.write_text("{" + good)
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model_config(path)

    with pytest.raises(ValueError, match="not found"):
        load_model_config(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="folder has no config.json"):
        load_model_config(tmp_path / "..")

    with pytest.raises(ValueError, match="ModelDescriptor.heads"):
        ModelDescriptor(layers=1, hidden=64, intermediate=1, heads=4, kv_heads=3, head_dim=16, vocab=10)


def test_errors_are_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 64}')
    for call in (lambda: load_hardware("x"), lambda: load_model_config(path)):
        with pytest.raises(ValueError) as e:
            call()
        assert "\n" not in str(e.value)


# -- guideline helpers -------------------------------------------------------------------------------


def test_compute_bound_rows_h200():
    h200 = load_hardware("h200")
    # Ridge at 100%: 989e12 / 4.8e12 = 206.04 FLOP/byte = rows (bf16 intensity ≈ M).
    ideal = h200.model_copy(update={"gemm_efficiency": 1.0, "bandwidth_efficiency": 1.0})
    assert compute_bound_rows(ideal) == pytest.approx(206.04, abs=0.01)
    # With efficiencies: 692.3e12 / 4.08e12 = 169.68.
    assert compute_bound_rows(h200) == pytest.approx(169.68, abs=0.01)
    # fp8: 1979·0.7 / 4.08 = 339.5 FLOP/byte, intensity 2M -> 169.77 rows, about the bf16 threshold.
    assert compute_bound_rows(h200, "fp8") == pytest.approx(169.77, abs=0.01)


def test_attention_draft_limit():
    # 128 // G - 1
    assert [attention_draft_limit(g) for g in (4, 8, 16, 32, 64, 128)] == [31, 15, 7, 3, 1, 0]
    assert attention_draft_limit(3) == 41  # SmolLM2: 128 // 3 = 42
    assert attention_draft_limit(4, tile_rows=64) == 15


def test_tile_aligned_drafts():
    # batch 8: 8·16 = 128 and 8·32 = 256 rows; D = 16 would give 136.
    assert tile_aligned_drafts(8, 31) == [15, 31]
    assert tile_aligned_drafts(8, 16) == [15]
    # batch 3: floor(128/3) - 1 = 41 (126 rows), floor(256/3) - 1 = 84 (255 rows).
    assert tile_aligned_drafts(3, 100) == [41, 84]
    assert tile_aligned_drafts(1, 15) == []  # 16 rows never reach the first boundary


# -- roofline cost -----------------------------------------------------------------------------------


def test_linear_tile_rounding(h200_8b):
    c = h200_8b
    # 127 and 128 rows pad to one 128-row tile: 2 · 7,504,658,432 · 128 = 1,921,192,558,592 FLOPs.
    assert c.linear_flops(127) == c.linear_flops(128) == 1_921_192_558_592
    assert c.linear_flops(129) == 2 * 1_921_192_558_592  # one more tile
    assert c.linear_bytes(1) == c.linear_bytes(129) == GEMM_BYTES_8B  # weights streamed once either way
    # 128 rows: bytes 15,009,316,864 / 4.08e12 = 3.6788 ms > FLOPs 1.9212e12 / 692.3e12 = 2.775 ms.
    assert c.linear_time(1) == c.linear_time(128) == pytest.approx(GEMM_BYTES_8B / BYTE_RATE_H200)
    assert c.linear_time(128) == pytest.approx(3.6788e-3, abs=1e-7)
    # 129 rows -> 256 padded: 3.8424e12 / 692.3e12 = 5.5502 ms, now compute-bound.
    assert c.linear_time(129) == pytest.approx(2 * GEMM_PARAMS_8B * 256 / FLOP_RATE_H200)
    assert c.linear_time(129) == pytest.approx(5.5502e-3, abs=1e-7)
    assert c.linear_time(0) == 0.0


def test_batch8_draft15_vs_16(h200_8b):
    c = h200_8b
    # 8·16 = 128 rows (one tile, memory-bound) vs 8·17 = 136 rows (two tiles, 256 > 169.7 rows).
    t15 = c.step_time([15] * 8, [0] * 8)
    t16 = c.step_time([16] * 8, [0] * 8)
    # overhead 300 µs + linear + model-free drafting 8·5 µs + 0.5 µs per token.
    assert t15 == pytest.approx(300e-6 + 3.6788e-3 + (40 + 0.5 * 120) * 1e-6, abs=1e-7)
    assert t16 == pytest.approx(300e-6 + 5.5502e-3 + (40 + 0.5 * 128) * 1e-6, abs=1e-7)
    assert binding_guideline(c, 8, 15, 0) == "memory-bound: long drafts nearly free"
    assert binding_guideline(c, 8, 16, 0) == "tile boundary at 128 rows"


def test_attention_tiles_g8():
    c = RooflineCost("h200", "llama-3.1-70b")
    # G = 8: 8·16 = 128 query rows -> one tile at D = 15; 8·17 = 136 -> two tiles at D = 16.
    assert c.attention_tiles(15) == 1 and c.attention_tiles(16) == 2
    # L = 4096: KV per layer 2·4096·8·128·2 = 16,777,216 B; · 80 layers = 1,342,177,280 B / 4.08e12
    # = 328.96 µs. FLOPs per tile 4·8·128·128·4096 = 2.147e9 · 80 / 692.3e12 = 248 µs < 329: memory-bound.
    assert c.attention_time(15, 4096) == pytest.approx(1_342_177_280 / BYTE_RATE_H200)
    assert c.attention_time(15, 4096) == pytest.approx(328.96e-6, abs=1e-8)
    assert c.attention_time(0, 4096) == c.attention_time(15, 4096)  # D ≤ 15 is free in attention
    assert c.attention_time(16, 4096) == pytest.approx(2 * c.attention_time(15, 4096))  # KV read twice
    assert c.attention_time(16, 0) == 0.0
    assert binding_guideline(c, 1, 16, 4096) == "attention tile: D ≤ 128/G−1 = 15"


def test_moe_experts_streamed():
    c = RooflineCost("h200", "mixtral-8x7b")
    # rows = 1: 2 experts. Per layer 41,943,040 attn + 32,768 router + 2·176,160,768 = 394,297,344;
    # · 32 = 12,617,515,008 + LM head 131,072,000 = 12,748,587,008 params · 2 B.
    assert c.linear_bytes(1) == 25_497_174_016
    # rows ≥ 4 touch all 8: 46,702,526,464 total - 131,072,000 embedding = 46,571,454,464 params · 2 B.
    assert c.linear_bytes(4) == c.linear_bytes(64) == 93_142_908_928
    assert c.linear_time(4) > c.linear_time(1)


def test_draft_costs():
    m = load_model_config("llama-3.1-8b")
    # Model-free: 5 µs per drafting request + 0.5 µs per token; D = 0 costs nothing.
    free = RooflineCost("h200", m)
    assert free.draft_time([4, 0, 2]) == pytest.approx((2 * 5 + 0.5 * 6) * 1e-6)
    assert free.draft_time([0, 0]) == 0.0
    # One drafter forward of one Llama-8B layer + the LM head: 218,103,808 + 525,336,576 = 743,440,384
    # params = 1,486,880,768 B / 4.08e12 = 364.43 µs (FLOPs at 128 rows: 190.3e9 / 692.3e12 = 275 µs).
    forward = 1_486_880_768 / BYTE_RATE_H200
    block = RooflineCost("h200", m, drafter=DraftCost(kind="block", draft_layers=1))
    assert block.draft_time([3, 1, 0]) == pytest.approx(forward)  # one forward, 4 + 2 rows
    seq = RooflineCost("h200", m, drafter=DraftCost(kind="sequential", draft_layers=1))
    assert seq.draft_time([3, 1, 0]) == pytest.approx(3 * forward)  # forwards over 2, 1, 1 rows
    assert seq.draft_time([0]) == 0.0
    with pytest.raises(ValueError):
        DraftCost(kind="tree")


def test_speedup_is_the_seed_formula(h200_8b):
    c = h200_8b
    b, d, al, ctx = 8, 15, 4.0, 0
    # By hand (no attention at L = 0): T_verif(8) = 300 µs + 3678.754 µs; T_verif(128 rows) is the
    # same (both one tile, memory-bound); T_draft = 8·5 + 0.5·120 = 100 µs.
    # speedup = 3978.754 · 4 / 4078.754 = 3.90193.
    assert c.speedup(b, d, al, ctx) == pytest.approx(3.90193, abs=1e-5)
    # The same ratio from step_time, with attention at L = 2048.
    ctx = 2048
    base = c.step_time([0] * b, [ctx] * b)
    spec = c.step_time([d] * b, [ctx] * b)
    parts = c.overhead_s + c.linear_time(b * (1 + d)) + b * c.attention_time(d, ctx) + c.draft_time([d] * b)
    assert spec == pytest.approx(parts)
    assert c.speedup(b, d, al, ctx) == pytest.approx(base * al / spec)
    with pytest.raises(ValueError, match="acceptance_length"):
        c.speedup(b, 3, 5.0, ctx)  # AL ≤ 1 + D


def test_speedup_regimes(h200_8b):
    c = h200_8b
    # Batch 1, D = 7: 8 rows, one tile, memory-bound; G·8 = 32 query rows, one attention tile;
    # drafting 8.5 µs against ~4 ms of verification -> speedup ≈ AL.
    assert c.speedup(1, 7, 4.0, 1024) == pytest.approx(4.0, rel=0.01)
    assert binding_guideline(c, 1, 7, 1024) == "memory-bound: long drafts nearly free"
    # Batch 1024, D = 3: 1024 vs 4096 rows, both far above the 170-row ridge, so linear time grows 4x
    # (22.2 ms -> 88.8 ms); overhead and short-context attention are a few percent -> speedup ≈ AL/(1+D).
    assert c.speedup(1024, 3, 2.0, 16) == pytest.approx(2.0 / 4, rel=0.05)
    assert c.speedup(1024, 3, 2.0, 16) < 1.0
    assert binding_guideline(c, 1024, 3, 16) == "compute-bound GEMMs above 170 rows"


def test_linear_time_is_cached(h200_8b):
    c = h200_8b
    first = c.linear_time(1000)
    assert 1000 in c._linear_cache and c.linear_time(1000) == first


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b"])
def test_linear_curve_is_computed_once_per_tile_with_the_same_values(model):
    """Rows on the same tiles (and, for MoE, the same experts and expert tiles) cost the same: the curve is
    computed once per tile, and every entry equals the cost computed for its own row count."""
    from spec_plugins.policy.cost import RooflineCost, _round_up, step_cost

    c = step_cost(hardware="h200", model=model)
    curve = c.linear_curve(5000)
    tile = c.hardware.gemm_tile_rows
    assert len(c._linear_cache) <= _round_up(len(curve), tile) // tile + 64  # linear_time once per tiling
    fresh = step_cost(hardware="h200", model=model)
    assert curve[:5000].tolist() == [fresh.linear_time(r) for r in range(5000)]
    for rows in (1, 2, tile - 1, tile, tile + 1, 777, 4096, 4999):
        fresh = step_cost(hardware="h200", model=model)
        direct = fresh.model.layers * fresh._time(*fresh._layer_cost(rows))
        direct += fresh._time(*fresh._gemm_cost(fresh.model.lm_head_params, rows))
        assert curve[rows] == direct, rows
    assert isinstance(c, RooflineCost) and curve[0] == 0.0
