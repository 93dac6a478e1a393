"""GPU profiles for the step-cost model: datasheet peaks, tile sizes and achievable fractions.

Built-in profiles live in configs/hardware/*.yaml (shipped as `spec_plugins.configs`); a user profile is
any YAML file with the same fields. Peaks are *dense* (no 2:4 sparsity) because inference GEMMs are dense.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pydantic
import yaml

# Element sizes of the dtypes the cost model knows, under their common spellings (HF torch_dtype,
# vLLM --dtype, short names). fp16 and bf16 have the same tensor-core peak on every profile here.
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp8": "fp8", "float8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def canonical_dtype(name: str, what: str = "dtype") -> str:
    """'bfloat16' -> 'bf16' etc.; ValueError naming `what` for anything else."""
    key = str(name).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"{what}: unknown dtype {name!r}; expected one of bf16, fp16, fp8, fp32")
    return _DTYPE_ALIASES[key]


def builtin_config_dir(sub: str) -> Path:
    """configs/<sub> of the installed package (`spec_plugins.configs`), else of the repo checkout.

    The installed package maps configs/ to `spec_plugins.configs`; running from a checkout without
    installing, that package does not exist and the repo's configs/ folder two levels up is used.
    """
    try:
        folder = Path(str(importlib.resources.files("spec_plugins.configs") / sub))
        if folder.is_dir():
            return folder
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    return Path(__file__).resolve().parents[2] / "configs" / sub


class HardwareProfile(pydantic.BaseModel):
    """One GPU. Frozen so a profile can key caches."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: str = pydantic.Field(min_length=1)
    description: str = ""
    bf16_tflops: float = pydantic.Field(gt=0)  # dense tensor-core peak
    fp8_tflops: float | None = pydantic.Field(gt=0)  # required, null where the GPU has no FP8 (A100)
    memory_bandwidth_tbs: float = pydantic.Field(gt=0)
    sm_count: int = pydantic.Field(ge=1)
    # Rows of one GEMM M tile: a GEMM with M rows costs the FLOPs of M rounded up to this.
    gemm_tile_rows: int = pydantic.Field(ge=1)
    # Query rows (G heads x positions) served by one K/V tile load in decode attention.
    attention_tile_rows: int = pydantic.Field(ge=1)
    # Fractions of the peaks a well-tuned kernel reaches; they scale the roofline, not its shape.
    gemm_efficiency: float = pydantic.Field(default=0.7, gt=0, le=1)
    bandwidth_efficiency: float = pydantic.Field(default=0.85, gt=0, le=1)
    # Per-step cost that does not scale with tokens: launches, sampling, scheduler, host sync.
    step_overhead_us: float = pydantic.Field(default=300.0, ge=0)

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense tensor-core FLOP/s for GEMMs in `dtype` (bf16/fp16 share a peak)."""
        dt = canonical_dtype(dtype)
        if dt in ("bf16", "fp16"):
            return self.bf16_tflops * 1e12
        if dt == "fp8" and self.fp8_tflops is not None:
            return self.fp8_tflops * 1e12
        raise ValueError(f"hardware {self.name}: no {dt} tensor-core peak; expected bf16, fp16" +
                         (", fp8" if self.fp8_tflops is not None else ""))

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.memory_bandwidth_tbs * 1e12


def _hardware_dir() -> Path:
    return builtin_config_dir("hardware")


def available_hardware() -> list[str]:
    """Names of the built-in profiles (YAML file stems), sorted."""
    folder = _hardware_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_hardware(name_or_path: str | Path | HardwareProfile) -> HardwareProfile:
    """A built-in profile by name (case-insensitive), or a YAML file; a profile passes through."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    text = str(name_or_path)
    builtin = _hardware_dir() / f"{text.strip().lower()}.yaml"
    looks_like_path = isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text
    if not looks_like_path and builtin.is_file():
        return _load_yaml(builtin)
    if looks_like_path or Path(text).is_file():
        return _load_yaml(Path(text))
    raise ValueError(
        f"hardware: unknown profile {text!r}; expected one of {', '.join(available_hardware())} "
        "or a path to a YAML file"
    )


def _load_yaml(path: Path) -> HardwareProfile:
    if not path.is_file():
        raise ValueError(f"hardware file {path}: not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ValueError(f"hardware file {path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ValueError(f"hardware file {path}: expected a mapping of fields, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    try:
        return HardwareProfile(**data)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "?"
        raise ValueError(f"hardware file {path}: field '{field}': {err['msg']}") from None
