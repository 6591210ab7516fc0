"""posenc.torch.hf: run Hugging Face T5 attention on posenc's fused attention.

`patch(model)` swaps, in place, the class of every `T5Attention` module of a
transformers 5.x model (T5, mT5, UMT5 and anything whose attention is a
`T5Attention` or subclass) for a subclass whose `forward` computes HF's
result with `posenc.torch.t5_attention` (self-attention: the relative bias
of the layer that owns it, HF's buckets) or `posenc.torch.content_attention`
(cross-attention, scale 1, no position bias), using the layer's own
parameters (the same `Parameter` objects: state dicts, optimizers and tied
weights are untouched).  `unpatch(model)` restores the original classes.

What the patched forward cannot serve exactly (attention weights requested,
an attention mask that is not key padding plus the causal mask, query rows
with every key masked, an unknown attention implementation, an unexpected
argument, a position bias handed in as a tensor) runs HF's original forward
for that call, with one warning per reason.  transformers is imported
lazily: importing this module does not need it.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["patch", "unpatch", "is_patched"]

_WARNED: set = set()
_SUBCLASSES: dict = {}


def _warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"posenc.torch.hf: {reason}; running the original Hugging Face forward "
                      "for such calls", RuntimeWarning, stacklevel=3)


class _SharedT5Bias:
    """What a patched T5 layer with a relative bias hands to the next layers in
    place of HF's (1, H, n, m) `position_bias`: the layer whose
    `relative_attention_bias` they share."""

    __slots__ = ("owner", "past")

    def __init__(self, owner, past):
        self.owner = owner
        self.past = past

    def materialize(self, query_length, key_length, device):
        return self.owner.compute_bias(query_length, key_length, device=device, past_seen_tokens=self.past)


def _collecting_attentions() -> bool:
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - other transformers layouts
        return False
    collected = _active_collector.get()
    return bool(collected) and ("attentions" in collected or "cross_attentions" in collected)


_ALLOWED_KWARGS = {"output_attentions", "output_hidden_states", "use_cache", "cache_position",
                   "return_dict", "position_ids"}


def _split_mask(mask, batch, n, m, causal, offset):
    """key_padding_mask (B, m) bool (True = padding) or None, when `mask` (HF's
    4-D bool-allowed or additive mask, or None) is exactly key padding plus
    (if causal) the causal mask at `offset`; raise _Unsupported otherwise."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] != 1 \
            or mask.shape[2] not in (1, n) or mask.shape[3] != m:
        raise _Unsupported("an attention mask of an unexpected shape")
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        low = torch.finfo(mask.dtype).min
        blocked = (mask == low) | torch.isneginf(mask)
        if not bool(((mask == 0) | blocked).all()):
            raise _Unsupported("an additive attention mask with values other than 0 and -inf/min")
        allowed = ~blocked
    padding = ~allowed[:, 0, -1, :]                                 # (B|1, m)
    if causal and mask.shape[2] == 1 and n > 1:
        raise _Unsupported("a causal layer with a mask that is not causal")
    expect = ~padding[:, None, None, :]
    if causal:
        rows = torch.arange(n, device=mask.device)[:, None] + offset
        expect = expect & (torch.arange(m, device=mask.device)[None, :] <= rows)
    if not torch.equal(allowed.expand(expect.shape[0], 1, -1, m), expect.expand(-1, 1, allowed.shape[2], m)):
        raise _Unsupported("an attention mask that is not key padding plus the causal mask")
    padding = padding.expand(batch, m)
    first = torch.where(padding.all(dim=1), m, (~padding).int().argmax(dim=1))
    if bool((first > (offset if causal else m - 1)).any()):
        raise _Unsupported("query rows whose keys are all masked")
    return padding.contiguous() if bool(padding.any()) else None


class _Unsupported(Exception):
    pass


def _t5_forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None,
                past_key_values=None, **kwargs):
    try:
        return _t5_posenc(self, hidden_states, mask, key_value_states, position_bias, past_key_values, kwargs)
    except _Unsupported as why:
        if not getattr(position_bias, "_posenc_fallback", False):   # warned by the layer that made it
            _warn_once(str(why))
    if isinstance(position_bias, _SharedT5Bias):
        past = position_bias.past
        n = hidden_states.shape[1]
        m = n + past if key_value_states is None else key_value_states.shape[1]
        position_bias = position_bias.materialize(n, m, hidden_states.device)
    result = self._posenc_original_forward(hidden_states, mask=mask, key_value_states=key_value_states,
                                           position_bias=position_bias, past_key_values=past_key_values,
                                           **kwargs)
    if isinstance(result[1], torch.Tensor):
        result[1]._posenc_fallback = True      # the next layers fall back silently with it
    return result


def _t5_posenc(self, hidden_states, mask, key_value_states, position_bias, past_key_values, kwargs):
    from transformers.cache_utils import EncoderDecoderCache

    import posenc.torch as pt

    unexpected = set(kwargs) - _ALLOWED_KWARGS
    if unexpected:
        raise _Unsupported(f"unexpected argument(s) {sorted(unexpected)}")
    if kwargs.get("output_attentions") or _collecting_attentions():
        raise _Unsupported("attention weights requested (output_attentions)")
    implementation = getattr(self.config, "_attn_implementation", None) or "eager"
    if implementation not in ("eager", "sdpa"):
        raise _Unsupported(f"attention implementation {implementation!r}")
    if position_bias is not None and not isinstance(position_bias, _SharedT5Bias):
        raise _Unsupported("a position_bias tensor from an unpatched layer")
    if hidden_states.dtype not in (torch.float32, torch.float64):
        raise _Unsupported(f"dtype {hidden_states.dtype}")

    batch, n = hidden_states.shape[:2]
    heads, dk = self.n_heads, self.key_value_proj_dim
    past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
    past = int(past)
    cross = key_value_states is not None

    if isinstance(past_key_values, EncoderDecoderCache):
        updated = past_key_values.is_updated.get(self.layer_idx)
        cache = past_key_values.cross_attention_cache if cross else past_key_values.self_attention_cache
    else:
        updated, cache = False, past_key_values

    query = self.q(hidden_states).view(batch, n, heads, dk).transpose(1, 2)
    if cross and past_key_values is not None and updated:
        key = cache.layers[self.layer_idx].keys
        value = cache.layers[self.layer_idx].values
    else:
        source = key_value_states if cross else hidden_states
        key = self.k(source).view(batch, source.shape[1], heads, dk).transpose(1, 2)
        value = self.v(source).view(batch, source.shape[1], heads, dk).transpose(1, 2)
    m = key.shape[2]

    causal = bool(self.is_causal) and not cross
    offset = 0 if cross else past
    total = m if cross else past + m
    if mask is None and causal:
        if implementation == "eager" and n > 1:
            raise _Unsupported("a causal eager layer called without a mask")
        if n > 1 and total != n:
            raise _Unsupported("a causal layer without a mask over a longer cache")
    padding = _split_mask(mask, batch, n, total, causal, offset)

    if not cross and past_key_values is not None:
        key, value = cache.update(key, value, self.layer_idx)
    elif cross and past_key_values is not None and not updated:
        key, value = cache.update(key, value, self.layer_idx)
        if isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.is_updated[self.layer_idx] = True
    if key.shape[2] != total:
        raise RuntimeError("posenc.torch.hf: cache length mismatch")  # never a wrong number

    dropout = float(self.dropout) if self.training else 0.0
    seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if dropout > 0 else 0
    common = dict(causal=causal, key_padding_mask=padding, query_offset=offset if causal else 0,
                  dropout_p=dropout, seed=seed)

    returned = None
    if cross:
        out = pt.content_attention(query, key, value, scale=1.0, **common).out
    else:
        if isinstance(position_bias, _SharedT5Bias):
            owner = position_bias.owner
            returned = position_bias
        elif self.has_relative_attention_bias:
            owner = self
            returned = _SharedT5Bias(self, past)
        else:
            owner = None
        if owner is None:
            out = pt.content_attention(query, key, value, scale=1.0, **common).out
        else:
            bias = owner.relative_attention_bias.weight.t()
            if bias.dtype != query.dtype:
                bias = bias.to(query.dtype)
            out = pt.t5_attention(query, key, value, bias, num_buckets=owner.relative_attention_num_buckets,
                                  max_distance=owner.relative_attention_max_distance,
                                  bidirectional=not owner.is_decoder, scale=1.0,
                                  query_offset=offset, **{k: v for k, v in common.items() if k != "query_offset"}).out
    out = out.transpose(1, 2).reshape(batch, n, heads * dk)
    return self.o(out), returned, None


def _patched_class(cls):
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type("Posenc" + cls.__name__, (cls,), {
            "forward": _t5_forward,
            "_posenc_original_forward": cls.forward,
            "_posenc_original_class": cls,
            "__module__": __name__,
        })
    return _SUBCLASSES[cls]


def patch(model):
    """Swap every T5Attention module of `model` (in place) for posenc's fused
    attention; returns `model`.  Parameters stay the same objects."""
    from transformers.models.t5.modeling_t5 import T5Attention

    count = 0
    for module in model.modules():
        cls = type(module)
        if getattr(cls, "_posenc_original_class", None) is not None:
            continue
        if isinstance(module, T5Attention):
            if cls.forward is not T5Attention.forward:
                _warn_once(f"{cls.__name__} overrides T5Attention.forward; left unpatched")
                continue
            module.__class__ = _patched_class(cls)
            count += 1
    model._posenc_patched = count
    return model


def unpatch(model):
    """Restore the original attention classes of a patched model; returns it."""
    for module in model.modules():
        original = getattr(type(module), "_posenc_original_class", None)
        if original is not None:
            module.__class__ = original
    if hasattr(model, "_posenc_patched"):
        del model._posenc_patched
    return model


def is_patched(model) -> bool:
    """Whether any attention module of `model` runs posenc."""
    return any(getattr(type(mod), "_posenc_original_class", None) is not None for mod in model.modules())
