"""The fused C attention in eager autograd: one `autograd.Function` for every
method.  The forward checks and configures once and keeps the checked call
on ``ctx``; the backward is one C call for exactly the gradients autograd
needs (v, q, k and the method's parameters), recomputing the logits tile by
tile from q, k and lse (no stored probabilities).  lse is an output like out:
a loss may use both, and dL/dlse joins the backward (None where lse is unused:
the C call then does what it does without).  Under
``create_graph=True`` the backward differentiates the native formula instead,
so second derivatives are right.
"""

from __future__ import annotations

import inspect

import torch

from .. import _checks, _methods
from .._attention import ATTENTION_GRAD_TYPES, ATTENTION_OPTIONS, Attention, check_attention
from .._registry import REGISTRY
from . import native
from ._common import (HALF_DTYPES, SEED_WRAP, autocast_inputs, cpu_autocast_dtype,
                      register_autocast, seed_value, to_c_array, to_numpy, to_tensor)
from ._ops import PARAMS
from .._signatures import attention_option


# The attention's arguments other than v and sinks (the one float among them: a tensor
# input of the autograd.Function and the ops, with a gradient), in ATTENTION_OPTIONS order.
OPTIONS = tuple(name for name, _ in ATTENTION_OPTIONS if name != "sinks")
# where sinks and OPTIONS sit in `attention` (v, then ATTENTION_OPTIONS), and which
# options may be tensors (the masks' ids)
_NAMES = ("v",) + tuple(name for name, _ in ATTENTION_OPTIONS)
_SINKS_AT = _NAMES.index("sinks")
_OPTIONS_AT = tuple(_NAMES.index(name) for name in OPTIONS)
# the options that may be tensors (the masks' ids), by their place in OPTIONS; where the
# sinks go back among them for check_attention (its arguments: ATTENTION_OPTIONS' order)
_TENSOR_OPTIONS = tuple((OPTIONS.index(name), name)
                        for name in ("key_padding_mask", "document_q", "document_k"))
_SINKS_AMONG = _NAMES.index("sinks") - 1
# v and the attention's optional tensor arguments, and (position, name) in `attention` (v,
# then ATTENTION_OPTIONS, as check_attention takes them)
ATTENTION_TENSORS = ("v", "key_padding_mask", "document_q", "document_k", "sinks")
_ATTENTION_TENSORS = tuple((_NAMES.index(name), name) for name in ATTENTION_TENSORS)
# _call passes the options to check_attention by position
assert tuple(inspect.signature(check_attention).parameters)[2:] == _NAMES[1:]


# The method's parameters the ops take: those that are not the attention's own option of
# their name (cope's causal: the attention's; posenc._signatures.attention_option).
OP_PARAMS = {method: tuple((name, kind) for name, kind in PARAMS[method]
                           if not attention_option(name)) for method in REGISTRY}


def _op_params(method: str, params: tuple) -> tuple:
    """The values of OP_PARAMS[method] among the method's parameters."""
    return tuple(value for (name, _), value in zip(PARAMS[method], params)
                 if not attention_option(name))


def _method_params(method: str, values: tuple, options: dict) -> tuple:
    """The method's parameters from the ops' (OP_PARAMS) and the attention's options."""
    given = iter(values)
    return tuple(options[name] if attention_option(name) else next(given)
                 for name, _ in PARAMS[method])


def split_attention(attention: tuple) -> tuple:
    """(v, sinks, options): options the values of OPTIONS, in order."""
    return attention[0], attention[_SINKS_AT], tuple([attention[at] for at in _OPTIONS_AT])


def _problem(method, tensors, params, array):
    """The checked logits of a call, its tensors as array(name, tensor) makes them."""
    spec = REGISTRY[method]
    arrays = tuple([None if t is None else array(name, t)
                    for name, t in zip(spec.tensors, tensors)])
    return _checks.check(spec, arrays, tuple(params), None)


def _call(method, tensors, params, v, sinks, options):
    """The checked call, its arrays as to_c_array makes them (q, k, v views, the other
    strided ones C-contiguous copies): the eager backward reuses it, so a strided
    parameter is copied once per step, not once per C call."""
    problem = _problem(method, tensors, params, to_c_array)
    options = list(options)
    for at, name in _TENSOR_OPTIONS:
        if isinstance(options[at], torch.Tensor):
            options[at] = to_c_array(name, options[at])
    options.insert(_SINKS_AMONG, None if sinks is None else to_c_array("sinks", sinks))
    return check_attention(problem, to_c_array("v", v), *options)


def _view(name: str, tensor: torch.Tensor):
    """`to_c_array` for one C call, its common case first: a contiguous CPU tensor of a
    NumPy dtype not requiring grad is `tensor.numpy()` (a strided one goes to to_c_array:
    q, k, v as views, the others copied by torch, faster than the binding's NumPy copy)."""
    if tensor.is_contiguous():
        try:
            return tensor.numpy()
        except (RuntimeError, TypeError):   # bfloat16, a neg or conj bit, requires_grad
            pass
    return to_c_array(name, tensor)


def _inference_call(method, tensors, params, attention):
    """_call for a call with nothing to differentiate, outside compile and autocast (a
    decoding step): `attention` (v, ATTENTION_OPTIONS) goes to check_attention as it is,
    its tensors as views for this call (_view), the seed as an int."""
    problem = _problem(method, tensors, params, _view)
    attention = list(attention)
    for at, name in _ATTENTION_TENSORS:
        if attention[at] is not None:
            attention[at] = _view(name, attention[at])
    if isinstance(attention[-1], torch.Tensor):   # the seed, last
        attention[-1] = seed_value(attention[-1])
    return check_attention(problem, *attention)


def _forward(call) -> tuple:
    """(out, lse) of the checked call, as tensors sharing the C results' memory."""
    out, lse = _methods.attention_forward(call)
    return to_tensor(out), to_tensor(lse)


class _FusedAttention(torch.autograd.Function):
    """apply(method, params, options, v, sinks, *tensors)."""

    @staticmethod
    def forward(ctx, method, params, options, v, sinks, *tensors):
        call = _call(method, tensors, params, v, sinks, options)
        out, lse = _forward(call)
        ctx.method, ctx.params, ctx.options, ctx.call = method, params, options, call
        ctx.save_for_backward(v, sinks, out, lse, *tensors)
        ctx.set_materialize_grads(False)    # d_lse None where the loss does not use lse
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        v, sinks, out, lse, *tensors = ctx.saved_tensors
        if d_out is None:                   # the loss uses lse only
            d_out = torch.zeros_like(out)
        fields = ATTENTION_GRAD_TYPES[ctx.method]._fields    # q, k, v, the method's floats, sinks
        names = REGISTRY[ctx.method].tensors
        # the position of each field among apply's inputs
        position = {name: 5 + names.index(name) for name in fields if name not in ("v", "sinks")}
        position.update(v=3, sinks=4)
        saved = dict(zip(names, tensors), v=v, sinks=sinks)
        wanted = 0
        spec = REGISTRY[ctx.method]      # no gradient: RoPE's (P, r) tables
        for bit, name in enumerate(fields):
            if (ctx.needs_input_grad[position[name]] and saved[name] is not None
                    and spec.trainable(name, saved[name])):
                wanted |= 1 << bit
        result = [None] * (5 + len(tensors))
        if not wanted:
            return tuple(result)
        if torch.is_grad_enabled():             # create_graph: a differentiable backward
            grads = _native_gradients(ctx, d_out, d_lse, saved, tensors, wanted)
        else:
            grads = [None if g is None else to_tensor(g) for g in _methods.attention_backward(
                ctx.call, to_c_array("d_out", d_out), to_numpy("out", out), lse.numpy(),
                _lse_grad(d_lse), fields=wanted)]
        for bit, (name, grad) in enumerate(zip(fields, grads)):
            if wanted >> bit & 1:
                result[position[name]] = grad
        return tuple(result)


def _lse_grad(d_lse):
    """dL/dlse as the C call takes it: a C-contiguous array, or None (lse unused)."""
    return None if d_lse is None else to_c_array("d_lse", d_lse)


def _native_gradients(ctx, d_out, d_lse, saved, tensors, wanted: int) -> list:
    fields = ATTENTION_GRAD_TYPES[ctx.method]._fields
    asked = [name for bit, name in enumerate(fields) if wanted >> bit & 1]
    attention = dict(zip(OPTIONS, ctx.options), sinks=saved["sinks"])
    result = native.attention(ctx.method, tuple(tensors), ctx.params,
                              (saved["v"],) + tuple(attention[name]
                                                    for name, _ in ATTENTION_OPTIONS))
    outputs, upstream = (result.out,), (d_out,)
    if d_lse is not None:
        outputs, upstream = (result.out, result.lse), (d_out, d_lse)
    grads = torch.autograd.grad(outputs, [saved[name] for name in asked], upstream,
                                create_graph=True, allow_unused=True)
    found = dict(zip(asked, grads))
    return [found.get(name) for name in fields]


def _window_list(window):
    """The ops' int[]? of a window: None, or [left, right] with -1 for an unbounded side."""
    return None if window is None else [-1 if side is None else int(side) for side in window]


def _any_requires_grad(tensors: tuple, attention: tuple) -> bool:
    """Whether a float input of the call requires grad (q, k, the method's, v, sinks)."""
    sinks = attention[_SINKS_AT]
    return (attention[0].requires_grad or (sinks is not None and sinks.requires_grad) or
            any(t is not None and t.requires_grad for t in tensors))


def fused_attention(method: str, tensors: tuple, params: tuple, attention: tuple) -> Attention:
    """The fused C attention: the custom op under torch.compile (traceable), the
    autograd.Function in eager mode (less per-call overhead); under CPU autocast
    q, k, v, the float parameters and the sinks are first cast to its dtype, as `run` does."""
    if not torch.compiler.is_compiling() and cpu_autocast_dtype() is None and \
            not (torch.is_grad_enabled() and _any_requires_grad(tensors, attention)):
        # nothing to differentiate (a decoding step): no autograd's bookkeeping, no regrouping
        return Attention(*_forward(_inference_call(method, tensors, params, attention)))
    v, sinks, options = split_attention(attention)
    v, sinks, *tensors = autocast_inputs((v, sinks, *tensors))
    if torch.compiler.is_compiling():
        named = dict(zip(OPTIONS, options))
        seed = named["seed"]
        if not isinstance(seed, torch.Tensor):     # a constant of the graph, as int64
            seed = torch.tensor(seed - SEED_WRAP if seed >= 1 << 63 else seed, dtype=torch.int64)
        named["seed"] = seed
        named["window"] = _window_list(named["window"])
        out, lse = FORWARD[method](v, *tensors, *_op_params(method, params), sinks,
                                   *named.values())
    else:
        if isinstance(options[-1], torch.Tensor):    # the seed, last
            options = options[:-1] + (seed_value(options[-1]),)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (v, sinks, *tensors)):
            out, lse = _FusedAttention.apply(method, tuple(params), options, v, sinks, *tensors)
        else:   # nothing to differentiate (a decoding step): without autograd's bookkeeping
            out, lse = _forward(_call(method, tensors, params, v, sinks, options))
    return Attention(out, lse)


# ------------------------------------------------------------------ custom ops (torch.compile)


# the options' schema types, in OPTIONS order
_OPTION_TYPES = {"causal": "bool", "key_padding_mask": "Tensor?", "window": "int[]?",
                 "document_q": "Tensor?", "document_k": "Tensor?", "softcap": "float?",
                 "dropout_p": "float", "seed": "Tensor"}


def _schema(method: str, backward: bool) -> str:
    spec = REGISTRY[method]
    args = ["Tensor d_out"] if backward else []
    args += ["Tensor v"] + [f"Tensor{'?' if name in spec.optional else ''} {name}"
                            for name in spec.tensors]
    if backward:
        args += ["Tensor out", "Tensor lse", "Tensor? d_lse"]
    args += [f"{kind} {name}" for name, kind in OP_PARAMS[method]]
    args += ["Tensor? sinks"] + [f"{_OPTION_TYPES[name]} {name}" for name in OPTIONS]
    if backward:
        args.append("int needs")
    return "(" + ", ".join(args) + ") -> " + ("Tensor[]" if backward else "(Tensor, Tensor)")


def _define(method: str):
    count = len(REGISTRY[method].tensors)
    params = len(OP_PARAMS[method])
    fields = ATTENTION_GRAD_TYPES[method]._fields
    names = REGISTRY[method].tensors

    def split(args):
        """(v, tensors, params, sinks, options) of the op's arguments (OPTIONS' values as
        the eager path has them: the window a tuple, the seed an unsigned int)."""
        v, tensors, rest = args[0], args[1:1 + count], args[1 + count:]
        sinks, values = rest[params], dict(zip(OPTIONS, rest[params + 1:]))
        values["seed"] = seed_value(values["seed"])
        if values["window"] is not None:
            values["window"] = tuple(None if side < 0 else side for side in values["window"])
        return (v, tensors, _method_params(method, rest[:params], values), sinks,
                tuple(values.values()))

    def forward(*args):
        v, tensors, values, sinks, options = split(args)
        return _forward(_call(method, tensors, values, v, sinks, options))

    def backward(d_out, *args):
        *args, needs = args
        v, tensors = args[0], args[1:1 + count]
        out, lse, d_lse = args[1 + count:4 + count]
        rest = (v,) + tuple(tensors) + tuple(args[4 + count:])
        v, tensors, values, sinks, options = split(rest)
        call = _call(method, tensors, values, v, sinks, options)
        grads = _methods.attention_backward(call, to_c_array("d_out", d_out), to_numpy("out", out),
                                            lse.numpy(), _lse_grad(d_lse), fields=needs)
        return [d_out.new_empty(0) if g is None else to_tensor(g) for g in grads]

    forward_op = torch.library.custom_op(f"posenc::{method}_attention", forward, mutates_args=(),
                                         device_types="cpu", schema=_schema(method, False))
    backward_op = torch.library.custom_op(f"posenc::{method}_attention_backward", backward,
                                          mutates_args=(), device_types="cpu",
                                          schema=_schema(method, True))

    @forward_op.register_fake
    def _(*args):
        v, tensors = args[0], args[1:1 + count]
        q = tensors[0]
        lse_dtype = torch.float32 if q.dtype in HALF_DTYPES else q.dtype     # lse stays float32
        return (q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3])),
                q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=lse_dtype))

    @backward_op.register_fake
    def _(d_out, *args):
        *args, needs = args
        inputs = dict(zip(names, args[1:1 + count]), v=args[0], sinks=args[4 + count + params])
        return [inputs[name].new_empty(inputs[name].shape)
                if needs >> bit & 1 and inputs[name] is not None else d_out.new_empty(0)
                for bit, name in enumerate(fields)]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:1 + count], inputs[1 + count + params], *output)
        ctx.rest = inputs[1 + count:]

    def gradients(ctx, d_out, d_lse):
        v, *rest = ctx.saved_tensors
        tensors, sinks, (out, lse) = rest[:count], rest[count], rest[count + 1:]
        position = {name: 1 + names.index(name) for name in fields if name not in ("v", "sinks")}
        position.update(v=0, sinks=1 + count + params)
        saved = dict(zip(names, tensors), v=v, sinks=sinks)
        needs = 0
        for bit, name in enumerate(fields):
            if ctx.needs_input_grad[position[name]] and saved[name] is not None and \
                    REGISTRY[method].trainable(name, saved[name]):
                needs |= 1 << bit
        result = [None] * (1 + count + len(ctx.rest))
        if needs:
            grads = backward_op(d_out, v, *tensors, out, lse, d_lse, *ctx.rest, needs)
            for bit, name in enumerate(fields):
                if needs >> bit & 1:
                    result[position[name]] = grads[bit]
        return tuple(result)

    forward_op.register_autograd(gradients, setup_context=setup_context)
    register_autocast(f"{method}_attention")
    return forward_op, backward_op


# torch.ops.posenc.<m>_attention and <m>_attention_backward for every method
FORWARD, BACKWARD = (dict(zip(REGISTRY, ops)) for ops in zip(*map(_define, REGISTRY)))
