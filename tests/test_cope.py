"""CoPE, contextual position encoding (spec §3.18): the engine's `cope` term
module (csrc/engine/term_cope_impl.h) beyond the generic suites (every ISA x
dtype, finite differences, decoding steps, threads, errors: tests/test_kernels.py,
test_reference.py, test_attention.py, test_decode.py, ... run it from the
registry).  Here: the formula written out as loops; x-transformers' CoPE module
on the masked content logits (its own code, float64), forward and gradients;
long rows (positions past P, and P past every position); the fused attention
under windows and documents against the rows' own keys; NaN rows; the nn
module (training, compile, gradcheck)."""

import numpy as np
import pytest
import torch

import posenc
import posenc.reference as ref
import posenc.torch as pt
from posenc.torch import nn as pnn


def _inputs(rng, B=2, H=3, n=6, m=9, d=5, P=4, shared=False, dtype=np.float64):
    q = rng.standard_normal((B, H, n, d)).astype(dtype)
    k = rng.standard_normal((B, H, m, d)).astype(dtype)
    table = rng.standard_normal((P, d) if shared else (H, P, d)).astype(dtype)
    return q, k, table


def _literal(q, k, table, *, causal=False, query_offset=0, scale=None):
    """A_ij by loops: the gates of the keys the row sees, their sums from the row's
    end, the projections interpolated (spec §3.18, written out)."""
    B, H, n, d = q.shape
    m = k.shape[2]
    s = 1 / np.sqrt(d) if scale is None else scale
    table = np.broadcast_to(table if table.ndim == 3 else table[None], (H,) + table.shape[-2:])
    P = table.shape[1]
    A = np.zeros((B, H, n, m))
    for b in range(B):
        for h in range(H):
            for i in range(n):
                z = [s * float(q[b, h, i] @ k[b, h, j]) for j in range(m)]
                seen = [not causal or j <= query_offset + i for j in range(m)]
                gates = [1 / (1 + np.exp(-z[j])) if seen[j] else 0.0 for j in range(m)]
                qe = [float(q[b, h, i] @ table[h, t]) for t in range(P)]
                for j in range(m):
                    p = min(sum(gates[j:]), P - 1)
                    lo = int(np.floor(p))
                    hi = int(np.ceil(p))
                    w = p - lo
                    A[b, h, i, j] = z[j] + w * qe[hi] + (1 - w) * qe[lo]
    return A


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_formula_written_out(causal, shared, rng):
    q, k, table = _inputs(rng, shared=shared)
    want = _literal(q, k, table, causal=causal, query_offset=3)
    np.testing.assert_allclose(ref.cope(q, k, table, causal=causal, query_offset=3), want,
                               rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(posenc.cope(q, k, table, causal=causal, query_offset=3), want,
                               rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ x-transformers

def _x_transformers_cope(q, k, table, causal):
    """x-transformers 2.31's CoPE on the content logits as its Attend masks them (a
    causal mask fills -finfo.max before CoPE reads them): (logits, the mask)."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    H, d = q.shape[1], q.shape[3]
    module = xt.CoPE(dim=d, heads=H, max_pos=table.shape[0]).double()
    with torch.no_grad():
        module.pos_emb.copy_(table)
    sim = torch.einsum("bhid,bhjd->bhij", q, k) * d ** -0.5
    n, m = sim.shape[-2:]
    masked = torch.ones(n, m, dtype=torch.bool).triu(m - n + 1) if causal else \
        torch.zeros(n, m, dtype=torch.bool)
    sim = sim.masked_fill(masked, -torch.finfo(sim.dtype).max)
    return sim + module(q, sim), masked, module


@pytest.mark.parametrize("causal", [False, True])
def test_equals_x_transformers(causal, rng):
    """posenc's cope (the C kernels, float64) = x-transformers' CoPE added to the masked
    content logits, on every key a row sees, to 1e-12; the gradients of q, k and pos_emb
    through a loss on those logits too."""
    B, H, n, m, d, P = 2, 3, 7, 11, 8, 5
    q = torch.tensor(rng.standard_normal((B, H, n, d)), requires_grad=True)
    k = torch.tensor(rng.standard_normal((B, H, m, d)), requires_grad=True)
    table = torch.tensor(rng.standard_normal((P, d)))
    theirs, masked, module = _x_transformers_cope(q, k, table, causal)
    pos_emb = table.clone().requires_grad_(True)
    ours = pt.cope(q, k, pos_emb, causal=causal, query_offset=m - n)
    seen = ~masked
    assert torch.allclose(ours[..., seen], theirs[..., seen], rtol=1e-12, atol=1e-12)
    weights = torch.tensor(rng.standard_normal(ours.shape))
    loss_theirs = (theirs * weights)[..., seen].sum()
    grads_theirs = torch.autograd.grad(loss_theirs, [q, k, module.pos_emb])
    loss_ours = (ours * weights)[..., seen].sum()
    grads_ours = torch.autograd.grad(loss_ours, [q, k, pos_emb])
    for name, a, b in zip(("q", "k", "pos_emb"), grads_ours, grads_theirs):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10), (name, (a - b).abs().max())


# ------------------------------------------------------------------ long rows, masks, NaN

@pytest.mark.parametrize("P", [3, 3000])
def test_long_rows(P, rng):
    """2000 keys: with P = 3 the early keys' positions clamp at 2; with P = 3000 none
    does.  Forward and every gradient, float64 and float32, against the reference."""
    q, k, table = _inputs(rng, B=1, H=2, n=5, m=2000, d=8, P=P)
    want = ref.cope(q, k, table, causal=True, query_offset=1995)
    G = rng.standard_normal(want.shape)
    want_grads = ref.cope_backward(G, q, k, table, causal=True, query_offset=1995)
    for dtype, tol in ((np.float64, 1e-11), (np.float32, 2e-4)):
        args = [x.astype(dtype) for x in (q, k, table)]
        got = posenc.cope(*args, causal=True, query_offset=1995)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
        grads = posenc.cope_backward(G.astype(dtype), *args, causal=True, query_offset=1995)
        for name in grads._fields:
            g, w = getattr(grads, name), getattr(want_grads, name)
            assert np.linalg.norm(g - w) <= tol * np.linalg.norm(w), (dtype, name)


def _rows_literal(q, k, v, table, seen):
    """out of the fused attention row by row: each row's logits over its own keys alone
    (its gates count those keys only), then a softmax and v."""
    B, H, n, _ = q.shape
    out = np.zeros((B, H, n, v.shape[-1]))
    for b in range(B):
        for i in range(n):
            keys = np.flatnonzero(seen[b, i])
            if keys.size == 0:
                continue
            A = ref.cope(q[b:b + 1, :, i:i + 1], k[b:b + 1, :, keys], table)[0, :, 0]
            P = np.exp(A - A.max(axis=-1, keepdims=True))
            P /= P.sum(axis=-1, keepdims=True)
            out[b, :, i] = np.einsum("hj,hjd->hd", P, v[b][:, keys])
    return out


def test_attention_masks_are_the_gates_keys(rng):
    """Under a window and documents the positions count only the keys a row sees: the
    fused attention (every ISA's engine, float64) = the rows over their own keys alone."""
    B, H, n, m = 2, 3, 7, 12
    q, k, table = _inputs(rng, B=B, H=H, n=n, m=m, P=5)
    v = rng.standard_normal((B, H, m, 4))
    document_q = np.array([[0, 0, 1, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1, 1]])
    document_k = np.array([[0] * 4 + [1] * 4 + [2] * 4, [0] * 6 + [1] * 6])
    offset = 5
    i = np.arange(n)[:, None] + offset
    j = np.arange(m)[None, :]
    seen = (j <= i) & (j >= i - 4) & (document_q[:, :, None] == document_k[:, None, :])
    got = posenc.cope_attention(q, k, v, table, causal=True, window=(4, 0), query_offset=offset,
                                document_q=document_q, document_k=document_k)
    np.testing.assert_allclose(got.out, _rows_literal(q, k, v, table, seen), rtol=1e-12,
                               atol=1e-12)


def test_nan_gate_makes_its_row_nan_from_it_down(rng):
    """A NaN in key 4 (seen by every row): the positions of keys <= 4 are NaN, so are
    their logits; the keys after it keep finite positions and logits, as the reference's."""
    q, k, table = _inputs(rng, n=3, m=8)
    k[:, :, 4, 0] = np.nan
    got = posenc.cope(q, k, table)
    want = ref.cope(q, k, table)
    assert np.isnan(got[..., :5]).all() and np.isfinite(got[..., 5:]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[..., 5:], want[..., 5:], rtol=1e-12, atol=1e-12)


def test_errors():
    rng = np.random.default_rng(0)
    q, k, table = _inputs(rng)
    with pytest.raises(ValueError, match=r"pos_emb must have shape \(P, d\) or \(H\|1, P, d\)"):
        posenc.cope(q, k, table[:, :, :-1])
    with pytest.raises(ValueError, match="got \\(3, 0, 5\\)"):
        posenc.cope(q, k, table[:, :0])
    with pytest.raises(TypeError, match="causal must be a bool"):
        posenc.cope(q, k, table, causal=1)
    with pytest.raises(TypeError, match="causal"):   # the attention's own causal stands for it
        posenc.cope_attention(q, k, k, table, causal=True, **{"causal": False, "x": 1})


# ------------------------------------------------------------------ torch

def test_module_trains_and_compiles(rng):
    """CoPE in PositionalSelfAttention: 30 Adam steps lower a causal LM-style loss from
    the zero table (its gradient is the kernels'), and torch.compile gives eager's logits."""
    torch.manual_seed(0)
    encoding = pnn.CoPE(4, 8, max_pos=6)
    layer = pnn.PositionalSelfAttention(32, 4, encoding=encoding)
    x = torch.randn(2, 12, 32)
    target = torch.randn(2, 12, 32)
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = ((layer(x, causal=True) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    assert encoding.pos_emb.abs().sum() > 0          # the table left zero: it trained
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8)
    eager = encoding(q, k)
    compiled = torch.compile(encoding, fullgraph=True)(q, k)
    torch.testing.assert_close(compiled, eager)


def test_gradcheck():
    rng = np.random.default_rng(3)
    q, k, table = (torch.tensor(x, requires_grad=True) for x in _inputs(rng, B=1, H=2, n=3,
                                                                        m=5, d=3, P=3))
    v = torch.tensor(rng.standard_normal((1, 2, 5, 2)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda *x: pt.cope(*x, causal=True, query_offset=2),
                                    (q, k, table))
    assert torch.autograd.gradcheck(
        lambda q, k, v, t: pt.cope_attention(q, k, v, t, causal=True, query_offset=2).out,
        (q, k, v, table))


def test_unfused_layer_equals_fused(rng):
    """PositionalSelfAttention(fused=False) with CoPE: the torch formula on the keys each
    row sees (causal, a window, padding, a boolean attn_mask) = the fused C attention."""
    torch.manual_seed(1)
    encoding = pnn.CoPE(4, 8, max_pos=5, per_head=True)
    with torch.no_grad():
        encoding.pos_emb.normal_()
    fused = pnn.PositionalSelfAttention(32, 4, encoding=encoding, window=(3, 0)).double()
    unfused = pnn.PositionalSelfAttention(32, 4, encoding=encoding, window=(3, 0),
                                          fused=False).double()
    unfused.load_state_dict(fused.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, :2] = True
    torch.testing.assert_close(unfused(x, padding, causal=True), fused(x, padding, causal=True))
    mask = torch.zeros(9, 9, dtype=torch.bool)
    mask[:, 4] = True
    reference = unfused(x, causal=True, attn_mask=mask)
    keys = torch.ones(2, 9, dtype=torch.bool)
    keys[:, 4] = False          # key 4 masked for every row: as padding, the same gates
    torch.testing.assert_close(reference, fused(x, ~keys, causal=True))
    with pytest.raises(ValueError, match="bool"):
        unfused(x, causal=True, attn_mask=mask.double())
