"""Faults through `vllm serve` with our suffix tree + adaptive policy: the server keeps serving, nothing is lost.

One server (loopback only, the matrix's 32-token target, float32) takes, from 32 client threads at once:

* streamed greedy completions on a fixed set of token-id prompts, a third of them closed by the client after
  a random number of chunks (0-5);
* requests whose `max_tokens` reaches past `max_model_len`, and malformed bodies (invalid JSON, a prompt of the
  wrong type, a negative temperature, an unknown field type), each of which must get a 4xx answer.

Then: every completed answer equals the offline no-speculation answer for its prompt; the drafting layer's
tracked requests are back to zero once the load stops (the trace's finish lines, SPEC_PLUGINS_TRACE_FILE);
the server tree's resident memory after the run is within 5% of after a warm-up of the same mix (500
requests); the server log holds no error
line. CI sends `FAST_REQUESTS`; the whole run (`matrix_full`, SPEC_PLUGINS_MATRIX=full) sends 1,000.
SPEC_PLUGINS_FAULT_REPORT=PATH writes the figures as JSON (docs/results.md, "Serving features").
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .conftest import requires_vllm
from .test_matrix import ADAPTIVE, GREEDY_PROMPTS, matrix_models, ours  # noqa: F401  (matrix_models: a fixture)

pytestmark = [requires_vllm, pytest.mark.vllm]

MAX_TOKENS = 24
MAX_MODEL_LEN = 256
FAST_REQUESTS = 150
FULL_REQUESTS = 1000
WARMUP_REQUESTS = 500
CLIENTS = 32
PROMPTS = GREEDY_PROMPTS + [[4 + (i * 5 + j) % 28 for j in range(12 + 3 * i)] for i in range(7)]


def tree_rss(pid: int) -> int:
    import psutil

    proc = psutil.Process(pid)
    total = 0
    for p in [proc] + proc.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def offline_answers(model: str) -> list[list[int]]:
    from spec_plugins.bench.vllm_run import Engine, EngineRun

    run = EngineRun(model=model, prompts=PROMPTS, max_tokens=MAX_TOKENS, max_model_len=MAX_MODEL_LEN, warmup=False,
                    ignore_eos=True)
    with Engine(run, timeout=900) as eng:
        return eng.generate().token_ids


class Load:
    """The client side: streamed requests (some cancelled), over-long ones, malformed bodies; what came back."""

    def __init__(self, url: str, model: str, seed: int) -> None:
        import httpx

        self.url, self.model, self.rng = url, model, random.Random(seed)
        self.http = httpx.Client(timeout=300)
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "completed": 0, "cancelled": 0, "refused": 0, "failed": 0}
        self.answers: list[tuple[int, list[int]]] = []
        self.failures: list[str] = []

    def _count(self, key: str, detail: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if detail is not None and len(self.failures) < 20:
                self.failures.append(detail)

    def stream(self, i: int, cancel_after: int | None) -> None:
        body = {"model": self.model, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "stream": True, "ignore_eos": True, "return_token_ids": True}
        tokens: list[int] = []
        with self.http.stream("POST", f"{self.url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return self._count("failed", f"stream: HTTP {r.status_code} {r.read()[:200]!r}")
            chunks = 0
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunks += 1
                if cancel_after is not None and chunks > cancel_after:
                    return self._count("cancelled")  # leaving the block closes the connection mid-stream
                tokens += json.loads(line[6:])["choices"][0].get("token_ids") or []
        if cancel_after is not None and len(tokens) < MAX_TOKENS:
            return self._count("failed", f"stream {i} ended after {len(tokens)} tokens")
        with self.lock:
            self.answers.append((i, tokens))
        self._count("completed")

    def bad(self, kind: int) -> None:
        bodies = [
            {"model": self.model, "prompt": PROMPTS[0], "max_tokens": MAX_MODEL_LEN + 50},  # past max_model_len
            b'{"model": "x", "prompt": [4, 5',  # invalid JSON
            {"model": self.model, "prompt": 5, "max_tokens": 4},  # a prompt of the wrong type
            {"model": self.model, "prompt": PROMPTS[1], "temperature": -1.0},
            {"model": self.model, "prompt": PROMPTS[2], "max_tokens": "many"},
        ]
        body = bodies[kind % len(bodies)]
        if isinstance(body, bytes):
            r = self.http.post(f"{self.url}/v1/completions", content=body, headers={"content-type": "application/json"})
        else:
            r = self.http.post(f"{self.url}/v1/completions", json=body)
        self._count("refused" if 400 <= r.status_code < 500 else "failed",
                    None if 400 <= r.status_code < 500 else f"bad body {kind}: HTTP {r.status_code}")

    def one(self, n: int) -> None:
        with self.lock:
            self.counts["sent"] += 1
            roll, i, cut = self.rng.random(), self.rng.randrange(len(PROMPTS)), self.rng.randrange(6)
        try:
            if roll < 0.05:
                self.bad(n)
            else:
                self.stream(i, cut if roll < 0.05 + 0.95 / 3 else None)
        except Exception as exc:  # noqa: BLE001 (a client error is a finding, counted)
            self._count("failed", f"{type(exc).__name__}: {exc}")

    def run(self, n: int) -> None:
        with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
            list(pool.map(self.one, range(n)))


def _trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("requests", [pytest.param(FAST_REQUESTS, id="fast"),
                                      pytest.param(FULL_REQUESTS, id="full", marks=pytest.mark.matrix_full)])
def test_faults_leave_the_server_serving_and_nothing_tracked(requests, matrix_models, tmp_path):
    from spec_plugins.bench.serve import VllmServer
    from spec_plugins.bench.vllm_run import CPU_ENV_DEFAULTS

    model = matrix_models["llama"]["target"]
    want = offline_answers(model)
    spec, extra = ours("suffix_tree", ADAPTIVE)
    trace, log = tmp_path / "trace.jsonl", tmp_path / "server.log"
    args = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--seed", "0",
            "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(extra)]
    env = {**CPU_ENV_DEFAULTS, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "SPEC_PLUGINS_TRACE_FILE": str(trace)}
    start = time.monotonic()
    with VllmServer(model, args, log, env=env, health_timeout=600) as server:
        # Warm-up: the same mix at the same concurrency, so the batch sizes and buffers of the run are reached
        warm = Load(server.url, model, seed=1)
        warm.run(WARMUP_REQUESTS)
        time.sleep(2)
        rss_warm = tree_rss(server.pid)
        load = Load(server.url, model, seed=2)
        rss_by_part = []  # after each part of the run: growth that levels off, or keeps on
        parts = max(1, requests // 250)
        for _ in range(parts):
            load.run(requests // parts)
            time.sleep(3)  # the engine's drain step hands the last ends to the runner
            rss_by_part.append(round(tree_rss(server.pid) / 2**20, 1))
        rss_after = tree_rss(server.pid)
        at_rest = _trace(trace)
        alive = Load(server.url, model, seed=3)
        alive.stream(0, None)  # still serving
        served_log = log.read_text(errors="replace")  # before shutdown, whose own lines are vLLM's to judge
        spec_counts = server.spec_decode_counts()  # vLLM's own counters: drafts made and accepted
    errors = [line for line in served_log.splitlines() if " ERROR " in line or line.startswith("Traceback")]
    figures = {**load.counts, "requests": requests, "clients": CLIENTS,
               "wrong_answers": sum(1 for i, tokens in load.answers if tokens != want[i]),
               "tracked_after_load": next((e["tracked"] for e in reversed(at_rest) if "tracked" in e), None),
               "finished": sum(1 for e in at_rest if "finish" in e),
               "rss_warm_mib": round(rss_warm / 2**20, 1), "rss_after_mib": round(rss_after / 2**20, 1),
               "rss_by_part_mib": rss_by_part,
               "server_error_lines": len(errors), "drafts": sum(1 for e in at_rest if any(e.get("drafted", ()))),
               "vllm_spec_decode": spec_counts,
               "seconds": round(time.monotonic() - start, 1)}
    if os.environ.get("SPEC_PLUGINS_FAULT_REPORT"):
        Path(os.environ["SPEC_PLUGINS_FAULT_REPORT"]).write_text(json.dumps(figures, indent=1) + "\n")
    assert load.counts["failed"] == 0, load.failures
    assert load.counts["sent"] == requests // parts * parts == sum(load.counts[k] for k in ("completed", "cancelled", "refused"))
    assert load.counts["cancelled"] > requests // 5 and load.counts["refused"] > 0, figures
    assert figures["wrong_answers"] == 0, figures
    assert alive.counts["completed"] == 1, alive.failures
    assert figures["drafts"] > 0 and spec_counts["drafts"] > 0, "speculation did not run"
    assert spec_counts["accepted"] > 0, figures  # and its drafts were accepted
    assert figures["tracked_after_load"] == 0, figures
    assert rss_after <= 1.05 * rss_warm, figures
    assert errors == [], errors[:5]
