"""Replay benchmark: the walk, its statistics, traces and CLI errors (no engine, tiny tokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spec_plugins.bench import replay
from spec_plugins.bench.replay import Row, TextTokenizer, load_workload, run_workload, walk
from spec_plugins.core import Draft
from spec_plugins.proposers.ngram import NgramProposer
from spec_plugins.traces import TRACE_FORMAT, read_trace

K = 4
TEXTS = [
    ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
     "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"),
    ("List the colours: red, green, blue.", "red, green, blue, red, green, blue, and red again."),
    ("Say hi.", "Hello! Hello! Hello there, hello."),
    ("Repeat: the cat sat on the mat.", "The cat sat on the mat. The cat sat on the mat."),
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    from spec_plugins.tiny_models import build_local_tokenizer

    d = tmp_path_factory.mktemp("tok")
    build_local_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wl") / "tiny.jsonl"
    with open(path, "w") as f:
        for k, (prompt, response) in enumerate(TEXTS):
            f.write(json.dumps({"id": f"r{k}", "prompt": prompt, "response": response, "chat": k % 2 == 0}) + "\n")
    return path


@pytest.fixture(scope="module")
def rows(tok_dir, workload) -> list[Row]:
    return load_workload(workload, TextTokenizer(tok_dir))


def brute_ngram(ctx: list[int], k: int, lo: int = 2, hi: int = 5) -> list[int]:
    """Longest n-gram (hi down to lo) ending ctx that occurs earlier; earliest occurrence; next k tokens."""
    for n in range(min(hi, len(ctx) - 1), lo - 1, -1):
        tail = ctx[-n:]
        for s in range(len(ctx) - n):
            if ctx[s:s + n] == tail:
                return ctx[s + n:s + n + k]
    return []


def brute_walk(prompt: list[int], response: list[int], k: int) -> list[tuple[int, int, int]]:
    steps, i = [], 1
    while i < len(response):
        draft = brute_ngram(prompt + response[:i], k)
        a = 0
        while a < len(draft) and i + a < len(response) and draft[a] == response[i + a]:
            a += 1
        steps.append((i, len(draft), a))
        i += a + 1
    return steps


class Oracle:
    """Drafts the true continuation: every step accepts everything it can."""

    def __init__(self, truth: dict[str, np.ndarray]) -> None:
        self.truth = truth

    def propose(self, requests):
        return [Draft(self.truth[r.req_id][len(r.tokens):len(r.tokens) + r.max_draft].tolist()) for r in requests]

    def finish(self, req_id) -> None:
        pass


class Recorder:
    """Checks what the walk sends against the protocol: growing context, num_new, finish last."""

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}
        self.finished: list[str] = []

    def propose(self, requests):
        for r in requests:
            assert r.req_id not in self.finished
            tokens = list(r.tokens)
            before = self.seen.get(r.req_id)
            if before is None:
                assert r.num_new == len(tokens)
            else:
                assert tokens[: len(tokens) - r.num_new] == before and r.num_new >= 1
            self.seen[r.req_id] = tokens
        return [Draft([0] * r.max_draft, confidence=[0.5] * r.max_draft) for r in requests]

    def finish(self, req_id) -> None:
        self.finished.append(req_id)


def test_hand_computed_walk() -> None:
    row = Row("x", np.array([5, 6, 7, 8, 5, 6], np.int32), np.array([7, 8, 5, 6, 7, 1, 2], np.int32))
    w = walk(NgramProposer(), row, max_draft=3)
    # pos 1: context ..5,6,7 matches the prompt's 5,6,7 -> draft 8,5,6, all right (+ bonus 7);
    # pos 5: 7,8,5,6,7 matches earlier -> draft 8,5,6, truth is 1: none; pos 6: token 1 never seen.
    assert list(zip(w.pos, w.drafted, w.accepted)) == [(1, 3, 3), (5, 3, 0), (6, 0, 0)]
    s = replay.summarize([w], None)
    assert s["acceptance_length"] == pytest.approx(2.0)
    assert (s["steps"], s["drafted_tokens"], s["accepted_tokens"]) == (3, 6, 3)
    assert s["update_us_per_token"] is None


def test_mrv2_accounting_verifies_the_filler_too() -> None:
    """Model Runner V2 pads a draft to K with the last token and verifies all K: a filler slot that matches the truth
    counts, and only then."""
    truth = np.array([5, 6, 7, 7, 7, 9], np.int32)
    assert replay.verified([5, 6], truth, None, 7) == 2
    assert replay.verified([5, 6], truth, 5, 7) == 5  # 7, 7, 7 filler slots match
    assert replay.verified([5, 9], truth, 5, 7) == 1
    assert replay.verified([], truth, 3, 5) == 1 and replay.verified([], truth, None, 5) == 0
    # the hand-computed walk above, counted as MRV2 verifies: at pos 6 the filler is 1 (the last token), truth 2
    row = Row("x", np.array([5, 6, 7, 8, 5, 6], np.int32), np.array([7, 8, 5, 6, 7, 1, 2], np.int32))
    w = walk(NgramProposer(), row, max_draft=3, fill=True)
    assert list(zip(w.pos, w.drafted, w.accepted)) == [(1, 3, 3), (5, 3, 0), (6, 0, 0)]
    row = Row("y", np.array([3, 4], np.int32), np.array([4, 4, 4, 4, 4], np.int32))
    w = walk(NgramProposer(), row, max_draft=3, fill=True)
    assert w.drafted[0] == 0 and w.accepted[0] == 3  # nothing drafted; the filler 4, 4, 4 is right


def test_ngram_walk_matches_brute_force(rows) -> None:
    total = 0
    for row in rows:
        w = walk(NgramProposer(), row, K)
        expected = brute_walk(row.prompt.tolist(), row.response.tolist(), K)
        assert list(zip(w.pos, w.drafted, w.accepted)) == expected
        total += sum(w.accepted)
    assert total > 0  # the texts repeat themselves: something must be accepted


def test_oracle_accepts_max_draft_except_at_the_end(rows) -> None:
    oracle = Oracle({r.id: np.concatenate([r.prompt, r.response]) for r in rows})
    for row in rows:
        w = walk(oracle, row, K)
        assert all(a == K for a in w.accepted[:-1])
        assert w.accepted[-1] == min(K, row.response.size - w.pos[-1])
        assert w.pos[-1] + w.accepted[-1] + 1 >= row.response.size
    s = replay.summarize([walk(oracle, r, K) for r in rows], None)
    assert s["acceptance_rate"] == 1.0  # never wrong; only final steps draft fewer than K


def test_walk_follows_the_protocol(rows) -> None:
    rec = Recorder()
    for row in rows:
        w = walk(rec, row, K)
        assert rec.finished[-1] == row.id and len(rec.seen[row.id]) == row.prompt.size + w.pos[-1]
    assert rec.finished == [r.id for r in rows]


def test_chat_rows_use_the_template(tok_dir) -> None:
    tok = TextTokenizer(tok_dir)
    assert len(tok.prompt("hello", chat=True)) > len(tok.prompt("hello", chat=False))


def test_cli_json_and_traces(tmp_path, tok_dir, workload, monkeypatch) -> None:
    from spec_plugins import registry

    registry.available_proposers()  # load entry points first, so the patch below is all that is undone
    monkeypatch.setitem(registry._proposers, "replay_test_conf", lambda **o: Recorder())
    out, traces = tmp_path / "out.json", tmp_path / "traces"
    rc = replay.main(["--workload", str(workload), "--proposers", "ngram,replay_test_conf", "--max-draft", str(K),
                      "--tokenizer", str(tok_dir), "--json", str(out), "--trace-out", str(traces),
                      "--options", 'ngram={"max_ngram": 4}', "--no-progress"])
    assert rc == 0
    report = json.loads(out.read_text())
    stats = report["workloads"]["tiny"]["proposers"]["ngram"]
    for key in ("acceptance_length", "speculate_us_median", "update_us_per_token", "steps", "finish_us_per_token"):
        assert key in stats
    assert report["proposers"]["ngram"]["steps"] == stats["steps"]
    assert report["config"]["options"]["ngram"] == {"min_ngram": 2, "max_ngram": 4, "threads": -1, "parallel_from": 64,
                                                 "confidence": True}

    for name, has_conf in (("ngram", True), ("replay_test_conf", True)):  # n-gram: from its match lengths
        doc = read_trace(traces / "tiny" / f"{name}.json")
        assert doc["format"] == TRACE_FORMAT and doc["max_draft"] == K and doc["proposer"] == name
        assert [r["id"] for r in doc["requests"]] == [f"r{k}" for k in range(len(TEXTS))]
        steps = 0
        for req in doc["requests"]:
            pos = [s["pos"] for s in req["steps"]]
            assert pos[0] == 1
            for s, nxt in zip(req["steps"], pos[1:] + [None]):
                assert set(s) == ({"pos", "drafted", "accepted", "confidence"} if has_conf else {"pos", "drafted", "accepted"})
                assert 0 <= s["accepted"] <= s["drafted"] <= K
                if has_conf:
                    assert len(s["confidence"]) == s["drafted"]
                if nxt is not None:
                    assert nxt == s["pos"] + s["accepted"] + 1
            steps += len(req["steps"])
        assert steps == report["workloads"]["tiny"]["proposers"][name]["steps"]


def test_unknown_proposer_and_bad_options(capsys, workload) -> None:
    with pytest.raises(ValueError, match=r"unknown name 'sufix'.*ngram"):
        replay.make_proposer("sufix")
    assert replay.main(["--workload", str(workload), "--proposers", "ngram,sufix", "--no-progress"]) == 2
    assert "unknown name 'sufix'" in capsys.readouterr().err
    assert replay.main(["--workload", str(workload), "--proposers", "ngram",
                        "--options", 'ngram={"max_ngarm": 3}', "--no-progress"]) == 2
    assert "max_ngarm" in capsys.readouterr().err
    with pytest.raises(ValueError, match="NAME=JSON"):
        replay.parse_options(["ngram"])
    assert replay.parse_options(['{"a": {"x": 1}}', 'a={"y": 2}']) == {"a": {"x": 1, "y": 2}}


def test_labels_run_one_proposer_twice() -> None:
    assert isinstance(replay.make_proposer("ngram@small", {"max_ngram": 2}), NgramProposer)
    assert replay.effective_options("ngram@small", {"max_ngram": 2}) == {"min_ngram": 2, "max_ngram": 2, "threads": -1,
                                                                         "parallel_from": 64, "confidence": True}


def test_arctic_adapter_on_a_repetitive_sequence(rows) -> None:
    pytest.importorskip("arctic_inference.suffix_decoding",
                        reason="arctic-inference not installed (bench extra; builds from source)")
    from spec_plugins.bench.baselines import ArcticSuffix

    arctic = ArcticSuffix()
    pattern = [11, 12, 13, 14, 15]
    row = Row("rep", np.array(pattern * 4, np.int32), np.array(pattern * 6, np.int32))
    w = walk(arctic, row, K)
    assert w.drafted[0] > 0 and w.accepted[0] == w.drafted[0]  # the prompt already holds the loop
    assert replay.summarize([w], None)["acceptance_length"] > 3
    assert all(c is not None and len(c) == d for c, d in zip(w.confidence, w.drafted))
    assert arctic.cache.active_requests == set() and "rep" in arctic.cache.cached_requests
    ns, n = replay.update_ns(ArcticSuffix(), [row], [w])
    assert n == w.pos[-1] - w.pos[0] and ns > 0  # every chunk the drafting walk fed, after the first
    assert arctic.propose([replay.DraftRequest("other", pattern * 2, 10, 0)])[0].tokens == []


def test_vllm_ngram_matches_ngram(tmp_path, tok_dir, workload) -> None:
    """vLLM's kernel and ours implement the same rule; run in a child: numba must not load in this process."""
    pytest.importorskip("vllm", reason="vLLM not installed")
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-m", "spec_plugins.bench.replay", "--workload", str(workload),
                    "--proposers", "ngram,vllm_ngram", "--max-draft", str(K), "--tokenizer", str(tok_dir),
                    "--trace-out", str(tmp_path), "--json", str(out), "--no-progress"],
                   check=True, capture_output=True, timeout=120)
    def drafts(name):  # ours also carries confidences (from the match length); the drafts are the rule's
        reqs = read_trace(tmp_path / "tiny" / f"{name}.json")["requests"]
        return [[(s["pos"], s["drafted"], s["accepted"]) for s in r["steps"]] for r in reqs]

    assert drafts("ngram") == drafts("vllm_ngram")


def test_batched_walk_drafts_what_propose_drafts(rows) -> None:
    for name in ("suffix_tree", "ngram"):
        single, batched = replay.make_proposer(name, {}), replay.make_proposer(name, {})
        for row in rows[:4]:
            a = replay.walk(single, row, 8)
            b = replay.walk(batched, row, 8, batched=True)
            assert (a.drafted, a.accepted, a.confidence) == (b.drafted, b.accepted, b.confidence)


def test_suffix_tree_traces_record_the_kind_and_calibrate(tmp_path, tok_dir, workload) -> None:
    from spec_plugins.bench import calibration

    traces = tmp_path / "traces"
    assert replay.main(["--workload", str(workload), "--proposers", "suffix_tree", "--max-draft", str(K),
                        "--tokenizer", str(tok_dir), "--trace-out", str(traces), "--no-progress"]) == 0
    path = traces / "tiny" / "suffix_tree.json"
    doc = read_trace(path)
    steps = [s for r in doc["requests"] for s in r["steps"]]
    assert {s.get("kind") for s in steps if s["drafted"]} <= {"copy", "count"}
    assert any(s.get("kind") == "copy" for s in steps)  # the texts repeat themselves
    assert all("kind" not in s for s in steps if not s["drafted"])
    out = tmp_path / "cal.json"
    assert calibration.main(["--traces", str(path), "--json", str(out), "--png", str(tmp_path / "c.png")]) == 0
    rows = json.loads(out.read_text())["rows"]
    total = next(r for r in rows if r["kind"] == "all" and r["positions"] == "all")
    # Every tried token is counted once: the tokens accepted plus one rejected per step that drafted more.
    assert total["tries"] == sum(min(s["accepted"] + 1, s["drafted"]) for s in steps)
    by_kind = sum(r["tries"] for r in rows if r["kind"] != "all" and r["positions"] == "all")
    assert by_kind == total["tries"]
    assert (tmp_path / "c.png").stat().st_size > 5_000


def test_interleaved_walk_replays_what_one_at_a_time_does_where_no_request_sees_another(rows) -> None:
    """One in flight: the sequential walk exactly. Several: a proposer without a cross-request cache (n-gram, the
    suffix tree with its global tree off) drafts each request as alone, and the protocol holds per request."""
    for name, opts in (("suffix_tree", {}), ("ngram", {}), ("suffix_tree", {"max_cached_requests": 0})):
        sequential = replay.make_proposer(name, opts)
        alone = [walk(sequential, row, K) for row in rows]
        one = replay.walk_interleaved(replay.make_proposer(name, opts), rows, K, concurrency=1)
        assert [(w.pos, w.drafted, w.accepted, w.confidence) for w in one] == \
               [(w.pos, w.drafted, w.accepted, w.confidence) for w in alone]
        if name == "ngram" or opts:
            many = replay.walk_interleaved(replay.make_proposer(name, opts), rows, K, concurrency=3)
            assert [(w.pos, w.drafted, w.accepted) for w in many] == [(w.pos, w.drafted, w.accepted) for w in alone]
    class BatchRecorder(Recorder):
        def propose(self, requests):
            self.widest = max(getattr(self, "widest", 0), len(requests))
            return super().propose(requests)

    rec = BatchRecorder()
    walks = replay.walk_interleaved(rec, rows, K, concurrency=3)
    assert rec.widest == 3 and sorted(rec.finished) == sorted(r.id for r in rows)
    for w, row in zip(walks, rows):
        assert len(rec.seen[row.id]) == row.prompt.size + w.pos[-1]


def test_interleaved_walk_lets_in_flight_caching_help() -> None:
    """Two in flight: a random response A beside a short filler, then a copy of A, which starts when the filler
    ends and A is part way. With cache_in_flight the copy drafts from A's partial response and takes fewer steps;
    with only finished responses cached it cannot (A is not finished), and random text drafts nothing else."""
    rng = np.random.default_rng(5)
    text = rng.integers(0, 1000, size=200).astype(np.int32)
    order = [Row("a", rng.integers(0, 1000, size=8).astype(np.int32), text),
             Row("filler", rng.integers(0, 1000, size=8).astype(np.int32), rng.integers(0, 1000, size=30).astype(np.int32)),
             Row("copy", rng.integers(0, 1000, size=8).astype(np.int32), text)]
    plain = replay.walk_interleaved(replay.make_proposer("suffix_tree", {}), order, K, concurrency=2)
    shared = replay.walk_interleaved(replay.make_proposer("suffix_tree", {"cache_in_flight": True}), order, K,
                                     concurrency=2)
    # A is ~30 tokens ahead when the copy starts: with A's partial response the copy catches up in drafts of K;
    # without it, one token a step (random text, nothing else to draft from) until A finishes.
    def steps_to(w, position):
        return next(k for k, p in enumerate(w.pos) if p >= position)

    assert steps_to(shared[2], 25) <= 10 and steps_to(plain[2], 25) >= 20


def test_cli_concurrency(tmp_path, tok_dir, workload) -> None:
    out = tmp_path / "out.json"
    assert replay.main(["--workload", str(workload), "--proposers", "ngram", "--tokenizer", str(tok_dir),
                        "--concurrency", "2", "--json", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["concurrency"] == 2 and report["proposers"]["ngram"]["requests"] == len(TEXTS)
    assert replay.main(["--workload", str(workload), "--concurrency", "0", "--no-progress"]) == 2
    assert replay.main(["--workload", str(workload), "--concurrency", "2", "--batched", "--no-progress"]) == 2


def test_continued_suffix_tree_extends_the_trees_draft_and_only_that(rows) -> None:
    """The MRV2 filler candidate: the suffix tree's own draft, continued by the tree past where it stops."""
    from spec_plugins.core import DraftRequest
    from spec_plugins.registry import create_proposer

    continued = replay.make_proposer("suffix_tree_continued")
    plain = create_proposer("suffix_tree", {})
    for row in rows:
        seq = np.concatenate([row.prompt, row.response]).astype(np.int32)
        seen = 0
        for end in range(len(row.prompt) + 1, len(seq), 7):
            req = DraftRequest(row.id, seq[:end], end - seen, K)
            a, b = plain.propose([req])[0].tokens, continued.propose([req])[0].tokens
            seen = end
            assert list(b[: len(a)]) == list(a) and len(b) <= K
        plain.finish(row.id)
        continued.finish(row.id)

    class Fixed:
        def __init__(self, tokens):
            self.tokens = tokens

        def propose(self, requests):
            return [Draft(list(self.tokens)) for _ in requests]

    req = DraftRequest("x", np.arange(1, 9, dtype=np.int32), 8, 4)
    continued.primary, continued.extender = Fixed([3, 4]), Fixed([3, 4, 5, 6, 7, 8])
    assert continued.propose([req])[0].tokens == [3, 4, 5, 6]  # continued up to K
    continued.extender = Fixed([3, 9, 9])
    assert continued.propose([req])[0].tokens == [3, 4]  # another path: the draft stays as it is


def test_vllm034_suffix_says_where_it_runs(monkeypatch) -> None:
    """vLLM 0.34's own suffix kernels run only interpreted, in .venv-vllm034: elsewhere one line says so (the
    contract tests run it there: integration_tests/test_vllm_contract.py)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"^proposer vllm034_suffix: runs vLLM 0.34's Triton kernels in Triton's "
                                         r"interpreter: set TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="):
        replay.make_proposer("vllm034_suffix")
    assert "vllm034_suffix" in replay.proposer_names()
    assert replay.effective_options("vllm034_suffix", None)["corpus_tokens"] == 1 << 20


@pytest.mark.parametrize("fill", [False, True])
def test_paired_scores_walk_to_what_the_replay_reports(rows, fill) -> None:
    """bench.paired drafts at every position; a walk read off its scores is the replay's own walk (for proposers
    whose drafts depend only on the context: vLLM 0.34's suffix without its statistics, ngram), and the better of
    the two at every step is at least either."""
    from spec_plugins.bench.paired import score_positions, summarize

    names = ("ngram", "vllm034_suffix_np")
    scores = score_positions(rows, names, {}, 6, fill)
    assert len(scores["a"]) == sum(len(r.response) - 1 for r in rows)
    result = run_workload("tiny", "tiny.jsonl", rows, list(names), {}, 6, fill=fill)
    summary = summarize(scores)
    for side, name in zip("ab", names):
        walked = result.walks[name]
        want = sum(sum(a + 1 for a in w.accepted) for w in walked) / sum(len(w.accepted) for w in walked)
        assert summary["walk"][side] == pytest.approx(want, abs=1e-4), (name, summary["walk"])
    assert summary["walk"]["oracle"] >= max(summary["walk"]["a"], summary["walk"]["b"])
    assert summary["all"]["a_wins"] + summary["all"]["b_wins"] + summary["all"]["ties"] == pytest.approx(1.0, abs=1e-3)
    kinds = set(summary["by_kind"])
    assert any(k.endswith("/ local") for k in kinds), kinds  # vLLM's replay reports where each draft came from
