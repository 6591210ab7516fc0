"""A masked key is never read (SPEC §6): NaN or +Inf planted in the k and v rows of
keys that causality, a window, documents or key padding mask change nothing that
does not see them, and a key masked for every row gets zero dk, dv.  Every method,
every ISA of this CPU forced (posenc_isa), on the tiles (n >= 33), the decoding path
(n = 1, 3 with query_offset) and split keys (m = 4500, n = 1), and in the reference.

Each call is compared with the same call whose planted rows hold finite random
values: bitwise for the kernels (the planted rows change which path a tile takes,
not the sums of the rows it reads); to rounding for the reference (its exact path
sums row by row).
"""

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._registry import METHODS

from test_attention import _backward, _forward, _inputs


def _documents(B, n, m):
    """Query rows in documents 0 and 2; keys: 0, a never-queried 1 inside 0's span
    (document 0 scattered), 0 again, then 2."""
    doc_q = np.repeat([[0, 2]], [n // 2, n - n // 2], axis=1).repeat(B, axis=0)
    a = m // 4
    doc_k = np.repeat([[0, 1, 0, 2]], [a, a, a, m - 3 * a], axis=1).repeat(B, axis=0)
    return doc_q, doc_k, np.arange(a, 2 * a)


def _padding(B, m, keys):
    mask = np.zeros((B, m), dtype=bool)
    mask[:, keys] = True
    return mask


def scenarios(n, m):
    """(name, attention keywords, planted keys, rows that see none of them or None: every
    planted key is masked for every row)."""
    doc_q, doc_k, doc_keys = _documents(2, n, m)
    pad = np.arange(m // 3, m // 3 + 5)
    yield "padding", {"key_padding_mask": _padding(2, m, pad)}, pad, None
    yield "documents", {"document_q": doc_q, "document_k": doc_k}, doc_keys, None
    offset = max(m - n - 4, 0)
    future = np.arange(offset + n, m)   # causal: masked for every row
    if len(future):
        yield "causal", {"causal": True, "query_offset": offset}, future, None
    left = 3   # a window: keys before the first row's window, masked for every row
    first = max(offset - left, 0)
    yield ("window", {"causal": True, "query_offset": offset, "window": (left, 0),
                      "key_padding_mask": _padding(2, m, pad)},
           np.union1d(np.arange(0, first), pad), None)
    if n > 1:   # a key masked for the rows before it only: those rows are compared
        key = offset + n // 2 + 1
        yield "diagonal", {"causal": True, "query_offset": offset}, np.array([key]), \
            np.arange(0, key - offset)


def _plant(args, v, keys, fill):
    k, v = args[1].copy(), v.copy()
    k[:, :, keys] = fill
    v[:, :, keys] = fill
    return (args[0], k) + tuple(args[2:]), v


def _check(namespace, method, n, m, dtype, fill, rng, *, exact, backward=True):
    d, dv = 5, 3
    for name, attention, keys, rows in scenarios(n, m):
        args, kwargs, v = _inputs(method, n, m, d, dv, rng, dtype=dtype)
        planted_args, planted_v = _plant(args, v, keys, fill)
        want = _forward(namespace, method, args, kwargs, v, **attention)
        got = _forward(namespace, method, planted_args, kwargs, planted_v, **attention)
        what = f"{method} {name} {fill}"
        sel = slice(None) if rows is None else rows
        _same(got.out[:, :, sel], want.out[:, :, sel], exact, what + " out")
        _same(got.lse[:, :, sel], want.lse[:, :, sel], exact, what + " lse")
        if not backward:
            continue
        d_out = rng.standard_normal(want.out.shape).astype(dtype)
        want_g = _backward(namespace, method, d_out, args, kwargs, v, want, **attention)
        got_g = _backward(namespace, method, d_out, planted_args, kwargs, planted_v, got,
                          **attention)
        if rows is not None:   # the rows that see the key are NaN: only their dq is theirs
            _same(got_g.q[:, :, rows], want_g.q[:, :, rows], exact, what + " dq")
            continue
        for field in want_g._fields:
            g, w = getattr(got_g, field), getattr(want_g, field)
            if w is not None:
                _same(g, w, exact, f"{what} d{field}")
        assert not got_g.v[:, :, keys].any(), what
        assert not got_g.k[:, :, keys].any(), what


def _same(got, want, exact, what):
    assert np.isfinite(want[np.isfinite(want)]).all()
    if exact:
        assert np.array_equal(got, want), what
    else:
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12), what


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("method", METHODS)
def test_tiles(posenc_isa, method, dtype, rng):
    for fill in (np.nan, np.inf):
        _check(posenc, method, 37, 45, dtype, fill, rng, exact=True)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("method", METHODS)
def test_decoding(posenc_isa, method, n, rng):
    for fill in (np.nan, np.inf):
        _check(posenc, method, n, 29, np.float32, fill, rng, exact=True)


@pytest.mark.parametrize("method", METHODS)
def test_split_keys(posenc_isa, method, rng):
    _check(posenc, method, 1, 4500, np.float32, np.nan, rng, exact=True,
           backward=False)


@pytest.mark.parametrize("n", [1, 37])
@pytest.mark.parametrize("method", METHODS)
def test_reference(method, n, rng):
    for fill in (np.nan, np.inf):
        _check(reference, method, n, 45, np.float64, fill, rng, exact=False)


@pytest.mark.parametrize("method", METHODS)
def test_torch_native_formula_never_reads_keys_no_row_sees(method, rng):
    """posenc.torch's native formulas (off the CPU, and create_graph) take the rule for
    the keys no row sees -- padding, other documents, a decoding step's future
    (a cache's unused slots): NaN planted there changes no output and no gradient,
    and those keys' dk, dv are 0.  (A key some rows see, the causal diagonal of a
    prefill, is the kernels' alone: the native matmuls read it for every row.)"""
    torch = pytest.importorskip("torch")
    import posenc.torch as pt

    def call(args, kwargs, v, attention):
        tensors = [torch.tensor(a, requires_grad=np.issubdtype(a.dtype, np.floating))
                   if isinstance(a, np.ndarray) else a for a in args]
        tv = torch.tensor(v, requires_grad=True)
        options = {key: torch.tensor(value) if isinstance(value, np.ndarray) else value
                   for key, value in attention.items()}
        extra = {key: torch.tensor(value) if isinstance(value, np.ndarray) else value
                 for key, value in kwargs.items()}
        with pt.use_native(True):
            out, lse = getattr(pt, method + "_attention")(tensors[0], tensors[1], tv, *tensors[2:],
                                                          **extra, **options)
        finite = torch.isfinite(lse)
        (out.sum() + torch.where(finite, lse, 0.0).sum()).backward()
        return out.detach(), lse.detach(), tensors[1].grad, tv.grad

    n, m = 3, 29
    for name, attention, keys, rows in scenarios(n, m):
        if rows is not None:
            continue
        args, kwargs, v = _inputs(method, n, m, 5, 3, rng)
        planted_args, planted_v = _plant(args, v, keys, np.nan)
        want, got = call(args, kwargs, v, attention), call(planted_args, kwargs, planted_v, attention)
        for w, g, what in zip(want, got, ("out", "lse", "dk", "dv")):
            assert torch.equal(torch.nan_to_num(w, neginf=-1.0), torch.nan_to_num(g, neginf=-1.0)) \
                and not torch.isnan(g).any(), f"{method} {name} {what}"
        assert not got[2][:, :, keys].any() and not got[3][:, :, keys].any()
