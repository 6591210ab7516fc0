"""Rotary tables per token (spec §3.16): cos, sin (B|1, H|1, n, r) are query row
i's own, cos_k, sin_k (B|1, H_kv|1, m, r) key j's, and all four have gradients --
the engine's rope_token module (csrc/engine/term_rope_token_impl.h, read by
rope_impl.h).  Every ISA and dtype against the reference on odd sizes, n != m,
grouped-query heads, shared axes, interleaved and partial rotary; the formula
written out; the fused attention (causal with dropout, padding) and decoding
steps equal to the full call's rows; float64 finite differences of every table
through the logits and the attention; one and two threads bitwise; the errors;
fidelity against HuggingFace's rotary attention for Qwen2-VL's M-RoPE,
Qwen3-VL's interleaved M-RoPE, Pixtral's 2-D rotary and DINOv3's (float64,
1e-10), and the modules' own tables against HF's; RoPE-Mixed's frequencies
trained through the kernels; gradcheck and compile."""

import numpy as np
import pytest

import posenc
from posenc import reference, testing
from test_attention_reference import numeric_gradients

try:                # a module-level importorskip would skip the NumPy tests too
    import torch

    import posenc.torch as pt
    from posenc.torch import nn as pnn
except ImportError:
    torch = pt = pnn = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install torch)")

DTYPES = ["float32", "float64", "float16"] + (["bfloat16"] if posenc._dtypes.BFLOAT16 else [])
TABLES = ("cos", "sin", "cos_k", "sin_k")


def _call(rng, B, H, H_kv, n, m, d, r, dtype=np.float64, shared=(False, False)):
    """q, k and per-token tables whose batch and head axes broadcast as `shared` says
    (cos: batch shared, sin: heads shared, the keys' the other way round)."""
    cast = lambda x: x.astype(dtype)
    q, k = cast(rng.standard_normal((B, H, n, d))), cast(rng.standard_normal((B, H_kv, m, d)))
    sb, sh = shared
    angles = lambda b, h, L: rng.uniform(-3, 3, (1 if sb else b, 1 if sh else h, L, r))
    aq, ak = angles(B, H, n), angles(B, H_kv, m)
    # cos and sin apart (a scaled rotation, as xPos's), each a table of its own; in
    # 16 bits a plain rotation (the bound's rounding of rotated operands is tight there:
    # docs/validation.md)
    f, g = (1.0, 1.0) if np.dtype(dtype).itemsize == 2 else (1.1, 0.9)
    tables = dict(cos=cast(np.cos(aq) * f), sin=cast(np.sin(aq)),
                  cos_k=cast(np.cos(ak)), sin_k=cast(np.sin(ak) * g))
    return q, k, tables


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_isa_and_dtype(posenc_isa, dtype, rng):
    np_dtype = posenc._dtypes.by_name(dtype)
    for B, H, H_kv, n, m, d, r, offset, shared, interleaved in (
            (1, 1, 1, 1, 1, 2, 1, 0, (False, False), False),
            (2, 4, 2, 7, 17, 8, 3, 2, (True, False), True),
            (2, 3, 3, 33, 33, 16, 8, 0, (False, True), False),
            (1, 2, 1, 5, 65, 12, 6, 40, (True, True), True),
            (2, 2, 2, 17, 18, 64, 32, 1, (False, False), False)):
        q, k, tables = _call(rng, B, H, H_kv, n, m, d, r, np_dtype, shared)
        kwargs = dict(tables, interleaved=interleaved, query_offset=offset)
        tables_q = (tables["cos"], tables["sin"])
        kwargs.pop("cos"), kwargs.pop("sin")
        testing.assert_logits_close(posenc.rope(q, k, *tables_q, **kwargs), "rope", q, k,
                                    *tables_q, **kwargs)
        grads = posenc.rope_backward(np.ones((B, H, n, m), np_dtype), q, k, *tables_q, **kwargs)
        want = reference.rope_backward(np.ones((B, H, n, m), np_dtype), q, k, *tables_q, **kwargs)
        tol = 1e-10 if dtype == "float64" else 2e-5 if dtype == "float32" else 3e-2
        for name in grads._fields:
            got, ref = getattr(grads, name), getattr(want, name)
            assert got.shape == ref.shape and got.dtype == np_dtype, name
            scale = np.abs(ref).max() + 1
            np.testing.assert_allclose(got.astype(np.float64), ref, rtol=0, atol=tol * scale,
                                       err_msg=f"{name} {dtype}")
        v = rng.standard_normal((B, H_kv, m, 4)).astype(np_dtype)
        padding = np.zeros((B, m), dtype=bool)
        padding[-1, m // 2:] = True
        for attention in (dict(causal=True, dropout_p=0.1, seed=7),
                          dict(causal=False, key_padding_mask=padding)):
            got = posenc.rope_attention(q, k, v, *tables_q, **kwargs, **attention)
            testing.assert_attention_close(got, "rope", q, k, v, *tables_q, **kwargs,
                                           **attention)


def test_the_formula_written_here(posenc_isa, rng):
    """Row i's own (c, s) rotate q_i, row j's of the keys' k_j, pair by pair (half split),
    written out here apart from posenc.reference; query_offset moves nothing."""
    B, H, n, m, d, r = 2, 2, 3, 5, 6, 2
    q, k, t = _call(rng, B, H, H, n, m, d, r)

    def rotate(x, c, s):
        y = x.copy()
        for p in range(r):
            y[p], y[p + r] = x[p] * c[p] - x[p + r] * s[p], x[p + r] * c[p] + x[p] * s[p]
        return y

    want = np.zeros((B, H, n, m))
    for b, h, i, j in np.ndindex(B, H, n, m):
        qi = rotate(q[b, h, i], t["cos"][b, h, i], t["sin"][b, h, i])
        kj = rotate(k[b, h, j], t["cos_k"][b, h, j], t["sin_k"][b, h, j])
        want[b, h, i, j] = qi @ kj / np.sqrt(d)
    for offset in (0, 4):
        got = posenc.rope(q, k, t["cos"], t["sin"], cos_k=t["cos_k"], sin_k=t["sin_k"],
                          query_offset=offset)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_finite_differences(rng):
    """float64: every table's gradient, and q's, k's, v's, through the logits and the
    fused attention (grouped heads, padding, an offset) equal central differences."""
    q, k, t = _call(rng, 2, 4, 2, 3, 5, 4, 2, shared=(True, False))
    v = rng.standard_normal((2, 2, 5, 3))
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, -2:] = True
    attention = dict(causal=True, key_padding_mask=mask, query_offset=2, interleaved=True)
    weights, G = rng.standard_normal((2, 4, 3, 3)), rng.standard_normal((2, 4, 3, 5))
    floats = dict(q=q, k=k, v=v, **t)

    def split(values):
        tables = {name: values[name] for name in TABLES}
        return values["q"], values["k"], values["v"], tables.pop("cos"), tables.pop("sin"), tables

    def loss(values):
        q_, k_, v_, cos, sin, rest = split(values)
        logits = posenc.rope(q_, k_, cos, sin, **rest, query_offset=2, interleaved=True)
        out = posenc.rope_attention(q_, k_, v_, cos, sin, **rest, **attention).out
        return float((G * logits).sum() + (weights * out).sum())

    q_, k_, v_, cos, sin, rest = split(floats)
    result = posenc.rope_attention(q_, k_, v_, cos, sin, **rest, **attention)
    grads = posenc.rope_attention_backward(weights, q_, k_, v_, cos, sin, result.out, result.lse,
                                           **rest, **attention)
    logit_grads = posenc.rope_backward(G, q_, k_, cos, sin, **rest, query_offset=2,
                                       interleaved=True)
    for name, numeric in numeric_gradients(loss, floats).items():
        analytic = getattr(grads, name) + (getattr(logit_grads, name) if name != "v" else 0)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-6, err_msg=name)


def test_decoding_steps_equal_the_full_rows(rng):
    """One query row at a time (its table rows with it) over every key so far: the
    logits and the attention's out equal the full causal call's rows (grouped heads)."""
    q, k, t = _call(rng, 2, 4, 2, 9, 9, 8, 4, shared=(False, True))
    v = rng.standard_normal((2, 2, 9, 5))
    full = posenc.rope_attention(q, k, v, t["cos"], t["sin"], cos_k=t["cos_k"], sin_k=t["sin_k"],
                                 causal=True)
    logits = posenc.rope(q, k, t["cos"], t["sin"], cos_k=t["cos_k"], sin_k=t["sin_k"])
    for s in range(9):
        rows = dict(cos_k=t["cos_k"][:, :, :s + 1], sin_k=t["sin_k"][:, :, :s + 1])
        step_q, cos, sin = q[:, :, s:s + 1], t["cos"][:, :, s:s + 1], t["sin"][:, :, s:s + 1]
        step = posenc.rope_attention(step_q, k[:, :, :s + 1], v[:, :, :s + 1], cos, sin, **rows,
                                     causal=True, query_offset=s)
        np.testing.assert_allclose(step.out[:, :, 0], full.out[:, :, s], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(posenc.rope(step_q, k[:, :, :s + 1], cos, sin, **rows,
                                               query_offset=s)[:, :, 0],
                                   logits[:, :, s, :s + 1], rtol=1e-13, atol=1e-13)


def test_one_and_two_threads_bitwise(threads, rng):
    q, k, t = _call(rng, 3, 4, 2, 70, 80, 16, 8, np.float32, shared=(True, False))
    v = rng.standard_normal((3, 2, 80, 16)).astype(np.float32)
    G = rng.standard_normal((3, 4, 70, 80)).astype(np.float32)
    rest = dict(cos_k=t["cos_k"], sin_k=t["sin_k"])
    results = []
    for count in (1, 2):
        threads(count)
        att = posenc.rope_attention(q, k, v, t["cos"], t["sin"], **rest, causal=True,
                                    query_offset=10)
        results.append((posenc.rope(q, k, t["cos"], t["sin"], **rest),
                        posenc.rope_backward(G, q, k, t["cos"], t["sin"], **rest), att,
                        posenc.rope_attention_backward(att.out, q, k, v, t["cos"], t["sin"],
                                                       att.out, att.lse, **rest, causal=True,
                                                       query_offset=10)))
    for one, two in zip(*results):
        for x, y in zip(*(r if isinstance(r, tuple) else (r,) for r in (one, two))):
            np.testing.assert_array_equal(x, y)


def test_zero_sizes(posenc_isa, rng):
    """B, H, n, m or d of 0: empty results, and every table's gradient zero (the keys'
    with no query row: written though no unit ran)."""
    from posenc._examples import make_inputs

    for B, H, n, m, d in ((0, 2, 3, 3, 4), (2, 0, 3, 3, 4), (2, 2, 0, 3, 4), (2, 2, 3, 0, 4),
                          (2, 2, 3, 4, 0)):
        args, kwargs = make_inputs("rope", B, H, n, m, d, rng=rng, rope_per_token=True)
        G = np.ones((B, H, n, m))
        got = posenc.rope_backward(G, *args, **kwargs)
        want = reference.rope_backward(G, *args, **kwargs)
        for name in got._fields:
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        v = np.ones((B, H, m, 3))
        out = posenc.rope_attention(args[0], args[1], v, *args[2:], **kwargs)
        grads = posenc.rope_attention_backward(np.ones(out.out.shape), args[0], args[1], v,
                                               *args[2:], out.out, out.lse, **kwargs)
        for name in TABLES:
            assert not np.any(getattr(grads, name)), name


@pytest.mark.parametrize("namespace", [posenc, reference], ids=["posenc", "reference"])
def test_errors(namespace, rng):
    q, k, t = _call(rng, 2, 4, 2, 3, 5, 4, 2)
    cos, sin = t["cos"], t["sin"]
    with pytest.raises(ValueError, match="need the keys' own: cos_k and sin_k"):
        namespace.rope(q, k, cos, sin)
    with pytest.raises(ValueError, match="positions_q goes with \\(P, r\\) tables"):
        namespace.rope(q, k, cos, sin, cos_k=t["cos_k"], sin_k=t["sin_k"],
                       positions_q=np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"cos_k must have shape \(1\|2, 1\|2, 5, 2\)"):
        namespace.rope(q, k, cos, sin, cos_k=t["cos_k"][:, :, :4], sin_k=t["sin_k"])
    with pytest.raises(ValueError, match=r"cos must have shape \(1\|2, 1\|4, 3, 2\)"):
        namespace.rope(q, k, cos[:, :, :2], sin, cos_k=t["cos_k"], sin_k=t["sin_k"])
    with pytest.raises(ValueError, match="rotate 2 r = 6 dimensions"):
        wide = {name: np.concatenate([x, x[..., :1]], -1) for name, x in t.items()}
        namespace.rope(q, k, wide["cos"], wide["sin"], cos_k=wide["cos_k"], sin_k=wide["sin_k"])


# ------------------------------------------------------------------ outside code, torch

def _hf_rotary_logits(module, q, k, cos, sin):
    """HF's rotation (its model's apply_rotary_pos_emb, full-width tables) then s q.k."""
    if cos.dim() == 2:                               # (L, 2r): a vision model's, one image
        cos, sin = cos[None], sin[None]
    qr, kr = module.apply_rotary_pos_emb(q, k, cos, sin)
    return qr @ kr.transpose(-1, -2) / q.shape[-1] ** 0.5


def _ours(q, k, cos, sin, **kw):
    """posenc.torch.rope on HF's tables: their first halves, per token (B|1, 1, L, r)."""
    r = cos.shape[-1] // 2
    half = lambda x: (x if x.dim() == 4 else x[:, None] if x.dim() == 3 else x[None, None])[..., :r]
    return pt.rope(q, k, half(cos), half(sin), cos_k=half(cos), sin_k=half(sin), **kw)


@needs_torch
@pytest.mark.parametrize("interleaved_sections", [False, True], ids=["qwen2_vl", "qwen3_vl"])
def test_hf_mrope(interleaved_sections):
    """Qwen2-VL's M-RoPE (mrope_section) and Qwen3-VL's interleaved layout: HF's rotary
    attention on its own tables equals posenc's per-token rope on them, float64 to
    1e-10; MRoPE's tables equal HF's (both float32 angles) to rounding."""
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "default", "rope_theta": 5000.0, "mrope_section": [2, 3, 3]}
    if interleaved_sections:
        module = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
        config = transformers.Qwen3VLTextConfig(hidden_size=64, num_attention_heads=4,
                                                head_dim=16, rope_parameters=rope)
        hf = module.Qwen3VLTextRotaryEmbedding(config)
    else:
        module = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
        config = transformers.Qwen2VLTextConfig(hidden_size=64, num_attention_heads=4,
                                                rope_parameters=rope)
        hf = module.Qwen2VLRotaryEmbedding(config)
    torch.manual_seed(0)
    position_ids = torch.randint(0, 40, (3, 2, 11))             # (t, h, w) per token
    cos, sin = hf(torch.zeros(1, dtype=torch.float64), position_ids)      # (B, L, 16)
    q, k = (torch.randn(2, 4, 11, 16, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(_ours(q, k, cos, sin), _hf_rotary_logits(module, q, k, cos, sin),
                               rtol=0, atol=1e-10)
    ours = pnn.MRoPE(4, 16, (2, 3, 3), interleaved_sections=interleaved_sections,
                     rope_theta=5000.0)
    got_cos, got_sin = ours.tables(torch.arange(11), position_ids, torch.float64)
    torch.testing.assert_close(got_cos[:, 0], cos[..., :8], rtol=0, atol=1e-6)
    torch.testing.assert_close(got_sin[:, 0], sin[..., :8], rtol=0, atol=1e-6)
    # the module in a layer's place: its logits are HF's on its tables
    full = lambda x: torch.cat([x[:, 0], x[:, 0]], -1)
    torch.testing.assert_close(ours.logits(q, k, state=position_ids),
                               _hf_rotary_logits(module, q, k, full(got_cos), full(got_sin)),
                               rtol=0, atol=1e-10)


@needs_torch
def test_hf_pixtral_2d_rotary():
    """Pixtral's 2-D axial rotary of a 3 x 4 patch grid: HF's rotation on its tables
    equals posenc's, float64 to 1e-10; AxialRoPE2D(style="pixtral")'s tables equal HF's."""
    transformers = pytest.importorskip("transformers")
    module = pytest.importorskip("transformers.models.pixtral.modeling_pixtral")
    config = transformers.PixtralVisionConfig(hidden_size=64, num_attention_heads=4, head_dim=16)
    hf = module.PixtralVisionRotaryEmbedding(config)
    ids = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij"), -1)
    cos, sin = hf(torch.zeros(1, dtype=torch.float64), ids.reshape(-1, 2))   # (12, 16)
    torch.manual_seed(0)
    q, k = (torch.randn(1, 4, 12, 16, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(_ours(q, k, cos, sin), _hf_rotary_logits(module, q, k, cos, sin),
                               rtol=0, atol=1e-10)
    ours = pnn.AxialRoPE2D(4, 16, (3, 4), style="pixtral")
    got_cos, got_sin = ours.tables(torch.arange(12), None, torch.float64)
    torch.testing.assert_close(got_cos[0, 0], cos[:, :8], rtol=0, atol=1e-6)
    torch.testing.assert_close(got_sin[0, 0], sin[:, :8], rtol=0, atol=1e-6)


@needs_torch
def test_hf_dinov3_rotary_with_prefix_tokens():
    """DINOv3's rotary (patch centres in [-1, 1]; [CLS] and registers unrotated): HF's
    apply_rotary_pos_emb equals posenc's per-token rope with identity rows for the
    prefix, float64 to 1e-10; AxialRoPE2D(style="dinov3")'s tables equal HF's."""
    transformers = pytest.importorskip("transformers")
    module = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
    config = transformers.DINOv3ViTConfig(hidden_size=64, num_attention_heads=4, image_size=32,
                                          patch_size=8, num_register_tokens=2)
    hf = module.DINOv3ViTRopePositionEmbedding(config).eval()
    cos, sin = hf(torch.zeros(1, 3, 24, 32, dtype=torch.float64))    # 3 x 4 patches: (12, 16)
    torch.manual_seed(0)
    prefix = 3
    q, k = (torch.randn(2, 4, prefix + 12, 16, dtype=torch.float64) for _ in range(2))
    qr, kr = module.apply_rotary_pos_emb(q, k, cos, sin)
    want = qr @ kr.transpose(-1, -2) / 4.0
    ours = pnn.AxialRoPE2D(4, 16, (3, 4), style="dinov3", prefix_tokens=prefix)
    torch.testing.assert_close(ours.logits(q, k), want, rtol=0, atol=1e-6)   # tables float32
    got_cos, got_sin = ours.tables(torch.arange(prefix + 12), None, torch.float64)
    torch.testing.assert_close(got_cos[0, 0, prefix:], cos[:, :8], rtol=0, atol=1e-6)
    torch.testing.assert_close(got_sin[0, 0, prefix:], sin[:, :8], rtol=0, atol=1e-6)
    identity = torch.cat([torch.ones(prefix, 16, dtype=torch.float64), cos.double()])
    zeros = torch.cat([torch.zeros(prefix, 16, dtype=torch.float64), sin.double()])
    torch.testing.assert_close(_ours(q, k, identity, zeros), want, rtol=0, atol=1e-10)


@needs_torch
def test_rope_mixed_trains_through_the_kernels():
    """RoPE-Mixed's learnable frequencies: the fused layer's output and the
    frequencies' gradient equal the torch-native formula's (autograd through cos and
    sin), float64; a few steps of Adam lower a loss; gradcheck of the op and the
    attention with per-token tables; compile equals eager."""
    torch.manual_seed(0)
    encoding = pnn.RoPEMixed(4, 16, (3, 4), prefix_tokens=1)
    layer = pnn.PositionalSelfAttention(64, 4, encoding).double()
    x = torch.randn(2, 13, 64, dtype=torch.float64)
    fused = layer(x)
    fused.square().sum().backward()
    grad = encoding.freqs.grad.clone()
    assert grad.abs().sum() > 0
    encoding.freqs.grad = None
    with pt.use_native():
        torch.testing.assert_close(layer(x), fused, rtol=1e-12, atol=1e-12)
        layer(x).square().sum().backward()
    torch.testing.assert_close(encoding.freqs.grad, grad, rtol=1e-10, atol=1e-10)
    target = torch.randn(2, 13, 64, dtype=torch.float64)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = (layer(x) - target).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
    compiled = torch.compile(lambda x: layer(x), dynamic=False)
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-12, atol=1e-12)

    rng = np.random.default_rng(0)
    q, k, t = _call(rng, 1, 2, 1, 3, 4, 4, 2, shared=(True, False))
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, *(t[n] for n in TABLES))]
    assert torch.autograd.gradcheck(
        lambda q, k, c, s, ck, sk: pt.rope(q, k, c, s, cos_k=ck, sin_k=sk), leaves)
    v = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, c, s, ck, sk: pt.rope_attention(q, k, v, c, s, cos_k=ck, sin_k=sk,
                                                        causal=True, query_offset=1).out,
        (leaves[0], leaves[1], v, *leaves[2:]))
