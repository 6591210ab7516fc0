"""The projections around an attention on posenc's GEMM: `linear(x, weight,
bias)` is `torch.nn.functional.linear`, forward and backward computed by the
C engine's packed GEMM (`posenc._C.matmul`: X W^T, G W, G^T X read in place
from the tensors' strides).  posenc.torch.hf's patched modules and
posenc.torch.nn.PositionalSelfAttention compute their q, k, v and output
projections with it (`project`); on the machine this was built on
(an AMD EPYC, where PyTorch's MKL sgemm runs at about a third of the
AVX-512 peak) it is about 2x torch's float32 GEMM.

What it does not serve runs `torch.nn.functional.linear` itself, so the
result is always F.linear's up to the order of the sums: fewer than
MIN_ROWS rows (a decoding step), tensors off the CPU, dtypes other than
float32 and float64 (autocast included), mixed dtypes, `torch.compile`
tracing, and `posenc.torch.use_native` in force.  A backward that builds a
graph (`create_graph=True`) computes the gradients as torch ops,
differentiable again.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import _C
from ._common import native_forced, to_numpy, to_tensor

_DTYPES = (torch.float32, torch.float64)
# Fewer rows than this run F.linear: packing W (the GEMM's B, K x N) costs more than a
# product of a few rows by it (W 512 x 512, 2 threads: 1 row, torch 19 us, posenc 90 us;
# 8 rows, 65 against 94; 16 rows even; 48 rows, 198 against 130).
MIN_ROWS = 16


def _served(x, weight, bias) -> bool:
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (all(t.device.type == "cpu" and t.dtype == x.dtype and t.layout == torch.strided
                for t in tensors)
            and x.dtype in _DTYPES and weight.dim() == 2 and x.dim() >= 1
            and math.prod(x.shape[:-1]) >= MIN_ROWS and weight.numel() > 0   # K = 0: F.linear's bias rows
            and x.shape[-1] == weight.shape[1] and (bias is None or bias.shape == weight.shape[:1])
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
            and not native_forced())


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t (..., c) as (rows, c): a view where strides allow, else a copy."""
    return t.reshape(-1, t.shape[-1])


def _mm(a: torch.Tensor, b: torch.Tensor, bias=None) -> torch.Tensor:
    """a (M, K) @ b (K, N) [+ bias] on posenc's GEMM, a new tensor."""
    return to_tensor(_C.matmul(to_numpy("a", a), to_numpy("b", b),
                               None if bias is None else to_numpy("bias", bias)))


class _Linear(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = _mm(_rows(x), weight.t(), bias)
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = _rows(grad)
        mm = torch.mm if torch.is_grad_enabled() else _mm   # create_graph: differentiable torch ops
        d_x = d_weight = d_bias = None
        if ctx.needs_input_grad[0]:
            d_x = mm(g, weight).view(x.shape)
        if ctx.needs_input_grad[1]:
            d_weight = mm(g.t(), _rows(x))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            d_bias = g.sum(0)
        return d_x, d_weight, d_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear(x, weight, bias)`, on posenc's GEMM where it serves."""
    if not _served(x, weight, bias):
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


def _plain(module) -> bool:
    """Whether module(x) is F.linear(x, module.weight, module.bias) and nothing more:
    a torch.nn.Linear itself (not a subclass), its forward not replaced on the
    instance (as accelerate's hooks do), no hooks of its own or global ones."""
    hooks = torch.nn.modules.module
    return (type(module) is torch.nn.Linear and "forward" not in vars(module)
            and not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                     or module._backward_pre_hooks or hooks._global_forward_hooks
                     or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                     or hooks._global_backward_pre_hooks))


def project(module, x: torch.Tensor) -> torch.Tensor:
    """module(x) for a layer's projection: `linear` with its weight and bias when
    module is a plain torch.nn.Linear (`_plain`), else the module itself (a
    LoRA wrapper, a quantised, hooked or wrapped layer runs its own forward)."""
    if _plain(module):
        return linear(x, module.weight, module.bias)
    return module(x)
