/*
 * term_vectors_impl.h -- the vector-table kinds (term_vectors.h: csrc/terms.h's query_table
 * and key_table, term_query_table_impl.h, term_key_table_impl.h) for one dtype (REAL): the
 * builders of their rows on a tile (the query side a GEMM of the tile's q rows onto the
 * packed table, then gathers along the map; the key side gathers from the unit's key
 * projections, k onto every bucket), their rows on a decoding step's few rows (dot products
 * with the tables in place), and what the two kinds' files share.  The product mode's
 * backward builds its factors with the same builders (backward_product_impl.h).
 */
#ifndef POSENC_ENGINE_TERM_VECTORS_IMPL_H
#define POSENC_ENGINE_TERM_VECTORS_IMPL_H

#include "gemm_impl.h"
#include "term_unit_impl.h"
#include "term_vectors.h"

/* The head of a parameter whose head axis has `heads` entries (H or 1). */
static inline size_t head_of(size_t heads, size_t h) { return heads == 1 ? 0 : h; }

/* Row `row` of head h's vector table v (term_vectors.h; rows of d). */
static inline const REAL *vector_table_row(const vector_table *v, size_t h, size_t row, size_t d)
{
    return (const REAL *)v->table + (head_of(v->heads, h) * v->rows + row) * d;
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

/* Head h's query table as a GEMM's B (d x buckets, vector_scale on it) in table_pack: its
 * shape, the table packed where `pack`. */
static packed_b query_table_packed(const posenc_kernels *kern, const gemm_scratch *g,
                                   const posenc_problem *p, const vector_call *v,
                                   REAL *table_pack, size_t h, int pack)
{
    const size_t d = p->d;
    packed_b pb = packed_b_shape(kern, table_pack, d, v->buckets, (REAL)p->vector_scale);
    if (pack)
        pack_b(kern, g, &pb, table_pack, vector_table_row(&v->table, h, (size_t)v->runs.b_min, d),
               1, (ptrdiff_t)d, d, v->buckets, (REAL)p->vector_scale);
    return pb;
}

/*
 * The query-side term of a row tile, keys [k0, cols): proj = q[rows] . (vector_scale
 * query_table[h])^T over the buckets the map uses (pb: the table packed,
 * query_table_packed), then gathered into P with op.  reach (or NULL: all): the buckets
 * [reach[0], reach[1]) (from b_min) the tile's offsets use, the only columns of proj
 * computed when the packed table is one block deep (d <= kc).
 */
static void term_query_rows(const posenc_kernels *kern, const gemm_scratch *g,
                            const posenc_problem *p, const vector_call *v, const packed_b *table,
                            REAL *proj, const REAL *q_u, int op, REAL *P, size_t ldp, size_t i0,
                            size_t rows, size_t k0, size_t cols, const size_t *reach)
{
    const size_t d = p->d, ld = posenc_round_up(v->buckets, kern->nr);
    packed_b pb = *table;
    size_t first = 0;   /* the first column of proj computed: a panel's */
    if (reach && d <= kern->kc && reach[0] < reach[1]) {
        first = reach[0] / pb.nr * pb.nr;
        packed_b_skip(&pb, first);   /* from panel first / nr of the one block of depth d */
        pb.N = reach[1] - first;
    }
    gemm_packed(kern, g, rows, q_u + i0 * d, (ptrdiff_t)d, 1, &pb, proj + first, (ptrdiff_t)ld,
                0, NULL, 0, NULL, 0, NULL);
    term_query_gather(kern, p, &v->runs, v->table.map, proj, ld, op, P, ldp, i0, rows, k0, cols);
}

/*
 * The query table's term of rows [i0, i0 + rows) of head h, keys [k0, cols), applied to P
 * with op, when the rows are few (a decoding step: terms_call's direct): their projections
 * on the buckets they reach (reach, or NULL: all) as dot products with the table's rows in
 * place (rows_dot) into proj (rows the buckets rounded up to nr apart), instead of packing the
 * whole table for a GEMM of a row or two.
 */
static void term_query_direct(const posenc_kernels *kern, const posenc_problem *p,
                              const vector_call *v, size_t h, const REAL *q_u, REAL *proj, int op,
                              REAL *P, size_t ldp, size_t i0, size_t rows, size_t k0, size_t cols,
                              const size_t *reach)
{
    const size_t d = p->d, buckets = v->buckets, ld = posenc_round_up(buckets, kern->nr);
    const size_t lo = reach ? reach[0] : 0, hi = reach ? posenc_max(reach[0], reach[1]) : buckets;
    const REAL *table = vector_table_row(&v->table, h, (size_t)v->runs.b_min, d);
    kern->rows_dot(proj + lo, ld, q_u + i0 * d, rows, table + lo * d, hi - lo, d,
                   p->vector_scale);
    term_query_gather(kern, p, &v->runs, v->table.map, proj, ld, op, P, ldp, i0, rows, k0, cols);
}

/* The key table's term of keys [js, je), one run of the key map (bucket bs at key js,
 * moving by step per key), into row[js, je): vector_scale k_j . table[bucket], one
 * rows_dot where the bucket holds, a key at a time where it moves. */
static void key_run_terms(const posenc_kernels *kern, const posenc_problem *p, const REAL *table,
                          const REAL *k_u, REAL *row, ptrdiff_t js, ptrdiff_t je, ptrdiff_t bs,
                          ptrdiff_t step)
{
    const size_t d = p->d;
    if (step == 0) {
        kern->rows_dot(row + js, 0, table + (size_t)bs * d, 1, k_u + (size_t)js * d,
                       (size_t)(je - js), d, p->vector_scale);
        return;
    }
    for (ptrdiff_t j = js; j < je; ++j, bs += step)
        kern->rows_dot(row + j, 0, table + (size_t)bs * d, 1, k_u + (size_t)j * d, 1, d,
                       p->vector_scale);
}

/*
 * The key table's term of rows [i0, i0 + rows) of head h, keys [k0, cols), applied to P
 * with op, when the rows are few (a decoding step: terms_call's direct): key j of row i is
 * vector_scale k_j . key_table[h, map(j - i)], a dot product per key, along the runs of
 * the map (key_run_terms), into `row`: k is read once per row instead of being projected
 * onto every bucket the row reaches (m x buckets).  With `fused` the row was formed in the
 * content's pass over k (term_key_table_content_row: one row, keys [k0, cols)).
 */
static void term_key_direct(const posenc_kernels *kern, const posenc_problem *p,
                            const vector_call *v, size_t h, const REAL *k_u, REAL *row, int fused,
                            int op, REAL *P, size_t ldp, size_t i0, size_t rows, size_t k0,
                            size_t cols)
{
    const posenc_runs *runs = &v->runs;
    const REAL *table = vector_table_row(&v->table, h, 0, p->d);
    for (size_t r = 0; r < rows; ++r) {
        const ptrdiff_t i = (ptrdiff_t)(i0 + r);
        ptrdiff_t js, je, bs;
        if (!fused)
            for (size_t t = posenc_runs_seek(runs, (ptrdiff_t)k0 - i);
                 t < runs->count &&
                 posenc_run_span(&runs->runs[t], i, (ptrdiff_t)k0, (ptrdiff_t)cols, &js, &je, &bs);
                 ++t)
                key_run_terms(kern, p, table, k_u, row, js, je, bs, runs->runs[t].step);
        if (cols > k0)
            kern->row_gather(op, P + r * ldp + k0, row + k0, 1, cols - k0);
    }
}

/* Kind k's data in the call c (a vector kind's: vector_prepare), or an empty one (its table
 * NULL, no buckets) where p has none. */
static const vector_call *vector_call_of(const terms_call *c, int k)
{
    static const vector_call none;
    return c->data[k] ? (const vector_call *)c->data[k] : &none;
}

/* Both kinds' prepare and release (kind k: POSENC_TERM_query_table or key_table). */
static int vector_prepare(const posenc_problem *p, const terms_call *call, int k, void **data)
{
    vector_call *v = (vector_call *)posenc_alloc(1, sizeof *v);
    *data = v;
    return v ? vector_call_build(v, p, k, call->reach, k == POSENC_TERM_query_table)
             : POSENC_ENOMEM;
}

static void vector_release(void *data)
{
    vector_call_free((vector_call *)data);
    posenc_free(data);
}

/* The REAL elements of a kind's table packed as a GEMM's B (d x buckets), aligned. */
static size_t vector_pack_size(const posenc_problem *p, const posenc_kernels *kern,
                               const vector_call *v)
{
    return posenc_round_up(packed_b_size(p->d, v->buckets, kern->nr), 16);
}

#endif /* POSENC_ENGINE_TERM_VECTORS_IMPL_H */
