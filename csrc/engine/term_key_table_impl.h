/*
 * term_key_table_impl.h -- the key-side vector table (term_vectors.h), a term module
 * of csrc/terms.h for one dtype (REAL): vector_scale k_j . table[h, map(j - i)].
 * Its call's data: the map as runs and edges, the buckets a causal attention's tiles
 * reach (vector_call).  Its unit data: the key projections k . table^T over those buckets
 * (m x buckets, then the edges' columns: key_projections) and the table packed for them;
 * a tile's rows gather from the projections along the map (term_key_table).  A decoding
 * step's rows are dot products per key along the map (term_key_direct) into one row of
 * unit data, or, for one row, formed in the content's own pass over k (content_row).
 * Its gradient: G's rows summed into its buckets, then GEMMs (term_vectors_grad_impl.h).
 */
#ifndef POSENC_ENGINE_TERM_KEY_TABLE_IMPL_H
#define POSENC_ENGINE_TERM_KEY_TABLE_IMPL_H

#include "term_vectors.h"

#ifdef REAL

#include "term_vectors_impl.h"
#include "term_vectors_grad_impl.h"

#define term_key_table_prepare vector_prepare
#define term_key_table_release vector_release

/* The projections and their edges' columns, then the packed table; direct: one row. */
static size_t term_key_table_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                          const terms_call *call)
{
    const vector_call *v = (const vector_call *)call->data[POSENC_TERM_key_table];
    if (call->direct)
        return p->m;
    return posenc_round_up(v->buckets * p->m + key_edge_size(&v->edges, p->m), 16) +
           vector_pack_size(p, kern, v);
}

/* The unit's key projections over the buckets the tiles reach (none with direct). */
static void term_key_table_unit(const term_unit *t)
{
    const vector_call *v = (const vector_call *)t->data;
    const posenc_problem *p = t->p;
    if (t->env->call->direct)
        return;
    REAL *proj = t->unit_data;
    REAL *pack = proj + posenc_round_up(v->buckets * p->m + key_edge_size(&v->edges, p->m), 16);
    const int whole = t->env->whole;   /* the backward's tiles: every bucket */
    key_projections(t->kern, t->gemm, p, &v->table, v->runs.b_min, v->buckets,
                    whole ? 0 : v->reach[0], whole ? v->buckets : v->reach[1], &v->edges, pack,
                    proj, t->h, t->env->k);
}

static void term_key_table_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                                size_t rows, size_t k0, size_t cols)
{
    const vector_call *v = (const vector_call *)t->data;
    const posenc_problem *p = t->p;
    if (t->env->call->direct)
        term_key_direct(t->kern, p, v, t->h, t->env->k, t->unit_data, t->env->call->fused, op, P,
                        ldp, i0, rows, k0, cols);
    else
        term_key_table(t->kern, op, P, ldp, v->table.map, v->runs.b_min, t->unit_data, v->buckets,
                       &v->edges, p->n, p->m, cols, i0, rows);
}

/* Where its term may share the content's pass over k: additive, its scale the content's. */
static int term_key_table_fuses(const posenc_problem *p)
{
    return !p->product && p->vector_scale == p->scale;
}

/*
 * A single row's content logits, keys [c0, cols) of row i, into x, with the kind's term
 * of the row in the same pass over k: along the key map's runs on which the bucket holds
 * (the far keys), q and the bucket's table row are two rows of one rows_dot (each key
 * loaded once for both; each sum as alone: x + ldx holds the term's, moved into the unit
 * data's row that term_key_direct applies); on a run whose bucket moves, the run's
 * content, then its terms (key_run_terms) while its keys are in cache.  The same bits as
 * the two passes.
 */
static void term_key_table_content_row(const term_unit *t, REAL *x, size_t ldx, REAL *pair,
                                       size_t i, size_t c0, size_t cols)
{
    const posenc_problem *p = t->p;
    const posenc_kernels *kern = t->kern;
    const vector_call *v = (const vector_call *)t->data;
    const posenc_runs *runs = &v->runs;
    const size_t d = p->d;
    const REAL *table = vector_table_row(&v->table, t->h, 0, d), *k_u = t->env->k;
    REAL *row = t->unit_data;
    memcpy(pair, t->env->q + i * d, sizeof(REAL) * d);
    size_t done = c0;   /* keys [c0, done): their content computed */
    ptrdiff_t js, je, bs;
    for (size_t r = posenc_runs_seek(runs, (ptrdiff_t)c0 - (ptrdiff_t)i);
         r < runs->count && posenc_run_span(&runs->runs[r], (ptrdiff_t)i, (ptrdiff_t)c0,
                                            (ptrdiff_t)cols, &js, &je, &bs);
         ++r) {
        const size_t keys = (size_t)(je - js);
        if ((size_t)js > done)   /* keys no run maps (none: the map is total) */
            kern->rows_dot(x + done, ldx, pair, 1, k_u + done * d, (size_t)js - done, d, p->scale);
        done = (size_t)je;
        if (runs->runs[r].step == 0) {
            memcpy(pair + d, table + (size_t)bs * d, sizeof(REAL) * d);
            kern->rows_dot(x + js, ldx, pair, 2, k_u + (size_t)js * d, keys, d, p->scale);
            memcpy(row + js, x + ldx + js, sizeof(REAL) * keys);
            continue;
        }
        kern->rows_dot(x + js, ldx, pair, 1, k_u + (size_t)js * d, keys, d, p->scale);
        key_run_terms(kern, p, table, k_u, row, js, je, bs, runs->runs[r].step);
    }
    if (cols > done)
        kern->rows_dot(x + done, ldx, pair, 1, k_u + done * d, cols - done, d, p->scale);
}

#define term_key_table_grad_prepare vector_grad_prepare
#define term_key_table_grad_release vector_grad_release
#define term_key_table_grad_unit_scratch vector_grad_unit_scratch
#define term_key_table_grad_begin vector_grad_begin
#define term_key_table_grad_sums vector_grad_sums
#define term_key_table_grad_end vector_grad_end
#define term_key_table_grad_reduce vector_grad_reduce
#define term_key_table_grad_rows NULL
#define term_key_table_grad_scratch NULL
#define term_key_table_content NULL
#define term_key_table_content_grad NULL
#define term_key_table_content_keep NULL
#define term_key_table_expand_rows NULL
#define term_key_table_expand NULL
#define term_key_table_row_of NULL
#define term_key_table_rows_at NULL
#define term_key_table_grad_block NULL
#define term_key_table_overrides 0
#define term_key_table_scaled 0
#define term_key_table_grad_bf16 0

#endif /* REAL */

/* A factor of the product mode (M4M), beside the one factor module. */
#define term_key_table_factor 1
/* Its gradient: the engine's slots, summed over the batch (not by blocks). */
#define term_key_table_by_blocks 0
#define term_key_table_vector 2

#endif /* POSENC_ENGINE_TERM_KEY_TABLE_IMPL_H */
