"""Every method of SPEC §3 as a configuration of the one C engine.

A method is the content term plus positional terms of five kinds (dense
factor, scalar table, query-side and key-side vector tables, segment table,
[CLS] reset) combined by sum or product; `_configure` says which, with which
bucket map.  The public functions validate with `_checks` (shared with the
reference), configure, and call `posenc._C`.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _C, _checks, buckets
from ._grads import GRAD_TYPES

# Order of the gradients posenc._C.backward returns.
ENGINE_GRADS = ("q", "k", "pos_q", "pos_k", "table", "vq_table", "vk_table", "seg_table", "theta")


def _offsets(n: int, m: int) -> np.ndarray:
    """o = j - i for the n + m - 1 diagonals, o from -(n - 1) to m - 1."""
    if n == 0 or m == 0:
        return np.zeros(0, dtype=np.int64)
    return np.arange(-(n - 1), m, dtype=np.int64)


@functools.lru_cache(maxsize=256)
def _bucket_map(kind: str, params: tuple, n: int, m: int) -> np.ndarray:
    """A bucket map over the offsets j - i, computed once per shape."""
    o = _offsets(n, m)
    if kind == "clipped":
        result = buckets.clipped(o, params[0])
    elif kind == "clipped_reversed":          # DIET eq. (3): R_{i-j}
        result = buckets.clipped(-o, params[0])
    elif kind == "t5":
        result = buckets.t5(o, *params)
    elif kind == "deberta":
        span, position_buckets, max_relative = params
        delta = -o                            # DeBERTa's delta = i - j
        if position_buckets > 0 and max_relative > 0:
            delta = buckets.deberta_log(delta, position_buckets, max_relative)
        result = np.clip(delta + span, 0, 2 * span - 1)
    else:
        raise AssertionError(kind)
    result = np.ascontiguousarray(result, dtype=np.int64)
    result.setflags(write=False)
    return result


def _configure(p: _checks.Problem):
    """(engine keyword arguments, {gradient field: engine gradients summed})."""
    a, prm, n, m = p.arrays, p.params, p.n, p.m
    s = prm["scale"]
    kw = {"scale": s}
    fields = {"q": ("q",), "k": ("k",)}
    method = p.method
    if method == "content":
        pass
    elif method in ("shaw", "m4", "m4m"):
        rel_map = _bucket_map("clipped", (prm["max_distance"],), n, m)
        kw.update(vq_table=a["rel_k"], vq_map=rel_map)
        fields["rel_k"] = ("vq_table",)
        if method != "shaw":                  # M4 / M4M: q.a and k.a share the table
            kw.update(vk_table=a["rel_k"], vk_map=rel_map)
            fields["rel_k"] = ("vq_table", "vk_table")
        if method == "m4m":
            kw.update(combine=True, vec_scale=1.0)
        else:
            kw.update(vec_scale=s)
    elif method == "t5":
        kw.update(table=a["bias"], table_map=_bucket_map(
            "t5", (prm["num_buckets"], prm["max_distance"], prm["bidirectional"]), n, m))
        fields["bias"] = ("table",)
    elif method == "m2":
        kw.update(combine=True, table=a["rel"],
                  table_map=_bucket_map("clipped", (prm["max_distance"],), n, m))
        fields["rel"] = ("table",)
    elif method == "deberta":
        pmap = _bucket_map("deberta", (prm["att_span"], prm["position_buckets"],
                                       prm["max_relative_positions"]), n, m)
        kw.update(vq_table=a["pos_key"], vq_map=pmap, vk_table=a["pos_query"], vk_map=pmap,
                  vec_scale=s)
        fields.update(pos_key=("vq_table",), pos_query=("vk_table",))
    elif method == "tupe":
        kw.update(pos_q=a["pos_q"], pos_k=a["pos_k"], dense_scale=s)
        fields.update(pos_q=("pos_q",), pos_k=("pos_k",))
        if "bias" in a:
            kw.update(table=a["bias"], table_map=_bucket_map(
                "t5", (prm["num_buckets"], prm["max_distance"], prm["bidirectional"]), n, m))
            fields["bias"] = ("table",)
        if "theta" in a:
            kw.update(theta=a["theta"])
            fields["theta"] = ("theta",)
    elif method in ("diet_abs", "diet_rel"):
        if method == "diet_abs":
            kw.update(pos_q=a["pos_q"], pos_k=a["pos_k"], dense_scale=1.0)
            fields.update(pos_q=("pos_q",), pos_k=("pos_k",))
        else:
            kw.update(table=a["rel"],
                      table_map=_bucket_map("clipped_reversed", (prm["max_distance"],), n, m))
            fields["rel"] = ("table",)
        if "segment_table" in a:
            kw.update(seg_q=a["segment_q"], seg_k=a["segment_k"], seg_table=a["segment_table"])
            fields["segment_table"] = ("seg_table",)
    else:
        raise AssertionError(method)
    return kw, fields


def forward(p: _checks.Problem) -> np.ndarray:
    kw, _ = _configure(p)
    return _C.forward(p.arrays["q"], p.arrays["k"], out=p.out, **kw)


def backward(p: _checks.Problem, G: np.ndarray, wanted=None):
    """The gradient tuple of p's method; `wanted` (field names) limits the work."""
    kw, fields = _configure(p)
    grad_type = GRAD_TYPES[p.method]
    if wanted is None:
        wanted = grad_type._fields
    needs = 0
    for field in wanted:
        for engine_name in fields.get(field, ()):
            needs |= 1 << ENGINE_GRADS.index(engine_name)
    raw = dict(zip(ENGINE_GRADS, _C.backward(G, p.arrays["q"], p.arrays["k"], needs=needs, **kw)))
    values = {}
    for field in grad_type._fields:
        parts = [raw[name] for name in fields.get(field, ()) if raw[name] is not None]
        if not parts or field not in wanted:
            values[field] = None
        elif len(parts) == 1:
            values[field] = parts[0]
        else:   # M4 / M4M: the table's query-side and key-side gradients
            with np.errstate(invalid="ignore", over="ignore"):   # IEEE, as the kernels
                values[field] = np.add(parts[0], parts[1], out=parts[0])
    return grad_type(**values)
