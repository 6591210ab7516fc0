"""Shared by the C ops and the native formulas of posenc.torch.

* `to_numpy`: a zero-copy NumPy view of a CPU tensor (any strides; bfloat16
  as an `ml_dtypes.bfloat16` array), or a TypeError naming the argument when
  NumPy has no such dtype; `to_c_array`: the same of a C-contiguous tensor (a
  strided one copied by torch, but q, k, v and d_out, which the kernels read in
  place: ROW_INPUTS); `to_tensor`: back, without a copy;
* `autocast_inputs`: a C-kernel call's float tensors in CPU autocast's dtype,
  and `register_autocast`, the same rule on the custom ops themselves;
* `validate`: the checkers of `posenc._checks` run on stand-in arrays of the
  tensors' shapes and dtypes, so every namespace raises the same exception for
  the same bad input (SPEC §5) whatever the device;
* `bucket_index`: the (n, m) bucket map of a relative method as an int64
  tensor on the tensors' device, built from `posenc.buckets` once per shape;
* the backend switch (`use_native`).
"""

from __future__ import annotations

import collections
import functools
import threading

import numpy as np
import torch

from .. import _checks, _dtypes
from .._attention import ATTENTION_OPTIONS, check_attention
from .._kinds import check_index_range, shape_str
from .._registry import INDEX_TENSORS, REGISTRY, diagonal_map

_NUMPY_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
    torch.uint8: np.uint8, torch.uint16: np.uint16, torch.uint32: np.uint32,
    torch.uint64: np.uint64, torch.bool: np.bool_, torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}
# The low-precision dtypes: the C kernels take them (issue 16: products and
# softmax statistics in float32, results rounded once to the input's dtype;
# bfloat16 needs ml_dtypes), the native formulas on any device.
HALF_DTYPES = (torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
              torch.uint32, torch.uint64)


# ------------------------------------------------------------------ backend

class _Backend(threading.local):
    native = False


_BACKEND = _Backend()


class use_native:
    """Run the torch-native formulas instead of the C kernels on CPU tensors.

    Works as a call (``posenc.torch.use_native(True)`` switches until told
    otherwise) and as a context manager (``with posenc.torch.use_native():``
    restores the previous setting on exit), like ``torch.set_grad_enabled``.
    Tensors on other devices always run the native formulas.  The setting is
    per thread.
    """

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        self.previous = _BACKEND.native
        _BACKEND.native = enabled

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _BACKEND.native = self.previous
        return False


def native_forced() -> bool:
    """True while `use_native(True)` is in force in this thread."""
    return _BACKEND.native


def on_c_kernels(tensors) -> bool:
    """Whether a call with these (checked) tensors runs the C kernels: CPU
    tensors, no `use_native`, no functorch transform (torch.func.grad,
    vmap, jacrev: their wrapped tensors have no storage a kernel could read,
    so the native formula, which torch.func can transform, serves them), and
    not bfloat16 where ml_dtypes is missing."""
    return (tensors[0].is_cpu and not _BACKEND.native
            and not torch._C._are_functorch_transforms_active()
            and (_dtypes.BFLOAT16 is not None or not _runs_bfloat16(tensors[0])))


def _runs_bfloat16(q: torch.Tensor) -> bool:
    """Whether a call on q computes in bfloat16 (q's dtype, or CPU autocast's): without
    ml_dtypes NumPy cannot hold it, so such calls run the native formulas."""
    return q.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                         and torch.get_autocast_dtype("cpu") == torch.bfloat16)


# ------------------------------------------------------------------ dropout seeds

SEED_WRAP = 1 << 64


def dropout_seed(dropout_p: float):
    """A fresh dropout seed from torch's generator (0 without dropout): an int in
    eager mode; under torch.compile an int64 0-dim tensor, which the custom ops take
    as a graph input (an int drawn by ``.item()`` would be data-dependent: a graph
    break, or an error under ``fullgraph=True``)."""
    if not dropout_p:
        return 0
    seed = torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64)
    return seed if torch.compiler.is_compiling() else int(seed) % SEED_WRAP


def seed_value(seed):
    """A seed as the NumPy API takes it: an int in [0, 2**64); an integer 0-dim
    tensor (`dropout_seed` under compile, or a user's) read as int64 mod 2**64."""
    if isinstance(seed, torch.Tensor):
        return int(check_seed_tensor(seed)) % SEED_WRAP
    return seed


def check_seed_tensor(seed: torch.Tensor) -> torch.Tensor:
    """TypeError unless `seed` is an integer 0-dim tensor on the CPU (its shape and
    dtype only: under torch.compile its value is not known)."""
    if seed.dim() or seed.dtype not in INT_DTYPES or seed.device.type != "cpu":
        raise TypeError(f"seed must be an int or an integer 0-dim CPU tensor, got a "
                        f"{seed.dtype} tensor of shape {tuple(seed.shape)} on {seed.device}")
    return seed


# ------------------------------------------------------------------ arguments

def require_tensors(names, values, optional=()) -> None:
    """TypeError unless every value is a tensor (None only where `optional`);
    ValueError on mixed devices."""
    on_cpu = True      # every tensor on the CPU: no device objects built (a decoding step's path)
    for name, value in zip(names, values):
        if value is None:
            if name not in optional:
                raise TypeError(f"{name} is required: a torch.Tensor, got None")
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor, got {type(value).__module__}."
                f"{type(value).__qualname__}")
        on_cpu = on_cpu and value.is_cpu
    if on_cpu:
        return
    device = None
    first = None
    for name, value in zip(names, values):
        if value is None:
            continue
        if device is None:
            device, first = value.device, name
        elif value.device != device:
            raise ValueError(
                f"{name} is on device {value.device} but {first} is on {device}: "
                "the tensors of one call must share one device")


def _numpy_dtype(name: str, dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype the C kernels see for a tensor dtype, or a TypeError naming
    the argument: bfloat16 is `ml_dtypes.bfloat16` (the optional extra ``bf16``)."""
    if dtype in _NUMPY_DTYPES:
        return np.dtype(_NUMPY_DTYPES[dtype])
    if dtype == torch.bfloat16:
        if _dtypes.BFLOAT16 is None:
            raise TypeError(
                f"{name} has dtype torch.bfloat16: the C kernels read it as an "
                f"ml_dtypes.bfloat16 array, which {_dtypes.BFLOAT16_MISSING}; or "
                "posenc.torch.use_native(True) for the torch-native formulas")
        return _dtypes.BFLOAT16
    expected = "an integer dtype" if name in INDEX_TENSORS else f"dtype {_dtypes.TEXT}"
    raise TypeError(f"{name} must have {expected}, got {dtype}")


def to_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor, sharing its memory and strides (a bfloat16
    tensor's bits viewed as int16, then as ml_dtypes.bfloat16)."""
    dtype = _numpy_dtype(name, tensor.dtype)
    tensor = tensor.detach()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(dtype)
    return tensor.numpy()


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """`torch.from_numpy`, an ml_dtypes.bfloat16 array as a torch.bfloat16 tensor
    (both without a copy)."""
    try:
        return torch.from_numpy(array)
    except TypeError:   # ml_dtypes.bfloat16 (its kind 'V': NumPy's own dtypes only above)
        if array.dtype == _dtypes.BFLOAT16:
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        raise


# The inputs the C kernels read in place with any strides but the last axis's (a unit's
# rows at a time: the (B, H, n, d) views of (B, n, H, d) projections HF models hand).
ROW_INPUTS = frozenset({"q", "k", "v", "d_out"})


def _rows_in_place(name: str, tensor: torch.Tensor) -> bool:
    """Whether the C kernels read this 4-D input where it lies (ROW_INPUTS, its last
    axis contiguous, its rows apart: the binding's rule)."""
    return (name in ROW_INPUTS and tensor.dim() == 4 and tensor.stride(2) != 0
            and (tensor.shape[3] <= 1 or tensor.stride(3) == 1))


def to_c_array(name: str, tensor: torch.Tensor) -> np.ndarray:
    """`to_numpy` of the tensor, copied to C-contiguous first when it is not
    (but for q, k, v and d_out whose last axis is contiguous: ROW_INPUTS).

    The C kernels read C-contiguous arrays and copy any other at every call:
    an op that keeps its arrays for its backward copies once here instead
    of once per C call, and torch's copy of a small strided tensor costs less
    than NumPy's.  q, k, v and d_out the kernels read a unit at a time in place
    (a transposed view of the projections in a layer: no copy, and the op keeps
    the view).  The values are the tensor's exactly.
    """
    if tensor.dtype in _NUMPY_DTYPES and (tensor.is_contiguous() or _rows_in_place(name, tensor)):
        try:   # the common case, in one step
            return (tensor.detach() if tensor.requires_grad else tensor).numpy()
        except RuntimeError:                  # a negative or conjugate bit: to_numpy resolves it
            pass
    _numpy_dtype(name, tensor.dtype)      # its TypeError before any copy
    if not tensor.is_contiguous() and not _rows_in_place(name, tensor):
        tensor = tensor.detach().contiguous()
    return to_numpy(name, tensor)


def _stand_in(name: str, tensor: torch.Tensor, half_as: np.dtype | None):
    """A read-only array of the tensor's shape and dtype that owns one element
    (a float16/bfloat16 tensor's dtype replaced by `half_as` when given)."""
    if tensor.dtype in HALF_DTYPES and half_as is not None:
        dtype = half_as
    else:
        dtype = _numpy_dtype(name, tensor.dtype)
    return np.broadcast_to(np.zeros((), dtype=dtype), tuple(int(s) for s in tensor.shape))


# ------------------------------------------------------------------ autocast

_DEVICE_AUTOCAST = hasattr(torch, "get_autocast_dtype")


def cpu_autocast_dtype():
    """CPU autocast's dtype while it is on, else None (torch 2.4 names the device;
    torch 2.1-2.3 has the CPU-only functions)."""
    if _DEVICE_AUTOCAST:
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


def autocast_inputs(values) -> tuple:
    """Under CPU autocast, the floating-point CPU tensors among `values` cast to
    autocast's dtype (``torch.get_autocast_dtype("cpu")``: bfloat16 or float16),
    float64 kept, as autocast's own lower-precision ops (matmul, linear) do; the
    casts are differentiable, so float32 parameters get float32 gradients.
    Other values (ints, bools, None, integer and bool tensors) are unchanged."""
    dtype = cpu_autocast_dtype()
    if dtype is None:
        return tuple(values)
    return tuple(value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point()
                 and value.dtype != torch.float64 and value.device.type == "cpu" else value
                 for value in values)


_AUTOCAST_LIBRARY = torch.library.Library("posenc", "IMPL")


def register_autocast(name: str) -> None:
    """CPU autocast on the custom op ``torch.ops.posenc.<name>`` called directly:
    its float inputs cast by `autocast_inputs`, then the op with autocast off.
    (torch.library.register_autocast casts to one dtype fixed at registration;
    this follows the autocast region's dtype, float16 as well as bfloat16.)"""
    overload = getattr(torch.ops.posenc, name).default

    def kernel(*args):
        args = autocast_inputs(args)
        with torch.autocast("cpu", enabled=False):
            return overload(*args)

    _AUTOCAST_LIBRARY.impl(name, kernel, "AutocastCPU")


def validate(method: str, tensors: dict, params: dict, *, allow_half: bool = False):
    """Run the method's checker on stand-ins of `tensors`; return its Problem.

    Segment ids are replaced by zeros (their range is checked by the caller,
    which has the data).  With `allow_half`, float16/bfloat16 tensors pass
    when every float tensor of the call has that same dtype.
    """
    half_as = None
    if allow_half:
        float_dtypes = {t.dtype for name, t in tensors.items()
                        if t is not None and name not in INDEX_TENSORS}
        if len(float_dtypes) == 1 and next(iter(float_dtypes)) in HALF_DTYPES:
            half_as = np.dtype(np.float32)
    spec = REGISTRY[method]
    arrays = []
    for name in spec.tensors:
        tensor = tensors.get(name)
        if tensor is None:
            arrays.append(None)
        elif name in INDEX_TENSORS and tensor.dtype in INT_DTYPES:
            arrays.append(np.zeros(tuple(tensor.shape), dtype=np.int64))
        else:
            arrays.append(_stand_in(name, tensor, half_as))
    values = tuple(params.get(name, default) for name, default in spec.params)
    return _checks.check(spec, tuple(arrays), values, None)


def validate_attention(method: str, tensors: tuple, params: tuple, attention: tuple) -> None:
    """The checks of `method`'s fused attention on stand-ins, as `validate` does
    for its logits (v takes q's half-precision stand-in dtype when q has one)."""
    spec = REGISTRY[method]
    v, *values = attention
    problem = validate(method, dict(zip(spec.tensors, tensors)),
                       dict(zip((name for name, _ in spec.params), params)), allow_half=True)
    half_as = problem.dtype if tensors[0].dtype in HALF_DTYPES else None
    same = lambda x: half_as if x.dtype == tensors[0].dtype else None    # noqa: E731
    named = dict(zip((name for name, _ in ATTENTION_OPTIONS), values))
    stand_in = {name: _stand_in(name, value, same(value) if name == "sinks" else None)
                if isinstance(value, torch.Tensor) and name != "seed" else value
                for name, value in named.items()}
    if isinstance(named["seed"], torch.Tensor):     # its value is read by the op, not here
        check_seed_tensor(named["seed"])
        stand_in["seed"] = 0
    check_attention(problem, _stand_in("v", v, same(v)), **stand_in)


def check_segment_range(segment_q, segment_k, segment_table) -> None:
    """The ids of CPU segments lie in [0, S) (the C path checks its own).

    On accelerators this would cost a device synchronisation per call, so
    there the ids are not checked (an out-of-range id is a device-side error).
    """
    if segment_table is None:
        return
    S = segment_table.shape[1]
    for name, ids in (("segment_q", segment_q), ("segment_k", segment_k)):
        if ids.device.type != "cpu" or ids.numel() == 0:
            continue
        # (torch has no min/max for uint16..uint64)
        check_index_range(name, ids.detach().numpy(), S, "segment id",
                          f"for segment_table of shape {shape_str(segment_table.shape)}")


# ------------------------------------------------------------------ bucket maps

@functools.lru_cache(maxsize=128)
def _cpu_index(kind: str, params: tuple, n: int, m: int) -> torch.Tensor:
    """(n, m) int64: index[i, j] = bucket(j - (query_offset + i)), mapped once per
    diagonal; the last of `params` is the query offset."""
    per_diagonal = diagonal_map(kind, params[:-1], n, m, params[-1])
    # offset j - i lives at position (j - i) + (n - 1) of per_diagonal
    where = np.arange(m, dtype=np.int64)[None, :] - np.arange(n, dtype=np.int64)[:, None] + (n - 1)
    return torch.from_numpy(per_diagonal[where] if n and m else np.zeros((n, m), np.int64))


_DEVICE_INDEX: collections.OrderedDict = collections.OrderedDict()
_DEVICE_INDEX_SIZE = 128
_DEVICE_INDEX_LOCK = threading.Lock()


def _device_index(kind: str, params: tuple, n: int, m: int, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return _cpu_index(kind, params, n, m)
    key = (kind, params, n, m, device)
    with _DEVICE_INDEX_LOCK:
        index = _DEVICE_INDEX.get(key)
        if index is not None:
            _DEVICE_INDEX.move_to_end(key)
            return index
    index = _cpu_index(kind, params, n, m).to(device)
    with _DEVICE_INDEX_LOCK:
        _DEVICE_INDEX[key] = index
        while len(_DEVICE_INDEX) > _DEVICE_INDEX_SIZE:
            _DEVICE_INDEX.popitem(last=False)
    return index


# Inside torch.compile the index comes from an opaque op (the bucket maps are
# NumPy, which dynamo cannot trace); with dynamic shapes n and m are symbols.
@torch.library.custom_op("posenc::bucket_index", mutates_args=(),
                         schema="(Tensor like, str kind, int[] params, SymInt n, SymInt m) -> Tensor")
def _bucket_index_op(like, kind, params, n, m):
    # a fresh tensor: a compiled graph may reuse the buffers its ops return
    return _device_index(kind, tuple(params), n, m, like.device).clone()


@_bucket_index_op.register_fake
def _(like, kind, params, n, m):
    return like.new_empty((n, m), dtype=torch.int64)


def bucket_index(kind: str, params: tuple, n: int, m: int, like: torch.Tensor,
                 query_offset: int = 0) -> torch.Tensor:
    """(n, m) int64 table rows on like.device; `params` are ints (bools as 0/1)."""
    params = tuple(params) + (query_offset,)
    if torch.compiler.is_compiling():
        return torch.ops.posenc.bucket_index(like, kind, list(params), n, m)
    return _device_index(kind, tuple(params), int(n), int(m), like.device)
