"""posenc's dense product (posenc._C.matmul) and posenc.torch._linear.linear, the
projections of posenc.torch.hf's patched modules, with every ISA of this CPU
forced (posenc_isa): against float64 products, against F.linear forward and
backward (gradcheck in float64), strided operands, 1 and 2 threads bitwise,
and F.linear itself wherever posenc does not serve the call.
"""

import numpy as np
import pytest

import posenc
from posenc import _C

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from posenc.torch import _linear  # noqa: E402

SHAPES = ((1, 1, 1), (3, 7, 5), (17, 33, 65), (65, 300, 31), (33, 17, 600))   # M, K, N


def _bound(a, b, bias, dtype):
    """|a| |b| + |bias| times (K + 2) eps: the float rounding of a sum of K products."""
    eps = np.finfo(dtype).eps
    size = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    if bias is not None:
        size = size + np.abs(bias)
    return (a.shape[1] + 2) * eps * size + np.finfo(dtype).tiny


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_against_float64(posenc_isa, shape, dtype, rng):
    M, K, N = shape
    a = rng.standard_normal((M, K)).astype(dtype)
    w = rng.standard_normal((N, K)).astype(dtype)
    bias = rng.standard_normal(N).astype(dtype)
    for aa in (a, np.asfortranarray(a), np.repeat(a, 2, axis=1)[:, ::2]):     # rows, columns, strided
        for b in (w.T, np.ascontiguousarray(w.T)):                            # W^T and row-major
            for bb in (None, bias):
                want = aa.astype(np.float64) @ b.astype(np.float64) + (0 if bb is None else bb)
                got = _C.matmul(aa, b, bb)
                assert got.dtype == dtype and got.shape == (M, N) and got.flags.c_contiguous
                assert np.all(np.abs(got - want) <= _bound(aa, b, bb, dtype))


def test_matmul_threads_bitwise(posenc_isa, rng):
    a = rng.standard_normal((301, 200)).astype(np.float32)
    b = rng.standard_normal((200, 97)).astype(np.float32)
    previous = posenc.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            posenc.set_num_threads(threads)
            runs.append(_C.matmul(a, b, None))
    finally:
        posenc.set_num_threads(previous)
    np.testing.assert_array_equal(runs[0], runs[1])


def test_matmul_zero_sizes_and_copies(rng):
    assert _C.matmul(np.zeros((0, 3)), np.zeros((3, 4)), None).shape == (0, 4)
    bias = rng.standard_normal(4)
    np.testing.assert_array_equal(_C.matmul(np.zeros((2, 0)), np.zeros((0, 4)), bias), np.tile(bias, (2, 1)))
    a, b = rng.standard_normal((5, 6)), rng.standard_normal((12, 9))[::2, ::3]   # no unit stride: copied
    np.testing.assert_allclose(_C.matmul(a[:, ::-1], b, None), a[:, ::-1] @ b, rtol=1e-13)


def test_matmul_errors():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"a is \(2, 3\) but b is \(4, 2\)"):
        _C.matmul(a, np.ones((4, 2), np.float32), None)
    with pytest.raises(TypeError, match="float32 or float64"):
        _C.matmul(a.astype(np.float16), np.ones((3, 2), np.float16), None)
    with pytest.raises(TypeError, match=r"b must have dtype float32 \(from a's\)"):
        _C.matmul(a, np.ones((3, 2)), None)
    with pytest.raises(ValueError, match="b must be 2-D, got 1 dimensions"):
        _C.matmul(a, np.ones(3, np.float32), None)
    with pytest.raises(TypeError, match=r"bias must have dtype float32 \(from a's\)"):
        _C.matmul(a, np.ones((3, 2), np.float32), np.ones(2))
    with pytest.raises(ValueError, match=r"bias must be \(2,\)"):
        _C.matmul(a, np.ones((3, 2), np.float32), np.ones(3, np.float32))


@pytest.mark.parametrize("bias", (True, False))
def test_linear_gradcheck(posenc_isa, bias):
    torch.manual_seed(0)
    x = torch.randn(2, 9, 7, dtype=torch.float64, requires_grad=True)   # 18 rows >= MIN_ROWS
    w = torch.randn(9, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(9, dtype=torch.float64, requires_grad=True) if bias else None
    inputs = (x, w) if b is None else (x, w, b)
    assert torch.autograd.gradcheck(lambda *t: _linear.linear(*t), inputs)
    assert torch.autograd.gradgradcheck(lambda *t: _linear.linear(*t), inputs)   # create_graph


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_linear_matches_f_linear(posenc_isa, dtype):
    torch.manual_seed(1)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    base = torch.randn(3, 40, 33, dtype=dtype)
    for x0 in (base, base.transpose(0, 1)):                    # contiguous and strided x
        w0, b0 = torch.randn(65, 33, dtype=dtype), torch.randn(65, dtype=dtype)
        g = torch.randn(*x0.shape[:-1], 65, dtype=dtype)
        results = []
        for fn in (_linear.linear, F.linear):
            x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
            y = fn(x, w, b)
            y.backward(g)
            results.append((y, x.grad, w.grad, b.grad))
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, **tol)
            assert got.shape == want.shape


def test_linear_runs_posenc(monkeypatch):
    """The product goes through posenc._C.matmul (forward, d_x, d_weight)."""
    calls = []
    real = _C.matmul
    monkeypatch.setattr(_linear._C, "matmul", lambda *a: calls.append(a[0].shape) or real(*a))
    x = torch.randn(_linear.MIN_ROWS, 6, requires_grad=True)
    w = torch.randn(5, 6, requires_grad=True)
    _linear.linear(x, w).sum().backward()
    rows = _linear.MIN_ROWS
    assert calls == [(rows, 6), (rows, 5), (5, rows)]


@pytest.mark.parametrize("case", ("few rows", "bfloat16", "autocast", "mixed", "shape error",
                                  "no inputs", "no outputs"))
def test_linear_falls_back_to_f_linear(case, monkeypatch):
    """What posenc does not serve is F.linear's own call: the same bits (an x of
    width 0 gives the bias rows, as F.linear; it raised a RuntimeError)."""
    monkeypatch.setattr(_linear._C, "matmul", None)     # any posenc call would fail
    x, w, b = torch.randn(_linear.MIN_ROWS, 8), torch.randn(4, 8), torch.randn(4)
    if case == "few rows":
        x = x[: _linear.MIN_ROWS - 1]
    elif case == "no inputs":
        x, w = torch.randn(2 * _linear.MIN_ROWS, 0), torch.randn(4, 0)
    elif case == "no outputs":
        w, b = torch.randn(0, 8), torch.randn(0)
    elif case == "bfloat16":
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
    elif case == "mixed":
        x = x.double()
        with pytest.raises(RuntimeError):
            _linear.linear(x, w, b)
        return
    elif case == "shape error":
        w = torch.randn(4, 5)          # a shape error: F.linear's own message
        with pytest.raises(RuntimeError):
            _linear.linear(x, w, b)
        return
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"):
        got, want = _linear.linear(x, w, b), F.linear(x, w, b)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_project_respects_wrapped_modules():
    """A hooked nn.Linear or another module runs its own forward."""
    lin = torch.nn.Linear(4, 3)
    seen = []
    lin.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    x = torch.randn(2, 4)
    torch.testing.assert_close(_linear.project(lin, x), F.linear(x, lin.weight, lin.bias))
    assert seen == [(2, 3)]
    other = torch.nn.Sequential(torch.nn.Linear(4, 3))
    torch.testing.assert_close(_linear.project(other, x), other(x))
    wrapped = torch.nn.Linear(4, 3)
    wrapped.forward = lambda inp: torch.zeros(inp.shape[0], 3)     # replaced on the instance
    assert torch.equal(_linear.project(wrapped, x), torch.zeros(2, 3))
    backward_hooked = torch.nn.Linear(4, 3)
    backward_hooked.register_full_backward_hook(lambda mod, g_in, g_out: seen.append("backward"))
    x.requires_grad_()
    _linear.project(backward_hooked, x).sum().backward()
    assert seen[-1] == "backward"
    assert _linear._plain(torch.nn.Linear(4, 3))
