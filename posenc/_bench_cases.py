"""What the benchmark runs: realistic inputs per method, their FLOP counts and
the memory a peer needs (to shrink or skip it before it runs out of memory).

Kept free of torch so the NumPy-only subprocesses of the suite can import it.
"""

from __future__ import annotations

import numpy as np

from ._examples import make_inputs

METHODS = ("content", "shaw", "t5", "m2", "m4", "m4m", "deberta", "tupe", "diet_abs", "diet_rel")

# Parameters at benchmark sizes, as the papers' models use them.
MAX_DISTANCE = 128                  # Shaw / M2 / M4 / M4M / DIET-REL clip: 2t+1 = 257 rows
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128
DEBERTA = dict(att_span=256, position_buckets=256, max_relative_positions=512)   # DeBERTa-v3
SEGMENTS = 2                        # DIET: sentence pairs
# one rel_k for all heads, as Shaw et al. 2018 (§3.1) and HF BERT relative_key do
SHARED_TABLE = ("shaw", "m4", "m4m")

PARAMETERS = {
    "content": "s = 1/sqrt(d)",
    "shaw": f"rel_k (1, {2 * MAX_DISTANCE + 1}, d) shared by the heads, "
            f"max_distance={MAX_DISTANCE}",
    "t5": f"bias (H, {T5_BUCKETS}), num_buckets={T5_BUCKETS}, max_distance={T5_MAX_DISTANCE}, "
          "bidirectional, s = 1",
    "m2": f"rel (H, {2 * MAX_DISTANCE + 1}), max_distance={MAX_DISTANCE}",
    "m4": f"rel_k (1, {2 * MAX_DISTANCE + 1}, d) shared by the heads, max_distance={MAX_DISTANCE}",
    "m4m": f"rel_k (1, {2 * MAX_DISTANCE + 1}, d) shared by the heads, max_distance={MAX_DISTANCE}",
    "deberta": f"pos_key, pos_query (H, {2 * DEBERTA['att_span']}, d), "
               f"att_span={DEBERTA['att_span']}, position_buckets={DEBERTA['position_buckets']}, "
               f"max_relative_positions={DEBERTA['max_relative_positions']} (DeBERTa-v3)",
    "tupe": f"TUPE-R: pos_q, pos_k (H, n|m, d_p=d), bias (H, {T5_BUCKETS}) with T5 buckets "
            f"(max_distance={T5_MAX_DISTANCE}), theta (H, 2) [CLS] reset",
    "diet_abs": f"pos_q, pos_k (H, n|m, d_p=d), {SEGMENTS} segments (segment_table (H, 2, 2))",
    "diet_rel": f"rel (H, {2 * MAX_DISTANCE + 1}), max_distance={MAX_DISTANCE}, "
                f"{SEGMENTS} segments (segment_table (H, 2, 2))",
}

ADDITIVE = ("t5", "diet_abs", "diet_rel", "tupe")          # issue 3: within 1.15x of content
HEAVY = ("shaw", "m4", "m4m", "deberta")                   # issue 3: >= 3x over eager
MEMORY_METHODS = ("shaw", "m4", "m4m", "deberta")          # issue 3: peak < 2x the logits


def case_inputs(method: str, B: int, H: int, n: int, m: int, d: int, seed: int = 0):
    """(args, kwargs) of posenc.<method> in float32 with the parameters above."""
    rng = np.random.default_rng(seed)
    common = dict(dtype=np.float32, rng=rng, max_distance=MAX_DISTANCE,
                  num_buckets=T5_BUCKETS, t5_max_distance=T5_MAX_DISTANCE, segments=SEGMENTS,
                  shared=method in SHARED_TABLE, d_p=d, theta=True, bias=True)
    args, kwargs = make_inputs(method, B, H, n, m, d, **common)
    if method == "deberta":      # make_inputs has a small fixed span; use DeBERTa-v3's
        rows = 2 * DEBERTA["att_span"]
        args = [args[0], args[1],
                rng.standard_normal((H, rows, d), dtype=np.float32),
                rng.standard_normal((H, rows, d), dtype=np.float32)]
        kwargs = dict(DEBERTA)
    return args, kwargs


def upstream_gradient(B: int, H: int, n: int, m: int, seed: int = 1) -> np.ndarray:
    """G (B, H, n, m) float32, uniform in [-0.5, 0.5): written in place, no float64 temporary."""
    G = np.empty((B, H, n, m), dtype=np.float32)
    np.random.default_rng(seed).random(out=G, dtype=np.float32)
    G -= np.float32(0.5)
    return G


def logits_bytes(B, H, n, m, itemsize=4) -> int:
    return B * H * n * m * itemsize


# ------------------------------------------------------------------ FLOP counts

def _table_rows(method: str, n: int, m: int) -> int:
    """Table rows a vector-table method can touch: never more than the n+m-1 offsets."""
    rows = 2 * DEBERTA["att_span"] if method == "deberta" else 2 * MAX_DISTANCE + 1
    return min(rows, n + m - 1)


FLOP_LEGEND = (
    "Counted for the minimal (project-then-gather) algorithm, 2 FLOPs per multiply-add, "
    "1 per element-wise op; the same count is used for every implementation, so GFLOP/s "
    "is useful work per second. N = B·H·n·m logits; C = 2·N·d (one q·kᵀ contraction); "
    "P_q = 2·B·H·n·R·d and P_k = 2·B·H·m·R·d (q or k projected on the R table rows a "
    "vector table can reach, R = min(rows, n+m-1): 257 for max_distance 128, 512 for "
    "DeBERTa's 2·att_span); D = 2·H·n·m·d_p (a dense per-head positional factor "
    "pos_q·pos_kᵀ, computed once per head). Backward = the gradients of every float input.")

FLOP_FORMULAS = {   # method: (forward, backward)
    "content": ("C + N", "2C + N"),
    "shaw": ("C + P_q + 2N", "2C + 2P_q + 2N"),
    "t5": ("C + 2N", "2C + 2N"),
    "m2": ("C + 2N", "3C + 3N  (q·k recomputed for the table gradient)"),
    "m4": ("C + P_q + P_k + 3N", "2C + 2P_q + 2P_k + 3N"),
    "m4m": ("C + P_q + P_k + 3N", "3C + 3P_q + 3P_k + 6N  (all three factors recomputed)"),
    "deberta": ("C + P_q + P_k + 3N", "2C + 2P_q + 2P_k + 3N"),
    "tupe": ("C + D + 3N", "2C + 2D + 3N"),
    "diet_abs": ("C + D + 2N", "2C + 2D + 2N"),
    "diet_rel": ("C + 3N", "2C + 3N"),
}

_FLOP_TERMS = {   # method: (forward (C, P_q, P_k, D, N), backward (...)) coefficients
    "content": ((1, 0, 0, 0, 1), (2, 0, 0, 0, 1)),
    "shaw": ((1, 1, 0, 0, 2), (2, 2, 0, 0, 2)),
    "t5": ((1, 0, 0, 0, 2), (2, 0, 0, 0, 2)),
    "m2": ((1, 0, 0, 0, 2), (3, 0, 0, 0, 3)),
    "m4": ((1, 1, 1, 0, 3), (2, 2, 2, 0, 3)),
    "m4m": ((1, 1, 1, 0, 3), (3, 3, 3, 0, 6)),
    "deberta": ((1, 1, 1, 0, 3), (2, 2, 2, 0, 3)),
    "tupe": ((1, 0, 0, 1, 3), (2, 0, 0, 2, 3)),
    "diet_abs": ((1, 0, 0, 1, 2), (2, 0, 0, 2, 2)),
    "diet_rel": ((1, 0, 0, 0, 3), (2, 0, 0, 0, 3)),
}


def flops(method: str, direction: str, B: int, H: int, n: int, m: int, d: int) -> float:
    """FLOPs of one forward ('fwd') or backward ('bwd') call, by FLOP_FORMULAS."""
    N = B * H * n * m
    R = _table_rows(method, n, m)
    terms = (2.0 * N * d, 2.0 * B * H * n * R * d, 2.0 * B * H * m * R * d,
             2.0 * H * n * m * d, float(N))
    coefficients = _FLOP_TERMS[method][0 if direction == "fwd" else 1]
    return sum(c * t for c, t in zip(coefficients, terms))


# ------------------------------------------------------------------ memory estimates

# Peak of the PyTorch eager formula (posenc.torch.native) forward+backward above
# its inputs and G, as multiples of: the logits L = 4·B·H·n·m bytes; one gathered
# (n, m, d) float32 relative tensor V (shared table); a per-head (H, n, m) float32
# table P.  Fitted to ru_maxrss at B ∈ {1, 8}, H = 12, n = m = 512, d = 64 on
# torch 2.13 (e.g. shaw 1.9 L + 2.6 V, m4m 6.2 L + 2.2 V, deberta 4.4 L + 4 P),
# then taken 1.5x larger: they only decide whether to shrink B·H or skip.
_EAGER_PEAK = {   # method: (L, V, P)
    "content": (3, 0, 0), "shaw": (3, 4, 0), "t5": (3, 0, 2), "m2": (6, 0, 2),
    "m4": (3, 5.5, 0), "m4m": (9.5, 3.5, 0), "deberta": (7, 0, 7), "tupe": (3, 0, 8),
    "diet_abs": (4.5, 0, 2), "diet_rel": (4.5, 0, 2)}


def peer_bytes(method: str, impl: str, B: int, H: int, n: int, m: int, d: int) -> int:
    """Estimated peak bytes of one implementation's forward+backward, G included."""
    L = logits_bytes(B, H, n, m)
    if impl.startswith("posenc"):
        return 2 * L                          # the logits, G (workspace is O((n+m)·rows))
    if impl == "reference":                   # float64 throughout, (H, n, m, d) gathers
        vectors = H * n * m * d * 8 * (6 if method in ("shaw", "m4", "m4m", "deberta") else 0)
        return 8 * L + vectors
    in_L, in_V, in_P = _EAGER_PEAK.get(method, (10, 6, 8))
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


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"

