"""The ALiBi families -- BLOOM, MPT, Falcon with `alibi=True` -- patched onto posenc's
fused `alibi_attention` (SPEC 3.13, §6).

These models do not call HF's attention interface: each builds an ALiBi tensor
(BLOOM and Falcon `slope * position` per key, (B*H, 1, m); MPT `slope * (j - L + 1)`,
(H, 1, max_seq_len)) and adds it to a materialised (B, H, n, m) score tensor.  The
patched forwards keep the model's projections (computed on posenc's GEMM, as
the T5 and DeBERTa patches do: `_linear.project`) and cache, and run the fused
kernel with the model's own slopes: a softmax is blind to a constant per row, so
`slope * j` and ALiBi's `-slope * (i - j)` give the same attention.  Before the
call each forward checks that the model's ALiBi tensor is that line in every
kept key (to the rounding HF built it with) and reads the mask as the kernel's
parameters; anything else (positions that skip, as padding in the middle of a
row does in BLOOM's cumulative positions; attention weights asked for) runs the
original forward with one warning.

Where HF rounds: BLOOM builds `slope * position` in float32, Falcon in
bfloat16 (its slopes too); posenc uses the same slopes but computes the line
exactly, so against HF the numbers differ by that rounding (Falcon: up to 2^-9
of the bias).  HF's eager Falcon adds the ALiBi twice (once in its scores, once
in the mask it folded it into; its sdpa path once): posenc follows the sdpa path.
"""

from __future__ import annotations

import sys

import torch

from ._common import dropout_seed
from ._hf_interface import (MaskReading, Unserved, _warn_once, collecting_attentions, mask_options,
                            read_mask)
from ._linear import project


def _home(module):
    """The transformers module that defines the (unpatched) class of `module`."""
    return sys.modules[module._posenc_original_class.__module__]


def _check_line(alibi: torch.Tensor, slopes: torch.Tensor, positions: torch.Tensor,
                kept: torch.Tensor, rounding: torch.dtype) -> None:
    """Unserved unless alibi[b, h, j] = slopes[h] * positions[b, j] at every kept
    key, to `rounding`'s precision (HF's own rounding of the product)."""
    want = slopes.double()[None, :, None] * positions.double()[:, None, :]
    error = ((alibi.double() - want).abs() * kept[:, None, :]).max() if kept.any() else 0.0
    bound = 2 * torch.finfo(rounding).eps * max(float(want.abs().max()), 1.0)
    if float(error) > bound:
        raise Unserved("an ALiBi tensor that is not the model's slopes times each key's "
                       "position (padding inside a row?)")


def _query_offset(cache, layer_idx) -> int:
    """The position of the call's first query: the tokens the cache held before it
    (the model's own count, never read from the mask)."""
    return 0 if cache is None else int(cache.get_query_offset(layer_idx))


def _reading(attention_mask, batch, n, m, offset, convention) -> MaskReading:
    """The call's mask as kernel parameters, the queries at `offset` (the cache's)."""
    if attention_mask is None:
        if m != offset + n:
            raise Unserved(f"no attention mask for {n} queries after {offset} tokens and {m} keys")
        return MaskReading(True, offset, None, None, None)
    return read_mask(attention_mask, batch, n, m, offset, causal=True, convention=convention)


def _row_positions(reading: MaskReading, batch: int, m: int) -> tuple:
    """BLOOM's and Falcon's key positions (cumulative over kept keys, from 0) where
    each row's kept keys are contiguous: j - (the row's first kept key); and the kept keys."""
    kept = torch.ones(batch, m, dtype=torch.bool) if reading.key_padding is None \
        else ~reading.key_padding.cpu()
    first = kept.to(torch.uint8).argmax(1)
    return torch.arange(m)[None, :] - first[:, None], kept


def _slopes_of(module, heads: int) -> torch.Tensor:
    """The model's own slopes (its build_alibi_tensor at position 1: float32 in BLOOM,
    bfloat16-rounded in Falcon), as float64."""
    ones = torch.ones(1, 2, dtype=torch.long)
    return _home(module).build_alibi_tensor(ones, heads, torch.float32).view(heads, 2)[:, 1].double()


def _line_slopes(module, alibi, reading, batch, heads, m, rounding) -> torch.Tensor:
    """The slopes of BLOOM's or Falcon's ALiBi tensor ((B*H, 1, m), or Falcon's
    (B, H, 1, m)), checked."""
    if alibi.shape not in ((batch * heads, 1, m), (batch, heads, 1, m)):
        raise Unserved(f"an ALiBi tensor of shape {tuple(alibi.shape)} for {m} keys")
    slopes = _slopes_of(module, heads)
    positions, kept = _row_positions(reading, batch, m)
    _check_line(alibi.detach().view(batch, heads, m).cpu(), slopes, positions, kept, rounding)
    return slopes


def _fused(q, k, v, slopes, scale, reading, dropout, training):
    from . import alibi_attention

    dropout = dropout if training else 0.0
    return alibi_attention(q, k, v, slopes.to(q.dtype).to(q.device), scale=scale,
                           dropout_p=dropout, seed=dropout_seed(dropout),
                           **mask_options(reading, q.device)).out


def _merged(out):
    batch, heads, n, d = out.shape
    return out.transpose(1, 2).reshape(batch, n, heads * d)


def _line_call(module, hidden_states, alibi, attention_mask, cache, output_attentions,
               convention: str, rounding) -> tuple:
    """(mask reading, slopes) of a BLOOM or Falcon attention call, or Unserved."""
    batch, n, _ = hidden_states.shape
    m = alibi.shape[-1]
    if output_attentions or collecting_attentions():
        raise Unserved("attention weights asked for (output_attentions)")
    if _expected_keys(cache, module.layer_idx, n) != m:
        raise Unserved("an ALiBi tensor shorter than the cache's keys")
    reading = _reading(attention_mask, batch, n, m, _query_offset(cache, module.layer_idx), convention)
    return reading, _line_slopes(module, alibi, reading, batch, module.num_heads, m, rounding)


def _expected_keys(cache, layer_idx, n) -> int:
    """How many keys the layer attends to once `cache` has taken the n new ones (a
    static cache: all its slots, the unused ones masked)."""
    return n if cache is None else int(cache.get_mask_sizes(n, layer_idx)[0])


# ------------------------------------------------------------------ BLOOM

def bloom_forward(self, hidden_states, residual, alibi, attention_mask, layer_past=None,
                  use_cache=False, output_attentions=False, **kwargs):
    try:
        if self.pretraining_tp > 1 and self.slow_but_exact:
            raise Unserved("pretraining_tp > 1 with slow_but_exact")
        reading, slopes = _line_call(self, hidden_states, alibi, attention_mask, layer_past,
                                     output_attentions, "hf", torch.float32 if alibi.dtype ==
                                     torch.float64 else alibi.dtype)
    except Unserved as why:
        _warn_once(str(why))
        return self._posenc_original_forward(hidden_states, residual, alibi, attention_mask, layer_past,
                                             use_cache, output_attentions, **kwargs)
    q, k, v = self._reshape(project(self.query_key_value, hidden_states))
    if layer_past is not None:
        k, v = layer_past.update(k, v, self.layer_idx)
    out = _fused(q, k, v, slopes * self.beta, self.inv_norm_factor, reading, self.attention_dropout.p,
                 self.training)
    out = project(self.dense, _merged(out))
    return _home(self).dropout_add(out, residual, self.hidden_dropout, self.training), None


# ------------------------------------------------------------------ MPT

def mpt_forward(self, hidden_states, position_bias, past_key_values=None, attention_mask=None,
                **kwargs):
    batch, n = hidden_states.shape[:2]
    heads, d = self.n_heads, self.head_dim
    m = _expected_keys(past_key_values, self.layer_idx, n)
    try:
        if getattr(self, "_posenc_output_attentions", False) or collecting_attentions():
            raise Unserved("attention weights asked for (output_attentions)")
        if position_bias is None or position_bias.dim() != 3 or position_bias.shape[:2] != (heads, 1) \
                or not 2 <= m <= position_bias.shape[2]:
            raise Unserved("a position bias that is not MPT's (H, 1, max_seq_len) ALiBi for these keys")
        length = position_bias.shape[2]
        slopes = -position_bias[:, 0, -2].detach().double().cpu()   # the bias at j = L - 2
        _check_line(position_bias.detach().view(1, heads, length).cpu(), slopes,
                    (torch.arange(length) - (length - 1))[None], torch.ones(1, length, dtype=torch.bool),
                    torch.float32)
        reading = _reading(attention_mask, batch, n, m,
                           _query_offset(past_key_values, self.layer_idx), "dropped")
    except Unserved as why:
        _warn_once(str(why))
        return self._posenc_original_forward(hidden_states, position_bias, past_key_values,
                                             attention_mask, **kwargs)
    qkv = project(self.Wqkv, hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    q, k, v = (x.reshape(batch, n, heads, d).transpose(1, 2) for x in qkv.chunk(3, dim=2))
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    out = _fused(q, k, v, slopes, self.softmax_scale, reading, self.attn_dropout_p, self.training)
    return project(self.out_proj, _merged(out)), None


def mpt_block_forward(self, hidden_states, position_bias, attention_mask, layer_past=None,
                      use_cache=False, output_attentions=False, **kwargs):
    """MptBlock's forward, telling its attention whether weights are asked for (MPT's
    block keeps output_attentions from its attention: the patched attention would
    return None weights without this)."""
    self.attn._posenc_output_attentions = bool(output_attentions)
    return self._posenc_original_forward(hidden_states, position_bias, attention_mask, layer_past,
                                         use_cache, output_attentions, **kwargs)


# ------------------------------------------------------------------ Falcon (alibi=True)

def falcon_forward(self, hidden_states, alibi, attention_mask, position_ids=None, layer_past=None,
                   use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
    original = (hidden_states, alibi, attention_mask, position_ids, layer_past, use_cache,
                output_attentions, position_embeddings)
    if alibi is None:                       # a rotary Falcon: not an ALiBi model, nothing to serve
        return self._posenc_original_forward(*original, **kwargs)
    try:
        reading, slopes = _line_call(self, hidden_states, alibi, attention_mask, layer_past,
                                     output_attentions, "biased", torch.bfloat16)
    except Unserved as why:
        _warn_once(str(why))
        return self._posenc_original_forward(*original, **kwargs)
    batch, n, _ = hidden_states.shape
    heads, d = self.num_heads, self.head_dim
    kv_heads = heads if self.new_decoder_architecture else self.num_kv_heads
    q, k, v = self._split_heads(project(self.query_key_value, hidden_states))
    q = q.transpose(1, 2).reshape(batch, heads, n, d)
    k = k.transpose(1, 2).reshape(batch, kv_heads, n, d)
    v = v.transpose(1, 2).reshape(batch, kv_heads, n, d)
    if layer_past is not None:
        k, v = layer_past.update(k, v, self.layer_idx)
    # HF's sdpa path: softmax(q.k / sqrt(d) + slope * position / sqrt(d))
    out = _fused(q, k, v, slopes * self.inv_norm_factor, self.inv_norm_factor, reading,
                 self.attention_dropout.p, self.training)
    return project(self.dense, _merged(out)), None
