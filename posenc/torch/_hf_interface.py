"""`attn_implementation="posenc"`: posenc's fused attention on Hugging Face's attention interface.

transformers 5.x models (Llama, Mistral, Qwen2/3, Gemma 2/3, gpt-oss, GPT-NeoX,
Phi-3, OLMo-2, BERT, GPT-2, ... and T5) call their attention through
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]` with q (B, H, n, d), k and
v (B, H_kv, m, d) after the model's own rotary embedding, and a mask built by
`ALL_MASK_ATTENTION_FUNCTIONS[...]`.  `register()` (run when posenc.torch.hf is
imported) adds "posenc" to both: the mask is HF's boolean sdpa mask, and
`attention` reads it back as the kernel's parameters -- causal with a query
offset (the cache's), a left window (`sliding_window`), packed documents and key
padding -- once per mask (the model's layers share it), checks that those
parameters give exactly the mask, and runs `posenc.torch.content_attention`
(`t5_attention` for T5's position bias) with HF's scaling, GQA without
repeating k and v, `softcap`, `s_aux` sinks and dropout (posenc's counter-based
dropout: other random draws than torch's, the same distribution).

What it cannot serve exactly -- attention weights asked for, a mask that is not
those four patterns (a custom 4-D float mask, heads with different masks), a
position bias it did not see made, a paged cache -- runs the model's own eager
attention for that call, with one warning per reason: never a wrong number.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NamedTuple

import torch

import posenc

from ._common import dropout_seed

NAME = "posenc"


class MaskReading(NamedTuple):
    """A mask as the fused kernel's parameters: key j of query i (at position
    i + query_offset) is kept unless causal and j > i + query_offset, j < i +
    query_offset - window_left, key_padding[b, j], or documents differ."""
    causal: bool
    query_offset: int
    window_left: int | None
    key_padding: torch.Tensor | None
    documents: tuple | None


class Unserved(Exception):
    """A call the fused kernel cannot serve exactly; its text is the reason."""


# ------------------------------------------------------------------ the fallback's warning

_WARNED: set = set()


def _library_dirs() -> tuple:
    """The folders of torch, transformers and posenc: a warning skips their frames."""
    import transformers

    return tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                 for module in (torch, transformers, posenc))


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel for the first caller outside the libraries (the line
    of the user's script or notebook that called the model, not torch's module.py)."""
    skip = _library_dirs()
    frame, level = sys._getframe(2), 2       # the caller of warnings.warn's caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def _warn_once(reason: str, runs: str = "the original Hugging Face forward") -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"posenc.torch.hf: {reason}; running {runs} for such calls",
                      RuntimeWarning, stacklevel=_user_stacklevel())


# ------------------------------------------------------------------ reading a mask

def _allowed(mask: torch.Tensor, batch: int, n: int, m: int, convention: str) -> torch.Tensor:
    """The (B, n, m) keep pattern of an HF mask: bool (True keeps; with convention
    "dropped", MPT's, True drops) or additive float (0 keeps, the dtype's minimum or
    -inf drops; with convention "biased", Falcon's ALiBi mask, any value above half
    the minimum keeps); Unserved for anything else."""
    if mask.dim() != 4 or mask.shape[-2:] != (n, m):
        raise Unserved(f"an attention mask of shape {tuple(mask.shape)} for {n} queries and {m} keys")
    if mask.dtype == torch.bool:
        keep = ~mask if convention == "dropped" else mask
    elif mask.is_floating_point() and convention == "biased":
        keep = mask > torch.finfo(mask.dtype).min / 2
    elif mask.is_floating_point():
        keep = mask == 0
        if not torch.all(keep | (mask <= torch.finfo(mask.dtype).min / 2)):
            raise Unserved("an additive float attention mask with values other than 0 and -inf")
    else:
        raise Unserved(f"an attention mask of dtype {mask.dtype}")
    if keep.shape[1] != 1:
        if not torch.all(keep == keep[:, :1]):
            raise Unserved("an attention mask that differs between heads")
        keep = keep[:, :1]
    return keep[:, 0].expand(batch, n, m)


def _implied(batch: int, n: int, m: int, reading: MaskReading) -> torch.Tensor:
    """The (B, n, m) keep pattern of a reading (the kernel's masks)."""
    i = torch.arange(n)[:, None] + reading.query_offset
    j = torch.arange(m)[None, :]
    keep = torch.ones(batch, n, m, dtype=torch.bool)
    if reading.causal:
        keep = keep & (j <= i)
    if reading.window_left is not None:
        keep = keep & (j >= i - reading.window_left)
    if reading.documents is not None:
        document_q, document_k = reading.documents
        keep = keep & (document_q[:, :, None] == document_k[:, None, :])
    if reading.key_padding is not None:
        keep = keep & ~reading.key_padding[:, None, :]
    return keep


def _documents_of(position_ids, batch: int, n: int):
    """Packed documents from position ids, as HF finds them (a new document wherever
    the position does not go up by one); None for one per row."""
    from transformers.masking_utils import find_packed_sequence_indices

    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] != n:
        return None
    return find_packed_sequence_indices(position_ids.expand(batch, n))


def _candidates(keep: torch.Tensor, position_ids, causal_hint: bool):
    """Readings that could give `keep`, the likeliest first (each is checked).  A
    bidirectional layer's padding-only reading comes first: a causal reading of it
    would give T5's bias a wrong query offset."""
    batch, n, m = keep.shape
    padding = ~keep.any(1)                             # keys no query sees
    key_padding = padding if torch.any(padding) else None
    if not causal_hint:
        yield MaskReading(False, 0, None, key_padding, None)
    live = keep.any(2)                                 # rows that see a key
    if not torch.any(live):
        yield MaskReading(False, 0, None, key_padding, None)
        return
    rows = torch.arange(n)[None, :].expand(batch, n)[live]
    last = (m - 1 - keep.flip(2).to(torch.uint8).argmax(2))[live]
    offset = int((last - rows).max())
    causal = offset < m - 1
    offset = offset if causal else 0
    first_key = keep.to(torch.uint8).argmax(2)         # each row's first key
    first = first_key[live]

    def window(starts):
        """The left window that explains the rows starting after `starts` (their
        document's first key) -- padding keys at the start only widen it."""
        cut = first > starts[live]
        if not causal or not torch.any(cut):
            return None
        return int((rows[cut] + offset - first[cut]).max())

    yield MaskReading(causal, offset, None, key_padding, None)
    zero = torch.zeros(batch, n, dtype=torch.long)
    left = window(zero)
    if left is not None:
        yield MaskReading(causal, offset, left, key_padding, None)
    if n == m and offset == 0:
        for documents in (_documents_of(position_ids, batch, n),
                          torch.cat([zero[:, :1], (first_key[:, 1:] != first_key[:, :-1]).long()],
                                    1).cumsum(1)):
            if documents is None:
                continue
            index = torch.arange(n).expand(batch, n)
            starts = torch.full_like(documents, n).scatter_reduce(1, documents, index, "amin")
            yield MaskReading(causal, offset, window(starts.gather(1, documents)), key_padding,
                              (documents, documents))


def read_mask(mask: torch.Tensor, batch: int, n: int, m: int, position_ids=None,
              causal: bool = True, convention: str = "hf") -> MaskReading:
    """The kernel's parameters that give exactly HF's `mask` (B|1, 1|H, n, m);
    Unserved if none do.  `causal`: whether the layer is causal (which reading to
    try first); `convention`: see _allowed.  Remembered per mask tensor: the
    layers of one forward share the mask, so it is read once."""
    key = (batch, n, m, causal, convention, None if position_ids is None else id(position_ids))
    known = getattr(mask, "_posenc_reading", None)     # (key, reading) of an earlier layer
    if known is not None and known[0] == key:
        return known[1]
    keep = _allowed(mask.detach().cpu(), batch, n, m, convention)
    position_ids = None if position_ids is None else position_ids.detach().cpu()
    for reading in _candidates(keep, position_ids, causal):
        if torch.equal(_implied(batch, n, m, reading), keep):
            mask._posenc_reading = (key, reading)
            return reading
    raise Unserved("an attention mask that is not causal, a window, packed documents "
                   "and padding")


def mask_options(reading: MaskReading, device) -> dict:
    """A reading as the fused attention's keyword arguments, on `device`."""
    documents = reading.documents or (None, None)
    return dict(causal=reading.causal, query_offset=reading.query_offset,
                window=None if reading.window_left is None else (reading.window_left, 0),
                key_padding_mask=None if reading.key_padding is None else reading.key_padding.to(device),
                document_q=None if documents[0] is None else documents[0].to(device),
                document_k=None if documents[1] is None else documents[1].to(device))


# ------------------------------------------------------------------ T5's position bias

def _position_bias(module, position_bias, query_offset: int):
    """posenc's t5 arguments for HF's `position_bias` (None: none or zero), or Unserved."""
    owner = getattr(position_bias, "_posenc_t5_owner", None)   # the layer that made it
    if owner is None and getattr(module, "has_relative_attention_bias", False) \
            and position_bias.dim() == 4 and position_bias.shape[0] == 1:
        owner = module                      # made by this layer's compute_bias just now
        position_bias._posenc_t5_owner = owner
    if owner is not None:
        if not position_bias.shape[-1] or not position_bias.shape[-2]:
            return None
        return dict(bias=owner.relative_attention_bias.weight.t(),
                    num_buckets=owner.relative_attention_num_buckets,
                    max_distance=owner.relative_attention_max_distance,
                    bidirectional=not owner.is_decoder, query_offset=query_offset)
    if not position_bias.requires_grad and not torch.any(position_bias):
        return None                          # the zeros of a layer without a bias
    raise Unserved("a position_bias tensor that no T5 layer made")


# ------------------------------------------------------------------ the attention function

def _warn(reason: str) -> None:
    _warn_once(reason, "the model's eager attention")


def _eager(module, query, key, value, attention_mask, is_causal, kwargs):
    """The model's own eager attention (its module's eager_attention_forward), with HF's
    additive float mask."""
    home = sys.modules.get(type(module).__module__)
    eager = getattr(home, "eager_attention_forward", None)
    if eager is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      is_causal=is_causal, **kwargs)
    n, m = query.shape[2], key.shape[2]
    if attention_mask is None and is_causal and n > 1:
        attention_mask = torch.ones(n, m, dtype=torch.bool, device=query.device).tril()[None, None]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, **kwargs)


def _unfused(module, encoding, query, key, value, attention_mask, is_causal, dropout, kwargs):
    """A swapped model's attention the eager way, for what the fused call cannot
    serve: the encoding's logits (k and v repeated to the query heads), softcap,
    HF's mask (boolean, or added; without one the query at position m - n + i),
    softmax with the sinks, torch's dropout; returns (out (B, n, H, dv), weights
    (B, H, n, m))."""
    batch, heads, n, _ = query.shape
    m = key.shape[2]
    group = heads // key.shape[1]
    key, value = (x.repeat_interleave(group, dim=1) for x in (key, value))
    logits = encoding.logits(query, key, query_offset=m - n if is_causal else 0)
    softcap = kwargs.get("softcap")
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if attention_mask is None:
        keep = torch.ones(n, m, dtype=torch.bool, device=query.device)
        logits = logits.masked_fill(~(keep.tril(m - n) if is_causal else keep), float("-inf"))
    elif attention_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attention_mask, float("-inf"))
    else:                                    # HF's additive mask, whatever it holds
        logits = logits + attention_mask
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        logits = torch.cat([logits, sinks.reshape(1, -1, 1, 1).expand(batch, heads, n, 1)], dim=-1)
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)[..., :m]
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def attention(module, query, key, value, attention_mask, dropout: float = 0.0,
              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """HF's attention-interface function for "posenc": returns (out (B, n, H, dv), None)."""
    from . import content_attention, t5_attention

    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    try:
        if kwargs.get("output_attentions"):
            raise Unserved("attention weights asked for (output_attentions)")
        if kwargs.get("cache") is not None:
            raise Unserved("a paged cache")
        batch, _, n, _ = query.shape
        m = key.shape[2]
        if attention_mask is None:  # HF leaves it out for n == m or n == 1 without padding
            reading = MaskReading(bool(is_causal), m - n if is_causal else 0, None, None, None)
        else:
            reading = read_mask(attention_mask, batch, n, m, kwargs.get("position_ids"),
                                bool(is_causal))
        encoding = getattr(module, "_posenc_encoding", None)   # swap_positional_encoding's
        position_bias = None if encoding is not None else kwargs.get("position_bias")
        t5 = None if position_bias is None else _position_bias(module, position_bias,
                                                                reading.query_offset)
    except Unserved as why:
        _warn(str(why))
        encoding = getattr(module, "_posenc_encoding", None)
        if encoding is not None:            # the model's eager attention lacks the swapped encoding
            return _unfused(module, encoding, query, key, value, attention_mask, is_causal, dropout,
                            kwargs)
        return _eager(module, query, key, value, attention_mask, is_causal,
                      dict(kwargs, dropout=dropout, scaling=scaling))
    options = dict(mask_options(reading, query.device), softcap=kwargs.get("softcap"),
                   sinks=kwargs.get("s_aux"), dropout_p=dropout, seed=dropout_seed(dropout))
    if encoding is not None:
        out = encoding.attention(query, key, value, **options).out
    elif t5 is not None:
        bias = t5.pop("bias").to(query.dtype)
        options["query_offset"] = t5.pop("query_offset")
        out = t5_attention(query, key, value, bias, scale=1.0 if scaling is None else scaling,
                           **t5, **options).out
    else:
        out = content_attention(query, key, value, scale=scaling, **options).out
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Add "posenc" to HF's attention and mask interfaces (the mask: HF's boolean
    sdpa mask, which `attention` reads back as the kernel's parameters)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
