"""Random inputs for every method, from its registry entry: used by
`python -m posenc check`, the benchmarks and the tests, so all three
exercise the same configurations."""

from __future__ import annotations

import numpy as np

from ._kinds import Example
from ._registry import GRAD_FIELDS, METHODS, REGISTRY, Dense

__all__ = ["METHODS", "make_inputs", "key_count", "query_rows", "float_inputs", "trainable_inputs",
           "with_inputs", "dense_rank"]


def make_inputs(method: str, B: int, H: int, n: int, m: int, d: int, *, dtype=np.float64,
                rng=None, shared: bool = False, max_distance: int = 4, segments: int = 3,
                theta: bool = True, bias: bool = True, d_p: int | None = None,
                log_buckets: bool = True, num_buckets: int = 16, t5_max_distance: int = 40,
                att_span: int = 8, rotary_dim: int | None = None, kv_heads: int | None = None,
                rope_per_token: bool = False):
    """(args, kwargs) for posenc.<method>(*args, **kwargs).

    Tensors before the signature's `*` are positional, those after it (optional ones,
    coordinates) and parameters keywords.
    shared=True gives every positional parameter a head axis of 1.
    Parameters are drawn standard normal; the tables of product methods (m2)
    around 1 so the logits keep the content's scale; each term kind draws its
    own (posenc._kinds: ALiBi's slopes, RoPE's tables for n + m + 8 positions
    and `rotary_dim` rotated dimensions, d by default).  The optional terms
    (TUPE's bias and theta, DIET's segments) are given unless turned off.
    Dense factors have rank d_p (default d, or d // 2 when unscaled: DIET-ABS).
    rope_per_token=True gives rope per-token tables (spec §3.16): the queries'
    (1, H|1, n, r), the keys' (B, 1, m, r).
    kv_heads gives k that many heads (a divisor of H: grouped-query attention).
    """
    if method not in REGISTRY:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    spec = REGISTRY[method]
    rng = np.random.default_rng(0) if rng is None else rng
    options = dict(max_distance=max_distance, segments=segments, d_p=d_p,
                   log_buckets=log_buckets, num_buckets=num_buckets,
                   t5_max_distance=t5_max_distance, att_span=att_span, rotary_dim=rotary_dim,
                   rope_per_token=rope_per_token,
                   wanted={"bias": bias, "theta": theta, "segment_table": bool(segments)})
    kw: dict = {}
    rows = None
    if spec.map is not None:
        kw.update(spec.map.example(options))
        rows = spec.map.rows({**dict(spec.params), **kw})
    ctx = Example(rng, B, H, n, m, d, 1 if shared else H, np.dtype(dtype), rows, spec.product,
                  options)
    values = {"q": ctx.normal(B, H, n, d), "k": ctx.normal(B, H if kv_heads is None else kv_heads,
                                                            m, d)}
    for term in spec.terms:
        values.update(term.example(ctx, spec, values))
    kw.update({name: values[name] for name, _ in spec.params if name in values})   # a term's
    args = [values[name] for name in spec.tensors if name not in spec.keyword_only]
    kw.update({name: values[name] for name in spec.tensors
               if name in spec.keyword_only and name in values})
    return args, kw


def key_count(method: str, n: int, m: int, query_offset: int = 0) -> int:
    """The keys m of an example of `method` meant to have m: m itself, or at least
    query_offset + n for a method whose queries are among the keys (FoX), so that
    tests and checks of every method can share their shapes."""
    return max(m, query_offset + n) if REGISTRY[method].queries_among_keys else m


def query_rows(method: str, args, kwargs, rows):
    """(args, kwargs) of the call restricted to query rows `rows` (a slice): q's, and those
    of every tensor with a row per query (Method.query_tensors: absolute factors, segment
    ids, coordinates) -- a decoding step's call, with query_offset at the rows' start."""
    spec = REGISTRY[method]
    args, kwargs = list(args), dict(kwargs)
    args[0] = args[0][:, :, rows]
    for name in spec.query_tensors:
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, rows]
        elif name not in spec.keyword_only:
            position = spec.tensors.index(name)
            args[position] = args[position][:, rows]
    return args, kwargs


def dense_rank(method: str, args, kwargs) -> int:
    """d_p of a method's dense factor in a call (0 without one)."""
    for term in REGISTRY[method].term(Dense):
        return float_inputs(method, args, kwargs)[term.query].shape[-1]
    return 0


def float_inputs(method: str, args, kwargs) -> dict:
    """The float (differentiable) inputs by argument name."""
    names = GRAD_FIELDS[method]
    found = dict(zip(names, args))
    for name in names:
        if name in kwargs and kwargs[name] is not None:
            found[name] = kwargs[name]
    return found


def trainable_inputs(method: str, args, kwargs) -> dict:
    """The float inputs with a gradient (every float input but a method's constants:
    RoPE's tables), by argument name."""
    constant = REGISTRY[method].constant if method in REGISTRY else ()
    return {name: value for name, value in float_inputs(method, args, kwargs).items()
            if name not in constant}


def with_inputs(method: str, args, kwargs, replace: dict):
    """(args, kwargs) with some float inputs replaced by name."""
    names = GRAD_FIELDS[method]
    new_args = [replace.get(names[t], a) if t < len(names) else a for t, a in enumerate(args)]
    new_kwargs = {key: replace.get(key, value) for key, value in kwargs.items()}
    return new_args, new_kwargs
