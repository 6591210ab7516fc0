/*
 * attention_decode_impl.h -- the fused attention's decoding path, for one
 * dtype (REAL, set by engine_<dtype>.c): calls of few query rows (a
 * decoding step, a short chunk; attention_ctx's decode) stream k and v
 * once, in place, through the ISA's rows_dot and rows_axpy instead of
 * packing them into GEMM panels of which a row or two would be used; the
 * query heads of one key/value head (GQA) share the pass.  Its rows go to
 * out and lse, or, for a step whose keys are split among threads, to the
 * chunk parts attention_split_impl.h merges.
 */
#ifndef POSENC_ENGINE_ATTENTION_DECODE_IMPL_H
#define POSENC_ENGINE_ATTENTION_DECODE_IMPL_H

#include "attention_impl.h"

/* The decoding path's positional rows of head h (its q from row 0 at q_u; rows
 * [i0, i0 + rows), keys [c0, cols)) onto the content logits (row r at scores + r ld),
 * added or multiplied as the tiles' epilogue does (forward_positional), or the
 * content-reading term applied to them as the tiles apply it (forward_tile). */
static void attention_decode_terms(const attention_ctx *c, forward_ws *fw, size_t b, size_t h,
                                   const REAL *q_u, size_t i0, size_t rows, size_t c0,
                                   size_t cols, REAL *scores)
{
    const size_t ld = c->logits.m_pad;
    if (c->logits.content >= 0) {
        terms_content(c->p, c->kern, &fw->env, c->logits.content, b, h, q_u, scores, ld, i0,
                      rows, c0, cols, c->logits.seen, fw->term_unit, NULL);
        return;
    }
    ptrdiff_t ldp = 0;
    const REAL *P = forward_positional(&c->logits, fw, b, h, q_u, i0, rows, c0, cols, &ldp);
    if (!P)
        return;
    for (size_t r = 0; r < rows; ++r)
        c->kern->row_gather(c->p->product ? POSENC_MUL : POSENC_ADD, scores + r * ld + c0,
                            P + (ptrdiff_t)r * ldp + c0, 1, cols - c0);
}

/*
 * Where a decoding step's rows go: out and lse, normalised; or, when its keys are
 * split among work items (c->split: chunks of c->split keys, chunk s of keys
 * [k0, k1)), chunk s's out rows unnormalised, sum_j exp(x_j - max) v_j, and its
 * rows' max and sum, which attention_merge_chunks merges in chunk order.
 */
typedef struct {
    size_t k0, k1, s;
    REAL *out, *lse;        /* the call's: (B H n) x dv, B H n */
    REAL *part;             /* split: (B H n) x S x dv, S = c->chunks */
    double *part_stats;     /* split: (B H n) x S x 2 */
} decode_target;

/* Chunk t->s's softmax part of the logits row x of query i of unit (b, h), its keys
 * [c0, c1) computed (within the chunk): the row's range there capped, masked, then
 * exp(x - max), 0 elsewhere in [c0, c1); stats: the part's max (-inf when every key
 * is masked: then its sum is 0; NaN when its only unmasked logits are NaN) and sum.
 * The sink and dropout are not here (a split call has no dropout; the merge adds
 * the sink). */
static void attention_softmax_part(const attention_ctx *c, REAL *x, size_t b, size_t i,
                                   const decode_target *t, size_t c0, size_t c1, double *stats)
{
    size_t lo, hi;
    attention_row_range(c, b, i, &lo, &hi);
    lo = posenc_max(lo, posenc_max(c0, t->k0));
    hi = posenc_min(hi, posenc_min(c1, t->k1));
    if (lo >= hi)
        lo = hi = c0;
    REAL *row = x + lo;
    const size_t len = hi - lo;
    if (c->softcap > 0)
        attention_cap_row(c, row, NULL, len);
    attention_mask_row(c, x, b, i, lo, hi, (REAL)-INFINITY);
    const double row_max = len ? c->kern->row_max(row, len) : -INFINITY;
    memset(x + c0, 0, sizeof(REAL) * (lo - c0));
    memset(x + hi, 0, sizeof(REAL) * (c1 - hi));
    if (row_max == -INFINITY) {
        const int nan = attention_has_nan(row, len);
        for (size_t j = 0; j < len; ++j)
            row[j] = nan ? (REAL)NAN : (REAL)0;
        stats[0] = nan ? NAN : -INFINITY;
        stats[1] = 0;
        return;
    }
    stats[0] = row_max;
    stats[1] = c->kern->row_exp(row, len, row_max);
}

/* A decoding tile's rows: row r is query i0 + r % per_head of batch row b (the rows of
 * several heads of a key/value head follow each other), row0 + r of the call's B H n. */
typedef struct {
    size_t b, i0, per_head, row0;
} decode_rows;

/* The decoding path's out rows of a tile (`rows` rows of w->scores over keys [c0, c0 +
 * keys) from query (b, h_first)'s row i0, the heads' rows consecutive): P.v into the
 * target's rows (rows_axpy: the keys in order), then each row scaled by its 1 / sum
 * (w->row_scale) or, split, left unnormalised with its part's statistics. */
static void attention_decode_out(const attention_ctx *c, const attention_ws *w,
                                 const decode_target *t, const decode_rows *x, size_t rows,
                                 const REAL *v_u, size_t c0, size_t keys)
{
    const size_t dv = c->a->dv, ld = c->split ? c->chunks * dv : dv;
    if (dv == 0)
        return;
    REAL *out_rows = c->split ? t->part + (x->row0 * c->chunks + t->s) * dv : t->out + x->row0 * dv;
    REAL *seen = NULL;   /* a masked key's v not finite: row by row over the v rows it sees */
    if (attention_tile_unread(c, x->b, x->i0, posenc_min(rows, x->per_head), c0, c0 + keys, v_u,
                              dv, 1))
        seen = (REAL *)posenc_alloc(keys * dv, sizeof(REAL));
    if (seen) {
        for (size_t r = 0; r < rows; ++r) {
            attention_seen_rows(c, seen, v_u, dv, x->b, x->i0 + r % x->per_head, c0, c0 + keys);
            c->kern->rows_axpy(out_rows + r * ld, ld, w->scores + r * c->logits.m_pad + c0,
                               c->logits.m_pad, 1, seen, keys, dv);
        }
        posenc_free(seen);
    } else {
        c->kern->rows_axpy(out_rows, ld, w->scores + c0, c->logits.m_pad, rows, v_u + c0 * dv,
                           keys, dv);
    }
    if (c->split)
        return;
    for (size_t r = 0; r < rows; ++r)
        c->kern->row_gather(POSENC_MUL, out_rows + r * dv, &w->row_scale[r], 0, dv);
}

/* The softmax rows of a decoding tile (rows i0.. of unit (b, h), query row row0 of the
 * call's B H n): the tiles' (probabilities, lse), or, split, the chunk's parts. */
static void attention_decode_softmax(const attention_ctx *c, attention_ws *w,
                                     const decode_target *t, size_t b, size_t h, size_t row0,
                                     size_t i0, size_t rows, size_t c0, size_t cols)
{
    if (!c->split) {
        attention_tile_softmax(c, w, b, h, i0, rows, c0, cols, t->lse + row0 - i0);
        return;
    }
    const size_t ld = c->logits.m_pad;
    for (size_t r = 0; r < rows; ++r)
        attention_softmax_part(c, w->scores + r * ld, b, i0 + r, t, c0, cols,
                               t->part_stats + ((row0 + r) * c->chunks + t->s) * 2);
}

/* A tile's keys: the union of its rows' ranges (attention_span) within the target's. */
static size_t attention_decode_span(const attention_ctx *c, const decode_target *t, size_t b,
                                    size_t i0, size_t rows, size_t *c0, size_t *cols)
{
    attention_span(c, b, i0, rows, c0, cols);
    *c0 = posenc_max(*c0, t->k0);
    *cols = posenc_max(*c0, posenc_min(*cols, t->k1));
    return *cols - *c0;
}

/*
 * Rows [r0, r1) of unit (b, h) when they are few (c->decode: a decoding step, a short
 * chunk): the prefill's tiles would pack all of k and v into GEMM panels of which a row
 * or two is used.  Here k and v stream once, in place (the ISA's rows_dot and
 * rows_axpy: each key's row loaded once for all the query rows): the content logits of
 * the tile's keys, the method's positional rows added or multiplied as the tiles'
 * epilogue does (forward_positional), the softmax rows as the tiles', then P.v.  No
 * exact scales or expanded module rows here (attention_prepare); on the bfloat16 GEMM's
 * problem q, k and v are read widened from their twins, a unit at a time
 * (forward_inputs_widened, attention_v_unit), and P stays float32.  The keys: the
 * target's (all, or a chunk of a split call).
 */
static void attention_decode_unit(const attention_ctx *c, forward_ws *fw, attention_ws *w,
                                  size_t b, size_t h, size_t r0, size_t r1, const decode_target *t)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t d = p->d, u = b * p->H + h, ld = c->logits.m_pad;
    const REAL *v_u = attention_v_unit(c, w, u);
    packed_b shape;
    forward_unit_setup(&c->logits, fw, b, h, r0, r1, &shape, 0);   /* inputs, terms: no panels */
    const REAL *q_u = fw->inputs.q, *k_u = fw->inputs.k;
    for (size_t i0 = r0; i0 < r1; i0 += kern->mr) {
        const size_t rows = posenc_min(kern->mr, r1 - i0);
        size_t c0, cols;
        const size_t keys = attention_decode_span(c, t, b, i0, rows, &c0, &cols);
        if (keys) {
            if (c->logits.call.fused)   /* n = 1: the kind's term in the same pass over k */
                terms_content_row(p, kern, &fw->env, c->logits.content_row, b, h, w->scores, ld,
                                  w->group_q, i0, c0, cols, fw->term_unit);
            else
                kern->rows_dot(w->scores + c0, ld, q_u + i0 * d, rows, k_u + c0 * d, keys, d,
                               p->scale);
            attention_decode_terms(c, fw, b, h, q_u, i0, rows, c0, cols, w->scores);
        }
        attention_decode_softmax(c, w, t, b, h, u * p->n + i0, i0, rows, c0, cols);
        const decode_rows x = {b, i0, rows, u * p->n + i0};
        attention_decode_out(c, w, t, &x, rows, v_u, c0, keys);
    }
}

/*
 * The decoding path for `heads` query heads from h_first of one key/value head (GQA),
 * all of their n rows (heads n <= mr): k and v stream once for all of them.  The
 * content logits of every row in one rows_dot (q's rows of the heads are contiguous,
 * or rotated or copied from a strided q into w->group_q), each head's positional rows
 * and softmax rows on its
 * block of w->scores, then one rows_axpy into the heads' out rows (contiguous too).
 */
static void attention_decode_heads(const attention_ctx *c, forward_ws *fw, attention_ws *w,
                                   size_t b, size_t h_first, size_t heads, const decode_target *t)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t n = p->n, d = p->d, ld = c->logits.m_pad;
    const size_t u0 = b * p->H + h_first, rows = heads * n;
    const REAL *v_u = attention_v_unit(c, w, u0);
    unit_inputs_at(p, &fw->scratch, &fw->inputs, b, h_first, 0, n);
    if (forward_inputs_widened(&c->logits))   /* k from its twin */
        unit_inputs_widen(&fw->scratch, &fw->inputs, n, p->m, d, 0, n);
    const REAL *k_u = fw->inputs.k, *q_rows = (const REAL *)p->q + u0 * n * d;
    if (posenc_rotates(p) || p->q_strides.r || kern->bf16) {   /* the heads' rows copied, rotated */
        for (size_t e = 0; e < heads; ++e) {
            REAL *rows_e = w->group_q + e * n * d;
            const REAL *q_e = unit_q_rows(p, rows_e, b, h_first + e, 0, n);
            q_e = unit_rows(&fw->scratch, rows_e, q_e, n, d, 0, n);   /* a twin widened */
            if (posenc_rotates(p))
                rope_rows(p, rows_e, q_e, b, h_first + e, 0, n, 0, 0, NULL);
            else if (q_e != rows_e)
                memcpy(rows_e, q_e, sizeof(REAL) * n * d);
        }
        q_rows = w->group_q;
    }
    size_t c0, cols;
    const size_t keys = attention_decode_span(c, t, b, 0, n, &c0, &cols);
    if (keys)
        kern->rows_dot(w->scores + c0, ld, q_rows, rows, k_u + c0 * d, keys, d, p->scale);
    for (size_t e = 0; e < heads; ++e) {
        const size_t h = h_first + e;
        attention_ws head = *w;   /* head e's block of the scores and row statistics */
        head.scores = w->scores + e * n * ld;
        head.row_scale = w->row_scale + e * n;
        head.row_stats = w->row_stats + 2 * e * n;
        if (keys && c->decode_terms) {
            packed_b shape;
            forward_unit_setup(&c->logits, fw, b, h, 0, n, &shape, 0);
            attention_decode_terms(c, fw, b, h, q_rows + e * n * d, 0, n, c0, cols, head.scores);
        }
        attention_decode_softmax(c, &head, t, b, h, (u0 + e) * n, 0, n, c0, cols);
    }
    const decode_rows x = {b, 0, n, u0 * n};
    attention_decode_out(c, w, t, &x, rows, v_u, c0, keys);
}

/* The decoding path for key/value head g of batch row b: its query heads in batches of
 * mr / n (one pass over k and v each), or one by one where n > mr / 2. */
static void attention_decode_group(const attention_ctx *c, forward_ws *fw, attention_ws *w,
                                   size_t b, size_t g, const decode_target *t)
{
    const size_t G = posenc_kv_group(c->p), n = c->p->n, per = c->kern->mr / n;
    if (per < 2 || G == 1) {
        for (size_t e = 0; e < G; ++e)
            attention_decode_unit(c, fw, w, b, g * G + e, 0, n, t);
        return;
    }
    for (size_t e = 0; e < G; e += per)
        attention_decode_heads(c, fw, w, b, g * G + e, posenc_min(per, G - e), t);
}

#endif /* POSENC_ENGINE_ATTENTION_DECODE_IMPL_H */
