"""Every method of SPEC §3 as a configuration of the one C engine.

`configure` turns a checked `Problem` into an `EngineConfig` (posenc._engine)
from the method's registry entry: the content scale, sum or product, and one
engine slot per term (the dense factor, the scalar table, the query- and
key-side vector tables, the segments, the [CLS] reset), each table with the
bucket map of the entry.  `forward` and `backward` call posenc._C with it;
`attention_forward` and `attention_backward` the fused attention (SPEC §6)
of a checked `posenc._attention.AttentionCall` on the same configuration.
"""

from __future__ import annotations

import numpy as np

from . import _C
from ._attention import ATTENTION_GRAD_TYPES
from ._engine import ENGINE_GRADS, EngineConfig
from ._registry import GRAD_TYPES, REGISTRY, Dense, Segments, diagonal_map

_ENGINE_BIT = {name: 1 << bit for bit, name in enumerate(ENGINE_GRADS)}


def _engine_slots(spec) -> tuple:
    """For each gradient field of `spec`, the index of its _C.backward entry."""
    slot = {"q": 0, "k": 1}
    for term in spec.terms:
        if isinstance(term, Dense):
            slot[term.query], slot[term.key] = ENGINE_GRADS.index("pos_q"), ENGINE_GRADS.index("pos_k")
        elif isinstance(term, Segments):
            slot["segment_table"] = ENGINE_GRADS.index("segment_table")
        elif term.name not in slot:     # M4/M4M: one table on both sides, one gradient
            slot[term.name] = ENGINE_GRADS.index(term.slot)
    return tuple(slot[field] for field in spec.grad_fields)


SLOTS = {name: _engine_slots(spec) for name, spec in REGISTRY.items()}

# The attention gradients' fields are (q, k, v, the method's parameters); v is
# entry len(ENGINE_GRADS) of _C.attention_backward's result.
ATTENTION_SLOTS = {name: slots[:2] + (len(ENGINE_GRADS),) + slots[2:]
                   for name, slots in SLOTS.items()}


_FIELD = {name: t for t, name in enumerate(EngineConfig._fields)}
_QUERY_OFFSET = _FIELD["query_offset"]


def _plan(spec):
    """What configure does for `spec`: a template of the engine slots that do
    not depend on the call, where the scale goes, and (tensor, slot, map slot)
    for every positional tensor."""
    template = [None] * len(EngineConfig._fields)
    template[_FIELD["product"]] = spec.product
    template[_FIELD["dense_scale"]] = template[_FIELD["vector_scale"]] = 1.0
    template[_FIELD["query_offset"]] = 0
    scaled = [_FIELD["scale"]]
    if not spec.product:
        scaled.append(_FIELD["vector_scale"])
    tensors = []
    for term in spec.terms:
        kind = term.__class__
        if kind is Dense:
            tensors += [(term.query, _FIELD["pos_q"], None), (term.key, _FIELD["pos_k"], None)]
            if term.scaled:
                scaled.append(_FIELD["dense_scale"])
        elif kind is Segments:
            tensors += [(name, _FIELD[name], None) for name in term.tensors]
        else:
            tensors.append((term.name, _FIELD[term.slot],
                            term.map_slot and _FIELD[term.map_slot]))
    return template, tuple(scaled), tuple(tensors)


_PLANS = {name: _plan(spec) for name, spec in REGISTRY.items()}


def configure(p) -> EngineConfig:
    """The engine's problem for a checked call of p's method."""
    template, scaled, tensors = _PLANS[p.method]
    slots = template.copy()
    arrays = p.arrays
    slots[0], slots[1] = arrays["q"], arrays["k"]
    if p.query_offset:
        slots[_QUERY_OFFSET] = p.query_offset
    scale = p.scale
    for slot in scaled:
        slots[slot] = scale
    rows = None
    for name, slot, map_slot in tensors:
        value = arrays.get(name)
        if value is not None:
            slots[slot] = value
            if map_slot is not None:
                if rows is None:      # one map for every table of the method (M4: the same object)
                    rows = diagonal_map(REGISTRY[p.method].bucket, p.map_values, p.n, p.m,
                                        p.query_offset)
                slots[map_slot] = rows
    return tuple.__new__(EngineConfig, slots)


def forward(p, config: EngineConfig | None = None) -> np.ndarray:
    return _C.forward(configure(p) if config is None else config, p.out)


def field_mask(method: str, wanted) -> int:
    """The bits (in gradient-field order) of the fields named in `wanted`."""
    fields = REGISTRY[method].grad_fields
    return sum(1 << t for t, name in enumerate(fields) if name in wanted)


def backward(p, G: np.ndarray, fields: int | None = None, config: EngineConfig | None = None):
    """The gradient tuple of p's method; `fields` (a bit mask over the method's
    gradient fields, all by default) limits the work to the fields asked for."""
    slots = SLOTS[p.method]
    fields, needs = _needs(slots, fields)
    raw = _C.backward(G, configure(p) if config is None else config, needs)
    return GRAD_TYPES[p.method](*[raw[slot] if fields >> bit & 1 else None
                                  for bit, slot in enumerate(slots)])


def _needs(slots, fields: int | None) -> tuple:
    """(fields, needs): all fields when None, and their engine bits."""
    if fields is None:
        fields = (1 << len(slots)) - 1
    needs = 0
    for bit, slot in enumerate(slots):
        if fields >> bit & 1:
            needs |= 1 << slot
    return fields, needs


def attention_forward(call, config: EngineConfig | None = None) -> tuple:
    """(out, lse) of a checked attention call (posenc._attention.AttentionCall);
    out is written into the problem's `out` when it has one."""
    p = call.problem
    return _C.attention_forward(configure(p) if config is None else config, call.v,
                                call.key_padding_mask, call.causal, call.dropout_p, call.seed,
                                p.out)


def attention_backward(call, d_out: np.ndarray, out: np.ndarray, lse: np.ndarray,
                       fields: int | None = None, config: EngineConfig | None = None):
    """The <Method>AttentionGrads of a checked attention call given d_out = dL/dout
    and the forward's out and lse; `fields` (a bit mask over its fields q, k, v,
    the method's parameters; all by default) limits the work to those asked for."""
    p = call.problem
    slots = ATTENTION_SLOTS[p.method]
    fields, needs = _needs(slots, fields)
    raw = _C.attention_backward(d_out, configure(p) if config is None else config, call.v, out,
                                lse, call.key_padding_mask, call.causal, call.dropout_p, call.seed,
                                needs)
    return ATTENTION_GRAD_TYPES[p.method](*[raw[slot] if fields >> bit & 1 else None
                                            for bit, slot in enumerate(slots)])
