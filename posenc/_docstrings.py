"""One docstring per method, shared by posenc, posenc.reference and posenc.torch."""

_SHAPES = """
Shapes: q (B, H, n, d), k (B, H, m, d); result A (B, H, n, m), A[b, h, i, j]
is how query i attends to key j before the softmax.  Float inputs share one
dtype (float32 or float64); inputs may have any strides.  Every positional
parameter has a leading head axis of size H or 1 (shared by all heads).
"""

FORMULAS = {
    "content": (
        "Plain attention logits (SPEC 3.1): A_ij = s q_i.k_j, s = 1/sqrt(d) by default."),
    "shaw": (
        "Shaw et al. 2018 (SPEC 3.2): A_ij = s q_i.(k_j + rel_k[c(i,j)]),\n"
        "c = clipped(j - i, max_distance); rel_k (H|1, 2t+1, d); s = 1/sqrt(d)."),
    "t5": (
        "T5 relative bias, Raffel et al. (SPEC 3.3): A_ij = s q_i.k_j + bias[h, t5(j - i)];\n"
        "bias (H|1, num_buckets); s = 1 as in T5; the bias is never scaled."),
    "m2": (
        "Huang et al. 2020, M2 (SPEC 3.4): A_ij = s (q_i.k_j) rel[h, c(i,j)],\n"
        "c = clipped(j - i, max_distance); rel (H|1, 2t+1); s = 1/sqrt(d)."),
    "m4": (
        "Huang et al. 2020, M4 (SPEC 3.5): A_ij = s (q_i.k_j + q_i.a_ij + k_j.a_ij),\n"
        "a_ij = rel_k[clipped(j - i, max_distance)]; rel_k (H|1, 2t+1, d); s = 1/sqrt(d)."),
    "m4m": (
        "Multiplicative M4 (SPEC 3.6): A_ij = s (q_i.k_j)(q_i.a_ij)(k_j.a_ij),\n"
        "a_ij = rel_k[clipped(j - i, max_distance)]; s = 1/sqrt(d)."),
    "deberta": (
        "DeBERTa(-v2) disentangled attention (SPEC 3.7), c2p + p2c:\n"
        "A_ij = s (q_i.k_j + q_i.pos_key[p(i,j)] + k_j.pos_query[p(i,j)]),\n"
        "delta = i - j (log-bucketed when position_buckets > 0 and max_relative_positions > 0),\n"
        "p = clip(delta + att_span, 0, 2 att_span - 1); pos_key, pos_query (H|1, 2 att_span, d)\n"
        "already projected; s = 1/sqrt(3d).  Equals HuggingFace DebertaV2 for square inputs."),
    "tupe": (
        "TUPE, Ke et al. 2020 (SPEC 3.8): A_ij = s q_i.k_j + reset(v)_ij,\n"
        "v_ij = s pos_q_i.pos_k_j + bias[h, t5(j - i)] (TUPE-R; TUPE-A without bias);\n"
        "reset: theta[h,0] on row 0 ([CLS] to others), theta[h,1] on column 0 of other rows.\n"
        "pos_q (H|1, n, d_p), pos_k (H|1, m, d_p), theta (H|1, 2); s = 1/sqrt(2d)."),
    "diet_abs": (
        "DIET-ABS, Chen et al. 2021 eq. (1) (SPEC 3.9):\n"
        "A_ij = s q_i.k_j + pos_q_i.pos_k_j + segment_table[h, segment_q[b,i], segment_k[b,j]];\n"
        "pos_q (H|1, n, d_p), pos_k (H|1, m, d_p) (rank d_p free); segments optional, all three\n"
        "or none: segment_q (B, n), segment_k (B, m) ints, segment_table (H|1, S, S); s = 1/sqrt(d)."),
    "diet_rel": (
        "DIET-REL, Chen et al. 2021 eq. (3) (SPEC 3.10):\n"
        "A_ij = s q_i.k_j + rel[h, clip(i - j, -t, t) + t] + E_S (note R_{i-j}: query minus key);\n"
        "rel (H|1, 2t+1); segments as diet_abs; s = 1/sqrt(d)."),
}


def forward_doc(method: str, where: str) -> str:
    return f"{FORMULAS[method]}\n{_SHAPES}\nComputed by {where}.  `out=`: a C-contiguous (B, H, n, m) array of the\nresult dtype, not overlapping an input, written and returned."


def backward_doc(method: str, fields, where: str) -> str:
    return (
        f"Gradients of sum(G * {method}(...)) for G = dL/dA of shape (B, H, n, m).\n\n"
        f"Returns a named tuple with fields {', '.join(fields)}, each shaped like its\n"
        "input (None for an optional input not given); a parameter shared over heads\n"
        f"(head axis 1) gets its gradient summed over heads.  Computed by {where}.\n\n"
        + FORMULAS[method])
