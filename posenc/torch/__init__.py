"""posenc for PyTorch: every method of SPEC §3 as a differentiable tensor function.

``posenc.torch.<name>(q, k, ...)`` takes the same arguments as ``posenc.<name>``
(tensors instead of arrays, integer tensors for segment ids, no ``out=``) and
returns the logits ``A`` (B, H, n, m), differentiable in every float input.

* CPU tensors (float32, float64, bfloat16, float16; CPU autocast casts float32
  inputs to its dtype) run the C kernels through the custom ops ``torch.ops.posenc.<name>``
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

try:
    import torch as _torch  # noqa: F401  (the hint below instead of a bare ModuleNotFoundError)
except ModuleNotFoundError as _error:
    if _error.name != "torch":
        raise
    raise ModuleNotFoundError(
        "posenc.torch needs PyTorch, which is not installed: pip install torch "
        "(a CPU-only build: pip install torch --index-url https://download.pytorch.org/whl/cpu), "
        "or pip install \".[torch]\" in posenc's checkout",
        name="torch") from None

from .._registry import METHODS
from . import native, nn
from ._common import native_forced, use_native
from ._functional import *  # noqa: F401,F403  posenc.torch.<name> for every method
from ._fused import *  # noqa: F401,F403  posenc.torch.<name>_attention for every method

__all__ = (list(METHODS) + [m + "_attention" for m in METHODS]
           + ["use_native", "native_forced", "native", "nn"])
