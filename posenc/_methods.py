"""Every method of SPEC §3 as a configuration of the one C engine.

`configure` turns a checked `Problem` into an `EngineConfig` (posenc._engine)
from the method's registry entry: the content scale and sum or product, then
each term fills its engine slots (posenc._kinds: the dense factor, the scalar
table, the query- and key-side vector tables, the segments, the [CLS] reset,
a bias over the call's offsets, the rotation), each table with the bucket
map of the entry.  `forward` and `backward` call posenc._C with it;
`attention_forward` and `attention_backward` the fused attention (SPEC §6)
of a checked `posenc._attention.AttentionCall` on the same configuration.
The gradients come from the engine's entries the terms name
(Method.gradient_sources), through a term's `finish` where a parameter is
not the engine's array itself (an OffsetBias's parameters from its table's
gradient).
"""

from __future__ import annotations

import numpy as np

from . import _C
from ._attention import ATTENTION_GRAD_TYPES
from ._dtypes import narrow
from ._engine import ENGINE_GRADS, EngineConfig
from ._registry import GRAD_TYPES, REGISTRY

_FIELD = {name: t for t, name in enumerate(EngineConfig._fields)}
_Q, _K, _SCALE, _QUERY_OFFSET = (_FIELD[name] for name in ("q", "k", "scale", "query_offset"))
# v's gradient follows ENGINE_GRADS in _C.attention_backward's result, then the sinks'
_V = len(ENGINE_GRADS)
_SINKS = _V + 1


def _sinks_grad(p, value):
    """The sinks' gradient (float64 from the engine) in the call's dtype."""
    return narrow(value, p.dtype)


def _sources(spec, attention: bool) -> tuple:
    """(engine entry or None, finish or None) per gradient field of `spec` (with v
    third and the sinks last for the attention's)."""
    sources = [(None if engine is None else ENGINE_GRADS.index(engine), finish)
               for _, engine, finish in spec.gradient_sources()]
    if attention:
        sources.insert(2, (_V, None))
        sources.append((_SINKS, _sinks_grad))
    return tuple(sources)


SOURCES = {name: _sources(spec, False) for name, spec in REGISTRY.items()}
ATTENTION_SOURCES = {name: _sources(spec, True) for name, spec in REGISTRY.items()}


def _template(spec) -> list:
    """The engine slots that do not depend on the call."""
    template = [None] * len(EngineConfig._fields)
    template[_FIELD["product"]] = spec.product
    template[_FIELD["dense_scale"]] = template[_FIELD["vector_scale"]] = 1.0
    template[_FIELD["rope_interleaved"]] = False
    template[_QUERY_OFFSET] = 0
    return template


_TEMPLATES = {name: _template(spec) for name, spec in REGISTRY.items()}


def configure(p) -> EngineConfig:
    """The engine's problem for a checked call of p's method."""
    spec = REGISTRY[p.method]
    slots = _TEMPLATES[p.method].copy()
    arrays = p.arrays
    slots[_Q], slots[_K] = arrays["q"], arrays["k"]
    slots[_SCALE] = p.scale
    if p.query_offset:
        slots[_QUERY_OFFSET] = p.query_offset
    for term in spec.terms:
        term.configure(slots, _FIELD, spec, p, arrays)
    return tuple.__new__(EngineConfig, slots)


def forward(p, config: EngineConfig | None = None):
    return _C.forward(configure(p) if config is None else config, p.out)


def field_mask(method: str, wanted) -> int:
    """The bits (in gradient-field order) of the fields named in `wanted`."""
    fields = REGISTRY[method].grad_fields
    return sum(1 << t for t, name in enumerate(fields) if name in wanted)


# engine entry -> the entry it is formed from (a per-token rotary table's: dq or dk)
_REQUIRES = {ENGINE_GRADS.index(engine): ENGINE_GRADS.index(source)
             for spec in REGISTRY.values() for term in spec.terms
             for engine, source in term.grad_requires.items()}


def _needs(sources, fields: int | None) -> tuple:
    """(fields, needs): all fields when None (those with an engine entry), and their
    engine bits (with the entries they are formed from)."""
    if fields is None:
        fields = (1 << len(sources)) - 1
    needs = 0
    for bit, (entry, _) in enumerate(sources):
        if fields >> bit & 1 and entry is not None:
            needs |= 1 << entry
            if entry in _REQUIRES:
                needs |= 1 << _REQUIRES[entry]
    return fields, needs


def _gradients(p, grad_type, sources, fields: int, raw):
    """The named tuple of the fields asked for, from the engine's raw entries."""
    values = []
    for bit, (entry, finish) in enumerate(sources):
        value = raw[entry] if entry is not None and fields >> bit & 1 else None
        if value is not None and finish is not None:
            value = finish(p, value)
        values.append(value)
    return grad_type(*values)


def backward(p, G, fields: int | None = None, config: EngineConfig | None = None):
    """The gradient tuple of p's method; `fields` (a bit mask over the method's
    gradient fields, all by default) limits the work to the fields asked for."""
    sources = SOURCES[p.method]
    fields, needs = _needs(sources, fields)
    raw = _C.backward(G, configure(p) if config is None else config, needs)
    return _gradients(p, GRAD_TYPES[p.method], sources, fields, raw)


def _attention_arguments(call) -> tuple:
    """The binding's (key_padding_mask, causal, dropout_p, seed, window, document_q,
    document_k, softcap, sinks): the ids int64, the sinks float64 (exact for every dtype)."""
    docs = (None, None) if call.document_q is None else (
        np.ascontiguousarray(call.document_q, dtype=np.int64),
        np.ascontiguousarray(call.document_k, dtype=np.int64))
    sinks = None if call.sinks is None else np.ascontiguousarray(call.sinks, dtype=np.float64)
    return (call.key_padding_mask, call.causal, call.dropout_p, call.seed, call.window, *docs,
            call.softcap, sinks)


def attention_forward(call, config: EngineConfig | None = None) -> tuple:
    """(out, lse) of a checked attention call (posenc._attention.AttentionCall);
    out is written into the problem's `out` when it has one."""
    p = call.problem
    return _C.attention_forward(configure(p) if config is None else config, call.v,
                                *_attention_arguments(call), p.out)


def attention_backward(call, d_out, out, lse, d_lse=None, fields: int | None = None,
                       config: EngineConfig | None = None):
    """The <Method>AttentionGrads of a checked attention call given d_out = dL/dout,
    the forward's out and lse and d_lse = dL/dlse (None: lse unused); `fields` (a bit
    mask over its fields q, k, v, the method's parameters; all by default) limits the
    work to those asked for."""
    p = call.problem
    sources = ATTENTION_SOURCES[p.method]
    fields, needs = _needs(sources, fields)
    raw = _C.attention_backward(d_out, configure(p) if config is None else config, call.v, out,
                                lse, *_attention_arguments(call), needs, d_lse)
    return _gradients(p, ATTENTION_GRAD_TYPES[p.method], sources, fields, raw)
