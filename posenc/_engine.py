"""The one interface between the Python package and the C engine (posenc._C).

A configured problem is an `EngineConfig`: a tuple whose fields are the
engine's slots (csrc/posenc.h `posenc_problem`), in this order.  Python
builds it once per call from a checked `Problem` (posenc._registry), and the
binding reads it positionally -- no keyword parsing, no second validation
beyond the binding's one `posenc_validate` (the safety net that no index can
leave its table):

    _C.forward(config, out)          -> logits (B, H, n, m); out may be None
    _C.backward(G, config, needs)    -> tuple of gradients in ENGINE_GRADS order

and the fused attention of SPEC §6 on the same configured logits:

    _C.attention_forward(config, v, key_padding_mask, causal, dropout_p, seed, out)
        -> (out (B, H, n, dv), lse (B, H, n)); key_padding_mask None or bool (B, m)
    _C.attention_backward(d_out, config, v, out, lse, key_padding_mask, causal,
                          dropout_p, seed, window, document_q, document_k, softcap, sinks,
                          needs, d_lse)
        -> the gradients of ENGINE_GRADS, then dv (bit len(ENGINE_GRADS) of needs) and
           dsinks; d_lse: dL/dlse (B, H, n) of lse's dtype, or None (lse unused)

`needs` is one bit mask in ENGINE_GRADS order (bit t asks for entry t).  When
`key_table_table` is the same object as `query_table_table` with the same map
object (M4, M4M: one table read on both sides), the engine sums both sides'
gradients into one array, returned in the `query_table_table` entry (the
`key_table_table` entry is None); either bit asks for it.
"""

from __future__ import annotations

from collections import namedtuple

from . import _C

# The engine's slots, named by the binding (csrc/module_config.h, from posenc.h's
# one list of the problem's arrays), in the order it reads them:
#   q, k                            (B, H, n, d), (B, H, m, d), any float dtype, any strides
#   rope_cos, rope_sin              the rotation's tables (P, r), rope_cos_k, rope_sin_k the keys'
#                                   (xPos) or None; positions_q (B, n), positions_k (B, m) or None
#   product                         bool: A = s q.k * factors (M2, M4M) instead of a sum
#   scale, dense_scale, vector_scale   floats: the content's, the dense module's, the vector tables'
#   rope_interleaved                bool: the rotation's pairs (x_2t, x_2t+1), else (x_t, x_t+r)
#   query_offset                    int >= 0: query row i sits at position query_offset + i
#   <kind>_<array>                  the term modules' arrays (csrc/terms.h), float64 or
#                                   the compute type (B|1, H|1, length), leading axes of one
#                                   may be left out: dense_pos_q, dense_pos_k (TUPE's and
#                                   DIET-ABS's dense factor (H|1, n d_p), (H|1, m d_p)),
#                                   toeplitz_table, toeplitz_rows (a term
#                                   of j - i alone: a scalar table and its map over the
#                                   offsets, ALiBi's bias and the identity), segments_table, segments_query,
#                                   segments_key (DIET's segments), reset_theta (TUPE's
#                                   [CLS] reset), query_table_table, query_table_map,
#                                   key_table_table, key_table_map (the vector tables
#                                   (H|1, R d): q_i . table[map], k_j . table[map]), fox_gates, ...
EngineConfig = namedtuple("EngineConfig", _C.CONFIG_FIELDS)

# Entries of _C.backward's result, and bits of its `needs` mask: q, k, then the
# parameters with a gradient.
ENGINE_GRADS = _C.ENGINE_GRADS

# A bucket map is a 1-D int64 array over the diagonals o = j - i of an (n, m)
# problem, o from -(n - 1) to m - 1, stored at index o + n - 1; Python builds
# it for the positions' offsets j - (query_offset + i), so the engine reads
# query_offset only where a rule names the position itself: TUPE's [CLS] row
# (query_offset + i == 0) and the causal mask (j > query_offset + i).
