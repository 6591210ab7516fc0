"""The decoding path (issue 30): calls of at most 16 query rows stream k and v
in place (the ISA's rows_dot and rows_axpy) instead of packing them for the
prefill's GEMM tiles.  Every method x ISA x dtype against the reference at
n in {1, 2, 7, 16} (16 the last row count on the path, 17 the first off it),
m odd and large, causal with query_offset, padding with a fully masked row,
dropout, grouped-query heads, a window, sinks and a softcap; the backward of
such a call; 1 and 2 threads bitwise."""

import numpy as np
import pytest

import posenc

from test_attention import (_forward, _inputs, _padding, assert_attention_matches_reference,
                            assert_threads_bitwise)
from test_attention_shapes import _grouped
from posenc._registry import METHODS

ROWS = (1, 2, 7, 16, 17)
M = 301


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_decode_matches_reference(posenc_isa, method, dtype, n, rng):
    """A step at the cache's end (query_offset = m - n, causal), and the same rows
    with padding (row 1 fully masked) and dropout, forward and every gradient."""
    args, kwargs, v = _inputs(method, n, M, 16, 9, rng, dtype=dtype)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=M - n)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=M - n - 40,
                                       key_padding_mask=_padding(2, M), dropout_p=0.2, seed=5)


@pytest.mark.parametrize("kv_heads", (1, 2))
@pytest.mark.parametrize("n", (1, 2, 7))
@pytest.mark.parametrize("method", METHODS)
def test_decode_shapes_match_reference(posenc_isa, method, n, kv_heads, rng):
    """SPEC §7 on the path: grouped-query heads (a group's query heads share one pass
    over their k and v where n leaves room for several in a tile), a window, sinks and
    a softcap; then padding with a fully masked row and dropout."""
    args, kwargs, v = _grouped(method, n, M, 8, 5, kv_heads, rng, dtype=np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=M - n, window=(60, 0), softcap=5.0,
                                       sinks=sinks)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=M - n - 9, key_padding_mask=_padding(2, M),
                                       dropout_p=0.3, seed=7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_low_precision(dtype, rng):
    """The 16-bit dtypes at a step, as posenc.testing bounds them."""
    from posenc import _dtypes
    from posenc.testing import assert_attention_close

    if dtype == "bfloat16" and _dtypes.BFLOAT16 is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    for method in METHODS:
        args, kwargs, v = _inputs(method, 1, M, 16, 9, rng, dtype=np.float32)
        cast = lambda x: x.astype(_dtypes.by_name(dtype)) if x.dtype == np.float32 else x  # noqa: E731
        args = [cast(a) for a in args]
        kwargs = {k: cast(x) if isinstance(x, np.ndarray) else x for k, x in kwargs.items()}
        v = cast(v)
        got = getattr(posenc, method + "_attention")(args[0], args[1], v, *args[2:], **kwargs,
                                                     causal=True, query_offset=M - 1)
        assert_attention_close(got, method, args[0], args[1], v, *args[2:], **kwargs,
                               causal=True, query_offset=M - 1)


@pytest.mark.parametrize("method", METHODS)
def test_decode_bfloat16_is_float32_narrowed(method, rng):
    """bfloat16 at a step runs the float32 decoding path on its inputs widened (on the
    bfloat16 GEMM's problems from their twins, a unit at a time: the path has no GEMM),
    so its out is the float32 step's on the widened inputs narrowed once, bit for bit,
    and its lse the same: heads alone, a group's heads in one pass, 16 rows, keys split
    among work items.  Where there is a bfloat16 GEMM, a Dense term's pos_q . pos_kᵀ runs
    on it, and DIET's segments keep the prefill's tiles (their expanded rows): those are
    bounded (test_decode_low_precision), not bitwise."""
    from posenc import _dtypes
    from posenc._registry import REGISTRY, Dense, Segments
    from test_low_precision import bf16_gemm

    if _dtypes.BFLOAT16 is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    if bf16_gemm("bfloat16") and (REGISTRY[method].term(Dense) or REGISTRY[method].term(Segments)):
        pytest.skip("a GEMM on vdpbf16ps in the step (bound only)")
    for n, m, kv_heads in ((1, M, None), (2, 513, 2), (16, 40, None), (1, SPLIT_M, None)):
        if kv_heads:
            args, kwargs, v = _grouped(method, n, m, 16, 9, kv_heads, rng, dtype=np.float32)
        else:
            args, kwargs, v = _inputs(method, n, m, 16, 9, rng, dtype=np.float32)
        narrow = lambda x: (x.astype(_dtypes.BFLOAT16)  # noqa: E731
                            if isinstance(x, np.ndarray) and x.dtype == np.float32 else x)
        wide = lambda x: (x.astype(np.float32)  # noqa: E731
                          if isinstance(x, np.ndarray) and x.dtype == _dtypes.BFLOAT16 else x)
        args16 = [narrow(a) for a in args]
        kwargs16 = {key: narrow(x) for key, x in kwargs.items()}
        attention = dict(causal=True, query_offset=m - n)
        got = _forward(posenc, method, args16, kwargs16, narrow(v), **attention)
        want = _forward(posenc, method, [wide(a) for a in args16],
                        {key: wide(x) for key, x in kwargs16.items()}, wide(narrow(v)),
                        **attention)
        expected = _dtypes.narrow(want.out.astype(np.float64), _dtypes.BFLOAT16)
        assert np.array_equal(got.out.view(np.uint16), expected.view(np.uint16)), (n, m)
        np.testing.assert_array_equal(got.lse, want.lse)


@pytest.mark.parametrize("kv_heads", (None, 2))
@pytest.mark.parametrize("method", METHODS)
def test_decode_one_and_two_threads_are_bitwise_equal(method, kv_heads, threads, rng):
    if kv_heads:
        args, kwargs, v = _grouped(method, 1, 4001, 16, 9, kv_heads, rng, dtype=np.float32)
    else:
        args, kwargs, v = _inputs(method, 3, 4001, 16, 9, rng, dtype=np.float32)
    B, H, n = args[0].shape[:3]
    d_out = rng.standard_normal((B, H, n, 9)).astype(np.float32)
    assert_threads_bitwise(threads, method, args, kwargs, v, d_out, causal=True,
                           query_offset=4001 - n,
                           key_padding_mask=_padding(2, 4001, fully_masked_row=None))


SPLIT_M = 4500   # past the engine's ATTENTION_SPLIT_KEYS (2048): 3 chunks, the last partial


def _split_padding():
    """Key padding whose run covers chunk 1 (keys 2048-4095) whole, row 1 fully masked."""
    mask = np.zeros((2, SPLIT_M), dtype=bool)
    mask[:, 2000:4200] = True
    mask[1] = True
    return mask


@pytest.mark.parametrize("n", (1, 7))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", METHODS)
def test_decode_split_keys_match_reference(posenc_isa, method, dtype, n, rng):
    """A step over more keys than a chunk: its keys split into work items whose softmax
    parts merge in chunk order (no rotation or dense term: those keep one item per
    head).  At the cache's end, with every gradient (the backward runs the tiles from
    the merged lse); then padding that masks a whole chunk and a whole row, with sinks
    (the merge adds them once) and a softcap, out and lse."""
    args, kwargs, v = _inputs(method, n, SPLIT_M, 16, 9, rng, dtype=dtype)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=SPLIT_M - n, backward=n == 1)
    sinks = rng.standard_normal(3).astype(dtype)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=SPLIT_M - n - 3,
                                       key_padding_mask=_split_padding(), sinks=sinks,
                                       softcap=4.0, backward=False)


@pytest.mark.parametrize("method", METHODS)
def test_decode_split_keys_multi_query(posenc_isa, method, rng):
    """One key/value head (MQA) at B=2, split keys: a window reaching over two chunks,
    sinks, with every gradient; then the padding of a whole chunk and row (out, lse).  Float32, whose bound grows with
    m (float64's fixed 1e-12 is tighter than M4M's rel_k gradient over 4,500 keys on the
    unsplit tiles too: 1.2e-12)."""
    args, kwargs, v = _grouped(method, 1, SPLIT_M, 8, 5, 1, rng, dtype=np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=SPLIT_M - 1, window=(3000, 0), sinks=sinks)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=SPLIT_M - 1, key_padding_mask=_split_padding(),
                                       backward=False)



@pytest.mark.parametrize("m", (M, SPLIT_M))
def test_decode_single_row_fuses_the_key_term_bitwise(posenc_isa, m, rng):
    """DeBERTa's step (n = 1) computes its p2c term in the content's pass over k
    (term_key_table_content_row): the same bits as the two passes a call of two rows
    makes (its first row at the same position, the second seeing one key more)."""
    args, kwargs, v = _inputs("deberta", 2, m, 16, 9, rng, dtype=np.float32)
    one = _forward(posenc, "deberta", [np.ascontiguousarray(args[0][:, :, :1])] + list(args[1:]),
                   kwargs, v, causal=True, query_offset=m - 2)
    two = _forward(posenc, "deberta", args, kwargs, v, causal=True, query_offset=m - 2)
    np.testing.assert_array_equal(one.out, two.out[:, :, :1])
    np.testing.assert_array_equal(one.lse, two.lse[:, :, :1])


@pytest.mark.parametrize("d", (4, 8, 16, 32, 64, 128))
@pytest.mark.parametrize("n", (1, 2, 3))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ("content", "t5", "deberta"))
def test_decode_rows_in_registers(posenc_isa, method, dtype, n, d, rng):
    """rows_dot holds one or two query rows in registers where d is 4 or 8 of the ISA's
    vectors (every d here is that for some ISA and dtype: AVX-512 float32 64 and 128,
    AVX2 float64 16 and 32, ...), more rows a pair at a time over blocks of 32 keys: a
    step (DeBERTa's: q with its key table's row), three rows, a grouped-query step (the
    4 query heads of a key/value head: 4 n rows of one pass), over keys that leave every
    remainder of the blocks."""
    if method == "content":   # grouped: H = 8 query heads on 2 key/value heads
        args, kwargs, v = _grouped(method, n, 77, d, 5, 2, rng, dtype=dtype)
        assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                           query_offset=77 - n, backward=False)
    args, kwargs, v = _inputs(method, n, 37, d, 5, rng, dtype=dtype)
    assert_attention_matches_reference(method, args, kwargs, v, rng, causal=True,
                                       query_offset=37 - n, backward=False)
    assert_attention_matches_reference(method, args, kwargs, v, rng, backward=False)
