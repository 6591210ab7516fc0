"""posenc.reference's fused attention (SPEC §6) and the dropout generator:
against a literal softmax, finite differences in float64, masks (causal with
n < m and n > m, padding with fully masked rows), query_offset, dropout, and
the Philox known answers."""

import numpy as np
import pytest

import posenc.reference as ref
from posenc._attention import attention_dropout_mask, philox4x32
from posenc._examples import key_count, make_inputs, query_rows, trainable_inputs, with_inputs
from posenc._registry import METHODS, REGISTRY

B, H, D, DV = 2, 3, 4, 5


def _call(method, n, m, rng, **kw):
    args, kwargs = make_inputs(method, B, H, n, m, D, rng=rng)
    v = rng.standard_normal((B, H, m, DV))
    return args, kwargs, v


def _row_logits(method, args, kwargs, b, i, allowed, query_offset):
    """Logits of row i of batch row b over the keys it sees, from the reference logits of
    that query alone and those keys alone (CoPE: its gates count the keys the row sees)."""
    q, k = args[0][b:b + 1, :, i:i + 1], args[1][b:b + 1, :, allowed]
    return getattr(ref, method)(q, k, *args[2:], **dict(kwargs, causal=False),
                                query_offset=query_offset + i)[0, :, 0]


def _literal(method, args, kwargs, v, *, causal=False, key_padding_mask=None, query_offset=0,
             dropout_p=0.0, seed=0):
    """softmax(A + Mask) D v by loops over rows, from the reference logits (a method whose
    logits read the mask: row by row over the keys the row sees, _row_logits)."""
    A = getattr(ref, method)(*args, **kwargs, query_offset=query_offset)
    n, m = A.shape[2:]
    keep = attention_dropout_mask(seed, A.shape, dropout_p) / (1 - dropout_p)
    out = np.zeros(A.shape[:3] + (v.shape[-1],))
    lse = np.full(A.shape[:3], -np.inf)
    for b in range(A.shape[0]):
        for h in range(A.shape[1]):
            for i in range(n):
                allowed = [j for j in range(m) if not (causal and j > query_offset + i)
                           and not (key_padding_mask is not None and key_padding_mask[b, j])]
                if not allowed:
                    continue
                row = (_row_logits(method, args, kwargs, b, i, allowed, query_offset)[h]
                       if REGISTRY[method].reads_mask else A[b, h, i, allowed])
                lse[b, h, i] = np.log(np.sum(np.exp(row - row.max()))) + row.max()
                weights = np.exp(row - lse[b, h, i]) * keep[b, h, i, allowed]
                out[b, h, i] = weights @ v[b, h, allowed]
    return out, lse


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n, m, causal", [(5, 7, True), (7, 5, True), (6, 6, False), (1, 4, False)])
def test_attention_equals_literal_softmax(method, n, m, causal, rng):
    m = key_count(method, n, m)
    args, kwargs, v = _call(method, n, m, rng)
    mask = np.zeros((B, m), dtype=bool)
    mask[1, -2:] = True
    got = ref.__dict__[method + "_attention"](*args[:2], v, *args[2:], **kwargs, causal=causal,
                                               key_padding_mask=mask, dropout_p=0.25, seed=7)
    out, lse = _literal(method, args, kwargs, v, causal=causal, key_padding_mask=mask,
                        dropout_p=0.25, seed=7)
    np.testing.assert_allclose(got.out, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.lse, lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_fully_masked_rows_give_zeros_and_no_nan(method, rng):
    m = key_count(method, 4, 3)
    args, kwargs, v = _call(method, 4, m, rng)
    mask = np.zeros((B, m), dtype=bool)
    mask[0] = True                                  # batch 0: every key is padding
    attention = ref.__dict__[method + "_attention"]
    got = attention(*args[:2], v, *args[2:], **kwargs, key_padding_mask=mask)
    assert np.all(got.out[0] == 0) and np.all(np.isneginf(got.lse[0]))
    assert not np.isnan(got.out).any()
    grads = ref.__dict__[method + "_attention_backward"](
        np.ones_like(got.out), *args[:2], v, *args[2:], got.out, got.lse, **kwargs,
        key_padding_mask=mask)
    for name, grad in zip(grads._fields, grads):
        if grad is not None:
            assert not np.isnan(grad).any(), name
    assert np.all(grads.q[0] == 0) and np.all(grads.v[0] == 0)


@pytest.mark.parametrize("method", METHODS)
def test_one_query_step_is_the_last_row(method, rng):
    """A KV-cache step: n = 1 at query_offset = m - 1 equals the last row of the full pass."""
    args, kwargs, v = _call(method, 6, 6, rng)
    attention = ref.__dict__[method + "_attention"]
    full = attention(*args[:2], v, *args[2:], **kwargs, causal=True)
    step_args, step_kw = query_rows(method, args, kwargs, slice(-1, None))
    step = attention(*step_args[:2], v, *step_args[2:], **step_kw, causal=True, query_offset=5)
    np.testing.assert_allclose(step.out, full.out[:, :, -1:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(step.lse, full.lse[:, :, -1:], rtol=1e-12, atol=1e-12)


def numeric_gradients(loss, floats: dict, eps: float = 1e-6) -> dict:
    """Central differences of loss(values) (values: `floats` with one entry bumped) for
    every entry of every array of `floats`, by name."""
    grads = {}
    for name, value in floats.items():
        numeric = np.zeros(value.shape)
        for index in np.ndindex(value.shape):
            bumped = {**floats, name: value.copy()}
            bumped[name][index] += eps
            up = loss(bumped)
            bumped[name][index] -= 2 * eps
            numeric[index] = (up - loss(bumped)) / (2 * eps)
        grads[name] = numeric
    return grads


@pytest.mark.parametrize("method", METHODS)
def test_backward_matches_finite_differences(method, rng):
    n, m = 4, 5
    args, kwargs, v = _call(method, n, m, rng)
    mask = np.zeros((B, m), dtype=bool)
    mask[1, 0] = True
    options = dict(causal=True, key_padding_mask=mask, query_offset=1, dropout_p=0.3, seed=3)
    attention = ref.__dict__[method + "_attention"]
    weights = rng.standard_normal((B, H, n, DV))
    floats = dict(trainable_inputs(method, args, kwargs), v=v)

    def loss(values):
        a, kw = with_inputs(method, args, kwargs, values)
        return float(np.sum(weights * attention(*a[:2], values["v"], *a[2:], **kw,
                                                **options).out))

    result = attention(*args[:2], v, *args[2:], **kwargs, **options)
    grads = ref.__dict__[method + "_attention_backward"](
        weights, *args[:2], v, *args[2:], result.out, result.lse, **kwargs, **options)
    for name, numeric in numeric_gradients(loss, floats).items():
        np.testing.assert_allclose(getattr(grads, name), numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{method} {name}")


def test_philox_known_answers():
    """Random123's published vectors for Philox-4x32-10."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
             ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
             ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
              (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in cases:
        assert tuple(int(w) for w in philox4x32(counter, key)) == want


def test_dropout_mask_rate_and_purity():
    mask = attention_dropout_mask(2**63 + 5, (2, 3, 64, 67), 0.2)
    assert mask.dtype == bool and mask.shape == (2, 3, 64, 67)
    assert abs(1 - mask.mean() - 0.2) < 0.01
    # a pure function of (seed, b, h, i, j): a sub-block is the block's slice
    np.testing.assert_array_equal(attention_dropout_mask(2**63 + 5, (1, 2, 10, 9), 0.2),
                                  mask[:1, :2, :10, :9])
    assert attention_dropout_mask(0, (1, 1, 3, 3), 0.0).all()
    with pytest.raises(ValueError, match="dropout_p"):
        attention_dropout_mask(0, (1, 1, 1, 1), 1.0)
    with pytest.raises(ValueError, match="seed"):
        attention_dropout_mask(-1, (1, 1, 1, 1), 0.5)


@pytest.mark.parametrize("bad, error, fragment", [
    (dict(v=np.zeros((B, H, 4, DV), dtype=np.float32)), TypeError, "v has dtype float32"),
    (dict(v=np.zeros((B, H, 3, DV))), ValueError, "v must have shape"),
    (dict(key_padding_mask=np.zeros((B, 4), dtype=np.int8)), TypeError, "key_padding_mask"),
    (dict(key_padding_mask=np.zeros((B, 5), dtype=bool)), ValueError, "key_padding_mask"),
    (dict(dropout_p=1.0), ValueError, "dropout_p"),
    (dict(causal=1), TypeError, "causal"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(query_offset=-1), ValueError, "query_offset"),
])
def test_attention_errors_name_the_argument(bad, error, fragment, rng):
    args, kwargs, v = _call("t5", 3, 4, rng)
    call = dict(kwargs, v=v)
    call.update(bad)
    v = call.pop("v")
    with pytest.raises(error, match=fragment):
        ref.t5_attention(*args[:2], v, *args[2:], **call)
