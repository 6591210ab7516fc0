/*
 * term_cope_impl.h -- contextual position encoding (CoPE, docs/spec.md
 * §3.18), a term module (csrc/terms.h) that reads the content logits, for
 * one dtype (REAL).
 *
 * Arrays, float64: pos_emb (per unit P d, row t at t d: the head's table, or
 * one shared by the heads); shape (P, causal): the table's rows and, for the
 * logits, whether the keys after a query's position are masked for its gates
 * (a fused attention's masks say which keys a row sees instead: term_seen).
 * Row i of a unit, with its content logits Z_ij = s q_i.k_j (the tile's, on
 * entry) and U_i the keys it sees:
 *
 *   g_j = sigmoid(Z_ij) for j in U_i, 0 elsewhere
 *   p_j = min(sum_{t >= j} g_t, P - 1)           (the keys' positions)
 *   e_j = w qe[ceil p_j] + (1 - w) qe[floor p_j],  w = p_j - floor p_j,
 *         qe[t] = q_i . pos_emb[t] (q unscaled)
 *   A_ij = Z_ij + e_j.
 *
 * A row's positions need its last key's gate first: the row's gates are formed
 * over its keys, then summed in double from its last key down by the kernels'
 * suffix_interp (isa/positions_impl.h: the ISA's order, the same in the forward
 * and the backward; each position rounded to REAL once, and interpolated in
 * REAL), never a (B, H, n, m) tensor; a NaN gate
 * makes its row's positions NaN from it down (a NaN position indexes nothing:
 * its e is NaN).  Gates: the kernels' row_sigmoid (exp(-|z|), then 1 / (1 + e)
 * (z >= 0) or e / (1 + e): accurate at both ends).
 *
 * Backward, for G = dL/dA of row i:
 *   dqe[floor p_j] += (1 - w) G_j,  dqe[ceil p_j] += w G_j,
 *   dL/dp_j = G_j (qe[ceil p_j] - qe[floor p_j])   (0 where clamped: ceil = floor)
 *   dL/dg_t = sum_{j <= t} dL/dp_j                 (one running sum along the keys)
 *   dL/dZ_ij = G_j + dL/dg_j g_j (1 - g_j)         (G_j where g_j (1 - g_j) = 0)
 *   dq_i += dqe . pos_emb (beside the content's s dL/dZ . k),
 *   pos_emb[t]'s gradient += sum_i dqe_i[t] q_i,
 * with the gates, positions and projections the fused attention's backward formed
 * with the block's logits (term_keep: the forward's own, not recomputed), or, for the
 * logits' gradient, Z recomputed for a block of rows by the kernels' rows_dot.
 */
#ifndef POSENC_ENGINE_TERM_COPE_IMPL_H
#define POSENC_ENGINE_TERM_COPE_IMPL_H

#include <math.h>

#include "engine.h"

enum { COPE_POS_EMB, COPE_SHAPE };

/* The table's rows P (shape[0]) and the logits' causal flag (shape[1]). */
static inline size_t cope_rows_of(const posenc_problem *p)
{
    return (size_t)((const double *)p->terms[POSENC_TERM_cope].array[COPE_SHAPE].data)[0];
}

static inline int cope_causal(const posenc_problem *p)
{
    return ((const double *)p->terms[POSENC_TERM_cope].array[COPE_SHAPE].data)[1] != 0;
}

/* The list's condition: alone (no other term), P an integer in [1, 2^30], pos_emb P d
 * per unit, the causal flag 0 or 1. */
static inline int term_cope_valid(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_cope].array;
    const double *shape = (const double *)a[COPE_SHAPE].data;
    const double rows = shape[0];
    int others = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k)
        others |= k != POSENC_TERM_cope && posenc_term_present(p, k);
    return !others && rows >= 1 && rows <= 1073741824.0 && rows == floor(rows) &&
           a[COPE_POS_EMB].per_unit == (size_t)rows * p->d && (shape[1] == 0 || shape[1] == 1);
}

#ifdef REAL   /* (entry.c reads the validation above) */

#include "term_unit_impl.h"

/* Rows taken at once: their positions' sums interleaved (a row's alone would wait on
 * each addition), the backward's recomputed Z. */
#define COPE_ROWS 16

/* A thread's scratch: the table in REAL, COPE_ROWS rows' gates and positions, a row's
 * projections; the backward's block of Z and its projections' gradients.  Each part
 * 64-byte aligned. */
typedef struct {
    REAL *table, *gates, *qe;   /* P d, COPE_ROWS m, COPE_ROWS P */
    REAL *pos;                  /* backward: COPE_ROWS m (the forward's overwrite the gates) */
    REAL *z, *dqe_rows, *dqe_cols, *table_grad;   /* backward: COPE_ROWS m, COPE_ROWS P,
                                                     P COPE_ROWS, P d */
    double *dqe;                /* backward: P */
} cope_scratch;

/* Carves s from mem (REAL elements; s NULL: counts only); returns the elements. */
static size_t cope_layout(const posenc_problem *p, int backward, cope_scratch *s, REAL *mem)
{
    const size_t P = cope_rows_of(p), m = p->m, d = p->d;
    size_t at = 0;
#define COPE_TAKE(field, type, count)                                   \
    do {                                                                \
        if (s)                                                          \
            s->field = (type *)(void *)(mem + at);                      \
        at += posenc_round_up((count) * (sizeof(type) / sizeof(REAL)), \
                              64 / sizeof(REAL));                       \
    } while (0)
    COPE_TAKE(table, REAL, P * d);
    COPE_TAKE(gates, REAL, COPE_ROWS * m);
    COPE_TAKE(qe, REAL, COPE_ROWS * P);
    if (backward) {
        COPE_TAKE(pos, REAL, COPE_ROWS * m);
        COPE_TAKE(z, REAL, COPE_ROWS * m);
        COPE_TAKE(dqe_rows, REAL, COPE_ROWS * P);
        COPE_TAKE(dqe_cols, REAL, P * COPE_ROWS);
        COPE_TAKE(table_grad, REAL, P * d);
        COPE_TAKE(dqe, double, P);
    }
#undef COPE_TAKE
    return at;
}

/* The unit's table in REAL. */
static void cope_table(const term_unit *t, REAL *table)
{
    const double *pos_emb = t->array[COPE_POS_EMB];
    const size_t count = cope_rows_of(t->p) * t->p->d;
    for (size_t x = 0; x < count; ++x)
        table[x] = (REAL)pos_emb[x];
}

static void term_cope_unit(const term_unit *t)
{
    cope_scratch s;
    cope_layout(t->p, 0, &s, t->unit_data);
    cope_table(t, s.table);
}

static size_t term_cope_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                 const terms_call *call)
{
    (void)kern;
    return cope_layout(p, 0, NULL, NULL);
}

/* Row i's gates g[j], j in [k0, cols), from its content logits z[j]: 0 at the keys it
 * does not see (seen, or the logits' causal flag: keys past query_offset + i). */
static void cope_gates(const term_unit *t, REAL *g, const REAL *z, size_t i, size_t k0,
                       size_t cols, const term_seen *seen)
{
    if (cols <= k0)
        return;
    t->kern->row_sigmoid(g + k0, z + k0, cols - k0);
    if (seen) {
        seen->unseen_zero(seen->ctx, g, t->b, i, cols);
    } else if (cope_causal(t->p)) {
        for (size_t j = posenc_max(k0, t->p->query_offset + i + 1); j < cols; ++j)
            g[j] = 0;
    }
}

/* The last position, P - 1, as the largest REAL not above it (P - 1 itself below 2^24 in
 * float32): a position rounded to REAL never passes the table's last row. */
static double cope_last(size_t P)
{
    const double last = (double)(P - 1);
    REAL at = (REAL)last;
    while ((double)at > last)
        at = sizeof(REAL) == sizeof(float) ? (REAL)nextafterf((float)at, 0.0f)
                                           : (REAL)nextafter((double)at, 0.0);
    return (double)at;
}

/* A row's keep (term_keep): its gates and its positions (m each, from gap on: m padded),
 * then its projections qe (P). */
static size_t cope_keep_gap(const posenc_problem *p)
{
    return posenc_round_up(p->m, 16);
}

static size_t term_cope_content_keep(const posenc_problem *p)
{
    return 2 * cope_keep_gap(p) + cope_rows_of(p);
}

static void term_cope_content(const term_unit *t, const REAL *q, REAL *C, size_t ldc, size_t i0,
                              size_t rows, size_t k0, size_t cols, const term_seen *seen,
                              const term_keep *keep)
{
    const posenc_problem *p = t->p;
    const size_t d = p->d, P = cope_rows_of(p), gap = cope_keep_gap(p);
    const size_t ldg = keep ? keep->ld : p->m, ldq = keep ? keep->ld : P;
    cope_scratch s;
    cope_layout(p, 0, &s, t->unit_data);
    for (size_t r0 = 0; r0 < rows; r0 += COPE_ROWS) {
        const size_t count = posenc_min(COPE_ROWS, rows - r0);
        REAL *g = keep ? keep->data + r0 * keep->ld : s.gates;
        REAL *qe = keep ? g + 2 * gap : s.qe;
        for (size_t e = 0; e < count; ++e)
            cope_gates(t, g + e * ldg, C + (r0 + e) * ldc, i0 + r0 + e, k0, cols, seen);
        t->kern->rows_dot(qe, ldq, q + (i0 + r0) * d, count, s.table, P, d, 1.0);
        t->kern->suffix_interp(C + r0 * ldc, ldc, keep ? g + gap : NULL, g, ldg, qe, ldq, count,
                               k0, cols, cope_last(P));
    }
    for (size_t r = 0; keep && r < rows; ++r) {
        keep->range[2 * r] = k0;
        keep->range[2 * r + 1] = cols;
    }
}

/* Row i's kept gates, positions and projections (term_cope_content) made the recomputed
 * ones on keys [first, cols): the keys its tile did not form see nothing (gates 0; the
 * positions before the formed keys are the first's, after them 0), and a row not formed
 * sees no key (its projections formed here). */
static void cope_kept_row(const term_unit *t, const size_t *range, REAL *gates, REAL *pos,
                          REAL *qe, const REAL *q_row, const REAL *table, size_t first,
                          size_t cols)
{
    const size_t lo = range[0], hi = range[1], P = cope_rows_of(t->p);
    const int formed = lo < hi;
    const REAL before = formed ? pos[lo] : 0;
    if (!formed)
        t->kern->rows_dot(qe, 0, q_row, 1, table, P, t->p->d, 1.0);
    for (size_t j = first; j < cols && (!formed || j < lo); ++j)
        gates[j] = 0, pos[j] = before;
    for (size_t j = formed ? posenc_max(hi, first) : cols; j < cols; ++j)
        gates[j] = 0, pos[j] = 0;
}

static void term_cope_content_grad(const term_unit *t, double *const *grad, const REAL *q,
                                   const REAL *k, double scale, const REAL *G, REAL *Gc,
                                   size_t ldg, size_t i0, size_t rows, size_t first, size_t cols,
                                   const term_seen *seen, REAL *dq, double *scratch,
                                   const term_keep *keep)
{
    const posenc_problem *p = t->p;
    const posenc_kernels *kern = t->kern;
    const size_t d = p->d, m = p->m, P = cope_rows_of(p);
    double *table_grad = grad[COPE_POS_EMB];
    cope_scratch s;
    cope_layout(p, 1, &s, (REAL *)(void *)scratch);
    cope_table(t, s.table);
    const size_t gap = cope_keep_gap(p), ldr = keep ? keep->ld : m, ldq = keep ? keep->ld : P;
    const double last = cope_last(P);
    for (size_t r0 = 0; r0 < rows; r0 += COPE_ROWS) {
        const size_t count = posenc_min(COPE_ROWS, rows - r0);
        REAL *gates_blk = keep ? keep->data + r0 * keep->ld : s.gates;
        REAL *pos_blk = keep ? gates_blk + gap : s.pos, *qe_blk = keep ? gates_blk + 2 * gap : s.qe;
        if (keep) {   /* what the block's logits formed */
            for (size_t e = 0; e < count; ++e)
                cope_kept_row(t, keep->range + 2 * (r0 + e), gates_blk + e * ldr,
                              pos_blk + e * ldr, qe_blk + e * ldq, q + (i0 + r0 + e) * d,
                              s.table, first, cols);
        } else {   /* s (q.k), as the forward's tiles (forward_tile_exact too) */
            if (cols > first) {
                kern->rows_dot(s.z + first, m, q + (i0 + r0) * d, count, k + first * d,
                               cols - first, d, 1.0);
                for (size_t e = 0; e < count; ++e)
                    for (size_t j = first; j < cols; ++j)
                        s.z[e * m + j] = (REAL)(scale * (double)s.z[e * m + j]);
            }
            for (size_t e = 0; e < count; ++e)
                cope_gates(t, s.gates + e * m, s.z + e * m, i0 + r0 + e, first, cols, seen);
            kern->suffix_interp(NULL, 0, s.pos, s.gates, m, NULL, 0, count, first, cols, last);
            kern->rows_dot(s.qe, P, q + (i0 + r0) * d, count, s.table, P, d, 1.0);
        }
        for (size_t e = 0; e < count; ++e) {
            const size_t r = r0 + e;
            const REAL *g_row = G + r * ldg, *gates = gates_blk + e * ldr;
            const REAL *pos = pos_blk + e * ldr, *qe = qe_blk + e * ldq;
            REAL *gc = Gc + r * ldg;
            memset(gc, 0, sizeof(REAL) * posenc_min(first, cols));
            memset(s.dqe, 0, sizeof(double) * P);
            kern->suffix_interp_grad(gc, s.dqe, g_row, gates, pos, qe, first, cols, last);
            for (size_t x = 0; x < P; ++x) {
                s.dqe_rows[e * P + x] = (REAL)s.dqe[x];
                s.dqe_cols[x * COPE_ROWS + e] = (REAL)s.dqe[x];
            }
        }
        kern->rows_axpy(dq + r0 * d, d, s.dqe_rows, P, count, s.table, P, d);
        if (table_grad) {
            kern->rows_axpy(s.table_grad, d, s.dqe_cols, COPE_ROWS, P, q + (i0 + r0) * d, count,
                            d);
            for (size_t x = 0; x < P * d; ++x)
                table_grad[x] += (double)s.table_grad[x];
        }
    }
}

/* term_cope_content_grad's scratch, in doubles. */
static size_t term_cope_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    (void)kern;
    const size_t elements = cope_layout(p, 1, NULL, NULL);
    return (elements * sizeof(REAL) + sizeof(double) - 1) / sizeof(double);
}

/* It reads the content logits: no rows of its own. */
#define term_cope_rows NULL
#define term_cope_grad_rows NULL
#define term_cope_expand_rows NULL
#define term_cope_expand NULL
#define term_cope_row_of NULL
#define term_cope_prepare NULL
#define term_cope_release NULL
#define term_cope_content_row NULL
#define term_cope_fuses NULL
#define term_cope_grad_prepare NULL
#define term_cope_grad_release NULL
#define term_cope_grad_unit_scratch NULL
#define term_cope_grad_begin NULL
#define term_cope_grad_sums NULL
#define term_cope_grad_end NULL
#define term_cope_grad_reduce NULL
#define term_cope_overrides 0
#define term_cope_grad_block NULL
#define term_cope_scaled 0
#define term_cope_grad_bf16 0
#define term_cope_rows_at NULL

#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_cope_factor 0
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_cope_by_blocks 0
#define term_cope_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_COPE_IMPL_H */
