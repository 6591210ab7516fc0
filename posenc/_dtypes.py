"""The float dtypes posenc takes (docs/low_precision.md): float32, float64, and
the 16-bit storage types bfloat16 (``ml_dtypes.bfloat16``, when ml_dtypes is
installed: NumPy has no bfloat16 of its own) and float16 (``np.float16``).

A call's float inputs share one dtype; its results (logits, the attention's
out, gradients) come back in it, except the attention's ``lse``, which is
float32 for the 16-bit types.  ``narrow`` rounds float64 values once to a
dtype (the reference's results).
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes
except ImportError:           # float16 still works; bfloat16 arrays cannot exist
    ml_dtypes = None

FLOAT32, FLOAT64, FLOAT16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else None

# The 16-bit storage types available here, and every float dtype.
LOW_PRECISION = tuple(t for t in (BFLOAT16, FLOAT16) if t is not None)
FLOAT_DTYPES = (FLOAT32, FLOAT64) + LOW_PRECISION
# what a user without ml_dtypes reads (check's summary, by_name's error)
BFLOAT16_MISSING = ("needs ml_dtypes, which is not installed: pip install ml_dtypes, "
                    "or pip install \".[bf16]\" in posenc's checkout")
TEXT = "float32, float64, bfloat16 (with ml_dtypes installed) or float16"

# Unit roundoff of each 16-bit type's one rounding (docs/validation.md).
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# The rounding of an operand the kernels compute themselves (the attention's
# probabilities and dS, sums of G feeding a GEMM) to the dtype before a GEMM:
# bfloat16's GEMM on vdpbf16ps rounds them once (docs/validation.md); float16
# has no such GEMM.  Results that pass through one (every gradient, the
# attention's out) get OPERAND_ROUNDOFF x M in their float32 bound.
OPERAND_ROUNDOFF = {"bfloat16": 2.0 ** -8}
# The relative error of the exp a dtype's attention softmax computes, beyond
# float32's: bfloat16's (the P its GEMM rounds) is 2^t, t = x log2(e) -
# shift log2(e) by one FMA, 2^r on r = t - floor(t) in [0, 1) a degree-4
# polynomial within 2.7e-6 of it (csrc/isa/vector_exp.h, posenc_softmax_exp_bf16;
# t's rounding is the float32 subtraction's it replaces).  It enters the
# attention's bounds as a logit error would (lse, out, the gradients).
SOFTMAX_EXP_ERROR = {"bfloat16": 3.0e-6}
FLOAT16_MAX_FINITE = 65504.0
FLOAT16_OVERFLOW = 65520.0          # the smallest magnitude that rounds to +-inf
FLOAT16_SUBNORMAL_ERROR = 2.0 ** -25   # half the spacing of float16 below 2^-14


def by_name(name: str) -> np.dtype:
    """A float dtype from its name; ValueError naming what exists here."""
    for dtype in FLOAT_DTYPES:
        if dtype.name == name:
            return dtype
    if name == "bfloat16":
        raise ValueError(f"bfloat16 {BFLOAT16_MISSING}")
    raise ValueError(f"unknown dtype {name!r}; expected one of "
                     f"{', '.join(t.name for t in FLOAT_DTYPES)}")


def is_low_precision(dtype) -> bool:
    return dtype is not None and np.dtype(dtype).name in UNIT_ROUNDOFF


def operand_roundoff(dtype) -> float:
    """OPERAND_ROUNDOFF of `dtype` (0 for the dtypes computed without one)."""
    return OPERAND_ROUNDOFF.get(np.dtype(dtype).name, 0.0) if dtype is not None else 0.0


def softmax_exp_error(dtype) -> float:
    """SOFTMAX_EXP_ERROR of `dtype` (0 for the dtypes whose softmax is float32's)."""
    return SOFTMAX_EXP_ERROR.get(np.dtype(dtype).name, 0.0) if dtype is not None else 0.0


def lse_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of the attention's lse for inputs of `dtype`."""
    return FLOAT32 if is_low_precision(dtype) else np.dtype(dtype)


def narrow(values, dtype) -> np.ndarray:
    """`values` (float64) as a new C-contiguous array of `dtype`, rounded once to
    nearest even.  ml_dtypes casts float64 to bfloat16 through float32 (two
    roundings: 1 + 2^-8 + 2^-30 becomes 1, not 1 + 2^-7); posenc's C rounds the
    float64 bits to bfloat16's directly (posenc_narrow_bf16, csrc/posenc.h)."""
    dtype = np.dtype(dtype)
    if dtype != BFLOAT16 or BFLOAT16 is None:
        with np.errstate(over="ignore"):          # float16 overflows to +-inf, as IEEE says
            return np.ascontiguousarray(values, dtype=dtype)
    from . import _C    # _dtypes is imported by the binding's own package: _C is built
    return _C.narrow_bf16(values)
