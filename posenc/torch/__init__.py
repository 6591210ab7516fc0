"""posenc for PyTorch: every method of SPEC §3 as a differentiable tensor function.

``posenc.torch.<name>(q, k, ...)`` takes the same arguments as ``posenc.<name>``
(tensors instead of arrays, integer tensors for segment ids, no ``out=``) and
returns the logits ``A`` (B, H, n, m), differentiable in every float input.

* CPU tensors run the C kernels through the custom ops ``torch.ops.posenc.<name>``
  (``torch.library.custom_op`` + ``register_autograd`` + ``register_fake``): the
  tensors are viewed as NumPy arrays without a copy, and the backward is one C
  call computing only the gradients autograd needs.  The ops work eagerly and
  inside ``torch.compile(fullgraph=True)``.
* Tensors on other devices (CUDA, MPS, ...) run the torch-native formulas of
  `posenc.torch.native` (plain torch ops, differentiated by autograd).
  ``posenc.torch.use_native(True)`` (or ``with posenc.torch.use_native():``)
  sends CPU tensors there too.

Ready-made modules (T5 bias, Shaw, M2, M4, M4M, DeBERTa, TUPE, DIET, segment
attention, and a full self-attention layer) are in `posenc.torch.nn`.
"""

from __future__ import annotations

import torch

from .. import METHODS
from .._docstrings import _SHAPES, FORMULAS
from . import native
from ._common import native_forced, require_tensors, use_native
from ._ops import check_params, run, tensor_names

__all__ = list(METHODS) + ["use_native", "native_forced", "native", "nn"]


def _on_c_kernels(method: str, tensors: tuple, params: tuple) -> bool:
    """True when this call runs the C kernels: CPU tensors, native not forced.

    The C op checks its arrays itself; its parameters are checked here, so a
    wrong type is the checker's TypeError rather than the schema's RuntimeError.
    """
    require_tensors(tensor_names(method), tensors)
    if tensors[0].device.type != "cpu" or native_forced():
        return False
    if not torch.compiler.is_compiling():
        check_params(method, params)
    return True


def content(q, k, *, scale=None):
    tensors, params = (q, k), (scale,)
    if _on_c_kernels("content", tensors, params):
        return run("content", tensors, params)
    return native.content(q, k, scale=scale)


def shaw(q, k, rel_k, *, max_distance, scale=None):
    tensors, params = (q, k, rel_k), (max_distance, scale)
    if _on_c_kernels("shaw", tensors, params):
        return run("shaw", tensors, params)
    return native.shaw(q, k, rel_k, max_distance=max_distance, scale=scale)


def t5(q, k, bias, *, num_buckets=32, max_distance=128, bidirectional=True, scale=1.0):
    tensors, params = (q, k, bias), (num_buckets, max_distance, bidirectional, scale)
    if _on_c_kernels("t5", tensors, params):
        return run("t5", tensors, params)
    return native.t5(q, k, bias, num_buckets=num_buckets, max_distance=max_distance,
                     bidirectional=bidirectional, scale=scale)


def m2(q, k, rel, *, max_distance, scale=None):
    tensors, params = (q, k, rel), (max_distance, scale)
    if _on_c_kernels("m2", tensors, params):
        return run("m2", tensors, params)
    return native.m2(q, k, rel, max_distance=max_distance, scale=scale)


def m4(q, k, rel_k, *, max_distance, scale=None):
    tensors, params = (q, k, rel_k), (max_distance, scale)
    if _on_c_kernels("m4", tensors, params):
        return run("m4", tensors, params)
    return native.m4(q, k, rel_k, max_distance=max_distance, scale=scale)


def m4m(q, k, rel_k, *, max_distance, scale=None):
    tensors, params = (q, k, rel_k), (max_distance, scale)
    if _on_c_kernels("m4m", tensors, params):
        return run("m4m", tensors, params)
    return native.m4m(q, k, rel_k, max_distance=max_distance, scale=scale)


def deberta(q, k, pos_key, pos_query, *, att_span, position_buckets=-1,
            max_relative_positions=-1, scale=None):
    tensors = (q, k, pos_key, pos_query)
    params = (att_span, position_buckets, max_relative_positions, scale)
    if _on_c_kernels("deberta", tensors, params):
        return run("deberta", tensors, params)
    return native.deberta(q, k, pos_key, pos_query, att_span=att_span,
                          position_buckets=position_buckets,
                          max_relative_positions=max_relative_positions, scale=scale)


def tupe(q, k, pos_q, pos_k, *, bias=None, theta=None, num_buckets=32, max_distance=128,
         bidirectional=True, scale=None):
    tensors = (q, k, pos_q, pos_k, bias, theta)
    params = (num_buckets, max_distance, bidirectional, scale)
    if _on_c_kernels("tupe", tensors, params):
        return run("tupe", tensors, params)
    return native.tupe(q, k, pos_q, pos_k, bias=bias, theta=theta, num_buckets=num_buckets,
                       max_distance=max_distance, bidirectional=bidirectional, scale=scale)


def diet_abs(q, k, pos_q, pos_k, *, segment_q=None, segment_k=None, segment_table=None,
             scale=None):
    tensors, params = (q, k, pos_q, pos_k, segment_q, segment_k, segment_table), (scale,)
    if _on_c_kernels("diet_abs", tensors, params):
        return run("diet_abs", tensors, params)
    return native.diet_abs(q, k, pos_q, pos_k, segment_q=segment_q, segment_k=segment_k,
                           segment_table=segment_table, scale=scale)


def diet_rel(q, k, rel, *, max_distance, segment_q=None, segment_k=None, segment_table=None,
             scale=None):
    tensors = (q, k, rel, segment_q, segment_k, segment_table)
    params = (max_distance, scale)
    if _on_c_kernels("diet_rel", tensors, params):
        return run("diet_rel", tensors, params)
    return native.diet_rel(q, k, rel, max_distance=max_distance, segment_q=segment_q,
                           segment_k=segment_k, segment_table=segment_table, scale=scale)


_WHERE = ("the C kernels on CPU tensors (torch.ops.posenc.{method}), the torch-native\n"
          "formula posenc.torch.native.{method} on other devices or under use_native().\n"
          "Differentiable in every float input; segment ids are integer tensors.")

for _method in METHODS:
    globals()[_method].__doc__ = (f"{FORMULAS[_method]}\n{_SHAPES}\nComputed by "
                                  + _WHERE.format(method=_method))
    native.__dict__[_method].__doc__ = (f"{FORMULAS[_method]}\n{_SHAPES}\nComputed by "
                                        "plain torch ops, differentiated by autograd.")
del _method

from . import nn
