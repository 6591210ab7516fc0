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
#include "runs.h"

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


/*
 * The key map's edges: its first and last runs where one bucket holds many
 * offsets (a clipped map's j - i <= -t and >= t).  Along a row a key-side
 * term reads a diagonal of proj, one gather per key; in an edge it reads one
 * column of proj, which key_projections copies contiguous once per unit
 * (key_edge_size's 2 m elements: lo's m keys, then hi's), so that a tile's keys in an edge go
 * through a row operation instead.  The same values either way.
 */
typedef struct {
    ptrdiff_t lo_end;     /* offsets o < lo_end: column lo of proj (PTRDIFF_MIN: no low edge) */
    ptrdiff_t hi_begin;   /* offsets o >= hi_begin: column hi (PTRDIFF_MAX: no high edge) */
    size_t lo, hi;
} key_edges;

static inline int key_edge_has_lo(const key_edges *e) { return e->lo_end != PTRDIFF_MIN; }
static inline int key_edge_has_hi(const key_edges *e) { return e->hi_begin != PTRDIFF_MAX; }

/* Runs shorter than this are left to the gathers: a row operation's call
 * costs more than the few gathers it would save. */
#define KEY_EDGE_MIN 16

static inline key_edges key_edges_of(const posenc_runs *runs)
{
    key_edges e = {PTRDIFF_MIN, PTRDIFF_MAX, 0, 0};
    if (runs->count == 0)
        return e;
    const posenc_run *first = &runs->runs[0], *last = &runs->runs[runs->count - 1];
    if (first->step == 0 && first->o_end - first->o_begin >= KEY_EDGE_MIN) {
        e.lo_end = first->o_end;
        e.lo = (size_t)(first->b_begin - runs->b_min);
    }
    if (runs->count > 1 && last->step == 0 && last->o_end - last->o_begin >= KEY_EDGE_MIN) {
        e.hi_begin = last->o_begin;
        e.hi = (size_t)(last->b_begin - runs->b_min);
    }
    return e;
}

/* Elements of the edge columns after proj (m x buckets). */
static inline size_t key_edge_size(const key_edges *e, size_t m)
{
    return key_edge_has_lo(e) || key_edge_has_hi(e) ? 2 * m : 0;
}

/*
 * What a call reads of one vector table, built once per call by the kind's `prepare` (the
 * fused attention's backward reads its logits' for its gradients): the table, its map as
 * runs over the offsets, the buckets the map uses, and (the key side) its edges; under a
 * causal attention the buckets its tiles reach (the map indices up to the call's reach:
 * terms_call): the key side's [reach[0], reach[1]) (from b_min), the query side's per
 * tile ending at row t, [row_reach[2 t], row_reach[2 t + 1]).  Without a reach: all.
 */
typedef struct {
    vector_table table;      /* table NULL: absent */
    posenc_runs runs;
    size_t buckets;
    key_edges edges;
    size_t reach[2];
    size_t *row_reach;       /* NULL: no reach */
} vector_call;

/* The call's data of kind k of p (present: its table given), the map indices up to `reach`
 * (-1: no reach) read by a causal attention's tiles.  POSENC_OK or ENOMEM (what was built
 * is vector_call_free's). */
static inline int vector_call_build(vector_call *v, const posenc_problem *p, int k,
                                    ptrdiff_t reach, int query_side)
{
    const size_t n = p->n, offsets = p->n && p->m ? p->n + p->m - 1 : 0;
    memset(v, 0, sizeof *v);
    v->table = vector_table_of(p, k);
    if (offsets == 0)
        return POSENC_OK;
    if (posenc_runs_build(&v->runs, v->table.map, -(ptrdiff_t)(n - 1), offsets))
        return POSENC_ENOMEM;
    v->buckets = posenc_runs_buckets(&v->runs);
    v->edges = key_edges_of(&v->runs);
    v->reach[1] = v->buckets;
    /* no reach, or one that holds every offset a tile reads (a decoding step's last rows:
     * query_offset + n = m; the query side's tiles ending at row t reach past -t, so for it
     * only with one row): every bucket, as the extents would find */
    if (reach < 0 || ((size_t)reach + 1 >= offsets && (!query_side || n == 1)))
        return POSENC_OK;
    ptrdiff_t lo = v->runs.b_max, hi = v->runs.b_min;
    if (!query_side) {   /* the offsets j - i up to a tile's last row's */
        posenc_map_extent(v->table.map, 0, (size_t)reach + 1, &lo, &hi);
        v->reach[0] = (size_t)(lo - v->runs.b_min);
        v->reach[1] = (size_t)(hi - v->runs.b_min + 1);
        return POSENC_OK;
    }
    if (!(v->row_reach = (size_t *)posenc_alloc(2 * n, sizeof(size_t))))
        return POSENC_ENOMEM;
    posenc_map_extent(v->table.map, n - 1, (size_t)reach + 1, &lo, &hi);   /* offsets 0 .. */
    for (size_t t = 0; t < n; ++t) {                                       /* and -t */
        posenc_map_extent(v->table.map, n - 1 - t, n - t, &lo, &hi);
        v->row_reach[2 * t] = (size_t)(lo - v->runs.b_min);
        v->row_reach[2 * t + 1] = (size_t)(hi - v->runs.b_min + 1);
    }
    return POSENC_OK;
}

static inline void vector_call_free(vector_call *v)
{
    posenc_runs_free(&v->runs);
    posenc_free(v->row_reach);
}

#endif /* POSENC_ENGINE_TERM_VECTORS_H */
