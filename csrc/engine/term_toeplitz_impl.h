/*
 * term_toeplitz_impl.h -- a term that depends on the offset j - i alone: the
 * scalar table of T5, DIET-REL, TUPE, M2 and relative_bias (table[h, map(j -
 * i)], docs/spec.md §3.2) and the biases computed from per-head parameters
 * (ALiBi, KERPLE), a term module (csrc/terms.h) for one dtype (REAL).
 *
 * Array, per unit (b, h), float64: values, the term along the n + m - 1
 * offsets, values[j - i + n - 1] (the caller reads its table through its map:
 * posenc/_kinds.py's Table; or computes the bias: OffsetBias).  Row i of a
 * unit is values from n - 1 - i on: the rows of the term are one array read
 * with a row stride of -1, so the kind gives them by pointer (rows_at: the
 * GEMM's epilogue reads them there, T5's and ALiBi's forward form no rows)
 * and is a factor of the product mode (M2: s q.k * table[map(j - i)]; the
 * rows are linear in the values).  The gradient is the sums of G along its
 * diagonals (the kernels' diagonal_sums), in REAL per call, added to the
 * double gradient after (in place for a double REAL: the sums of one order).
 */
#ifndef POSENC_ENGINE_TERM_TOEPLITZ_IMPL_H
#define POSENC_ENGINE_TERM_TOEPLITZ_IMPL_H

#include "engine.h"

enum { TOEPLITZ_VALUES };

#ifdef REAL

#include "term_unit_impl.h"

/* The unit data: the values in REAL, n + m - 1 of them. */
static size_t term_toeplitz_unit_scratch(const posenc_problem *p)
{
    return p->n + p->m - 1;
}

static void term_toeplitz_unit(const term_unit *t)
{
    const double *values = t->array[TOEPLITZ_VALUES];
    const size_t offsets = t->p->n + t->p->m - 1;
    for (size_t o = 0; o < offsets; ++o)
        t->unit_data[o] = (REAL)values[o];
}

/* Row i0's values from key 0 (row i0 + r at + r * *ld: *ld = -1). */
static const REAL *term_toeplitz_rows_at(const term_unit *t, size_t i0, ptrdiff_t *ld)
{
    *ld = -1;
    return t->unit_data + (t->p->n - 1 - i0);
}

static void term_toeplitz_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                               size_t rows, size_t k0, size_t cols)
{
    if (cols <= k0)
        return;
    for (size_t r = 0; r < rows; ++r)
        t->kern->row_gather(op, P + r * ldp + k0, t->unit_data + (t->p->n - 1 - (i0 + r)) + k0,
                            1, cols - k0);
}

/* The values' gradient of rows [i0, i0 + rows), keys [first, cols): the diagonal sums of G,
 * offsets [lo, lo + span) of the unit's. */
static void term_toeplitz_grad_rows(const term_unit *t, double *const *grad, const REAL *G,
                                    size_t ldg, size_t i0, size_t rows, size_t first,
                                    size_t cols, double *scratch)
{
    double *dvalues = grad[TOEPLITZ_VALUES];
    if (!dvalues || !rows || first >= cols)
        return;
    const size_t top = t->p->n - 1 - i0;   /* row i0's offset index at key 0 */
    if (sizeof(REAL) == sizeof(double)) {
        t->kern->diagonal_sums((REAL *)(void *)dvalues + top, G, ldg, rows, first, cols);
        return;
    }
    REAL *sums = (REAL *)(void *)scratch;   /* indexed as dvalues */
    const size_t lo = top - (rows - 1) + first, span = rows - 1 + cols - first;
    memset(sums + lo, 0, sizeof(REAL) * span);
    t->kern->diagonal_sums(sums + top, G, ldg, rows, first, cols);
    for (size_t o = lo; o < lo + span; ++o)
        dvalues[o] += (double)sums[o];
}

static size_t term_toeplitz_grad_scratch(const posenc_problem *p)
{
    return p->n + p->m;
}

/* It adds (or multiplies) rows: it does not read the content logits. */
#define term_toeplitz_content NULL
#define term_toeplitz_content_grad NULL
#define term_toeplitz_content_keep NULL
#define term_toeplitz_expand_rows NULL
#define term_toeplitz_expand NULL
#define term_toeplitz_row_of NULL
#define term_toeplitz_overrides 0

#endif /* REAL */

/* A factor of the product mode (read by entry.c's validation too). */
#define term_toeplitz_factor 1

#endif /* POSENC_ENGINE_TERM_TOEPLITZ_IMPL_H */
