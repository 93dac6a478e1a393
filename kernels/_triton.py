"""What both kernels share: the optional Triton import, the interpreter switch, and an fp32-accumulating dot."""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # torch-only installs: the kernels' torch references still work
    triton = tl = None

# Kernels are decorated when their module is imported, so that is when the interpreter is chosen.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def jit(fn=None, **options):
    """`triton.jit`, or None without Triton (the module still imports; dispatch takes the reference)."""
    if fn is None:
        return lambda f: jit(f, **options)
    if triton is None:
        return None
    return triton.jit(fn, **options)


@jit
def dot(a, b, DOT_PRECISION: tl.constexpr):
    """a @ b with fp32 accumulation. Under the interpreter the operands go in as fp32 (exact products of the
    fp16/bf16 values, the same result): its dot multiplies bf16 operands as raw bits."""
    if DOT_PRECISION == "interpret":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PRECISION)
