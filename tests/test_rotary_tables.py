"""posenc.rotary: rope_tables gives HuggingFace transformers' rotary tables
(LlamaRotaryEmbedding, GPTNeoXRotaryEmbedding for partial rotary) for every
rope_type, in float32 to float32 rounding and in float64 against HF's own
formulas run in float64; xpos_tables gives xPos's tables (formula, and a port
of torchscale's XPOS); bad arguments raise clear errors."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from posenc import rotary  # noqa: E402
from posenc.rotary import ROPE_TYPES, rope_tables, xpos_tables  # noqa: E402

U32 = 2.0 ** -24        # float32's unit roundoff: an ulp of a number in [0.5, 1)
U64 = 2.0 ** -53
C32 = 8


# ---------------------------------------------------------------------------
# cases: (id, rope_parameters for a rotary dim, num_positions, max_position_embeddings)
# ---------------------------------------------------------------------------

def longrope(rdim, **extra):
    rng = np.random.default_rng(rdim)
    return {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [float(x) for x in 1 + rng.random(rdim // 2)],
            "long_factor": [float(x) for x in 1 + 30 * rng.random(rdim // 2)],
            "original_max_position_embeddings": 2048, **extra}


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
CASES = [
    ("default", lambda r: {"rope_type": "default", "rope_theta": 10000.0}, 4096, 2048),
    ("default-theta5e5-8192", lambda r: {"rope_type": "default", "rope_theta": 5e5}, 8192, 2048),
    ("linear", lambda r: {"rope_type": "linear", "factor": 4.0}, 4096, 2048),
    ("linear-1.7", lambda r: {"rope_type": "linear", "factor": 1.7, "rope_theta": 2e4}, 2048, 2048),
    ("dynamic-below", lambda r: {"rope_type": "dynamic", "factor": 2.0}, 4096, 8192),
    ("dynamic-at", lambda r: {"rope_type": "dynamic", "factor": 3.0}, 2048, 2048),
    ("dynamic-above", lambda r: {"rope_type": "dynamic", "factor": 2.5}, 4096, 1000),
    ("yarn", lambda r: dict(YARN), 4096, 4096),
    ("yarn-no-truncate", lambda r: dict(YARN, truncate=False, beta_fast=16, beta_slow=2),
     4096, 4096),
    ("yarn-mscale", lambda r: dict(YARN, factor=40.0, original_max_position_embeddings=4096,
                                   mscale=1.0, mscale_all_dim=0.707), 4096, 163840),
    ("yarn-attention", lambda r: dict(YARN, attention_factor=1.3, truncate=False), 4096, 4096),
    ("yarn-factor-none", lambda r: dict(YARN, factor=None, rope_theta=50000.0), 2048, 8192),
    ("longrope-short", lambda r: longrope(r, factor=4.0), 2048, 8192),
    ("longrope-long", lambda r: longrope(r, factor=4.0), 4096, 8192),
    ("longrope-long-no-factor", lambda r: longrope(r), 4096, 8192),     # a from max/original
    ("longrope-attention", lambda r: longrope(r, attention_factor=1.2), 3000, 8192),
    ("llama3", lambda r: dict(LLAMA3, rope_theta=500000.0,
                              original_max_position_embeddings=8192), 8192, 131072),
    ("llama3-small", lambda r: dict(LLAMA3, original_max_position_embeddings=256), 4096, 2048),
]
# (head_dim, partial_rotary_factor): the rotary dim is int(head_dim * partial_rotary_factor)
DIMS = [(8, None), (64, None), (128, None), (64, 0.25)]


def rotary_dim(head_dim, partial):
    return head_dim if partial is None else int(head_dim * partial)


def hf_config(params, head_dim, partial, max_pos):
    """A tiny config; Llama's default init ignores partial_rotary_factor, GPT-NeoX's reads it."""
    params = copy.deepcopy(params)          # the config completes the dict in place
    common = dict(num_attention_heads=2, intermediate_size=8, num_hidden_layers=1, vocab_size=8,
                  max_position_embeddings=max_pos, rope_parameters=params)
    if partial is None:
        return transformers.LlamaConfig(hidden_size=2 * head_dim, head_dim=head_dim,
                                        num_key_value_heads=2, **common)
    params["partial_rotary_factor"] = partial
    return transformers.GPTNeoXConfig(hidden_size=2 * head_dim, **common)


def hf_module(params, head_dim, partial, max_pos):
    config = hf_config(params, head_dim, partial, max_pos)
    return (LlamaRotaryEmbedding if partial is None else GPTNeoXRotaryEmbedding)(config)


def hf_call(module, n):
    """cos, sin (n, rotary_dim) of a forward pass on positions 0..n-1."""
    cos, sin = module(torch.zeros(1, n, 1), torch.arange(n)[None])
    return cos[0].numpy(), sin[0].numpy()


@pytest.fixture(autouse=True, scope="module")
def quiet_transformers():
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()     # yarn's factor-vs-max warnings, ...
    yield
    transformers.logging.set_verbosity(level)


# ---------------------------------------------------------------------------
# float32: HF's tables
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dims", DIMS, ids=[f"hd{h}" + (f"x{p}" if p else "") for h, p in DIMS])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float32_equals_hf(case, dims):
    name, make, n, max_pos = case
    rdim = rotary_dim(*dims)
    params = make(rdim)
    module = hf_module(params, *dims, max_pos)
    hf_cos, hf_sin = hf_call(module, n)
    r = rdim // 2
    assert hf_cos.shape == (n, rdim) and np.array_equal(hf_cos[:, r:], hf_cos[:, :r])
    cos, sin = rope_tables(n, rdim, rope_parameters=params, max_position_embeddings=max_pos)
    assert cos.dtype == sin.dtype == np.float32 and cos.shape == sin.shape == (n, r)

    # Every step but pow, cos and sin is HF's, rounded as torch rounds it; those three are
    # correctly rounded here and within 1 ulp in torch (Sleef u10 in its vector loops, libm
    # in their tails), so inv_freq (1 / pow) is HF's bit for bit or 1-2 ulps off, on this CPU
    # mostly bit for bit (here 1 ulp off in 5 pairs, of 4 of the 72 runs: linear-1.7 and
    # dynamic-above at hd128, yarn-factor-none at hd64 and hd128).
    inv_freq, a = rotary._inv_freq(np.float32, rdim, params, max_pos, n)
    hf_inv = module.inv_freq.numpy()        # after the forward pass: dynamic/longrope updated
    assert a == module.attention_scaling
    ulps = np.abs(inv_freq.view(np.int32).astype(np.int64) - hf_inv.view(np.int32))
    assert ulps.max() <= 2, ulps
    # The bound, per pair t, a = max(1, attention factor):
    # * same inv_freq: the angles p * inv_freq are the same float32s, and the tables differ
    #   only by the cos/sin kernels: <= 1.5 ulp (1 ulp of a value < 1 is U32), times a, plus
    #   the rounding of the product by a; measured: 1.0 U32 (a = 1), 1.7 a U32 (a > 1);
    # * inv_freq k ulps (2 k U32 relative) apart: the angles are (2 k + 2) U32 * angle apart
    #   at most (k ulps times p, and each rounded to float32), which dominates at large p
    #   (at p = 8192, 2.4e-4 absolute for an angle of ~8000); measured: <= 2.8 U32 a (1 + angle)
    #   (3.7e-5 absolute: yarn-factor-none, hd128, angle ~360).
    # No rtol/atol would do: the first is 1 ulp at every angle, the second grows with p.
    angle = np.arange(n)[:, None] * hf_inv.astype(np.float64)[None, :]
    a = max(1.0, a)
    bound = U32 * a * (2 + np.where(ulps > 0, 2 * ulps + 2, 0) * angle)
    for mine, theirs in ((cos, hf_cos[:, :r]), (sin, hf_sin[:, :r])):
        excess = np.abs(mine.astype(np.float64) - theirs) - bound
        assert excess.max() <= 0, (name, rdim, np.unravel_index(excess.argmax(), excess.shape))


# ---------------------------------------------------------------------------
# float64: HF's formulas run in float64
# ---------------------------------------------------------------------------

def hf_float64(params, head_dim, partial, max_pos, n, monkeypatch):
    """HF's inv_freq and attention factor computed by HF's own init functions in float64
    (torch.float, torch.float32 and Tensor.float made float64 while they run), with
    dynamic_rope_update's choice of seq_len; the outer product and cos/sin in float64."""
    config = hf_config(params, head_dim, partial, max_pos)
    rope_type = config.rope_parameters["rope_type"]
    with monkeypatch.context() as m:
        m.setattr(torch, "float", torch.float64)
        m.setattr(torch, "float32", torch.float64)
        m.setattr(torch.Tensor, "float", torch.Tensor.double)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            module = LlamaRotaryEmbedding if partial is None else GPTNeoXRotaryEmbedding
            if rope_type == "default":
                inv_freq, a = module.compute_default_rope_parameters(config)
            elif rope_type == "dynamic":       # grown past max_pos: seq_len comes as a tensor
                inv_freq, a = ROPE_INIT_FUNCTIONS[rope_type](
                    config, None, seq_len=torch.tensor(n) if n > max_pos else None)
            else:
                inv_freq, a = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=n)
        finally:
            torch.set_default_dtype(default_dtype)
    assert inv_freq.dtype == torch.float64
    angle = np.arange(n, dtype=np.float64)[:, None] * inv_freq.numpy()[None, :]
    return a * np.cos(angle), a * np.sin(angle), angle, a


@pytest.mark.parametrize("dims", DIMS, ids=[f"hd{h}" + (f"x{p}" if p else "") for h, p in DIMS])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float64_equals_hf_formulas(case, dims, monkeypatch):
    name, make, n, max_pos = case
    rdim = rotary_dim(*dims)
    params = make(rdim)
    hf_cos, hf_sin, angle, a = hf_float64(params, *dims, max_pos, n, monkeypatch)
    cos, sin = rope_tables(n, rdim, rope_parameters=params, max_position_embeddings=max_pos,
                           dtype=np.float64)
    assert cos.dtype == np.float64 and cos.shape == (n, rdim // 2)
    # The same operations in float64 but pow (torch's and libm's may differ by an ulp), which
    # an angle carries times p, and a * cos rounded: 1e-12 at angle 4096; measured
    # <= 4.4 U64 a (1 + angle), 4.6e-13 absolute.
    bound = 8 * U64 * max(1.0, a) * (1 + angle)
    assert np.all(np.abs(cos - hf_cos) <= bound) and np.all(np.abs(sin - hf_sin) <= bound), name


@pytest.mark.parametrize("params", [{"rope_type": "default"},
                                    {"rope_type": "yarn", "factor": 8.0,
                                     "original_max_position_embeddings": 512},
                                    dict(LLAMA3, original_max_position_embeddings=256)],
                         ids=["default", "yarn", "llama3"])
def test_float32_is_float64_rounded(params):
    """float32 carries float32's error of inv_freq and of the angle: C32 U32 * angle
    (measured: C32 <= 5.4, llama3's inv_freq being the most rounded)."""
    n = 8192
    c32, s32 = rope_tables(n, 64, rope_parameters=params, max_position_embeddings=4096)
    c64, s64 = rope_tables(n, 64, rope_parameters=params, max_position_embeddings=4096,
                           dtype=np.float64)
    inv_freq, a = rotary._inv_freq(np.float64, 64, params, 4096, n)
    angle = np.arange(n)[:, None] * inv_freq
    err = np.maximum(np.abs(c32 - c64), np.abs(s32 - s64)) / (U32 * a)
    assert np.all(err <= 2 + C32 * angle), (err / (1 + angle)).max()


# ---------------------------------------------------------------------------
# seq_len: what dynamic and longrope read
# ---------------------------------------------------------------------------

def test_seq_len_selects_the_scaling():
    dyn = {"rope_type": "dynamic", "factor": 2.0}
    full = rope_tables(4096, 64, rope_parameters=dyn, max_position_embeddings=1000)
    part = rope_tables(100, 64, rope_parameters=dyn, max_position_embeddings=1000, seq_len=4096)
    assert all(np.array_equal(x[:100], y) for x, y in zip(full, part))
    short = rope_tables(100, 64, rope_parameters=dyn, max_position_embeddings=1000)
    assert np.array_equal(short[0], rope_tables(100, 64)[0])      # below max: default RoPE
    assert not np.array_equal(short[0], part[0])

    lr = longrope(64, factor=4.0)
    at = rope_tables(50, 64, rope_parameters=lr, seq_len=2048)      # = original: short factors
    past = rope_tables(50, 64, rope_parameters=lr, seq_len=2049)
    assert np.array_equal(at[0], rope_tables(50, 64, rope_parameters=lr)[0])
    assert not np.array_equal(at[0], past[0])
    assert np.array_equal(past[0], rope_tables(2049, 64, rope_parameters=lr)[0][:50])


def test_hf_dynamic_keeps_the_longest_sequence():
    """HF's dynamic module is stateful: after 4096 positions, a 2000-position call (still past
    max_position_embeddings) keeps the 4096 frequencies; one below max resets to the original."""
    dyn = {"rope_type": "dynamic", "factor": 2.0}
    module = hf_module(dyn, 64, None, 1000)
    hf_call(module, 4096)
    cos, _ = hf_call(module, 2000)
    kept = rope_tables(2000, 64, rope_parameters=dyn, max_position_embeddings=1000, seq_len=4096)
    fresh = rope_tables(2000, 64, rope_parameters=dyn, max_position_embeddings=1000)
    assert np.abs(cos[:, :32] - kept[0]).max() < 1e-3 < np.abs(cos[:, :32] - fresh[0]).max()
    cos, _ = hf_call(module, 500)
    assert np.abs(cos[:, :32] - rope_tables(500, 64)[0]).max() < 1e-6


def test_half_split_rotation_is_hfs(rng):
    """The module docstring's half-split rotation with these tables is HF's apply_rotary_pos_emb."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    n, d = 50, 16
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    cos, sin = rope_tables(n, d, rope_parameters=params, max_position_embeddings=64)
    q, k = rng.standard_normal((2, 1, 1, n, d)).astype(np.float32)
    hf_q, _ = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k),
                                   torch.from_numpy(np.concatenate([cos, cos], -1))[None],
                                   torch.from_numpy(np.concatenate([sin, sin], -1))[None])
    x1, x2 = q[..., :d // 2], q[..., d // 2:]
    mine = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    np.testing.assert_allclose(mine, hf_q.numpy(), rtol=1e-6, atol=1e-6)


def test_defaults_and_ignored_keys():
    default = rope_tables(300, 32)
    assert all(np.array_equal(x, y) for x, y in zip(
        default, rope_tables(300, 32, rope_parameters={"rope_type": "default", "rope_theta": 1e4})))
    assert all(np.array_equal(x, y) for x, y in zip(   # legacy "type"; rotary_dim has the partial
        default, rope_tables(300, 32, rope_parameters={"type": "default",
                                                       "partial_rotary_factor": 0.5})))
    cos, sin = rope_tables(0, 8)
    assert cos.shape == sin.shape == (0, 4)
    cos, sin = rope_tables(3, 2, dtype="float64")
    assert cos.dtype == np.float64 and np.allclose(cos[:, 0], np.cos([0, 1, 2]))
    assert set(ROPE_TYPES) == {"default", "linear", "dynamic", "yarn", "longrope", "llama3"}


def test_imports_without_torch(python):
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from posenc.rotary import rope_tables, xpos_tables\n"
            "rope_tables(5, 8, rope_parameters={'rope_type': 'yarn', 'factor': 2.0}, "
            "max_position_embeddings=64); xpos_tables(5, 8)\n"
            "assert not any(m.split('.')[0] == 'torch' and sys.modules[m] is not None "
            "for m in sys.modules)")
    done = python("-c", code)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------
# xPos
# ---------------------------------------------------------------------------

def test_xpos_formula():
    n, d, base, sb = 40, 12, 5000.0, 64
    cos, sin, cos_k, sin_k = xpos_tables(n, d, base=base, scale_base=sb, dtype=np.float64)
    assert all(x.shape == (n, d // 2) and x.dtype == np.float64 for x in (cos, sin, cos_k, sin_k))
    for p in range(n):
        for t in range(d // 2):
            theta = p / base ** (2 * t / d)
            zeta = (2 * t / d + 0.4) / 1.4
            q, k = math.pow(zeta, p / sb), math.pow(zeta, -p / sb)
            expect = (math.cos(theta) * q, math.sin(theta) * q, math.cos(theta) * k,
                      math.sin(theta) * k)
            got = (cos[p, t], sin[p, t], cos_k[p, t], sin_k[p, t])
            assert got == pytest.approx(expect, rel=1e-13, abs=1e-15), (p, t)
    as32 = xpos_tables(n, d, base=base, scale_base=sb)
    assert all(x.dtype == np.float32 and np.array_equal(x, y.astype(np.float32))
               for x, y in zip(as32, (cos, sin, cos_k, sin_k)))
    # default RoPE's rotation, scaled
    c, s = rope_tables(n, d, rope_parameters={"rope_theta": base}, dtype=np.float64)
    decay = ((np.arange(0, d, 2) / d + 0.4) / 1.4) ** (np.arange(n)[:, None] / sb)
    np.testing.assert_allclose(cos, c * decay, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(sin_k, s / decay, rtol=1e-13, atol=1e-15)


def torchscale_xpos(x, scale_base, downscale, offset=0):
    """torchscale's XPOS.forward (microsoft/torchscale,
    torchscale/component/xpos_relative_position.py) ported in float64: x (batch, length,
    head_dim), interleaved pairs."""
    length, head_dim = x.shape[1], x.shape[2]
    zeta = (torch.arange(0, head_dim, 2, dtype=torch.float64) + 0.4 * head_dim) / (1.4 * head_dim)
    min_pos = -(length + offset) // 2
    max_pos = length + offset + min_pos
    scale = zeta ** (torch.arange(min_pos, max_pos, 1, dtype=torch.float64) / scale_base)[:, None]
    seq_len, dim = scale.shape                                     # fixed_pos_embedding(scale)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, dtype=torch.float64) / dim))
    angle = torch.einsum("i , j -> i j", torch.arange(0, seq_len, dtype=torch.float64), inv_freq)
    sin, cos = torch.sin(angle), torch.cos(angle)
    if scale.shape[0] > length:
        scale, sin, cos = scale[-length:], sin[-length:], cos[-length:]
    if downscale:
        scale = 1 / scale
    sin, cos = (torch.repeat_interleave(t * scale, 2, dim=-1) for t in (sin, cos))
    rotated = torch.stack((-x[:, :, 1::2], x[:, :, ::2]), dim=-1).flatten(-2)   # rotate_every_two
    return x * cos + rotated * sin, scale


def interleaved_rotation(x, cos, sin):
    """(x_{2t}, x_{2t+1}) -> (x_{2t} c - x_{2t+1} s, x_{2t+1} c + x_{2t} s), as the module
    docstring says."""
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


@pytest.mark.parametrize("n", [37, 64])
def test_xpos_matches_torchscale(rng, n):
    d, sb = 16, 512
    q, k = rng.standard_normal((2, 1, n, d))
    ts_q, scale = torchscale_xpos(torch.from_numpy(q), sb, downscale=False)
    ts_k, _ = torchscale_xpos(torch.from_numpy(k), sb, downscale=True)
    cos, sin, cos_k, sin_k = xpos_tables(n, d, scale_base=sb, dtype=np.float64)
    # torchscale's centring: its query tables are ours times zeta ** (min_pos / scale_base)
    centring = scale.numpy()[0]
    zeta = (np.arange(0, d, 2) / d + 0.4) / 1.4
    np.testing.assert_allclose(centring, zeta ** ((-n // 2) / sb), rtol=1e-14)
    my_q = interleaved_rotation(q, cos, sin)
    my_k = interleaved_rotation(k, cos_k, sin_k)
    np.testing.assert_allclose(my_q * np.repeat(centring, 2), ts_q.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(my_k / np.repeat(centring, 2), ts_k.numpy(), rtol=1e-12, atol=1e-12)
    # ... which cancels in the logits
    np.testing.assert_allclose(my_q[0] @ my_k[0].T, (ts_q[0] @ ts_k[0].T).numpy(),
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

YARN_ONLY_FACTOR = {"rope_type": "yarn", "factor": 2.0}
ERRORS = [
    (dict(num_positions=-1), ValueError, "num_positions must be >= 0"),
    (dict(num_positions=2.0), TypeError, "num_positions must be an int"),
    (dict(num_positions=True), TypeError, "num_positions must be an int"),
    (dict(rotary_dim=7), ValueError, "rotary_dim must be even"),
    (dict(rotary_dim=0), ValueError, "rotary_dim must be >= 2"),
    (dict(rotary_dim="8"), TypeError, "rotary_dim must be an int"),
    (dict(dtype=np.float16), TypeError, "dtype must be float32 or float64"),
    (dict(dtype="int32"), TypeError, "dtype must be float32 or float64"),
    (dict(dtype="no-such-type"), TypeError, "dtype must be float32 or float64"),
    (dict(dtype=None), TypeError, "dtype must be float32 or float64"),
    (dict(seq_len=-1), ValueError, "seq_len must be >= 0"),
    (dict(max_position_embeddings=0), ValueError, "max_position_embeddings must be >= 1"),
    (dict(rope_parameters=[("rope_type", "default")]), TypeError, "rope_parameters must be a dict"),
    (dict(rope_parameters={"rope_type": "ntk"}), ValueError,
     "unknown rope_type 'ntk'; known: default, linear, dynamic, yarn, longrope, llama3"),
    (dict(rope_parameters={"rope_type": "linear"}), ValueError,
     "rope_type 'linear' need the key 'factor'"),
    (dict(rope_parameters={"rope_type": "linear", "factor": "2"}), TypeError,
     "rope_parameters['factor'] (rope_type 'linear') must be a real number"),
    (dict(rope_parameters={"rope_type": "linear", "factor": -1.0}), ValueError,
     "rope_parameters['factor'] (rope_type 'linear') must be a finite positive number"),
    (dict(rope_parameters={"rope_theta": 0.0}), ValueError, "rope_parameters['rope_theta']"),
    (dict(rope_parameters={"rope_type": "dynamic"}, max_position_embeddings=64), ValueError,
     "rope_type 'dynamic' need the key 'factor'"),
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), ValueError,
     "rope_type 'dynamic' needs max_position_embeddings"),
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}, rotary_dim=2,
          max_position_embeddings=64), ValueError, "needs rotary_dim >= 4"),
    (dict(rope_parameters=YARN_ONLY_FACTOR), ValueError,
     "rope_type 'yarn' needs max_position_embeddings (the model config's) when rope_parameters "
     "has no 'original_max_position_embeddings'"),
    (dict(rope_parameters={"rope_type": "yarn", "original_max_position_embeddings": 64}),
     ValueError, "rope_type 'yarn' needs max_position_embeddings (the model config's) when "
     "rope_parameters has no 'factor'"),
    (dict(rope_parameters={"rope_type": "longrope", "long_factor": [1.0] * 4, "factor": 2.0,
                           "original_max_position_embeddings": 64}),
     ValueError, "rope_type 'longrope' need the key 'short_factor'"),
    (dict(rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 4,
                           "long_factor": [1.0] * 3, "factor": 2.0,
                           "original_max_position_embeddings": 64}),
     ValueError,
     "rope_parameters['long_factor'] (rope_type 'longrope') must hold rotary_dim // 2 = 4"),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}),
     ValueError, "rope_type 'llama3' need the key 'low_freq_factor'"),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                           "high_freq_factor": 2.0, "original_max_position_embeddings": 64}),
     ValueError, "need low_freq_factor != high_freq_factor"),
]


XPOS_ERRORS = [
    (dict(rotary_dim=5), ValueError, "rotary_dim must be even"),
    (dict(num_positions=-2), ValueError, "num_positions must be >= 0"),
    (dict(base=0.0), ValueError, "base must be a finite positive number"),
    (dict(scale_base=-512), ValueError, "scale_base must be a finite positive number"),
    (dict(scale_base="512"), TypeError, "scale_base must be a real number"),
    (dict(dtype=np.int64), TypeError, "dtype must be float32 or float64"),
]


CASES = [(rope_tables, *case) for case in ERRORS] + [(xpos_tables, *case) for case in XPOS_ERRORS]


@pytest.mark.parametrize("function, kwargs, error, message", CASES,
                         ids=[f"{f.__name__}-{m[:40]}" for f, _, _, m in CASES])
def test_errors(function, kwargs, error, message):
    args = dict(num_positions=4, rotary_dim=8)
    args.update(kwargs)
    with pytest.raises(error) as info:
        function(args.pop("num_positions"), args.pop("rotary_dim"), **args)
    assert message in str(info.value)
