"""Rotary position tables: RoPE (with HuggingFace's scaled variants) and xPos.

Plain NumPy; torch is neither imported nor needed.  The formulas are those of
docs/methods.md of this repository.

``rope_tables(n, r2)`` gives ``cos, sin`` of shape ``(n, r2 // 2)``: row ``p``
is position ``p``, column ``t`` is rotation pair ``t``, whose angle is
``p * inv_freq[t]``.  With ``r = r2 // 2``, a vector ``x`` of ``r2`` rotary
dimensions is rotated at position ``p`` (``c = cos[p, t]``, ``s = sin[p, t]``)
pair by pair:

* half-split layout (HuggingFace Llama's ``rotate_half``, GPT-NeoX): the pair is
  ``(x_t, x_{t+r})`` and becomes ``(x_t c - x_{t+r} s, x_{t+r} c + x_t s)``.
  HuggingFace's own ``cos``/``sin`` of width ``r2`` are
  ``np.concatenate([cos, cos], -1)`` and ``np.concatenate([sin, sin], -1)``;
* interleaved layout (GPT-J, RoFormer): the pair is ``(x_{2t}, x_{2t+1})`` and
  becomes ``(x_{2t} c - x_{2t+1} s, x_{2t+1} c + x_{2t} s)``.

Queries and keys are rotated with the same tables, so ``q_i . k_j`` depends on
the positions through ``j - i`` only.  Where a RoPE type has an attention factor
(``yarn``, ``longrope``), both tables are multiplied by it, as HuggingFace does,
so a logit carries its square.  Dimensions past ``r2`` of a head (partial
rotary) are left as they are.

``xpos_tables`` gives the four tables of xPos: the queries' ``cos, sin`` carry
the decay ``zeta_t ** (p / scale_base)``, the keys' ``cos_k, sin_k`` its
inverse, so a logit decays as ``zeta_t ** ((i - j) / scale_base)``.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping

import numpy as np

__all__ = ["ROPE_TYPES", "rope_tables", "xpos_tables"]


# ---------------------------------------------------------------------------
# inv_freq of each rope_type.  Each helper mirrors one of transformers 5's
# ROPE_INIT_FUNCTIONS (modeling_rope_utils.py) operation by operation: the
# arrays are in the working precision F (float32 reproduces HF's torch.float
# tensors, each operation rounded as torch rounds it), the Python-float scalar
# arithmetic that HF does outside tensors stays in Python floats.  The only
# operations not reproduced bit for bit are pow, cos and sin: they are computed
# in float64 and rounded once (correctly rounded but for rare ties), where
# torch uses its own float32 kernels (Sleef on the CPU's vector loops, libm on
# their scalar tails, CUDA's on a GPU), which are within about 1 ulp of it.
# ---------------------------------------------------------------------------

_REQUIRED = object()


class _Spec:
    """What a helper reads: the working float type F, the rotary dim, the
    rope_parameters dict (and whose rope_type it is), the model's
    max_position_embeddings and the sequence length."""

    def __init__(self, F, dim, params, rope_type, max_pos, seq_len):
        self.F, self.dim, self.params, self.rope_type = F, dim, params, rope_type
        self.max_pos, self.seq_len = max_pos, seq_len

    def number(self, key, default=_REQUIRED, *, positive=True):
        """params[key] as a float; ``default`` where it is absent or None, if there is one."""
        value = self.params.get(key)
        if value is None:
            if default is _REQUIRED:
                raise ValueError(f"rope_parameters of rope_type {self.rope_type!r} need the key "
                                 f"{key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"rope_parameters[{key!r}] (rope_type {self.rope_type!r}) must be a "
                            f"real number, got {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value) or (positive and value <= 0):
            raise ValueError(f"rope_parameters[{key!r}] (rope_type {self.rope_type!r}) must be a "
                             f"finite{' positive' if positive else ''} number, got {value!r}")
        return value

    def needs_max_pos(self, why):
        if self.max_pos is None:
            raise ValueError(f"rope_type {self.rope_type!r} needs max_position_embeddings "
                             f"(the model config's) {why}")
        return self.max_pos

    def original_max(self):
        """original_max_position_embeddings; HF's config defaults it to
        max_position_embeddings (standardize_rope_params)."""
        if self.params.get("original_max_position_embeddings") is None:
            return self.needs_max_pos("when rope_parameters has no "
                                      "'original_max_position_embeddings'")
        return self.number("original_max_position_embeddings")

    @property
    def theta(self):
        return self.number("rope_theta", 10000.0)

    def factor_or_ratio(self):
        """'factor', or where it is absent or None max_position_embeddings /
        original_max_position_embeddings (yarn, longrope: HF's Phi3/DeepSeek case)."""
        if self.params.get("factor") is not None:
            return self.number("factor")
        return self.needs_max_pos("when rope_parameters has no 'factor'") / self.original_max()

    def pow(self, base, exponent):
        """F(base) ** exponent (an F array, or a Python float as torch's scalar exponent),
        evaluated in float64, rounded to F."""
        return (np.float64(self.F(base)) ** np.asarray(exponent, np.float64)).astype(self.F)

    def powers(self, base):
        """base ** (2t / dim), t < dim / 2: HF's ``base ** (arange(0, dim, 2).float() / dim)``."""
        F = self.F
        return self.pow(base, np.arange(0, self.dim, 2).astype(F) / F(self.dim))

    def recip(self, x):
        """HF's ``1.0 / tensor`` (torch: ``tensor.reciprocal() * 1.0``)."""
        return self.F(1) / x


def _default(s):
    return s.recip(s.powers(s.theta)), 1.0


def _linear(s):
    return s.recip(s.powers(s.theta)) / s.F(s.number("factor")), 1.0


def _dynamic(s):
    # NTK-aware: base * (factor * L / M - (factor - 1)) ** (dim / (dim - 2)), L = max(seq_len, M).
    # HF's init runs it in Python floats with L = M; past M its dynamic_rope_update passes
    # seq_len = max(position_ids) + 1 as a tensor, so the base is computed in torch.float.
    F, dim, factor, theta = s.F, s.dim, s.number("factor"), s.theta
    max_pos = s.needs_max_pos("(the length past which the base grows)")
    if dim == 2:
        raise ValueError("rope_type 'dynamic' needs rotary_dim >= 4 (its exponent is "
                         "rotary_dim / (rotary_dim - 2))")
    if s.seq_len <= max_pos:
        base = theta * ((factor * max_pos / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    else:
        ratio = F(factor) * F(s.seq_len) / F(max_pos) - F(factor - 1)
        base = F(theta) * s.pow(ratio, dim / (dim - 2))   # torch: a double exponent
    return s.recip(s.powers(base)), 1.0


def _yarn(s):
    F, dim, theta = s.F, s.dim, s.theta
    factor, original = s.factor_or_ratio(), s.original_max()
    beta_fast, beta_slow = (s.number(key, default) if s.params.get(key) else default
                            for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)))
    # (HF: `or 32`, `or 1`: a 0 is the default too)
    attention = s.number("attention_factor", None)
    if attention is None:
        mscale, mscale_all_dim = (s.number(key, 0.0, positive=False)
                                  for key in ("mscale", "mscale_all_dim"))

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                     if mscale and mscale_all_dim else get_mscale(factor))

    def correction_dim(rotations):      # the pair index whose wavelength fits `rotations` times
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                   # HF: prevent a singularity
    ramp = np.clip((np.arange(dim // 2).astype(F) - F(low)) / F(high - low), F(0), F(1))
    extrapolation = F(1) - ramp         # 1 on fast pairs (kept), 0 on slow ones (interpolated)
    powers = s.powers(theta)
    inv_freq = (s.recip(F(factor) * powers) * (F(1) - extrapolation)
                + s.recip(powers) * extrapolation)
    return inv_freq, attention


def _longrope(s):
    factor, original = s.factor_or_ratio(), s.original_max()
    attention = s.number("attention_factor", None)
    if attention is None:
        attention = (1.0 if factor <= 1.0
                     else math.sqrt(1 + math.log(factor) / math.log(original)))
    factors = {}
    for key in ("short_factor", "long_factor"):
        if s.params.get(key) is None:
            raise ValueError(f"rope_parameters of rope_type 'longrope' need the key {key!r}")
        factors[key] = ext = np.asarray(s.params[key], dtype=np.float64)
        if ext.shape != (s.dim // 2,) or not np.all(np.isfinite(ext) & (ext > 0)):
            raise ValueError(f"rope_parameters[{key!r}] (rope_type 'longrope') must hold "
                             f"rotary_dim // 2 = {s.dim // 2} finite positive numbers, got "
                             f"shape {ext.shape}")
    ext = factors["long_factor" if s.seq_len > original else "short_factor"]
    return s.recip(ext.astype(s.F) * s.powers(s.theta)), attention


def _llama3(s):
    F = s.F
    factor = s.number("factor")
    low, high = (s.number(key) for key in ("low_freq_factor", "high_freq_factor"))
    if low == high:
        raise ValueError("rope_parameters of rope_type 'llama3' need low_freq_factor != "
                         f"high_freq_factor, got both {low!r}")
    original = s.original_max()
    inv_freq = s.recip(s.powers(s.theta))
    wavelen = s.recip(inv_freq) * F(2 * math.pi)      # HF: 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = F(original / low), F(original / high)
    scaled = np.where(wavelen > low_wavelen, inv_freq / F(factor), inv_freq)
    smooth = (s.recip(wavelen) * F(original) - F(low)) / F(high - low)
    smoothed = (F(1) - smooth) * scaled / F(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled), 1.0


_INV_FREQ = {"default": _default, "linear": _linear, "dynamic": _dynamic, "yarn": _yarn,
             "longrope": _longrope, "llama3": _llama3}
ROPE_TYPES = tuple(_INV_FREQ)


def _inv_freq(F, rotary_dim, rope_parameters, max_pos, seq_len):
    """(inv_freq as an F array, attention factor as a float) of rope_parameters."""
    if rope_parameters is None:
        rope_parameters = {}
    if not isinstance(rope_parameters, Mapping):
        raise TypeError(f"rope_parameters must be a dict or None, got "
                        f"{type(rope_parameters).__name__}")
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in _INV_FREQ:
        raise ValueError(f"unknown rope_type {rope_type!r}; known: {', '.join(ROPE_TYPES)}")
    return _INV_FREQ[rope_type](_Spec(F, rotary_dim, rope_parameters, rope_type, max_pos, seq_len))


# ---------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------

def _count(name, value, minimum, *, optional=False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _rotary_dim(rotary_dim):
    rotary_dim = _count("rotary_dim", rotary_dim, 2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (it rotates pairs), got {rotary_dim}")
    return rotary_dim


def _float_type(dtype):
    try:
        dt = None if dtype is None else np.dtype(dtype)     # (np.dtype(None) is float64)
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt.type not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}")
    return dt.type


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------
# public functions
# ---------------------------------------------------------------------------

def rope_tables(num_positions, rotary_dim, *, rope_parameters=None, max_position_embeddings=None,
                seq_len=None, dtype=np.float32):
    """RoPE tables ``cos, sin`` of shape ``(num_positions, rotary_dim // 2)``,
    as HuggingFace transformers 5 builds them for ``rope_parameters``.

    ``cos[p, t] = a * cos(p * inv_freq[t])`` and ``sin[p, t] = a * sin(p * inv_freq[t])``,
    with ``inv_freq`` and the attention factor ``a`` of the RoPE type
    (docs/methods.md has the formulas); they equal the first half
    (``[..., :rotary_dim // 2]``) of what a HF rotary-embedding module
    (``LlamaRotaryEmbedding``, ...) returns for ``position_ids = arange(num_positions)``.

    Arguments:
        num_positions: number of rows (positions 0 .. num_positions - 1), an int >= 0.
        rotary_dim: the number of rotated dimensions, an even int >= 2: HF's
            ``int(head_dim * partial_rotary_factor)``.  A ``partial_rotary_factor``
            key of ``rope_parameters`` is ignored: ``rotary_dim`` already counts it.
        rope_parameters: a dict as transformers 5's ``config.rope_parameters``;
            ``None`` is ``{"rope_type": "default", "rope_theta": 10000.0}``.
            ``rope_theta`` (default 10000.0) and ``rope_type`` (default
            ``"default"``; the legacy key ``type`` is read too), which reads:

            * ``default``: nothing else;
            * ``linear``: ``factor`` (``inv_freq / factor``);
            * ``dynamic`` (NTK-aware): ``factor``, and ``max_position_embeddings``:
              for ``seq_len > max_position_embeddings`` the base grows to
              ``rope_theta * (factor * seq_len / max_position_embeddings - (factor - 1))
              ** (rotary_dim / (rotary_dim - 2))``; needs ``rotary_dim >= 4``;
            * ``yarn``: ``factor``, ``original_max_position_embeddings``,
              ``beta_fast`` (32), ``beta_slow`` (1), ``truncate`` (True),
              ``attention_factor`` (default from ``factor``, or from ``mscale`` and
              ``mscale_all_dim`` where both are given and non-zero);
            * ``longrope``: ``short_factor``, ``long_factor`` (``rotary_dim // 2``
              numbers each; the long ones for ``seq_len > original_max_position_embeddings``),
              ``original_max_position_embeddings``, ``factor``, ``attention_factor``
              (default ``sqrt(1 + log(factor) / log(original_max_position_embeddings))``);
            * ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
              ``original_max_position_embeddings``.

            As in HF, a missing ``original_max_position_embeddings`` is
            ``max_position_embeddings``, and a missing or ``None`` ``factor`` of
            ``yarn``/``longrope`` is ``max_position_embeddings /
            original_max_position_embeddings``.  Other keys are ignored.
        max_position_embeddings: the model config's, an int >= 1; needed by
            ``dynamic``, and by ``yarn``/``longrope``/``llama3`` where the keys above
            fall back on it.
        seq_len: the sequence length the tables are for (default ``num_positions``):
            HF's ``max(position_ids) + 1``, which ``dynamic`` and ``longrope`` read
            in the forward pass to rescale.  (HF's ``dynamic`` module keeps the
            frequencies of the longest sequence it has seen until a sequence is
            shorter than ``max_position_embeddings``; these tables are those of a
            fresh module.)
        dtype: ``np.float32`` reproduces HF's float32 arithmetic step by step
            (inv_freq and the angle ``position * inv_freq`` rounded to float32,
            cos/sin of that angle, times the attention factor in float32), so the
            tables equal HF's to float32 rounding: HF's torch pow, cos and sin are
            within about 1 ulp of the correctly rounded ones used here, and an ulp
            of inv_freq is an ulp or two of the angle, which at position p is
            about ``p * inv_freq * 2**-24``.  ``np.float64`` computes the same
            formulas in float64 throughout, more accurate than HF.

    Errors: TypeError for arguments of the wrong type (dtype not float32/float64
    included), ValueError for bad values, an unknown rope_type (the message lists
    the known ones, ``ROPE_TYPES``) or a missing required key (naming the key and
    the rope_type).
    """
    num_positions = _count("num_positions", num_positions, 0)
    rotary_dim = _rotary_dim(rotary_dim)
    max_pos = _count("max_position_embeddings", max_position_embeddings, 1, optional=True)
    seq_len = _count("seq_len", seq_len, 0, optional=True)
    F = _float_type(dtype)
    inv_freq, attention_factor = _inv_freq(F, rotary_dim, rope_parameters, max_pos,
                                           num_positions if seq_len is None else seq_len)
    angles = np.arange(num_positions).astype(F)[:, None] * inv_freq[None, :]
    wide = angles.astype(np.float64, copy=False)   # cos/sin rounded once from float64
    cos, sin = np.cos(wide).astype(F), np.sin(wide).astype(F)
    if attention_factor != 1.0:
        cos *= F(attention_factor)
        sin *= F(attention_factor)
    return cos, sin


def xpos_tables(num_positions, rotary_dim, *, base=10000.0, scale_base=512, dtype=np.float32):
    """xPos tables ``cos, sin, cos_k, sin_k`` of shape ``(num_positions, rotary_dim // 2)``.

    xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer",
    arXiv:2212.10554; docs/methods.md has the formulas) rotates as default
    RoPE, ``angle[p, t] = p * base ** (-2t / rotary_dim)``, and scales pair ``t``
    of a query at position ``p`` by ``zeta_t ** (p / scale_base)`` and of a key by
    ``zeta_t ** (-p / scale_base)``, ``zeta_t = (2t / rotary_dim + 0.4) / 1.4``:

        cos   = cos(angle) * zeta ** (p / scale_base),   sin   likewise (queries)
        cos_k = cos(angle) * zeta ** (-p / scale_base),  sin_k likewise (keys)

    so pair t of ``q_i . k_j`` decays as ``zeta_t ** ((i - j) / scale_base)``.
    The reference implementation (torchscale's ``XPOS``) centres the positions of
    the scale (``min_pos = -(length + offset) // 2``); that multiplies the query
    tables by a constant per pair and the key tables by its inverse, which cancel
    in every logit: the plain ``p / scale_base`` used here gives the same logits.
    torchscale rotates interleaved pairs ``(x_{2t}, x_{2t+1})``.  The key tables
    grow as ``zeta_t ** (-p / scale_base)`` (past float32's range, to inf, beyond
    some tens of thousands of positions at the default scale_base).

    Computed in float64, returned in ``dtype`` (float32 or float64).
    """
    num_positions = _count("num_positions", num_positions, 0)
    rotary_dim = _rotary_dim(rotary_dim)
    base = _positive("base", base)
    scale_base = _positive("scale_base", scale_base)
    F = _float_type(dtype)
    pair = np.arange(0, rotary_dim, 2) / rotary_dim           # 2t / rotary_dim
    p = np.arange(num_positions, dtype=np.float64)[:, None]
    angles = p * base ** -pair
    zeta = (pair + 0.4) / 1.4
    up, down = zeta ** (p / scale_base), zeta ** (-p / scale_base)
    cos, sin = np.cos(angles), np.sin(angles)
    return tuple(table.astype(F) for table in (cos * up, sin * up, cos * down, sin * down))
