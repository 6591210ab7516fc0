"""Tests of posenc.reference, the NumPy twin of the kernels.

The reference is the yardstick of every kernel test, so it is checked on its
own, without the C engine:

* hand-worked tiny cases (the expected matrices are written out below with
  their arithmetic);
* every backward field against float64 central finite differences of
  sum(G * A), on small awkward sizes where clipping and log-bucketing happen;
* head-shared parameters (head axis 1) against the same parameter tiled to H
  heads;
* dtypes, strides, `out=`, zero sizes, d = 0, and the errors of SPEC §5.
"""

import inspect

import numpy as np
import pytest

from posenc import _checks
from posenc import _registry
from posenc import reference as ref

B, H, N, M, D = 2, 3, 5, 4, 3

# --------------------------------------------------------------- the cases
# A case is (method, positional args, keyword args), built for given sizes.
# Parameters mix head axes H and 1; max_distance = 2 so that clipping happens
# for n = 5, m = 4; the T5 cases use n, m ~ 20 with num_buckets = 8,
# max_distance = 16, so that log-bucketing and saturation happen.


def _normal(rng, *shape):
    return rng.standard_normal(shape)


def _qk(rng, b, h, n, m, d):
    return _normal(rng, b, h, n, d), _normal(rng, b, h, m, d)


def _segments(rng, b, n, m, num_ids):
    return (rng.integers(0, num_ids, size=(b, n)).astype(np.int32),
            rng.integers(0, num_ids, size=(b, m)).astype(np.uint8))


def _build(name, rng, b=B, h=H, n=N, m=M, d=D):
    r = lambda *shape: _normal(rng, *shape)  # noqa: E731
    if name.startswith(("t5", "tupe_r")):
        # Big enough for T5's log buckets: |j - i| up to 19 with max_exact 2.
        n, m = (20 if n else 0), (18 if m else 0)
    if name == "deberta_log":
        n, m = (14 if n else 0), (12 if m else 0)
    if name == "absolute_input":
        return "absolute_input", (r(b, n, 4), r(b, n, 4), r(h, 4, d), r(h, 4, d)), {}
    q, k = _qk(rng, b, h, n, m, d)
    if name == "content":
        return "content", (q, k), {}
    if name == "shaw":
        return "shaw", (q, k, r(h, 5, d)), {"max_distance": 2}
    if name == "shaw_shared":
        return "shaw", (q, k, r(1, 5, d)), {"max_distance": 2, "scale": 0.7}
    if name == "t5":
        return "t5", (q, k, r(h, 8)), {"num_buckets": 8, "max_distance": 16}
    if name == "t5_unidirectional":
        return "t5", (q, k, r(1, 6)), {"num_buckets": 6, "max_distance": 12,
                                        "bidirectional": False, "scale": 0.5}
    if name == "m2":
        return "m2", (q, k, r(h, 5)), {"max_distance": 2}
    if name == "m4":
        return "m4", (q, k, r(1, 5, d)), {"max_distance": 2}
    if name == "m4m":
        return "m4m", (q, k, r(h, 5, d)), {"max_distance": 2}
    if name == "deberta":
        # delta = i - j in [-3, 4], delta + 2 clipped to [0, 3]
        return "deberta", (q, k, r(h, 4, d), r(1, 4, d)), {"att_span": 2}
    if name == "deberta_log":
        # mid = 4: |delta| > 4 log-compressed, then clipped to 2 * 4 rows
        return "deberta", (q, k, r(1, 8, d), r(h, 8, d)), {
            "att_span": 4, "position_buckets": 8, "max_relative_positions": 16}
    if name == "tupe_r":
        return "tupe", (q, k, r(h, n, 2), r(1, m, 2)), {
            "bias": r(h, 8), "theta": r(1, 2), "num_buckets": 8, "max_distance": 16}
    if name == "tupe_a":
        return "tupe", (q, k, r(h, n, 2), r(h, m, 2)), {}
    if name == "tupe_theta":
        return "tupe", (q, k, r(1, n, 4), r(h, m, 4)), {"theta": r(h, 2)}
    if name == "tupe_bias":
        return "tupe", (q, k, r(h, n, 1), r(1, m, 1)), {
            "bias": r(1, 4), "num_buckets": 4, "max_distance": 3}
    if name == "diet_abs":
        return "diet_abs", (q, k, r(h, n, 2), r(1, m, 2)), {}
    if name.startswith("diet_abs_seg"):
        num_ids = int(name[-1])
        seg_q, seg_k = _segments(rng, b, n, m, num_ids)
        return "diet_abs", (q, k, r(1, n, 3), r(h, m, 3)), {
            "segment_q": seg_q, "segment_k": seg_k, "segment_table": r(h, num_ids, num_ids)}
    if name == "diet_rel":
        return "diet_rel", (q, k, r(h, 5)), {"max_distance": 2}
    if name.startswith("diet_rel_seg"):
        num_ids = int(name[-1])
        seg_q, seg_k = _segments(rng, b, n, m, num_ids)
        return "diet_rel", (q, k, r(1, 5)), {
            "max_distance": 2, "segment_q": seg_q, "segment_k": seg_k,
            "segment_table": r(1, num_ids, num_ids)}
    if name == "bert_ad":
        return "bert_ad", (q, k, r(h, n, d), r(1, m, d)), {}
    raise AssertionError(name)


CASES = ["content", "shaw", "shaw_shared", "t5", "t5_unidirectional", "m2", "m4", "m4m",
         "deberta", "deberta_log", "tupe_r", "tupe_a", "tupe_theta", "tupe_bias",
         "diet_abs", "diet_abs_seg1", "diet_abs_seg3", "diet_rel", "diet_rel_seg1",
         "diet_rel_seg3", "bert_ad", "absolute_input"]


def _forward(method):
    return getattr(ref, method)


def _backward(method):
    return getattr(ref, method + "_backward")


def _bound(method, args, kwargs):
    """{argument name: value} of a call, defaults left out."""
    return inspect.signature(_forward(method)).bind(*args, **kwargs).arguments


def _float_arrays(method, args, kwargs):
    return {name: value for name, value in _bound(method, args, kwargs).items()
            if isinstance(value, np.ndarray) and value.dtype.kind == "f"}


def _replace(method, args, kwargs, **new):
    """The call with some arguments (by name) replaced."""
    bound = inspect.signature(_forward(method)).bind(*args, **kwargs)
    bound.arguments.update(new)
    return bound.args, bound.kwargs


def _logits_shape(method, args, kwargs):
    if method == "absolute_input":
        x, w_q = args[0], args[2]
        return (x.shape[0], w_q.shape[0], x.shape[1], x.shape[1])
    q, k = args[0], args[1]
    return q.shape[:3] + (k.shape[2],)


# ------------------------------------------------------ finite differences

FD_STEP = 1e-5
FD_MAX_ELEMENTS = 400          # above every array of the cases: all perturbed


def _finite_difference_check(method, args, kwargs, G, rng):
    forward, backward = _forward(method), _backward(method)
    grads = backward(G, *args, **kwargs)

    def loss():
        return float(np.sum(G * forward(*args, **kwargs)))

    checked = []
    for name, array in _float_arrays(method, args, kwargs).items():
        analytic = getattr(grads, name)
        assert analytic.shape == array.shape, name
        flat = np.arange(array.size)
        if array.size > FD_MAX_ELEMENTS:
            flat = rng.choice(flat, FD_MAX_ELEMENTS, replace=False)
        numeric = np.empty(flat.size)
        for pos, index in enumerate(flat):
            where = np.unravel_index(index, array.shape)
            original = array[where]
            array[where] = original + FD_STEP
            plus = loss()
            array[where] = original - FD_STEP
            minus = loss()
            array[where] = original
            numeric[pos] = (plus - minus) / (2 * FD_STEP)
        expected = analytic.reshape(-1)[flat]
        scale = np.max(np.abs(expected))
        assert scale > 0, f"{method}: gradient of {name} is all zero on this case"
        error = np.max(np.abs(numeric - expected)) / scale
        assert error < 1e-6, f"{method}: d/d{name} relative error {error:.2e}"
        checked.append(name)
    return checked


@pytest.mark.parametrize("case", CASES)
def test_backward_matches_finite_differences(case, rng):
    method, args, kwargs = _build(case, rng)
    G = _normal(rng, *_logits_shape(method, args, kwargs))
    checked = _finite_difference_check(method, args, kwargs, G, rng)
    expected = [f for f in _registry.GRAD_FIELDS[method]
                if _bound(method, args, kwargs).get(f) is not None]
    assert sorted(checked) == sorted(expected)


# ------------------------------------------------- shared (head axis 1) parameters

SHARABLE = [
    ("shaw", "rel_k"), ("t5", "bias"), ("m2", "rel"), ("m4", "rel_k"), ("m4m", "rel_k"),
    ("deberta", "pos_key"), ("deberta_log", "pos_query"), ("tupe_r", "pos_q"),
    ("tupe_r", "pos_k"), ("tupe_r", "bias"), ("tupe_r", "theta"), ("diet_abs_seg3", "pos_q"),
    ("diet_abs_seg3", "pos_k"), ("diet_abs_seg3", "segment_table"), ("diet_rel_seg3", "rel"),
    ("diet_rel_seg3", "segment_table"), ("bert_ad", "pos_q"), ("bert_ad", "pos_k"),
]


@pytest.mark.parametrize("case,param", SHARABLE)
def test_shared_parameter_is_the_tiled_one(case, param, rng):
    method, args, kwargs = _build(case, rng)
    shared = np.ascontiguousarray(_bound(method, args, kwargs)[param][:1])
    tiled = np.repeat(shared, H, axis=0)
    shared_call = _replace(method, args, kwargs, **{param: shared})
    tiled_call = _replace(method, args, kwargs, **{param: tiled})
    np.testing.assert_allclose(_forward(method)(*shared_call[0], **shared_call[1]),
                               _forward(method)(*tiled_call[0], **tiled_call[1]),
                               rtol=1e-13, atol=1e-13)
    G = _normal(rng, *_logits_shape(method, args, kwargs))
    shared_grads = _backward(method)(G, *shared_call[0], **shared_call[1])
    tiled_grads = _backward(method)(G, *tiled_call[0], **tiled_call[1])
    for field in shared_grads._fields:
        got, want = getattr(shared_grads, field), getattr(tiled_grads, field)
        if field == param:
            assert got.shape == shared.shape
            want = want.sum(axis=0, keepdims=True)
        if want is None:
            assert got is None
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=field)


# ------------------------------------------------------ dtypes, strides, out

@pytest.mark.parametrize("case", CASES)
def test_float32_in_float32_out(case, rng):
    method, args, kwargs = _build(case, rng)
    floats = _float_arrays(method, args, kwargs)
    args32, kwargs32 = _replace(method, args, kwargs,
                                **{name: a.astype(np.float32) for name, a in floats.items()})
    # The same float32-representable values in float64: the float32 result is
    # the float64 one rounded once (accumulation in float64).
    args64, kwargs64 = _replace(method, args, kwargs, **{
        name: a.astype(np.float32).astype(np.float64) for name, a in floats.items()})
    result = _forward(method)(*args32, **kwargs32)
    assert result.dtype == np.float32 and result.flags.c_contiguous
    np.testing.assert_array_equal(result,
                                  _forward(method)(*args64, **kwargs64).astype(np.float32))
    G = _normal(rng, *result.shape)
    grads = _backward(method)(G.astype(np.float32), *args32, **kwargs32)
    grads64 = _backward(method)(G.astype(np.float32).astype(np.float64), *args64, **kwargs64)
    for field in grads._fields:
        got = getattr(grads, field)
        if got is None:
            assert field not in floats
            continue
        assert got.dtype == np.float32 and got.shape == floats[field].shape
        np.testing.assert_array_equal(got, getattr(grads64, field).astype(np.float32))


def _strided(array):
    """The same values in a non-C-contiguous layout: q (B, H, n, d) as the
    transposed view of a (B, n, H, d) buffer, as in a fused QKV projection;
    other arrays as every-other-element views of a buffer twice as large."""
    if array.ndim == 4:
        return np.ascontiguousarray(array.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    buffer = np.full(tuple(2 * size for size in array.shape), np.nan, dtype=array.dtype)
    every_other = tuple(slice(None, None, 2) for _ in array.shape)
    buffer[every_other] = array
    return buffer[every_other]


@pytest.mark.parametrize("case", CASES)
def test_non_contiguous_inputs(case, rng):
    method, args, kwargs = _build(case, rng)
    floats = _float_arrays(method, args, kwargs)
    views = {name: _strided(a) for name, a in floats.items()}
    assert all(not v.flags.c_contiguous for v in views.values() if v.size > 1)
    strided_args, strided_kwargs = _replace(method, args, kwargs, **views)
    result = _forward(method)(*strided_args, **strided_kwargs)
    assert result.flags.c_contiguous
    np.testing.assert_allclose(result, _forward(method)(*args, **kwargs), rtol=1e-13, atol=1e-13)
    G = _strided(_normal(rng, *result.shape))
    grads = _backward(method)(G, *strided_args, **strided_kwargs)
    want = _backward(method)(np.ascontiguousarray(G), *args, **kwargs)
    for field in grads._fields:
        if getattr(want, field) is not None:
            assert getattr(grads, field).flags.c_contiguous
            np.testing.assert_allclose(getattr(grads, field), getattr(want, field),
                                       rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("case", CASES)
def test_out_is_written_and_returned(case, rng):
    method, args, kwargs = _build(case, rng)
    out = np.full(_logits_shape(method, args, kwargs), np.nan)
    returned = _forward(method)(*args, **kwargs, out=out)
    assert returned is out
    np.testing.assert_array_equal(out, _forward(method)(*args, **kwargs))


@pytest.mark.parametrize("case", CASES)
def test_inputs_are_not_modified(case, rng):
    method, args, kwargs = _build(case, rng)
    before = {name: np.copy(v) for name, v in _bound(method, args, kwargs).items()
              if isinstance(v, np.ndarray)}
    G = _normal(rng, *_logits_shape(method, args, kwargs))
    G_before = G.copy()
    _forward(method)(*args, **kwargs)
    _backward(method)(G, *args, **kwargs)
    for name, value in _bound(method, args, kwargs).items():
        if name in before:
            np.testing.assert_array_equal(value, before[name], err_msg=name)
    np.testing.assert_array_equal(G, G_before)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("zero", ["b", "h", "n", "m"])
def test_zero_sizes(case, zero, rng):
    if case == "absolute_input" and zero == "m":
        zero = "n"                       # square: m is n
    sizes = {"b": B, "h": H, "n": N, "m": M, zero: 0}
    method, args, kwargs = _build(case, rng, **sizes)
    shape = _logits_shape(method, args, kwargs)
    assert 0 in shape
    result = _forward(method)(*args, **kwargs)
    assert result.shape == shape and result.dtype == np.float64
    grads = _backward(method)(np.zeros(shape), *args, **kwargs)
    for name, value in _float_arrays(method, args, kwargs).items():
        grad = getattr(grads, name)
        assert grad.shape == value.shape, name
        np.testing.assert_array_equal(grad, 0.0, err_msg=name)


@pytest.mark.parametrize("case", ["content", "shaw", "m4", "m4m", "deberta", "bert_ad", "m2"])
def test_d_zero_gives_zero_logits(case, rng):
    method, args, kwargs = _build(case, rng, d=0)
    result = _forward(method)(*args, **kwargs)
    assert result.shape == (B, H, N, M)
    np.testing.assert_array_equal(result, 0.0)


def test_d_zero_keeps_the_positional_terms(rng):
    _, args, kwargs = _build("diet_abs_seg3", rng, d=0)
    _, _, pos_q, pos_k = args
    result = ref.diet_abs(*args, **kwargs)
    no_content = ref.diet_abs(np.zeros((B, H, N, 1)), np.zeros((B, H, M, 1)), pos_q, pos_k,
                              **kwargs)
    np.testing.assert_allclose(result, no_content, rtol=1e-15)


@pytest.mark.parametrize("case", CASES)
def test_gradient_fields(case, rng):
    method, args, kwargs = _build(case, rng)
    G = _normal(rng, *_logits_shape(method, args, kwargs))
    grads = _backward(method)(G, *args, **kwargs)
    assert type(grads) is _registry.GRAD_TYPES[method]
    bound = _bound(method, args, kwargs)
    for field in grads._fields:
        if bound.get(field) is None:
            assert getattr(grads, field) is None, field
        else:
            assert getattr(grads, field).shape == bound[field].shape, field


def test_signatures_match_the_checkers():
    for method, checker in _checks.CHECKERS.items():
        assert inspect.signature(getattr(ref, method)) == inspect.signature(checker)
        params = list(inspect.signature(getattr(ref, method + "_backward")).parameters)
        assert params == ["G"] + [p for p in inspect.signature(checker).parameters if p != "out"]
    assert list(inspect.signature(ref.absolute_input).parameters) == [
        "x", "p", "w_q", "w_k", "scale", "out"]
    assert list(inspect.signature(ref.bert_ad).parameters) == [
        "q", "k", "pos_q", "pos_k", "scale", "out"]


# ------------------------------------------------------ hand-worked cases
# B = H = 1 unless said; vectors of d = 1 are written as plain numbers.

def _col(*values):
    """(1, 1, n, 1) from n numbers: a (B, H, n, d = 1) q or k."""
    return np.array(values, dtype=np.float64).reshape(1, 1, -1, 1)


def _mat(rows):
    """(1, 1, n, m) from a list of rows."""
    return np.array(rows, dtype=np.float64)[None, None]


def test_hand_content():
    # d = 2, s = 2.  q = (1,2), (0,1), (3,-1);  k = (1,0), (2,1), (-1,1)
    # q0.k = 1, 4, 1;  q1.k = 0, 1, 1;  q2.k = 3, 5, -4;  times 2
    q = np.array([[1, 2], [0, 1], [3, -1]], dtype=np.float64)[None, None]
    k = np.array([[1, 0], [2, 1], [-1, 1]], dtype=np.float64)[None, None]
    np.testing.assert_array_equal(ref.content(q, k, scale=2.0),
                                  _mat([[2, 8, 2], [0, 2, 2], [6, 10, -8]]))
    # default s = 1/sqrt(d) = 1/2 for d = 4: (1,1,1,1).(1,2,3,4) = 10 -> 5
    q4 = np.ones((1, 1, 1, 4))
    k4 = np.arange(1.0, 5.0).reshape(1, 1, 1, 4)
    np.testing.assert_array_equal(ref.content(q4, k4), [[[[5.0]]]])


def test_hand_shaw():
    # t = 1: rel_k rows for offsets j - i = -1, 0, +1 are 10, 20, 30.
    # c = clip(j - i, -1, 1) + 1 = [[1,2,2],[0,1,2],[0,0,1]]
    # -> a = [[20,30,30],[10,20,30],[10,10,20]];  k = 1, -1, 2
    # i=0, q=1: 1*(1+20, -1+30, 2+30) = 21, 29, 32
    # i=1, q=2: 2*(1+10, -1+20, 2+30) = 22, 38, 64
    # i=2, q=3: 3*(1+10, -1+10, 2+20) = 33, 27, 66
    q, k = _col(1, 2, 3), _col(1, -1, 2)
    rel_k = np.array([10.0, 20.0, 30.0]).reshape(1, 3, 1)
    np.testing.assert_array_equal(ref.shaw(q, k, rel_k, max_distance=1, scale=1.0),
                                  _mat([[21, 29, 32], [22, 38, 64], [33, 27, 66]]))
    # Backward with G = 1: d rel_k[r] = sum of q_i over the pairs with c = r:
    # r=0: (1,0),(2,0),(2,1) -> 2+3+3 = 8;  r=1: diagonal -> 1+2+3 = 6;
    # r=2: (0,1),(0,2),(1,2) -> 1+1+2 = 4.
    # d q_i = sum_j (k_j + a_ij) = 21+29+32, 11+19+32, 11+9+22 = 82, 62, 42
    # d k_j = sum_i q_i = 6
    grads = ref.shaw_backward(np.ones((1, 1, 3, 3)), q, k, rel_k, max_distance=1, scale=1.0)
    np.testing.assert_array_equal(grads.rel_k.reshape(-1), [8, 6, 4])
    np.testing.assert_array_equal(grads.q.reshape(-1), [82, 62, 42])
    np.testing.assert_array_equal(grads.k.reshape(-1), [6, 6, 6])


def test_hand_t5():
    # num_buckets = 4, bidirectional, max_distance = 2: half = 2, max_exact = 1,
    # offset 0 -> 0; offset < 0 -> bucket 1 (|o| >= 1 saturates at half - 1);
    # offset > 0 -> 2 + 1 = 3.  bias = 100, 200, 300, 400.
    # bias grid [[100,400,400],[200,100,400],[200,200,100]] + q_i k_j (k = 1)
    q, k = _col(1, 2, 3), _col(1, 1, 1)
    bias = np.array([[100.0, 200.0, 300.0, 400.0]])
    np.testing.assert_array_equal(
        ref.t5(q, k, bias, num_buckets=4, max_distance=2),
        _mat([[101, 401, 401], [202, 102, 402], [203, 203, 103]]))
    # Unidirectional, num_buckets = 4, max_distance = 8: half = 4, max_exact = 2,
    # distance = max(i - j, 0); 0 -> 0, 1 -> 1, 2 -> 2 + trunc(log(1)...) = 2.
    # bias = 1, 2, 3, 4 and q = 0:  [[1,1,1],[2,1,1],[3,2,1]]
    bias = np.array([[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_array_equal(
        ref.t5(_col(0, 0, 0), k, bias, num_buckets=4, max_distance=8, bidirectional=False),
        _mat([[1, 1, 1], [2, 1, 1], [3, 2, 1]]))
    # Log buckets: num_buckets = 8, max_distance = 16: half = 4, max_exact = 2,
    # r >= 2 -> min(2 + trunc(log(r/2) / log(8) * 2), 3), + 4 for j > i:
    # r=2: 2;  r=3: log 1.5/log 8*2 = 0.39 -> 2;  r=4: 0.67 -> 2;  r=5: 0.88 -> 2;
    # r=6: log 3/log 8*2 = 1.06 -> 3;  r=7: 1.20 -> 3.
    # Row i = 0, j = 0..7: buckets 0, 5, 6, 6, 6, 6, 7, 7;  bias[b] = 10 b.
    bias = 10.0 * np.arange(8.0)[None]
    np.testing.assert_array_equal(
        ref.t5(np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 8, 1)), bias, num_buckets=8,
               max_distance=16),
        _mat([[0, 50, 60, 60, 60, 60, 70, 70]]))


def test_hand_m2():
    # t = 1, rel = 2, 3, 5 for offsets -1, 0, +1; rows c as in Shaw:
    # r = [[3,5,5],[2,3,5],[2,2,3]];  q_i k_j = [[1,-1,2],[2,-2,4],[3,-3,6]]
    # product: [[3,-5,10],[4,-6,20],[6,-6,18]]
    q, k = _col(1, 2, 3), _col(1, -1, 2)
    rel = np.array([[2.0, 3.0, 5.0]])
    np.testing.assert_array_equal(ref.m2(q, k, rel, max_distance=1, scale=1.0),
                                  _mat([[3, -5, 10], [4, -6, 20], [6, -6, 18]]))


def test_hand_m4():
    # A = q k + (q + k) a, a = [[20,30,30],[10,20,30],[10,10,20]] as in Shaw.
    # i=0 (q=1): qk = 1,-1,2; q+k = 2,0,3; (q+k)a = 40,0,90   -> 41,-1,92
    # i=1 (q=2): qk = 2,-2,4; q+k = 3,1,4; (q+k)a = 30,20,120 -> 32,18,124
    # i=2 (q=3): qk = 3,-3,6; q+k = 4,2,5; (q+k)a = 40,20,100 -> 43,17,106
    q, k = _col(1, 2, 3), _col(1, -1, 2)
    rel_k = np.array([10.0, 20.0, 30.0]).reshape(1, 3, 1)
    np.testing.assert_array_equal(ref.m4(q, k, rel_k, max_distance=1, scale=1.0),
                                  _mat([[41, -1, 92], [32, 18, 124], [43, 17, 106]]))


def test_hand_m4m():
    # d = 2, t = 1: rel_k rows (offset -1, 0, +1) = (1,0), (0,1), (1,1).
    # q0 = (1,2), q1 = (2,-1);  k0 = (1,1), k1 = (0,3).
    # (0,0): o=0,  a=(0,1): qk=3,  qa=2,  ka=1 -> 6
    # (0,1): o=+1, a=(1,1): qk=6,  qa=3,  ka=3 -> 54
    # (1,0): o=-1, a=(1,0): qk=1,  qa=2,  ka=1 -> 2
    # (1,1): o=0,  a=(0,1): qk=-3, qa=-1, ka=3 -> 9
    q = np.array([[1, 2], [2, -1]], dtype=np.float64)[None, None]
    k = np.array([[1, 1], [0, 3]], dtype=np.float64)[None, None]
    rel_k = np.array([[[1, 0], [0, 1], [1, 1]]], dtype=np.float64)
    np.testing.assert_array_equal(ref.m4m(q, k, rel_k, max_distance=1, scale=1.0),
                                  _mat([[6, 54], [2, 9]]))
    # default s = 1/sqrt(d) = 1/sqrt(2)
    np.testing.assert_allclose(ref.m4m(q, k, rel_k, max_distance=1),
                               _mat([[6, 54], [2, 9]]) / np.sqrt(2), rtol=1e-15)


def test_hand_deberta():
    # att_span = 2: p = clip(i - j + 2, 0, 3) = [[2,1,0],[3,2,1],[3,3,2]]
    # pos_key = 1,2,3,4 -> PK[p] = [[3,2,1],[4,3,2],[4,4,3]]
    # pos_query = 10,20,30,40 -> PQ[p] = [[30,20,10],[40,30,20],[40,40,30]]
    # q = 1,2,3;  k = 1,0,-1.  A = q k + q PK[p] + k PQ[p]:
    # i=0: (1,0,-1) + (3,2,1)   + (30,0,-10) = 34, 2, -10
    # i=1: (2,0,-2) + (8,6,4)   + (40,0,-20) = 50, 6, -18
    # i=2: (3,0,-3) + (12,12,9) + (40,0,-30) = 55, 12, -24
    q, k = _col(1, 2, 3), _col(1, 0, -1)
    pos_key = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1)
    pos_query = np.array([10.0, 20.0, 30.0, 40.0]).reshape(1, 4, 1)
    np.testing.assert_array_equal(
        ref.deberta(q, k, pos_key, pos_query, att_span=2, scale=1.0),
        _mat([[34, 2, -10], [50, 6, -18], [55, 12, -24]]))
    # default s = 1/sqrt(3d) = 1/sqrt(3)
    np.testing.assert_allclose(
        ref.deberta(q, k, pos_key, pos_query, att_span=2),
        _mat([[34, 2, -10], [50, 6, -18], [55, 12, -24]]) / np.sqrt(3), rtol=1e-15)


def test_hand_deberta_log_buckets():
    # position_buckets = 4 (mid = 2), max_relative_positions = 8, att_span = 4.
    # |delta| <= 2 kept; else sign * (ceil(log(|delta|/2) / log(7/2) * 1) + 2):
    # 3: log 1.5/log 3.5 = 0.32 -> 3;  4: 0.55 -> 3;  5: 0.73 -> 3;  6: 0.88 -> 3;
    # 7: 1 -> 3;  8: log 4/log 3.5 = 1.11 -> 4.
    # Row i = 0, j = 0..8: delta = -j -> 0,-1,-2,-3,-3,-3,-3,-3,-4; + 4 ->
    # rows 4,3,2,1,1,1,1,1,0.  q = 1, k = 0, pos_key[r] = 10 r:
    pos_key = 10.0 * np.arange(8.0).reshape(1, 8, 1)
    pos_query = np.zeros((1, 8, 1))
    kwargs = dict(att_span=4, position_buckets=4, max_relative_positions=8, scale=1.0)
    np.testing.assert_array_equal(
        ref.deberta(np.ones((1, 1, 1, 1)), np.zeros((1, 1, 9, 1)), pos_key, pos_query, **kwargs),
        _mat([[40, 30, 20, 10, 10, 10, 10, 10, 0]]))
    # Column j = 0, i = 0..8: delta = i -> rows 4,5,6,7,7,7,7,7, 8 clipped to 7.
    np.testing.assert_array_equal(
        ref.deberta(np.ones((1, 1, 9, 1)), np.zeros((1, 1, 1, 1)), pos_key, pos_query,
                    **kwargs).reshape(-1),
        [40, 50, 60, 70, 70, 70, 70, 70, 70])


def test_hand_tupe():
    # q = 1,2,3; k = 1,1,1 -> q_i k_j rows 1, 2, 3.  pos_q = 1,2,3; pos_k = 1,10,100:
    # v0 = pos_q_i pos_k_j = [[1,10,100],[2,20,200],[3,30,300]]
    q, k = _col(1, 2, 3), _col(1, 1, 1)
    pos_q = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1)
    pos_k = np.array([1.0, 10.0, 100.0]).reshape(1, 3, 1)
    # TUPE-A: A = qk + v0 = [[2,11,101],[4,22,202],[6,33,303]]
    np.testing.assert_array_equal(ref.tupe(q, k, pos_q, pos_k, scale=1.0),
                                  _mat([[2, 11, 101], [4, 22, 202], [6, 33, 303]]))
    # TUPE-R: num_buckets = 4, max_distance = 2 (o=0 -> 0, o<0 -> 1, o>0 -> 3),
    # bias = 1000, 2000, 0, 3000 -> [[1000,3000,3000],[2000,1000,3000],[2000,2000,1000]]
    # v = [[1001,3010,3100],[2002,1020,3200],[2003,2030,1300]]
    # theta = (-7, -9): row 0 -> -7; column 0 of rows 1, 2 -> -9
    # reset(v) = [[-7,-7,-7],[-9,1020,3200],[-9,2030,1300]];  + qk:
    bias = np.array([[1000.0, 2000.0, 0.0, 3000.0]])
    theta = np.array([[-7.0, -9.0]])
    kwargs = dict(bias=bias, theta=theta, num_buckets=4, max_distance=2, scale=1.0)
    np.testing.assert_array_equal(ref.tupe(q, k, pos_q, pos_k, **kwargs),
                                  _mat([[-6, -6, -6], [-7, 1022, 3202], [-6, 2033, 1303]]))
    # Backward, G = 1.  theta: 3 entries of row 0, 2 of column 0 below it -> (3, 2).
    # Kept pairs: (1,1),(1,2),(2,1),(2,2).  d pos_q_i = sum of kept pos_k_j:
    # 0, 10+100, 10+100;  d pos_k_j = sum of kept pos_q_i: 0, 2+3, 2+3;
    # d bias: (1,1),(2,2) -> bucket 0; (1,2) -> 3; (2,1) -> 1  => 2, 1, 0, 1.
    grads = ref.tupe_backward(np.ones((1, 1, 3, 3)), q, k, pos_q, pos_k, **kwargs)
    np.testing.assert_array_equal(grads.theta, [[3, 2]])
    np.testing.assert_array_equal(grads.pos_q.reshape(-1), [0, 110, 110])
    np.testing.assert_array_equal(grads.pos_k.reshape(-1), [0, 5, 5])
    np.testing.assert_array_equal(grads.bias, [[2, 1, 0, 1]])
    # default s = 1/sqrt(2d) = 1/2 for d = 2, on both terms:
    # q.k = (1,1).(2,2) = 4 -> 2;  pos_q.pos_k = 2*3 = 6 -> 3;  A = 5
    np.testing.assert_array_equal(
        ref.tupe(np.ones((1, 1, 1, 2)), np.full((1, 1, 1, 2), 2.0), np.full((1, 1, 1), 2.0),
                 np.full((1, 1, 1), 3.0)),
        [[[[5.0]]]])


def test_hand_diet_abs():
    # q = 1,2,3; k = 1,1,1 -> qk rows 1, 2, 3 (s = 1).
    # pos_q = 1,0,2; pos_k = 1,2,3 -> [[1,2,3],[0,0,0],[2,4,6]]
    # segment_q = 0,0,1; segment_k = 0,1,1; table [[10,20],[30,40]]
    # E = [[10,20,20],[10,20,20],[30,40,40]]
    # A: i=0: 1+1+10, 1+2+20, 1+3+20 = 12, 23, 24
    #    i=1: 2+0+10, 2+0+20, 2+0+20 = 12, 22, 22
    #    i=2: 3+2+30, 3+4+40, 3+6+40 = 35, 47, 49
    q, k = _col(1, 2, 3), _col(1, 1, 1)
    pos_q = np.array([1.0, 0.0, 2.0]).reshape(1, 3, 1)
    pos_k = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1)
    segments = dict(segment_q=np.array([[0, 0, 1]]), segment_k=np.array([[0, 1, 1]]),
                    segment_table=np.array([[[10.0, 20.0], [30.0, 40.0]]]))
    np.testing.assert_array_equal(ref.diet_abs(q, k, pos_q, pos_k, scale=1.0, **segments),
                                  _mat([[12, 23, 24], [12, 22, 22], [35, 47, 49]]))
    # Backward, G = 1: each table cell gets the count of pairs mapped to it:
    # (0,0): rows 0,1 x column 0 -> 2;  (0,1): rows 0,1 x columns 1,2 -> 4;
    # (1,0): 1;  (1,1): 2.
    grads = ref.diet_abs_backward(np.ones((1, 1, 3, 3)), q, k, pos_q, pos_k, scale=1.0,
                                  **segments)
    np.testing.assert_array_equal(grads.segment_table, [[[2, 4], [1, 2]]])
    # default s = 1/sqrt(d) = 1/2 for d = 4 on q.k = 4 -> 2; positional term
    # unscaled: 3 * 5 = 15;  A = 17
    np.testing.assert_array_equal(
        ref.diet_abs(np.ones((1, 1, 1, 4)), np.ones((1, 1, 1, 4)), np.full((1, 1, 1), 3.0),
                     np.full((1, 1, 1), 5.0)),
        [[[[17.0]]]])


def test_hand_diet_rel():
    # t = 1, rel = 100, 200, 300 at clip(i - j, -1, 1) + 1 (query minus key):
    # rows [[1,0,0],[2,1,0],[2,2,1]] -> [[200,100,100],[300,200,100],[300,300,200]]
    # (the transpose of Shaw's layout).  + q_i k_j with k = 1: rows 1, 2, 3.
    q, k = _col(1, 2, 3), _col(1, 1, 1)
    rel = np.array([[100.0, 200.0, 300.0]])
    np.testing.assert_array_equal(ref.diet_rel(q, k, rel, max_distance=1, scale=1.0),
                                  _mat([[201, 101, 101], [302, 202, 102], [303, 303, 203]]))
    # Segments per batch row, B = 2, q = 0, t = 0 with rel = 0:
    # table [[1,2],[3,4]].  b=0: segment_q = 0,1,1; segment_k = 0,0,1
    #   i=0 (0): 1,1,2;  i=1 (1): 3,3,4;  i=2 (1): 3,3,4
    # b=1: segment_q = 1,0,0; segment_k = 1,1,1
    #   i=0 (1): 4,4,4;  i=1 (0): 2,2,2;  i=2 (0): 2,2,2
    zeros = np.zeros((2, 1, 3, 1))
    result = ref.diet_rel(zeros, zeros, np.zeros((1, 1)), max_distance=0,
                          segment_q=np.array([[0, 1, 1], [1, 0, 0]], dtype=np.int8),
                          segment_k=np.array([[0, 0, 1], [1, 1, 1]], dtype=np.uint16),
                          segment_table=np.array([[[1.0, 2.0], [3.0, 4.0]]]))
    np.testing.assert_array_equal(result[:, 0], [[[1, 1, 2], [3, 3, 4], [3, 3, 4]],
                                                 [[4, 4, 4], [2, 2, 2], [2, 2, 2]]])


def test_hand_bert_ad():
    # d = 1, default s = 1/sqrt(4d) = 1/2.  q = 1,2; pos_q = 10,20; k = 3,4; pos_k = 100,200
    # q.k = [[3,4],[6,8]];  q.pos_k = [[100,200],[200,400]];
    # pos_q.k = [[30,40],[60,80]];  pos_q.pos_k = [[1000,2000],[2000,4000]]
    # sum = [[1133,2244],[2266,4488]];  halved:
    q, k = _col(1, 2), _col(3, 4)
    pos_q = np.array([10.0, 20.0]).reshape(1, 2, 1)
    pos_k = np.array([100.0, 200.0]).reshape(1, 2, 1)
    np.testing.assert_array_equal(ref.bert_ad(q, k, pos_q, pos_k),
                                  _mat([[566.5, 1122], [1133, 2244]]))


def test_hand_absolute_input():
    # B = H = 1, n = D = 2, d = 1, default s = 1/sqrt(1) = 1.
    # x + p = [[1,0],[0,1]] + [[1,1],[0,0]] = [[2,1],[0,1]]
    # W_Q = (1, 2)^T -> Q = 2+2, 0+2 = 4, 2;  W_K = (1, -1)^T -> K = 2-1, 0-1 = 1, -1
    # A = Q K^T = [[4,-4],[2,-2]]
    x = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    p = np.array([[[1.0, 1.0], [0.0, 0.0]]])
    w_q = np.array([[[1.0], [2.0]]])
    w_k = np.array([[[1.0], [-1.0]]])
    np.testing.assert_array_equal(ref.absolute_input(x, p, w_q, w_k), _mat([[4, -4], [2, -2]]))
    # Backward, G = 1: dQ_i = sum_j K_j = 0, dK_j = sum_i Q_i = 6;
    # d(x+p)_n = dQ_n W_Q^T + dK_n W_K^T = 6 (1, -1);  dW_K = sum_n (x+p)_n^T dK_n
    # = 6 ((2,1) + (0,1)) = (12, 12);  dW_Q = 0.
    grads = ref.absolute_input_backward(np.ones((1, 1, 2, 2)), x, p, w_q, w_k)
    np.testing.assert_array_equal(grads.x, [[[6, -6], [6, -6]]])
    np.testing.assert_array_equal(grads.p, grads.x)
    np.testing.assert_array_equal(grads.w_k.reshape(-1), [12, 12])
    np.testing.assert_array_equal(grads.w_q, 0.0)


# ---------------------------------------------------------------- errors
# (method, exception, builder of the bad call from the good float64 arrays)

def _q(b=1, h=2, n=3, d=2, dtype=np.float64):
    return np.zeros((b, h, n, d), dtype=dtype)


ERROR_CASES = [
    ("content", TypeError, lambda: ((_q(dtype=np.int64), _q()), {})),
    ("content", TypeError, lambda: ((_q(dtype=np.float32), _q()), {})),
    ("content", TypeError, lambda: ((_q().tolist(), _q()), {})),
    ("content", ValueError, lambda: ((_q()[0], _q()), {})),
    ("content", ValueError, lambda: ((_q(), _q(d=3)), {})),
    ("content", TypeError, lambda: ((_q(), _q()), {"out": np.zeros((1, 2, 3, 3), np.float32)})),
    ("content", ValueError, lambda: ((_q(), _q()), {"out": np.zeros((1, 2, 3, 3)).T})),
    ("shaw", ValueError, lambda: ((_q(), _q(), np.zeros((2, 4, 2))), {"max_distance": 2})),
    ("shaw", ValueError, lambda: ((_q(), _q(), np.zeros((3, 5, 2))), {"max_distance": 2})),
    ("m2", ValueError, lambda: ((_q(), _q(), np.zeros((1, 5))), {"max_distance": -1})),
    ("m4", TypeError, lambda: ((_q(), _q(), np.zeros((1, 5, 2), np.float32)),
                               {"max_distance": 2})),
    ("t5", ValueError, lambda: ((_q(), _q(), np.zeros((1, 3))), {"num_buckets": 3})),
    ("deberta", ValueError, lambda: ((_q(), _q(), np.zeros((1, 4, 2)), np.zeros((1, 4, 2))),
                                     {"att_span": 0})),
    ("tupe", ValueError, lambda: ((_q(), _q(), np.zeros((1, 3, 1)), np.zeros((1, 3, 1))),
                                  {"theta": np.zeros((1, 3))})),
    ("diet_abs", ValueError, lambda: ((_q(), _q(), np.zeros((1, 3, 1)), np.zeros((1, 3, 1))),
                                      {"segment_q": np.zeros((1, 3), np.int64)})),
    ("diet_rel", ValueError, lambda: ((_q(), _q(), np.zeros((1, 3))), {
        "max_distance": 1, "segment_q": np.full((1, 3), 2), "segment_k": np.zeros((1, 3), int),
        "segment_table": np.zeros((1, 2, 2))})),
    ("diet_rel", TypeError, lambda: ((_q(), _q(), np.zeros((1, 3))), {
        "max_distance": 1, "segment_q": np.zeros((1, 3)), "segment_k": np.zeros((1, 3), int),
        "segment_table": np.zeros((1, 2, 2))})),
]

BASELINE_ERROR_CASES = [
    ("bert_ad", TypeError, lambda: ((_q(), _q(), np.zeros((1, 3, 2), np.float32),
                                     np.zeros((1, 3, 2))), {})),
    ("bert_ad", ValueError, lambda: ((_q(), _q(), np.zeros((1, 3, 3)), np.zeros((1, 3, 2))),
                                     {})),
    ("bert_ad", ValueError, lambda: ((_q(), _q(), np.zeros((3, 3, 2)), np.zeros((1, 3, 2))),
                                     {})),
    ("absolute_input", TypeError, lambda: ((np.zeros((1, 3, 4), int), np.zeros((1, 3, 4)),
                                            np.zeros((2, 4, 2)), np.zeros((2, 4, 2))), {})),
    ("absolute_input", ValueError, lambda: ((np.zeros((1, 3, 4)), np.zeros((3, 4)),
                                             np.zeros((2, 4, 2)), np.zeros((2, 4, 2))), {})),
    ("absolute_input", ValueError, lambda: ((np.zeros((1, 3, 4)), np.zeros((1, 3, 4)),
                                             np.zeros((2, 5, 2)), np.zeros((2, 4, 2))), {})),
    ("absolute_input", ValueError, lambda: ((np.zeros((1, 3, 4)), np.zeros((1, 3, 4)),
                                             np.zeros((2, 4, 2)), np.zeros((1, 4, 2))), {})),
]


@pytest.mark.parametrize("method,error,make", ERROR_CASES)
def test_errors_are_the_checkers(method, error, make):
    args, kwargs = make()
    with pytest.raises(error) as from_checker:
        _checks.CHECKERS[method](*args, **kwargs)
    with pytest.raises(error) as from_reference:
        _forward(method)(*args, **kwargs)
    assert str(from_reference.value) == str(from_checker.value)
    if "out" not in kwargs:              # backward has no out=
        with pytest.raises(error):
            _backward(method)(np.zeros((1, 2, 3, 3)), *args, **kwargs)


@pytest.mark.parametrize("method,error,make", BASELINE_ERROR_CASES)
def test_baseline_errors(method, error, make):
    args, kwargs = make()
    with pytest.raises(error, match=r"pos_q|pos_k|x|p|w_q|w_k"):
        _forward(method)(*args, **kwargs)
    with pytest.raises(error):
        _backward(method)(np.zeros((1, 2, 3, 3)), *args, **kwargs)


def test_bad_gradient_is_rejected():
    q = _q()
    with pytest.raises(ValueError, match="G"):
        ref.content_backward(np.zeros((1, 2, 3, 4)), q, q)
    with pytest.raises(TypeError, match="G"):
        ref.content_backward(np.zeros((1, 2, 3, 3), np.float32), q, q)
    with pytest.raises(TypeError, match="out"):
        ref.content_backward(np.zeros((1, 2, 3, 3)), q, q, out=np.zeros((1, 2, 3, 3)))
