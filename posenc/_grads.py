"""The named tuples every `*_backward` returns (SPEC §3).

Fields are named exactly as the method's float arguments, in signature
order; an optional float argument that was not given has the field None.
posenc, posenc.reference and posenc.torch return the same types.
"""

from collections import namedtuple

GRAD_FIELDS = {
    "content": ("q", "k"),
    "shaw": ("q", "k", "rel_k"),
    "t5": ("q", "k", "bias"),
    "m2": ("q", "k", "rel"),
    "m4": ("q", "k", "rel_k"),
    "m4m": ("q", "k", "rel_k"),
    "deberta": ("q", "k", "pos_key", "pos_query"),
    "tupe": ("q", "k", "pos_q", "pos_k", "bias", "theta"),
    "diet_abs": ("q", "k", "pos_q", "pos_k", "segment_table"),
    "diet_rel": ("q", "k", "rel", "segment_table"),
    "bert_ad": ("q", "k", "pos_q", "pos_k"),
    "absolute_input": ("x", "p", "w_q", "w_k"),
}


def _class_name(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_")) + "Grads"


GRAD_TYPES = {method: namedtuple(_class_name(method), fields)
              for method, fields in GRAD_FIELDS.items()}

ContentGrads = GRAD_TYPES["content"]
ShawGrads = GRAD_TYPES["shaw"]
T5Grads = GRAD_TYPES["t5"]
M2Grads = GRAD_TYPES["m2"]
M4Grads = GRAD_TYPES["m4"]
M4mGrads = GRAD_TYPES["m4m"]
DebertaGrads = GRAD_TYPES["deberta"]
TupeGrads = GRAD_TYPES["tupe"]
DietAbsGrads = GRAD_TYPES["diet_abs"]
DietRelGrads = GRAD_TYPES["diet_rel"]
BertAdGrads = GRAD_TYPES["bert_ad"]
AbsoluteInputGrads = GRAD_TYPES["absolute_input"]
