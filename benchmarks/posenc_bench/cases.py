"""What the benchmark runs: realistic inputs per method, their FLOP counts and
the memory a peer needs (to shrink or skip it before it runs out of memory).

Per-method facts (FLOP terms, eager peaks, target groups, shared tables) come
from the method registry; this module adds only the benchmark's parameters.
Kept free of torch so the NumPy-only subprocesses of the suite can import it.
"""

from __future__ import annotations

import numpy as np

from posenc._examples import make_inputs
from posenc._registry import (METHODS, REGISTRY, ContextualPositions, Grid2D, KeyTable,
                              QueryTable)

# Parameters at benchmark sizes, per bucket map, as the papers' models use them.
MAP_PARAMETERS = {
    "clipped": {"max_distance": 128},            # Shaw / M2 / M4 / M4M: 2t+1 = 257 rows
    "clipped_reversed": {"max_distance": 128},   # DIET-REL
    "t5": {"num_buckets": 32, "max_distance": 128},                      # T5, TUPE-R
    "deberta": {"att_span": 256, "position_buckets": 256,                # DeBERTa-v3
                "max_relative_positions": 512},
}
SEGMENTS = 2                        # DIET: sentence pairs


def _bench(method: str):
    return REGISTRY[method].bench


def _group(name: str) -> tuple:
    return tuple(m for m in METHODS if _bench(m).group == name)


ADDITIVE = _group("additive")       # target: forward within 1.15x of content
HEAVY = _group("heavy")             # target: >= 3x over eager
MEMORY_METHODS = tuple(m for m in METHODS if _bench(m).memory)   # target: peak < 2x the logits


def case_inputs(method: str, B: int, H: int, n: int, m: int, d: int, seed: int = 0):
    """(args, kwargs) of posenc.<method> in float32 with the parameters above."""
    spec = REGISTRY[method]
    args, kwargs = make_inputs(
        method, B, H, n, m, d, dtype=np.float32, rng=np.random.default_rng(seed),
        max_distance=MAP_PARAMETERS["clipped"]["max_distance"],
        num_buckets=MAP_PARAMETERS["t5"]["num_buckets"],
        t5_max_distance=MAP_PARAMETERS["t5"]["max_distance"],
        att_span=MAP_PARAMETERS["deberta"]["att_span"], segments=SEGMENTS,
        shared=_bench(method).shared_table, d_p=d, theta=True, bias=True)
    kwargs.update(MAP_PARAMETERS.get(spec.bucket, {}))   # whatever make_inputs' defaults
    if spec.term(Grid2D):
        args, kwargs = _vit_grid(args, kwargs, n, m, seed)
    if spec.term(ContextualPositions):
        args = args[:2] + [np.random.default_rng(seed + 2).standard_normal(
            (COPE_POSITIONS, d)).astype(np.float32)]
    return args, kwargs


# CoPE's table: P rows shared by the heads, as the paper's and x-transformers' CoPE
COPE_POSITIONS = 64


def _vit_grid(args, kwargs, n: int, m: int, seed: int):
    """A 2-D bias as a ViT's (BEiT's, Swin's in one window): the m keys on a raster of
    ceil(sqrt(m)) columns, the queries at the last n keys' places, every offset its own
    bucket (max_distance = (rows - 1, cols - 1)), a table per head, no global token."""
    cols = max(1, int(np.ceil(np.sqrt(max(m, 1)))))
    rows = max(1, -(-m // cols))
    t = np.arange(m)
    coords_k = np.stack([t // cols, t % cols], axis=-1)[None]
    distance = (rows - 1, cols - 1)
    buckets = (2 * rows - 1) * (2 * cols - 1)
    heads = args[0].shape[1]
    bias = np.random.default_rng(seed + 2).standard_normal((heads, buckets)).astype(np.float32)
    return [args[0], args[1], bias], dict(kwargs, coords_q=coords_k[:, max(m - n, 0):][:, :n],
                                          coords_k=coords_k, max_distance=distance)


def describe(method: str) -> str:
    """The case's parameters in words, read off case_inputs: every argument after
    q, k with its shape (B, H, n, m, d named), then the map's parameters and s."""
    probe = {3: "B", 5: "H", 11: "n", 13: "m", 7: "d"}      # sizes nothing else has
    B, H, n, m, d = probe
    args, kwargs = case_inputs(method, B, H, n, m, d)
    spec = REGISTRY[method]
    given = dict(zip(spec.tensors, args), **kwargs)
    parts = []
    for name in spec.tensors[2:]:
        if name in given:
            shape = ", ".join(probe.get(size, str(size)) for size in given[name].shape)
            shared = (" shared by the heads" if given[name].shape[0] == 1 and
                      name not in spec.index else "")
            parts.append(f"{name} ({shape}){shared}")
    defaults = dict(spec.params)
    parts += [f"{name}={kwargs.get(name, defaults[name])}" for name in spec.map_params]
    parts += [f"{name}={kwargs[name]}" for name, _ in spec.params[:-2]
              if name not in spec.map_params and name in kwargs]      # a term's (a grid's distance)
    parts.append(f"s = {spec.scale_text}")
    return ", ".join(parts)


def parameters() -> dict:
    """method -> describe(method), for the report."""
    return {method: describe(method) for method in METHODS}


def upstream_gradient(B: int, H: int, n: int, m: int, seed: int = 1) -> np.ndarray:
    """G (B, H, n, m) float32, uniform in [-0.5, 0.5): written in place, no float64 temporary."""
    G = np.empty((B, H, n, m), dtype=np.float32)
    np.random.default_rng(seed).random(out=G, dtype=np.float32)
    G -= np.float32(0.5)
    return G


def logits_bytes(B, H, n, m, itemsize=4) -> int:
    return B * H * n * m * itemsize


def shape_text(shape) -> str:
    B, H, n, m, d = shape
    return f"B={B} H={H} n={n} m={m} d={d}"


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


# ------------------------------------------------------------------ FLOP counts

def _vector_tables(method: str) -> int:
    """How many (rows, d) tables q or k are projected on (Shaw 1, M4 2, DeBERTa 2)."""
    return len(REGISTRY[method].term(QueryTable)) + len(REGISTRY[method].term(KeyTable))


def _table_rows(method: str, n: int, m: int) -> int:
    """Table rows a method's map can reach: never more than the n+m-1 offsets."""
    spec = REGISTRY[method]
    if spec.map is None:
        return 0
    return min(spec.map.rows({"bidirectional": True, **MAP_PARAMETERS[spec.bucket]}), n + m - 1)


FLOP_LEGEND = (
    "Counted for the minimal (project-then-gather) algorithm, 2 FLOPs per multiply-add, "
    "1 per element-wise op; the same count is used for every implementation, so GFLOP/s "
    "is useful work per second. N = B·H·n·m logits; C = 2·N·d (one q·kᵀ contraction); "
    "P_q = 2·B·H·n·R·d and P_k = 2·B·H·m·R·d (q or k projected on the R table rows a "
    "vector table can reach, R = min(rows, n+m-1): 257 for max_distance 128, 512 for "
    "DeBERTa's 2·att_span); D = 2·H·n·m·d_p (a dense per-head positional factor "
    "pos_q·pos_kᵀ, computed once per head). Backward = the gradients of every float input.")

FLOP_FORMULAS = {method: _bench(method).flop_text for method in METHODS}   # (fwd, bwd)


def flops(method: str, direction: str, B: int, H: int, n: int, m: int, d: int) -> float:
    """FLOPs of one forward ('fwd') or backward ('bwd') call, by FLOP_FORMULAS."""
    N = B * H * n * m
    R = _table_rows(method, n, m)
    terms = (2.0 * N * d, 2.0 * B * H * n * R * d, 2.0 * B * H * m * R * d,
             2.0 * H * n * m * d, float(N))
    coefficients = _bench(method).flops[0 if direction == "fwd" else 1]
    return sum(c * t for c, t in zip(coefficients, terms))


# ------------------------------------------------------------------ memory estimates

def peer_bytes(method: str, impl: str, B: int, H: int, n: int, m: int, d: int) -> int:
    """Estimated peak bytes of one implementation's forward+backward, G included.

    The PyTorch eager formula's peak above its inputs and G is the registry's
    eager_peak (L, V, P), as multiples of: the logits L = 4·B·H·n·m bytes; one
    gathered (n, m, d) float32 relative tensor V (shared table); a per-head
    (H, n, m) float32 table P.  Fitted to ru_maxrss at B ∈ {1, 8}, H = 12,
    n = m = 512, d = 64 on torch 2.13, then taken 1.5x larger: they only decide
    whether to shrink B·H or skip."""
    L = logits_bytes(B, H, n, m)
    if impl.startswith("posenc"):
        return 2 * L                          # the logits, G (workspace is O((n+m)·rows))
    if impl == "reference":                   # float64 throughout, (H, n, m, d) gathers
        vectors = H * n * m * d * 8 * (6 if _vector_tables(method) else 0)
        return 8 * L + vectors
    in_L, in_V, in_P = _bench(method).eager_peak
    V = n * m * d * 4
    P = H * n * m * 4
    return int((1 + in_L) * L + in_V * V + in_P * P + 8 * n * m)   # + G, + the int64 index


def shrink_ladder(B: int, H: int):
    """Smaller (B, H) to try, largest first: halve B down to 1, then H."""
    b, h = B, H
    while b > 1:
        b = max(1, b // 2)
        yield b, h
    while h > 1:
        h = max(1, h // 2)
        yield b, h


def fit_shape(method: str, impl: str, B: int, H: int, n: int, m: int, d: int, budget: float):
    """(B, H) at which `impl` fits in `budget` bytes, the same or shrunk; None if none does."""
    if peer_bytes(method, impl, B, H, n, m, d) <= budget:
        return B, H
    for b, h in shrink_ladder(B, H):
        if peer_bytes(method, impl, b, h, n, m, d) <= budget:
            return b, h
    return None
