"""The one interface between the Python package and the C engine (posenc._C).

A configured problem is an `EngineConfig`: a tuple whose fields are the
engine's slots (csrc/posenc.h `posenc_problem`), in this order.  Python
builds it once per call from a checked `Problem` (posenc._registry), and the
binding reads it positionally -- no keyword parsing, no second validation
beyond the binding's one `posenc_validate` (the safety net that no index can
leave its table):

    _C.forward(config, out)          -> logits (B, H, n, m); out may be None
    _C.backward(G, config, needs)    -> 9-tuple of gradients in ENGINE_GRADS order

and the fused attention of SPEC §6 on the same configured logits:

    _C.attention_forward(config, v, key_padding_mask, causal, dropout_p, seed, out)
        -> (out (B, H, n, dv), lse (B, H, n)); key_padding_mask None or bool (B, m)
    _C.attention_backward(d_out, config, v, out, lse, key_padding_mask, causal,
                          dropout_p, seed, needs)
        -> 10-tuple: the 9 of ENGINE_GRADS, then dv (bit 9 of needs)

`needs` is one bit mask in ENGINE_GRADS order (bit t asks for entry t).  When
`key_table` is the same object as `query_table` with the same map object (M4,
M4M: one table read on both sides), the engine sums both sides' gradients
into one array, returned in the `query_table` entry (the `key_table` entry is
None); either bit asks for it.
"""

from __future__ import annotations

from collections import namedtuple

EngineConfig = namedtuple("EngineConfig", (
    "q", "k",                     # (B, H, n, d), (B, H, m, d), any float dtype, any strides
    "product",                    # bool: A = s q.k * factors (M2, M4M) instead of a sum
    "scale",                      # float: s of the content term
    "pos_q", "pos_k",             # dense factor (H|1, n, d_p), (H|1, m, d_p) or None
    "dense_scale",                # float
    "table", "table_map",         # scalar table (H|1, R) and its int64 map over offsets
    "query_table", "query_map",   # query-side vector table (H|1, R, d): q_i . table[map]
    "key_table", "key_map",       # key-side vector table (H|1, R, d): k_j . table[map]
    "vector_scale",               # float, on both vector tables
    "segment_q", "segment_k",     # (B, n), (B, m) integer ids, or None
    "segment_table",              # (H|1, S, S)
    "theta",                      # (H|1, 2): TUPE's [CLS] reset
    "query_offset",               # int >= 0: query row i sits at position query_offset + i
))

# Entries of _C.backward's result, and bits of its `needs` mask.
ENGINE_GRADS = ("q", "k", "pos_q", "pos_k", "table", "query_table", "key_table",
                "segment_table", "theta")

# A bucket map is a 1-D int64 array over the diagonals o = j - i of an (n, m)
# problem, o from -(n - 1) to m - 1, stored at index o + n - 1; Python builds
# it for the positions' offsets j - (query_offset + i), so the engine reads
# query_offset only where a rule names the position itself: TUPE's [CLS] row
# (query_offset + i == 0) and the causal mask (j > query_offset + i).
