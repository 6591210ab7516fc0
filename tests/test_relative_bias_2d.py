"""The 2-D relative position bias of Swin and BEiT (spec §3.19), a term module
(csrc/terms.h, csrc/engine/term_relative_bias_2d_impl.h).  Every ISA and dtype
against the reference on odd sizes and n != m: rasters whose rows clip on both
sides, a global [CLS] token, shuffled (irregular) coordinates, shared tables,
batch-shared coordinates; the formula written out here; the fused attention
(causal with dropout, padding; spec §7's shapes run for every method in
test_attention_shapes.py) and decoding steps equal to the full call's rows;
float64 finite differences of the table's gradient through the logits and the
attention; one and two threads bitwise; the errors; fidelity against
HuggingFace Swin's and BEiT's relative position bias (with [CLS]) and Swin's
attention; the nn module (learned table, Swin-v2's continuous bias) in a layer
and under torch.compile."""

import numpy as np
import pytest

import posenc
from posenc import reference, testing
from posenc._examples import make_inputs, query_rows, trainable_inputs, with_inputs
from test_attention_reference import numeric_gradients

try:                # a module-level importorskip would skip the NumPy tests too
    import torch

    import posenc.torch as pt
    from posenc.torch import nn as pnn
except ImportError:
    torch = pt = pnn = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install torch)")

DTYPES = ["float32", "float64", "float16"] + (["bfloat16"] if posenc._dtypes.BFLOAT16 else [])


def _raster(count, width, start=0):
    t = np.arange(start, start + count)
    return np.stack([t // width, t % width], axis=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_isa_and_dtype(posenc_isa, dtype, rng):
    """make_inputs' grids (batch 0 with a global token, batch 1's keys shuffled) at odd
    sizes, n != m, shared tables and offsets; logits, every gradient, the attention."""
    np_dtype = posenc._dtypes.by_name(dtype)
    for n, m, d, offset, shared, distance in ((1, 1, 1, 0, False, 0), (7, 17, 3, 2, True, 1),
                                              (33, 33, 16, 0, False, 4), (5, 65, 7, 40, True, 2),
                                              (17, 18, 5, 1, False, 9)):
        args, kwargs = make_inputs("relative_bias_2d", 2, 3, n, m, d, dtype=np_dtype, rng=rng,
                                   shared=shared, max_distance=distance)
        kwargs = dict(kwargs, query_offset=offset)
        testing.assert_logits_close(posenc.relative_bias_2d(*args, **kwargs), "relative_bias_2d",
                                    *args, **kwargs)
        testing.assert_grads_close(posenc.relative_bias_2d_backward, "relative_bias_2d", *args,
                                   **kwargs)
        v = rng.standard_normal((2, 3, m, 4)).astype(np_dtype)
        padding = np.zeros((2, m), dtype=bool)
        padding[1, m // 2:] = True
        for attention in (dict(causal=True, dropout_p=0.1, seed=7),
                          dict(causal=False, key_padding_mask=padding)):
            got = posenc.relative_bias_2d_attention(args[0], args[1], v, *args[2:], **kwargs,
                                                    **attention)
            testing.assert_attention_close(got, "relative_bias_2d", args[0], args[1], v,
                                           *args[2:], **kwargs, **attention)


def test_the_formula_written_here(posenc_isa, rng):
    """bias[h, (dy + t_y)(2 t_x + 1) + dx + t_x] with dy, dx clipped, and T, T + 1, T + 2 for
    global tokens, written out pair by pair apart from posenc.reference; coordinates
    shared by the batch (B|1 = 1), a table shared by the heads."""
    B, H, n, m, d, (ty, tx) = 2, 3, 6, 11, 4, (1, 2)
    T = (2 * ty + 1) * (2 * tx + 1)
    q, k = rng.standard_normal((B, H, n, d)), rng.standard_normal((B, H, m, d))
    coords_q = np.concatenate([[[-1, -1]], _raster(n - 1, 3, 2)])[None]
    coords_k = np.concatenate([_raster(m - 1, 4), [[-1, -1]]])[None]
    coords_k[0, 3] = (7, 0)                    # a key out of the raster's order
    bias = rng.standard_normal((1, T + 3))
    want = np.einsum("bhid,bhjd->bhij", q, k) / 2.0
    for b, h, i, j in np.ndindex(B, H, n, m):
        (yq, xq), (yk, xk) = coords_q[0, i], coords_k[0, j]
        if yq == -1:
            at = T + 2 if yk == -1 else T
        elif yk == -1:
            at = T + 1
        else:
            dy, dx = min(max(yk - yq, -ty), ty), min(max(xk - xq, -tx), tx)
            at = (dy + ty) * (2 * tx + 1) + dx + tx
        want[b, h, i, j] += bias[0, at]
    got = posenc.relative_bias_2d(q, k, bias, coords_q=coords_q, coords_k=coords_k,
                                  max_distance=(ty, tx))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_long_rows_and_large_tables(posenc_isa, rng):
    """A 40 x 50 grid (2000 tokens, every offset its own bucket: T = 79 x 99) and the
    same grid with distance 3 (most of each row clipped), float32, a block of rows."""
    coords = _raster(2000, 50)[None]
    q = rng.standard_normal((1, 2, 37, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 2000, 8)).astype(np.float32)
    for distance in ((39, 49), 3):
        ty, tx = (distance, distance) if isinstance(distance, int) else distance
        bias = rng.standard_normal((2, (2 * ty + 1) * (2 * tx + 1))).astype(np.float32)
        kwargs = dict(coords_q=coords[:, 900:937], coords_k=coords, max_distance=distance)
        testing.assert_logits_close(posenc.relative_bias_2d(q, k, bias, **kwargs),
                                    "relative_bias_2d", q, k, bias, **kwargs)
        testing.assert_grads_close(posenc.relative_bias_2d_backward, "relative_bias_2d", q, k,
                                   bias, **kwargs)


def test_finite_differences(rng):
    """float64: the table's gradient (and q's, k's) through the logits and the fused
    attention (padding, a query offset) equal central differences."""
    args, kwargs = make_inputs("relative_bias_2d", 2, 2, 4, 7, 3, rng=rng, max_distance=1)
    v = rng.standard_normal((2, 2, 7, 3))
    mask = np.zeros((2, 7), dtype=bool)
    mask[1, -2:] = True
    attention = dict(causal=False, key_padding_mask=mask, query_offset=2)
    weights = rng.standard_normal((2, 2, 4, 3))
    G = rng.standard_normal((2, 2, 4, 7))
    floats = trainable_inputs("relative_bias_2d", args, kwargs)

    def loss(values):
        a, kw = with_inputs("relative_bias_2d", args, kwargs, values)
        logits = posenc.relative_bias_2d(*a, **kw, query_offset=2)
        out = posenc.relative_bias_2d_attention(a[0], a[1], v, *a[2:], **kw, **attention).out
        return float((G * logits).sum() + (weights * out).sum())

    result = posenc.relative_bias_2d_attention(args[0], args[1], v, *args[2:], **kwargs,
                                               **attention)
    grads = posenc.relative_bias_2d_attention_backward(weights, args[0], args[1], v, *args[2:],
                                                       result.out, result.lse, **kwargs,
                                                       **attention)
    logit_grads = posenc.relative_bias_2d_backward(G, *args, **kwargs, query_offset=2)
    assert set(floats) == {"q", "k", "bias"}
    for name, numeric in numeric_gradients(loss, floats).items():
        analytic = getattr(grads, name) + getattr(logit_grads, name)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-6, err_msg=name)


def test_decoding_steps_equal_the_full_rows(rng):
    """Query rows one at a time (their coordinates sliced with them) over every key so
    far: the logits and the attention's out equal the full causal call's rows."""
    args, kwargs = make_inputs("relative_bias_2d", 2, 4, 9, 9, 8, rng=rng, kv_heads=2)
    v = rng.standard_normal((2, 2, 9, 5))
    full = posenc.relative_bias_2d_attention(args[0], args[1], v, *args[2:], **kwargs,
                                             causal=True)
    logits = posenc.relative_bias_2d(*args, **kwargs)
    for t in range(9):
        a, kw = query_rows("relative_bias_2d", args, kwargs, slice(t, t + 1))
        kw["coords_k"] = kwargs["coords_k"][:, :t + 1]
        step = posenc.relative_bias_2d_attention(a[0], a[1][:, :, :t + 1], v[:, :, :t + 1],
                                                 *a[2:], **kw, causal=True, query_offset=t)
        np.testing.assert_allclose(step.out[:, :, 0], full.out[:, :, t], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(
            posenc.relative_bias_2d(a[0], a[1][:, :, :t + 1], *a[2:], **kw,
                                    query_offset=t)[:, :, 0],
            logits[:, :, t, :t + 1], rtol=1e-13, atol=1e-13)


def test_one_and_two_threads_bitwise(threads, rng):
    args, kwargs = make_inputs("relative_bias_2d", 3, 4, 70, 80, 16, dtype=np.float32, rng=rng)
    v = rng.standard_normal((3, 4, 80, 16)).astype(np.float32)
    G = rng.standard_normal((3, 4, 70, 80)).astype(np.float32)
    results = []
    a, kw = query_rows("relative_bias_2d", args, kwargs, slice(0, 60))
    for count in (1, 2):
        threads(count)
        att = posenc.relative_bias_2d_attention(a[0], a[1], v, *a[2:], **kw, causal=True,
                                                query_offset=10)
        results.append((posenc.relative_bias_2d(*args, **kwargs),
                        posenc.relative_bias_2d_backward(G, *args, **kwargs), att,
                        posenc.relative_bias_2d_attention_backward(
                            att.out, a[0], a[1], v, *a[2:], att.out, att.lse, **kw,
                            causal=True, query_offset=10)))
    for one, two in zip(*results):
        for x, y in zip(*(r if isinstance(r, tuple) else (r,) for r in (one, two))):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("namespace", [posenc, reference], ids=["posenc", "reference"])
def test_errors(namespace):
    q, k = np.zeros((2, 3, 4, 2)), np.zeros((2, 3, 5, 2))
    cq, ck = _raster(4, 3)[None], _raster(5, 3)[None]
    bias = np.zeros((3, 15))                                      # T for (1, 2)
    call = dict(coords_q=cq, coords_k=ck, max_distance=(1, 2))
    assert namespace.relative_bias_2d(q, k, bias, **call).shape == (2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"bias must have shape \(1\|3, 15\|18\) \(H\|1, T\) or"):
        namespace.relative_bias_2d(q, k, np.zeros((3, 16)), **call)
    glob = cq.copy()
    glob[0, 0] = -1
    with pytest.raises(ValueError, match=r"bias must have shape \(1\|3, 18\) \(H\|1, T \+ 3\)"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, coords_q=glob))
    bad = ck.copy()
    bad[0, 2] = (-1, 0)
    with pytest.raises(ValueError, match=r"coords_k\[0, 2\] = \(-1, 0\)"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, coords_k=bad))
    with pytest.raises(TypeError, match="coords_q must have an integer dtype"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, coords_q=cq.astype(float)))
    with pytest.raises(ValueError, match=r"coords_q must have shape \(1\|2, 4, 2\) \(B\|1, n, 2\)"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, coords_q=cq[:, :3]))
    with pytest.raises(ValueError, match="max_distance must be >= 0"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, max_distance=(-1, 2)))
    with pytest.raises(TypeError, match=r"max_distance must be an int or a pair of ints"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, max_distance=(1, 2, 3)))
    with pytest.raises(TypeError, match="coords_k is required"):
        namespace.relative_bias_2d(q, k, bias, **dict(call, coords_k=None))
    # an int t is (t, t): (2t + 1)^2 entries
    assert namespace.relative_bias_2d(q, k, np.zeros((1, 9)), coords_q=cq, coords_k=ck,
                                      max_distance=1).shape == (2, 3, 4, 5)


# ------------------------------------------------------------------ outside code, torch

def _swin_config(**kw):
    transformers = pytest.importorskip("transformers")
    return transformers.SwinConfig(**kw)


@needs_torch
def test_hf_swin_relative_position_bias():
    """HF Swin's relative position bias of a (3, 5) window (its own index and table)
    equals posenc's term with the table reversed (RelativeBias2D.from_hf_table), float64
    to 1e-12; and a square window's SwinAttention output equals posenc's fused
    attention of the same projections."""
    swin = pytest.importorskip("transformers.models.swin.modeling_swin")
    torch.manual_seed(0)
    H = 3
    hf_bias = swin.SwinRelativePositionBias(H, (3, 5)).double()
    torch.nn.init.normal_(hf_bias.relative_position_bias_table)
    want = hf_bias()[0]                                               # (H, 15, 15)
    ours = pnn.RelativeBias2D(H, grid=(3, 5)).double()
    with torch.no_grad():
        ours.table.copy_(ours.from_hf_table(hf_bias.relative_position_bias_table, 45))
    q, k = torch.randn(2, H, 15, 4, dtype=torch.float64), torch.randn(2, H, 15, 4,
                                                                   dtype=torch.float64)
    torch.testing.assert_close(ours.logits(q, k) - pt.content(q, k), want.expand(2, -1, -1, -1),
                               rtol=0, atol=1e-12)

    config = _swin_config(embed_dim=12, num_heads=[H], depths=[1], window_size=4)
    config._attn_implementation = "sdpa"        # (eager's softmax is float32 in float64)
    attention = swin.SwinAttention(config, 12, H, 4).double().eval()
    torch.nn.init.normal_(attention.relative_position_bias.relative_position_bias_table)
    x = torch.randn(2, 16, 12, dtype=torch.float64)
    want, _ = attention(x)
    table = attention.relative_position_bias.relative_position_bias_table
    heads = [proj(x).view(2, 16, H, 4).transpose(1, 2)
             for proj in (attention.q_proj, attention.k_proj, attention.v_proj)]
    coords = torch.tensor(_raster(16, 4))[None]
    out = pt.relative_bias_2d_attention(*heads, pnn.RelativeBias2D.from_hf_table(table, 49),
                                        coords_q=coords, coords_k=coords, max_distance=3).out
    got = attention.o_proj(out.transpose(1, 2).reshape(2, 16, 12))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@needs_torch
def test_hf_beit_relative_position_bias_with_cls():
    """HF BEiT's relative position bias of a 4 x 4 patch grid with its [CLS] token
    (buckets T, T + 1, T + 2) equals RelativeBias2D(cls_token=True)'s term, float64."""
    transformers = pytest.importorskip("transformers")
    beit = pytest.importorskip("transformers.models.beit.modeling_beit")
    torch.manual_seed(0)
    H = 2
    config = transformers.BeitConfig(image_size=16, patch_size=4, num_attention_heads=H,
                                     hidden_size=8, use_relative_position_bias=True)
    hf_bias = beit.BeitRelativePositionBias(config).double()
    torch.nn.init.normal_(hf_bias.relative_position_bias_table)
    want = hf_bias((4, 4))                                            # (H, 17, 17)
    ours = pnn.RelativeBias2D(H, grid=(4, 4), cls_token=True).double()
    with torch.no_grad():
        ours.table.copy_(ours.from_hf_table(hf_bias.relative_position_bias_table, 49))
    q, k = torch.randn(1, H, 17, 4, dtype=torch.float64), torch.randn(1, H, 17, 4,
                                                                   dtype=torch.float64)
    torch.testing.assert_close(ours.logits(q, k) - pt.content(q, k), want, rtol=0,
                               atol=1e-12)


@needs_torch
def test_continuous_position_bias_is_swin_v2s():
    """ContinuousPositionBias with HF Swinv2's MLP weights gives Swinv2's bias (its
    16 sigmoid of the MLP of the log-spaced offsets, gathered by its index) reversed."""
    transformers = pytest.importorskip("transformers")
    swinv2 = pytest.importorskip("transformers.models.swinv2.modeling_swinv2")
    torch.manual_seed(0)
    config = transformers.Swinv2Config(embed_dim=12, num_heads=[3], depths=[1], window_size=4)
    attention = swinv2.Swinv2SelfAttention(config, 12, 3, 4).double().eval()
    cpb = pnn.ContinuousPositionBias(3, 3).double()
    cpb.mlp.load_state_dict(attention.continuous_position_bias_mlp.state_dict())
    table = attention.continuous_position_bias_mlp(attention.relative_coords_table).view(-1, 3)
    index = attention.relative_position_index.view(-1)
    want = (16 * torch.sigmoid(table[index])).view(16, 16, 3).permute(2, 0, 1)
    layer = pnn.RelativeBias2D(3, grid=(4, 4), bias_fn=cpb)
    q, k = torch.randn(1, 3, 16, 4, dtype=torch.float64), torch.randn(1, 3, 16, 4,
                                                                   dtype=torch.float64)
    torch.testing.assert_close(layer.logits(q, k) - pt.content(q, k), want[None].detach(),
                               rtol=0, atol=1e-12)


@needs_torch
def test_the_module_trains_and_compiles(rng):
    """A layer of a ViT's shape ([CLS] + 3 x 4 patches): fused = logits path (output and
    the table's gradient), compile = eager, gradcheck of the op and the attention."""
    torch.manual_seed(0)
    encoding = pnn.RelativeBias2D(4, grid=(3, 4), cls_token=True)
    layer = pnn.PositionalSelfAttention(16, 4, encoding).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    fused = layer(x)
    fused.square().sum().backward()
    grad = encoding.table.grad.clone()
    assert grad.abs().sum() > 0
    encoding.table.grad = None
    layer.fused = False
    torch.testing.assert_close(layer(x), fused, rtol=1e-12, atol=1e-13)
    layer(x).square().sum().backward()
    torch.testing.assert_close(encoding.table.grad, grad, rtol=1e-10, atol=1e-12)
    compiled = torch.compile(lambda x: layer(x), fullgraph=False)
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-12, atol=1e-13)

    args, kwargs = make_inputs("relative_bias_2d", 1, 2, 4, 5, 3, rng=rng, shared=True)
    tensors = [torch.tensor(a, requires_grad=True) for a in args]
    coords = {name: torch.tensor(kwargs[name]) for name in ("coords_q", "coords_k")}
    assert torch.autograd.gradcheck(
        lambda q, k, b: pt.relative_bias_2d(q, k, b, **coords, max_distance=kwargs["max_distance"]),
        tensors)
    v = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b: pt.relative_bias_2d_attention(
            q, k, v, b, **coords, max_distance=kwargs["max_distance"], causal=True,
            query_offset=1).out, (tensors[0], tensors[1], v, tensors[2]))
