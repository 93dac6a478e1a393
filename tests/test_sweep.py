"""The sweep's parts without an engine: workload loaders, the frontier, configurations, summaries."""

from __future__ import annotations

import json

import pytest

from spec_plugins.bench import sweep
from spec_plugins.bench.frontier import best_per_target, frontier_table, pareto_front, plot_frontier
from spec_plugins.bench.workloads import load_workload


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def speed_bench_parquet(path, turns_of=lambda i: [f"Question {i}?", f"And then {i}?"]):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    cats = ["coding", "math", "writing"]
    rows = [{"question_id": f"q{i}", "category": cats[i % 3], "sub_category": "x", "turns": turns_of(i),
             "source": "src", "src_id": str(i), "difficulty": "easy", "multiturn": True} for i in range(9)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_spec_bench_and_plain_jsonl(tmp_path):
    spec = write_jsonl(tmp_path / "q.jsonl", [
        {"question_id": 1, "category": "coding", "turns": ["Write a sort.", "Now faster."]},
        {"question_id": 2, "category": "math", "turns": ["2+2?"]},
        {"question_id": 3, "category": "coding", "turns": ["Reverse a list."]}])
    rows = load_workload(str(spec))
    assert [r.id for r in rows] == ["1", "2", "3"] and rows[0].turns == ["Write a sort."]
    assert load_workload(str(spec), turns="all")[0].turns == ["Write a sort.", "Now faster."]
    assert [r.id for r in load_workload(str(spec), categories=["CODING"])] == ["1", "3"]
    assert [r.category for r in load_workload(str(spec), limit=2)] == ["coding", "math"]  # round-robin
    plain = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "hi", "response": "hello"}, {"id": "b", "prompt": "yo"}])
    got = load_workload(str(plain))
    assert (got[0].text, got[0].response, got[1].response) == ("hi", "hello", None)
    assert len(load_workload("code")) >= 8 and load_workload("spec_bench")


@pytest.mark.parametrize("line,match", [
    ("{not json", r"row 2: not JSON"),
    ('{"id": "x"}', r"row 2: expected 'turns'"),
    ('{"id": "x", "prompt": ""}', r"row 2: 'prompt' must be a non-empty string"),
    ('{"question_id": 5, "turns": []}', r"row 2: 'turns' must be a non-empty list"),
    ("[1, 2]", r"row 2: expected a JSON object"),
])
def test_a_malformed_row_is_named(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=match):
        load_workload(str(path))


def test_workload_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_workload(str(tmp_path / "missing.jsonl"))
    spec = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "category": "coding", "turns": ["x"]}])
    with pytest.raises(ValueError, match=r"no category \['poetry'\]; it has \['coding'\]"):
        load_workload(str(spec), categories=["poetry"])


def test_speed_bench_parquet(tmp_path):
    path = speed_bench_parquet(tmp_path / "qualitative.parquet")
    rows = load_workload(f"speed:{path}", categories=["math"], turns="all")
    assert [r.id for r in rows] == ["q1", "q4", "q7"]
    assert rows[0].turns == ["Question 1?", "And then 1?"] and rows[0].meta["difficulty"] == "easy"
    folder = tmp_path / "split"
    folder.mkdir()
    speed_bench_parquet(folder / "part-0.parquet")
    assert len(load_workload(str(folder))) == 9


def test_speed_bench_placeholders_are_refused_with_the_fix(tmp_path):
    path = speed_bench_parquet(tmp_path / "q.parquet", turns_of=lambda i: ["<PLACEHOLDER: rebuild from source>"])
    with pytest.raises(ValueError, match=r"9 of 9 prompts are placeholders.*prepare_data.py --dataset speed"):
        load_workload(str(path))


def test_speed_bench_missing_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question_id": "a", "text": "x"}]), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match=r"missing SPEED-Bench columns \['category', 'turns'\]"):
        load_workload(str(tmp_path / "x.parquet"))


def test_pareto_front_excludes_dominated_points_and_keeps_ties():
    pts = [(10, 5), (20, 3), (15, 4), (12, 4), (20, 3), (5, 6), (5, 5), (25, 1), (24, 1)]
    front = pareto_front(pts)
    assert front == [5, 0, 2, 1, 4, 7]  # (5,6) (10,5) (15,4) (20,3) twice (25,1)
    assert 3 not in front and 6 not in front and 8 not in front  # (12,4) < (15,4); (5,5) < (5,6); (24,1) < (25,1)
    assert pareto_front([]) == []


def rows_for(points, tpots, identical=None):
    return [{"method": f"m{i % 2}", "draft_length": 4, "concurrency": 1 + i, "config": f"c{i}",
             "tokens_per_s": x, "tokens_per_s_per_user": y, "tpot_p50_ms": t,
             "identical": True if identical is None else identical[i], "spread": {"tokens_per_s": [x - 1, x + 1]}}
            for i, ((x, y), t) in enumerate(zip(points, tpots))]


def test_best_per_target_takes_the_fastest_lossless_row_under_each_target(tmp_path):
    rows = rows_for([(10, 9), (30, 5), (50, 2), (60, 1)], [10, 20, 45, 30], identical=[True, True, True, False])
    best = best_per_target(rows, [5, 25, 50])
    assert [b["row"] and b["row"]["config"] for b in best] == [None, "c1", "c2"]  # c3 is fastest but not lossless
    assert [r["config"] for r in frontier_table(rows)] == ["c0", "c1", "c2", "c3"]
    assert plot_frontier(rows, tmp_path / "p.png", "t").stat().st_size > 10_000


def test_plot_labels_of_nearby_points_cover_neither_each_other_nor_a_marker():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from spec_plugins.bench.frontier import _separate

    # Three configurations within a label's height of each other (as sweeps of one method at one load give)
    # and one apart.
    pts = [(14.7, 13.85), (14.9, 13.75), (14.94, 13.67), (20.0, 5.0)]
    fig, ax = plt.subplots(figsize=(11, 7), dpi=120)
    ax.scatter(*zip(*pts), s=70)
    labels = [ax.annotate(f"suffix_tree+adaptive K{i} c1", p, textcoords="offset points", xytext=(7, 5), fontsize=8,
                          arrowprops=dict(arrowstyle="-")) for i, p in enumerate(pts)]
    fig.tight_layout()
    _separate(fig, ax, labels, pts)
    renderer = fig.canvas.get_renderer()
    boxes = []
    for ann in labels:
        ann.update_positions(renderer)
        boxes.append(Text.get_window_extent(ann, renderer))
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    half = 5 * fig.dpi / 72
    for x, y in ax.transData.transform(pts):
        assert not any(b.overlaps(matplotlib.transforms.Bbox.from_extents(x - half, y - half, x + half, y + half))
                       for b in boxes)
    assert labels[3].xyann == (7, 5)  # a label with room keeps its place
    plt.close(fig)


def test_methods_and_their_engine_configs():
    configs = sweep.parse_methods("none,ngram,suffix,suffix_tree,suffix_tree+adaptive", [4, 8], {"profile": "p"})
    assert [c.name for c in configs] == ["none", "ngram K=4", "ngram K=8", "suffix K=4", "suffix K=8",
                                         "suffix_tree K=4", "suffix_tree K=8", "suffix_tree+adaptive K=4",
                                         "suffix_tree+adaptive K=8"]
    ada = configs[-1]
    assert ada.speculative_config() == {"method": "custom_class", "model": "spec_plugins.vllm.SpecPluginsProposer",
                                        "num_speculative_tokens": 8}
    assert ada.additional_config() == {"spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive",
                                                         "policy_options": {"profile": "p"}}}
    assert configs[1].speculative_config()["method"] == "ngram" and configs[1].additional_config() is None
    assert configs[0].serve_args() == [] and "--additional-config" in ada.serve_args()
    assert "decoding_type: UserProvided" in ada.trtllm_yaml() and "decoding_type: NGram" in configs[1].trtllm_yaml()
    assert sweep.parse_methods("spec_plugins:ngram", [2], None)[1].additional_config() == {
        "spec_plugins": {"proposer": "ngram"}}
    # No options: the zero-option form, the policy's prior taken from the engine's device.
    assert sweep.parse_methods("suffix_tree+adaptive", [4], None)[1].additional_config() == {
        "spec_plugins": {"proposer": "suffix_tree", "policy": "adaptive"}}


def test_adaptive_verification_methods_on_vllm_0_34():
    configs = sweep.parse_methods("suffix+av,suffix_tree+av", [8], None, "0.34.0")
    suffix, ours = configs[1], configs[2]
    assert suffix.speculative_config() == {"method": "suffix", "num_speculative_tokens": 8,
                                           "enable_adaptive_verification": True}
    assert ours.speculative_config()["enable_adaptive_verification"] is True and ours.base == "suffix_tree"
    assert suffix.trtllm_yaml() is None  # TensorRT-LLM has no adaptive verification
    with pytest.raises(ValueError, match=r"--methods suffix\+av: adaptive verification is vLLM 0.34's .* the "
                                         r"installed vLLM is 0.32.0"):
        sweep.parse_methods("suffix+av", [8], None, "0.32.0")
    with pytest.raises(ValueError, match=r"--methods ngram\+av: adaptive verification needs per-position"):
        sweep.parse_methods("ngram+av", [8], None, "0.34.0")


@pytest.mark.parametrize("methods,options,match", [
    ("nonsense", None, r"--methods nonsense: unknown"),
    ("ngram+adaptive", {"hardware": "h200"}, r"drives our proposers, not vLLM's 'ngram'"),
    ("dflash:/no/such/dir", None, r"expected dflash:DIR"),
    (",", None, r"expected a comma-separated list"),
])
def test_bad_methods(methods, options, match):
    with pytest.raises(ValueError, match=match):
        sweep.parse_methods(methods, [4], options)


def test_prompt_slices_are_disjoint_and_cover_each_concurrency():
    prompts = load_workload("code")
    slices = sweep.slice_prompts(prompts, 2, [1, 2], per_slice=2)
    ids = [p.id for s in slices.values() for p in s]
    assert len(ids) == len(set(ids)) == 8 and set(slices) == {(0, 1), (0, 2), (1, 1), (1, 2)}
    with pytest.raises(ValueError, match="cannot give 6 rounds x concurrency levels"):
        sweep.slice_prompts(prompts, 3, [1, 4])


def test_replicate_rounds_repeat_the_same_prompts():
    prompts = load_workload("code")
    slices = sweep.slice_prompts(prompts, 3, [1, 2], per_slice=2, replicate=True)
    assert set(slices) == {(r, c) for r in range(3) for c in (1, 2)}
    assert all([p.id for p in slices[(r, c)]] == [p.id for p in slices[(0, c)]] for r in range(3) for c in (1, 2))
    assert not {p.id for p in slices[(0, 1)]} & {p.id for p in slices[(0, 2)]}  # a round never repeats a prompt
    # Only the concurrency levels need distinct prompts: 3 rounds fit where 3 x 2 disjoint slices would not.
    assert len(prompts) < 3 * 2 * 4 and sweep.slice_prompts(prompts, 3, [1, 4], replicate=True)[(2, 4)]
    with pytest.raises(ValueError, match="cannot give 2 concurrency levels"):
        sweep.slice_prompts(prompts[:5], 3, [1, 4], replicate=True)


def test_spec_decode_counters_from_metrics_text():
    text = ("# HELP vllm:spec_decode_num_drafts_total Drafts\n# TYPE vllm:spec_decode_num_drafts_total counter\n"
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 48.0\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n")
    assert sweep.spec_counters(text) == {"num_drafts": 12, "num_draft_tokens": 48, "num_accepted_tokens": 20}
    assert sweep.spec_counters("") == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}


def test_summary_rows_medians_spread_and_identity():
    def load(config, round_, wall, texts, drafts=0, accepted=0):
        reqs = [sweep.RequestResult(f"p{i}", "c", [t], 10, 0.1, 1.0, drafts, accepted, drafts)
                for i, t in enumerate(texts)]
        return sweep.LoadResult(config, round_, 1, wall, reqs, drafts * len(texts), 0, accepted * len(texts))

    configs = sweep.parse_methods("ngram", [4], None)
    plan = sweep.SweepPlan("m", configs, [1], 3, 10, {})
    loads = [load("none", r, w, ["a", "b"]) for r, w in enumerate([2.0, 1.0, 4.0])]
    loads += [load("ngram K=4", r, w, ["a", "b" if r < 2 else "X"], drafts=2, accepted=3)
              for r, w in enumerate([1.0, 0.5, 2.0])]
    rows = sweep.summarize(plan, loads)
    none, ngram = rows
    assert none["tokens_per_s"] == 10.0 and none["spread"]["tokens_per_s"] == [5.0, 20.0]
    assert ngram["tokens_per_s"] == 20.0 and ngram["speedup"] == 2.0
    assert ngram["acceptance_length"] == 1 + 3 / 2 and none["acceptance_length"] is None
    assert none["identical"] and not ngram["identical"]  # round 3's second answer differs
    assert ngram["tpot_p50_ms"] == pytest.approx(100.0)  # (1.0 - 0.1) s over 9 tokens
    cats = sweep.category_acceptance(loads)
    assert {c["config"]: c["acceptance_length"] for c in cats}["ngram K=4"] == 2.5


def test_adaptive_against_the_best_static_k_with_paired_rounds():
    def load(config, round_, wall):
        reqs = [sweep.RequestResult("p", "c", ["a"], 10, 0.1, 1.0, 1, 1, 1)]
        return sweep.LoadResult(config, round_, 1, wall, reqs, 1, 0, 1)

    configs = sweep.parse_methods("suffix_tree,suffix_tree+adaptive", [4, 8], {"profile": "vllm-cpu-smollm2-135m"})
    plan = sweep.SweepPlan("m", configs, [1], 3, 10, {})
    # Round 2 is slow for everyone; adaptive K<=8 is 5% ahead of static K=4 in every round, K=4 beats K=8.
    walls = {"suffix_tree K=4": [1.0, 2.0, 1.1], "suffix_tree K=8": [1.2, 2.4, 1.3],
             "suffix_tree+adaptive K=4": [1.1, 2.2, 1.2], "suffix_tree+adaptive K=8": [1 / 1.05, 2 / 1.05, 1.1 / 1.05]}
    loads = [load(c, r, w) for c, ws in walls.items() for r, w in enumerate(ws)]
    (row,) = sweep.adaptive_vs_static(sweep.summarize(plan, loads))
    assert row["adaptive"] == "suffix_tree+adaptive K=8" and row["best_static"] == "suffix_tree K=4"
    assert row["ratio"] == pytest.approx(1.05) and row["paired"] == pytest.approx(1.05)
    assert row["verdict"] == "at or above" and row["static"] == {"4": pytest.approx(10 / 1.1), "8": pytest.approx(10 / 1.3)}
    # Behind by 2% but inside the other's range; far behind outside it.
    walls["suffix_tree+adaptive K=8"] = [1.02, 2.04, 1.12]
    loads = [load(c, r, w) for c, ws in walls.items() for r, w in enumerate(ws)]
    (row,) = sweep.adaptive_vs_static(sweep.summarize(plan, loads))
    assert row["verdict"] == "below, within spread" and row["paired"] == pytest.approx(1 / 1.02)
    walls["suffix_tree+adaptive K=8"] = walls["suffix_tree+adaptive K=4"] = [3.0, 3.0, 3.0]
    loads = [load(c, r, w) for c, ws in walls.items() for r, w in enumerate(ws)]
    assert sweep.adaptive_vs_static(sweep.summarize(plan, loads))[0]["verdict"] == "below"
    # A sweep without static rows of the proposer compares nothing.
    assert sweep.adaptive_vs_static([r for r in sweep.summarize(plan, loads) if "adaptive" in r["method"]]) == []


def test_render_redoes_the_best_configs_from_results_json(tmp_path):
    rows = rows_for([(10, 9), (30, 5)], [40, 60])
    for r, (m, k) in zip(rows, [("suffix_tree+adaptive", 8), ("none", None)]):
        r.update(method=m, draft_length=k, config=m if k is None else f"{m} K={k}")
    (tmp_path / "results.json").write_text(json.dumps({"format": sweep.FORMAT, "model": "/m/SmolLM2", "workload": "code",
                                                       "max_tokens": 8, "rounds": 1, "rows": rows}))
    doc = sweep.render(tmp_path, [50, 100])
    assert [b["config"] for b in doc["best"]] == ["suffix_tree+adaptive K=8", "none"]
    assert doc["best"][0]["additional_config"]["spec_plugins"] == {"proposer": "suffix_tree", "policy": "adaptive"}
    assert json.loads((tmp_path / "best_configs.json").read_text()) == doc["best"]
    with pytest.raises(ValueError, match="no readable results.json"):
        sweep.render(tmp_path / "nowhere", [1])


def test_client_opens_a_fresh_connection_per_request():
    """No pooled keep-alive connection is reused (one the server closed while idle fails the next request)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from spec_plugins.bench.sweep import Client

    peers = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive on the server's side

        def do_GET(self):
            peers.append(self.client_address)
            body = json.dumps({"object": "list", "data": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{server.server_port}", "m", 4)
        for _ in range(3):
            client.openai.models.list()
    finally:
        server.shutdown()
    assert len(peers) == 3 and len(set(peers)) == 3
