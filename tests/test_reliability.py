"""What a new user or an adversary trips on: errors that name the argument
and what was expected, whatever the namespace; odd but valid inputs that
must work (unsigned segment ids, torch.func transforms, any-case ISA names)."""

import os

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc._examples import make_inputs

try:                # a module-level importorskip would skip the NumPy tests too
    import torch

    import posenc.torch as pt
except ImportError:
    torch = pt = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (pip install torch)")

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("method", ["diet_abs", "diet_rel"])
def test_segment_ids_of_any_integer_dtype(method, dtype):
    """SPEC §1: integer inputs may be any integer dtype (uint64 included)."""
    args, kw = make_inputs(method, 2, 3, 5, 4, 3, rng=np.random.default_rng(0))
    want = getattr(reference, method)(*args, **kw)
    kw = dict(kw, segment_q=kw["segment_q"].astype(dtype), segment_k=kw["segment_k"].astype(dtype))
    np.testing.assert_allclose(getattr(posenc, method)(*args, **kw), want, rtol=1e-12, atol=1e-12)
    G = np.ones(want.shape)
    got = getattr(posenc, method + "_backward")(G, *args, **kw)
    ref = getattr(reference, method + "_backward")(G, *args, **kw)
    np.testing.assert_allclose(got.segment_table, ref.segment_table, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("module", [posenc, reference], ids=["posenc", "reference"])
def test_none_for_a_required_table(module):
    q = np.zeros((1, 1, 2, 2))
    for call in (lambda: module.t5(q, q, None), lambda: module.shaw(q, q, None, max_distance=1),
                 lambda: module.t5_backward(np.zeros((1, 1, 2, 2)), q, q, None)):
        with pytest.raises(TypeError, match="bias is required|rel_k is required"):
            call()


@pytest.mark.parametrize("module", [posenc, reference], ids=["posenc", "reference"])
def test_misaligned_out_is_refused_alike(module):
    q = np.ones((1, 1, 2, 2))
    raw = np.zeros(4 * 8 + 1, dtype=np.uint8)
    out = raw[1:].view(np.float64).reshape(1, 1, 2, 2)
    assert not out.flags.aligned
    with pytest.raises(ValueError, match="out must be aligned"):
        module.content(q, q, out=out)


def test_isa_names_as_the_environment_variable_takes_them():
    previous = posenc.get_isa()
    try:
        posenc.set_isa(" SCALAR ")
        assert posenc.get_isa() == "scalar"
        with pytest.raises(ValueError, match="unknown ISA"):
            posenc.set_isa("scalar\x00junk")
        with pytest.raises(TypeError):
            posenc.set_isa(b"scalar")
    finally:
        posenc.set_isa(previous)


_FORK_SCRIPT = """
import multiprocessing as mp, sys, numpy as np, posenc
posenc.set_num_threads(2)
q = np.random.default_rng(0).standard_normal((4, 12, 256, 64)).astype(np.float32)
want = float(posenc.content(q, q).sum())          # the parent's OpenMP threads are running

def work(i):
    assert posenc.get_num_threads() == 1
    return float(posenc.content(q, q).sum())

if __name__ == "__main__":
    if sys.argv[1] == "pool":
        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map_async(work, range(4)).get(timeout=60)
    else:
        import torch
        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return torch.tensor(work(i))
        loader = torch.utils.data.DataLoader(Data(), batch_size=1, num_workers=2, timeout=60,
                                             multiprocessing_context="fork")
        got = [float(x) for x in loader]
    assert all(g == want for g in got), (got, want)
    print("ok", len(got))
"""


@pytest.mark.parametrize("kind", ["pool", "dataloader"])
def test_fork_after_the_parent_used_threads(kind, tmp_path, python):
    """A fork() child (multiprocessing pool, DataLoader worker) of a parent whose
    OpenMP threads ran returns in seconds, on one thread, with the same numbers."""
    if kind == "dataloader":
        pytest.importorskip("torch")
    script = tmp_path / "fork_script.py"
    script.write_text(_FORK_SCRIPT)
    result = python(str(script), kind)
    assert result.returncode == 0 and result.stdout.startswith("ok 4"), result.stderr[-2000:]


def test_forked_child_refuses_more_threads():
    import os
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child reports and leaves at once
        try:
            posenc.set_num_threads(2)
            message = b"accepted"
        except RuntimeError as exc:
            message = str(exc).encode()[:200]
        os.write(write, message)
        os._exit(0)
    os.waitpid(pid, 0)
    assert b"fork()" in os.read(read, 400)


def test_thread_count_from_the_environment_is_clamped(python):
    result = python("-c", "import posenc; print(posenc.get_num_threads())",
                    env={"OMP_NUM_THREADS": "100000"})
    assert result.returncode == 0 and int(result.stdout) == posenc.MAX_THREADS


def test_plot_without_matplotlib_is_one_line(tmp_path, python):
    """`posenc plot` with matplotlib missing: one line saying what to install."""
    result = python("-m", "posenc", "plot", "--method", "t5", "--random-params", "-o",
                    str(tmp_path / "x.png"), blocked="matplotlib")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "needs matplotlib, which is not installed: pip install matplotlib" in result.stderr


def test_check_without_ml_dtypes_says_what_it_skipped(python):
    result = python("-m", "posenc", "check", "--methods", "content", "--isa", "scalar",
                    blocked="ml_dtypes")
    assert result.returncode == 0, result.stderr
    assert "3 dtypes" in result.stdout
    assert "skipped: bfloat16 (needs ml_dtypes, which is not installed: pip install ml_dtypes" \
        in result.stdout


def test_posenc_torch_without_torch_says_what_to_install(python):
    result = python("-c", "import posenc.torch", blocked="torch",
                    blocked_error="ModuleNotFoundError")
    assert result.returncode == 1
    assert "ModuleNotFoundError: posenc.torch needs PyTorch, which is not installed: " \
           "pip install torch" in result.stderr, result.stderr[-2000:]


@needs_torch
@pytest.mark.parametrize("dtype_name", ["uint16", "uint32", "uint64", "int8"])
def test_torch_segment_ids_of_unsigned_dtypes(dtype_name):
    dtype = getattr(torch, dtype_name)
    args, kw = make_inputs("diet_rel", 2, 3, 5, 4, 3, rng=np.random.default_rng(0))
    want = reference.diet_rel(*args, **kw)
    targs = [torch.from_numpy(a) for a in args]
    tkw = dict(kw, segment_q=torch.from_numpy(kw["segment_q"]).to(dtype),
               segment_k=torch.from_numpy(kw["segment_k"]).to(dtype),
               segment_table=torch.from_numpy(kw["segment_table"]))
    for native in (False, True):
        with pt.use_native(native):
            got = pt.diet_rel(*targs, **tkw)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@needs_torch
def test_torch_wrong_segment_dtype_names_what_is_expected():
    q = torch.zeros(1, 1, 2, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match="segment_q must have an integer dtype"):
        pt.diet_abs(q, q, torch.zeros(1, 2, 1, dtype=torch.float64),
                    torch.zeros(1, 2, 1, dtype=torch.float64),
                    segment_q=torch.zeros(1, 2, dtype=torch.complex64),
                    segment_k=torch.zeros(1, 2, dtype=torch.int64),
                    segment_table=torch.zeros(1, 1, 1, dtype=torch.float64))


@needs_torch
def test_torch_none_for_a_required_table():
    q = torch.zeros(1, 1, 2, 2)
    with pytest.raises(TypeError, match="bias is required: a torch.Tensor"):
        pt.t5(q, q, None)


@needs_torch
@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms(transform):
    """torch.func transforms run through the native formula (wrapped tensors have
    no storage for the C kernels), with the same numbers as autograd."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 3, 2, dtype=torch.float64, generator=g)
    k = torch.randn(2, 1, 3, 2, dtype=torch.float64, generator=g)
    bias = torch.randn(1, 8, dtype=torch.float64, generator=g)

    def f(q):
        return pt.t5(q, k, bias, num_buckets=8, max_distance=6).pow(2).sum()

    if transform == "grad":
        got = torch.func.grad(f)(q)
        qq = q.clone().requires_grad_()
        want = torch.autograd.grad(f(qq), qq)[0]
    else:
        got = torch.func.vmap(lambda x: pt.t5(x, k[:1], bias, num_buckets=8, max_distance=6))(
            q[:, None])
        want = torch.stack([pt.t5(x[None], k[:1], bias, num_buckets=8, max_distance=6)
                            for x in q])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- result memory

_BIG = (2, 4, 1024, 1024)       # float32: 32 MiB, the size from which results use blocks


def _address(a):
    return a.__array_interface__["data"][0]


def test_large_results_reuse_a_freed_block():
    """A freed large result backs the next one (no fresh page faults); while
    any view of it lives, its block is not reused."""
    previous = posenc.get_result_cache()
    rng = np.random.default_rng(0)
    q = rng.standard_normal(_BIG[:3] + (8,)).astype(np.float32)
    want = reference.content(q, q)
    try:
        posenc.set_result_cache(256 << 20)
        first = posenc.content(q, q)
        assert _address(first) % 64 == 0 and first.flags.c_contiguous and first.flags.writeable
        np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
        view = first[1]
        address = _address(first)
        del first
        second = posenc.content(q, q)         # the view still holds the first block
        assert _address(second) != address
        np.testing.assert_allclose(view, want[1], rtol=1e-5, atol=1e-5)
        del view
        assert posenc._C.result_cache_info()["blocks"] == 1
        third = posenc.content(q * 2, q)
        assert _address(third) == address
        np.testing.assert_allclose(third, 2 * want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(second, want, rtol=1e-5, atol=1e-5)
        del second, third
        info = posenc._C.result_cache_info()
        assert info["blocks"] == 2 and info["bytes"] <= info["budget"]
        posenc.set_result_cache(0)                # frees what it holds
        assert posenc._C.result_cache_info() == {"budget": 0, "blocks": 0, "bytes": 0}
        np.testing.assert_allclose(posenc.content(q, q), want, rtol=1e-5, atol=1e-5)
        assert posenc._C.result_cache_info()["blocks"] == 0
    finally:
        posenc.set_result_cache(previous)


def test_result_cache_knob_checks_its_argument():
    with pytest.raises(TypeError):
        posenc.set_result_cache(1.5)
    with pytest.raises(ValueError, match=">= 0"):
        posenc.set_result_cache(-1)


@pytest.mark.parametrize("value, budget", [("64M", 64 << 20), ("0", 0), ("1048576", 1 << 20),
                                           ("lots", 256 << 20)])
def test_result_cache_from_the_environment(value, budget, python):
    code = "import warnings, posenc; print(posenc.get_result_cache())"
    run = python("-c", code, env={"POSENC_RESULT_CACHE": value})
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == budget
    assert ("POSENC_RESULT_CACHE=lots" in run.stderr) == (value == "lots")


@pytest.mark.parametrize("B", [1, 4, 16])
def test_a_result_too_large_is_a_memory_error_naming_its_shape(B):
    """d = 0, n = m = 2**30: the result's size overflows any integer before
    any allocation; a MemoryError with the shape, never a negative size."""
    q = np.zeros((B, 1, 2**30, 0), np.float32)
    with pytest.raises(MemoryError, match=rf"\({B}, 1, 1073741824, 1073741824\)"):
        posenc.content(q, q)
