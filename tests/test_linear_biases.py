"""The biases of the offset with parameters (spec §3.13-3.15): alibi, kerple (log and
power kernels) and relative_bias, on the engine's per-offset table.  Every ISA and
dtype against the reference, with the parameters' gradients; float64 finite
differences of the logits and of the fused attention in every parameter; kerple
against its formula written here; alibi_slopes and HuggingFace BLOOM's
build_alibi_tensor (12 and 10 heads: a power of two and not) giving the same
attention; the modules' parametrisations."""

import math

import numpy as np
import pytest

import posenc
from posenc import reference, testing
from posenc._examples import make_inputs, trainable_inputs, with_inputs
from test_attention_reference import numeric_gradients

try:                # a module-level importorskip would skip the NumPy tests too
    import torch

    import posenc.torch as pt
    from posenc.torch import nn as pnn
except ImportError:
    torch = pt = pnn = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install torch)")

DTYPES = ["float32", "float64", "float16"] + (["bfloat16"] if posenc._dtypes.BFLOAT16 else [])
CASES = [("alibi", {}), ("kerple", {"kind": "log"}), ("kerple", {"kind": "power"}),
         ("relative_bias", {})]
IDS = ["alibi", "kerple-log", "kerple-power", "relative_bias"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method, options", CASES, ids=IDS)
def test_every_isa_and_dtype(posenc_isa, method, options, dtype, rng):
    np_dtype = posenc._dtypes.by_name(dtype)
    for n, m, d, offset, shared in ((1, 1, 1, 0, False), (7, 17, 3, 2, True),
                                    (33, 9, 16, 0, False), (5, 65, 7, 40, True)):
        args, kwargs = make_inputs(method, 2, 3, n, m, d, dtype=np_dtype, rng=rng, shared=shared)
        kwargs = dict(kwargs, **options, query_offset=offset)
        testing.assert_logits_close(getattr(posenc, method)(*args, **kwargs), method, *args,
                                    **kwargs)
        testing.assert_grads_close(getattr(posenc, method + "_backward"), method, *args, **kwargs)
        v = rng.standard_normal((2, 3, m, 4)).astype(np_dtype)
        attention = dict(causal=True, dropout_p=0.1, seed=7)
        got = getattr(posenc, method + "_attention")(args[0], args[1], v, *args[2:], **kwargs,
                                                    **attention)
        testing.assert_attention_close(got, method, args[0], args[1], v, *args[2:], **kwargs,
                                       **attention)


@pytest.mark.parametrize("method, options", CASES, ids=IDS)
def test_finite_differences(method, options, rng):
    """float64: every parameter's gradient (and q's, k's) through the logits and the
    fused attention (causal, padding, query_offset) equals central differences."""
    args, kwargs = make_inputs(method, 2, 2, 4, 6, 3, rng=rng)
    kwargs = dict(kwargs, **options)
    v = rng.standard_normal((2, 2, 6, 3))
    mask = np.zeros((2, 6), dtype=bool)
    mask[1, -2:] = True
    attention = dict(causal=True, key_padding_mask=mask, query_offset=2)
    weights = rng.standard_normal((2, 2, 4, 3))
    G = rng.standard_normal((2, 2, 4, 6))
    floats = trainable_inputs(method, args, kwargs)

    def loss(values):
        a, kw = with_inputs(method, args, kwargs, values)
        logits = getattr(posenc, method)(*a, **kw, query_offset=2)
        out = getattr(posenc, method + "_attention")(a[0], a[1], v, *a[2:], **kw, **attention).out
        return float((G * logits).sum() + (weights * out).sum())

    result = getattr(posenc, method + "_attention")(args[0], args[1], v, *args[2:], **kwargs,
                                                   **attention)
    grads = getattr(posenc, method + "_attention_backward")(
        weights, args[0], args[1], v, *args[2:], result.out, result.lse, **kwargs, **attention)
    logit_grads = getattr(posenc, method + "_backward")(G, *args, **kwargs, query_offset=2)
    for name, numeric in numeric_gradients(loss, floats).items():
        analytic = getattr(grads, name) + getattr(logit_grads, name)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-6, err_msg=name)


def test_kerple_is_its_formula(posenc_isa, rng):
    """KERPLE (Chi et al. 2022, §4): -r1 log(1 + r2 |j - i|) and -r1 |j - i|^r2, written
    here apart from posenc.reference, with 0^r2 = 0 on the diagonal."""
    args, _ = make_inputs("kerple", 2, 3, 6, 8, 4, rng=rng)
    q, k, r1, r2 = args
    content = np.einsum("bhid,bhjd->bhij", q, k) / 2.0
    distance = np.abs(np.arange(8)[None, :] - (np.arange(6)[:, None] + 1))
    for kind, kernel in (("log", lambda r: np.log(1 + r * distance)),
                         ("power", lambda r: np.where(distance == 0, 0.0, distance ** r))):
        want = content - np.stack([r1[h] * kernel(r2[h]) for h in range(3)])[None]
        got = posenc.kerple(q, k, r1, r2, kind=kind, query_offset=1)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13, err_msg=kind)


def test_alibi_far_query_offset(rng):
    """A decoding step far down a sequence: the bias -m |j - i'| at i' = query_offset,
    in float64, equals the reference's (the engine's table is built in float64)."""
    args, kwargs = make_inputs("alibi", 1, 2, 1, 40, 8, rng=rng)
    offset = 10 ** 12
    got = posenc.alibi(*args, **kwargs, query_offset=offset)
    want = reference.alibi(*args, **kwargs, query_offset=offset)
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert got.min() < -1e10


def test_kerple_rejects_an_unknown_kind():
    q = np.zeros((1, 1, 2, 2))
    for namespace in (posenc, reference):
        with pytest.raises(ValueError, match="kind must be one of 'log', 'power', got 'poly'"):
            namespace.kerple(q, q, np.ones(1), np.ones(1), kind="poly")
        with pytest.raises(TypeError, match="kind must be a str"):
            namespace.kerple(q, q, np.ones(1), np.ones(1), kind=2)


# ------------------------------------------------------------------ ALiBi's slopes

def test_alibi_slopes_follow_the_paper():
    for heads in (1, 2, 4, 8, 16, 32):             # powers of two: 2^(-8 t / H)
        np.testing.assert_allclose(posenc.alibi_slopes(heads),
                                   2.0 ** (-8.0 * np.arange(1, heads + 1) / heads), rtol=1e-15)
    # 12 = 8 + 4: the 8 of 8 heads, then the odd-numbered of 16's (t = 1, 3, 5, 7)
    np.testing.assert_allclose(posenc.alibi_slopes(12),
                               np.concatenate([2.0 ** -np.arange(1, 9),
                                               2.0 ** (-np.arange(1, 8, 2) / 2)]), rtol=1e-15)
    assert posenc.alibi_slopes(10).shape == (10,) and posenc.alibi_slopes(10).dtype == np.float64
    for bad, error in ((0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="num_heads"):
            posenc.alibi_slopes(bad)


@needs_torch
@pytest.mark.parametrize("heads", [12, 10])
def test_bloom_alibi_attention(heads, rng):
    """HF BLOOM: build_alibi_tensor's slopes are posenc.alibi_slopes (to float32
    rounding: BLOOM computes them in float32), and with them its attention -- alibi + q k^T / sqrt(d), causal and padding masks, softmax, v --
    equals posenc's alibi_attention for the valid queries of a left-padded batch:
    BLOOM's m (j - pad) and ALiBi's -m |j - i| differ by a constant per row."""
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    B, n, d = 2, 9, 4
    pad = np.array([0, 3])
    valid = np.arange(n)[None] >= pad[:, None]
    alibi = build_alibi_tensor(torch.from_numpy(valid.astype(np.int64)), heads, torch.float64)
    slopes = alibi.view(B, heads, n)[0, :, 1]                    # position 1 of the unpadded row
    # BLOOM computes them in float32: the paper's slopes to float32 rounding
    np.testing.assert_allclose(slopes.numpy(), posenc.alibi_slopes(heads), rtol=2 ** -23)
    q, k, v = (torch.from_numpy(rng.standard_normal((B, heads, n, d))) for _ in range(3))
    scores = alibi.view(B, heads, 1, n) + q @ k.transpose(-1, -2) / math.sqrt(d)
    allowed = torch.from_numpy(np.tril(np.ones((n, n), dtype=bool))[None] & valid[:, None, :])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    want = torch.softmax(scores, dim=-1) @ v
    got = pt.alibi_attention(q, k, v, slopes, causal=True,
                             key_padding_mask=torch.from_numpy(~valid))
    rows = torch.from_numpy(valid)[:, None, :, None].expand_as(want)
    # BLOOM's alibi is m * position rounded to float32 (its product's dtype): the
    # attention moves by at most 2 max|logit change| max|v| (a softmax's Lipschitz bound)
    positions = torch.from_numpy((np.cumsum(valid, axis=1) - 1) * valid)
    exact = slopes[None, :, None] * positions[:, None, :]
    rounding = (alibi.view(B, heads, n) - exact).abs().max()
    assert 0 < rounding <= 2 ** -24 * exact.abs().max()
    assert (got.out - want)[rows].abs().max() <= 2 * rounding * v.abs().max()
    # and BLOOM's formula with its product in float64: equal to rounding
    scores = exact[:, :, None, :] + q @ k.transpose(-1, -2) / math.sqrt(d)
    exact_out = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1) @ v
    assert (got.out - exact_out)[rows].abs().max() <= 1e-12


@needs_torch
def test_modules_keep_their_parameters_positive(rng):
    alibi = pnn.ALiBi(10)
    assert not list(alibi.parameters())                      # the paper's: fixed slopes
    torch.testing.assert_close(alibi.slopes.double(),
                               torch.from_numpy(posenc.alibi_slopes(10)), rtol=1e-6, atol=0)
    learnable = pnn.ALiBi(4, learnable=True).double()
    kerple = pnn.KERPLE(4, "log").double()
    q = torch.from_numpy(rng.standard_normal((2, 4, 5, 8)))
    for module in (learnable, kerple):
        optimizer = torch.optim.SGD(module.parameters(), lr=50.0)    # a step far past zero
        for _ in range(3):
            optimizer.zero_grad()
            module.attention(q, q, q, causal=True).out.square().sum().backward()
            assert all(p.grad is not None and torch.isfinite(p.grad).all()
                       for p in module.parameters())
            optimizer.step()
        method, keywords = module.arguments(q, q)
        for name in ("slopes", "r1", "r2"):
            if name in keywords:
                assert (keywords[name] > 0).all(), (method, name)
    with pytest.raises(ValueError, match="kind must be 'log' or 'power'"):
        pnn.KERPLE(4, "cubic")


@needs_torch
def test_relative_bias_trains_its_function_of_the_offset(rng):
    """RelativeBias with bias_fn: the table's gradient from the fused kernels reaches
    the function's parameters (as autograd through the native formula does)."""
    torch.manual_seed(0)
    function = torch.nn.Sequential(torch.nn.Unflatten(0, (-1, 1)), torch.nn.Linear(1, 8),
                                   torch.nn.Tanh(), torch.nn.Linear(8, 3))

    class Transpose(torch.nn.Module):
        def forward(self, x):          # (2t + 1, H) -> (H, 2t + 1)
            return x.transpose(0, 1)

    module = pnn.RelativeBias(3, 4, bias_fn=torch.nn.Sequential(function, Transpose())).double()
    q = torch.from_numpy(rng.standard_normal((2, 3, 6, 4)))
    grads = []
    for native in (False, True):
        module.zero_grad()
        with pt.use_native(native):
            module.attention(q, q, q, causal=True).out.square().sum().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for c_grad, native_grad in zip(*grads):
        assert c_grad.abs().max() > 0
        torch.testing.assert_close(c_grad, native_grad, rtol=1e-10, atol=1e-12)
