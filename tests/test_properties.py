"""Property tests (hypothesis): random shapes (1s and 0s included), strides
(transposed, sliced, negative-stride views), dtypes, parameter sharing, and
occasionally a wrong dimension.  For every method, posenc equals
posenc.reference forward and backward, or both raise the same exception
type; the process never crashes."""

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import posenc  # noqa: E402
from posenc import _check, reference  # noqa: E402
from posenc._examples import METHODS, dense_rank, float_inputs, make_inputs, with_inputs  # noqa: E402
from posenc._registry import GRAD_FIELDS  # noqa: E402

EXAMPLES = int(os.environ.get("POSENC_HYPOTHESIS_EXAMPLES", "150"))
VIEWS = ("contiguous", "transposed", "sliced", "reversed")


def _view(x, kind, axis_seed):
    """An array equal to x with other strides."""
    if not isinstance(x, np.ndarray) or x.ndim == 0 or kind == "contiguous":
        return x
    axis = axis_seed % x.ndim
    if kind == "transposed" and x.ndim >= 2:
        other = (axis + 1) % x.ndim
        return np.ascontiguousarray(np.swapaxes(x, axis, other)).swapaxes(axis, other)
    if kind == "sliced":
        return np.repeat(x, 2, axis=axis)[(slice(None),) * axis + (slice(None, None, 2),)]
    if kind == "reversed":
        return np.flip(np.flip(x, axis).copy(), axis)
    return x


@st.composite
def problems(draw):
    method = draw(st.sampled_from(METHODS))
    B, H = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    n, m, d = draw(st.integers(0, 9)), draw(st.integers(0, 9)), draw(st.integers(0, 6))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    args, kw = make_inputs(method, B, H, n, m, d, dtype=dtype, rng=rng,
                           shared=draw(st.booleans()), max_distance=draw(st.integers(0, 4)),
                           segments=draw(st.sampled_from([0, 1, 3])), theta=draw(st.booleans()),
                           bias=draw(st.booleans()), log_buckets=draw(st.booleans()),
                           d_p=draw(st.integers(0, 4)))
    # strides: each float input gets its own view
    floats = float_inputs(method, args, kw)
    views = {name: _view(v, draw(st.sampled_from(VIEWS)), draw(st.integers(0, 3)))
             for name, v in floats.items()}
    args, kw = with_inputs(method, args, kw, views)
    # sometimes break one dimension of one input
    if draw(st.integers(0, 9)) == 0:
        name = draw(st.sampled_from(sorted(views)))
        x = views[name]
        if x.ndim:
            axis = draw(st.integers(0, x.ndim - 1))
            x = np.concatenate([x, x.take([0] if x.shape[axis] else [], axis=axis)], axis=axis) \
                if x.shape[axis] else np.concatenate([x, x], axis=axis)
            args, kw = with_inputs(method, args, kw, {name: x})
    G = rng.standard_normal((B, H, n, m)).astype(dtype)
    return method, args, kw, G


def _call(fn, *args, **kw):
    try:
        return fn(*args, **kw), None
    except (TypeError, ValueError) as exc:
        return None, type(exc)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_posenc_equals_reference(problem):
    method, args, kw, G = problem
    got, err = _call(getattr(posenc, method), *args, **kw)
    ref, ref_err = _call(getattr(reference, method), *args, **kw)
    assert err == ref_err, f"{method}: posenc raised {err}, reference {ref_err}"
    if err is not None:
        return
    dtype = args[0].dtype
    floats = float_inputs(method, args, kw)
    f64_args, f64_kw = with_inputs(method, args, kw, {k: v.astype(np.float64) for k, v in floats.items()})
    d = args[0].shape[-1]
    d_p = dense_rank(method, args, kw)
    ref64 = getattr(reference, method)(*f64_args, **f64_kw)
    _, measure, ok = _check.compare(got, ref64, _check.magnitude(method, f64_args, f64_kw),
                                    d + d_p, dtype)
    assert ok, f"{method} forward error measure {measure}"
    assert ref.dtype == got.dtype == dtype

    grads, err = _call(getattr(posenc, method + "_backward"), G, *args, **kw)
    ref_grads, ref_err = _call(getattr(reference, method + "_backward"), G, *args, **kw)
    assert err == ref_err
    if err is not None:
        return
    ref64_grads = getattr(reference, method + "_backward")(G.astype(np.float64), *f64_args, **f64_kw)
    mag_grads = _check.grad_magnitudes(method, np.abs(G.astype(np.float64)), f64_args, f64_kw)
    n, m = got.shape[2], got.shape[3]
    for field in GRAD_FIELDS[method]:
        g, r = getattr(grads, field), getattr(ref64_grads, field)
        assert (g is None) == (r is None), field
        if g is not None:
            assert g.shape == floats[field].shape and g.dtype == dtype
            _, measure, ok = _check.compare(g, r, mag_grads[field], n + m + d + d_p, dtype)
            assert ok, f"{method} d{field} error measure {measure}"
