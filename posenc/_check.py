"""`python -m posenc check`: every method x every ISA x dtype, the logits and the
fused attention, against the reference.

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

The fused attention (float32) propagates that bound: with e_i the largest
logit bound of row i, P the probabilities and D the dropout scale,
|d out_i| <= (2 e_i + (m + 8) eps32) sum_j P_ij D_ij |v_j| (a softmax turns an
absolute logit error e into a relative probability error <= 2e); lse gets
e_i + (m + 8) eps32.  The gradients: dS = P (D dP - delta) carries the
error E = P (D |dO| |v|^T + |delta|) (2 e + (dv + 8) eps32), which the
logits' backward carries on linearly, so the bound of a gradient is the
logits' backward on |inputs| applied to (depth + 8) eps32 |dS| + E; dv's is
(2 e + (m + 8) eps32) (P D)^T |dO|.  float64 is normwise 1e-12 throughout.

bfloat16 and float16 (docs/low_precision.md): the engine computes in float32
and rounds each result once, so with u = 2^-8 (bfloat16) or 2^-11 (float16)
and E32 the float32 bound above, |got - ref| <= u |ref| + (1 + u) E32, plus
2^-25 for float16 (its subnormals' absolute rounding error); a float16 result
may be +-inf where |ref| + E32 reaches 65520 (where float16 overflows).
lse stays float32, with its float32 bound.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _C, _checks, _dtypes, reference
from ._examples import METHODS, dense_rank, float_inputs, key_count, make_inputs, with_inputs
from ._registry import GRAD_FIELDS, REGISTRY

F64_RTOL = 1e-12
EPS32 = float(np.finfo(np.float32).eps)


@dataclasses.dataclass
class CheckRow:
    method: str
    op: str             # "logits" or "attention"
    isa: str
    dtype: str
    fwd_abs: float
    fwd_rel: float
    bwd_abs: float
    bwd_rel: float
    ok: bool
    note: str = ""


def _abs_inputs(method, args, kwargs, **options):
    """(args, kwargs, problem): the inputs whose logits are M, the sum of the absolute
    values of every term -- each float input's absolute value, then as each term
    says how magnitudes pass through it (posenc._kinds.Term.magnitudes: ALiBi's
    slopes negated, RoPE's q and k rotated in absolute values) -- and the checked
    call (None without terms); `options` the call's other keywords."""
    floats = float_inputs(method, args, kwargs)
    values = {name: np.abs(value) for name, value in floats.items()}
    problem = None
    if method in REGISTRY and REGISTRY[method].terms:
        problem = _checks.CHECKERS[method](*args, **kwargs, **options)
        for term in REGISTRY[method].terms:
            term.magnitudes(problem, values)
    return (*with_inputs(method, args, kwargs, values), problem)


def logit_operands_rounded(method) -> bool:
    """Whether the logits' GEMM reads operands the kernels compute themselves (RoPE's
    rotated q and k), which a 16-bit GEMM rounds once (the bound's operand rounding
    then applies to the logits too, as it does to every gradient)."""
    return method in REGISTRY and any(term.computes_operands for term in REGISTRY[method].terms)


def magnitude(method, args64, kwargs64, **options) -> np.ndarray:
    """M (B, H, n, m): the logits on the inputs' magnitudes (_abs_inputs), `options`
    the logits' keywords (query_offset)."""
    abs_args, abs_kwargs, _ = _abs_inputs(method, args64, kwargs64, **options)
    return np.abs(reference.__dict__[method](*abs_args, **abs_kwargs, **options))


def grad_magnitudes(method, weights, args64, kwargs64, **options) -> dict:
    """Each gradient field's magnitude (None where absent): the backward of the
    non-negative `weights` (|G|, or a bound on |dS|) on the inputs' magnitudes,
    as non-negative arrays (a parameter's derivative may be negative however
    the inputs are signed: ALiBi's -|j - i|)."""
    abs_args, abs_kwargs, problem = _abs_inputs(method, args64, kwargs64, **options)
    grads = reference.__dict__[method + "_backward"](weights, *abs_args, **abs_kwargs, **options)
    grads = {name: None if value is None else np.abs(value)
             for name, value in grads._asdict().items()}
    for term in REGISTRY[method].terms if problem is not None else ():
        term.grad_magnitudes(problem, grads, weights)
    return grads


def _as64(method, args, kwargs):
    floats = float_inputs(method, args, kwargs)
    return with_inputs(method, args, kwargs, {k: v.astype(np.float64) for k, v in floats.items()})


def magnitude_coefficient(depth: int, dtype, rounded_operands: bool) -> float:
    """The float32 bound's factor on M: (depth + 8) eps32, plus, for a result that
    passes through GEMMs of the kernels' own operands (`rounded_operands`: the
    gradients, the attention's out), the dtype's operand rounding."""
    extra = _dtypes.operand_roundoff(dtype) if rounded_operands else 0.0
    return (depth + 8) * EPS32 + extra


def compare(got: np.ndarray, ref: np.ndarray, magnitude: np.ndarray | None, depth: int,
            dtype, *, rounded_operands: bool = False) -> tuple[float, float, bool]:
    """(max abs error, error measure, within tolerance) for one array.

    The measure is normwise relative for float64 and the largest ratio of
    the error to its element-wise bound (`bound`) otherwise (<= 1 passes);
    `rounded_operands` as in magnitude_coefficient (True for gradients).
    """
    if got.shape != ref.shape:
        return float("inf"), float("inf"), False
    if got.size == 0:
        return 0.0, 0.0, True
    got = got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got - ref)
    if np.dtype(dtype) == np.float64:
        abs_err = float(diff.max())
        scale = float(np.abs(ref).max())
        rel = abs_err / scale if scale > 0 else abs_err
        return abs_err, rel, rel <= F64_RTOL
    bound32 = magnitude_coefficient(depth, dtype, rounded_operands) * magnitude
    tolerance = bound(ref, bound32, dtype)
    diff = np.where(overflow_allowed(got, ref, bound32, dtype), 0.0, diff)
    ratio = float((diff / tolerance).max())
    return float(diff.max()), ratio, ratio <= 1.0


def bound(ref: np.ndarray, bound32: np.ndarray, dtype) -> np.ndarray:
    """The element-wise bound of a result of `dtype` whose float32 computation is
    within `bound32` of `ref`: bound32 itself for float32; for bfloat16 and
    float16, one more rounding: u |ref| + (1 + u) bound32 (+ 2^-25 for float16's
    subnormals).  float32's smallest normal is added so an exact 0 passes."""
    name = np.dtype(dtype).name
    tiny = np.finfo(np.float32).tiny
    if name not in _dtypes.UNIT_ROUNDOFF:
        return bound32 + tiny
    u = _dtypes.UNIT_ROUNDOFF[name]
    extra = _dtypes.FLOAT16_SUBNORMAL_ERROR if name == "float16" else 0.0
    return u * np.abs(ref) + (1 + u) * bound32 + extra + tiny


def overflow_allowed(got: np.ndarray, ref: np.ndarray, bound32: np.ndarray, dtype) -> np.ndarray:
    """float16 entries that are +-inf (the sign of ref) where |ref| is within the
    float32 bound `bound32` of 65520, where float16 overflows: the float32 result
    may be on either side of it, so both are right."""
    if np.dtype(dtype).name != "float16":
        return np.zeros(got.shape, dtype=bool)
    return (np.isinf(got) & (np.sign(got) == np.sign(ref)) &
            (np.abs(ref) + bound32 >= _dtypes.FLOAT16_OVERFLOW))


# Forms of a method the check runs beside the methods: name -> (method, make_inputs options)
FORMS = {"rope/token": ("rope", dict(rope_per_token=True))}     # per-token tables (spec §3.16)
CASES = METHODS + tuple(FORMS)


def _case(name: str) -> tuple:
    """(method, make_inputs options) of a method or a form."""
    return FORMS.get(name, (name, {}))


def check_one(method: str, dtype, *, B=2, H=3, n=33, m=17, d=16, shared=False, seed=0):
    """Forward and backward of the active ISA against the reference, for one configuration
    (`method`: a method, or a form of FORMS)."""
    import posenc

    method, form = _case(method)
    rng = np.random.default_rng(seed)
    m = key_count(method, n, m)         # fox: every query among the keys
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=dtype, rng=rng, shared=shared, **form)
    G = rng.standard_normal((B, H, n, m)).astype(dtype)
    args64, kwargs64 = _as64(method, args, kwargs)
    G64 = G.astype(np.float64)
    d_p = dense_rank(method, args, kwargs)

    got = getattr(posenc, method)(*args, **kwargs)
    ref = reference.__dict__[method](*args64, **kwargs64)
    fwd_abs, fwd_rel, fwd_ok = compare(got, ref, magnitude(method, args64, kwargs64), d + d_p,
                                       dtype, rounded_operands=logit_operands_rounded(method))

    grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
    ref_grads = reference.__dict__[method + "_backward"](G64, *args64, **kwargs64)
    mag_grads = grad_magnitudes(method, np.abs(G64), args64, kwargs64)
    bwd_abs = bwd_rel = 0.0
    bwd_ok = True
    for field in GRAD_FIELDS[method]:
        g, r, mg = getattr(grads, field), getattr(ref_grads, field), mag_grads[field]
        if (g is None) != (r is None):
            return fwd_abs, fwd_rel, float("inf"), float("inf"), False, f"{field} missing"
        if g is None:
            continue
        if g.dtype != np.dtype(dtype):
            return fwd_abs, fwd_rel, float("inf"), float("inf"), False, f"{field} dtype {g.dtype}"
        a, rel, ok = compare(g, r, mg, n + m + d + d_p, dtype, rounded_operands=True)
        bwd_abs, bwd_rel, bwd_ok = max(bwd_abs, a), max(bwd_rel, rel), bwd_ok and ok
    ok = fwd_ok and bwd_ok and got.dtype == np.dtype(dtype)
    return fwd_abs, fwd_rel, bwd_abs, bwd_rel, ok, ""


# the attention's keywords in the check (SPEC §6, §7), beside the padding, documents and
# sinks of _attention_inputs
ATTENTION_OPTIONS = dict(causal=True, query_offset=3, dropout_p=0.1, seed=5, window=(12, None),
                         softcap=8.0)


def _attention_inputs(method, dtype, rng, B, H, n, m, d, shared, form=None):
    """(args, kwargs, v, options): one key/value head for the H query heads
    (multi-query), dv != d, ATTENTION_OPTIONS with key padding (a fully masked batch
    row), two documents (keys from m // 2 on, and the queries at those positions) and
    a sink per head."""
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=dtype, rng=rng, shared=shared,
                               kv_heads=1, **(form or {}))
    v = rng.standard_normal((B, 1, m, d + 3)).astype(dtype)        # dv != d
    mask = np.zeros((B, m), dtype=bool)
    mask[-1, m // 2:] = True                                        # padding
    mask[0, :] = B > 1                                              # a fully masked batch row
    positions = np.arange(n) + ATTENTION_OPTIONS["query_offset"]
    documents = dict(document_q=np.broadcast_to(positions >= m // 2, (B, n)).astype(np.int64),
                     document_k=np.broadcast_to(np.arange(m) >= m // 2, (B, m)).astype(np.int64))
    return args, kwargs, v, dict(ATTENTION_OPTIONS, key_padding_mask=mask, **documents,
                                 sinks=rng.standard_normal(H).astype(dtype))


def attention_bounds(method, args64, kwargs64, v64, options: dict, d_out64=None, dtype=None):
    """(reference Attention, out bound, lse bound, {field: gradient bound} or None):
    the float32 bounds of the module's docstring, for the attention keywords
    `options` (SPEC §6, §7: causal, key_padding_mask, window, documents, softcap, sinks,
    query_offset, dropout_p, seed), with the operand rounding of `dtype`
    (_dtypes.OPERAND_ROUNDOFF: P before P.v and dV, dS before every gradient's GEMM)
    and the error of its softmax's exp (_dtypes.SOFTMAX_EXP_ERROR) where it has them.
    A softcap passes the logits' error on at most (|tanh'| <= 1); the sinks' gradient
    is bounded by its probabilities times delta's error."""
    options = dict(dict(query_offset=0, dropout_p=0.0, seed=0), **options)
    m, dv = v64.shape[2], v64.shape[3]
    depth = args64[0].shape[-1] + dense_rank(method, args64, kwargs64)
    qo = options["query_offset"]
    logits, t, masked = reference.ATTENTION_TERMS[method](*args64[:2], v64, *args64[2:],
                                                          **kwargs64, **options)
    masked = np.broadcast_to(masked, logits.shape)
    logit_bound = magnitude_coefficient(depth, dtype, logit_operands_rounded(method)) * \
        magnitude(method, args64, kwargs64, query_offset=qo)
    ref = reference.__dict__[method + "_attention"](*args64[:2], v64, *args64[2:], **kwargs64,
                                                     **options)
    H_kv, v64 = v64.shape[1], reference.per_query_head(v64, logits.shape[1])
    with np.errstate(invalid="ignore", over="ignore"):
        P = np.where(masked | np.isneginf(ref.lse)[..., None], 0.0,
                     np.exp(logits - np.where(np.isneginf(ref.lse), 0.0, ref.lse)[..., None]))
    D = reference.attention_dropout_mask(options["seed"], logits.shape,
                                         options["dropout_p"]) / (1 - options["dropout_p"])
    PD = P * D
    e = np.where(masked, 0.0, logit_bound).max(axis=-1, initial=0.0)       # (B, H, n)
    e = e + _dtypes.softmax_exp_error(dtype)   # the softmax's exp, as a logit error
    r = _dtypes.operand_roundoff(dtype)
    out_bound = (2 * e + (m + 8) * EPS32 + r)[..., None] * np.einsum("bhij,bhjd->bhid", PD,
                                                                     np.abs(v64))
    lse_bound = e + (m + 8) * EPS32 * np.maximum(np.abs(ref.lse), 1.0)
    if d_out64 is None:
        return ref, out_bound, lse_bound, None
    dP = np.einsum("bhid,bhjd->bhij", d_out64, v64)
    delta = np.einsum("bhid,bhid->bhi", d_out64, ref.out)
    d_s = P * (D * dP - delta[..., None])
    error_s = (P * (D * np.einsum("bhid,bhjd->bhij", np.abs(d_out64), np.abs(v64))
                    + np.abs(delta)[..., None]) * (2 * e + (dv + 8) * EPS32)[..., None])
    if t is not None:   # dS (1 - tanh^2): the factor's own error 2 |tanh| e / softcap
        cap = options["softcap"]
        error_s = error_s * (1 - t * t) + np.abs(d_s) * (2 * np.abs(t) * e[..., None] / cap
                                                          + 4 * EPS32)
        d_s = d_s * (1 - t * t)
    grad_bounds = grad_magnitudes(method, ((depth + m + 8) * EPS32 + r) * np.abs(d_s) + error_s,
                                  args64, kwargs64, query_offset=qo)
    v_bound = reference.fold_groups(np.einsum(
        "bhij,bhid->bhjd", (2 * e + (m + 8) * EPS32 + r)[..., None] * PD, np.abs(d_out64)), H_kv)
    bounds = dict(grad_bounds, v=v_bound)
    if options.get("sinks") is not None:   # -sum_i exp(sink - lse_i) delta_i
        with np.errstate(over="ignore", invalid="ignore"):
            p_sink = np.exp(options["sinks"].astype(np.float64)[None, :, None] - ref.lse)
        delta_error = (np.einsum("bhid,bhid->bhi", np.abs(d_out64), np.abs(ref.out))
                       * (2 * e + (m + dv + 16) * EPS32 + r)
                       + np.einsum("bhid,bhid->bhi", np.abs(d_out64), out_bound))
        bounds["sinks"] = (p_sink * (delta_error + np.abs(delta) * (2 * e + 8 * EPS32))).sum(
            axis=(0, 2))
    return ref, out_bound, lse_bound, bounds


def within(got, ref, bound32, dtype):
    """(max abs error, error measure, ok): normwise for float64, ratio to the
    float32 bound `bound32` (also given in a float64 call) for float32, to
    `bound(ref, bound32, dtype)` for bfloat16 and float16;
    -inf where the reference has -inf (lse of a fully masked row) must match exactly."""
    if got.shape != ref.shape:
        return float("inf"), float("inf"), False
    got = got.astype(np.float64)
    infinite = np.isinf(ref)
    if not np.array_equal(np.isinf(got), infinite) or np.isnan(got).any():
        return float("inf"), float("inf"), False
    got, ref = np.where(infinite, 0.0, got), np.where(infinite, 0.0, ref)
    if got.size == 0:
        return 0.0, 0.0, True
    diff = np.abs(got.astype(np.float64) - ref)
    if np.dtype(dtype) == np.float64:
        # normwise, against the larger of the result and its terms' magnitude (the
        # bound / eps32): a gradient that cancels to ~0 by structure -- a softmax row's
        # dS sums to zero, so a table row every key of a row reads gets ~0 -- is not
        # measured against its own rounding noise
        scale = max(float(np.abs(ref).max()), float(np.max(bound32)) / EPS32)
        rel = float(diff.max()) / scale if scale > 0 else float(diff.max())
        return float(diff.max()), rel, rel <= F64_RTOL
    ratio = float((diff / bound(ref, bound32, dtype)).max())
    return float(diff.max()), ratio, ratio <= 1.0


def check_attention_one(method: str, dtype, *, B=2, H=3, n=33, m=17, d=16, shared=False, seed=0):
    """The fused attention (causal, padding with a fully masked row, dropout,
    query_offset, dv != d; multi-query, a window, two documents, a softcap and sinks)
    of the active ISA against the reference."""
    import posenc

    method, form = _case(method)
    rng = np.random.default_rng(seed)
    m = key_count(method, n, m, ATTENTION_OPTIONS["query_offset"])
    args, kwargs, v, options = _attention_inputs(method, dtype, rng, B, H, n, m, d, shared, form)
    d_out = rng.standard_normal((B, H, n, v.shape[-1])).astype(dtype)
    args64, kwargs64 = _as64(method, args, kwargs)
    v64, d_out64 = v.astype(np.float64), d_out.astype(np.float64)
    options64 = dict(options, sinks=options["sinks"].astype(np.float64))
    ref, out_bound, lse_bound, grad_bounds = attention_bounds(method, args64, kwargs64, v64,
                                                              options64, d_out64, dtype)
    got = getattr(posenc, method + "_attention")(*args[:2], v, *args[2:], **kwargs, **options)
    out_abs, out_rel, out_ok = within(got.out, ref.out, out_bound, dtype)
    _, lse_rel, lse_ok = within(got.lse, ref.lse, lse_bound, _dtypes.lse_dtype(dtype))
    grads = getattr(posenc, method + "_attention_backward")(
        d_out, *args[:2], v, *args[2:], got.out, got.lse, **kwargs, **options)
    # 16-bit: out was rounded to q's dtype (an error of u |out|, far above the float32
    # bound's), and the backward is a function of the out and lse it is given
    saved = (got.out.astype(np.float64), got.lse.astype(np.float64)) \
        if _dtypes.is_low_precision(dtype) else (ref.out, ref.lse)
    ref_grads = reference.__dict__[method + "_attention_backward"](
        d_out64, *args64[:2], v64, *args64[2:], *saved, **kwargs64, **options64)
    bwd_abs = bwd_rel = 0.0
    bwd_ok = True
    for field in ref_grads._fields:
        g, r = getattr(grads, field), getattr(ref_grads, field)
        if (g is None) != (r is None):
            return out_abs, out_rel, float("inf"), float("inf"), False, f"{field} missing"
        if g is None:
            continue
        a, rel, ok = within(g, r, grad_bounds[field], dtype)
        bwd_abs, bwd_rel, bwd_ok = max(bwd_abs, a), max(bwd_rel, rel), bwd_ok and ok
    ok = (out_ok and lse_ok and bwd_ok and got.out.dtype == np.dtype(dtype) and
          got.lse.dtype == _dtypes.lse_dtype(dtype))
    return out_abs, max(out_rel, lse_rel), bwd_abs, bwd_rel, ok, ""


OPS = ("logits", "attention")


DTYPES = tuple(dtype.name for dtype in _dtypes.FLOAT_DTYPES)   # bfloat16 with ml_dtypes


def run_check(methods=CASES, isas=None, dtypes=DTYPES, progress=None, ops=OPS,
              **shape) -> list:
    """A CheckRow per method x op x ISA x dtype; `progress(row)` after each, when given."""
    isas = list(isas) if isas else list(_C.capabilities())
    previous = _C.get_isa()
    rows = []
    try:
        for method in methods:
            for op in ops:
                one = check_one if op == "logits" else check_attention_one
                for isa in isas:
                    _C.set_isa(isa)
                    for dtype in dtypes:
                        result = one(method, _dtypes.by_name(dtype), **shape)
                        rows.append(CheckRow(method, op, isa, dtype, *result))
                    if progress is not None:
                        progress(rows[-1])
    finally:
        _C.set_isa(previous)
    return rows


HEADER = ("method", "op", "isa", "dtype", "fwd max abs", "fwd err", "bwd max abs", "bwd err",
          "result")


def table_rows(rows) -> list:
    """The rows as the table's cells (text and HTML show the same)."""
    return [(r.method, r.op, r.isa, r.dtype, f"{r.fwd_abs:.2e}", f"{r.fwd_rel:.2e}",
             f"{r.bwd_abs:.2e}", f"{r.bwd_rel:.2e}",
             ("PASS" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")) for r in rows]


def format_table(rows) -> str:
    header = HEADER
    lines = [header] + table_rows(rows)
    widths = [max(len(str(line[c])) for line in lines) for c in range(len(header))]
    out = []
    for t, line in enumerate(lines):
        out.append("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())
        if t == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
