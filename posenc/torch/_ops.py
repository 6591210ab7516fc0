"""The C kernels as torch custom ops: ``torch.ops.posenc.<name>`` and ``<name>_backward``.

One forward op and one backward op per method of SPEC §3, built from one table
(the method's tensor arguments and parameters), each with

* a CPU kernel that views the tensors as NumPy arrays (no copy, any strides),
  validates them with the checker of `posenc._checks` and calls the C engine
  through `posenc._methods`; the backward computes only the gradients asked for
  (a bit mask from ``ctx.needs_input_grad``), in one C call;
* a fake kernel (shapes only), so ``torch.compile(fullgraph=True)`` traces the
  ops without a graph break;
* for the forward, an autograd formula (``register_autograd``) that calls the
  backward op.  The backward op itself has no autograd formula: the ops are
  differentiable once, not twice.

The ops are CPU-only; `posenc.torch` sends other devices to `posenc.torch.native`.
"""

from __future__ import annotations

import torch

from .. import _checks, _methods
from .._grads import GRAD_FIELDS
from ._common import to_numpy, validate

# Tensor arguments of each op, in signature order; "?" marks an optional one.
TENSORS = {
    "content": ("q", "k"),
    "shaw": ("q", "k", "rel_k"),
    "t5": ("q", "k", "bias"),
    "m2": ("q", "k", "rel"),
    "m4": ("q", "k", "rel_k"),
    "m4m": ("q", "k", "rel_k"),
    "deberta": ("q", "k", "pos_key", "pos_query"),
    "tupe": ("q", "k", "pos_q", "pos_k", "bias?", "theta?"),
    "diet_abs": ("q", "k", "pos_q", "pos_k", "segment_q?", "segment_k?", "segment_table?"),
    "diet_rel": ("q", "k", "rel", "segment_q?", "segment_k?", "segment_table?"),
}

_T5 = (("num_buckets", "int"), ("max_distance", "int"), ("bidirectional", "bool"))
_SCALE = (("scale", "float?"),)
# Non-tensor arguments of each op (all passed, defaults resolved by the caller).
PARAMS = {
    "content": _SCALE,
    "shaw": (("max_distance", "int"),) + _SCALE,
    "t5": _T5 + _SCALE,
    "m2": (("max_distance", "int"),) + _SCALE,
    "m4": (("max_distance", "int"),) + _SCALE,
    "m4m": (("max_distance", "int"),) + _SCALE,
    "deberta": (("att_span", "int"), ("position_buckets", "int"),
                ("max_relative_positions", "int")) + _SCALE,
    "tupe": _T5 + _SCALE,
    "diet_abs": _SCALE,
    "diet_rel": (("max_distance", "int"),) + _SCALE,
}


_TENSOR_NAMES = {method: tuple(name.rstrip("?") for name in names)
                 for method, names in TENSORS.items()}


def tensor_names(method: str) -> tuple:
    return _TENSOR_NAMES[method]


def check_params(method: str, values: tuple) -> None:
    """The checker's TypeError/ValueError for a parameter of the wrong type,
    before the op's schema would turn it into a RuntimeError."""
    for (name, kind), value in zip(PARAMS[method], values):
        if kind == "int":
            _checks.check_int(name, value)
        elif kind == "bool":
            _checks.check_bool(name, value)
        else:
            _checks.check_scale(value, 1.0)


def _schema(method: str, backward: bool) -> str:
    args = ["Tensor G"] if backward else []
    args += [f"Tensor{'?' if name.endswith('?') else ''} {name.rstrip('?')}"
             for name in TENSORS[method]]
    args += [f"{kind} {name}" for name, kind in PARAMS[method]]
    if backward:
        args.append("int needs")
    return "(" + ", ".join(args) + ") -> " + ("Tensor[]" if backward else "Tensor")


def _split(method: str, args: tuple):
    """(tensors by name, params by name) from an op's positional arguments."""
    names = tensor_names(method)
    tensors = dict(zip(names, args[:len(names)]))
    params = {name: value for (name, _), value in zip(PARAMS[method], args[len(names):])}
    return tensors, params


def _problem(method: str, tensors: dict, params: dict) -> _checks.Problem:
    arrays = {name: None if t is None else to_numpy(name, t) for name, t in tensors.items()}
    return _checks.CHECKERS[method](**arrays, **params)


def _static(tensors: dict) -> bool:
    return all(isinstance(size, int) for t in tensors.values() if t is not None for size in t.shape)


def _define(method: str):
    names = tensor_names(method)
    fields = GRAD_FIELDS[method]
    # bit b of `needs` asks for gradient field b, the input at position field_input[b]
    field_input = [names.index(field) for field in fields]

    def forward(*args):
        problem = _problem(method, *_split(method, args))
        return torch.from_numpy(_methods.forward(problem))

    def backward(G, *args):
        *args, needs = args
        problem = _problem(method, *_split(method, args))
        grad = _checks.check_grad(to_numpy("G", G), problem)
        wanted = tuple(field for bit, field in enumerate(fields) if needs >> bit & 1)
        grads = _methods.backward(problem, grad, wanted=wanted)
        # a field not asked for is an empty tensor: the schema has no optional outputs
        return [G.new_empty(0) if value is None else torch.from_numpy(value) for value in grads]

    forward_op = torch.library.custom_op(
        f"posenc::{method}", forward, mutates_args=(), device_types="cpu",
        schema=_schema(method, backward=False))
    backward_op = torch.library.custom_op(
        f"posenc::{method}_backward", backward, mutates_args=(), device_types="cpu",
        schema=_schema(method, backward=True))

    @forward_op.register_fake
    def _(*args):
        tensors, params = _split(method, args)
        if _static(tensors):
            validate(method, tensors, params)
        q, k = tensors["q"], tensors["k"]
        return q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]))

    @backward_op.register_fake
    def _(G, *args):
        *args, needs = args
        tensors, _ = _split(method, args)
        out = []
        for bit, field in enumerate(fields):
            t = tensors[field]
            out.append(t.new_empty(t.shape) if needs >> bit & 1 and t is not None
                       else G.new_empty(0))
        return out

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:len(names)])
        ctx.params = inputs[len(names):]

    def gradients(ctx, grad, run_backward):
        """The inputs' gradients, computing only those autograd asks for."""
        saved = ctx.saved_tensors
        needs = 0
        for bit, position in enumerate(field_input):
            if ctx.needs_input_grad[position] and saved[position] is not None:
                needs |= 1 << bit
        result = [None] * (len(names) + len(PARAMS[method]))
        if needs:
            grads = run_backward(grad, *saved, *ctx.params, needs)
            for bit, position in enumerate(field_input):
                if needs >> bit & 1:
                    result[position] = grads[bit]
        return tuple(result)

    forward_op.register_autograd(lambda ctx, grad: gradients(ctx, grad, backward_op),
                                 setup_context=setup_context)

    save_inputs = setup_context   # (a class body cannot see a closure name it assigns)

    class Eager(torch.autograd.Function):
        """The same forward and backward without the op dispatcher: in eager
        mode a custom op's Python dispatch costs more than a small kernel."""

        @staticmethod
        def forward(*args):
            return forward(*args)

        setup_context = staticmethod(save_inputs)

        @staticmethod
        def backward(ctx, grad):
            return gradients(ctx, grad, backward)

    Eager.__name__ = Eager.__qualname__ = f"{method}_eager"
    return forward_op, backward_op, Eager


FORWARD = {}
BACKWARD = {}
EAGER = {}
for _method in TENSORS:
    FORWARD[_method], BACKWARD[_method], EAGER[_method] = _define(_method)
del _method


def run(method: str, tensors: tuple, params: tuple):
    """The C kernels' logits: the custom op under torch.compile (traceable, no
    graph break), the autograd.Function in eager mode (same results, less
    per-call overhead)."""
    if torch.compiler.is_compiling():
        return FORWARD[method](*tensors, *params)
    return EAGER[method].apply(*tensors, *params)


__all__ = ["BACKWARD", "EAGER", "FORWARD", "PARAMS", "TENSORS", "check_params", "run",
           "tensor_names"]
