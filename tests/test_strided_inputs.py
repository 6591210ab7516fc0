"""q, k, v and d_out read where they lie (issue 40): any batch, head and row strides
with the last axis contiguous, as Hugging Face models hand them ((B, H, n, d) views of
(B, n, H, d) projections).  The float32/float64 engine copies a unit's rows into the
thread's workspace as it reaches the unit; the bfloat16/float16 engine gathers a
strided input once per call (csrc/engine/engine_lp.c).  What a user sees:

* every method x ISA x dtype, logits and fused attention, forward and every gradient,
  grouped-query heads, causal or not: the results of strided inputs are the
  contiguous inputs' bit for bit (the same values in the same order of sums);
* the decoding path (one or two query rows at a query_offset, grouped heads in one
  pass, keys split over threads) the same;
* other layouts the binding copies (a strided last axis) or reads in place (negative
  strides, a broadcast batch axis), all right;
* no copy: a strided call's peak traced memory is the contiguous call's;
* posenc.torch hands transposed views through (no torch copy), forward and backward.
"""

import tracemalloc

import numpy as np
import pytest

import posenc
from posenc import _dtypes
from posenc._examples import make_inputs
from posenc._registry import METHODS

BF16 = pytest.param("bfloat16", marks=pytest.mark.skipif(
    _dtypes.BFLOAT16 is None, reason="bfloat16 needs ml_dtypes (pip install 'posenc[bf16]')"))
DTYPES = ["float64", "float32", BF16, "float16"]


def strided(x, pad=3):
    """x (B, H, rows, cols) as a view of a (B, rows, H, cols + pad) buffer: the rows
    H (cols + pad) apart, the heads cols + pad, the last axis contiguous."""
    B, H, rows, cols = x.shape
    buffer = np.zeros((B, rows, H, cols + pad), x.dtype)
    buffer[..., :cols] = x.transpose(0, 2, 1, 3)
    view = buffer[..., :cols].transpose(0, 2, 1, 3)
    assert not view.flags.c_contiguous and view.strides[-1] == x.itemsize
    np.testing.assert_array_equal(view, x)
    return view


def _bits(x):
    x = np.ascontiguousarray(x)
    return x.view(np.uint8 if x.dtype.itemsize == 1 else f"u{x.dtype.itemsize}")


def assert_bitwise(got, want, what):
    if want is None:
        assert got is None, what
        return
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert np.array_equal(_bits(got), _bits(want)), what


def _attention_pair(method, args, kw, v, rng, **attention):
    """(contiguous, strided) results: forward (out, lse) and every gradient."""
    att = getattr(posenc, f"{method}_attention")
    back = getattr(posenc, f"{method}_attention_backward")
    q, k, *rest = args
    results = []
    want = att(q, k, v, *rest, **kw, **attention)
    d_out = rng.standard_normal(want.out.shape).astype(want.out.dtype)
    for wrap in (lambda x: x, strided):
        got = att(wrap(q), wrap(k), wrap(v), *rest, **kw, **attention)
        grads = back(wrap(d_out), wrap(q), wrap(k), wrap(v), *rest, got.out, got.lse, **kw,
                     **attention)
        results.append((got, grads))
    return results


def _dtype_of(dtype):
    return _dtypes.BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_attention_strided_is_contiguous_bitwise(posenc_isa, method, dtype, rng):
    for kv_heads, causal in ((None, False), (None, True), (2, True)):
        args, kw = make_inputs(method, 2, 4, 17, 23, 7,
                               dtype=_dtype_of(dtype), rng=rng, kv_heads=kv_heads)
        v = rng.standard_normal(args[1].shape[:3] + (5,)).astype(args[1].dtype)
        (want, want_grads), (got, got_grads) = _attention_pair(method, args, kw, v, rng,
                                                               causal=causal)
        what = f"{method} {dtype} kv_heads={kv_heads} causal={causal}"
        assert_bitwise(got.out, want.out, f"{what} out")
        assert_bitwise(got.lse, want.lse, f"{what} lse")
        for name, g, w in zip(want_grads._fields, got_grads, want_grads):
            assert_bitwise(g, w, f"{what} d{name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_logits_strided_is_contiguous_bitwise(posenc_isa, method, dtype, rng):
    args, kw = make_inputs(method, 2, 3, 13, 19, 5, dtype=_dtype_of(dtype), rng=rng)
    q, k, *rest = args
    forward, backward = getattr(posenc, method), getattr(posenc, f"{method}_backward")
    want = forward(q, k, *rest, **kw)
    assert_bitwise(forward(strided(q), strided(k), *rest, **kw), want, f"{method} logits")
    G = rng.standard_normal(want.shape).astype(want.dtype)
    want_grads = backward(G, q, k, *rest, **kw)
    got_grads = backward(G, strided(q), strided(k), *rest, **kw)
    for name, g, w in zip(want_grads._fields, got_grads, want_grads):
        assert_bitwise(g, w, f"{method} d{name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["content", "t5", "alibi", "rope", "shaw", "tupe"])
@pytest.mark.parametrize("shape", [(1, 4, 1, 300, 2), (2, 8, 2, 70, 2), (3, 4, 1, 65, 1)],
                         ids=["split-keys", "grouped-heads", "one-row"])
def test_decoding_step_strided(posenc_isa, method, dtype, shape, rng):
    """A decoding step's rows (n = 1 or 2 at query_offset m - n): q strided (as HF hands
    it) with k and v contiguous (HF's cache), and all strided."""
    B, H, n, m, group = shape
    args, kw = make_inputs(method, B, H, n, m, 16, dtype=_dtype_of(dtype), rng=rng,
                           kv_heads=H // group)
    q, k, *rest = args
    v = rng.standard_normal(k.shape[:3] + (8,)).astype(k.dtype)
    att = getattr(posenc, f"{method}_attention")
    options = dict(causal=True, query_offset=m - n)
    want = att(q, k, v, *rest, **kw, **options)
    for given in ((strided(q), k, v), (strided(q), strided(k), strided(v))):
        got = att(*given, *rest, **kw, **options)
        assert_bitwise(got.out, want.out, f"{method} out")
        assert_bitwise(got.lse, want.lse, f"{method} lse")


def test_other_layouts(rng):
    """A strided last axis (copied by the binding), negative strides and a broadcast
    batch axis (read in place): the contiguous results."""
    args, kw = make_inputs("t5", 2, 3, 9, 11, 6, rng=rng)
    q, k, bias = args
    v = rng.standard_normal((2, 3, 11, 4))
    want = posenc.t5_attention(q, k, v, bias, **kw, causal=True)
    every_other = np.repeat(q, 2, axis=-1)[..., ::2]
    flipped = np.ascontiguousarray(k[:, ::-1])[:, ::-1]   # the heads axis's stride < 0
    assert flipped.strides[1] < 0
    for q_, k_ in ((every_other, k), (q, flipped), (every_other, flipped)):
        got = posenc.t5_attention(q_, k_, v, bias, **kw, causal=True)
        assert_bitwise(got.out, want.out, "out")
    shared = np.broadcast_to(q[:1], q.shape)                  # the batch axis's stride 0
    got = posenc.t5_attention(shared, k, v, bias, **kw, causal=True)
    ref = posenc.t5_attention(np.ascontiguousarray(shared), k, v, bias, **kw, causal=True)
    assert_bitwise(got.out, ref.out, "broadcast out")
    d_out = rng.standard_normal(ref.out.shape)
    grads = posenc.t5_attention_backward(d_out, shared, k, v, bias, ref.out, ref.lse, **kw,
                                         causal=True)
    ref_grads = posenc.t5_attention_backward(d_out, np.ascontiguousarray(shared), k, v, bias,
                                             ref.out, ref.lse, **kw, causal=True)
    for name, g, w in zip(ref_grads._fields, grads, ref_grads):
        assert_bitwise(g, w, name)


def _peak_bytes(call):
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_strided_inputs_are_not_copied(dtype, rng):
    """NumPy's allocations are traced: a copy of q, k and v (3 x 2 MiB in float64) would
    show in a strided call's peak.  The engine's per-unit rows are its own workspace."""
    B, H, n, d = 1, 8, 512, 64
    q, k, v = (rng.standard_normal((B, H, n, d)).astype(dtype) for _ in range(3))
    views = [strided(x) for x in (q, k, v)]
    posenc.content_attention(q, k, v)                      # warm: imports, caches
    contiguous = _peak_bytes(lambda: posenc.content_attention(q, k, v))
    in_place = _peak_bytes(lambda: posenc.content_attention(*views))
    size = q.nbytes
    assert contiguous >= size                              # the output, (B, H, n, d)
    assert in_place < contiguous + size // 4, (in_place, contiguous, size)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_torch_reads_transposed_views(dtype, rng):
    torch = pytest.importorskip("torch")
    import posenc.torch as pt
    from posenc.torch._common import to_c_array

    if dtype == "bfloat16" and _dtypes.BFLOAT16 is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    tdtype = getattr(torch, dtype)
    B, n, H, d = 2, 9, 4, 8
    x = torch.tensor(rng.standard_normal((B, n, 3 * H * d)), dtype=tdtype)
    views = [part.view(B, n, H, d).transpose(1, 2) for part in x.split(H * d, dim=-1)]
    assert not views[0].is_contiguous()
    array = to_c_array("q", views[0])
    assert np.shares_memory(array, x.numpy() if dtype != "bfloat16" else x.view(torch.int16).numpy())
    bias = torch.tensor(rng.standard_normal((H, 32)), dtype=tdtype)
    leaves = [t.detach().clone().requires_grad_(True) for t in views]
    contiguous = [t.detach().contiguous().requires_grad_(True) for t in views]
    weight = torch.tensor(rng.standard_normal((B, n, H, d)), dtype=tdtype)
    outs = []
    for q, k, v in (leaves, contiguous):
        out = pt.t5_attention(q, k, v, bias, causal=True).out
        (out.transpose(1, 2) * weight).sum().backward()    # d_out: a transposed view
        outs.append(out.detach())
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(leaves, contiguous):
        assert torch.equal(a.grad, b.grad)
