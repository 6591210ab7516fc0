"""A self-attention layer around any encoding of `posenc.torch.nn`."""

from __future__ import annotations

import torch
from torch import nn

from ._common import dropout_seed
from ._encodings import Content, PositionalEncoding
from ._linear import project
from .._attention import check_softcap, check_window
from .._registry import REGISTRY
from .native import _MASKED_FORMULAS, attention_mask, per_query_head, softmax


class PositionalSelfAttention(nn.Module):
    """Multi-head self-attention whose logits come from a positional encoding.

    ``x`` (B, n, d_model) → Q, K, V projections (d_model → num_heads·head_dim
    for Q, num_kv_heads·head_dim for K and V) → per-head ``q`` (B, H, n, head_dim),
    ``k``, ``v`` (B, H_kv, n, head_dim), strided views passed to
    the ops without a copy → softmax(logits + mask) → dropout → weighted sum of
    ``v`` → output projection (Vaswani et al. 2017, eq. (1)-(2), with the logits
    of the encoding in place of ``QKᵀ/sqrt(d)``).  ``encoding`` is any
    `PositionalEncoding` of `posenc.torch.nn` (None: plain content attention);
    passing one module to several layers shares it layer-wise.
    ``num_kv_heads`` (default ``num_heads``; a divisor of it) gives grouped-query
    attention (Ainslie et al. 2023; 1: multi-query, Shazeer 2019): query head h
    reads key/value head ``h // (num_heads // num_kv_heads)``, k and v are never
    repeated on the fused path, and the KV cache holds ``num_kv_heads`` heads.
    SPEC §7's shapes: ``window=(left, right)`` (either side None: unbounded; HF's
    ``sliding_window = w`` with ``causal`` is ``(w - 1, 0)``), ``softcap`` (Gemma 2:
    logits ``softcap·tanh(A / softcap)``), ``sinks=True`` (gpt-oss: a learned logit
    per head, ``self.sinks``, in every row's softmax with no value).

    By default the layer runs the encoding's *fused* attention
    (``posenc.torch.<method>_attention``: on CPU the C kernels compute
    softmax(A + mask)·V and its gradients without the (B, H, n, m) logits;
    dropout inside the kernel).  An additive or boolean ``attn_mask``, or
    ``fused=False``, takes the logits path: the encoding's logits, the masks,
    torch's softmax, dropout and matmul.

    ``forward(x, key_padding_mask=None, segment_ids=None, state=None, *,
    causal=None, attn_mask=None, past_key_value=None, use_cache=False)``:

    * ``key_padding_mask`` (B, m) bool, True at padding keys (m counts the
      cached keys too);
    * ``causal`` (default: the layer's ``causal``): query i attends to keys
      j <= query_offset + i;
    * ``attn_mask``: (n, m) or (B, H|1, n, m), bool (True = masked, as
      ``key_padding_mask``) or float (added to the logits);
    * ``past_key_value``: ``(k, v)`` of the earlier positions, each
      (B, H_kv, m_past, head_dim), as returned with ``use_cache=True`` (with their
      segment ids as a third entry when the call had ``segment_ids``); the new
      queries sit at positions m_past, m_past + 1, ... (``query_offset``);
      ``use_cache=True`` returns ``(out, cache)`` with every key and value so far;
    * ``document_ids`` (B, n) ints: packed sequences (HF's
      ``DataCollatorWithFlattening``, flash-attn's ``cu_seqlens``): a query sees
      the keys of its own document only (with a cache, the cache holds the keys'
      ids as a fourth entry; with an encoding that reads the layer input, FoX's
      `ForgetGates`, the keys' gates as a fifth);
    * ``segment_ids`` (B, n) ints for encodings with segment attention;
      ``state``: the encoding's `positional(n, m)`, computed once by a model
      whose layers share the encoding (TUPE, DIET-ABS), used on the logits path.
    """

    def __init__(self, d_model: int, num_heads: int, encoding: PositionalEncoding | None = None,
                 *, head_dim: int | None = None, dropout: float = 0.0, bias: bool = True,
                 causal: bool = False, fused: bool = True, num_kv_heads: int | None = None,
                 window: tuple | None = None, softcap: float | None = None,
                 sinks: bool = False):
        super().__init__()
        self.window = check_window(window)
        self.softcap = check_softcap(softcap)
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if self.num_kv_heads <= 0 or num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads must divide num_heads = {num_heads}, got "
                             f"{num_kv_heads}")
        if head_dim is None and d_model % num_heads:
            raise ValueError(f"d_model = {d_model} is not a multiple of num_heads = {num_heads}: "
                             f"give head_dim (the per-head width) explicitly")
        self.head_dim = head_dim or d_model // num_heads
        if self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.encoding = Content(num_heads) if encoding is None else encoding
        if self.encoding.num_heads != num_heads:
            raise ValueError(f"encoding has {self.encoding.num_heads} heads, the layer "
                             f"{num_heads}")
        if self.encoding.uses_attention_projections and self.num_kv_heads != num_heads:
            raise ValueError(f"{type(self.encoding).__name__} projects its positions by the "
                             f"layer's key projection, which has {self.num_kv_heads} heads, not "
                             f"the {num_heads} of the queries (num_kv_heads must be num_heads)")
        self.causal, self.fused = causal, fused
        inner, inner_kv = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner_kv, bias=bias)
        self.v_proj = nn.Linear(d_model, inner_kv, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def _heads(self, x):
        """(B, n, heads·d) → (B, heads, n, d), a strided view."""
        return x.view(x.shape[0], x.shape[1], -1, self.head_dim).transpose(1, 2)

    def _projections(self, x, key_padding_mask, past_key_value):
        """q, k, v (keys and values after the cache and a Linformer projection)."""
        q, k, v = (self._heads(project(proj, x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if past_key_value is not None:
            k_past, v_past = past_key_value[:2]
            k, v = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)
        if self.encoding.projects_keys:
            if past_key_value is not None:
                raise ValueError("a key/value cache needs the keys' own positions; "
                                 f"{type(self.encoding).__name__} projects them (Linformer)")
            if key_padding_mask is not None:   # Linformer: padding must not enter E k, F v
                keep = (~key_padding_mask)[:, None, :, None].to(k.dtype)
                k, v = k * keep, v * keep
            k, v = self.encoding.project_keys(k, v)
        return q, k, v

    def _input_state(self, x, state, past_key_value):
        """An encoding that reads the layer input (FoX's gates): its state for every key,
        the cached keys' (the cache's fifth entry) then the new tokens'."""
        if not self.encoding.reads_input or state is not None:
            return state
        state = self.encoding.input_state(x)
        if past_key_value is not None:
            if len(past_key_value) < 5 or past_key_value[4] is None:
                raise ValueError(f"{type(self.encoding).__name__} with a key/value cache: the "
                                 "cache must hold the keys' gates (a cache of this layer)")
            state = torch.cat([past_key_value[4], state], dim=2)
        return state

    def _state(self, q, k, state):
        if state is None and self.encoding.uses_attention_projections:
            state = self.encoding.positional(q.shape[2], k.shape[2], query_proj=self.q_proj,
                                             key_proj=self.k_proj)
        return state

    def logits_and_values(self, x, *, segment_ids=None, state=None, key_padding_mask=None,
                          past_key_value=None):
        """(logits (B, H, n, m), v (B, H_kv, m, d)): the encoding's logits before the
        softcap, the mask and the softmax, and the values they weight (value head
        h // (H / H_kv) for query head h)."""
        q, k, v = self._projections(x, key_padding_mask, past_key_value)
        offset = 0 if past_key_value is None else past_key_value[0].shape[2]
        segment_k = None if self.encoding.projects_keys else _key_segments(segment_ids,
                                                                           past_key_value)
        state = self._input_state(x, state, past_key_value)
        logits = self.encoding.logits(q, k, state=self._state(q, k, state),
                                      segment_q=segment_ids, segment_k=segment_k,
                                      query_offset=offset)
        return logits, v

    def forward(self, x, key_padding_mask: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None, state=None, *, causal: bool | None = None,
                attn_mask: torch.Tensor | None = None, past_key_value=None,
                use_cache: bool = False, document_ids: torch.Tensor | None = None):
        if x.dim() != 3:
            raise ValueError(f"x must be (B, n, d_model), got shape {tuple(x.shape)}"
                             + (" (add a batch axis: x[None])" if x.dim() == 2 else ""))
        batch, n, width = x.shape
        d_model = getattr(self.q_proj, "in_features", width)
        if width != d_model:
            raise ValueError(f"x must be (B, n, d_model = {d_model}), got shape {tuple(x.shape)}")
        causal = self.causal if causal is None else causal
        offset = 0 if past_key_value is None else past_key_value[0].shape[2]
        m = offset + n
        if attn_mask is not None:
            _check_attn_mask(attn_mask, batch, self.num_heads, n, m)
        if key_padding_mask is not None and key_padding_mask.shape != (batch, m):
            raise ValueError(f"key_padding_mask must have shape ({batch}, {m}) (B, m), got "
                             f"{tuple(key_padding_mask.shape)}")
        if document_ids is not None and self.encoding.projects_keys:
            raise ValueError(f"document_ids need the keys' own positions; "
                             f"{type(self.encoding).__name__} projects them (Linformer)")
        q, k, v = self._projections(x, key_padding_mask, past_key_value)
        segment_k = None if self.encoding.projects_keys else _key_segments(segment_ids,
                                                                           past_key_value)
        document_k = _cached(document_ids, past_key_value, 3, "document_ids")
        state = self._input_state(x, state, past_key_value)
        cache = (k, v) if segment_k is None and document_k is None else (
            (k, v, segment_k) if document_k is None else (k, v, segment_k, document_k))
        if self.encoding.reads_input:   # the keys' gates, fifth
            cache = (k, v, segment_k, document_k, state)
        padding = None if self.encoding.projects_keys else key_padding_mask
        shapes = dict(window=self.window, document_q=document_ids, document_k=document_k,
                      softcap=self.softcap, sinks=self.sinks)
        if self.fused and attn_mask is None:
            dropout_p = self.dropout.p if self.training else 0.0
            seed = dropout_seed(dropout_p)
            out = self.encoding.attention(
                q, k, v, state=self._state(q, k, state), segment_q=segment_ids,
                segment_k=segment_k, causal=causal, key_padding_mask=padding,
                query_offset=offset, dropout_p=dropout_p, seed=seed, **shapes).out
        else:
            masked = attention_mask(q, k, offset, causal, padding, self.window, document_ids, document_k)
            logits = self._logits(q, k, state, segment_ids, segment_k, offset, masked, attn_mask)
            if self.softcap is not None:
                logits = self.softcap * torch.tanh(logits / self.softcap)
            if masked is not None:
                logits = logits.masked_fill(masked, float("-inf"))
            if attn_mask is not None:
                logits = (logits.masked_fill(attn_mask, float("-inf"))
                          if attn_mask.dtype == torch.bool else logits + attn_mask)
            weights = self.dropout(softmax(logits, self.sinks)[0])
            out = torch.matmul(weights, per_query_head(v, self.num_heads))
        out = project(self.out_proj, out.transpose(1, 2).reshape(batch, n, -1))
        return (out, cache) if use_cache else out


    def _logits(self, q, k, state, segment_q, segment_k, offset, masked, attn_mask):
        """The unfused path's logits: the encoding's; for an encoding whose logits read the
        keys each row sees (CoPE's gates: REGISTRY[method].reads_mask) its method's torch
        formula on those keys (the masks and a boolean attn_mask's; an additive one is
        refused: which keys would its gates count?)."""
        state = self._state(q, k, state)
        if not REGISTRY[self.encoding.method].reads_mask:
            return self.encoding.logits(q, k, state=state, segment_q=segment_q,
                                        segment_k=segment_k, query_offset=offset)
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise ValueError(f"{type(self.encoding).__name__}'s gates count the keys each row "
                             "sees: give attn_mask as bool (True = masked), not additive")
        if attn_mask is not None:
            masked = attn_mask if masked is None else masked | attn_mask
        method, keywords = self.encoding.arguments(q, k, state=state, segment_q=segment_q,
                                                   segment_k=segment_k, query_offset=offset)
        return _MASKED_FORMULAS[method](q, k, **keywords,
                                        seen=None if masked is None else ~masked)


def _check_attn_mask(mask, batch: int, heads: int, n: int, m: int) -> None:
    """attn_mask as torch's attention takes it: bool (True = masked) or floating
    (added), (n, m) or (B|1, H|1, n, m); an integer mask is refused, as
    torch.nn.MultiheadAttention and SDPA refuse it (adding 0/1 would not mask)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(f"attn_mask must be bool (True = masked) or floating point (added to "
                        f"the logits), got {mask.dtype}: for a 0/1 mask pass mask.bool() "
                        f"(True where masked) or key_padding_mask")
    shape = tuple(mask.shape)
    fits = (shape == (n, m) or len(shape) == 4 and shape[0] in (1, batch)
            and shape[1] in (1, heads) and shape[2:] == (n, m))
    if not fits:
        raise ValueError(f"attn_mask must be (n, m) = ({n}, {m}) or (B|1, H|1, n, m) = "
                         f"({batch}|1, {heads}|1, {n}, {m}), got {shape}")


def _cached(ids, past_key_value, entry: int, name: str):
    """The keys' ids (segments, documents): the cached ones (the cache's `entry`), then
    the new queries'."""
    if ids is None or past_key_value is None:
        return ids
    if len(past_key_value) <= entry or past_key_value[entry] is None:
        raise ValueError(f"{name} with a key/value cache: the cache must hold the keys' "
                         f"{name.replace('_ids', '')} ids (the cache of a call that had {name})")
    return torch.cat([past_key_value[entry], ids], dim=1)


def _key_segments(segment_ids, past_key_value):
    return _cached(segment_ids, past_key_value, 2, "segment_ids")
