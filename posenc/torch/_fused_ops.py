"""The fused C attention in eager autograd: one `autograd.Function` for every
method.  The forward checks and configures once and keeps the checked call
on ``ctx``; the backward is one C call for exactly the gradients autograd
needs (v, q, k and the method's parameters), recomputing the logits tile by
tile from q, k and lse (no stored probabilities).  Under
``create_graph=True`` the backward differentiates the native formula instead,
so second derivatives are right.
"""

from __future__ import annotations

import torch

from .. import _checks, _methods
from .._attention import ATTENTION_GRAD_TYPES, Attention, check_attention
from .._registry import REGISTRY
from . import native
from ._common import (HALF_DTYPES, autocast_inputs, register_autocast, to_c_array, to_numpy,
                      to_tensor)
from ._ops import PARAMS


def _call(method, tensors, params, v, causal, key_padding_mask, dropout_p, seed):
    """The checked call, its arrays C-contiguous (to_c_array): the eager backward
    reuses it, so strided q, k, v are copied once per step, not once per C call."""
    spec = REGISTRY[method]
    arrays = tuple(None if t is None else to_c_array(name, t)
                   for name, t in zip(spec.tensors, tensors))
    problem = _checks.check(spec, arrays, tuple(params), None)
    mask = None if key_padding_mask is None else to_c_array("key_padding_mask", key_padding_mask)
    return check_attention(problem, to_c_array("v", v), causal, mask, dropout_p, seed)


class _FusedAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, method, params, options, v, *tensors):
        causal, key_padding_mask, dropout_p, seed = options
        call = _call(method, tensors, params, v, causal, key_padding_mask, dropout_p, seed)
        out, lse = (to_tensor(a) for a in _methods.attention_forward(call))
        ctx.method, ctx.params, ctx.options, ctx.call = method, params, options, call
        ctx.save_for_backward(v, out, lse, *tensors)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        v, out, lse, *tensors = ctx.saved_tensors
        fields = ATTENTION_GRAD_TYPES[ctx.method]._fields      # q, k, v, the method's floats
        names = REGISTRY[ctx.method].tensors
        position = {name: names.index(name) for name in fields if name != "v"}
        wanted = 0
        constant = REGISTRY[ctx.method].constant       # no gradient: RoPE's tables
        for bit, name in enumerate(fields):
            needed = ctx.needs_input_grad[3] if name == "v" else (
                ctx.needs_input_grad[4 + position[name]] and tensors[position[name]] is not None
                and name not in constant)
            if needed:
                wanted |= 1 << bit
        result = [None] * (4 + len(tensors))
        if not wanted:
            return tuple(result)
        if torch.is_grad_enabled():             # create_graph: a differentiable backward
            grads = _native_gradients(ctx, d_out, v, tensors, wanted)
        else:
            grads = [None if g is None else to_tensor(g) for g in _methods.attention_backward(
                ctx.call, to_c_array("d_out", d_out), to_numpy("out", out), lse.numpy(), wanted)]
        for bit, (name, grad) in enumerate(zip(fields, grads)):
            if wanted >> bit & 1:
                result[3 if name == "v" else 4 + position[name]] = grad
        return tuple(result)


def _native_gradients(ctx, d_out, v, tensors, wanted: int) -> list:
    fields = ATTENTION_GRAD_TYPES[ctx.method]._fields
    names = REGISTRY[ctx.method].tensors
    inputs = {name: (v if name == "v" else tensors[names.index(name)]) for name in fields}
    asked = [name for bit, name in enumerate(fields) if wanted >> bit & 1]
    causal, key_padding_mask, dropout_p, seed = ctx.options
    out = native.attention(ctx.method, tuple(tensors), ctx.params,
                           (v, causal, key_padding_mask, dropout_p, seed)).out
    grads = torch.autograd.grad(out, [inputs[name] for name in asked], d_out, create_graph=True,
                                allow_unused=True)
    found = dict(zip(asked, grads))
    return [found.get(name) for name in fields]


def fused_attention(method: str, tensors: tuple, params: tuple, attention: tuple) -> Attention:
    """The fused C attention: the custom op under torch.compile (traceable), the
    autograd.Function in eager mode (less per-call overhead); under CPU autocast
    q, k, v and the float parameters are first cast to its dtype, as `run` does."""
    v, causal, key_padding_mask, dropout_p, seed = attention
    v, *tensors = autocast_inputs((v, *tensors))
    if torch.compiler.is_compiling():
        signed_seed = seed - _SEED_WRAP if seed >= 1 << 63 else seed    # the schema's int64
        out, lse = FORWARD[method](v, *tensors, *params, causal, key_padding_mask, dropout_p,
                                   signed_seed)
    else:
        out, lse = _FusedAttention.apply(method, tuple(params), (causal, key_padding_mask,
                                                                 dropout_p, seed), v, *tensors)
    return Attention(out, lse)


# ------------------------------------------------------------------ custom ops (torch.compile)

_SEED_WRAP = 1 << 64


def _schema(method: str, backward: bool) -> str:
    spec = REGISTRY[method]
    args = ["Tensor d_out"] if backward else []
    args += ["Tensor v"] + [f"Tensor{'?' if name in spec.optional else ''} {name}"
                            for name in spec.tensors]
    if backward:
        args += ["Tensor out", "Tensor lse"]
    args += [f"{kind} {name}" for name, kind in PARAMS[method]]
    args += ["bool causal", "Tensor? key_padding_mask", "float dropout_p", "int seed"]
    if backward:
        args.append("int needs")
    return "(" + ", ".join(args) + ") -> " + ("Tensor[]" if backward else "(Tensor, Tensor)")


def _define(method: str):
    count = len(REGISTRY[method].tensors)
    params = len(PARAMS[method])
    fields = ATTENTION_GRAD_TYPES[method]._fields
    names = REGISTRY[method].tensors

    def split(args):
        """(v, tensors, params, (causal, key_padding_mask, dropout_p, seed))."""
        v, tensors, rest = args[0], args[1:1 + count], args[1 + count:]
        causal, key_padding_mask, dropout_p, seed = rest[params:params + 4]
        return v, tensors, rest[:params], (causal, key_padding_mask, dropout_p, seed % _SEED_WRAP)

    def forward(*args):
        v, tensors, values, (causal, mask, dropout_p, seed) = split(args)
        out, lse = _methods.attention_forward(_call(method, tensors, values, v, causal, mask,
                                                    dropout_p, seed))
        return to_tensor(out), to_tensor(lse)

    def backward(d_out, *args):
        *args, needs = args
        v, tensors = args[0], args[1:1 + count]
        out, lse = args[1 + count:3 + count]
        rest = (v,) + tuple(tensors) + tuple(args[3 + count:])
        v, tensors, values, (causal, mask, dropout_p, seed) = split(rest)
        call = _call(method, tensors, values, v, causal, mask, dropout_p, seed)
        grads = _methods.attention_backward(call, to_c_array("d_out", d_out), to_numpy("out", out),
                                            lse.numpy(), needs)
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
        inputs = dict(zip(names, args[1:1 + count]), v=args[0])
        return [inputs[name].new_empty(inputs[name].shape)
                if needs >> bit & 1 and inputs[name] is not None else d_out.new_empty(0)
                for bit, name in enumerate(fields)]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:1 + count], *output)
        ctx.rest = inputs[1 + count:]

    def gradients(ctx, d_out, _d_lse):
        v, *rest = ctx.saved_tensors
        tensors, (out, lse) = rest[:count], rest[count:]
        position = {name: 1 + names.index(name) for name in fields if name != "v"}
        position["v"] = 0
        needs = 0
        for bit, name in enumerate(fields):
            saved = v if name == "v" else tensors[position[name] - 1]
            if ctx.needs_input_grad[position[name]] and saved is not None and \
                    name not in REGISTRY[method].constant:
                needs |= 1 << bit
        result = [None] * (1 + count + len(ctx.rest))
        if needs:
            grads = backward_op(d_out, v, *tensors, out, lse, *ctx.rest, needs)
            for bit, name in enumerate(fields):
                if needs >> bit & 1:
                    result[position[name]] = grads[bit]
        return tuple(result)

    forward_op.register_autograd(gradients, setup_context=setup_context)
    register_autocast(f"{method}_attention")
    return forward_op, backward_op


# torch.ops.posenc.<m>_attention and <m>_attention_backward for every method
FORWARD, BACKWARD = (dict(zip(REGISTRY, ops)) for ops in zip(*map(_define, REGISTRY)))
