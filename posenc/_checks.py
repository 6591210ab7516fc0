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
import sys

import numpy as np

from ._dtypes import FLOAT_DTYPES, LOW_PRECISION
from ._dtypes import TEXT as FLOAT_DTYPES_TEXT
from ._kinds import Bool, Int, Scale, check_rank, check_shape, require_ndarray
from ._kinds import shape_str as _shape_str
from ._registry import MAPS, REGISTRY
from ._signatures import define


class Problem:
    """A validated call: sizes, dtype, the given arrays by argument name, and
    the parameters with defaults resolved: `scale`, `query_offset`, the bucket
    map's `map_values` (what the engine needs) and `values`, every parameter
    but those two in signature order (`params`: all of them by name, built on
    first use)."""

    __slots__ = ("method", "dtype", "B", "H", "H_kv", "n", "m", "d", "arrays", "scale",
                 "query_offset", "map_values", "values", "d_p", "out", "seen", "_params")

    def __init__(self, method, dtype, B, H, n, m, d, arrays=None, params=None, out=None):
        self.method, self.dtype = method, dtype
        self.B, self.H, self.n, self.m, self.d = B, H, n, m, d
        self.H_kv = H             # k's heads: H, or a divisor of it (grouped-query attention)
        self.arrays = {} if arrays is None else arrays
        self._params = params
        self.scale = None
        self.query_offset = 0
        self.map_values = ()      # the bucket map's parameters, checked, in MAPS order
        self.values = ()          # every parameter before scale, checked, in signature order
        self.d_p = None           # rank of the dense factor
        self.out = out
        self.seen = None          # posenc.reference's fused attention: the keys each row sees

    @property
    def params(self) -> dict:
        """Every parameter by name (the map's, the terms', "scale", "query_offset",
        "d_p" with a dense factor)."""
        if self._params is None:
            spec = REGISTRY.get(self.method)        # None for the reference's baselines
            names = [name for name, _ in spec.params[:-2]] if spec else ()
            self._params = dict(zip(names, self.values), scale=self.scale,
                                query_offset=self.query_offset)
            if self.d_p is not None:
                self._params["d_p"] = self.d_p
        return self._params


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


# The largest query_offset + n + m: the kernels index positions and offsets in int64.
MAX_QUERY_OFFSET = 2 ** 63 - 1


def check_int(name: str, value, minimum: int | None = None) -> int:
    return Int(minimum).check(name, value)


def check_bool(name: str, value) -> bool:
    if value is True or value is False:
        return value
    return Bool().check(name, value)


def check_scale(value, default: float) -> float:
    if value is None:
        return default
    return Scale().check("scale", value)


def _heads(H: int) -> set:
    return {H, 1}


def check_qk(q, k, grouped: bool = True) -> tuple:
    """(B, H, n, m, d, H_kv) of q (B, H, n, d) and k (B, H_kv, m, d): H_kv = H, or
    with `grouped` any divisor of H (grouped-query attention, SPEC §7)."""
    if q.ndim != 4:
        check_rank("q", q, 4, "(B, H, n, d)")
    if k.ndim != 4:
        check_rank("k", k, 4, "(B, H, m, d)")
    B, H, n, d = q.shape
    kB, kH, m, kd = k.shape
    if kB != B or kd != d or not (kH == H or (grouped and kH and H % kH == 0)):
        raise ValueError(
            f"k must have shape ({B}, {H}, m, {d}) (B, H, m, d) to match q of shape "
            f"{_shape_str(q.shape)}" + (f", or H_kv heads that divide H = {H} (grouped-query "
                                        "attention);" if grouped and kH != H else ",") +
            f" got {_shape_str(k.shape)}"
        )
    return B, H, n, m, d, kH


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
    B, H, n, m, d, _ = check_qk(q, k, grouped=False)
    return Problem(method, dtype, B, H, n, m, d, arrays={"q": q, "k": k})


_F32, _F64 = FLOAT_DTYPES[:2]


@functools.lru_cache(maxsize=1024)
def _map_rows(kind: str, values: tuple) -> int:
    """Rows of the table a map indexes, once its parameters passed SPEC §2's checks."""
    bucket_map = MAPS[kind]
    named = dict(zip(bucket_map.params, values))
    bucket_map.check(named)
    return bucket_map.rows(named)


def _plan(spec) -> tuple:
    """What `check` walks for `spec`: (name, optional, float) per tensor; (name,
    kind, fast types) per parameter before scale; the positions of the map's
    parameters among them; the terms whose tensors to check (each tensor once:
    M4's rel_k, read on two sides, is checked once)."""
    tensors = tuple((name, name in spec.optional, name not in spec.index)
                    for name in spec.tensors)
    params = tuple((name, spec.param_kinds[name]) for name, _ in spec.params[:-2])
    # the exact types every parameter's fast path takes (None: always checked)
    types = tuple(kind.types[0] if len(kind.types) == 1 else None for _, kind in params)
    names = [name for name, _ in params]
    map_positions = tuple(names.index(name) for name in spec.map_params)
    if map_positions == tuple(range(len(map_positions))):   # the map's first: a slice
        map_positions = slice(0, len(map_positions)) if map_positions else None
    terms, seen = [], set()
    for term in spec.terms:
        if not set(term.tensors) <= seen:
            terms.append(term)
            seen.update(term.tensors)
    return tensors, params, types, map_positions, tuple(terms)


_PLANS = {name: _plan(spec) for name, spec in REGISTRY.items()}


def check(spec, tensors: tuple, params: tuple, out) -> Problem:
    """Validate one call of method `spec` (a posenc._registry.Method): its
    fast check (_FAST, generated from its plan) for the common call, which
    hands any other to `check_call`."""
    return _FAST[spec.name](spec, tensors, params, out)


def check_call(spec, tensors: tuple, params: tuple, out) -> Problem:
    """Validate one call of method `spec` (a posenc._registry.Method).

    `tensors` and `params` are the call's values in the order of
    spec.tensors and spec.params.  The order of the checks -- types and
    dtypes, then q and k, then parameters, then each term's shapes, then
    out -- is the same for every namespace, so each raises the same error.
    Common values take fast paths (exact ndarray, int, bool and float types,
    native float dtypes); anything else goes through the checks that build
    the error messages.
    """
    plan_tensors, plan_params, plan_types, map_positions, terms = _PLANS[spec.name]
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
        H_kv = H
    else:
        B, H, n, m, d, H_kv = check_qk(tensors[0], tensors[1])
    # parameters: the map's and the terms' (in signature order), then the scale and the offset
    *values, scale, query_offset = params
    if tuple(map(type, values)) != plan_types:     # NumPy scalars, a choice, or an error
        for t, (name, kind) in enumerate(plan_params):
            if values[t].__class__ not in kind.types:
                values[t] = kind.check(name, values[t])
    if scale is None:
        scale = spec.default_scale(d)
    elif scale.__class__ is not float:
        scale = check_scale(scale, 0.0)
    if query_offset.__class__ is not int or query_offset < 0:
        query_offset = check_int("query_offset", query_offset, 0)
    if query_offset > MAX_QUERY_OFFSET - n - m:
        raise ValueError(f"query_offset = {query_offset} is too large: positions "
                         f"query_offset + i and offsets j - (query_offset + i) must fit in "
                         f"int64, so query_offset <= 2**63 - 1 - (n + m) = "
                         f"{MAX_QUERY_OFFSET - n - m} here (n = {n}, m = {m})")
    p = Problem(spec.name, dtype, B, H, n, m, d, arrays)
    p.H_kv = H_kv
    p.scale = scale
    p.query_offset = query_offset
    p.values = values = tuple(values)
    rows = None
    if map_positions is not None:
        p.map_values = map_values = (values[map_positions] if map_positions.__class__ is slice
                                     else tuple(values[t] for t in map_positions))
        rows = _map_rows(spec.bucket, map_values)
    for term in terms:
        term.check(p, arrays, rows)
    if out is not None:
        check_out(out, p)
    return p


def _fast_check(spec):
    """`check_call` of `spec` for the common call, generated from its plan
    (unrolled: no loop over the plan, no list of the parameters): every
    float tensor an exact ndarray of one dtype of posenc's, q and k 4-D
    with the same B, H and d, every parameter of its one fast type, the
    scale None or a float, the offset an int in range, no `out`.  Any other
    call goes to check_call, which gives it the same Problem or the same
    error; the term checks are the same calls either way.  The size-1 call
    of issue-free inputs is where this counts: the checks are most of its
    cost."""
    plan_tensors, _, plan_types, map_positions, terms = _PLANS[spec.name]
    if None in plan_types:      # a parameter always checked (a choice): the general path
        return check_call
    tensor_names = [f"t{t}" for t in range(len(plan_tensors))]
    param_names = [f"p{t}" for t in range(len(plan_types))]
    slow = "return _module.check_call(spec, tensors, params, out)"
    lines = ["def fast(spec, tensors, params, out):",
             f"    if out is not None or len(tensors) != {len(plan_tensors)} or "
             f"len(params) != {len(plan_types) + 2}:",
             f"        {slow}",
             f"    {', '.join(tensor_names)}, = tensors",
             "    if t0.__class__ is not _ndarray or t1.__class__ is not _ndarray:",
             f"        {slow}",
             "    dtype = t0.dtype",
             "    if not (dtype is _F32 or dtype is _F64 or dtype in _LOW) or "
             "t1.dtype is not dtype:",
             f"        {slow}"]
    arrays = ['"q": t0', '"k": t1']
    optional = []
    for t, (name, is_optional, is_float) in enumerate(plan_tensors[2:], start=2):
        value = f"t{t}"
        if is_float:
            test = f"{value}.__class__ is not _ndarray or {value}.dtype is not dtype"
            lines += [f"    if {value} is not None and ({test}):" if is_optional
                      else f"    if {test}:", f"        {slow}"]
        elif not is_optional:
            lines += [f"    if {value} is None:", f"        {slow}"]
        (optional if is_optional else arrays).append((name, value) if is_optional
                                                     else f'"{name}": {value}')
    lines += ["    q_shape, k_shape = t0.shape, t1.shape",
              "    if len(q_shape) != 4 or len(k_shape) != 4 or q_shape[0] != k_shape[0] or "
              "q_shape[1] != k_shape[1] or q_shape[3] != k_shape[3]:",
              f"        {slow}",
              "    B, H, n, d = q_shape",
              "    m = k_shape[2]",
              f"    {''.join(name + ', ' for name in param_names)}scale, query_offset = params"]
    if param_names:
        lines += ["    if " + " or ".join(f"{name}.__class__ is not _T{t}"
                                          for t, name in enumerate(param_names)) + ":",
                  f"        {slow}"]
    lines += ["    if scale is None:", "        scale = spec.default_scale(d)",
              "    elif scale.__class__ is not float:", f"        {slow}",
              "    if query_offset.__class__ is not int or query_offset < 0 or "
              "query_offset > _MAX_QUERY_OFFSET - n - m:", f"        {slow}",
              "    arrays = {" + ", ".join(arrays) + "}"]
    for name, value in optional:
        lines += [f"    if {value} is not None:", f'        arrays["{name}"] = {value}']
    lines += ["    p = _Problem(spec.name, dtype, B, H, n, m, d, arrays)",
              "    p.scale = scale",
              "    p.query_offset = query_offset",
              f"    p.values = ({''.join(name + ', ' for name in param_names)})"]
    if map_positions is None:
        lines.append("    rows = None")
    else:
        picked = (param_names[map_positions] if map_positions.__class__ is slice
                  else [param_names[t] for t in map_positions])
        lines += [f"    p.map_values = map_values = ({''.join(name + ', ' for name in picked)})",
                  f"    rows = _map_rows({spec.bucket!r}, map_values)"]
    lines += [f"    _term{t}.check(p, arrays, rows)" for t in range(len(terms))]
    lines.append("    return p")
    namespace = {"_module": sys.modules[__name__], "_ndarray": np.ndarray, "_F32": _F32, "_F64": _F64,
                 "_LOW": LOW_PRECISION, "_MAX_QUERY_OFFSET": MAX_QUERY_OFFSET,
                 "_Problem": Problem, "_map_rows": _map_rows,
                 **{f"_T{t}": kind for t, kind in enumerate(plan_types)},
                 **{f"_term{t}": term for t, term in enumerate(terms)}}
    exec(compile("\n".join(lines) + "\n", f"<posenc check of {spec.name}>", "exec"), namespace)
    return namespace["fast"]


_FAST = {name: _fast_check(spec) for name, spec in REGISTRY.items()}


def _checker(method: str):
    spec = REGISTRY[method]
    return define(method, lambda tensors, params, out: check(spec, tensors, params, out),
                  name=method, module=__name__,
                  doc=f"Check a call of posenc.{method}; return its Problem or raise.")


# One checker per method, with the method's signature (what every namespace runs).
CHECKERS = {method: _checker(method) for method in REGISTRY}
