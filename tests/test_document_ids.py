"""Document ids compared as integer values (SPEC §7): document_q and document_k of
different integer dtypes mask as their values say (int64 -1 and uint8 255 are
different documents), and an id outside the int64 range is
a ValueError naming the argument; posenc, posenc.reference and posenc.torch (the
C path and the native formula)."""

import numpy as np
import pytest

import posenc
from posenc import reference

B, H, N, M, D = 1, 2, 3, 4, 5


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((B, H, N, D)), rng.standard_normal((B, H, M, D)),
            rng.standard_normal((B, H, M, D)))


def _ids(doc_q, doc_k):
    """(B, n) ids all doc_q, (B, m) ids all doc_k, each of its scalar's dtype."""
    q_ids = np.full((B, N), doc_q)
    k_ids = np.full((B, M), doc_k)
    return q_ids, k_ids


# document_q value/dtype, document_k value/dtype: whether the keys are the query's document
PAIRS = [
    (np.int64(-1), np.uint8(255), False),
    (np.int64(-1), np.uint32(2**32 - 1), False),
    (np.int64(5), np.uint64(5), True),
    (np.int8(-1), np.int64(-1), True),
    (np.uint8(200), np.int64(200), True),
    (np.uint64(2**63 - 1), np.int64(2**63 - 1), True),
    (np.int32(-5), np.uint16(65531), False),
]


@pytest.mark.parametrize("namespace", [posenc, reference], ids=["posenc", "reference"])
@pytest.mark.parametrize("doc_q, doc_k, same", PAIRS)
def test_ids_compare_as_values(namespace, doc_q, doc_k, same):
    q, k, v = _inputs()
    q_ids, k_ids = _ids(doc_q, doc_k)
    got = namespace.content_attention(q, k, v, document_q=q_ids, document_k=k_ids)
    if same:
        want = namespace.content_attention(q, k, v)
        np.testing.assert_allclose(got.out, want.out, rtol=1e-12, atol=1e-12)
    else:
        assert (got.out == 0).all() and np.isneginf(got.lse).all()


@pytest.mark.parametrize("namespace", [posenc, reference], ids=["posenc", "reference"])
@pytest.mark.parametrize("side", ["document_q", "document_k"])
def test_id_outside_int64_is_a_value_error(namespace, side):
    q, k, v = _inputs()
    ids = dict(document_q=np.zeros((B, N), dtype=np.uint64),
               document_k=np.zeros((B, M), dtype=np.uint64))
    ids[side][0, -1] = 2**63 if side == "document_q" else 2**64 - 1
    with pytest.raises(ValueError, match=side):
        namespace.content_attention(q, k, v, **ids)
    with pytest.raises(ValueError, match=side):
        namespace.content_attention_backward(np.zeros((B, H, N, D)), q, k, v,
                                             np.zeros((B, H, N, D)), np.zeros((B, H, N)), **ids)


torch = pytest.importorskip("torch")
import posenc.torch as pt  # noqa: E402

TORCH_PAIRS = [
    (torch.tensor(-1, dtype=torch.int64), torch.tensor(255, dtype=torch.uint8), False),
    (torch.tensor(-1, dtype=torch.int64), torch.tensor(2**32 - 1, dtype=torch.uint32), False),
    (torch.tensor(5, dtype=torch.int64), torch.tensor(5, dtype=torch.uint64), True),
    (torch.tensor(-1, dtype=torch.int8), torch.tensor(-1, dtype=torch.int64), True),
    (torch.tensor(200, dtype=torch.uint8), torch.tensor(200, dtype=torch.int32), True),
]


@pytest.mark.parametrize("native", [False, True], ids=["c", "native"])
@pytest.mark.parametrize("doc_q, doc_k, same", TORCH_PAIRS)
def test_torch_ids_compare_as_values(native, doc_q, doc_k, same):
    q, k, v = (torch.from_numpy(x) for x in _inputs())
    q_ids, k_ids = doc_q.expand(B, N).contiguous(), doc_k.expand(B, M).contiguous()
    with pt.use_native(native):
        got = pt.content_attention(q, k, v, document_q=q_ids, document_k=k_ids)
        if same:
            torch.testing.assert_close(got.out, pt.content_attention(q, k, v).out)
        else:
            assert (got.out == 0).all() and torch.isneginf(got.lse).all()


@pytest.mark.parametrize("native", [False, True], ids=["c", "native"])
def test_torch_id_outside_int64_is_a_value_error(native):
    q, k, v = (torch.from_numpy(x) for x in _inputs())
    q_ids = torch.zeros(B, N, dtype=torch.int64)
    k_ids = torch.full((B, M), -2, dtype=torch.int64).view(torch.uint64)   # 2**64 - 2
    with pt.use_native(native), pytest.raises(ValueError, match="document_k"):
        pt.content_attention(q, k, v, document_q=q_ids, document_k=k_ids)
