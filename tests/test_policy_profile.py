"""Step profiles: the file format's validation and MeasuredCost against hand-computed values."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from spec_plugins.policy.measured import FORMAT, MeasuredCost, load_profile, save_profile
from spec_plugins.bench.profile import plot_profile


def point(batch, draft, step_ms, runs=None):
    return {"batch": batch, "draft": draft, "tokens": batch * (1 + draft), "step_ms": step_ms,
            "runs": runs or [step_ms]}


def profile(points):
    return {"format": FORMAT, "engine": "vllm 0.32.0+cpu", "device": "test CPU", "model": "tiny",
            "dtype": "float32", "context_len": 256, "points": points, "created": "2025-01-01T00:00:00+00:00",
            "command": "spec-plugins profile ..."}


# Medians per token count: 1 -> 10 ms, 2 -> median(12, 14) = 13 ms, 4 -> median(20, 18, 25) = 20 ms, 8 -> 30 ms.
GRID = profile([
    point(1, 0, 10.0), point(2, 0, 12.0), point(1, 1, 14.0),
    point(4, 0, 20.0), point(2, 1, 18.0), point(1, 3, 25.0), point(8, 0, 30.0),
])


def write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# ---------------------------------------------------------------------------------------------
# load_profile


def test_save_load_round_trip(tmp_path):
    path = save_profile(GRID, tmp_path / "sub" / "p.json")
    loaded = load_profile(path)
    assert loaded["points"][1]["step_ms"] == 12.0 and loaded["context_len"] == 256
    assert loaded == load_profile(save_profile(loaded, tmp_path / "again.json"))


def test_unknown_keys_are_ignored(tmp_path):
    data = copy.deepcopy(GRID)
    data["notes"] = "measured on a quiet machine"
    data["points"][0]["extra"] = 1
    assert "notes" not in load_profile(write(tmp_path, data))


def bad(**changes):
    data = copy.deepcopy(GRID)
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        ("{not json", "expected JSON, got invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (bad(format="spec-plugins-step-profile/2"),
         "expected format 'spec-plugins-step-profile/1', got 'spec-plugins-step-profile/2'"),
        (bad(format=None), "expected format 'spec-plugins-step-profile/1', got None"),
        (bad(points=[point(1, 0, 10.0)]), "points: expected at least 2 points, got 1"),
        (bad(points=[point(2, 0, 10.0), point(1, 1, 12.0)]),
         "points: expected at least 2 distinct token counts, got only 2"),
        (bad(points=[point(1, 0, 10.0), point(2, 0, 0.0)]),
         "points.1.step_ms: Input should be greater than 0 (got 0.0)"),
        (bad(points=[point(1, 0, 10.0), {**point(1, 3, 9.0), "tokens": 3}]),
         "points.1: expected tokens = batch * (1 + draft) = 4, got 3"),
        (bad(points=[point(1, 0, 10.0), point(0, 0, 9.0)]),
         "points.1.batch: Input should be greater than or equal to 1"),
        (bad(device=None), "device: Field required"),
        (bad(context_len=0), "context_len: Input should be greater than or equal to 1 (got 0)"),
    ],
)
def test_load_profile_errors_are_one_line(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ValueError) as exc:
        load_profile(path)
    text = str(exc.value)
    assert text.startswith(f"profile {path}: ") and message in text, text
    assert "\n" not in text


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"profile .*nope\.json: cannot read it \(No such file or directory\)"):
        load_profile(tmp_path / "nope.json")


# ---------------------------------------------------------------------------------------------
# MeasuredCost


@pytest.mark.parametrize(
    "rows, ms",
    [
        (0, 0.0),
        (1, 10.0),
        (2, 13.0),  # median of the two points at 2 tokens
        (3, 16.5),  # halfway between 13 and 20
        (4, 20.0),  # median of three points
        (6, 25.0),
        (8, 30.0),
        (12, 40.0),  # beyond the last point: slope of the last two, (30 - 20) / (8 - 4) ms per token
        (16, 50.0),
    ],
)
def test_linear_time_interpolates_medians(rows, ms):
    assert MeasuredCost(GRID).linear_time(rows) == pytest.approx(ms / 1e3)


def test_linear_time_is_cached_and_loads_paths(tmp_path):
    cost = MeasuredCost(str(save_profile(GRID, tmp_path / "p.json")))
    assert cost.linear_time(5) == cost.linear_time(5) == pytest.approx(22.5e-3)
    assert 5 in cost._cache


def test_noise_never_makes_more_tokens_cheaper():
    # 2 tokens measured faster than 1 and the last slope negative: both are noise.
    cost = MeasuredCost(profile([point(1, 0, 10.0), point(2, 0, 8.0), point(4, 0, 20.0), point(8, 0, 18.0)]))
    assert cost.linear_time(2) == pytest.approx(10e-3)
    assert cost.linear_time(3) == pytest.approx(15e-3)
    assert cost.linear_time(8) == pytest.approx(20e-3)
    assert cost.linear_time(1000) == pytest.approx(20e-3)  # flat, not negative


def test_below_the_first_point_keeps_its_time():
    cost = MeasuredCost(profile([point(2, 0, 10.0), point(4, 0, 14.0)]))
    assert cost.linear_time(1) == pytest.approx(10e-3)


def test_step_time_and_draft_time():
    cost = MeasuredCost(GRID)
    assert cost.overhead_s == 0.0
    assert cost.attention_time(3, 100_000) == 0.0  # inside the measured step times
    assert cost.draft_time([0, 0]) == 0.0
    assert cost.draft_time([1, 0, 5]) == pytest.approx(10e-6)
    # 2 requests, rows (1 + 0) + (1 + 3) = 5: mean draft 1.5 on the batch-2 curve (D=0 12 ms, D=1 18 ms),
    # past its last point at its slope: 21 ms; one drafting request.
    assert cost.step_time([0, 3], [256, 256]) == pytest.approx(21e-3 + 5e-6)
    assert MeasuredCost(GRID, draft_us_per_request=0).step_time([0, 3], [1, 1]) == pytest.approx(21e-3)
    with pytest.raises(ValueError, match=r"step_time: 2 draft lengths for 1 context lengths"):
        cost.step_time([0, 3], [256])
    with pytest.raises(ValueError, match=r"MeasuredCost.draft_us_per_request: Input should be greater than or eq"):
        MeasuredCost(GRID, draft_us_per_request=-1)


def test_speedup_for_uniform_lengths():
    cost = MeasuredCost(GRID)
    # Batch 2: D=0 12 ms, D=1 18 ms; T_draft = 2 requests * 5 us.
    assert cost.speedup(2, 1, 1.5, 256) == pytest.approx(12e-3 * 1.5 / (18e-3 + 10e-6))
    # Batch 1: D=0 10 ms, D=3 25 ms; T_draft = 5 us.
    assert cost.speedup(1, 3, 2.5, 256) == pytest.approx(10e-3 * 2.5 / (25e-3 + 5e-6))
    assert cost.speedup(4, 0, 1.0, 256) == pytest.approx(1.0)  # no drafting, no cost, no gain
    for args, message in [((0, 1, 1.5, 1), "speedup.batch: expected an integer >= 1, got 0"),
                          ((1, -1, 1.5, 1), "speedup.draft_len: expected an integer >= 0, got -1"),
                          ((1, 1, 0.5, 1), "speedup.acceptance_length: expected a number >= 1, got 0.5")]:
        with pytest.raises(ValueError, match=message):
            cost.speedup(*args)


def test_loading_a_profile_imports_no_profiler():
    # The serving engine loads profiles; the profiler's engine driver and plotting must stay out of it.
    code = ("import sys\nfrom spec_plugins.policy.measured import MeasuredCost, profile_path\n"
            "MeasuredCost(profile_path('vllm-cpu-smollm2-135m')).step_time([3, 0], [256, 256])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'rich', 'vllm')\n"
            "             or m in ('spec_plugins.bench.profile', 'spec_plugins.bench.vllm_run')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot_profile(GRID, tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# the CLI: bad input fails in one line before any engine starts


def spec_plugins(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spec_plugins.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-sizes", ""], "--batch-sizes: expected comma-separated integers >= 1, got ''"),
        (["--batch-sizes", "1,x"], "--batch-sizes: expected comma-separated integers >= 1, got '1,x'"),
        (["--batch-sizes", "0,4"], "--batch-sizes: expected comma-separated integers >= 1, got '0,4'"),
        (["--draft-lens", "0,-3"], "--draft-lens: expected comma-separated integers >= 0, got '0,-3'"),
        (["--steps", "0"], "--steps: expected an integer >= 1, got 0"),
        (["--context-len", "-1"], "--context-len: expected comma-separated integers >= 1, got '-1'"),
        (["--dtype", "int8"], "--dtype: expected one of float32, bfloat16, float16, auto, got 'int8'"),
        (["--model", "/no/such/model"],
         "--model: expected a model folder with config.json or 'smollm2', got '/no/such/model'"),
    ],
)
def test_cli_bad_input(tmp_path, args, message):
    res = spec_plugins("profile", *args, "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines == [f"spec-plugins: error: {message}"], res.stderr
    assert not (tmp_path / "p.json").exists()


# ---------------------------------------------------------------------------------------------
# which engine steps are timed


def test_decode_steps_are_the_full_batch_steps_less_first_and_last():
    from spec_plugins.bench.vllm_run import RunResult
    from spec_plugins.bench.profile import _decode_steps

    # Batch 2, 6 tokens each: a prefill step (chunked into two here), then 5 decode steps.
    steps = [9.0, 8.0, 1.5, 1.0, 1.1, 1.2, 1.4]
    run = RunResult(token_ids=[], texts=[], seconds=1.0, output_tokens=12, step_seconds=steps)
    assert _decode_steps(run, 2) == [1.0, 1.1, 1.2]
    # Two accepted drafts per request: 8 tokens in the same 6 emitting steps.
    run = RunResult(token_ids=[], texts=[], seconds=1.0, output_tokens=16, num_accepted_tokens=4, step_seconds=steps)
    assert _decode_steps(run, 2) == [1.0, 1.1, 1.2]
    short = RunResult(token_ids=[], texts=[], seconds=1.0, output_tokens=2, step_seconds=[3.0, 1.0])
    assert _decode_steps(short, 1) == []


# Batch 1: D = 0, 1, 3 -> 10, 14, 25 ms; batch 2: D = 0, 1 -> 12, 18 ms; batch 4: 20 ms; batch 8: 30 ms.
@pytest.mark.parametrize(
    "batch, rows, ms",
    [
        (1, 1, 10.0),
        (1, 3, 19.5),   # D = 2: halfway from 14 to 25
        (1, 6, 36.0),   # D = 5: past the last point (D = 3) at its slope, 5.5 ms per draft token
        (2, 3, 15.0),   # D = 0.5 on the batch-2 curve
        (3, 3, 16.0),   # D = 0: halfway from batch 2 (12) to batch 4 (20)
        (6, 6, 25.0),   # D = 0: halfway from batch 4 to batch 8
        (16, 16, 50.0), # beyond the largest batch: the 4 -> 8 trend, 2.5 ms per request
        (1, 0.5, 10.0), # below the first draft point: flat
    ],
)
def test_batch_time_reads_the_batch_by_draft_grid(batch, rows, ms):
    assert MeasuredCost(GRID).batch_time(batch, rows) == pytest.approx(ms / 1e3)


def test_equal_tokens_cost_what_their_batch_measured():
    # 4 tokens: 1 request with 3 drafts (25 ms) and 4 requests without (20 ms) are different steps.
    cost = MeasuredCost(GRID, draft_us_per_request=0)
    assert cost.step_time([3], [256]) == pytest.approx(25e-3)
    assert cost.step_time([0, 0, 0, 0], [256] * 4) == pytest.approx(20e-3)
    assert cost.step_time([], []) == 0.0


# ---------------------------------------------------------------------------------------------
# profiles at several context lengths


def at_context(data, context_len, scale):
    """`data`'s grid measured again at `context_len`, every step `scale` times as long."""
    other = copy.deepcopy(data)
    other["context_len"] = context_len
    for p in other["points"]:
        p["step_ms"] *= scale
        p["runs"] = [p["step_ms"]]
    return other


def test_contexts_join_save_and_load(tmp_path):
    from spec_plugins.policy.measured import add_context

    joined = add_context(GRID, at_context(GRID, 2048, 2.0))
    assert [c["context_len"] for c in joined["contexts"]] == [2048]
    assert load_profile(save_profile(joined, tmp_path / "j.json")) == joined
    assert "contexts" not in load_profile(save_profile(GRID, tmp_path / "one.json"))  # unchanged for one context
    with pytest.raises(ValueError, match=r"contexts\.1\.context_len: expected a context length not profiled"):
        add_context(joined, at_context(GRID, 2048, 3.0))
    coarse = at_context(GRID, 1024, 2.0)  # another context may be profiled on fewer cells
    coarse["points"] = [p for p in coarse["points"] if p["batch"] in (1, 8)]
    assert MeasuredCost(add_context(joined, coarse)).batch_time(8, 8, 1024.0) == pytest.approx(2 * 0.030)
    coarse["points"] = coarse["points"][:1]
    with pytest.raises(ValueError, match=r"contexts\.1\.points: expected at least 2 distinct token counts"):
        add_context(joined, coarse)
    other_model = at_context(GRID, 1024, 2.0)
    other_model["model"] = "another"
    with pytest.raises(ValueError, match="model: expected the same as the profile it joins"):
        add_context(GRID, other_model)


def test_measured_cost_reads_the_steps_mean_context():
    from spec_plugins.policy.measured import add_context

    one, two = MeasuredCost(GRID), MeasuredCost(add_context(GRID, at_context(GRID, 2048, 2.0)))
    for batch, rows in ((1, 1), (2, 4), (4, 5), (8, 8), (16, 40)):
        base = one.batch_time(batch, rows)
        assert two.batch_time(batch, rows) == base == two.batch_time(batch, rows, 100.0)  # at or below 256: as profiled
        assert two.batch_time(batch, rows, 2048.0) == pytest.approx(2.0 * base)
        assert two.batch_time(batch, rows, 1152.0) == pytest.approx(1.5 * base)  # halfway
        assert two.batch_time(batch, rows, 3840.0) == pytest.approx(3.0 * base)  # the trend beyond
        curve = two.batch_curve(batch, rows + 3, 1152.0)
        assert curve[: rows + 1].tolist() == pytest.approx([two.batch_time(batch, r, 1152.0) for r in range(rows + 1)])
    # equal drafts: step_time is the profile read at the requests' mean context; a one-context profile ignores it
    assert two.step_time([1, 1], [1000, 3096]) - two.draft_time([1, 1]) == pytest.approx(two.batch_time(2, 4, 2048.0))
    assert one.step_time([1, 1], [1000, 3096]) - one.draft_time([1, 1]) == pytest.approx(one.batch_time(2, 4))
    assert not one.has_contexts and two.has_contexts


def brute_force_step(cost, drafts, contexts):
    """The per-request model written out: the reference step, each request's weight on the longer contexts
    times its share of their extra time (an equal share of the base step, its own drafted rows' share)."""
    import numpy as np

    n, rows = len(drafts), len(drafts) + sum(drafts)
    own = {k: v for k, v in cost.profile.items() if k != "contexts"}  # the shortest context here
    alone = [MeasuredCost(own)] + [MeasuredCost({**own, **c}) for c in cost.profile["contexts"]]
    ctx = [a.profile["context_len"] for a in alone]
    total = alone[0].batch_time(n, rows)
    for r, (d, c) in enumerate(zip(drafts, contexts)):
        i = min(max(int(np.searchsorted(ctx, c)), 1), len(ctx) - 1)
        w = 0.0 if c <= ctx[0] else (c - ctx[i - 1]) / (ctx[i] - ctx[i - 1])
        for g, weight in ((i - 1, 1.0 - w), (i, w)):
            if g == 0 or weight == 0.0:
                continue
            top = n * (1 + cost._top_draft)  # linear from the base step: the chord to the longest profiled draft
            delta = np.maximum.accumulate([max(0.0, alone[g].batch_time(n, x) - alone[0].batch_time(n, x))
                                           for x in range(max(rows, top) + 1)])
            if top > n:
                delta = np.concatenate((delta[:n], delta[n] + (delta[top] - delta[n]) / (top - n)
                                        * np.arange(len(delta) - n)))
            total += weight * delta[n] / n
            if rows > n:
                total += weight * d * (delta[rows] - delta[n]) / (rows - n)
    return total


def test_measured_cost_prices_each_request_at_its_own_context():
    from spec_plugins.policy.measured import add_context

    data = add_context(GRID, at_context(GRID, 2048, 1.0))
    for p in data["contexts"][0]["points"]:  # at 2048 a step costs 3 ms more a request, 2 ms more a draft row
        p["step_ms"] += 3.0 * p["batch"] + 2.0 * p["batch"] * p["draft"]
    cost = MeasuredCost(data, draft_us_per_request=0)
    short, long_ = 256, 2048
    for drafts, contexts in (([3, 0], [short, long_]), ([0, 3], [short, long_]), ([2, 1, 0, 1], [100, 900, 3000, 2048]),
                             ([1, 1], [1000, 3096]), ([0, 0], [short, long_])):
        assert cost.step_time(drafts, contexts) == pytest.approx(brute_force_step(cost, drafts, contexts))
    # the same three drafted rows cost less on the short request than on the long one
    assert cost.step_time([3, 0], [short, long_]) < cost.step_time([0, 3], [short, long_])
    assert cost.step_time([0, 3], [short, long_]) - cost.step_time([0, 0], [short, long_]) == pytest.approx(
        cost.step_time([0, 3], [long_, long_]) - cost.step_time([0, 0], [long_, long_]))


def test_a_concave_context_extra_is_priced_by_its_chord():
    """vLLM-CPU at 2k tokens: a request's first drafted row costs ~3x a later one. Each drafted row over the long
    context pays the mean extra of the profiled drafts, however many rows the step has."""
    from spec_plugins.policy.measured import add_context

    grid = profile([point(b, d, 10.0 + 2.0 * b + 0.8 * b * d) for b in (1, 2, 4, 8) for d in (0, 1, 3, 7)])
    data = add_context(grid, at_context(grid, 2048, 1.0))
    for p in data["contexts"][0]["points"]:  # 9 ms for a request's first drafted row, 3 ms for each after it
        p["step_ms"] += 0.0 if p["draft"] == 0 else p["batch"] * (9.0 + 3.0 * (p["draft"] - 1))
    cost = MeasuredCost(data, draft_us_per_request=0)
    top = cost._top_draft
    per_row = (9.0 + 3.0 * (top - 1)) / top / 1e3  # the chord
    for batch in (2, 4, 8):
        short, long_ = [256] * batch, [2048] * batch
        for d in (1, 3, top):
            extra = (cost.step_time([d] * batch, long_) - cost.step_time([0] * batch, long_)) - (
                cost.step_time([d] * batch, short) - cost.step_time([0] * batch, short))
            assert extra == pytest.approx(per_row * d * batch, rel=1e-9)
        for drafts in ([1] + [0] * (batch - 1), [3] * batch, [top, 1] + [0] * (batch - 2)):
            contexts = [2048, 256] + [900] * (batch - 2)
            assert cost.step_time(drafts, contexts) == pytest.approx(brute_force_step(cost, drafts, contexts))


def test_allocator_prices_tokens_over_long_contexts_dearer_on_both_walks():
    import numpy as np

    from policy_reference import numpy_allocate_batch
    from spec_plugins.policy import allocator
    from spec_plugins.policy.measured import add_context

    data = add_context(GRID, at_context(GRID, 2048, 1.0))
    for p in data["contexts"][0]["points"]:  # at 2048 every verified draft token costs 6 ms more
        p["step_ms"] += 6.0 * p["batch"] * p["draft"]
    cost = MeasuredCost(data)
    surv = np.cumprod(np.full((2, 3), 0.8), axis=1)  # the grid's batch 2 has drafts 0 and 1
    lengths = np.full(2, 3)
    kept = {}
    for ctx in (256, 2048):
        context = np.full(2, ctx)
        compiled = allocator.allocate_batch(surv, lengths, context, cost, search="global")
        plain = numpy_allocate_batch(surv, lengths, context, cost, search="global")
        assert compiled.tolist() == plain.tolist()
        kept[ctx] = int(compiled.sum())
    assert kept[2048] < kept[256]


def test_plot_of_a_profile_at_two_contexts(tmp_path):
    from spec_plugins.policy.measured import add_context

    out = plot_profile(add_context(GRID, at_context(GRID, 2048, 2.0)), tmp_path / "two.png")
    assert out.stat().st_size > 10_000


def test_cpu_kv_cache_is_sized_for_the_largest_batch(monkeypatch):
    from spec_plugins.bench.profile import _cpu_kv_cache

    smollm2 = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576, "num_hidden_layers": 30}
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    tokens = 32 * 2107  # 46 KB a token in float32: 2.9 GiB, where the engines here default to 1 GiB
    assert _cpu_kv_cache(smollm2, "float32", tokens, None) == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    assert _cpu_kv_cache(smollm2, "float32", 32 * 300, {"A": "1"}) == {"A": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with pytest.raises(ValueError, match=r"context_len: the largest batch needs 2\.9 GiB of KV cache .*gives 2 GiB"):
        _cpu_kv_cache(smollm2, "float32", tokens, {"VLLM_CPU_KVCACHE_SPACE": "2"})
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    assert _cpu_kv_cache(smollm2, "float32", tokens, None) == {}
