/*
 * term_segments_impl.h -- DIET's segment term (docs/spec.md §3.9), a term
 * module (csrc/terms.h), for one dtype (REAL).
 *
 * Arrays, per unit (b, h), float64: table, S x S entries (S segments; its
 * row is the query's segment); query (n ids) and key (m ids), integers in
 * [0, S), shared by the heads.  The term is table[query[i] S + key[j]].
 *
 * Keys come in runs of one segment (a sentence pair's two halves: two runs),
 * formed once per unit: a row is a broadcast of one table entry per run (the
 * kernels' row_gather, stride 0).  A row depends on its query only through
 * the query's segment, so the forward can form the S distinct rows of a unit
 * once (expand) and let the GEMM's epilogue add query i's row by pointer
 * (row_of): the engine's `expanded` path, which DIET takes where no reset
 * overrides the term.  The gradient takes each run's sum of G back into its
 * entry (row_scatter_add), in REAL per call, added to the double gradient
 * after (in place for a double REAL: the sums of one order).
 */
#ifndef POSENC_ENGINE_TERM_SEGMENTS_IMPL_H
#define POSENC_ENGINE_TERM_SEGMENTS_IMPL_H

#include <math.h>

#include "engine.h"

enum { SEG_TABLE, SEG_QUERY, SEG_KEY };

/* S: the segments of a table of `entries` = S x S entries (S * S <= entries: the largest
 * square, which is all of it in a valid problem). */
static inline size_t seg_count(size_t entries)
{
    size_t S = (size_t)sqrt((double)entries);
    while (S * S > entries)
        --S;
    while ((S + 1) * (S + 1) <= entries)
        ++S;
    return S;
}

/* Whether every id of ids (len) is an integer in [0, S). */
static inline int seg_ids_valid(const double *ids, size_t len, size_t S)
{
    for (size_t t = 0; t < len; ++t)
        if (!(ids[t] >= 0 && ids[t] < (double)S && ids[t] == floor(ids[t])))
            return 0;
    return 1;
}

/* The list's condition: a square table, ids shared by the heads, every batch's within it. */
static inline int term_segments_valid(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_segments].array;
    const size_t S = seg_count(a[SEG_TABLE].per_unit);
    if (S * S != a[SEG_TABLE].per_unit || a[SEG_QUERY].head_stride || a[SEG_KEY].head_stride)
        return 0;
    for (size_t b = 0; b < p->B; ++b)
        for (int side = SEG_QUERY; side <= SEG_KEY; ++side) {
            const posenc_term_array *x = &a[side];
            if (b && !x->batch_stride)
                continue;   /* one batch's, shared */
            if (!seg_ids_valid((const double *)x->data + b * x->batch_stride, x->per_unit, S))
                return 0;
        }
    return 1;
}

#ifdef REAL

#include "term_unit_impl.h"

/* A run of keys [begin, end) of one segment. */
typedef struct {
    size_t begin, end, segment;
} seg_run;

/* The runs of key ids (m of them) into runs; returns their count. */
static size_t seg_runs(seg_run *runs, const double *key, size_t m)
{
    size_t count = 0;
    for (size_t j = 0; j < m; ++j) {
        if (j == 0 || key[j] != key[j - 1])
            runs[count++] = (seg_run){j, j, (size_t)key[j]};
        runs[count - 1].end = j + 1;
    }
    return count;
}

/* The unit data: the table in REAL (S x S, rounded up to 16), then the count of runs and
 * the runs. */
typedef struct {
    const REAL *table;
    size_t S, count;
    const seg_run *runs;
} seg_unit;

static seg_unit seg_unit_of(const term_unit *t)
{
    const size_t SS = t->term->array[SEG_TABLE].per_unit;
    const size_t *count = (const size_t *)(const void *)(t->unit_data + posenc_round_up(SS, 16));
    return (seg_unit){t->unit_data, seg_count(SS), *count, (const seg_run *)(const void *)(count + 1)};
}

static void term_segments_unit(const term_unit *t)
{
    const size_t SS = t->term->array[SEG_TABLE].per_unit;
    for (size_t e = 0; e < SS; ++e)
        t->unit_data[e] = (REAL)t->array[SEG_TABLE][e];
    size_t *count = (size_t *)(void *)(t->unit_data + posenc_round_up(SS, 16));
    *count = seg_runs((seg_run *)(void *)(count + 1), t->array[SEG_KEY], t->p->m);
}

static size_t term_segments_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                 const terms_call *call)
{
    (void)kern;
    const size_t SS = p->terms[POSENC_TERM_segments].array[SEG_TABLE].per_unit;
    return posenc_round_up(SS, 16) + term_reals(sizeof(size_t) + p->m * sizeof(seg_run));
}

/* Row `row` of the table (a query's segment) on keys [k0, cols) of P's row, with op: one
 * broadcast per run. */
static void seg_row(const posenc_kernels *kern, const seg_unit *s, int op, REAL *P, size_t row,
                    size_t k0, size_t cols)
{
    const REAL *table_row = s->table + row * s->S;
    for (size_t t = 0; t < s->count && s->runs[t].begin < cols; ++t) {
        const size_t js = posenc_max(s->runs[t].begin, k0);
        if (js < s->runs[t].end)
            kern->row_gather(op, P + js, table_row + s->runs[t].segment, 0,
                             posenc_min(s->runs[t].end, cols) - js);
    }
}

static void term_segments_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                               size_t rows, size_t k0, size_t cols)
{
    const seg_unit s = seg_unit_of(t);
    for (size_t r = 0; r < rows; ++r)
        seg_row(t->kern, &s, op, P + r * ldp, (size_t)t->array[SEG_QUERY][i0 + r], k0, cols);
}

/* The S distinct rows: row s at X + s m, every key. */
static size_t term_segments_expand_rows(const posenc_problem *p)
{
    return seg_count(p->terms[POSENC_TERM_segments].array[SEG_TABLE].per_unit);
}

static void term_segments_expand(const term_unit *t, REAL *X)
{
    const seg_unit s = seg_unit_of(t);
    const size_t m = t->p->m;
    for (size_t row = 0; row < s.S; ++row)
        seg_row(t->kern, &s, POSENC_SET, X + row * m, row, 0, m);
}

static size_t term_segments_row_of(const term_unit *t, size_t i)
{
    return (size_t)t->array[SEG_QUERY][i];
}

/* term_segments_grad_rows' widened row of G: its doubles' offset in the scratch, after the
 * runs (m) and the REAL table (S x S). */
static size_t seg_grad_row_at(const posenc_problem *p)
{
    const size_t SS = p->terms[POSENC_TERM_segments].array[SEG_TABLE].per_unit;
    return posenc_round_up(p->m * sizeof(seg_run) / sizeof(double), 8) + posenc_round_up(SS, 8);
}

/* The table's gradient of rows [i0, i0 + rows): each run's sum of G into its entry of the
 * query's row, in a REAL table per call added to the double gradient (in place when REAL is
 * double).  From G's bfloat16 twin (t->g16) a row at a time, widened into the scratch's
 * last m REAL (term_grad_row) and summed by the same kernel. */
static void term_segments_grad_rows(const term_unit *t, double *const *grad, const REAL *G,
                                    size_t ldg, size_t i0, size_t rows, size_t first, size_t cols,
                                    double *scratch)
{
    double *dtable = grad[SEG_TABLE];
    const size_t SS = t->term->array[SEG_TABLE].per_unit, S = seg_count(SS);
    if (!dtable || !rows || first >= cols)
        return;
    seg_run *runs = (seg_run *)(void *)scratch;
    const size_t count = seg_runs(runs, t->array[SEG_KEY], t->p->m);
    const int in_place = sizeof(REAL) == sizeof(double);
    REAL *table = in_place ? (REAL *)(void *)dtable
                           : (REAL *)(void *)(scratch + posenc_round_up(t->p->m * sizeof(seg_run) /
                                                                            sizeof(double), 8));
    if (!in_place)
        memset(table, 0, sizeof(REAL) * SS);
    REAL *wide = (REAL *)(void *)(scratch + seg_grad_row_at(t->p));   /* a widened row of G */
    for (size_t e = 0; e < rows; ++e) {
        REAL *slot = table + (size_t)t->array[SEG_QUERY][i0 + e] * S;
        const REAL *row = term_grad_row(t, G, ldg, e, first, cols, wide);
        for (size_t r = 0; r < count && runs[r].begin < cols; ++r) {
            const size_t js = posenc_max(runs[r].begin, first), je = posenc_min(runs[r].end, cols);
            if (js < je)
                t->kern->row_scatter_add(slot + runs[r].segment, 0, row + js, je - js);
        }
    }
    if (!in_place)
        for (size_t e = 0; e < SS; ++e)
            dtable[e] += (double)table[e];
}

/* term_segments_grad_rows' runs, REAL table and widened row (m REAL), in doubles' room. */
static size_t term_segments_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    (void)kern;
    return seg_grad_row_at(p) + posenc_round_up(p->m * sizeof(REAL) / sizeof(double) + 1, 8);
}

/* It adds rows: it does not read the content logits. */
#define term_segments_content NULL
#define term_segments_content_grad NULL
#define term_segments_content_keep NULL
#define term_segments_prepare NULL
#define term_segments_release NULL
#define term_segments_content_row NULL
#define term_segments_fuses NULL
#define term_segments_grad_prepare NULL
#define term_segments_grad_release NULL
#define term_segments_grad_unit_scratch NULL
#define term_segments_grad_begin NULL
#define term_segments_grad_sums NULL
#define term_segments_grad_end NULL
#define term_segments_grad_reduce NULL
#define term_segments_overrides 0
#define term_segments_grad_block NULL
#define term_segments_scaled 0
#define term_segments_grad_bf16 1
#define term_segments_rows_at NULL

#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_segments_factor 0
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_segments_by_blocks 0
#define term_segments_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_SEGMENTS_IMPL_H */
