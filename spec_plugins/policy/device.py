"""The cost prior of `policy: adaptive` when its options name none: read off the engine's device.

    prior_for_device("cuda")   # -> ("hardware", <h100 profile>, "NVIDIA H100 80GB HBM3 -> h100")
    prior_for_device("cpu")    # -> ("profile", "vllm-cpu-smollm2-135m", "a CPU engine -> ...")

A GPU whose name contains a shipped profile's (H100, H200, B200, A100, L40S) gets that profile. Any other GPU
gets a roofline built from what its driver reports (`roofline_from_properties`): SM count and clock for the
tensor-core peak, memory clock and bus width for the bandwidth. A CPU engine gets the measured CPU profile
shipped in configs/profiles. Each is a prior: the policy corrects it online from the engine's measured step
times (`step_overhead: measured`, `adaptive.StepTimeFit`), so a prior wrong by a uniform factor changes no
choice and one wrong in its per-token slope is corrected once the steps vary.

The GPU is read where the policy first costs a step (inside the engine's worker, where CUDA is initialised by
then), never in a front-end process: initialising CUDA there would break the engine's worker processes.
"""

from __future__ import annotations

from typing import Any, Literal

from spec_plugins.policy.hardware import HardwareProfile, load_hardware

CPU_PRIOR = "vllm-cpu-smollm2-135m"  # configs/profiles/<name>.json
# Substrings of a device name (upper case) -> shipped hardware profile. H200 before H100: "H100" is no
# substring of "H200", but an "H100 NVL" must not read as anything else.
NAMED_GPUS = (("H200", "h200"), ("H100", "h100"), ("H800", "h100"), ("B200", "b200"), ("A100", "a100"),
              ("A800", "a100"), ("L40S", "l40s"))
# Dense bf16 tensor-core FLOPs per SM per clock, by compute capability (the datasheets' dense peaks divided by
# SMs x boost clock: A100 312 TFLOPS = 108 x 1.41 GHz x 2048; H100 989 = 132 x 1.83 x 4096; B200 2250 =
# 148 x 1.86 x 8192; L40S 362 = 142 x 2.52 x 1024). Unknown capabilities take the nearest lower one.
FLOPS_PER_SM_CLOCK = {(7, 0): 1024, (8, 0): 2048, (8, 6): 1024, (8, 9): 1024, (9, 0): 4096, (10, 0): 8192,
                      (12, 0): 1024}


def named_gpu(device_name: str) -> str | None:
    """The shipped hardware profile a device name stands for, or None."""
    upper = device_name.upper()
    return next((profile for key, profile in NAMED_GPUS if key in upper), None)


def roofline_from_properties(name: str, major: int, minor: int, sm_count: int, clock_khz: float,
                             memory_clock_khz: float, memory_bus_bits: int) -> HardwareProfile:
    """A hardware profile of a GPU from its reported properties (what `torch.cuda.get_device_properties` gives)."""
    known = sorted(k for k in FLOPS_PER_SM_CLOCK if k <= (major, minor)) or [min(FLOPS_PER_SM_CLOCK)]
    per_clock = FLOPS_PER_SM_CLOCK[known[-1]]
    tflops = sm_count * clock_khz * 1e3 * per_clock / 1e12
    bandwidth_tbs = 2.0 * memory_clock_khz * 1e3 * memory_bus_bits / 8 / 1e12  # double data rate
    hopper_or_later = major >= 9
    return HardwareProfile(
        name=f"roofline:{name}", description=f"{name} (sm_{major}{minor}), from its reported properties",
        bf16_tflops=tflops, fp8_tflops=2 * tflops if (major, minor) >= (8, 9) else None,
        memory_bandwidth_tbs=bandwidth_tbs, sm_count=sm_count,
        gemm_tile_rows=128 if hopper_or_later else 64, attention_tile_rows=128 if hopper_or_later else 64)


def _clocks(props: Any, index: int) -> tuple[float, float, int]:
    """(SM clock kHz, memory clock kHz, memory bus bits): from torch's device properties where its build reports
    them, else from NVML (nvidia-ml-py, where installed; it does not initialise CUDA); zeros where neither can."""
    found = (getattr(props, "clock_rate", 0), getattr(props, "memory_clock_rate", 0),
             getattr(props, "memory_bus_width", 0))
    if all(found):
        return float(found[0]), float(found[1]), int(found[2])
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return (pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) * 1e3,
                pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) * 1e3,
                int(pynvml.nvmlDeviceGetMemoryBusWidth(handle)))
    except Exception:  # no NVML, or a driver without these queries: the caller falls back to a shipped class
        return 0.0, 0.0, 0


def _cuda_hardware() -> tuple[HardwareProfile, str]:
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    name = str(props.name)
    shipped = named_gpu(name)
    if shipped is not None:
        return load_hardware(shipped), f"{name} -> hardware {shipped!r}"
    clock, memory_clock, bus = _clocks(props, index)
    if not (clock and memory_clock and bus):
        # Without clocks the peak cannot be estimated: the closest shipped class by capability, as a prior.
        fallback = "h100" if props.major >= 9 else "a100"
        return load_hardware(fallback), f"{name} (no clocks reported) -> hardware {fallback!r}"
    profile = roofline_from_properties(name, props.major, props.minor, props.multi_processor_count, clock,
                                       memory_clock, bus)
    return profile, (f"{name} -> a roofline from its properties ({profile.bf16_tflops:.0f} TFLOPS bf16, "
                     f"{profile.memory_bandwidth_tbs:.2f} TB/s)")


def prior_for_device(device: str | None) -> tuple[Literal["hardware", "profile"], Any, str]:
    """("hardware", HardwareProfile, how) for a CUDA device, ("profile", shipped profile name, how) for anything
    else. device: the engine's device type ("cuda", "cpu", ...); None: CUDA where torch has it initialised."""
    if device is None:
        import sys

        torch = sys.modules.get("torch")
        device = "cuda" if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"
    if device == "cuda":
        profile, how = _cuda_hardware()
        return "hardware", profile, how
    return "profile", CPU_PRIOR, f"a {device} engine -> the measured CPU profile {CPU_PRIOR!r}"
