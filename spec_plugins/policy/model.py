"""The shape of a target model, read from a Hugging Face config.json: what the cost model needs.

Only the fields that set the cost of a decode step are kept: layer count, GEMM shapes, attention heads
(the group size G = heads / kv_heads decides how many draft positions share one K/V tile load) and
mixture-of-experts routing. Built-in shapes live in configs/models/*.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec_plugins.policy.hardware import DTYPE_BYTES, builtin_config_dir, canonical_dtype

_MISSING = object()


@dataclass(frozen=True)
class ModelDescriptor:
    """A decoder-only transformer with gated (SwiGLU) MLPs, the layout of Llama/Mistral/Qwen/Mixtral.

    intermediate:        the dense MLP width (HF intermediate_size).
    expert_intermediate: each expert's MLP width (moe_intermediate_size, else intermediate_size); 0 if dense.
    shared_intermediate: width of an always-active shared expert (Qwen2-MoE); 0 for none.
    Biases and norm weights are left out: under 0.1% of the bytes and FLOPs of any model here.
    """

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    dtype: str = "bf16"
    tie_word_embeddings: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            _check_int(getattr(self, f), f"ModelDescriptor.{f}", low=1)
        for f in ("num_experts", "experts_per_token", "expert_intermediate", "shared_intermediate"):
            _check_int(getattr(self, f), f"ModelDescriptor.{f}", low=0)
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelDescriptor.heads: {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"ModelDescriptor.experts_per_token: expected 1..{self.num_experts}, got {self.experts_per_token}"
            )
        if self.num_experts and not self.expert_intermediate:
            raise ValueError("ModelDescriptor.expert_intermediate: expected > 0 for a mixture-of-experts model")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype, "ModelDescriptor.dtype"))

    # -- shape -----------------------------------------------------------------------------------

    @property
    def group_size(self) -> int:
        """G: query heads sharing one KV head."""
        return self.heads // self.kv_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def experts_touched(self, rows: int) -> int:
        """Experts whose weights a step with `rows` tokens streams: min(E, rows·k).

        An upper bound: uniform routing touches E·(1 − (1 − k/E)^rows) distinct experts in expectation.
        It is exact for one token and approached once rows·k ≫ E; in between it overstates the weights
        streamed, which errs on the side of costing extra draft rows more.
        """
        if not self.is_moe or rows <= 0:
            return 0
        return min(self.num_experts, rows * self.experts_per_token)

    # -- parameter counts per layer (elements) ---------------------------------------------------

    @property
    def attn_params(self) -> int:
        """q and o projections (heads·head_dim × hidden each), k and v (kv_heads·head_dim × hidden each)."""
        return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)

    @property
    def dense_mlp_params(self) -> int:
        """MLP weights every token uses: gate/up/down of a dense MLP; router + shared expert for MoE."""
        if not self.is_moe:
            return 3 * self.hidden * self.intermediate
        return self.hidden * self.num_experts + 3 * self.hidden * self.shared_intermediate

    @property
    def expert_params(self) -> int:
        """One routed expert's gate/up/down; 0 for a dense model."""
        return 3 * self.hidden * self.expert_intermediate if self.is_moe else 0

    @property
    def layer_params(self) -> int:
        """All weights of one decoder layer, every expert included."""
        return self.attn_params + self.dense_mlp_params + self.num_experts * self.expert_params

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def param_count(self) -> int:
        """Total parameters: layers, embedding and LM head (one matrix when tied)."""
        embeddings = self.lm_head_params * (1 if self.tie_word_embeddings else 2)
        return self.layers * self.layer_params + embeddings

    def param_bytes(self, dtype: str | None = None) -> int:
        """Weight bytes in `dtype` (default: the checkpoint's dtype)."""
        return self.param_count * DTYPE_BYTES[canonical_dtype(dtype or self.dtype)]

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """K and V of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[canonical_dtype(dtype or self.dtype)]

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def from_config(cls, d: dict[str, Any], source: str = "config.json", name: str = "") -> ModelDescriptor:
        """From a HF config dict (Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE field names)."""
        where = f"model config {source}"
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        # Multimodal wrappers (Llava, Mistral3, Gemma3) keep the language model under text_config.
        if "hidden_size" not in d and isinstance(d.get("text_config"), dict):
            d = d["text_config"]

        def field(key: str, default: Any = _MISSING, low: int = 1) -> int:
            value = d.get(key)
            if value is None:
                if default is _MISSING:
                    raise ValueError(f"{where}: missing field '{key}'")
                return default
            return _check_int(value, f"{where}: field '{key}'", low=low)

        heads = field("num_attention_heads")
        kv_heads = field("num_key_value_heads", heads)
        hidden = field("hidden_size")
        if heads % kv_heads:
            raise ValueError(
                f"{where}: num_attention_heads ({heads}) not divisible by num_key_value_heads ({kv_heads})"
            )
        if d.get("head_dim") is None and hidden % heads:
            raise ValueError(f"{where}: missing field 'head_dim' (hidden_size {hidden} not divisible by {heads} heads)")
        intermediate = field("intermediate_size")
        experts = field("num_local_experts", 0, low=0) or field("num_experts", 0, low=0)
        per_token = field("num_experts_per_tok", 0, low=0) if experts else 0
        if experts and not 1 <= per_token <= experts:
            raise ValueError(f"{where}: field 'num_experts_per_tok': expected 1..{experts}, got {per_token}")
        dtype = d.get("torch_dtype") or d.get("dtype") or "bfloat16"
        return cls(
            layers=field("num_hidden_layers"),
            hidden=hidden,
            intermediate=intermediate,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=field("head_dim", hidden // heads),
            vocab=field("vocab_size"),
            num_experts=experts,
            experts_per_token=per_token,
            expert_intermediate=field("moe_intermediate_size", intermediate) if experts else 0,
            shared_intermediate=field("shared_expert_intermediate_size", 0, low=0) if experts else 0,
            dtype=canonical_dtype(dtype, f"{where}: field 'torch_dtype'"),
            # LlamaConfig/Qwen/Mixtral default to untied; configs that tie (SmolLM2) say so.
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            name=name,
        )


def _check_int(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}: expected an integer >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{what}: expected an integer >= {low}, got {value}")
    return value


def available_models() -> list[str]:
    """Names of the built-in model shapes (configs/models/*.json stems), sorted."""
    folder = builtin_config_dir("models")
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def load_model_config(path: str | Path) -> ModelDescriptor:
    """A config.json file, a folder holding one (a HF checkpoint), or a built-in name (`llama-3.1-8b`)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ValueError(f"model config {path}: folder has no config.json")
    elif not p.is_file():
        builtin = builtin_config_dir("models") / f"{str(path).strip().lower()}.json"
        if not builtin.is_file():
            raise ValueError(
                f"model config {path}: not found; expected a config.json file, a folder containing one, "
                f"or one of {', '.join(available_models())}"
            )
        p = builtin
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {p}: not valid JSON (line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"model config {p}: cannot read ({e.__class__.__name__})") from None
    name = p.parent.name if p.name == "config.json" else p.stem
    return ModelDescriptor.from_config(data, source=str(p), name=name)
