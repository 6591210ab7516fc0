"""The interface every encoding of `posenc.torch.nn` implements, and the two
encodings that need no position table: plain content attention and DIET's
per-head segment attention."""

from __future__ import annotations

import torch
from torch import nn

from . import _functional as F
from . import _fused


def segment_ids_pair(table, segment_q, segment_k):
    """(segment_q, segment_k) for the ops: both None without a table; in
    self-attention the keys' ids default to the queries'."""
    if table is None or segment_q is None:
        return None, None
    return segment_q, segment_q if segment_k is None else segment_k


def content_and_segments(q, k, scale, segment_q, segment_k, table, query_offset=0):
    """The call of s q_i·k_j [+ table[h, S(i), S(j)]] as (method, keywords):
    DIET-ABS of rank 0 carries the segment term when there is one."""
    segment_q, segment_k = segment_ids_pair(table, segment_q, segment_k)
    if segment_q is None:
        return "content", {"scale": scale, "query_offset": query_offset}
    return "diet_abs", {"pos_q": q.new_zeros(1, q.shape[2], 0), "pos_k": k.new_zeros(1, k.shape[2], 0),
                        "segment_q": segment_q, "segment_k": segment_k, "segment_table": table,
                        "scale": scale, "query_offset": query_offset}


class PositionalEncoding(nn.Module):
    """Base of the encodings: logits of per-head q (B, H, n, d), k (B, H, m, d).

    Subclasses implement `logits`; `positional` returns the input-independent
    part that layers sharing the encoding can reuse (``state``), or None;
    `project_keys` shortens the key sequence (Linformer) or is the identity.
    ``uses_attention_projections``: `positional` needs the attention layer's
    ``query_proj``/``key_proj`` (DeBERTa's ``share_att_key``).
    """

    method = ""         # the posenc method whose logits it computes
    # another form of its method's encoding (MRoPE of rope): not the one
    # posenc.torch.nn.build_encoding (and the HF swap) builds for the method
    variant = False
    # whether the method's paper shares one encoding across a model's layers
    # (posenc.torch.hf.swap_positional_encoding's default)
    shared_across_layers = False

    uses_attention_projections = False
    projects_keys = False
    # `input_state(x)` gives `state` from the layer's input (FoX's gates), per token:
    # the layer passes it, and caches the keys' for decoding
    reads_input = False

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads

    def positional(self, n: int, m: int, *, query_proj=None, key_proj=None):
        return None

    def project_keys(self, k, v):
        return k, v

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        """(method, keywords): this encoding's logits are
        ``posenc.torch.<method>(q, k, **keywords)`` and its fused attention
        ``posenc.torch.<method>_attention(q, k, v, **keywords, ...)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement arguments()")

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        """(B, H, n, m) logits; query row i at position query_offset + i."""
        method, keywords = self.arguments(q, k, state=state, segment_q=segment_q,
                                          segment_k=segment_k, query_offset=query_offset)
        return getattr(F, method)(q, k, **keywords)

    def attention(self, q, k, v, *, state=None, segment_q=None, segment_k=None, causal=False,
                  key_padding_mask=None, query_offset=0, dropout_p=0.0, seed=0, window=None,
                  document_q=None, document_k=None, softcap=None, sinks=None):
        """The fused attention softmax(logits + mask) dropout v (SPEC §6) of this
        encoding, with SPEC §7's window, documents, softcap and sinks:
        ``posenc.Attention(out, lse)``; k and v may have fewer heads than q
        (grouped-query attention)."""
        method, keywords = self.arguments(q, k, state=state, segment_q=segment_q,
                                          segment_k=segment_k, query_offset=query_offset)
        return getattr(_fused, method + "_attention")(
            q, k, v, **keywords, causal=causal, key_padding_mask=key_padding_mask,
            dropout_p=dropout_p, seed=seed, window=window, document_q=document_q,
            document_k=document_k, softcap=softcap, sinks=sinks)

    def forward(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return self.logits(q, k, state=state, segment_q=segment_q, segment_k=segment_k,
                           query_offset=query_offset)


class Content(PositionalEncoding):
    """No positional term: ``A_ij = q_i·k_j / sqrt(d)`` (Vaswani et al. 2017;
    SPEC 3.1).  What `PositionalSelfAttention` uses when given no encoding."""

    method = "content"

    def __init__(self, num_heads: int, *, scale: float | None = None):
        super().__init__(num_heads)
        self.scale = scale

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return "content", {"scale": self.scale, "query_offset": query_offset}


class SegmentAttention(PositionalEncoding):
    """Per-head segment attention: Chen et al. 2021 (DIET), eq. (2).

    ``A_ij = q_i·k_j / sqrt(d) + E_S(S(i), S(j))``, ``E_S(a, b) = table[h, a, b]``,
    ``table`` (H|1, S, S) (``per_head=False``: shared by the heads), replacing
    BERT's segment embedding added at the input.  DIETAbs and DIETRel hold one
    when given ``num_segments``.  Without segment ids the term is left out.
    Initialised N(0, init_std²).
    """

    def __init__(self, num_heads: int, num_segments: int, *, per_head: bool = True,
                 scale: float | None = None, init_std: float = 0.02):
        super().__init__(num_heads)
        self.num_segments, self.per_head, self.scale = num_segments, per_head, scale
        self.table = nn.Parameter(
            torch.randn(num_heads if per_head else 1, num_segments, num_segments) * init_std)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return content_and_segments(q, k, self.scale, segment_q, segment_k, self.table,
                                    query_offset)
