/*
 * term_fox_impl.h -- the Forgetting Transformer's decay (docs/spec.md §3.17),
 * a term module (csrc/terms.h), for one dtype (REAL).
 *
 * Arrays, per unit (b, h), over the keys, float64: gates, the log forget
 * gates; gates_reverse (the bidirectional form, optional); cum and
 * cum_reverse, their inclusive prefix sums c_t = sum_{l <= t} gates[l], given
 * when every gate is finite.  With i' = query_offset + i (< m, checked):
 *   D_ij = sum_{l = j+1}^{i'} gates[l]            (j <= i'; D_ii' = 0)
 *   D_ij = sum_{l = i'+1}^{j} gates_reverse[l]    (j > i'; 0 without them)
 * With the prefix sums, c_{i'} - c_j and r_j - r_{i'}: a row constant and a
 * key vector (nothing of n x m is formed), each prefix sum split once per unit
 * into REAL parts c = hi + lo (term_fox_unit), D = (hi_{i'} - hi_j) + (lo_{i'}
 * - lo_j) in REAL: within 2 u |D| (+ u^2 |c|), with REAL's vector width.  A
 * difference of prefix sums is not the sum where a gate is Inf or NaN (inf -
 * inf): without them the rows are summed as written, from i' outwards.
 * Gradients of the gates: row i gives gate l <= i' the sum of its G over the
 * keys j < l, and reverse gate l > i' the sum over the keys j >= l, from
 * column sums of a block's rows (term_fox_grad_rows), so that an Inf or NaN
 * of G reaches exactly the gates whose sums hold it.
 */
#ifndef POSENC_ENGINE_TERM_FOX_IMPL_H
#define POSENC_ENGINE_TERM_FOX_IMPL_H
#ifdef REAL   /* (entry.c reads the kinds' validation, which fox's list line holds) */

#include "term_unit_impl.h"

/* The unit's prefix sums split into REAL parts, hi = (REAL) c, lo = (REAL)(c - hi):
 * cum's at unit_data (hi, then lo: m each), cum_reverse's after them. */
static void term_fox_unit(const term_unit *t)
{
    const size_t m = t->p->m;
    for (int side = 0; side < 2; ++side) {
        const double *c = t->array[2 + side];
        REAL *hi = t->unit_data + 2 * side * m, *lo = hi + m;
        for (size_t j = 0; c && j < m; ++j) {
            hi[j] = (REAL)c[j];
            lo[j] = (REAL)(c[j] - (double)hi[j]);
        }
    }
}

static size_t term_fox_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                 const terms_call *call)
{
    (void)kern;
    return 4 * p->m;
}

static void fox_put(int op, REAL *dst, double value)
{
    *dst = op == POSENC_SET ? (REAL)value : *dst + (REAL)value;
}

/* Keys [lo, hi) of row i' summed as written: before i' (after = 0) the gates
 * j+1 .. i' accumulated from i' down, after it the reverse gates i'+1 .. j. */
static void fox_row_literal(int op, REAL *dst, const double *gate, size_t i, size_t lo, size_t hi,
                            int after)
{
    double sum = 0;
    if (!after) {
        for (size_t j = i; j-- > lo;) {
            sum += gate[j + 1];
            if (j < hi)
                fox_put(op, dst + j, sum);
        }
    } else {
        for (size_t j = i + 1; j < hi; ++j) {
            sum += gate[j];
            if (j >= lo)
                fox_put(op, dst + j, sum);
        }
    }
}

static void term_fox_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                          size_t rows, size_t k0, size_t cols)
{
    const double *gate = t->array[0], *gate_r = t->array[1], *c = t->array[2], *r = t->array[3];
    const size_t m = t->p->m;
    const REAL *hi = t->unit_data, *lo = hi + m, *hi_r = lo + m, *lo_r = hi_r + m;
    for (size_t e = 0; e < rows; ++e) {
        const size_t i = t->p->query_offset + i0 + e;   /* < m */
        REAL *row = P + e * ldp;
        const size_t split = posenc_max(k0, posenc_min(i + 1, cols));   /* keys j <= i' end */
        if (split > k0) {
            if (c) {
                t->kern->row_difference(op, row + k0, hi[i], lo[i], hi + k0, lo + k0, 1,
                                        split - k0);
            } else {
                if (i < split)
                    fox_put(op, row + i, 0);
                fox_row_literal(op, row, gate, i, k0, posenc_min(split, i), 0);
            }
        }
        if (cols > split) {
            if (!gate_r) {
                if (op == POSENC_SET)
                    memset(row + split, 0, sizeof(REAL) * (cols - split));
            } else if (r) {
                t->kern->row_difference(op, row + split, hi_r[i], lo_r[i], hi_r + split,
                                        lo_r + split, -1, cols - split);
            } else {
                fox_row_literal(op, row, gate_r, i, split, cols, 1);
            }
        }
    }
}

/*
 * The gates' gradients of a block of rows t_e = query_offset + i0 + e (e < rows), keys
 * [first, cols): gate l gets the sum over the rows with t_e >= l of their G over j < l,
 * reverse gate l over the rows with t_e < l of their G over j >= l.  Gates every row
 * reaches (l <= t0, reverse l > t1) from the block's column sums S, one running
 * sum along the keys (in double); the others (t0 < l <= t1) from the column sums A of
 * the rows past (before) l, grown a row at a time.  The column sums and A's sums are
 * the kernels' row operations (vector-wide, in REAL): no chain of n m dependent adds.
 */
static void term_fox_grad_rows(const term_unit *t, double *const *grad, const REAL *G,
                               size_t ldg, size_t i0, size_t rows, size_t first, size_t cols,
                               double *scratch)
{
    const posenc_kernels *kern = t->kern;
    double *dgate = grad[0], *dgate_r = grad[1];
    const size_t m = t->p->m, t0 = t->p->query_offset + i0, t1 = t0 + rows - 1;
    if (!rows || first >= cols)
        return;
    REAL *S = (REAL *)(void *)scratch, *A = S + m;
    const size_t width = cols - first;
    for (size_t e = 0; e < rows; ++e)
        kern->row_gather(e ? POSENC_ADD : POSENC_SET, S + first, G + e * ldg + first, 1, width);
    if (dgate) {
        double sum = 0;   /* gates l in (first, t0]: sum_{first <= j < l} S[j] */
        for (size_t l = first + 1; l <= t0; ++l) {
            if (l <= cols)
                sum += S[l - 1];
            dgate[l] += sum;
        }
        for (size_t l = t1; l > t0; --l) {   /* rows e >= l - t0 */
            kern->row_gather(l == t1 ? POSENC_SET : POSENC_ADD, A + first,
                             G + (l - t0) * ldg + first, 1, width);
            if (l > first) {
                REAL part = 0;
                kern->row_scatter_add(&part, 0, A + first, posenc_min(l, cols) - first);
                dgate[l] += part;
            }
        }
    }
    if (dgate_r) {
        double sum = 0;   /* reverse gates l in (t1, cols): sum_{max(l, first) <= j < cols} S[j] */
        for (size_t l = cols; l-- > t1 + 1;) {
            if (l >= first)
                sum += S[l];
            dgate_r[l] += sum;
        }
        for (size_t l = t0 + 1; l <= t1 && l < cols; ++l) {   /* rows e < l - t0 */
            kern->row_gather(l == t0 + 1 ? POSENC_SET : POSENC_ADD, A + first,
                             G + (l - t0 - 1) * ldg + first, 1, width);
            const size_t from = posenc_max(l, first);
            REAL part = 0;
            kern->row_scatter_add(&part, 0, A + from, cols - from);
            dgate_r[l] += part;
        }
    }
}

/* term_fox_grad_rows' column sums: two rows of m (REAL, in doubles' room). */
static size_t term_fox_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    (void)kern;
    return 2 * p->m;
}

/* It adds rows: it does not read the content logits. */
#define term_fox_content NULL
#define term_fox_content_grad NULL
#define term_fox_content_keep NULL
#define term_fox_expand_rows NULL
#define term_fox_expand NULL
#define term_fox_row_of NULL
#define term_fox_prepare NULL
#define term_fox_release NULL
#define term_fox_content_row NULL
#define term_fox_fuses NULL
#define term_fox_grad_prepare NULL
#define term_fox_grad_release NULL
#define term_fox_grad_unit_scratch NULL
#define term_fox_grad_begin NULL
#define term_fox_grad_sums NULL
#define term_fox_grad_end NULL
#define term_fox_grad_reduce NULL
#define term_fox_overrides 0
#define term_fox_grad_block NULL
#define term_fox_scaled 0
#define term_fox_grad_bf16 0
#define term_fox_rows_at NULL

#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_fox_factor 0
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_fox_by_blocks 0
#define term_fox_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_FOX_IMPL_H */
