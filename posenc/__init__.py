"""posenc: attention logits of positional-encoding methods, and their gradients.

Every method of SPEC §3 (docs/spec.md) -- content, shaw, t5, m2, m4, m4m, deberta, tupe,
diet_abs, diet_rel, relative_bias, alibi, kerple, rope -- is a function
``posenc.<name>(q, k, ...)`` that returns
the logits A (B, H, n, m) computed by fused C kernels (scalar, AVX2, AVX-512,
NEON; picked at run time), and ``posenc.<name>_backward(G, q, k, ...)`` that
returns their gradients as a named tuple.  ``posenc.reference`` has the same
functions in plain NumPy; ``posenc.torch`` plugs them into autograd.

ISA and threads: ``posenc.capabilities()``, ``posenc.get_isa()``,
``posenc.set_isa(name)`` (or the POSENC_ISA environment variable),
``posenc.set_num_threads(n)`` / ``posenc.get_num_threads()``.  Memory of
large results: ``posenc.set_result_cache(nbytes)`` / ``posenc.get_result_cache()``.
"""

from __future__ import annotations

import os

try:
    from . import _C
except ImportError as exc:   # a source checkout without the built extension
    raise ImportError(
        "posenc's C extension (posenc._C) is not built here "
        f"({__path__[0]}). Install with `pip install -e .` (or `pip install .` and run from "
        "another directory), or build in place with `python setup.py build_ext --inplace`."
    ) from exc
from . import _checks, _dtypes, _methods, buckets
from ._attention import (ATTENTION_GRAD_TYPES, Attention, attention_dropout_mask, check_attention,
                         check_attention_grad, check_attention_out)
from ._display import check, info
from ._registry import (EXPORTS, GRAD_FIELDS, GRAD_TYPES, METHODS, REGISTRY,
                        attention_backward_doc, attention_doc, backward_doc, forward_doc)
from ._signatures import define

__version__ = "0.1.0"

if _dtypes.BFLOAT16 is not None:      # ml_dtypes registered bfloat16: tell the binding its number
    _C._set_bfloat16(_dtypes.BFLOAT16.num)


def capabilities() -> list:
    """The ISAs this CPU and OS support (and this build has), best last."""
    return list(_C.capabilities())


def get_isa() -> str:
    """The ISA whose kernels run: 'scalar', 'avx2', 'avx512' or 'neon'."""
    return _C.get_isa()


def set_isa(name: str) -> None:
    """Run the kernels of ISA `name` (any case, surrounding spaces ignored, as
    the POSENC_ISA variable); ValueError naming the valid ones if unsupported."""
    if not isinstance(name, str):
        raise TypeError(f"isa must be a str, got {type(name).__name__}")
    if "\x00" in name:
        raise ValueError(f"unknown ISA {name!r}; this CPU supports {capabilities()}")
    _C.set_isa(name.strip().lower())


MAX_THREADS = 4096      # the most threads any source (OMP_NUM_THREADS, set_num_threads) gives
_forked_child = False


def get_num_threads() -> int:
    """Threads every kernel call uses (OpenMP; default: OMP_NUM_THREADS or all cores,
    at most MAX_THREADS; 1 in a process made by fork())."""
    return _C.get_num_threads()


def set_num_threads(threads: int) -> None:
    """Threads every kernel call uses; results are bitwise identical for any count."""
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int, got {type(threads).__name__}")
    if _forked_child and threads > 1:
        raise RuntimeError(
            "posenc runs on one thread in a process made by fork(): GNU OpenMP's thread pool "
            "does not survive fork() (a parallel region would wait forever for threads that "
            "are not there).  Start workers with the 'spawn' or 'forkserver' method for "
            "more threads.")
    _C.set_num_threads(threads)


def _after_fork_in_child() -> None:
    """As PyTorch does: the child of fork() runs the kernels on the calling thread."""
    global _forked_child
    _forked_child = True
    _C.set_num_threads(1)


os.register_at_fork(after_in_child=_after_fork_in_child)
if _C.get_num_threads() > MAX_THREADS:      # OMP_NUM_THREADS=100000: clamp, as the API does
    _C.set_num_threads(MAX_THREADS)


def deberta_hf_scale(d: int) -> float:
    """DeBERTa's scale as HuggingFace computes it: 1 / sqrt(3 d) with the square
    root rounded to float32 (``torch.sqrt(torch.tensor(d, dtype=torch.float) * 3)``).
    posenc's default is the exact 1/sqrt(3 d) (relative difference up to about
    3e-8); pass ``scale=posenc.deberta_hf_scale(d)`` to reproduce HF's numbers."""
    import numpy as np

    return 1.0 / float(np.sqrt(np.float32(3 * d), dtype=np.float32))


def set_result_cache(nbytes: int) -> None:
    """Bytes of freed large results (32 MiB and up) that posenc keeps to back
    the next results (default 256 MiB, at most 4 blocks; the POSENC_RESULT_CACHE
    environment variable, e.g. ``512M``, sets it at import).  A fresh result
    faults its pages in (tens of ms per 100 MB, now and then far more while
    the kernel compacts memory for huge pages); a reused block is already
    faulted in.  0 frees the cache and keeps none."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
    _C.set_result_cache(nbytes)


def get_result_cache() -> int:
    """The result cache's budget in bytes (see set_result_cache)."""
    return _C.result_cache_info()["budget"]


def build_info() -> dict:
    """Compiler, OpenMP version, compiled ISAs of this build."""
    return dict(_C.build_info())


_WHERE = "the C kernels"


def _forward(method: str):
    spec = REGISTRY[method]
    check, configure, run = _checks.check, _methods.configure, _C.forward

    def body(tensors, params, out):
        problem = check(spec, tensors, params, out)
        return run(configure(problem), problem.out)

    return define(method, body, name=method, doc=forward_doc(method, _WHERE))


def _backward(method: str):
    spec = REGISTRY[method]

    def body(G, tensors, params, _out):
        problem = _checks.check(spec, tensors, params, None)
        return _methods.backward(problem, _checks.check_grad(G, problem))

    return define(method, body, name=method + "_backward", form="logits_backward",
                  doc=backward_doc(method, _WHERE))


def _attention(method: str):
    spec = REGISTRY[method]

    def body(tensors, params, attention, out):
        call = check_attention(_checks.check(spec, tensors, params, None), *attention)
        if out is not None:
            check_attention_out(out, call)
        return Attention(*_methods.attention_forward(call))

    return define(method, body, name=method + "_attention", form="attention",
                  doc=attention_doc(method, _WHERE))


def _attention_backward(method: str):
    spec = REGISTRY[method]

    def body(d_out, tensors, params, attention, saved):
        call = check_attention(_checks.check(spec, tensors, params, None), *attention)
        check_attention_grad(d_out, *saved, call)
        return _methods.attention_backward(call, d_out, *saved)

    return define(method, body, name=method + "_attention_backward", form="attention_backward",
                  doc=attention_backward_doc(method, _WHERE))


# The gradient named tuples by their class names (ShawGrads, T5Grads, ...).
_GRAD_NAMES = [GRAD_TYPES[method].__name__ for method in METHODS]
for _method in METHODS:
    globals()[_method] = _forward(_method)
    globals()[_method + "_backward"] = _backward(_method)
    globals()[_method + "_attention"] = _attention(_method)
    globals()[_method + "_attention_backward"] = _attention_backward(_method)
    globals()[GRAD_TYPES[_method].__name__] = GRAD_TYPES[_method]
del _method
globals().update(EXPORTS)      # what the methods bring: posenc.alibi_slopes, posenc.rope_tables, ...

__all__ = list(METHODS) + [m + "_backward" for m in METHODS] + [
    m + suffix for m in METHODS for suffix in ("_attention", "_attention_backward")] + [
    "capabilities", "get_isa", "set_isa", "get_num_threads", "set_num_threads", "build_info",
    "set_result_cache", "get_result_cache",
    "info", "check",
    "deberta_hf_scale", "MAX_THREADS", "attention_dropout_mask", "Attention",
    "buckets", "METHODS", "GRAD_FIELDS", "GRAD_TYPES"] + _GRAD_NAMES + list(EXPORTS)

if os.environ.get("POSENC_ISA"):
    try:
        set_isa(os.environ["POSENC_ISA"])
    except ValueError as _error:
        raise ValueError(f"the POSENC_ISA environment variable: {_error} (unset it for the "
                         f"best one)") from None
