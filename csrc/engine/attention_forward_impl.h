/*
 * attention_forward_impl.h -- the fused attention's forward, for one dtype
 * (REAL, set by engine_<dtype>.c).  Per (b, h) unit and row tile of mr
 * queries: the tile's logits (forward_tile: the content microkernel and
 * its positional epilogue) into per-thread scratch, then the softmax rows
 * (mask, row max, exp, lse, dropout) and P.v through the microkernel into
 * out.  With `causal` only the keys j < query_offset + i0 + rows a tile
 * can see are computed, and packed as the tiles reach them.  Few query
 * rows take the decoding path (attention_decode_impl.h), a long decoding
 * step splits its keys (attention_split_impl.h).
 */
#ifndef POSENC_ENGINE_ATTENTION_FORWARD_IMPL_H
#define POSENC_ENGINE_ATTENTION_FORWARD_IMPL_H

#include "attention_impl.h"
#include "attention_decode_impl.h"
#include "attention_split_impl.h"

/* Rows [r0, r1) of unit (b, h): out and lse. */
static void attention_forward_unit(const attention_ctx *c, forward_ws *fw, attention_ws *w,
                                   size_t b, size_t h, size_t r0, size_t r1, REAL *out, REAL *lse)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t m = p->m, dv = c->a->dv, u = b * p->H + h, ld = c->logits.m_pad;
    REAL *out_u = out + u * p->n * dv, *lse_u = lse + u * p->n;
    packed_b k_packed, v_packed;
    if (c->decode) {
        const decode_target all = {0, m, 0, out, lse, NULL, NULL};
        attention_decode_unit(c, fw, w, b, h, r0, r1, &all);
        return;
    }
    const REAL *v_u = attention_v_unit(c, w, u);
    const int by_tiles = c->ranged && !kern->bf16;   /* causal_keys */
    forward_unit_setup(&c->logits, fw, b, h, r0, r1, &k_packed, !by_tiles);
    if (by_tiles) {
        v_packed = packed_b_shape(kern, w->v_pack, m, dv, 1);
    } else {
        pack_b(kern, &fw->scratch, &v_packed, w->v_pack, v_u, (ptrdiff_t)dv, 1, m, dv, 1);
        attention_zero_padding(c, &v_packed, b, 0, m, 0);
    }
    causal_keys keys = {{{&k_packed, fw->inputs.k, p->d, 0}, {&v_packed, v_u, dv, 1}}, 0, 0};
    for (size_t i0 = r0; i0 < r1; i0 += kern->mr) {
        const size_t rows = posenc_min(kern->mr, r1 - i0);
        size_t c0, cols, ahead0, ahead;
        attention_span(c, b, i0, rows, &c0, &cols);
        if (by_tiles) {   /* the keys of the tile after the next asked for */
            attention_span(c, b, i0, posenc_min(3 * kern->mr, r1 - i0), &ahead0, &ahead);
            const size_t packed = keys.done;
            causal_keys_reach(kern, &keys, cols, posenc_max(ahead, cols));
            attention_zero_padding(c, &v_packed, b, packed, keys.done, 0);
        }
        if (c0 < cols)
            forward_tile(&c->logits, fw, b, h, &k_packed, i0, rows, c0, cols, w->scores,
                         (ptrdiff_t)ld);
        attention_tile_softmax(c, w, b, h, i0, rows, c0, cols, lse_u);
        if (dv == 0)
            continue;
#ifdef ENGINE_BF16_GEMM
        if (w->scores16)   /* P's twin: the GEMM reads its rows in place */
            gemm_twin_set(&fw->scratch, w->scores, w->scores16, rows * ld);
#endif
        const size_t k_range[2] = {c0, cols};   /* the keys the tile sees */
        if (c->ranged && !kern->bf16 &&
            attention_tile_unread(c, b, i0, rows, c0, cols, v_u, dv, 0))
            attention_rows_product(c, &fw->scratch, &v_packed, w->scores, ld, out_u + i0 * dv,
                                   dv, b, i0, rows, 0);
        else
            gemm_packed(kern, &fw->scratch, rows, w->scores, (ptrdiff_t)ld, 1, &v_packed,
                        out_u + i0 * dv, (ptrdiff_t)dv, 0, NULL, 0, NULL, 0, k_range);
        fw->scratch.local.src = NULL;
        for (size_t r = 0; r < rows; ++r)
            kern->row_gather(POSENC_MUL, out_u + (i0 + r) * dv, &w->row_scale[r], 0, dv);
    }
}

/* The forward's items: units, each split into row chunks when units are fewer than threads
 * (chunk t: rows [start[t], start[t + 1]), or rows_per_chunk rows each when start is NULL). */
typedef struct {
    const attention_ctx *c;
    REAL *out, *lse;
    size_t chunks, rows_per_chunk;
    size_t *start;
    decode_target target;   /* the decoding path by key/value heads (attention_decode_item) */
} attention_forward_call;

static void attention_forward_item(const void *call_, attention_thread *t, size_t item)
{
    const attention_forward_call *call = (const attention_forward_call *)call_;
    const posenc_problem *p = call->c->p;
    const size_t unit = item / call->chunks, chunk = item % call->chunks;
    const size_t r0 = call->start ? call->start[chunk] : chunk * call->rows_per_chunk;
    const size_t r1 = call->start ? call->start[chunk + 1] : posenc_min(p->n, r0 + call->rows_per_chunk);
    const size_t h = unit / p->B, b = unit % p->B;   /* head-major: a head's terms stay cached */
    attention_forward_unit(call->c, &t->logits, &t->attention, b, h, r0, r1, call->out, call->lse);
}

/* Under `causal` a tile's cost grows with the keys it sees: the chunks of a unit (call->start,
 * chunks + 1 first rows, whole tiles) split its tiles' keys evenly rather than its rows.
 * 0, or -1 out of memory. */
static int attention_causal_chunks(const attention_ctx *c, attention_forward_call *call)
{
    const size_t n = c->p->n, mr = c->kern->mr, chunks = call->chunks;
    if (!c->ranged || chunks < 2)
        return 0;
    if (!(call->start = (size_t *)posenc_alloc(chunks + 1, sizeof(size_t))))
        return -1;
    double total = 0, done = 0;
    size_t c0, c1;   /* batch row 0's spans stand for every row's (documents may differ) */
    for (size_t i0 = 0; i0 < n; i0 += mr) {
        attention_span(c, 0, i0, posenc_min(mr, n - i0), &c0, &c1);
        total += (double)(c1 - c0) + 1;
    }
    size_t k = 1;
    call->start[0] = 0;
    for (size_t i0 = 0; i0 < n && k < chunks; i0 += mr) {
        attention_span(c, 0, i0, posenc_min(mr, n - i0), &c0, &c1);
        done += (double)(c1 - c0) + 1;
        while (k < chunks && done * (double)chunks >= total * (double)k)
            call->start[k++] = posenc_min(n, i0 + mr);
    }
    while (k <= chunks)
        call->start[k++] = n;
    return 0;
}

/* The decoding path by key/value heads (grouped-query heads share a pass; a split
 * call's chunks): item ((g, b), s), key/value head-major, chunk s of c->chunks. */
static void attention_decode_item(const void *call_, attention_thread *t, size_t item)
{
    const attention_forward_call *call = (const attention_forward_call *)call_;
    const attention_ctx *c = call->c;
    const size_t B = c->p->B, s = item % c->chunks, gb = item / c->chunks;
    decode_target target = call->target;
    if (c->split) {
        target.s = s;
        target.k0 = s * c->split;
        target.k1 = posenc_min(c->p->m, target.k0 + c->split);
    }
    attention_decode_group(c, &t->logits, &t->attention, gb % B, gb / B, &target);
}

static int attention_forward(const posenc_problem *p, const posenc_attention *a, void *out_,
                             void *lse_, int num_threads)
{
    REAL *out = (REAL *)out_, *lse = (REAL *)lse_;
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0)
        return POSENC_OK;
    if (p->m == 0) {   /* every row masked: out 0, lse -inf (the sink with sinks) */
        memset(out, 0, sizeof(REAL) * BH * p->n * a->dv);
        for (size_t t = 0; t < BH * p->n; ++t)
            lse[t] = (REAL)(a->sinks ? a->sinks[t / p->n % p->H] : -INFINITY);
        return POSENC_OK;
    }
    const posenc_kernels *kern = posenc_engine_kernels(p, REAL_DTYPE);
    attention_ctx c;
    int status = attention_prepare(&c, p, a, kern);
    if (status == POSENC_OK) {
        const size_t threads = (size_t)(num_threads > 0 ? num_threads : 1);
        c.logits.call.direct = c.decode;   /* the backward projects and packs (its tiles) */
        if (c.decode && p->n == 1 && kern->mr > 1 && posenc_kv_group(p) == 1)
            c.logits.content_row = terms_content_row_kind(p);   /* attention_decode_unit */
        c.logits.call.fused = c.logits.content_row >= 0;
        attention_split(&c);
        attention_forward_call call = {&c, out, lse, 0,
                                       posenc_rows_per_item(BH, p->n, kern->mr, threads), NULL,
                                       {0, p->m, 0, out, lse, NULL, NULL}};
        call.chunks = (p->n + call.rows_per_chunk - 1) / call.rows_per_chunk;
        REAL *weights = NULL;
        if (c.split &&
            (!(call.target.part = (REAL *)posenc_alloc(posenc_mul_size(BH * p->n, c.chunks * a->dv),
                                                       sizeof(REAL))) ||
             !(call.target.part_stats = (double *)posenc_alloc(posenc_mul_size(BH * p->n, 2 * c.chunks),
                                                               sizeof(double))) ||
             !(weights = (REAL *)posenc_alloc(c.chunks, sizeof(REAL)))))
            status = POSENC_ENOMEM;
        else if (c.decode && (posenc_kv_group(p) > 1 || c.split))   /* by key/value heads */
            status = attention_run(&c, NULL, num_threads, p->B * posenc_kv_heads(p) * c.chunks,
                                   attention_decode_item, &call);
        else if (attention_causal_chunks(&c, &call))
            status = POSENC_ENOMEM;
        else
            status = attention_run(&c, NULL, num_threads, BH * call.chunks, attention_forward_item,
                                   &call);
        if (status == POSENC_OK && c.split)
            attention_merge_chunks(&c, &call.target, weights);
        posenc_free(call.start);
        posenc_free(call.target.part);
        posenc_free(call.target.part_stats);
        posenc_free(weights);
    }
    attention_release(&c);
    return status;
}

#endif /* POSENC_ENGINE_ATTENTION_FORWARD_IMPL_H */
