"""NaN and Inf reach exactly the outputs that depend on them (SPEC §5), as in
posenc.reference, for every method, ISA and dtype, forward and backward.

A NaN (or, separately, a +Inf) is put at a few positions of one float input
at a time (G included, for the backward).  The forward's NaN and Inf masks
must equal the reference's, and so must the backward's NaN masks.  With an
Inf input the backward's *non-finite* masks must be equal and the infinities
they share of the same sign: the engine sums G along a bucket's diagonals
before it multiplies (sum_j G_ij) q_i, where the reference adds the
products G_ij q_i one by one, so an Inf meeting G's of both signs is +-Inf
in one and NaN in the other -- both IEEE results of the same sum, grouped
differently.  Finite outputs are compared with the usual tolerances.

Scales past 1 (+-inf, 1e308, 3) give s (q.k + ...) as the reference
computes it: the same masks and values, but for the table gradients summed
along buckets before they are scaled (BUCKET_SUMMED).
"""

import functools
import warnings

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import float_inputs, make_inputs, with_inputs

ISAS = posenc.capabilities()
DTYPES = [np.float32, np.float64]
SHAPES = [(2, 2, 7, 9, 5), (1, 2, 33, 40, 17)]
TOL = {np.float32: dict(rtol=2e-4, atol=2e-4), np.float64: dict(rtol=1e-9, atol=1e-9)}


@pytest.fixture
def isa(request):
    previous = posenc.get_isa()
    posenc.set_isa(request.param)
    yield request.param
    posenc.set_isa(previous)


def _inputs(method, shape, dtype):
    return make_inputs(method, *shape, dtype=dtype, rng=np.random.default_rng(3))


def _positions(shape, seed):
    """A few positions of an array of `shape`: its first and last element and one between."""
    rng = np.random.default_rng(seed)
    middle = tuple(int(rng.integers(0, s)) for s in shape)
    return [tuple(0 for _ in shape), tuple(s - 1 for s in shape), middle]


def _cases(method, shape, dtype):
    """(label, args, kwargs, G) with the special value put into one input (or G)."""
    args, kw = _inputs(method, shape, dtype)
    B, H, n, m, _ = shape
    G = np.random.default_rng(4).standard_normal((B, H, n, m)).astype(dtype)
    names = list(float_inputs(method, args, kw).items()) + [("G", G)]
    for special in (np.nan, np.inf):
        for t, (name, array) in enumerate(names):
            spoiled = array.copy()
            for position in _positions(array.shape, t):
                spoiled[position] = special
            if name == "G":
                yield special, name, args, kw, spoiled
            else:
                new_args, new_kw = with_inputs(method, args, kw, {name: spoiled})
                yield special, name, new_args, new_kw, G


@functools.lru_cache(maxsize=None)
def _reference(method, shape, dtype):
    """The reference's forward and backward of every case (computed once for every ISA)."""
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for special, name, args, kw, G in _cases(method, shape, dtype):
            forward = None if name == "G" else getattr(reference, method)(*args, **kw)
            results.append((forward, getattr(reference, method + "_backward")(G, *args, **kw)))
    return results


def assert_same_pattern(got, want, what, dtype, exact=True, tol=None):
    """NaN and Inf where the reference has them (exact), or at least non-finite
    where it is, +-Inf of the same sign where both are infinite; the finite
    values close."""
    if exact:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN mask")
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"{what}: Inf mask")
    else:
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want),
                                      err_msg=f"{what}: non-finite mask")
    both_inf = np.isinf(got) & np.isinf(want)
    np.testing.assert_array_equal(got[both_inf], want[both_inf], err_msg=f"{what}: Inf signs")
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite].astype(np.float64), want[finite].astype(np.float64),
                               err_msg=f"{what}: finite values", **(tol or TOL[dtype]))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("method", posenc.METHODS)
def test_nan_and_inf_inputs(method, isa, dtype, shape):
    wanted = _reference(method, shape, dtype)
    for (special, name, args, kw, G), (forward, grads) in zip(_cases(method, shape, dtype), wanted):
        label = f"{method} [{isa}, {np.dtype(dtype).name}] {special} in {name}"
        if forward is not None:
            assert_same_pattern(getattr(posenc, method)(*args, **kw), forward,
                                f"{label}: forward", dtype)
        got = getattr(posenc, method + "_backward")(G, *args, **kw)
        for field in got._fields:
            if getattr(grads, field) is not None:
                assert_same_pattern(getattr(got, field), getattr(grads, field),
                                    f"{label}: d{field}", dtype, exact=special != special)


# The table gradients the engine sums along a bucket's diagonals before it
# scales them, (s sum_j G_ij) q_i, where the reference scales each product,
# sum_j s G_ij q_i: with s = +-inf both are non-finite where reached (NaN or
# +-Inf), with s = 1e308 a product may overflow in one and not in the other.
BUCKET_SUMMED = {("shaw", "rel_k"), ("m4", "rel_k"), ("m4m", "rel_k"), ("m2", "rel"),
                 ("deberta", "pos_key"), ("deberta", "pos_query")}
SCALES = [np.inf, -np.inf, 1e308, 3.0]


@functools.lru_cache(maxsize=None)
def _scaled_reference(method, shape, dtype, scale):
    args, kw = _inputs(method, shape, dtype)
    G = np.random.default_rng(4).standard_normal(shape[:3] + (shape[3],)).astype(dtype)
    kw = dict(kw, scale=scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return (args, kw, G, getattr(reference, method)(*args, **kw),
                getattr(reference, method + "_backward")(G, *args, **kw))


@pytest.mark.parametrize("scale", SCALES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("method", posenc.METHODS)
def test_scales_past_one(method, isa, dtype, scale):
    """scale = +-inf, 1e308 (past float32: +-inf there) or 3: the result is
    s (q.k + ...) as the reference computes it, not q.(s k) (whose s k_j
    overflows, and whose sum of +-Inf is NaN).  The engine then sums every
    term unscaled and scales after (forward_tile_exact, exact_content_grad)."""
    for shape in SHAPES:
        args, kw, G, forward, grads = _scaled_reference(method, shape, dtype, scale)
        label = f"{method} [{isa}, {np.dtype(dtype).name}] scale={scale} {shape}"
        tol = dict(TOL[dtype])
        if np.isfinite(scale):
            tol["atol"] *= scale
        got = getattr(posenc, method)(*args, **kw)
        assert_same_pattern(got, forward, f"{label}: forward", dtype, tol=tol)
        got = getattr(posenc, method + "_backward")(G, *args, **kw)
        for field in got._fields:
            want = getattr(grads, field)
            if want is None:
                continue
            what = f"{label}: d{field}"
            if (method, field) not in BUCKET_SUMMED or scale == 3.0:
                assert_same_pattern(getattr(got, field), want, what, dtype, tol=tol)
            elif np.isinf(scale):
                assert_same_pattern(getattr(got, field), want, what, dtype, exact=False, tol=tol)
            else:
                both = np.isfinite(getattr(got, field)) & np.isfinite(want)
                np.testing.assert_allclose(getattr(got, field)[both].astype(np.float64),
                                           want[both].astype(np.float64), err_msg=what, **tol)


def test_a_table_row_no_query_reaches_stays_finite():
    """The example of the issue: row 0 of Shaw's table is never read by query
    0 (max_distance 1), so a NaN in q[0, 0, 0, 0] leaves it finite."""
    args, kw = make_inputs("shaw", 1, 1, 4, 4, 2, rng=np.random.default_rng(0), max_distance=1)
    q = args[0].copy()
    q[0, 0, 0, 0] = np.nan
    G = np.ones((1, 1, 4, 4))
    previous = posenc.get_isa()
    for isa in ISAS:
        posenc.set_isa(isa)
        try:
            got = posenc.shaw_backward(G, q, *args[1:], **kw).rel_k
        finally:
            posenc.set_isa(previous)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = reference.shaw_backward(G, q, *args[1:], **kw).rel_k
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert np.isfinite(got[0, 0]).all() and np.isnan(got[0, 1:]).any()
