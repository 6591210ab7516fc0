/*
 * term_query_table_impl.h -- the query-side vector table (term_vectors.h), a term module
 * of csrc/terms.h for one dtype (REAL): vector_scale q_i . table[h, map(j - i)].
 * Its call's data: the map as runs, the buckets a causal attention's tiles reach
 * (vector_call).  Its unit data: the head's table packed as a GEMM's B (kept while the
 * thread's units stay on the head), then a tile's projections q . table^T (mr rows); a
 * decoding step's rows are dot products with the table in place (term_query_direct).
 * Its gradient: G's rows summed into its buckets, then GEMMs (term_vectors_grad_impl.h).
 */
#ifndef POSENC_ENGINE_TERM_QUERY_TABLE_IMPL_H
#define POSENC_ENGINE_TERM_QUERY_TABLE_IMPL_H

#include "term_vectors.h"

#ifdef REAL

#include "term_vectors_impl.h"
#include "term_vectors_grad_impl.h"

#define term_query_table_prepare vector_prepare
#define term_query_table_release vector_release

/* The packed table (not with direct), then a tile's projections. */
static size_t term_query_table_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                            const terms_call *call)
{
    const vector_call *v = (const vector_call *)call->data[POSENC_TERM_query_table];
    const size_t proj = kern->mr * posenc_round_up(v->buckets, kern->nr);
    return (call->direct ? 0 : vector_pack_size(p, kern, v)) + proj;
}

/* The head's table packed, unless the thread's unit data holds it (its tag: the head). */
static void term_query_table_unit(const term_unit *t)
{
    const vector_call *v = (const vector_call *)t->data;
    const ptrdiff_t head = (ptrdiff_t)head_of(v->table.heads, t->h);
    if (t->env->call->direct || *t->tag == head)
        return;
    query_table_packed(t->kern, t->gemm, t->p, v, t->unit_data, t->h, 1);
    *t->tag = head;
}

static void term_query_table_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                                  size_t rows, size_t k0, size_t cols)
{
    const vector_call *v = (const vector_call *)t->data;
    const size_t *reach =   /* the buckets a causal tile reaches (the backward's: all) */
        v->row_reach && !t->env->whole ? v->row_reach + 2 * (i0 + rows - 1) : NULL;
    if (t->env->call->direct) {
        term_query_direct(t->kern, t->p, v, t->h, t->env->q, t->unit_data, op, P, ldp, i0, rows,
                          k0, cols, reach);
        return;
    }
    const packed_b table = query_table_packed(t->kern, t->gemm, t->p, v, t->unit_data, t->h, 0);
    term_query_rows(t->kern, t->gemm, t->p, v, &table,
                    t->unit_data + vector_pack_size(t->p, t->kern, v), t->env->q, op, P, ldp, i0,
                    rows, k0, cols, reach);
}

#define term_query_table_grad_prepare vector_grad_prepare
#define term_query_table_grad_release vector_grad_release
#define term_query_table_grad_unit_scratch vector_grad_unit_scratch
#define term_query_table_grad_begin vector_grad_begin
#define term_query_table_grad_sums vector_grad_sums
#define term_query_table_grad_end vector_grad_end
#define term_query_table_grad_reduce vector_grad_reduce
#define term_query_table_grad_rows NULL
#define term_query_table_grad_scratch NULL
#define term_query_table_content NULL
#define term_query_table_content_grad NULL
#define term_query_table_content_keep NULL
#define term_query_table_expand_rows NULL
#define term_query_table_expand NULL
#define term_query_table_row_of NULL
#define term_query_table_rows_at NULL
#define term_query_table_grad_block NULL
#define term_query_table_content_row NULL
#define term_query_table_fuses NULL
#define term_query_table_overrides 0
#define term_query_table_scaled 0
#define term_query_table_grad_bf16 0

#endif /* REAL */

/* A factor of the product mode (M4M), beside the one factor module. */
#define term_query_table_factor 1
/* Its gradient: the engine's slots, summed over the batch (not by blocks). */
#define term_query_table_by_blocks 0
#define term_query_table_vector 1

#endif /* POSENC_ENGINE_TERM_QUERY_TABLE_IMPL_H */
