"""The fused attention's C kernels (SPEC §6: posenc.<m>_attention and
<m>_attention_backward) against posenc.reference, every method with every
ISA of this CPU forced (posenc's pytest plugin: posenc_isa; NEON runs under
qemu in tests/c), float64 and float32: awkward sizes (n != m, dv != d), causal
with n < m and n > m, padding with fully masked rows, query_offset (a
one-query step is the last row of the full causal pass), dropout (the
reference applies the exported keep mask), 1 and 2 threads bitwise,
non-contiguous q, k, v.

Tolerances, normwise, relative to the reference's norm (or to entries of
size 1 where the reference nearly vanishes: a segment gradient through rows
that sum to 0): float32 (n + m + d + dv + 8) eps32 (1 + max|A|), the logits'
rounding (depth d, magnified by exp in proportion to the logits' size) plus
the sums over keys and queries; float64 the same in eps64, at least 1e-12
(past it only over thousands of keys: CoPE's positions sum a row's gates).
"""

import numpy as np
import pytest

import posenc
from posenc import _C, reference
from posenc._examples import float_inputs, key_count, make_inputs, query_rows, with_inputs
from posenc._registry import METHODS, REGISTRY

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)


def _inputs(method, n, m, d, dv, rng, *, dtype=np.float64, B=2, H=3):
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=dtype, rng=rng)
    return args, kwargs, rng.standard_normal((B, H, m, dv)).astype(dtype)


def _forward(namespace, method, args, kwargs, v, **attention):
    return getattr(namespace, method + "_attention")(args[0], args[1], v, *args[2:], **kwargs,
                                                     **attention)


def _backward(namespace, method, d_out, args, kwargs, v, saved, **attention):
    return getattr(namespace, method + "_attention_backward")(
        d_out, args[0], args[1], v, *args[2:], *saved, **kwargs, **attention)


def _wide(method, args, kwargs, v):
    """The call's float inputs in float64 (the reference's exact view of them)."""
    floats = float_inputs(method, args, kwargs)
    a64, k64 = with_inputs(method, args, kwargs, {k: x.astype(np.float64) for k, x in floats.items()})
    return a64, k64, v.astype(np.float64)


def _assert_close(got, want, tol, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite]), f"{what}: non-finite entries differ"
    assert np.isfinite(got[finite]).all(), f"{what}: NaN or inf where the reference is finite"
    error = np.linalg.norm(got[finite] - want[finite])
    scale = max(np.linalg.norm(want[finite]), np.sqrt(finite.sum()))
    assert error <= tol * scale, f"{what}: normwise error {error / scale:.3g} > {tol:.3g}"


def assert_attention_matches_reference(method, args, kwargs, v, rng, *, backward=True, d_lse=None,
                                       **attention):
    """posenc == reference: out, lse and (backward) every gradient (q, k, v, the method's),
    given d_out (drawn from rng) and d_lse = dL/dlse (None: lse unused)."""
    dtype = args[0].dtype
    B, H, n, d = args[0].shape
    m, dv = v.shape[2], v.shape[3]
    a64, k64, v64 = _wide(method, args, kwargs, v)
    logits = getattr(reference, method)(*a64, **k64, query_offset=attention.get("query_offset", 0))
    eps = EPS64 if dtype == np.float64 else EPS32
    tol = (n + m + d + dv + 8) * eps * (1 + np.abs(logits).max(initial=0))
    if dtype == np.float64:
        tol = max(tol, 1e-12)
    wide = dict(attention)             # the reference on the float64 view of every float input
    if wide.get("sinks") is not None:
        wide["sinks"] = wide["sinks"].astype(np.float64)
    got = _forward(posenc, method, args, kwargs, v, **attention)
    want = _forward(reference, method, a64, k64, v64, **wide)
    assert isinstance(got, posenc.Attention)
    assert got.out.dtype == dtype and got.out.shape == (B, H, n, dv) and got.out.flags.c_contiguous
    assert got.lse.dtype == dtype and got.lse.shape == (B, H, n)
    _assert_close(got.out, want.out, tol, f"{method} out")
    _assert_close(got.lse, want.lse, tol, f"{method} lse")
    if not backward:
        return got, None
    d_out = rng.standard_normal(got.out.shape)
    grads = _backward(posenc, method, d_out.astype(dtype), args, kwargs, v, got, d_lse=d_lse,
                      **attention)
    want_grads = _backward(reference, method, d_out, a64, k64, v64, want,
                           d_lse=None if d_lse is None else d_lse.astype(np.float64), **wide)
    assert type(grads).__name__ == type(want_grads).__name__
    inputs = dict(float_inputs(method, args, kwargs), v=v, sinks=attention.get("sinks"))
    for field in want_grads._fields:
        g, w = getattr(grads, field), getattr(want_grads, field)
        assert (g is None) == (w is None), field
        if g is not None:
            assert g.dtype == dtype and g.shape == inputs[field].shape, field
            _assert_close(g, w, tol, f"{method} d{field}")
    return got, grads


def _padding(B, m, *, fully_masked_row=1):
    mask = np.zeros((B, m), dtype=bool)
    mask[:, (2 * m) // 3 + 1:] = True
    if fully_masked_row is not None:
        mask[fully_masked_row] = True
    return mask


# ------------------------------------------ every method, ISA and dtype

CASES = [  # n, m, d, dv, attention keywords
    (7, 17, 3, 5, {}),
    (17, 7, 7, 1, {"causal": True}),                              # n > m
    (3, 33, 17, 7, {"causal": True, "query_offset": 5}),          # n < m
    (33, 65, 1, 3, {"key_padding_mask": "padding", "dropout_p": 0.25, "seed": 2**63 + 5}),
    (65, 3, 7, 17, {"causal": True, "key_padding_mask": "padding", "dropout_p": 0.5}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_methods_match_reference(posenc_isa, method, dtype, rng):
    for n, m, d, dv, attention in CASES:
        m = key_count(method, n, m, attention.get("query_offset", 0))
        args, kwargs, v = _inputs(method, n, m, d, dv, rng, dtype=dtype)
        attention = dict(attention)
        if attention.get("key_padding_mask") == "padding":
            attention["key_padding_mask"] = _padding(2, m)
        assert_attention_matches_reference(method, args, kwargs, v, rng, **attention)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1, 3, 7, 17, 33, 65])
def test_content_awkward_sizes(posenc_isa, size, dtype, rng):
    other = {1: 17, 3: 33, 7: 65, 17: 1, 33: 3, 65: 7}[size]
    for n, m, d, dv in ((size, size, size, size), (size, other, 5, 3), (other, size, size, 1),
                        (3, 2, 7, size)):
        for causal in (False, True):
            args, kwargs, v = _inputs("content", n, m, d, dv, rng, dtype=dtype)
            assert_attention_matches_reference("content", args, kwargs, v, rng, causal=causal)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_causal_over_several_row_blocks(posenc_isa, method, dtype, rng):
    """Causal with n past the backward's row block (256 rows in float32, 128 in float64): each
    block and each tile of rows or keys in it computes only the keys it sees, the later blocks
    starting past key 0 of their tiles' rows (dk, dV), with n > m, n < m and query_offset > 0."""
    for n, m, query_offset in ((300, 270, 0), (270, 300, 0), (280, 300, 13), (290, 40, 5)):
        m = key_count(method, n, m, query_offset)
        args, kwargs, v = _inputs(method, n, m, 5, 3, rng, dtype=dtype, B=1, H=2)
        assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                           query_offset=query_offset)


@pytest.mark.parametrize("method", METHODS)
def test_scales_past_one(method, rng):
    """A scale past 1 takes the engine's exact path (every sum unscaled, scaled after)."""
    args, kwargs, v = _inputs(method, 7, 9, 4, 3, rng)
    kwargs["scale"] = 3.0
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True, dropout_p=0.2)


# ------------------------------------------------------------ masks

@pytest.mark.parametrize("method", METHODS)
def test_fully_masked_rows_are_zero_with_zero_gradients(method, rng):
    args, kwargs, v = _inputs(method, 5, 6, 4, 3, rng)
    mask = _padding(2, 6, fully_masked_row=0)
    got, grads = assert_attention_matches_reference(method, args, kwargs, v, rng,
                                                    key_padding_mask=mask, dropout_p=0.2)
    assert np.all(got.out[0] == 0) and np.all(np.isneginf(got.lse[0]))
    assert np.isfinite(got.out).all() and np.isfinite(got.lse[1]).all()
    for name, grad in zip(grads._fields, grads):
        if grad is not None:
            assert not np.isnan(grad).any(), name
    assert np.all(grads.q[0] == 0) and np.all(grads.k[0] == 0) and np.all(grads.v[0] == 0)


def test_fully_masked_rows_ignore_nan_logits(rng):
    """A masked logit never reaches the softmax, even as NaN: its row is 0, its lse -inf."""
    args, kwargs, v = _inputs("content", 3, 4, 2, 3, rng)
    args[1][0, :, 2] = np.nan                    # keys 2 of batch row 0: NaN logits, masked
    mask = np.zeros((2, 4), dtype=bool)
    mask[0, 2] = True
    mask[1] = True
    got = _forward(posenc, "content", args, kwargs, v, key_padding_mask=mask)
    assert np.isfinite(got.out).all() and np.all(got.out[1] == 0)
    assert np.isfinite(got.lse[0]).all() and np.all(np.isneginf(got.lse[1]))


@pytest.mark.parametrize("method", ["content", "t5"])
def test_nan_logit_alone_in_its_row_stays_nan(posenc_isa, method, rng):
    """A row whose only unmasked logit is NaN (causal row 0 with a NaN in q) is
    NaN, out, lse and the gradients through it, as the reference's -- not a
    fully masked row of zeros (the row maximum passes a NaN over).  dq and dv
    have the reference's NaNs exactly; the other gradients a subset of them
    (the reference's dS row is NaN on the keys the row has masked too: its
    softmax row is; the kernel's is 0 there) and dk the NaN of the key the
    row sees."""
    args, kwargs, v = _inputs(method, 5, 5, 4, 3, rng)
    args[0][0, 1, 0, 0] = np.nan
    got = _forward(posenc, method, args, kwargs, v, causal=True)
    want = _forward(reference, method, args, kwargs, v, causal=True)
    for name in ("out", "lse"):
        g, w = getattr(got, name), getattr(want, name)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=name)
        assert np.isnan(w).any(), name
    d_out = rng.standard_normal(got.out.shape)
    grads = _backward(posenc, method, d_out, args, kwargs, v, got, causal=True)
    want_grads = _backward(reference, method, d_out, args, kwargs, v, want, causal=True)
    for field in want_grads._fields:
        g, w = getattr(grads, field), getattr(want_grads, field)
        if w is None:
            continue
        if field in ("q", "v"):
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=field)
        assert not (np.isnan(g) & ~np.isnan(w)).any(), f"{field}: NaN where the reference is finite"
    assert np.isnan(grads.k[0, 1, 0]).any() and np.isnan(grads.q[0, 1, 0]).any()


def test_causal_rows_see_only_their_past(rng):
    """Changing key j changes only the rows that see it: i >= j - query_offset."""
    args, kwargs, v = _inputs("t5", 6, 9, 4, 2, rng)
    before = _forward(posenc, "t5", args, kwargs, v, causal=True, query_offset=3)
    v2 = v.copy()
    v2[:, :, 7] += 1.0
    after = _forward(posenc, "t5", args, kwargs, v2, causal=True, query_offset=3)
    changed = np.any(before.out != after.out, axis=(0, 1, 3))
    np.testing.assert_array_equal(changed, np.arange(6) + 3 >= 7)


# ------------------------------------------------------- query_offset

@pytest.mark.parametrize("method", METHODS)
def test_one_query_step_is_the_last_row_of_the_causal_pass(method, rng):
    n = 9
    args, kwargs, v = _inputs(method, n, n, 4, 3, rng)
    full = _forward(posenc, method, args, kwargs, v, causal=True)
    step_args, step_kwargs = query_rows(method, args, kwargs, slice(n - 1, n))
    step = _forward(posenc, method, step_args, step_kwargs, v, causal=True, query_offset=n - 1)
    np.testing.assert_allclose(step.out, full.out[:, :, -1:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(step.lse, full.lse[:, :, -1:], rtol=1e-12, atol=1e-12)
    # the step's gradients: those of the full pass with d_out on its last row only
    d_out = np.zeros_like(full.out)
    d_out[:, :, -1] = rng.standard_normal(d_out[:, :, -1].shape)
    full_grads = _backward(posenc, method, d_out, args, kwargs, v, full, causal=True)
    step_grads = _backward(posenc, method, d_out[:, :, -1:], step_args, step_kwargs, v, step,
                           causal=True, query_offset=n - 1)
    sliced = {"q"} | set(REGISTRY[method].query_tensors)
    for name in full_grads._fields:
        want, got = getattr(full_grads, name), getattr(step_grads, name)
        if want is None:
            continue
        if name in sliced:
            want = want[:, :, -1:] if name == "q" else want[:, -1:]
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12, err_msg=name)


# ------------------------------------------------------------ dropout

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_is_the_exported_mask(dtype, rng):
    """The kernel drops exactly posenc.attention_dropout_mask's entries, scaled by 1/(1-p)."""
    args, kwargs, v = _inputs("content", 5, 11, 3, 2, rng, dtype=dtype)
    seed, p = 2**40 + 12345, 0.4
    got = _forward(posenc, "content", args, kwargs, v, dropout_p=p, seed=seed)
    plain = _forward(posenc, "content", args, kwargs, v)
    keep = posenc.attention_dropout_mask(seed, (2, 3, 5, 11), p)
    a64, k64, v64 = _wide("content", args, kwargs, v)
    probabilities = np.exp(reference.content(*a64, **k64) - plain.lse[..., None].astype(np.float64))
    want = np.einsum("bhij,bhjd->bhid", probabilities * keep / (1 - p), v64)
    tol = 1e-12 if dtype == np.float64 else 64 * EPS32
    _assert_close(got.out, want, tol, "out")
    np.testing.assert_array_equal(got.lse, plain.lse)     # lse is before the dropout
    assert not np.allclose(got.out, plain.out)
    again = _forward(posenc, "content", args, kwargs, v, dropout_p=p, seed=seed + 1)
    assert not np.array_equal(again.out, got.out)


# ------------------------------------------------------------ threads

def assert_threads_bitwise(threads, method, args, kwargs, v, d_out, **attention):
    """Forward and backward with 1 and 2 threads (`threads`: the fixture's setter):
    the same bits in out, lse and every gradient."""
    results = []
    for count in (1, 2):
        threads(count)
        got = _forward(posenc, method, args, kwargs, v, **attention)
        grads = _backward(posenc, method, d_out, args, kwargs, v, got, **attention)
        results.append((got.out, got.lse) + tuple(grads))
    for name, one, two in zip(("out", "lse") + grads._fields, *results):
        if one is not None:
            assert np.array_equal(one, two, equal_nan=True), name


@pytest.mark.parametrize("method", METHODS)
def test_one_and_two_threads_are_bitwise_equal(method, threads, rng):
    # above the engine's one-thread threshold (B H n m (d + 1) >= 2^18)
    args, kwargs, v = _inputs(method, 65, 70, 16, 9, rng, dtype=np.float32)
    attention = {"causal": True, "key_padding_mask": _padding(2, 70), "dropout_p": 0.1,
                 "seed": 3}
    d_out = rng.standard_normal((2, 3, 65, 9)).astype(np.float32)
    assert_threads_bitwise(threads, method, args, kwargs, v, d_out, **attention)


@pytest.mark.parametrize("method", METHODS)
def test_one_unit_causal_split_over_threads(method, threads, rng):
    """One unit and two threads: the forward splits its rows into chunks of equal causal work
    (not equal rows); bitwise what one thread computes, and the reference's values."""
    args, kwargs, v = _inputs(method, 150, key_count(method, 150, 140, 3), 16, 9, rng,
                              dtype=np.float32, B=1, H=1)
    attention = {"causal": True, "query_offset": 3}
    results = []
    for count in (1, 2):
        threads(count)
        got = _forward(posenc, method, args, kwargs, v, **attention)
        results.append((got.out, got.lse))
    for name, one, two in zip(("out", "lse"), *results):
        assert np.array_equal(one, two, equal_nan=True), name
    assert_attention_matches_reference(method, args, kwargs, v, rng, **attention)


# ------------------------------------------------------- layouts, out=

@pytest.mark.parametrize("method", ["content", "deberta", "tupe"])
def test_non_contiguous_inputs(method, rng):
    args, kwargs, v = _inputs(method, 7, 9, 4, 3, rng)
    strided = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
               for x in (args[0], args[1], v)]
    assert not any(x.flags.c_contiguous for x in strided)
    s_args = strided[:2] + list(args[2:])
    attention = {"causal": True, "dropout_p": 0.3, "seed": 9}
    want = _forward(posenc, method, args, kwargs, v, **attention)
    got = _forward(posenc, method, s_args, kwargs, strided[2], **attention)
    np.testing.assert_array_equal(got.out, want.out)
    np.testing.assert_array_equal(got.lse, want.lse)
    d_out = rng.standard_normal(want.out.shape)
    want_grads = _backward(posenc, method, d_out, args, kwargs, v, want, **attention)
    d_out_strided = np.ascontiguousarray(d_out.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    got_grads = _backward(posenc, method, d_out_strided, s_args, kwargs, strided[2], got,
                          **attention)
    for name, g, w in zip(want_grads._fields, got_grads, want_grads):
        if w is not None:
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_out_is_written_and_returned(rng):
    args, kwargs, v = _inputs("shaw", 4, 6, 3, 5, rng)
    out = np.empty((2, 3, 4, 5))
    got = _forward(posenc, "shaw", args, kwargs, v, out=out)
    assert got.out is out
    np.testing.assert_array_equal(out, _forward(posenc, "shaw", args, kwargs, v).out)


def test_empty_sizes(rng):
    for n, m, dv in ((0, 4, 3), (3, 0, 3), (3, 4, 0)):
        args, kwargs, v = _inputs("t5", n, m, 2, dv, rng)
        got = _forward(posenc, "t5", args, kwargs, v)
        want = _forward(reference, "t5", args, kwargs, v)
        assert got.out.shape == (2, 3, n, dv) and got.lse.shape == (2, 3, n)
        np.testing.assert_array_equal(got.out, want.out)
        np.testing.assert_allclose(got.lse, want.lse, rtol=1e-14)
        grads = _backward(posenc, "t5", np.ones_like(got.out), args, kwargs, v, got)
        for name, grad in zip(grads._fields, grads):
            if grad is not None:
                assert not np.isnan(grad).any() and (m > 0 or not grad.any()), name


# ----------------------------------------------- the binding's safety net

def test_binding_rejects_bad_attention_arguments(rng):
    from posenc import _methods
    from posenc._checks import check
    from posenc._attention import check_attention

    args, kwargs, v = _inputs("content", 3, 4, 2, 2, rng)
    call = check_attention(check(REGISTRY["content"], tuple(args), (None, 0), None), v)
    config = _methods.configure(call.problem)
    # (config, v, key_padding_mask, causal, dropout_p, seed, window, document_q, document_k,
    #  softcap, sinks, out)
    ok = (config, v, None, False, 0.0, 0, None, None, None, None, None, None)
    _C.attention_forward(*ok)
    ids = np.zeros((2, 3), dtype=np.int64)
    for position, value, error in ((1, v[:, :, :3], ValueError), (1, v.astype(np.float32), TypeError),
                                   (2, np.zeros((2, 4), dtype=np.int8), TypeError),
                                   (2, np.zeros((2, 5), dtype=bool), ValueError),
                                   (4, 1.0, ValueError), (4, -0.1, ValueError),
                                   (5, -1, ValueError), (5, 2**64, ValueError),
                                   (6, (1,), TypeError), (6, (-1, 0), ValueError),
                                   (6, 3, TypeError), (7, ids, ValueError),     # document_k missing
                                   (9, 0.0, ValueError), (9, float("inf"), ValueError),
                                   (10, np.zeros(3, dtype=np.float32), TypeError),
                                   (10, np.zeros(2), ValueError)):
        bad = list(ok)
        bad[position] = value
        with pytest.raises(error):
            _C.attention_forward(*bad)
    bad = list(ok)
    bad[7:9] = ids, np.zeros((2, 5), dtype=np.int64)          # document_k of m = 5, not 4
    with pytest.raises(ValueError):
        _C.attention_forward(*bad)
    out, lse = _C.attention_forward(*ok)
    rest = (None, False, 0.0, 0, None, None, None, None, None)
    with pytest.raises(ValueError):
        _C.attention_backward(out[:, :, :2], config, v, out, lse, *rest, 1023, None)
    with pytest.raises(TypeError):
        _C.attention_backward(out, config, v, out, lse, *rest)
