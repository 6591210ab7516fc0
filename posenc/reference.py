"""posenc.reference: the NumPy twin of every public function (SPEC §4).

`posenc.<name>` computes the attention logits of a positional-encoding method
with fused C kernels; `posenc.reference.<name>` computes the same thing in
plain NumPy, written *literally* from the formula of SPEC §3, so that the two
are independent and one can cross-check the other.  Nothing here is clever:

* every positional term is materialised -- the (n, m) grid of offsets, its
  bucket rows from `posenc.buckets`, the gathered (H, n, m[, d]) relative
  tensor -- and contracted with `numpy.einsum`;
* the arithmetic is done in float64 and the result rounded once to the input
  dtype (float32 in, float32 out; bfloat16 and float16 alike, the attention's
  lse float32 for those), a new C-contiguous array or `out=`;
* every `<name>_backward(G, ...)` is a hand-written gradient of
  `sum(G * <name>(...))` (no autograd), with the derivative of each term
  written next to it.  A parameter with head axis 1 is used as if tiled to H
  heads, so its gradient is the per-head gradient summed over heads.

Arguments are validated by the same checkers as the C path
(`posenc._checks`), so both namespaces raise the same exceptions.  Two
baselines exist only here (SPEC §3.11): `absolute_input`, BERT's
input-additive position embedding, and `bert_ad`, TUPE's BERT-A^d ablation;
their checkers are at the end of this file.

Slow by design: memory O(H n m d).  Use it on test-sized problems.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from . import _checks, buckets
from ._dtypes import lse_dtype, narrow
from ._attention import (ATTENTION_GRAD_TYPES, Attention, attention_dropout_mask, check_attention,
                         check_attention_grad, check_attention_out)
from ._registry import (GRAD_FIELDS, GRAD_TYPES, REGISTRY, attention_backward_doc, attention_doc,
                        backward_doc, forward_doc)
from ._signatures import define

BASELINES = ("bert_ad", "absolute_input")
METHODS = tuple(REGISTRY) + BASELINES

_WHERE = "plain NumPy, literally from the SPEC formula (posenc.reference)"


# ------------------------------------------------------------------- helpers

def _wide(array) -> np.ndarray:
    """The array in float64 to compute with (accumulate in float64, cast at the end)."""
    return np.asarray(array, dtype=np.float64)


def _per_head(param, H: int) -> np.ndarray:
    """A (H|1, ...) parameter as (H, ...): head axis 1 is shared by all heads."""
    wide = _wide(param)
    return np.broadcast_to(wide, (H,) + wide.shape[1:])


def _fold_heads(grad: np.ndarray, param, axis: int = 0) -> np.ndarray:
    """Gradient of a (H|1, ...) parameter from its per-head gradient (H, ...), the head
    axis at `axis` (FoX's (B, H|1, m) gates: 1).

    A shared parameter (head axis 1) feeds every head: its gradient is the
    sum over heads."""
    if param.shape[axis] == 1 and grad.shape[axis] != 1:
        grad = grad.sum(axis=axis, keepdims=True)
    return grad


def _key_minus_query(p) -> np.ndarray:
    """offset[i, j] = j - i', the (n, m) grid of SPEC §1, query i at position
    i' = query_offset + i."""
    rows = p.params["query_offset"] + np.arange(p.n, dtype=np.int64)
    return np.arange(p.m, dtype=np.int64)[None, :] - rows[:, None]


def _query_minus_key(p) -> np.ndarray:
    """offset[i, j] = i' - j (DIET-REL's R_{i-j}, DeBERTa's delta)."""
    return -_key_minus_query(p)


def _gather(table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """table (H, R, ...) and rows (n, m) -> (H, n, m, ...): table[h, rows[i, j]]."""
    return table[:, rows]


def _scatter(per_pair: np.ndarray, rows: np.ndarray, num_rows: int) -> np.ndarray:
    """The transpose of _gather: per_pair (H, n, m, ...) summed into (H, num_rows, ...).

    Every pair (i, j) read table row rows[i, j], so its gradient adds there."""
    H = per_pair.shape[0]
    table_grad = np.zeros((H, num_rows) + per_pair.shape[3:])
    np.add.at(table_grad, (np.arange(H)[:, None, None], rows[None, :, :]), per_pair)
    return table_grad


def per_query_head(x, H: int) -> np.ndarray:
    """k or v (B, H_kv, m, .) in float64 with each head repeated for the H / H_kv
    query heads of its group (SPEC §7: query head h reads key head h div (H / H_kv))."""
    x = _wide(x)
    return x if x.shape[1] == H else np.repeat(x, H // x.shape[1], axis=1)


def fold_groups(grad, H_kv: int) -> np.ndarray:
    """A (B, H, m, .) gradient of a repeated k or v summed over each group's query heads."""
    B, H, m, d = grad.shape
    return grad if H_kv == H else grad.reshape(B, H_kv, H // H_kv, m, d).sum(axis=2)


def _qk(p) -> tuple:
    return _wide(p.arrays["q"]), per_query_head(p.arrays["k"], p.H)


def _dot_qk(q, k) -> np.ndarray:
    """q_i.k_j, (B, H, n, m)."""
    return np.einsum("bhid,bhjd->bhij", q, k)


def _content_term_grads(p, G, weight=None) -> dict:
    """Gradients of sum(G * s * w * q_i.k_j), w an optional (B|1, H, n, m) weight.

    d(s w q_i.k_j)/dq_i = s w k_j,  d(s w q_i.k_j)/dk_j = s w q_i."""
    q, k = _qk(p)
    s = p.params["scale"]
    Gw = G if weight is None else G * weight
    return {"q": s * np.einsum("bhij,bhjd->bhid", Gw, k),
            "k": s * np.einsum("bhij,bhid->bhjd", Gw, q)}


def _segment_term(p) -> np.ndarray | float:
    """E_S[b, h, i, j] = segment_table[h, segment_q[b, i], segment_k[b, j]], or 0."""
    if "segment_table" not in p.arrays:
        return 0.0
    table = _per_head(p.arrays["segment_table"], p.H)
    seg_q = np.asarray(p.arrays["segment_q"], dtype=np.intp)
    seg_k = np.asarray(p.arrays["segment_k"], dtype=np.intp)
    heads = np.arange(p.H)[None, :, None, None]
    return table[heads, seg_q[:, None, :, None], seg_k[:, None, None, :]]


def _segment_grad(p, G) -> dict:
    """dE_S[b,h,i,j]/d segment_table[h, S(i), S(j)] = 1: scatter G into the table."""
    if "segment_table" not in p.arrays:
        return {}
    table = p.arrays["segment_table"]
    seg_q = np.asarray(p.arrays["segment_q"], dtype=np.intp)
    seg_k = np.asarray(p.arrays["segment_k"], dtype=np.intp)
    per_head = np.zeros((p.H,) + table.shape[1:])
    heads = np.arange(p.H)[None, :, None, None]
    np.add.at(per_head, (heads, seg_q[:, None, :, None], seg_k[:, None, None, :]), G)
    return {"segment_table": _fold_heads(per_head, table)}


def _clipped_rows(p) -> np.ndarray:
    """c(i, j) = clipped(j - i, max_distance): Shaw, M2, M4, M4M."""
    return buckets.clipped(_key_minus_query(p), p.params["max_distance"])


def _t5_rows(p) -> np.ndarray:
    """t5(j - i) with the call's num_buckets, max_distance, bidirectional."""
    return buckets.t5(_key_minus_query(p), p.params["num_buckets"],
                      p.params["max_distance"], p.params["bidirectional"])


# ------------------------------------------------------------- the methods
# Each method is a pair: _<name>_logits(problem) -> A (float64) and
# _<name>_grads(problem, G) -> {field: float64 gradient}.

# SPEC 3.1  A_ij = s q_i.k_j
def _content_logits(p):
    q, k = _qk(p)
    return p.params["scale"] * _dot_qk(q, k)


def _content_grads(p, G):
    return _content_term_grads(p, G)


# SPEC 3.2  A_ij = s q_i.(k_j + a_ij),  a_ij = rel_k[clipped(j - i, t)]
def _shaw_logits(p):
    q, k = _qk(p)
    a = _gather(_per_head(p.arrays["rel_k"], p.H), _clipped_rows(p))     # (H, n, m, d)
    return p.params["scale"] * (_dot_qk(q, k) + np.einsum("bhid,hijd->bhij", q, a))


def _shaw_grads(p, G):
    q, _ = _qk(p)
    s, rows = p.params["scale"], _clipped_rows(p)
    a = _gather(_per_head(p.arrays["rel_k"], p.H), rows)
    grads = _content_term_grads(p, G)                                 # the s q_i.k_j term
    # d(s q_i.a_ij)/dq_i = s a_ij
    grads["q"] = grads["q"] + s * np.einsum("bhij,hijd->bhid", G, a)
    # d(s q_i.a_ij)/da_ij = s q_i, and a_ij is row c(i, j) of rel_k
    grad_a = s * np.einsum("bhij,bhid->hijd", G, q)
    grads["rel_k"] = _fold_heads(_scatter(grad_a, rows, 2 * p.params["max_distance"] + 1),
                                 p.arrays["rel_k"])
    return grads


# SPEC 3.3  A_ij = s q_i.k_j + bias[h, t5(j - i)]  (bias unscaled)
def _t5_logits(p):
    bias = _gather(_per_head(p.arrays["bias"], p.H), _t5_rows(p))        # (H, n, m)
    return _content_logits(p) + bias[None]


def _t5_grads(p, G):
    grads = _content_term_grads(p, G)
    # d bias[h, t5(j - i)] / d bias[h, row] = 1 where row == t5(j - i)
    grads["bias"] = _fold_heads(_scatter(G.sum(axis=0), _t5_rows(p), p.params["num_buckets"]),
                                p.arrays["bias"])
    return grads


# SPEC 3.4  A_ij = s (q_i.k_j) r_ij,  r_ij = rel[h, clipped(j - i, t)]
def _m2_logits(p):
    q, k = _qk(p)
    r = _gather(_per_head(p.arrays["rel"], p.H), _clipped_rows(p))       # (H, n, m)
    return p.params["scale"] * _dot_qk(q, k) * r[None]


def _m2_grads(p, G):
    q, k = _qk(p)
    s, rows = p.params["scale"], _clipped_rows(p)
    r = _gather(_per_head(p.arrays["rel"], p.H), rows)
    # d/dq_i = s r_ij k_j,  d/dk_j = s r_ij q_i
    grads = _content_term_grads(p, G, weight=r[None])
    # d/dr_ij = s q_i.k_j
    grad_r = s * (G * _dot_qk(q, k)).sum(axis=0)
    grads["rel"] = _fold_heads(_scatter(grad_r, rows, 2 * p.params["max_distance"] + 1),
                               p.arrays["rel"])
    return grads


# SPEC 3.5  A_ij = s (q_i.k_j + q_i.a_ij + k_j.a_ij),  a_ij = rel_k[clipped(j - i, t)]
def _m4_logits(p):
    q, k = _qk(p)
    a = _gather(_per_head(p.arrays["rel_k"], p.H), _clipped_rows(p))     # (H, n, m, d)
    return p.params["scale"] * (_dot_qk(q, k) + np.einsum("bhid,hijd->bhij", q, a)
                                + np.einsum("bhjd,hijd->bhij", k, a))


def _m4_grads(p, G):
    q, k = _qk(p)
    s, rows = p.params["scale"], _clipped_rows(p)
    a = _gather(_per_head(p.arrays["rel_k"], p.H), rows)
    grads = _content_term_grads(p, G)
    # d(s q_i.a_ij)/dq_i = s a_ij
    grads["q"] = grads["q"] + s * np.einsum("bhij,hijd->bhid", G, a)
    # d(s k_j.a_ij)/dk_j = s a_ij
    grads["k"] = grads["k"] + s * np.einsum("bhij,hijd->bhjd", G, a)
    # d(s (q_i + k_j).a_ij)/da_ij = s (q_i + k_j)
    grad_a = s * (np.einsum("bhij,bhid->hijd", G, q) + np.einsum("bhij,bhjd->hijd", G, k))
    grads["rel_k"] = _fold_heads(_scatter(grad_a, rows, 2 * p.params["max_distance"] + 1),
                                 p.arrays["rel_k"])
    return grads


# SPEC 3.6  A_ij = s u v w,  u = q_i.k_j, v = q_i.a_ij, w = k_j.a_ij
def _m4m_factors(p):
    q, k = _qk(p)
    a = _gather(_per_head(p.arrays["rel_k"], p.H), _clipped_rows(p))
    u = _dot_qk(q, k)
    v = np.einsum("bhid,hijd->bhij", q, a)
    w = np.einsum("bhjd,hijd->bhij", k, a)
    return q, k, a, u, v, w


def _m4m_logits(p):
    _, _, _, u, v, w = _m4m_factors(p)
    return p.params["scale"] * u * v * w


def _m4m_grads(p, G):
    q, k, a, u, v, w = _m4m_factors(p)
    s = p.params["scale"]
    # d(s u v w)/dq_i = s (v w k_j + u w a_ij)   (u and v depend on q_i)
    grad_q = s * (np.einsum("bhij,bhjd->bhid", G * v * w, k)
                  + np.einsum("bhij,hijd->bhid", G * u * w, a))
    # d(s u v w)/dk_j = s (v w q_i + u v a_ij)   (u and w depend on k_j)
    grad_k = s * (np.einsum("bhij,bhid->bhjd", G * v * w, q)
                  + np.einsum("bhij,hijd->bhjd", G * u * v, a))
    # d(s u v w)/da_ij = s (u w q_i + u v k_j)   (v and w depend on a_ij)
    grad_a = s * (np.einsum("bhij,bhid->hijd", G * u * w, q)
                  + np.einsum("bhij,bhjd->hijd", G * u * v, k))
    rel_k = _fold_heads(_scatter(grad_a, _clipped_rows(p), 2 * p.params["max_distance"] + 1),
                        p.arrays["rel_k"])
    return {"q": grad_q, "k": grad_k, "rel_k": rel_k}


# SPEC 3.7  A_ij = s (q_i.k_j + q_i.pos_key[p(i,j)] + k_j.pos_query[p(i,j)]),
#           p = clip(delta + att_span, 0, 2 att_span - 1), delta = i - j (log-bucketed)
def _deberta_rows(p):
    span = p.params["att_span"]
    position_buckets = p.params["position_buckets"]
    max_relative = p.params["max_relative_positions"]
    delta = _query_minus_key(p)
    if position_buckets > 0 and max_relative > 0:
        delta = buckets.deberta_log(delta, position_buckets, max_relative)
    return np.clip(delta + span, 0, 2 * span - 1)


def _deberta_logits(p):
    q, k = _qk(p)
    rows = _deberta_rows(p)
    key_rel = _gather(_per_head(p.arrays["pos_key"], p.H), rows)        # (H, n, m, d)
    query_rel = _gather(_per_head(p.arrays["pos_query"], p.H), rows)
    c2p = np.einsum("bhid,hijd->bhij", q, key_rel)
    p2c = np.einsum("bhjd,hijd->bhij", k, query_rel)
    return p.params["scale"] * (_dot_qk(q, k) + c2p + p2c)


def _deberta_grads(p, G):
    q, k = _qk(p)
    s, rows = p.params["scale"], _deberta_rows(p)
    key_rel = _gather(_per_head(p.arrays["pos_key"], p.H), rows)
    query_rel = _gather(_per_head(p.arrays["pos_query"], p.H), rows)
    grads = _content_term_grads(p, G)
    # c2p: d(s q_i.pos_key[p])/dq_i = s pos_key[p],  .../d pos_key[p] = s q_i
    grads["q"] = grads["q"] + s * np.einsum("bhij,hijd->bhid", G, key_rel)
    # p2c: d(s k_j.pos_query[p])/dk_j = s pos_query[p],  .../d pos_query[p] = s k_j
    grads["k"] = grads["k"] + s * np.einsum("bhij,hijd->bhjd", G, query_rel)
    rows_total = 2 * p.params["att_span"]
    grads["pos_key"] = _fold_heads(
        _scatter(s * np.einsum("bhij,bhid->hijd", G, q), rows, rows_total), p.arrays["pos_key"])
    grads["pos_query"] = _fold_heads(
        _scatter(s * np.einsum("bhij,bhjd->hijd", G, k), rows, rows_total), p.arrays["pos_query"])
    return grads


# SPEC 3.8  A_ij = s q_i.k_j + reset(v)_ij,  v_ij = s pos_q_i.pos_k_j (+ bias[h, t5(j - i)])
def _tupe_kept(p) -> np.ndarray:
    """(n, m) mask of the v_ij that reset keeps: all of them without theta.
    The [CLS] query is the one at position i' = query_offset + i = 0."""
    kept = np.ones((p.n, p.m), dtype=bool)
    if "theta" in p.arrays:
        cls_row = _cls_rows(p)
        kept[cls_row, :] = False                 # i' == 0: from [CLS] to others
        kept[~cls_row, :1] = False               # i' != 0, j == 0: from others to [CLS]
    return kept


def _cls_rows(p) -> np.ndarray:
    """(n,) True for the query row at position 0 ([CLS])."""
    return p.params["query_offset"] + np.arange(p.n) == 0


def _tupe_logits(p):
    s = p.params["scale"]
    pos_q = _per_head(p.arrays["pos_q"], p.H)
    pos_k = _per_head(p.arrays["pos_k"], p.H)
    v = s * np.einsum("hie,hje->hij", pos_q, pos_k)                     # (H, n, m)
    if "bias" in p.arrays:
        v = v + _gather(_per_head(p.arrays["bias"], p.H), _t5_rows(p))
    reset = v.copy()
    if "theta" in p.arrays:
        theta = _per_head(p.arrays["theta"], p.H)
        cls_row = _cls_rows(p)
        reset[:, cls_row, :] = theta[:, 0, None, None]       # i' == 0
        reset[:, ~cls_row, :1] = theta[:, 1, None, None]     # i' != 0, j == 0
    return _content_logits(p) + reset[None]


def _tupe_grads(p, G):
    s = p.params["scale"]
    pos_q = _per_head(p.arrays["pos_q"], p.H)
    pos_k = _per_head(p.arrays["pos_k"], p.H)
    kept = _tupe_kept(p)
    grads = _content_term_grads(p, G)
    # reset(v)_ij = v_ij where kept, a theta entry elsewhere: d reset/d v = kept
    grad_v = np.where(kept, G, 0.0).sum(axis=0)                         # (H, n, m)
    # d(s pos_q_i.pos_k_j)/d pos_q_i = s pos_k_j,  .../d pos_k_j = s pos_q_i
    grads["pos_q"] = _fold_heads(s * np.einsum("hij,hje->hie", grad_v, pos_k), p.arrays["pos_q"])
    grads["pos_k"] = _fold_heads(s * np.einsum("hij,hie->hje", grad_v, pos_q), p.arrays["pos_k"])
    grads["bias"] = grads["theta"] = None
    if "bias" in p.arrays:
        # d bias[h, t5(j - i)] / d bias[h, row] = 1 where row == t5(j - i)
        grads["bias"] = _fold_heads(_scatter(grad_v, _t5_rows(p), p.params["num_buckets"]),
                                    p.arrays["bias"])
    if "theta" in p.arrays:
        # d reset_ij / d theta[h, 0] = [i' == 0];  d reset_ij / d theta[h, 1] = [i' != 0, j == 0]
        cls_row = _cls_rows(p)
        grad_theta = np.zeros((p.H, 2))
        grad_theta[:, 0] = G[:, :, cls_row, :].sum(axis=(0, 2, 3))
        grad_theta[:, 1] = G[:, :, ~cls_row, :1].sum(axis=(0, 2, 3))
        grads["theta"] = _fold_heads(grad_theta, p.arrays["theta"])
    return grads


# SPEC 3.9  A_ij = s q_i.k_j + pos_q_i.pos_k_j + E_S  (positional term unscaled)
def _diet_abs_logits(p):
    pos_q = _per_head(p.arrays["pos_q"], p.H)
    pos_k = _per_head(p.arrays["pos_k"], p.H)
    positional = np.einsum("hie,hje->hij", pos_q, pos_k)
    return _content_logits(p) + positional[None] + _segment_term(p)


def _diet_abs_grads(p, G):
    pos_q = _per_head(p.arrays["pos_q"], p.H)
    pos_k = _per_head(p.arrays["pos_k"], p.H)
    grads = _content_term_grads(p, G)
    # d(pos_q_i.pos_k_j)/d pos_q_i = pos_k_j,  .../d pos_k_j = pos_q_i
    grads["pos_q"] = _fold_heads(np.einsum("bhij,hje->hie", G, pos_k), p.arrays["pos_q"])
    grads["pos_k"] = _fold_heads(np.einsum("bhij,hie->hje", G, pos_q), p.arrays["pos_k"])
    grads["segment_table"] = None
    grads.update(_segment_grad(p, G))
    return grads


# SPEC 3.10  A_ij = s q_i.k_j + rel[h, clip(i - j, -t, t) + t] + E_S  (DIET eq. 3: R_{i-j})
def _diet_rel_rows(p):
    return buckets.clipped(_query_minus_key(p), p.params["max_distance"])


def _diet_rel_logits(p):
    rel = _gather(_per_head(p.arrays["rel"], p.H), _diet_rel_rows(p))   # (H, n, m)
    return _content_logits(p) + rel[None] + _segment_term(p)


def _diet_rel_grads(p, G):
    grads = _content_term_grads(p, G)
    # d rel[h, c(i,j)] / d rel[h, row] = 1 where row == c(i, j)
    grads["rel"] = _fold_heads(
        _scatter(G.sum(axis=0), _diet_rel_rows(p), 2 * p.params["max_distance"] + 1),
        p.arrays["rel"])
    grads["segment_table"] = None
    grads.update(_segment_grad(p, G))
    return grads


# SPEC 3.15  A_ij = s q_i.k_j + bias[h, clipped(j - i, t)]  (any function of the offset)
def _relative_bias_logits(p):
    bias = _gather(_per_head(p.arrays["bias"], p.H), _clipped_rows(p))      # (H, n, m)
    return _content_logits(p) + bias[None]


def _relative_bias_grads(p, G):
    grads = _content_term_grads(p, G)
    # d bias[h, c(i, j)] / d bias[h, row] = 1 where row == c(i, j)
    grads["bias"] = _fold_heads(_scatter(G.sum(axis=0), _clipped_rows(p),
                                         2 * p.params["max_distance"] + 1), p.arrays["bias"])
    return grads


# SPEC 3.13  A_ij = s q_i.k_j - slopes[h] |j - i|  (ALiBi, Press et al. 2022)
def _alibi_logits(p):
    slopes = _per_head(p.arrays["slopes"], p.H)                          # (H,)
    distance = np.abs(_key_minus_query(p)).astype(np.float64)          # (n, m)
    return _content_logits(p) - slopes[None, :, None, None] * distance


def _alibi_grads(p, G):
    grads = _content_term_grads(p, G)
    # d(-m_h |j - i|)/d m_h = -|j - i|, summed over every (b, i, j) of head h
    distance = np.abs(_key_minus_query(p)).astype(np.float64)
    grads["slopes"] = _fold_heads(-np.einsum("bhij,ij->h", G, distance), p.arrays["slopes"])
    return grads


# SPEC 3.14  KERPLE (Chi et al. 2022): A_ij = s q_i.k_j - r1[h] log(1 + r2[h] |j - i|)  (log)
#                                  A_ij = s q_i.k_j - r1[h] |j - i|^r2[h]            (power)
def _kerple_terms(p):
    """(H, n, m) each: the kernel k(|j - i|) = log(1 + r2 |j - i|) or |j - i|^r2 (0^r2 = 0),
    and its derivative in r2 (|j - i| / (1 + r2 |j - i|), or |j - i|^r2 log|j - i|, 0 at 0)."""
    r2 = _per_head(p.arrays["r2"], p.H)[:, None, None]
    distance = np.abs(_key_minus_query(p)).astype(np.float64)[None]
    if p.params["kind"] == "log":
        return np.log(1.0 + r2 * distance), distance / (1.0 + r2 * distance)
    far = distance > 0
    safe = np.where(far, distance, 1.0)
    kernel = np.where(far, safe ** r2, 0.0)
    return kernel, np.where(far, kernel * np.log(safe), 0.0)


def _kerple_logits(p):
    r1 = _per_head(p.arrays["r1"], p.H)[:, None, None]
    kernel, _ = _kerple_terms(p)
    return _content_logits(p) - (r1 * kernel)[None]


def _kerple_grads(p, G):
    grads = _content_term_grads(p, G)
    r1 = _per_head(p.arrays["r1"], p.H)[:, None, None]
    kernel, kernel_r2 = _kerple_terms(p)
    per_head = G.sum(axis=0)                                # (H, n, m)
    # d(-r1 k)/dr1 = -k,  d(-r1 k)/dr2 = -r1 dk/dr2
    grads["r1"] = _fold_heads(-(per_head * kernel).sum(axis=(1, 2)), p.arrays["r1"])
    grads["r2"] = _fold_heads(-(per_head * r1 * kernel_r2).sum(axis=(1, 2)), p.arrays["r2"])
    return grads


# SPEC 3.12  A_ij = s rot(q_i, p_q(i)) . rot_k(k_j, p_k(j))  (RoPE, Su et al. 2021)
# SPEC 3.16  per-token tables: row i of cos, sin (B|1, H|1, n, r) rotates q_i, row j of
# cos_k, sin_k (B|1, H_kv|1, m, r) k_j
def _rope_pairs(p) -> tuple:
    """(first, second): each pair's two components, (t, t + r) or (2t, 2t + 1)."""
    r = p.arrays["cos"].shape[-1]
    first = np.arange(r) * 2 if p.params["interleaved"] else np.arange(r)
    return first, first + 1 if p.params["interleaved"] else first + r


def _rope_rows(p, side: str) -> tuple:
    """The cos and sin rows of every q row (side q) or k row (side k, a key head's
    repeated for its query heads), float64, broadcasting against (B, H, rows, r)."""
    key = side == "k"
    cos = p.arrays["cos_k" if key and p.arrays.get("cos_k") is not None else "cos"]
    sin = p.arrays["sin_k" if key and p.arrays.get("sin_k") is not None else "sin"]
    if cos.ndim == 4:                                   # per token: each row its own
        if key and cos.shape[1] != 1:
            return per_query_head(cos, p.H), per_query_head(sin, p.H)
        return _wide(cos), _wide(sin)
    rows = p.m if key else p.n
    given = p.arrays.get("positions_k" if key else "positions_q")
    positions = (np.asarray(given, dtype=np.intp)[:, None, :] if given is not None else
                 np.arange(rows) + (0 if key else p.params["query_offset"]))
    return _wide(cos)[positions], _wide(sin)[positions]


def _rope_rotated(p, side: str, transpose: bool = False, x=None):
    """x (q or k by default) rotated pair by pair by the rows of its positions:
    (x_a, x_b) -> (x_a c - x_b sn, x_b c + x_a sn), pairs (t, t + r) or (2t, 2t + 1);
    with `transpose` the inverse rotation (sn -> -sn): the gradient's way back."""
    key = side == "k"
    x = _wide(x) if x is not None else (
        per_query_head(p.arrays["k"], p.H) if key else _wide(p.arrays["q"]))
    c, sn = _rope_rows(p, side)
    sn = sn * (-1.0 if transpose else 1.0)
    first, second = _rope_pairs(p)
    y = x.copy()
    y[..., first] = x[..., first] * c - x[..., second] * sn
    y[..., second] = x[..., second] * c + x[..., first] * sn
    return y


def _rope_logits(p):
    return p.params["scale"] * _dot_qk(_rope_rotated(p, "q"), _rope_rotated(p, "k"))


def _rope_grads(p, G):
    # A = s (R_i q_i).(R_j k_j): dq_i = R_i^T (s sum_j G_ij R_j k_j), dk_j likewise
    q_rot, k_rot, s = _rope_rotated(p, "q"), _rope_rotated(p, "k"), p.params["scale"]
    grad_q_rot = s * np.einsum("bhij,bhjd->bhid", G, k_rot)
    grad_k_rot = s * np.einsum("bhij,bhid->bhjd", G, q_rot)
    grads = {"q": _rope_rotated(p, "q", transpose=True, x=grad_q_rot),
             "k": _rope_rotated(p, "k", transpose=True, x=grad_k_rot)}
    if p.arrays["cos"].ndim == 4:
        # per-token tables (SPEC 3.16): a pair (x_a, x_b) -> (x_a c - x_b sn, x_b c + x_a sn),
        # so d/dc = g_a x_a + g_b x_b and d/dsn = g_b x_a - g_a x_b, g the rotated rows'
        first, second = _rope_pairs(p)
        for side, g, x in (("", grad_q_rot, _wide(p.arrays["q"])),
                           ("_k", grad_k_rot, per_query_head(p.arrays["k"], p.H))):
            dc = g[..., first] * x[..., first] + g[..., second] * x[..., second]
            ds = g[..., second] * x[..., first] - g[..., first] * x[..., second]
            for name, grad in (("cos" + side, dc), ("sin" + side, ds)):
                table = p.arrays[name]
                if side:                                # summed over a key head's group
                    grad = fold_groups(grad, p.H_kv)
                if table.shape[0] == 1:
                    grad = grad.sum(axis=0, keepdims=True)
                grads[name] = _fold_heads(grad, table, axis=1)
    return grads


# SPEC 3.11  A_ij = s (q_i.k_j + q_i.pos_k_j + pos_q_i.k_j + pos_q_i.pos_k_j)
def _bert_ad_logits(p):
    q, k = _qk(p)
    pos_q = _per_head(p.arrays["pos_q"], p.H)
    pos_k = _per_head(p.arrays["pos_k"], p.H)
    return p.params["scale"] * (_dot_qk(q, k)
                                + np.einsum("bhid,hjd->bhij", q, pos_k)
                                + np.einsum("hid,bhjd->bhij", pos_q, k)
                                + np.einsum("hid,hjd->hij", pos_q, pos_k)[None])


def _bert_ad_grads(p, G):
    q, k = _qk(p)
    s = p.params["scale"]
    pos_q = _per_head(p.arrays["pos_q"], p.H)
    pos_k = _per_head(p.arrays["pos_k"], p.H)
    # d/dq_i = s (k_j + pos_k_j)  (from q.k and q.pos_k)
    grad_q = s * (np.einsum("bhij,bhjd->bhid", G, k) + np.einsum("bhij,hjd->bhid", G, pos_k))
    # d/dk_j = s (q_i + pos_q_i)  (from q.k and pos_q.k)
    grad_k = s * (np.einsum("bhij,bhid->bhjd", G, q) + np.einsum("bhij,hid->bhjd", G, pos_q))
    # d/d pos_q_i = s (k_j + pos_k_j),  d/d pos_k_j = s (q_i + pos_q_i), summed over the batch
    grad_pos_q = s * (np.einsum("bhij,bhjd->hid", G, k) + np.einsum("bhij,hjd->hid", G, pos_k))
    grad_pos_k = s * (np.einsum("bhij,bhid->hjd", G, q) + np.einsum("bhij,hid->hjd", G, pos_q))
    return {"q": grad_q, "k": grad_k,
            "pos_q": _fold_heads(grad_pos_q, p.arrays["pos_q"]),
            "pos_k": _fold_heads(grad_pos_k, p.arrays["pos_k"])}


# SPEC 3.11  A = s ((x + p) W_Q)((x + p) W_K)^T, per head
def _absolute_input_projections(p):
    inputs = _wide(p.arrays["x"]) + _wide(p.arrays["p"])                # (B, n, D)
    w_q, w_k = _wide(p.arrays["w_q"]), _wide(p.arrays["w_k"])           # (H, D, d)
    queries = np.einsum("bnD,hDd->bhnd", inputs, w_q)
    keys = np.einsum("bnD,hDd->bhnd", inputs, w_k)
    return inputs, w_q, w_k, queries, keys


def _absolute_input_logits(p):
    _, _, _, queries, keys = _absolute_input_projections(p)
    return p.params["scale"] * _dot_qk(queries, keys)


def _absolute_input_grads(p, G):
    inputs, w_q, w_k, queries, keys = _absolute_input_projections(p)
    s = p.params["scale"]
    # A = s Q K^T:  dQ_i = s sum_j G_ij K_j,  dK_j = s sum_i G_ij Q_i
    grad_queries = s * np.einsum("bhij,bhjd->bhid", G, keys)
    grad_keys = s * np.einsum("bhij,bhid->bhjd", G, queries)
    # Q = (x + p) W_Q:  dW_Q = (x + p)^T dQ (summed over the batch),  d(x + p) = dQ W_Q^T
    grad_w_q = np.einsum("bnD,bhnd->hDd", inputs, grad_queries)
    grad_w_k = np.einsum("bnD,bhnd->hDd", inputs, grad_keys)
    grad_inputs = (np.einsum("bhnd,hDd->bnD", grad_queries, w_q)
                   + np.einsum("bhnd,hDd->bnD", grad_keys, w_k))
    # d(x + p)/dx = d(x + p)/dp = identity
    return {"x": grad_inputs, "p": grad_inputs.copy(), "w_q": grad_w_q, "w_k": grad_w_k}


# ------------------------------------------- checkers of the two baselines

def _check_bert_ad(q, k, pos_q, pos_k, *, scale=None, out=None):
    p = _checks._begin("bert_ad", q, k, {"pos_q": pos_q, "pos_k": pos_k})
    heads = {p.H, 1}
    _checks.check_shape("pos_q", pos_q, (heads, p.n, p.d), f"(H|1, n, d) with d = {p.d}")
    _checks.check_shape("pos_k", pos_k, (heads, p.m, p.d), f"(H|1, m, d) with d = {p.d}")
    p.arrays.update(pos_q=pos_q, pos_k=pos_k)
    p.params["scale"] = _checks.check_scale(scale, 1.0 / math.sqrt(4 * p.d) if p.d else 1.0)
    _checks.check_out(out, p)
    return p


def _check_absolute_input(x, p, w_q, w_k, *, scale=None, out=None):
    dtype = _checks.check_floats({"x": x, "p": p, "w_q": w_q, "w_k": w_k})
    _checks.check_rank("x", x, 3, "(B, n, D)")
    B, n, D = x.shape
    _checks.check_shape("p", p, (B, n, D), "(B, n, D), like x")
    _checks.check_rank("w_q", w_q, 3, "(H, D, d)")
    H, _, d = w_q.shape
    _checks.check_shape("w_q", w_q, (H, D, d), f"(H, D, d) with D = {D} from x")
    _checks.check_shape("w_k", w_k, (H, D, d), "(H, D, d), like w_q")
    problem = _checks.Problem("absolute_input", dtype, B, H, n, n, d,
                              arrays={"x": x, "p": p, "w_q": w_q, "w_k": w_k})
    problem.params["scale"] = _checks.check_scale(scale, 1.0 / math.sqrt(d) if d else 1.0)
    _checks.check_out(out, problem)
    return problem


_BASELINE_FORMULAS = {
    "bert_ad": (
        "BERT-A^d, the ablation of TUPE (Ke et al. 2020) (SPEC 3.11):\n"
        "A_ij = s (q_i.k_j + q_i.pos_k_j + pos_q_i.k_j + pos_q_i.pos_k_j);\n"
        "pos_q (H|1, n, d), pos_k (H|1, m, d); s = 1/sqrt(4d).\n"
        "Shapes: q (B, H, n, d), k (B, H, m, d); result A (B, H, n, m)."),
    "absolute_input": (
        "BERT's input-additive position embedding (SPEC 3.11):\n"
        "A[b, h] = s ((x + p) W_Q[h]) ((x + p) W_K[h])^T;\n"
        "x, p (B, n, D); w_q, w_k (H, D, d); result A (B, H, n, n); s = 1/sqrt(d)."),
}


# ------------------------------------------------ fused attention (SPEC §6)
# Written plainly: the logits above, the mask, a softmax, the exported dropout
# decisions, two matmuls; the backward from out and lse as the contract gives them.

def _attention_mask(call) -> np.ndarray:
    """(B, 1, n, m) True where a logit is masked (SPEC §6, §7): causal (j > i' =
    query_offset + i), outside the window (j < i' - left or j > i' + right), another
    document's key, or padding."""
    p = call.problem
    masked = np.zeros((p.B, 1, p.n, p.m), dtype=bool)
    offset = _key_minus_query(p)[None, None]           # j - i'
    if call.causal:
        masked |= offset > 0
    if call.window is not None:
        left, right = call.window
        if left is not None:
            masked |= offset < -left
        if right is not None:
            masked |= offset > right
    if call.document_q is not None:
        masked |= (call.document_q[:, None, :, None] != call.document_k[:, None, None, :])
    if call.key_padding_mask is not None:
        masked |= call.key_padding_mask[:, None, None, :]
    return masked


def _dropout_scale(call) -> np.ndarray | float:
    """D: 1 / (1 - dropout_p) where the dropout keeps a probability, 0 where it drops it."""
    if call.dropout_p == 0.0:
        return 1.0
    p = call.problem
    keep = attention_dropout_mask(call.seed, (p.B, p.H, p.n, p.m), call.dropout_p)
    return keep / (1.0 - call.dropout_p)


def _seen(call):
    """The call's problem, with the keys each row sees set where its method's logits
    read them (CoPE's gates: REGISTRY[m].reads_mask)."""
    p = call.problem
    if REGISTRY[p.method].reads_mask:
        p.seen = ~_attention_mask(call)
    return p


def _capped_logits(call):
    """(A, tanh(A / softcap) or None): the method's logits, soft-capped (SPEC §7)."""
    p = _seen(call)
    logits = globals()[f"_{p.method}_logits"](p)
    if call.softcap is None:
        return logits, None
    t = np.tanh(logits / call.softcap)
    return call.softcap * t, t


def _sink_logits(call):
    """The sinks as (1, H, 1) float64, or None."""
    return None if call.sinks is None else _wide(call.sinks)[None, :, None]


def _probabilities(call, lse=None):
    """(P, lse, tanh or None): softmax_j(capped A + Mask) in float64, a sink (SPEC §7)
    in every row's denominator; a row with every key masked is 0, lse -inf (the sink)."""
    logits, t = _capped_logits(call)
    scores = np.where(_attention_mask(call), -np.inf, logits)
    sinks = _sink_logits(call)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if lse is None:
            keys_max = scores.max(axis=-1) if call.problem.m else np.full(scores.shape[:-1],
                                                                          -np.inf)
            row_max = keys_max
            if sinks is not None:
                row_max = np.where(np.isnan(row_max), row_max, np.maximum(row_max, sinks))
            shift = np.where(np.isneginf(row_max), 0.0, row_max)
            total = np.exp(scores - shift[..., None]).sum(axis=-1)
            if sinks is not None:
                total = total + np.exp(sinks - shift)
            lse = np.log(total) + shift
            if sinks is not None:   # every key masked: lse = the sink (+inf too, SPEC §7)
                lse = np.where(np.isneginf(keys_max), sinks, lse)
        shifted = scores - np.where(np.isneginf(lse), 0.0, lse)[..., None]
        P = np.where(np.isneginf(scores), 0.0, np.exp(shifted))
    return P, lse, t


def _unread(masked, x) -> np.ndarray:
    """(B, m): keys masked for some row whose rows of x (B, H|H_kv, m, ...) hold an Inf
    or NaN: the keys a masked key's "never read" (SPEC §6) must keep out of a product."""
    bad = ~np.isfinite(x).all(axis=tuple(range(3, x.ndim))).all(axis=1)
    return masked.any(axis=(1, 2)) & bad


def _masked_product(weights, masked, v) -> np.ndarray:
    """sum_j weights_ij v_j over the keys row i sees: a masked key's v is never read
    (its 0 weight times a NaN or Inf would be NaN).  (B, H, n, m) x (B, H, m, dv)."""
    if not _unread(masked, v).any():
        return np.einsum("bhij,bhjd->bhid", weights, v)
    with np.errstate(invalid="ignore"):
        terms = np.where(masked[..., None], 0.0, weights[..., None] * v[:, :, None])
    return terms.sum(axis=3)


def _masked_key_grads(p, d_s, masked) -> dict:
    """The method's gradients of sum(dS * A) (_method_grads), where a key masked for a
    row is never read for that row: when some masked key's k holds an Inf or NaN, row
    by row on a copy of the problem whose k is 0 at that row's masked keys (the
    gradients are linear in dS: the rows' sum, and row i's dq from row i's copy)."""
    k = p.arrays["k"]
    if not _unread(masked, k).any():
        return _method_grads(p, d_s)
    total = {}
    for i in range(p.n):
        row = copy.copy(p)
        row.arrays = dict(p.arrays)
        row.arrays["k"] = np.where(masked[:, :, i, :, None], np.zeros((), k.dtype), k)
        d_s_row = np.zeros_like(d_s)
        d_s_row[:, :, i] = d_s[:, :, i]
        for name, grad in _method_grads(row, d_s_row).items():
            if grad is not None and name == "q":   # row i's own: the others read its k
                grad = np.where(np.arange(p.n)[:, None] == i, grad, 0.0)
            total[name] = grad if total.get(name) is None or grad is None else total[name] + grad
    return total


def _attention_forward(call):
    p = call.problem
    P, lse, _ = _probabilities(call)
    out = _masked_product(P * _dropout_scale(call), _attention_mask(call),
                          per_query_head(call.v, p.H))
    result = narrow(out, p.dtype)
    if p.out is not None:
        p.out[...] = result
        result = p.out
    return Attention(result, np.ascontiguousarray(lse, dtype=lse_dtype(p.dtype)))


def _attention_backward(call, d_out, out, lse, d_lse=None):
    """dV = (P D)^T dO; dS = P (D (dO V^T) - rowsum(dO out)) + P dL/dlse (dlse_i/dA_ij =
    P_ij), times 1 - tanh^2 under a softcap; dsinks = -sum_i exp(sink - lse_i)
    rowsum(dO out)_i + sum_i exp(sink - lse_i) dL/dlse_i; the rest is the logits'
    backward of dS."""
    p = call.problem
    lse = _wide(lse)
    P, _, t = _probabilities(call, lse)
    D = _dropout_scale(call)
    d_out, v = _wide(d_out), per_query_head(call.v, p.H)
    grad_v = fold_groups(np.einsum("bhij,bhid->bhjd", P * D, d_out), p.H_kv)
    masked = _attention_mask(call)
    with np.errstate(invalid="ignore"):
        d_p = np.where(masked, 0.0, D * np.einsum("bhid,bhjd->bhij", d_out, v))
    delta = np.einsum("bhid,bhid->bhi", d_out, _wide(out))
    d_s = P * (d_p - delta[..., None])
    if d_lse is not None:       # lse_i = log sum_j exp(A_ij): dlse_i/dA_ij = P_ij
        d_s = d_s + P * _wide(d_lse)[..., None]
    d_s = np.where(masked, 0.0, d_s)
    if t is not None:
        d_s = np.where(masked, 0.0, d_s * (1.0 - t * t))
    grads = _masked_key_grads(_seen(call), d_s, masked)
    grads["v"] = grad_v
    sinks = _sink_logits(call)
    if sinks is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            grads["sinks"] = -(np.exp(sinks - lse) * delta).sum(axis=(0, 2))
            if d_lse is not None:   # dlse_i/dsink = exp(sink - lse_i)
                grads["sinks"] = grads["sinks"] + (np.exp(sinks - lse) * _wide(d_lse)).sum(
                    axis=(0, 2))
    fields = ATTENTION_GRAD_TYPES[p.method]._fields
    return ATTENTION_GRAD_TYPES[p.method](**{
        name: None if grads.get(name) is None
        else narrow(grads[name], p.dtype) for name in fields})


def _attention_call(spec, tensors, params, attention):
    return check_attention(_checks.check(spec, tensors, params, None), *attention)


def _attention(method: str):
    spec = REGISTRY[method]

    def body(tensors, params, attention, out):
        call = _attention_call(spec, tensors, params, attention)
        if out is not None:
            check_attention_out(out, call)
        return _attention_forward(call)

    return define(method, body, name=method + "_attention", form="attention", module=__name__,
                  doc=attention_doc(method, _WHERE))


def _attention_terms(method: str):
    """(capped logits, tanh(A / softcap) or None, masked (B, 1, n, m)) of an attention call
    with <method>_attention's arguments: what posenc._check bounds the kernels' errors by."""
    spec = REGISTRY[method]

    def body(tensors, params, attention, _out):
        call = _attention_call(spec, tensors, params, attention)
        return _capped_logits(call) + (_attention_mask(call),)

    return define(method, body, name=method + "_attention_terms", form="attention",
                  module=__name__, doc=_attention_terms.__doc__)


ATTENTION_TERMS = {method: _attention_terms(method) for method in REGISTRY}


def _attention_backward_function(method: str):
    spec = REGISTRY[method]

    def body(d_out, tensors, params, attention, saved):
        call = _attention_call(spec, tensors, params, attention)
        check_attention_grad(d_out, *saved, call)
        return _attention_backward(call, d_out, *saved)

    return define(method, body, name=method + "_attention_backward", form="attention_backward",
                  module=__name__, doc=attention_backward_doc(method, _WHERE))


# --------------------------------------------------- the public functions

# SPEC 3.17  FoX (Lin et al. 2025): A_ij = s q_i.k_j + D_ij, D_ij the log forget gates summed
# between key j and the query's position i' (the reverse gates past i' when given)
def _fox_gates(p, name):
    """The gates (B, H, m) in float64, or None."""
    gates = p.arrays.get(name)
    return None if gates is None else np.broadcast_to(_wide(gates), (p.B, p.H, p.m))


def _fox_logits(p):
    gates, reverse = _fox_gates(p, "log_fgate"), _fox_gates(p, "log_fgate_reverse")
    D = np.zeros((p.B, p.H, p.n, p.m))
    for i in range(p.n):
        t = p.params["query_offset"] + i                  # i' < m
        # j < i': log_fgate[j + 1] + ... + log_fgate[i'], summed from i' down
        D[:, :, i, :t] = np.cumsum(gates[..., t:0:-1], axis=-1)[..., ::-1]
        if reverse is not None:                           # j > i': reverse[i' + 1] + ... + reverse[j]
            D[:, :, i, t + 1:] = np.cumsum(reverse[..., t + 1:], axis=-1)
    return _content_logits(p) + D


def _fox_grads(p, G):
    grads = _content_term_grads(p, G)
    # d D_ij / d log_fgate[l] = 1 for j < l <= i': row i gives every l <= i' the sum of its
    # G over the keys j < l; the reverse gates l > i' the sum over the keys j >= l
    gates = np.zeros((p.B, p.H, p.m))
    reverse = np.zeros((p.B, p.H, p.m))
    for i in range(p.n):
        t = p.params["query_offset"] + i
        before = np.cumsum(G[:, :, i, :t], axis=-1)       # sum_{j < l} G_ij at l - 1
        gates[..., 1:t + 1] += before
        after = np.cumsum(G[:, :, i, ::-1], axis=-1)[..., ::-1]   # sum_{j >= l} G_ij at l
        reverse[..., t + 1:] += after[..., t + 1:]
    grads["log_fgate"] = _fold_heads(gates, p.arrays["log_fgate"], axis=1)
    grads["log_fgate_reverse"] = (None if p.arrays.get("log_fgate_reverse") is None else
                                  _fold_heads(reverse, p.arrays["log_fgate_reverse"], axis=1))
    return grads


# SPEC 3.19  A_ij = s q_i.k_j + bias[h, (dy + t_y)(2 t_x + 1) + dx + t_x], (dy, dx) the key's
# coordinates minus the query's clipped to (t_y, t_x); T, T + 1, T + 2 for global tokens
def _relative_bias_2d_rows(p):
    """The table entry of every pair, (B|1, n, m)."""
    ty, tx = p.params["max_distance"]
    T = (2 * ty + 1) * (2 * tx + 1)
    cq = np.asarray(p.arrays["coords_q"], dtype=np.int64)[:, :, None, :]     # (B|1, n, 1, 2)
    ck = np.asarray(p.arrays["coords_k"], dtype=np.int64)[:, None, :, :]     # (B|1, 1, m, 2)
    dy = np.clip(ck[..., 0] - cq[..., 0], -ty, ty)
    dx = np.clip(ck[..., 1] - cq[..., 1], -tx, tx)
    rows = (dy + ty) * (2 * tx + 1) + dx + tx
    global_q, global_k = (cq == -1).all(axis=-1), (ck == -1).all(axis=-1)
    rows = np.where(global_q & global_k, T + 2,
                    np.where(global_q, T, np.where(global_k, T + 1, rows)))
    return np.broadcast_to(rows, (max(cq.shape[0], ck.shape[0]), p.n, p.m))


def _relative_bias_2d_logits(p):
    bias = _per_head(p.arrays["bias"], p.H)                               # (H, L)
    term = bias[:, _relative_bias_2d_rows(p)]                             # (H, B|1, n, m)
    return _content_logits(p) + np.moveaxis(term, 0, 1)


def _relative_bias_2d_grads(p, G):
    grads = _content_term_grads(p, G)
    # d bias[h, row(b, i, j)] / d bias[h, r] = 1 where row(b, i, j) == r
    rows = np.broadcast_to(_relative_bias_2d_rows(p), (p.B, p.n, p.m))
    table = np.zeros((p.H, p.arrays["bias"].shape[1]))
    for h in range(p.H):
        np.add.at(table[h], rows, G[:, h])
    grads["bias"] = _fold_heads(table, p.arrays["bias"])
    return grads


# SPEC 3.18  CoPE (Golovneva et al. 2024): A_ij = Z_ij + e_ij, the positions p_ij the reverse
# sums of the gates sigmoid(Z_it) over the keys t >= j the row sees, e_ij q_i . pos_emb
# interpolated between floor(p_ij) and ceil(p_ij)
def _cope_seen(p) -> np.ndarray:
    """(B|1, 1, n, m) bool: the keys each row's gates see: a fused attention's (p.seen),
    else all, or with causal the keys j <= i'."""
    if p.seen is not None:
        return p.seen
    if p.params["causal"]:
        return (_key_minus_query(p) <= 0)[None, None]
    return np.ones((1, 1, p.n, p.m), dtype=bool)


def _cope_table(p) -> np.ndarray:
    """pos_emb as (H, P, d), float64 (a (P, d) or (1, P, d) table serves every head)."""
    table = _wide(p.arrays["pos_emb"])
    return np.broadcast_to(table[None] if table.ndim == 2 else table, (p.H,) + table.shape[-2:])


def _cope_terms(p) -> tuple:
    """(Z, gates, positions, qe, floor, ceil, w), float64: qe (B, H, n, P) = q_i . pos_emb[t]
    (q unscaled); floor and ceil as indices (0 where the position is NaN)."""
    q, k = _qk(p)
    Z = p.params["scale"] * _dot_qk(q, k)
    table = _cope_table(p)
    with np.errstate(over="ignore", invalid="ignore"):
        gates = np.where(_cope_seen(p), 1.0 / (1.0 + np.exp(-Z)), 0.0)
    positions = np.minimum(np.cumsum(gates[..., ::-1], axis=-1)[..., ::-1], table.shape[1] - 1)
    qe = np.einsum("bhid,hpd->bhip", q, table)
    floor = np.floor(np.nan_to_num(positions))
    w = positions - floor                                                    # NaN stays NaN
    lo = floor.astype(np.int64)
    hi = lo + (w > 0)
    return Z, gates, positions, qe, lo, hi, w


def _cope_logits(p):
    Z, _, _, qe, lo, hi, w = _cope_terms(p)
    with np.errstate(invalid="ignore"):
        e = (w * np.take_along_axis(qe, hi, axis=-1) +
             (1 - w) * np.take_along_axis(qe, lo, axis=-1))
    return Z + e


def _cope_grads(p, G):
    Z, gates, positions, qe, lo, hi, w = _cope_terms(p)
    valid = ~np.isnan(positions)
    P = qe.shape[-1]
    # e = w qe[hi] + (1 - w) qe[lo]: qe's gradient at the two rows, and de/dp = qe[hi] - qe[lo]
    dqe = np.zeros(qe.shape)
    pairs = np.arange(p.B * p.H * p.n).repeat(p.m)                         # each pair's row
    for rows, weight in ((lo, 1 - w), (hi, w)):
        part = np.where(valid, weight * G, 0.0)
        np.add.at(dqe.reshape(-1, P), (pairs, rows.reshape(-1)), part.reshape(-1))
    with np.errstate(invalid="ignore"):
        d_pos = np.where(valid, G * (np.take_along_axis(qe, hi, axis=-1) -
                                     np.take_along_axis(qe, lo, axis=-1)), np.nan)
        # p_j = sum_{t >= j} g_t: dL/dg_t = sum_{j <= t} dL/dp_j; dg/dZ = g (1 - g)
        d_gates = np.cumsum(d_pos, axis=-1)
        slope = gates * (1 - gates)
        d_Z = G + np.where(slope != 0, d_gates * slope, 0.0)
    grads = _content_term_grads(p, d_Z)
    table = p.arrays["pos_emb"]
    grads["q"] = grads["q"] + np.einsum("bhip,hpd->bhid", dqe, _cope_table(p))
    per_head = np.einsum("bhip,bhid->hpd", dqe, _qk(p)[0])
    grads["pos_emb"] = (per_head.sum(axis=0) if table.ndim == 2 else
                        _fold_heads(per_head, table))
    return grads


def _method_grads(p, G) -> dict:
    """The method's float64 gradients of sum(G * A), k's summed over its query heads."""
    grads = globals()[f"_{p.method}_grads"](p, G)
    if grads.get("k") is not None:
        grads["k"] = fold_groups(grads["k"], p.H_kv)
    return grads


def _logits(problem) -> np.ndarray:
    """The float64 logits of the problem's method, cast to the input dtype:
    a new C-contiguous array or `out`."""
    values = globals()[f"_{problem.method}_logits"](problem)
    result = narrow(values, problem.dtype)
    if problem.out is not None:
        problem.out[...] = result
        return problem.out
    return result


def _gradients(problem, G):
    """The named gradient tuple of the problem's method, each in the input dtype."""
    values = _method_grads(problem, _wide(_checks.check_grad(G, problem)))
    return GRAD_TYPES[problem.method](**{
        name: None if values.get(name) is None
        else narrow(values[name], problem.dtype)
        for name in GRAD_FIELDS[problem.method]})


def _forward(method: str):
    spec = REGISTRY[method]
    return define(method, lambda tensors, params, out: _logits(
        _checks.check(spec, tensors, params, out)), name=method, module=__name__,
        doc=forward_doc(method, _WHERE))


def _backward(method: str):
    spec = REGISTRY[method]
    return define(method, lambda G, tensors, params, _: _gradients(
        _checks.check(spec, tensors, params, None), G), name=method + "_backward",
        form="logits_backward", module=__name__, doc=backward_doc(method, _WHERE))


for _method in REGISTRY:
    globals()[_method] = _forward(_method)
    globals()[_method + "_backward"] = _backward(_method)
    globals()[_method + "_attention"] = _attention(_method)
    globals()[_method + "_attention_backward"] = _attention_backward_function(_method)
del _method


def bert_ad(q, k, pos_q, pos_k, *, scale=None, out=None):
    return _logits(_check_bert_ad(q, k, pos_q, pos_k, scale=scale, out=out))


def bert_ad_backward(G, q, k, pos_q, pos_k, *, scale=None):
    return _gradients(_check_bert_ad(q, k, pos_q, pos_k, scale=scale), G)


def absolute_input(x, p, w_q, w_k, *, scale=None, out=None):
    return _logits(_check_absolute_input(x, p, w_q, w_k, scale=scale, out=out))


def absolute_input_backward(G, x, p, w_q, w_k, *, scale=None):
    return _gradients(_check_absolute_input(x, p, w_q, w_k, scale=scale), G)


for _method in BASELINES:
    globals()[_method].__doc__ = f"{_BASELINE_FORMULAS[_method]}\n\nComputed by {_WHERE}."
    globals()[_method + "_backward"].__doc__ = (
        f"Gradients of sum(G * {_method}(...)) for G = dL/dA of shape (B, H, n, m):\n"
        f"a named tuple with fields {', '.join(GRAD_FIELDS[_method])}, each shaped like its\n"
        f"input.  Computed by {_WHERE}.\n\n{_BASELINE_FORMULAS[_method]}")
del _method

__all__ = (list(METHODS) + [m + "_backward" for m in METHODS]
           + [m + suffix for m in REGISTRY for suffix in ("_attention", "_attention_backward")]
           + ["METHODS", "attention_dropout_mask", "per_query_head", "fold_groups"])
