"""`python -m posenc check`: every method x every ISA x dtype against the reference.

Tolerances (also used by the test suite, see docs/validation.md):

* float64: the normwise relative error max|got - ref| / max|ref| must be
  <= 1e-12 (the reference is evaluated in float64 from the same inputs).
* float32: element by element, |got - ref| <= gamma * M, where M is the
  method evaluated on the absolute values of every float input (for these
  sums and products of products, M bounds the sum of the absolute values
  of every rounded term) and gamma = (depth + 8) * eps32, depth being the
  longest sum a value goes through (d + d_p for logits, n + m + d + d_p for
  gradients).  This is the classical bound |fl(sum x) - sum x| <= gamma_depth
  sum |x| with a few rounding steps of slack; it grows with d and the
  magnitudes as the error itself does, so it cannot hide a wrong term.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _C, reference
from ._examples import METHODS, dense_rank, float_inputs, make_inputs, with_inputs
from ._registry import GRAD_FIELDS

F64_RTOL = 1e-12
EPS32 = float(np.finfo(np.float32).eps)


@dataclasses.dataclass
class CheckRow:
    method: str
    isa: str
    dtype: str
    fwd_abs: float
    fwd_rel: float
    bwd_abs: float
    bwd_rel: float
    ok: bool
    note: str = ""


def _abs_inputs(method, args, kwargs):
    floats = float_inputs(method, args, kwargs)
    return with_inputs(method, args, kwargs, {k: np.abs(v) for k, v in floats.items()})


def _as64(method, args, kwargs):
    floats = float_inputs(method, args, kwargs)
    return with_inputs(method, args, kwargs, {k: v.astype(np.float64) for k, v in floats.items()})


def compare(got: np.ndarray, ref: np.ndarray, magnitude: np.ndarray | None, depth: int,
            dtype) -> tuple[float, float, bool]:
    """(max abs error, error measure, within tolerance) for one array.

    The measure is normwise relative for float64 and the largest ratio of
    the error to its float32 bound for float32 (<= 1 passes).
    """
    if got.shape != ref.shape:
        return float("inf"), float("inf"), False
    if got.size == 0:
        return 0.0, 0.0, True
    diff = np.abs(got.astype(np.float64) - ref)
    abs_err = float(diff.max())
    if np.dtype(dtype) == np.float64:
        scale = float(np.abs(ref).max())
        rel = abs_err / scale if scale > 0 else abs_err
        return abs_err, rel, rel <= F64_RTOL
    bound = (depth + 8) * EPS32 * magnitude + np.finfo(np.float32).tiny
    ratio = float((diff / bound).max())
    return abs_err, ratio, ratio <= 1.0


def check_one(method: str, dtype, *, B=2, H=3, n=33, m=17, d=16, shared=False, seed=0):
    """Forward and backward of the active ISA against the reference, for one configuration."""
    import posenc

    rng = np.random.default_rng(seed)
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=dtype, rng=rng, shared=shared)
    G = rng.standard_normal((B, H, n, m)).astype(dtype)
    args64, kwargs64 = _as64(method, args, kwargs)
    G64 = G.astype(np.float64)
    d_p = dense_rank(method, args, kwargs)

    got = getattr(posenc, method)(*args, **kwargs)
    ref = reference.__dict__[method](*args64, **kwargs64)
    abs_args, abs_kwargs = _abs_inputs(method, args64, kwargs64)
    magnitude = reference.__dict__[method](*abs_args, **abs_kwargs)
    fwd_abs, fwd_rel, fwd_ok = compare(got, ref, magnitude, d + d_p, dtype)

    grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
    ref_grads = reference.__dict__[method + "_backward"](G64, *args64, **kwargs64)
    mag_grads = reference.__dict__[method + "_backward"](np.abs(G64), *abs_args, **abs_kwargs)
    bwd_abs = bwd_rel = 0.0
    bwd_ok = True
    for field in GRAD_FIELDS[method]:
        g, r, mg = getattr(grads, field), getattr(ref_grads, field), getattr(mag_grads, field)
        if (g is None) != (r is None):
            return fwd_abs, fwd_rel, float("inf"), float("inf"), False, f"{field} missing"
        if g is None:
            continue
        if g.dtype != np.dtype(dtype):
            return fwd_abs, fwd_rel, float("inf"), float("inf"), False, f"{field} dtype {g.dtype}"
        a, rel, ok = compare(g, r, mg, n + m + d + d_p, dtype)
        bwd_abs, bwd_rel, bwd_ok = max(bwd_abs, a), max(bwd_rel, rel), bwd_ok and ok
    ok = fwd_ok and bwd_ok and got.dtype == np.dtype(dtype)
    return fwd_abs, fwd_rel, bwd_abs, bwd_rel, ok, ""


def run_check(methods=METHODS, isas=None, dtypes=("float32", "float64"), progress=None,
              **shape) -> list:
    """A CheckRow per method x ISA x dtype; `progress(row)` after each, when given."""
    isas = list(isas) if isas else list(_C.capabilities())
    previous = _C.get_isa()
    rows = []
    try:
        for method in methods:
            for isa in isas:
                _C.set_isa(isa)
                for dtype in dtypes:
                    result = check_one(method, np.dtype(dtype), **shape)
                    rows.append(CheckRow(method, isa, dtype, *result))
                    if progress is not None:
                        progress(rows[-1])
    finally:
        _C.set_isa(previous)
    return rows


def format_table(rows) -> str:
    header = ("method", "isa", "dtype", "fwd max abs", "fwd err", "bwd max abs", "bwd err", "result")
    lines = [header]
    for r in rows:
        lines.append((r.method, r.isa, r.dtype, f"{r.fwd_abs:.2e}", f"{r.fwd_rel:.2e}",
                      f"{r.bwd_abs:.2e}", f"{r.bwd_rel:.2e}",
                      ("PASS" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")))
    widths = [max(len(str(line[c])) for line in lines) for c in range(len(header))]
    out = []
    for t, line in enumerate(lines):
        out.append("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())
        if t == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
