"""posenc.torch.<name>: the differentiable function of every method, made from
the registry (the C kernels on CPU tensors, the native formula elsewhere)."""

from __future__ import annotations

from .._registry import METHODS, REGISTRY, SHAPES
from .._signatures import define
from . import native
from ._common import on_c_kernels, require_tensors
from ._ops import run

__all__ = list(METHODS)

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

    return define(method, body, name=method, out=False, module="posenc.torch",
                  doc=f"{spec.formula}\n{SHAPES}\nComputed by " + _WHERE.format(method=method))


for _method in METHODS:
    globals()[_method] = _logits(_method)
    getattr(native, _method).__doc__ = (f"{REGISTRY[_method].formula}\n{SHAPES}\nComputed by "
                                        "plain torch ops, differentiated by autograd.")
del _method
