"""`spec-plugins sweep`: mechanisms x draft lengths x load on a real `vllm serve`, the Pareto frontier, the
configurations to deploy.

    spec-plugins sweep --model smollm2 --workload spec_bench --workload code \\
        --methods none,ngram,suffix,suffix_tree,suffix_tree+adaptive --draft-lengths 4,8,16 \\
        --concurrency 1,4 --max-tokens 96 --rounds 3 --tpot-ms 20,40 --out sweep-out

Per round and configuration it starts `vllm serve` on 127.0.0.1 (stopped by its PID when the round is done,
also when a request fails), warms it up, then sends each concurrency level its own prompts with the OpenAI
client, streaming, so each request's time to first token and time per output token are measured; vLLM's
spec-decode counters (`/metrics`) give drafted and accepted tokens. Configurations take turns within a
round, their order rotating, and within a round each concurrency level has prompts the server has not seen (a
proposer that remembers answers would answer a repeated one from memory). Every round starts new servers, so
every round runs the same prompts: rounds are replicates that differ only by the machine. With `--url` (one
server for all rounds) each round takes new prompts instead. Greedy outputs are compared with the no-speculation
run's, prompt by prompt.

Methods: `none`; vLLM's own `ngram` and `suffix`; our proposers by name (`suffix_tree`, `spec_plugins:ngram`,
any registered one) with `+adaptive` for the adaptive draft-length policy; `dflash:DIR` (a DFlash or DSpark
checkpoint in vLLM's DFlash path). On vLLM 0.34+ `+av` (last) turns on vLLM's adaptive verification for `suffix`
and ours (`suffix+av`, `suffix_tree+av`): the configuration the simulation finds best there. Each runs at every
`--draft-lengths` K (`none` once).

Writes to --out: results.csv / results.json (one row per method, K and concurrency: medians over rounds with
their min-max spread), pareto.png, categories.csv (acceptance per workload category, from the concurrency-1
runs where requests go one at a time), best_configs.json (per --tpot-ms target the best lossless row as a
ready `--speculative-config` / `--additional-config` pair, and TensorRT-LLM YAML where the mechanism exists
there), adaptive.csv (each `+adaptive` method's best cap against the best static K of its proposer, per
concurrency: medians, spreads, the median of the per-round ratios and a verdict), responses.jsonl (the
no-speculation answers) and traces/ (acceptance traces of our proposers replayed
on those answers: `spec-plugins plan --acceptance traces/...` reads them).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from spec_plugins.bench.vllm_run import round_order
from spec_plugins.demo import native_config, plugin_config, plugin_section
from spec_plugins.bench.workloads import Prompt, load_workload

FORMAT = "spec-plugins-sweep/1"
NATIVE = ("ngram", "suffix")
WARMUP_PROMPT = "Name three colours."  # a prompt of its own: warming up on a timed one would help proposers that remember


class SweepError(RuntimeError):
    """A configuration failed (its server, or one of its requests)."""


# ---- configurations -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One mechanism at one draft length (None for no speculation)."""

    method: str
    k: int | None
    policy_options: tuple = ()  # (key, value) pairs of the adaptive policy's options

    @property
    def name(self) -> str:
        return self.method if self.k is None else f"{self.method} K={self.k}"

    @property
    def adaptive(self) -> bool:
        return self.method.endswith("+adaptive")

    @property
    def verification(self) -> bool:
        """`+av`: vLLM 0.34's adaptive verification (`enable_adaptive_verification`) on."""
        return self.method.endswith(AV)

    @property
    def base(self) -> str:
        """The method without `+av` (which only adds vLLM's own switch)."""
        return self.method.removesuffix(AV)

    def speculative_config(self) -> dict | None:
        base = self.base
        if base == "none":
            return None
        if base in NATIVE:
            conf = native_config(base, self.k)
        elif base.startswith("dflash:"):
            conf = {"method": "dflash", "model": base[len("dflash:"):], "num_speculative_tokens": self.k}
        else:
            conf = plugin_config(base.removeprefix("spec_plugins:"), self.k, dict(self.policy_options))[0]
        return {**conf, "enable_adaptive_verification": True} if self.verification else conf

    def additional_config(self) -> dict | None:
        """vLLM 0.32 / 0.33 only: our settings travel in speculator_options on 0.34+."""
        base = self.base
        if base == "none" or base in NATIVE or base.startswith("dflash:"):
            return None
        return plugin_config(base.removeprefix("spec_plugins:"), self.k, dict(self.policy_options))[1]

    def plugin_section(self) -> dict:
        """Our settings, whatever the vLLM version: the `spec_plugins` section of the TensorRT-LLM YAML."""
        name, section = plugin_section(self.base.removeprefix("spec_plugins:"), dict(self.policy_options))
        return {"spec_plugins": {"proposer": name, **section}}

    def serve_args(self) -> list[str]:
        args = []
        if (spec := self.speculative_config()) is not None:
            args += ["--speculative-config", json.dumps(spec)]
        if (extra := self.additional_config()) is not None:
            args += ["--additional-config", json.dumps(extra)]
        return args

    def trtllm_yaml(self) -> str | None:
        """The same mechanism as a TensorRT-LLM config file, where TensorRT-LLM has it."""
        import yaml

        if self.method == "none" or self.verification:  # TensorRT-LLM has no adaptive verification
            return None
        if self.method == "ngram":
            spec = {"decoding_type": "NGram", "max_draft_len": self.k, "max_matching_ngram_size": 5}
            doc = {"disable_overlap_scheduler": True, "speculative_config": spec}
            head = "# TensorRT-LLM's own n-gram drafter (PyTorch backend):\n#   trtllm-serve MODEL --backend pytorch --config THIS\n"
        elif self.method == "suffix":
            doc = {"speculative_config": {"decoding_type": "SA", "max_draft_len": self.k}}
            head = "# TensorRT-LLM's suffix-automaton drafter (1.3+):\n#   trtllm-serve MODEL --backend pytorch --config THIS\n"
        elif self.method.startswith("dflash:"):
            doc = {"speculative_config": {"decoding_type": "DFlash", "max_draft_len": self.k,
                                          "speculative_model": self.method[len("dflash:"):]}}
            head = "# TensorRT-LLM's DFlash (1.3+):\n#   trtllm-serve MODEL --backend pytorch --config THIS\n"
        else:
            doc = {"speculative_config": {"decoding_type": "UserProvided", "max_draft_len": self.k},
                   "disable_overlap_scheduler": True, **self.plugin_section()}
            head = "# Our proposer as a TensorRT-LLM user-provided drafter:\n#   spec-plugins trtllm serve MODEL --config THIS\n"
        return head + yaml.safe_dump(doc, sort_keys=False)


AV = "+av"  # a method's suffix for vLLM 0.34's adaptive verification


def check_adaptive_verification(method: str, ours: set[str], vllm_version: str | None) -> None:
    """`+av` needs vLLM 0.34+ (Model Runner V2) and a method that gives per-position confidences."""
    from spec_plugins.vllm.settings import on_model_runner_v2

    base = method.removesuffix(AV).removesuffix("+adaptive")
    if base != "suffix" and (base in NATIVE or base.removeprefix("spec_plugins:") not in ours):
        raise ValueError(f"--methods {method}: adaptive verification needs per-position confidences: vLLM's "
                         f"'suffix' or one of our proposers ({', '.join(sorted(ours))})")
    if vllm_version is not None and not on_model_runner_v2(vllm_version):
        raise ValueError(f"--methods {method}: adaptive verification is vLLM 0.34's (Model Runner V2, a GPU with "
                         f"full CUDA graphs); the installed vLLM is {vllm_version}")


def parse_methods(methods: str, draft_lengths: Sequence[int], policy_options: dict | None,
                  vllm_version: str | None = None) -> list[Config]:
    """The configurations of `--methods` x `--draft-lengths`; `none` first (the reference of every ratio).
    vllm_version: the vLLM the sweep runs (None: not checked), for what only some versions have (`+av`)."""
    from spec_plugins.registry import available_proposers

    names = [m.strip() for m in methods.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods: expected a comma-separated list, e.g. none,ngram,suffix_tree")
    ours = set(available_proposers())
    out = [Config("none", None)]
    for m in names:
        if m == "none":
            continue
        if m.endswith(AV):
            check_adaptive_verification(m, ours, vllm_version)
        base = m.removesuffix(AV).removesuffix("+adaptive")
        if m.startswith("dflash:"):
            if not Path(m[len("dflash:"):]).is_dir():
                raise ValueError(f"--methods {m}: expected dflash:DIR with a draft checkpoint folder")
        elif base in NATIVE and m.endswith("+adaptive"):
            raise ValueError(f"--methods {m}: the adaptive policy drives our proposers, not vLLM's {base!r}")
        elif base not in NATIVE and base.removeprefix("spec_plugins:") not in ours:
            raise ValueError(f"--methods {m}: unknown; expected none, {', '.join(NATIVE)}, dflash:DIR, or one of "
                             f"our proposers ({', '.join(sorted(ours))}, with +adaptive for the adaptive policy)")
        options = tuple(sorted((policy_options or {}).items())) if m.removesuffix(AV).endswith("+adaptive") else ()
        out += [Config(m, k, options) for k in draft_lengths]
    return out


# ---- one server, one load -------------------------------------------------------------------------------

@dataclass
class RequestResult:
    id: str
    category: str | None
    texts: list[str]
    output_tokens: int
    ttft_s: float
    latency_s: float
    drafted: int | None = None   # concurrency 1 only: this request's own spec-decode counters
    accepted: int | None = None
    drafts: int | None = None

    @property
    def tpot_s(self) -> float | None:
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class LoadResult:
    config: str
    round: int
    concurrency: int
    wall_s: float
    requests: list[RequestResult]
    drafts: int
    draft_tokens: int
    accepted_tokens: int

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)


def spec_counters(metrics_text: str) -> dict[str, int]:
    """vLLM's spec-decode counters (num_drafts, num_draft_tokens, num_accepted_tokens) from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    for family in text_string_to_metric_families(metrics_text):
        name = family.name.removeprefix("vllm:spec_decode_")
        if name in out:
            out[name] += int(sum(s.value for s in family.samples if s.name.endswith("_total") or s.name == family.name))
    return out


class Client:
    """Streaming chat requests to one server (OpenAI client) and its spec-decode counters."""

    def __init__(self, url: str, model: str, max_tokens: int, timeout: float = 600) -> None:
        import httpx
        from openai import DefaultHttpxClient, OpenAI

        self.url, self.model, self.max_tokens = url.rstrip("/"), model, max_tokens
        # A fresh connection per request: a pooled keep-alive connection that the server closed while idle
        # (uvicorn: after 5 s) fails the next request before it is sent, and with no retries (every failure
        # counts here) that would be charged to the configuration.
        http = DefaultHttpxClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=timeout)
        self.openai = OpenAI(base_url=f"{self.url}/v1", api_key="spec-plugins", timeout=timeout, max_retries=0,
                             http_client=http)

    def counters(self) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            return spec_counters(resp.read().decode())

    def chat(self, prompt: Prompt, max_tokens: int | None = None) -> RequestResult:
        """Every turn of `prompt` in order (each answer fed back); timings of the whole conversation."""
        messages: list[dict] = []
        texts, tokens, ttft = [], 0, None
        start = time.perf_counter()
        for turn in prompt.turns:
            messages.append({"role": "user", "content": turn})
            stream = self.openai.chat.completions.create(
                model=self.model, messages=messages, max_tokens=max_tokens or self.max_tokens, temperature=0.0,
                stream=True, stream_options={"include_usage": True})
            parts = []
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    tokens += chunk.usage.completion_tokens
            text = "".join(parts)
            texts.append(text)
            messages.append({"role": "assistant", "content": text})
        latency = time.perf_counter() - start
        return RequestResult(prompt.id, prompt.category, texts, tokens, latency if ttft is None else ttft, latency)

    def load(self, prompts: Sequence[Prompt], concurrency: int, config: str, round_: int) -> LoadResult:
        """The prompts at `concurrency` requests in flight (one at a time at 1, each with its own counters)."""
        before = self.counters()
        start = time.perf_counter()
        if concurrency == 1:
            results, prev = [], before
            for p in prompts:
                r = self.chat(p)
                now = self.counters()
                r.drafts = now["num_drafts"] - prev["num_drafts"]
                r.drafted = now["num_draft_tokens"] - prev["num_draft_tokens"]
                r.accepted = now["num_accepted_tokens"] - prev["num_accepted_tokens"]
                results.append(r)
                prev = now
        else:
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(self.chat, prompts))
        wall = time.perf_counter() - start
        after = self.counters()
        return LoadResult(config, round_, concurrency, wall, results, after["num_drafts"] - before["num_drafts"],
                          after["num_draft_tokens"] - before["num_draft_tokens"],
                          after["num_accepted_tokens"] - before["num_accepted_tokens"])


# ---- the sweep -------------------------------------------------------------------------------------------

@dataclass
class SweepPlan:
    model: str
    configs: list[Config]
    concurrency: list[int]
    rounds: int
    max_tokens: int
    slices: dict[tuple[int, int], list[Prompt]]  # (round, concurrency) -> its prompts
    server_args: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    url: str | None = None  # a running server instead of ours (one configuration only)


def slice_prompts(prompts: list[Prompt], rounds: int, concurrency: Sequence[int], per_slice: int | None = None,
                  replicate: bool = False) -> dict[tuple[int, int], list[Prompt]]:
    """Prompts for every (round, concurrency): `per_slice` each (default: as many as there are, evenly), at least
    the concurrency level's worth, disjoint across concurrency levels. replicate: every round gets the same
    slices (servers started anew each round remember nothing); else every (round, concurrency) its own."""
    own = 1 if replicate else rounds  # rounds with prompts of their own
    distinct = [(r, c) for r in range(own) for c in concurrency]
    per = per_slice or len(prompts) // len(distinct)
    need = max(concurrency)
    if per < need or per * len(distinct) > len(prompts):
        what = "concurrency levels" if replicate else "rounds x concurrency levels"
        raise ValueError(f"workload: {len(prompts)} prompts cannot give {len(distinct)} {what} {max(per, need)} "
                         f"distinct prompts each (needs {max(per, need) * len(distinct)}); add prompts or lower "
                         "--rounds / --concurrency")
    taken = {slot: prompts[i * per:(i + 1) * per] for i, slot in enumerate(distinct)}
    return {(r, c): taken[(r % own, c)] for r in range(rounds) for c in concurrency}


def run_sweep(plan: SweepPlan, log_dir: Path, progress: Callable[[str | None], None] | None = None
              ) -> list[LoadResult]:
    """Every configuration in every round (configurations take turns, their order rotating per round).
    progress(name) is called as each configuration starts, progress(None) when it is done."""
    from spec_plugins.bench.serve import VllmServer

    results: list[LoadResult] = []
    for round_ in range(plan.rounds):
        order = round_order(plan.configs, round_)
        for config in order:
            if progress:
                progress(f"round {round_ + 1}/{plan.rounds}: {config.name}")
            log = log_dir / f"serve-r{round_}-{_slug(config.name)}.log"
            try:
                if plan.url is not None:
                    results += _measure(Client(plan.url, plan.model, plan.max_tokens), plan, config, round_)
                    continue
                with VllmServer(plan.model, [*plan.server_args, *config.serve_args()], log, env=plan.env) as server:
                    results += _measure(Client(server.url, plan.model, plan.max_tokens), plan, config, round_)
            except SweepError:
                raise
            except Exception as exc:
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise SweepError(f"{config.name}, round {round_ + 1}: {type(exc).__name__}: {exc}\n{tail}") from None
            if progress:
                progress(None)
    return results


def _measure(client: Client, plan: SweepPlan, config: Config, round_: int) -> list[LoadResult]:
    client.chat(Prompt("warmup", [WARMUP_PROMPT]), max_tokens=8)
    out = []
    for c in plan.concurrency:
        out.append(client.load(plan.slices[(round_, c)], c, config.name, round_))
    return out


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")


# ---- summaries -------------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize(plan: SweepPlan, loads: list[LoadResult]) -> list[dict]:
    """One row per configuration and concurrency: medians over rounds (spread: min and max over rounds)."""
    by_key: dict[tuple[str, int], list[LoadResult]] = {}
    for load in loads:
        by_key.setdefault((load.config, load.concurrency), []).append(load)
    reference = {(load.round, load.concurrency): load for load in loads if load.config == "none"}
    rows = []
    for config in plan.configs:
        for c in plan.concurrency:
            runs = sorted(by_key.get((config.name, c), []), key=lambda l: l.round)
            if not runs:
                continue
            tps = [l.output_tokens / l.wall_s for l in runs]
            per_user = [statistics.median(r.output_tokens / r.latency_s for r in l.requests) for l in runs]
            ttft = [r.ttft_s * 1e3 for l in runs for r in l.requests]
            tpot = [r.tpot_s * 1e3 for l in runs for r in l.requests if r.tpot_s is not None]
            drafts = sum(l.drafts for l in runs)
            identical = all(
                [r.texts for r in l.requests] == [r.texts for r in reference[(l.round, c)].requests]
                for l in runs if (l.round, c) in reference)
            rows.append({
                "method": config.method, "draft_length": config.k, "concurrency": c, "config": config.name,
                "rounds": len(runs),
                "acceptance_length": None if drafts == 0 else 1 + sum(l.accepted_tokens for l in runs) / drafts,
                "tokens_per_s": statistics.median(tps), "tokens_per_s_per_user": statistics.median(per_user),
                "ttft_p50_ms": _pct(ttft, 0.5), "ttft_p99_ms": _pct(ttft, 0.99),
                "tpot_p50_ms": _pct(tpot, 0.5), "tpot_p99_ms": _pct(tpot, 0.99),
                "identical": identical,
                "spread": {"tokens_per_s": [min(tps), max(tps)], "tokens_per_s_per_user": [min(per_user), max(per_user)]},
                "round_tokens_per_s": {str(l.round): t for l, t in zip(runs, tps)},
            })
    base = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["method"] == "none"}
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base[r["concurrency"]] if r["concurrency"] in base else None
    return rows


def adaptive_vs_static(rows: list[dict]) -> list[dict]:
    """For every adaptive method and concurrency: its best cap against the best static K of the same proposer.

    `ratio` compares the medians over rounds; `paired` is the median over rounds of the same round's ratio
    (each round times every configuration in turn on the same new prompts, so a slow round of the machine
    cancels out); `verdict` says whether the adaptive row is at or above the best static one, below it within
    the rounds' spread (the ranges overlap), or below it outright.
    """
    out = []
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["method"].endswith("+adaptive"):
            groups.setdefault((r["method"], r["concurrency"]), []).append(r)
    for (method, c), adaptive in groups.items():
        static = [r for r in rows if r["method"] == method.removesuffix("+adaptive") and r["concurrency"] == c]
        if not static:
            continue
        a = max(adaptive, key=lambda r: r["tokens_per_s"])
        b = max(static, key=lambda r: r["tokens_per_s"])
        ra, rb = a.get("round_tokens_per_s") or {}, b.get("round_tokens_per_s") or {}
        both = [ra[k] / rb[k] for k in ra if k in rb and rb[k] > 0]
        ratio = a["tokens_per_s"] / b["tokens_per_s"]
        (a_lo, a_hi), (b_lo, b_hi) = a["spread"]["tokens_per_s"], b["spread"]["tokens_per_s"]
        verdict = "at or above" if ratio >= 1.0 else "below, within spread" if a_hi >= b_lo else "below"
        out.append({"method": method, "concurrency": c, "adaptive": a["config"], "tokens_per_s": a["tokens_per_s"],
                    "spread": [a_lo, a_hi], "best_static": b["config"], "static_tokens_per_s": b["tokens_per_s"],
                    "static_spread": [b_lo, b_hi], "ratio": ratio,
                    "paired": statistics.median(both) if both else None, "verdict": verdict,
                    "static": {str(r["draft_length"]): r["tokens_per_s"] for r in static}})
    return out


def category_acceptance(loads: list[LoadResult]) -> list[dict]:
    """Acceptance length per configuration and workload category, from the one-at-a-time (concurrency 1) runs."""
    acc: dict[tuple[str, str], list[int]] = {}
    for load in loads:
        if load.concurrency != 1:
            continue
        for r in load.requests:
            if r.drafts is None:
                continue
            t = acc.setdefault((load.config, r.category or "-"), [0, 0, 0])
            t[0] += r.drafts
            t[1] += r.accepted or 0
            t[2] += 1
    return [{"config": cfg, "category": cat, "requests": n,
             "acceptance_length": None if d == 0 else 1 + a / d}
            for (cfg, cat), (d, a, n) in sorted(acc.items())]


def best_configs(plan: SweepPlan, rows: list[dict], targets: Sequence[float]) -> list[dict]:
    from spec_plugins.bench.frontier import best_per_target

    configs = {c.name: c for c in plan.configs}
    out = []
    for pick in best_per_target(rows, targets):
        row = pick["row"]
        entry: dict[str, Any] = {"tpot_ms": pick["tpot_ms"], "config": None if row is None else row["config"]}
        if row is not None:
            cfg = configs[row["config"]]
            entry.update(concurrency=row["concurrency"], tokens_per_s=row["tokens_per_s"],
                         tpot_p50_ms=row["tpot_p50_ms"], speculative_config=cfg.speculative_config(),
                         additional_config=cfg.additional_config(), vllm_serve_args=cfg.serve_args(),
                         trtllm_yaml=cfg.trtllm_yaml())
        out.append(entry)
    return out


def write_outputs(out: Path, plan: SweepPlan, loads: list[LoadResult], rows: list[dict], targets: Sequence[float],
                  command: str, workload: str) -> dict:
    from spec_plugins.bench.frontier import frontier_table, plot_frontier

    out.mkdir(parents=True, exist_ok=True)
    cats = category_acceptance(loads)
    best = best_configs(plan, rows, targets)
    frontier = [r["config"] + f" c={r['concurrency']}" for r in frontier_table(rows)]
    doc = {"format": FORMAT, "command": command, "model": plan.model, "workload": workload,
           "max_tokens": plan.max_tokens, "rounds": plan.rounds, "rows": rows, "frontier": frontier,
           "categories": cats, "best": best, "adaptive": adaptive_vs_static(rows),
           "policy_options": next((dict(c.policy_options) for c in plan.configs if c.adaptive), None),
           "loads": [{**{k: v for k, v in asdict(l).items() if k != "requests"},
                      "requests": [{k: v for k, v in asdict(r).items() if k != "texts"} for r in l.requests]}
                     for l in loads]}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    columns = ["method", "draft_length", "concurrency", "acceptance_length", "tokens_per_s", "tokens_per_s_per_user",
               "speedup", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "identical", "rounds",
               "tokens_per_s_min", "tokens_per_s_max"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns[:-2]] + [_cell(v) for v in r["spread"]["tokens_per_s"]])
    with open(out / "categories.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "category", "requests", "acceptance_length"])
        for c in cats:
            w.writerow([c["config"], c["category"], c["requests"], _cell(c["acceptance_length"])])
    (out / "best_configs.json").write_text(json.dumps(best, indent=1) + "\n")
    write_adaptive_csv(out, doc["adaptive"])
    plot_frontier(rows, out / "pareto.png", plot_title(plan.model, workload, plan.max_tokens, plan.rounds))
    return doc


def write_adaptive_csv(out: Path, adaptive: Sequence[dict]) -> None:
    if not adaptive:
        return
    with open(out / "adaptive.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "concurrency", "adaptive", "tokens_per_s", "min", "max", "best_static",
                    "static_tokens_per_s", "static_min", "static_max", "ratio", "paired_ratio", "verdict"])
        for a in adaptive:
            w.writerow([a["method"], a["concurrency"], a["adaptive"], _cell(a["tokens_per_s"]), *map(_cell, a["spread"]),
                        a["best_static"], _cell(a["static_tokens_per_s"]), *map(_cell, a["static_spread"]),
                        _cell(a["ratio"]), _cell(a["paired"]), a["verdict"]])


def plot_title(model: str, workload: str, max_tokens: int, rounds: int) -> str:
    names = "+".join(Path(w).stem if "/" in w else w for w in workload.split("+"))
    return (f"{Path(model).name} on vllm serve: {names}, {max_tokens} output tokens, median of {rounds} rounds "
            "(bars: min-max over rounds)")


def render(out: Path, targets: Sequence[float]) -> dict:
    """best_configs.json, pareto.png and results.json's best again from a finished sweep's results.json
    (other --tpot-ms targets, a new plot) without running anything."""
    from spec_plugins.bench.frontier import plot_frontier

    path = out / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--render {out}: no readable results.json ({exc})") from None
    if doc.get("format") != FORMAT:
        raise ValueError(f"--render {out}: {path} is not a sweep result (format {doc.get('format')!r})")
    options = tuple(sorted((doc.get("policy_options") or {}).items()))
    configs = {}
    for r in doc["rows"]:
        adaptive = r["method"].endswith("+adaptive")
        configs[r["config"]] = Config(r["method"], r["draft_length"], options if adaptive else ())
    plan = SweepPlan(doc["model"], list(configs.values()), [], doc["rounds"], doc["max_tokens"], {})
    doc["best"] = best_configs(plan, doc["rows"], targets)
    doc["adaptive"] = adaptive_vs_static(doc["rows"])
    path.write_text(json.dumps(doc, indent=1) + "\n")
    write_adaptive_csv(out, doc["adaptive"])
    (out / "best_configs.json").write_text(json.dumps(doc["best"], indent=1) + "\n")
    plot_frontier(doc["rows"], out / "pareto.png", plot_title(doc["model"], doc["workload"], doc["max_tokens"],
                                                                doc["rounds"]))
    return doc


def _cell(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def write_traces(out: Path, model: str, loads: list[LoadResult], prompts: dict[str, Prompt], max_draft: int,
                 proposers: Sequence[str] = ("suffix_tree", "ngram")) -> list[Path]:
    """responses.jsonl (the no-speculation answers, chat-templated prompts) and our proposers' acceptance
    traces replayed on them (`traces/sweep/<proposer>.json`), for `spec-plugins plan --acceptance`."""
    from spec_plugins.bench import replay

    answers = {r.id: r.texts[0] for load in loads if load.config == "none" for r in load.requests}  # once per prompt
    lines = [json.dumps({"id": i, "prompt": prompts[i].turns[0], "response": text, "chat": True})
             for i, text in answers.items()]
    responses = out / "responses.jsonl"
    responses.write_text("\n".join(lines) + "\n")
    rows = replay.load_workload(responses, replay.TextTokenizer(model))
    result = replay.run_workload("sweep", str(responses), rows, list(proposers), {}, max_draft)
    replay.write_traces(out / "traces", result, {}, max_draft)
    return sorted((out / "traces").glob("**/*.json"))


# ---- command line ----------------------------------------------------------------------------------------

def add_sweep_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sweep", help="methods x draft lengths x concurrency on vllm serve: the Pareto frontier "
                              "and the configurations to deploy", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2 (the bundled SmolLM2-135M-Instruct) or a model folder")
    p.add_argument("--workload", action="append", default=None,
                   help="a Spec-Bench or plain JSONL file, a SPEED-Bench parquet (file or folder), 'spec_bench' "
                        "(bundled rows) or 'code' (code rewrites); repeat to mix (default: spec_bench and code)")
    p.add_argument("--categories", help="keep these categories (comma-separated; not applied to 'code')")
    p.add_argument("--limit", type=int, help="at most this many prompts per workload (round-robin over categories)")
    p.add_argument("--turns", choices=("first", "all"), default="first", help="multi-turn conversations: first turn or all")
    p.add_argument("--methods", default="none,ngram,suffix,suffix_tree,suffix_tree+adaptive")
    p.add_argument("--draft-lengths", default="4,8,16")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-slice", type=int, help="prompts per (round, concurrency) (default: the workload split evenly)")
    p.add_argument("--tpot-ms", default="", help="latency targets: the best configuration for each (comma-separated ms)")
    p.add_argument("--policy-options", help="JSON options of the adaptive policy (default: none, the prior taken "
                   "from the engine's device and corrected by its measured steps)")
    p.add_argument("--serve-args", default="--dtype float32 --max-model-len 2048 --enforce-eager --seed 0",
                   help="extra `vllm serve` arguments for every configuration")
    p.add_argument("--url", help="a running OpenAI-compatible server to measure instead (one method only)")
    p.add_argument("--no-traces", action="store_true", help="skip the acceptance traces for `spec-plugins plan`")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--render", action="store_true", help="run nothing: redo best_configs.json and pareto.png from "
                   "--out's results.json (e.g. for other --tpot-ms)")
    p.set_defaults(func=_cmd_sweep)
    return p


def _ints(value: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {value!r}") from None
    if not out or min(out) < 1:
        raise ValueError(f"{flag}: expected positive integers, got {value!r}")
    return out


def _cmd_sweep(args: argparse.Namespace) -> None:
    import os

    from rich.console import Console
    from tqdm import tqdm

    console = Console(stderr=True, width=max(120, Console(stderr=True).width))
    try:
        targets = [float(x) for x in args.tpot_ms.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--tpot-ms: expected comma-separated milliseconds, got {args.tpot_ms!r}") from None
    if args.render:
        doc = render(Path(args.out), targets)
        print_summary(console, doc["rows"], Path(args.out), doc["best"], doc["adaptive"])
        return
    ks, conc = _ints(args.draft_lengths, "--draft-lengths"), _ints(args.concurrency, "--concurrency")
    model = args.model
    if model == "smollm2":
        from spec_plugins.models import smollm2_path

        model = str(smollm2_path())
    elif not Path(model).is_dir():
        raise ValueError(f"--model {args.model}: expected 'smollm2' or a model folder")
    options = json.loads(args.policy_options) if args.policy_options else {}
    from spec_plugins.vllm.settings import installed_vllm

    configs = parse_methods(args.methods, ks, options, installed_vllm())
    if args.url and len(configs) > 1:
        raise ValueError("--url: measures the one server it names; give --methods with one method and one K "
                         "(and not none), or let the sweep start its servers")
    specs = args.workload or ["spec_bench", "code"]
    cats = [c for c in (args.categories or "").split(",") if c.strip()] or None
    prompts: list[Prompt] = []
    for spec in specs:
        prompts += load_workload(spec, categories=cats if spec not in ("code",) else None, limit=args.limit,
                                 turns=args.turns)
    prompts = _interleave(prompts, specs)
    plan = SweepPlan(model, configs, conc, args.rounds, args.max_tokens,
                     slice_prompts(prompts, args.rounds, conc, args.per_slice, replicate=args.url is None),
                     shlex.split(args.serve_args),
                     env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}, url=args.url)
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]sweep[/]: {len(configs)} configurations x {len(conc)} concurrency levels x {args.rounds} "
                  f"rounds, {len({p.id for v in plan.slices.values() for p in v})} prompts; logs in {out / 'logs'}")
    bar = tqdm(total=len(configs) * args.rounds, desc="sweep", unit="server", disable=not sys.stderr.isatty())

    def progress(what: str | None) -> None:
        if what is None:
            bar.update(1)
        else:
            bar.set_postfix_str(what)

    try:
        loads = run_sweep(plan, out / "logs", progress)
    finally:
        bar.close()
    rows = summarize(plan, loads)
    command = "spec-plugins sweep " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    doc = write_outputs(out, plan, loads, rows, targets, command, "+".join(specs))
    if not args.no_traces and args.url is None:
        by_id = {p.id: p for p in prompts}
        write_traces(out, model, loads, by_id, max(ks))
    print_summary(console, rows, out, doc["best"], doc["adaptive"])


def _interleave(prompts: list[Prompt], specs: Sequence[str]) -> list[Prompt]:
    """Categories (and so workloads) alternate, so that every slice mixes them."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category or "", []).append(p)
    out, queues = [], [list(g) for g in groups.values()]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def print_summary(console: Any, rows: list[dict], out: Path, best: Sequence[dict] = (),
                  adaptive: Sequence[dict] = ()) -> None:
    from rich.table import Table

    table = Table(title=f"sweep: medians over rounds ({out})")
    for col in ("configuration", "c", "AL", "tok/s", "x none", "tok/s/user", "TTFT p50", "TPOT p50", "same"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        table.add_row(r["config"], str(r["concurrency"]),
                      "-" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}",
                      f"{r['tokens_per_s']:.1f}", "-" if r["speedup"] is None else f"{r['speedup']:.2f}",
                      f"{r['tokens_per_s_per_user']:.1f}", f"{r['ttft_p50_ms']:.0f} ms",
                      "-" if r["tpot_p50_ms"] is None else f"{r['tpot_p50_ms']:.1f} ms",
                      "yes" if r["identical"] else "[red]NO[/]")
    console.print(table)
    if adaptive:
        t = Table(title="the adaptive policy against the best static K (tokens/s, median \\[min-max] over rounds)")
        for col in ("method", "c", "adaptive", "best static", "ratio", "paired", "verdict"):
            t.add_column(col, justify="left" if col in ("method", "verdict") else "right")
        for a in adaptive:
            t.add_row(a["method"], str(a["concurrency"]),
                      f"{a['adaptive'].split(' ')[-1]}: {a['tokens_per_s']:.1f} [{a['spread'][0]:.1f}-{a['spread'][1]:.1f}]",
                      f"{a['best_static'].split(' ')[-1]}: {a['static_tokens_per_s']:.1f} "
                      f"[{a['static_spread'][0]:.1f}-{a['static_spread'][1]:.1f}]",
                      f"{a['ratio']:.3f}x", "-" if a["paired"] is None else f"{a['paired']:.3f}x", a["verdict"])
        console.print(t)
    for b in best:
        if b["config"] is None:
            console.print(f"TPOT <= {b['tpot_ms']:g} ms: no configuration meets it")
        else:
            console.print(f"TPOT <= {b['tpot_ms']:g} ms: [bold]{b['config']}[/] at concurrency {b['concurrency']} "
                          f"({b['tokens_per_s']:.1f} tokens/s, TPOT p50 {b['tpot_p50_ms']:.1f} ms): "
                          + " ".join(shlex.quote(a) for a in b["vllm_serve_args"]))
    console.print(f"results.csv, results.json, pareto.png, categories.csv, best_configs.json"
                  f"{', adaptive.csv' if adaptive else ''} in {out}")
