/*
 * backward_vectors_impl.h -- the gradients through the vector tables (Shaw,
 * M4, M4M, DeBERTa) of one unit, for one dtype: the GEMMs through the
 * bucket matrices, and where an input is not finite the IEEE-exact
 * fallbacks.  Types in backward_rows_impl.h, the unit's flow in backward_impl.h.
 */
#ifndef POSENC_ENGINE_BACKWARD_VECTORS_IMPL_H
#define POSENC_ENGINE_BACKWARD_VECTORS_IMPL_H

#include "gemm_impl.h"
#include "terms_impl.h"
#include "backward_rows_impl.h"

/* Whether x[0 .. count) are all finite: x - x is 0 for a finite x, NaN for
 * Inf or NaN (16 sums side by side, so that the compiler vectorizes them). */
static int all_finite(const REAL *x, size_t count)
{
    REAL acc[16] = {0};
    size_t t = 0;
    for (; t + 16 <= count; t += 16)
        for (int k = 0; k < 16; ++k)
            acc[k] += x[t + k] - x[t + k];
    for (; t < count; ++t)
        acc[0] += x[t] - x[t];
    REAL sum = 0;
    for (int k = 0; k < 16; ++k)
        sum += acc[k];
    return sum == 0;
}

#ifdef ENGINE_BF16_GEMM
/* Whether a bfloat16 twin's x[0 .. count) are all finite (exponent bits not all ones). */
static int twin_all_finite(const uint16_t *x, size_t count)
{
    unsigned bad = 0;
    for (size_t t = 0; t < count; ++t)
        bad |= (x[t] & 0x7f80u) == 0x7f80u;
    return !bad;
}
#endif

/*
 * x[0 .. count) (q or k of a unit), finite or not; *values: where its
 * values are (x, or where engine_lp.c left x unwritten and one is not
 * finite, x widened from its twin into `spare`, for vector_table_exact).
 */
static int x_all_finite(const gemm_scratch *s, const REAL *x, size_t count, REAL *spare,
                        const REAL **values)
{
    *values = x;
#ifdef ENGINE_BF16_GEMM
    const uint16_t *twin = gemm_unwritten_twin(s, x, count);
    if (twin) {
        if (twin_all_finite(twin, count))
            return 1;
        posenc_active_convert()->bf16_to_f32(spare, twin, count);
        *values = spare;
        return 0;
    }
#else
    (void)s; (void)spare;
#endif
    return all_finite(x, count);
}

/*
 * reach[r] = 1 for the buckets that row x of a bucket matrix reaches, else 0:
 * query side, query x with keys [jb, m) (none for the [CLS] row); key side,
 * key x (none below jb) with queries from 0 (1 past the [CLS] row).
 */
static void bucket_reach(const backward_ctx *c, int key_side, size_t x, REAL *reach)
{
    const posenc_runs *runs = key_side ? &c->key->runs : &c->query->runs;
    const ptrdiff_t n = (ptrdiff_t)c->p->n, m = (ptrdiff_t)c->p->m, jb = c->masked ? 1 : 0;
    const ptrdiff_t i_lo = c->cls_row0 ? 1 : 0, at = (ptrdiff_t)x;
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
 * A fused attention's key side (masked_keys): seen[j buckets + r] = 1 for the buckets
 * r that key j reaches with the rows that see it, else 0, so that a key masked for a
 * row is never read for it (SPEC §6: its entries of Gk are 0, and 0 times its Inf or
 * NaN would be NaN).  Batch row b; NULL out of memory.
 */
static unsigned char *key_side_seen(const backward_ctx *c, size_t b, size_t buckets)
{
    const posenc_problem *p = c->p;
    const masked_keys *hidden = c->masked_keys;
    const size_t n = p->n, m = p->m, i_lo = c->cls_row0 ? 1 : 0, jb = c->masked ? 1 : 0;
    unsigned char *seen = (unsigned char *)posenc_alloc(posenc_mul_size(m, buckets), 1);
    REAL *row = (REAL *)posenc_alloc(m, sizeof(REAL));
    if (!seen || !row) {
        posenc_free(seen);
        posenc_free(row);
        return NULL;
    }
    memset(seen, 0, m * buckets);
    for (size_t i = i_lo; i < n; ++i) {
        static const REAL one = 1;
        c->kern->row_gather(POSENC_SET, row, &one, 0, m);
        hidden->unseen_zero(hidden->attention, row, b, i, m);
        const int64_t *map = c->key->table.map + (n - 1 - i);   /* key j's bucket: map[j] */
        for (size_t j = jb; j < m; ++j) {
            const size_t r = (size_t)(map[j] - c->key->runs.b_min);
            if (row[j] != 0 && r < buckets)
                seen[j * buckets + r] = 1;
        }
    }
    posenc_free(row);
    return seen;
}

/*
 * A fused attention's k for the key side's bucket sums (masked_keys): a copy of the
 * unit's k with the rows of the keys that no row of batch row b sees set to 0.  Their
 * rows of Gk are 0, so the GEMM's sums are those of k itself, and a masked key's Inf or
 * NaN stays out of them (SPEC §6).  NULL out of memory.
 */
static REAL *key_side_seen_k(const backward_ctx *c, size_t b, const REAL *k)
{
    const posenc_problem *p = c->p;
    const masked_keys *hidden = c->masked_keys;
    const size_t n = p->n, m = p->m, d = p->d;
    REAL *copy = (REAL *)posenc_alloc(posenc_mul_size(m, d), sizeof(REAL));
    REAL *seen = (REAL *)posenc_alloc(2 * m, sizeof(REAL)), *row = seen + m;
    if (copy && seen) {
        static const REAL zero = 0, one = 1;
        c->kern->row_gather(POSENC_SET, seen, &zero, 0, m);
        for (size_t i = 0; i < n; ++i) {   /* seen[j] != 0: some row sees key j */
            c->kern->row_gather(POSENC_SET, row, &one, 0, m);
            hidden->unseen_zero(hidden->attention, row, b, i, m);
            c->kern->row_gather(POSENC_ADD, seen, row, 1, m);
        }
        for (size_t j = 0; j < m; ++j)
            if (seen[j] != 0)
                memcpy(copy + j * d, k + j * d, sizeof(REAL) * d);
            else
                memset(copy + j * d, 0, sizeof(REAL) * d);
    } else {
        posenc_free(copy);
        copy = NULL;
    }
    posenc_free(seen);
    return copy;
}

/*
 * backward_vector_table's GEMMs without their products of exact zeros: row
 * x of X times only the table rows it reaches (dx), or into only those slot
 * rows (slot).  For a table (dx) or an x (slot) holding Inf or NaN, where
 * 0 * Inf would put a NaN into gradients that do not depend on it.  `seen`
 * (key side, key_side_seen): the buckets a key reaches with the rows that see it.
 */
static void vector_table_exact(const backward_ctx *c, backward_ws *w, int key_side,
                               const REAL *X, size_t buckets, const REAL *table, const REAL *x,
                               REAL vs, REAL *dx, REAL *slot, const unsigned char *seen)
{
    const size_t d = c->p->d, rows = key_side ? c->p->m : c->p->n;
    if (slot)
        memset(slot, 0, sizeof(REAL) * buckets * d);
    for (size_t row = 0; row < rows; ++row) {
        if (seen)
            for (size_t r = 0; r < buckets; ++r)
                w->reach[r] = seen[row * buckets + r];
        else
            bucket_reach(c, key_side, row, w->reach);
        for (size_t r = 0; r < buckets; ++r) {
            if (w->reach[r] == 0)
                continue;
            const REAL coef = X[row * buckets + r];
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
 * The gradients through a vector table (key_side 0: the query side, x = q;
 * 1: the key side, x = k) from the unit's bucket matrix X (rows x buckets):
 * dx += vs X.table and the table's slot = vs X^T.x, each GEMM skipping the
 * blocks where X is zero.  X is zero outside each row's buckets, so with
 * an Inf or NaN in the GEMM's other operand (the table for dx, x for the
 * slot) the products go row by row over the buckets reached
 * (vector_table_exact): NaN and Inf reach exactly what depends on them.
 */
static void backward_vector_table(const backward_ctx *c, backward_ws *w, size_t u, size_t h,
                                  int key_side, const REAL *x, REAL *dx)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t d = p->d, rows = key_side ? p->m : p->n;
    const size_t buckets = key_side ? c->key->buckets : c->query->buckets;
    const REAL vs = (REAL)p->vector_scale;
    const REAL *X = key_side ? w->key_side : w->query_side;
    const posenc_spans *spans = key_side ? &c->key_spans : &c->query_spans;
    const vector_table *v = key_side ? &c->key->table : &c->query->table;
    const REAL *table = vector_table_row(
        v, h, (size_t)(key_side ? c->key->runs.b_min : c->query->runs.b_min), d);
    REAL *slots = key_side ? c->key_table_slots : c->query_table_slots;
    REAL *slot = slots ? slots + u * buckets * d : NULL;
    const REAL *x_values = x;
    const int exact_dx = dx && !all_finite(table, buckets * d);
    int exact_slot = slot && !x_all_finite(&w->scratch, x, rows * d, w->x_wide, &x_values);
    REAL *seen_k = NULL;   /* k less the keys no row sees, where k is not finite */
    if (exact_slot && key_side && c->masked_keys && x_values == x &&
        (seen_k = key_side_seen_k(c, u / p->H, x))) {
        x = x_values = seen_k;
        exact_slot = !all_finite(seen_k, rows * d);
    }
    if (dx && !exact_dx)
        gemm(kern, &w->scratch, w->b_pack, rows, d, buckets, X, (ptrdiff_t)buckets, 1, table,
             (ptrdiff_t)d, 1, vs, dx, (ptrdiff_t)d, 1, spans->by_row);
    if (slot && !exact_slot)
        gemm(kern, &w->scratch, w->b_pack, buckets, d, rows, X, 1, (ptrdiff_t)buckets, x,
             (ptrdiff_t)d, 1, vs, slot, (ptrdiff_t)d, 0, spans->by_bucket);
    if (exact_dx || exact_slot) {
        unsigned char *seen =
            key_side && c->masked_keys ? key_side_seen(c, u / p->H, buckets) : NULL;
        vector_table_exact(c, w, key_side, X, buckets, table, x_values, vs, exact_dx ? dx : NULL,
                           exact_slot ? slot : NULL, seen);
        posenc_free(seen);
    }
    posenc_free(seen_k);
}

/*
 * scales.exact: dx (rows x d, its content part s Gc.x' unscaled) scaled
 * after its sums, in double, in the reference's order: s dx + vs X.table
 * (sum), s (dx + X.table) (product); X.table in w->vector_grad, or none.
 */
static void exact_content_grad(const backward_ctx *c, REAL *dx, const REAL *vector_grad,
                               size_t count)
{
    const double s = c->scales.scale, vs = c->p->product ? 1 : c->scales.vector_scale;
    for (size_t t = 0; t < count; ++t) {
        const double content = (double)dx[t];
        if (!vector_grad)
            dx[t] = (REAL)(s * content);
        else if (c->p->product)
            dx[t] = (REAL)(s * (content + (double)vector_grad[t]));
        else
            dx[t] = (REAL)(s * content + vs * (double)vector_grad[t]);
    }
}

#endif /* POSENC_ENGINE_BACKWARD_VECTORS_IMPL_H */
