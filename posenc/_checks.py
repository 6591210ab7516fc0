"""Argument validation shared by every namespace (SPEC §1 and §5).

`posenc.<name>`, `posenc.reference.<name>` and `posenc.torch.<name>` all run
`check` on the method's registry entry, so the three raise the same exception
for the same bad input.  `check` returns a `Problem`: the arrays (dtypes
checked, never copied), the sizes, and the parameters with defaults resolved.

Error policy (SPEC §5): `TypeError` for a wrong type or dtype, `ValueError`
for a wrong rank, shape or value.  Every message names the argument and shows
what was expected and what was received.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from ._dtypes import FLOAT_DTYPES, LOW_PRECISION
from ._dtypes import TEXT as FLOAT_DTYPES_TEXT
from ._registry import INDEX_TENSORS, MAPS, REGISTRY, Dense, Reset, Segments, Table
from ._signatures import define


class Problem:
    """A validated call: sizes, dtype, the given arrays by argument name, and
    the parameters with defaults resolved (`params`, built on first use: the
    engine needs only `scale` and the bucket map's `map_values`)."""

    __slots__ = ("method", "dtype", "B", "H", "n", "m", "d", "arrays", "scale", "query_offset",
                 "map_values", "d_p", "out", "_params")

    def __init__(self, method, dtype, B, H, n, m, d, arrays=None, params=None, out=None):
        self.method, self.dtype = method, dtype
        self.B, self.H, self.n, self.m, self.d = B, H, n, m, d
        self.arrays = {} if arrays is None else arrays
        self._params = params
        self.scale = None
        self.query_offset = 0
        self.map_values = ()      # the bucket map's parameters, checked, in MAPS order
        self.d_p = None           # rank of the dense factor
        self.out = out

    @property
    def params(self) -> dict:
        """Every parameter by name (the map's, "scale", "query_offset", "d_p" with a
    dense factor)."""
        if self._params is None:
            spec = REGISTRY.get(self.method)        # None for the reference's baselines
            names = spec.map_params if spec else ()
            self._params = dict(zip(names, self.map_values), scale=self.scale,
                                query_offset=self.query_offset)
            if self.d_p is not None:
                self._params["d_p"] = self.d_p
        return self._params


def _shape_str(shape) -> str:
    return str(tuple(int(s) for s in shape))


def require_ndarray(name: str, value) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy.ndarray, got {type(value).__module__}."
            f"{type(value).__qualname__}"
        )
    return value


def check_floats(named) -> np.dtype:
    """Every given float argument (a dict, or (name, value) pairs) has one of
    posenc's float dtypes (posenc._dtypes), all the same dtype."""
    dtype = None
    first = None
    for name, value in (named.items() if isinstance(named, dict) else named):
        if value is None:
            continue
        if value.__class__ is not np.ndarray:
            require_ndarray(name, value)
        if value.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must have dtype {FLOAT_DTYPES_TEXT}, got {value.dtype}")
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


def check_qk(q, k) -> tuple:
    if q.ndim != 4:
        check_rank("q", q, 4, "(B, H, n, d)")
    if k.ndim != 4:
        check_rank("k", k, 4, "(B, H, m, d)")
    B, H, n, d = q.shape
    kB, kH, m, kd = k.shape
    if kB != B or kH != H or kd != d:
        raise ValueError(
            f"k must have shape ({B}, {H}, m, {d}) (B, H, m, d) to match q of shape "
            f"{_shape_str(q.shape)}, got {_shape_str(k.shape)}"
        )
    return B, H, n, m, d


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
    """`out=` of the logits: (B, H, n, m) of the problem's dtype, writable (see below)."""
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
    check_writable_out(out, problem.arrays)
    problem.out = out


def check_writable_out(out: np.ndarray, inputs: dict) -> None:
    """C-contiguous, writeable, aligned, and overlapping none of `inputs` (name: array)."""
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous, got a non-contiguous array")
    if not out.flags.writeable:
        raise ValueError("out must be writeable, got a read-only array")
    if not out.flags.aligned:
        raise ValueError(f"out must be aligned to its {out.dtype} items, got a misaligned array "
                         f"(address {out.ctypes.data:#x})")
    for name, value in inputs.items():
        if isinstance(value, np.ndarray) and np.may_share_memory(out, value):
            if np.shares_memory(out, value, max_work=10**6):
                raise ValueError(f"out must not overlap an input, but it overlaps {name}")


def check_grad(G, problem: Problem) -> np.ndarray:
    require_ndarray("G", G)
    if G.dtype not in FLOAT_DTYPES:
        raise TypeError(f"G must have dtype {FLOAT_DTYPES_TEXT}, got {G.dtype}")
    if G.dtype != problem.dtype:
        raise TypeError(
            f"G has dtype {G.dtype} but q has dtype {problem.dtype}: float inputs "
            "of one call must share one dtype"
        )
    expected = (problem.B, problem.H, problem.n, problem.m)
    check_shape("G", G, expected, "(B, H, n, m)")
    return G


def _begin(method, q, k, floats: dict) -> Problem:
    """The checks every (q, k) function starts with (the reference's baselines use it too)."""
    require_ndarray("q", q)
    require_ndarray("k", k)
    dtype = check_floats({"q": q, "k": k, **floats})
    B, H, n, m, d = check_qk(q, k)
    return Problem(method, dtype, B, H, n, m, d, arrays={"q": q, "k": k})


_PARAM_MINIMUM = {"att_span": 1}
_F32, _F64 = FLOAT_DTYPES[:2]


@functools.lru_cache(maxsize=1024)
def _map_rows(kind: str, values: tuple) -> int:
    """Rows of the table a map indexes, once its parameters passed SPEC §2's checks."""
    bucket_map = MAPS[kind]
    named = dict(zip(bucket_map.params, values))
    bucket_map.check(named)
    return bucket_map.rows(named)


def _plan(spec) -> tuple:
    """What `check` walks for `spec`: (name, optional, float) per tensor, the
    exact types of the map's parameters, and the shape check of each distinct
    positional tensor as (kind, term)."""
    tensors = tuple((name, name in spec.optional, name not in INDEX_TENSORS)
                    for name in spec.tensors)
    shapes, seen = [], set()
    for term in spec.terms:
        key = (term.__class__, getattr(term, "name", None))
        if key[1] is None or key[1] not in seen:   # M4/M4M: rel_k checked once
            shapes.append((term.__class__, term))
            seen.add(key[1])
    types = tuple(bool if name == "bidirectional" else int for name in spec.map_params)
    return tensors, types, tuple(shapes)


_PLANS = {name: _plan(spec) for name, spec in REGISTRY.items()}


def check(spec, tensors: tuple, params: tuple, out) -> Problem:
    """Validate one call of method `spec` (a posenc._registry.Method).

    `tensors` and `params` are the call's values in the order of
    spec.tensors and spec.params.  The order of the checks -- types and
    dtypes, then q and k, then parameters, then each term's shapes, then
    out -- is the same for every namespace, so each raises the same error.
    Common values take fast paths (exact ndarray, int, bool and float types,
    native float dtypes); anything else goes through the checks that build
    the error messages.
    """
    plan_tensors, plan_types, plan_shapes = _PLANS[spec.name]
    arrays = {}
    dtype = None
    for (name, optional, is_float), value in zip(plan_tensors, tensors):
        if value is None:
            if not optional:
                raise TypeError(f"{name} is required: a numpy.ndarray, got None")
            continue
        arrays[name] = value
        if is_float:
            if value.__class__ is not np.ndarray:
                require_ndarray(name, value)
            value_dtype = value.dtype
            if dtype is None and (value_dtype is _F64 or value_dtype is _F32 or
                                  value_dtype in LOW_PRECISION):
                dtype = value_dtype
            elif value_dtype is not dtype:
                dtype = False
    if not dtype:      # the slow path names the offending argument
        dtype = check_floats([(name, arrays.get(name)) for name, _, is_float in plan_tensors
                              if is_float])
    q_shape, k_shape = tensors[0].shape, tensors[1].shape
    if len(q_shape) == 4 and len(k_shape) == 4 and q_shape[0] == k_shape[0] and \
            q_shape[1] == k_shape[1] and q_shape[3] == k_shape[3]:
        B, H, n, d = q_shape
        m = k_shape[2]
    else:
        B, H, n, m, d = check_qk(tensors[0], tensors[1])
    # parameters: the map's (in the order of its kind), then the scale and the query offset
    *map_values, scale, query_offset = params
    if tuple(map(type, map_values)) != plan_types:     # NumPy scalars, or an error
        for t, (name, value) in enumerate(zip(spec.map_params, map_values)):
            map_values[t] = (check_bool(name, value) if name == "bidirectional"
                             else check_int(name, value, _PARAM_MINIMUM.get(name)))
    if scale is None:
        scale = spec.default_scale(d)
    elif scale.__class__ is not float:
        scale = check_scale(scale, 0.0)
    if query_offset.__class__ is not int or query_offset < 0:
        query_offset = check_int("query_offset", query_offset, 0)
    p = Problem(spec.name, dtype, B, H, n, m, d, arrays)
    p.scale = scale
    p.query_offset = query_offset
    if spec.bucket is not None:
        p.map_values = map_values = tuple(map_values)
        rows = _map_rows(spec.bucket, map_values)
    for kind, term in plan_shapes:
        if kind is Dense:
            _check_dense(p, arrays[term.query], arrays[term.key], term.query, term.key)
        elif kind is Segments:
            check_segments(arrays.get("segment_q"), arrays.get("segment_k"),
                           arrays.get("segment_table"), B, H, n, m)
        else:
            table = arrays.get(term.name)
            if table is None:
                continue
            shape = table.shape
            heads = shape[0] if shape else -1
            if kind is Table:
                if len(shape) != 2 or (heads != H and heads != 1) or shape[1] != rows:
                    check_shape(term.name, table, ({H, 1}, rows), f"(H|1, {rows})")
            elif kind is Reset:
                if len(shape) != 2 or (heads != H and heads != 1) or shape[1] != 2:
                    check_shape(term.name, table, ({H, 1}, 2), "(H|1, 2)")
            elif (len(shape) != 3 or (heads != H and heads != 1) or shape[1] != rows
                  or shape[2] != d):
                check_shape(term.name, table, ({H, 1}, rows, d), f"(H|1, {rows}, d)")
    if out is not None:
        check_out(out, p)
    return p


def _check_dense(p: Problem, pos_q, pos_k, query: str, key: str) -> None:
    check_rank(query, pos_q, 3, "(H|1, n, d_p)")
    check_rank(key, pos_k, 3, "(H|1, m, d_p)")
    d_p = pos_q.shape[2]
    check_shape(query, pos_q, ({p.H, 1}, p.n, d_p), "(H|1, n, d_p)")
    check_shape(key, pos_k, ({p.H, 1}, p.m, d_p), "(H|1, m, d_p)")
    p.d_p = d_p


def _checker(method: str):
    spec = REGISTRY[method]
    return define(method, lambda tensors, params, out: check(spec, tensors, params, out),
                  name=method, module=__name__,
                  doc=f"Check a call of posenc.{method}; return its Problem or raise.")


# One checker per method, with the method's signature (what every namespace runs).
CHECKERS = {method: _checker(method) for method in REGISTRY}
