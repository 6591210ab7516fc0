"""Ready-made positional encodings and a self-attention layer that takes any of them.

Every encoding is an ``nn.Module`` with the papers' parameter shapes,
initialisations and sharing options, and the same interface:

* ``logits(q, k, *, state=None, segment_q=None, segment_k=None)`` (also its
  ``forward``): the attention logits ``(B, H, n, m)`` of per-head ``q``
  ``(B, H, n, d)`` and ``k`` ``(B, H, m, d)``, computed by the ops of
  `posenc.torch` (C kernels on CPU, torch-native formulas elsewhere);
* ``positional(n, m, *, query_proj=None, key_proj=None)``: the input-independent
  part (TUPE's positional correlation, DIET-ABS's ``P_Q P_Kᵀ``, DeBERTa's
  projected relative embeddings), or ``None``.  A model that shares one encoding
  between layers computes it once per forward and hands it to every layer as
  ``state`` (TUPE §3.3, DIET §3.1);
* ``project_keys(k, v)``: identity, except for DIET-ABS^LIN (Linformer).

Head-wise sharing is a head axis of size 1 (``per_head=False``); layer-wise
sharing is passing the same encoding module to every layer.
`PositionalSelfAttention` is a complete attention layer around an encoding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._registry import REGISTRY, alibi_slopes
from . import _functional as F
from ._attention import PositionalSelfAttention
from ._encodings import (
    Content,
    PositionalEncoding,
    SegmentAttention,
    content_and_segments,
    segment_ids_pair,
)

__all__ = [
    "ALiBi",
    "AxialRoPE2D",
    "TUPE",
    "Content",
    "DIETAbs",
    "DIETRel",
    "DebertaRelative",
    "DebertaRelativeEmbeddings",
    "ContinuousPositionBias",
    "CoPE",
    "ForgetGates",
    "KERPLE",
    "M2Relative",
    "MRoPE",
    "M4MRelative",
    "M4Relative",
    "PositionalEncoding",
    "PositionalSelfAttention",
    "RelativeBias",
    "RelativeBias2D",
    "RoPEMixed",
    "RotaryEmbedding",
    "SegmentAttention",
    "ShawRelative",
    "T5RelativeBias",
    "build_encoding",
    "encoding_classes",
]


def _table(heads: int, *shape, init_std: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(heads, *shape) * init_std)


# ------------------------------------------------------------------ relative tables

class T5RelativeBias(PositionalEncoding):
    """T5 relative attention bias: Raffel et al. 2020, *Exploring the Limits of
    Transfer Learning with a Unified Text-to-Text Transformer*, §2.1 (SPEC 3.3).

    ``A_ij = q_i·k_j + bias[h, t5(j - i)]``: one learned scalar per head and
    log-binned bucket, ``bias`` of shape ``(H, num_buckets)``; no ``1/sqrt(d)``
    (``scale=None`` keeps T5's 1).  T5 shares the table across layers
    (layer-wise sharing: pass this module to every layer).  Initialised
    N(0, init_std²) (HuggingFace T5 uses ``factor · d_model^-1/2``).
    """

    method = "t5"
    shared_across_layers = True        # T5: one table, the first layer's, for all

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True, *, scale: float | None = None,
                 init_std: float = 0.02):
        super().__init__(num_heads)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional, self.scale = bidirectional, scale
        self.bias = _table(num_heads, num_buckets, init_std=init_std)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return "t5", dict(bias=self.bias, num_buckets=self.num_buckets,
                          max_distance=self.max_distance, bidirectional=self.bidirectional,
                          scale=1.0 if self.scale is None else self.scale,
                          query_offset=query_offset)


class _ClippedRelative(PositionalEncoding):
    """A table indexed by clip(j - i, -t, t) + t, head-shared or per head."""

    def __init__(self, num_heads, max_distance, table_shape, *, per_head, scale, init):
        super().__init__(num_heads)
        self.max_distance, self.per_head, self.scale = max_distance, per_head, scale
        heads = num_heads if per_head else 1
        self.rel = nn.Parameter(init(torch.empty(heads, 2 * max_distance + 1, *table_shape)))

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        table = REGISTRY[self.method].tensors[2]        # rel_k (Shaw, M4, M4M) or rel (M2)
        return self.method, {table: self.rel, "max_distance": self.max_distance,
                             "scale": self.scale, "query_offset": query_offset}


class _VectorRelative(_ClippedRelative):
    """A (H|1, 2t + 1, head_dim) table of vectors, N(0, init_std²) (Shaw, M4, M4M)."""

    def __init__(self, num_heads: int, head_dim: int, max_distance: int, *,
                 per_head: bool = False, scale: float | None = None,
                 init_std: float | None = 0.02):
        std = self.default_init_std(head_dim) if init_std is None else init_std
        super().__init__(num_heads, max_distance, (head_dim,), per_head=per_head, scale=scale,
                         init=lambda t: t.normal_(0.0, std))

    @staticmethod
    def default_init_std(head_dim: int) -> float:
        return 0.02


class ShawRelative(_VectorRelative):
    """Relative position representations: Shaw, Uszkoreit & Vaswani 2018, eq. (4)
    with the clipping of eq. (3) (SPEC 3.2).

    ``A_ij = (q_i·(k_j + a^K_ij)) / sqrt(d)``, ``a^K_ij = rel[clip(j - i, -t, t) + t]``,
    ``rel`` of shape ``(H|1, 2t + 1, head_dim)``.  Shaw et al. share the table
    across heads (``per_head=False``, the default).  Only the key-side ``a^K``
    (the logits); the value-side ``a^V`` "did not improve much" (TUPE, note 2).
    Initialised N(0, init_std²) as HuggingFace's ``distance_embedding``.
    """

    method = "shaw"


class M2Relative(_ClippedRelative):
    """M2 of Huang et al. 2020 (*Improve Transformer Models with Better Relative
    Position Embeddings*), as written in *Multiplicative Position-aware
    Transformer Models*, eq. (5) (SPEC 3.4).

    ``A_ij = (q_i·k_j) · a_ij / sqrt(d)``, one scalar per clipped offset,
    ``rel`` of shape ``(H|1, 2t + 1)``, head-shared by default (that paper,
    App. D).  Initialised to ones, so training starts from plain attention.
    """

    method = "m2"

    def __init__(self, num_heads: int, max_distance: int, *, per_head: bool = False,
                 scale: float | None = None):
        super().__init__(num_heads, max_distance, (), per_head=per_head, scale=scale,
                         init=lambda t: t.fill_(1.0))


class M4Relative(_VectorRelative):
    """M4 of Huang et al. 2020, *Multiplicative Position-aware Transformer
    Models*, eq. (6) (SPEC 3.5); HuggingFace BERT's ``relative_key_query``.

    ``A_ij = (q_i·k_j + q_i·a_ij + k_j·a_ij) / sqrt(d)``, ``rel`` of shape
    ``(H|1, 2t + 1, head_dim)``, head-shared by default (App. D: sharing did
    better on two of three tasks).  Initialised N(0, init_std²).
    """

    method = "m4"


class M4MRelative(_VectorRelative):
    """M4M, the multiplicative M4 of *Multiplicative Position-aware Transformer
    Models*, eq. (11) (SPEC 3.6).

    ``A_ij = (q_i·k_j)(q_i·a_ij)(k_j·a_ij) / sqrt(d)``, ``rel`` of shape
    ``(H|1, 2t + 1, head_dim)``, head-shared by default.  The paper gives no
    initialisation; since the logits are a product of three dot products,
    the default N(0, 1/head_dim) keeps ``q·a`` and ``k·a`` of the order of
    ``|q|/sqrt(d)``, so the product starts at the scale of the content term.
    """

    method = "m4m"

    def __init__(self, num_heads: int, head_dim: int, max_distance: int, *,
                 per_head: bool = False, scale: float | None = None,
                 init_std: float | None = None):
        super().__init__(num_heads, head_dim, max_distance, per_head=per_head, scale=scale,
                         init_std=init_std)

    @staticmethod
    def default_init_std(head_dim: int) -> float:
        return head_dim ** -0.5


# ------------------------------------------------------------------ DeBERTa

class DebertaRelativeEmbeddings(nn.Module):
    """DeBERTa's relative position embeddings ``P`` (2·att_span, d_model), with
    the optional LayerNorm of DeBERTa-v2 (``norm_rel_ebd="layer_norm"``).

    DeBERTa keeps one such table in the encoder for all layers: build it once
    and pass it to every layer's `DebertaRelative` as ``embeddings=``.
    ``layer_norm_eps`` is the LayerNorm's epsilon: DeBERTa-v2 (and HuggingFace's
    ``DebertaV2Config.layer_norm_eps``) uses 1e-7, the default here; PyTorch's
    own default 1e-5 changes the normalised table by about 2e-2 relative.
    """

    def __init__(self, d_model: int, att_span: int, *, layer_norm: bool = True,
                 layer_norm_eps: float = 1e-7, init_std: float = 0.02):
        super().__init__()
        self.att_span = att_span
        self.weight = nn.Parameter(torch.randn(2 * att_span, d_model) * init_std)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps) if layer_norm else None

    def forward(self) -> torch.Tensor:
        return self.weight if self.norm is None else self.norm(self.weight)


class DebertaRelative(PositionalEncoding):
    """Disentangled attention: He, Liu, Gao & Chen 2021, *DeBERTa*, §3.1,
    with DeBERTa-v2's log buckets; *Multiplicative Position-aware Transformer
    Models*, eq. (7) (SPEC 3.7).

    ``A_ij = (q_i·k_j + q_i·(P W^R)[p(i,j)] + k_j·(P W^T)[p(i,j)]) / sqrt(3d)``
    with ``δ = i - j`` log-bucketed when ``position_buckets > 0`` and
    ``p = clip(δ + att_span, 0, 2·att_span - 1)``; ``att_span`` is
    ``position_buckets`` if positive, else ``max_relative_positions``, and ``P``
    has ``2·att_span`` rows of width ``d_model`` (`DebertaRelativeEmbeddings`).
    ``W^R`` (``pos_key_proj``) and ``W^T`` (``pos_query_proj``) are
    ``d_model → num_heads·head_dim`` linear maps; with ``share_att_key`` they are
    the attention layer's own key and query projections (DeBERTa-v2), which the
    layer passes to `positional`.  ``scale=None`` is the exact ``1/sqrt(3d)``;
    HuggingFace divides by ``sqrt(3d)`` rounded to float32 -- pass
    ``scale=posenc.deberta_hf_scale(head_dim)`` to match it to rounding.
    """

    method = "deberta"

    def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
                 max_relative_positions: int = 512, position_buckets: int = -1,
                 layer_norm: bool = True, layer_norm_eps: float = 1e-7,
                 share_att_key: bool = False,
                 embeddings: DebertaRelativeEmbeddings | None = None,
                 scale: float | None = None, init_std: float = 0.02):
        super().__init__(num_heads)
        self.head_dim = head_dim or d_model // num_heads
        self.max_relative_positions, self.position_buckets = max_relative_positions, position_buckets
        self.att_span = position_buckets if position_buckets > 0 else max_relative_positions
        self.share_att_key, self.scale = share_att_key, scale
        self.uses_attention_projections = share_att_key
        if embeddings is None:
            embeddings = DebertaRelativeEmbeddings(d_model, self.att_span, layer_norm=layer_norm,
                                                   layer_norm_eps=layer_norm_eps, init_std=init_std)
        elif embeddings.att_span != self.att_span:
            raise ValueError(f"embeddings has att_span {embeddings.att_span}, this layer "
                             f"needs {self.att_span}")
        self.embeddings = embeddings
        if not share_att_key:
            self.pos_key_proj = nn.Linear(d_model, num_heads * self.head_dim)     # W^R
            self.pos_query_proj = nn.Linear(d_model, num_heads * self.head_dim)   # W^T

    def _heads(self, x):
        """(2 span, H·d) → (H, 2 span, d)."""
        return x.view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def positional(self, n, m, *, query_proj=None, key_proj=None):
        """(pos_key, pos_query), each (H, 2·att_span, head_dim)."""
        rel = self.embeddings()
        if self.share_att_key:
            if query_proj is None or key_proj is None:
                raise ValueError("share_att_key: pass the attention layer's query_proj and "
                                 "key_proj (PositionalSelfAttention does)")
            return self._heads(key_proj(rel)), self._heads(query_proj(rel))
        return self._heads(self.pos_key_proj(rel)), self._heads(self.pos_query_proj(rel))

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        pos_key, pos_query = self.positional(q.shape[2], k.shape[2]) if state is None else state
        return "deberta", dict(pos_key=pos_key, pos_query=pos_query, att_span=self.att_span,
                               position_buckets=self.position_buckets,
                               max_relative_positions=self.max_relative_positions,
                               scale=self.scale, query_offset=query_offset)


# ------------------------------------------------------------------ TUPE

class TUPE(PositionalEncoding):
    """Untied positional encoding: Ke, He & Liu 2020, *Rethinking Positional
    Encoding in Language Pre-training* (TUPE), eq. (10) TUPE-A and (11) TUPE-R
    (SPEC 3.8).

    ``A_ij = q_i·k_j/sqrt(2d) + reset_θ(v)_ij``,
    ``v_ij = (LN(p_i) U^Q)(LN(p_j) U^K)ᵀ/sqrt(2d) [+ b_{j-i}]``: absolute
    embeddings ``positions`` (max_len, d_model), LayerNorm "whenever it is
    used" (§3.3), per-head projections ``U^Q``, ``U^K`` (d_model → H·head_dim,
    no bias, as in eq. (7)); TUPE-R (``relative=True``) adds a T5 bias
    (H, num_buckets).  ``reset_cls`` applies eq. (9), with θ parameterised as in
    §3.3: ``θ_c = (LN(p_θc) U^Q)(LN(p_θc) U^K)ᵀ/sqrt(2d)`` for two learnable
    vectors ``theta_vectors`` (2, d_model).  TUPE shares ``U^Q``, ``U^K`` across
    layers, so `positional` computes ``reset_θ(v)`` (1, H, n, n) once per forward
    and every layer reuses it (§3.3).
    """

    method = "tupe"
    shared_across_layers = True        # TUPE §3.3: U^Q, U^K shared by the layers

    def __init__(self, d_model: int, num_heads: int, max_len: int, *,
                 head_dim: int | None = None, relative: bool = False, reset_cls: bool = True,
                 num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                 scale: float | None = None, init_std: float = 0.02):
        super().__init__(num_heads)
        self.head_dim = head_dim or d_model // num_heads
        self.max_len, self.relative, self.reset_cls = max_len, relative, reset_cls
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.scale = 1.0 / math.sqrt(2 * self.head_dim) if scale is None else scale
        self.positions = nn.Parameter(torch.randn(max_len, d_model) * init_std)
        self.norm = nn.LayerNorm(d_model)
        self.query_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=False)   # U^Q
        self.key_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=False)     # U^K
        self.bias = _table(num_heads, num_buckets, init_std=init_std) if relative else None
        self.theta_vectors = (nn.Parameter(torch.randn(2, d_model) * init_std)
                              if reset_cls else None)

    def _project(self, rows):
        """LN(p) U^Q and LN(p) U^K, each (H, len, head_dim)."""
        p = self.norm(rows)
        split = lambda x: x.view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)
        return split(self.query_proj(p)), split(self.key_proj(p))

    def terms(self, n: int, m: int, query_offset: int = 0):
        """The arguments of `posenc.torch.tupe`: (pos_q, pos_k, bias, theta), the
        queries at positions query_offset ... query_offset + n - 1."""
        length = max(query_offset + n, m)
        if length > self.max_len:
            raise ValueError(f"sequence of length {length} exceeds max_len {self.max_len}")
        pos_q, pos_k = self._project(self.positions[:length])
        theta = None
        if self.reset_cls:
            theta_q, theta_k = self._project(self.theta_vectors)            # (H, 2, d)
            theta = (theta_q * theta_k).sum(-1) * self.scale                 # (H, 2)
        return pos_q[:, query_offset:query_offset + n], pos_k[:, :m], self.bias, theta

    def positional(self, n, m, *, query_proj=None, key_proj=None):
        """reset_θ(v): (1, H, n, m), the tupe op on zero-width q, k."""
        pos_q, pos_k, bias, theta = self.terms(n, m)
        empty = pos_q.new_zeros(1, self.num_heads, n, 0)
        return F.tupe(empty, pos_q.new_zeros(1, self.num_heads, m, 0), pos_q, pos_k,
                      bias=bias, theta=theta, num_buckets=self.num_buckets,
                      max_distance=self.max_distance, bidirectional=self.bidirectional,
                      scale=self.scale)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        pos_q, pos_k, bias, theta = self.terms(q.shape[2], k.shape[2], query_offset)
        return "tupe", dict(pos_q=pos_q, pos_k=pos_k, bias=bias, theta=theta,
                            num_buckets=self.num_buckets, max_distance=self.max_distance,
                            bidirectional=self.bidirectional, scale=self.scale,
                            query_offset=query_offset)

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        if state is not None and not query_offset:   # the layers' shared reset(v)
            return F.content(q, k, scale=self.scale) + state
        return super().logits(q, k, segment_q=segment_q, segment_k=segment_k,
                              query_offset=query_offset)


# ------------------------------------------------------------------ DIET

class DIETAbs(PositionalEncoding):
    """Decoupled absolute positional attention: Chen et al. 2021, *A Simple and
    Effective Positional Encoding for Transformers* (DIET), eq. (1)-(2) and
    DIET-ABS^LIN eq. (4) (SPEC 3.9).

    ``A_ij = q_i·k_j/sqrt(d) + (P_Q P_Kᵀ)_ij + E_S(S(i), S(j))`` with
    ``pos_q`` (H|1, max_len, d_p), ``pos_k`` (H|1, max_len, d_p): rank ``d_p``
    free (DIET-ABS-Rank-k; the paper's default ``d_p = head_dim``); head-wise
    sharing with ``per_head=False``, layer-wise sharing (the paper's choice,
    Table 5) by passing this module to every layer.  ``num_segments`` adds the
    per-head segment attention ``E_S`` (a `SegmentAttention`).  ``P_Q P_Kᵀ``
    depends on no input: `positional` computes it once per forward for all
    layers, and in eval mode without autograd it is cached (§3.1).  With
    ``linformer_k`` the keys and values are projected along the sequence by
    ``E`` (k, max_len) (``F = E`` when ``share_kv``), and ``pos_k`` has k rows
    (eq. (4); segments then stay at the input, as in the paper).
    """

    method = "diet_abs"
    shared_across_layers = True        # DIET Table 5: layer-wise sharing

    def __init__(self, num_heads: int, max_len: int, rank: int, *, per_head: bool = True,
                 num_segments: int | None = None, linformer_k: int | None = None,
                 share_kv: bool = True, scale: float | None = None, init_std: float = 0.02):
        super().__init__(num_heads)
        if linformer_k is not None and num_segments is not None:
            raise ValueError("DIET-ABS^LIN keeps segments at the input: give num_segments or "
                             "linformer_k, not both")
        self.max_len, self.rank, self.per_head, self.scale = max_len, rank, per_head, scale
        heads = num_heads if per_head else 1
        key_rows = max_len if linformer_k is None else linformer_k
        self.pos_q = _table(heads, max_len, rank, init_std=init_std)
        self.pos_k = _table(heads, key_rows, rank, init_std=init_std)
        self.segments = (SegmentAttention(num_heads, num_segments, per_head=per_head, scale=scale)
                         if num_segments is not None else None)
        self.linformer_k = linformer_k
        self.projects_keys = linformer_k is not None
        if linformer_k is not None:
            self.E = nn.Parameter(nn.init.xavier_normal_(torch.empty(linformer_k, max_len)))
            self.F = (None if share_kv else
                      nn.Parameter(nn.init.xavier_normal_(torch.empty(linformer_k, max_len))))
        self._cache = None

    def project_keys(self, k, v):
        """Linformer: k ← E k, v ← F v along the sequence axis (eq. (4))."""
        if self.linformer_k is None:
            return k, v
        n = k.shape[2]
        value_projection = self.E if self.F is None else self.F
        return (torch.einsum("kn,bhnd->bhkd", self.E[:, :n], k),
                torch.einsum("kn,bhnd->bhkd", value_projection[:, :n], v))

    def _pos(self, n, m, query_offset=0):
        if query_offset + n > self.pos_q.shape[1] or m > self.pos_k.shape[1]:
            raise ValueError(f"lengths ({query_offset + n}, {m}) exceed the position tables "
                             f"({self.pos_q.shape[1]}, {self.pos_k.shape[1]})")
        return self.pos_q[:, query_offset:query_offset + n], self.pos_k[:, :m]

    def _cacheable(self) -> bool:
        return (not self.training and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling())

    def positional(self, n, m, *, query_proj=None, key_proj=None):
        """P_Q P_Kᵀ: (1, H|1, n, m) (cached in eval mode without autograd)."""
        if self._cacheable():
            key = (n, m, self.pos_q._version, self.pos_k._version, self.pos_q.device,
                   self.pos_q.dtype)
            if self._cache is None or self._cache[0] != key:
                pos_q, pos_k = self._pos(n, m)
                self._cache = (key, torch.matmul(pos_q, pos_k.transpose(-1, -2)).unsqueeze(0))
            return self._cache[1]
        pos_q, pos_k = self._pos(n, m)
        return torch.matmul(pos_q, pos_k.transpose(-1, -2)).unsqueeze(0)

    def train(self, mode: bool = True):
        self._cache = None
        return super().train(mode)

    def _segment_table(self, segment_q):
        return None if self.segments is None or segment_q is None else self.segments.table

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        pos_q, pos_k = self._pos(q.shape[2], k.shape[2], query_offset)
        table = self._segment_table(segment_q)
        segment_q, segment_k = segment_ids_pair(table, segment_q, segment_k)
        return "diet_abs", dict(pos_q=pos_q, pos_k=pos_k, segment_q=segment_q,
                                segment_k=segment_k, segment_table=table, scale=self.scale,
                                query_offset=query_offset)

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        n, m = q.shape[2], k.shape[2]
        if not query_offset:          # P_Q P_Kᵀ shared by the layers, or cached in eval
            if state is None and self._cacheable():
                state = self.positional(n, m)
            if state is not None:
                method, keywords = content_and_segments(
                    q, k, self.scale, segment_q, segment_k, self._segment_table(segment_q))
                return getattr(F, method)(q, k, **keywords) + state
        return super().logits(q, k, segment_q=segment_q, segment_k=segment_k,
                              query_offset=query_offset)


class DIETRel(PositionalEncoding):
    """Decoupled relative positional attention: Chen et al. 2021 (DIET), eq. (3)
    (SPEC 3.10).

    ``A_ij = q_i·k_j/sqrt(d) + R_{i-j} + E_S(S(i), S(j))``, one scalar per head
    and clipped offset ``i - j`` (query minus key, as the paper writes it):
    ``rel`` (H|1, 2t + 1), no log-binning.  The paper recommends no sharing
    (``per_head=True``, one module per layer; Table 6).  ``num_segments`` adds
    the per-head segment attention.  Initialised N(0, init_std²).
    """

    method = "diet_rel"

    def __init__(self, num_heads: int, max_distance: int, *, per_head: bool = True,
                 num_segments: int | None = None, scale: float | None = None,
                 init_std: float = 0.02):
        super().__init__(num_heads)
        self.max_distance, self.per_head, self.scale = max_distance, per_head, scale
        self.rel = _table(num_heads if per_head else 1, 2 * max_distance + 1, init_std=init_std)
        self.segments = (SegmentAttention(num_heads, num_segments, per_head=per_head, scale=scale)
                         if num_segments is not None else None)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        table = None if self.segments is None or segment_q is None else self.segments.table
        segment_q, segment_k = segment_ids_pair(table, segment_q, segment_k)
        return "diet_rel", dict(rel=self.rel, max_distance=self.max_distance, segment_q=segment_q,
                                segment_k=segment_k, segment_table=table, scale=self.scale,
                                query_offset=query_offset)


class RelativeBias(PositionalEncoding):
    """Any function of the offset as a bias (SPEC 3.15): ``A_ij = q_i·k_j/sqrt(d)
    + bias[h, clip(j - i, -t, t) + t]``, the generic Toeplitz term on the fused
    kernels with its gradient.

    ``bias_fn`` (an ``nn.Module``) maps the offsets ``-t..t`` (a float tensor of
    ``2t + 1`` values) to the ``(H|1, 2t + 1)`` bias, so any parametrisation of
    the offset trains through it: Sandwich's sinusoid products, FIRE-style or
    other small networks of the offset, a kernel of the distance.  Without one
    the bias is a learned table of its own (``per_head``), N(0, init_std²).
    """

    method = "relative_bias"

    def __init__(self, num_heads: int, max_distance: int, *, bias_fn: nn.Module | None = None,
                 per_head: bool = True, scale: float | None = None, init_std: float = 0.02):
        super().__init__(num_heads)
        self.max_distance, self.scale, self.bias_fn = max_distance, scale, bias_fn
        self.table = (None if bias_fn is not None else
                      _table(num_heads if per_head else 1, 2 * max_distance + 1,
                             init_std=init_std))

    def bias(self) -> torch.Tensor:
        """The (H|1, 2t + 1) bias of the offsets -t..t."""
        if self.bias_fn is None:
            return self.table
        like = next(self.bias_fn.parameters(), None)      # the offsets on its device, dtype
        offsets = torch.arange(-self.max_distance, self.max_distance + 1,
                               dtype=torch.get_default_dtype() if like is None else like.dtype,
                               device=None if like is None else like.device)
        return self.bias_fn(offsets)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return "relative_bias", dict(bias=self.bias(), max_distance=self.max_distance,
                                     scale=self.scale, query_offset=query_offset)


class ContinuousPositionBias(nn.Module):
    """Swin Transformer V2's continuous position bias (Liu et al. 2022, §3.3): a small
    network of the log-spaced 2-D offset, a `bias_fn` for `RelativeBias2D`.

    The offsets (dy, dx) of a (2 t_y + 1) x (2 t_x + 1) window, query minus key as
    Swin-v2 writes them, divided by ``pretrained`` (t_y, t_x) (or max_distance), times
    8, then ``sign(x) log2(1 + |x|) / log2(8)``; ``Linear(2, hidden)``, ReLU,
    ``Linear(hidden, num_heads, bias=False)``, and ``16 sigmoid``: HuggingFace
    Swinv2's ``continuous_position_bias_mlp`` and layout, so its weights load as they
    are (``mlp.0``, ``mlp.2``).  Returns the ``(num_heads, T)`` bias in posenc's
    order (key minus query: Swin's table reversed).
    """

    def __init__(self, num_heads: int, max_distance, *, hidden: int = 512,
                 pretrained=None):
        super().__init__()
        kind = REGISTRY["relative_bias_2d"].param_kinds["max_distance"]
        self.max_distance = kind.check("max_distance", max_distance)
        self.pretrained = (self.max_distance if pretrained is None
                           else kind.check("pretrained", pretrained))
        self.mlp = nn.Sequential(nn.Linear(2, hidden, bias=True), nn.ReLU(inplace=True),
                                 nn.Linear(hidden, num_heads, bias=False))

    def offsets(self, dtype=None, device=None) -> torch.Tensor:
        """(T, 2) Swin-v2's normalised log-spaced offsets, in Swin's (query-minus-key) order."""
        ty, tx = self.max_distance
        dy = torch.arange(-ty, ty + 1, dtype=torch.float32, device=device)
        dx = torch.arange(-tx, tx + 1, dtype=torch.float32, device=device)
        table = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1)
        table = table / torch.tensor([max(t, 1) for t in self.pretrained], device=device) * 8
        table = torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)
        return table.reshape(-1, 2).to(dtype or torch.get_default_dtype())

    def forward(self, offsets=None) -> torch.Tensor:
        weight = self.mlp[0].weight
        swin = self.mlp(self.offsets(weight.dtype, weight.device))       # (T, H), Swin's order
        return (16 * torch.sigmoid(swin)).flip(0).transpose(0, 1)        # (H, T), posenc's


class RelativeBias2D(PositionalEncoding):
    """A 2-D relative position bias (SPEC 3.19): Swin (Liu et al. 2021) and BEiT (Bao et
    al. 2022).  ``A_ij = q_i·k_j/sqrt(d) + bias[h, bucket(dy, dx)]``, (dy, dx) the key's
    grid coordinates minus the query's clipped to ``max_distance``; fused, with the
    table's gradient.

    Token p of a sequence sits on a raster of ``grid = (rows, cols)`` at
    ``(p // cols, p % cols)`` (after a global [CLS] token, ``cls_token=True``: BEiT's,
    with its three buckets T, T + 1, T + 2); without a grid on one row, ``(0, p)`` (a
    1-D relative bias: an int max_distance t is then (0, t)).  ``max_distance`` (t_y,
    t_x) defaults to the grid's (rows - 1, cols - 1): every offset its own bucket, as
    Swin's windows and BEiT's patches.  ``logits(q, k, state=(coords_q, coords_k))``
    takes any other coordinates ((B|1, n, 2), (B|1, m, 2) integers).

    ``bias_fn`` (an ``nn.Module``, as `ContinuousPositionBias`: Swin-v2) gives the
    ``(H|1, T)`` bias of the T offsets; the global buckets then have a table of their
    own.  Without one the bias is a learned table (``per_head``) N(0, init_std²)
    (Swin's and BEiT's truncated-normal 0.02).  Load HF Swin's or BEiT's
    ``relative_position_bias_table`` (T [+ 3], H) as ``table = hf.T`` with its first
    T rows reversed (`from_hf_table`).
    """

    method = "relative_bias_2d"

    def __init__(self, num_heads: int, max_distance=None, *, grid=None, cls_token: bool = False,
                 bias_fn: nn.Module | None = None, per_head: bool = True,
                 scale: float | None = None, init_std: float = 0.02):
        super().__init__(num_heads)
        kind = REGISTRY["relative_bias_2d"].param_kinds["max_distance"]
        if grid is not None:
            grid = tuple(kind.check("grid", grid))
            if min(grid) < 1:
                raise ValueError(f"grid must be (rows, cols) >= 1, got {grid}")
            if max_distance is None:
                max_distance = (grid[0] - 1, grid[1] - 1)
        elif max_distance is None:
            raise ValueError("RelativeBias2D needs a grid (rows, cols) or a max_distance")
        elif isinstance(max_distance, int):
            max_distance = (0, max_distance)          # one row of tokens: a 1-D bias
        self.max_distance = kind.check("max_distance", max_distance)
        self.grid, self.cls_token, self.scale, self.bias_fn = grid, cls_token, scale, bias_fn
        heads = num_heads if per_head else 1
        T = (2 * self.max_distance[0] + 1) * (2 * self.max_distance[1] + 1)
        self.table = (None if bias_fn is not None else
                      _table(heads, T + 3 if cls_token else T, init_std=init_std))
        self.global_table = (_table(heads, 3, init_std=init_std)
                             if bias_fn is not None and cls_token else None)

    def bias(self) -> torch.Tensor:
        """The (H|1, T) bias, or (H|1, T + 3) with the global token's."""
        if self.bias_fn is None:
            return self.table
        bias = self.bias_fn()
        if self.global_table is not None:
            bias = torch.cat([bias, self.global_table.to(bias.dtype).expand(len(bias), 3)], 1)
        return bias

    @staticmethod
    def from_hf_table(table: torch.Tensor, buckets: int) -> torch.Tensor:
        """HF Swin's / BEiT's relative_position_bias_table (T [+ 3], H) as posenc's bias
        (H, T [+ 3]): its first T rows reversed (they index query minus key)."""
        return torch.cat([table[:buckets].flip(0), table[buckets:]], 0).transpose(0, 1)

    def coords(self, positions: torch.Tensor) -> torch.Tensor:
        """(len, 2) coordinates of sequence positions (the global token's (-1, -1))."""
        if self.cls_token:
            positions = positions - 1
        if self.grid is None:
            coords = torch.stack([torch.zeros_like(positions), positions], -1)
        else:
            coords = torch.stack(_raster(positions, self.grid[1]), -1).long()
        return torch.where((positions < 0)[:, None], -1, coords)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        if state is None:
            rows = torch.arange(q.shape[-2], device=q.device) + int(query_offset)
            state = (self.coords(rows)[None], self.coords(torch.arange(k.shape[-2],
                                                                       device=q.device))[None])
        coords_q, coords_k = state
        return "relative_bias_2d", dict(bias=self.bias(), coords_q=coords_q, coords_k=coords_k,
                                        max_distance=self.max_distance, scale=self.scale,
                                        query_offset=query_offset)


class ForgetGates(PositionalEncoding):
    """The Forgetting Transformer's forget gates: Lin et al. 2025, *Forgetting
    Transformer: Softmax Attention with a Forget Gate* (SPEC 3.17).

    Each head forgets at a rate the tokens choose: ``f_t = σ(w_h·x_t + b_h)``
    from the layer's input ``x_t`` (a linear map ``d_model → num_heads``), and
    ``A_ij = q_i·k_j/sqrt(d) + Σ_{l=j+1}^{i} log f_l``: a data-dependent ALiBi,
    computed fused (the kernels read the gates' prefix sums; nothing of
    ``(n, m)`` is formed).  ``bidirectional=True`` adds a second set of gates
    for the keys after the query (the encoder form).  The bias starts at
    ``bias_init`` (5: gates of σ(5) ≈ 0.993, little forgetting at first).

    The gates come from the layer input, so the layer hands them over:
    `PositionalSelfAttention` calls ``input_state(x)`` (``reads_input``) and
    keeps the gates of cached keys in its cache; called directly,
    ``logits(q, k, state=(log_fgate, log_fgate_reverse))`` takes them
    ``(B, H, m)`` each (the second None unless bidirectional).
    """

    method = "fox"
    reads_input = True

    def __init__(self, num_heads: int, d_model: int, *, bidirectional: bool = False,
                 scale: float | None = None, bias_init: float = 5.0):
        super().__init__(num_heads)
        self.bidirectional, self.scale = bidirectional, scale
        self.gate_proj = nn.Linear(d_model, num_heads * (2 if bidirectional else 1))
        nn.init.constant_(self.gate_proj.bias, bias_init)

    def input_state(self, x: torch.Tensor) -> torch.Tensor:
        """The log forget gates of the tokens of x (B, n, d_model): (B, H, n), or
        (B, 2H, n) with the reverse direction's after (bidirectional)."""
        return torch.nn.functional.logsigmoid(self.gate_proj(x)).transpose(1, 2)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        if state is None:
            raise ValueError("ForgetGates needs the keys' log forget gates: state = "
                             "input_state(x) of the layer's input (PositionalSelfAttention "
                             "passes it)")
        if isinstance(state, torch.Tensor):
            gates, reverse = (state.chunk(2, dim=1) if self.bidirectional else (state, None))
        else:
            gates, reverse = state
        return "fox", dict(log_fgate=gates, log_fgate_reverse=reverse, scale=self.scale,
                           query_offset=query_offset)


class CoPE(PositionalEncoding):
    """Contextual position encoding: Golovneva et al. 2024, *Contextual Position
    Encoding: Learning to Count What's Important* (SPEC 3.18).

    Positions are counted by the content: query i gates each key it sees by
    ``g_ij = σ(q_i·k_j/sqrt(d))``, key j sits at ``p_ij = Σ_{t≥j} g_it`` (clamped to
    ``max_pos - 1``), and ``A_ij = q_i·k_j/sqrt(d) + q_i·e[p_ij]``, the embedding
    interpolated between the rows around ``p_ij``.  ``pos_emb`` ``(max_pos, head_dim)``
    is shared by the heads as in the paper and x-transformers' ``CoPE`` (``per_head``:
    one per head), zero at first as there.  The kernels compute it fused, forward and
    backward (the gates' path into q and k included), never forming ``(n, m)``
    positions; the fused attention's masks (causal, padding, windows, documents) are
    the keys the gates see.  ``causal=True`` masks the keys after each query for the
    gates of ``logits`` (a decoder's); the attention takes its own ``causal``.
    """

    method = "cope"

    def __init__(self, num_heads: int, head_dim: int, max_pos: int = 16, *,
                 per_head: bool = False, causal: bool = False, scale: float | None = None):
        super().__init__(num_heads)
        self.max_pos, self.per_head, self.causal, self.scale = max_pos, per_head, causal, scale
        shape = (num_heads, max_pos, head_dim) if per_head else (max_pos, head_dim)
        self.pos_emb = nn.Parameter(torch.zeros(shape))

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return "cope", dict(pos_emb=self.pos_emb, scale=self.scale, query_offset=query_offset)

    def logits(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        method, keywords = self.arguments(q, k, query_offset=query_offset)
        return getattr(F, method)(q, k, causal=self.causal, **keywords)


class ALiBi(PositionalEncoding):
    """Attention with linear biases: Press et al. 2022, *Train Short, Test Long*
    (spec §3.13).  ``A_ij = q_i·k_j/sqrt(d) - m_h |j - i|``.

    The slopes start at the paper's (``posenc.alibi_slopes(num_heads)``, BLOOM's
    rule for any H) and are fixed by default, as in the paper; with
    ``learnable=True`` they train, kept positive by their parametrisation
    (``m = exp(log_m)``; their gradient comes from the fused kernels).
    """

    method = "alibi"

    def __init__(self, num_heads: int, *, learnable: bool = False, scale: float | None = None):
        super().__init__(num_heads)
        self.scale, self.learnable = scale, learnable
        log_slopes = torch.log(torch.from_numpy(alibi_slopes(num_heads))).to(
            torch.get_default_dtype())
        if learnable:
            self.log_slopes = nn.Parameter(log_slopes)
        else:
            self.register_buffer("log_slopes", log_slopes)

    @property
    def slopes(self) -> torch.Tensor:
        return self.log_slopes.exp()

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return "alibi", dict(slopes=self.slopes, scale=self.scale, query_offset=query_offset)


class KERPLE(PositionalEncoding):
    """Kernelized relative positional embedding: Chi et al. 2022, *KERPLE:
    Kernelized Relative Positional Embedding for Length Extrapolation*
    (spec §3.14).  ``kind="log"``: ``A_ij = q_i·k_j/sqrt(d) - r1 log(1 + r2 |j - i|)``;
    ``kind="power"``: ``- r1 |j - i|^r2``.

    ``r1``, ``r2`` per head (``per_head=False``: one pair for all heads), kept
    positive as ``exp`` of the parameters; initialised as the authors' code
    does, ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``, at least ``eps``.
    """

    method = "kerple"

    def __init__(self, num_heads: int, kind: str = "log", *, per_head: bool = True,
                 scale: float | None = None, eps: float = 1e-2):
        super().__init__(num_heads)
        if kind not in ("log", "power"):
            raise ValueError(f"kind must be 'log' or 'power', got {kind!r}")
        self.kind, self.scale = kind, scale
        heads = num_heads if per_head else 1
        self.log_r1 = nn.Parameter((torch.rand(heads) * 2).clamp(min=eps).log())
        self.log_r2 = nn.Parameter(torch.rand(heads).clamp(min=eps).log())

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        return "kerple", dict(r1=self.log_r1.exp(), r2=self.log_r2.exp(), kind=self.kind,
                              scale=self.scale, query_offset=query_offset)


class RotaryEmbedding(PositionalEncoding):
    """Rotary position embedding: Su et al. 2021, *RoFormer* (spec §3.12), as
    HuggingFace's rotary models apply it: q and k rotated pair by pair by the
    angles of their positions, ``A_ij = rot(q_i, i)·rot(k_j, j) / sqrt(d)``.

    The tables come from ``rope_parameters`` exactly as transformers 5 builds
    them (``posenc.rope_tables``: ``rope_theta``, ``rope_type`` default,
    linear, dynamic, yarn, longrope, llama3), for ``rotary_dim`` of the
    ``head_dim`` dimensions (``partial_rotary_factor``; default all), half-split
    pairs (Llama, GPT-NeoX) or ``interleaved`` (GPT-J, RoFormer);
    ``xpos_scale_base`` gives xPos's tables instead (Sun et al. 2022).  They
    are built for the longest position a call reaches (at least
    ``max_position_embeddings``; ``dynamic`` and ``longrope`` for that length,
    as HF does past it), in the inputs' dtype, and kept until a longer one.
    The rotation runs in the fused kernels, forward and backward.
    """

    method = "rope"

    def __init__(self, num_heads: int, head_dim: int, *, rotary_dim: int | None = None,
                 rope_parameters: dict | None = None, max_position_embeddings: int = 2048,
                 interleaved: bool = False, xpos_scale_base: float | None = None,
                 scale: float | None = None):
        super().__init__(num_heads)
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not 0 < self.rotary_dim <= head_dim or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even, in (0, head_dim = {head_dim}], "
                             f"got {self.rotary_dim}")
        self.rope_parameters = dict(rope_parameters or {"rope_type": "default",
                                                        "rope_theta": 10000.0})
        self.max_position_embeddings = max_position_embeddings
        self.interleaved, self.xpos_scale_base, self.scale = interleaved, xpos_scale_base, scale
        self._tables = {}

    def tables(self, positions: int, dtype, device) -> tuple:
        """(cos, sin[, cos_k, sin_k]) for positions [0, positions), in `dtype` on `device`."""
        length = max(int(positions), self.max_position_embeddings)
        key = (length, dtype, device)
        if key not in self._tables:
            import numpy as np
            from ..rotary import rope_tables, xpos_tables
            wide = np.float64 if dtype == torch.float64 else np.float32
            if self.xpos_scale_base is not None:
                arrays = xpos_tables(length, self.rotary_dim, scale_base=self.xpos_scale_base,
                                     dtype=wide)
            else:
                arrays = rope_tables(length, self.rotary_dim,
                                     rope_parameters=self.rope_parameters,
                                     max_position_embeddings=self.max_position_embeddings,
                                     seq_len=length, dtype=wide)
            self._tables = {key: tuple(torch.from_numpy(a).to(dtype=dtype, device=device)
                                       for a in arrays)}
        return self._tables[key]

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        reach = max(int(query_offset) + q.shape[-2], k.shape[-2])
        cos, sin, *keys = self.tables(reach, q.dtype, q.device)
        cos_k, sin_k = keys if keys else (None, None)
        return "rope", dict(cos=cos, sin=sin, cos_k=cos_k, sin_k=sin_k,
                            interleaved=self.interleaved, scale=self.scale,
                            query_offset=query_offset)


class _TokenRotary(PositionalEncoding):
    """Base of the rotary encodings whose angles a model computes per token (spec
    §3.16): ``angles(positions, state)`` gives the ``(B|1, H|1, L, r)`` angles of
    sequence positions ``positions`` (L,), and the rotation runs on the per-token
    tables ``cos``, ``sin`` of them (queries at ``query_offset + i``, keys at ``j``)
    in the fused kernels, their gradients flowing back into whatever computed the
    angles (RoPE-Mixed's frequencies).  A variant of ``rope``: `build_encoding`
    and the HF swap take `RotaryEmbedding` for that method."""

    method = "rope"
    variant = True
    interleaved = False
    attention_scaling = 1.0     # the tables' factor (HF's attention_scaling: MRoPE's)

    def __init__(self, num_heads: int, head_dim: int, *, scale: float | None = None):
        super().__init__(num_heads)
        if head_dim < 2:
            raise ValueError(f"head_dim must be >= 2 to rotate a pair, got {head_dim}")
        self.head_dim, self.scale = head_dim, scale

    def angles(self, positions: torch.Tensor, state=None) -> torch.Tensor:
        raise NotImplementedError

    def tables(self, positions: torch.Tensor, state=None, dtype=None) -> tuple:
        """(cos, sin) of the angles, (B|1, H|1, L, r), times attention_scaling, in `dtype`."""
        angles = self.angles(positions, state)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(dtype or cos.dtype), sin.to(dtype or sin.dtype)

    def arguments(self, q, k, *, state=None, segment_q=None, segment_k=None, query_offset=0):
        rows = torch.arange(q.shape[-2], device=q.device) + int(query_offset)
        cos, sin = self.tables(rows, state, q.dtype)
        cos_k, sin_k = self.tables(torch.arange(k.shape[-2], device=q.device), state, q.dtype)
        return "rope", dict(cos=cos, sin=sin, cos_k=cos_k, sin_k=sin_k,
                            interleaved=self.interleaved, scale=self.scale,
                            query_offset=query_offset)


def _raster(positions: torch.Tensor, cols: int) -> tuple:
    """(row, col) float64 of positions on a raster of `cols` columns (by floor of a
    float division: torch.compile's inductor miscompiles an integer arange's // and %)."""
    t = positions.to(torch.float64)
    row = torch.floor(t / cols)
    return row, t - cols * row


def _inverse_frequencies(dim: int, base: float, step: int = 2, device=None) -> torch.Tensor:
    """1 / base^(t / dim), t = 0, step, ... < dim, in float32 as HF computes them."""
    return 1.0 / (base ** (torch.arange(0, dim, step, dtype=torch.float, device=device) / dim))


class MRoPE(_TokenRotary):
    """Multimodal rotary position embedding: Qwen2-VL's M-RoPE (Wang et al. 2024, §2.1)
    and Qwen3-VL's interleaved layout.  Each token has three positions (temporal,
    height, width: ``state = position_ids (3, B, m)`` over the keys, the queries
    reading theirs at ``query_offset + i``; without it, text, the three are the
    sequence position and this is RoPE).  The ``head_dim / 2`` pairs are split by
    ``mrope_section``: consecutive sections of the three axes (Qwen2-VL), or with
    ``interleaved_sections`` pair t on axis t mod 3 within the sections' reach
    (Qwen3-VL).  The angles are HF's (``position * inv_freq`` in float32, times
    ``attention_scaling``); half-split pairs."""

    def __init__(self, num_heads: int, head_dim: int, mrope_section=(16, 24, 24), *,
                 interleaved_sections: bool = False, rope_theta: float = 10000.0,
                 attention_scaling: float = 1.0, scale: float | None = None):
        super().__init__(num_heads, head_dim, scale=scale)
        self.mrope_section = tuple(int(x) for x in mrope_section)
        pairs = head_dim // 2
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != pairs:
            raise ValueError(f"mrope_section must be three sections of the head_dim / 2 = "
                             f"{pairs} pairs, got {mrope_section}")
        self.interleaved_sections, self.rope_theta = interleaved_sections, rope_theta
        self.attention_scaling = attention_scaling
        axis = torch.zeros(pairs, dtype=torch.long)
        if interleaved_sections:           # Qwen3-VL: T H W T H W ..., then T
            for a in (1, 2):
                axis[a:3 * self.mrope_section[a]:3] = a
        else:                              # Qwen2-VL: T..T H..H W..W
            axis[self.mrope_section[0]:] = 1
            axis[self.mrope_section[0] + self.mrope_section[1]:] = 2
        self.register_buffer("axis_of_pair", axis, persistent=False)
        self.register_buffer("inv_freq", _inverse_frequencies(head_dim, rope_theta),
                             persistent=False)

    def angles(self, positions, state=None):
        if state is None:                  # text: every axis the sequence position
            ids = positions[None, None, :].expand(3, 1, -1)
        else:
            ids = state[..., positions]                       # (3, B, L)
        freqs = ids[..., None].float() * self.inv_freq.to(ids.device)   # (3, B, L, r)
        index = self.axis_of_pair.to(ids.device)[None, None, None, :].expand(1, *freqs.shape[1:])
        return torch.gather(freqs, 0, index)[0][:, None]      # (B, 1, L, r)

class AxialRoPE2D(_TokenRotary):
    """2-D axial rotary embedding of a patch grid ``grid = (rows, cols)`` (tokens in
    raster order after ``prefix_tokens`` unrotated ones: [CLS], registers): half the
    pairs rotate by the patch's row, half by its column.  ``style="pixtral"``
    (Pixtral, HF PixtralVisionRotaryEmbedding): integer (row, col), the pairs of
    1/θ^(2t/d) split even/odd between the axes; ``style="dinov3"`` (DINOv3, HF
    DINOv3ViTRopePositionEmbedding): patch centres in [-1, 1], angles 2π c·f with
    f = 1/θ^(4t/d).  Half-split pairs."""

    def __init__(self, num_heads: int, head_dim: int, grid, *, style: str = "pixtral",
                 rope_theta: float | None = None, prefix_tokens: int = 0,
                 scale: float | None = None):
        super().__init__(num_heads, head_dim, scale=scale)
        if style not in ("pixtral", "dinov3"):
            raise ValueError(f"style must be 'pixtral' or 'dinov3', got {style!r}")
        if head_dim % 4:
            raise ValueError(f"head_dim must be a multiple of 4 (two axes of pairs), got {head_dim}")
        self.grid, self.style, self.prefix_tokens = tuple(int(g) for g in grid), style, prefix_tokens
        self.rope_theta = rope_theta if rope_theta is not None else (
            10000.0 if style == "pixtral" else 100.0)
        if style == "pixtral":
            inv = _inverse_frequencies(head_dim, self.rope_theta)
            freqs = torch.cat([inv[0::2], inv[1::2]])
        else:
            freqs = 1 / self.rope_theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32)
        self.register_buffer("freqs", freqs, persistent=False)

    def coordinates(self, positions) -> torch.Tensor:
        """(L, 2) float32 (row, col) of positions (prefix tokens: 0, unrotated)."""
        rows, cols = self.grid
        yx = torch.stack(_raster((positions - self.prefix_tokens).clamp(min=0), cols), -1).float()
        if self.style == "dinov3":
            yx = 2.0 * (yx + 0.5) / torch.tensor([rows, cols], dtype=torch.float32,
                                                 device=yx.device) - 1.0
        return yx

    def angles(self, positions, state=None):
        yx = self.coordinates(positions)
        freqs = self.freqs.to(yx.device)
        if self.style == "pixtral":
            half = len(freqs) // 2
            angles = torch.cat([yx[:, :1] * freqs[:half], yx[:, 1:] * freqs[half:]], -1)
        else:
            angles = (2 * math.pi * yx[:, :, None] * freqs).flatten(1, 2)
        angles = torch.where((positions < self.prefix_tokens)[:, None], 0.0, angles)
        return angles[None, None]                              # (1, 1, L, r)


class RoPEMixed(_TokenRotary):
    """RoPE-Mixed: Heo et al. 2024, *Rotary Position Embedding for Vision
    Transformer* (eq. (11)): learnable frequencies per head mixing both axes, the
    angle of pair t of head h at patch (x, y) ``x·ω_x[h, t] + y·ω_y[h, t]``;
    ``freqs (2, H, head_dim / 2)`` initialised as the authors do (magnitudes
    1/θ^(4t/d), θ = 10, at a random direction per head and its perpendicular),
    trained through the per-token tables' gradient of the fused kernels.  Tokens
    on ``grid = (rows, cols)`` after ``prefix_tokens`` unrotated ones; interleaved
    pairs (the authors' complex rotation)."""

    interleaved = True

    def __init__(self, num_heads: int, head_dim: int, grid, *, rope_theta: float = 10.0,
                 prefix_tokens: int = 0, scale: float | None = None):
        super().__init__(num_heads, head_dim, scale=scale)
        if head_dim % 4:
            raise ValueError(f"head_dim must be a multiple of 4, got {head_dim}")
        self.grid, self.prefix_tokens = tuple(int(g) for g in grid), prefix_tokens
        magnitude = 1 / rope_theta ** (torch.arange(0, head_dim, 4)[:head_dim // 4].float() / head_dim)
        phase = torch.rand(num_heads, 1) * 2 * math.pi
        fx = torch.cat([magnitude * torch.cos(phase), magnitude * torch.cos(math.pi / 2 + phase)], -1)
        fy = torch.cat([magnitude * torch.sin(phase), magnitude * torch.sin(math.pi / 2 + phase)], -1)
        self.freqs = nn.Parameter(torch.stack([fx, fy]))       # (2, H, d / 2)

    def angles(self, positions, state=None):
        y, x = (c.to(self.freqs.dtype) for c in
                _raster((positions - self.prefix_tokens).clamp(min=0), self.grid[1]))
        angles = x[None, :, None] * self.freqs[0][:, None] + y[None, :, None] * self.freqs[1][:, None]
        angles = torch.where((positions < self.prefix_tokens)[None, :, None], 0.0, angles)
        return angles[None]                                    # (1, H, L, r)


def encoding_classes() -> dict:
    """method -> its encoding class of this module (the class's `method`)."""
    return {cls.method: cls for cls in globals().values()
            if isinstance(cls, type) and issubclass(cls, PositionalEncoding) and cls.method
            and not cls.variant}


def build_encoding(method: str, context: dict, params: dict | None = None) -> PositionalEncoding:
    """An encoding of `method` for a model of `context`'s shape (num_heads, head_dim,
    d_model, max_len, max_distance, ...): its class's constructor takes what it
    accepts of `context`, and `params` override (an argument it does not take is a
    TypeError naming the ones it does)."""
    import inspect

    classes = encoding_classes()
    if method not in classes:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(sorted(classes))}")
    cls, params = classes[method], dict(params or {})
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(params) - set(accepted) - {"self"})
    if unknown:
        raise TypeError(f"{cls.__name__} ({cls.method}) takes no argument {', '.join(unknown)}; "
                        f"it takes {', '.join(name for name in accepted if name != 'self')}")
    return cls(**{name: params.get(name, context.get(name)) for name in accepted
                  if name in params or name in context})
