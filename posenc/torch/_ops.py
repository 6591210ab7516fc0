"""The C kernels in autograd: ``torch.ops.posenc.<name>`` / ``<name>_backward``
custom ops (for torch.compile) and one `autograd.Function` (eager mode).

Everything is derived from the method registry (`posenc._registry`): the op
schemas from the method's tensor arguments and parameters, the gradient
bits from its gradient fields.

* Eager (`_Logits`): the forward checks the call once and configures the
  engine once; the backward reuses that configured problem (saved on
  ``ctx``) and makes one C call for exactly the gradients autograd needs.
  Under ``create_graph=True`` (a gradient penalty, ``gradgradcheck``) the
  backward instead differentiates the torch-native formula of the method at
  the saved inputs, so the gradients it returns carry their own graph and a
  second derivative is right (never a gradient silently without a graph).
* Compiled (`FORWARD`, `BACKWARD`): CPU custom ops whose kernels view the
  tensors as NumPy arrays (no copy, any strides), with fake kernels (shapes
  only) so ``torch.compile(fullgraph=True)`` traces them without a graph
  break, and an autograd formula that calls the backward op.

The ops are CPU-only; `posenc.torch` sends other devices to `posenc.torch.native`.
"""

from __future__ import annotations

import torch

from .. import _checks, _methods
from .._registry import GRAD_FIELDS, REGISTRY
from ._common import autocast_inputs, register_autocast, to_numpy, to_tensor, validate

# Non-tensor arguments of each op, (name, schema type), in signature order.
PARAMS = {name: tuple((p, spec.param_kinds[p].schema) for p, _ in spec.params)
          for name, spec in REGISTRY.items()}


def tensor_names(method: str) -> tuple:
    """The tensor arguments of `method`, in signature order."""
    return REGISTRY[method].tensors


def _grad_positions(method: str) -> tuple:
    """For each gradient field, its position among the method's tensor arguments."""
    names = tensor_names(method)
    return tuple(names.index(f) for f in GRAD_FIELDS[method])


GRAD_POSITIONS = {method: _grad_positions(method) for method in REGISTRY}


def _problem(method: str, tensors, params) -> _checks.Problem:
    arrays = tuple(None if t is None else to_numpy(name, t)
                   for name, t in zip(tensor_names(method), tensors))
    return _checks.check(REGISTRY[method], arrays, tuple(params), None)


def _gradient_tensors(grads, positions, count: int) -> list:
    """The gradients of the tensor arguments (None where not computed)."""
    result = [None] * count
    for position, value in zip(positions, grads):
        if value is not None:
            result[position] = to_tensor(value)
    return result


class _Logits(torch.autograd.Function):
    """Eager mode: one check, one configuration, one C call per direction."""

    @staticmethod
    def forward(ctx, method, params, *tensors):
        problem = _problem(method, tensors, params)
        config = _methods.configure(problem)
        ctx.method, ctx.params, ctx.problem, ctx.config = method, params, problem, config
        ctx.save_for_backward(*tensors)      # autograd's check that no input changed since
        return to_tensor(_methods.forward(problem, config))

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        positions = GRAD_POSITIONS[ctx.method]
        fields = 0
        spec = REGISTRY[ctx.method]
        for bit, (position, name) in enumerate(zip(positions, GRAD_FIELDS[ctx.method])):
            if ctx.needs_input_grad[2 + position] and saved[position] is not None and \
                    spec.trainable(name, saved[position]):
                fields |= 1 << bit
        if not fields:
            return (None, None) + (None,) * len(saved)
        if torch.is_grad_enabled():       # create_graph=True: a differentiable backward
            return (None, None, *_native_gradients(ctx, grad, saved, fields))
        grads = _methods.backward(ctx.problem, to_numpy("G", grad), fields, ctx.config)
        return (None, None, *_gradient_tensors(grads, positions, len(saved)))


def _native_gradients(ctx, grad, saved, fields: int) -> list:
    """The asked gradients by autograd through the torch-native formula at the
    saved inputs, with create_graph: themselves differentiable (any order)."""
    from . import native

    spec = REGISTRY[ctx.method]
    params = dict(zip((name for name, _ in spec.params), ctx.params))
    logits = getattr(native, ctx.method)(**dict(zip(spec.tensors, saved)), **params)
    positions = [position for bit, position in enumerate(GRAD_POSITIONS[ctx.method])
                 if fields >> bit & 1]
    grads = torch.autograd.grad(logits, [saved[p] for p in positions], grad, create_graph=True,
                                allow_unused=True)
    result = [None] * len(saved)
    for position, value in zip(positions, grads):
        result[position] = value
    return result


def _schema(method: str, backward: bool) -> str:
    spec = REGISTRY[method]
    args = ["Tensor G"] if backward else []
    args += [f"Tensor{'?' if name in spec.optional else ''} {name}" for name in spec.tensors]
    args += [f"{kind} {name}" for name, kind in PARAMS[method]]
    if backward:
        args.append("int needs")
    return "(" + ", ".join(args) + ") -> " + ("Tensor[]" if backward else "Tensor")


def _split(method: str, args: tuple):
    """(tensors, params) from an op's positional arguments."""
    count = len(tensor_names(method))
    return args[:count], args[count:]


def _static(tensors) -> bool:
    return all(isinstance(size, int) for t in tensors if t is not None for size in t.shape)


def _define(method: str):
    names = tensor_names(method)
    fields = GRAD_FIELDS[method]
    positions = GRAD_POSITIONS[method]

    def forward(*args):
        problem = _problem(method, *_split(method, args))
        return to_tensor(_methods.forward(problem))

    def backward(G, *args):
        *args, needs = args
        problem = _problem(method, *_split(method, args))
        grad = _checks.check_grad(to_numpy("G", G), problem)
        grads = _methods.backward(problem, grad, needs)
        # a field not asked for is an empty tensor: the schema has no optional outputs
        return [G.new_empty(0) if value is None else to_tensor(value) for value in grads]

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
            validate(method, dict(zip(names, tensors)), dict(zip((p for p, _ in PARAMS[method]), params)))
        q, k = tensors[0], tensors[1]
        return q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]))

    @backward_op.register_fake
    def _(G, *args):
        *args, needs = args
        tensors, _ = _split(method, args)
        out = []
        for bit, position in enumerate(positions):
            t = tensors[position]
            out.append(t.new_empty(t.shape) if needs >> bit & 1 and t is not None
                       else G.new_empty(0))
        return out

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:len(names)])
        ctx.params = inputs[len(names):]

    def gradients(ctx, grad):
        saved = ctx.saved_tensors
        needs = 0
        for bit, (position, name) in enumerate(zip(positions, fields)):
            if ctx.needs_input_grad[position] and saved[position] is not None and \
                    REGISTRY[method].trainable(name, saved[position]):
                needs |= 1 << bit
        result = [None] * (len(names) + len(PARAMS[method]))
        if needs:
            grads = backward_op(grad, *saved, *ctx.params, needs)
            for bit, position in enumerate(positions):
                if needs >> bit & 1:
                    result[position] = grads[bit]
        return tuple(result)

    forward_op.register_autograd(gradients, setup_context=setup_context)
    register_autocast(method)
    assert len(fields) == len(positions)
    return forward_op, backward_op


# torch.ops.posenc.<m> and <m>_backward for every method of the registry
FORWARD, BACKWARD = (dict(zip(REGISTRY, ops)) for ops in zip(*map(_define, REGISTRY)))


def run(method: str, tensors: tuple, params: tuple):
    """The C kernels' logits: the custom op under torch.compile (traceable, no
    graph break), the autograd.Function in eager mode (same results, less
    per-call overhead).  Under CPU autocast the float tensors are first cast to
    its dtype (`autocast_inputs`: the eager Function does not pass through the
    op's autocast kernel)."""
    tensors = autocast_inputs(tensors)
    if torch.compiler.is_compiling():
        return FORWARD[method](*tensors, *params)
    return _Logits.apply(method, params, *tensors)


__all__ = ["BACKWARD", "FORWARD", "PARAMS", "run", "tensor_names"]
