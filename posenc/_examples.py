"""Random inputs for every method: used by `python -m posenc check`, the
benchmarks and the tests, so all three exercise the same configurations."""

from __future__ import annotations

import numpy as np

# Methods whose positional term needs n == m to be meaningful in its paper
# still accept n != m here; every method does.
METHODS = ("content", "shaw", "t5", "m2", "m4", "m4m", "deberta", "tupe", "diet_abs", "diet_rel")


def make_inputs(method: str, B: int, H: int, n: int, m: int, d: int, *, dtype=np.float64,
                rng=None, shared: bool = False, max_distance: int = 4, segments: int = 3,
                theta: bool = True, bias: bool = True, d_p: int | None = None,
                log_buckets: bool = True, num_buckets: int = 16, t5_max_distance: int = 40,
                att_span: int = 8):
    """(args, kwargs) for posenc.<method>(*args, **kwargs).

    shared=True gives every positional parameter a head axis of 1.
    Parameters are drawn standard normal; tables of multiplicative methods
    (m2) around 1 so the logits keep the content's scale.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    Hp = 1 if shared else H
    dt = np.dtype(dtype)

    def normal(*shape):
        return rng.standard_normal(shape).astype(dt)

    q, k = normal(B, H, n, d), normal(B, H, m, d)
    kw: dict = {}
    args = [q, k]
    t = max_distance
    if method == "shaw" or method == "m4" or method == "m4m":
        args.append(normal(Hp, 2 * t + 1, d))
        kw["max_distance"] = t
    elif method == "m2":
        args.append((1.0 + 0.5 * rng.standard_normal((Hp, 2 * t + 1))).astype(dt))
        kw["max_distance"] = t
    elif method == "t5":
        args.append(normal(Hp, num_buckets))
        kw.update(num_buckets=num_buckets, max_distance=t5_max_distance)
    elif method == "deberta":
        span = att_span
        args += [normal(Hp, 2 * span, d), normal(Hp, 2 * span, d)]
        kw["att_span"] = span
        if log_buckets:
            kw.update(position_buckets=span, max_relative_positions=4 * span)
    elif method == "tupe":
        dp = d if d_p is None else d_p
        args += [normal(Hp, n, dp), normal(Hp, m, dp)]
        if bias:
            kw.update(bias=normal(Hp, num_buckets), num_buckets=num_buckets,
                      max_distance=t5_max_distance)
        if theta:
            kw["theta"] = normal(Hp, 2)
    elif method in ("diet_abs", "diet_rel"):
        if method == "diet_abs":
            dp = max(1, d // 2) if d_p is None else d_p
            args += [normal(Hp, n, dp), normal(Hp, m, dp)]
        else:
            args.append(normal(Hp, 2 * t + 1))
            kw["max_distance"] = t
        if segments:
            # contiguous segments, as sentence pairs are laid out
            kw["segment_q"] = np.sort(rng.integers(0, segments, size=(B, n)), axis=1)
            kw["segment_k"] = np.sort(rng.integers(0, segments, size=(B, m)), axis=1)
            kw["segment_table"] = normal(Hp, segments, segments)
    elif method != "content":
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    return args, kw


def float_inputs(method: str, args, kwargs) -> dict:
    """The float (differentiable) inputs by argument name."""
    from ._grads import GRAD_FIELDS

    names = GRAD_FIELDS[method]
    found = dict(zip(names, args))
    for name in names:
        if name in kwargs and kwargs[name] is not None:
            found[name] = kwargs[name]
    return found


def with_inputs(method: str, args, kwargs, replace: dict):
    """(args, kwargs) with some float inputs replaced by name."""
    from ._grads import GRAD_FIELDS

    names = GRAD_FIELDS[method]
    new_args = [replace.get(names[t], a) if t < len(names) else a for t, a in enumerate(args)]
    new_kwargs = {key: replace.get(key, value) for key, value in kwargs.items()}
    return new_args, new_kwargs
