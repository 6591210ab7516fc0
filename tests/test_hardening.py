"""Hardening: no leaks (success and error paths), reference counts, inputs
untouched, concurrent Python threads, determinism, more than 2^31 logits."""

import gc
import re
import os
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._engine import ENGINE_GRADS
from posenc._examples import METHODS, float_inputs, key_count, make_inputs

SEED = int(os.environ.get("POSENC_TEST_SEED", "0"))


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _calls(method, rng):
    """(name, callable) pairs: forward, backward, out=, and error paths."""
    m = key_count(method, 6, 5)
    args, kw = make_inputs(method, 2, 2, 6, m, 3, rng=rng)
    G = rng.standard_normal((2, 2, 6, m))
    out = np.empty((2, 2, 6, m))
    fwd = getattr(posenc, method)
    bwd = getattr(posenc, method + "_backward")
    bad_q = [args[0].astype(np.float32)] + list(args[1:])
    bad_shape = [args[0][:, :1]] + list(args[1:])
    return args, kw, G, [
        ("forward", lambda: fwd(*args, **kw)),
        ("backward", lambda: bwd(G, *args, **kw)),
        ("out", lambda: fwd(*args, out=out, **kw)),
        ("error dtype", lambda: fwd(*bad_q, **kw)),
        ("error shape", lambda: bwd(G, *bad_shape, **kw)),
        ("error out", lambda: fwd(*args, out=out[..., :2], **kw)),
        ("error G", lambda: bwd(G[..., :2], *args, **kw)),
    ]


def _call_quietly(fn):
    try:
        fn()
    except (TypeError, ValueError):
        pass


CALLS = 6_000       # per path: RSS grows by less than 8 MiB over them (1.4 KB a call)
TRACED = 1_000      # the last of them under tracemalloc (it makes a call 20x slower): less
LEAKED = 13_107     # than this many bytes, 13 a call: less than any Python object kept per call


@pytest.mark.parametrize("method", METHODS)
def test_no_leaks(method):
    """6,000 calls of each path grow neither RSS nor (over their last 1,000)
    tracemalloc's count beyond a small bound per call."""
    rng = np.random.default_rng(SEED)
    args, kw, G, calls = _calls(method, rng)
    for name, fn in calls:
        for _ in range(200):                  # warm caches (lru_cache of bucket maps, allocator)
            _call_quietly(fn)
        gc.collect()
        rss0 = _rss_bytes()
        for _ in range(CALLS - TRACED):
            _call_quietly(fn)
        gc.collect()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        for _ in range(TRACED):
            _call_quietly(fn)
        gc.collect()
        snap1 = tracemalloc.take_snapshot()
        rss1 = _rss_bytes()
        tracemalloc.stop()
        grown = sum(stat.size_diff for stat in snap1.compare_to(snap0, "filename"))
        assert grown < LEAKED, f"{method} {name}: tracemalloc grew {grown} bytes"
        assert rss1 - rss0 < 8 * 1024 * 1024, f"{method} {name}: RSS grew {rss1 - rss0} bytes"


@pytest.mark.parametrize("method", METHODS)
def test_refcounts_unchanged(method):
    rng = np.random.default_rng(SEED)
    args, kw, G, calls = _calls(method, rng)
    inputs = list(float_inputs(method, args, kw).values()) + [G]
    inputs += [v for v in kw.values() if isinstance(v, np.ndarray)]
    before = [sys.getrefcount(x) for x in inputs]
    for _ in range(100):
        for _, fn in calls:
            _call_quietly(fn)
    gc.collect()
    assert [sys.getrefcount(x) for x in inputs] == before


@pytest.mark.parametrize("method", METHODS)
def test_inputs_bitwise_unchanged(method):
    rng = np.random.default_rng(SEED)
    args, kw, G, calls = _calls(method, rng)
    arrays = list(float_inputs(method, args, kw).values()) + [G]
    arrays += [v for v in kw.values() if isinstance(v, np.ndarray)]
    before = [a.tobytes() for a in arrays]
    for _, fn in calls:
        _call_quietly(fn)
    assert [a.tobytes() for a in arrays] == before


def test_concurrent_python_threads():
    """8 Python threads calling different methods at once get the serial results."""
    rng = np.random.default_rng(SEED)
    jobs = []
    for t in range(8):
        method = METHODS[t % len(METHODS)]
        args, kw = make_inputs(method, 2, 3, 40, 33, 16, dtype=np.float32, rng=rng)
        G = rng.standard_normal((2, 3, 40, 33)).astype(np.float32)
        jobs.append((method, args, kw, G))
    serial = [(getattr(posenc, m)(*a, **k), getattr(posenc, m + "_backward")(G, *a, **k))
              for m, a, k, G in jobs]
    results = [None] * len(jobs)
    errors = []
    barrier = threading.Barrier(len(jobs))

    def work(t):
        try:
            method, args, kw, G = jobs[t]
            barrier.wait()
            for _ in range(20):
                results[t] = (getattr(posenc, method)(*args, **kw),
                              getattr(posenc, method + "_backward")(G, *args, **kw))
        except Exception as exc:   # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(jobs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for (fwd, bwd), (sfwd, sbwd) in zip(results, serial):
        np.testing.assert_array_equal(fwd, sfwd)
        for a, b in zip(bwd, sbwd):
            if b is not None:
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", METHODS)
def test_repeated_runs_bitwise(method):
    rng = np.random.default_rng(SEED)
    m = key_count(method, 50, 41)
    args, kw = make_inputs(method, 3, 2, 50, m, 24, dtype=np.float32, rng=rng)
    G = rng.standard_normal((3, 2, 50, m)).astype(np.float32)
    first = (getattr(posenc, method)(*args, **kw), getattr(posenc, method + "_backward")(G, *args, **kw))
    for _ in range(5):
        again = (getattr(posenc, method)(*args, **kw), getattr(posenc, method + "_backward")(G, *args, **kw))
        np.testing.assert_array_equal(first[0], again[0])
        for a, b in zip(first[1], again[1]):
            if a is not None:
                np.testing.assert_array_equal(a, b)


def _available_memory():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.skipif(_available_memory() < 14 * 2**30,
                    reason="needs ~10 GiB free for a 2^31-logit float32 result")
@pytest.mark.parametrize("method", ["content", "t5", "diet_rel"])
def test_more_than_2_31_logits(method):
    """B = H = 1, n = m = 46341, d = 8: n*m > 2^31 logits; sampled entries are right.

    The content part of the sampled rows comes from posenc.reference.content
    on those rows; the positional part from posenc.buckets at the entries'
    true offsets (a relative method cannot be cut to a few rows without
    shifting them)."""
    from posenc import buckets

    n = 46341
    assert n * n > 2**31
    rng = np.random.default_rng(SEED)
    args, kw = make_inputs(method, 1, 1, n, n, 8, dtype=np.float32, rng=rng, segments=2,
                           num_buckets=32, t5_max_distance=128, max_distance=64)
    A = getattr(posenc, method)(*args, **kw)
    try:
        rows = np.array([0, 1, 12345, 23170, 46339, n - 1])
        cols = np.array([0, 1, 777, 23171, 40000, n - 2, n - 1])
        q, k = args[0], args[1]
        scale = 1.0 if method == "t5" else 1 / np.sqrt(8)
        content = reference.content(np.ascontiguousarray(q[:, :, rows]), k, scale=scale)[0, 0][:, cols]
        offset = cols[None, :] - rows[:, None]
        if method == "content":
            positional = 0.0
        elif method == "t5":
            positional = args[2][0, buckets.t5(offset, 32, 128, True)]
        else:
            positional = args[2][0, buckets.clipped(-offset, 64)]
            positional = positional + kw["segment_table"][0][kw["segment_q"][0, rows][:, None],
                                                             kw["segment_k"][0, cols][None, :]]
        np.testing.assert_allclose(A[0, 0][rows][:, cols], content + positional, rtol=1e-5, atol=1e-5)
    finally:
        del A
        gc.collect()


def test_module_arrays_in_the_binding():
    """A term module's array (csrc/terms.h) reaches the engine as the caller holds it:
    (B|1, H|1, L) with leading axes of one left out, any of the four float dtypes
    converted to its type (a `real` array, the Toeplitz table, to the problem's compute
    type), views copied; every form gives the same logits and the same float64
    gradient per unit, and a bad one is refused by name."""
    from posenc import _C, _checks, _methods
    import ml_dtypes
    rng = np.random.default_rng(SEED)
    for dtype in (np.float32, np.float64, ml_dtypes.bfloat16):
        args, kw = make_inputs("t5", 2, 3, 5, 7, 4, dtype=dtype, rng=rng)
        config = _methods.configure(_checks.CHECKERS["t5"](*args, **kw))
        table = np.asarray(config.toeplitz_table)          # (H, R), q's dtype
        assert table.ndim == 2 and table.dtype == dtype
        G = rng.standard_normal((2, 3, 5, 7)).astype(dtype)
        want = _C.forward(config, None)
        want_grad = _C.backward(G, config, 1 << ENGINE_GRADS.index("toeplitz_table"))
        grad = want_grad[ENGINE_GRADS.index("toeplitz_table")]
        assert grad.dtype == np.float64 and grad.shape == (2, 3, table.shape[1])
        wide = np.zeros((3, 2 * table.shape[1]), dtype=np.float64)
        wide[:, ::2] = table.astype(np.float64)
        forms = {"3-D": table[None], "float64": table.astype(np.float64),
                 "a strided view": wide[:, ::2]}
        if dtype != np.float64:                              # its values, held as float32
            forms["float32"] = table.astype(np.float32)
        for name, form in forms.items():
            other = config._replace(toeplitz_table=form)
            assert _C.forward(other, None).tobytes() == want.tobytes(), (dtype, name)
            got = _C.backward(G, other, 1 << ENGINE_GRADS.index("toeplitz_table"))
            assert got[ENGINE_GRADS.index("toeplitz_table")].tobytes() == grad.tobytes(), name
    bad = {"4-D": (table[None, None], ValueError, "toeplitz_table must be (B|1, H|1, L)"),
           "two heads of three": (table[:2], ValueError, "H = 3"),
           "rows of the wrong length": (config.toeplitz_rows[..., 1:], ValueError,
                                        "toeplitz_rows must be (B|1, H|1, L)"),
           "integers": (table.astype(np.int64), TypeError, "toeplitz_table must be a numpy"),
           "a list": (table.tolist(), TypeError, "toeplitz_table must be a numpy")}
    for name, (form, exc, fragment) in bad.items():
        field = "toeplitz_rows" if "rows" in name else "toeplitz_table"
        with pytest.raises(exc, match=re.escape(fragment)):
            _C.forward(config._replace(**{field: form}), None)
