"""posenc.torch.hf: Hugging Face models on posenc's fused attention (docs/huggingface.md).

* Importing this module registers attn_implementation="posenc" on HF's attention
  interface (Llama, Mistral, Qwen, Gemma, gpt-oss, GPT-NeoX, BERT, GPT-2, T5,
  ...): `_hf_interface`.
* `swap_positional_encoding(model, method)` replaces such a model's positional
  encoding by any posenc method; `from_pretrained` loads it back; `describe`
  says what a model runs: `_hf_swap`.
* `patch(model)` serves the models that do not use the interface: the ALiBi
  families (BLOOM, MPT, Falcon with alibi=True: `_hf_alibi`) and T5, mT5, UMT5
  and DeBERTa-v2 (below); a model with none of those that uses the interface
  gets attn_implementation="posenc".

`patch(model)` swaps, in place, the class of every `T5Attention` module of a
transformers 5.x model (T5, mT5's `MT5Attention`, a copy of it, and
subclasses that keep its forward) for a subclass whose `forward` computes HF's
result with `posenc.torch.t5_attention` (self-attention: the relative bias
of the layer that owns it, HF's buckets) or `posenc.torch.content_attention`
(cross-attention, scale 1, no position bias), using the layer's own
parameters (the same `Parameter` objects: state dicts, optimizers and tied
weights are untouched).  `unpatch(model)` restores the original classes.
UMT5's `UMT5Attention` (a class of its own, with T5's attributes and a
relative bias in every self-attention layer) runs the same code, each layer
with its own bias.

DeBERTa-v2's `DisentangledSelfAttention` (c2p + p2c, `share_att_key`,
`position_buckets` > 0 or -1, `max_relative_positions`) is patched the same
way onto `posenc.torch.deberta_attention`, with HF's float32-rounded scale
`posenc.deberta_hf_scale(head_dim)` so that the numbers match HF's (posenc's
own default is the exact 1/sqrt(3d)); HF's mask is query x key padding, and a
padded query row, all of whose scores HF fills with the dtype's minimum, gets
HF's uniform average of the values.

What the patched forward cannot serve exactly (attention weights requested,
an attention mask that is not key padding plus the causal mask, query rows
with every key masked, an unknown attention implementation, an unexpected
argument, a position bias handed in as a tensor) runs HF's original forward
for that call, with one warning per reason.  Importing this module without
transformers installed works (nothing is registered); the functions need it.
"""

from __future__ import annotations

import importlib

import torch

from . import _hf_alibi, _hf_swap, _linear
from ._common import dropout_seed
from ._hf_interface import _WARNED, _warn_once, collecting_attentions  # noqa: F401  (_WARNED: the tests clear it)
from ._hf_interface import Unserved as _Unsupported
from ._hf_swap import describe, from_pretrained, swap_positional_encoding
from ._linear import project

__all__ = ["patch", "unpatch", "is_patched", "swap_positional_encoding", "from_pretrained",
           "describe"]

_SUBCLASSES: dict = {}
# served classes that are not attention layers (patched for what they hand their attention)
_HELPERS = {"MptBlock"}


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


# the dtypes posenc's ops take (bfloat16 and float16 through the C kernels on CPU)
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
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
        _require(((mask == 0) | blocked).all(),
                 "an additive attention mask with values other than 0 and -inf/min")
        allowed = ~blocked
    padding = ~allowed[:, 0, -1, :]                                 # (B|1, m)
    if causal and mask.shape[2] == 1 and n > 1:
        raise _Unsupported("a causal layer with a mask that is not causal")
    expect = ~padding[:, None, None, :]
    if causal:
        rows = torch.arange(n, device=mask.device)[:, None] + offset
        expect = expect & (torch.arange(m, device=mask.device)[None, :] <= rows)
    _require((allowed == expect).all(),
             "an attention mask that is not key padding plus the causal mask")
    padding = padding.expand(batch, m)
    first = torch.where(padding.all(dim=1), m, (~padding).int().argmax(dim=1))
    _require((first <= (offset if causal else m - 1)).all(), "query rows whose keys are all masked")
    return padding.contiguous() if _maybe(padding.any()) else None


def _require(condition: torch.Tensor, reason: str) -> None:
    """_Unsupported(reason) unless the 0-dim bool `condition` holds: the call then runs
    HF's forward.  Under torch.compile or torch.export the value is not known while
    tracing: the condition becomes a runtime assertion in the graph (an error naming
    the reason, never a wrong number, where an eager call would fall back)."""
    if torch.compiler.is_compiling():
        torch._assert_async(condition, f"posenc.torch.hf: {reason}; a compiled or exported "
                                       f"patched model cannot fall back to HF's forward")
    elif not bool(condition):
        raise _Unsupported(reason)


def _maybe(condition: torch.Tensor) -> bool:
    """bool(condition) in eager mode; True while tracing (the general branch, right
    either way: a padding mask of no padding, a where() that keeps every row)."""
    return torch.compiler.is_compiling() or bool(condition)


def _heads(x, heads, head_dim):
    """A projection (B, n, H·d) as (B, H, n, d): a view, no copy.  The fused op reads
    q, k and v a unit at a time where they lie (their last axis contiguous) and keeps
    the view for its backward: one copy of each per layer, the projection's output."""
    return x.view(x.shape[0], x.shape[1], heads, head_dim).transpose(1, 2)


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


def _dynamic_layer(cache, index) -> bool:
    """Whether layer `index` of `cache` is a plain DynamicLayer (keys grow by
    concatenation: after an update they are exactly the past and new keys)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is not None and index is not None and index < len(layers):
        return type(layers[index]) is DynamicLayer
    return type(cache) is DynamicCache


def _t5_posenc(self, hidden_states, mask, key_value_states, position_bias, past_key_values, kwargs):
    """T5Attention.forward's (out, position_bias, weights): the relative bias of the
    layer that owns it (this layer, or the first one's, handed along as a
    _SharedT5Bias in place of HF's (1, H, n, m) tensor)."""
    if position_bias is not None and not isinstance(position_bias, _SharedT5Bias):
        raise _Unsupported("a position_bias tensor from an unpatched layer")

    def bias_owner(past):
        if isinstance(position_bias, _SharedT5Bias):
            return position_bias.owner, position_bias
        if self.has_relative_attention_bias:
            return self, _SharedT5Bias(self, past)
        return None, None

    out, returned = _t5_family_attention(self, hidden_states, mask, key_value_states, past_key_values,
                                         kwargs, bias_owner)
    return out, returned, None


def _umt5_forward(self, hidden_states, encoder_hidden_states=None, past_key_values=None, attention_mask=None,
                  **kwargs):
    try:
        return _umt5_posenc(self, hidden_states, encoder_hidden_states, past_key_values, attention_mask, kwargs)
    except _Unsupported as why:
        _warn_once(str(why))
    return self._posenc_original_forward(hidden_states, encoder_hidden_states=encoder_hidden_states,
                                         past_key_values=past_key_values, attention_mask=attention_mask,
                                         **kwargs)


def _umt5_posenc(self, hidden_states, encoder_hidden_states, past_key_values, attention_mask, kwargs):
    """UMT5Attention.forward's (out, weights): T5's attention with a relative bias
    in every self-attention layer (none shared, none handed along) and none in
    cross-attention; HF's scaling is 1 as in T5."""
    if float(self.scaling) != 1.0:
        raise _Unsupported(f"a UMT5 scaling of {self.scaling} (posenc serves UMT5's 1)")
    if encoder_hidden_states is not None and self.has_relative_attention_bias:
        raise _Unsupported("a UMT5 cross-attention layer with a relative bias")

    def bias_owner(past):
        return (self if self.has_relative_attention_bias else None), None

    out, _ = _t5_family_attention(self, hidden_states, attention_mask, encoder_hidden_states, past_key_values,
                                  kwargs, bias_owner)
    return out, None


def _t5_family_attention(self, hidden_states, mask, key_value_states, past_key_values, kwargs, bias_owner):
    """The attention of a T5-style layer (T5Attention's or UMT5Attention's
    attributes: q, k, v, o, n_heads, key_value_proj_dim, is_causal, dropout,
    layer_idx, config) on posenc: self-attention through t5_attention with the
    bias of `bias_owner(past)[0]` (content_attention where it is None), and
    cross-attention through content_attention, both with scale 1, HF's masks
    and HF's cache.  Returns (self.o(out), bias_owner(past)[1]);
    the projections on posenc's GEMM (_linear.project)."""
    from transformers.cache_utils import EncoderDecoderCache

    import posenc.torch as pt

    unexpected = set(kwargs) - _ALLOWED_KWARGS
    if unexpected:
        raise _Unsupported(f"unexpected argument(s) {sorted(unexpected)}")
    if kwargs.get("output_attentions") or collecting_attentions():
        raise _Unsupported("attention weights requested (output_attentions)")
    implementation = getattr(self.config, "_attn_implementation", None) or "eager"
    if implementation not in ("eager", "sdpa"):
        raise _Unsupported(f"attention implementation {implementation!r}")
    if hidden_states.dtype not in _DTYPES:
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

    if cache is not None and not _dynamic_layer(cache, self.layer_idx):
        raise _Unsupported(f"a {type(cache).__name__} (posenc serves DynamicCache)")

    # (B, H, n, d) views (_heads), which the fused op reads in place; HF's cache keeps copies
    query = _heads(project(self.q, hidden_states), heads, dk)
    if cross and past_key_values is not None and updated:
        key = cache.layers[self.layer_idx].keys
        value = cache.layers[self.layer_idx].values
    else:
        source = key_value_states if cross else hidden_states
        key, value = (_heads(project(self.k, source), heads, dk),
                      _heads(project(self.v, source), heads, dk))
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

    # what the cache keeps every later step reads: contiguous (no view of a projection)
    if not cross and past_key_values is not None:
        key, value = cache.update(key.contiguous(), value.contiguous(), self.layer_idx)
    elif cross and past_key_values is not None and not updated:
        key, value = cache.update(key.contiguous(), value.contiguous(), self.layer_idx)
        if isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.is_updated[self.layer_idx] = True
    if key.shape[2] != total:
        raise RuntimeError("posenc.torch.hf: cache length mismatch")  # never a wrong number

    dropout = float(self.dropout) if self.training else 0.0
    seed = dropout_seed(dropout)
    common = dict(causal=causal, key_padding_mask=padding, query_offset=offset if causal else 0,
                  dropout_p=dropout, seed=seed)

    returned = None
    if cross:
        out = pt.content_attention(query, key, value, scale=1.0, **common).out
    else:
        owner, returned = bias_owner(past)
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
    return project(self.o, out), returned


def _deberta_forward(self, hidden_states, attention_mask, output_attentions=False, query_states=None,
                     relative_pos=None, rel_embeddings=None):
    try:
        return _deberta_posenc(self, hidden_states, attention_mask, output_attentions, query_states,
                               relative_pos, rel_embeddings)
    except _Unsupported as why:
        _warn_once(str(why))
    return self._posenc_original_forward(hidden_states, attention_mask, output_attentions,
                                         query_states=query_states, relative_pos=relative_pos,
                                         rel_embeddings=rel_embeddings)


def _deberta_posenc(self, hidden_states, attention_mask, output_attentions, query_states, relative_pos,
                    rel_embeddings):
    """HF's DisentangledSelfAttention (c2p + p2c) with posenc.torch.deberta_attention;
    HF's float32-rounded scale (posenc.deberta_hf_scale)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    import posenc
    import posenc.buckets
    import posenc.torch as pt

    if output_attentions or collecting_attentions():
        raise _Unsupported("attention weights requested (output_attentions)")
    if query_states is not None:
        raise _Unsupported("DeBERTa query_states (enhanced mask decoder)")
    if not self.relative_attention or set(self.pos_att_type) != {"c2p", "p2c"}:
        raise _Unsupported(f"DeBERTa pos_att_type {list(self.pos_att_type)} (posenc serves c2p+p2c)")
    if hidden_states.dtype not in _DTYPES:
        raise _Unsupported(f"dtype {hidden_states.dtype}")
    if rel_embeddings is None:
        raise _Unsupported("DeBERTa without rel_embeddings")
    if self.position_buckets > 0 and self.max_relative_positions > 0:
        try:
            posenc.buckets.check_deberta_log(self.position_buckets, self.max_relative_positions)
        except ValueError as error:
            raise _Unsupported(f"DeBERTa log buckets posenc does not accept ({error})") from None
    batch, n = hidden_states.shape[:2]
    heads, d = self.num_attention_heads, self.attention_head_size
    span = self.pos_ebd_size
    if rel_embeddings.shape[0] < 2 * span:
        raise _Unsupported("a relative embedding table shorter than 2 att_span")

    query = _heads(project(self.query_proj, hidden_states), heads, d)
    key = _heads(project(self.key_proj, hidden_states), heads, d)
    value = _heads(project(self.value_proj, hidden_states), heads, d)

    if relative_pos is not None:
        standard = build_relative_position(query, key, bucket_size=self.position_buckets,
                                           max_position=self.max_relative_positions)
        got = relative_pos if relative_pos.dim() != 4 else relative_pos[:, 0]
        if got.dim() == 2:
            got = got[None]
        if got.shape[-2:] != standard.shape[-2:]:
            raise _Unsupported("a relative_pos other than DeBERTa's own")
        _require((got.to(torch.long) == standard).all(), "a relative_pos other than DeBERTa's own")

    # the mask: HF fills disallowed scores with the dtype's min; it must be
    # query-valid x key-valid (DeBERTa's encoder mask); fully masked rows are uniform.
    if attention_mask is None:
        raise _Unsupported("DeBERTa without an attention mask")
    allowed = attention_mask.bool()
    if allowed.dim() == 3:
        allowed = allowed[:, None]
    if allowed.dim() != 4 or allowed.shape[1] != 1 or allowed.shape[0] not in (1, batch) \
            or allowed.shape[2] != n or allowed.shape[3] != n:
        raise _Unsupported("a DeBERTa attention mask of an unexpected shape")
    allowed = allowed[:, 0].expand(batch, n, n)
    query_valid, key_valid = allowed.any(dim=2), allowed.any(dim=1)
    _require((allowed == (query_valid[:, :, None] & key_valid[:, None, :])).all(),
             "a DeBERTa attention mask that is not query x key padding")

    rel = self.pos_dropout(rel_embeddings)[: 2 * span]
    if self.share_att_key:
        pos_key, pos_query = project(self.key_proj, rel), project(self.query_proj, rel)
    else:
        pos_key, pos_query = project(self.pos_key_proj, rel), project(self.pos_query_proj, rel)
    pos_key = pos_key.view(2 * span, heads, d).transpose(0, 1)
    pos_query = pos_query.view(2 * span, heads, d).transpose(0, 1)

    dropout = float(self.dropout.p) if self.training else 0.0
    seed = dropout_seed(dropout)
    padding = ~key_valid
    out = pt.deberta_attention(query, key, value, pos_key, pos_query, att_span=span,
                               position_buckets=self.position_buckets,
                               max_relative_positions=self.max_relative_positions,
                               scale=posenc.deberta_hf_scale(d),
                               key_padding_mask=padding if _maybe(padding.any()) else None,
                               dropout_p=dropout, seed=seed).out
    if _maybe(~query_valid.all()):
        # HF: a row with every score at the dtype's min has a uniform softmax
        # (in training HF also drops some of it: padded rows only, left undropped here)
        out = torch.where(query_valid[:, None, :, None], out, value.mean(dim=2, keepdim=True))
    return out.transpose(1, 2).reshape(batch, n, heads * d), None


def _linear_forward(self, x):
    """A patched attention layer's projection: F.linear on posenc's GEMM (_linear)."""
    return _linear.linear(x, self.weight, self.bias)


def _patched_class(cls, forward):
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type("Posenc" + cls.__name__, (cls,), {
            "forward": forward,
            "_posenc_original_forward": cls.forward,
            "_posenc_original_class": cls,
            "__module__": __name__,
        })
    return _SUBCLASSES[cls]


def __getattr__(name):
    """The patched classes of HF's own attention classes by name
    (PosencT5Attention, PosencMT5Attention, PosencUMT5Attention,
    PosencDisentangledSelfAttention), so that pickle (torch.save of a whole
    patched model) finds them."""
    if name == "PosencLinear":
        return _patched_class(torch.nn.Linear, _linear_forward)
    if name.startswith("Posenc"):
        for cls, forward in _served():
            if "Posenc" + cls.__name__ == name:
                return _patched_class(cls, forward)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _served():
    """(HF attention class, the patched forward) for each class served: T5 and
    mT5 (a copy of T5Attention), UMT5 (a class of its own: a bias in every
    self-attention layer) and DeBERTa-v2; those this transformers lacks are
    left out."""
    from transformers.models.t5.modeling_t5 import T5Attention

    served = [(T5Attention, _t5_forward)]
    for module, name, forward in (("mt5.modeling_mt5", "MT5Attention", _t5_forward),
                                  ("umt5.modeling_umt5", "UMT5Attention", _umt5_forward),
                                  ("deberta_v2.modeling_deberta_v2", "DisentangledSelfAttention",
                                   _deberta_forward),
                                  ("bloom.modeling_bloom", "BloomAttention", _hf_alibi.bloom_forward),
                                  ("mpt.modeling_mpt", "MptAttention", _hf_alibi.mpt_forward),
                                  ("mpt.modeling_mpt", "MptBlock", _hf_alibi.mpt_block_forward),
                                  ("falcon.modeling_falcon", "FalconAttention",
                                   _hf_alibi.falcon_forward)):
        try:
            served.append((getattr(importlib.import_module("transformers.models." + module), name), forward))
        except (ImportError, AttributeError):  # pragma: no cover - other transformers versions
            pass
    return served


def _applies(module) -> bool:
    """Whether a served class's module has something to serve (a Falcon with
    rotary embeddings has no ALiBi: it keeps HF's attention)."""
    config = getattr(module, "config", None)
    return getattr(config, "alibi", True) if type(module).__name__ == "FalconAttention" else True


def patch(model):
    """Swap every served attention module of `model` (T5, mT5, UMT5, DeBERTa-v2,
    BLOOM, MPT, Falcon with ALiBi; in place) for posenc's fused attention; a model
    with none of them that calls HF's attention interface (Llama, BERT, ...) gets
    attn_implementation="posenc" instead, and its attention layers' q, k, v and o
    projections (plain nn.Linear) run on posenc's GEMM (`unpatch` restores both).  Returns
    `model`; parameters stay the same objects."""
    count = 0
    served = _served()
    for module in model.modules():
        cls = type(module)
        if getattr(cls, "_posenc_original_class", None) is not None:
            continue
        for base, forward in served:
            if not isinstance(module, base) or not _applies(module):
                continue
            if cls.forward is not base.forward:
                _warn_once(f"{cls.__name__} overrides {base.__name__}.forward; left unpatched")
            else:
                module.__class__ = _patched_class(cls, forward)
                count += base.__name__ not in _HELPERS
            break
    if not count and getattr(model, "_supports_attention_backend", False) \
            and model.config._attn_implementation != "posenc":
        model._posenc_previous_implementation = model.config._attn_implementation
        model.set_attn_implementation("posenc")
        layers = _hf_swap.attention_layers(model)
        for layer in layers:                  # q, k, v, o on posenc's GEMM, as T5's patch has them
            for child in layer.children():
                if _linear._plain(child):
                    child.__class__ = _patched_class(torch.nn.Linear, _linear_forward)
        count = len(layers)
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
    previous = getattr(model, "_posenc_previous_implementation", None)
    if previous is not None:
        model.set_attn_implementation(previous)
        del model._posenc_previous_implementation
    return model


def is_patched(model) -> bool:
    """Whether any attention module of `model` runs posenc (a patched class, or
    attn_implementation="posenc")."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == "posenc" or any(
        getattr(type(mod), "_posenc_original_class", None) is not None for mod in model.modules())


try:                                    # attn_implementation="posenc"
    from . import _hf_interface
    _hf_interface.register()
except ImportError:                     # pragma: no cover - transformers not installed
    pass
