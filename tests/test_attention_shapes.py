"""The attention shapes of SPEC §7 in the C kernels, against posenc.reference:
grouped-query heads (k and v with H_kv heads dividing H; H_kv = 1 is
multi-query), every method with every ISA of this CPU forced (posenc's pytest
plugin: posenc_isa; NEON runs the multi-query configurations of tests/c under
qemu), float32 and float64, logits and fused attention, forward and backward;
1 and 2 threads bitwise; float64 finite differences of the reference and
torch's gradcheck of posenc.torch; the shapes' errors.

Tolerances as tests/test_attention.py's (assert_attention_matches_reference).
"""

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import make_inputs, trainable_inputs, with_inputs
from posenc._registry import METHODS, REGISTRY

from test_attention import _assert_close, _padding, _wide, assert_attention_matches_reference

EPS32 = float(np.finfo(np.float32).eps)
H = 4


@pytest.fixture
def threads():
    previous = posenc.get_num_threads()
    yield posenc.set_num_threads
    posenc.set_num_threads(previous)


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
    eps = 1e-6
    for name in ("q", "k", "v"):
        value = floats[name]
        numeric = np.zeros(value.shape)
        for index in np.ndindex(value.shape):
            bumped = {**floats, name: value.copy()}
            bumped[name][index] += eps
            up = loss(bumped)
            bumped[name][index] -= 2 * eps
            numeric[index] = (up - loss(bumped)) / (2 * eps)
        np.testing.assert_allclose(getattr(grads, name), numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{method} {name}")


@pytest.mark.parametrize("method", ["content", "shaw", "deberta", "tupe", "rope", "alibi"])
def test_grouped_gradcheck_torch(method, rng):
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    args, kwargs, v = _grouped(method, 4, 5, 3, 2, 2, rng)
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, -2:] = True
    trainable = dict(trainable_inputs(method, args, kwargs), v=v)
    names = list(trainable)
    tensors = {name: torch.from_numpy(x) for name, x in
               zip(REGISTRY[method].tensors, args)} | {
        name: torch.from_numpy(x) if isinstance(x, np.ndarray) else x
        for name, x in kwargs.items()}
    for native in (False, True):
        def call(*values):
            bound = dict(tensors, **dict(zip(names, values)))
            positional = [bound[name] for name in REGISTRY[method].tensors[:len(args)]]
            keywords = {name: bound[name] for name in kwargs}
            with pt.use_native(native):
                return getattr(pt, method + "_attention")(
                    positional[0], positional[1], bound["v"], *positional[2:], **keywords,
                    key_padding_mask=torch.from_numpy(mask), causal=True, query_offset=1,
                    dropout_p=0.25, seed=5).out

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
