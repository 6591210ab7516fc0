"""Tests of posenc.buckets (SPEC section 2): the bucket maps and their checks.

The exact tables come from HuggingFace transformers (tests/data/bucket_tables.npz,
made by tests/data/make_bucket_tables.py); this file needs neither torch nor
transformers.
"""

import os

import numpy as np
import pytest

from posenc import buckets

TABLES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "bucket_tables.npz")

# The configurations make_bucket_tables.py writes, under the same names.
T5_CONFIGS = [(32, 128, True), (32, 128, False), (64, 256, True), (32, 50, True), (16, 50, False)]
DEBERTA_LOG_CONFIGS = [(256, 512), (64, 128), (32, 512)]

INT64 = np.iinfo(np.int64)


def t5_key(num_buckets, max_distance, bidirectional):
    return f"t5_{num_buckets}_{max_distance}_{'bi' if bidirectional else 'uni'}"


def deberta_log_key(bucket_size, max_position):
    return f"deberta_log_{bucket_size}_{max_position}"


@pytest.fixture(scope="module")
def tables():
    with np.load(TABLES_PATH, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def table_offsets(tables):
    return np.arange(int(tables["offset_min"]), int(tables["offset_max"]) + 1, dtype=np.int64)


# ---------------------------------------------------------------------------
# Equality with transformers over the whole table
# ---------------------------------------------------------------------------

def test_tables_hold_the_expected_configurations(tables):
    expected = {t5_key(*config) for config in T5_CONFIGS}
    expected |= {deberta_log_key(*config) for config in DEBERTA_LOG_CONFIGS}
    metadata = {"offset_min", "offset_max", "transformers_version", "torch_version",
                "torch_cpu_capability"}
    assert set(tables) == expected | metadata
    assert int(tables["offset_min"]) == -100_000 and int(tables["offset_max"]) == 100_000
    assert str(tables["transformers_version"])  # recorded, whichever it is


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional", T5_CONFIGS)
def test_t5_equals_transformers_table(tables, num_buckets, max_distance, bidirectional):
    offsets = table_offsets(tables)
    expected = tables[t5_key(num_buckets, max_distance, bidirectional)].astype(np.int64)
    got = buckets.t5(offsets, num_buckets, max_distance, bidirectional)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("bucket_size, max_position", DEBERTA_LOG_CONFIGS)
def test_deberta_log_equals_transformers_table(tables, bucket_size, max_position):
    offsets = table_offsets(tables)
    expected = tables[deberta_log_key(bucket_size, max_position)].astype(np.int64)
    got = buckets.deberta_log(offsets, bucket_size, max_position)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------
# Hand-worked cases
# ---------------------------------------------------------------------------

def test_clipped_by_hand():
    # clip(-5..5, -2, 2) + 2
    got = buckets.clipped(np.arange(-5, 6), 2)
    np.testing.assert_array_equal(got, [0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4])
    np.testing.assert_array_equal(buckets.clipped([-3, 0, 3], 0), [0, 0, 0])


# Defaults (32, 128, bidirectional): h = 16 buckets a side, max_exact e = 8,
# h - e = 8 log buckets, D / e = 16, so for a distance r >= 8
#     bucket = 8 + trunc(8 * log(r / 8) / log(16)) = 8 + trunc(2 * log2(r / 8)),
# capped at 15; a positive offset adds 16.
#   r = 11: 2 * log2(1.375) = 0.92 -> 8        r = 12: 2 * log2(1.5) = 1.17 -> 9
#   r = 16: exactly 2 -> 10 (float32 log(16) is exactly 4 * float32 log(2), so the
#           quotient is exactly 0.25 and the product exactly 2.0)
#   r = 32: 4 -> 12    r = 64: 6 -> 14    r = 127: 2 * log2(15.875) = 7.98 -> 15
#   r = 128 and beyond: 8 -> capped at 15
T5_DEFAULT_BY_HAND = [
    (0, 0), (-1, 1), (1, 17), (-7, 7), (7, 23), (-8, 8), (8, 24), (-11, 8), (-12, 9),
    (-16, 10), (16, 26), (-32, 12), (-64, 14), (-127, 15), (-128, 15), (-1000, 15),
    (1000, 31), (INT64.min, 15), (INT64.max, 31),
]

# Unidirectional (32, 128): h = 32, e = 16, 16 log buckets, D / e = 8, so
#     bucket = 16 + trunc(16 * log(r / 16) / log(8)) = 16 + trunc(16/3 * log2(r / 16)),
# capped at 31; positive offsets (the future) count as distance 0.
#   r = 32: 5.33 -> 21    r = 64: 10.67 -> 26    r = 128: 16 -> capped at 31
T5_UNIDIRECTIONAL_BY_HAND = [
    (5, 0), (0, 0), (-15, 15), (-16, 16), (-32, 21), (-64, 26), (-128, 31), (-100_000, 31),
    (INT64.min, 31),
]


@pytest.mark.parametrize("offset, bucket", T5_DEFAULT_BY_HAND)
def test_t5_defaults_by_hand(offset, bucket):
    assert buckets.t5(np.int64(offset)) == bucket
    assert buckets.t5([offset], 32, 128, True)[0] == bucket


@pytest.mark.parametrize("offset, bucket", T5_UNIDIRECTIONAL_BY_HAND)
def test_t5_unidirectional_by_hand(offset, bucket):
    assert buckets.t5([offset], num_buckets=32, max_distance=128, bidirectional=False)[0] == bucket


def test_t5_exact_quotient_follows_correctly_rounded_float32():
    # (12/8)**9 == (27/8)**3: the exact log quotient is the integer 3, and
    # float32 arithmetic with a correctly rounded log lands just below it.
    # transformers on an AVX-512 CPU agrees; MKL's AVX2 log rounds the other way (11).
    assert buckets.t5([-12], num_buckets=17, max_distance=27, bidirectional=False)[0] == 10


# (float32 input bits, bits of its correctly rounded float32 log).  The first two
# are the only float32 in [1, 2**64) whose float64 log, rounded to float32, is
# wrong (by an ulp); the others lie near a rounding boundary too.
HARD_LOGS = [
    (0x41178FEB, 0x400FE5E7),  # log(9.472636)
    (0x4C5D65A5, 0x418F034B),  # log(5.8037908e7)
    (0x4D604EBE, 0x419A352C),  # log(2.3520355e8)
    (0x4665A9A6, 0x41198725),  # log(14698.412)
    (0x3F800000, 0x00000000),  # log(1) = 0
    (0x41800000, 0x40317218),  # log(16) = 4 * float32 log(2)
]


def test_float32_log_is_correctly_rounded_on_hard_cases():
    values = np.array([value for value, _ in HARD_LOGS], dtype=np.uint32).view(np.float32)
    expected = np.array([log for _, log in HARD_LOGS], dtype=np.uint32)
    np.testing.assert_array_equal(buckets._log_float32(values).view(np.uint32), expected)


@pytest.mark.parametrize("bucket_size, max_position", DEBERTA_LOG_CONFIGS + [(2, 3), (5, 7)])
def test_deberta_log_is_identity_for_small_offsets(bucket_size, max_position):
    mid = bucket_size // 2
    offsets = np.arange(-mid, mid + 1)
    np.testing.assert_array_equal(buckets.deberta_log(offsets, bucket_size, max_position), offsets)


def test_deberta_log_by_hand():
    # (256, 512): mid = 128, bucket = sign(r) * (128 + ceil(127 * log(|r|/128) / log(511/128)))
    #   r = 129: 127 * 0.0078 / 1.384 = 0.71 -> 1 -> 129
    #   r = 256: 127 * log(2) / 1.384 = 63.6 -> 64 -> 192
    #   r = 511: the quotient is exactly 1 -> 127 -> 255 (= bucket_size - 1)
    #   r = 1000: 127 * log(7.8125) / 1.384 = 188.6 -> 189 -> 317 (no clamp)
    offsets = [128, 129, 256, -256, 511, -511, 1000]
    np.testing.assert_array_equal(buckets.deberta_log(offsets, 256, 512),
                                  [128, 129, 192, -192, 255, -255, 317])
    # bucket_size 2: mid = 1 and mid - 1 = 0, so every |r| > 1 goes to sign(r) * 1.
    np.testing.assert_array_equal(buckets.deberta_log(np.arange(-5, 6), 2, 3),
                                  [-1, -1, -1, -1, -1, 0, 1, 1, 1, 1, 1])
    # Extremes neither overflow nor lose their sign.
    extremes = buckets.deberta_log([INT64.min, INT64.max], 256, 512)
    assert extremes[0] == -extremes[1] and extremes[1] > 255


# ---------------------------------------------------------------------------
# Ranges, shapes, dtypes
# ---------------------------------------------------------------------------

def wide_offsets():
    rng = np.random.default_rng(int(os.environ.get("POSENC_TEST_SEED", "0")))
    return np.concatenate([
        np.arange(-3000, 3001),
        rng.integers(INT64.min, INT64.max, size=2000, dtype=np.int64),
        [INT64.min, INT64.min + 1, INT64.max],
    ])


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional",
                         T5_CONFIGS + [(4, 2, True), (2, 2, False), (3, 5, False), (1000, 10**6, True)])
def test_t5_range_and_sides(num_buckets, max_distance, bidirectional):
    offsets = wide_offsets()
    got = buckets.t5(offsets, num_buckets, max_distance, bidirectional)
    assert got.min() >= 0 and got.max() < num_buckets
    if bidirectional:
        half = num_buckets // 2
        assert np.all((got >= half) == (offsets > 0))
    else:
        assert np.all(got[offsets > 0] == 0)
    # Buckets never decrease as the distance grows, on either side.
    distance = np.arange(0, 3 * max_distance + 3)
    for side in (distance, -distance):
        assert np.all(np.diff(buckets.t5(side, num_buckets, max_distance, bidirectional)) >= 0)


@pytest.mark.parametrize("max_distance", [0, 1, 2, 127, 10**6])
def test_clipped_range(max_distance):
    got = buckets.clipped(wide_offsets(), max_distance)
    assert got.min() >= 0 and got.max() <= 2 * max_distance
    assert buckets.clipped([INT64.min], max_distance)[0] == 0
    assert buckets.clipped([INT64.max], max_distance)[0] == 2 * max_distance


@pytest.mark.parametrize("bucket_size, max_position", DEBERTA_LOG_CONFIGS)
def test_deberta_log_is_odd_and_monotone(bucket_size, max_position):
    offsets = np.arange(0, 5 * max_position)
    positive = buckets.deberta_log(offsets, bucket_size, max_position)
    np.testing.assert_array_equal(buckets.deberta_log(-offsets, bucket_size, max_position), -positive)
    assert np.all(np.diff(positive) >= 0)


MAPS = [
    (buckets.clipped, {"max_distance": 3}),
    (buckets.t5, {}),
    (buckets.t5, {"num_buckets": 16, "max_distance": 50, "bidirectional": False}),
    (buckets.deberta_log, {"bucket_size": 8, "max_position": 20}),
]


@pytest.mark.parametrize("bucket_map, params", MAPS)
def test_shape_is_preserved(bucket_map, params):
    query, key = np.arange(7), np.arange(60)
    offsets = key[None, :] - query[:, None]  # r(i, j) = j - i, shape (7, 60)
    got = bucket_map(offsets, **params)
    assert got.shape == (7, 60) and got.dtype == np.int64
    np.testing.assert_array_equal(got.ravel(), bucket_map(offsets.ravel(), **params))
    # Transposed (non-contiguous), 0-d, empty and Python-list inputs.
    np.testing.assert_array_equal(bucket_map(offsets.T, **params), got.T)
    scalar = bucket_map(5, **params)
    assert scalar.shape == () and scalar.dtype == np.int64 and scalar == got[0, 5]
    assert bucket_map(np.zeros((0, 3), dtype=np.int64), **params).shape == (0, 3)
    np.testing.assert_array_equal(bucket_map(offsets[0].tolist(), **params), got[0])


@pytest.mark.parametrize("bucket_map, params", MAPS)
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.uint64])
def test_integer_dtypes(bucket_map, params, dtype):
    info = np.iinfo(dtype)
    offsets = np.arange(-200, 201)
    offsets = offsets[(offsets >= info.min) & (offsets <= info.max)]
    got = bucket_map(offsets.astype(dtype), **params)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, bucket_map(offsets.astype(np.int64), **params))


@pytest.mark.parametrize("bucket_map, params", MAPS)
def test_input_is_not_modified(bucket_map, params):
    offsets = np.arange(-100, 100)
    before = offsets.copy()
    bucket_map(offsets, **params)
    np.testing.assert_array_equal(offsets, before)


def test_numpy_parameters_are_accepted():
    offsets = np.arange(-300, 300)
    np.testing.assert_array_equal(
        buckets.t5(offsets, np.int32(32), np.int64(128), np.bool_(True)), buckets.t5(offsets))
    np.testing.assert_array_equal(buckets.clipped(offsets, np.uint8(4)), buckets.clipped(offsets, 4))
    np.testing.assert_array_equal(buckets.deberta_log(offsets, np.int16(64), np.int64(128)),
                                  buckets.deberta_log(offsets, 64, 128))


def test_checks_return_none_for_valid_parameters():
    assert buckets.check_clipped(0) is None
    assert buckets.check_t5(4, 2, True) is None
    assert buckets.check_t5(2, 2, False) is None
    assert buckets.check_deberta_log(2, 3) is None


# ---------------------------------------------------------------------------
# Errors: (function, kwargs, exception, substrings of the message)
# ---------------------------------------------------------------------------

OFFSETS = np.arange(-3, 4)

ERROR_CASES = [
    # clipped
    (buckets.clipped, {"offset": OFFSETS, "max_distance": -1}, ValueError, ["max_distance", "-1", ">= 0"]),
    (buckets.clipped, {"offset": OFFSETS, "max_distance": 2**62}, ValueError, ["max_distance", "int64"]),
    (buckets.clipped, {"offset": OFFSETS, "max_distance": 2.0}, TypeError, ["max_distance", "float"]),
    (buckets.clipped, {"offset": OFFSETS, "max_distance": True}, TypeError, ["max_distance", "bool"]),
    (buckets.clipped, {"offset": OFFSETS, "max_distance": "3"}, TypeError, ["max_distance", "str"]),
    (buckets.clipped, {"offset": OFFSETS, "max_distance": None}, TypeError, ["max_distance", "NoneType"]),
    (buckets.check_clipped, {"max_distance": -5}, ValueError, ["max_distance", "-5"]),
    (buckets.check_clipped, {"max_distance": np.float64(3)}, TypeError, ["max_distance", "float64"]),
    # offsets
    (buckets.clipped, {"offset": OFFSETS * 1.0, "max_distance": 3}, TypeError, ["offset", "float64"]),
    (buckets.t5, {"offset": OFFSETS.astype(np.float32)}, TypeError, ["offset", "float32"]),
    (buckets.t5, {"offset": OFFSETS > 0}, TypeError, ["offset", "bool"]),
    (buckets.deberta_log, {"offset": [True, False], "bucket_size": 8, "max_position": 20},
     TypeError, ["offset", "bool"]),
    (buckets.deberta_log, {"offset": 1.5, "bucket_size": 8, "max_position": 20}, TypeError, ["offset", "float"]),
    (buckets.t5, {"offset": np.array([1, None], dtype=object)}, TypeError, ["offset", "object"]),
    (buckets.t5, {"offset": np.array([2**64 - 1], dtype=np.uint64)}, ValueError, ["offset", "int64"]),
    # t5: degenerate
    (buckets.t5, {"offset": OFFSETS, "num_buckets": 3}, ValueError, ["num_buckets", "3", ">= 4"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": -4, "bidirectional": True},
     ValueError, ["num_buckets", "-4"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": 1, "max_distance": 5, "bidirectional": False},
     ValueError, ["num_buckets", "1", ">= 2"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": 32, "max_distance": 8},
     ValueError, ["max_distance", "8", "max_exact = 8"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": 32, "max_distance": -1},
     ValueError, ["max_distance", "-1"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": 32, "max_distance": 16, "bidirectional": False},
     ValueError, ["max_distance", "16", "max_exact = 16"]),
    (buckets.check_t5, {"num_buckets": 4, "max_distance": 1, "bidirectional": True},
     ValueError, ["max_distance", "1", "max_exact = 1"]),
    # t5: wrong types
    (buckets.t5, {"offset": OFFSETS, "num_buckets": 32.0}, TypeError, ["num_buckets", "float"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": np.float32(32)}, TypeError, ["num_buckets", "float32"]),
    (buckets.t5, {"offset": OFFSETS, "num_buckets": True}, TypeError, ["num_buckets", "bool"]),
    (buckets.t5, {"offset": OFFSETS, "max_distance": 128.0}, TypeError, ["max_distance", "float"]),
    (buckets.t5, {"offset": OFFSETS, "max_distance": np.bool_(True)}, TypeError, ["max_distance", "bool"]),
    (buckets.t5, {"offset": OFFSETS, "bidirectional": 1}, TypeError, ["bidirectional", "int"]),
    (buckets.t5, {"offset": OFFSETS, "bidirectional": "yes"}, TypeError, ["bidirectional", "str"]),
    (buckets.t5, {"offset": OFFSETS, "bidirectional": None}, TypeError, ["bidirectional", "NoneType"]),
    (buckets.check_t5, {"num_buckets": 32, "max_distance": 128, "bidirectional": 0},
     TypeError, ["bidirectional", "int"]),
    # deberta_log: degenerate
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 1, "max_position": 10},
     ValueError, ["bucket_size", "1", ">= 2"]),
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 0, "max_position": 10},
     ValueError, ["bucket_size", "0"]),
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": -256, "max_position": 512},
     ValueError, ["bucket_size", "-256"]),
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 256, "max_position": 129},
     ValueError, ["max_position", "129", "129"]),
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 2, "max_position": 2},
     ValueError, ["max_position", "2"]),
    (buckets.check_deberta_log, {"bucket_size": 64, "max_position": -1},
     ValueError, ["max_position", "-1"]),
    # deberta_log: wrong types
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 256.0, "max_position": 512},
     TypeError, ["bucket_size", "float"]),
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 256, "max_position": True},
     TypeError, ["max_position", "bool"]),
    (buckets.deberta_log, {"offset": OFFSETS, "bucket_size": 256, "max_position": np.float32(512)},
     TypeError, ["max_position", "float32"]),
    (buckets.check_deberta_log, {"bucket_size": "256", "max_position": 512},
     TypeError, ["bucket_size", "str"]),
    # parameters beyond int64
    (buckets.t5, {"offset": OFFSETS, "max_distance": 2**70}, ValueError, ["max_distance", "int64"]),
]


def case_id(case):
    function, kwargs, exception, _ = case
    shown = ", ".join(f"{key}={value!r}" for key, value in kwargs.items() if key != "offset")
    return f"{function.__name__}({shown})-{exception.__name__}"


@pytest.mark.parametrize("function, kwargs, exception, substrings", ERROR_CASES,
                         ids=[case_id(case) for case in ERROR_CASES])
def test_errors(function, kwargs, exception, substrings):
    with pytest.raises(exception) as caught:
        function(**kwargs)
    message = str(caught.value)
    for substring in substrings:
        assert substring in message, f"{substring!r} not in {message!r}"


def test_degenerate_max_distance_message_names_the_condition():
    with pytest.raises(ValueError, match=r"max_distance must be > max_exact = 8 .* got 8"):
        buckets.t5(OFFSETS, num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match=r"max_position must be > bucket_size // 2 \+ 1 = 129 .* got 129"):
        buckets.deberta_log(OFFSETS, bucket_size=256, max_position=129)
