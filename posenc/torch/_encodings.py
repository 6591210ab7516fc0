"""The interface every encoding of `posenc.torch.nn` implements, and the two
encodings that need no position table: plain content attention and DIET's
per-head segment attention."""

from __future__ import annotations

import torch
from torch import nn

from . import _functional as F


def segment_ids_pair(table, segment_q, segment_k):
    """(segment_q, segment_k) for the ops: both None without a table; in
    self-attention the keys' ids default to the queries'."""
    if table is None or segment_q is None:
        return None, None
    return segment_q, segment_q if segment_k is None else segment_k


def content_and_segments(q, k, scale, segment_q, segment_k, table):
    """s q_i·k_j [+ table[h, S(i), S(j)]] in one op: DIET-ABS of rank 0 carries
    the segment term when there is one."""
    segment_q, segment_k = segment_ids_pair(table, segment_q, segment_k)
    if segment_q is None:
        return F.content(q, k, scale=scale)
    return F.diet_abs(q, k, q.new_zeros(1, q.shape[2], 0), k.new_zeros(1, k.shape[2], 0),
                      segment_q=segment_q, segment_k=segment_k, segment_table=table, scale=scale)


class PositionalEncoding(nn.Module):
    """Base of the encodings: logits of per-head q (B, H, n, d), k (B, H, m, d).

    Subclasses implement `logits`; `positional` returns the input-independent
    part that layers sharing the encoding can reuse (``state``), or None;
    `project_keys` shortens the key sequence (Linformer) or is the identity.
    ``uses_attention_projections``: `positional` needs the attention layer's
    ``query_proj``/``key_proj`` (DeBERTa's ``share_att_key``).
    """

    method = ""         # the posenc method whose logits it computes

    uses_attention_projections = False
    projects_keys = False

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads

    def positional(self, n: int, m: int, *, query_proj=None, key_proj=None):
        return None

    def project_keys(self, k, v):
        return k, v

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None):
        raise NotImplementedError

    def forward(self, q, k, *, state=None, segment_q=None, segment_k=None):
        return self.logits(q, k, state=state, segment_q=segment_q, segment_k=segment_k)


class Content(PositionalEncoding):
    """No positional term: ``A_ij = q_i·k_j / sqrt(d)`` (Vaswani et al. 2017;
    SPEC 3.1).  What `PositionalSelfAttention` uses when given no encoding."""

    method = "content"

    def __init__(self, num_heads: int, *, scale: float | None = None):
        super().__init__(num_heads)
        self.scale = scale

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None):
        return F.content(q, k, scale=self.scale)


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

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None):
        return content_and_segments(q, k, self.scale, segment_q, segment_k, self.table)
