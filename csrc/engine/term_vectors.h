/*
 * term_vectors.h -- what the two vector-table kinds share (csrc/terms.h's query_table and
 * key_table: term_query_table_impl.h, term_key_table_impl.h): their arrays, the view of
 * them the engine reads, and their validation.
 *
 *   query_table   vector_scale q_i . table[h, map(j - i)]   (Shaw, M4, M4M, DeBERTa c2p)
 *   key_table     vector_scale k_j . table[h, map(j - i)]   (M4, M4M, DeBERTa p2c)
 *
 * Arrays: table, R x d per head (heads H or 1, no batch axis), in the problem's compute
 * type (a `real` array); map, float64, the table's row of each of the n + m - 1 offsets,
 * map[j - i + n - 1], integers in [0, R), shared by the batch and the heads.  Their
 * gradients are the engine's sums over the batch (posenc_term_summed), in batch row 0's
 * units: the table's per head, R x d.  Where both kinds read one table through one map
 * (M4, M4M) and the caller hands one gradient buffer for both, the key side's sums are
 * added to the query side's.
 */
#ifndef POSENC_ENGINE_TERM_VECTORS_H
#define POSENC_ENGINE_TERM_VECTORS_H

#include <string.h>

#include "engine.h"

enum { VECTOR_TABLE, VECTOR_MAP };

/* A vector table of a problem as the engine reads it. */
typedef struct {
    const void *table;   /* head h's rows (REAL) from table + (h heads > 1 ? h : 0) rows d */
    size_t heads, rows;  /* heads: H or 1; rows: R */
    const double *map;   /* map[o + n - 1]: offset o's row */
} vector_table;

/* Kind k's table of p (NULL table: not present). */
static inline vector_table vector_table_of(const posenc_problem *p, int k)
{
    const posenc_term_array *a = p->terms[k].array;
    vector_table v = {a[VECTOR_TABLE].data, a[VECTOR_TABLE].head_stride ? p->H : 1,
                      p->d ? a[VECTOR_TABLE].per_unit / p->d : 0,
                      (const double *)a[VECTOR_MAP].data};
    return v;
}

/* 2^52: for 0 <= x < 2^52, x + 2^52 - 2^52 is x rounded to an integer, and the low bits of
 * x + 2^52 are that integer (vector_map_is_rows, vector_map_rows: SSE2 arithmetic a loop
 * vectorizes, no conversion instruction per entry). */
#define VECTOR_MAP_BIG 4503599627370496.0

/* Whether map[0 .. len) are integers in [0, rows), rows <= 2^52 (a decoding step's call
 * reads its map whole: one pass without branches). */
static inline int vector_map_is_rows(const double *map, size_t len, double rows)
{
    int64_t bad = 0;   /* 64-bit lanes beside the doubles' */
    for (size_t o = 0; o < len; ++o) {
        const double x = map[o];
        bad += !(x >= 0 && x < rows && (x + VECTOR_MAP_BIG) - VECTOR_MAP_BIG == x);
    }
    return bad == 0;
}

/* rows[o] = map[o] as int64 (entries vector_map_is_rows took). */
static inline void vector_map_rows(int64_t *rows, const double *map, size_t len)
{
    for (size_t o = 0; o < len; ++o) {
        const double y = map[o] + VECTOR_MAP_BIG;
        int64_t bits;
        memcpy(&bits, &y, sizeof bits);
        rows[o] = bits - (int64_t)0x4330000000000000;   /* 2^52's bits */
    }
}

/* The list's condition: the table R x d per head without a batch axis, the map shared by
 * the batch and the heads, each entry an integer row of the table (with d = 0, whose table
 * has no entries, a non-negative integer below 2^52: nothing reads it). */
static inline int term_vector_valid(const posenc_problem *p, int k)
{
    const posenc_term_array *a = p->terms[k].array;
    if (a[VECTOR_TABLE].batch_stride || a[VECTOR_MAP].batch_stride ||
        a[VECTOR_MAP].head_stride || (p->d ? a[VECTOR_TABLE].per_unit % p->d
                                           : a[VECTOR_TABLE].per_unit != 0))
        return 0;
    const double rows = p->d ? (double)(a[VECTOR_TABLE].per_unit / p->d) : VECTOR_MAP_BIG;
    return rows <= VECTOR_MAP_BIG &&
           vector_map_is_rows((const double *)a[VECTOR_MAP].data, a[VECTOR_MAP].per_unit, rows);
}

#endif /* POSENC_ENGINE_TERM_VECTORS_H */
