"""What every namespace's fused attention shares (SPEC §6, §7): the dropout
generator, the checks of the attention arguments (the masks, window,
documents, softcap and sinks), the result types.

Dropout is counter-based, so that the backward regenerates the forward's
decisions and any thread count or ISA draws the same ones: the keep decision
of entry (b, h, i, j) is word j mod 4 of Philox-4x32-10 (Salmon et al. 2011,
10 rounds, Random123's constants) at the counter (j div 4, i, h, b) under the
key (seed mod 2^32, seed div 2^32); the entry is kept when that 32-bit word
is at least floor(dropout_p 2^32), and a kept probability is scaled by
1 / (1 - dropout_p).  `attention_dropout_mask` returns these decisions, so a
reference or a test can apply exactly the kernel's dropout.
"""

from __future__ import annotations

import numbers
from collections import namedtuple

import numpy as np

from ._checks import (check_bool, check_int, check_rank, check_shape, check_writable_out,
                      require_ndarray)
from ._dtypes import lse_dtype
from ._kinds import require_index_array
from ._registry import GRAD_FIELDS, REGISTRY, grad_class_name
from ._signatures import ATTENTION_OPTIONS


Attention = namedtuple("Attention", ("out", "lse"))
Attention.__doc__ = """The fused attention's result: out (B, H, n, dv) and lse (B, H, n), the
natural log of each row's softmax denominator (-inf for a row whose keys are all masked)."""

_M0, _M1 = 0xD2511F53, 0xCD9E8D57           # Philox-4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85           # its Weyl key increments
_MASK32 = 0xFFFFFFFF
SEED_LIMIT = 1 << 64


def philox4x32(counter, key) -> tuple:
    """Philox-4x32-10 of 4 counter words and 2 key words (arrays broadcast
    together; each value < 2^32); returns the 4 output words as uint64 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.uint64(k) for k in key)
    for round_ in range(10):
        p0, p1 = np.uint64(_M0) * c0, np.uint64(_M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & np.uint64(_MASK32),
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & np.uint64(_MASK32))
        if round_ < 9:
            k0 = (k0 + np.uint64(_W0)) & np.uint64(_MASK32)
            k1 = (k1 + np.uint64(_W1)) & np.uint64(_MASK32)
    return c0, c1, c2, c3


def dropout_threshold(dropout_p: float) -> int:
    """A 32-bit word at least this keeps its entry."""
    return int(dropout_p * 4294967296.0)


def attention_dropout_mask(seed: int, shape, dropout_p: float) -> np.ndarray:
    """The keep decisions (bool, `shape` = (B, H, n, m)) of the fused attention's
    dropout for `seed` and `dropout_p`: True where the kernel keeps P[b, h, i, j]
    (and scales it by 1 / (1 - dropout_p)).  A pure function of
    (seed, b, h, i, j, dropout_p), the same for every thread count and ISA."""
    seed = check_seed(seed)
    dropout_p = check_dropout(dropout_p)
    B, H, n, m = (int(s) for s in shape)
    if min(B, H, n, m) < 0:
        raise ValueError(f"shape must be 4 sizes >= 0 (B, H, n, m), got {tuple(shape)}")
    words = (m + 3) // 4
    counter = (np.arange(words, dtype=np.uint64)[None, None, None, :],
               np.arange(n, dtype=np.uint64)[None, None, :, None],
               np.arange(H, dtype=np.uint64)[None, :, None, None],
               np.arange(B, dtype=np.uint64)[:, None, None, None])
    out = np.broadcast_arrays(*philox4x32(counter, (seed & _MASK32, seed >> 32)))
    stream = np.stack(out, axis=-1).reshape(B, H, n, 4 * words)[..., :m]
    return stream >= np.uint64(dropout_threshold(dropout_p))


def check_seed(seed) -> int:
    if type(seed) is int and 0 <= seed < SEED_LIMIT:   # the common case, without the ABCs
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return int(seed)


def check_dropout(dropout_p) -> float:
    if type(dropout_p) is float and 0.0 <= dropout_p < 1.0:   # the common case
        return dropout_p
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a real number, got {type(dropout_p).__name__} "
                        f"{dropout_p!r}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return dropout_p


class AttentionCall:
    """A checked attention call: the logits' Problem and the attention arguments
    (ATTENTION_OPTIONS), window a (left, right) tuple or None."""

    __slots__ = ("problem", "v", "dv") + tuple(name for name, _ in ATTENTION_OPTIONS)

    def options(self) -> dict:
        """The attention keywords of the call (ATTENTION_OPTIONS and query_offset)."""
        return dict({name: getattr(self, name) for name, _ in ATTENTION_OPTIONS},
                    query_offset=self.problem.query_offset)


def check_window(window):
    """None, or (left, right) with each side None (no bound) or an int >= 0."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or (left, right), each None or an int >= 0; got "
                        f"{type(window).__name__} {window!r}")
    return tuple(None if side is None else check_int(f"window's {name}", side, 0)
                 for name, side in zip(("left", "right"), window))


def check_softcap(softcap):
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number > 0 or None, got "
                        f"{type(softcap).__name__} {softcap!r}")
    softcap = float(softcap)
    if not 0.0 < softcap < float("inf"):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {softcap}")
    return softcap


def _document_ids(name: str, ids: np.ndarray) -> np.ndarray:
    """Document ids as int64 by value (SPEC §7: int64 -1 and uint8 255 differ, whatever
    the two dtypes); an id outside the int64 range (uint64 >= 2**63) is a ValueError."""
    if ids.dtype == np.int64:
        return ids
    if ids.dtype.kind == "u" and ids.dtype.itemsize == 8 and ids.size and ids.max() >= 2**63:
        raise ValueError(f"{name} holds an id outside the int64 range: {int(ids.max())} "
                         f"(dtype {ids.dtype}); document ids are compared as int64 values")
    return ids.astype(np.int64)


def _check_documents(p, document_q, document_k):
    if (document_q is None) != (document_k is None):
        missing = "document_k" if document_k is None else "document_q"
        raise ValueError(f"documents come as both document_q and document_k or neither; missing "
                         f"{missing}")
    if document_q is None:
        return None, None
    require_index_array("document_q", document_q)
    require_index_array("document_k", document_k)
    check_shape("document_q", document_q, (p.B, p.n), "(B, n)")
    check_shape("document_k", document_k, (p.B, p.m), "(B, m)")
    return _document_ids("document_q", document_q), _document_ids("document_k", document_k)


def check_attention(problem, v, causal=False, key_padding_mask=None, window=None,
                    document_q=None, document_k=None, softcap=None, sinks=None, dropout_p=0.0,
                    seed=0) -> AttentionCall:
    """The attention arguments of SPEC §6 and §7 beside a checked logits `problem`."""
    p = problem
    require_ndarray("v", v)
    if v.dtype != p.dtype:
        raise TypeError(f"v has dtype {v.dtype} but q has dtype {p.dtype}: float inputs of one "
                        "call must share one dtype")
    if v.ndim != 4 or v.shape[:3] != (p.B, p.H_kv, p.m):   # the message built on failure only
        check_rank("v", v, 4, "(B, H_kv, m, dv)")
        check_shape("v", v, (p.B, p.H_kv, p.m, None), f"(B, H_kv, m, dv) with B = {p.B}, "
                                                       f"H_kv = {p.H_kv}, m = {p.m} from k")
    call = AttentionCall()
    call.problem, call.v, call.dv = p, v, v.shape[3]
    call.causal = check_bool("causal", causal)
    if key_padding_mask is not None:
        require_ndarray("key_padding_mask", key_padding_mask)
        if key_padding_mask.dtype != np.bool_:
            raise TypeError(f"key_padding_mask must have dtype bool (True = padding), got "
                            f"{key_padding_mask.dtype}")
        check_shape("key_padding_mask", key_padding_mask, (p.B, p.m), "(B, m)")
    call.key_padding_mask = key_padding_mask
    call.window = check_window(window)
    call.document_q, call.document_k = _check_documents(p, document_q, document_k)
    call.softcap = check_softcap(softcap)
    if sinks is not None:
        require_ndarray("sinks", sinks)
        if sinks.dtype != p.dtype:
            raise TypeError(f"sinks has dtype {sinks.dtype} but q has dtype {p.dtype}: float "
                            "inputs of one call must share one dtype")
        check_shape("sinks", sinks, (p.H,), "(H,)")
    call.sinks = sinks
    call.dropout_p = check_dropout(dropout_p)
    call.seed = check_seed(seed)
    return call


def check_attention_out(out, call: AttentionCall) -> None:
    """`out=` of the attention: a writeable, aligned, C-contiguous (B, H, n, dv) array of
    q's dtype, not overlapping an input; becomes the problem's out."""
    p = call.problem
    require_ndarray("out", out)
    if out.dtype != p.dtype:
        raise TypeError(f"out must have dtype {p.dtype}, got {out.dtype}")
    check_shape("out", out, (p.B, p.H, p.n, call.dv), "(B, H, n, dv)")
    inputs = dict(p.arrays, v=call.v, key_padding_mask=call.key_padding_mask,
                  document_q=call.document_q, document_k=call.document_k, sinks=call.sinks)
    check_writable_out(out, inputs)
    p.out = out


def check_attention_grad(d_out, out, lse, d_lse, call: AttentionCall) -> None:
    """d_out and out (B, H, n, dv) of q's dtype, lse and d_lse = dL/dlse (None: lse
    unused) (B, H, n) of the forward's lse dtype (q's; float32 for bfloat16 and float16)."""
    p = call.problem
    for name, value, shape, layout, dtype in (
            ("d_out", d_out, (p.B, p.H, p.n, call.dv), "(B, H, n, dv)", p.dtype),
            ("out", out, (p.B, p.H, p.n, call.dv), "(B, H, n, dv)", p.dtype),
            ("lse", lse, (p.B, p.H, p.n), "(B, H, n)", lse_dtype(p.dtype)),
            ("d_lse", d_lse, (p.B, p.H, p.n), "(B, H, n)", lse_dtype(p.dtype))):
        if value is None and name == "d_lse":
            continue
        require_ndarray(name, value)
        if value.dtype != dtype:
            if dtype == p.dtype:
                raise TypeError(f"{name} has dtype {value.dtype} but q has dtype {p.dtype}")
            raise TypeError(f"{name} must have dtype {dtype} (the forward's lse for q of dtype "
                            f"{p.dtype}), got {value.dtype}")
        check_shape(name, value, shape, layout)


def _attention_fields(method: str) -> tuple:
    """The fields of <method>_attention_backward: its float arguments in order (v after k,
    sinks last: None without sinks)."""
    fields = GRAD_FIELDS[method]
    return fields[:2] + ("v",) + fields[2:] + ("sinks",)


# <Method>AttentionGrads: the gradients of every float input of <method>_attention.
ATTENTION_GRAD_TYPES = {
    method: namedtuple(grad_class_name(method).replace("Grads", "AttentionGrads"),
                       _attention_fields(method))
    for method in REGISTRY}
