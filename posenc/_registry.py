"""The method registry: every method of SPEC §3, declared once.

A method is the content term ``s q_i.k_j`` plus terms of a few kinds
(posenc._kinds, csrc/posenc.h), combined by sum or by product:

    Dense(pos_q, pos_k)      pos_q_i . pos_k_j, scaled by s or not     (TUPE, DIET-ABS)
    Table(name)              table[h, map(offset)]                      (T5, M2, DIET-REL, TUPE-R)
    QueryTable(name)         q_i . table[map(offset)]                   (Shaw, M4, M4M, DeBERTa c2p)
    KeyTable(name)           k_j . table[map(offset)]                   (M4, M4M, DeBERTa p2c)
    Segments()               segment_table[h, segment_q[b,i], segment_k[b,j]]  (DIET)
    Reset(name)              TUPE's [CLS] reset by theta
    OffsetBias(names, ...)   a function of the offset with per-head parameters (ALiBi, KERPLE)
    Rotary()                 q and k rotated by their positions (RoPE, xPos)
    ForgetGates()            FoX's decay: sums of per-token log forget gates between key
                             and query (a term module of the engine: csrc/terms.h)
    Grid2D()                 bias[h, bucket(clipped 2-D offset)] of tokens on a grid
                             (Swin, BEiT: a term module)
    ContextualPositions()    q_i . pos_emb at positions counted by the row's gates
                             sigmoid(s q_i.k_t) (CoPE: a term module reading the content)

with at most one bucket map (`MAPS`) from the offset to a table row.  Each
kind owns its checks, engine configuration, gradients, example inputs and
pictures; from an entry everything else is derived: the signature of
``posenc.<m>`` / ``<m>_backward`` / ``posenc.reference.<m>`` /
``posenc.torch.<m>`` (one signature string; its non-tensor arguments typed by
the map's, the terms' and the common parameters), the argument checks
(`posenc._checks.check`), the engine configuration (`posenc._methods`), the
gradient fields and types, the docstrings, the example inputs
(`posenc._examples`), the torch custom ops, the pictures and the benchmark
facts.  Adding a method of these kinds is an entry here, a reference formula
(``posenc.reference._<m>_logits`` and ``_<m>_grads``), a torch-native formula
(``posenc.torch.native.<m>``) and an nn module; tests/test_registry.py fails
until every place exists.  Functions a method brings (``posenc.alibi_slopes``)
are its entry's `exports`.
"""

from __future__ import annotations

import math
import numbers
from collections import namedtuple
from dataclasses import dataclass, field

import numpy as np


from ._kinds import (COMMON_PARAMS, MAPS, Choice, ContextualPositions, Dense, ForgetGates,
                     Grid2D, KeyTable,
                     OffsetBias, QueryTable, Reset, Rotary, Segments, Table, diagonal_map,
                     diagonal_offsets)
from .rotary import rope_tables, xpos_tables

__all__ = ["REGISTRY", "METHODS", "INDEX_TENSORS", "EXPORTS", "Method", "MAPS", "Dense", "Table",
           "QueryTable", "KeyTable", "Reset", "Segments", "OffsetBias", "Rotary", "ForgetGates", "Grid2D",
           "ContextualPositions",
           "diagonal_map", "diagonal_offsets"]

# Every function's last keyword (SPEC §1): query row i sits at position query_offset + i.
COMMON_KEYWORDS = ", query_offset=0"


@dataclass(frozen=True)
class Bench:
    """Facts about a method the benchmark needs (benchmarks/ reads them)."""

    flops: tuple            # ((C, P_q, P_k, D, N) forward, (...) backward) coefficients
    flop_text: tuple        # (forward, backward) in words
    eager_peak: tuple       # (L, V, P): peak of the torch-eager formula, see benchmarks/
    shared_table: bool = False   # the benchmark shares the vector table over heads
    group: str | None = None     # "additive" or "heavy": which speed target applies
    memory: bool = False         # peak memory is a target


@dataclass(frozen=True)
class Method:
    name: str
    title: str
    signature: str          # the arguments after q, k, as Python writes them
    terms: tuple = ()
    bucket: str | None = None     # a kind of MAPS
    product: bool = False         # A = s q.k * factors (M2, M4M)
    scale_factor: int | None = 1  # default s = 1/sqrt(factor d); None: s = 1
    formula: str = ""
    bench: Bench | None = None
    # std (or a function of d) of each table drawn for pictures (posenc.plot)
    plot_init: dict = field(default_factory=dict)
    exports: tuple = ()           # functions the method brings, exported as posenc.<name>
    # derived in __post_init__
    tensors: tuple = ()           # tensor arguments in signature order
    optional: frozenset = frozenset()
    keyword_only: frozenset = frozenset()   # tensors after `*` (required ones too: coordinates)
    index: frozenset = frozenset()     # integer tensors (ids, positions)
    constant: frozenset = frozenset()  # float tensors without a gradient (tables of constants)
    params: tuple = ()            # (name, default or REQUIRED) in signature order
    param_kinds: dict = field(default_factory=dict)   # name -> posenc._kinds.Param
    grad_fields: tuple = ()
    arguments: tuple = ()         # every argument name in signature order
    map_params: tuple = ()        # the bucket map's parameters, in its order

    def __post_init__(self):
        kinds = dict(self.map.params) if self.map else {}
        for term in self.terms:
            kinds.update(term.params)
        kinds.update(COMMON_PARAMS)
        tensors, optional, params, arguments, keyword = [], set(), [], [], set()
        star = False
        for text in ("q, k, " + self.signature + COMMON_KEYWORDS).split(","):
            text = text.strip()
            if text == "*":
                star = True
                continue
            name, _, default = (part.strip() for part in text.partition("="))
            arguments.append(name)
            if name in kinds:
                params.append((name, eval(default, {}) if default else REQUIRED))
            else:
                tensors.append(name)
                if default:
                    optional.add(name)
                if star:
                    keyword.add(name)
        names = [name for name, _ in params]
        if names[-2:] != ["scale", "query_offset"] or set(names) != set(kinds):
            raise AssertionError(f"{self.name}: the parameters must be the map's and the terms' "
                                 f"({', '.join(kinds)}), then scale; the signature has "
                                 f"{', '.join(names)}")
        index = {t for term in self.terms for t in term.index}
        constant = {t for term in self.terms for t in term.constant}
        setattr_ = object.__setattr__
        setattr_(self, "tensors", tuple(tensors))
        setattr_(self, "optional", frozenset(optional))
        setattr_(self, "keyword_only", frozenset(keyword))
        setattr_(self, "index", frozenset(index))
        setattr_(self, "constant", frozenset(constant))
        setattr_(self, "params", tuple(params))
        setattr_(self, "param_kinds", {name: kinds[name] for name in names})
        setattr_(self, "arguments", tuple(arguments))
        setattr_(self, "map_params", tuple(self.map.params) if self.map else ())
        setattr_(self, "grad_fields", tuple(t for t in tensors if t not in index))
        declared = {"q", "k"} | {t for term in self.terms for t in term.tensors}
        if declared != set(tensors):
            raise AssertionError(f"{self.name}: terms use {sorted(declared)}, the signature "
                                 f"has {sorted(tensors)}")

    @property
    def map(self):
        return MAPS[self.bucket] if self.bucket else None

    def default_scale(self, d: int) -> float:
        """SPEC §3's default s for head dimension d (1 when d = 0)."""
        if self.scale_factor is None or d == 0:
            return 1.0
        return 1.0 / math.sqrt(self.scale_factor * d)

    @property
    def scale_text(self) -> str:
        if self.scale_factor is None:
            return "1"
        return "1/sqrt(d)" if self.scale_factor == 1 else f"1/sqrt({self.scale_factor}d)"

    @property
    def reads_mask(self) -> bool:
        """Whether its logits read which keys a row sees (CoPE's gates): a fused
        attention's masks reach them (posenc.reference, posenc.torch.native)."""
        return any(term.reads_mask for term in self.terms)

    @property
    def queries_among_keys(self) -> bool:
        """Whether every query must be among the keys, query_offset + n <= m (FoX)."""
        return any(term.queries_among_keys for term in self.terms)

    def head_axis(self, name: str) -> int:
        """The axis of tensor `name` that is its head axis (H|1): its term's (0, or 1 for
        FoX's (B, H|1, m) gates)."""
        for term in self.terms:
            if name in term.tensors:
                return term.head_axis
        return 0

    @property
    def query_tensors(self) -> tuple:
        """Its tensors with a row per query on axis 1 (DIET-ABS's pos_q, segment ids,
        2-D coordinates): what a call of a subset of q's rows slices with them."""
        return tuple(name for term in self.terms for name in term.query_tensors)

    def trainable(self, name: str, value) -> bool:
        """Whether input `name` of a call (value: its array or tensor) has a gradient:
        it is not a constant, or its term makes it trainable in this form (RoPE's
        per-token tables, spec §3.16; the (P, r) tables stay constants)."""
        return name not in self.constant or any(
            name in term.constant and term.trainable(name, value) for term in self.terms)

    def term(self, kind):
        """The terms of one kind."""
        return tuple(t for t in self.terms if isinstance(t, kind))

    def gradient_sources(self) -> tuple:
        """(field, engine gradient name or None, finish or None) per gradient field, in
        field order: the first term that names a field gives it (M4's rel_k, read on
        both sides, has one gradient: the engine sums both sides into the query
        table's); q and k are the content's; a constant has none."""
        sources = {"q": ("q", None), "k": ("k", None)}
        for term in self.terms:
            for name, engine, finish in term.gradients(self):
                sources.setdefault(name, (engine, finish))
        return tuple((name,) + sources.get(name, (None, None)) for name in self.grad_fields)


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()

# ------------------------------------------------------------------ the methods

# Shaw, M4, M4M: one clipped vector table, shared by the heads in the benchmark (as Shaw
# et al. 2018 §3.1 and HF BERT's relative_key), a speed and a memory target there
_CLIPPED_VECTOR = dict(bucket="clipped", signature="rel_k, *, max_distance, scale=None",
                       plot_init={"rel_k": 1.0})
_HEAVY_SHARED = dict(shared_table=True, group="heavy", memory=True)
_T5_KEYWORDS = "num_buckets=32, max_distance=128, bidirectional=True"

_ENTRIES = (
    Method(
        "content", "plain attention, the baseline", "*, scale=None",
        formula="Plain attention logits (SPEC 3.1): A_ij = s q_i.k_j, s = 1/sqrt(d) by default.",
        bench=Bench(((1, 0, 0, 0, 1), (2, 0, 0, 0, 1)), ("C + N", "2C + N"), (3, 0, 0))),
    Method(
        "shaw", "Shaw et al. 2018", terms=(QueryTable("rel_k"),), **_CLIPPED_VECTOR,
        formula="""\
Shaw et al. 2018 (SPEC 3.2): A_ij = s q_i.(k_j + rel_k[c(i,j)]),
c = clipped(j - i, max_distance); rel_k (H|1, 2t+1, d); s = 1/sqrt(d).""",
        bench=Bench(((1, 1, 0, 0, 2), (2, 2, 0, 0, 2)), ("C + P_q + 2N", "2C + 2P_q + 2N"),
                    (3, 4, 0), **_HEAVY_SHARED)),
    Method(
        "t5", "Raffel et al. (T5)", f"bias, *, {_T5_KEYWORDS}, scale=1.0",
        terms=(Table("bias"),), bucket="t5", scale_factor=None,
        formula="""\
T5 relative bias, Raffel et al. (SPEC 3.3): A_ij = s q_i.k_j + bias[h, t5(j - i)];
bias (H|1, num_buckets); s = 1 as in T5; the bias is never scaled.""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive"),
        plot_init={"bias": 2.0}),
    Method(
        "m2", "Huang et al. 2020, M2", "rel, *, max_distance, scale=None",
        terms=(Table("rel"),), bucket="clipped", product=True,
        formula="""\
Huang et al. 2020, M2 (SPEC 3.4): A_ij = s (q_i.k_j) rel[h, c(i,j)],
c = clipped(j - i, max_distance); rel (H|1, 2t+1); s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 2), (3, 0, 0, 0, 3)),
                    ("C + 2N", "3C + 3N  (q·k recomputed for the table gradient)"), (6, 0, 2)),
        plot_init={"rel": 0.5}),
    Method(
        "m4", "Huang et al. 2020, M4", terms=(QueryTable("rel_k"), KeyTable("rel_k")),
        **_CLIPPED_VECTOR,
        formula="""\
Huang et al. 2020, M4 (SPEC 3.5): A_ij = s (q_i.k_j + q_i.a_ij + k_j.a_ij),
a_ij = rel_k[clipped(j - i, max_distance)]; rel_k (H|1, 2t+1, d); s = 1/sqrt(d).""",
        bench=Bench(((1, 1, 1, 0, 3), (2, 2, 2, 0, 3)), ("C + P_q + P_k + 3N", "2C + 2P_q + 2P_k + 3N"),
                    (3, 5.5, 0), **_HEAVY_SHARED)),
    Method(
        "m4m", "multiplicative M4", terms=(QueryTable("rel_k"), KeyTable("rel_k")),
        product=True, **{**_CLIPPED_VECTOR,   # three dot products multiply: keep each near 1
                         "plot_init": {"rel_k": lambda d: d ** -0.5}},
        formula="""\
Multiplicative M4 (SPEC 3.6): A_ij = s (q_i.k_j)(q_i.a_ij)(k_j.a_ij),
a_ij = rel_k[clipped(j - i, max_distance)]; s = 1/sqrt(d).""",
        bench=Bench(((1, 1, 1, 0, 3), (3, 3, 3, 0, 6)),
                    ("C + P_q + P_k + 3N", "3C + 3P_q + 3P_k + 6N  (all three factors recomputed)"),
                    (9.5, 3.5, 0), **_HEAVY_SHARED)),
    Method(
        "deberta", "DeBERTa(-v2) disentangled attention",
        "pos_key, pos_query, *, att_span, position_buckets=-1, max_relative_positions=-1, "
        "scale=None",
        terms=(QueryTable("pos_key"), KeyTable("pos_query")), bucket="deberta", scale_factor=3,
        formula="""\
DeBERTa(-v2) disentangled attention (SPEC 3.7), c2p + p2c:
A_ij = s (q_i.k_j + q_i.pos_key[p(i,j)] + k_j.pos_query[p(i,j)]),
delta = i - j (log-bucketed when position_buckets > 0 and max_relative_positions > 0),
p = clip(delta + att_span, 0, 2 att_span - 1); pos_key, pos_query (H|1, 2 att_span, d)
already projected; s = 1/sqrt(3d).  Equals HuggingFace DebertaV2 for square inputs.""",
        bench=Bench(((1, 1, 1, 0, 3), (2, 2, 2, 0, 3)), ("C + P_q + P_k + 3N", "2C + 2P_q + 2P_k + 3N"),
                    (7, 0, 7), group="heavy", memory=True),
        plot_init={"pos_key": 1.0, "pos_query": 1.0}),
    Method(
        "tupe", "Ke et al. 2020 (TUPE)",
        f"pos_q, pos_k, *, bias=None, theta=None, {_T5_KEYWORDS}, scale=None",
        terms=(Dense(scaled=True), Table("bias"), Reset("theta")), bucket="t5", scale_factor=2,
        formula="""\
TUPE, Ke et al. 2020 (SPEC 3.8): A_ij = s q_i.k_j + reset(v)_ij,
v_ij = s pos_q_i.pos_k_j + bias[h, t5(j - i)] (TUPE-R; TUPE-A without bias);
reset: theta[h,0] on row 0 ([CLS] to others), theta[h,1] on column 0 of other rows.
pos_q (H|1, n, d_p), pos_k (H|1, m, d_p), theta (H|1, 2); s = 1/sqrt(2d).""",
        bench=Bench(((1, 0, 0, 1, 3), (2, 0, 0, 2, 3)), ("C + D + 3N", "2C + 2D + 3N"), (3, 0, 8),
                    group="additive"),
        plot_init={"pos_q": 1.5, "pos_k": 1.5, "theta": 2.0}),   # s = 1/sqrt(2d) scales pos_q.pos_k
    Method(
        "diet_abs", "Chen et al. 2021, DIET-ABS",
        "pos_q, pos_k, *, segment_q=None, segment_k=None, segment_table=None, scale=None",
        terms=(Dense(), Segments()),
        formula="""\
DIET-ABS, Chen et al. 2021 eq. (1) (SPEC 3.9):
A_ij = s q_i.k_j + pos_q_i.pos_k_j + segment_table[h, segment_q[b,i], segment_k[b,j]];
pos_q (H|1, n, d_p), pos_k (H|1, m, d_p) (rank d_p free); segments optional, all three
or none: segment_q (B, n), segment_k (B, m) ints, segment_table (H|1, S, S); s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 1, 2), (2, 0, 0, 2, 2)), ("C + D + 2N", "2C + 2D + 2N"), (4.5, 0, 2),
                    group="additive"),
        # unscaled: entries of std sqrt(2) d^-1/4 give logits of std 2
        plot_init={"pos_q": lambda d: math.sqrt(2.0) * d ** -0.25,
                   "pos_k": lambda d: math.sqrt(2.0) * d ** -0.25}),
    Method(
        "diet_rel", "Chen et al. 2021, DIET-REL",
        "rel, *, max_distance, segment_q=None, segment_k=None, segment_table=None, scale=None",
        terms=(Table("rel"), Segments()), bucket="clipped_reversed",
        formula="""\
DIET-REL, Chen et al. 2021 eq. (3) (SPEC 3.10):
A_ij = s q_i.k_j + rel[h, clip(i - j, -t, t) + t] + E_S (note R_{i-j}: query minus key);
rel (H|1, 2t+1); segments as diet_abs; s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 3), (2, 0, 0, 0, 3)), ("C + 3N", "2C + 3N"), (4.5, 0, 2),
                    group="additive"),
        plot_init={"rel": 2.0}),
    Method(
        "relative_bias", "any function of the offset", "bias, *, max_distance, scale=None",
        terms=(Table("bias"),), bucket="clipped",
        formula="""\
Any function of the offset (SPEC 3.15): A_ij = s q_i.k_j + bias[h, clipped(j - i, t)],
t = max_distance; bias (H|1, 2t+1), computed by the caller from any parametrisation
of the offsets -t..t (Sandwich, a small network of the offset, a learned table),
unscaled; s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive"),
        plot_init={"bias": 2.0}),
)

def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's head slopes (Press et al. 2022, spec §3.13), float64 (H,): 2^(-8t/H),
    t = 1..H, for H a power of two; otherwise those of the largest power of two
    c < H, then the odd-numbered ones (t = 1, 3, 5, ...) of 2c's, H - c of them
    (the ALiBi authors' rule, and BLOOM's build_alibi_tensor)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral):
        raise TypeError(f"num_heads must be an int, got {type(num_heads).__name__} {num_heads!r}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    closest = 1 << (int(num_heads).bit_length() - 1)        # the largest power of two <= H
    slopes = 2.0 ** (-8.0 * np.arange(1, closest + 1) / closest)
    extra = 2.0 ** (-8.0 * np.arange(1, 2 * (num_heads - closest), 2) / (2 * closest))
    return np.concatenate([slopes, extra])


_ENTRIES += (
    Method(
        "alibi", "ALiBi, Press et al. 2022", "slopes, *, scale=None",
        terms=(OffsetBias(
            ("slopes",),
            value=lambda o, slopes: -slopes * np.abs(o),            # -m |j - i|
            derivatives=lambda o, slopes: (-np.abs(o),),
            init={"slopes": lambda rng, heads: 0.5 ** rng.uniform(0.0, 4.0, heads)},
            negative=("slopes",)),),
        formula="""\
ALiBi, Press et al. 2022 (SPEC 3.13): A_ij = s q_i.k_j - slopes[h] |j - i|;
slopes (H|1,), learnable (posenc.alibi_slopes(H): the paper's); s = 1/sqrt(d).
Under causal attention this is the paper's -m (i - j), and BLOOM's m j after the
softmax (the two differ by a constant per row).""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive"),
        exports=(alibi_slopes,)),
)

def _kerple_power(distance, r2):
    """|o|^r2, with 0^r2 = 0 (spec §3.14)."""
    return np.where(distance > 0, np.where(distance > 0, distance, 1.0) ** r2, 0.0)


def _kerple_value(o, r1, r2, *, kind):
    distance = np.abs(o)
    if kind == "log":                                       # KERPLE eq. (log kernel)
        return -r1 * np.log1p(r2 * distance)
    return -r1 * _kerple_power(distance, r2)                # the power kernel


def _kerple_derivatives(o, r1, r2, *, kind):
    """(d bias / d r1, d bias / d r2); in r2 at offset 0 the power's is 0."""
    distance = np.abs(o)
    if kind == "log":
        return -np.log1p(r2 * distance), -r1 * distance / (1.0 + r2 * distance)
    log_distance = np.log(np.where(distance > 0, distance, 1.0))   # 0 at offset 0
    return -_kerple_power(distance, r2), -r1 * _kerple_power(distance, r2) * log_distance


_ENTRIES += (
    Method(
        "kerple", "KERPLE, Chi et al. 2022", "r1, r2, *, kind='log', scale=None",
        terms=(OffsetBias(
            ("r1", "r2"), value=_kerple_value, derivatives=_kerple_derivatives,
            init={"r1": lambda rng, heads: rng.uniform(0.5, 2.0, heads),
                  "r2": lambda rng, heads: rng.uniform(0.5, 1.5, heads)},
            params={"kind": Choice(("log", "power"))}, negative=("r1",)),),
        formula="""\
KERPLE, Chi et al. 2022 (SPEC 3.14): kind="log": A_ij = s q_i.k_j - r1[h] log(1 + r2[h] |j - i|);
kind="power": A_ij = s q_i.k_j - r1[h] |j - i|^r2[h] (0^r2 = 0); r1, r2 (H|1,) used as
given (posenc.torch.nn.KERPLE keeps them positive), both with gradients; s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive")),
)

_ENTRIES += (
    Method(
        "rope", "RoPE, Su et al. 2021 (RoFormer)",
        "cos, sin, *, cos_k=None, sin_k=None, interleaved=False, positions_q=None, "
        "positions_k=None, scale=None",
        terms=(Rotary(),),
        formula="""\
Rotary position embedding, Su et al. 2021 (SPEC 3.12): A_ij = s rot(q_i, p_q(i)) . rot(k_j, p_k(j)),
pair t of a vector (x_t, x_{t+r}) (HF Llama's rotate_half, GPT-NeoX; x_{2t}, x_{2t+1} when
interleaved: GPT-J, RoFormer) rotated to (x c - y sn, y c + x sn) by c = cos[p, t], sn = sin[p, t];
cos, sin (P, r) tables (posenc.rope_tables: HuggingFace's for every rope_type), 2r <= d
(partial rotary: the rest unrotated); cos_k, sin_k the keys' own (xPos: posenc.xpos_tables);
p_q(i) = positions_q[b, i] or query_offset + i, p_k(j) = positions_k[b, j] or j; the tables
are constants (their gradient fields are None); s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 1), (2, 0, 0, 0, 1)), ("C + N", "2C + N"), (5, 0, 0),
                    group="additive"),
        exports=(rope_tables, xpos_tables)),
)

_ENTRIES += (
    Method(
        "fox", "FoX, Lin et al. 2025 (Forgetting Transformer)",
        "log_fgate, *, log_fgate_reverse=None, scale=None",
        terms=(ForgetGates(),),
        formula="""\
Forgetting Transformer, Lin et al. 2025 (SPEC 3.17): A_ij = s q_i.k_j + D_ij, i' = query_offset + i,
D_ij = sum_{l=j+1}^{i'} log_fgate[b, h, l] for j <= i' (0 on the diagonal) and, for j > i',
sum_{l=i'+1}^{j} log_fgate_reverse[b, h, l] (the bidirectional form) or 0 without it;
log_fgate, log_fgate_reverse (B, H|1, m): FoX's log sigmoid(w.x_l + b) per key token, with
gradients; every query among the keys (query_offset + n <= m); s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive"),
        plot_init={"log_fgate": 1.0}),
)

_ENTRIES += (
    Method(
        "relative_bias_2d", "2-D relative position bias (Swin, BEiT)",
        "bias, *, coords_q, coords_k, max_distance, scale=None",
        terms=(Grid2D(),),
        formula="""\
2-D relative position bias, Swin (Liu et al. 2021) and BEiT (Bao et al. 2022) (SPEC 3.19):
A_ij = s q_i.k_j + bias[h, (dy + t_y)(2 t_x + 1) + dx + t_x], dy = clip(y_k[j] - y_q[i], t_y),
dx = clip(x_k[j] - x_q[i], t_x); coords_q (B|1, n, 2), coords_k (B|1, m, 2) integer (y, x),
(-1, -1) a global token ([CLS]: buckets T, T + 1, T + 2 for a global query, a global key,
both; T = (2 t_y + 1)(2 t_x + 1)); max_distance t or (t_y, t_x); bias (H|1, T) or (H|1, T + 3),
HF Swin's and BEiT's tables reversed (they index query minus key); s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive"),
        plot_init={"bias": 2.0}),
)

_ENTRIES += (
    Method(
        "cope", "CoPE, Golovneva et al. 2024 (contextual position encoding)",
        "pos_emb, *, causal=False, scale=None",
        terms=(ContextualPositions(),),
        formula="""\
Contextual position encoding, Golovneva et al. 2024 (SPEC 3.18): A_ij = Z_ij + e_ij, Z_ij = s q_i.k_j;
the gates g_ij = sigmoid(Z_ij) over the keys row i sees (all, keys j <= i' when causal, a fused
attention's masks), 0 elsewhere; the position p_ij = min(sum_{t >= j} g_it, P - 1);
e_ij = w q_i.pos_emb[ceil p_ij] + (1 - w) q_i.pos_emb[floor p_ij], w = p_ij - floor p_ij (q
unscaled); pos_emb (P, d) or (H|1, P, d), with a gradient, and the gates' path into q and k;
s = 1/sqrt(d).""",
        bench=Bench(((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)), ("C + 2N", "2C + 2N"), (3, 0, 2),
                    group="additive"),
        plot_init={"pos_emb": 1.0}),
)

REGISTRY = {entry.name: entry for entry in _ENTRIES}
METHODS = tuple(REGISTRY)
# Integer tensor arguments of any method (segment ids, positions), by name.
INDEX_TENSORS = frozenset(t for spec in REGISTRY.values() for t in spec.index)
# The functions the methods bring, exported as posenc.<name> (posenc.alibi_slopes, ...).
EXPORTS = {function.__name__: function for spec in REGISTRY.values() for function in spec.exports}

# ------------------------------------------------------------------ gradient types

# The two baselines of posenc.reference (SPEC 3.11) are not engine methods;
# their gradient fields are declared beside the registry's.
REFERENCE_GRAD_FIELDS = {"bert_ad": ("q", "k", "pos_q", "pos_k"),
                         "absolute_input": ("x", "p", "w_q", "w_k")}

GRAD_FIELDS = {**{name: m.grad_fields for name, m in REGISTRY.items()}, **REFERENCE_GRAD_FIELDS}


def grad_class_name(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_")) + "Grads"


# The named tuples every `*_backward` returns (SPEC §3): fields named exactly
# as the method's float arguments, in signature order; an optional float
# argument that was not given has the field None.  Every namespace returns these.
GRAD_TYPES = {method: namedtuple(grad_class_name(method), fields)
              for method, fields in GRAD_FIELDS.items()}

# ------------------------------------------------------------------ docstrings

SHAPES = """
Shapes: q (B, H, n, d), k (B, H, m, d); result A (B, H, n, m), A[b, h, i, j]
is how query i attends to key j before the softmax.  Float inputs share one
dtype (float32, float64, bfloat16 or float16); inputs may have any strides.  Every positional
parameter has a leading head axis of size H or 1 (shared by all heads).
"""


def forward_doc(method: str, where: str, *, out: bool = True) -> str:
    text = f"{REGISTRY[method].formula}\n{SHAPES}\nComputed by {where}."
    if out:
        text += ("  `out=`: a C-contiguous (B, H, n, m) array of the\nresult dtype, "
                 "not overlapping an input, written and returned.")
    return text


def backward_doc(method: str, where: str) -> str:
    return (
        f"Gradients of sum(G * {method}(...)) for G = dL/dA of shape (B, H, n, m).\n\n"
        f"Returns a named tuple with fields {', '.join(GRAD_FIELDS[method])}, each shaped like its\n"
        "input (None for an optional input not given); a parameter shared over heads\n"
        f"(head axis 1) gets its gradient summed over heads.  Computed by {where}.\n\n"
        + REGISTRY[method].formula)


ATTENTION = """
Fused attention (SPEC §6): out = softmax_j(A + Mask) D v, never materialising the
(B, H, n, m) logits A of the method above.  v (B, H, m, dv); Mask = -inf where
causal and j > query_offset + i, or where key_padding_mask[b, j] (bool (B, m),
True = padding); D the dropout (keep with probability 1 - dropout_p, scaled by
1/(1 - dropout_p), decided by posenc.attention_dropout_mask(seed, ...)).
Returns Attention(out (B, H, n, dv), lse (B, H, n)); a row with every key masked
has out 0 and lse -inf.
"""


def attention_doc(method: str, where: str) -> str:
    return f"{REGISTRY[method].formula}\n{ATTENTION}\nComputed by {where}."


def attention_backward_doc(method: str, where: str) -> str:
    return (f"Gradients of L given d_out = dL/dout of {method}_attention (out and lse from\n"
            "its forward): a named tuple with a field per float input (q, k, v, then the\n"
            f"method's), each shaped like its input.  Computed by {where}.\n\n"
            + attention_doc(method, where))
