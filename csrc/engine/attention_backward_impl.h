/*
 * attention_backward_impl.h -- the fused attention's backward (SPEC §6) for
 * one dtype, on attention_impl.h's context, workspaces and teams.
 *
 * Per unit, row block by row block (row_block rows, the backward's own
 * blocking): the block's logits recomputed, P = exp(A + Mask - lse) (no
 * stored probabilities), dV += (P D)^T.dO, dP = D (dO.V^T), dS = P (dP -
 * delta), delta = rowsum(dO out) - dL/dlse (dlse_i/dA_ij = P_ij), and dS
 * handed to the logits' backward (backward_unit_block) for dq, dk and every
 * table / reset slot and the term modules' (those that go by blocks, TUPE's dense factor,
 * block by block of dS: backward_block_grads).
 * With `causal` a block's rows hold its first `cols` keys only, and every
 * GEMM skips, tile by tile, the keys a tile of rows cannot see (the logits,
 * dO.V^T, dq) or the rows that cannot see a tile of keys (dV, dk).
 * Scratch per thread is O(row_block m): never O(n m) or O(B H n m).
 * Slots are reduced in a fixed order: results are bitwise identical for
 * any thread count.
 */
#ifndef POSENC_ENGINE_ATTENTION_BACKWARD_IMPL_H
#define POSENC_ENGINE_ATTENTION_BACKWARD_IMPL_H

#include "attention_impl.h"
#include "backward_impl.h"
#include "forward_impl.h"

/* masked_keys' (backward_rows_impl.h) zero_keys: the padded keys of the packed k. */
static void attention_hidden_zero(const void *c_, const packed_b *pb, size_t b, size_t first)
{
    attention_zero_padding((const attention_ctx *)c_, pb, b, first, first + pb->K, first);
}

/* masked_keys' rows: dq's tile row by row where a key it does not see is not finite. */
static int attention_hidden_rows(const void *c_, gemm_scratch *s, const packed_b *pb,
                                 const REAL *G, size_t ldg, REAL *dq, size_t ldq, size_t b,
                                 size_t i0, size_t rows, size_t first, size_t c1, const REAL *k)
{
    const attention_ctx *c = (const attention_ctx *)c_;
    if (!c->ranged || !attention_tile_unread(c, b, i0, rows, first, posenc_max(c1, first), k,
                                             c->p->d, 0))
        return 0;
    attention_rows_product(c, s, pb, G, ldg, dq, ldq, b, i0, rows, first);
    return 1;
}

/* masked_keys' unread_nonfinite: whether a key some row of batch row b does not see
 * holds an Inf or NaN in k (attention_tile_unread over the unit's rows: those keys only). */
static int attention_hidden_nonfinite(const void *c_, size_t b, const REAL *k)
{
    const attention_ctx *c = (const attention_ctx *)c_;
    return attention_tile_unread(c, b, 0, c->p->n, 0, c->p->m, k, c->p->d, 1);
}

typedef struct {
    const attention_ctx *a;
    const backward_ctx *g;
    const REAL *d_out, *out, *lse;
    const REAL *d_lse;                 /* dL/dlse (B, H, n); NULL: lse unused */
    REAL *grad_v;
    double *sink_slots;                /* dL/dsinks per unit, reduced over b in order */
    int need_ds;                       /* a gradient other than dv: dS is formed */
} attention_grad_ctx;

/* A block's rows of dO and out as rowsum(dO out) reads them: float32, or their
 * bfloat16 twins (gemm_shadow: engine_lp.c leaves the float32 copies unwritten
 * then), the same values. */
typedef struct {
    const REAL *d_out, *out;
    const uint16_t *d_out16, *out16;   /* NULL: none */
    size_t dv;
} delta_rows;

static delta_rows delta_rows_of(const gemm_scratch *s, const REAL *d_out, const REAL *out,
                                size_t rows, size_t dv)
{
    delta_rows x = {d_out, out, NULL, NULL, dv};
#ifdef ENGINE_BF16_GEMM
    x.d_out16 = gemm_shadow(s, d_out, rows * dv);
    x.out16 = gemm_shadow(s, out, rows * dv);
#else
    (void)s; (void)rows;
#endif
    return x;
}

/* Elements [at, at + len) of x as REAL: in place, or widened from its twin x16 into buf. */
static const REAL *delta_chunk(const REAL *x, const uint16_t *x16, size_t at, size_t len,
                               REAL *buf)
{
#ifdef ENGINE_BF16_GEMM
    if (x16) {
        posenc_active_convert()->bf16_to_f32(buf, x16 + at, len);
        return buf;
    }
#else
    (void)x16; (void)len; (void)buf;
#endif
    return x + at;
}

/* rowsum(dO out) of row r, in double, in four running sums (one chain would
 * wait on each addition): element l in sum l % 4, the row's last dv % 4 in the
 * first; the row widened DELTA_CHUNK elements at a time (a multiple of 4: an
 * element's sum is its place in the row's), so that the loop has no branch. */
static double row_delta(const delta_rows *x, size_t r)
{
    enum { DELTA_CHUNK = 64 };
    REAL d_buf[DELTA_CHUNK], o_buf[DELTA_CHUNK];
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    const size_t at = r * x->dv;
    for (size_t l0 = 0; l0 < x->dv; l0 += DELTA_CHUNK) {
        const size_t len = posenc_min(DELTA_CHUNK, x->dv - l0);
        const REAL *d = delta_chunk(x->d_out, x->d_out16, at + l0, len, d_buf);
        const REAL *o = delta_chunk(x->out, x->out16, at + l0, len, o_buf);
        size_t l = 0;
        for (; l + 4 <= len; l += 4) {
            a0 += (double)d[l] * (double)o[l];
            a1 += (double)d[l + 1] * (double)o[l + 1];
            a2 += (double)d[l + 2] * (double)o[l + 2];
            a3 += (double)d[l + 3] * (double)o[l + 3];
        }
        for (; l < len; ++l)
            a0 += (double)d[l] * (double)o[l];
    }
    return (a0 + a1) + (a2 + a3);
}

/* Where unit u's dV goes: its value head's gradient, or with grouped-query
 * attention the thread's dv_unit, added into the value head's after the unit,
 * the query heads of a group in order on one thread (attention_backward_unit). */
static REAL *attention_unit_dv(const attention_grad_ctx *gc, const attention_ws *w, size_t u)
{
    return w->dv_unit ? w->dv_unit : gc->grad_v + u * gc->a->p->m * gc->a->a->dv;
}

/* Row x (elements of `size` bytes) zeroed on [from, lo) and [hi, cols), where the GEMMs and
 * the logits' gradients read past the row's range [lo, hi), and on [lo, hi) too with `all`. */
static void row_zero_around(void *x, size_t size, size_t from, size_t lo, size_t hi, size_t cols,
                            int all)
{
    char *at = (char *)x;
    if (all) {
        memset(at + from * size, 0, (cols - from) * size);
        return;
    }
    memset(at + from * size, 0, (lo - from) * size);
    memset(at + hi * size, 0, (cols - hi) * size);
}

/* Row r's delta = rowsum(dO out) - dL/dlse (dL/dlse_i P_ij joins dS_ij = P_ij (dP_ij -
 * delta_i) as -dL/dlse_i in delta_i); the sink's gradient takes -exp(sink - lse) delta
 * (its probability, with no value: dP 0). */
static double attention_row_delta(const delta_rows *deltas, size_t r, const REAL *d_lse_blk,
                                  REAL lse, double sink, double *sink_grad)
{
    const double delta = row_delta(deltas, r) - (d_lse_blk ? (double)d_lse_blk[r] : 0.0);
    if (sink != -INFINITY)
        *sink_grad -= exp(sink - (double)lse) * delta;
    return delta;
}

/* Whether the block rows of batch row b take the bfloat16 GEMM's pass (bf16->grad_row):
 * P and dS in one pass, rounded as their GEMMs read them (P only so: dV reads its twin
 * scores16; product mode reads dS in float32 only), P from the forward's exp.  Not with
 * dropout or a softcap (their own passes between), masked keys inside a row's range
 * (padding, scattered documents: dS is zeroed there after it is formed), nor where dS is
 * not wanted. */
static int attention_grad_fused(const attention_grad_ctx *gc, const attention_ws *w, size_t b)
{
    const attention_ctx *c = gc->a;
    return c->kern->bf16 && w->scores16 && gc->need_ds && c->a->dv && !c->dropout &&
           !(c->softcap > 0) && !c->padding_start && !(c->doc_scattered && c->doc_scattered[b]);
}

/*
 * Rows [blk0, blk0 + rows) of unit u: their probabilities P (scores, 0
 * where masked) recomputed from the logits (capped: softcap) and lse, P D
 * (dropped, with dropout), and their D (dO.V^T - delta) P, the gradient dS
 * of their logits (grad, when need_ds; times 1 - tanh^2 with softcap), delta
 * = rowsum(dO out) - dL/dlse; dV += (P D)^T.dO; the sink's gradient, -sum
 * exp(sink - lse) delta (NaN with a NaN sink).  Without
 * `limits` the rows hold keys [0, cols); a ranged block's (limits) each
 * tile its span, and every row is valid (0 where masked) on [limits->first,
 * cols), or from key 0 where the logits' gradients read there
 * (!grads_from_first).
 */
static void attention_backward_block(const attention_grad_ctx *gc, forward_ws *fw,
                                     attention_ws *w, const packed_b *k_packed,
                                     const packed_b *vt_packed, size_t u, size_t blk0,
                                     size_t rows, size_t cols, const block_limits *limits)
{
    const attention_ctx *c = gc->a;
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t n = p->n, m = p->m, dv = c->a->dv, b = u / p->H, h = u % p->H, mr = kern->mr;
    const size_t first = limits ? limits->first : 0, zero_from = c->grads_from_first ? first : 0;
    const REAL *d_out_blk = w->d_out_unit + blk0 * dv;
    const REAL *out_blk = gc->out + (u * n + blk0) * dv;
    const REAL *lse_blk = gc->lse + u * n + blk0;
    const REAL *d_lse_blk = gc->d_lse ? gc->d_lse + u * n + blk0 : NULL;
    const double sink = c->a->sinks ? c->a->sinks[h] : -INFINITY;
    const int need_delta = gc->need_ds || (c->a->grad_sinks && c->a->sinks);
    const delta_rows deltas = delta_rows_of(&fw->scratch, d_out_blk, out_blk, rows, dv);
    const int fused = attention_grad_fused(gc, w, b);
#ifndef ENGINE_BF16_GEMM
    (void)fused;   /* no bfloat16 GEMM in this dtype's engine */
#endif
    for (size_t i0 = blk0; i0 < blk0 + rows; i0 += mr) {   /* a tile's logits and dO.V^T: its keys */
        const size_t tile = posenc_min(mr, blk0 + rows - i0), t = (i0 - blk0) / mr;
        const size_t c0 = limits ? limits->row_keys[2 * t] : 0;
        const size_t c1 = limits ? limits->row_keys[2 * t + 1] : cols;
        if (c0 >= c1)
            continue;
        forward_tile(&c->logits, fw, b, h, k_packed, i0, tile, c0, c1,
                     w->scores + (i0 - blk0) * m, (ptrdiff_t)m);
        if (gc->need_ds && dv) {
            if (i0 + tile < blk0 + rows)   /* the next tile's rows of dO, read in place */
                gemm_prefetch(&fw->scratch, d_out_blk + (i0 + tile - blk0) * dv,
                              (posenc_min(blk0 + rows, i0 + 2 * tile) - i0 - tile) * dv);
            packed_b values = *vt_packed;
            if (c0)
                packed_b_skip(&values, c0);
            values.N = c1 - c0;
            gemm_packed(kern, &fw->scratch, tile, d_out_blk + (i0 - blk0) * dv, (ptrdiff_t)dv, 1,
                        &values, w->grad + (i0 - blk0) * m + c0, (ptrdiff_t)m, 0, NULL, 0, NULL,
                        0, NULL);
        }
    }
    for (size_t r = 0; r < rows; ++r) {
        const size_t i = blk0 + r;
        size_t lo, hi;
        if (limits) {
            lo = w->row_range[2 * r];
            hi = w->row_range[2 * r + 1];
        } else {
            attention_row_range(c, b, i, &lo, &hi);
        }
        if (lo >= hi)
            lo = hi = first;
        REAL *P = w->scores + r * m, *dS = w->grad + r * m;
        REAL *PD = c->dropout ? w->dropped + r * m : P;
        const size_t len = hi - lo;
        /* every key masked (and no sink): no gradient, the row all zeros */
        const int none = lse_blk[r] == -INFINITY;
#ifdef ENGINE_BF16_GEMM
        if (fused) {   /* P16 and dS16 as the float32 rows below, zeros included */
            uint16_t *P16 = w->scores16 + r * m, *dS16 = w->grad16 + r * m;
            row_zero_around(P16, sizeof(uint16_t), zero_from, lo, hi, cols, none);
            row_zero_around(dS16, sizeof(uint16_t), zero_from, lo, hi, cols, none);
            row_zero_around(dS, sizeof(REAL), zero_from, lo, hi, cols, none);
            if (none)
                continue;
            const double delta = attention_row_delta(&deltas, r, d_lse_blk, lse_blk[r], sink,
                                                      &w->sink_grad);
            kern->bf16->grad_row(P16 + lo, dS16 + lo, dS + lo, P + lo, len, (double)lse_blk[r],
                                 (REAL)-delta);
            continue;
        }
#endif
        /* zeros where the GEMMs and the logits' gradients read past the row's range */
        row_zero_around(P, sizeof(REAL), zero_from, lo, hi, cols, none);
        if (c->dropout)
            row_zero_around(PD, sizeof(REAL), zero_from, lo, hi, cols, none);
        row_zero_around(dS, sizeof(REAL), zero_from, lo, hi, cols, none);
        if (none)
            continue;
        REAL *cap_grad = c->softcap > 0 ? w->cap_grad + r * m + lo : NULL;
        if (cap_grad)
            attention_cap_row(c, P + lo, cap_grad, len);
        attention_mask_row(c, P, b, i, lo, hi, (REAL)-INFINITY);
        kern->row_exp(P + lo, len, (double)lse_blk[r]);
        if (c->dropout) {
            attention_drop_row(c, w, b, h, i, hi);
            kern->row_mul(PD + lo, P + lo, w->drop_row + lo, len);
        }
        if (!need_delta)
            continue;
        const double delta = attention_row_delta(&deltas, r, d_lse_blk, lse_blk[r], sink,
                                                  &w->sink_grad);
        if (!gc->need_ds)
            continue;
        REAL *dS_row = dS + lo;
        if (dv == 0)
            memset(dS_row, 0, sizeof(REAL) * len);
        const REAL minus_delta = (REAL)-delta;
        if (c->dropout)
            kern->row_gather(POSENC_MUL, dS_row, w->drop_row + lo, 1, len);
        kern->row_gather(POSENC_ADD, dS_row, &minus_delta, 0, len);
        kern->row_gather(POSENC_MUL, dS_row, P + lo, 1, len);
        if (cap_grad)
            kern->row_gather(POSENC_MUL, dS_row, cap_grad, 1, len);
        attention_mask_row(c, dS, b, i, lo, hi, (REAL)0);   /* not (dO.v - delta) 0: v unread */
    }
#ifdef ENGINE_BF16_GEMM
    if (fused)   /* P only in bfloat16: dV reads its twin */
        gemm_twin_set(&fw->scratch, w->scores, w->scores16, rows * m);
#endif
    REAL *dv_u = gc->grad_v && dv ? attention_unit_dv(gc, w, u) : NULL;
    if (dv_u && blk0 == 0)   /* keys the first block does not reach (its GEMM sets the rest) */
        row_zero_around(dv_u, sizeof(REAL) * dv, 0, first, cols, m, cols <= first);
    if (dv_u && cols > first)   /* dV += (P D)^T.dO over the keys the block sees */
        gemm(kern, &fw->scratch, w->d_out_pack, cols - first, dv, rows,
             (c->dropout ? w->dropped : w->scores) + first, 1, (ptrdiff_t)m, d_out_blk,
             (ptrdiff_t)dv, 1, 1, dv_u + first * dv, (ptrdiff_t)dv, blk0 > 0,
             limits ? limits->key_rows + 2 * (first / mr) : NULL);
    fw->scratch.local.src = NULL;
}

/* The bfloat16 GEMM's backward: the block's dS (rows x cols of w->grad, ld
 * m; under `causal` each row up to its tile's width, the rest not read)
 * rounded once into w->grad16 (unless `rounded`: attention_grad_fused's pass
 * did) and made the twin of w->grad in `s`, so that dq reads its rows in
 * place and dk packs its columns without rounding. */
static void attention_grad_twin(const attention_ctx *c, attention_ws *w, gemm_scratch *s,
                                size_t rows, size_t cols, const block_limits *limits,
                                int rounded)
{
#ifdef ENGINE_BF16_GEMM
    const size_t m = c->p->m, first = limits ? limits->first : 0;
    for (size_t r = 0; r < rows && !rounded; ++r)
        c->kern->bf16->round_row(w->grad16 + r * m + first, w->grad + r * m + first,
                                 cols - first);
    gemm_twin_set(s, w->grad, w->grad16, rows * m);
#else
    (void)c; (void)w; (void)s; (void)rows; (void)cols; (void)limits; (void)rounded;
#endif
}

/* Unit u = b H + h of the backward, on a thread's workspaces. */
static void attention_backward_head(const attention_grad_ctx *gc, attention_thread *t, size_t u)
{
    forward_ws *fw = &t->logits;
    backward_ws *bw = &t->grads;
    attention_ws *w = &t->attention;
    const attention_ctx *c = gc->a;
    const backward_ctx *g = gc->g;
    const posenc_problem *p = c->p;
    const size_t h = u % p->H;
    const size_t n = p->n, m = p->m, dv = c->a->dv;
    const REAL *v_u = attention_v_unit(c, w, u);
    w->d_out_unit = (const REAL *)posenc_unit_rows(w->d_out_rows, gc->d_out, &c->a->d_out_strides,
                                                   p->H, n, dv, sizeof(REAL), u / p->H, h, 0, n);
    packed_b k_packed, vt_packed, product_keys;
    const int by_blocks = c->ranged && !c->kern->bf16;   /* causal_keys */
    forward_unit_setup(&c->logits, fw, u / p->H, h, 0, n, &k_packed, !by_blocks);
    bw->inputs = fw->inputs;   /* the gradients read the inputs the logits did */
    if (by_blocks)
        vt_packed = packed_b_shape(c->kern, w->v_pack, dv, m, 1);
    else if (dv)
        pack_b(c->kern, &fw->scratch, &vt_packed, w->v_pack, v_u, 1, (ptrdiff_t)dv, dv, m, 1);   /* v^T */
    causal_keys keys = {{{&k_packed, fw->inputs.k, p->d, 0}, {&vt_packed, v_u, dv, 0}}, 0, 0};
    if (gc->need_ds)
        backward_unit_begin(g, bw, u, &product_keys);
    w->sink_grad = 0;
    for (size_t blk0 = 0; blk0 < n; blk0 += g->row_block) {
        const size_t rows = posenc_min(g->row_block, n - blk0);
        size_t cols = m;
        block_limits ranged_limits;
        const block_limits *limits = NULL;
        if (c->ranged) {
            ranged_limits = attention_block_limits(c, w, u / p->H, blk0, rows);
            limits = &ranged_limits;
            cols = ranged_limits.cols;
        }
        if (by_blocks) {   /* the next block's keys asked for */
            size_t ahead0, ahead;
            attention_span(c, u / p->H, blk0, posenc_min(2 * g->row_block, n - blk0), &ahead0,
                           &ahead);
            causal_keys_reach(c->kern, &keys, cols, posenc_max(ahead, cols));
        }
        if (bw->keep.data) {   /* what the block's logits keep for their gradient */
            fw->keep = bw->keep;
            fw->keep_row0 = blk0;
            memset(bw->keep.range, 0, sizeof(size_t) * 2 * rows);
        }
        attention_backward_block(gc, fw, w, &k_packed, &vt_packed, u, blk0, rows, cols, limits);
        if (!gc->need_ds)
            continue;
        if (c->kern->bf16 && !p->product)   /* dS rounded once: dq's rows, dk's columns */
            attention_grad_twin(c, w, &bw->scratch, rows, cols, limits,
                                attention_grad_fused(gc, w, u / p->H));
        backward_unit_block(g, bw, u, &product_keys, blk0, rows, w->grad, cols, limits);
        bw->scratch.local.src = NULL;   /* backward_block_grads changes dS */
        if (g->need_blocks)   /* after the unit block: it zeroes the reset's entries */
            backward_block_grads(g, bw, u, w->grad, m, blk0, rows, cols, limits);
    }
    if (gc->need_ds) {
        backward_unit_end(g, bw, u);
        backward_unit_commit_dk(g, bw, u);
    }
    if (gc->sink_slots)
        gc->sink_slots[u] = w->sink_grad;
    if (gc->grad_v && w->dv_unit) {   /* into the value head's dV, the group's heads in order */
        REAL *grad_v = gc->grad_v + posenc_kv_unit(p, u) * m * dv;
        if (u % posenc_kv_group(p) == 0)
            memcpy(grad_v, w->dv_unit, sizeof(REAL) * m * dv);
        else
            for (size_t e = 0; e < m * dv; ++e)
                grad_v[e] += w->dv_unit[e];
    }
}

/* Item `item` of the backward: the query heads of key head g = item / B of batch row
 * b = item % B, in order (head-major: a head's terms stay cached; grouped-query
 * attention sums a group's dk and dV on one thread, the same sums for any count). */
static void attention_backward_unit(const void *gc_, attention_thread *t, size_t item)
{
    const attention_grad_ctx *gc = (const attention_grad_ctx *)gc_;
    const posenc_problem *p = gc->a->p;
    const size_t group = posenc_kv_group(p), kv = item / p->B, b = item % p->B;
    for (size_t h = kv * group; h < (kv + 1) * group; ++h)
        attention_backward_head(gc, t, b * p->H + h);
}

static int attention_backward(const posenc_problem *p, const posenc_attention *a,
                              const void *d_out, const void *out, const void *lse,
                              const posenc_grads *grads, void *grad_v, int num_threads)
{
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0 || p->m == 0) {
        backward_zero(p, grads);
        if (grad_v)
            memset(grad_v, 0, sizeof(REAL) * p->B * posenc_kv_heads(p) * p->m * a->dv);
        if (a->grad_sinks)   /* no row (n = 0), or rows with the sink alone: out 0, delta 0 */
            memset(a->grad_sinks, 0, sizeof(double) * p->H);
        return POSENC_OK;
    }
    const posenc_kernels *kern = posenc_engine_kernels(p, REAL_DTYPE);
    attention_ctx c;
    backward_ctx g;
    attention_grad_ctx gc = {&c, &g, (const REAL *)d_out, (const REAL *)out, (const REAL *)lse,
                             (const REAL *)a->d_lse, (REAL *)grad_v, NULL, 0};
    memset(&g, 0, sizeof g);
    int status = attention_prepare(&c, p, a, kern);
    if (status == POSENC_OK)
        status = backward_prepare(&g, p, kern, NULL, grads, attention_last_offset(p, a),
                                  &c.logits.call);   /* the logits' term data, built once */
    const masked_keys hidden = {&c, attention_hidden_zero, attention_hidden_rows,
                                attention_hidden_nonfinite, attention_hidden_unseen};
    g.masked_keys = &hidden;
    g.seen = &c.seen;
    if (status == POSENC_OK && a->sinks && a->grad_sinks &&
        !(gc.sink_slots = (double *)posenc_alloc(BH, sizeof(double))))
        status = POSENC_ENOMEM;
    if (status != POSENC_OK)
        goto done;
    gc.need_ds = grads->q || grads->k || g.sums ||
                 g.need_modules || g.need_blocks;

    if ((status = attention_run(&c, &g, num_threads, p->B * posenc_kv_heads(p),
                                attention_backward_unit, &gc)))
        goto done;
    backward_reduce(&g);
    for (size_t h = 0; gc.sink_slots && h < p->H; ++h) {   /* the sinks', batch rows in order */
        double sum = 0;
        for (size_t b = 0; b < p->B; ++b)
            sum += gc.sink_slots[b * p->H + h];
        a->grad_sinks[h] = sum;
    }

done:
    posenc_free(gc.sink_slots);
    backward_release(&g);
    attention_release(&c);
    return status;
}

#endif /* POSENC_ENGINE_ATTENTION_BACKWARD_IMPL_H */
