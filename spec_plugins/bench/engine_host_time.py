"""The engine's own host time per step on vLLM's V1 runner, by batch size and tokens per request, by part.

    python -m spec_plugins.bench.engine_host_time --batches 1,4,16,64,256 --drafts 0,3,7 \\
        --json benchmarks/host_time/cpu2-engine-host-time.json

What it measures: a live vLLM engine (SmolLM2-135M by default) in this process's child, its engine core in
process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), every request decoding, each step verifying B x (1 + D) tokens
(our `fixed_draft` proposer, as `spec-plugins profile` runs it, so scheduling is synchronous as for every
`custom_class` and `suffix` method; D = 0 is K = 1 with nothing drafted). vLLM's own methods are wrapped with
timers, and each step's time is split into

* scheduler:   `Scheduler.schedule` + `Scheduler.update_from_output`;
* input prep:  `GPUModelRunner.execute_model` less the model's forward and logits (state updates, input
               tensors, attention metadata);
* model:       `_model_forward` + `LogitsProcessor.forward` (device work on a GPU);
* sampling:    `_sample` (device work on a GPU);
* drafting:    `propose_draft_token_ids` (here a proposer that does nearly nothing);
* bookkeeping: the rest of `sample_tokens` (accepted tokens to lists, the runner's output);
* output:      `OutputProcessor.process_outputs` (detokenising, request outputs);
* other:       the rest of `LLMEngine.step` (engine-core glue, stats).

host = the step less model and sampling: the Python that runs between two forwards on the V1 runner with
synchronous scheduling, on a GPU machine the same code. engine = host less drafting and output: what the engine
core itself pays every step whatever the proposer (a proposer's own drafting time is measured apart, by
`step_overhead`), where the front end runs in its own process (`vllm serve`, and `LLM` by default) and
processes outputs beside the engine core. The simulator charges `engine` (`spec_plugins.bench.host_time.
EngineHostTime`). Only steps with the whole batch decoding (no prefill, no request joining or leaving) count;
each cell reports medians over its steps.

Limits: this machine's CPU is not a GPU server's (the same Python runs faster on a newer core); on a GPU the
input prep also launches copies to the device, and `_sample` / the forward hold host launch time that is
counted here as device work. With async scheduling (Model Runner V2, vLLM's default for its own methods on a
GPU in 0.33) this host time overlaps the GPU step instead of adding to it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

FORMAT = "spec-plugins-engine-host-time/1"
# part -> (module, class, method) of vLLM 0.32 / 0.33 whose inclusive time the part reads
TIMED = {
    "schedule": ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    "update": ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    "execute": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    "forward": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward"),
    "logits": ("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "forward"),
    "sample_tokens": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    "sample": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
    "draft": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"),
    "output": ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs"),
    "step": ("vllm.v1.engine.llm_engine", "LLMEngine", "step"),
}
PARTS = ("scheduler", "input_prep", "model", "sampling", "drafting", "bookkeeping", "output", "other")


def split(t: dict[str, float]) -> dict[str, float]:
    """One step's inclusive timer readings -> its exclusive parts, `host` and `step` (seconds)."""
    get = lambda k: t.get(k, 0.0)  # noqa: E731
    parts = {
        "scheduler": get("schedule") + get("update"),
        "input_prep": get("execute") - get("forward") - get("logits"),
        "model": get("forward") + get("logits"),
        "sampling": get("sample"),
        "drafting": get("draft"),
        "bookkeeping": get("sample_tokens") - get("sample") - get("draft"),
        "output": get("output"),
    }
    parts["other"] = get("step") - sum(parts.values())
    parts["step"] = get("step")
    parts["host"] = parts["step"] - parts["model"] - parts["sampling"]
    parts["engine"] = parts["host"] - parts["drafting"] - parts["output"]
    return parts


class Timers:
    """Class-level wrappers around the TIMED methods; each LLMEngine.step opens a new record."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def install(self) -> None:
        import importlib

        for part, (module, cls_name, method) in TIMED.items():
            cls = getattr(importlib.import_module(module), cls_name)
            setattr(cls, method, self._wrap(part, getattr(cls, method)))

    def _wrap(self, part: str, fn: Any) -> Any:
        timers = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if part == "step":
                timers._open = {"t": {}, "reqs": 0, "tokens": 0, "new": 0}
            record = timers._open
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                if record is not None:
                    record["t"][part] = record["t"].get(part, 0.0) + time.perf_counter() - start
            if part == "schedule" and record is not None:
                record["reqs"] = len(out.num_scheduled_tokens)
                record["tokens"] = int(out.total_num_scheduled_tokens)
                record["new"] = len(out.scheduled_new_reqs) + len(getattr(out, "finished_req_ids", ()) or ())
            if part == "step" and record is not None:
                timers.steps.append(record)
                timers._open = None
            return out

        return timed


def _measure_child(conn: Any, model: str, draft: int, batches: list[int], steps: int, dtype: str, vocab: int,
                   env: dict[str, str]) -> None:
    try:
        os.environ.update({**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})  # before vLLM is imported
        timers = Timers()
        timers.install()
        from vllm import LLM, SamplingParams

        from spec_plugins.bench.profile import _engine_kwargs, _speculation

        top = max(batches)
        llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=512, seed=0,
                  **_speculation(draft, token=3), **_engine_kwargs(top, draft))
        params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
        rows = []
        for b in batches:
            prompts = [{"prompt_token_ids": [4 + (31 * i + 7 * j) % (min(vocab, 4000) - 4) for j in range(64)]}
                       for i in range(b)]
            llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)  # warm this shape
            timers.steps.clear()
            llm.generate(prompts, params, use_tqdm=False)
            full = [s for s in timers.steps if s["reqs"] == b and s["new"] == 0 and s["tokens"] == b * (1 + draft)]
            if not full:
                raise RuntimeError(f"batch {b}, draft {draft}: no step ran the whole batch decoding")
            parts = [split(s["t"]) for s in full]
            row = {"batch": b, "draft": draft, "tokens_per_request": 1 + draft, "steps": len(full)}
            for name in (*PARTS, "host", "engine", "step"):
                row[f"{name}_us"] = round(statistics.median(p[name] for p in parts) * 1e6, 1)
            rows.append(row)
            conn.send(("row", row))
        conn.send(("done", rows))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, which fails with it)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def measure(model: str, drafts: list[int], batches: list[int], steps: int, dtype: str, on_row: Any = None
            ) -> list[dict]:
    """Rows of medians per (draft, batch); one engine per draft length, each in a child process."""
    from spec_plugins.bench.profile import _cpu_kv_cache

    cfg = json.loads((Path(model) / "config.json").read_text())
    vocab = int(cfg.get("text_config", cfg)["vocab_size"])
    env = _cpu_kv_cache(cfg, dtype, max(batches) * (64 + steps + 16) * (1 + max(drafts)), None)
    rows: list[dict] = []
    ctx = mp.get_context("spawn")
    for draft in drafts:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_measure_child, args=(child, model, draft, batches, steps, dtype, vocab, env),
                           daemon=True)
        proc.start()
        while True:
            kind, payload = parent.recv()
            if kind == "row" and on_row is not None:
                on_row(payload)
            elif kind == "done":
                rows += payload
                break
            elif kind == "error":
                proc.kill()
                raise RuntimeError(f"engine_host_time, draft {draft}: {payload}")
        proc.join(timeout=60)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_plugins.bench.engine_host_time",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="HF model folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--drafts", default="0,3,7", help="drafted tokens per request per step (tokens = 1 + D)")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per cell")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    err = Console(stderr=True)
    try:
        batches = [int(x) for x in args.batches.split(",") if x.strip()]
        drafts = [int(x) for x in args.drafts.split(",") if x.strip()]
        if not batches or min(batches) < 1:
            raise ValueError(f"--batches: expected positive integers, got {args.batches!r}")
        if not drafts or min(drafts) < 0:
            raise ValueError(f"--drafts: expected integers >= 0, got {args.drafts!r}")
        if args.steps < 4:
            raise ValueError(f"--steps: expected >= 4, got {args.steps}")
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    model = args.model
    if model is None:
        from spec_plugins.models import smollm2_path

        model = str(smollm2_path())
    with err.status("starting vLLM") as status:
        rows = measure(model, drafts, batches, args.steps, args.dtype,
                       on_row=lambda r: status.update(f"measured batch {r['batch']}, draft {r['draft']}"))
    t = Table(title="vLLM V1 runner, synchronous scheduling: µs per step (medians)")
    for col in ("batch", "tokens/req", *PARTS, "host", "engine", "step", "host / step"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["batch"]), str(r["tokens_per_request"]), *(f"{r[p + '_us']:.0f}" for p in PARTS),
                  f"{r['host_us']:.0f}", f"{r['engine_us']:.0f}", f"{r['step_us']:.0f}",
                  f"{r['host_us'] / r['step_us']:.2f}")
    Console(width=160).print(t)
    if args.json:
        from spec_plugins.bench.profile import _engine_name, device_name

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "format": FORMAT, "engine": _engine_name(), "device": device_name(), "model": Path(model).name,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m spec_plugins.bench.engine_host_time " + " ".join(sys.argv[1:] if argv is None
                                                                                   else argv),
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
