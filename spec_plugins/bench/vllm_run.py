"""Run vLLM engine configurations in fresh processes and report outputs, speed and acceptance.

Each configuration gets its own process: vLLM engines do not share a process cleanly (memory,
and an engine started after numba was imported fails on the CPU platform).
"""

from __future__ import annotations

import os
import statistics
import multiprocessing
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from spec_plugins.bench.prompts import Rendered

CPU_ENV_DEFAULTS = {
    # Engine core and worker in this process: start-up drops from ~40 s to ~5 s on small CPU hosts.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB per engine; several engines run side by side
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


@dataclass
class EngineRun:
    """What to run: a model, prompts (text, or token-id lists) and an optional speculative config."""

    model: str
    prompts: list[Any]
    max_tokens: int = 128
    speculative_config: dict | None = None
    additional_config: dict | None = None
    dtype: str = "float32"
    max_model_len: int | None = None  # None: the model's own context length
    temperature: float = 0.0
    seed: int = 0
    chat: bool = False  # wrap text prompts in the model's chat template
    warmup: bool = True
    ignore_eos: bool = False  # always generate max_tokens (timing by token count)
    enforce_eager: bool = True  # False: let vLLM compile and capture CUDA graphs, as a GPU server does
    repeats: int = 1  # timed generate() calls for run(); the median time is reported
    engine_kwargs: dict = field(default_factory=dict)


@dataclass
class RunResult:
    token_ids: list[list[int]]
    texts: list[str]
    seconds: float
    output_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    error: str | None = None
    step_seconds: list[float] = field(default_factory=list)  # each engine-core step of the call, in order
    num_preemptions: int = 0
    # generate(..., detail=True): per request, every completion (n > 1) with its finish reason and sampled-token
    # logprobs, and the prompt's logprobs (see `_details`)
    details: list[dict] | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted drafts per drafting step (1.0 without drafts)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


class Engine:
    """A vLLM engine in its own process, kept alive for several timed `generate()` calls.

    Keeping engines alive lets several configurations be timed in turns (A, B, A, B, ...), so a
    busy neighbour on a shared machine slows all of them alike instead of whichever ran last.
    """

    def __init__(self, spec: EngineRun, env: dict | None = None, timeout: float = 1800) -> None:
        self.spec, self.timeout = spec, timeout
        fd, self.log_path = tempfile.mkstemp(prefix="spec-plugins-vllm-", suffix=".log")
        os.close(fd)
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no engine state, no numba
        self._conn, child_conn = ctx.Pipe()
        saved = dict(os.environ)
        os.environ.update({**CPU_ENV_DEFAULTS, **saved, **(env or {})})
        try:
            self._proc = ctx.Process(target=_serve, args=(child_conn, asdict(spec), self.log_path), daemon=True)
            self._proc.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child_conn.close()
        self._expect("ready")

    def generate(self, prompts: list[Any] | None = None, max_tokens: int | None = None,
                 params: list[dict] | None = None, detail: bool = False,
                 max_in_flight: int | None = None) -> RunResult:
        """Generate for the spec's prompts and max_tokens, or for these instead (same engine).

        max_in_flight: at most this many requests in the engine at once, the next prompt submitted as one
        finishes (closed-loop clients, as `vllm bench serve --max-concurrency` runs); None: all at once.
        params: one dict of `SamplingParams` fields per prompt (e.g. temperature, seed), over the spec's
        defaults; greedy and sampled requests can share one batch this way. A `structured_outputs` dict
        becomes vLLM's `StructuredOutputsParams`.
        detail: fill `RunResult.details`; and a call vLLM refuses (bad sampling parameters) comes back as a
        result whose `error` is vLLM's message, with the engine still serving."""
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight: expected an integer >= 1, got {max_in_flight!r}")
        if prompts is None and max_tokens is None and params is None and not detail and max_in_flight is None:
            self._conn.send("generate")
        else:
            self._conn.send(("generate", {"prompts": prompts, "max_tokens": max_tokens, "params": params,
                                          "detail": detail, "max_in_flight": max_in_flight}))
        return RunResult(**self._expect("result"))

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send("close")
            except OSError:
                pass
            self._proc.join(timeout=60)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _expect(self, kind: str) -> Any:
        if self._conn.poll(self.timeout):
            try:
                got, payload = self._conn.recv()
            except EOFError:
                got, payload = "error", "engine process exited"
        else:
            got, payload = "error", f"no answer within {self.timeout:.0f} s"
        if got == kind:
            return payload
        with open(self.log_path, errors="replace") as f:
            tail = "\n".join(f.read().strip().splitlines()[-20:])
        self.close()
        raise RuntimeError(f"vLLM engine failed: {payload}\n{tail}")


def combine(results: list[RunResult]) -> RunResult:
    """One result for repeated identical runs: outputs of the first, the median time."""
    first = results[0]
    return RunResult(**{**asdict(first), "seconds": statistics.median(r.seconds for r in results)})


def run(spec: EngineRun, env: dict | None = None) -> RunResult:
    """Start an engine for `spec`, time `spec.repeats` generate() calls, stop it."""
    with Engine(spec, env) as engine:
        return combine([engine.generate() for _ in range(max(1, spec.repeats))])


def concat(results: list[RunResult]) -> RunResult:
    """One result for rounds on different prompts: outputs concatenated, times and counts summed."""
    return RunResult(
        token_ids=[t for r in results for t in r.token_ids], texts=[t for r in results for t in r.texts],
        seconds=sum(r.seconds for r in results), output_tokens=sum(r.output_tokens for r in results),
        num_drafts=sum(r.num_drafts for r in results), num_draft_tokens=sum(r.num_draft_tokens for r in results),
        num_accepted_tokens=sum(r.num_accepted_tokens for r in results),
    )


def round_order(names: list, r: int) -> list:
    """The configurations in round r's order: rotated by r, so no configuration always starts or follows another."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def run_side_by_side(specs: list[EngineRun], repeats: int = 3, on_start: Any = None,
                     prompt_rounds: list[list[Any]] | None = None) -> list[RunResult]:
    """Start every engine, then time them in turns; one result per engine.

    prompt_rounds: one prompt list per timed round, each different. Proposers that remember finished
    responses (the suffix tree, ArcticInference's suffix decoding) would otherwise replay an earlier
    round's answers from memory. Results are then summed over rounds. Without it, every round repeats
    the spec's prompts and the median time is kept (fine for memoryless proposers only).
    """
    engines: list[Engine] = []
    try:
        for spec in specs:
            if on_start is not None:
                on_start(spec)
            engines.append(Engine(spec))
        if prompt_rounds is not None:
            rounds = [[engine.generate(prompts) for engine in engines] for prompts in prompt_rounds]
            return [concat([r[i] for r in rounds]) for i in range(len(engines))]
        rounds = [[engine.generate() for engine in engines] for _ in range(max(1, repeats))]
        return [combine([r[i] for r in rounds]) for i in range(len(engines))]
    finally:
        for engine in engines:
            engine.close()


_COUNTERS = {"num_drafts": "vllm:spec_decode_num_drafts", "num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
             "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens", "num_preemptions": "vllm:num_preemptions"}


def _spec_metrics(llm: Any) -> dict[str, int]:
    totals = dict.fromkeys(_COUNTERS, 0)
    names = {name: key for key, name in _COUNTERS.items()}
    for metric in llm.get_metrics():
        if metric.name in names:
            totals[names[metric.name]] += int(getattr(metric, "value", 0))
    return totals


def _logprobs(positions: Any) -> list[dict[int, float]] | None:
    if positions is None:
        return None
    return [None if p is None else {int(t): float(lp.logprob) for t, lp in p.items()} for p in positions]


def _details(outputs: list[Any]) -> list[dict]:
    """Per request: {"outputs": [{"token_ids", "text", "finish_reason", "logprobs"}, ...], "prompt_logprobs"}."""
    return [{"outputs": [{"token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason,
                          "logprobs": _logprobs(c.logprobs)} for c in o.outputs],
             "prompt_logprobs": _logprobs(o.prompt_logprobs)} for o in outputs]


def _serve(conn: Any, spec_dict: dict, log_path: str) -> None:
    """Child process: build the engine, then answer "generate" until "close"."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        spec = EngineRun(**spec_dict)
        llm, default_prompts, default_params = _build(spec)
        steps = _record_steps(llm)
        conn.send(("ready", None))
        while True:
            msg = conn.recv()  # "generate", ("generate", overrides) or "close"
            overrides = msg[1] if isinstance(msg, tuple) and msg[0] == "generate" else None
            if msg != "generate" and overrides is None:
                break
            detail = bool(overrides and overrides.get("detail"))
            try:  # SamplingParams or the engine may refuse a request; the engine keeps serving
                prompts, params = (default_prompts, default_params) if overrides is None else \
                    _call_inputs(llm, spec, overrides)
                before = _spec_metrics(llm)
                steps.clear()
                start = time.perf_counter()
                limit = overrides.get("max_in_flight") if overrides else None
                outputs = llm.generate(prompts, params, use_tqdm=False) if limit is None else \
                    _generate_in_flight(llm, prompts, params, limit)
            except Exception as exc:
                if not (detail and _refused(exc)):
                    raise
                conn.send(("result", asdict(RunResult([], [], 0.0, 0, error=f"{type(exc).__name__}: {exc}"))))
                continue
            seconds = time.perf_counter() - start
            after = _spec_metrics(llm)
            token_ids = [list(o.outputs[0].token_ids) for o in outputs]
            result = RunResult(
                token_ids=token_ids,
                texts=[o.outputs[0].text for o in outputs],
                seconds=seconds,
                output_tokens=sum(len(t) for t in token_ids),
                **{k: after[k] - before[k] for k in after},
                step_seconds=list(steps),
                details=_details(outputs) if detail else None,
            )
            conn.send(("result", asdict(result)))
    except Exception as exc:  # reported to the parent with the log tail; the parent raises
        causes, e = [], exc
        while e is not None:
            causes.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        conn.send(("error", " <- ".join(causes)))


def _generate_in_flight(llm: Any, prompts: list, params: Any, limit: int) -> list:
    """llm.generate with at most `limit` requests in the engine: the next prompt joins as one finishes."""
    engine = llm.llm_engine
    params = params if isinstance(params, list) else [params] * len(prompts)
    tag = f"in-flight-{time.monotonic_ns()}-"  # request ids unique across calls
    outputs: list[Any] = [None] * len(prompts)
    queued = iter(range(len(prompts)))

    def submit() -> None:
        i = next(queued, None)
        if i is not None:
            engine.add_request(f"{tag}{i}", prompts[i], params[i])

    for _ in range(min(limit, len(prompts))):
        submit()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[int(out.request_id.removeprefix(tag))] = out
                submit()
    return outputs


def _refused(exc: Exception) -> bool:
    """A request vLLM turned down (bad parameters: a 4xx under `vllm serve`), not an engine failure."""
    return isinstance(exc, (ValueError, TypeError)) or any(
        c.__name__ == "VLLMClientError" for c in type(exc).__mro__)


def _record_steps(llm: Any) -> list[float]:
    """Time every engine-core step (schedule, forward, sample, draft) of `llm` into the returned list."""
    core = llm.llm_engine.engine_core
    get_output = core.get_output
    steps: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return get_output(*args, **kwargs)
        finally:
            steps.append(time.perf_counter() - start)

    core.get_output = timed
    return steps


def _call_inputs(llm: Any, spec: EngineRun, overrides: dict) -> tuple[list, Any]:
    """Prompts and sampling parameters of one generate() call that overrides the spec's."""
    prompts = overrides.get("prompts")
    max_tokens = overrides.get("max_tokens")
    max_tokens = spec.max_tokens if max_tokens is None else max_tokens
    per_prompt = overrides.get("params")
    params = _params(spec, max_tokens) if per_prompt is None else [
        _params(spec, **{"max_tokens": max_tokens, **p}) for p in per_prompt]
    return _prompt_inputs(llm, spec, spec.prompts if prompts is None else prompts), params


def _params(spec: EngineRun, max_tokens: int, **fields: Any) -> Any:
    from vllm import SamplingParams

    defaults = dict(max_tokens=max_tokens, temperature=spec.temperature, seed=spec.seed, ignore_eos=spec.ignore_eos)
    if isinstance(fields.get("structured_outputs"), dict):
        from vllm.sampling_params import StructuredOutputsParams

        fields["structured_outputs"] = StructuredOutputsParams(**fields["structured_outputs"])
    return SamplingParams(**{**defaults, **fields})


def _prompt_inputs(llm: Any, spec: EngineRun, raw: list[Any]) -> list[Any]:
    prompts: list[Any] = []
    for p in raw:
        if isinstance(p, list):
            prompts.append({"prompt_token_ids": p})
        elif spec.chat and not isinstance(p, Rendered):
            prompts.append(llm.get_tokenizer().apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True))
        else:
            prompts.append(p)
    return prompts


def _build(spec: EngineRun) -> tuple[Any, list, Any]:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec.model,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        enforce_eager=spec.enforce_eager,
        seed=spec.seed,
        disable_log_stats=False,
        speculative_config=spec.speculative_config,
        additional_config=spec.additional_config or {},
        **spec.engine_kwargs,
    )
    prompts = _prompt_inputs(llm, spec, spec.prompts)
    if spec.warmup:
        # A prompt of its own: warming up on a timed prompt would let proposers that remember
        # responses (suffix trees) start the timed run with part of its answer.
        warm = [list(range(10, 42))] if isinstance(spec.prompts[0], list) else ["Name three colours."]
        llm.generate(_prompt_inputs(llm, spec, warm), SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
    return llm, prompts, _params(spec, spec.max_tokens)
