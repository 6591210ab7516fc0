"""posenc.torch.<name>_attention: the fused attention of SPEC §6 in autograd.

CPU tensors run the fused C kernels (posenc.<name>_attention and its
backward: no (B, H, n, m) tensor in either direction); tensors on other
devices, or under `use_native`, or inside a torch.func transform, run the
torch-native formula: the method's native logits, the mask, a softmax, the
same counter-based dropout (the keep decisions of
`posenc.attention_dropout_mask`, so both paths drop the same entries) and a
matmul.  Both return `posenc.Attention(out, lse)`.
"""

from __future__ import annotations

from .._registry import METHODS, REGISTRY, SHAPES, attention_doc
from .._signatures import define
from . import native
from . import _fused_ops
from ._common import on_c_kernels, require_tensors

__all__ = [method + "_attention" for method in METHODS]

# v and the attention's optional tensor arguments, and where they sit in `attention`
_TENSOR_OPTIONS = _fused_ops.ATTENTION_TENSORS
_TENSOR_AT = tuple(at for at, _ in _fused_ops._ATTENTION_TENSORS)


_WHERE = ("the fused C kernels on CPU tensors, the torch-native formula (logits, mask,\n"
          "softmax, the same dropout, matmul) on other devices or under use_native().\n"
          "Differentiable in q, k, v and every float parameter.")


def _fused(method: str):
    spec = REGISTRY[method]

    names, optional = spec.tensors + _TENSOR_OPTIONS, spec.optional | set(_TENSOR_OPTIONS[1:])

    def body(tensors, params, attention, _out):
        require_tensors(names, tensors + tuple([attention[at] for at in _TENSOR_AT]), optional)
        if on_c_kernels(tensors):
            return _fused_ops.fused_attention(method, tensors, params, attention)
        return native.attention(method, tensors, params, attention)

    return define(method, body, name=method + "_attention", form="attention", out=False,
                  module="posenc.torch", doc=attention_doc(method, _WHERE).replace(
                      "Computed by", SHAPES + "\nComputed by"))


for _method in METHODS:
    globals()[_method + "_attention"] = _fused(_method)
del _method
