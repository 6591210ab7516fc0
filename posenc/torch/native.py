"""Torch-native formulas of every method (SPEC §3), written the way practitioners do.

These run on any device (CUDA, MPS, ..., and CPU under `posenc.torch.use_native`),
are differentiated by autograd and traced by `torch.compile`.  They serve as the
"PyTorch eager" peer of the C kernels in benchmarks, so each follows the usual
public implementation of its method:

* content, T5, DIET, TUPE: a batched matmul plus a gathered bias
  (HuggingFace ``T5Attention.compute_bias``: ``bias[:, bucket(j - i)]``);
* Shaw, M2, M4, M4M: the relative table gathered to an ``(n, m, d)`` tensor and
  contracted with ``einsum`` (tensor2tensor ``_relative_attention_inner``;
  HuggingFace BERT ``relative_key`` / ``relative_key_query``, the latter being M4);
* DeBERTa: ``q @ pos_keyᵀ`` and ``k @ pos_queryᵀ`` followed by
  ``torch.gather`` (HuggingFace ``DisentangledSelfAttention.disentangled_attention_bias``).

Same names and arguments as `posenc.<name>` (no ``out=``).  Grouped-query ``k`` and
``v`` (``H_kv`` heads dividing ``H``) are repeated per query head with
``repeat_interleave``, as HuggingFace's ``repeat_kv`` does.  Half precision
(float16, bfloat16) is accepted here on any device (and needs no ml_dtypes).  Segment ids are
range-checked on CPU only (a check on an accelerator would synchronise it).
"""

from __future__ import annotations

import functools
import math

import torch

from .._attention import ATTENTION_OPTIONS, Attention, attention_dropout_mask
from .._registry import REGISTRY
from ._common import bucket_index, check_segment_range, seed_value, validate, validate_attention

__all__ = ["alibi", "attention", "content", "cope", "deberta", "diet_abs", "diet_rel", "fox", "m2", "m4",
           "m4m", "kerple", "relative_bias", "relative_bias_2d", "rope", "shaw", "t5", "tupe"]


def _check(method, tensors, params):
    """Validate like posenc (eager only: dynamo cannot trace NumPy)."""
    if not torch.compiler.is_compiling():
        validate(method, tensors, params, allow_half=True)
        check_segment_range(tensors.get("segment_q"), tensors.get("segment_k"),
                            tensors.get("segment_table"))


def _scale(scale, d: int, factor: int = 1) -> float:
    """The default 1/sqrt(factor * d) (1 when d = 0), or the given scale."""
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(factor * d) if d else 1.0


def _content(q, k, scale):
    """s q kᵀ: (B, H, n, m)."""
    return torch.matmul(q, k.transpose(-1, -2)) * scale


def _relative_vectors(rel_k, index):
    """rel_k[c(i, j)] gathered: (n, m, d) for a head-shared table, else (H, n, m, d)."""
    if rel_k.shape[0] == 1:
        return rel_k[0][index]
    return rel_k[:, index]


def _dot_relative(x, vectors, query_side: bool):
    """x_i . a_ij (query side) or x_j . a_ij (key side), by einsum as HF BERT does."""
    if vectors.dim() == 3:
        spec = "bhid,ijd->bhij" if query_side else "bhjd,ijd->bhij"
    else:
        spec = "bhid,hijd->bhij" if query_side else "bhjd,hijd->bhij"
    return torch.einsum(spec, x, vectors)


def _clipped_index(max_distance, q, k, query_offset):
    """clipped(j - i', max_distance) for every (i, j): Shaw, M2, M4, M4M."""
    return bucket_index("clipped", (max_distance,), q.shape[-2], k.shape[-2], q, query_offset)


def _scalar_bias(table, index):
    """table[h, index[i, j]] as (1, H|1, n, m), ready to add to the logits."""
    return table[:, index].unsqueeze(0)


def _segment_bias(segment_q, segment_k, segment_table):
    """DIET eq. (2): segment_table[h, S(i), S(j)] as (B, H|1, n, m)."""
    rows = segment_q.long()[:, :, None]           # (B, n, 1)
    cols = segment_k.long()[:, None, :]           # (B, 1, m)
    return segment_table[:, rows, cols].transpose(0, 1)


# ------------------------------------------------------------------ methods

def content(q, k, *, scale=None, query_offset=0):
    _check("content", {"q": q, "k": k}, {"scale": scale, "query_offset": query_offset})
    return _content(q, k, _scale(scale, q.shape[-1]))


def shaw(q, k, rel_k, *, max_distance, scale=None, query_offset=0):
    _check("shaw", {"q": q, "k": k, "rel_k": rel_k},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    s = _scale(scale, q.shape[-1])
    a = _relative_vectors(rel_k, _clipped_index(max_distance, q, k, query_offset))
    return (torch.matmul(q, k.transpose(-1, -2)) + _dot_relative(q, a, True)) * s


def t5(q, k, bias, *, num_buckets=32, max_distance=128, bidirectional=True, scale=1.0,
       query_offset=0):
    _check("t5", {"q": q, "k": k, "bias": bias},
           {"num_buckets": num_buckets, "max_distance": max_distance,
            "bidirectional": bidirectional, "scale": scale, "query_offset": query_offset})
    index = bucket_index("t5", (num_buckets, max_distance, int(bidirectional)),
                         q.shape[-2], k.shape[-2], q, query_offset)
    return _content(q, k, _scale(scale, 0)) + _scalar_bias(bias, index)


def m2(q, k, rel, *, max_distance, scale=None, query_offset=0):
    _check("m2", {"q": q, "k": k, "rel": rel},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    index = _clipped_index(max_distance, q, k, query_offset)
    return _content(q, k, _scale(scale, q.shape[-1])) * _scalar_bias(rel, index)


def m4(q, k, rel_k, *, max_distance, scale=None, query_offset=0):
    _check("m4", {"q": q, "k": k, "rel_k": rel_k},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    s = _scale(scale, q.shape[-1])
    a = _relative_vectors(rel_k, _clipped_index(max_distance, q, k, query_offset))
    return (torch.matmul(q, k.transpose(-1, -2)) + _dot_relative(q, a, True)
            + _dot_relative(k, a, False)) * s


def m4m(q, k, rel_k, *, max_distance, scale=None, query_offset=0):
    _check("m4m", {"q": q, "k": k, "rel_k": rel_k},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    s = _scale(scale, q.shape[-1])
    a = _relative_vectors(rel_k, _clipped_index(max_distance, q, k, query_offset))
    return _content(q, k, s) * _dot_relative(q, a, True) * _dot_relative(k, a, False)


def deberta(q, k, pos_key, pos_query, *, att_span, position_buckets=-1,
            max_relative_positions=-1, scale=None, query_offset=0):
    _check("deberta", {"q": q, "k": k, "pos_key": pos_key, "pos_query": pos_query},
           {"att_span": att_span, "position_buckets": position_buckets,
            "max_relative_positions": max_relative_positions, "scale": scale,
            "query_offset": query_offset})
    s = _scale(scale, q.shape[-1], 3)
    B, H, n, _ = q.shape
    m = k.shape[-2]
    # position[i, j] = clip(delta(i, j) + att_span, 0, 2 att_span - 1), delta = i - j
    position = bucket_index("deberta", (att_span, position_buckets, max_relative_positions),
                            n, m, q, query_offset)
    scores = torch.matmul(q, k.transpose(-1, -2))
    # content -> position: q_i . pos_key[p(i, j)]
    c2p = torch.matmul(q, pos_key.transpose(-1, -2))                      # (B, H, n, 2 span)
    scores = scores + torch.gather(c2p, -1, position.expand(B, H, n, m))
    # position -> content: k_j . pos_query[p(i, j)], gathered along the key's rows
    p2c = torch.matmul(k, pos_query.transpose(-1, -2))                    # (B, H, m, 2 span)
    scores = scores + torch.gather(p2c, -1,
                                   position.t().expand(B, H, m, n)).transpose(-1, -2)
    return scores * s


def _reset(v, theta, query_offset):
    """TUPE eq. (9): the row of position 0 ([CLS] to others) = theta[h, 0]; column 0
    of the others = theta[h, 1]."""
    n, m = v.shape[-2], v.shape[-1]
    first_row = (torch.arange(n, device=v.device) + query_offset == 0)[:, None]
    first_col = (torch.arange(m, device=v.device) == 0)[None, :]
    to_cls = theta[:, 1, None, None]
    from_cls = theta[:, 0, None, None]
    return torch.where(first_row, from_cls, torch.where(first_col, to_cls, v))


def tupe(q, k, pos_q, pos_k, *, bias=None, theta=None, num_buckets=32, max_distance=128,
         bidirectional=True, scale=None, query_offset=0):
    _check("tupe", {"q": q, "k": k, "pos_q": pos_q, "pos_k": pos_k, "bias": bias, "theta": theta},
           {"num_buckets": num_buckets, "max_distance": max_distance,
            "bidirectional": bidirectional, "scale": scale, "query_offset": query_offset})
    s = _scale(scale, q.shape[-1], 2)
    # the position-only correlation v (H|1, n, m), TUPE eq. (7) / (8)
    positional = torch.matmul(pos_q, pos_k.transpose(-1, -2)) * s
    if bias is not None:
        index = bucket_index("t5", (num_buckets, max_distance, int(bidirectional)),
                             q.shape[-2], k.shape[-2], q, query_offset)
        positional = positional + bias[:, index]
    if theta is not None:
        positional = _reset(positional, theta, query_offset)
    return _content(q, k, s) + positional.unsqueeze(0)


def diet_abs(q, k, pos_q, pos_k, *, segment_q=None, segment_k=None, segment_table=None,
             scale=None, query_offset=0):
    _check("diet_abs", {"q": q, "k": k, "pos_q": pos_q, "pos_k": pos_k, "segment_q": segment_q,
                        "segment_k": segment_k, "segment_table": segment_table},
           {"scale": scale, "query_offset": query_offset})
    # DIET eq. (1): the positional term P_Q P_Kᵀ is not scaled
    scores = _content(q, k, _scale(scale, q.shape[-1]))
    scores = scores + torch.matmul(pos_q, pos_k.transpose(-1, -2)).unsqueeze(0)
    if segment_table is not None:
        scores = scores + _segment_bias(segment_q, segment_k, segment_table)
    return scores


def diet_rel(q, k, rel, *, max_distance, segment_q=None, segment_k=None, segment_table=None,
             scale=None, query_offset=0):
    _check("diet_rel", {"q": q, "k": k, "rel": rel, "segment_q": segment_q,
                        "segment_k": segment_k, "segment_table": segment_table},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    index = bucket_index("clipped_reversed", (max_distance,), q.shape[-2], k.shape[-2], q,
                         query_offset)
    scores = _content(q, k, _scale(scale, q.shape[-1])) + _scalar_bias(rel, index)
    if segment_table is not None:
        scores = scores + _segment_bias(segment_q, segment_k, segment_table)
    return scores


def relative_bias(q, k, bias, *, max_distance, scale=None, query_offset=0):
    _check("relative_bias", {"q": q, "k": k, "bias": bias},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    index = _clipped_index(max_distance, q, k, query_offset)
    return _content(q, k, _scale(scale, q.shape[-1])) + _scalar_bias(bias, index)


def _grid_index(coords_q, coords_k, max_distance):
    """The table entry of every pair (B|1, n, m), as Swin's relative_position_index (in
    posenc's key-minus-query order), global tokens ((-1, -1)) at T, T + 1, T + 2."""
    ty, tx = REGISTRY["relative_bias_2d"].param_kinds["max_distance"].check(
        "max_distance", max_distance)
    T = (2 * ty + 1) * (2 * tx + 1)
    cq, ck = coords_q.long()[:, :, None, :], coords_k.long()[:, None, :, :]
    delta = ck - cq                                                      # (B|1, n, m, 2)
    index = ((delta[..., 0].clamp(-ty, ty) + ty) * (2 * tx + 1)
             + delta[..., 1].clamp(-tx, tx) + tx)
    global_q, global_k = (cq == -1).all(-1), (ck == -1).all(-1)
    return torch.where(global_q, torch.where(global_k, T + 2, T),
                       torch.where(global_k, T + 1, index))


def relative_bias_2d(q, k, bias, *, coords_q, coords_k, max_distance, scale=None,
                     query_offset=0):
    _check("relative_bias_2d", {"q": q, "k": k, "bias": bias, "coords_q": coords_q,
                                "coords_k": coords_k},
           {"max_distance": max_distance, "scale": scale, "query_offset": query_offset})
    index = _grid_index(coords_q, coords_k, max_distance)
    # Swin's and BEiT's gather of the table by the pairs' index, per head
    term = bias[:, index].transpose(0, 1)                                # (B|1, H|1, n, m)
    return _content(q, k, _scale(scale, q.shape[-1])) + term.to(q.dtype)


def _distance(q, k, query_offset):
    """|j - i'| (n, m) in q's dtype, on its device (ALiBi, KERPLE)."""
    rows = torch.arange(q.shape[-2], device=q.device, dtype=torch.float64) + query_offset
    columns = torch.arange(k.shape[-2], device=q.device, dtype=torch.float64)
    return (columns[None, :] - rows[:, None]).abs().to(q.dtype)


def alibi(q, k, slopes, *, scale=None, query_offset=0):
    _check("alibi", {"q": q, "k": k, "slopes": slopes},
           {"scale": scale, "query_offset": query_offset})
    # BLOOM / the ALiBi authors' bias, m |j - i| per head, subtracted
    bias = slopes[:, None, None] * _distance(q, k, query_offset)
    return _content(q, k, _scale(scale, q.shape[-1])) - bias


def kerple(q, k, r1, r2, *, kind="log", scale=None, query_offset=0):
    _check("kerple", {"q": q, "k": k, "r1": r1, "r2": r2},
           {"kind": kind, "scale": scale, "query_offset": query_offset})
    distance = _distance(q, k, query_offset)
    r1, r2 = r1[:, None, None], r2[:, None, None]
    if kind == "log":                  # KERPLE's logarithmic kernel
        kernel = torch.log1p(r2 * distance)
    else:                              # its power kernel, 0^r2 = 0 (no NaN in r2's gradient)
        kernel = torch.where(distance > 0, distance.clamp(min=1) ** r2, 0.0)
    return _content(q, k, _scale(scale, q.shape[-1])) - r1 * kernel


def _fox_prefix(gates):
    """The gates' inclusive prefix sums over the keys, in float32 at least (B, H|1, m)."""
    return torch.cumsum(gates.to(torch.promote_types(gates.dtype, torch.float32)), dim=-1)


def fox(q, k, log_fgate, *, log_fgate_reverse=None, scale=None, query_offset=0):
    _check("fox", {"q": q, "k": k, "log_fgate": log_fgate,
                   "log_fgate_reverse": log_fgate_reverse},
           {"scale": scale, "query_offset": query_offset})
    # FoX's decay as its authors compute it: differences of the gates' prefix sums
    rows = torch.arange(q.shape[-2], device=q.device) + query_offset
    before = torch.arange(k.shape[-2], device=q.device)[None, :] <= rows[:, None]   # j <= i'
    c = _fox_prefix(log_fgate)
    decay = c[..., rows, None] - c[..., None, :]
    other = torch.zeros((), dtype=decay.dtype, device=q.device)
    if log_fgate_reverse is not None:
        r = _fox_prefix(log_fgate_reverse)
        other = r[..., None, :] - r[..., rows, None]
    decay = torch.where(before, decay, other)
    return _content(q, k, _scale(scale, q.shape[-1])) + decay.to(q.dtype)


def cope(q, k, pos_emb, *, causal=False, scale=None, query_offset=0):
    return _cope_masked(q, k, pos_emb, causal=causal, scale=scale, query_offset=query_offset)


def _cope_masked(q, k, pos_emb, *, causal=False, scale=None, query_offset=0, seen=None):
    """cope, its gates over `seen` (B|1, 1, n, m) bool, the keys each row sees (a fused
    attention's masks: attention); None: every key, or with causal the keys j <= i'."""
    _check("cope", {"q": q, "k": k, "pos_emb": pos_emb},
           {"causal": causal, "scale": scale, "query_offset": query_offset})
    logits = _content(q, k, _scale(scale, q.shape[-1]))
    # x-transformers' CoPE: the gates' reverse sums along the row, clamped, and the
    # projections q . pos_emb interpolated between the rows around each position
    gates = torch.sigmoid(logits)
    if seen is None and causal:
        rows = torch.arange(q.shape[-2], device=q.device) + query_offset
        seen = torch.arange(k.shape[-2], device=q.device)[None, :] <= rows[:, None]
    if seen is not None:
        gates = torch.where(seen, gates, 0.0)
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=pos_emb.shape[-2] - 1)
    table = pos_emb if pos_emb.dim() == 3 else pos_emb[None]
    projections = torch.matmul(q, table.transpose(-1, -2))              # (B, H, n, P)
    floor = torch.nan_to_num(positions.detach()).floor()
    w = positions - floor
    lo = floor.long()
    hi = lo + (w > 0).long()
    return logits + (w * projections.gather(-1, hi) + (1 - w) * projections.gather(-1, lo))


def _rotate(x, cos, sin, positions, interleaved: bool):
    """x (B, H, L, d) rotated pair by pair (HuggingFace's apply_rotary_pos_emb for the
    half split, rotate_half; GPT-J's for interleaved pairs), rows `positions` ((B, L)
    or (L,)) of the (P, r) tables; dimensions past 2r (partial rotary) pass."""
    r = cos.shape[-1]
    c, s = (cos, sin) if positions is None else (cos[positions], sin[positions])
    if c.dim() == 3:                              # per batch row: (B, 1, L, r)
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    if interleaved:
        x1, x2 = x[..., 0:2 * r:2], x[..., 1:2 * r:2]
        pairs = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = x[..., :r], x[..., r:2 * r]
        pairs = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((pairs, x[..., 2 * r:]), dim=-1)


def rope(q, k, cos, sin, *, cos_k=None, sin_k=None, interleaved=False, positions_q=None,
         positions_k=None, scale=None, query_offset=0):
    if cos.dim() == 4 and cos_k is not None and sin_k is not None:
        # per-token tables (SPEC 3.16): the keys' follow k, repeated per query head
        cos_k, sin_k = per_query_head(cos_k, q.shape[1]), per_query_head(sin_k, q.shape[1])
    _check("rope", {"q": q, "k": k, "cos": cos, "sin": sin, "cos_k": cos_k, "sin_k": sin_k,
                    "positions_q": positions_q, "positions_k": positions_k},
           {"interleaved": interleaved, "scale": scale, "query_offset": query_offset})
    if cos.dim() == 4:       # each row its own (HF's position_embeddings, M-RoPE, 2-D RoPE)
        q = _rotate(q, cos, sin, None, interleaved)
        k = _rotate(k, cos_k, sin_k, None, interleaved)
        return _content(q, k, _scale(scale, q.shape[-1]))
    if positions_q is None:
        positions_q = torch.arange(q.shape[-2], device=q.device) + query_offset
    if positions_k is None:
        positions_k = torch.arange(k.shape[-2], device=k.device)
    q = _rotate(q, cos, sin, positions_q.long(), interleaved)
    k = _rotate(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k,
                positions_k.long(), interleaved)
    return _content(q, k, _scale(scale, q.shape[-1]))


# ------------------------------------------------------------------ fused attention

def document_ids(name: str, ids):
    """Document ids as int64 by value (SPEC §7), as posenc._attention's: a uint64 id
    >= 2**63 is a ValueError (checked on CPU outside torch.compile: elsewhere it would
    cost a device synchronisation, as check_segment_range's)."""
    if ids.dtype == torch.uint64:
        wide = ids.view(torch.int64)                 # the same bits: >= 2**63 is negative
        if ids.device.type == "cpu" and not torch.compiler.is_compiling() and (wide < 0).any():
            raise ValueError(f"{name} holds an id outside the int64 range (dtype "
                             f"{ids.dtype}); document ids are compared as int64 values")
        return wide
    return ids.to(torch.int64)


def attention_mask(q, k, query_offset: int, causal: bool, key_padding_mask, window, document_q,
          document_k):
    """(B|1, 1, n, m) bool, True where a logit is masked (SPEC §6, §7), or None."""
    n, m = q.shape[-2], k.shape[-2]
    offset = (torch.arange(m, device=q.device)[None, :]
              - torch.arange(n, device=q.device)[:, None] - query_offset)[None, None]   # j - i'
    masked = []
    if causal:
        masked.append(offset > 0)
    if window is not None:
        left, right = window
        if left is not None:
            masked.append(offset < -left)
        if right is not None:
            masked.append(offset > right)
    if document_q is not None:
        document_q, document_k = (document_ids(name, ids.to(q.device)) for name, ids in
                                  (("document_q", document_q), ("document_k", document_k)))
        masked.append(document_q[:, None, :, None] != document_k[:, None, None, :])
    if key_padding_mask is not None:
        masked.append(key_padding_mask.to(device=q.device, dtype=torch.bool)[:, None, None, :])
    result = None
    for mask in masked:
        result = mask if result is None else result | mask
    return result


def softmax(logits, sinks=None):
    """(P, lse) of masked logits (B, H, n, m): softmax over the keys with each head's
    sink (gpt-oss: a logit with no value, in the denominator only) when given; a row
    whose keys are all masked has P = 0 (not NaN) and lse -inf, or the sink."""
    if sinks is not None:
        sink_column = sinks.to(logits.dtype)[None, :, None, None].expand(*logits.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat([logits, sink_column], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(logits, dim=-1)
    empty = torch.isneginf(lse)[..., None]
    return torch.where(empty, 0.0, torch.exp(logits - lse[..., None].masked_fill(empty, 0.0))), lse


def attention(method: str, tensors: tuple, params: tuple, attention: tuple) -> Attention:
    """The fused attention of SPEC §6 and §7 (posenc.torch.<method>_attention) by the
    native logits of `method`, the softcap, the mask, a softmax with the sinks, the
    dropout decisions of posenc.attention_dropout_mask (the C kernels' own) and a
    matmul; any device."""
    spec = REGISTRY[method]
    v, *values = attention
    options = dict(zip((name for name, _ in ATTENTION_OPTIONS), values))
    if not torch.compiler.is_compiling():
        validate_attention(method, tensors, params, attention)
    names = tuple(name for name, _ in spec.params)
    q, k = tensors[0], tensors[1]
    masked = attention_mask(q, k, params[-1], options["causal"], options["key_padding_mask"],
                   options["window"], options["document_q"], options["document_k"])
    if masked is not None:
        # keys no row sees (padding, other documents, a cache's unused slots) never
        # read: their k and v rows enter as zeros (a NaN there would reach the rows
        # through the matmuls, 0 * NaN); their gradients are zero
        unseen = masked.all(dim=-2)[..., None]                     # (B|1, 1, m, 1)
        k, v = torch.where(unseen, 0.0, k), torch.where(unseen, 0.0, v)
        tensors = (q, k) + tuple(tensors[2:])
    named = dict(zip(names, params))
    formula = _FORMULAS[method]
    if spec.reads_mask:            # its logits read the keys each row sees (CoPE's gates)
        formula = functools.partial(_MASKED_FORMULAS[method],
                                    seen=None if masked is None else ~masked)
    logits = formula(**dict(zip(spec.tensors, tensors)), **named)
    if options["softcap"] is not None:                 # Gemma 2
        logits = options["softcap"] * torch.tanh(logits / options["softcap"])
    if masked is not None:
        logits = logits.masked_fill(masked, float("-inf"))
    probabilities, lse = softmax(logits, options["sinks"])
    dropout_p, seed = options["dropout_p"], options["seed"]
    if dropout_p:
        keep = attention_dropout_mask(seed_value(seed), tuple(logits.shape), dropout_p)
        probabilities = probabilities * torch.from_numpy(keep).to(probabilities.device) / (
            1.0 - dropout_p)
    return Attention(torch.matmul(probabilities, per_query_head(v, q.shape[1])), lse)


def per_query_head(x, H: int):
    """k or v (B, H_kv, m, .) with each head repeated for the H / H_kv query heads of
    its group (HuggingFace ``repeat_kv``); x itself when it has H heads or a shape
    the checks will refuse."""
    if x.dim() != 4 or x.shape[1] in (0, H) or H % x.shape[1]:
        return x
    return x.repeat_interleave(H // x.shape[1], dim=1)


def _grouped(formula):
    """The formula taking k with H_kv heads (SPEC §7): k repeated per query head."""
    @functools.wraps(formula)
    def grouped(q, k, *args, **kwargs):
        return formula(q, per_query_head(k, q.shape[1]) if q.dim() == 4 else k, *args, **kwargs)
    return grouped


for _method in REGISTRY:
    globals()[_method] = _grouped(globals()[_method])
del _method
_FORMULAS = {method: globals()[method] for method in REGISTRY}
# The formulas of the methods whose logits read the mask (REGISTRY[m].reads_mask), with
# `seen` (B|1, 1, n, m): _<method>_masked, k per query head as the others'.
_MASKED_FORMULAS = {method: _grouped(globals()[f"_{method}_masked"]) for method in REGISTRY
                    if REGISTRY[method].reads_mask}
