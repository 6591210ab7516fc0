"""The C kernels of every method against posenc.reference, with every ISA forced.

Tolerances are those of `python -m posenc check` (posenc/_check.py): float64
normwise relative error <= 1e-12; float32 within (depth + 8) eps32 times the
method evaluated on |inputs|, element by element.
"""

import itertools

import numpy as np
import pytest

import posenc
from posenc import _check, reference
from posenc._examples import METHODS, dense_rank, float_inputs, key_count, make_inputs, with_inputs
from posenc._registry import GRAD_FIELDS, REGISTRY

ALL_ISAS = ("scalar", "avx2", "avx512", "neon")
AWKWARD = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)


@pytest.fixture(params=ALL_ISAS)
def isa(request):
    name = request.param
    if name not in posenc.capabilities():
        pytest.skip(f"ISA {name} not supported by this CPU/build (have {posenc.capabilities()})")
    previous = posenc.get_isa()
    posenc.set_isa(name)
    yield name
    posenc.set_isa(previous)


def assert_matches_reference(method, args, kwargs, rng, *, check_backward=True):
    """posenc == reference for forward and every gradient field (tolerances of _check)."""
    dtype = args[0].dtype
    B, H, n, d = args[0].shape
    m = args[1].shape[2]
    floats = float_inputs(method, args, kwargs)
    a64, k64 = with_inputs(method, args, kwargs,
                           {name: v.astype(np.float64) for name, v in floats.items()})
    depth = d + dense_rank(method, args, kwargs)

    got = getattr(posenc, method)(*args, **kwargs)
    assert got.dtype == dtype and got.shape == (B, H, n, m) and got.flags.c_contiguous
    ref = getattr(reference, method)(*a64, **k64)
    _, err, ok = _check.compare(got, ref, _check.magnitude(method, a64, k64), depth, dtype)
    assert ok, f"{method} forward: error measure {err:.3g} ({dtype}, n={n} m={m} d={d})"
    if not check_backward:
        return
    G = rng.standard_normal((B, H, n, m)).astype(dtype)
    grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
    ref_grads = getattr(reference, method + "_backward")(G.astype(np.float64), *a64, **k64)
    mag_grads = _check.grad_magnitudes(method, np.abs(G.astype(np.float64)), a64, k64)
    assert type(grads).__name__ == type(ref_grads).__name__
    for field in GRAD_FIELDS[method]:
        g, r = getattr(grads, field), getattr(ref_grads, field)
        assert (g is None) == (r is None), field
        if g is None:
            continue
        assert g.dtype == dtype and g.shape == floats[field].shape, field
        _, err, ok = _check.compare(g, r, mag_grads[field], n + m + depth, dtype)
        assert ok, f"{method} d{field}: error measure {err:.3g} ({dtype}, n={n} m={m} d={d})"


# ------------------------------------------------- content on every awkward size

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", AWKWARD)
def test_content_awkward_sizes(isa, dtype, size, rng):
    # n, m and d each take the size in turn, the others a different awkward size
    other = AWKWARD[(AWKWARD.index(size) + 5) % len(AWKWARD)]
    for n, m, d in ((size, size, size), (size, other, 5), (other, size, size), (3, 2, size)):
        args, kw = make_inputs("content", 2, 2, n, m, d, dtype=dtype, rng=rng)
        assert_matches_reference("content", args, kw, rng)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_content_large(isa, dtype, rng):
    args, kw = make_inputs("content", 1, 2, 300, 257, 96, dtype=dtype, rng=rng)
    assert_matches_reference("content", args, kw, rng)


# ------------------------------------------------- every method x ISA x dtype

METHOD_SIZES = [(1, 1, 1), (2, 3, 7), (8, 9, 16), (17, 15, 31), (33, 31, 9), (65, 64, 17)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_methods_awkward_sizes(isa, method, dtype, rng):
    for t, (n, m, d) in enumerate(METHOD_SIZES):
        m = key_count(method, n, m)        # fox: every query among the keys
        args, kw = make_inputs(method, 2, 3, n, m, d, dtype=dtype, rng=rng, shared=t % 2 == 1)
        assert_matches_reference(method, args, kw, rng)


@pytest.mark.parametrize("method", METHODS)
def test_methods_large(isa, method, rng):
    args, kw = make_inputs(method, 1, 2, 130, key_count(method, 130, 97), 64, dtype=np.float64, rng=rng,
                           max_distance=40, t5_max_distance=128, num_buckets=32)
    assert_matches_reference(method, args, kw, rng)


@pytest.mark.parametrize("method", METHODS)
def test_shared_parameters(isa, method, rng):
    """Head axis 1: same logits as the parameter tiled over heads, gradient summed over heads."""
    m = key_count(method, 9, 7)
    args, kw = make_inputs(method, 2, 3, 9, m, 5, rng=rng, shared=True)
    assert_matches_reference(method, args, kw, rng)
    floats = float_inputs(method, args, kw)
    axis = REGISTRY[method].head_axis
    tiled = {name: np.repeat(v, 3, axis=axis(name)) for name, v in floats.items()
             if name not in ("q", "k") and name not in REGISTRY[method].constant}
    targs, tkw = with_inputs(method, args, kw, tiled)
    np.testing.assert_allclose(getattr(posenc, method)(*args, **kw),
                               getattr(posenc, method)(*targs, **tkw), rtol=1e-13, atol=1e-13)
    G = rng.standard_normal((2, 3, 9, m))
    shared = getattr(posenc, method + "_backward")(G, *args, **kw)
    full = getattr(posenc, method + "_backward")(G, *targs, **tkw)
    for name in tiled:
        np.testing.assert_allclose(getattr(shared, name),
                                   getattr(full, name).sum(axis(name), keepdims=True),
                                   rtol=1e-12, atol=1e-12, err_msg=name)


# methods with two or more positional parameters (the others have no mix to test)
MIXED_HEADS = [m for m in METHODS
               if len(set(GRAD_FIELDS[m]) - REGISTRY[m].constant) > 3]


@pytest.mark.parametrize("method", MIXED_HEADS)
def test_mixed_head_axes(isa, method, rng):
    """One positional parameter per head, another shared: each head axis checked on its own."""
    args, kw = make_inputs(method, 2, 3, 6, key_count(method, 6, 5), 4, rng=rng)
    floats = {k: v for k, v in float_inputs(method, args, kw).items()
              if k not in ("q", "k") and k not in REGISTRY[method].constant}
    assert len(floats) >= 2
    first = sorted(floats)[0]
    shared = np.take(floats[first], [0], axis=REGISTRY[method].head_axis(first))   # a head axis of 1
    args, kw = with_inputs(method, args, kw, {first: shared})
    assert_matches_reference(method, args, kw, rng)


@pytest.mark.parametrize("method", METHODS)
def test_non_contiguous_inputs(isa, method, rng):
    """q/k as (B, H, n, d) views of (B, n, H, d) buffers; parameters as strided views."""
    args, kw = make_inputs(method, 2, 3, 11, key_count(method, 11, 9), 6, rng=rng)
    floats = float_inputs(method, args, kw)
    views = {
        "q": np.ascontiguousarray(floats["q"].transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3),
        "k": np.ascontiguousarray(floats["k"].transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3),
    }
    for name, v in floats.items():
        if name not in views:   # every other element of a doubled buffer
            doubled = np.repeat(v, 2, axis=-1)
            views[name] = doubled[..., ::2]
            assert not views[name].flags.c_contiguous or v.shape[-1] == 1
    assert not views["q"].flags.c_contiguous
    vargs, vkw = with_inputs(method, args, kw, views)
    for name in views:
        np.testing.assert_array_equal(float_inputs(method, vargs, vkw)[name], floats[name])
    assert_matches_reference(method, vargs, vkw, rng)
    np.testing.assert_array_equal(getattr(posenc, method)(*vargs, **vkw),
                                  getattr(posenc, method)(*args, **kw))


@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("method", ["diet_abs", "diet_rel"])
def test_segments(isa, method, segments, rng):
    args, kw = make_inputs(method, 3, 2, 13, 10, 5, rng=rng, segments=segments)
    # also ids in any order, not only contiguous runs
    kw["segment_q"] = rng.integers(0, segments, size=kw["segment_q"].shape).astype(np.int16)
    assert_matches_reference(method, args, kw, rng)
    args, kw = make_inputs(method, 3, 2, 13, 10, 5, rng=rng, segments=0)
    assert_matches_reference(method, args, kw, rng)


@pytest.mark.parametrize("theta,bias", list(itertools.product([True, False], [True, False])))
def test_tupe_variants(isa, theta, bias, rng):
    for B in (1, 3):   # B = 1 builds the positional rows per tile, B > 1 once per head
        args, kw = make_inputs("tupe", B, 2, 14, 12, 6, rng=rng, theta=theta, bias=bias, d_p=4)
        assert_matches_reference("tupe", args, kw, rng)


@pytest.mark.parametrize("log_buckets", [True, False])
def test_deberta_buckets(isa, log_buckets, rng):
    args, kw = make_inputs("deberta", 2, 2, 40, 40, 8, rng=rng, log_buckets=log_buckets)
    assert_matches_reference("deberta", args, kw, rng)


@pytest.mark.parametrize("method", METHODS)
def test_zero_sizes(isa, method, rng):
    for B, H, n, m, d in ((0, 2, 3, 3, 2), (2, 0, 3, 3, 2), (2, 2, 0, 3, 2), (2, 2, 3, 0, 2),
                          (2, 2, 3, 4, 0)):
        if key_count(method, n, m) != m:  # fox: no query without keys (m = 0 needs n = 0)
            continue
        args, kw = make_inputs(method, B, H, n, m, d, rng=rng)
        assert_matches_reference(method, args, kw, rng)


@pytest.mark.parametrize("method", METHODS)
def test_out_argument(isa, method, rng):
    m = key_count(method, 7, 6)
    args, kw = make_inputs(method, 2, 2, 7, m, 5, dtype=np.float32, rng=rng)
    out = np.full((2, 2, 7, m), np.nan, dtype=np.float32)
    result = getattr(posenc, method)(*args, out=out, **kw)
    assert result is out
    np.testing.assert_array_equal(out, getattr(posenc, method)(*args, **kw))


# ------------------------------------------------- SIMD against scalar, threads

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_simd_against_scalar(method, dtype, rng):
    simd = [name for name in posenc.capabilities() if name != "scalar"]
    if not simd:
        pytest.skip("no SIMD ISA on this CPU")
    m = key_count(method, 37, 29)
    args, kw = make_inputs(method, 2, 3, 37, m, 19, dtype=dtype, rng=rng)
    G = rng.standard_normal((2, 3, 37, m)).astype(dtype)
    previous = posenc.get_isa()
    results = {}
    try:
        for name in ["scalar"] + simd:
            posenc.set_isa(name)
            results[name] = (getattr(posenc, method)(*args, **kw),
                             getattr(posenc, method + "_backward")(G, *args, **kw))
    finally:
        posenc.set_isa(previous)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    base_fwd, base_bwd = results["scalar"]
    for name in simd:
        fwd, bwd = results[name]
        scale = np.abs(base_fwd).max()
        np.testing.assert_allclose(fwd, base_fwd, rtol=0, atol=rtol * scale, err_msg=name)
        for field in bwd._fields:
            a, b = getattr(bwd, field), getattr(base_bwd, field)
            if b is not None:
                np.testing.assert_allclose(a, b, rtol=0, atol=rtol * max(np.abs(b).max(), 1e-30),
                                           err_msg=f"{name} d{field}")


@pytest.fixture
def restore_threads():
    previous = posenc.get_num_threads()
    yield
    posenc.set_num_threads(previous)


@pytest.mark.parametrize("method", METHODS)
def test_threads_bitwise(isa, method, rng, restore_threads):
    """1 and 2 threads give bitwise identical logits and gradients."""
    # above the engine's one-thread threshold (B H n m (d + 1) >= 2^18): many units,
    # and one unit whose rows are split over the threads
    for B, H, n, m in ((2, 3, 70, 45), (1, 1, 300, 200)):
        assert B * H * n * m * 14 >= 1 << 18
        m = key_count(method, n, m)
        args, kw = make_inputs(method, B, H, n, m, 13, dtype=np.float32, rng=rng)
        G = rng.standard_normal((B, H, n, m)).astype(np.float32)
        runs = []
        for threads in (1, 2):
            posenc.set_num_threads(threads)
            runs.append((getattr(posenc, method)(*args, **kw),
                         getattr(posenc, method + "_backward")(G, *args, **kw)))
        np.testing.assert_array_equal(runs[0][0], runs[1][0])
        for field in runs[0][1]._fields:
            a, b = getattr(runs[0][1], field), getattr(runs[1][1], field)
            if a is not None:
                np.testing.assert_array_equal(a, b, err_msg=field)


def test_inputs_untouched(rng):
    for method in METHODS:
        m = key_count(method, 9, 8)
        args, kw = make_inputs(method, 2, 2, 9, m, 5, rng=rng)
        before = {k: v.copy() for k, v in float_inputs(method, args, kw).items()}
        G = rng.standard_normal((2, 2, 9, m))
        G0 = G.copy()
        getattr(posenc, method)(*args, **kw)
        getattr(posenc, method + "_backward")(G, *args, **kw)
        for name, value in float_inputs(method, args, kw).items():
            np.testing.assert_array_equal(value, before[name], err_msg=f"{method} {name}")
        np.testing.assert_array_equal(G, G0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("method", METHODS)
def test_nonfinite_propagate(isa, method, rng):
    """NaN and Inf propagate as IEEE arithmetic says: no crash, no hang."""
    args, kw = make_inputs(method, 1, 2, 6, key_count(method, 6, 5), 4, rng=rng)
    args[0][0, 0, 2, 1] = np.nan
    args[1][0, 1, 3, 0] = np.inf
    got = getattr(posenc, method)(*args, **kw)
    assert np.isnan(got[0, 0, 2]).all()           # row 2 of head 0 touches the NaN
    assert np.isfinite(got[0, 0, :2]).all()        # other rows of head 0 do not
    ref = reference.__dict__[method](*args, **kw)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    getattr(posenc, method + "_backward")(np.ones_like(got), *args, **kw)


@pytest.mark.parametrize("method", ["content", "t5", "tupe", "m4m"])
def test_streamed_large_output(isa, method, rng):
    """Logits of >= 32 MB with 64-byte rows are written with non-temporal stores."""
    args, kw = make_inputs(method, 2, 1, 1024, 4096, 8, dtype=np.float32, rng=rng)
    out = getattr(posenc, method)(*args, **kw)
    assert out.nbytes >= 32 << 20 and out.ctypes.data % 64 == 0
    assert_matches_reference(method, args, kw, rng, check_backward=False)
    again = np.empty_like(out)
    np.testing.assert_array_equal(getattr(posenc, method)(*args, out=again, **kw), out)
