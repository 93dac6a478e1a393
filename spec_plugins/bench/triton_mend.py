"""A local mend of Triton 3.9's interpreter (TRITON_INTERPRET=1), so vLLM 0.34's Triton kernels run on CPU tensors.

The interpreter builds a comparison through its generic `binary_op`, which tags the result with the *operands'*
element type and casts numpy's bool result back to it (int32 / int64). A mask made of comparisons is then an
integer array, and `tl.load(..., mask=...)` fails with "mask has unsupported dtype". Here every integer and float
comparison returns what Triton's compiled backends return: an int1 (bool) tensor. Nothing else changes.
"""

from __future__ import annotations

import numpy as np

_COMPARISONS = {
    "icmpSLE": np.less_equal, "icmpSLT": np.less, "icmpSGE": np.greater_equal, "icmpSGT": np.greater,
    "icmpULE": np.less_equal, "icmpULT": np.less, "icmpUGE": np.greater_equal, "icmpUGT": np.greater,
    "icmpEQ": np.equal, "icmpNE": np.not_equal,
    "fcmpOLT": np.less, "fcmpOGT": np.greater, "fcmpOLE": np.less_equal, "fcmpOGE": np.greater_equal,
    "fcmpOEQ": np.equal, "fcmpONE": np.not_equal, "fcmpULT": np.less, "fcmpUGT": np.greater,
    "fcmpULE": np.less_equal, "fcmpUGE": np.greater_equal, "fcmpUEQ": np.equal, "fcmpUNE": np.not_equal,
}


def mend() -> bool:
    """Install the mend once; True when the interpreter's builder is there to mend."""
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    except ImportError:
        return False
    if getattr(InterpreterBuilder, "_spec_plugins_mended", False):
        return True

    def comparison(op):
        return lambda self, lhs, rhs: TensorHandle(op(lhs.data, rhs.data), tl.int1)

    for name, op in _COMPARISONS.items():
        setattr(InterpreterBuilder, f"create_{name}", comparison(op))
    InterpreterBuilder._spec_plugins_mended = True
    return True
