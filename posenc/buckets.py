"""Bucket maps: from an integer offset to an integer bucket (SPEC section 2).

Every relative method in posenc depends on a query/key pair ``(i, j)`` only
through an offset, and on the offset only through a *bucket map*, which picks
the row of a learned table.  Three maps are used:

* :func:`clipped` -- ``clip(offset, -t, t) + t`` (Shaw et al. 2018, Huang et
  al. 2020, DIET-REL of Chen et al. 2021);
* :func:`t5` -- T5's log-binned buckets (Raffel et al. 2020), bit-for-bit
  equal to HuggingFace ``T5Attention._relative_position_bucket``;
* :func:`deberta_log` -- DeBERTa-v2's log buckets (He et al. 2021), equal to
  HuggingFace ``make_log_bucket_position``.

All maps are vectorised over an integer array of any shape and return a new
``int64`` array of that shape.  Pure NumPy.

Float32 exactness.  The two log maps reproduce the reference's float32
arithmetic step by step: every division and product is one IEEE float32
operation, as in torch.  The only step that IEEE does not pin down is the
float32 ``log``: libraries differ by an ulp (NumPy's SIMD ``log`` and torch's
MKL ``log`` do, and MKL even differs between its AVX2 and AVX-512 code
paths), and an ulp moves a bucket whenever the exact quotient is an integer,
e.g. ``t5(-12, 17, 27, False)`` where ``(12/8)**9 == (27/8)**3``.  Here the
float32 log is *correctly rounded* (see :func:`_log_float32`), the one
reading that does not depend on the machine; with it the maps equal
transformers (torch 2.13 on an AVX-512 CPU) on every configuration the tests
cover and on those swept once while writing this module (7650 t5 and 5554
deberta_log configurations, each over all offsets that matter).
"""

import decimal
import math

import numpy as np

__all__ = [
    "clipped",
    "t5",
    "deberta_log",
    "check_clipped",
    "check_t5",
    "check_deberta_log",
]

_INT64_MAX = int(np.iinfo(np.int64).max)

# A float64 log from any libm or from NumPy's SIMD loops is within a few ulps
# of the exact value; a result closer than this to a float32 rounding
# boundary is settled exactly instead.
_DOUBTFUL_ULPS = 16


# ---------------------------------------------------------------------------
# Parameter checks (also called by the other modules of posenc)
# ---------------------------------------------------------------------------

def _check_int(name, value):
    """An integer parameter is a Python int or a NumPy integer, never a bool."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"{name} must fit in int64, got {value}")


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_clipped(max_distance):
    """Raise unless ``max_distance`` gives a valid :func:`clipped` map.

    ``max_distance`` must be an int with ``0 <= max_distance`` (and
    ``2 * max_distance`` must fit in int64).
    """
    _check_int("max_distance", max_distance)
    if max_distance < 0:
        raise ValueError(f"max_distance must be >= 0, got {max_distance}")
    if max_distance > _INT64_MAX // 2:
        raise ValueError(
            f"max_distance must be <= {_INT64_MAX // 2} so that the bucket "
            f"2 * max_distance fits in int64, got {max_distance}")


def check_t5(num_buckets, max_distance, bidirectional):
    """Raise unless the parameters give a valid :func:`t5` map.

    ``num_buckets >= 2`` (``>= 4`` when ``bidirectional``) and
    ``max_distance > max_exact`` where
    ``max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2``;
    otherwise the log term ``log(max_distance / max_exact)`` is not positive.
    """
    _check_int("num_buckets", num_buckets)
    _check_int("max_distance", max_distance)
    _check_bool("bidirectional", bidirectional)
    if bidirectional and num_buckets < 4:
        raise ValueError(
            f"num_buckets must be >= 4 when bidirectional=True, got {num_buckets}")
    if num_buckets < 2:
        raise ValueError(f"num_buckets must be >= 2, got {num_buckets}")
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must be > max_exact = {max_exact} (num_buckets="
            f"{num_buckets}, bidirectional={bool(bidirectional)}), got {max_distance}")


def check_deberta_log(bucket_size, max_position):
    """Raise unless the parameters give a valid :func:`deberta_log` map.

    ``bucket_size >= 2`` and ``max_position > bucket_size // 2 + 1``, so that
    the log denominator ``log((max_position - 1) / (bucket_size // 2))`` is
    positive.
    """
    _check_int("bucket_size", bucket_size)
    _check_int("max_position", max_position)
    if bucket_size < 2:
        raise ValueError(f"bucket_size must be >= 2, got {bucket_size}")
    if max_position <= bucket_size // 2 + 1:
        raise ValueError(
            f"max_position must be > bucket_size // 2 + 1 = {bucket_size // 2 + 1} "
            f"(bucket_size={bucket_size}), got {max_position}")


def _as_offsets(offset):
    """The offsets as a new int64 array; a float, bool or object input is a TypeError."""
    array = np.asarray(offset)
    if array.dtype.kind not in "iu":
        raise TypeError(f"offset must be an integer array, got dtype {array.dtype}")
    if array.dtype == np.uint64 and array.size and array.max() > _INT64_MAX:
        raise ValueError(f"offset values must fit in int64, got {array.max()}")
    return array.astype(np.int64)


# ---------------------------------------------------------------------------
# Correctly rounded float32 log
# ---------------------------------------------------------------------------

def _log_float32(values):
    """Natural log of positive float32 values, correctly rounded; a 1-D array.

    The float64 log is accurate to about one float64 ulp, 2**29 times finer
    than a float32 ulp, so rounding it to float32 is the correctly rounded
    result unless the exact log lies next to a float32 rounding boundary (the
    midpoint of two float32 neighbours).  Such elements (44 of the float32 in
    [1, 2**64); rounding the float64 log gets two of them wrong, e.g.
    9.472636) are settled by comparing the exact log, computed with
    :mod:`decimal` to 60 digits, with the midpoint.  An exhaustive run over
    [1, 2**64) against a 300-bit log found no other error.
    """
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    wide = np.log(values.astype(np.float64))
    result = wide.astype(np.float32)
    toward = np.where(wide > result, np.float32(np.inf), np.float32(-np.inf))
    neighbour = np.nextafter(result, toward)
    midpoint = (result.astype(np.float64) + neighbour.astype(np.float64)) / 2
    doubtful = np.abs(wide - midpoint) <= _DOUBTFUL_ULPS * np.spacing(np.abs(wide))
    with decimal.localcontext() as context:
        context.prec = 60
        for index in np.flatnonzero(doubtful):
            exact = decimal.Decimal(float(values[index])).ln()
            lower, upper = sorted((result[index], neighbour[index]))
            above = exact > decimal.Decimal(float(midpoint[index]))
            result[index] = upper if above else lower
    return result


# ---------------------------------------------------------------------------
# The maps
# ---------------------------------------------------------------------------

def clipped(offset, max_distance):
    """Clipped relative position: ``clip(offset, -t, t) + t``, ``t = max_distance``.

    The bucket of Shaw, Uszkoreit & Vaswani 2018, *Self-Attention with
    Relative Position Representations* (eq. 3, ``clip(j - i, k)``), also used
    by Huang et al. 2020 (M2, M4) and by DIET-REL (Chen et al. 2021).  Values
    lie in ``[0, 2t]``, shifted so that they index a table of ``2t + 1`` rows.
    """
    check_clipped(max_distance)
    max_distance = int(max_distance)  # a NumPy unsigned would wrap on negation
    offsets = _as_offsets(offset)
    return np.asarray(np.clip(offsets, -max_distance, max_distance) + max_distance)


def t5(offset, num_buckets=32, max_distance=128, bidirectional=True):
    """T5 relative-position bucket (Raffel et al. 2020, *Exploring the Limits
    of Transfer Learning with a Unified Text-to-Text Transformer*, sec. 2.1).

    ``offset = memory_position - query_position`` (key minus query).  With
    ``bidirectional``, half of the buckets, ``h = num_buckets // 2``, serve each
    side and positive offsets add ``h``; otherwise ``h = num_buckets`` and a
    positive offset counts as distance 0.  For a distance ``r = |offset|``
    (``max(-offset, 0)`` when not bidirectional), with ``e = h // 2``::

        bucket(r) = r                                                if r < e
                  = min(e + trunc(log(r / e) / log(D / e) * (h - e)), h - 1)
                                                                     otherwise

    where ``D = max_distance``.  As in HuggingFace transformers'
    ``T5Attention._relative_position_bucket`` (after Mesh TensorFlow), ``r / e``,
    the log, the division by ``float32(math.log(D / e))`` (a float64 rounded
    to float32, which is what torch does with a Python float) and the product
    are float32, and the cast truncates toward zero.  Values lie in
    ``[0, num_buckets)``.  See the module docstring for the log's rounding.
    """
    check_t5(num_buckets, max_distance, bidirectional)
    num_buckets, max_distance = int(num_buckets), int(max_distance)
    offsets = _as_offsets(offset)
    shape = offsets.shape
    offsets = offsets.reshape(-1)
    # Every |offset| >= max_distance lands in the last bucket of its side, so
    # saturating first changes no result and keeps abs() clear of overflow.
    offsets = np.clip(offsets, -max_distance, max_distance)
    if bidirectional:
        half = num_buckets // 2
        side = np.where(offsets > 0, np.int64(half), np.int64(0))
        distance = np.abs(offsets)
    else:
        half = num_buckets
        side = np.int64(0)
        distance = -np.minimum(offsets, 0)
    max_exact = half // 2
    is_large = distance >= max_exact

    ratio = distance[is_large].astype(np.float32) / np.float32(max_exact)
    scaled = (_log_float32(ratio)
              / np.float32(math.log(max_distance / max_exact))
              * np.float32(half - max_exact))
    bucket = distance.copy()
    bucket[is_large] = np.minimum(max_exact + scaled.astype(np.int64), half - 1)
    return (side + bucket).reshape(shape)


def deberta_log(offset, bucket_size, max_position):
    """DeBERTa-v2 log bucket position (He, Liu, Gao & Chen 2021, *DeBERTa:
    Decoding-enhanced BERT with Disentangled Attention*; the log buckets of
    its v2 models).

    With ``mid = bucket_size // 2`` and ``P = max_position``::

        bucket(r) = r                                                  if |r| <= mid
                  = sign(r) * (ceil(log(|r| / mid) / log((P - 1) / mid) * (mid - 1)) + mid)
                                                                       otherwise

    Offsets up to ``mid`` are kept; beyond, the magnitude grows
    logarithmically, reaching ``bucket_size - 1`` at ``|r| = P - 1``, and keeps
    growing past it (no clamp).  The result is a signed relative position, not
    yet a table row.  As in HuggingFace transformers'
    ``make_log_bucket_position`` (then ``.to(torch.long)``), ``|r| / mid``, both
    logs (the denominator is the float32 log of ``float32((P - 1) / mid)``),
    the division, the product, ``ceil`` and ``+ mid`` are float32.  One
    deliberate difference: transformers rounds kept offsets through float32,
    which only matters when ``mid > 2**24``; here they stay exact.
    """
    check_deberta_log(bucket_size, max_position)
    bucket_size, max_position = int(bucket_size), int(max_position)
    offsets = _as_offsets(offset)
    shape = offsets.shape
    offsets = offsets.reshape(-1)
    mid = bucket_size // 2
    is_far = (offsets < -mid) | (offsets > mid)  # |offset| > mid, without abs() overflow

    far = offsets[is_far]
    # abs() after the float32 conversion: same value, no overflow at int64 min.
    ratio = np.abs(far.astype(np.float32)) / np.float32(mid)
    denominator = _log_float32(np.float32((max_position - 1) / mid))[0]
    magnitude = (np.ceil(_log_float32(ratio) / denominator * np.float32(mid - 1))
                 + np.float32(mid))
    bucket = offsets.copy()
    bucket[is_far] = (magnitude * np.sign(far).astype(np.float32)).astype(np.int64)
    return bucket.reshape(shape)
