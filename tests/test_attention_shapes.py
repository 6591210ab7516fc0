"""The attention shapes of SPEC §7 in the C kernels, against posenc.reference:
grouped-query heads (k and v with H_kv heads dividing H; H_kv = 1 is
multi-query), sliding windows, packed documents, soft-capping and sinks,
every method with every ISA of this CPU forced (posenc's pytest plugin:
posenc_isa; NEON runs tests/c's multi-query configurations and window,
document, softcap and sink cases under qemu), float32 and float64, logits and
fused attention, forward and backward (bfloat16 and float16:
tests/test_low_precision.py); 1 and 2 threads bitwise; fully masked rows
(zeros, lse -inf or the sink, never NaN); float64 finite differences of the
reference and torch's gradcheck of posenc.torch (both paths); the shapes'
errors.

Tolerances as tests/test_attention.py's (assert_attention_matches_reference).
"""

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import key_count, make_inputs, trainable_inputs, with_inputs
from posenc._registry import METHODS, REGISTRY

from test_attention_reference import numeric_gradients
from test_attention import (_assert_close, _padding, _wide, assert_attention_matches_reference,
                            assert_threads_bitwise)

EPS32 = float(np.finfo(np.float32).eps)
H = 4


def _grouped(method, n, m, d, dv, kv_heads, rng, *, dtype=np.float64, B=2):
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=dtype, rng=rng, kv_heads=kv_heads)
    return args, kwargs, rng.standard_normal((B, kv_heads, m, dv)).astype(dtype)


# ------------------------------------------------ grouped-query heads

GQA_CASES = [  # n, m, d, dv, attention keywords
    (7, 17, 3, 5, {"causal": True, "query_offset": 9}),
    (17, 7, 7, 1, {"key_padding_mask": "padding", "dropout_p": 0.25, "seed": 11}),
    (1, 33, 16, 3, {"causal": True, "query_offset": 32}),                # a decoding step
]


@pytest.mark.parametrize("kv_heads", [1, 2, H])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_grouped_query_attention_matches_reference(posenc_isa, method, dtype, kv_heads, rng):
    for n, m, d, dv, attention in GQA_CASES:
        m = key_count(method, n, m, attention.get("query_offset", 0))
        args, kwargs, v = _grouped(method, n, m, d, dv, kv_heads, rng, dtype=dtype)
        attention = dict(attention)
        if attention.get("key_padding_mask") == "padding":
            attention["key_padding_mask"] = _padding(2, m)
        _, grads = assert_attention_matches_reference(method, args, kwargs, v, rng, **attention)
        assert grads.k.shape == (2, kv_heads, m, d) and grads.v.shape == (2, kv_heads, m, dv)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_grouped_query_logits_match_reference(posenc_isa, method, dtype, kv_heads, rng):
    n, m, d = 9, 13, 5
    args, kwargs, v = _grouped(method, n, m, d, 1, kv_heads, rng, dtype=dtype)
    a64, k64, _ = _wide(method, args, kwargs, v)
    want = getattr(reference, method)(*a64, **k64, query_offset=2)
    tol = 1e-12 if dtype == np.float64 else (n + m + d + 8) * EPS32 * (1 + np.abs(want).max())
    got = getattr(posenc, method)(*args, **kwargs, query_offset=2)
    _assert_close(got, want, tol, f"{method} logits")
    G = rng.standard_normal(got.shape)
    grads = getattr(posenc, method + "_backward")(G.astype(dtype), *args, **kwargs, query_offset=2)
    want_grads = getattr(reference, method + "_backward")(G, *a64, **k64, query_offset=2)
    for field in want_grads._fields:
        g, w = getattr(grads, field), getattr(want_grads, field)
        if w is not None:
            _assert_close(g, w, tol * np.abs(G).max(), f"{method} d{field}")
    assert grads.k.shape == args[1].shape == (2, kv_heads, m, d)


@pytest.mark.parametrize("method", ["content", "t5", "deberta", "rope"])
def test_grouped_equals_repeated_heads(method, rng):
    """GQA is attention over k, v repeated per query head: the same out and lse bit for
    bit, and dk, dv the group's sums of the repeated call's gradients."""
    args, kwargs, v = _grouped(method, 20, 30, 8, 6, 2, rng, dtype=np.float32)
    group = H // 2
    repeated = with_inputs(method, args, kwargs, {"k": np.repeat(args[1], group, axis=1)})
    v_full = np.repeat(v, group, axis=1)
    options = dict(causal=True, query_offset=10, dropout_p=0.2, seed=4)
    run = getattr(posenc, method + "_attention")
    back = getattr(posenc, method + "_attention_backward")
    got = run(args[0], args[1], v, *args[2:], **kwargs, **options)
    full = run(repeated[0][0], repeated[0][1], v_full, *repeated[0][2:], **repeated[1], **options)
    assert np.array_equal(got.out, full.out) and np.array_equal(got.lse, full.lse)
    d_out = rng.standard_normal(got.out.shape).astype(np.float32)
    grads = back(d_out, args[0], args[1], v, *args[2:], *got, **kwargs, **options)
    grads_full = back(d_out, repeated[0][0], repeated[0][1], v_full, *repeated[0][2:], *full,
                      **repeated[1], **options)
    np.testing.assert_array_equal(grads.q, grads_full.q)
    for name in ("k", "v"):
        summed = reference.fold_groups(getattr(grads_full, name).astype(np.float64), 2)
        np.testing.assert_allclose(getattr(grads, name), summed, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("method", METHODS)
def test_grouped_one_and_two_threads_are_bitwise_equal(method, kv_heads, threads, rng):
    """dk and dv summed over a group in one fixed order whatever the team."""
    args, kwargs, v = _grouped(method, 65, 70, 16, 9, kv_heads, rng, dtype=np.float32)
    attention = {"causal": True, "key_padding_mask": _padding(2, 70), "dropout_p": 0.1,
                 "seed": 3}
    d_out = rng.standard_normal((2, H, 65, 9)).astype(np.float32)
    G = rng.standard_normal((2, H, 65, 70)).astype(np.float32)
    results = []
    for count in (1, 2):
        threads(count)
        got = getattr(posenc, method + "_attention")(args[0], args[1], v, *args[2:], **kwargs,
                                                     **attention)
        grads = getattr(posenc, method + "_attention_backward")(
            d_out, args[0], args[1], v, *args[2:], *got, **kwargs, **attention)
        logit_grads = getattr(posenc, method + "_backward")(G, *args, **kwargs)
        results.append((got.out, got.lse) + tuple(grads) + tuple(logit_grads))
    names = ("out", "lse") + grads._fields + tuple("logits d" + f for f in logit_grads._fields)
    for name, one, two in zip(names, *results):
        if one is not None:
            assert np.array_equal(one, two, equal_nan=True), name


@pytest.mark.parametrize("method", ["tupe", "deberta", "rope", "kerple"])
def test_grouped_reference_matches_finite_differences(method, rng):
    n, m, B = 3, 4, 2
    args, kwargs, v = _grouped(method, n, m, 3, 2, 2, rng, B=B)
    mask = np.zeros((B, m), dtype=bool)
    mask[1, 0] = True
    options = dict(causal=True, key_padding_mask=mask, query_offset=1, dropout_p=0.3, seed=3)
    attention = getattr(reference, method + "_attention")
    weights = rng.standard_normal((B, H, n, 2))
    floats = dict(trainable_inputs(method, args, kwargs), v=v)

    def loss(values):
        a, kw = with_inputs(method, args, kwargs, values)
        return float(np.sum(weights * attention(*a[:2], values["v"], *a[2:], **kw,
                                                **options).out))

    result = attention(*args[:2], v, *args[2:], **kwargs, **options)
    grads = getattr(reference, method + "_attention_backward")(
        weights, *args[:2], v, *args[2:], *result, **kwargs, **options)
    wanted = {name: floats[name] for name in ("q", "k", "v")}
    for name, numeric in numeric_gradients(lambda values: loss({**floats, **values}),
                                           wanted).items():
        np.testing.assert_allclose(getattr(grads, name), numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{method} {name}")


@pytest.mark.parametrize("method", ["content", "shaw", "deberta", "tupe", "rope", "alibi"])
def test_grouped_gradcheck_torch(method, rng):
    args, kwargs, v = _grouped(method, 4, 5, 3, 2, 2, rng)
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, -2:] = True
    assert_gradcheck_torch(method, args, kwargs, dict(trainable_inputs(method, args, kwargs), v=v),
                           dict(key_padding_mask=mask, causal=True, query_offset=1))


def assert_gradcheck_torch(method, args, kwargs, trainable, attention):
    """torch.autograd.gradcheck of posenc.torch.<method>_attention in the float inputs
    `trainable` (by name: the method's, v, sinks), with the attention keywords (NumPy
    arrays as tensors) and dropout, on the C kernels and on the native formula."""
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    attention = {name: torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                 for name, x in attention.items()}
    names = list(trainable)
    tensors = {name: torch.from_numpy(x) for name, x in zip(REGISTRY[method].tensors, args)}
    tensors.update({name: torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                    for name, x in kwargs.items()})
    for native in (False, True):
        def call(*values):
            bound = dict(tensors, **dict(zip(names, values)))
            positional = [bound[name] for name in REGISTRY[method].tensors[:len(args)]]
            keywords = {name: bound[name] for name in kwargs}
            with pt.use_native(native):
                return getattr(pt, method + "_attention")(
                    positional[0], positional[1], bound["v"], *positional[2:], **keywords,
                    **attention, sinks=bound.get("sinks"), dropout_p=0.25, seed=5).out

        inputs = tuple(torch.from_numpy(trainable[name]).requires_grad_() for name in names)
        assert torch.autograd.gradcheck(call, inputs, eps=1e-6, atol=1e-7), native


def test_grouped_shape_errors(rng):
    q = rng.standard_normal((2, 4, 5, 3))
    with pytest.raises(ValueError, match=r"H_kv heads that divide H = 4"):
        posenc.content(q, rng.standard_normal((2, 3, 6, 3)))
    k = rng.standard_normal((2, 2, 6, 3))
    with pytest.raises(ValueError, match=r"v must have shape \(2, 2, 6, \*\) \(B, H_kv, m, dv\)"):
        posenc.content_attention(q, k, rng.standard_normal((2, 4, 6, 3)))
    with pytest.raises(ValueError, match=r"H_kv heads that divide H = 4"):
        reference.content_attention(q, rng.standard_normal((2, 3, 6, 3)),
                                    rng.standard_normal((2, 3, 6, 3)))
    out = posenc.content_attention(q, k, rng.standard_normal((2, 2, 6, 1)))
    assert out.out.shape == (2, 4, 5, 1)


# ------------------------------------------------ windows, documents, softcap, sinks

def _documents(B, n, m, lengths, query_offset=0):
    """document_q (B, n), document_k (B, m) of documents of the given lengths per batch
    row (summing to m), query i at key position query_offset + i."""
    doc_k = np.stack([np.repeat(np.arange(len(ls)), ls) for ls in lengths])
    positions = np.minimum(np.arange(n) + query_offset, m - 1)
    return doc_k[:, positions], doc_k


def _shape_case(case, B, n, m, rng, dtype):
    """The attention keywords of a SHAPE_CASES entry, arrays drawn for (B, n, m)."""
    attention = dict(case)
    if attention.pop("padding", False):
        attention["key_padding_mask"] = _padding(B, m)
    lengths = attention.pop("documents", None)
    if lengths is not None:
        attention["document_q"], attention["document_k"] = _documents(
            B, n, m, lengths(m), attention.get("query_offset", 0))
    if attention.get("sinks") is True:
        attention["sinks"] = rng.standard_normal(H).astype(dtype)
    return attention


SHAPE_CASES = {   # n, m, attention keywords (documents: lengths per batch row, given m)
    "window-left": (17, 17, dict(window=(3, None))),
    "window-both-sides": (33, 40, dict(window=(5, 2), query_offset=7)),
    "window-wider-than-the-sequence": (7, 20, dict(window=(100, 100), causal=True,
                                                   query_offset=13)),
    "sliding-window-causal-offset": (9, 40, dict(window=(6, 0), causal=True, query_offset=31)),
    "documents": (30, 30, dict(documents=lambda m: [[10, 1, m - 11], [1, 1, m - 2]])),
    "documents-spanning-the-row-padding": (30, 30, dict(
        documents=lambda m: [[m], [5, 5, m - 10]], padding=True, causal=True)),
    "softcap": (13, 17, dict(softcap=2.0)),
    "sinks-fully-masked-rows": (13, 17, dict(sinks=True, padding=True)),
    "everything": (33, 33, dict(window=(7, 1), causal=True, softcap=1.5, sinks=True,
                                padding=True, dropout_p=0.2, seed=9,
                                documents=lambda m: [[12, m - 12], [3, m - 3]])),
}


@pytest.mark.parametrize("case", SHAPE_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_shapes_match_reference(posenc_isa, method, dtype, case, rng):
    n, m, options = SHAPE_CASES[case]
    kv_heads = 2 if case == "everything" else H
    args, kwargs, v = _grouped(method, n, m, 4, 3, kv_heads, rng, dtype=dtype)
    attention = _shape_case(options, 2, n, m, rng, dtype)
    got, grads = assert_attention_matches_reference(method, args, kwargs, v, rng, **attention)
    assert not np.isnan(got.out).any() and not np.isnan(got.lse).any()
    assert (grads.sinks is None) == ("sinks" not in attention)


def test_masks_take_effect(rng):
    """Each shape changes the result (the comparison above cannot pass vacuously)."""
    args, kwargs, v = _grouped("t5", 20, 20, 4, 3, H, rng)
    plain = posenc.t5_attention(args[0], args[1], v, *args[2:], **kwargs)
    for name in ("window-left", "documents", "softcap", "sinks-fully-masked-rows"):
        attention = _shape_case(SHAPE_CASES[name][2], 2, 20, 20, rng, np.float64)
        got = posenc.t5_attention(args[0], args[1], v, *args[2:], **kwargs, **attention)
        assert not np.allclose(got.out, plain.out), name


def test_rows_without_keys_are_zero(rng):
    """A query whose document has no key, or whose window holds none: out 0, lse -inf
    (the sink with sinks), zero gradients, no NaN."""
    B, n, m = 2, 6, 8
    args, kwargs, v = _grouped("t5", n, m, 4, 3, H, rng)
    doc_k = np.zeros((B, m), dtype=np.int64)
    doc_q = np.zeros((B, n), dtype=np.int64)
    doc_q[0, 2] = doc_q[1, :] = 7                      # an id no key has
    sinks = rng.standard_normal(H)
    for attention in (dict(document_q=doc_q, document_k=doc_k),
                      dict(document_q=doc_q, document_k=doc_k, sinks=sinks),
                      dict(window=(0, None), causal=True, query_offset=m)):   # keys all behind
        got = posenc.t5_attention(args[0], args[1], v, *args[2:], **kwargs, **attention)
        want = reference.t5_attention(args[0], args[1], v, *args[2:], **kwargs, **attention)
        empty = np.isneginf(want.lse) if "sinks" not in attention else np.broadcast_to(
            want.lse == sinks[None, :, None], want.lse.shape)
        assert empty.any()
        assert not got.out[empty].any() and np.array_equal(got.lse[empty], want.lse[empty])
        grads = posenc.t5_attention_backward(np.ones_like(got.out), args[0], args[1], v,
                                             *args[2:], *got, **kwargs, **attention)
        for name, grad in zip(grads._fields, grads):
            assert grad is None or not np.isnan(grad).any(), name
        assert not grads.q[empty].any()


@pytest.mark.parametrize("method", ["content", "t5", "tupe", "rope", "deberta"])
def test_shapes_one_and_two_threads_are_bitwise_equal(method, threads, rng):
    """Above the engine's one-thread threshold, with every shape at once: the same bits."""
    n = m = 130
    args, kwargs, v = _grouped(method, n, m, 16, 9, 2, rng, dtype=np.float32)
    attention = _shape_case(dict(window=(20, 3), causal=True, softcap=3.0, sinks=True,
                                 padding=True, dropout_p=0.1, seed=3,
                                 documents=lambda m: [[40, 1, m - 41], [m // 2, m - m // 2]]),
                            2, n, m, rng, np.float32)
    d_out = rng.standard_normal((2, H, n, 9)).astype(np.float32)
    assert_threads_bitwise(threads, method, args, kwargs, v, d_out, **attention)


@pytest.mark.parametrize("method", ["t5", "rope", "tupe"])
def test_shapes_reference_matches_finite_differences(method, rng):
    """The reference's softcap chain rule and the sinks' gradient, in float64."""
    n = m = 5
    B = 2
    args, kwargs, v = _grouped(method, n, m, 3, 2, 2, rng, B=B)
    attention = _shape_case(dict(window=(2, 1), softcap=1.3, sinks=True, padding=True,
                                 documents=lambda m: [[2, m - 2], [m]]), B, n, m, rng,
                            np.float64)
    run = getattr(reference, method + "_attention")
    weights = rng.standard_normal((B, H, n, 2))
    floats = dict(trainable_inputs(method, args, kwargs), v=v, sinks=attention.pop("sinks"))

    def loss(values):
        a, kw = with_inputs(method, args, kwargs, values)
        return float(np.sum(weights * run(*a[:2], values["v"], *a[2:], **kw, **attention,
                                          sinks=values["sinks"]).out))

    result = run(*args[:2], v, *args[2:], **kwargs, **attention, sinks=floats["sinks"])
    grads = getattr(reference, method + "_attention_backward")(
        weights, *args[:2], v, *args[2:], *result, **kwargs, **attention, sinks=floats["sinks"])
    for name, numeric in numeric_gradients(loss, floats).items():
        np.testing.assert_allclose(getattr(grads, name), numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{method} {name}")


@pytest.mark.parametrize("method", ["content", "t5", "tupe", "rope", "alibi"])
def test_shapes_gradcheck_torch(method, rng):
    n = m = 6
    args, kwargs, v = _grouped(method, n, m, 3, 2, 2, rng)
    attention = _shape_case(dict(window=(3, 1), causal=True, softcap=2.0, padding=True,
                                 documents=lambda m: [[2, m - 2], [m]]), 2, n, m, rng,
                            np.float64)
    trainable = dict(trainable_inputs(method, args, kwargs), v=v, sinks=rng.standard_normal(H))
    assert_gradcheck_torch(method, args, kwargs, trainable, attention)


def test_shape_errors(rng):
    q, k, v = (rng.standard_normal((2, H, 5, 3)) for _ in range(3))
    ids = np.zeros((2, 5), dtype=np.int64)
    cases = [
        (dict(window=3), TypeError, r"window must be None or \(left, right\)"),
        (dict(window=(1, 2, 3)), TypeError, r"window must be None or \(left, right\)"),
        (dict(window=(-1, 0)), ValueError, r"window's left must be >= 0, got -1"),
        (dict(window=(0, 1.5)), TypeError, r"window's right must be an int"),
        (dict(document_q=ids), ValueError, r"missing document_k"),
        (dict(document_q=ids, document_k=ids[:, :4]), ValueError,
         r"document_k must have shape \(2, 5\) \(B, m\)"),
        (dict(document_q=ids.astype(float), document_k=ids), TypeError,
         r"document_q must have an integer dtype"),
        (dict(softcap=0.0), ValueError, r"softcap must be a finite number > 0"),
        (dict(softcap="30"), TypeError, r"softcap must be a real number > 0 or None"),
        (dict(sinks=np.zeros(3)), ValueError, r"sinks must have shape \(4,\) \(H,\), got \(3,\)"),
        (dict(sinks=np.zeros(H, dtype=np.float32)), TypeError,
         r"sinks has dtype float32 but q has dtype float64"),
    ]
    for namespace in (posenc, reference):
        for attention, error, message in cases:
            with pytest.raises(error, match=message):
                namespace.content_attention(q, k, v, **attention)


def _torch_shapes(torch, rng, n=12):
    """q (B, H, n, 8), k, v (B, 2, n, 8) float32 leaves, and every shape's keywords as tensors."""
    q = torch.from_numpy(rng.standard_normal((2, H, n, 8), dtype=np.float32)).requires_grad_()
    k, v = (torch.from_numpy(rng.standard_normal((2, 2, n, 8), dtype=np.float32))
            .requires_grad_() for _ in range(2))
    attention = _shape_case(dict(window=(4, 1), causal=True, softcap=3.0, sinks=True,
                                 padding=True, documents=lambda m: [[5, m - 5], [m]]),
                            2, n, n, rng, np.float32)
    attention = {name: torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                 for name, x in attention.items()}
    attention["sinks"].requires_grad_()
    return q, k, v, attention


def test_shapes_torch_compile_equals_eager(rng):
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    q, k, v, attention = _torch_shapes(torch, rng)
    sinks = attention.pop("sinks")

    def f(q, k, v, sinks):
        return pt.content_attention(q, k, v, **attention, sinks=sinks).out.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = (q, k, v, sinks)
    eager = f(*leaves)
    got = compiled(*leaves)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(got, leaves), torch.autograd.grad(eager, leaves)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_shapes_under_cpu_autocast(dtype, rng):
    """Under CPU autocast the fused attention with every shape runs in autocast's dtype
    (q, k, v and the sinks cast), lse float32, float32 leaves get float32 gradients,
    near the float32 call."""
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    q, k, v, attention = _torch_shapes(torch, rng)
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        low = pt.content_attention(q, k, v, **attention)
    wide = pt.content_attention(q, k, v, **attention)
    assert low.out.dtype == getattr(torch, dtype) and low.lse.dtype == torch.float32
    tol = 2 ** -6 if dtype == "bfloat16" else 2 ** -9
    torch.testing.assert_close(low.out.float(), wide.out, rtol=tol, atol=tol)
    low.out.float().sum().backward()
    assert attention["sinks"].grad.dtype == torch.float32 and q.grad.dtype == torch.float32
