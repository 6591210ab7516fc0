"""rope (spec §3.12): the rotation in the fused kernels against posenc.reference,
every ISA and dtype, logits and attention, forward and backward, on odd sizes
with partial and interleaved rotary, the keys' own tables (xPos), positions
given, query_offset and causal; float64 finite differences; the torch ops
(gradcheck, compile equal to eager); and HuggingFace's own rotations -- Llama's
apply_rotary_pos_emb for every rope_type, GPT-NeoX's partial rotary, GPT-J's
interleaved pairs -- feeding an eager attention, equal to posenc's to rounding."""

import numpy as np
import pytest

import posenc
from posenc import reference, testing
from posenc._examples import make_inputs, with_inputs

torch = pytest.importorskip("torch")
import posenc.torch as pt  # noqa: E402
from posenc.torch import nn as pnn  # noqa: E402

DTYPES = ["float32", "float64", "float16"] + (["bfloat16"] if posenc._dtypes.BFLOAT16 else [])


def _variant(name, rng, *, B=2, H=3, n=7, m=9, d=10, dtype=np.float64):
    """(args, kwargs) of rope for one variant of the rotation."""
    rotary_dim = 2 * max(1, d // 4) if name in ("partial", "everything") else None
    args, kwargs = make_inputs("rope", B, H, n, m, d, dtype=dtype, rng=rng, rotary_dim=rotary_dim)
    P, r = args[2].shape
    if name in ("interleaved", "everything"):
        kwargs["interleaved"] = True
    if name in ("xpos", "everything"):
        tables = posenc.xpos_tables(P, 2 * r, scale_base=16, dtype=np.float64)
        args[2], args[3] = tables[0].astype(dtype), tables[1].astype(dtype)
        kwargs["cos_k"], kwargs["sin_k"] = tables[2].astype(dtype), tables[3].astype(dtype)
    if name in ("positions", "everything"):     # left padding: each row's positions from 0
        kwargs["positions_q"] = np.maximum(np.arange(n)[None] - np.array([[0], [3]]), 0) + 2
        kwargs["positions_k"] = np.maximum(np.arange(m)[None] - np.array([[0], [3]]), 0)
    return args, kwargs


VARIANTS = ["default", "partial", "interleaved", "xpos", "positions", "everything"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_and_gradients(posenc_isa, variant, dtype, rng):
    for n, m, d, offset in ((1, 1, 2, 0), (7, 9, 10, 3), (17, 3, 6, 0), (33, 31, 16, 5)):
        args, kwargs = _variant(variant, rng, n=n, m=m, d=d, dtype=posenc._dtypes.by_name(dtype))
        kwargs = dict(kwargs, query_offset=offset if "positions_q" not in kwargs else 0)
        testing.assert_logits_close(posenc.rope(*args, **kwargs), "rope", *args, **kwargs)
        testing.assert_grads_close(posenc.rope_backward, "rope", *args, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention(posenc_isa, variant, dtype, rng):
    np_dtype = posenc._dtypes.by_name(dtype)
    for n, m, options in ((7, 9, dict(causal=True, query_offset=2)),
                          (9, 7, dict(key_padding_mask=np.arange(7)[None] >= [[7], [5]])),
                          (5, 12, dict(causal=True, query_offset=7, dropout_p=0.2, seed=3))):
        args, kwargs = _variant(variant, rng, n=n, m=m, dtype=np_dtype)
        v = rng.standard_normal((2, 3, m, 4)).astype(np_dtype)
        got = posenc.rope_attention(args[0], args[1], v, *args[2:], **kwargs, **options)
        testing.assert_attention_close(got, "rope", *args[:2], v, *args[2:], **kwargs, **options)
        d_out = rng.standard_normal(got.out.shape).astype(np_dtype)
        grads = posenc.rope_attention_backward(d_out, args[0], args[1], v, *args[2:], got.out,
                                               got.lse, **kwargs, **options)
        saved = (got.out.astype(np.float64), got.lse.astype(np.float64))
        wide = [a.astype(np.float64) for a in args]
        wide_kw = {key: x.astype(np.float64) if isinstance(x, np.ndarray) and x.dtype.kind not in "iub"
                   else x for key, x in kwargs.items()}
        want = reference.rope_attention_backward(d_out.astype(np.float64), wide[0], wide[1],
                                                 v.astype(np.float64), *wide[2:], *saved,
                                                 **wide_kw, **options)
        assert grads.cos is grads.sin is grads.cos_k is grads.sin_k is None
        tolerance = {"float64": 1e-11, "float32": 2e-4}.get(dtype, 0.08)
        for name in ("q", "k", "v"):
            got_grad, want_grad = getattr(grads, name).astype(np.float64), getattr(want, name)
            scale = max(np.abs(want_grad).max(), 1.0)
            assert np.abs(got_grad - want_grad).max() <= tolerance * scale, (variant, name)


def test_finite_differences(rng):
    """float64: the logits' and the attention's gradients in q and k equal central
    differences, the rotation partial, interleaved, with positions and xPos."""
    args, kwargs = _variant("everything", rng, B=2, H=1, n=3, m=4, d=8)
    v = rng.standard_normal((2, 1, 4, 3))
    weights = rng.standard_normal((2, 1, 3, 3))
    options = dict(causal=False, dropout_p=0.0)

    def loss(q, k):
        out = posenc.rope_attention(q, k, v, *args[2:], **kwargs, **options).out
        logits = posenc.rope(q, k, *args[2:], **kwargs)
        return float((weights * out).sum() + (logits ** 2).sum() / 2)

    result = posenc.rope_attention(args[0], args[1], v, *args[2:], **kwargs, **options)
    grads = posenc.rope_attention_backward(weights, args[0], args[1], v, *args[2:], result.out,
                                           result.lse, **kwargs, **options)
    logits = posenc.rope(args[0], args[1], *args[2:], **kwargs)
    logit_grads = posenc.rope_backward(logits, *args, **kwargs)
    for position, name in enumerate(("q", "k")):
        value = args[position]
        numeric = np.zeros(value.shape)
        for index in np.ndindex(value.shape):
            bumped = [a.copy() for a in args[:2]]
            bumped[position][index] += 1e-6
            up = loss(*bumped)
            bumped[position][index] -= 2e-6
            numeric[index] = (up - loss(*bumped)) / 2e-6
        analytic = getattr(grads, name) + getattr(logit_grads, name)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=name)


def test_one_thread_and_two_are_bitwise_equal(rng):
    args, kwargs = _variant("everything", rng, B=2, H=2, n=70, m=90, d=16, dtype=np.float32)
    v = rng.standard_normal((2, 2, 90, 8)).astype(np.float32)
    results = []
    previous = posenc.get_num_threads()
    try:
        for threads in (1, 2):
            posenc.set_num_threads(threads)
            out = posenc.rope_attention(args[0], args[1], v, *args[2:], **kwargs, causal=True)
            grads = posenc.rope_attention_backward(out.out, args[0], args[1], v, *args[2:],
                                                   out.out, out.lse, **kwargs, causal=True)
            results.append((out.out, out.lse, grads.q, grads.k, grads.v))
    finally:
        posenc.set_num_threads(previous)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


# ------------------------------------------------------------------ errors

def _errors():
    q, k = np.zeros((2, 1, 3, 4)), np.zeros((2, 1, 5, 4))
    cos, sin = np.ones((6, 2)), np.zeros((6, 2))
    return [
        ("odd rows", (q, k, cos, sin[:5]), {}, ValueError, "sin must have shape (6, 2)"),
        ("too many pairs", (q, k, np.ones((6, 3)), np.zeros((6, 3))), {}, ValueError,
         "more than q's d = 4"),
        ("cos_k alone", (q, k, cos, sin), {"cos_k": cos}, ValueError, "cos_k and sin_k come"),
        ("positions out of range", (q, k, cos, sin),
         {"positions_q": np.full((2, 3), 6)}, ValueError, "positions_q holds position 6"),
        ("negative position", (q, k, cos, sin),
         {"positions_k": -np.ones((2, 5), dtype=np.int32)}, ValueError, "positions_k holds"),
        ("positions shape", (q, k, cos, sin), {"positions_q": np.zeros((2, 4), dtype=np.int64)},
         ValueError, "positions_q must have shape (2, 3)"),
        ("float positions", (q, k, cos, sin), {"positions_q": np.zeros((2, 3))}, TypeError,
         "positions_q must have an integer dtype"),
        ("query_offset past the tables", (q, k, cos, sin), {"query_offset": 4}, ValueError,
         "query_offset + i reach 6"),
        ("keys past the tables", (q, np.zeros((2, 1, 7, 4)), cos, sin), {}, ValueError,
         "key positions j reach 6"),
        ("tables of another dtype", (q, k, cos.astype(np.float32), sin), {}, TypeError,
         "cos has dtype float32"),
        ("interleaved not a bool", (q, k, cos, sin), {"interleaved": 1}, TypeError,
         "interleaved must be a bool"),
    ]


@pytest.mark.parametrize("case", _errors(), ids=lambda c: c[0])
def test_errors(case):
    _, args, kwargs, error, message = case
    for namespace in (posenc, reference):
        with pytest.raises(error) as info:
            namespace.rope(*args, **kwargs)
        assert message in str(info.value), (namespace.__name__, str(info.value))
    tensors = [torch.from_numpy(a) for a in args]
    keywords = {key: torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                for key, x in kwargs.items()}
    with pytest.raises(error):
        pt.rope(*tensors, **keywords)


# ------------------------------------------------------------------ torch

def _tensors(args, kwargs):
    tensor = lambda x: torch.from_numpy(x)    # noqa: E731
    return ([tensor(args[0]).requires_grad_(), tensor(args[1]).requires_grad_()]
            + [tensor(a) for a in args[2:]],
            {key: tensor(x) if isinstance(x, np.ndarray) else x for key, x in kwargs.items()})


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_gradcheck_and_native(variant, rng):
    args, kwargs = _variant(variant, rng, B=2, H=2, n=4, m=5, d=6)
    (q, k, *rest), tkw = _tensors(args, kwargs)
    v = torch.from_numpy(rng.standard_normal((2, 2, 5, 3))).requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: pt.rope(q, k, *rest, **tkw), (q, k))
    assert torch.autograd.gradcheck(
        lambda q, k, v: pt.rope_attention(q, k, v, *rest, **tkw, causal=True).out, (q, k, v))
    with pt.use_native():
        native = pt.rope(q, k, *rest, **tkw)
    torch.testing.assert_close(pt.rope(q, k, *rest, **tkw), native, rtol=1e-12, atol=1e-12)


@pytest.mark.usefixtures("one_thread")
def test_torch_compile_equals_eager(rng):
    args, kwargs = _variant("everything", rng, B=2, H=2, n=4, m=5, d=6)
    (q, k, *rest), tkw = _tensors(args, kwargs)
    v = torch.from_numpy(rng.standard_normal((2, 2, 5, 3)))

    def f(q, k):
        return pt.rope_attention(q, k, v, *rest, **tkw, causal=True).out.square().sum()

    eager = f(q, k)
    eager_grads = torch.autograd.grad(eager, (q, k))
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(q, k)
    torch.testing.assert_close(got, eager)
    for a, b in zip(torch.autograd.grad(got, (q, k)), eager_grads):
        torch.testing.assert_close(a, b)


def test_rotary_embedding_module(rng):
    """RotaryEmbedding builds HF's tables from rope_parameters for the positions a call
    reaches, partial and interleaved, and runs the fused attention with them."""
    parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
    module = pnn.RotaryEmbedding(2, 8, rotary_dim=4, rope_parameters=parameters,
                                 max_position_embeddings=32, interleaved=True)
    q = torch.from_numpy(rng.standard_normal((1, 2, 3, 8)))
    k = torch.from_numpy(rng.standard_normal((1, 2, 40, 8)))        # past 32 positions
    cos, sin = posenc.rope_tables(40, 4, rope_parameters=parameters, max_position_embeddings=32,
                                  dtype=np.float64)
    want = pt.rope(q, k, torch.from_numpy(cos), torch.from_numpy(sin), interleaved=True,
                   query_offset=37)
    torch.testing.assert_close(module(q, k, query_offset=37), want, rtol=1e-12, atol=1e-12)
    layer = pnn.PositionalSelfAttention(16, 2, module).double()
    out = layer(torch.from_numpy(rng.standard_normal((2, 5, 16))), causal=True)
    assert out.shape == (2, 5, 16) and torch.isfinite(out).all()


# ------------------------------------------------------------------ HuggingFace

transformers = pytest.importorskip("transformers")

ROPE_TYPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
             "original_max_position_embeddings": 8},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [1.2, 1.5, 2.0, 3.0],
                 "factor": 2.0, "original_max_position_embeddings": 8},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
}


def _eager(q, k, v, mask, scaling):
    """HF's eager attention in float64 throughout (its eager_attention_forward takes its
    softmax in float32 even for float64 tensors: compared separately below)."""
    weights = torch.matmul(q, k.transpose(2, 3)) * scaling + mask
    return torch.matmul(torch.softmax(weights, dim=-1), v)


def _causal_mask(position_q, valid_k):
    """HF's additive mask: -inf above the diagonal and on padded keys (B, 1, n, m)."""
    allowed = (torch.arange(valid_k.shape[1])[None, None, :] <= position_q[:, :, None]) & \
        valid_k[:, None, :]
    return torch.where(allowed, 0.0, float("-inf")).to(torch.float64)[:, None]


@pytest.mark.parametrize("rope_type", list(ROPE_TYPES))
def test_llama_rotation_and_eager_attention(rope_type, rng):
    """HF Llama: LlamaRotaryEmbedding's cos, sin for a left-padded batch (position_ids
    from 0 at each row's first token; dynamic and longrope past their original
    length), apply_rotary_pos_emb, eager attention, float64: posenc's rope_attention
    with the first-half columns of the same tables and the same positions, to 1e-12."""
    from transformers.models.llama import modeling_llama as llama

    B, H, n, head_dim = 2, 3, 24, 8
    config = transformers.LlamaConfig(hidden_size=H * head_dim, num_attention_heads=H,
                                      num_key_value_heads=H, head_dim=head_dim,
                                      max_position_embeddings=16,
                                      rope_parameters=dict(ROPE_TYPES[rope_type]))
    rotary = llama.LlamaRotaryEmbedding(config)
    pad = torch.tensor([0, 5])
    valid = torch.arange(n)[None] >= pad[:, None]
    position_ids = (torch.arange(n)[None] - pad[:, None]).clamp(min=0)
    q, k, v = (torch.from_numpy(rng.standard_normal((B, H, n, head_dim))) for _ in range(3))
    cos, sin = rotary(q, position_ids)                         # (B, n, head_dim), float64
    q_rot, k_rot = llama.apply_rotary_pos_emb(q, k, cos, sin)
    scaling = head_dim ** -0.5
    want = _eager(q_rot, k_rot, v, _causal_mask(torch.arange(n)[None].expand(B, n), valid),
                  scaling)
    # posenc: the tables of every position (row p = position p), half the columns
    table_cos, table_sin = rotary(q, torch.arange(n)[None])
    half = head_dim // 2
    got = pt.rope_attention(q, k, v, table_cos[0, :, :half].contiguous(),
                            table_sin[0, :, :half].contiguous(), positions_q=position_ids,
                            positions_k=position_ids, causal=True, key_padding_mask=~valid,
                            scale=scaling)
    rows = valid[:, None, :, None].expand_as(want)               # padded queries aside
    error = (got.out - want)[rows].abs().max() / want[rows].abs().max()
    assert error <= 1e-12, error
    # HF's own eager_attention_forward (softmax in float32): within its rounding
    module = type("M", (), {"num_key_value_groups": 1, "training": False})()
    hf_out, _ = llama.eager_attention_forward(
        module, q_rot, k_rot, v, _causal_mask(torch.arange(n)[None].expand(B, n), valid),
        scaling)
    hf_out = hf_out.transpose(1, 2)
    assert (got.out - hf_out)[rows].abs().max() <= 1e-6


def test_gpt_neox_partial_rotary(rng):
    """GPT-NeoX rotates a quarter of each head (rotary_pct 0.25): its
    GPTNeoXRotaryEmbedding and apply_rotary_pos_emb, equal to posenc's rope with
    2r = head_dim / 4 (the rest unrotated)."""
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    B, H, n, head_dim = 2, 2, 11, 16
    config = transformers.GPTNeoXConfig(hidden_size=H * head_dim, num_attention_heads=H,
                                        max_position_embeddings=32, rotary_pct=0.25)
    rotary = neox.GPTNeoXRotaryEmbedding(config)
    q, k = (torch.from_numpy(rng.standard_normal((B, H, n, head_dim))) for _ in range(2))
    cos, sin = rotary(q, torch.arange(n)[None])
    assert cos.shape[-1] == head_dim // 4
    q_rot, k_rot = neox.apply_rotary_pos_emb(q, k, cos, sin)
    want = torch.matmul(q_rot, k_rot.transpose(-1, -2)) * head_dim ** -0.5
    r = head_dim // 8
    got = pt.rope(q, k, cos[0, :, :r].contiguous(), sin[0, :, :r].contiguous())
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()


def test_gpt_j_interleaved(rng):
    """GPT-J rotates interleaved pairs (rotate_every_two) of its first rotary_dim
    dimensions, by its sinusoidal table: posenc's rope with interleaved=True."""
    from transformers.models.gptj import modeling_gptj as gptj

    B, H, n, head_dim, rotary_dim = 2, 2, 9, 12, 8
    positions = gptj.create_sinusoidal_positions(n, rotary_dim).double()   # [sin | cos]
    sin, cos = positions[None, :, :rotary_dim // 2], positions[None, :, rotary_dim // 2:]
    q, k = (torch.from_numpy(rng.standard_normal((B, n, H, head_dim))) for _ in range(2))

    def rotate(x):                                       # GPT-J's layout: (B, n, H, d)
        return torch.cat([gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos),
                          x[..., rotary_dim:]], dim=-1).transpose(1, 2)

    want = torch.matmul(rotate(q), rotate(k).transpose(-1, -2)) * head_dim ** -0.5
    got = pt.rope(q.transpose(1, 2), k.transpose(1, 2), cos[0].contiguous(), sin[0].contiguous(),
                  interleaved=True)
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()


def test_float32_tables_feed_the_kernels_as_hf_rotates(rng):
    """float32 end to end: posenc.rope_tables' tables (HF's to rounding) in the fused
    kernels against HF Llama's rotation and a float32 eager attention."""
    from transformers.models.llama import modeling_llama as llama

    B, H, n, head_dim = 1, 2, 33, 16
    parameters = dict(ROPE_TYPES["yarn"])
    config = transformers.LlamaConfig(hidden_size=H * head_dim, num_attention_heads=H,
                                      num_key_value_heads=H, head_dim=head_dim,
                                      max_position_embeddings=64, rope_parameters=parameters)
    q, k, v = (torch.from_numpy(rng.standard_normal((B, H, n, head_dim)).astype(np.float32))
               for _ in range(3))
    cos, sin = llama.LlamaRotaryEmbedding(config)(q, torch.arange(n)[None])
    q_rot, k_rot = llama.apply_rotary_pos_emb(q, k, cos, sin)
    mask = torch.triu(torch.full((n, n), float("-inf")), 1)
    want = torch.softmax(q_rot @ k_rot.transpose(-1, -2) * head_dim ** -0.5 + mask, -1) @ v
    tables = posenc.rope_tables(n, head_dim, rope_parameters=parameters,
                                max_position_embeddings=64)
    got = pt.rope_attention(q, k, v, *(torch.from_numpy(t) for t in tables), causal=True)
    assert (got.out - want).abs().max() <= 1e-5
