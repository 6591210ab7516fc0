"""bfloat16 and float16 through the public NumPy API (issue 16, docs/low_precision.md).

Every method x ISA of this CPU (posenc's pytest plugin: posenc_isa) x {bfloat16,
float16}: the logits forward and backward, the fused attention forward and
backward (causal, a padding mask with a fully masked batch row, query_offset,
dropout, dv != d; grouped-query heads, and SPEC §7's window, documents, softcap
and sinks together), on awkward sizes (n != m, sizes 1, 3, 17, 33), with shared
(head axis 1) parameters and non-contiguous inputs.  Two checks each:

* the design, exactly: a 16-bit result is narrow(float32 posenc on the widened
  inputs), bit for bit, and lse is float32 and equal to the float32 run's
  (but for bfloat16 where its GEMMs run on vdpbf16ps, posenc._C.bf16_dot(),
  design (b): the bound only; tests/c/test_lp.c checks those bits);
* the bound of docs/validation.md against the float64 reference on the same
  (widened) inputs: |posenc - reference| <= u |reference| + (1 + u) E32
  (u = 2^-8, 2^-11; + 2^-25 for float16), E32 the float32 bound, plus
  2^-8 M for bfloat16's gradients and out (its rounded GEMM operands)
  (posenc._check.compare / within, which `python -m posenc check` uses).

Also: float16 overflow to +-inf at 65520 (and not below; the attention's out and
dv at the edge of the range), the reference's one
rounding from float64, a result large enough for the result-block cache,
mixed dtypes refused with the dtypes named, and posenc without ml_dtypes
(float16 only).  bfloat16 cases are skipped when ml_dtypes is not installed.
"""


import numpy as np
import pytest

import posenc
from posenc import _C, _check, _dtypes, _methods, reference
from posenc._examples import float_inputs, key_count, make_inputs, with_inputs
from posenc._registry import METHODS, REGISTRY

BF16 = pytest.param("bfloat16", marks=pytest.mark.skipif(
    _dtypes.BFLOAT16 is None, reason="bfloat16 needs ml_dtypes (pip install 'posenc[bf16]')"))
DTYPES = [BF16, "float16"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: tiny problems on a shared machine (threads are tested in tests/c)."""
    previous = posenc.get_num_threads()
    posenc.set_num_threads(1)
    yield
    posenc.set_num_threads(previous)


# ------------------------------------------------------------------ helpers

def _cast(method, args, kwargs, dtype):
    """The call with every float input converted to `dtype` (exact when widening)."""
    floats = float_inputs(method, args, kwargs)
    return with_inputs(method, args, kwargs, {k: v.astype(dtype) for k, v in floats.items()})


def _strided(method, args, kwargs):
    """The same values as views with a stride of 2 items along the last axis."""
    floats = float_inputs(method, args, kwargs)
    return with_inputs(method, args, kwargs,
                       {k: np.repeat(v, 2, axis=-1)[..., ::2] for k, v in floats.items()})


def _inputs(method, dtype, n, m, d, rng, *, shared=False, strided=False, B=2, H=3,
            kv_heads=None):
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=np.float64, rng=rng, shared=shared,
                               kv_heads=kv_heads)
    args, kwargs = _cast(method, args, kwargs, _dtypes.by_name(dtype))
    return _strided(method, args, kwargs) if strided else (args, kwargs)


def _bits(array) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint16)


def assert_narrowed(got, wide32, dtype, what, float64=False):
    """got (16-bit) is wide32 (the float32 run) rounded once to nearest even.  float64: a
    gradient the engine forms in float64 (a term module's array: _methods.SOURCES' entries
    with a finish), rounded once from there in both runs, so that where wide32 is a tie of
    the 16-bit type (exactly halfway between two of its values) got may be the other one."""
    assert got.dtype == _dtypes.by_name(dtype), f"{what}: dtype {got.dtype}"
    assert wide32.dtype == np.float32
    want = wide32.astype(got.dtype)
    same = _bits(got) == _bits(want)
    if float64:
        x, y = got.astype(np.float64), want.astype(np.float64)
        apart = np.abs(_bits(got).astype(np.int32) - _bits(want).astype(np.int32))
        same |= (x + y == 2 * wide32.astype(np.float64)) & (apart == 1)   # its neighbour
    assert same.all(), (f"{what}: {int((~same).sum())} of {same.size} entries are not "
                        f"narrow(float32 posenc); first at {np.argwhere(~same)[0]}")


def engine_float64(method, field) -> bool:
    """Whether the engine forms gradient `field` of `method` in float64 (assert_narrowed)."""
    spec = REGISTRY[method]
    return dict(zip(spec.grad_fields, _methods.SOURCES[method])).get(field, (None, None))[1] \
        is not None


def bf16_gemm(dtype) -> bool:
    """bfloat16 on vdpbf16ps (avx512 with AVX512-BF16: design (b)): its sums run
    in another order than the float32 engine's, so the results are checked by
    their bound only; elsewhere they are narrow(float32 posenc) bit for bit."""
    return dtype == "bfloat16" and _C.bf16_dot()


def assert_within(ratio, what):
    assert ratio <= 1.0, f"{what}: error / bound = {ratio:.3g} > 1"


SIZES = [  # n, m, d, options
    (3, 17, 33, dict(kv_heads=1)),                  # multi-query: k with one head
    (17, 1, 3, dict(query_offset=2)),
    (33, 17, 16, dict(shared=True, strided=True)),
]


# ------------------------------------------------------------------ logits

@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"n{s[0]}-m{s[1]}-d{s[2]}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_logits_forward_backward(posenc_isa, method, dtype, size, rng):
    n, m, d, options = size
    options = dict(options)
    query_offset = options.pop("query_offset", 0)
    m = key_count(method, n, m, query_offset)
    args, kwargs = _inputs(method, dtype, n, m, d, rng, **options)
    kwargs["query_offset"] = query_offset
    args32, kwargs32 = _cast(method, args, kwargs, np.float32)
    args64, kwargs64 = _cast(method, args, kwargs, np.float64)
    d_p = _check.dense_rank(method, args, kwargs)

    got = getattr(posenc, method)(*args, **kwargs)
    if not bf16_gemm(dtype):
        assert_narrowed(got, getattr(posenc, method)(*args32, **kwargs32), dtype, "logits")
    formula = getattr(reference, method)
    _, ratio, _ = _check.compare(got, formula(*args64, **kwargs64),
                                 _check.magnitude(method, args64, kwargs64), d + d_p, dtype,
                                 rounded_operands=_check.logit_operands_rounded(method))
    assert_within(ratio, "logits")

    G = rng.standard_normal(got.shape).astype(got.dtype)
    G32, G64 = G.astype(np.float32), G.astype(np.float64)
    grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
    grads32 = getattr(posenc, method + "_backward")(G32, *args32, **kwargs32)
    backward = getattr(reference, method + "_backward")
    want = backward(G64, *args64, **kwargs64)
    magnitude = _check.grad_magnitudes(method, np.abs(G64), args64, kwargs64)
    for field in grads._fields:
        if getattr(want, field) is None:
            continue
        if not bf16_gemm(dtype):
            assert_narrowed(getattr(grads, field), getattr(grads32, field), dtype, field,
                            engine_float64(method, field))
        _, ratio, _ = _check.compare(getattr(grads, field), getattr(want, field),
                                     magnitude[field], n + m + d + d_p, dtype,
                                     rounded_operands=True)
        assert_within(ratio, field)


# ------------------------------------------------------------------ attention

ATTENTION_CASES = {  # n, m, d, dv, options (padding: a fully masked batch row and a padded tail)
    "causal-padding-dropout": (17, 33, 3, 5, dict(causal=True, query_offset=3, dropout_p=0.1,
                                                   seed=7, padding=True)),
    "decode-step-mqa": (1, 17, 16, 1, dict(causal=True, query_offset=16, kv_heads=1)),
    "gqa-2-of-4-heads": (9, 13, 5, 3, dict(causal=True, padding=True, H=4, kv_heads=2)),
    "n>m-shared-strided": (33, 3, 1, 17, dict(padding=True, shared=True, strided=True)),
    # SPEC §7: a window with causality, packed documents (one of them spanning no key of
    # batch row 0's padding), a softcap, sinks (with a fully masked batch row), one kv head
    "window-documents-softcap-sinks": (33, 33, 8, 5, dict(causal=True, window=(6, 1),
                                                          documents=True, softcap=2.5,
                                                          sinks=True, padding=True,
                                                          kv_heads=1)),
}


def _documents(B, n, m):
    """document_q, document_k: batch row 0 three documents, row 1 one and a long one."""
    lengths = ([7, 1, m - 8], [1, m - 1])
    ids = [np.repeat(np.arange(len(ls)), ls) for ls in lengths[:B]]
    return np.stack([i[m - n:] for i in ids]), np.stack(ids)


def _attention(namespace, method, args, kwargs, v, options):
    return getattr(namespace, method + "_attention")(*args[:2], v, *args[2:], **kwargs, **options)


def _attention_backward(namespace, method, d_out, args, kwargs, v, saved, options):
    return getattr(namespace, method + "_attention_backward")(
        d_out, *args[:2], v, *args[2:], *saved, **kwargs, **options)


@pytest.mark.parametrize("case", ATTENTION_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_attention_forward_backward(posenc_isa, method, dtype, case, rng):
    n, m, d, dv, options = ATTENTION_CASES[case]
    m = key_count(method, n, m, options.get("query_offset", 0))
    options = dict(options)
    layout = {key: options.pop(key) for key in ("shared", "strided", "kv_heads", "H")
              if key in options}
    B = 2
    args, kwargs = _inputs(method, dtype, n, m, d, rng, B=B, **layout)
    lp = _dtypes.by_name(dtype)
    H = layout.get("H", 3)
    v = rng.standard_normal((B, layout.get("kv_heads", H), m, dv)).astype(lp)
    if options.pop("padding", False):
        mask = np.zeros((B, m), dtype=bool)
        mask[0, :] = True                  # every key of batch row 0 is padding
        mask[1, m // 2 + 1:] = True
        options["key_padding_mask"] = mask
    if options.pop("documents", False):
        options["document_q"], options["document_k"] = _documents(B, n, m)
    if options.get("sinks") is True:
        options["sinks"] = rng.standard_normal(H).astype(lp)
    if layout.get("strided"):
        v = np.repeat(v, 2, axis=-1)[..., ::2]
    args32, kwargs32 = _cast(method, args, kwargs, np.float32)
    args64, kwargs64 = _cast(method, args, kwargs, np.float64)
    # the options with the sinks (a float input) in float32 and float64
    options32, options64 = (dict(options, sinks=options["sinks"].astype(wide_dtype))
                            if options.get("sinks") is not None else options
                            for wide_dtype in (np.float32, np.float64))

    got = _attention(posenc, method, args, kwargs, v, options)
    wide = _attention(posenc, method, args32, kwargs32, v.astype(np.float32), options32)
    assert got.lse.dtype == np.float32
    if not bf16_gemm(dtype):
        assert_narrowed(got.out, wide.out, dtype, "out")
        np.testing.assert_array_equal(got.lse, wide.lse)
    if "key_padding_mask" in options:   # batch row 0 all padding: lse -inf, or the sink
        empty = -np.inf if options.get("sinks") is None else options32["sinks"][:, None]
        assert np.array_equal(got.lse[0], np.broadcast_to(empty, got.lse[0].shape))
        assert not _bits(got.out[0]).any()

    d_out = rng.standard_normal(got.out.shape).astype(lp)
    ref, out_bound, lse_bound, grad_bounds = _check.attention_bounds(
        method, args64, kwargs64, v.astype(np.float64), options64, d_out.astype(np.float64), lp)
    assert_within(_check.within(got.out, ref.out, out_bound, lp)[1], "out")
    assert_within(_check.within(got.lse, ref.lse, lse_bound, np.float32)[1], "lse")

    grads = _attention_backward(posenc, method, d_out, args, kwargs, v, got, options)
    grads32 = _attention_backward(posenc, method, d_out.astype(np.float32), args32, kwargs32,
                                  v.astype(np.float32), (got.out.astype(np.float32), got.lse),
                                  options32)
    # the backward is a function of the out (rounded to 16 bits) and lse it is given
    want = _attention_backward(reference, method, d_out.astype(np.float64), args64, kwargs64,
                               v.astype(np.float64), (got.out.astype(np.float64),
                                                      got.lse.astype(np.float64)), options64)
    for field in want._fields:
        if getattr(want, field) is None:
            continue
        if not bf16_gemm(dtype):
            assert_narrowed(getattr(grads, field), getattr(grads32, field), dtype, field,
                            engine_float64(method, field))
        assert_within(_check.within(getattr(grads, field), getattr(want, field),
                                    grad_bounds[field], lp)[1], field)


# ------------------------------------------------------------------ edges

@pytest.mark.parametrize("method", METHODS)
def test_non_finite_q_and_k_in_bfloat16(posenc_isa, method, rng):
    """An Inf in q and a NaN in k: the bfloat16 gradients are non-finite where
    the float32 run's on the widened inputs are, and near them elsewhere.  With
    a vector table (Shaw, M4, M4M, DeBERTa) its gradient then takes the exact
    path, which reads q and k themselves: on vdpbf16ps the engine widens them
    from the bfloat16 inputs there (engine_lp.c leaves q and k unwidened)."""
    if _dtypes.BFLOAT16 is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    n, d = 17, 5
    m = key_count(method, n, 9)
    args, kwargs = _inputs(method, "bfloat16", n, m, d, rng)
    floats = float_inputs(method, args, kwargs)
    q, k = floats["q"].copy(), floats["k"].copy()
    q[0, 1, 3, 2], k[1, 2, 4, 0] = np.inf, np.nan
    args, kwargs = with_inputs(method, args, kwargs, {"q": q, "k": k})
    args32, kwargs32 = _cast(method, args, kwargs, np.float32)
    G = rng.standard_normal(q.shape[:2] + (n, m)).astype(q.dtype)
    grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
    grads32 = getattr(posenc, method + "_backward")(G.astype(np.float32), *args32, **kwargs32)
    for field in grads._fields:
        if getattr(grads32, field) is None:       # a constant (RoPE's tables)
            assert getattr(grads, field) is None, field
            continue
        got = getattr(grads, field).astype(np.float32)
        want = getattr(grads32, field)
        finite = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), finite, err_msg=f"{field}: non-finite")
        if finite.any():
            scale = np.abs(want[finite]).max()
            np.testing.assert_allclose(got[finite], want[finite], rtol=0.05, atol=0.05 * scale,
                                       err_msg=field)


def test_float16_overflows_to_inf_at_65520(posenc_isa):
    """Logits of +-65504 and 65519 stay finite (65519 rounds to 65504); 65520 and
    beyond are +-inf, in posenc and in the reference, and the check's bound
    accepts them."""
    q = np.ones((1, 1, 1, 2), np.float16)
    k = np.array([[65504, 0], [-65504, 0], [65504, 15], [65504, 16], [-65504, -16], [256, 0]],
                 np.float16).reshape(1, 1, 6, 2)
    scale = 1.0                                 # the logit is exactly k_j0 + k_j1
    got = posenc.content(q, k, scale=scale)
    want = [65504, -65504, 65504, np.inf, -np.inf, 256]
    np.testing.assert_array_equal(got.astype(np.float64)[0, 0, 0], want)
    np.testing.assert_array_equal(reference.content(q, k, scale=scale).astype(np.float64)[0, 0, 0],
                                  want)
    exact = reference.content(q.astype(np.float64), k.astype(np.float64), scale=scale)
    magnitude = reference.content(np.abs(q).astype(np.float64), np.abs(k).astype(np.float64),
                                  scale=scale)
    assert _check.compare(got, exact, magnitude, 2, np.float16)[2]
    wrong = got.copy()
    wrong[0, 0, 0, 3] = -np.inf                               # the wrong sign
    assert not _check.compare(wrong, exact, magnitude, 2, np.float16)[2]
    wrong[0, 0, 0, 3] = np.inf
    wrong[0, 0, 0, 0] = np.inf                                # 65504 is not near 65520
    assert not _check.compare(wrong, exact, magnitude, 2, np.float16)[2]


def test_float16_attention_at_the_edge_of_its_range(posenc_isa):
    """The attention's results overflow only where their exact value does: with
    q = k = 0 every row averages the 2 keys, so out = mean(v) = 65504 exactly
    (finite: a mean never exceeds its values), and dv_j = sum_i P_ij d_out_i =
    8 * 0.5 * 30000 = 120000 > 65520 is +inf; dS = P (dP - delta) is exactly 0
    (delta_i = d_out_i . out_i = dP_ij), so dq and dk are 0, not NaN."""
    q = np.zeros((1, 1, 8, 2), np.float16)
    k = np.zeros((1, 1, 2, 2), np.float16)
    v = np.full((1, 1, 2, 1), 65504, np.float16)
    d_out = np.full((1, 1, 8, 1), 30000, np.float16)
    out, lse = posenc.content_attention(q, k, v)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    np.testing.assert_array_equal(out.astype(np.float64), 65504.0)
    np.testing.assert_allclose(lse, np.log(2.0), rtol=1e-6)
    grads = posenc.content_attention_backward(d_out, q, k, v, out, lse)
    np.testing.assert_array_equal(grads.v.astype(np.float64), np.inf)
    np.testing.assert_array_equal(grads.q.astype(np.float64), 0.0)
    np.testing.assert_array_equal(grads.k.astype(np.float64), 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_rounds_once_from_float64(dtype):
    """reference(16-bit inputs) = its float64 result rounded once: the logit
    1 + 2^-8 + 2^-30 is 1 + 2^-7 in bfloat16 (through float32 it would tie to
    1), 1 + 2^-11 + 2^-21 is 1 + 2^-10 in float16."""
    lp = _dtypes.by_name(dtype)
    half_ulp, sticky = (2.0 ** -8, 2.0 ** -29) if dtype == "bfloat16" else (2.0 ** -11, 2.0 ** -20)
    q = np.array([2.0, 2 * half_ulp, sticky, 0.0]).reshape(1, 1, 1, 4).astype(lp)
    k = np.array([1.0, 1.0, 1.0, 0.0]).reshape(1, 1, 1, 4).astype(lp)  # scale 1/sqrt(4)
    got = reference.content(q, k)
    assert got.dtype == lp and float(got[0, 0, 0, 0]) == 1 + 2 * half_ulp
    x = np.array([1 + 2.0 ** -8 + 2.0 ** -30, -(1 + 2.0 ** -8), 3.5e38, 1e-45, -1e-40, np.inf])
    if dtype == "bfloat16":
        np.testing.assert_array_equal(_dtypes.narrow(x, lp).astype(np.float64),
                                      [1 + 2.0 ** -7, -1.0, np.inf, 0.0, -2.0 ** -133, np.inf])
    G = np.ones((1, 1, 1, 1), lp)
    grads = reference.content_backward(G, q, k)
    want = reference.content_backward(G.astype(np.float64), q.astype(np.float64),
                                      k.astype(np.float64))
    np.testing.assert_array_equal(_bits(grads.q), _bits(_dtypes.narrow(want.q, lp)))


def _narrow_by_float32(values):
    """float64 -> bfloat16 by NumPy: to float32 rounded to odd (truncated, the last bit set
    when inexact: 16 bits kept beyond bfloat16's), then ml_dtypes' float32 -> bfloat16, so
    that the second rounding is the only one."""
    wide = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        single = wide.astype(np.float32)
        back = single.astype(np.float64)
        inexact = np.isfinite(wide) & (back != wide)
        away = inexact & (np.abs(back) > np.abs(wide))
    bits = single.view(np.uint32) - away.view(np.uint8).astype(np.uint32)
    bits |= inexact.view(np.uint8).astype(np.uint32)
    return bits.view(np.float32).astype(_dtypes.BFLOAT16)


@pytest.mark.skipif(_dtypes.BFLOAT16 is None, reason="bfloat16 needs ml_dtypes")
def test_narrow_bfloat16_is_the_round_to_odd_route(rng):
    """narrow (the C rounding of the float64 bits, posenc_narrow_bf16) gives the bits of
    the NumPy route through float32 rounded to odd: every bfloat16 value's midpoints and
    their neighbours, random magnitudes from 2^-160 to 2^140, random bit patterns (NaN
    payloads, infinities, double subnormals); a strided view; the shape kept (0-d too)."""
    bf16 = _dtypes.BFLOAT16
    values = np.arange(0x7f80, dtype=np.uint32).astype(np.uint16).view(bf16).astype(np.float64)
    successors = np.append(values[1:], 2.0 ** 128)
    mids = (values + successors) / 2
    x = np.concatenate([values, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf),
                        rng.standard_normal(100_000) * np.exp2(rng.integers(-160, 140, 100_000)),
                        rng.integers(0, 2 ** 63, 100_000, dtype=np.uint64).view(np.float64),
                        [np.nan, -np.nan, np.inf, -np.inf, -0.0, 5e-324, 2.0 ** -134]])
    x = np.concatenate([x, -x])
    got = _dtypes.narrow(x, bf16)
    assert got.dtype == bf16 and got.shape == x.shape
    np.testing.assert_array_equal(_bits(got), _bits(_narrow_by_float32(x)))
    view = x[: 2 * 8 * 9 * 5].reshape(2, 8, 9, 5)[:, ::3, :, 1::2]
    got = _dtypes.narrow(view, bf16)
    assert got.flags.c_contiguous and got.shape == view.shape
    np.testing.assert_array_equal(_bits(got), _bits(_narrow_by_float32(view)))
    assert _dtypes.narrow(np.float64(1 + 2.0 ** -8 + 2.0 ** -30), bf16).shape == ()


def test_float16_result_in_a_result_block():
    """A float16 result of 33.6 MB lives in a cached block (module_results.h) with
    2-byte items; d = 1 makes every logit an exact float32 product, so the
    result is NumPy's outer product rounded once."""
    n = 4100
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, n, 1)).astype(np.float16)
    k = rng.standard_normal((1, 1, n, 1)).astype(np.float16)
    budget = posenc.get_result_cache()
    try:
        got = posenc.content(q, k)
        assert type(got.base).__name__ == "ResultBlock" and got.dtype == np.float16
        want = np.multiply.outer(q[0, 0, :, 0].astype(np.float64),
                                 k[0, 0, :, 0].astype(np.float64))
        np.testing.assert_array_equal(_bits(got[0, 0]), _bits(want.astype(np.float16)))
        del got
        assert _C.result_cache_info()["blocks"] >= 1          # the block went back to the cache
    finally:
        posenc.set_result_cache(0)           # empty, as later tests of the cache expect it
        posenc.set_result_cache(budget)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_of_the_16_bit_dtype(dtype, rng):
    """out= of q's 16-bit dtype is written and returned, for the logits and the attention."""
    lp = _dtypes.by_name(dtype)
    q, k, v = (rng.standard_normal((2, 3, 5, 4)).astype(lp) for _ in range(3))
    out = np.empty((2, 3, 5, 5), lp)
    assert posenc.content(q, k, out=out) is out
    np.testing.assert_array_equal(_bits(out), _bits(posenc.content(q, k)))
    out = np.empty((2, 3, 5, 4), lp)
    got = posenc.content_attention(q, k, v, out=out)
    assert got.out is out and got.lse.dtype == np.float32
    np.testing.assert_array_equal(_bits(out), _bits(posenc.content_attention(q, k, v).out))


# ------------------------------------------------------------------ errors

def _mixed_cases():
    rng = np.random.default_rng(0)
    f16 = rng.standard_normal((1, 2, 3, 4)).astype(np.float16)
    table16 = rng.standard_normal((2, 9)).astype(np.float16)
    cases = [
        ("k float32, q float16", lambda: posenc.content(f16, f16.astype(np.float32)),
         ["k has dtype float32", "q has dtype float16"]),
        ("table float32", lambda: posenc.t5(f16, f16, table16.astype(np.float32), num_buckets=9),
         ["bias has dtype float32", "float16"]),
        ("G float32", lambda: posenc.content_backward(np.zeros((1, 2, 3, 3), np.float32), f16, f16),
         ["G has dtype float32", "q has dtype float16"]),
        ("int q", lambda: posenc.content(f16.astype(np.int16), f16),
         ["q must have dtype float32, float64, bfloat16 (with ml_dtypes installed) or float16",
          "int16"]),
        ("out float32", lambda: posenc.content(f16, f16, out=np.zeros((1, 2, 3, 3), np.float32)),
         ["out must have dtype float16"]),
        ("lse float16", lambda: posenc.content_attention_backward(
            f16, f16, f16, f16, f16, np.zeros((1, 2, 3), np.float16)),
         ["lse must have dtype float32", "float16"]),
        ("v float32", lambda: posenc.content_attention(f16, f16, f16.astype(np.float32)),
         ["v has dtype float32", "q has dtype float16"]),
        ("binding: k float32", lambda: _C.forward(posenc._methods.configure(posenc._checks.check(
            posenc._registry.REGISTRY["content"], (f16, f16), (None, 0), None))._replace(
                k=f16.astype(np.float32)), None),
         ["k must have dtype float16", "float32"]),
    ]
    if _dtypes.BFLOAT16 is not None:
        bf16 = f16.astype(_dtypes.BFLOAT16)
        cases += [
            ("k float16, q bfloat16", lambda: posenc.content(bf16, f16),
             ["k has dtype float16", "q has dtype bfloat16"]),
            ("binding: k bfloat16, q float16", lambda: _C.forward(
                posenc._methods.configure(posenc._checks.check(
                    posenc._registry.REGISTRY["content"], (f16, f16), (None, 0), None))._replace(
                        k=bf16), None),
             ["k must have dtype float16", "bfloat16"]),
        ]
    return cases


@pytest.mark.parametrize("case", _mixed_cases(), ids=lambda case: case[0])
def test_mixed_dtypes_are_refused(case):
    _, call, fragments = case
    with pytest.raises(TypeError) as raised:
        call()
    for fragment in fragments:
        assert fragment in str(raised.value), (fragment, str(raised.value))


def test_binding_refuses_a_dtype_that_is_not_bfloat16():
    with pytest.raises(ValueError, match="not a registered NumPy user dtype"):
        _C._set_bfloat16(np.dtype(np.float16).num)


def test_without_ml_dtypes_float16_works_and_bfloat16_is_named(python):
    """posenc imported with ml_dtypes hidden: float16 runs and checks, bfloat16 is
    named as needing ml_dtypes."""
    code = """
import sys
sys.modules["ml_dtypes"] = None             # import ml_dtypes raises ImportError
import numpy as np, posenc
from posenc import _check, _dtypes
assert _dtypes.BFLOAT16 is None and _check.DTYPES == ("float32", "float64", "float16")
q = np.ones((1, 1, 2, 4), np.float16)
assert posenc.content(q, q).dtype == np.float16
try:
    posenc.check("content", dtypes=["bfloat16"])
except ValueError as error:
    assert "ml_dtypes" in str(error), error
else:
    raise AssertionError("bfloat16 without ml_dtypes was accepted")
try:
    posenc.content(q.view(np.uint16), q)
except TypeError as error:
    assert "bfloat16 (with ml_dtypes installed)" in str(error), error
result = posenc.check("content", dtypes=["float16"])
assert result.passed, result
print("ok")
"""
    done = python("-c", code, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
