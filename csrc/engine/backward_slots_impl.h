/*
 * backward_slots_impl.h -- a backward call's per-unit slots, for one dtype:
 * allocated and zeroed (backward_prepare), summed into the outputs in a
 * fixed (h, b) order (backward_reduce: the gradients are bitwise identical
 * for any number of threads), released; and the zero gradients of an empty
 * problem.  Types in backward_rows_impl.h, phases in backward_impl.h.
 */
#ifndef POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H
#define POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H

#include "terms_impl.h"
#include "backward_rows_impl.h"

/*
 * A vector table's gradient (term_vectors.h) from its slots: unit h of batch row 0 (out +
 * h per_unit doubles, the table's R x d), elements [at, at + width) (the rows its map
 * uses) the sum over b of slots[b H + h] in double, in order, the others 0; added to
 * what out holds where `accumulate` (one table on both sides: the key side's).
 */
static void reduce_vector_slots(double *out, size_t per_unit, size_t at, const REAL *slots,
                                size_t B, size_t H, size_t width, int accumulate)
{
    for (size_t h = 0; h < H; ++h) {
        double *dst = out + h * per_unit;
        if (!accumulate) {
            memset(dst, 0, sizeof(double) * per_unit);
            for (size_t t = 0; t < width && B; ++t)
                dst[at + t] = (double)slots[h * width + t];
        } else {
            for (size_t t = 0; t < width && B; ++t)
                dst[at + t] += (double)slots[h * width + t];
        }
        for (size_t b = 1; b < B; ++b) {
            const REAL *slot = slots + (b * H + h) * width;
            for (size_t t = 0; t < width; ++t)
                dst[at + t] += (double)slot[t];
        }
    }
}

/*
 * scales.exact: a vector table's gradient (H units of R x d, in double) times the scale its
 * sums left out.  Only the rows a logit reads through the map (the offsets j - i of the
 * rows and columns the reset leaves): the others are sums of no terms, 0 in the reference
 * whatever the scale (not 0 * Inf).
 */
static void exact_scale_rows(const backward_ctx *c, double *grad, size_t rows,
                             const int64_t *map, double scale)
{
    const posenc_problem *p = c->p;
    const size_t d = p->d;
    if (!grad || scale == 1 || !d)   /* d = 0: no entries */
        return;
    unsigned char *read = (unsigned char *)posenc_alloc(rows, 1);
    if (read) {
        memset(read, 0, rows);
        /* o = j - i with j >= jb and i past the [CLS] row: map[o + n - 1] */
        const size_t first = c->masked ? 1 : 0, last = p->n + p->m - 1 - (c->cls_row0 ? 1 : 0);
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

/* Phase 3: every wanted table gradient from its slots, in a fixed order. */
static void backward_reduce(const backward_ctx *c)
{
    const posenc_problem *p = c->p;
    const posenc_grads *g = c->g;
    const size_t B = p->B, H = p->H, d = p->d;
    /* a vector table's slots cover the buckets its map uses: rows b_min..; one table on
     * both sides: the key side adds to the query side's sums */
    double *dquery = (double *)g->terms[POSENC_TERM_query_table][VECTOR_TABLE];
    double *dkey = (double *)g->terms[POSENC_TERM_key_table][VECTOR_TABLE];
    const vector_call *query = c->query, *key = c->key;
    if (dquery && query->table.table)
        reduce_vector_slots(dquery, query->table.rows * d, (size_t)query->runs.b_min * d,
                            c->query_table_slots, B, H, query->buckets * d, 0);
    if (dkey && key->table.table)
        reduce_vector_slots(dkey, key->table.rows * d, (size_t)key->runs.b_min * d,
                            c->key_table_slots, B, H, key->buckets * d, dkey == dquery);
    /* the modules' that go by blocks: their slots over the batch (one head's sum in the
     * logits' backward), the exact path's dense scale on a `scaled` kind's */
    terms_block_grads_reduce(p, g, c->block_slots, c->G ? 1 : B,
                             c->scales.exact ? c->scales.dense_scale : 1);
    if (c->scales.exact) {
        /* the scale each gradient's sums left out: s for every factor of a
         * product (each effective gradient holds s q.k; the module's at its
         * unit's end), vs on the vector tables of a sum */
        const double s = c->scales.scale, vs = p->product ? s : c->scales.vector_scale;
        if (query->table.table)
            exact_scale_rows(c, dquery, query->table.rows, query->table.map, vs);
        if (key->table.table && dkey != dquery)
            exact_scale_rows(c, dkey, key->table.rows, key->table.map, vs);
    }
}

/* Every wanted output zeroed: the gradients of an empty problem. */
static void backward_zero(const posenc_problem *p, const posenc_grads *g)
{
    const size_t BH = p->B * p->H;
    const struct { void *ptr; size_t count; } outs[] = {
        {g->q, BH * p->n * p->d},
        {g->k, p->B * posenc_kv_heads(p) * p->m * p->d},
    };
    for (size_t t = 0; t < sizeof outs / sizeof outs[0]; ++t)
        if (outs[t].ptr && outs[t].count)
            memset(outs[t].ptr, 0, sizeof(REAL) * outs[t].count);
    for (size_t u = 0; u < BH; ++u)   /* the term modules' (n = 0 or m = 0: no rows) */
        terms_grads_begin(p, g, u);
    terms_block_grads_zero(p, g);
}

static void backward_release(backward_ctx *c)
{
    terms_release(&c->own_terms);
    posenc_spans_free(&c->query_spans);
    posenc_spans_free(&c->key_spans);
    REAL *slots[] = {c->query_table_slots, c->key_table_slots};
    for (size_t t = 0; t < sizeof slots / sizeof slots[0]; ++t)
        posenc_free(slots[t]);
    terms_block_slots_free(c->block_slots);
}

/* A zeroed slot array of `count` elements when wanted; 0, or -1 out of memory. */
static int zeroed_slots(REAL **slots, int wanted, size_t count)
{
    if (!wanted)
        return 0;
    *slots = (REAL *)posenc_alloc(count, sizeof(REAL));
    if (!*slots)
        return -1;
    memset(*slots, 0, sizeof(REAL) * count);
    return 0;
}

/* The call's context; o_max: the largest offset j - i where G may be nonzero (m - 1, or a
 * causal attention's query_offset), past which the spans take the bucket matrices as zero;
 * terms: the call's term data when another context built it (the fused attention's
 * logits'), else NULL: built here. */
static int backward_prepare(backward_ctx *c, const posenc_problem *p, const posenc_kernels *kern,
                            const REAL *G, const posenc_grads *g, ptrdiff_t o_max,
                            const terms_call *terms)
{
    const size_t n = p->n, m = p->m, BH = p->B * p->H;
    memset(c, 0, sizeof *c);
    c->p = call_scales_init(&c->scales, p);
    c->kern = kern;
    c->g = g;
    c->G = G;
    c->m_pad = posenc_round_up(m, kern->nr);
    c->row_block = kern->kc;   /* a row block's dk update is one packed depth: see backward_unit */
    c->masked = terms_override_kind(p) >= 0;
    c->cls_row0 = c->masked && p->query_offset == 0;
    c->need_content = g->q || g->k;
    const int dquery = g->terms[POSENC_TERM_query_table][VECTOR_TABLE] != NULL;
    const int dkey = g->terms[POSENC_TERM_key_table][VECTOR_TABLE] != NULL;
    c->need_query_side = posenc_term_present(p, POSENC_TERM_query_table) && (g->q || dquery);
    c->need_key_side = posenc_term_present(p, POSENC_TERM_key_table) && (g->k || dkey);
    c->need_modules = terms_grads_wanted(p, g, TERMS_EVERY);
    c->need_blocks = terms_block_grads_wanted(p, g);
    c->content = c->need_content || c->need_modules ? terms_content_kind(p) : -1;
    c->unit_reads_g = p->product || c->need_query_side || c->need_key_side ||
                      terms_grads_wanted(p, g, TERMS_ADDING) || c->content >= 0;
    c->reads_g = c->unit_reads_g || c->masked || c->need_blocks;
    c->own_terms.reach = -1;
    c->terms = terms ? terms : &c->own_terms;
    if (!terms && terms_prepare(p, &c->own_terms))
        return POSENC_ENOMEM;
    c->query = vector_call_of(c->terms, POSENC_TERM_query_table);
    c->key = vector_call_of(c->terms, POSENC_TERM_key_table);
    if (c->need_query_side && posenc_spans_build(&c->query_spans, &c->query->runs,
                                                 c->query->table.map, n, m, 0, c->masked ? 1 : 0,
                                                 kern->mr, o_max))
        return POSENC_ENOMEM;
    if (c->need_key_side && posenc_spans_build(&c->key_spans, &c->key->runs,
                                               c->key->table.map, n, m, 1, 0, kern->mr, o_max))
        return POSENC_ENOMEM;
    if (zeroed_slots(&c->query_table_slots,
                     posenc_term_present(p, POSENC_TERM_query_table) && dquery,
                     posenc_mul_size(BH, c->query->buckets * p->d)) ||
        zeroed_slots(&c->key_table_slots, posenc_term_present(p, POSENC_TERM_key_table) && dkey,
                     posenc_mul_size(BH, c->key->buckets * p->d)) ||
        terms_block_slots_alloc(p, g, G ? p->H : BH, c->block_slots))
        return POSENC_ENOMEM;
    return POSENC_OK;
}

#endif /* POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H */
