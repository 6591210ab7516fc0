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
 * out[head_of(h)][at + t] += slots[b * H + h][t], t < width, in (h, b)
 * order (a head of out has out_width elements), out zeroed first unless
 * `accumulate`; index (or NULL: the identity) maps t to its element of out.
 */
static void reduce_slots(REAL *out, size_t heads, size_t out_width, size_t at, const REAL *slots,
                         size_t B, size_t H, size_t width, const int64_t *index, int accumulate)
{
    if (!accumulate)
        memset(out, 0, sizeof(REAL) * heads * out_width);
    for (size_t h = 0; h < H; ++h)
        for (size_t b = 0; b < B; ++b) {
            const REAL *slot = slots + (b * H + h) * width;
            REAL *dst = out + head_of(heads, h) * out_width + at;
            if (index)
                for (size_t t = 0; t < width; ++t)
                    dst[index[t]] += slot[t];
            else
                for (size_t t = 0; t < width; ++t)
                    dst[t] += slot[t];
        }
}

/*
 * scales.exact: grad (heads x rows x width) times the scale its sums left
 * out, in double.  With a map, only the rows a logit reads through it (the
 * offsets j - i of the rows and columns the reset leaves): the others are sums of no
 * terms, 0 in the reference whatever the scale (not 0 * Inf).
 */
static void exact_scale_rows(const backward_ctx *c, REAL *grad, size_t heads, size_t rows,
                             size_t width, const int64_t *map, double scale)
{
    if (!grad || scale == 1)
        return;
    const posenc_problem *p = c->p;
    unsigned char *read = map ? (unsigned char *)posenc_alloc(rows, 1) : NULL;
    if (read) {
        memset(read, 0, rows);
        /* o = j - i with j >= jb and i past the [CLS] row: map[o + n - 1] */
        const size_t first = c->masked ? 1 : 0, last = p->n + p->m - 1 - (c->cls_row0 ? 1 : 0);
        for (size_t t = first; t < last; ++t)
            read[map[t]] = 1;
    }
    for (size_t h = 0; h < heads; ++h)
        for (size_t r = 0; r < rows; ++r)
            if (!read || read[r])
                for (size_t e = 0; e < width; ++e) {
                    REAL *x = grad + (h * rows + r) * width + e;
                    *x = (REAL)(scale * (double)*x);
                }
    posenc_free(read);
}

/* Phase 3: every wanted table gradient from its slots, in a fixed order. */
static void backward_reduce(const backward_ctx *c)
{
    const posenc_problem *p = c->p;
    const posenc_grads *g = c->g;
    const size_t B = p->B, H = p->H, d = p->d;
    /* a vector table's slots cover the buckets its map uses: rows b_min.. */
    if (g->query_table)
        reduce_slots((REAL *)g->query_table, p->query_table_heads, p->query_table_rows * d,
                     (size_t)c->terms->query_runs.b_min * d, c->query_table_slots, B, H,
                     c->terms->query_buckets * d, NULL, 0);
    if (g->key_table)   /* one table on both sides: the key side adds to the query side's sums */
        reduce_slots((REAL *)g->key_table, p->key_table_heads, p->key_table_rows * d,
                     (size_t)c->terms->key_runs.b_min * d, c->key_table_slots, B, H, c->terms->key_buckets * d,
                     NULL, g->key_table == g->query_table);
    /* the modules' that go by blocks: their slots over the batch (one head's sum in the
     * logits' backward), the exact path's dense scale on a `scaled` kind's */
    terms_block_grads_reduce(p, g, c->block_slots, c->G ? 1 : B,
                             c->scales.exact ? c->scales.dense_scale : 1);
    if (c->scales.exact) {
        /* the scale each gradient's sums left out: s for every factor of a
         * product (each effective gradient holds s q.k; the module's at its
         * unit's end), vs on the vector tables of a sum */
        const double s = c->scales.scale, vs = p->product ? s : c->scales.vector_scale;
        exact_scale_rows(c, (REAL *)g->query_table, p->query_table_heads, p->query_table_rows, d,
                         p->query_map, vs);
        if (g->key_table != g->query_table)
            exact_scale_rows(c, (REAL *)g->key_table, p->key_table_heads, p->key_table_rows, d,
                             p->key_map, vs);
    }
}

/* Every wanted output zeroed: the gradients of an empty problem. */
static void backward_zero(const posenc_problem *p, const posenc_grads *g)
{
    const size_t BH = p->B * p->H;
#define ZERO_PARAM_(name, heads, per_head) {g->name, p->heads * (per_head)},
#define ZERO_CONST_(name, count)
    const struct { void *ptr; size_t count; } outs[] = {
        {g->q, BH * p->n * p->d},
        {g->k, p->B * posenc_kv_heads(p) * p->m * p->d},
        POSENC_ARRAYS(ZERO_PARAM_, ZERO_CONST_)
    };
#undef ZERO_PARAM_
#undef ZERO_CONST_
    for (size_t t = 0; t < sizeof outs / sizeof outs[0]; ++t)
        if (outs[t].ptr && outs[t].count)
            memset(outs[t].ptr, 0, sizeof(REAL) * outs[t].count);
    for (size_t u = 0; u < BH; ++u)   /* the term modules' (n = 0 or m = 0: no rows) */
        terms_grads_begin(p, g, u);
    terms_block_grads_zero(p, g);
}

static void backward_release(backward_ctx *c)
{
    term_data_release(&c->own_terms);
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
                            const term_data *terms)
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
    c->need_query_side = p->query_table && (g->q || g->query_table);
    c->need_key_side = p->key_table && (g->k || g->key_table);
    c->need_modules = terms_grads_wanted(p, g, TERMS_EVERY);
    c->need_blocks = terms_block_grads_wanted(p, g);
    c->content = c->need_content || c->need_modules ? terms_content_kind(p) : -1;
    c->unit_reads_g = p->product || c->need_query_side || c->need_key_side ||
                      terms_grads_wanted(p, g, TERMS_ADDING) || c->content >= 0;
    c->reads_g = c->unit_reads_g || c->masked || c->need_blocks;
    c->terms = terms ? terms : &c->own_terms;
    if (!terms && term_data_build(&c->own_terms, p))
        return POSENC_ENOMEM;
    if (c->need_query_side && posenc_spans_build(&c->query_spans, &c->terms->query_runs,
                                                 p->query_map, n, m, 0, c->masked ? 1 : 0,
                                                 kern->mr, o_max))
        return POSENC_ENOMEM;
    if (c->need_key_side && posenc_spans_build(&c->key_spans, &c->terms->key_runs, p->key_map, n,
                                               m, 1, 0, kern->mr, o_max))
        return POSENC_ENOMEM;
    if (zeroed_slots(&c->query_table_slots, p->query_table && g->query_table,
                     posenc_mul_size(BH, c->terms->query_buckets * p->d)) ||
        zeroed_slots(&c->key_table_slots, p->key_table && g->key_table,
                     posenc_mul_size(BH, c->terms->key_buckets * p->d)) ||
        terms_block_slots_alloc(p, g, G ? p->H : BH, c->block_slots))
        return POSENC_ENOMEM;
    return POSENC_OK;
}

#endif /* POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H */
