"""Runs inside one vLLM environment and reports, as JSON on stdout, what that vLLM's own code decides.

    python integration_tests/vllm_contract_probe.py contract
    python integration_tests/vllm_contract_probe.py config SCENARIOS.json   (vLLM 0.33, a CUDA platform)
    python integration_tests/vllm_contract_probe.py load CHECKS.json         (vLLM 0.33, a CUDA platform)
    python integration_tests/vllm_contract_probe.py mrv2 SETUP.json          (vLLM 0.34, a CUDA platform)

`contract`: every entry of `spec_plugins.vllm.patches` (PATCHES and RELIES_ON) resolved in this vLLM, with the
problems found (none when the contract holds), and whether this vLLM still has the CPU defects our fixes mend.

`config`: `EngineArgs(**args).create_engine_config()` for each scenario, on vLLM's own `CudaPlatform` class whose
device queries answer for one H100 (this machine has no GPU, and the wheel's compiled op library needs CUDA, so
that library is left out and Triton is reported present; every decision reported is vLLM's code or ours). Per
scenario: the runner (`use_v2_model_runner`), async scheduling, the schedule vLLM kept, our section of
`additional_config`, the start-up line our custom_class proposer logs when built from that config, vLLM's and
our log lines, or the one-line error.

`load`: for each (target, draft checkpoint, method), the draft model class vLLM's registry picks for that method,
built on the CPU with vLLM's own constructor, every parameter set to NaN, then vLLM's own `load_weights` fed the
checkpoint's tensors: the parameters left NaN are the ones the checkpoint did not fill. Compiled ops are only
referenced at construction (a call would raise), so nothing runs but the loader.

`mrv2`: our vLLM 0.34 speculator as vLLM builds and drives it: `SpeculativeConfig` built by vLLM's own code for
good and bad options, `init_speculator`, and a recorded runner trace (`mrv2_trace.py`: prefills, chunked prefill,
preemption and re-send, finishes, warm-up) driven with vLLM's own `RequestState` / `InputBatch` on CPU tensors,
compared step by step with the V1 `custom_class` proposer on the same contexts; two speculators fed one trace in
two threads (tensor-parallel ranks); dummy runs.

No assertions here: the tests (`test_vllm_contract.py`) read the report.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import types


class _Lines:
    """Every vLLM / spec-plugins log line at INFO or above, whatever handlers vLLM's logging config installs (its
    dictConfig replaces the handlers of "vllm" and its children whenever it configures logging)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        handle = logging.Logger.handle

        def record(logger: logging.Logger, rec: logging.LogRecord) -> None:
            if rec.levelno >= logging.INFO and rec.name.startswith(("vllm", "spec_plugins")):
                self.lines.append(rec.getMessage())
            handle(logger, rec)

        logging.Logger.handle = record


def contract() -> dict:
    import inspect

    import vllm

    from spec_plugins.versions import major_minor
    from spec_plugins.vllm import cpu_sampler_fix, min_tokens_fix, patches, plugin

    found = major_minor(vllm.__version__)
    report = {"version": vllm.__version__, "problems": {}}
    for entry in patches.PATCHES + patches.RELIES_ON:
        if patches.applies(entry, found):
            report["problems"][entry.target + ("" if isinstance(entry, patches.Patch) else " (relied on)")] = \
                patches.problems(entry)
    # The V1 names this vLLM no longer has: on Model Runner V2 none of them may be touched.
    report["v1_only_found"] = [e.target for e in patches.PATCHES + patches.RELIES_ON
                               if not patches.applies(e, found) and not patches.problems(e)]
    if found in patches.V1:
        _, expand = patches.resolve(patches.by_name("cpu_expand_kernel").target)
        _, bookkeeping = patches.resolve(patches.by_name("cpu_seed_rewind_bookkeeping").target)
        _, bonus = patches.resolve(patches.by_name("min_tokens_bonus").target)
        report["defects"] = {
            # the expand kernel converts its float output to a dropped int64 copy
            "cpu_expand_kernel": "_ensure_int64(output)" in inspect.getsource(patches.original(expand)),
            # the rewind of a discarded sample's generator by offset, which CPU generators do not have
            "cpu_seed_rewind": "set_offset" in inspect.getsource(patches.original(bookkeeping)),
            # the bonus token's logits processors run with no word of this step's drafts (min_tokens by output length)
            "min_tokens_bonus": "processor.apply(logits)" in inspect.getsource(patches.original(bonus)),
        }
    report["cpu_fix_affected"] = cpu_sampler_fix.affected(vllm.__version__)
    report["min_tokens_fix_affected"] = min_tokens_fix.affected(vllm.__version__)
    report["plugin_supported"] = plugin._supported(vllm.__version__)
    return report


# The wheel's compiled op libraries (built for torch 2.14 and CUDA) that vLLM's CUDA modules import at import time.
COMPILED_LIBRARIES = ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C")


def _stand_in_cuda() -> None:
    """vLLM's own CudaPlatform, its device queries answered for one H100; set before any vLLM module reads it."""
    for lib in COMPILED_LIBRARIES:  # empty: no op of theirs runs in a config build
        sys.modules.setdefault(lib, types.ModuleType(lib))
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class StandInH100(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=9, minor=0)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H100 80GB HBM3"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 * 2**30

        @classmethod
        def device_count(cls) -> int:
            return 1

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

    platforms._current_platform = StandInH100()
    _stand_in_capability_queries()
    import vllm.triton_utils

    vllm.triton_utils.HAS_TRITON = True  # Triton ships with every CUDA install of vLLM
    import vllm.config.vllm

    vllm.config.vllm.HAS_TRITON = True


# Queries vLLM's modules make of the compiled op library at import time; the stand-in has no CUTLASS kernels.
CAPABILITY_QUERIES = ("cutlass_scaled_mm_supports_block_fp8", "cutlass_scaled_mm_supports_fp8",
                      "cutlass_group_gemm_supported")


def _stand_in_capability_queries() -> None:
    import torch

    lib = torch.library.Library("_C", "FRAGMENT")
    _stand_in_capability_queries.lib = lib  # kept alive: the ops live as long as the library object
    for name in CAPABILITY_QUERIES:
        lib.define(f"{name}(int cuda_device_capability) -> bool")
        lib.impl(name, lambda capability: False, "CompositeExplicitAutograd")


def config(scenarios: list[dict]) -> dict:
    _stand_in_cuda()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    import vllm.logger

    lines = _Lines()
    logging.getLogger("spec_plugins").setLevel(logging.INFO)
    out = {"platform": type(current_platform).__name__, "device_type": current_platform.device_type, "scenarios": {}}
    for sc in scenarios:
        saved = {k: os.environ.get(k) for k in sc.get("env", {})}
        os.environ.update(sc.get("env", {}))
        lines.lines.clear()
        for once in ("_print_info_once", "_print_warning_once"):  # each scenario sees vLLM's *_once lines
            getattr(vllm.logger, once).cache_clear()
        res: dict = {}
        try:
            cfg = EngineArgs(**sc["args"]).create_engine_config()
            spec = cfg.speculative_config
            res.update(v2=bool(getattr(cfg, "use_v2_model_runner", True)), async_scheduling=cfg.scheduler_config.async_scheduling,
                       cudagraph_mode=str(getattr(cfg.compilation_config.cudagraph_mode, "name", None)),
                       method=getattr(spec, "method", None),
                       vllm_schedule=getattr(spec, "num_speculative_tokens_per_batch_size", None),
                       section=(cfg.additional_config or {}).get("spec_plugins"))
            if spec is not None and getattr(spec, "custom_method", None):
                res["custom_method"] = spec.custom_method
                res["speculator_config"] = type(spec.speculator_config).__name__
                res["speculator_options"] = spec.speculator_options
            if spec is not None and spec.method == "custom_class":
                import importlib

                module, _, cls = spec.model.rpartition(".")
                proposer = getattr(importlib.import_module(module), cls)(cfg)
                res["applied_schedule"] = proposer.batch_schedule
        except Exception as exc:  # reported, not raised: the test says what was expected
            res["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        res["log"] = list(lines.lines)
        out["scenarios"][sc["name"]] = json.loads(json.dumps(res, default=str))
    from spec_plugins.vllm import patches

    out["installed"] = [p.name for p in patches.PATCHES if patches.installed(p)]
    return out


def _referenced_ops_only() -> None:
    """vLLM's layers look their kernels up in `torch.ops._C` at construction; the stand-in returns a callable
    that raises if called, so a model can be built and loaded but never run."""
    import torch

    class NoKernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, *args, **kwargs):
            raise RuntimeError(f"stand-in: no kernel for _C::{self.name}")

        def __getattr__(self, attr: str):  # overloads: torch.ops._C.op.default
            return self

    namespace = type(torch.ops._C)
    lookup = namespace.__getattr__

    def getattr_(self, name: str):
        try:
            return lookup(self, name)
        except AttributeError:
            if getattr(self, "name", None) == "_C" and not name.startswith("__"):
                return NoKernel(name)
            raise

    namespace.__getattr__ = getattr_


def load(checks: list[dict]) -> dict:
    _stand_in_cuda()
    import torch
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import get_model_architecture

    _referenced_ops_only()  # after vLLM's op registrations, which look the real ops up

    out = {}
    for i, check in enumerate(checks):
        res: dict = {}
        try:
            cfg = EngineArgs(model=check["target"], max_model_len=256, speculative_config={
                "method": check["method"], "model": check["draft"],
                "num_speculative_tokens": check["k"]}).create_engine_config()
            draft_config = cfg.speculative_config.draft_model_config
            cls, arch = get_model_architecture(draft_config)
            res.update(cls=f"{cls.__module__}.{cls.__qualname__}", arch=arch,
                       v2=bool(getattr(cfg, "use_v2_model_runner", True)))
            with set_current_vllm_config(cfg), torch.device("cpu"):
                if i == 0:
                    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                 distributed_init_method="tcp://127.0.0.1:29531")
                    initialize_model_parallel(1, 1)
                model = cls(vllm_config=cfg, prefix="draft_model")
            with torch.no_grad():
                for _, param in model.named_parameters():
                    param.fill_(float("nan"))
            tensors = load_file(f"{check['draft']}/model.safetensors")
            model.load_weights(iter(tensors.items()))
            res["tensors"] = len(tensors)
            res["not_loaded"] = sorted(n for n, p in model.named_parameters() if torch.isnan(p).all())
            res["partly_loaded"] = sorted(n for n, p in model.named_parameters()
                                          if torch.isnan(p).any() and not torch.isnan(p).all())
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}"
        out[check["name"]] = res
    return out


def mrv2(setup: dict) -> dict:
    """Our speculator on vLLM 0.34's own objects (see the module docstring)."""
    _stand_in_cuda()
    import threading

    import torch
    from vllm.config.speculative import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.gpu.spec_decode import init_speculator

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mrv2_trace

    from spec_plugins.vllm import patches, plugin

    plugin.register()
    out: dict = {"registered": sorted(__import__("vllm.v1.worker.gpu.spec_decode.speculator_config", fromlist=["x"])
                                      .registered_speculative_methods())}
    base = EngineArgs(model=setup["target"], max_model_len=mrv2_trace.MAX_LEN).create_engine_config()
    # vLLM's own SpeculativeConfig, as create_engine_config builds it, for good and bad options.
    direct = {}
    for name, spec in setup["direct"].items():
        try:
            sc = SpeculativeConfig(target_model_config=base.model_config, target_parallel_config=base.parallel_config,
                                   **spec)
            direct[name] = {"custom_method": sc.custom_method, "config": type(sc.speculator_config).__name__,
                            "k": sc.num_speculative_tokens, "options": sc.speculator_options}
        except Exception as exc:
            direct[name] = {"error": f"{type(exc).__name__}: {exc}"}
    out["direct"] = direct
    traces = {}
    for name, run in setup["traces"].items():
        spec = run["speculative_config"]
        cfg = EngineArgs(model=setup["target"], max_model_len=mrv2_trace.MAX_LEN,
                         speculative_config=spec).create_engine_config()
        cfg.parallel_config.tensor_parallel_size = run.get("tensor_parallel_size", 1)  # what each rank's config says
        built = init_speculator(cfg, torch.device("cpu"), _req_states(mrv2_trace))
        rec = mrv2_trace.run(cfg, v1=run.get("v1", True), device_copy=run.get("device_copy", False))
        traces[name] = {"class": f"{type(built).__module__}.{type(built).__qualname__}", "steps": rec.steps,
                        "drafted_rows": rec.drafted_rows, "compared_rows": rec.compared_rows,
                        "accepted": rec.accepted, "mismatches": rec.mismatches[:5],
                        "padding_mismatches": rec.padding_mismatches[:5], "warmup": rec.warmup,
                        "resent": rec.resent, "confidence_steps": len(rec.confidences),
                        "confidence_problems": rec.confidence_problems[:5], "trimmed_rows": rec.trimmed_rows}
        # Two ranks: two speculators fed one trace at once, in two threads.
        recs: list = [None, None]

        def rank(i: int) -> None:
            recs[i] = mrv2_trace.run(cfg, v1=False, device_copy=run.get("device_copy", False))

        threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        traces[name]["ranks_equal"] = (recs[0].drafts, recs[0].confidences) == (recs[1].drafts, recs[1].confidences)
        traces[name]["ranks_equal_to_alone"] = (recs[0].drafts, recs[0].confidences) == (rec.drafts, rec.confidences)
        # host_drafting: stream -- the host part in stream order, at two different timings (two ranks)
        streamed = [mrv2_trace.run(cfg, v1=False, device_copy=run.get("device_copy", False), stream_jitter=j)
                    for j in (1, 2)]
        traces[name]["stream_equal"] = [(r.drafts, r.confidences) == (rec.drafts, rec.confidences) for r in streamed]
        traces[name]["stream_steps"] = [r.steps for r in streamed]
        # A dummy / profile run: drafts nothing, changes nothing.
        spec_obj = built
        before = spec_obj.drafting.step_count
        dummy = spec_obj.propose(_dummy_batch(mrv2_trace), {}, {}, None, None, torch.ones(2, dtype=torch.int32), None,
                                 None, None, None, None, dummy_run=True)
        traces[name]["dummy"] = {"shape": list(dummy.shape), "steps_taken": spec_obj.drafting.step_count - before}
    out["traces"] = traces
    # The adaptive policy without adaptive verification: every slot is verified, so it is not applied (one warning).
    lines = _Lines()
    cfg = EngineArgs(model=setup["target"], max_model_len=mrv2_trace.MAX_LEN, speculative_config={
        "method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8,
        "speculator_options": {"policy": "adaptive", "policy_options": {"hardware": "h100"}}}).create_engine_config()
    built = init_speculator(cfg, torch.device("cpu"), _req_states(mrv2_trace))
    out["policy_without_adaptive_verification"] = {
        "policy": built.settings.policy, "drafting_policy": type(built.drafting.policy).__name__,
        "warnings": [line for line in lines.lines if "not applied" in line]}
    # host_drafting: stream where there is no CUDA device: drafting in place, said in one warning.
    cfg = EngineArgs(model=setup["target"], max_model_len=mrv2_trace.MAX_LEN, speculative_config={
        "method": "spec_plugins_suffix_tree", "num_speculative_tokens": 8,
        "speculator_options": {"host_drafting": "stream"}}).create_engine_config()
    built = init_speculator(cfg, torch.device("cpu"), _req_states(mrv2_trace))
    out["stream_on_cpu"] = {"stream_order": repr(built.stream_order),
                            "warnings": [line for line in lines.lines if "host_drafting" in line]}
    out["vllm_suffix"] = _vllm_suffix_replay()
    out["vllm_suffix_np"] = _vllm_np_check("suffix")
    out["vllm_ngram_np"] = _vllm_np_check("ngram")
    out["installed"] = [p.name for p in patches.PATCHES if patches.installed(p)]
    return json.loads(json.dumps(out, default=str))


def _vllm_suffix_replay() -> dict:
    """vLLM 0.34's own `suffix` kernels as the replay runs them (`spec_plugins.bench.vllm034_suffix`, Triton's
    interpreter with the local mend): a request's own repetition, then the corpus of a finished one."""
    from spec_plugins.bench.vllm034_suffix import Vllm034Suffix
    from spec_plugins.core import DraftRequest

    out: dict = {}
    try:
        p = Vllm034Suffix(max_model_len=256, max_requests=4)
        own = list(range(5, 25)) * 3 + [5]
        out["own_history"] = p.propose([DraftRequest("a", own, len(own), 8)])[0].tokens
        p.finish("a")
        # A request whose response is 10, 11, ..., 39, in two steps, then finished: into the corpus.
        p.propose([DraftRequest("r", [800, 801, 802, 10], 4, 8)])
        p.propose([DraftRequest("r", [800, 801, 802, *range(10, 40)], 29, 8)])
        p.finish("r")
        # A new request ending like that response's tokens 10, 11, 12, 13: only the corpus has them.
        fresh = [900, 901, 902, 10, 11, 12, 13]
        out["from_corpus"] = p.propose([DraftRequest("b", fresh, len(fresh), 8)])[0].tokens
        out["nothing"] = p.propose([DraftRequest("c", [700, 701, 702], 3, 8)])[0].tokens
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _vllm_np_check(kind: str) -> dict:
    """The project's numpy replays of vLLM 0.34's `suffix` / `ngram` (`vllm034_suffix_np`, `vllm034_ngram_np`)
    against its kernels, step by step: a replay of generated requests (repetitive token streams over a small
    vocabulary, so both the request's own history and, for `suffix`, the corpus match), 3 in flight, K = 8; for
    `suffix` a 700-token corpus ring that wraps and adaptive verification's statistics on; every draft and every
    confidence compared."""
    import numpy as np

    from spec_plugins.bench import replay
    from spec_plugins.bench.vllm034_suffix import Vllm034Ngram, Vllm034Suffix
    from spec_plugins.bench.vllm034_suffix_np import Vllm034NgramReplay, Vllm034SuffixReplay

    rng = np.random.default_rng(7)
    phrases = [rng.integers(0, 40, size=int(rng.integers(3, 9))) for _ in range(12)]
    rows = []
    for i in range(14):
        stream = np.concatenate([phrases[j] for j in rng.integers(0, len(phrases), size=30)])
        rows.append(replay.Row(f"r{i}", np.concatenate([[100 + i, 101], stream[:20]]).astype(np.int32),
                               stream[20:110].astype(np.int32)))
    if kind == "suffix":
        options = {"corpus_tokens": 700, "adaptive_verification": True}
        kernels, ours = Vllm034Suffix(max_model_len=512, max_requests=4, **options), Vllm034SuffixReplay(**options)
    else:
        options = {"min_n": 2, "max_n": 5}  # several n, so the longest-n rule is exercised
        kernels, ours = Vllm034Ngram(max_model_len=512, max_requests=4, **options), Vllm034NgramReplay(**options)
    out = {"steps": 0, "drafts": 0, "corpus_drafts": 0, "mismatches": [], "confidences": set(), "wrapped": False,
           "same_corpus": None}

    class Both:
        def propose(self, requests):
            theirs, mine = kernels.propose(requests), ours.propose(requests)
            for r, a, b in zip(requests, theirs, mine):
                if (a.tokens, a.confidence) != (b.tokens, b.confidence) and len(out["mismatches"]) < 5:
                    out["mismatches"].append({"step": out["steps"], "req": r.req_id, "kernels": [a.tokens, a.confidence],
                                              "numpy": [b.tokens, b.confidence]})
                out["drafts"] += bool(a.tokens)
                if kind == "suffix":
                    out["corpus_drafts"] += bool(b.tokens) and ours.last[r.req_id][0] >= 9  # buckets 9+: the corpus
                out["confidences"].update(a.confidence or ())
            out["steps"] += 1
            return theirs

        def finish(self, req_id):
            if kind != "suffix":
                kernels.finish(req_id)
                ours.finish(req_id)
                return
            head = ours.corpus.head
            kernels.finish(req_id)
            ours.finish(req_id)
            out["wrapped"] |= ours.corpus.head < head
            out["same_corpus"] = bool(np.array_equal(kernels.spec.corpus.numpy(), ours.corpus.tokens)
                                      and np.array_equal(kernels.spec.table.numpy(), ours.corpus.table))

    try:
        replay.walk_interleaved(Both(), rows, 8, 3, fill=True)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["confidences"] = len(out["confidences"])
    return out


def _req_states(trace: types.ModuleType):
    import torch
    from vllm.v1.worker.gpu.states import RequestState

    trace.cpu_buffers()
    return RequestState(max_num_reqs=trace.MAX_REQS, max_model_len=trace.MAX_LEN, max_num_batched_tokens=2048,
                        num_speculative_steps=trace.K, vocab_size=512, device=torch.device("cpu"))


def _dummy_batch(trace: types.ModuleType):
    import torch
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    return InputBatch.make_dummy(2, 2, InputBuffers(max_num_reqs=trace.MAX_REQS, max_num_tokens=64,
                                                    device=torch.device("cpu")))


def main() -> None:
    logging.getLogger("vllm").setLevel(logging.WARNING)
    if sys.argv[1] == "contract":
        report = contract()
    else:
        with open(sys.argv[2]) as f:
            report = {"config": config, "load": load, "mrv2": mrv2}[sys.argv[1]](json.load(f))
    print("PROBE-REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
