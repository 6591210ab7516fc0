"""lse as an output with a gradient (SPEC §6): <m>_attention_backward(..., d_lse=)
against posenc.reference for every method, ISA and dtype on the tiles, the
decoding path's shapes and split keys; the torch ops (eager and
torch.compile) under a loss of out and lse, float64 gradcheck.  And NaN /
+Inf sinks (SPEC §6): the head's rows NaN as the reference's, on the tiles,
the decoding path and split keys, the sink's gradient NaN."""

import copy

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import key_count
from posenc._registry import METHODS, REGISTRY

from test_attention import (_backward, _forward, _inputs, _padding, _wide,
                            assert_attention_matches_reference)
from test_decode import SPLIT_M

# n, m, attention keywords: the tiles, a decoding step (n <= 16 at the cache's end),
# split keys (m past a chunk of 2048)
SHAPES = {
    "tiles": (33, 7, dict(causal=True, key_padding_mask="padding")),
    "tiles-1": (1, 33, dict(key_padding_mask="padding")),
    "decode": (7, 301, dict(causal=True, query_offset=301 - 7 - 3, key_padding_mask="padding")),
    "split": (1, SPLIT_M, dict(causal=True, query_offset=SPLIT_M - 1)),
}


def _attention(shape, rng, dtype, H=3, method="content"):
    n, m, attention = SHAPES[shape]
    m = key_count(method, n, m, attention.get("query_offset", 0))
    attention = dict(attention, sinks=rng.standard_normal(H).astype(dtype))
    if attention.get("key_padding_mask") == "padding":
        attention["key_padding_mask"] = _padding(2, m)      # row 1 fully masked: lse the sink
    return n, m, attention


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_d_lse_matches_reference(posenc_isa, method, dtype, shape, rng):
    """Every gradient, sinks' included, with d_lse = dL/dlse beside d_out; d_lse changes
    them (dlse_i/dA_ij = P_ij); without sinks a fully masked row (lse -inf) keeps zero
    gradient whatever its d_lse."""
    if shape == "split" and dtype == np.float32:
        pytest.skip("split keys: float64 (the same engine code as float32)")
    n, m, attention = _attention(shape, rng, dtype, method=method)
    args, kwargs, v = _inputs(method, n, m, 8, 5, rng, dtype=dtype)
    d_lse = rng.standard_normal((2, 3, n)).astype(dtype)
    replay = copy.deepcopy(rng)            # the d_out the check draws
    got, grads = assert_attention_matches_reference(method, args, kwargs, v, rng, d_lse=d_lse,
                                                    **attention)
    d_out = replay.standard_normal(got.out.shape).astype(dtype)
    plain = _backward(posenc, method, d_out, args, kwargs, v, got, **attention)
    assert not np.array_equal(grads.q, plain.q) and not np.array_equal(grads.sinks, plain.sinks)
    assert np.array_equal(grads.v, plain.v)          # lse does not depend on v
    if "key_padding_mask" in attention:    # no sinks: row 1 fully masked, lse -inf
        no_sinks = dict(attention, sinks=None)
        out = _forward(posenc, method, args, kwargs, v, **no_sinks)
        assert np.isneginf(out.lse[1]).all()
        g = _backward(posenc, method, np.zeros_like(out.out), args, kwargs, v, out, d_lse=d_lse,
                      **no_sinks)
        zero = _backward(posenc, method, np.zeros_like(out.out), args, kwargs, v, out,
                         d_lse=np.where(np.isneginf(out.lse), 0, d_lse).astype(dtype), **no_sinks)
        for a, b in zip(g, zero):
            if a is not None:
                assert np.array_equal(a, b)
        assert np.isfinite(g.q).all()


@pytest.mark.parametrize("method", ["content", "t5", "tupe"])
def test_d_lse_float16_is_the_float32_engine_narrowed(posenc_isa, method, rng):
    """float16 with a float32 d_lse (lse's dtype): every gradient narrow(the float32
    engine on the widened inputs), as without d_lse (engine_lp.c widens d_lse as lse)."""
    args, kwargs, v = _inputs(method, 7, 9, 8, 5, rng, dtype=np.float16)
    attention = dict(causal=True, sinks=rng.standard_normal(3).astype(np.float16))
    got = _forward(posenc, method, args, kwargs, v, **attention)
    d_out = rng.standard_normal(got.out.shape).astype(np.float16)
    d_lse = rng.standard_normal(got.lse.shape).astype(np.float32)
    grads = _backward(posenc, method, d_out, args, kwargs, v, got, d_lse=d_lse, **attention)
    wide = lambda x: x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype == np.float16 \
        else x  # noqa: E731
    args32, kwargs32 = [wide(a) for a in args], {k: wide(x) for k, x in kwargs.items()}
    want = _backward(posenc, method, wide(d_out), args32, kwargs32, wide(v),
                     (wide(got.out), got.lse), d_lse=d_lse, sinks=wide(attention["sinks"]),
                     causal=True)
    for field in grads._fields:
        g, w = getattr(grads, field), getattr(want, field)
        if g is not None:
            assert np.array_equal(g, w.astype(g.dtype)), field


def test_d_lse_is_checked(rng):
    args, kwargs, v = _inputs("content", 3, 4, 2, 2, rng)
    out = _forward(posenc, "content", args, kwargs, v)
    with pytest.raises(ValueError, match="d_lse"):
        _backward(posenc, "content", out.out, args, kwargs, v, out, d_lse=np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="d_lse"):
        _backward(posenc, "content", out.out, args, kwargs, v, out,
                  d_lse=np.zeros((2, 3, 3), dtype=np.float32))


# ------------------------------------------------------------ NaN and +Inf sinks

@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["content", "t5", "deberta", "rope"])
def test_nonfinite_sink_matches_reference(posenc_isa, method, dtype, shape, value, rng):
    """Head 1's sink NaN (or +Inf): its rows' out and lse as the reference's (NaN where
    a row sees a key; a fully masked row: out 0, lse the sink), the other heads
    finite as before, and the sink's gradient NaN."""
    n, m, attention = _attention(shape, rng, dtype)
    if shape == "split":     # and a padded row
        attention["key_padding_mask"] = _padding(2, m)
    sinks = attention["sinks"]
    finite = _forward(posenc, method, *_inputs(method, n, m, 8, 5, np.random.default_rng(1),
                                               dtype=dtype), **attention)
    sinks[1] = value
    args, kwargs, v = _inputs(method, n, m, 8, 5, np.random.default_rng(1), dtype=dtype)
    a64, k64, v64 = _wide(method, args, kwargs, v)
    wide = dict(attention, sinks=sinks.astype(np.float64))
    got = _forward(posenc, method, args, kwargs, v, **attention)
    want = _forward(reference, method, a64, k64, v64, **wide)
    for name in ("out", "lse"):
        g, w = getattr(got, name), getattr(want, name)
        assert np.array_equal(np.isnan(g), np.isnan(w)), f"{name}: NaN pattern"
        assert np.array_equal(g[np.isinf(w)], w[np.isinf(w)]), name
        assert np.isnan(w[:, 1]).any()
        # the other heads: bitwise those of the finite sinks
        assert np.array_equal(g[:, [0, 2]], getattr(finite, name)[:, [0, 2]]), name
    if "key_padding_mask" in attention:       # row 1 fully masked: out 0, lse the sink
        assert (got.out[1] == 0).all()
        assert np.array_equal(got.lse[1, 1], np.full(n, value, dtype=dtype), equal_nan=True)
    grads = _backward(posenc, method, np.ones_like(got.out), args, kwargs, v, got, **attention)
    assert np.isnan(grads.sinks[1]) and np.isfinite(grads.sinks[[0, 2]]).all()


# ------------------------------------------------------------------ posenc.torch

torch = pytest.importorskip("torch")
import posenc.torch as pt  # noqa: E402
from posenc._examples import make_inputs, trainable_inputs  # noqa: E402

B, H, N, M, D, DV = 2, 2, 5, 6, 3, 4


def _torch_inputs(method, rng, sinks):
    args, kwargs = make_inputs(method, B, H, N, M, D, rng=rng)
    tensor = lambda x: torch.from_numpy(x) if x.dtype.kind != "f" else torch.from_numpy(x).double()  # noqa: E731
    trainable = trainable_inputs(method, args, kwargs)
    targs = [tensor(a).requires_grad_(name in trainable)
             for name, a in zip(REGISTRY[method].tensors, args)]
    tkw = {k: tensor(x).requires_grad_(k in trainable) if isinstance(x, np.ndarray) else x
           for k, x in kwargs.items()}
    floats = {**trainable_inputs(method, targs, tkw),
              "v": torch.from_numpy(rng.standard_normal((B, H, M, DV))).requires_grad_()}
    if sinks:
        floats["sinks"] = torch.from_numpy(rng.standard_normal(H)).requires_grad_()
    mask = torch.zeros(B, M, dtype=torch.bool)
    mask[0, -2:] = True
    mask[1] = True                  # a fully masked row: lse the sink, or -inf without
    return targs, tkw, floats, mask


def _attention_call(method, targs, tkw, floats, mask):
    """values -> (out, lse) of the torch op, the floats given by name."""
    names = list(floats)

    def call(*values):
        bound = dict(zip(names, values))
        args = [bound.get(name, a) for name, a in zip(REGISTRY[method].tensors, targs)]
        kw = {k: bound.get(k, x) for k, x in tkw.items()}
        got = getattr(pt, method + "_attention")(*args[:2], bound["v"], *args[2:], **kw,
                                                 key_padding_mask=mask, causal=True,
                                                 query_offset=1, sinks=bound.get("sinks"))
        lse = torch.where(torch.isfinite(got.lse), got.lse, 0.0)   # -inf: no gradient
        return got.out, lse
    return call


def _loss(call, rng):
    w = torch.from_numpy(rng.standard_normal((B, H, N, DV)))
    u = torch.from_numpy(rng.standard_normal((B, H, N)))

    def loss(*values):
        out, lse = call(*values)
        return (out * w).sum() + (lse * u).sum()
    return loss


@pytest.mark.parametrize("sinks", [True, False], ids=["sinks", "no-sinks"])
@pytest.mark.parametrize("method", METHODS)
def test_torch_gradcheck_out_and_lse(method, sinks, rng):
    targs, tkw, floats, mask = _torch_inputs(method, rng, sinks)
    call = _attention_call(method, targs, tkw, floats, mask)
    assert torch.autograd.gradcheck(call, tuple(floats.values()), eps=1e-6, atol=1e-7)
    # the C path's gradients equal the native formula's
    values = tuple(floats.values())
    loss = _loss(call, np.random.default_rng(3))
    got = torch.autograd.grad(loss(*values), values)
    with pt.use_native(True):
        want = torch.autograd.grad(_loss(call, np.random.default_rng(3))(*values), values)
    for name, a, b in zip(floats, got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("method", METHODS)
def test_torch_compile_out_and_lse_equals_eager(method, rng):
    targs, tkw, floats, mask = _torch_inputs(method, rng, True)
    loss = _loss(_attention_call(method, targs, tkw, floats, mask), rng)
    values = tuple(floats.values())
    eager = loss(*values)
    eager_grads = torch.autograd.grad(eager, values)
    torch._dynamo.reset()      # one code object for every method: no recompile limit
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(*values)
    got_grads = torch.autograd.grad(got, values)
    torch.testing.assert_close(got, eager, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(floats, got_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_torch_lse_alone_and_create_graph(rng):
    """A loss of lse alone (no d_out), and create_graph's native backward with lse."""
    targs, tkw, floats, mask = _torch_inputs("t5", rng, True)
    call = _attention_call("t5", targs, tkw, floats, mask)
    values = tuple(floats.values())
    assert torch.autograd.gradcheck(lambda *x: call(*x)[1], values, eps=1e-6, atol=1e-7)
    loss = _loss(call, np.random.default_rng(4))
    plain = torch.autograd.grad(loss(*values), values)
    graph = torch.autograd.grad(loss(*values), values, create_graph=True)
    for a, b in zip(plain, graph):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-10)
