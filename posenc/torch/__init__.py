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


from .._registry import METHODS, REGISTRY, SHAPES
from .._signatures import define
from . import native
from ._common import native_forced, on_c_kernels, require_tensors, use_native
from ._ops import run

__all__ = list(METHODS) + ["use_native", "native_forced", "native", "nn"]

_WHERE = ("the C kernels on CPU tensors (torch.ops.posenc.{method}), the torch-native\n"
          "formula posenc.torch.native.{method} on other devices or under use_native().\n"
          "Differentiable in every float input; segment ids are integer tensors.")


def _logits(method: str):
    """posenc.torch.<method>: the C kernels on CPU tensors, else the native formula."""
    spec = REGISTRY[method]
    native_formula = getattr(native, method)
    param_names = tuple(name for name, _ in spec.params)

    def body(tensors, params, _out):
        require_tensors(spec.tensors, tensors, spec.optional)
        if on_c_kernels(tensors):
            return run(method, tensors, params)
        return native_formula(**dict(zip(spec.tensors, tensors)), **dict(zip(param_names, params)))

    return define(method, body, name=method, out=False, module=__name__,
                  doc=f"{spec.formula}\n{SHAPES}\nComputed by " + _WHERE.format(method=method))


for _method in METHODS:
    globals()[_method] = _logits(_method)
    getattr(native, _method).__doc__ = (f"{REGISTRY[_method].formula}\n{SHAPES}\nComputed by "
                                        "plain torch ops, differentiated by autograd.")
del _method

from . import nn  # noqa: E402  (nn uses the functions above)
