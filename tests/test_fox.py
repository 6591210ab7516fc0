"""FoX, the Forgetting Transformer's decay (spec §3.17), the engine's first term
module (csrc/terms.h, csrc/engine/term_fox_impl.h).  Every ISA and dtype against
the reference on odd sizes, with and without the reverse gates, shared gates,
query offsets, the fused attention (causal with dropout, padding; the other
shapes of spec §7 run for every method in test_attention_shapes.py) and decoding
steps equal to the full call's rows (grouped-query heads); float64 finite differences of the gates' gradients through the logits
and the attention; non-finite gates summed as the formula reads; one and two
threads bitwise; the error of a query past the keys; fidelity against
x-transformers' DataDependentAlibi (causal and bidirectional); the nn module in a
layer, its cache, and the HF swap's decoding steps."""

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


def _gates(rng, B, H, m, dtype=np.float64, shift=2.0):
    """FoX's log forget gates: log sigmoid of a linear map of the input."""
    return (-np.logaddexp(0.0, -(rng.standard_normal((B, H, m)) + shift))).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_isa_and_dtype(posenc_isa, dtype, rng):
    np_dtype = posenc._dtypes.by_name(dtype)
    for n, m, d, offset, shared, reverse in ((1, 1, 1, 0, False, False), (7, 17, 3, 2, True, True),
                                            (33, 33, 16, 0, False, True), (5, 65, 7, 40, True, False),
                                            (17, 18, 5, 1, False, False)):
        args, kwargs = make_inputs("fox", 2, 3, n, m, d, dtype=np_dtype, rng=rng, shared=shared)
        if not reverse:
            kwargs.pop("log_fgate_reverse")
        kwargs = dict(kwargs, query_offset=offset)
        testing.assert_logits_close(posenc.fox(*args, **kwargs), "fox", *args, **kwargs)
        testing.assert_grads_close(posenc.fox_backward, "fox", *args, **kwargs)
        v = rng.standard_normal((2, 3, m, 4)).astype(np_dtype)
        padding = np.zeros((2, m), dtype=bool)
        padding[1, m // 2:] = True
        for attention in (dict(causal=True, dropout_p=0.1, seed=7),
                          dict(causal=False, key_padding_mask=padding)):
            got = posenc.fox_attention(args[0], args[1], v, *args[2:], **kwargs, **attention)
            testing.assert_attention_close(got, "fox", args[0], args[1], v, *args[2:], **kwargs,
                                           **attention)


def test_the_formula_written_here(posenc_isa, rng):
    """D_ij = sum of the gates l = j+1 .. i' (j <= i'), of the reverse gates i'+1 .. j
    (j > i'), each sum written out here apart from posenc.reference."""
    B, H, n, m, d, offset = 2, 3, 5, 9, 4, 3
    q, k = rng.standard_normal((B, H, n, d)), rng.standard_normal((B, H, m, d))
    gates, back = _gates(rng, B, H, m), _gates(rng, B, 1, m)
    want = np.einsum("bhid,bhjd->bhij", q, k) / 2.0
    for b, h, i, j in np.ndindex(B, H, n, m):
        t = offset + i
        want[b, h, i, j] += (sum(gates[b, h, l] for l in range(j + 1, t + 1)) if j <= t else
                             sum(back[b, 0, l] for l in range(t + 1, j + 1)))
    got = posenc.fox(q, k, gates, log_fgate_reverse=back, query_offset=offset)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_finite_differences(rng):
    """float64: the gates' gradients (and q's, k's) through the logits and the fused
    attention (bidirectional gates, padding, a query offset) equal central differences."""
    args, kwargs = make_inputs("fox", 2, 2, 4, 7, 3, rng=rng)
    v = rng.standard_normal((2, 2, 7, 3))
    mask = np.zeros((2, 7), dtype=bool)
    mask[1, -2:] = True
    attention = dict(causal=False, key_padding_mask=mask, query_offset=2)
    weights = rng.standard_normal((2, 2, 4, 3))
    G = rng.standard_normal((2, 2, 4, 7))
    floats = trainable_inputs("fox", args, kwargs)

    def loss(values):
        a, kw = with_inputs("fox", args, kwargs, values)
        logits = posenc.fox(*a, **kw, query_offset=2)
        out = posenc.fox_attention(a[0], a[1], v, *a[2:], **kw, **attention).out
        return float((G * logits).sum() + (weights * out).sum())

    result = posenc.fox_attention(args[0], args[1], v, *args[2:], **kwargs, **attention)
    grads = posenc.fox_attention_backward(weights, args[0], args[1], v, *args[2:], result.out,
                                          result.lse, **kwargs, **attention)
    logit_grads = posenc.fox_backward(G, *args, **kwargs, query_offset=2)
    assert set(floats) == {"q", "k", "log_fgate", "log_fgate_reverse"}
    for name, numeric in numeric_gradients(loss, floats).items():
        analytic = getattr(grads, name) + getattr(logit_grads, name)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-6, err_msg=name)


def test_causal_attention_never_reads_the_reverse_gates(rng):
    """Under causal attention the keys after i' are masked: the reverse gates change
    nothing and get a zero gradient, even when one is NaN."""
    args, kwargs = make_inputs("fox", 1, 2, 6, 6, 4, rng=rng)
    v = rng.standard_normal((1, 2, 6, 3))
    plain = posenc.fox_attention(args[0], args[1], v, args[2], causal=True)
    back = kwargs["log_fgate_reverse"].copy()
    back[0, 1, 3] = np.nan
    both = posenc.fox_attention(args[0], args[1], v, args[2], log_fgate_reverse=back, causal=True)
    np.testing.assert_array_equal(both.out, plain.out)
    grads = posenc.fox_attention_backward(np.ones_like(both.out), args[0], args[1], v, args[2],
                                          both.out, both.lse, log_fgate_reverse=back, causal=True)
    np.testing.assert_array_equal(grads.log_fgate_reverse, np.zeros_like(back))


@pytest.mark.parametrize("bad", [-np.inf, np.inf, np.nan])
def test_a_gate_that_is_not_finite(posenc_isa, bad, rng):
    """A gate of -inf (a forget gate of exactly 0), +inf or NaN reaches the sums that
    hold it, as IEEE arithmetic says, and no other: the kernels sum such rows as the
    formula reads instead of differencing prefix sums (inf - inf)."""
    args, kwargs = make_inputs("fox", 1, 2, 7, 7, 4, rng=rng)
    gates = args[2].copy()
    gates[0, 1, 3] = bad
    got = posenc.fox(args[0], args[1], gates, **kwargs)
    want = reference.fox(args[0], args[1], gates, **kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    hit = ~np.isfinite(want)
    np.testing.assert_array_equal(~np.isfinite(got), hit)
    assert hit[0, 1].sum() == 3 * 4 and not hit[0, 0].any()   # rows 3.. x keys 0..2 of head 1
    testing.assert_grads_close(posenc.fox_backward, "fox", args[0], args[1], gates, **kwargs)
    G = rng.standard_normal(got.shape)
    G[0, 0, 5, 1] = bad                 # in G: the gates whose sums hold key 1 of row 5
    grads = posenc.fox_backward(G, args[0], args[1], gates, **kwargs)
    want = reference.fox_backward(G, args[0], args[1], gates, **kwargs)
    for name in ("log_fgate", "log_fgate_reverse"):
        np.testing.assert_allclose(getattr(grads, name), getattr(want, name), rtol=1e-13,
                                   atol=1e-13, err_msg=name)
    assert (~np.isfinite(grads.log_fgate[0, 0])).sum() == 4         # gates 2..5


def test_a_query_past_the_keys_is_an_error():
    q = np.zeros((1, 1, 3, 2))
    gates = np.zeros((1, 1, 4))
    for namespace in (posenc, reference):
        with pytest.raises(ValueError, match=r"fox needs every query among the keys: "
                                             r"query_offset \+ n = 2 \+ 3 > m = 4"):
            namespace.fox(q, q[:, :, :1].repeat(4, axis=2), gates, query_offset=2)
        with pytest.raises(ValueError, match=r"log_fgate must have shape \(1, 1, 4\) "
                                             r"\(B, H\|1, m\), got \(1, 3, 4\)"):
            namespace.fox(q, np.zeros((1, 1, 4, 2)), np.zeros((1, 3, 4)))


def test_decoding_steps_equal_the_full_rows(rng):
    """Query rows one at a time at their positions (query_offset) over every key so
    far: the logits and the attention's out equal the full causal call's rows."""
    args, kwargs = make_inputs("fox", 2, 4, 9, 9, 8, rng=rng, kv_heads=2)
    v = rng.standard_normal((2, 2, 9, 5))
    q, k, gates = args
    full = posenc.fox_attention(q, k, v, gates, causal=True)
    logits = posenc.fox(q, k, gates)
    for t in range(9):
        step = posenc.fox_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1],
                                    gates[:, :, :t + 1], causal=True, query_offset=t)
        np.testing.assert_allclose(step.out[:, :, 0], full.out[:, :, t], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(posenc.fox(q[:, :, t:t + 1], k[:, :, :t + 1],
                                              gates[:, :, :t + 1], query_offset=t)[:, :, 0],
                                   logits[:, :, t, :t + 1], rtol=1e-13, atol=1e-13)


def test_one_and_two_threads_bitwise(threads, rng):
    args, kwargs = make_inputs("fox", 3, 4, 70, 80, 16, dtype=np.float32, rng=rng)
    v = rng.standard_normal((3, 4, 80, 16)).astype(np.float32)
    G = rng.standard_normal((3, 4, 70, 80)).astype(np.float32)
    results = []
    q = args[0][:, :, :60]
    for count in (1, 2):
        threads(count)
        att = posenc.fox_attention(q, args[1], v, *args[2:], **kwargs, causal=True,
                                   query_offset=10)
        results.append((posenc.fox(*args, **kwargs), posenc.fox_backward(G, *args, **kwargs),
                        att, posenc.fox_attention_backward(
                            att.out, q, args[1], v, *args[2:], att.out, att.lse, **kwargs,
                            causal=True, query_offset=10)))
    for one, two in zip(*results):
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (one, two))):
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ outside code, torch

@needs_torch
@pytest.mark.parametrize("causal", [True, False])
def test_x_transformers_data_dependent_alibi(causal):
    """fox's D equals x-transformers' DataDependentAlibi (the FoX bias of its
    attention) on the same gates, causal and bidirectional, float64 to 1e-10; and
    posenc.torch.nn.ForgetGates with that module's weights gives the same gates."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(0)
    B, H, n, dim = 2, 3, 11, 16
    alibi = xt.DataDependentAlibi(dim, H, causal=causal).double()
    with torch.no_grad():                       # gates away from 1: a visible decay
        alibi.to_forget_gates[0].bias.normal_(1.0, 1.0)
    x = torch.randn(B, n, dim, dtype=torch.float64)
    bias = alibi(x).detach()
    ours = pnn.ForgetGates(H, dim, bidirectional=not causal).double()
    ours.gate_proj.load_state_dict(alibi.to_forget_gates[0].state_dict())
    q, k = torch.randn(B, H, n, 4, dtype=torch.float64), torch.randn(B, H, n, 4, dtype=torch.float64)
    state = ours.input_state(x)
    got = ours.logits(q, k, state=state) - pt.content(q, k)
    if causal:          # x-transformers leaves j > i to the causal mask: compare j <= i
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        got, bias = got.masked_fill(~keep, 0.0), bias.masked_fill(~keep, 0.0)
    torch.testing.assert_close(got, bias, rtol=0, atol=1e-10)


@needs_torch
def test_the_layer_and_its_cache(rng):
    """PositionalSelfAttention with ForgetGates: the fused path equals the logits path,
    decoding with the cache equals the full forward, and the gates' projection trains
    (its gradient equals the logits path's)."""
    torch.manual_seed(0)
    layer = pnn.PositionalSelfAttention(24, 4, pnn.ForgetGates(4, 24), causal=True).double()
    x = torch.randn(2, 10, 24, dtype=torch.float64)
    full = layer(x)
    first, cache = layer(x[:, :6], use_cache=True)
    assert len(cache) == 5 and cache[4].shape == (2, 4, 6)
    rest = [layer(x[:, t:t + 1], past_key_value=cache, use_cache=True) for t in (6,)]
    second, cache = rest[0]
    third, _ = layer(x[:, 7:], past_key_value=cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first, second, third], 1), full, rtol=1e-12, atol=1e-13)
    full.square().sum().backward()
    fused_grad = layer.encoding.gate_proj.weight.grad.clone()
    layer.zero_grad()
    layer.fused = False
    torch.testing.assert_close(layer(x), full, rtol=1e-12, atol=1e-13)
    layer(x).square().sum().backward()
    torch.testing.assert_close(layer.encoding.gate_proj.weight.grad, fused_grad, rtol=1e-10,
                               atol=1e-12)
    with pytest.raises(ValueError, match="state = input_state"):
        layer.encoding.logits(x.view(2, 10, 4, 6).transpose(1, 2), x.view(2, 10, 4, 6).transpose(1, 2))


@needs_torch
def test_gradcheck_of_the_op(rng):
    args, kwargs = make_inputs("fox", 1, 2, 4, 5, 3, rng=rng, shared=True)
    tensors = [torch.tensor(a, requires_grad=True) for a in args]
    back = torch.tensor(kwargs["log_fgate_reverse"], requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, g, r: pt.fox(q, k, g, log_fgate_reverse=r),
                                    (*tensors, back))
    v = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, g: pt.fox_attention(q, k, v, g, causal=True, query_offset=1).out,
        (tensors[0], tensors[1], v, tensors[2]))
