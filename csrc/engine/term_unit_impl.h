/*
 * term_unit_impl.h -- what a term module's functions (csrc/terms.h,
 * term_kinds_impl.h) get and what they are, for one dtype (REAL): the one
 * header a kind's file (term_<name>_impl.h) includes.
 */
#ifndef POSENC_ENGINE_TERM_UNIT_IMPL_H
#define POSENC_ENGINE_TERM_UNIT_IMPL_H

#include <string.h>

#include "engine.h"

/* What a kind's functions get: the problem, the kernels it runs on, the term, its
 * unit's arrays. */
typedef struct {
    const posenc_problem *p;
    const posenc_kernels *kern;
    const posenc_term *term;
    const double *array[POSENC_TERM_ARRAYS_MAX];   /* unit (b, h)'s, NULL where not given */
    size_t b, h;
    REAL *unit_data;        /* the forward's: what the kind's `unit` formed for (b, h),
                               unit_scratch(p) elements (NULL elsewhere) */
} term_unit;

/*
 * unit: what the forward's rows of unit (b, h) read, formed once per unit into
 *   t->unit_data (unit_scratch(p) elements of REAL, a thread's).
 * rows: the term on rows [i0, i0 + rows) of the unit, keys [k0, cols), applied
 *   to P (row r at P + r ldp, key j at column j) with op (POSENC_SET or ADD);
 *   `unit` ran for the unit.
 * grad_rows: rows [i0, i0 + rows) of the logits' gradient (row r at G + r ldg;
 *   zero outside keys [first, cols), which are all it may read) into the
 *   unit's gradients grad[a] (NULL: not wanted), zeroed when the unit began;
 *   called for a unit's rows in order, so that its sums have one order;
 *   scratch: the thread's grad_scratch(p) doubles.
 */
typedef struct {
    void (*unit)(const term_unit *t);
    size_t (*unit_scratch)(const posenc_problem *p);
    void (*rows)(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0, size_t rows,
                 size_t k0, size_t cols);
    void (*grad_rows)(const term_unit *t, double *const *grad, const REAL *G, size_t ldg,
                      size_t i0, size_t rows, size_t first, size_t cols, double *scratch);
    size_t (*grad_scratch)(const posenc_problem *p);
} term_kind;

#endif /* POSENC_ENGINE_TERM_UNIT_IMPL_H */
