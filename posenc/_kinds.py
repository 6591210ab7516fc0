"""The kinds a method is made of, each owning its behaviour.

A method (posenc._registry) is the content term ``s q_i.k_j`` plus terms of
the kinds below, with at most one bucket map; a kind is a class, and adding
one is adding a class here, not a branch in every consumer.  Each kind
answers, for the method that uses it:

    parameters   typed non-tensor arguments (`Param`): their check and their
                 torch custom-op schema type
    check        the shapes (and values) of its tensors, after q and k (SPEC §5)
    configure    the engine slots it fills (posenc._engine.EngineConfig)
    gradients    which engine gradient gives each of its fields, and how
    example      random inputs (posenc._examples, hence `python -m posenc
                 check`, the tests and the benchmarks)
    picture      random parameters for `posenc.plot` (shapes and scales)

Bucket maps (`BucketMap`) map an offset j - i' to a table row; the maps'
reference formulas are in posenc.buckets.  The references of the methods
themselves are written literally per method in posenc.reference.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, field

import numpy as np

from . import buckets
from ._dtypes import narrow

# ------------------------------------------------------------------ parameters


class Param:
    """A typed non-tensor parameter.  `types`: the exact Python types a call's
    value may have to skip `check` (the common case); `schema`: its type in a
    torch custom op's schema."""

    types: tuple = ()
    schema = ""

    def check(self, name: str, value):
        """The value, validated and normalised, or TypeError / ValueError naming it."""
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Param):
    minimum: int | None = None
    types = (int,)
    schema = "int"

    def check(self, name, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        value = int(value)
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{name} must be >= {self.minimum}, got {value}")
        return value


@dataclass(frozen=True)
class Offset(Int):
    """A position offset (query_offset): an int, a SymInt in the custom ops' schemas so
    that a compiled decoding loop, whose offset grows by one a step, compiles once."""
    schema = "SymInt"


@dataclass(frozen=True)
class Bool(Param):
    types = (bool,)
    schema = "bool"

    def check(self, name, value):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
        return bool(value)


@dataclass(frozen=True)
class Scale(Param):
    """A real number, or None for the method's default (resolved by the check)."""

    types = (float,)
    schema = "float?"

    def check(self, name, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number or None, got "
                            f"{type(value).__name__} {value!r}")
        return float(value)


@dataclass(frozen=True)
class Choice(Param):
    """One of a few strings."""

    options: tuple = ()
    types = ()              # always checked: the value must be one of the options
    schema = "str"

    def check(self, name, value):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, one of {', '.join(map(repr, self.options))}; "
                            f"got {type(value).__name__} {value!r}")
        if value not in self.options:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, self.options))}, "
                             f"got {value!r}")
        return value


@dataclass(frozen=True)
class IntPair(Param):
    """An int t >= 0, meaning (t, t), or a pair (t_y, t_x) of them: a distance per axis
    of a grid (relative_bias_2d's max_distance), normalised to the pair."""

    types = ()              # always checked: normalised to a tuple
    schema = "int[2]"

    def check(self, name, value):
        values = np.asarray(value) if isinstance(value, (tuple, list, np.ndarray)) else None
        if values is None:
            values = np.asarray([Int().check(name, value)] * 2)
        if values.ndim == 0:
            values = np.asarray([values.item()] * 2, dtype=object)
        if values.shape != (2,) or not all(
                isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
                for v in values.tolist()):
            raise TypeError(f"{name} must be an int or a pair of ints (t_y, t_x), got "
                            f"{type(value).__name__} {value!r}")
        pair = tuple(int(v) for v in values.tolist())
        if min(pair) < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
        if max(pair) >= 2 ** 30:
            raise ValueError(f"{name} must be < 2**30, got {value!r}")
        return pair


# Every function's last two parameters (SPEC §1): the scale and the query offset.
COMMON_PARAMS = {"scale": Scale(), "query_offset": Offset(minimum=0)}

# ------------------------------------------------------------------ bucket maps


class BucketMap:
    """A map from the offset o = j - i' (key minus query position) to a table row."""

    kind = ""
    params: dict = {}       # name -> Param, in signature order
    rows_text = ""          # the table's row count in words, for layouts
    doc = ""

    def check(self, values: dict) -> None:
        """ValueError for a degenerate map (SPEC §2); values are checked ints/bools."""

    def rows(self, values: dict) -> int:
        """Rows of the table this map indexes."""
        raise NotImplementedError

    def infer(self, rows: int) -> dict:
        """The parameters a table of `rows` rows implies (plot files that lack them)."""
        raise NotImplementedError

    def of_offsets(self, offsets: np.ndarray, values: tuple) -> np.ndarray:
        """The table row of each offset o = j - i' (any integer array)."""
        raise NotImplementedError

    def example(self, options: dict) -> dict:
        """The map's parameters in posenc._examples.make_inputs (from its keywords)."""
        raise NotImplementedError

    def picture(self, t: int, defaults: dict) -> dict:
        """The map's parameters for a picture of a sequence of about t offsets
        (`defaults`: the method's defaults of the map's parameters)."""
        return dict(defaults)


class Clipped(BucketMap):
    """clip(o, -t, t) + t (Shaw eq. (3), Huang M2/M4), or of -o (DIET eq. (3): R_{i-j})."""

    params = {"max_distance": Int()}
    rows_text = "2t+1"

    def __init__(self, kind: str, reversed_: bool):
        self.kind, self.reversed = kind, reversed_
        self.doc = f"clipped({'i - j' if reversed_ else 'j - i'}, max_distance)"

    def check(self, values):
        buckets.check_clipped(values["max_distance"])

    def rows(self, values):
        return 2 * values["max_distance"] + 1

    def infer(self, rows):
        return {"max_distance": (rows - 1) // 2}

    def of_offsets(self, offsets, values):
        return buckets.clipped(-offsets if self.reversed else offsets, values[0])

    def example(self, options):
        return {"max_distance": options["max_distance"]}

    def picture(self, t, defaults):
        return {"max_distance": t}


class T5Buckets(BucketMap):
    kind = "t5"
    params = {"num_buckets": Int(), "max_distance": Int(), "bidirectional": Bool()}
    rows_text = "num_buckets"
    doc = "t5(j - i, num_buckets, max_distance, bidirectional)"

    def check(self, values):
        buckets.check_t5(values["num_buckets"], values["max_distance"], values["bidirectional"])

    def rows(self, values):
        return values["num_buckets"]

    def infer(self, rows):
        return {"num_buckets": rows}

    def of_offsets(self, offsets, values):
        return buckets.t5(offsets, values[0], values[1], bool(values[2]))

    def example(self, options):
        return {"num_buckets": options["num_buckets"], "max_distance": options["t5_max_distance"]}


class DebertaBuckets(BucketMap):
    """DeBERTa's p(i, j) = clip(delta + att_span, 0, 2 att_span - 1), delta = i - j,
    log-bucketed when position_buckets > 0 and max_relative_positions > 0."""

    kind = "deberta"
    params = {"att_span": Int(minimum=1), "position_buckets": Int(),
              "max_relative_positions": Int()}
    rows_text = "2 att_span"
    doc = "clip(deberta_log(i - j) + att_span, 0, 2 att_span - 1)"

    def check(self, values):
        if values["att_span"] < 1:
            raise ValueError(f"att_span must be >= 1, got {values['att_span']}")
        if values["position_buckets"] > 0 and values["max_relative_positions"] > 0:
            buckets.check_deberta_log(values["position_buckets"], values["max_relative_positions"])

    def rows(self, values):
        return 2 * values["att_span"]

    def infer(self, rows):
        return {"att_span": rows // 2}

    def of_offsets(self, offsets, values):
        span, position_buckets, max_relative = values
        delta = -offsets
        if position_buckets > 0 and max_relative > 0:
            delta = buckets.deberta_log(delta, position_buckets, max_relative)
        return np.clip(delta + span, 0, 2 * span - 1)

    def example(self, options):
        span = options["att_span"]
        return {"att_span": span, **({"position_buckets": span, "max_relative_positions": 4 * span}
                                     if options["log_buckets"] else {})}

    def picture(self, t, defaults):
        return {"att_span": t}


MAPS = {m.kind: m for m in (Clipped("clipped", False), Clipped("clipped_reversed", True),
                            T5Buckets(), DebertaBuckets())}


def diagonal_offsets(n: int, m: int) -> np.ndarray:
    """o = j - i for the n + m - 1 diagonals of an (n, m) problem, o from -(n - 1) to m - 1."""
    if n == 0 or m == 0:
        return np.zeros(0, dtype=np.int64)
    return np.arange(-(n - 1), m, dtype=np.int64)


@functools.lru_cache(maxsize=256)
def diagonal_map(kind: str, values: tuple, n: int, m: int, query_offset: int = 0) -> np.ndarray:
    """The read-only int64 table row of each diagonal j - i of an (n, m) problem,
    at index (j - i) + n - 1 (the engine's layout), computed once per shape.  The
    map reads the positions' offset j - (query_offset + i) (SPEC §1)."""
    offsets = diagonal_offsets(n, m) - query_offset
    result = np.ascontiguousarray(MAPS[kind].of_offsets(offsets, values), dtype=np.int64)
    result.setflags(write=False)
    return result


@functools.lru_cache(maxsize=256)
def diagonal_rows(kind: str, values: tuple, n: int, m: int, query_offset: int = 0) -> np.ndarray:
    """diagonal_map as the engine's toeplitz module reads it: float64 (1, 1, n + m - 1)
    (its entries exact), read-only, computed once per shape."""
    return _module_rows(diagonal_map(kind, values, n, m, query_offset))


@functools.lru_cache(maxsize=64)
def identity_rows(n: int, m: int) -> np.ndarray:
    """identity_map as the toeplitz module reads it (a bias with a value per offset)."""
    return _module_rows(identity_map(n, m))


def _module_rows(rows: np.ndarray) -> np.ndarray:
    result = rows.astype(np.float64)[None, None]
    result.setflags(write=False)
    return result


@functools.lru_cache(maxsize=64)
def identity_map(n: int, m: int) -> np.ndarray:
    """Row t for diagonal t: a table with a row per offset of the call (OffsetBias)."""
    result = np.arange(n + m - 1 if n and m else 0, dtype=np.int64)
    result.setflags(write=False)
    return result


# ------------------------------------------------------------------ shapes and values

def shape_str(shape) -> str:
    return str(tuple(int(s) for s in shape))


def check_rank(name: str, value: np.ndarray, rank: int, layout: str) -> None:
    if value.ndim != rank:
        raise ValueError(
            f"{name} must have {rank} dimensions {layout}, got shape "
            f"{shape_str(value.shape)} ({value.ndim} dimensions)")


def check_shape(name: str, value: np.ndarray, expected: tuple, layout: str) -> None:
    """expected: a tuple of ints or None (free); a tuple entry may be a set of allowed ints."""
    check_rank(name, value, len(expected), layout)
    for got, want in zip(value.shape, expected):
        if want is None:
            continue
        ok = got in want if isinstance(want, (set, frozenset)) else got == want
        if not ok:
            shown = ["*" if w is None else "|".join(str(x) for x in sorted(w))
                     if isinstance(w, (set, frozenset)) else str(w) for w in expected]
            raise ValueError(f"{name} must have shape ({', '.join(shown)}"
                             f"{',' if len(shown) == 1 else ''}) {layout}, got "
                             f"{shape_str(value.shape)}")


def check_heads_shape(name: str, value: np.ndarray, H: int, tail: tuple, layout: str) -> None:
    """(H|1, *tail): the fast comparison first, the message-building check when it fails."""
    shape = value.shape
    if len(shape) != 1 + len(tail) or (shape[0] != H and shape[0] != 1) or shape[1:] != tail:
        check_shape(name, value, ({H, 1},) + tail, layout)


def require_ndarray(name: str, value) -> np.ndarray:
    """value itself if it is a NumPy array; a TypeError naming `name` otherwise, with
    the way out for a torch tensor (posenc.torch) and a masked array (whose mask
    the kernels would ignore)."""
    if not isinstance(value, np.ndarray):
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        hint = ("; posenc.torch takes tensors (posenc.torch.<method>, with autograd), or "
                "pass tensor.numpy()" if type(value).__module__.split(".")[0] == "torch" else "")
        raise TypeError(f"{name} must be a numpy.ndarray, got {kind}{hint}")
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: posenc would ignore its mask; pass "
                        f"{name}.filled(...) or {name}.data, and mask keys by key_padding_mask")
    return value


def require_index_array(name: str, value) -> np.ndarray:
    require_ndarray(name, value)
    if value.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    return value


# ------------------------------------------------------------------ terms

@dataclass
class Example:
    """What a term's `example` draws with (posenc._examples.make_inputs)."""

    rng: np.random.Generator
    B: int
    H: int
    n: int
    m: int
    d: int
    heads: int              # of the positional parameters: H, or 1 when shared
    dtype: np.dtype
    rows: int | None        # of the method's bucket map's tables
    product: bool
    options: dict           # make_inputs' keywords

    def normal(self, *shape) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(self.dtype)


@dataclass
class Picture:
    """What a term's `picture` draws with (posenc.plot.random_params): H heads,
    length n, head dimension d, the map's rows, the method's plot scales."""

    rng: np.random.Generator
    H: int
    n: int
    d: int
    rows: int | None
    product: bool
    init: dict

    def draw(self, name: str, shape: tuple, around: float = 0.0):
        """around + std * standard normal, std from the method's plot_init (or None:
        a tensor the picture leaves out, as TUPE-R's bias)."""
        if name not in self.init:
            return None
        std = self.init[name]
        std = std(self.d) if callable(std) else std
        return around + std * self.rng.standard_normal(shape)


class Term:
    """A term kind: the base of every kind below (see the module docstring)."""

    index: tuple = ()       # of its tensors: integer ids or positions
    constant: tuple = ()    # of its tensors: floats without a gradient
    params: dict = {}       # its own typed parameters, name -> Param
    uses_map = False        # reads the method's bucket map
    reads_qk = False        # the term depends on q or k (its picture needs them)
    reads_mask = False      # the term reads which keys a row sees (CoPE's gates): a fused
                            # attention's masks reach its logits
    queries_among_keys = False   # every query among the keys: query_offset + n <= m (FoX)
    head_axis = 0           # of its tensors: where the head axis (H|1) is ((B, H|1, m): 1)
    computes_operands = False   # the logits' GEMM reads operands it computed (rotated q, k)
    query_tensors: tuple = ()   # of its tensors: those with a row per query (axis 1)
    depth_tensors: tuple = ()   # of its tensors: those whose last axis is q's depth d (a
                                # picture's q and k take their width: posenc.plot)
    grad_requires: dict = {}    # engine gradient -> the engine gradient it is formed from

    @property
    def tensors(self) -> tuple:
        raise NotImplementedError

    def check(self, p, arrays: dict, rows) -> None:
        """Shapes and values of its given tensors (q, k and the parameters checked)."""

    def trainable(self, name: str, value) -> bool:
        """Whether its constant `name` has a gradient in the form of `value` (no)."""
        return False

    def configure(self, slots: list, field: dict, spec, p, arrays: dict) -> None:
        """Its engine slots into `slots` (field: slot index by EngineConfig name)."""

    def gradients(self, spec) -> tuple:
        """(field, engine gradient name, finish or None) per gradient field it owns;
        finish(p, raw) turns the engine's gradient into the field's."""
        return ()

    def example(self, ctx: Example, spec, values: dict) -> dict:
        """Random tensors for make_inputs (`values`: what is drawn so far)."""
        return {}

    def picture(self, ctx: Picture, spec, params: dict) -> dict:
        """Random parameters for a picture (posenc.plot.random_params)."""
        return {}

    def magnitudes(self, p, values: dict) -> None:
        """The float inputs (`values`, by name: their absolute values, float64) with
        which the method's logits are the sum of the absolute values of their terms
        (the error bounds' M, posenc._check), changed in place where the term needs
        more than absolute values; p: the checked call."""

    def grad_magnitudes(self, p, grads: dict, weights: np.ndarray) -> None:
        """The gradients' magnitudes (`grads`: the backward of the non-negative `weights`
        (B, H, n, m) on the inputs of `magnitudes`), changed in place where the term takes
        a gradient further than those inputs (the rotation's adjoint, CoPE's gates)."""


@dataclass(frozen=True)
class Dense(Term):
    """pos_q_i . pos_k_j, times s when `scaled` (TUPE) or unscaled (DIET-ABS).  The engine's
    `dense` term module (csrc/engine/term_dense_impl.h) reads pos_q and pos_k as (H|1, n d_p)
    and (H|1, m d_p), in the problem's compute type (`real` arrays of csrc/terms.h), and
    gives their gradients per (b, h) unit, float64 (table_gradient folds them)."""

    query: str = "pos_q"
    key: str = "pos_k"
    scaled: bool = False

    @property
    def tensors(self):
        return (self.query, self.key)

    @property
    def query_tensors(self):
        return (self.query,)

    @property
    def depth_tensors(self):        # TUPE's pos_q: d wide (a picture's q and k too)
        return (self.query,)

    def check(self, p, arrays, rows):
        pos_q, pos_k = arrays[self.query], arrays[self.key]
        check_rank(self.query, pos_q, 3, "(H|1, n, d_p)")
        check_rank(self.key, pos_k, 3, "(H|1, m, d_p)")
        d_p = pos_q.shape[2]
        check_shape(self.query, pos_q, ({p.H, 1}, p.n, d_p), "(H|1, n, d_p)")
        check_shape(self.key, pos_k, ({p.H, 1}, p.m, d_p), "(H|1, m, d_p)")
        p.d_p = d_p

    def configure(self, slots, field, spec, p, arrays):
        for name, slot in ((self.query, "dense_pos_q"), (self.key, "dense_pos_k")):
            x = arrays[name]                                   # (H|1, rows, d_p): rows by row
            slots[field[slot]] = x.reshape(x.shape[0], x.shape[1] * x.shape[2])
        if self.scaled:
            slots[field["dense_scale"]] = p.scale

    def gradients(self, spec):
        return tuple((name, slot, lambda p, grad, name=name: table_gradient(p, name, grad))
                     for name, slot in ((self.query, "dense_pos_q"), (self.key, "dense_pos_k")))

    def example(self, ctx, spec, values):
        rank = ctx.options["d_p"]
        if rank is None:
            rank = ctx.d if self.scaled else max(1, ctx.d // 2)
        return {self.query: ctx.normal(ctx.heads, ctx.n, rank),
                self.key: ctx.normal(ctx.heads, ctx.m, rank)}

    def picture(self, ctx, spec, params):
        return {name: ctx.draw(name, (ctx.H, ctx.n, ctx.d))     # square pictures: m = n
                for name in self.tensors if name in ctx.init}


@dataclass(frozen=True)
class _Mapped(Term):
    """A term read from one tensor `name` through the method's bucket map."""

    name: str
    uses_map = True
    slot = ""               # its EngineConfig field
    vectors = False         # (H|1, rows, d), else (H|1, rows)

    @property
    def tensors(self):
        return (self.name,)

    @property
    def depth_tensors(self):
        return (self.name,) if self.vectors else ()

    def check(self, p, arrays, rows):
        table = arrays.get(self.name)
        if table is None:
            return
        shape = table.shape
        if self.vectors:
            if len(shape) != 3 or shape[1] != rows or shape[2] != p.d or \
                    (shape[0] != p.H and shape[0] != 1):
                check_shape(self.name, table, ({p.H, 1}, rows, p.d), f"(H|1, {rows}, d)")
        elif len(shape) != 2 or shape[1] != rows or (shape[0] != p.H and shape[0] != 1):
            check_shape(self.name, table, ({p.H, 1}, rows), f"(H|1, {rows})")

    def example(self, ctx, spec, values):
        if self.name in values or (self.name in spec.optional
                                   and not ctx.options["wanted"].get(self.name, True)):
            return {}
        if self.vectors:
            return {self.name: ctx.normal(ctx.heads, ctx.rows, ctx.d)}
        table = ctx.normal(ctx.heads, ctx.rows)
        return {self.name: (1.0 + 0.5 * table).astype(ctx.dtype) if ctx.product else table}

    def picture(self, ctx, spec, params):
        shape = (ctx.H, ctx.rows, ctx.d) if self.vectors else (ctx.H, ctx.rows)
        around = 1.0 if ctx.product and not self.vectors else 0.0    # M2: a factor
        value = ctx.draw(self.name, shape, around)
        return {} if value is None else {self.name: value}


class Table(_Mapped):
    """table[h, map(j - i)], unscaled; (H|1, rows).  The engine's `toeplitz` term module
    (csrc/engine/term_toeplitz_impl.h) reads it as it is (a `real` array of csrc/terms.h:
    the problem's compute type, converted only where it is not) through the map (float64:
    diagonal_rows) along the offsets, and gives its gradient per (b, h) unit."""

    slot = "toeplitz_table"

    def configure(self, slots, field, spec, p, arrays):
        table = arrays.get(self.name)
        if table is not None:
            slots[field[self.slot]] = table
            slots[field["toeplitz_rows"]] = diagonal_rows(spec.bucket, p.map_values, p.n, p.m,
                                                          p.query_offset)

    def gradients(self, spec):
        return ((self.name, self.slot, lambda p, grad: table_gradient(p, self.name, grad)),)


class _VectorTable(_Mapped):
    """A vector table (H|1, rows, d), scaled by s in a sum.  The engine's query_table and
    key_table term modules (csrc/engine/term_vectors.h) read it as (H|1, rows d) in the
    problem's compute type (a `real` array) through the map (int64: diagonal_map), and
    give its gradient summed over the batch, per head."""

    vectors, reads_qk = True, True
    map_slot = ""           # its map's EngineConfig field

    def configure(self, slots, field, spec, p, arrays):
        table = arrays.get(self.name)
        if table is None:
            return
        # one table read on both sides (M4, M4M: one tensor, one map) is one object to the
        # engine, which then sums both sides' gradients into the query side's
        first = self.first_reader(spec)
        if first is not self and slots[field[first.slot]] is not None:
            slots[field[self.slot]] = slots[field[first.slot]]
            slots[field[self.map_slot]] = slots[field[first.map_slot]]
        else:
            slots[field[self.slot]] = table.reshape(table.shape[0], table.shape[1] * table.shape[2])
            slots[field[self.map_slot]] = diagonal_map(spec.bucket, p.map_values, p.n, p.m,
                                                       p.query_offset)
        if not spec.product:
            slots[field["vector_scale"]] = p.scale

    def first_reader(self, spec) -> "_VectorTable":
        """The first of spec's vector tables that reads this one's tensor (itself, or the query
        side where one tensor is read on both sides), looked up once per method."""
        readers = _FIRST_READERS.get(spec.name)
        if readers is None:
            readers = _FIRST_READERS[spec.name] = {}
            for term in spec.term(_VectorTable):
                readers.setdefault(term.name, term)
        return readers[self.name]

    def gradients(self, spec):
        return ((self.name, self.slot, lambda p, grad: table_gradient(p, self.name, grad)),)


_FIRST_READERS: dict = {}   # method name -> tensor name -> its first _VectorTable


class QueryTable(_VectorTable):
    """q_i . table[map(j - i)]."""

    slot, map_slot = "query_table_table", "query_table_map"


class KeyTable(_VectorTable):
    """k_j . table[map(j - i)]."""

    slot, map_slot = "key_table_table", "key_table_map"


@dataclass(frozen=True)
class Reset(Term):
    """TUPE's [CLS] reset: theta[h, 0] on the row at position 0, theta[h, 1] on column 0
    of the others; (H|1, 2).  The engine's `reset` term module
    (csrc/engine/term_reset_impl.h), float64, its gradient per (b, h) unit."""

    name: str = "theta"

    @property
    def tensors(self):
        return (self.name,)

    def check(self, p, arrays, rows):
        theta = arrays.get(self.name)
        if theta is not None:
            check_heads_shape(self.name, theta, p.H, (2,), "(H|1, 2)")

    def configure(self, slots, field, spec, p, arrays):
        theta = arrays.get(self.name)
        if theta is not None:
            slots[field["reset_theta"]] = theta    # (H|1, 2), float64 in the binding

    def gradients(self, spec):
        return ((self.name, "reset_theta", lambda p, grad: table_gradient(p, self.name, grad)),)

    def example(self, ctx, spec, values):
        if not ctx.options["wanted"].get(self.name, True):
            return {}
        return {self.name: ctx.normal(ctx.heads, 2)}

    def picture(self, ctx, spec, params):
        value = ctx.draw(self.name, (ctx.H, 2))
        return {} if value is None else {self.name: value}


@dataclass(frozen=True)
class Segments(Term):
    """segment_table[h, segment_q[b, i], segment_k[b, j]]: all three or none (DIET).

    The engine's `segments` term module (csrc/engine/term_segments_impl.h) reads the
    table and the ids in float64 (the ids exactly) and gives the table's gradient per
    (b, h) unit, summed over the batch by the engine (in batch row 0: the table has no
    batch axis), here over the heads a shared table serves."""

    index = ("segment_q", "segment_k")
    query_tensors = ("segment_q",)

    @property
    def tensors(self):
        return ("segment_q", "segment_k", "segment_table")

    def check(self, p, arrays, rows):
        check_segments(arrays.get("segment_q"), arrays.get("segment_k"),
                       arrays.get("segment_table"), p.B, p.H, p.n, p.m)

    def configure(self, slots, field, spec, p, arrays):
        table = arrays.get("segment_table")
        if table is None:
            return
        table = np.ascontiguousarray(table, dtype=np.float64)
        H, S = table.shape[:2]
        slots[field["segments_table"]] = table.reshape(1, H, S * S)
        for name, side in (("segment_q", "query"), ("segment_k", "key")):
            ids = np.ascontiguousarray(arrays[name], dtype=np.float64)
            slots[field["segments_" + side]] = ids.reshape(ids.shape[0], 1, ids.shape[1])

    def gradients(self, spec):
        return (("segment_table", "segments_table",
                 lambda p, grad: table_gradient(p, "segment_table", grad)),)

    def example(self, ctx, spec, values):
        segments = ctx.options["segments"]
        if not segments:
            return {}
        rng = ctx.rng      # contiguous segments, as sentence pairs are laid out
        return {"segment_q": np.sort(rng.integers(0, segments, size=(ctx.B, ctx.n)), axis=1),
                "segment_k": np.sort(rng.integers(0, segments, size=(ctx.B, ctx.m)), axis=1),
                "segment_table": ctx.normal(ctx.heads, segments, segments)}


def table_gradient(p, name: str, grad: np.ndarray) -> np.ndarray:
    """The gradient of the call's table `name` (H|1, ...), a term module's array without a
    batch axis, from the engine's per unit (B, H, L), float64: the engine's sum over the
    batch (batch_summed), here over the heads a shared table serves, in the call's dtype
    and the table's shape."""
    table = p.arrays[name]
    grad = batch_summed(grad)[0]
    if table.shape[0] == 1:
        grad = grad.sum(axis=0, keepdims=True)
    return narrow(grad.reshape(table.shape), p.dtype)


def batch_summed(grad: np.ndarray) -> np.ndarray:
    """A term array's per-unit gradient (B, ...) summed over the batch, keeping the axis:
    the engine's sum, in batch row 0, for an array without a batch axis (posenc_grads,
    csrc/posenc.h); zeros for an empty batch."""
    return grad[:1] if grad.shape[0] else np.zeros((1,) + grad.shape[1:])


def check_segments(segment_q, segment_k, segment_table, B, H, n, m) -> dict:
    """All three or none; ids (B, n), (B, m) of an integer dtype within the (H|1, S, S) table."""
    given = [x is not None for x in (segment_q, segment_k, segment_table)]
    if not any(given):
        return {}
    if not all(given):
        missing = [nm for nm, g in zip(("segment_q", "segment_k", "segment_table"), given) if not g]
        raise ValueError(
            "segments come as all three of segment_q, segment_k, segment_table "
            f"or none of them; missing {', '.join(missing)}")
    for name, value in (("segment_q", segment_q), ("segment_k", segment_k)):
        require_index_array(name, value)
    check_shape("segment_q", segment_q, (B, n), "(B, n)")
    check_shape("segment_k", segment_k, (B, m), "(B, m)")
    check_rank("segment_table", segment_table, 3, "(H|1, S, S)")
    S = segment_table.shape[1]
    check_shape("segment_table", segment_table, ({H, 1}, S, S), "(H|1, S, S)")
    for name, value in (("segment_q", segment_q), ("segment_k", segment_k)):
        check_index_range(name, value, S, "segment id",
                          f"for segment_table of shape {shape_str(segment_table.shape)}")
    return {"segment_q": segment_q, "segment_k": segment_k, "segment_table": segment_table}


def check_index_range(name: str, values: np.ndarray, count: int, what: str, where: str) -> None:
    """Every entry of the integer array `values` in [0, count), else a ValueError
    naming the argument, the first bad value (`what`: segment id, position) and
    what it indexes (`where`)."""
    if values.size:
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi >= count:
            raise ValueError(f"{name} holds {what} {lo if lo < 0 else hi}, outside "
                             f"[0, {count}) {where}")


@dataclass(frozen=True)
class OffsetBias(Term):
    """A bias that is a function of the offset o = j - i' with per-head
    parameters (ALiBi, KERPLE): ``bias[h, o] = value(o, *params[h], **options)``.

    Each parameter is (H|1,).  The engine reads the bias along the n + m - 1
    offsets of the call as its `toeplitz` term module, built per call from the
    parameters; its gradient, the diagonal sums of the logits' gradient, gives
    each parameter's by the chain rule: dL/dparam[h] = sum_o dbias[h, o] *
    d value / d param.

    value(o, *params, **options) and derivatives(o, *params, **options) (one
    array per parameter) take o (1, T) float64 and each parameter (H', 1)
    float64 and broadcast; `options` are the term's own parameters (`params`).
    `init` draws each parameter for examples and pictures: init[name](rng, heads).
    `negative`: the parameters whose sign the term's value follows in reverse
    (ALiBi's slopes: -slope |o|), negated for the error bounds' magnitudes.
    """

    names: tuple
    value: object
    derivatives: object
    init: dict
    params: dict = field(default_factory=dict)
    negative: tuple = ()

    @property
    def tensors(self):
        return tuple(self.names)

    def check(self, p, arrays, rows):
        for name in self.names:
            check_heads_shape(name, arrays[name], p.H, (), "(H|1,)")

    def _inputs(self, p):
        """The call's offsets (1, T) and the parameters (H', 1), in float64, and its options."""
        offsets = (identity_map(p.n, p.m).astype(np.float64) - (p.n - 1) - float(p.query_offset))
        params = [np.asarray(p.arrays[name], dtype=np.float64)[:, None] for name in self.names]
        options = {name: p.params[name] for name in self.params}
        return offsets[None, :], params, options

    def values(self, p) -> np.ndarray:
        """The bias of every diagonal (H', n + m - 1), float64.  The binding rounds it to
        the problem's compute type (a `real` array of csrc/terms.h), float32 for bfloat16
        and float16 (which compute in float32: the bias is not rounded to 16 bits, nor is
        its gradient, float64 per unit)."""
        offsets, params, options = self._inputs(p)
        heads = max(len(x) for x in params)
        with np.errstate(all="ignore"):       # NaN and Inf parameters propagate (SPEC §5)
            value = self.value(offsets, *params, **options)
        return np.ascontiguousarray(np.broadcast_to(value, (heads, offsets.shape[1])),
                                    dtype=np.float64)

    def configure(self, slots, field, spec, p, arrays):
        slots[field["toeplitz_table"]] = self.values(p)
        slots[field["toeplitz_rows"]] = identity_rows(p.n, p.m)

    def gradients(self, spec):
        return tuple((name, "toeplitz_table", functools.partial(self._finish, t))
                     for t, name in enumerate(self.names))

    def _finish(self, t: int, p, dbias: np.ndarray) -> np.ndarray:
        """Parameter t's gradient from the bias's along the offsets, per unit (B, H, n + m
        - 1) (chain rule), folded to its heads."""
        offsets, params, options = self._inputs(p)
        with np.errstate(all="ignore"):       # NaN and Inf propagate (SPEC §5)
            derivative = self.derivatives(offsets, *params, **options)[t]
            grad = (batch_summed(dbias)[0] * derivative).sum(axis=1)
        if len(params[t]) == 1:
            grad = grad.sum(keepdims=True)
        return grad.astype(p.dtype)

    def example(self, ctx, spec, values):
        return {name: np.asarray(self.init[name](ctx.rng, ctx.heads), dtype=ctx.dtype)
                for name in self.names}

    def picture(self, ctx, spec, params):
        return {name: np.asarray(self.init[name](ctx.rng, ctx.H), dtype=np.float64)
                for name in self.names}

    def magnitudes(self, p, values):
        for name in self.negative:          # the bias follows its sign in reverse
            values[name] = -values[name]


@dataclass(frozen=True)
class Rotary(Term):
    """The rotation of q and k (RoPE, xPos), in the engine where they are read
    (SPEC §3.12): tables cos, sin (P, r) (cos_k, sin_k for the keys, both or
    neither), positions_q (B, n) and positions_k (B, m) or the defaults
    query_offset + i and j, `interleaved` pairs.  The (P, r) tables are
    constants: their gradient fields are None.

    Or per token (SPEC §3.16: M-RoPE, 2-D RoPE, learned frequencies): cos, sin
    (B|1, H|1, n, r), query row i's own, and cos_k, sin_k (B|1, H_kv|1, m, r),
    required; no positions.  The engine reads them as its rope_token module
    (csrc/engine/term_rope_token_impl.h: float64 per (b, h) unit, a key head's
    tables repeated for its query heads) and gives their gradients per unit,
    folded here over the batch, the groups and the heads they broadcast over."""

    constant = ("cos", "sin", "cos_k", "sin_k")
    index = ("positions_q", "positions_k")
    query_tensors = ("positions_q",)
    params = {"interleaved": Bool()}
    reads_qk = computes_operands = True

    @property
    def tensors(self):
        return self.constant + self.index

    def trainable(self, name, value):
        return len(value.shape) == 4          # per-token tables have gradients

    @staticmethod
    def per_token(arrays) -> bool:
        """Whether the call's tables are per token (4-D: SPEC §3.16)."""
        return arrays["cos"].ndim == 4

    def _check_per_token(self, p, arrays):
        cos, sin, cos_k, sin_k = (arrays.get(name) for name in self.constant)
        check_rank("cos", cos, 4, "(B|1, H|1, n, r)")
        pairs = cos.shape[3]
        layout = "(B|1, H|1, n, r) per-token tables (spec §3.16)"
        check_shape("cos", cos, ({p.B, 1}, {p.H, 1}, p.n, pairs), layout)
        check_shape("sin", sin, ({p.B, 1}, {p.H, 1}, p.n, pairs), layout + " as cos")
        if cos_k is None or sin_k is None:
            raise ValueError("per-token tables (cos of 4 dimensions) need the keys' own: "
                             f"cos_k and sin_k (B|1, H_kv|1, m, r); missing "
                             f"{' and '.join(n for n, v in (('cos_k', cos_k), ('sin_k', sin_k)) if v is None)}")
        layout_k = "(B|1, H_kv|1, m, r) as cos's r"
        check_shape("cos_k", cos_k, ({p.B, 1}, {p.H_kv, 1}, p.m, pairs), layout_k)
        check_shape("sin_k", sin_k, ({p.B, 1}, {p.H_kv, 1}, p.m, pairs), layout_k)
        for name in self.index:
            if arrays.get(name) is not None:
                raise ValueError(f"{name} goes with (P, r) tables: per-token tables are the "
                                 "tokens' own rows (spec §3.16)")
        if 2 * pairs > p.d:
            raise ValueError(f"cos and sin rotate 2 r = {2 * pairs} dimensions (shape "
                             f"{shape_str(cos.shape)}), more than q's d = {p.d}")

    def check(self, p, arrays, rows):
        if arrays["cos"].ndim == 4:
            return self._check_per_token(p, arrays)
        cos, sin = arrays["cos"], arrays["sin"]
        check_rank("cos", cos, 2, "(P, r)")
        P, pairs = cos.shape
        check_shape("sin", sin, (P, pairs), "(P, r) as cos")
        if 2 * pairs > p.d:
            raise ValueError(f"cos and sin rotate 2 r = {2 * pairs} dimensions (shape "
                             f"{shape_str(cos.shape)} (P, r)), more than q's d = {p.d}")
        cos_k, sin_k = arrays.get("cos_k"), arrays.get("sin_k")
        if (cos_k is None) != (sin_k is None):
            raise ValueError("cos_k and sin_k come together (the keys' tables, xPos), or "
                             f"neither; missing {'cos_k' if cos_k is None else 'sin_k'}")
        if cos_k is not None:
            check_shape("cos_k", cos_k, (P, pairs), "(P, r) as cos")
            check_shape("sin_k", sin_k, (P, pairs), "(P, r) as cos")
        for name, rows_ in (("positions_q", p.n), ("positions_k", p.m)):
            positions = arrays.get(name)
            if positions is None:
                continue
            require_index_array(name, positions)
            check_shape(name, positions, (p.B, rows_), f"(B, {'n' if name[-1] == 'q' else 'm'})")
            check_index_range(name, positions, P, "position",
                              f"of cos and sin {shape_str(cos.shape)} (P, r)")
        if arrays.get("positions_q") is None and p.n and p.query_offset + p.n > P:
            raise ValueError(f"query positions query_offset + i reach {p.query_offset + p.n - 1} "
                             f"(query_offset={p.query_offset}, n={p.n}), outside [0, {P}) of "
                             f"cos and sin {shape_str(cos.shape)} (P, r): longer tables, or "
                             "positions_q")
        if arrays.get("positions_k") is None and p.m > P:
            raise ValueError(f"key positions j reach {p.m - 1}, outside [0, {P}) of cos and sin "
                             f"{shape_str(cos.shape)} (P, r): longer tables, or positions_k")

    def configure(self, slots, field, spec, p, arrays):
        slots[field["rope_interleaved"]] = p.params["interleaved"]
        if self.per_token(arrays):       # the rope_token module's float64 (B|1, H|1, rows r)
            for name in self.constant:
                table = np.asarray(arrays[name], dtype=np.float64)
                if name.endswith("_k") and table.shape[1] != 1 and p.H != p.H_kv:
                    table = np.repeat(table, p.H // p.H_kv, axis=1)   # a key head's per query head
                table = np.ascontiguousarray(table)
                slots[field["rope_token_" + name]] = table.reshape(
                    table.shape[0], table.shape[1], table.shape[2] * table.shape[3])
            return
        for name in self.tensors:
            slots[field[name if name.startswith("positions") else "rope_" + name]] = \
                arrays.get(name)

    def gradients(self, spec):
        return tuple((name, "rope_token_" + name, functools.partial(self._finish, name))
                     for name in self.constant)

    # the engine's table gradients are formed from dq and dk (rope_impl.h)
    grad_requires = {"rope_token_cos": "q", "rope_token_sin": "q", "rope_token_cos_k": "k",
                     "rope_token_sin_k": "k"}

    @staticmethod
    def _finish(name: str, p, grad: np.ndarray) -> np.ndarray:
        """A per-token table's gradient from the engine's per unit (B, H, rows r): summed
        over the query heads of a key head's group (cos_k, sin_k), then over the batch
        and heads its table broadcasts over, in the call's dtype."""
        table = p.arrays[name]
        B, H = grad.shape[:2]
        grad = grad.reshape(B, H, table.shape[2], table.shape[3])
        if name.endswith("_k") and p.H_kv != H:
            grad = grad.reshape(B, p.H_kv, H // p.H_kv, *grad.shape[2:]).sum(axis=2)
        if table.shape[0] == 1:   # the engine's sum over the batch, in batch row 0
            grad = batch_summed(grad)
        return narrow(Rotary._fold(grad, table), p.dtype)

    def example(self, ctx, spec, values):
        from .rotary import rope_tables

        positions = ctx.n + ctx.m + 8     # query_offset up to m + 8 in the default positions
        pairs = ctx.options["rotary_dim"] // 2 if ctx.options["rotary_dim"] else ctx.d // 2
        cos, sin = rope_tables(positions, 2 * pairs, dtype=np.float64) if pairs else (
            np.ones((positions, 0)), np.zeros((positions, 0)))
        if ctx.options["rope_per_token"]:    # spec §3.16: rows of their own
            queries = np.arange(ctx.heads * ctx.n).reshape(1, ctx.heads, ctx.n) % positions
            keys = (np.arange(ctx.m)[None, None] + 3 * np.arange(ctx.B)[:, None, None]) % positions
            return {"cos": cos[queries].astype(ctx.dtype), "sin": sin[queries].astype(ctx.dtype),
                    "cos_k": cos[keys].astype(ctx.dtype), "sin_k": sin[keys].astype(ctx.dtype)}
        return {"cos": cos.astype(ctx.dtype), "sin": sin.astype(ctx.dtype)}

    def picture(self, ctx, spec, params):
        """The default tables, and q = k = 1 in every head: the rotation's own pattern,
        s sum_t 2 cos((j - i) theta_t) - s d, which decays with the distance (RoFormer
        §3.4.3); random q, k would show mostly themselves."""
        from .rotary import rope_tables

        cos, sin = rope_tables(ctx.n, 2 * (ctx.d // 2), dtype=np.float64)
        ones = np.ones((ctx.H, ctx.n, ctx.d))
        return {"cos": cos, "sin": sin, "q": ones, "k": ones}

    @staticmethod
    def _pairs(p) -> tuple:
        """(first, second): the indices of each rotated pair's two components, (t, t + r)
        or, interleaved, (2t, 2t + 1)."""
        pairs = p.arrays["cos"].shape[-1]
        first = np.arange(pairs) * 2 if p.params["interleaved"] else np.arange(pairs)
        return first, first + 1 if p.params["interleaved"] else first + pairs

    @staticmethod
    def _fold(grad: np.ndarray, table: np.ndarray) -> np.ndarray:
        """A (B, H, ...) per-token table's gradient (or its bound) summed over the batch
        and head axes `table` broadcasts over (size 1)."""
        if table.shape[0] == 1:
            grad = grad.sum(axis=0, keepdims=True)
        if table.shape[1] == 1:
            grad = grad.sum(axis=1, keepdims=True)
        return grad

    @staticmethod
    def _absolute_rotation(p, side: str, x: np.ndarray) -> np.ndarray:
        """x (B, H, L, d) >= 0 rotated in absolute values by the tables of `side` (q or
        k): |c| x_a + |s| x_b on both of a pair (the bound of either rotated
        component, and of either component of the rotation's transpose)."""
        first, second = Rotary._pairs(p)
        key = side == "k" and p.arrays.get("cos_k") is not None
        cos = np.abs(np.asarray(p.arrays["cos_k" if key else "cos"], dtype=np.float64))
        sin = np.abs(np.asarray(p.arrays["sin_k" if key else "sin"], dtype=np.float64))
        if cos.ndim == 4:           # per token: the rows themselves
            c, s = cos, sin
        else:
            given = p.arrays.get("positions_" + side)
            positions = (np.asarray(given, dtype=np.intp)[:, None, :] if given is not None else
                         np.arange(x.shape[2]) + (p.query_offset if side == "q" else 0))
            c, s = cos[positions], sin[positions]
        y = x.copy()
        y[..., first] = x[..., first] * c + x[..., second] * s
        y[..., second] = x[..., second] * c + x[..., first] * s
        return y

    def magnitudes(self, p, values):
        """q and k rotated in absolute values, and the tables then the identity (cos
        1, sin 0): the logits are M of the rotated dot products."""
        for side in ("q", "k"):
            values[side] = self._absolute_rotation(p, side, values[side])
        for name in ("cos", "sin", "cos_k", "sin_k"):
            if name in values:
                values[name] = np.full_like(values[name], name.startswith("cos"))

    def grad_magnitudes(self, p, grads, weights):
        """dq and dk taken back through the rotation's transpose, in absolute values;
        per-token tables' from them before (the rotated rows' gradient G: c gets
        G_a |x_a| + G_b |x_b|, and so does s), reduced as each table broadcasts."""
        if self.per_token(p.arrays):
            first, second = self._pairs(p)
            for side, suffix in (("q", ""), ("k", "_k")):
                if grads.get(side) is None:
                    continue
                x = np.abs(np.asarray(p.arrays[side], dtype=np.float64))
                g = grads[side]
                bound = g[..., first] * x[..., first] + g[..., second] * x[..., second]
                for name in ("cos" + suffix, "sin" + suffix):
                    if grads.get(name) is not None:
                        grads[name] = self._fold(bound, p.arrays[name])
        for side in ("q", "k"):
            if grads.get(side) is not None:
                grads[side] = self._absolute_rotation(p, side, grads[side])


@dataclass(frozen=True)
class ForgetGates(Term):
    """The Forgetting Transformer's data-dependent decay (FoX, SPEC §3.17), the
    engine's `fox` term module (csrc/engine/term_fox_impl.h): log forget gates
    (B, H|1, m) over the keys, and optionally the reverse direction's (the
    bidirectional form).  D_ij is the sum of the gates strictly after j up to i'
    (j <= i'), or of the reverse gates after i' up to j (j > i'); every query is
    among the keys (query_offset + n <= m).

    The engine reads the gates in float64 with their prefix sums when every gate
    is finite (a row constant minus a key vector: nothing of n x m is formed;
    a difference of prefix sums is not the sum where a gate is Inf or NaN).
    Its gradients are the gates' per (b, h) unit, summed here over the heads a
    shared gate serves."""

    name: str = "log_fgate"
    reverse: str = "log_fgate_reverse"
    queries_among_keys = True
    head_axis = 1

    @property
    def tensors(self):
        return (self.name, self.reverse)

    def check(self, p, arrays, rows):
        for name in self.tensors:
            gates = arrays.get(name)
            if gates is None:
                continue
            shape = gates.shape
            if len(shape) != 3 or shape[0] != p.B or shape[2] != p.m or \
                    (shape[1] != p.H and shape[1] != 1):
                check_shape(name, gates, (p.B, {p.H, 1}, p.m), "(B, H|1, m)")
        if p.n and p.query_offset + p.n > p.m:
            raise ValueError(
                f"fox needs every query among the keys: query_offset + n = "
                f"{p.query_offset} + {p.n} > m = {p.m} (FoX's decay sums the keys' gates "
                "between a key and the query's own position)")

    def configure(self, slots, field, spec, p, arrays):
        for name, slot in ((self.name, "fox_gates"), (self.reverse, "fox_gates_reverse")):
            gates = arrays.get(name)
            if gates is None:
                continue
            gates = np.ascontiguousarray(gates, dtype=np.float64)
            slots[field[slot]] = gates
            if np.isfinite(gates).all():
                slots[field[slot.replace("gates", "cum")]] = np.cumsum(gates, axis=2)

    def gradients(self, spec):
        return ((self.name, "fox_gates", functools.partial(self._finish, self.name)),
                (self.reverse, "fox_gates_reverse", functools.partial(self._finish, self.reverse)))

    @staticmethod
    def _finish(name: str, p, grad: np.ndarray) -> np.ndarray:
        """The gates' gradient from the engine's per unit (B, H, m), float64: summed
        over the heads a shared gate serves, in the call's dtype."""
        if p.arrays[name].shape[1] == 1:
            grad = grad.sum(axis=1, keepdims=True)
        return narrow(grad, p.dtype)

    def example(self, ctx, spec, values):
        # FoX's gates: log sigmoid of a linear map of the input (forget gates near 1)
        def gates():
            x = ctx.rng.standard_normal((ctx.B, ctx.heads, ctx.m)) + 2.0
            return (-np.logaddexp(0.0, -x)).astype(ctx.dtype)
        drawn = {self.name: gates()}
        if ctx.options["wanted"].get(self.reverse, True):
            drawn[self.reverse] = gates()
        return drawn

    def picture(self, ctx, spec, params):
        """One sequence's gates per head (a picture is of one batch row)."""
        x = ctx.rng.standard_normal((1, ctx.H, ctx.n)) + 3.0
        return {self.name: -np.logaddexp(0.0, -x)}


def _grid(count: int, width: int, start: int = 0) -> np.ndarray:
    """(count, 2) coordinates (y, x) of tokens start, start + 1, ... of a raster of `width`."""
    t = np.arange(start, start + count)
    return np.stack([t // width, t % width], axis=-1)


@dataclass(frozen=True)
class Grid2D(Term):
    """A 2-D relative position bias (Swin, BEiT; SPEC §3.19), the engine's
    `relative_bias_2d` term module (csrc/engine/term_relative_bias_2d_impl.h):
    tokens at integer coordinates (y, x) (coords_q (B|1, n, 2), coords_k
    (B|1, m, 2)), (-1, -1) a global token (BEiT's [CLS]); the bias of a pair is
    bias[h, (dy + t_y)(2 t_x + 1) + dx + t_x], dy, dx the key's coordinates minus
    the query's clipped to max_distance (t_y, t_x); bucket T, T + 1, T + 2 for a
    global query, a global key, both (T = (2 t_y + 1)(2 t_x + 1)).

    The engine reads the table and the coordinates in float64 (the coordinates
    exactly: integers below 2^30) and gives the table's gradient per (b, h)
    unit, summed here over the batch and the heads a shared table serves."""

    name: str = "bias"
    index = ("coords_q", "coords_k")
    query_tensors = ("coords_q",)
    params = {"max_distance": IntPair()}

    @property
    def tensors(self):
        return (self.name,) + self.index

    @staticmethod
    def buckets(max_distance) -> int:
        """T = (2 t_y + 1)(2 t_x + 1): the table's entries for ordinary tokens."""
        ty, tx = max_distance
        return (2 * ty + 1) * (2 * tx + 1)

    @staticmethod
    def _global(name: str, coords: np.ndarray) -> np.ndarray:
        """Which tokens are global ((-1, -1)); a ValueError naming any other negative
        coordinate or one past 2^30."""
        negative = coords < 0
        is_global = (coords == -1).all(axis=-1)
        bad = (negative.any(axis=-1) & ~is_global) | (coords >= 2 ** 30).any(axis=-1)
        if bad.any():
            b, t = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(f"{name}[{b}, {t}] = {tuple(int(c) for c in coords[b, t])}: a "
                             "coordinate is an integer in [0, 2**30), or (-1, -1) for a global "
                             "token")
        return is_global

    def check(self, p, arrays, rows):
        T = self.buckets(p.params["max_distance"])
        any_global = False
        for name, count, letter in (("coords_q", p.n, "n"), ("coords_k", p.m, "m")):
            coords = require_index_array(name, arrays[name])
            if coords.ndim != 3 or coords.shape[0] not in (p.B, 1) or \
                    coords.shape[1:] != (count, 2):
                check_shape(name, coords, ({p.B, 1}, count, 2), f"(B|1, {letter}, 2)")
            any_global |= bool(self._global(name, coords).any())
        bias = arrays[self.name]
        lengths = {T + 3} if any_global else {T, T + 3}
        if bias.ndim != 2 or bias.shape[0] not in (p.H, 1) or bias.shape[1] not in lengths:
            layout = ("(H|1, T + 3): a global token's buckets are T .. T + 2" if any_global else
                      "(H|1, T) or (H|1, T + 3)")
            check_shape(self.name, bias, ({p.H, 1}, lengths),
                        f"{layout}, T = (2 t_y + 1)(2 t_x + 1) = {T} for max_distance "
                        f"{p.params['max_distance']}")

    def configure(self, slots, field, spec, p, arrays):
        bias = np.ascontiguousarray(arrays[self.name], dtype=np.float64)
        slots[field["relative_bias_2d_bias"]] = bias[None]
        for name in self.index:
            coords = np.ascontiguousarray(arrays[name], dtype=np.float64)
            slots[field["relative_bias_2d_" + name]] = coords.reshape(coords.shape[0], 1,
                                                                      2 * coords.shape[1])
        slots[field["relative_bias_2d_distance"]] = np.asarray(
            p.params["max_distance"], dtype=np.float64).reshape(1, 1, 2)

    def gradients(self, spec):
        return ((self.name, "relative_bias_2d_bias",
                 lambda p, grad: table_gradient(p, self.name, grad)),)

    def example(self, ctx, spec, values):
        """Rasters of a width per batch (about sqrt(m)), the queries at the last n keys'
        places; batch 0's first token global on both sides, batch 1's keys shuffled (runs
        of one key); max_distance (t, t - 1), t from make_inputs' max_distance."""
        t = ctx.options["max_distance"]
        distance = (t, max(0, t - 1))
        width = max(1, int(np.ceil(np.sqrt(max(ctx.m, 1)))))
        coords_q = np.zeros((ctx.B, ctx.n, 2), dtype=np.int64)
        coords_k = np.zeros((ctx.B, ctx.m, 2), dtype=np.int64)
        for b in range(ctx.B):
            coords_q[b] = _grid(ctx.n, width + b, max(ctx.m - ctx.n, 0))
            coords_k[b] = _grid(ctx.m, width + b)
        if ctx.B and ctx.n > 1 and ctx.m > 1:
            coords_q[0, 0] = coords_k[0, 0] = -1
        if ctx.B > 1:
            coords_k[1] = coords_k[1][ctx.rng.permutation(ctx.m)]
        return {self.name: ctx.normal(ctx.heads, self.buckets(distance) + 3),
                "coords_q": coords_q, "coords_k": coords_k, "max_distance": distance}

    def picture(self, ctx, spec, params):
        """n tokens on a square-ish raster (rows of ceil(sqrt(n))), the distance its width."""
        width = max(1, int(np.ceil(np.sqrt(ctx.n))))
        distance = (width - 1, width - 1)
        coords = _grid(ctx.n, width)[None]
        bias = ctx.draw(self.name, (ctx.H, self.buckets(distance)))
        return {self.name: bias, "coords_q": coords, "coords_k": coords, "max_distance": distance}


@dataclass(frozen=True)
class ContextualPositions(Term):
    """Contextual position encoding (CoPE, SPEC §3.18), the engine's `cope` term
    module (csrc/engine/term_cope_impl.h): the position of key j from query i is the
    sum of the gates sigmoid(s q_i.k_t) over the keys t >= j that row i sees (the
    logits' `causal`, or a fused attention's masks), clamped to P - 1, and the term
    interpolates q_i . pos_emb between the two rows around it.  pos_emb (P, d) shared
    by the heads, or (H|1, P, d); P >= 1.

    The term reads the content logits: it goes with nothing else.  The engine reads
    pos_emb in float64 and gives its gradient per (b, h) unit, summed here over
    the batch and the heads it serves."""

    name: str = "pos_emb"
    params = {"causal": Bool()}
    reads_qk = True
    reads_mask = True

    @property
    def tensors(self):
        return (self.name,)

    @property
    def depth_tensors(self):
        return (self.name,)

    def check(self, p, arrays, rows):
        table = arrays[self.name]
        shape = table.shape
        if table.ndim not in (2, 3) or shape[-1] != p.d or shape[-2] < 1 or \
                (table.ndim == 3 and shape[0] not in (p.H, 1)):
            raise ValueError(f"{self.name} must have shape (P, d) or (H|1, P, d) = (P, {p.d}) "
                             f"or ({p.H}|1, P, {p.d}), P >= 1 positions, got {shape_str(shape)}")
        if shape[-2] > 2 ** 30:
            raise ValueError(f"{self.name} has {shape[-2]} positions: at most 2**30")

    @staticmethod
    def _table(value):
        """pos_emb as (H|1, P, d)."""
        return value[None] if value.ndim == 2 else value

    def configure(self, slots, field, spec, p, arrays):
        table = np.ascontiguousarray(self._table(arrays[self.name]), dtype=np.float64)
        heads, P = table.shape[0], table.shape[1]
        slots[field["cope_pos_emb"]] = table.reshape(1, heads, P * p.d)
        slots[field["cope_shape"]] = np.array([P, float(p.params["causal"])]).reshape(1, 1, 2)

    def gradients(self, spec):
        return ((self.name, "cope_pos_emb", self._finish),)

    def _finish(self, p, grad: np.ndarray) -> np.ndarray:
        """pos_emb's gradient from the engine's per unit (B, H, P d), float64, summed over
        the batch by the engine (in batch row 0: the table has no batch axis), here over
        the heads a shared table serves, in pos_emb's shape and the call's dtype."""
        table = p.arrays[self.name]
        grad = batch_summed(grad)[0]
        if table.ndim == 2 or table.shape[0] == 1:
            grad = grad.sum(axis=0, keepdims=True)
        return narrow(grad.reshape(table.shape), p.dtype)

    @staticmethod
    def positions(m: int) -> int:
        """The examples' P: about a third of the keys (random gates average 1/2: the
        early keys' positions clamp)."""
        return max(1, (m + 2) // 3)

    def example(self, ctx, spec, values):
        return {self.name: ctx.normal(ctx.heads, self.positions(ctx.m), ctx.d)}

    def picture(self, ctx, spec, params):
        table = ctx.draw(self.name, (ctx.H, self.positions(ctx.n), ctx.d))
        return {} if table is None else {self.name: table}

    def magnitudes(self, p, values):
        """|e| is at most the largest |q_i . pos_emb[t]| over t, whatever the positions:
        each row of |pos_emb| replaced by the largest of its column."""
        table = values[self.name]
        values[self.name] = np.broadcast_to(table.max(axis=-2, keepdims=True), table.shape).copy()

    def grad_magnitudes(self, p, grads, weights):
        """pos_emb's rows: the magnitudes' positions are not the call's, so each row gets
        what every position gives (the sum over the rows).  The gates' path, which the
        magnitudes' constant projections leave out: dZ_ij gains g (1 - g) sum_{j' <= j}
        W_ij' (qe[ceil] - qe[floor]), at most W_i = (1/2) max_t |q_i . pos_emb[t]| sum_j
        W_ij (g (1 - g) <= 1/4), so dq_i gains s W_i sum_j |k_j| and dk_j s sum_i W_i |q_i|."""
        if grads.get(self.name) is not None:
            total = grads[self.name].sum(axis=-2, keepdims=True)
            grads[self.name] = np.broadcast_to(total, grads[self.name].shape).copy()
        table = np.abs(np.asarray(p.arrays[self.name], dtype=np.float64))
        q = np.abs(np.asarray(p.arrays["q"], dtype=np.float64))
        k = np.abs(np.asarray(p.arrays["k"], dtype=np.float64))
        group = p.H // p.H_kv if p.H_kv else 1
        peak = np.broadcast_to(table.max(axis=-2), (p.H, p.d) if table.ndim == 3
                               else (1, p.d))                                   # (H|1, d)
        row = 0.5 * np.einsum("bhid,hd->bhi", q, np.broadcast_to(peak, (p.H, p.d))) * \
            np.asarray(weights, dtype=np.float64).sum(axis=-1)                  # (B, H, n)
        s = abs(p.scale)
        k_heads = np.repeat(k, group, axis=1)                                  # (B, H, m, d)
        if grads.get("q") is not None:
            grads["q"] = grads["q"] + s * row[..., None] * k_heads.sum(axis=2)[:, :, None]
        if grads.get("k") is not None:
            extra = s * np.einsum("bhi,bhid->bhd", row, q)[:, :, None]          # (B, H, 1, d)
            extra = np.broadcast_to(extra, k_heads.shape)
            grads["k"] = grads["k"] + extra.reshape(p.B, p.H_kv, group, p.m, p.d).sum(axis=2)
