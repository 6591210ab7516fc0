"""posenc.torch.<m>_attention: the fused C attention in autograd and its
native formula, against posenc.reference (forward and every gradient), float64
gradcheck, torch.compile(fullgraph=True) equal to eager, and the attention
layer (causal, masks, KV cache) on the fused path."""

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import posenc.reference as ref  # noqa: E402
import posenc.torch as pt  # noqa: E402
from posenc._examples import make_inputs, trainable_inputs  # noqa: E402
from posenc._registry import METHODS, REGISTRY  # noqa: E402
from posenc.torch import nn as pnn  # noqa: E402

B, H, N, M, D, DV = 2, 2, 5, 6, 3, 4
PATHS = ("c", "native")
OPTIONS = dict(causal=True, query_offset=1, dropout_p=0.25, seed=11)


pytestmark = pytest.mark.usefixtures("one_thread")   # tiny problems (conftest.py)


def _inputs(method, rng, dtype=torch.float64):
    args, kwargs = make_inputs(method, B, H, N, M, D, rng=rng)
    v = rng.standard_normal((B, H, M, DV))
    mask = np.zeros((B, M), dtype=bool)
    mask[1, -2:] = True
    tensor = lambda x: torch.from_numpy(x).to(dtype) if x.dtype.kind == "f" else torch.from_numpy(x)
    trainable = trainable_inputs(method, args, kwargs)       # not RoPE's constant tables
    targs = [tensor(a).requires_grad_(name in trainable)
             for name, a in zip(REGISTRY[method].tensors, args)]
    tkw = {k: tensor(x).requires_grad_(k in trainable) if isinstance(x, np.ndarray) else x
           for k, x in kwargs.items()}
    tv = tensor(v).requires_grad_()
    return (args, kwargs, v, mask), (targs, tkw, tv, torch.from_numpy(mask))


def _run(path, method, targs, tkw, tv, tmask, **options):
    with pt.use_native(path == "native"):
        return getattr(pt, method + "_attention")(*targs[:2], tv, *targs[2:], **tkw,
                                                  key_padding_mask=tmask, **options)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", METHODS)
def test_matches_reference(method, path, dtype, rng):
    (args, kwargs, v, mask), (targs, tkw, tv, tmask) = _inputs(method, rng, dtype)
    got = _run(path, method, targs, tkw, tv, tmask, **OPTIONS)
    want = getattr(ref, method + "_attention")(*args[:2], v, *args[2:], **kwargs,
                                                key_padding_mask=mask, **OPTIONS)
    tol = 1e-12 if dtype == torch.float64 else 3e-5
    np.testing.assert_allclose(got.out.detach().numpy(), want.out, rtol=tol, atol=tol)
    np.testing.assert_allclose(got.lse.detach().numpy(), want.lse, rtol=tol, atol=tol)
    d_out = rng.standard_normal(want.out.shape)
    floats = {**trainable_inputs(method, targs, tkw), "v": tv}
    grads = torch.autograd.grad(got.out, list(floats.values()), torch.from_numpy(d_out).to(dtype))
    want_grads = getattr(ref, method + "_attention_backward")(
        d_out, *args[:2], v, *args[2:], want.out, want.lse, **kwargs, key_padding_mask=mask,
        **OPTIONS)
    for name, grad in zip(floats, grads):
        np.testing.assert_allclose(grad.numpy(), getattr(want_grads, name), rtol=10 * tol,
                                   atol=10 * tol, err_msg=f"{method} {path} {name}")


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_c_path(method, rng):
    (_, _, _, _), (targs, tkw, tv, tmask) = _inputs(method, rng)
    floats = {**trainable_inputs(method, targs, tkw), "v": tv}
    names = list(floats)

    def call(*values):
        bound = dict(zip(names, values))
        args = [bound.get(name, a) for name, a in zip(REGISTRY[method].tensors, targs)]
        kw = {k: bound.get(k, x) for k, x in tkw.items()}
        return _run("c", method, args, kw, bound["v"], tmask, **OPTIONS).out

    assert torch.autograd.gradcheck(call, tuple(floats.values()), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", ["content", "t5", "deberta", "tupe"])
def test_compile_fullgraph_equals_eager(method, rng):
    (_, _, _, _), (targs, tkw, tv, tmask) = _inputs(method, rng)
    options = dict(causal=True, dropout_p=0.0)

    def f(q, k, v):
        return getattr(pt, method + "_attention")(q, k, v, *targs[2:], **tkw,
                                                  key_padding_mask=tmask, **options).out.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    q, k = targs[0].detach().requires_grad_(), targs[1].detach().requires_grad_()
    v = tv.detach().requires_grad_()
    eager = f(q, k, v)
    eager_grads = torch.autograd.grad(eager, (q, k, v))
    got = compiled(q, k, v)
    got_grads = torch.autograd.grad(got, (q, k, v))
    torch.testing.assert_close(got, eager, rtol=1e-12, atol=1e-12)
    for a, b in zip(got_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["shaw", "tupe"])
def test_strided_inputs_equal_contiguous(method, rng):
    """q, k, v as (B, H, n, d) views of (B, n, H, d) buffers (a layer's projections)
    and a strided d_out: the C path's out, lse and every gradient are bitwise those
    of the same values laid out C-contiguous (the op copies them once, for both
    directions)."""
    (_, _, _, _), (targs, tkw, tv, tmask) = _inputs(method, rng)
    views = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
             for t in (targs[0], targs[1], tv)]
    dense = [t.detach().contiguous().requires_grad_() for t in views]
    assert not any(t.is_contiguous() for t in views) and all(t.is_contiguous() for t in dense)
    parameters = list(trainable_inputs(method, targs, tkw).values())[2:]
    d_out = torch.from_numpy(rng.standard_normal((B, N, H, DV))).transpose(1, 2)
    results = []
    for (q, k, v), grad in ((views, d_out), (dense, d_out.contiguous())):
        got = _run("c", method, [q, k, *targs[2:]], tkw, v, tmask, **OPTIONS)
        results.append((got.out, got.lse,
                        *torch.autograd.grad(got.out, [q, k, v, *parameters], grad)))
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_to_c_array():
    from posenc.torch._common import to_c_array
    x = torch.arange(24.0).view(2, 3, 4)
    same = to_c_array("q", x)
    assert np.shares_memory(same, x.numpy())
    strided = x.transpose(1, 2)
    copy = to_c_array("q", strided)
    assert copy.flags.c_contiguous and not np.shares_memory(copy, x.numpy())
    np.testing.assert_array_equal(copy, strided.numpy())
    np.testing.assert_array_equal(to_c_array("q", strided.neg()), -strided.numpy())
    # a contiguous view with the negative bit (numpy() refuses it): resolved, not dropped
    np.testing.assert_array_equal(to_c_array("q", torch._neg_view(x)), -x.numpy())
    with pytest.raises(TypeError, match="q must have dtype float32, float64, bfloat16"):
        to_c_array("q", torch.zeros(2, dtype=torch.float8_e4m3fn).t())


ENCODINGS = {
    "content": lambda: None, "t5": lambda: pnn.T5RelativeBias(H, 8, 16),
    "shaw": lambda: pnn.ShawRelative(H, 4, 3), "m2": lambda: pnn.M2Relative(H, 3),
    "m4": lambda: pnn.M4Relative(H, 4, 3), "m4m": lambda: pnn.M4MRelative(H, 4, 3),
    "deberta": lambda: pnn.DebertaRelative(8, H, max_relative_positions=6),
    "tupe": lambda: pnn.TUPE(8, H, 12, relative=True),
    "diet_abs": lambda: pnn.DIETAbs(H, 12, 3, num_segments=2),
    "diet_rel": lambda: pnn.DIETRel(H, 3, num_segments=2),
}


def _decode(layer, x, stops, mask, **ids):
    """The layer over x in steps ending at `stops`, each with the cache of the ones
    before (the padding mask up to the step's end, the ids (B, n) of its positions):
    (the outputs concatenated, the last cache)."""
    outs, cache, start = [], None, 0
    for stop in stops:
        out, cache = layer(x[:, start:stop], key_padding_mask=mask[:, :stop],
                           **{name: value[:, start:stop] for name, value in ids.items()},
                           past_key_value=cache, use_cache=True)
        outs.append(out)
        start = stop
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("num_kv_heads", [None, 1], ids=["mha", "mqa"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_attention_layer_fused_cached_and_logits_paths_agree(name, num_kv_heads):
    """The layer on the fused C path equals its logits path (masks, causal), and a
    KV-cached decode, one token at a time, equals the full causal pass; with one
    key/value head (multi-query) the cache holds that one head."""
    torch.manual_seed(0)
    encoding = ENCODINGS[name]()
    if num_kv_heads and encoding is not None and encoding.uses_attention_projections:
        with pytest.raises(ValueError, match="num_kv_heads must be num_heads"):
            pnn.PositionalSelfAttention(8, H, encoding, num_kv_heads=num_kv_heads)
        return
    layer = pnn.PositionalSelfAttention(8, H, encoding, causal=True,
                                        num_kv_heads=num_kv_heads).double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[1, -2:] = True
    segments = torch.zeros(2, 7, dtype=torch.long)
    segments[:, 4:] = 1
    fused = layer(x, key_padding_mask=mask, segment_ids=segments)
    layer.fused = False
    plain = layer(x, key_padding_mask=mask, segment_ids=segments)
    layer.fused = True
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)
    out, cache = _decode(layer, x, (4, 5, 6, 7), mask, segment_ids=segments)
    torch.testing.assert_close(out, fused, rtol=1e-12, atol=1e-12)
    assert cache[0].shape == cache[1].shape == (2, num_kv_heads or H, 7, layer.head_dim)


def test_attention_layer_refuses_kv_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads = 2, got 3"):
        pnn.PositionalSelfAttention(8, H, num_kv_heads=3)


def test_attention_layer_masks_and_gradgradcheck():
    torch.manual_seed(0)
    layer = pnn.PositionalSelfAttention(8, H, pnn.T5RelativeBias(H, 8, 16)).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    additive = torch.randn(5, 5, dtype=torch.float64)
    boolean = torch.rand(5, 5) > 0.7
    boolean[:, 0] = False
    for attn_mask in (additive, boolean):
        out = layer(x, attn_mask=attn_mask)
        assert out.shape == (1, 5, 8) and not torch.isnan(out).any()
    assert torch.autograd.gradgradcheck(lambda x: layer(x, causal=True), (x,), atol=1e-5)


@pytest.mark.parametrize("name", ["content", "t5", "tupe", "deberta"])
def test_attention_layer_shapes_fused_cached_and_logits_paths_agree(name):
    """SPEC §7 in the layer: grouped-query heads, a sliding window, packed documents, a
    softcap and learned sinks; the fused C path equals the logits path, a cached decode
    (the cache holding the keys' document ids) the full causal pass, and the sinks learn."""
    torch.manual_seed(0)
    heads = 4
    encodings = {"content": lambda: None, "t5": lambda: pnn.T5RelativeBias(heads, 8, 16),
                 "tupe": lambda: pnn.TUPE(8, heads, 12, relative=True),
                 "deberta": lambda: pnn.DebertaRelative(8, heads, max_relative_positions=6)}
    layer = pnn.PositionalSelfAttention(8, heads, encodings[name](), causal=True, num_kv_heads=2,
                                        window=(3, 0), softcap=2.0, sinks=True).double().eval()
    with torch.no_grad():
        layer.sinks.copy_(torch.randn(heads))
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    documents = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2, 2], [0] * 9])
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1, :2] = True
    fused = layer(x, key_padding_mask=mask, document_ids=documents)
    layer.fused = False
    plain = layer(x, key_padding_mask=mask, document_ids=documents)
    layer.fused = True
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)
    out, cache = _decode(layer, x, (5, 6, 9), mask, document_ids=documents)
    torch.testing.assert_close(out, fused, rtol=1e-12, atol=1e-12)
    assert cache[0].shape[1] == 2 and torch.equal(cache[3], documents)
    layer.train()
    layer(x, document_ids=documents).sum().backward()
    assert layer.sinks.grad is not None and layer.sinks.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="the cache must hold the keys' document ids"):
        layer(x[:, :1], document_ids=documents[:, :1], past_key_value=cache[:2], use_cache=True)


# ------------------------------------------------------------------ the layer's inputs (issue 30)

def test_attention_layer_refuses_integer_masks_as_torch_does():
    """An int64 0/1 attn_mask was added to the logits (+1, nothing masked); torch's MHA
    and SDPA refuse integer masks, and so does the layer; bool masks mask, float add."""
    torch.manual_seed(0)
    layer = pnn.PositionalSelfAttention(8, H, pnn.T5RelativeBias(H, 8, 16)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="attn_mask must be bool .* or floating point .* got "
                                        "torch.int64"):
        layer(x, attn_mask=torch.triu(torch.ones(5, 5, dtype=torch.int64), 1))
    boolean = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    torch.testing.assert_close(layer(x, attn_mask=boolean), layer(x, causal=True),
                               rtol=1e-12, atol=1e-12)
    additive = torch.zeros(5, 5, dtype=torch.float64).masked_fill(boolean, float("-inf"))
    torch.testing.assert_close(layer(x, attn_mask=additive), layer(x, causal=True),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call,exc,message", [
    (lambda layer: layer(torch.randn(5, 8)), ValueError,
     r"x must be \(B, n, d_model\), got shape \(5, 8\) \(add a batch axis"),
    (lambda layer: layer(torch.randn(2, 5, 7)), ValueError,
     r"x must be \(B, n, d_model = 8\), got shape \(2, 5, 7\)"),
    (lambda layer: layer(torch.randn(2, 5, 8), attn_mask=torch.zeros(4, 5, dtype=torch.bool)),
     ValueError, r"attn_mask must be \(n, m\) = \(5, 5\) or \(B\|1, H\|1, n, m\) = "
                 r"\(2\|1, 2\|1, 5, 5\), got \(4, 5\)"),
    (lambda layer: layer(torch.randn(2, 5, 8), attn_mask=torch.zeros(2, 3, 5, 5)), ValueError,
     r"got \(2, 3, 5, 5\)"),
])
def test_attention_layer_input_errors_name_the_argument(call, exc, message):
    layer = pnn.PositionalSelfAttention(8, H)
    with pytest.raises(exc, match=message):
        call(layer)


def test_attention_layer_refuses_a_d_model_that_heads_do_not_divide():
    with pytest.raises(ValueError, match="d_model = 30 is not a multiple of num_heads = 4"):
        pnn.PositionalSelfAttention(30, 4)
    assert pnn.PositionalSelfAttention(30, 4, head_dim=8).q_proj.out_features == 32


# ------------------------------------------------------------------ compile (issue 30)

def test_compiled_layer_with_dropout_has_no_data_dependent_seed():
    """compile(fullgraph=True) of a training layer with dropout failed ('Could not guard
    on data-dependent expression': the seed drawn by .item()); the seed is now an int64
    tensor in the graph: each call draws a new one, and gradients flow."""
    torch.manual_seed(0)
    layer = pnn.PositionalSelfAttention(8, H, pnn.T5RelativeBias(H, 8, 16), causal=True,
                                        dropout=0.5).train()
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    x = torch.randn(2, 5, 8, requires_grad=True)
    first, second = compiled(x), compiled(x)
    assert not torch.equal(first, second)          # two seeds, two dropout masks
    first.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("path", PATHS)
def test_seed_tensor_equals_int_seed(path, rng):
    _, (targs, tkw, tv, tmask) = _inputs("t5", rng)
    call = lambda seed: _run(path, "t5", targs, tkw, tv, tmask, dropout_p=0.4, seed=seed).out  # noqa: E731
    expected = call(12345)
    torch.testing.assert_close(call(torch.tensor(12345)), expected, rtol=0, atol=0)
    # a negative int64 is its value mod 2**64, as the schema's int64 carries large seeds
    torch.testing.assert_close(call(torch.tensor(-1)), call(2**64 - 1), rtol=0, atol=0)
    with pytest.raises(TypeError, match="seed must be an int or an integer 0-dim CPU "
                                        "tensor, got a torch.float32 tensor"):
        call(torch.tensor(1.0))
    if path == "c":
        compiled = torch.compile(call, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(torch.tensor(12345)), expected, rtol=1e-12,
                                   atol=1e-12)


def test_compiled_decoding_loop_compiles_once():
    """query_offset is a SymInt in the ops' schemas: a compiled step whose offset grows
    by one each step compiled anew each time (FailOnRecompileLimitHit at the 9th)."""
    torch.manual_seed(0)
    bias = torch.randn(H, 32)

    def step(q, k, v):
        return pt.t5_attention(q, k, v, bias, causal=True, query_offset=k.shape[2] - 1).out

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="eager")
    k, v = torch.randn(1, H, 3, D), torch.randn(1, H, 3, D)
    for t in range(20):
        q = torch.randn(1, H, 1, D)
        k, v = torch.cat([k, torch.randn(1, H, 1, D)], 2), torch.cat([v, torch.randn(1, H, 1, D)], 2)
        with torch.compiler.set_stance("fail_on_recompile") if t else contextlib.nullcontext():
            out = compiled(q, k, v)
        torch.testing.assert_close(out, step(q, k, v), rtol=1e-6, atol=1e-6)
