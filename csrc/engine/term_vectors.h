/*
 * term_vectors.h -- what the two vector-table kinds share (csrc/terms.h's query_table and
 * key_table: term_query_table_impl.h, term_key_table_impl.h): their arrays, the view of
 * them the engine reads, and their validation.
 *
 *   query_table   vector_scale q_i . table[h, map(j - i)]   (Shaw, M4, M4M, DeBERTa c2p)
 *   key_table     vector_scale k_j . table[h, map(j - i)]   (M4, M4M, DeBERTa p2c)
 *
 * Arrays: table, R x d per head (heads H or 1, no batch axis), in the problem's compute
 * type (a `real` array); map, int64 (an index array: the kernels read it as it is), the
 * table's row of each of the n + m - 1 offsets, map[j - i + n - 1], in [0, R), shared by
 * the batch and the heads.  Their
 * gradients are the engine's sums over the batch (posenc_term_summed), in batch row 0's
 * units: the table's per head, R x d.  Where both kinds read one table through one map
 * (M4, M4M) and the caller hands one gradient buffer for both, the key side's sums are
 * added to the query side's.
 */
#ifndef POSENC_ENGINE_TERM_VECTORS_H
#define POSENC_ENGINE_TERM_VECTORS_H

#include "engine.h"

enum { VECTOR_TABLE, VECTOR_MAP };

/* A vector table of a problem as the engine reads it. */
typedef struct {
    const void *table;   /* head h's rows (REAL) from table + (h heads > 1 ? h : 0) rows d */
    size_t heads, rows;  /* heads: H or 1; rows: R */
    const int64_t *map;  /* map[o + n - 1]: offset o's row */
} vector_table;

/* Kind k's table of p (NULL table: not present). */
static inline vector_table vector_table_of(const posenc_problem *p, int k)
{
    const posenc_term_array *a = p->terms[k].array;
    vector_table v = {a[VECTOR_TABLE].data, a[VECTOR_TABLE].head_stride ? p->H : 1,
                      p->d ? a[VECTOR_TABLE].per_unit / p->d : 0,
                      (const int64_t *)a[VECTOR_MAP].data};
    return v;
}

/* The list's condition: the table R x d per head without a batch axis, the map shared by
 * the batch and the heads, each entry a row of the table (with d = 0, whose table has no
 * entries, any non-negative entry: nothing reads it). */
static inline int term_vector_valid(const posenc_problem *p, int k)
{
    const posenc_term_array *a = p->terms[k].array;
    if (a[VECTOR_TABLE].batch_stride || a[VECTOR_MAP].batch_stride ||
        a[VECTOR_MAP].head_stride || (p->d ? a[VECTOR_TABLE].per_unit % p->d
                                           : a[VECTOR_TABLE].per_unit != 0))
        return 0;
    const uint64_t rows = p->d ? (uint64_t)(a[VECTOR_TABLE].per_unit / p->d) : (uint64_t)INT64_MAX;
    const int64_t *map = (const int64_t *)a[VECTOR_MAP].data;
    uint64_t bad = 0;   /* one pass without branches: a decoding step reads its map whole */
    for (size_t o = 0; o < a[VECTOR_MAP].per_unit; ++o)
        bad |= (uint64_t)map[o] >= rows;   /* a negative entry wraps past rows */
    return bad == 0;
}

#endif /* POSENC_ENGINE_TERM_VECTORS_H */
