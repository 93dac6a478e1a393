"""What each engine version accepts in its speculative config, as data, and checkers with one-line errors.

Neither engine has to be installed: TensorRT-LLM does not even import without CUDA, so its YAML shapes are
checked against field lists kept here (from the 1.2.0 API reference and the 1.3/1.4 release-candidate line)
rather than against `tensorrt_llm.llmapi`. The vLLM lists match `vllm/config/speculative.py` of 0.32.0 / 0.33.0.

Config files declare the engine version they target in a comment line (YAML) such as

    # engine: tensorrt-llm>=1.2

`>=` checks the file against every rule set from that version on, `==` against that version's only; a YAML
file without the line is read as `tensorrt-llm==1.2` (what `spec-plugins plan` writes). Checking whole files
(ours included: their `spec_plugins` sections are built) is `spec_plugins.trtllm.config_files`.
"""

from __future__ import annotations

import re
from typing import Any

from spec_plugins.versions import major_minor

# ---- TensorRT-LLM --------------------------------------------------------------------------------------

# Rule sets we know. A 1.5+ engine is checked with the newest set (most fields carry over).
TRTLLM_VERSIONS = ("1.2", "1.3", "1.4")

# `DecodingBaseConfig` fields, valid under every decoding type. 1.3 renamed the acceptance gate's fields.
_BASE_12 = frozenset({
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "speculative_model_dir",
    "max_concurrency", "draft_len_schedule", "load_format", "acceptance_window", "acceptance_length_threshold",
    "allow_advanced_sampling",
})
_BASE_13 = (_BASE_12 - {"acceptance_window", "acceptance_length_threshold"}) | {
    "acceptance_rate_window_size", "acceptance_rate_threshold"}

_EAGLE = frozenset({
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
    "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
    "eagle3_model_arch",
})
_MTP = frozenset({
    "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
    "use_mtp_vanilla", "mtp_eagle_one_model", "num_nextn_predict_layers_from_model_config",
    "BEGIN_THINKING_PHASE_TOKEN", "END_THINKING_PHASE_TOKEN",
})
_NGRAM = frozenset({"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"})
_DFLASH_13 = frozenset({"mask_token_id", "target_layer_ids", "attention_backend"})
_DSPARK_13 = _DFLASH_13 | {"block_size", "markov_rank", "markov_head_type"}
_NONE: frozenset[str] = frozenset()

# decoding_type -> the fields it adds to the base ones. `UserProvided` is the marker our launcher reads: its
# drafter is a Python object, which YAML cannot carry.
_TYPES_12: dict[str, frozenset[str]] = {
    "MTP": _MTP,
    "Eagle": _EAGLE,
    "Lookahead": frozenset({"max_window_size", "max_ngram_size", "max_verification_set_size"}),
    "NGram": _NGRAM,
    "DraftTarget": _NONE,
    "SaveState": frozenset({"output_directory", "write_interval", "file_prefix", "eagle3_layers_to_capture"}),
    "UserProvided": _NONE,
    "AUTO": _NONE,
    "Medusa": frozenset({"medusa_choices", "num_medusa_heads"}),
}
_TYPES_13: dict[str, frozenset[str]] = {
    **_TYPES_12,
    "MTP": _MTP | {"sa_config"},
    "Eagle": _EAGLE | {"sa_config"},  # kept as an alias of Eagle3
    "Eagle3": _EAGLE | {"sa_config"},
    "Draft_Target": _NONE,
    "SA": frozenset({"max_matching_ngram_size", "enable_global_pool", "global_pool_size"}),
    "PARD": frozenset({"mask_token_id", "sa_config"}),
    "DFlash": _DFLASH_13,
    "DSpark": _DSPARK_13,
}
_TYPES_14: dict[str, frozenset[str]] = {
    **_TYPES_13,
    "DFlash": _DFLASH_13 | {"context_recompute_tail", "spec_dec_variant", "skip_ctx_buffer_budget_check"},
    "DSpark": _DSPARK_13 | {
        "enable_confidence_scheduling", "confidence_cost_table_path", "confidence_calibration_path",
        "confidence_min_predicted_gain", "enable_fused_confidence_scheduler"},
}

TRTLLM_RULES: dict[str, dict[str, Any]] = {
    "1.2": {"base": _BASE_12, "types": _TYPES_12},
    "1.3": {"base": _BASE_13, "types": _TYPES_13},
    "1.4": {"base": _BASE_13, "types": _TYPES_14},
}

# Fields a decoding type cannot run without (`speculative_model_dir` is an alias of `speculative_model`).
# MTP derives its length from `num_nextn_predict_layers`; AUTO and SaveState choose their own.
_NEEDS_DRAFT_MODEL = ("DraftTarget", "Draft_Target", "DFlash", "DSpark", "PARD")
_NEEDS_MAX_DRAFT_LEN = ("NGram", "DraftTarget", "Draft_Target", "Eagle", "Eagle3", "UserProvided", "SA", "PARD",
                        "DFlash", "DSpark", "Lookahead", "Medusa")

# Where a decoding type first appears, for the "it needs X" hint.
_FIRST_VERSION = {name: v for v in reversed(TRTLLM_VERSIONS) for name in TRTLLM_RULES[v]["types"]}

SPEC = "speculative_config"
SECTION = "spec_plugins"
USER_PROVIDED = "UserProvided"


def trtllm_rule_set(version: str) -> str:
    """The rule set for an engine version string (`1.2`, `1.2.1`, `1.3.0rc5`, ...)."""
    found = major_minor(version)
    if found is None:
        raise ValueError(f"TensorRT-LLM version: expected e.g. 1.2 or 1.3.0rc5, got {version!r}")
    major, minor = found
    if (major, minor) < (1, 2):
        raise ValueError(f"TensorRT-LLM version: {version} is not supported (spec-plugins needs 1.2+)")
    known = [v for v in TRTLLM_VERSIONS if tuple(map(int, v.split("."))) <= (major, minor)]
    return known[-1]


def check_trtllm_config(cfg: dict, version: str = "1.2") -> None:
    """Check a TensorRT-LLM LLM-API YAML document (as a dict) against `version`'s rules.

    Only `speculative_config` and our `spec_plugins` section are checked: TensorRT-LLM validates its other
    keys itself. The content of `spec_plugins` is checked by `spec_plugins.trtllm.settings`.
    """
    rules = TRTLLM_RULES[trtllm_rule_set(version)]
    if not isinstance(cfg, dict):
        raise ValueError(f"config: expected a mapping of LLM-API options, got {type(cfg).__name__}")
    spec = cfg.get(SPEC)
    if spec is None:
        if SECTION in cfg:
            raise ValueError(f"{SECTION}: needs {SPEC}.decoding_type: {USER_PROVIDED} (and max_draft_len)")
        return
    if not isinstance(spec, dict):
        raise ValueError(f"{SPEC}: expected a mapping, got {spec!r}")
    kind = _decoding_type(spec, rules, version)
    _check_keys(spec, kind, rules, version)
    _check_required(spec, kind)
    _check_schedule(spec, trtllm_rule_set(version))
    _check_user_provided(cfg, kind)


def _decoding_type(spec: dict, rules: dict, version: str) -> str:
    kind = spec.get("decoding_type")
    if kind is None:
        raise ValueError(f"{SPEC}.decoding_type: required (one of {', '.join(rules['types'])})")
    if kind not in rules["types"]:
        first = _FIRST_VERSION.get(kind)
        hint = f" (it needs {first}+)" if first else f"; expected one of {', '.join(rules['types'])}"
        raise ValueError(f"{SPEC}.decoding_type: {kind!r} does not exist in TensorRT-LLM {version}{hint}")
    return kind


def _check_keys(spec: dict, kind: str, rules: dict, version: str) -> None:
    allowed = rules["base"] | rules["types"][kind]
    for key in spec:
        if key not in allowed:
            raise ValueError(f"{SPEC}.{key}: not a field of decoding_type {kind} in TensorRT-LLM {version}")


def _check_required(spec: dict, kind: str) -> None:
    if kind in _NEEDS_DRAFT_MODEL and not (spec.get("speculative_model") or spec.get("speculative_model_dir")):
        raise ValueError(f"{SPEC}.speculative_model: required for decoding_type {kind} (the draft checkpoint)")
    k = spec.get("max_draft_len")
    if k is None and kind in _NEEDS_MAX_DRAFT_LEN:
        raise ValueError(f"{SPEC}.max_draft_len: required for decoding_type {kind}")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"{SPEC}.max_draft_len: expected an integer >= 1, got {k!r}")


def _check_schedule(spec: dict, rule_set: str) -> None:
    schedule = spec.get("draft_len_schedule")
    if schedule is None:
        return
    k = spec.get("max_draft_len")
    if k is None:
        raise ValueError(f"{SPEC}.draft_len_schedule: needs max_draft_len")
    if not isinstance(schedule, dict):
        raise ValueError(f"{SPEC}.draft_len_schedule: expected a mapping batch size -> draft length, got {schedule!r}")
    if rule_set == "1.2":
        from spec_plugins.policy.planner import check_trtllm_schedule

        try:
            check_trtllm_schedule(schedule, k)
        except ValueError as exc:
            raise ValueError(f"{SPEC}.{exc}") from None
        return
    _check_schedule_13(schedule, k)
    if spec.get("max_concurrency") is not None:
        raise ValueError(f"{SPEC}.max_concurrency: cannot be set together with draft_len_schedule in "
                         "TensorRT-LLM 1.3+ (it becomes {max_concurrency: max_draft_len}); use one of them")


def _check_schedule_13(schedule: dict, k: int) -> None:
    """1.3+: keys are upper bounds of batch-size ranges; the smallest one maps to max_draft_len."""
    where = f"{SPEC}.draft_len_schedule"
    for key, value in schedule.items():
        if not isinstance(key, int) or isinstance(key, bool) or key < 1:
            raise ValueError(f"{where}: keys must be batch sizes >= 1, got {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}[{key}]: expected a draft length >= 0, got {value!r}")
        if value > k:
            raise ValueError(f"{where}[{key}]: {value} exceeds max_draft_len {k}")
    if not schedule:
        raise ValueError(f"{where}: expected a non-empty mapping")
    smallest = min(schedule)
    if schedule[smallest] != k:
        raise ValueError(f"{where}: the smallest batch size ({smallest}) must map to max_draft_len ({k}) in "
                         f"TensorRT-LLM 1.3+, got {schedule[smallest]!r}")


def _check_user_provided(cfg: dict, kind: str) -> None:
    if kind != USER_PROVIDED:
        if SECTION in cfg:
            raise ValueError(f"{SECTION}: only read with {SPEC}.decoding_type: {USER_PROVIDED}, not {kind}")
        return
    if SECTION not in cfg:
        raise ValueError(f"{SECTION}: required with {SPEC}.decoding_type: {USER_PROVIDED} "
                         "(names the proposer the launcher builds)")
    if cfg.get("disable_overlap_scheduler") is False:
        raise ValueError("disable_overlap_scheduler: user-provided drafters need it true (or left out)")


# ---- vLLM ----------------------------------------------------------------------------------------------

VLLM_VERSIONS = ("0.32", "0.33", "0.34")
VLLM_RUNNER_VERSIONS = (("0.32", "0.33"), ("0.34",))  # the V1 runner (custom_class), Model Runner V2

_MTP_ALIASES = frozenset({
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp",
    "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp",
    "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "mtp",
    "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp", "inkling_mtp",
    "glm5_next_mtp",
})
_METHODS_32 = frozenset({
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
    "extract_hidden_states", "dflash", "ngram_gpu", "dspark",
}) | _MTP_ALIASES
_KEYS_32 = frozenset({
    "method", "model", "num_speculative_tokens", "enforce_eager", "revision", "code_revision", "max_model_len",
    "quantization", "kv_cache_dtype", "attention_backend", "moe_backend", "draft_tensor_parallel_size",
    "draft_load_config", "index_share_for_mtp_iteration", "disable_padded_drafter_batch", "disable_eagle_block_drop",
    "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min",
    "parallel_drafting", "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
    "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk",
})

VLLM_RULES: dict[str, dict[str, frozenset[str]]] = {
    "0.32": {"methods": _METHODS_32, "keys": _KEYS_32,
             "rejection": frozenset({"standard", "synthetic", "block"})},
    # 0.33 drops medusa and mlp_speculator, adds the fly verifier and a few drafting knobs.
    "0.33": {"methods": _METHODS_32 - {"medusa", "mlp_speculator"},
             "keys": _KEYS_32 | {"disable_lookahead_block_hashes", "draft_lm_head_quantization", "fly_window_size",
                                 "fly_entropy_threshold", "fly_entropy_top_k", "xpress_topc"},
             "rejection": frozenset({"standard", "synthetic", "block", "fly"})},
    # 0.34 (Model Runner V2 only): custom_class is gone; registered methods (ours: spec_plugins_*) take their options
    # in speculator_options; suffix gets a corpus size; the padded-batch and heterogeneous-vocab switches are gone.
    "0.34": {"methods": (_METHODS_32 - {"medusa", "mlp_speculator", "custom_class"}
                         | {"nemotron3_5_transcribe_mtp", "step5_mtp", "spec_plugins_suffix_tree", "spec_plugins_ngram"}),
             "keys": (_KEYS_32 - {"disable_padded_drafter_batch", "use_heterogeneous_vocab"}
                      | {"disable_lookahead_block_hashes", "draft_lm_head_quantization", "fly_window_size",
                         "fly_entropy_threshold", "fly_entropy_top_k", "xpress_topc", "speculator_options",
                         "suffix_decoding_corpus_tokens", "draft_decode_context_parallel_size"}),
             "rejection": frozenset({"standard", "synthetic", "block", "fly"})},
}

# Methods that load a draft checkpoint (or, for custom_class, a class) named by `model`.
_VLLM_NEEDS_MODEL = frozenset({"custom_class", "draft_model", "eagle", "eagle3", "dflash", "medusa",
                               "mlp_speculator"})
VSPEC = "speculative_config"


def vllm_rule_set(version: str) -> str:
    found = major_minor(version)
    name = None if found is None else f"{found[0]}.{found[1]}"
    if name not in VLLM_RULES:
        raise ValueError(f"vLLM version: expected one of {', '.join(VLLM_VERSIONS)}, got {version!r}")
    return name


def check_vllm_speculative_config(cfg: dict, version: str = "0.32") -> None:
    """Check a vLLM `--speculative-config` dict against `version`'s `SpeculativeConfig` fields."""
    rules = VLLM_RULES[vllm_rule_set(version)]
    if not isinstance(cfg, dict):
        raise ValueError(f"{VSPEC}: expected a JSON object, got {type(cfg).__name__}")
    for key in cfg:
        if key not in rules["keys"]:
            raise ValueError(f"{VSPEC}.{key}: not a field of vLLM {version}'s SpeculativeConfig")
    method = cfg.get("method")
    if method is None:
        raise ValueError(f"{VSPEC}.method: required (vLLM would guess it from `model`; say it explicitly)")
    if method not in rules["methods"]:
        other = [v for v in VLLM_VERSIONS if method in VLLM_RULES[v]["methods"]]
        hint = f" (only in {', '.join(other)})" if other else ""
        raise ValueError(f"{VSPEC}.method: {method!r} does not exist in vLLM {version}{hint}")
    if method in _VLLM_NEEDS_MODEL and not cfg.get("model"):
        raise ValueError(f"{VSPEC}.model: required for method {method!r}")
    k = cfg.get("num_speculative_tokens")
    if k is None and method not in ("suffix", "spec_plugins_suffix_tree", "spec_plugins_ngram"):  # these default it
        raise ValueError(f"{VSPEC}.num_speculative_tokens: required for method {method!r}")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"{VSPEC}.num_speculative_tokens: expected an integer >= 1, got {k!r}")
    rejection = cfg.get("rejection_sample_method")
    if rejection is not None and rejection not in rules["rejection"]:
        raise ValueError(f"{VSPEC}.rejection_sample_method: {rejection!r} does not exist in vLLM {version}")
    if cfg.get("num_speculative_tokens_per_batch_size") is not None:
        _check_vllm_schedule(cfg["num_speculative_tokens_per_batch_size"])
    if "speculator_options" in cfg:
        from spec_plugins.vllm.settings import MRV2_METHODS, settings_from_speculator_options

        ours = {m: p for p, m in MRV2_METHODS.items()}
        if method not in ours:
            raise ValueError(f"{VSPEC}.speculator_options: only for a registered method (ours: "
                             f"{', '.join(sorted(ours))}), not {method!r}")
        settings_from_speculator_options(cfg["speculator_options"], ours[method]).build(f"{VSPEC}.speculator_options")


def _check_vllm_schedule(ranges: Any) -> None:
    """vLLM's `validate_and_normalize_dynamic_sd_schedule`: inclusive (start, end, K) ranges from batch 1."""
    where = f"{VSPEC}.num_speculative_tokens_per_batch_size"
    if not isinstance(ranges, list) or not ranges:
        raise ValueError(f"{where}: expected a non-empty list of [start, end, K] ranges")
    previous_end = 0
    for entry in sorted(ranges, key=lambda e: e[0] if isinstance(e, (list, tuple)) and e else 0):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(isinstance(x, int) for x in entry):
            raise ValueError(f"{where}: expected [start, end, K] integer triples, got {entry!r}")
        start, end, k = entry
        if start < 1 or end < start or k < 0:
            raise ValueError(f"{where}: bad range {list(entry)} (need 1 <= start <= end, K >= 0)")
        if start <= previous_end:
            raise ValueError(f"{where}: ranges overlap at {list(entry)}")
        previous_end = end
    if min(e[0] for e in ranges) != 1:
        raise ValueError(f"{where}: the first range must start at batch size 1")


# ---- the `# engine:` line of a YAML file ---------------------------------------------------------------

_ENGINE_LINE = re.compile(r"^#\s*engine:\s*tensorrt-llm\s*(>=|==)\s*([0-9][0-9A-Za-z.]*)\s*$", re.MULTILINE)


def declared_trtllm_versions(text: str) -> list[str]:
    """The rule sets a YAML file's `# engine: tensorrt-llm>=X` (or `==X`) line asks for; none: `==1.2`."""
    m = _ENGINE_LINE.search(text)
    op, version = (m.group(1), m.group(2)) if m else ("==", "1.2")
    first = trtllm_rule_set(version)
    if op == "==":
        return [first]
    return list(TRTLLM_VERSIONS[TRTLLM_VERSIONS.index(first):])
