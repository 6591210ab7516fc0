"""Test helpers: check your own attention-logits code against posenc.reference.

For a kernel, a PyTorch module or a port of one of posenc's methods, these
helpers answer "does it compute what the paper's formula says?" with the
tolerances of ``python -m posenc check`` (docs/validation.md):

* :func:`random_inputs` -- random inputs of a method (``args, kwargs``), the
  configurations posenc's own checks use (clipping and log buckets reached,
  segments, TUPE's bias and theta, ...);
* :func:`assert_logits_close` -- your logits against ``posenc.reference.<m>``;
* :func:`assert_grads_close` -- your gradients (a NumPy backward, or a
  differentiable torch function) against ``posenc.reference.<m>_backward``;
* :func:`assert_attention_close` -- your attention output (and lse) against
  ``posenc.reference.<m>_attention`` (SPEC §6: masks, dropout, query_offset),
  the float32 bound carried through the softmax (docs/validation.md).

The tolerance follows the dtype: float64 passes when the largest error is at
most ``1e-12`` of the largest reference logit (normwise); float32 when every
entry is within ``E32 = (depth + 8) eps32 M``, where ``M`` is the method
evaluated on the absolute values of its inputs and ``depth`` the length of
the longest sum (``d + d_p`` for logits, ``n + m + d + d_p`` for gradients);
bfloat16 and float16 (float32 arithmetic, one rounding at the end) when every
entry is within ``u |reference| + (1 + u) E32`` with ``u = 2^-8`` and
``2^-11`` (``+ 2^-25`` for float16's subnormals; a float16 ``+-inf`` is right
where ``|reference| + E32`` reaches 65520); for bfloat16, the gradients and
the attention's out add ``2^-8 M`` to E32: the operands a kernel computes
itself (the attention's probabilities and dS, sums of G) may be rounded to
bfloat16 once before a GEMM, as posenc's vdpbf16ps GEMM and the usual
bfloat16 attention kernels do.  The reference is always the
float64 one on the given inputs.  A failure
raises AssertionError naming the worst entry, both values, its error and the
tolerance.  NumPy arrays and torch tensors (any device: copied to the CPU)
are accepted; torch is never imported by this module.

With pytest, the fixtures ``posenc_isa`` and ``posenc_inputs`` of the plugin
``posenc._pytest_plugin`` (registered by the package's ``pytest11`` entry
point) run a test on every ISA of the CPU and draw these inputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys

import numpy as np

from . import _dtypes, reference
from ._check import (F64_RTOL, _as64, attention_bounds, bound, compare, grad_magnitudes,
                     logit_operands_rounded, magnitude, magnitude_coefficient, overflow_allowed,
                     within)
from ._examples import dense_rank, float_inputs, key_count, make_inputs, with_inputs
from ._registry import GRAD_FIELDS, METHODS

__all__ = ["Inputs", "random_inputs", "assert_logits_close", "assert_grads_close",
           "assert_attention_close"]

_FLOATS = _dtypes.FLOAT_DTYPES
_OPTIONS = tuple(name for name in inspect.signature(make_inputs).parameters
                 if name not in ("method", "B", "H", "n", "m", "d", "dtype", "rng"))


@dataclasses.dataclass(frozen=True, eq=False)
class Inputs:
    """Inputs of one call of ``method``: ``fn(*inputs.args, **inputs.kwargs)``.

    Unpacks as ``args, kwargs = inputs``; :meth:`call` applies a function,
    :meth:`torch` gives the same values as torch tensors.
    """

    method: str
    args: tuple
    kwargs: dict

    def __iter__(self):
        return iter((self.args, self.kwargs))

    def call(self, fn):
        """``fn(*args, **kwargs)``: e.g. ``inputs.call(posenc.t5)``."""
        return fn(*self.args, **self.kwargs)

    @property
    def floats(self) -> dict:
        """The float (differentiable) inputs by argument name."""
        return float_inputs(self.method, self.args, self.kwargs)

    def torch(self, device=None, requires_grad: bool = False) -> Inputs:
        """The same inputs as torch tensors (on ``device``; float inputs as
        leaves that require grad when asked)."""
        import torch

        def tensor(value, grad):
            if not isinstance(value, np.ndarray):
                return value
            return torch.tensor(value, device=device, requires_grad=grad)

        floats = self.floats
        args = tuple(tensor(a, requires_grad) for a in self.args)
        kwargs = {key: tensor(value, requires_grad and key in floats)
                  for key, value in self.kwargs.items()}
        return Inputs(self.method, args, kwargs)


def random_inputs(method: str, B: int = 2, H: int = 3, n: int = 7, m: int | None = None,
                  d: int = 4, dtype=np.float64, seed=0, **options) -> Inputs:
    """Random inputs of ``posenc.<method>``: an :class:`Inputs` (``args, kwargs``).

    ``q (B, H, n, d)``, ``k (B, H, m, d)`` (``m`` by default 5, or ``n`` for a
    method whose queries are among the keys: ``fox``) and every parameter of the method
    standard normal (the tables of the product methods around 1), drawn from
    ``numpy.random.default_rng(seed)`` (an int, a sequence of ints or a
    Generator).  ``dtype`` is float32, float64, bfloat16 (``ml_dtypes.bfloat16``)
    or float16, for every float input.
    The optional terms are given (TUPE's ``bias`` and ``theta``, DIET's
    segments, DeBERTa's log buckets) and the sizes reach the clipping.
    ``options``: ``shared`` (head axis 1 for every positional parameter),
    ``max_distance`` (4), ``segments`` (3; 0 for none), ``theta``, ``bias``,
    ``log_buckets`` (True), ``d_p`` (the rank of TUPE's and DIET-ABS's
    factors), ``num_buckets`` (16) and ``t5_max_distance`` (40) of T5/TUPE,
    ``att_span`` (8) of DeBERTa.
    """
    _check_method(method)
    if np.dtype(dtype) not in _FLOATS:
        raise TypeError(f"dtype must be {_dtypes.TEXT}, got {np.dtype(dtype)}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; expected {', '.join(_OPTIONS)}")
    if m is None:
        m = key_count(method, n, 5)
    args, kwargs = make_inputs(method, B, H, n, m, d, dtype=dtype,
                               rng=np.random.default_rng(seed), **options)
    return Inputs(method, tuple(args), kwargs)


# ------------------------------------------------------------------ conversions

def _check_method(method) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _as_array(value, what: str) -> np.ndarray:
    """A NumPy array of `value` (a torch tensor is detached and copied to the CPU;
    torch.bfloat16 as ml_dtypes.bfloat16, the same bits)."""
    if _is_tensor(value):
        value = value.detach().cpu().resolve_conj().resolve_neg()
        if str(value.dtype) == "torch.bfloat16":
            if _dtypes.BFLOAT16 is None:
                raise TypeError(f"{what}: torch.bfloat16 as NumPy {_dtypes.BFLOAT16_MISSING}")
            import torch

            return value.view(torch.int16).numpy().view(_dtypes.BFLOAT16)
        value = value.numpy()
    return np.asarray(value)


def _numpy_call(method: str, args, kwargs) -> tuple:
    """(args, kwargs) with every tensor as a NumPy array, `out=` dropped."""
    args = [_as_array(a, "argument") if _is_tensor(a) or isinstance(a, np.ndarray) else a
            for a in args]
    kwargs = {key: _as_array(value, key) if _is_tensor(value) else value
              for key, value in kwargs.items() if key != "out"}
    floats = {name: _as_array(value, name)
              for name, value in float_inputs(method, args, kwargs).items()}
    return with_inputs(method, args, kwargs, floats)


def _tolerance_dtype(method: str, args, kwargs, *results) -> np.dtype:
    """The least precise float dtype of the inputs and results: bfloat16, float16,
    float32, float64 in that order."""
    dtypes = [v.dtype for v in float_inputs(method, args, kwargs).values()]
    dtypes += [r.dtype for r in results]
    for dtype in dtypes:
        if dtype.kind == "f" and dtype not in _FLOATS:
            raise TypeError(f"{dtype} is not supported; the tolerances are derived for "
                            f"{_dtypes.TEXT} (docs/validation.md)")
    for coarse in (_dtypes.BFLOAT16, _dtypes.FLOAT16, _dtypes.FLOAT32):
        if coarse is not None and coarse in dtypes:
            return coarse
    return np.dtype(np.float64)


def _depth(method: str, args, kwargs, grads: bool) -> tuple:
    """(depth, how it was counted) of the float32 bound (docs/validation.md)."""
    q, k = (float_inputs(method, args, kwargs)[name] for name in ("q", "k"))
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    d_p = dense_rank(method, args, kwargs)
    if grads:
        return n + m + d + d_p, f"n + m + d + d_p = {n} + {m} + {d} + {d_p}"
    return d + d_p, f"d + d_p = {d} + {d_p}"


# ------------------------------------------------------------------ comparison

def _assert_close(actual: np.ndarray, expected: np.ndarray, magnitude, depth: tuple,
                  dtype: np.dtype, *, what: str, where, against: str,
                  rounded_operands: bool = False) -> None:
    """AssertionError naming the worst entry (`where(index)`) unless `actual`
    is within the tolerance of `expected` (posenc._check.compare decides;
    `rounded_operands` as there: True for gradients)."""
    __tracebackhide__ = True      # pytest shows the caller's line, not this one
    if actual.shape != expected.shape:
        raise AssertionError(f"{what} {against} in shape: {actual.shape} instead of "
                             f"{expected.shape}")
    if expected.size == 0:
        return
    raw = actual.astype(np.float64)
    # NaN and Inf propagate as IEEE says (SPEC §5): equal non-finite entries agree;
    # a float16 +-inf where the reference is finite is compare()'s (overflow near 65520)
    special = ~(np.isfinite(raw) & np.isfinite(expected))
    if dtype == _dtypes.FLOAT16:
        special &= ~(np.isinf(raw) & np.isfinite(expected))
    bad_special = special & ~((raw == expected) | (np.isnan(raw) & np.isnan(expected)))
    got, wanted = np.where(special, 0.0, raw), np.where(special, 0.0, expected)
    if magnitude is not None:
        magnitude = np.where(special, 0.0, magnitude)
    _, _, ok = compare(got, wanted, magnitude, depth[0], dtype, rounded_operands=rounded_operands)
    if ok and not bad_special.any():
        return
    coefficient = magnitude_coefficient(depth[0], dtype, rounded_operands)
    bound32 = None if magnitude is None else coefficient * magnitude
    with np.errstate(invalid="ignore"):
        error = np.where(bad_special, np.inf, np.abs(got - wanted))
    if dtype == _dtypes.FLOAT16:
        error = np.where(overflow_allowed(got, wanted, bound32, dtype), 0.0, error)
    if dtype == np.float64:
        largest = float(np.abs(wanted).max())
        tolerance = np.full(error.shape, F64_RTOL * (largest or 1.0))   # as compare()
        rule = f"float64, normwise: {F64_RTOL:g} x max|reference| = {F64_RTOL:g} x {largest:.6g}"
    elif dtype == np.float32:
        tolerance = bound(wanted, bound32, dtype)
        rule = (f"float32, element-wise: (depth + 8) eps32 x M, depth = {depth[1]}, "
                "M = the method on |inputs|")
    else:
        tolerance = bound(wanted, bound32, dtype)
        operands = (f" + 2^{int(np.log2(_dtypes.operand_roundoff(dtype)))} (operands rounded)"
                    if rounded_operands and _dtypes.operand_roundoff(dtype) else "")
        rule = (f"{dtype}, element-wise: u |reference| + (1 + u) E32, u = "
                f"2^{int(np.log2(_dtypes.UNIT_ROUNDOFF[dtype.name]))}, E32 = ((depth + 8) eps32"
                f"{operands}) x M, depth = {depth[1]}, M = the method on |inputs|")
    outside = error > tolerance
    index = np.unravel_index(np.argmax(error / tolerance), error.shape)
    raise AssertionError(
        f"{what} {against} at {where(tuple(int(i) for i in index))}: "
        f"actual {raw[index]:.10g}, reference {expected[index]:.10g}, "
        f"error {error[index]:.3g} > tolerance {tolerance[index]:.3g} ({rule}); "
        f"{int(outside.sum())} of {outside.size} entries outside the tolerance")


def assert_logits_close(actual, method: str, *args, **kwargs) -> None:
    """Assert that ``actual`` equals ``posenc.reference.<method>(*args, **kwargs)``.

    ``actual``: your logits ``(B, H, n, m)`` for these inputs, a NumPy array or
    a torch tensor (any device).  ``args``, ``kwargs``: the inputs, as
    ``posenc.<method>`` takes them (arrays or tensors; ``out=`` is ignored).
    The reference is computed in float64 from the very inputs; the tolerance
    is float32's when the inputs or ``actual`` are float32, else float64's
    (module docstring).  AssertionError names the worst ``(b, h, i, j)``, both
    values, the error, the tolerance and how many entries are outside it.
    """
    __tracebackhide__ = True
    _check_method(method)
    args, kwargs = _numpy_call(method, args, kwargs)
    got = _as_array(actual, "actual")
    dtype = _tolerance_dtype(method, args, kwargs, got)
    args64, kwargs64 = _as64(method, args, kwargs)
    formula = getattr(reference, method)
    expected = formula(*args64, **kwargs64)
    magnitudes = None
    if dtype != np.float64:
        magnitudes = magnitude(method, args64, kwargs64)
    _assert_close(got, expected, magnitudes, _depth(method, args, kwargs, grads=False), dtype,
                  what=f"logits of {method} ({dtype}) differ from",
                  where="(b, h, i, j) = {}".format, against=f"posenc.reference.{method}",
                  rounded_operands=logit_operands_rounded(method))


def seed_from_env() -> int:
    """POSENC_TEST_SEED (default 0) as an int; a ValueError naming the variable
    unless it is a non-negative integer."""
    text = os.environ.get("POSENC_TEST_SEED", "0")
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise ValueError(f"POSENC_TEST_SEED must be a non-negative integer, got {text!r}")
    return seed


def _upstream(shape, dtype) -> np.ndarray:
    """G = dL/dA, standard normal from POSENC_TEST_SEED (default 0); the second
    word keeps it apart from inputs drawn with random_inputs(seed=that seed)."""
    return np.random.default_rng([seed_from_env(), 1]).standard_normal(shape).astype(dtype)


def _field(result, name: str, position: int):
    """Gradient `name` of a backward's result: a named tuple, any object with
    that attribute, a dict, or a plain tuple in the fields' order."""
    if isinstance(result, dict):
        return result.get(name)
    if hasattr(result, name):
        return getattr(result, name)
    if isinstance(result, (tuple, list)) and not hasattr(result, "_fields"):
        return result[position] if position < len(result) else None
    return None


def _torch_grads(fn, method: str, args, kwargs, G: np.ndarray) -> dict:
    """Gradients of sum(G * fn(...)) w.r.t. the float inputs, through autograd."""
    import torch

    leaves = {name: value.detach().clone().requires_grad_(True)
              for name, value in float_inputs(method, args, kwargs).items()}
    call_args, call_kwargs = with_inputs(method, args, kwargs, leaves)
    out = fn(*call_args, **call_kwargs)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        what = "a tensor without a gradient" if isinstance(out, torch.Tensor) else \
            f"a {type(out).__name__}"
        raise AssertionError(f"fn returned {what}: with tensor inputs it must return the "
                             "logits as a tensor that autograd can differentiate")
    upstream = torch.as_tensor(G, dtype=out.dtype, device=out.device)
    if tuple(out.shape) != G.shape:
        raise AssertionError(f"fn returned logits of shape {tuple(out.shape)}, "
                             f"posenc.reference.{method} {G.shape}")
    grads = torch.autograd.grad(out, list(leaves.values()), upstream, allow_unused=True)
    return dict(zip(leaves, grads))


def assert_grads_close(fn, method: str, *args, **kwargs) -> None:
    """Assert that ``fn``'s gradients equal ``posenc.reference.<method>_backward``'s.

    Two kinds of ``fn``, told apart by the inputs:

    * NumPy inputs: ``fn(G, *args, **kwargs)`` is a backward, like
      ``posenc.<method>_backward``; it returns the gradients by field name (a
      named tuple, an object with those attributes, a dict, or a plain tuple in
      the order of ``posenc.GRAD_FIELDS[method]``).
    * torch tensors (any device): ``fn(*args, **kwargs)`` returns the logits,
      differentiably, like ``posenc.torch.<method>``; the float inputs are
      given as fresh leaves that require grad and the gradients come from
      autograd.

    ``G = dL/dA`` is standard normal, seeded from ``POSENC_TEST_SEED``
    (default 0).  Every gradient of an input that was given is compared
    (a field of an input that was not given is ignored), with the tolerance
    of :func:`assert_logits_close` for depth ``n + m + d + d_p``; an
    AssertionError names the field, the worst index, both values, the error
    and the tolerance.
    """
    __tracebackhide__ = True
    _check_method(method)
    torch_mode = any(_is_tensor(v) for v in float_inputs(method, args, kwargs).values())
    numpy_args, numpy_kwargs = _numpy_call(method, args, kwargs)
    dtype = _tolerance_dtype(method, numpy_args, numpy_kwargs)
    args64, kwargs64 = _as64(method, numpy_args, numpy_kwargs)
    formula = getattr(reference, method + "_backward")
    logits_shape = getattr(reference, method)(*args64, **kwargs64).shape
    G = _upstream(logits_shape, dtype)
    if torch_mode:
        result = _torch_grads(fn, method, args, kwargs, G)
    else:
        result = fn(G, *numpy_args, **numpy_kwargs)
    expected = formula(G.astype(np.float64), *args64, **kwargs64)
    magnitudes = grad_magnitudes(method, np.abs(G.astype(np.float64)), args64, kwargs64)
    depth = _depth(method, numpy_args, numpy_kwargs, grads=True)
    for position, name in enumerate(GRAD_FIELDS[method]):
        want = getattr(expected, name)
        if want is None:                 # that input was not given
            continue
        got = _field(result, name, position)
        if got is None:
            if torch_mode and not np.any(want):   # autograd: unused and truly zero
                continue
            raise AssertionError(f"fn gave no gradient for {name!r} of {method} "
                                 f"(posenc.reference.{method}_backward has one, shape {want.shape})")
        _assert_close(_as_array(got, name), want, magnitudes[name], depth, dtype,
                      what=f"gradient {name!r} of {method} ({dtype}) differs from",
                      where=lambda index: f"{name}[{', '.join(map(str, index))}]",
                      against=f"posenc.reference.{method}_backward", rounded_operands=True)


_ATTENTION_KEYWORDS = ("causal", "key_padding_mask", "query_offset", "dropout_p", "seed")


def assert_attention_close(actual, method: str, q, k, v, *args, **kwargs) -> None:
    """Assert that ``actual`` equals ``posenc.reference.<method>_attention(q, k, v,
    *args, **kwargs)``: the attention output ``(B, H, n, dv)``, or an
    ``(out, lse)`` pair (a ``posenc.Attention``) to check lse too.

    The inputs are as ``posenc.<method>_attention`` takes them (arrays or
    tensors; ``causal``, ``key_padding_mask``, ``query_offset``, ``dropout_p``,
    ``seed``).  float64: normwise ``1e-12``; float32: every entry within the
    logits' bound carried through the softmax (docs/validation.md); bfloat16
    and float16: that bound and one rounding of out (lse is float32).  A
    fully masked row must be 0 with lse ``-inf``.  AssertionError names the
    worst ``(b, h, i, d)``, both values, the error and its bound.
    """
    __tracebackhide__ = True
    _check_method(method)
    options = {name: kwargs.pop(name) for name in _ATTENTION_KEYWORDS if name in kwargs}
    if options.get("key_padding_mask") is not None:
        options["key_padding_mask"] = _as_array(options["key_padding_mask"], "key_padding_mask")
    args, kwargs = _numpy_call(method, (q, k) + args, kwargs)
    v = _as_array(v, "v")
    pair = isinstance(actual, tuple) and len(actual) == 2
    got = _as_array(actual[0] if pair else actual, "actual")
    dtype = _tolerance_dtype(method, args, kwargs, got)
    args64, kwargs64 = _as64(method, args, kwargs)
    ref, out_bound, lse_bound, _ = attention_bounds(method, args64, kwargs64,
                                                    v.astype(np.float64), options, dtype=dtype)
    checks = [("out", got, ref.out, out_bound, dtype)]
    if pair:
        checks.append(("lse", _as_array(actual[1], "lse"), ref.lse, lse_bound,
                       _dtypes.lse_dtype(dtype)))
    for name, value, expected, bound32, value_dtype in checks:
        if value.shape != expected.shape:
            raise AssertionError(f"attention {name} of {method} has shape {value.shape}, "
                                 f"posenc.reference.{method}_attention {expected.shape}")
        _, measure, ok = within(value, expected, bound32, value_dtype)
        if ok:
            continue
        tolerance = bound(expected, bound32, value_dtype)
        value = value.astype(np.float64)
        with np.errstate(invalid="ignore"):
            error = np.abs(np.nan_to_num(value - expected, nan=np.inf, posinf=np.inf,
                                         neginf=np.inf))
        error = np.where(np.isneginf(expected) & np.isneginf(value), 0.0, error)
        if np.dtype(value_dtype) == np.float64:     # within()'s normwise measure
            index = np.unravel_index(np.argmax(error), error.shape)
            rule = (f"normwise relative error {measure:.3g} > {F64_RTOL:g} (the largest error "
                    f"over max(|reference|, the bound's magnitude))")
        else:
            index = np.unravel_index(np.argmax(error / tolerance), error.shape)
            rule = (f"error {error[index]:.3g} > bound {tolerance[index]:.3g} (the logits' "
                    f"bound carried through the softmax; error / bound {measure:.3g})")
        raise AssertionError(
            f"attention {name} of {method} ({value_dtype}) differs from "
            f"posenc.reference.{method}_attention at {tuple(int(i) for i in index)}: actual "
            f"{value[index]:.10g}, reference {expected[index]:.10g}; {rule}")
