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


@torch.compiler.assume_constant_result      # dynamo cannot trace ContextVar.get: read once
def collecting_attentions() -> bool:        # while tracing (output_attentions is guarded)
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # pragma: no cover - other transformers layouts
        return False
    collected = _active_collector.get()
    return bool(collected) and ("attentions" in collected or "cross_attentions" in collected)



# ------------------------------------------------------------------ positions from the model

class Positions(NamedTuple):
    """What posenc's mask function hands the attention function in place of HF's
    (B, 1, n, m) mask: where the rows and keys sit, read from the model's own
    arguments (HF's `q_offset`, `kv_offset`, `kv_length`: the cache's), never from
    a mask.  Query row i sits at position q_offset + i, key j at kv_offset + j;
    a key is kept unless causal and later than the query, outside `window`
    ((left, right) of the query's position), in another document (`documents`,
    (B, n) ids of packed sequences, n == m) or `key_padding` (B, kv_length), True
    = padding).  `unserved`: why the kernel cannot serve it (None where it can);
    `hf`: sdpa_mask's arguments, to build HF's own mask for a fallback."""
    batch: int
    q_length: int
    kv_length: int
    q_offset: object            # int, or HF's 0-dim tensor (a static cache's length)
    kv_offset: int
    causal: bool
    window: tuple | None
    documents: torch.Tensor | None
    key_padding: torch.Tensor | None
    unserved: str | None
    hf: dict

    # generate() prepares a static cache's masks before the forward (contiguous() on
    # each), and the forward's create_*_mask then hands a prepared "4-D" mask on to
    # the mask function unread (ndim): positions_mask returns it as it is
    ndim = 4

    def contiguous(self) -> "Positions":
        return self

    def hf_mask(self) -> torch.Tensor:
        """HF's boolean (B, 1, n, m) mask of the same call (True keeps): for a fallback."""
        from transformers.masking_utils import sdpa_mask

        return sdpa_mask(**dict(self.hf, allow_is_causal_skip=False,
                                allow_is_bidirectional_skip=False))


def _cells(function) -> dict:
    """A closure's free variables by name."""
    return dict(zip(function.__code__.co_freevars,
                    (cell.cell_contents for cell in function.__closure__ or ())))


def _structure(function) -> tuple:
    """(causal, window, documents) of one of HF's mask functions, read from the
    function itself (its code and closure): causal or bidirectional, with
    sliding-window overlays and packed sequences; None for any other function."""
    from transformers import masking_utils as mu

    code = function.__code__
    if code is mu.causal_mask_function.__code__:
        return True, None, None
    if code is mu.bidirectional_mask_function.__code__:
        return False, None, None
    if code is _and_code():
        base, window, documents = None, None, None
        for part in _cells(function)["mask_functions"]:
            part_code = part.__code__
            if part_code is _overlay_code("sliding_window_overlay"):
                window = (_cells(part)["sliding_window"] - 1, 0)
            elif part_code is _overlay_code("sliding_window_bidirectional_overlay"):
                size = _cells(part)["sliding_window"]
                window = (size, size)
            elif part_code is _overlay_code("packed_sequence_mask_function"):
                documents = _cells(part)["packed_sequence_mask"]
            elif part_code is _overlay_code("remap_positions_for_packed_sequence"):
                # positions go up by one within a document (HF's packing): the inner
                # function on them is the same pattern on the rows' own indices
                inner = _structure(_cells(part)["mask_function"])
                if inner is None or inner[2] is not None:
                    return None
                base, window = inner[0], inner[1] or window
            else:
                inner = _structure(part)
                if inner is None or base is not None:
                    return None
                base, window, documents = inner[0], inner[1] or window, inner[2] or documents
        return None if base is None else (base, window, documents)
    return None


_CODES: dict = {}


def _overlay_code(name: str):
    """The code object of HF's masking_utils factory `name`'s inner function."""
    if name not in _CODES:
        from transformers import masking_utils as mu

        factory = getattr(mu, name)
        argument = {"sliding_window_overlay": 1, "sliding_window_bidirectional_overlay": 1}.get(
            name, torch.zeros(1, 1, dtype=torch.long))
        made = factory(mu.causal_mask_function, argument) \
            if name == "remap_positions_for_packed_sequence" else factory(argument)
        _CODES[name] = made.__code__
    return _CODES[name]


def _and_code():
    if "and_masks" not in _CODES:
        from transformers import masking_utils as mu

        _CODES["and_masks"] = mu.and_masks(mu.causal_mask_function).__code__
    return _CODES["and_masks"]


def _traced_structure(function, local_size, config, bidirectional_call) -> tuple:
    """_structure while torch.compile traces (it cannot read a closure): HF's plain
    causal and bidirectional functions by identity, and the causal sliding window
    of create_sliding_window_causal_mask (an and_masks of the config's window);
    None for anything else (which then runs HF's own path)."""
    from transformers import masking_utils as mu

    if function is mu.causal_mask_function:
        return True, None, None
    if function is mu.bidirectional_mask_function:
        return False, None, None
    window = getattr(config, "sliding_window", None)
    if function.__qualname__ == "and_masks.<locals>.and_mask" and not bidirectional_call \
            and local_size is not None and local_size == window \
            and getattr(config, "attention_chunk_size", None) is None:
        return True, (window - 1, 0), None
    return None


def positions_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                   mask_function=None, attention_mask=None, local_size=None, config=None,
                   use_vmap: bool = False, device="cpu", **kwargs) -> Positions:
    """posenc's entry on HF's AttentionMaskInterface: the call's Positions (no
    (B, 1, n, m) tensor).  HF's create_*_mask functions call it with the cache's
    q_offset, kv_offset and kv_length, the 2-D padding mask and the mask function
    they composed; `attention` reads it."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask

    if isinstance(attention_mask, Positions):   # prepared by generate() for this step
        return attention_mask
    mask_function = causal_mask_function if mask_function is None else mask_function
    if isinstance(q_offset, torch.Tensor):   # a static cache's count, which its update() then
        q_offset = q_offset.clone()          # advances in place: the position as it is now
    hf = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
              kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
              local_size=local_size, use_vmap=use_vmap, device=device)
    compiling = torch.compiler.is_compiling()
    if compiling:
        structure = _traced_structure(mask_function, local_size, config,
                                      "allow_is_bidirectional_skip" in kwargs)
    else:
        structure = _structure(mask_function)
    unserved = None
    if structure is None:
        unserved = f"a mask function posenc cannot express ({mask_function.__qualname__})"
        structure = (True, None, None)
    causal, window, documents = structure
    if documents is not None and (documents.shape[-1] != q_length or q_length != kv_length):
        unserved, documents = "packed sequences with a cache", None
    key_padding = None
    if attention_mask is not None:
        keep = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        key_padding = ~keep[:, kv_offset:kv_offset + kv_length].expand(batch_size, kv_length)
        if not compiling and not bool(key_padding.any()):
            key_padding = None
    if documents is not None:
        documents = documents.expand(batch_size, q_length)
    return Positions(batch_size, q_length, kv_length, q_offset, kv_offset, causal, window,
                     documents, key_padding, unserved, hf)


# ------------------------------------------------------------------ reading a mask (the patched ALiBi families)

class MaskReading(NamedTuple):
    """A mask as the fused kernel's parameters: key j of query i (at position
    i + query_offset) is kept unless causal and j > i + query_offset, j < i +
    query_offset - window_left, key_padding[b, j], or documents differ."""
    causal: bool
    query_offset: int
    window_left: int | None
    key_padding: torch.Tensor | None
    documents: tuple | None


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


def _candidates(keep: torch.Tensor, causal: bool, offset: int):
    """Readings at the model's own positions (causal, query offset) that could give
    `keep`: key padding alone, then a left window, then documents where each row's
    first key changes (each is checked)."""
    batch, n, m = keep.shape
    padding = ~keep.any(1)                             # keys no query sees
    key_padding = padding if torch.any(padding) else None
    yield MaskReading(causal, offset, None, key_padding, None)
    live = keep.any(2)                                 # rows that see a key
    if not causal or not torch.any(live):
        return
    rows = torch.arange(n)[None, :].expand(batch, n)[live]
    first_key = keep.to(torch.uint8).argmax(2)         # each row's first key
    first = first_key[live]

    def window(starts):
        """The left window that explains the rows starting after `starts` (their
        document's first key) -- padding keys at the start only widen it."""
        cut = first > starts[live]
        return int((rows[cut] + offset - first[cut]).max()) if torch.any(cut) else None

    zero = torch.zeros(batch, n, dtype=torch.long)
    left = window(zero)
    if left is not None:
        yield MaskReading(causal, offset, left, key_padding, None)
    if n == m and offset == 0:
        documents = torch.cat([zero[:, :1], (first_key[:, 1:] != first_key[:, :-1]).long()],
                              1).cumsum(1)
        index = torch.arange(n).expand(batch, n)
        starts = torch.full_like(documents, n).scatter_reduce(1, documents, index, "amin")
        yield MaskReading(causal, offset, window(starts.gather(1, documents)), key_padding,
                          (documents, documents))


def read_mask(mask: torch.Tensor, batch: int, n: int, m: int, query_offset: int,
              causal: bool = True, convention: str = "hf") -> MaskReading:
    """The kernel's parameters that give exactly HF's `mask` (B|1, 1|H, n, m) with the
    queries at the model's positions (query row i at query_offset + i: the cache's
    length, never read from the mask); Unserved if none do.  `convention`: see
    _allowed.  Remembered per mask tensor: the layers of one forward share it."""
    key = (batch, n, m, causal, convention, query_offset)
    known = getattr(mask, "_posenc_reading", None)     # (key, reading) of an earlier layer
    if known is not None and known[0] == key:
        return known[1]
    keep = _allowed(mask.detach().cpu(), batch, n, m, convention)
    for reading in _candidates(keep, causal, query_offset):
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


def position_options(positions: Positions, n: int, m: int, device, positional: bool) -> dict:
    """Positions as the fused attention's keyword arguments for n queries and m keys
    (query_offset: the queries' position less the first key's); Unserved if the kernel
    cannot take them.  `positional`: whether the call has a positional term (T5's
    bias, a swapped encoding), which needs the offset as a number: while
    torch.compile traces a static cache's step its offset is a tensor, and a plain
    step of one row then takes causality and the window as masked keys instead."""
    if positions.unserved is not None:
        raise Unserved(positions.unserved)
    if (positions.q_length, positions.kv_length) != (n, m):
        raise Unserved(f"a mask made for {positions.q_length} queries and {positions.kv_length} "
                       f"keys, called with {n} and {m}")
    offset, padding = positions.q_offset - positions.kv_offset, positions.key_padding
    documents = positions.documents
    if isinstance(offset, torch.Tensor) and torch.compiler.is_compiling():
        if positional or n != 1:
            raise Unserved("a static cache's position while torch.compile traces, with "
                           + ("a positional term" if positional else "several query rows"))
        j = torch.arange(m, device=device)
        hidden = (j > offset) if positions.causal else torch.zeros(m, dtype=torch.bool, device=device)
        if positions.window is not None:
            left, right = positions.window
            hidden = hidden | (j < offset - left) | (j > offset + right)
        hidden = hidden[None].expand(positions.batch, m)
        return dict(causal=False, query_offset=0, window=None,
                    key_padding_mask=hidden if padding is None else hidden | padding.to(device),
                    document_q=None, document_k=None)
    return dict(causal=positions.causal, query_offset=int(offset), window=positions.window,
                key_padding_mask=None if padding is None else padding.to(device),
                document_q=None if documents is None else documents.to(device),
                document_k=None if documents is None else documents.to(device))


# ------------------------------------------------------------------ T5's position bias

def _position_bias(module, position_bias):
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
                    bidirectional=not owner.is_decoder)
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
        attention_mask = torch.ones(n, m, dtype=torch.bool, device=query.device).tril(m - n)[None, None]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, **kwargs)


def _unfused(module, encoding, query, key, value, attention_mask, is_causal, dropout, kwargs,
             query_offset):
    """A swapped model's attention the eager way, for what the fused call cannot
    serve: the encoding's logits (k and v repeated to the query heads; query row i
    at query_offset + i), softcap, HF's mask (boolean, or added; without one, causal
    for the query at m - n + i), softmax with the sinks, torch's dropout; returns
    (out (B, n, H, dv), weights (B, H, n, m))."""
    batch, heads, n, _ = query.shape
    m = key.shape[2]
    group = heads // key.shape[1]
    key, value = (x.repeat_interleave(group, dim=1) for x in (key, value))
    logits = encoding.logits(query, key, query_offset=query_offset,
                             state=_input_state(module, encoding, query_offset, m))
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


def _input_state(module, encoding, query_offset: int, m: int):
    """The state of an encoding that reads the layer input (FoX's gates), or None: from
    the layer's hidden states (its forward pre-hook, swap_positional_encoding), the new
    tokens' at positions query_offset.. after the earlier ones this layer kept (a cached
    decoding step; position 0 starts a sequence), zeros for keys past them (a static
    cache's unwritten slots, masked)."""
    if not encoding.reads_input:
        return None
    x = module.__dict__.pop("_posenc_input", None)
    if x is None:
        raise ValueError(f"{type(encoding).__name__} reads the layer's input, which this "
                         "attention call did not get (swap_positional_encoding's hook on "
                         f"{type(module).__name__})")
    new = encoding.input_state(x)                      # (B, G, n)
    kept = module.__dict__.get("_posenc_state")
    if query_offset:
        if kept is None or kept.shape[2] < query_offset or kept.shape[0] != new.shape[0]:
            raise ValueError(f"{type(encoding).__name__}: a decoding step at position "
                             f"{query_offset} without this layer's earlier gates")
        new = torch.cat([kept[:, :, :query_offset], new], dim=2)
    module.__dict__["_posenc_state"] = new.detach()
    if new.shape[2] < m:
        new = torch.nn.functional.pad(new, (0, m - new.shape[2]))
    return new[:, :, :m]


def _served_options(module, query, key, attention_mask, is_causal, kwargs):
    """(keyword arguments of the fused call, T5's arguments or None) of a call the
    kernel serves; Unserved otherwise."""
    if kwargs.get("output_attentions") or collecting_attentions():
        raise Unserved("attention weights asked for (output_attentions)")
    if kwargs.get("cache") is not None:
        raise Unserved("a paged cache")
    n, m = query.shape[2], key.shape[2]
    encoding = getattr(module, "_posenc_encoding", None)   # swap_positional_encoding's
    position_bias = None if encoding is not None else kwargs.get("position_bias")
    t5 = None if position_bias is None else _position_bias(module, position_bias)
    if isinstance(attention_mask, Positions):
        options = position_options(attention_mask, n, m, query.device,
                                   encoding is not None or t5 is not None)
    elif attention_mask is None:   # a layer called without a mask (no mask function ran)
        options = dict(causal=bool(is_causal), query_offset=m - n if is_causal else 0, window=None,
                       key_padding_mask=None, document_q=None, document_k=None)
    else:
        raise Unserved("a custom attention mask tensor (posenc takes positions from the "
                       "model's mask function)")
    return options, t5


def attention(module, query, key, value, attention_mask, dropout: float = 0.0,
              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """HF's attention-interface function for "posenc": returns (out (B, n, H, dv), None).
    `attention_mask` is posenc's Positions (positions_mask made it), None, or a
    tensor (a custom mask: HF's own path)."""
    from . import content_attention, t5_attention

    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    encoding = getattr(module, "_posenc_encoding", None)
    try:
        options, t5 = _served_options(module, query, key, attention_mask, is_causal, kwargs)
    except Unserved as why:
        _warn(str(why))
        n, m = query.shape[2], key.shape[2]
        offset = m - n if is_causal else 0
        if isinstance(attention_mask, Positions):
            offset = attention_mask.q_offset - attention_mask.kv_offset
            attention_mask = attention_mask.hf_mask()
        if encoding is not None:            # the model's eager attention lacks the swapped encoding
            return _unfused(module, encoding, query, key, value, attention_mask, is_causal, dropout,
                            kwargs, offset)
        return _eager(module, query, key, value, attention_mask, is_causal,
                      dict(kwargs, dropout=dropout, scaling=scaling))
    options.update(softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"), dropout_p=dropout,
                   seed=dropout_seed(dropout))
    if encoding is not None:
        out = encoding.attention(query, key, value, **options, state=_input_state(
            module, encoding, options["query_offset"], key.shape[2])).out
    elif t5 is not None:
        bias = t5.pop("bias").to(query.dtype)
        out = t5_attention(query, key, value, bias, scale=1.0 if scaling is None else scaling,
                           **t5, **options).out
    else:
        out = content_attention(query, key, value, scale=scaling, **options).out
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Add "posenc" to HF's attention and mask interfaces (the mask function:
    positions_mask, whose Positions `attention` reads)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, positions_mask)
