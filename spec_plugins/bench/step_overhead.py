"""Host time of one drafting step at serving batch sizes, beside vLLM's own proposers, in one run.

    python -m spec_plugins.bench.step_overhead [--batches 1,4,16,64,256] [--steps 30] [--k 16] [--json PATH]

On a GPU the drafting step runs between two verification steps (vLLM's `custom_class` path is
synchronous), so every microsecond here is added to the step. Each batch is B requests whose contexts
are real Python source files (the standard library's, SmolLM2 tokenizer) of 2-4k tokens; every step
appends the next 1-4 true tokens of each file (what vLLM hands over as sampled tokens) and every
proposer is called exactly as vLLM 0.32's model runner calls it, on the same arrays:

* ours: `spec_plugins.vllm.SpecPluginsProposer` (the whole `custom_class` adapter: drafting layer,
  policy, proposer), suffix tree and n-gram, policy `fixed` and `adaptive` (`hardware: h200`, the
  target costed as Llama-3.1-8B; kept from pausing, so its rows are drafting steps: `keep_drafting`);
* vLLM's `SuffixDecodingProposer` (method `suffix`, ArcticInference) and `NgramProposer` (method
  `ngram`, its numba batch kernel);
* the suffix tree with `append_ahead` ("+ ahead" rows): each step ends by appending the drafts' likely
  tokens on a thread of its own, which a GPU engine overlaps with verification. Their `propose()` time is
  what the engine waits for; the time still left on that thread when `propose()` returns is measured
  apart (`ahead_wait_us`: it must fit in the verification step, and it does not count in `us_per_step`),
  before the next proposer runs, so it never overlaps another proposer's timing.

Reported per proposer and batch: median microseconds per whole `propose()` call over the timed steps,
per request, the ratio to vLLM's `suffix` at the same batch; for ours also the median time inside the
proposer's own drafting call (`DraftingLayer.proposer_seconds`: the suffix tree's or n-gram's compiled
step; the rest of the step is the ledger, the policy and the adapter), and the share of the measured H200 step of
a Llama-3.1-8B-shaped stack at that batch (`benchmarks/profiles/h200-llama-3.1-8b-stack.json`, the
step with no drafts: the cheapest verification step, so the share is an upper bound). Timings come
from this host; the proposers run in turns inside each step so a noisy moment hits them all.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

PROFILE = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles" / "h200-llama-3.1-8b-stack.json"
MODEL_CONFIG = "llama-3.1-8b"
MAX_MODEL_LEN = 8192
FORMAT = "spec-plugins-step-overhead/1"


def code_token_streams(count: int, min_tokens: int, progress: bool = True) -> list[np.ndarray]:
    """Token ids of `count` standard-library source files of at least `min_tokens` tokens (SmolLM2)."""
    from transformers import AutoTokenizer

    from spec_plugins.models import smollm2_path

    tok = AutoTokenizer.from_pretrained(smollm2_path(progress=progress))
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    out: list[np.ndarray] = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        if len(text) < 4 * min_tokens:  # a source file runs ~3-4 characters per token
            continue
        ids = np.asarray(tok(text)["input_ids"], dtype=np.int32)
        if len(ids) >= min_tokens:
            out.append(ids)
        if len(out) == count:
            return out
    if not out:
        raise RuntimeError(f"no standard-library file has {min_tokens} tokens")
    return [out[i % len(out)] for i in range(count)]  # fewer files than requests: reuse them


def keep_drafting(drafting: Any) -> None:
    """Keep the adaptive policy of a drafting layer from pausing (`policy.adaptive.DraftingPause`): these rows
    measure the drafting step. A paused step costs what no drafter costs, and when the policy pauses is the
    simulator's to model (`policy_sim`), not a host time to charge."""
    pause = getattr(drafting.policy, "pause", None)
    if pause is not None:
        pause.min_steps = float("inf")  # the sums never reach a decision


REWRITE_LEN = 2600  # tokens of a file that a rewrite request holds in its prompt


def rewrite_streams(files: list[np.ndarray], seed: int = 1) -> list[np.ndarray]:
    """Code-edit requests: the prompt is a file's first REWRITE_LEN tokens and the answer rewrites it, one
    token changed every 200 (what the target emits; a request starts 300 tokens into its answer)."""
    rng = np.random.default_rng(seed)
    out = []
    for f in files:
        body = f[:REWRITE_LEN]
        answer = body.copy()
        answer[150::200] = rng.integers(0, 49000, size=len(answer[150::200]))
        out.append(np.concatenate([body, answer]))
    return out


class Batch:
    """vLLM's per-step inputs for B requests: the runner's token matrix and the sampled tokens."""

    def __init__(self, streams: list[np.ndarray], rng: np.random.Generator, width: int,
                 start: tuple[int, int] = (2048, 4096)) -> None:
        self.streams = streams
        b = len(streams)
        self.token_ids_cpu = np.zeros((b, width), dtype=np.int32)
        self.num_tokens = np.array([rng.integers(start[0], min(start[1], len(s) - 200) + 1) for s in streams])
        for i, s in enumerate(streams):
            self.token_ids_cpu[i, : self.num_tokens[i]] = s[: self.num_tokens[i]]
        self.num_prompt = self.num_tokens.copy()
        self.sampled: list[list[int]] = [[int(s[n - 1])] for s, n in zip(streams, self.num_tokens)]
        self.req_ids = [f"req-{i}" for i in range(b)]
        self.rng = rng

    def advance(self, drafts: list | None = None) -> None:
        """Each request commits its file's next 1-4 tokens; with `drafts`, what a target whose greedy output
        is the file would verify: the draft's prefix that agrees with the file, and the file's next token."""
        for i, s in enumerate(self.streams):
            n = int(self.num_tokens[i])
            if drafts is None:
                k = int(min(self.rng.integers(1, 5), len(s) - n))
            else:
                d = list(drafts[i])[: len(s) - n - 1]
                agree = np.flatnonzero(np.asarray(d, dtype=np.int64) != s[n : n + len(d)])
                k = (int(agree[0]) if len(agree) else len(d)) + 1
            self.token_ids_cpu[i, n : n + k] = s[n : n + k]
            self.num_tokens[i] = n + k
            self.sampled[i] = s[n : n + k].tolist()

    def input_batch(self) -> SimpleNamespace:
        """The parts of vLLM's InputBatch its SuffixDecodingProposer reads."""
        return SimpleNamespace(req_ids=self.req_ids, num_tokens_no_spec=self.num_tokens,
                               req_id_to_index={r: i for i, r in enumerate(self.req_ids)},
                               num_prompt_tokens=self.num_prompt, token_ids_cpu=self.token_ids_cpu)


def vllm_config(k: int, additional: dict | None = None, method: str = "custom_class") -> SimpleNamespace:
    from spec_plugins.policy.model import load_model_config

    hf = load_model_config(MODEL_CONFIG)
    spec = SimpleNamespace(
        method=method, num_speculative_tokens=k, num_speculative_tokens_per_batch_size=None,
        prompt_lookup_min=2, prompt_lookup_max=5,
        suffix_decoding_max_tree_depth=24, suffix_decoding_max_cached_requests=10000,
        suffix_decoding_max_spec_factor=1.0, suffix_decoding_min_token_prob=0.1,
    )
    return SimpleNamespace(
        speculative_config=spec, additional_config=additional or {},
        model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN, hf_config=SimpleNamespace(to_dict=lambda: hf)),
        scheduler_config=SimpleNamespace(max_num_seqs=1024), parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


class Contender:
    """One proposer driven as vLLM's runner drives it: `step` is the drafting step the engine waits for;
    `background` waits for work the proposer left running between steps (None: it leaves none)."""

    def __init__(self, step: Callable[[Batch], Any], background: Callable[[], None] | None = None,
                 proposer_seconds: Callable[[], float] | None = None) -> None:
        self.step, self.background = step, background
        self.proposer_seconds = proposer_seconds  # ours: the last step's time inside the proposer's own call


def contenders(k: int) -> dict[str, Callable[[], Contender]]:
    """name -> factory of a Contender."""

    def ours(proposer: str, policy: str, ahead: bool = False) -> Callable[[], Contender]:
        def make() -> Contender:
            from spec_plugins.vllm import SpecPluginsProposer

            extra = {"spec_plugins": {"proposer": proposer, "policy": policy,
                                      **({"proposer_options": {"append_ahead": True}} if ahead else {}),
                                      **({"policy_options": {"hardware": "h200"}} if policy == "adaptive" else {})}}
            p = SpecPluginsProposer(vllm_config(k, extra))
            p.drafting.time_proposer = True  # as with the engine's trace on: two clock reads a step
            keep_drafting(p.drafting)

            def call(b: Batch) -> Any:
                p.row_req_ids = b.req_ids  # what the plugin's runner wrapper sets
                return p.propose(b.sampled, b.num_tokens, b.token_ids_cpu)
            return Contender(call, p.proposer.wait_ahead if ahead else None, lambda: p.drafting.proposer_seconds)
        return make

    def vllm_suffix() -> Contender:
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        p = SuffixDecodingProposer(vllm_config(k, method="suffix"))
        return Contender(lambda b: p.propose(k, b.input_batch(), b.sampled))

    def vllm_ngram() -> Contender:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        cfg = vllm_config(k, method="ngram")
        cfg.model_config.max_model_len = 4608  # the JIT warm-up allocates 1024 x max_model_len
        p = NgramProposer(cfg)
        return Contender(lambda b: p.propose(k, b.sampled, b.num_tokens, b.token_ids_cpu))

    return {
        "suffix_tree fixed": ours("suffix_tree", "fixed"),
        "suffix_tree adaptive": ours("suffix_tree", "adaptive"),
        "suffix_tree fixed + ahead": ours("suffix_tree", "fixed", ahead=True),
        "suffix_tree adaptive + ahead": ours("suffix_tree", "adaptive", ahead=True),
        "ngram fixed": ours("ngram", "fixed"),
        "ngram adaptive": ours("ngram", "adaptive"),
        "vLLM suffix (ArcticInference)": vllm_suffix,
        "vLLM ngram (numba)": vllm_ngram,
    }


def h200_step_ms(batch: int) -> float | None:
    if not PROFILE.exists():
        return None
    from spec_plugins.policy.measured import MeasuredCost

    return MeasuredCost(str(PROFILE)).batch_time(batch, batch) * 1e3


def measure(batches: list[int], steps: int, warmup: int, k: int, seed: int, progress: bool = True,
            verify: bool = False, text: str = "code") -> list[dict]:
    """verify: every proposer's requests advance by what its own drafts would have accepted (Batch.advance),
    each on a batch of its own; else all take the same 1-4 tokens a step. text: "code" (the files as they
    are, contexts of 2-4k tokens) or "rewrite" (rewrite_streams)."""
    from tqdm import tqdm

    grow = (k + 1 if verify else 4) * (steps + warmup)
    if text == "rewrite":
        streams = rewrite_streams(code_token_streams(max(batches), REWRITE_LEN, progress=progress))
        start, width = (REWRITE_LEN + 300, REWRITE_LEN + 300), 2 * REWRITE_LEN + 1
        if REWRITE_LEN - 300 < grow + 200:
            raise ValueError(f"--steps: a rewrite's answer has room for {REWRITE_LEN - 500} more tokens, these steps "
                             f"may take {grow}")
    else:
        streams = code_token_streams(max(batches), 4096 + grow + 256, progress=progress)
        start, width = (2048, 4096), 4096 + grow + 512
    makers = contenders(k)
    rows = []
    bar = tqdm(total=len(batches) * (steps + warmup), desc="drafting steps", disable=not progress, leave=False)
    for b in batches:
        calls = {name: make() for name, make in makers.items()}  # fresh state per batch size
        # vLLM's engine core freezes its start-up heap before it serves (vllm.utils.gc_utils.freeze_gc_heap), so
        # the collector never walks it between steps: a proposer's step pays for its own garbage only.
        gc.collect()
        gc.freeze()
        own = {name: Batch(streams[:b], np.random.default_rng(seed), width, start)
               for name in (calls if verify else ["all"])}
        appended: dict[str, int] = {name: 0 for name in calls}
        times: dict[str, list[float]] = {name: [] for name in calls}
        waits: dict[str, list[float]] = {name: [] for name, c in calls.items() if c.background is not None}
        own_calls: dict[str, list[float]] = {name: [] for name, c in calls.items() if c.proposer_seconds is not None}
        for step in range(steps + warmup):
            order = list(calls)
            if step % 2:
                order.reverse()  # alternate who goes first (caches, turbo)
            for name in order:
                contender = calls[name]
                batch = own[name if verify else "all"]
                t0 = time.perf_counter()
                drafts = contender.step(batch)
                t1 = time.perf_counter()
                if contender.background is not None:  # off the step, but before anyone else is timed
                    contender.background()
                if step >= warmup:
                    times[name].append(t1 - t0)
                    if name in waits:
                        waits[name].append(time.perf_counter() - t1)
                    if name in own_calls:
                        own_calls[name].append(contender.proposer_seconds())
                if verify:
                    before = int(batch.num_tokens.sum())
                    batch.advance(drafts)
                    appended[name] += (int(batch.num_tokens.sum()) - before) * (step >= warmup)
            if not verify:
                before = int(own["all"].num_tokens.sum())
                own["all"].advance()
                for name in calls:
                    appended[name] += (int(own["all"].num_tokens.sum()) - before) * (step >= warmup)
            bar.update()
        gc.unfreeze()  # as vLLM on shutdown: this batch size's proposers become collectable again
        step_ms = h200_step_ms(b)
        base = statistics.median(times["vLLM suffix (ArcticInference)"])
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append({"proposer": name, "batch": b, "us_per_step": med * 1e6, "us_per_request": med * 1e6 / b,
                         "vs_vllm_suffix": med / base, "h200_step_ms": step_ms,
                         "share_of_h200_step": None if step_ms is None else med * 1e3 / step_ms,
                         "ahead_wait_us": statistics.median(waits[name]) * 1e6 if name in waits else None,
                         "proposer_us": statistics.median(own_calls[name]) * 1e6 if name in own_calls else None,
                         "proposer_vs_vllm_suffix": (statistics.median(own_calls[name]) / base
                                                     if name in own_calls else None),
                         "tokens_per_request_step": appended[name] / (steps * b)})
    bar.close()
    return rows


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Whole drafting step (propose() as vLLM calls it), median per step")
    for col in ("proposer", "B", "µs/step", "µs/request", "x vLLM suffix", "proposer call µs (x)",
                "share of H200 step", "µs left off the step", "tokens/request/step"):
        table.add_column(col, justify="left" if col == "proposer" else "right")
    for r in rows:
        share = "-" if r["share_of_h200_step"] is None else f"{100 * r['share_of_h200_step']:.1f}% of {r['h200_step_ms']:.1f} ms"
        wait = "-" if r.get("ahead_wait_us") is None else f"{r['ahead_wait_us']:.0f}"
        own = "-" if r.get("proposer_us") is None else f"{r['proposer_us']:.0f} ({r['proposer_vs_vllm_suffix']:.3f})"
        table.add_row(r["proposer"], str(r["batch"]), f"{r['us_per_step']:.0f}", f"{r['us_per_request']:.2f}",
                      f"{r['vs_vllm_suffix']:.3f}", own, share, wait, f"{r['tokens_per_request_step']:.2f}")
    Console(width=max(140, Console().width)).print(table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.step_overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,4,16,64,256", help="batch sizes (comma-separated)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per batch size")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--k", type=int, default=16, help="num_speculative_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verify", action="store_true",
                    help="each proposer's requests grow by what its drafts would have accepted (a target whose greedy "
                    "output is the file), on batches of their own; default: every proposer gets the same 1-4 tokens")
    ap.add_argument("--text", choices=["code", "rewrite"], default="code",
                    help="contexts: standard-library files (code) or requests rewriting such a file (rewrite)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    try:
        batches = [int(x) for x in args.batches.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--batches: expected comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.steps < 1 or args.k < 1:
        ap.error("--batches, --steps and --k must be positive")
    try:
        rows = measure(batches, args.steps, args.warmup, args.k, args.seed, progress=sys.stderr.isatty(),
                       verify=args.verify, text=args.text)
    except ValueError as exc:
        ap.error(str(exc))
    print_table(rows)
    if args.json:
        doc = {"format": FORMAT, "command": "python -m spec_plugins.bench.step_overhead " + " ".join(argv or sys.argv[1:]),
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", "k": args.k,
               "verify": args.verify, "text": args.text,
               "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
