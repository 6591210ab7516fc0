/*
 * term_toeplitz_impl.h -- a term that depends on the offset j - i alone: the
 * scalar table of T5, DIET-REL, TUPE, M2 and relative_bias (table[h, map(j -
 * i)], docs/spec.md §3.2) and the biases computed from per-head parameters
 * (ALiBi, KERPLE), a term module (csrc/terms.h) for one dtype (REAL).
 *
 * Arrays, per unit (b, h): table, R entries, in the problem's compute type (a
 * `real` array: terms.h); rows, float64, the table's entry
 * of each of the n + m - 1 offsets, rows[j - i + n - 1] (the map: integers in
 * [0, R), shared by the batch and the heads; posenc/_kinds.py's Table hands
 * its bucket map, OffsetBias its bias along the offsets with the identity).
 * Formed once per unit: the values along the offsets in REAL, row i of the
 * unit from index n - 1 - i on.  The rows of the term are that one array
 * read with a row stride of -1, so the kind gives them by pointer (rows_at:
 * the GEMM's epilogue reads them there, T5's and ALiBi's forward form no
 * rows) and is a factor of the product mode (M2: s q.k * table[map(j - i)];
 * the rows are linear in the table).  The gradient: the sums of G along its
 * diagonals (the kernels' diagonal_sums) in REAL per call, each added to its
 * entry's double gradient through the map.
 */
#ifndef POSENC_ENGINE_TERM_TOEPLITZ_IMPL_H
#define POSENC_ENGINE_TERM_TOEPLITZ_IMPL_H

#include "engine.h"

enum { TOEPLITZ_TABLE, TOEPLITZ_ROWS };

/* The end of the run of rows from offset o (of `offsets`): entries equal, or moving by one
 * per offset (*step 0, 1 or -1), or a lone entry (*step 0).  A map is a few runs (a clipped
 * map three, T5's about its buckets, the identity one): the validation and the unit's
 * values go run by run. */
static inline size_t toeplitz_run(const double *rows, size_t o, size_t offsets, double *step)
{
    double s = o + 1 < offsets ? rows[o + 1] - rows[o] : 0;
    size_t e = o + 1;
    if (s == 0 || s == 1 || s == -1)
        while (e < offsets && rows[e] - rows[e - 1] == s)
            ++e;
    *step = e == o + 1 ? 0 : s;
    return e;
}

/* The list's condition: the rows shared by the batch and the heads, each an integer entry
 * of the table (a run's ends within it, its first an integer: the run's every entry is). */
static inline int term_toeplitz_valid(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_toeplitz].array;
    const double *rows = (const double *)a[TOEPLITZ_ROWS].data;
    const double entries = (double)a[TOEPLITZ_TABLE].per_unit;
    if (a[TOEPLITZ_ROWS].batch_stride || a[TOEPLITZ_ROWS].head_stride)
        return 0;
    for (size_t o = 0, e; o < a[TOEPLITZ_ROWS].per_unit; o = e) {
        double step;
        e = toeplitz_run(rows, o, a[TOEPLITZ_ROWS].per_unit, &step);
        const double first = rows[o], last = rows[e - 1];
        if (!(first >= 0 && first < entries && first == (double)(size_t)first && last >= 0 &&
              last < entries))
            return 0;
    }
    return 1;
}

#ifdef REAL

#include "term_unit_impl.h"

/* The unit data: the values along the offsets in REAL, n + m - 1 of them. */
static size_t term_toeplitz_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                 const terms_call *call)
{
    (void)kern;
    return p->n + p->m - 1;
}

/* Run by run of the map (toeplitz_run): an entry over many offsets (a clipped or bucketed
 * map's far offsets) broadcast, entries moving by one per offset (the identity, a clipped
 * map's middle) copied as a row. */
static void term_toeplitz_unit(const term_unit *t)
{
    const REAL *table = t->real[TOEPLITZ_TABLE];
    const double *rows = t->array[TOEPLITZ_ROWS];
    const size_t offsets = t->p->n + t->p->m - 1;
    REAL *values = t->unit_data;
    for (size_t o = 0, e; o < offsets; o = e) {
        double step;
        e = toeplitz_run(rows, o, offsets, &step);
        const REAL *from = table + (size_t)rows[o];
        if (step == 0) {
            const REAL v = *from;
            for (size_t x = o; x < e; ++x)
                values[x] = v;
        } else if (step > 0) {
            memcpy(values + o, from, sizeof(REAL) * (e - o));
        } else {
            for (size_t x = o; x < e; ++x)
                values[x] = *(from - (x - o));
        }
    }
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

/* The table's gradient of rows [i0, i0 + rows), keys [first, cols): the diagonal sums of G
 * (offsets [lo, lo + span) of the unit's, in REAL), into their entries run by run of the
 * map (a run over one entry as its sum).  From G's bfloat16 twin (t->g16) row by row,
 * widened and added by posenc_convert.bf16_sum: each offset's sum in row order, as
 * diagonal_sums adds the rows. */
static void term_toeplitz_grad_rows(const term_unit *t, double *const *grad, const REAL *G,
                                    size_t ldg, size_t i0, size_t rows, size_t first,
                                    size_t cols, double *scratch)
{
    double *dtable = grad[TOEPLITZ_TABLE];
    if (!dtable || !rows || first >= cols)
        return;
    const double *map = t->array[TOEPLITZ_ROWS];
    const size_t top = t->p->n - 1 - i0;   /* row i0's offset index at key 0 */
    const size_t lo = top - (rows - 1) + first, span = rows - 1 + cols - first;
    REAL *sums = (REAL *)(void *)scratch;   /* indexed by offset */
    memset(sums + lo, 0, sizeof(REAL) * span);
#ifdef ENGINE_BF16_GEMM
    if (t->g16)
        for (size_t r = 0; r < rows; ++r) {
            const uint16_t *row = t->g16 + r * ldg + first;
            posenc_active_convert()->bf16_sum(sums + top + first - r, &row, 1, cols - first, 1);
        }
    else
#endif
        t->kern->diagonal_sums(sums + top, G, ldg, rows, first, cols);
    for (size_t o = lo, e; o < lo + span; o = e) {   /* run by run of the map */
        double step;
        e = toeplitz_run(map, o, lo + span, &step);
        double *to = dtable + (size_t)map[o];
        if (step == 0 && e - o > 1) {   /* one entry: the run's sum (a vector sum) */
            REAL part = 0;
            t->kern->row_scatter_add(&part, 0, sums + o, e - o);
            *to += (double)part;
        } else if (step > 0) {
            for (size_t x = o; x < e; ++x)
                to[x - o] += (double)sums[x];
        } else {
            for (size_t x = o; x < e; ++x)
                *(to - (x - o)) += (double)sums[x];
        }
    }
}

static size_t term_toeplitz_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    (void)kern;
    return p->n + p->m;
}

/* It adds (or multiplies) rows: it does not read the content logits. */
#define term_toeplitz_content NULL
#define term_toeplitz_content_grad NULL
#define term_toeplitz_content_keep NULL
#define term_toeplitz_expand_rows NULL
#define term_toeplitz_expand NULL
#define term_toeplitz_row_of NULL
#define term_toeplitz_prepare NULL
#define term_toeplitz_release NULL
#define term_toeplitz_content_row NULL
#define term_toeplitz_fuses NULL
#define term_toeplitz_grad_prepare NULL
#define term_toeplitz_grad_release NULL
#define term_toeplitz_grad_unit_scratch NULL
#define term_toeplitz_grad_begin NULL
#define term_toeplitz_grad_sums NULL
#define term_toeplitz_grad_end NULL
#define term_toeplitz_grad_reduce NULL
#define term_toeplitz_overrides 0
#define term_toeplitz_grad_block NULL
#define term_toeplitz_scaled 0
#define term_toeplitz_grad_bf16 1

#endif /* REAL */

/* A factor of the product mode (entry.c's validation reads it). */
#define term_toeplitz_factor 1
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_toeplitz_by_blocks 0
#define term_toeplitz_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_TOEPLITZ_IMPL_H */
