/*
 * term_vectors_grad_impl.h -- the vector-table kinds' backward (term_vectors.h; their
 * files term_query_table_impl.h, term_key_table_impl.h fill term_kind's grad_ hooks with
 * these), for one dtype (REAL): a unit's rows of G (a product's effective gradient of the
 * kind's factor) summed into its bucket matrix along the map (X: Gq, n x buckets, for the
 * query side, row by row and run by run; Gk, m x buckets, for the key side, by the ISA's
 * tile scatter, the adjoint of term_key_table, with the map's edges held contiguous), then
 * two GEMMs skipping X's zero blocks (spans.h): dx += vs X.table and the unit's slot of
 * the table's gradient, vs X^T.x; where an operand holds an Inf or NaN, the products row
 * by row over the buckets reached (NaN and Inf reach exactly what depends on them; a fused
 * attention's masked keys never: term_env's seen).  The slots are summed over the batch
 * in a fixed (h, b) order in double (vector_grad_reduce): bitwise the same for any number
 * of threads.
 */
#ifndef POSENC_ENGINE_TERM_VECTORS_GRAD_IMPL_H
#define POSENC_ENGINE_TERM_VECTORS_GRAD_IMPL_H

#include "gemm_impl.h"
#include "scales_impl.h"
#include "term_unit_impl.h"
#include "term_vectors_impl.h"

/* What a backward call of a vector kind holds (vector_grad_prepare). */
typedef struct {
    const vector_call *v;
    int key_side;            /* the key table (X: Gk, x: k), or the query table (Gq, q) */
    int masked, cls_row0;    /* the plan's: the reset's cells are not the kind's */
    posenc_spans spans;      /* where the unit's X is zero (its GEMMs skip the blocks) */
    REAL *slots;             /* the table's gradient per unit, units x buckets x d, zeroed;
                                NULL: not wanted */
    double *out;             /* g's gradient of the table (batch row 0's units), or NULL */
    int shared;              /* the key side of one table on both sides: out is the query
                                side's, to which its sums are added (M4, M4M) */
} vector_grad_call;

/* A thread's workspace of the kind (vector_grad_layout). */
typedef struct {
    REAL *X;                 /* the unit's bucket matrix, rows x buckets */
    REAL *reach;             /* the buckets one row of X reaches (vector_table_exact) */
    REAL *b_pack;            /* the GEMMs' packed B */
    REAL *x_wide;            /* q or k widened from its bfloat16 twin (x_all_finite) */
    REAL *edge_sums;         /* key side with edges: 2 m, the low edge's keys, then the high's */
    size_t *edge;            /* key side with edges: keys [edge[0], edge[1]) of the low edge's
                                column and [edge[2], edge[3]) of the high one's held in
                                edge_sums (scatter_key_rows) */
} vector_grad_ws;

/* The workspace's size in REAL elements; carved from mem into w where w != NULL. */
static size_t vector_grad_layout(const posenc_problem *p, const posenc_kernels *kern,
                                 const vector_grad_call *gc, vector_grad_ws *w, REAL *mem)
{
    const size_t rows = gc->key_side ? p->m : p->n, buckets = gc->v->buckets, d = p->d;
    const int edges = gc->key_side && key_edge_size(&gc->v->edges, p->m);
    size_t at = 0;
    if (w)
        memset(w, 0, sizeof *w);
    WS_TAKE(w, mem, at, X, rows * buckets);
    WS_TAKE(w, mem, at, reach, buckets);
    WS_TAKE(w, mem, at, b_pack, packed_b_size(posenc_max(rows, buckets), d, kern->nr));
    if (kern->bf16)
        WS_TAKE(w, mem, at, x_wide, rows * d);
    if (edges) {
        WS_TAKE(w, mem, at, edge_sums, key_edge_size(&gc->v->edges, p->m));
        WS_TAKE(w, mem, at, edge, term_reals(4 * sizeof(size_t)));
    }
    return at;
}

static vector_grad_ws vector_grad_ws_of(const term_unit *t)
{
    vector_grad_ws w;
    vector_grad_layout(t->p, t->kern, (const vector_grad_call *)t->grad, &w, t->unit_data);
    return w;
}

/* What the call reads of kind k (POSENC_TERM_query_table or key_table): *data NULL where it
 * wants neither the table's gradient nor x's. */
static int vector_grad_prepare(const posenc_problem *p, const posenc_kernels *kern,
                               const terms_call *call, const term_grad_plan *plan, int k,
                               void **data)
{
    const posenc_grads *g = plan->g;
    const int key_side = k == POSENC_TERM_key_table;
    double *out = (double *)g->terms[k][VECTOR_TABLE];
    *data = NULL;
    if (!(key_side ? g->k : g->q) && !out)
        return POSENC_OK;
    vector_grad_call *gc = (vector_grad_call *)posenc_alloc(1, sizeof *gc);
    if (!gc)
        return POSENC_ENOMEM;
    memset(gc, 0, sizeof *gc);
    *data = gc;
    gc->v = vector_call_of(call, k);
    gc->key_side = key_side;
    gc->masked = plan->masked;
    gc->cls_row0 = plan->cls_row0;
    gc->out = out;
    gc->shared =   /* one table read on both sides: one buffer */
        key_side && out && g->terms[POSENC_TERM_query_table][VECTOR_TABLE] == out;
    const size_t width = posenc_mul_size(gc->v->buckets, p->d);
    if (posenc_spans_build(&gc->spans, &gc->v->runs, gc->v->table.map, p->n, p->m, key_side,
                           key_side || !plan->masked ? 0 : 1, kern->mr, plan->o_max))
        return POSENC_ENOMEM;
    if (out) {
        if (!(gc->slots = (REAL *)posenc_alloc(posenc_mul_size(plan->units, width), sizeof(REAL))))
            return POSENC_ENOMEM;
        memset(gc->slots, 0, sizeof(REAL) * plan->units * width);
    }
    return POSENC_OK;
}

static void vector_grad_release(void *data)
{
    vector_grad_call *gc = (vector_grad_call *)data;
    posenc_spans_free(&gc->spans);
    posenc_free(gc->slots);
    posenc_free(gc);
}

static size_t vector_grad_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                       const void *data)
{
    return vector_grad_layout(p, kern, (const vector_grad_call *)data, NULL, NULL);
}

/* The unit's X zeroed, its edges empty. */
static void vector_grad_begin(const term_unit *t)
{
    const vector_grad_call *gc = (const vector_grad_call *)t->grad;
    const vector_grad_ws w = vector_grad_ws_of(t);
    memset(w.X, 0, sizeof(REAL) * (gc->key_side ? t->p->m : t->p->n) * gc->v->buckets);
    if (w.edge)
        memset(w.edge, 0, 4 * sizeof(size_t));
}

/*
 * G row i (columns [jb, m)) scattered into its query-side buckets:
 * Gq[i, bucket], run by run.  Short runs (log buckets: a few keys per
 * bucket) are summed in place rather than through the ISA's row kernel,
 * whose setup would dominate them.
 */
static void scatter_query_side(const posenc_kernels *kern, const posenc_runs *runs,
                               REAL *side_row, const REAL *src, ptrdiff_t i, ptrdiff_t jb,
                               ptrdiff_t m)
{
    ptrdiff_t js, je, bs;
    for (size_t t = posenc_runs_seek(runs, jb - i);
         t < runs->count && posenc_run_span(&runs->runs[t], i, jb, m, &js, &je, &bs); ++t) {
        REAL *dst = side_row + (bs - runs->b_min);
        const ptrdiff_t step = runs->runs[t].step;
        if (je - js > 16) {
            kern->row_scatter_add(dst, step, src + js, (size_t)(je - js));
        } else if (step == 0) {
            REAL sum = src[js];
            for (ptrdiff_t j = js + 1; j < je; ++j)
                sum += src[j];
            *dst += sum;
        } else {
            for (ptrdiff_t j = js; j < je; ++j, dst += step)
                *dst += src[j];
        }
    }
}

/* An edge column of Gk (side's column `bucket`) and its keys held
 * contiguous in `sums`: keys [from, to) moved in (sums = side) or out. */
static void key_edge_move(const posenc_kernels *kern, REAL *side, size_t ld_side, size_t bucket,
                          REAL *sums, size_t from, size_t to, int in)
{
    if (from >= to)
        return;
    if (in)
        kern->row_gather(POSENC_SET, sums + from, side + from * ld_side + bucket,
                         (ptrdiff_t)ld_side, to - from);
    else   /* set, not added: the sums began from side's entries (row_scatter_add only adds) */
        for (size_t j = from; j < to; ++j)
            side[j * ld_side + bucket] = sums[j];
}

/*
 * Rows [i0, i0 + rows) of an effective gradient (row r at src + r * ld_src)
 * scattered into their key-side buckets: Gk[j, map(j - i)] += src[r, j] (the
 * ISA's tile scatter, the adjoint of term_key_table).  Columns < jb and rows
 * below r0 belong to theta; keys [0, cols).  A bucket's sum runs
 * over i in order.  Keys in an edge of the map (key_edges) for every row go
 * to its column held contiguous (w->edge_sums: taken from Gk when a key
 * enters the edge, put back when it leaves or the unit ends,
 * scatter_key_edges_end), by row operations: the same sums in the same order.
 */
static void scatter_key_rows(const term_unit *t, const vector_grad_ws *w, const REAL *src,
                             size_t ld_src, size_t cols, size_t i0, size_t rows, size_t jb,
                             size_t r0)
{
    const posenc_kernels *kern = t->kern;
    const posenc_problem *p = t->p;
    const vector_call *v = ((const vector_grad_call *)t->grad)->v;
    const size_t ld_side = v->buckets, m = p->m;
    size_t lo = jb, hi = cols;
    if (w->edge_sums && rows > r0) {
        const key_edges *e = &v->edges;
        REAL *lo_sums = w->edge_sums, *hi_sums = lo_sums + m;
        size_t *lo_first = &w->edge[0], *lo_end = &w->edge[1];
        size_t *hi_first = &w->edge[2], *hi_end = &w->edge[3];
        key_edges_split(e, i0 + r0, rows - r0, cols, &lo, &hi);
        lo = posenc_max(lo, jb);
        hi = posenc_max(hi, lo);
        /* the edges only grow (lo) and move right (hi) as i0 does: keys below
         * hi leave the high edge, keys up to lo and up to cols enter them */
        key_edge_move(kern, w->X, ld_side, e->hi, hi_sums, *hi_first, posenc_min(*hi_end, hi), 0);
        *hi_first = posenc_max(*hi_first, hi);
        if (lo > jb) {
            if (*lo_end == 0)   /* the first keys: from jb on (column 0 may be theta's) */
                *lo_first = *lo_end = jb;
            key_edge_move(kern, w->X, ld_side, e->lo, lo_sums, *lo_end, lo, 1);
            *lo_end = posenc_max(*lo_end, lo);
            for (size_t r = r0; r < rows; ++r)
                kern->row_gather(POSENC_ADD, lo_sums + jb, src + r * ld_src + jb, 1, lo - jb);
        }
        if (hi < cols) {
            const size_t from = posenc_max(*hi_end, hi);
            key_edge_move(kern, w->X, ld_side, e->hi, hi_sums, from, cols, 1);
            *hi_end = posenc_max(*hi_end, cols);
            for (size_t r = r0; r < rows; ++r)
                kern->row_gather(POSENC_ADD, hi_sums + hi, src + r * ld_src + hi, 1, cols - hi);
        }
    }
    for (size_t j0 = lo; j0 < hi; j0 += kern->key_block)
        kern->tile_scatter_key(w->X, ld_side, v->table.map + (p->n - 1 - i0), v->runs.b_min, src,
                               ld_src, j0, posenc_min(j0 + kern->key_block, hi), r0, rows);
}

/* The unit's edge columns put back into Gk (before its GEMMs read it). */
static void scatter_key_edges_end(const term_unit *t, const vector_grad_ws *w)
{
    if (!w->edge_sums)
        return;
    const vector_call *v = ((const vector_grad_call *)t->grad)->v;
    const size_t m = t->p->m;
    key_edge_move(t->kern, w->X, v->buckets, v->edges.lo, w->edge_sums, w->edge[0], w->edge[1],
                  0);
    key_edge_move(t->kern, w->X, v->buckets, v->edges.hi, w->edge_sums + m, w->edge[2],
                  w->edge[3], 0);
}

/*
 * Rows [i0, i0 + rows) of G (keys [0, cols): m, or those a causal block sees, 0 past them)
 * into X, without the reset's cells (column 0 where masked; the [CLS] row, local row 0,
 * where cls_row0): the query side row by row, the key side at once or, with edges, in
 * tiles of mr rows, whose keys outside the edges are mr + 2 t wide (a clipped map's), where
 * a block's would be rows + 2 t.
 */
static void vector_grad_sums(const term_unit *t, const REAL *G, size_t ldg, size_t i0,
                             size_t rows, size_t cols)
{
    const vector_grad_call *gc = (const vector_grad_call *)t->grad;
    const vector_grad_ws w = vector_grad_ws_of(t);
    const size_t jb = gc->masked ? 1 : 0;
    if (!gc->key_side) {
        for (size_t i = i0; i < i0 + rows; ++i)
            if (!(gc->cls_row0 && i == 0))   /* the [CLS] row belongs to the reset */
                scatter_query_side(t->kern, &gc->v->runs, w.X + i * gc->v->buckets,
                                   G + (i - i0) * ldg, (ptrdiff_t)i, (ptrdiff_t)jb,
                                   (ptrdiff_t)cols);
        return;
    }
    const size_t r0 = gc->cls_row0 && i0 == 0 ? 1 : 0;
    const size_t step = w.edge_sums ? t->kern->mr : posenc_max(rows, 1);
    for (size_t t0 = 0; t0 < rows; t0 += step)
        scatter_key_rows(t, &w, G + t0 * ldg, ldg, cols, i0 + t0, posenc_min(step, rows - t0),
                         jb, t0 == 0 ? r0 : 0);
}

/*
 * reach[r] = 1 for the buckets that row x of a bucket matrix reaches, else 0:
 * query side, query x with keys [jb, m) (none for the [CLS] row); key side,
 * key x (none below jb) with queries from 0 (1 past the [CLS] row).
 */
static void bucket_reach(const posenc_problem *p, const vector_grad_call *gc, size_t x,
                         REAL *reach)
{
    const posenc_runs *runs = &gc->v->runs;
    const int key_side = gc->key_side;
    const ptrdiff_t n = (ptrdiff_t)p->n, m = (ptrdiff_t)p->m, jb = gc->masked ? 1 : 0;
    const ptrdiff_t i_lo = gc->cls_row0 ? 1 : 0, at = (ptrdiff_t)x;
    memset(reach, 0, sizeof(REAL) * posenc_runs_buckets(runs));
    /* the offsets o = j - i of the row, [o_lo, o_hi) */
    ptrdiff_t o_lo = key_side ? at - (n - 1) : jb - at, o_hi = key_side ? at - i_lo + 1 : m - at;
    if ((key_side && at < jb) || (!key_side && at < i_lo))
        o_hi = o_lo;
    ptrdiff_t os, oe, bs;
    for (size_t t = posenc_runs_seek(runs, o_lo);
         t < runs->count && posenc_run_span(&runs->runs[t], 0, o_lo, o_hi, &os, &oe, &bs); ++t) {
        const ptrdiff_t step = runs->runs[t].step, count = step ? oe - os : 1;
        for (ptrdiff_t k = 0; k < count; ++k)
            reach[bs + step * k - runs->b_min] = 1;
    }
}

/*
 * A fused attention's key side (seen: its masks): key_seen[j buckets + r] = 1 for the
 * buckets r that key j reaches with the rows that see it, else 0, so that a key masked for
 * a row is never read for it (SPEC §6: its entries of Gk are 0, and 0 times its Inf or NaN
 * would be NaN).  Batch row b; NULL out of memory.
 */
static unsigned char *key_side_seen(const term_unit *t, const term_seen *seen, size_t b,
                                    size_t buckets)
{
    const posenc_problem *p = t->p;
    const vector_grad_call *gc = (const vector_grad_call *)t->grad;
    const size_t n = p->n, m = p->m, i_lo = gc->cls_row0 ? 1 : 0, jb = gc->masked ? 1 : 0;
    unsigned char *key_seen = (unsigned char *)posenc_alloc(posenc_mul_size(m, buckets), 1);
    REAL *row = (REAL *)posenc_alloc(m, sizeof(REAL));
    if (!key_seen || !row) {
        posenc_free(key_seen);
        posenc_free(row);
        return NULL;
    }
    memset(key_seen, 0, m * buckets);
    for (size_t i = i_lo; i < n; ++i) {
        static const REAL one = 1;
        t->kern->row_gather(POSENC_SET, row, &one, 0, m);
        seen->unseen_zero(seen->ctx, row, b, i, m);
        const int64_t *map = gc->v->table.map + (n - 1 - i);   /* key j's bucket: map[j] */
        for (size_t j = jb; j < m; ++j) {
            const size_t r = (size_t)(map[j] - gc->v->runs.b_min);
            if (row[j] != 0 && r < buckets)
                key_seen[j * buckets + r] = 1;
        }
    }
    posenc_free(row);
    return key_seen;
}

/*
 * A fused attention's k for the key side's bucket sums (seen: its masks): a copy of the
 * unit's k with the rows of the keys that no row of batch row b sees set to 0.  Their rows
 * of Gk are 0, so the GEMM's sums are those of k itself, and a masked key's Inf or NaN
 * stays out of them (SPEC §6).  NULL out of memory.
 */
static REAL *key_side_seen_k(const term_unit *t, const term_seen *seen, size_t b, const REAL *k)
{
    const posenc_problem *p = t->p;
    const size_t n = p->n, m = p->m, d = p->d;
    REAL *copy = (REAL *)posenc_alloc(posenc_mul_size(m, d), sizeof(REAL));
    REAL *any = (REAL *)posenc_alloc(2 * m, sizeof(REAL)), *row = any + m;
    if (copy && any) {
        static const REAL zero = 0, one = 1;
        t->kern->row_gather(POSENC_SET, any, &zero, 0, m);
        for (size_t i = 0; i < n; ++i) {   /* any[j] != 0: some row sees key j */
            t->kern->row_gather(POSENC_SET, row, &one, 0, m);
            seen->unseen_zero(seen->ctx, row, b, i, m);
            t->kern->row_gather(POSENC_ADD, any, row, 1, m);
        }
        for (size_t j = 0; j < m; ++j)
            if (any[j] != 0)
                memcpy(copy + j * d, k + j * d, sizeof(REAL) * d);
            else
                memset(copy + j * d, 0, sizeof(REAL) * d);
    } else {
        posenc_free(copy);
        copy = NULL;
    }
    posenc_free(any);
    return copy;
}

/*
 * vector_grad_end's GEMMs without their products of exact zeros: row x of X times only
 * the table rows it reaches (dx), or into only those slot rows (slot).  For a table (dx)
 * or an x (slot) holding Inf or NaN, where 0 * Inf would put a NaN into gradients that do
 * not depend on it.  key_seen (key side, key_side_seen): the buckets a key reaches with
 * the rows that see it.
 */
static void vector_table_exact(const term_unit *t, const vector_grad_ws *w, const REAL *table,
                               const REAL *x, REAL vs, REAL *dx, REAL *slot,
                               const unsigned char *key_seen)
{
    const vector_grad_call *gc = (const vector_grad_call *)t->grad;
    const size_t d = t->p->d, rows = gc->key_side ? t->p->m : t->p->n, buckets = gc->v->buckets;
    if (slot)
        memset(slot, 0, sizeof(REAL) * buckets * d);
    for (size_t row = 0; row < rows; ++row) {
        if (key_seen)
            for (size_t r = 0; r < buckets; ++r)
                w->reach[r] = key_seen[row * buckets + r];
        else
            bucket_reach(t->p, gc, row, w->reach);
        for (size_t r = 0; r < buckets; ++r) {
            if (w->reach[r] == 0)
                continue;
            const REAL coef = w->X[row * buckets + r];
            if (dx)
                for (size_t l = 0; l < d; ++l)
                    dx[row * d + l] += coef * (vs * table[r * d + l]);
            if (slot)
                for (size_t l = 0; l < d; ++l)
                    slot[r * d + l] += coef * (vs * x[row * d + l]);
        }
    }
}

/*
 * The unit's gradients through the table from X (rows x buckets): dx += vs X.table (dx
 * NULL: not wanted) and the table's slot = vs X^T.x, each GEMM skipping the blocks where
 * X is zero.  X is zero outside each row's buckets, so with an Inf or NaN in the GEMM's
 * other operand (the table for dx, x for the slot) the products go row by row over the
 * buckets reached (vector_table_exact): NaN and Inf reach exactly what depends on them.
 */
static void vector_grad_end(const term_unit *t, const REAL *x, REAL *dx)
{
    const posenc_problem *p = t->p;
    const posenc_kernels *kern = t->kern;
    const vector_grad_call *gc = (const vector_grad_call *)t->grad;
    const vector_grad_ws w = vector_grad_ws_of(t);
    const int key_side = gc->key_side;
    const size_t d = p->d, rows = key_side ? p->m : p->n, buckets = gc->v->buckets;
    const size_t u = t->b * p->H + t->h;
    const REAL vs = (REAL)p->vector_scale;
    const term_seen *seen = t->env->seen;
    if (key_side)
        scatter_key_edges_end(t, &w);
    const REAL *table = vector_table_row(&gc->v->table, t->h, (size_t)gc->v->runs.b_min, d);
    REAL *slot = gc->slots ? gc->slots + u * buckets * d : NULL;
    const REAL *x_values = x;
    const int exact_dx = dx && !all_finite(table, buckets * d);
    int exact_slot = slot && !x_all_finite(t->gemm, x, rows * d, w.x_wide, &x_values);
    REAL *seen_k = NULL;   /* k less the keys no row sees, where k is not finite */
    if (exact_slot && key_side && seen && x_values == x &&
        (seen_k = key_side_seen_k(t, seen, t->b, x))) {
        x = x_values = seen_k;
        exact_slot = !all_finite(seen_k, rows * d);
    }
    if (dx && !exact_dx)
        gemm(kern, t->gemm, w.b_pack, rows, d, buckets, w.X, (ptrdiff_t)buckets, 1, table,
             (ptrdiff_t)d, 1, vs, dx, (ptrdiff_t)d, 1, gc->spans.by_row);
    if (slot && !exact_slot)
        gemm(kern, t->gemm, w.b_pack, buckets, d, rows, w.X, 1, (ptrdiff_t)buckets, x,
             (ptrdiff_t)d, 1, vs, slot, (ptrdiff_t)d, 0, gc->spans.by_bucket);
    if (exact_dx || exact_slot) {
        unsigned char *key_seen = key_side && seen ? key_side_seen(t, seen, t->b, buckets) : NULL;
        vector_table_exact(t, &w, table, x_values, vs, exact_dx ? dx : NULL,
                           exact_slot ? slot : NULL, key_seen);
        posenc_free(key_seen);
    }
    posenc_free(seen_k);
}

/*
 * scales.exact: a vector table's gradient (H units of R x d, in double) times the scale its
 * sums left out.  Only the rows a logit reads through the map (the offsets j - i of the
 * rows and columns the reset leaves): the others are sums of no terms, 0 in the reference
 * whatever the scale (not 0 * Inf).
 */
static void exact_scale_rows(const posenc_problem *p, const vector_grad_call *gc, double *grad,
                             double scale)
{
    const size_t d = p->d, rows = gc->v->table.rows;
    const int64_t *map = gc->v->table.map;
    if (!grad || scale == 1 || !d)   /* d = 0: no entries */
        return;
    unsigned char *read = (unsigned char *)posenc_alloc(rows, 1);
    if (read) {
        memset(read, 0, rows);
        /* o = j - i with j >= jb and i past the [CLS] row: map[o + n - 1] */
        const size_t first = gc->masked ? 1 : 0, last = p->n + p->m - 1 - (gc->cls_row0 ? 1 : 0);
        for (size_t t = first; t < last; ++t)
            read[map[t]] = 1;
    }
    for (size_t h = 0; h < p->H; ++h)
        for (size_t r = 0; r < rows; ++r)
            if (!read || read[r])
                for (size_t e = 0; e < d; ++e)
                    grad[(h * rows + r) * d + e] *= scale;
    posenc_free(read);
}

/*
 * Phase 0: the table's gradient from its slots: unit h of batch row 0 (its R x d), the
 * rows its map uses (b_min ..) the sum over b of slots[b H + h] in double, in order, the
 * others 0; added to what out holds where shared (the key side's, after the query
 * side's).  Phase 1 (scales: the exact path's): times the scale the sums left out, s for
 * a product's factor, vs in a sum (once for a shared table: the query side's).
 */
static void vector_grad_reduce(const posenc_problem *p, const posenc_grads *g, void *data,
                               const call_scales *scales, int phase)
{
    const vector_grad_call *gc = (const vector_grad_call *)data;
    (void)g;
    if (!gc->out)
        return;
    if (phase == 1) {
        if (scales && !gc->shared)
            exact_scale_rows(p, gc, gc->out, p->product ? scales->scale : scales->vector_scale);
        return;
    }
    const size_t B = p->B, H = p->H, d = p->d, per_unit = gc->v->table.rows * d;
    const size_t at = (size_t)gc->v->runs.b_min * d, width = gc->v->buckets * d;
    for (size_t h = 0; h < H; ++h) {
        double *dst = gc->out + h * per_unit;
        if (!gc->shared) {
            memset(dst, 0, sizeof(double) * per_unit);
            for (size_t e = 0; e < width && B; ++e)
                dst[at + e] = (double)gc->slots[h * width + e];
        } else {
            for (size_t e = 0; e < width && B; ++e)
                dst[at + e] += (double)gc->slots[h * width + e];
        }
        for (size_t b = 1; b < B; ++b) {
            const REAL *slot = gc->slots + (b * H + h) * width;
            for (size_t e = 0; e < width; ++e)
                dst[at + e] += (double)slot[e];
        }
    }
}

#endif /* POSENC_ENGINE_TERM_VECTORS_GRAD_IMPL_H */
