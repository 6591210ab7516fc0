"""posenc.torch on bfloat16 and float16 CPU tensors (issue 16): the C kernels
through the custom ops, and CPU autocast.

* Every method's logits and fused attention, forward and backward, on bf16
  and fp16 tensors against the float64 computation from the very same
  (rounded) inputs, element by element within the bound of
  docs/low_precision.md §4: ``u |ref| + (1 + u) E32`` (``u = 2^-8`` bfloat16,
  ``2^-11`` float16, ``E32`` the float32 bound of docs/validation.md, plus
  ``2^-25`` for float16's subnormal range).  Gradients are compared
  gradcheck-style with float64 autograd through the same op.
* ``torch.autocast("cpu", ...)`` around a ``PositionalSelfAttention`` of every
  encoding: forward and backward against the float32 layer; float32 parameters get float32
  gradients; the custom ops called directly follow the region's dtype.
* ``torch.compile(fullgraph=True)`` of bf16 ops, and of an autocast region,
  equals eager bit for bit.  (Hugging Face models: tests/test_hf.py.)
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

import posenc.reference as ref  # noqa: E402
import posenc.torch as pt  # noqa: E402
from posenc import _dtypes  # noqa: E402
from posenc._check import (attention_bounds, bound, grad_magnitudes,  # noqa: E402
                           logit_operands_rounded, magnitude, magnitude_coefficient)
from posenc._examples import dense_rank, float_inputs, key_count, make_inputs, with_inputs  # noqa: E402
from posenc._registry import METHODS, REGISTRY  # noqa: E402
from posenc.torch import nn as pnn  # noqa: E402
from posenc.torch._common import to_c_array, to_numpy, to_tensor  # noqa: E402

# awkward sizes: odd n, m, d, dv
B, H, N, M, D, DV = 2, 3, 9, 7, 5, 3
DTYPES = (torch.bfloat16, torch.float16)
IDS = ("bf16", "fp16")
NUMPY = {torch.bfloat16: _dtypes.BFLOAT16, torch.float16: _dtypes.FLOAT16}
UNIT_ROUNDOFF = {dtype: _dtypes.UNIT_ROUNDOFF[NUMPY[dtype].name] for dtype in DTYPES}
ATTENTION = dict(causal=True, query_offset=2)

pytestmark = pytest.mark.usefixtures("one_thread")   # tiny problems (conftest.py)


# ------------------------------------------------------------------ helpers

def _bound(dtype, reference, bound32):
    """docs/low_precision.md §4: u |reference| + (1 + u) E32 (+ float16's subnormal step)."""
    return bound(reference, bound32, NUMPY[dtype])


def _assert_within(got, want, tolerance, what):
    got = got.detach().double().numpy()
    assert got.shape == want.shape, what
    error = np.abs(got - want)
    outside = ~(error <= tolerance)
    if outside.any():
        index = np.unravel_index(np.argmax(np.nan_to_num(error / tolerance, nan=np.inf)), error.shape)
        raise AssertionError(f"{what}: at {index} got {got[index]:.8g}, float64 {want[index]:.8g}, "
                             f"error {error[index]:.3g} > bound {tolerance[index]:.3g}; "
                             f"{int(outside.sum())} of {error.size} outside")


def _keys(method) -> int:
    """M, or the keys fox needs (every query among them, at the attention's offset)."""
    return key_count(method, N, M, ATTENTION["query_offset"])


def _rounded(method, dtype, rng, attention=False):
    """The inputs drawn in float64 and rounded to `dtype`: (args64, kwargs64) with
    the rounded values exactly in float64, and {name: rounded float64 array}
    of the float inputs (v too for the attention)."""
    args, kwargs = make_inputs(method, B, H, N, _keys(method), D, rng=rng)
    floats = dict(float_inputs(method, args, kwargs))
    if attention:
        floats["v"] = rng.standard_normal((B, H, _keys(method), DV))
    exact = {name: torch.from_numpy(x).to(dtype).double().numpy() for name, x in floats.items()}
    args64, kwargs64 = with_inputs(method, args, kwargs, exact)
    return args64, kwargs64, exact


def _call(method, args64, kwargs64, exact, dtype, attention=None):
    """posenc.torch.<method> (or its attention with the keywords `attention`) on
    leaves of `dtype` made from the float64 values; (result, leaves by name)."""
    constant = REGISTRY[method].constant               # RoPE's tables: no gradient
    leaves = {name: torch.from_numpy(x).to(dtype).requires_grad_(name not in constant)
              for name, x in exact.items()}
    tensor = lambda x: torch.from_numpy(x) if isinstance(x, np.ndarray) else x   # noqa: E731
    args, kwargs = with_inputs(method, [tensor(a) for a in args64],
                               {key: tensor(x) for key, x in kwargs64.items()}, leaves)
    if attention is None:
        return getattr(pt, method)(*args, **kwargs), leaves
    return getattr(pt, method + "_attention")(*args[:2], leaves["v"], *args[2:], **kwargs,
                                              **attention), leaves


def _trainable(leaves: dict) -> dict:
    """The leaves with a gradient."""
    return {name: leaf for name, leaf in leaves.items() if leaf.requires_grad}


def _upstream(rng, shape, dtype):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


# ------------------------------------------------------------------ logits

@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("method", METHODS)
def test_logits_forward_and_backward(method, dtype, rng):
    args64, kwargs64, exact = _rounded(method, dtype, rng)
    logits, leaves = _call(method, args64, kwargs64, exact, dtype)
    assert logits.dtype == dtype
    want = getattr(ref, method)(*args64, **kwargs64)
    depth = D + dense_rank(method, args64, kwargs64)
    coefficient = magnitude_coefficient(depth, NUMPY[dtype], logit_operands_rounded(method))
    _assert_within(logits, want, _bound(dtype, want, coefficient * magnitude(
        method, args64, kwargs64)), f"{method} logits")

    # gradcheck-style: the gradients against float64 autograd through the same op,
    # with the same (rounded) upstream gradient
    G = _upstream(rng, want.shape, dtype)
    leaves = _trainable(leaves)
    grads = torch.autograd.grad(logits, list(leaves.values()), G)
    logits64, leaves64 = _call(method, args64, kwargs64, exact, torch.float64)
    grads64 = torch.autograd.grad(logits64, list(_trainable(leaves64).values()), G.double())
    magnitudes = grad_magnitudes(method, np.abs(G.double().numpy()), args64, kwargs64)
    depth += N + _keys(method)
    for name, grad, grad64 in zip(leaves, grads, grads64):
        assert grad.dtype == dtype, name
        want = grad64.numpy()
        _assert_within(grad, want, _bound(dtype, want, magnitude_coefficient(
            depth, NUMPY[dtype], rounded_operands=True) * magnitudes[name]),
            f"{method} gradient {name}")


# ------------------------------------------------------------------ fused attention

def _delta_term(method, args64, kwargs64, d_out64, out64, options):
    """The backward's bound for reading the rounded `out`: delta_i = Σ dO_i·out_i
    (the softmax's row term) has an error up to u Σ|dO_i||out_i| when out is
    rounded to u; it enters dS = P∘(dP − delta) as P_ij times that, and q, k and
    the tables through the logits' backward on |inputs|.  Returned without u:
    {field: bound / u}; v's gradient (Pᵀ dO) does not read delta."""
    m = _keys(method)
    eye = np.broadcast_to(np.eye(m), (B, H, m, m))      # v = I: out = the probabilities
    P = getattr(ref, method + "_attention")(*args64[:2], eye, *args64[2:], **kwargs64,
                                            **options).out          # softmax(A + mask)
    spread = P * np.einsum("bhid,bhid->bhi", np.abs(d_out64), np.abs(out64))[..., None]
    terms = grad_magnitudes(method, spread, args64, kwargs64,
                            query_offset=options.get("query_offset", 0))
    return dict(terms, v=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("method", METHODS)
def test_attention_forward_and_backward(method, dtype, rng):
    args64, kwargs64, exact = _rounded(method, dtype, rng, attention=True)
    v64 = exact["v"]
    mask = np.zeros((B, _keys(method)), dtype=bool)
    mask[1, -2:] = True
    options = dict(ATTENTION, key_padding_mask=mask)
    got, leaves = _call(method, args64, kwargs64, exact, dtype,
                        dict(ATTENTION, key_padding_mask=torch.from_numpy(mask)))
    assert got.out.dtype == dtype and got.lse.dtype == torch.float32
    d_out = _upstream(rng, (B, H, N, DV), dtype)
    d_out64 = d_out.double().numpy()
    want, out_bound, lse_bound, grad_bounds = attention_bounds(method, args64, kwargs64, v64,
                                                               options, d_out64, NUMPY[dtype])
    _assert_within(got.out, want.out, _bound(dtype, want.out, out_bound), f"{method} out")
    _assert_within(got.lse, want.lse, lse_bound, f"{method} lse")     # float32: its own bound

    leaves = _trainable(leaves)
    grads = torch.autograd.grad(got.out, list(leaves.values()), d_out)
    got64, leaves64 = _call(method, args64, kwargs64, exact, torch.float64,
                            dict(ATTENTION, key_padding_mask=torch.from_numpy(mask)))
    grads64 = torch.autograd.grad(got64.out, list(_trainable(leaves64).values()), d_out.double())
    u = UNIT_ROUNDOFF[dtype]
    delta = _delta_term(method, args64, kwargs64, d_out64, want.out, options)
    for name, grad, grad64 in zip(leaves, grads, grads64):
        assert grad.dtype == dtype, name
        want_grad = grad64.numpy()
        bound32 = grad_bounds[name] + u * (1 + u) * delta[name]
        _assert_within(grad, want_grad, _bound(dtype, want_grad, bound32),
                       f"{method} attention gradient {name}")


# ------------------------------------------------------------------ autocast

ENCODINGS = {
    "content": lambda: None, "t5": lambda: pnn.T5RelativeBias(4, 16, 32),
    "shaw": lambda: pnn.ShawRelative(4, 8, 6), "m2": lambda: pnn.M2Relative(4, 6),
    "m4": lambda: pnn.M4Relative(4, 8, 6), "m4m": lambda: pnn.M4MRelative(4, 8, 6),
    "deberta": lambda: pnn.DebertaRelative(32, 4, max_relative_positions=8),
    "tupe": lambda: pnn.TUPE(32, 4, 12, relative=True),
    "diet_abs": lambda: pnn.DIETAbs(4, 12, 3, num_segments=2),
    "diet_rel": lambda: pnn.DIETRel(4, 6, num_segments=2),
    "relative_bias": lambda: pnn.RelativeBias(4, 6),
    "alibi": lambda: pnn.ALiBi(4, learnable=True),
    "kerple": lambda: pnn.KERPLE(4, "power"),
    "rope": lambda: pnn.RotaryEmbedding(4, 8, rotary_dim=6, interleaved=True),
    "cope": lambda: _trained(pnn.CoPE(4, 8, 6, per_head=True))}


def _trained(encoding):
    """The encoding with its parameters drawn (CoPE's table starts at zero)."""
    with torch.no_grad():
        for parameter in encoding.parameters():
            parameter.normal_()
    return encoding
SEGMENTS = torch.tensor([[0] * 5 + [1] * 7, [0] * 8 + [1] * 4])


def _loss_and_grads(layer, x, autocast_dtype=None, **kwargs):
    layer.zero_grad()
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        y = layer(x, **kwargs)
    loss = (y.float() ** 2).mean()
    loss.backward()
    return y, loss.detach(), {k: p.grad.clone() for k, p in layer.named_parameters()}


# Tolerance of the autocast runs against float32: every Linear and the posenc op
# round their inputs and results to u, a handful of roundings in a row, so the
# loss within 16 u relative and each submodule's gradient (a Linear's weight and
# bias together) within 16 u normwise; measured over these layers: the loss
# within 0.4 u, the gradients 2.5 u (bf16) and 7.9 u (fp16, DIET-ABS's tables).  Per submodule, not per parameter: a key projection's bias gets a
# gradient that is zero by structure (adding one vector to every key shifts each
# row of logits by a constant, which the softmax ignores), float32 noise of 1e-9
# that no relative measure of its own could pass.
AUTOCAST_TOLERANCE = 16


def _by_module(grads):
    grouped = {}
    for key, grad in grads.items():
        grouped.setdefault(key.rpartition(".")[0], []).append(grad.flatten())
    return {module: torch.cat(parts) for module, parts in grouped.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name, fused", [(name, True) for name in ENCODINGS] + [("t5", False)],
                         ids=list(ENCODINGS) + ["t5-logits-path"])
def test_autocast_self_attention(name, fused, dtype):
    torch.manual_seed(0)
    layer = pnn.PositionalSelfAttention(32, 4, ENCODINGS[name](), causal=name == "t5", fused=fused)
    x = torch.randn(2, 12, 32)
    kwargs = dict(segment_ids=SEGMENTS) if name.startswith("diet") else {}
    y32, loss32, grads32 = _loss_and_grads(layer, x, **kwargs)
    y, loss, grads = _loss_and_grads(layer, x, dtype, **kwargs)
    assert y.dtype == dtype          # out_proj, a Linear, in autocast's dtype
    tolerance = AUTOCAST_TOLERANCE * UNIT_ROUNDOFF[dtype]
    assert abs(float(loss) - float(loss32)) <= tolerance * float(loss32), (float(loss), float(loss32))
    assert grads.keys() == grads32.keys()
    assert all(grad.dtype == torch.float32 for grad in grads.values())
    expected = _by_module(grads32)
    for module, grad in _by_module(grads).items():
        error = float((grad - expected[module]).norm() / expected[module].norm())
        assert error <= tolerance, (module, error / UNIT_ROUNDOFF[dtype])


def test_autocast_casts_only_what_autocast_casts():
    """Inside the region: float32 inputs of an op run in autocast's dtype (float16
    too), float64 ones stay float64; the custom ops called directly do the same;
    outside the region, mixed dtypes are the checker's TypeError."""
    q = torch.randn(1, 2, 5, 4)
    bias = torch.randn(2, 32, requires_grad=True)
    for dtype in DTYPES:
        with torch.autocast("cpu", dtype=dtype):
            logits = pt.t5(q, q, bias)
            direct = torch.ops.posenc.t5(q, q, bias, 32, 128, True, None, 0)
            # (v, q, k, scale, query_offset, sinks, causal, key_padding_mask, window,
            #  document_q, document_k, softcap, dropout_p, seed)
            attention = torch.ops.posenc.content_attention(q, q, q, None, 0, None, False, None,
                                                           None, None, None, None, 0.0,
                                                           torch.tensor(0))
            assert pt.content(q.double(), q.double()).dtype == torch.float64
        assert logits.dtype == direct.dtype == attention[0].dtype == dtype
        assert attention[1].dtype == torch.float32
        torch.testing.assert_close(logits, direct, rtol=0, atol=0)
        logits.float().sum().backward()
        assert bias.grad.dtype == torch.float32
    with pytest.raises(TypeError, match="share one dtype"):
        pt.t5(q.bfloat16(), q.bfloat16(), bias)


# ------------------------------------------------------------------ torch.compile

def test_compile_bf16_equals_eager(rng):
    args64, kwargs64, exact = _rounded("t5", torch.bfloat16, rng, attention=True)
    q, k, bias, v = (torch.from_numpy(exact[name]).bfloat16().requires_grad_()
                     for name in ("q", "k", "bias", "v"))
    options = {key: kwargs64[key] for key in ("num_buckets", "max_distance") if key in kwargs64}

    def layer(q, k, v, bias):
        logits = pt.t5(q, k, bias, **options)
        return logits, pt.t5_attention(q, k, v, bias, **options, causal=True)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    results = [fn(q, k, v, bias) for fn in (layer, compiled)]
    for logits, attention in results:
        assert logits.dtype == attention.out.dtype == torch.bfloat16
        assert attention.lse.dtype == torch.float32
    (logits, attention), (logits_c, attention_c) = results
    assert torch.equal(logits, logits_c) and torch.equal(attention.out, attention_c.out)
    assert torch.equal(attention.lse, attention_c.lse)
    grads = [torch.autograd.grad(lg.float().sum() + at.out.float().sum(), (q, k, v, bias))
             for lg, at in results]
    for eager, compiled_grad in zip(*grads):
        assert compiled_grad.dtype == torch.bfloat16
        assert torch.equal(eager, compiled_grad)


def test_compile_under_autocast_equals_eager():
    """An autocast region inside a compiled function: the ops' casts are traced."""
    torch.manual_seed(0)
    q, k = (torch.randn(2, 3, 9, 5, requires_grad=True) for _ in range(2))
    bias = torch.randn(3, 32, requires_grad=True)

    def scores(q, k, bias):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return pt.t5(q, k, bias)

    compiled = torch.compile(scores, fullgraph=True, backend="aot_eager")
    results = [fn(q, k, bias) for fn in (scores, compiled)]
    assert results[0].dtype == results[1].dtype == torch.bfloat16
    assert torch.equal(*results)
    grads = [torch.autograd.grad(r.float().square().sum(), (q, k, bias)) for r in results]
    for eager, compiled_grad in zip(*grads):
        assert compiled_grad.dtype == torch.float32
        assert torch.equal(eager, compiled_grad)


# ------------------------------------------------------------------ conversions

def test_bfloat16_views_without_copy():
    import ml_dtypes

    x = torch.randn(3, 4, 6).bfloat16()
    strided = x.transpose(1, 2)
    view = to_numpy("q", strided)
    assert view.dtype == ml_dtypes.bfloat16 and np.shares_memory(view, x.view(torch.int16).numpy())
    np.testing.assert_array_equal(view.astype(np.float32), strided.float().numpy())
    contiguous = to_c_array("q", strided)
    assert contiguous.flags.c_contiguous
    back = to_tensor(contiguous)
    assert back.dtype == torch.bfloat16 and torch.equal(back, strided)
    assert to_tensor(np.zeros(2, np.float16)).dtype == torch.float16
    with pytest.raises(TypeError, match="q must have dtype float32, float64, bfloat16"):
        to_c_array("q", torch.zeros(2, dtype=torch.float8_e4m3fn))


def test_bfloat16_without_ml_dtypes(monkeypatch):
    monkeypatch.setattr(_dtypes, "BFLOAT16", None)           # as posenc without ml_dtypes
    q = torch.randn(1, 1, 2, 3).bfloat16()
    with pytest.raises(TypeError, match=r"needs ml_dtypes, which is not installed: pip install ml_dtypes"):
        to_c_array("q", q)                                   # NumPy cannot hold it
    with pt.use_native():                                    # the native formula needs none
        want = pt.content(q, q)
    # the ops run the native formula where the C kernels cannot read bfloat16, as under
    # autocast to bfloat16 (a patched bfloat16 HF model raised a TypeError in every call)
    torch.testing.assert_close(pt.content(q, q), want, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = pt.content_attention(q.float(), q.float(), q.float()).out
    assert got.dtype == torch.bfloat16
