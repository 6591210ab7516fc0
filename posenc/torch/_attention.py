"""A self-attention layer around any encoding of `posenc.torch.nn`."""

from __future__ import annotations

import torch
from torch import nn

from ._encodings import Content, PositionalEncoding


class PositionalSelfAttention(nn.Module):
    """Multi-head self-attention whose logits come from a positional encoding.

    ``x`` (B, n, d_model) → Q, K, V projections (d_model → num_heads·head_dim)
    → per-head ``q``, ``k``, ``v`` (B, H, n, head_dim), strided views passed to
    the ops without a copy → ``encoding.logits(q, k)`` → key-padding mask →
    softmax → dropout → weighted sum of ``v`` → output projection (Vaswani et
    al. 2017, eq. (1)-(2), with the logits of the encoding in place of
    ``QKᵀ/sqrt(d)``).  ``encoding`` is any `PositionalEncoding` of
    `posenc.torch.nn` (None: plain content attention); passing one module to
    several layers shares it layer-wise.

    ``forward(x, key_padding_mask=None, segment_ids=None, state=None)``:
    ``key_padding_mask`` (B, n) bool, True at padding keys; ``segment_ids``
    (B, n) ints for encodings with segment attention; ``state``: the
    encoding's `positional(n, m)`, computed once by a model whose layers share
    the encoding (TUPE, DIET-ABS), else computed here when needed.
    """

    def __init__(self, d_model: int, num_heads: int, encoding: PositionalEncoding | None = None,
                 *, head_dim: int | None = None, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or d_model // num_heads
        if self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        self.encoding = Content(num_heads) if encoding is None else encoding
        if self.encoding.num_heads != num_heads:
            raise ValueError(f"encoding has {self.encoding.num_heads} heads, the layer "
                             f"{num_heads}")
        inner = num_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def _heads(self, x):
        """(B, n, H·d) → (B, H, n, d), a strided view."""
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def logits_and_values(self, x, *, segment_ids=None, state=None, key_padding_mask=None):
        """(logits (B, H, n, m), v (B, H, m, d)): the encoding's logits before the
        mask and the softmax, and the values they weight."""
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        encoding = self.encoding
        if encoding.projects_keys:
            if key_padding_mask is not None:   # Linformer: padding must not enter E k, F v
                keep = (~key_padding_mask)[:, None, :, None].to(k.dtype)
                k, v = k * keep, v * keep
            k, v = encoding.project_keys(k, v)
        if state is None and encoding.uses_attention_projections:
            state = encoding.positional(q.shape[2], k.shape[2], query_proj=self.q_proj,
                                        key_proj=self.k_proj)
        segment_k = None if encoding.projects_keys else segment_ids
        return encoding.logits(q, k, state=state, segment_q=segment_ids, segment_k=segment_k), v

    def forward(self, x, key_padding_mask: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None, state=None):
        batch, n, _ = x.shape
        if key_padding_mask is not None and key_padding_mask.shape != (batch, n):
            raise ValueError(f"key_padding_mask must have shape ({batch}, {n}) (B, n), got "
                             f"{tuple(key_padding_mask.shape)}")
        logits, v = self.logits_and_values(x, segment_ids=segment_ids, state=state,
                                           key_padding_mask=key_padding_mask)
        if key_padding_mask is not None and not self.encoding.projects_keys:
            logits = logits.masked_fill(key_padding_mask[:, None, None, :],
                                        torch.finfo(logits.dtype).min)
        weights = self.dropout(torch.softmax(logits, dim=-1))
        out = torch.matmul(weights, v).transpose(1, 2).reshape(batch, n, -1)
        return self.out_proj(out)
