/*
 * terms_impl.h -- the positional terms of a row tile, one builder per term
 * kind, for one dtype (REAL, set by engine_<dtype>.c); shared by the
 * forward and the product-mode backward.
 *
 * Each builder applies one term to the rows [i0, i0 + rows) of a row block
 * P (row r at P + r * ldp, columns j in [0, cols): cols = m, or the keys a
 * causal tile sees) with `op`: SET for the first term, then ADD (sum) or
 * MUL (product).
 */
#ifndef POSENC_ENGINE_TERMS_IMPL_H
#define POSENC_ENGINE_TERMS_IMPL_H

#include "gemm_impl.h"
#include "term_vectors.h"

/* The head of a parameter whose head axis has `heads` entries (H or 1). */
static inline size_t head_of(size_t heads, size_t h) { return heads == 1 ? 0 : h; }

/* Row `row` of head h's vector table v (term_vectors.h; rows of d). */
static inline const REAL *vector_table_row(const vector_table *v, size_t h, size_t row, size_t d)
{
    return (const REAL *)v->table + (head_of(v->heads, h) * v->rows + row) * d;
}

/*
 * Whether a scale may ride on an operand before the sums (s k^T packed, vs
 * on a table, ds on pos_k) and still give the reference's IEEE results,
 * s (q.k): finite, at most 1 in magnitude (s k_j never overflows) and not
 * lost in REAL (a nonzero that rounds to 0 would turn an Inf into NaN).
 * Otherwise the terms are computed unscaled and scaled after their sums
 * (forward_tile_exact, backward_unit_end, backward_reduce).
 */
static inline int scale_tame(double s)
{
    return s >= -1 && s <= 1 && (s == 0 || (REAL)s != 0);
}

/* A call's scales, and the problem the engine computes with. */
typedef struct {
    double scale, vector_scale, dense_scale;   /* the call's */
    int exact;              /* not all tame: computed unscaled (`unit`), scaled after the sums */
    posenc_problem unit;    /* exact: the problem with unit scales */
} call_scales;

/* s from p; returns the problem to compute with: p, or s->unit (unit scales;
 * the product mode's vector_scale, 1 for every method, stays on its factors)
 * when a scale is not tame.  s must outlive the returned problem. */
static inline const posenc_problem *call_scales_init(call_scales *s, const posenc_problem *p)
{
    s->scale = p->scale;
    s->vector_scale = p->vector_scale;
    s->dense_scale = p->dense_scale;
    s->exact = !scale_tame(p->scale) || (!p->product && !scale_tame(p->vector_scale)) ||
               !scale_tame(p->dense_scale);
    if (!s->exact)
        return p;
    s->unit = *p;
    s->unit.scale = s->unit.dense_scale = 1;
    if (!p->product)
        s->unit.vector_scale = 1;
    return &s->unit;
}

/*
 * Query-side table, run by run, keys [k0, m):
 * proj[r * ld + (bucket - b_min)] = vector_scale q_i . query_table[bucket].
 */
static void term_query_table_runs(const posenc_kernels *kern, int op, REAL *P, size_t ldp,
                                  const posenc_runs *runs, const REAL *proj, size_t ld, size_t k0,
                                  size_t m, size_t i0, size_t rows)
{
    for (size_t r = 0; r < rows; ++r) {
        const ptrdiff_t i = (ptrdiff_t)(i0 + r);
        ptrdiff_t js, je, bs;
        for (size_t t = posenc_runs_seek(runs, (ptrdiff_t)k0 - i);
             t < runs->count && posenc_run_span(&runs->runs[t], i, (ptrdiff_t)k0, (ptrdiff_t)m, &js, &je, &bs);
             ++t)
            kern->row_gather(op, P + r * ldp + js, proj + r * ld + (bs - runs->b_min),
                             runs->runs[t].step, (size_t)(je - js));
    }
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

static int key_edge_has_lo(const key_edges *e) { return e->lo_end != PTRDIFF_MIN; }
static int key_edge_has_hi(const key_edges *e) { return e->hi_begin != PTRDIFF_MAX; }

/* Runs shorter than this are left to the gathers: a row operation's call
 * costs more than the few gathers it would save. */
#define KEY_EDGE_MIN 16

static key_edges key_edges_of(const posenc_runs *runs)
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
static size_t key_edge_size(const key_edges *e, size_t m)
{
    return key_edge_has_lo(e) || key_edge_has_hi(e) ? 2 * m : 0;
}

/* The keys [*lo_keys, *hi_keys) of a tile of rows [i0, i0 + rows) that are
 * in no edge for some row; below them every row is in the low edge, from
 * them on every row in the high one.  keys: the tile's [0, keys). */
static void key_edges_split(const key_edges *e, size_t i0, size_t rows, size_t keys,
                            size_t *lo_keys, size_t *hi_keys)
{
    const ptrdiff_t k = (ptrdiff_t)keys;
    ptrdiff_t lo = 0, hi = k;
    if (e && key_edge_has_lo(e) && e->lo_end > -(ptrdiff_t)i0) {   /* j - i0 < lo_end */
        lo = (ptrdiff_t)i0 + e->lo_end;
        lo = lo < k ? lo : k;
    }
    if (e && key_edge_has_hi(e) && e->hi_begin < k) {   /* j - (i0 + rows - 1) >= hi_begin */
        hi = (ptrdiff_t)(i0 + rows - 1) + e->hi_begin;
        hi = hi < lo ? lo : hi > k ? k : hi;
    }
    *lo_keys = (size_t)lo;
    *hi_keys = (size_t)hi;
}

/*
 * Key-side table: proj[j * ld + (bucket - b_min)] = vector_scale k_j .
 * key_table[bucket] (j < m, ld = buckets); along a row the needed entries
 * form a diagonal of proj, so the ISA's tile gather takes the keys block by
 * block (kern->key_block), and a row operation those in an edge (e, or NULL:
 * none; the edge columns after proj).  The tile's keys [0, cols).
 * map[o + n - 1] is the bucket of offset o.
 */
static void term_key_table(const posenc_kernels *kern, int op, REAL *P, size_t ldp,
                           const int64_t *map, ptrdiff_t b_min, const REAL *proj, size_t ld,
                           const key_edges *e, size_t n, size_t m, size_t cols, size_t i0,
                           size_t rows)
{
    const REAL *edge_lo = proj + m * ld, *edge_hi = edge_lo + m;
    size_t lo, hi;
    key_edges_split(e, i0, rows, cols, &lo, &hi);
    for (size_t r = 0; r < rows && (lo > 0 || hi < cols); ++r) {
        if (lo > 0)
            kern->row_gather(op, P + r * ldp, edge_lo, 1, lo);
        if (hi < cols)
            kern->row_gather(op, P + r * ldp + hi, edge_hi + hi, 1, cols - hi);
    }
    for (size_t j0 = lo; j0 < hi; j0 += kern->key_block)
        kern->tile_gather_key(op, P, ldp, map + (n - 1 - i0), b_min, proj, ld, j0,
                              posenc_min(j0 + kern->key_block, hi), rows);
}

/*
 * The key-side projections of unit (b, h): proj = k . (vector_scale
 * key_table[h])^T over the buckets the map uses, m x buckets, the table
 * packed into table_pack; only its columns [lo, hi) (the buckets the tiles
 * read: all, or those a causal attention's keys reach), then the columns of
 * e's edges after them (key_edge_size: lo's, then hi's).
 */
static void key_projections(const posenc_kernels *kern, const gemm_scratch *g,
                            const posenc_problem *p, const vector_table *v, ptrdiff_t b_min,
                            size_t buckets, size_t lo, size_t hi, const key_edges *e,
                            REAL *table_pack, REAL *proj, size_t h, const REAL *k_u)
{
    const size_t d = p->d;
    const REAL *table = vector_table_row(v, h, (size_t)b_min + lo, d);
    packed_b pb;
    pack_b(kern, g, &pb, table_pack, table, 1, (ptrdiff_t)d, d, hi - lo, (REAL)p->vector_scale);
    gemm_packed(kern, g, p->m, k_u, (ptrdiff_t)d, 1, &pb, proj + lo, (ptrdiff_t)buckets, 0,
                NULL, 0, NULL, 0, NULL);
    REAL *edge_lo = proj + p->m * buckets;   /* the edges' columns, where computed */
    if (key_edge_has_lo(e) && lo <= e->lo && e->lo < hi)
        kern->row_gather(POSENC_SET, edge_lo, proj + e->lo, (ptrdiff_t)buckets, p->m);
    if (key_edge_has_hi(e) && lo <= e->hi && e->hi < hi)
        kern->row_gather(POSENC_SET, edge_lo + p->m, proj + e->hi, (ptrdiff_t)buckets, p->m);
}

/*
 * What a call's vector tables read, derived from the problem once per call
 * (the fused attention's backward builds it once for its logits and its
 * gradients): the tables (term_vectors.h: their maps are what the kernels' gathers and
 * scatters read) and the maps as runs (and the key map's edges).
 */
typedef struct {
    vector_table query, key;               /* table NULL: absent */
    posenc_runs query_runs, key_runs;
    size_t query_buckets, key_buckets;     /* buckets the maps use */
    key_edges key_edges;                   /* the key map's edges */
} term_data;

/*
 * The query-side term of a row tile, keys [0, cols): proj = q[rows] .
 * (vector_scale query_table[h])^T over the buckets the map uses (the table
 * packed once per head, cached: *cached_head is the head table_pack holds),
 * then gathered into P with op.  reach (or NULL: all): the buckets [reach[0],
 * reach[1]) (from b_min) the tile's offsets use, the only columns of proj
 * computed when the packed table is one block deep (d <= kc).
 */
/* The query table's term of rows [i0, i0 + rows), keys [k0, cols), from their projections
 * (proj, rows ld apart, column bucket - b_min) into P with op. */
static void term_query_gather(const posenc_kernels *kern, const posenc_problem *p,
                              const posenc_runs *runs, const int64_t *map, const REAL *proj,
                              size_t ld, int op, REAL *P, size_t ldp, size_t i0, size_t rows,
                              size_t k0, size_t cols)
{
    if (posenc_runs_short(runs, p->n + p->m - 1))   /* map_r0[j - r]: from key k0 by a shift */
        kern->tile_gather_query(op, P + k0, ldp, map + (p->n - 1 - i0) + k0, runs->b_min,
                                proj, ld, cols - k0, rows);
    else
        term_query_table_runs(kern, op, P, ldp, runs, proj, ld, k0, cols, i0, rows);
}

static void term_query_table(const posenc_kernels *kern, const gemm_scratch *g,
                             const posenc_problem *p, const term_data *td, REAL *table_pack,
                             ptrdiff_t *cached_head, REAL *proj, size_t h, const REAL *q_u, int op,
                             REAL *P, size_t ldp, size_t i0, size_t rows, size_t k0, size_t cols,
                             const size_t *reach)
{
    const posenc_runs *runs = &td->query_runs;
    const size_t d = p->d, buckets = td->query_buckets, ld = posenc_round_up(buckets, kern->nr);
    const size_t ht = head_of(td->query.heads, h);
    packed_b pb = packed_b_shape(kern, table_pack, d, buckets, (REAL)p->vector_scale);
    if (*cached_head != (ptrdiff_t)ht) {
        const REAL *table = vector_table_row(&td->query, h, (size_t)runs->b_min, d);
        pack_b(kern, g, &pb, table_pack, table, 1, (ptrdiff_t)d, d, buckets, (REAL)p->vector_scale);
        *cached_head = (ptrdiff_t)ht;
    }
    size_t first = 0;   /* the first column of proj computed: a panel's */
    if (reach && d <= kern->kc && reach[0] < reach[1]) {
        first = reach[0] / pb.nr * pb.nr;
        packed_b_skip(&pb, first);   /* from panel first / nr of the one block of depth d */
        pb.N = reach[1] - first;
    }
    gemm_packed(kern, g, rows, q_u + i0 * d, (ptrdiff_t)d, 1, &pb, proj + first, (ptrdiff_t)ld,
                0, NULL, 0, NULL, 0, NULL);
    term_query_gather(kern, p, runs, td->query.map, proj, ld, op, P, ldp, i0, rows, k0, cols);
}

/* t built for p: the vector tables, their maps and runs.  POSENC_OK or ENOMEM (what was
 * built is term_data_release's to free). */
static int term_data_build(term_data *t, const posenc_problem *p)
{
    const size_t n = p->n, m = p->m, offsets = n && m ? n + m - 1 : 0;
    memset(t, 0, sizeof *t);
    t->query = vector_table_of(p, POSENC_TERM_query_table);
    t->key = vector_table_of(p, POSENC_TERM_key_table);
    if (t->query.table) {
        if (posenc_runs_build(&t->query_runs, t->query.map, -(ptrdiff_t)(n - 1), offsets))
            return POSENC_ENOMEM;
        t->query_buckets = posenc_runs_buckets(&t->query_runs);
    }
    if (t->key.table) {
        if (posenc_runs_build(&t->key_runs, t->key.map, -(ptrdiff_t)(n - 1), offsets))
            return POSENC_ENOMEM;
        t->key_buckets = posenc_runs_buckets(&t->key_runs);
        t->key_edges = key_edges_of(&t->key_runs);
    }
    return POSENC_OK;
}

static void term_data_release(term_data *t)
{
    posenc_runs_free(&t->query_runs);
    posenc_runs_free(&t->key_runs);
}

#endif /* POSENC_ENGINE_TERMS_IMPL_H */
