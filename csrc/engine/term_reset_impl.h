/*
 * term_reset_impl.h -- TUPE's [CLS] reset (docs/spec.md §3.8, TUPE eq. (9)),
 * a term module (csrc/terms.h) that overrides instead of adding, for one
 * dtype (REAL).
 *
 * Array, per unit (b, h), float64: theta, two entries.  The query at position
 * 0 (query_offset + i == 0) reads theta[0] on every key; every other query
 * theta[1] on key 0; these logits' positional part is theta alone, whatever
 * the other terms (the dense factor, the table, the other modules) hold
 * there.  The engine knows the cells (an overriding kind's: the row at
 * position 0 and column 0, `masked` in backward_rows_impl.h): it applies the
 * kind's rows after every other term and hands the other terms' gradients G
 * without these cells; the kind's own gradient reads only them.
 */
#ifndef POSENC_ENGINE_TERM_RESET_IMPL_H
#define POSENC_ENGINE_TERM_RESET_IMPL_H

#include "engine.h"

enum { RESET_THETA };

#ifdef REAL

#include "term_unit_impl.h"

/* theta[0] on the row at position 0 (keys [k0, cols)), theta[1] on key 0 of the others
 * (when k0 = 0): set, over the other terms' sum (op ADD), or over zeros (op SET: the
 * reset is the first term). */
static void term_reset_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                            size_t rows, size_t k0, size_t cols)
{
    const double *theta = t->array[RESET_THETA];
    const REAL cls = (REAL)theta[0];
    if (cols <= k0)
        return;
    for (size_t r = 0; r < rows; ++r) {
        REAL *row = P + r * ldp;
        if (op == POSENC_SET)
            memset(row + k0, 0, sizeof(REAL) * (cols - k0));
        if (t->p->query_offset + i0 + r == 0)
            t->kern->row_gather(POSENC_SET, row + k0, &cls, 0, cols - k0);
        else if (k0 == 0)
            row[0] = (REAL)theta[1];
    }
}

/* theta's gradient of rows [i0, i0 + rows): the [CLS] row's sum (keys [first, cols)), key 0
 * of the others (when first = 0), in REAL per call added to the double gradient (in place
 * when REAL is double: the sums of one order). */
static void term_reset_grad_rows(const term_unit *t, double *const *grad, const REAL *G,
                                 size_t ldg, size_t i0, size_t rows, size_t first, size_t cols,
                                 double *scratch)
{
    double *dtheta = grad[RESET_THETA];
    (void)scratch;
    if (!dtheta || first >= cols)
        return;
    REAL own[2] = {0, 0};
    const int in_place = sizeof(REAL) == sizeof(double);
    REAL *slot = in_place ? (REAL *)(void *)dtheta : own;
    for (size_t r = 0; r < rows; ++r) {
        if (t->p->query_offset + i0 + r == 0)
            t->kern->row_scatter_add(slot, 0, G + r * ldg + first, cols - first);
        else if (first == 0)
            slot[1] += G[r * ldg];
    }
    if (!in_place) {
        dtheta[0] += (double)own[0];
        dtheta[1] += (double)own[1];
    }
}

static size_t term_reset_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    (void)kern;
    (void)p;
    return 0;
}

/* Its rows are formed as they are read: no unit data. */
#define term_reset_unit NULL
#define term_reset_unit_scratch NULL
/* It adds (overriding) rows: it does not read the content logits. */
#define term_reset_content NULL
#define term_reset_content_grad NULL
#define term_reset_content_keep NULL
#define term_reset_expand_rows NULL
#define term_reset_expand NULL
#define term_reset_row_of NULL
#define term_reset_prepare NULL
#define term_reset_release NULL
#define term_reset_content_row NULL
#define term_reset_fuses NULL
#define term_reset_grad_prepare NULL
#define term_reset_grad_release NULL
#define term_reset_grad_unit_scratch NULL
#define term_reset_grad_begin NULL
#define term_reset_grad_sums NULL
#define term_reset_grad_end NULL
#define term_reset_grad_reduce NULL
#define term_reset_overrides 1
#define term_reset_grad_block NULL
#define term_reset_scaled 0
#define term_reset_grad_bf16 0
#define term_reset_rows_at NULL

#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_reset_factor 0
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_reset_by_blocks 0
#define term_reset_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_RESET_IMPL_H */
