"""Argument validation shared by every namespace (SPEC §1 and §5).

`posenc.<name>`, `posenc.reference.<name>` and `posenc.torch.<name>` all call
the same checker, so the three raise the same exception for the same bad
input.  A checker returns a `Problem`: the arrays (dtypes checked, never
copied), the sizes, and the method's parameters with defaults resolved.

Error policy (SPEC §5): `TypeError` for a wrong type or dtype, `ValueError`
for a wrong rank, shape or value.  Every message names the argument and shows
what was expected and what was received.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from . import buckets

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class Problem:
    """A validated call: sizes, dtype, arrays by argument name, parameters."""

    method: str
    dtype: np.dtype
    B: int
    H: int
    n: int
    m: int
    d: int
    arrays: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    out: np.ndarray | None = None


def _shape_str(shape) -> str:
    return str(tuple(int(s) for s in shape))


def require_ndarray(name: str, value) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy.ndarray, got {type(value).__module__}."
            f"{type(value).__qualname__}"
        )
    return value


def check_floats(named: dict) -> np.dtype:
    """Every given float argument is float32 or float64, all the same dtype."""
    dtype = None
    first = None
    for name, value in named.items():
        if value is None:
            continue
        require_ndarray(name, value)
        if value.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must have dtype float32 or float64, got {value.dtype}"
            )
        if dtype is None:
            dtype, first = value.dtype, name
        elif value.dtype != dtype:
            raise TypeError(
                f"{name} has dtype {value.dtype} but {first} has dtype {dtype}: "
                "float inputs of one call must share one dtype"
            )
    return dtype


def check_rank(name: str, value: np.ndarray, rank: int, layout: str) -> None:
    if value.ndim != rank:
        raise ValueError(
            f"{name} must have {rank} dimensions {layout}, got shape "
            f"{_shape_str(value.shape)} ({value.ndim} dimensions)"
        )


def check_shape(name: str, value: np.ndarray, expected: tuple, layout: str) -> None:
    """expected: a tuple of ints or None (free); a tuple entry may be a set of allowed ints."""
    check_rank(name, value, len(expected), layout)
    for got, want in zip(value.shape, expected):
        if want is None:
            continue
        if isinstance(want, (set, frozenset)):
            ok = got in want
        else:
            ok = got == want
        if not ok:
            shown = []
            for w in expected:
                if w is None:
                    shown.append("*")
                elif isinstance(w, (set, frozenset)):
                    shown.append("|".join(str(x) for x in sorted(w)))
                else:
                    shown.append(str(w))
            raise ValueError(
                f"{name} must have shape ({', '.join(shown)}) {layout}, got "
                f"{_shape_str(value.shape)}"
            )


def check_int(name: str, value, minimum: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_scale(value, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(value).__name__} {value!r}")
    return float(value)


def _heads(H: int) -> set:
    return {H, 1}


def check_qk(q, k, *, rank_name="q") -> tuple:
    require_ndarray("q", q)
    require_ndarray("k", k)
    check_rank("q", q, 4, "(B, H, n, d)")
    check_rank("k", k, 4, "(B, H, m, d)")
    B, H, n, d = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError(
            f"k must have shape ({B}, {H}, m, {d}) (B, H, m, d) to match q of shape "
            f"{_shape_str(q.shape)}, got {_shape_str(k.shape)}"
        )
    return B, H, n, k.shape[2], d


def check_segments(segment_q, segment_k, segment_table, B, H, n, m) -> dict:
    given = [x is not None for x in (segment_q, segment_k, segment_table)]
    if not any(given):
        return {}
    if not all(given):
        missing = [nm for nm, g in zip(("segment_q", "segment_k", "segment_table"), given) if not g]
        raise ValueError(
            "segments come as all three of segment_q, segment_k, segment_table "
            f"or none of them; missing {', '.join(missing)}"
        )
    for name, value in (("segment_q", segment_q), ("segment_k", segment_k)):
        require_ndarray(name, value)
        if value.dtype.kind not in "iu":
            raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    check_shape("segment_q", segment_q, (B, n), "(B, n)")
    check_shape("segment_k", segment_k, (B, m), "(B, m)")
    check_rank("segment_table", segment_table, 3, "(H|1, S, S)")
    S = segment_table.shape[1]
    check_shape("segment_table", segment_table, (_heads(H), S, S), "(H|1, S, S)")
    for name, value in (("segment_q", segment_q), ("segment_k", segment_k)):
        if value.size:
            lo, hi = int(value.min()), int(value.max())
            if lo < 0 or hi >= S:
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"{name} holds segment id {bad}, outside [0, {S}) for "
                    f"segment_table of shape {_shape_str(segment_table.shape)}"
                )
    return {"segment_q": segment_q, "segment_k": segment_k, "segment_table": segment_table}


def check_out(out, problem: Problem) -> None:
    if out is None:
        return
    require_ndarray("out", out)
    if out.dtype != problem.dtype:
        raise TypeError(f"out must have dtype {problem.dtype}, got {out.dtype}")
    expected = (problem.B, problem.H, problem.n, problem.m)
    if out.shape != expected:
        raise ValueError(
            f"out must have shape {_shape_str(expected)} (B, H, n, m), got {_shape_str(out.shape)}"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous, got a non-contiguous array")
    if not out.flags.writeable:
        raise ValueError("out must be writeable, got a read-only array")
    for name, value in problem.arrays.items():
        if isinstance(value, np.ndarray) and np.may_share_memory(out, value):
            if np.shares_memory(out, value, max_work=10**6):
                raise ValueError(f"out must not overlap an input, but it overlaps {name}")
    problem.out = out


def check_grad(G, problem: Problem) -> np.ndarray:
    require_ndarray("G", G)
    if G.dtype not in FLOAT_DTYPES:
        raise TypeError(f"G must have dtype float32 or float64, got {G.dtype}")
    if G.dtype != problem.dtype:
        raise TypeError(
            f"G has dtype {G.dtype} but q has dtype {problem.dtype}: float inputs "
            "of one call must share one dtype"
        )
    expected = (problem.B, problem.H, problem.n, problem.m)
    check_shape("G", G, expected, "(B, H, n, m)")
    return G


def _begin(method, q, k, floats: dict) -> Problem:
    require_ndarray("q", q)
    require_ndarray("k", k)
    dtype = check_floats({"q": q, "k": k, **floats})
    B, H, n, m, d = check_qk(q, k)
    return Problem(method, dtype, B, H, n, m, d, arrays={"q": q, "k": k})


# ---------------------------------------------------------------- the methods

def content(q, k, *, scale=None, out=None):
    p = _begin("content", q, k, {})
    p.params["scale"] = check_scale(scale, 1.0 / math.sqrt(p.d) if p.d else 1.0)
    check_out(out, p)
    return p


def _vector_table(p: Problem, name: str, table, rows: int) -> None:
    check_shape(name, table, (_heads(p.H), rows, p.d), f"(H|1, {rows}, d)")
    p.arrays[name] = table


def _scalar_table(p: Problem, name: str, table, rows: int) -> None:
    check_shape(name, table, (_heads(p.H), rows), f"(H|1, {rows})")
    p.arrays[name] = table


def _clipped_method(method, q, k, table, *, max_distance, scale, out, vector):
    name = "rel_k" if vector else "rel"
    p = _begin(method, q, k, {name: table})
    t = check_int("max_distance", max_distance)
    buckets.check_clipped(t)
    p.params["max_distance"] = t
    p.params["scale"] = check_scale(scale, 1.0 / math.sqrt(p.d) if p.d else 1.0)
    if vector:
        _vector_table(p, name, table, 2 * t + 1)
    else:
        _scalar_table(p, name, table, 2 * t + 1)
    check_out(out, p)
    return p


def shaw(q, k, rel_k, *, max_distance, scale=None, out=None):
    return _clipped_method("shaw", q, k, rel_k, max_distance=max_distance, scale=scale,
                           out=out, vector=True)


def m2(q, k, rel, *, max_distance, scale=None, out=None):
    return _clipped_method("m2", q, k, rel, max_distance=max_distance, scale=scale,
                           out=out, vector=False)


def m4(q, k, rel_k, *, max_distance, scale=None, out=None):
    return _clipped_method("m4", q, k, rel_k, max_distance=max_distance, scale=scale,
                           out=out, vector=True)


def m4m(q, k, rel_k, *, max_distance, scale=None, out=None):
    return _clipped_method("m4m", q, k, rel_k, max_distance=max_distance, scale=scale,
                           out=out, vector=True)


def _t5_params(p: Problem, num_buckets, max_distance, bidirectional) -> None:
    nb = check_int("num_buckets", num_buckets)
    md = check_int("max_distance", max_distance)
    bd = check_bool("bidirectional", bidirectional)
    buckets.check_t5(nb, md, bd)
    p.params.update(num_buckets=nb, max_distance=md, bidirectional=bd)


def t5(q, k, bias, *, num_buckets=32, max_distance=128, bidirectional=True, scale=1.0, out=None):
    p = _begin("t5", q, k, {"bias": bias})
    _t5_params(p, num_buckets, max_distance, bidirectional)
    p.params["scale"] = check_scale(scale, 1.0)
    _scalar_table(p, "bias", bias, p.params["num_buckets"])
    check_out(out, p)
    return p


def deberta(q, k, pos_key, pos_query, *, att_span, position_buckets=-1,
            max_relative_positions=-1, scale=None, out=None):
    p = _begin("deberta", q, k, {"pos_key": pos_key, "pos_query": pos_query})
    span = check_int("att_span", att_span, minimum=1)
    pb = check_int("position_buckets", position_buckets)
    mrp = check_int("max_relative_positions", max_relative_positions)
    if pb > 0 and mrp > 0:
        buckets.check_deberta_log(pb, mrp)
    p.params.update(att_span=span, position_buckets=pb, max_relative_positions=mrp)
    p.params["scale"] = check_scale(scale, 1.0 / math.sqrt(3 * p.d) if p.d else 1.0)
    _vector_table(p, "pos_key", pos_key, 2 * span)
    _vector_table(p, "pos_query", pos_query, 2 * span)
    check_out(out, p)
    return p


def _dense(p: Problem, pos_q, pos_k) -> None:
    check_rank("pos_q", pos_q, 3, "(H|1, n, d_p)")
    check_rank("pos_k", pos_k, 3, "(H|1, m, d_p)")
    dp = pos_q.shape[2]
    check_shape("pos_q", pos_q, (_heads(p.H), p.n, dp), "(H|1, n, d_p)")
    check_shape("pos_k", pos_k, (_heads(p.H), p.m, dp), "(H|1, m, d_p)")
    p.arrays["pos_q"] = pos_q
    p.arrays["pos_k"] = pos_k
    p.params["d_p"] = dp


def tupe(q, k, pos_q, pos_k, *, bias=None, theta=None, num_buckets=32, max_distance=128,
         bidirectional=True, scale=None, out=None):
    p = _begin("tupe", q, k, {"pos_q": pos_q, "pos_k": pos_k, "bias": bias, "theta": theta})
    _dense(p, pos_q, pos_k)
    p.params["scale"] = check_scale(scale, 1.0 / math.sqrt(2 * p.d) if p.d else 1.0)
    _t5_params(p, num_buckets, max_distance, bidirectional)   # checked even when unused
    if bias is not None:
        _scalar_table(p, "bias", bias, p.params["num_buckets"])
    if theta is not None:
        check_shape("theta", theta, (_heads(p.H), 2), "(H|1, 2)")
        p.arrays["theta"] = theta
    check_out(out, p)
    return p


def _diet_segments(p, segment_q, segment_k, segment_table):
    if segment_table is not None:
        check_floats({"q": p.arrays["q"], "segment_table": segment_table})
    p.arrays.update(check_segments(segment_q, segment_k, segment_table, p.B, p.H, p.n, p.m))


def diet_abs(q, k, pos_q, pos_k, *, segment_q=None, segment_k=None, segment_table=None,
             scale=None, out=None):
    p = _begin("diet_abs", q, k, {"pos_q": pos_q, "pos_k": pos_k})
    _dense(p, pos_q, pos_k)
    _diet_segments(p, segment_q, segment_k, segment_table)
    p.params["scale"] = check_scale(scale, 1.0 / math.sqrt(p.d) if p.d else 1.0)
    check_out(out, p)
    return p


def diet_rel(q, k, rel, *, max_distance, segment_q=None, segment_k=None, segment_table=None,
             scale=None, out=None):
    p = _begin("diet_rel", q, k, {"rel": rel})
    t = check_int("max_distance", max_distance)
    buckets.check_clipped(t)
    p.params["max_distance"] = t
    _scalar_table(p, "rel", rel, 2 * t + 1)
    _diet_segments(p, segment_q, segment_k, segment_table)
    p.params["scale"] = check_scale(scale, 1.0 / math.sqrt(p.d) if p.d else 1.0)
    check_out(out, p)
    return p


CHECKERS = {
    "content": content, "shaw": shaw, "t5": t5, "m2": m2, "m4": m4, "m4m": m4m,
    "deberta": deberta, "tupe": tupe, "diet_abs": diet_abs, "diet_rel": diet_rel,
}
