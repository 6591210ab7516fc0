/*
 * attention_impl.h -- the fused attention of SPEC §6 for one dtype (REAL,
 * set by engine_<dtype>.c): out = softmax_j(A + Mask) D v per (b, h), A
 * the configured logits, without ever holding the (B, H, n, m) logits.
 *
 * This file: what the forward and the backward share -- the context
 * (attention_prepare), the workspaces, which keys a row sees (causality,
 * window, documents, padding), the softmax rows, the keys a causal unit
 * packs as its tiles reach them, and the teams.  The forward's prefill
 * tiles are in attention_forward_impl.h, the decoding path (few query
 * rows, k and v streamed in place) in attention_decode_impl.h, a decoding
 * step's keys split among threads in attention_split_impl.h, the backward
 * in attention_backward_impl.h.  Scratch per thread is O(mr m): never
 * O(n m) or O(B H n m).
 */
#ifndef POSENC_ENGINE_ATTENTION_IMPL_H
#define POSENC_ENGINE_ATTENTION_IMPL_H

#include "philox.h"
#include "gemm_impl.h"
#include "rope_impl.h"
#include "forward_impl.h"
#include "backward_impl.h"
#include <math.h>
#include <stdlib.h>

typedef struct {
    const posenc_problem *p;
    const posenc_attention *a;
    const posenc_kernels *kern;
    forward_ctx logits;          /* the logits' tiles (small head blocks only, no streaming) */
    int dropout;
    uint32_t threshold;          /* a Philox word at least this keeps its probability */
    REAL keep_scale;             /* 1 / (1 - dropout_p) */
    size_t *padding_start;       /* the padded key runs of batch row b: */
    size_t *padding_runs;        /* [2 t, 2 t + 1) for t in [padding_start[b], padding_start[b + 1]) */
    int ranged;                  /* causal, window or documents: rows see ranges of keys */
    size_t *doc_range;           /* documents: query (b, i)'s keys [2 (b n + i), + 1): its id's
                                    first key to its last key + 1 (empty: no key has the id) */
    uint8_t *doc_scattered;      /* documents: per batch row, an id in several runs of keys (its
                                    range holds other documents' keys, masked one by one) */
    size_t align;                /* a tile's first key is a multiple of this (0: tiles start at
                                    key 0): the key panels' nr */
    size_t block_align;          /* a backward block's first key: lcm(mr, nr) (its GEMMs over
                                    keys start there, dk's in tiles of mr keys) */
    int grads_from_first;        /* the backward's positional gradients read dS from a block's
                                    first key on (content, rope, a Toeplitz table alone) */
    double softcap;              /* SPEC §7's, or 0 */
    int decode;                  /* few query rows (a decoding step): k and v read in place,
                                    not packed (attention_decode_unit) */
    int decode_terms;            /* the decoding path forms positional rows (a term besides
                                    the content and the rotation) */
    size_t split, chunks;        /* a decoding step's keys split into `chunks` work items of
                                    `split` keys (attention_merge_chunks), or 0, 1 */
    term_seen seen;              /* the keys each row sees, for a content-reading term (cope) */
} attention_ctx;

typedef struct {
    REAL *scores;        /* logits, then probabilities: forward mr x m_pad, backward row_block x m */
    REAL *grad;          /* backward: dP, then dS, row_block x m */
    REAL *dropped;       /* backward with dropout: P D, row_block x m */
    uint16_t *grad16;    /* the bfloat16 GEMM's backward: dS rounded once, row_block x m */
    uint16_t *scores16;  /* the bfloat16 GEMM without dropout: P in bfloat16 only (the forward's
                          * tile, the backward's block: attention_grad_fused) */
    REAL *v_pack;        /* v as B: forward v (m x dv), backward v^T (dv x m) */
    REAL *dv_unit;       /* backward, grouped-query attention: a unit's dV (m x dv) before it is
                            added into its value head's (attention_backward_head) */
    REAL *d_out_pack;    /* backward: a row block of d_out as B (row_block x dv) */
    REAL *row_scale;     /* forward: 1 / sum of each row of a tile */
    double *row_stats;   /* forward: each row of a tile's max, then its sum (lse = max + log sum) */
    REAL *drop_row;      /* dropout: D of one row, 0 or keep_scale, m */
    uint8_t *keep;       /* dropout: the keep decisions of one row, m */
    size_t *row_keys;    /* ranged backward: per tile of mr rows of a block, its keys (k_range) */
    size_t *key_rows;    /* ranged backward: per tile of mr keys, the block's rows that see it */
    size_t *row_range;   /* ranged backward: each row of a block's keys [2 r, 2 r + 1) */
    REAL *cap_grad;      /* backward with softcap: 1 - tanh^2 of a block's capped logits */
    double sink_grad;    /* backward with sinks: the unit's dL/dsink so far */
    REAL *v_rows;        /* a strided v: a unit's rows (m x dv, attention_v_unit) */
    size_t v_held;       /* 1 + the value unit whose rows v_rows holds, 0: none */
    REAL *d_out_rows;    /* backward, a strided d_out: a unit's rows (n x dv) */
    const REAL *d_out_unit;   /* backward: the unit's rows of d_out (n x dv), in place or in
                                 d_out_rows */
    REAL *group_q;       /* the decoding path with a rotation or a strided q: a head batch's
                            q rows, rotated;
                            with call.fused: q's row and a table row (term_kind's content_row) */
} attention_ws;

/* Whether the forward's decoding path (the logits' call.direct: the backward keeps its
 * tiles) runs on the bfloat16 GEMM's problem, whose v is given only as its twin
 * (engine_lp.c): v widened into v_rows a value unit at a time (attention_v_unit). */
static int attention_v_widened(const attention_ctx *c)
{
    return c->logits.call.direct && c->kern->bf16;
}

/* The attention's part of a thread's workspace (elements); carved into w when w != NULL. */
static size_t attention_ws_layout(const attention_ctx *c, int backward, size_t row_block,
                                  attention_ws *w, REAL *mem)
{
    const posenc_problem *p = c->p;
    const size_t m = p->m, dv = c->a->dv, nr = c->kern->nr;
    size_t at = 0;
    if (w)
        memset(w, 0, sizeof *w);
    if (backward) {
        WS_TAKE(w, mem, at, scores, row_block * m);
        WS_TAKE(w, mem, at, grad, row_block * m);
        if (c->dropout)
            WS_TAKE(w, mem, at, dropped, row_block * m);
        if (c->kern->bf16)
            WS_TAKE(w, mem, at, grad16, (row_block * m + 1) / 2);
        if (c->kern->bf16 && !c->dropout)   /* attention_grad_fused's P */
            WS_TAKE(w, mem, at, scores16, (row_block * m + 1) / 2);
        WS_TAKE(w, mem, at, v_pack, packed_b_size(dv, m, nr));
        WS_TAKE(w, mem, at, d_out_pack, packed_b_size(row_block, dv, nr));
        if (posenc_kv_group(p) > 1)
            WS_TAKE(w, mem, at, dv_unit, m * dv);
        if (c->ranged) {
            const size_t mr = c->kern->mr, bytes = 2 * sizeof(size_t);
            WS_TAKE(w, mem, at, row_keys, ((row_block + mr - 1) / mr * bytes + sizeof(REAL) - 1) / sizeof(REAL));
            WS_TAKE(w, mem, at, key_rows, ((m + mr - 1) / mr * bytes + sizeof(REAL) - 1) / sizeof(REAL));
            WS_TAKE(w, mem, at, row_range, (row_block * bytes + sizeof(REAL) - 1) / sizeof(REAL));
        }
        if (c->softcap > 0)
            WS_TAKE(w, mem, at, cap_grad, row_block * m);
    } else {
        WS_TAKE(w, mem, at, scores, c->kern->mr * c->logits.m_pad);
        if (c->kern->bf16 && !c->dropout && !c->decode)   /* the decoding path: no P.v GEMM */
            WS_TAKE(w, mem, at, scores16, (c->kern->mr * c->logits.m_pad + 1) / 2);
        if (!c->decode)   /* the decoding path reads v in place */
            WS_TAKE(w, mem, at, v_pack, packed_b_size(m, dv, nr));
        WS_TAKE(w, mem, at, row_scale, c->kern->mr);
        WS_TAKE(w, mem, at, row_stats, 2 * c->kern->mr * (sizeof(double) / sizeof(REAL)));
        if (c->decode &&
            (posenc_rotates(p) || c->logits.call.fused || p->q_strides.r || c->kern->bf16))
            WS_TAKE(w, mem, at, group_q, c->kern->mr * p->d);
    }
    if (c->a->v_strides.r || attention_v_widened(c))
        WS_TAKE(w, mem, at, v_rows, m * dv);
    if (backward && c->a->d_out_strides.r)
        WS_TAKE(w, mem, at, d_out_rows, p->n * dv);
    if (c->dropout) {
        WS_TAKE(w, mem, at, drop_row, m);
        WS_TAKE(w, mem, at, keep, (m + sizeof(REAL) - 1) / sizeof(REAL));
    }
    return posenc_round_up(at, POSENC_ALIGN / sizeof(REAL));
}

/* Unit u's rows of v (m x dv): in place, or copied from a strided v into w->v_rows, or
 * (the decoding path on the bfloat16 GEMM's problem: attention_v_widened) widened there
 * from its twin; once for the heads of a group that a thread takes in turn. */
static const REAL *attention_v_unit(const attention_ctx *c, attention_ws *w, size_t u)
{
    const posenc_problem *p = c->p;
    const REAL *v = (const REAL *)posenc_kv_rows(w->v_rows, &w->v_held, c->a->v,
                                                 &c->a->v_strides, p, u / p->H, u % p->H, p->m,
                                                 c->a->dv, sizeof(REAL));
    if (attention_v_widened(c) && v != w->v_rows) {
        const size_t held = posenc_kv_unit(p, u) + 1;
        if (w->v_held == held)
            return w->v_rows;
        gemm_scratch s;
        gemm_scratch_carve(&s, NULL, c->kern, p);   /* the problem's twins */
        const REAL *values = unit_rows(&s, w->v_rows, v, p->m, c->a->dv, 0, p->m);
        w->v_held = values == w->v_rows ? held : 0;
        return values;
    }
    return v;
}

/* The keys [*lo, *hi) query row i of batch row b may see (SPEC §6, §7): all,
 * or those causality, the window and its document leave; key padding and a
 * scattered document's other keys are masked within (attention_mask_row).
 * An empty range is [0, 0). */
static void attention_row_range(const attention_ctx *c, size_t b, size_t i, size_t *lo, size_t *hi)
{
    const posenc_attention *a = c->a;
    const size_t m = c->p->m, pos = c->p->query_offset + i;
    size_t l = 0, h = m;
    if (a->causal)
        h = posenc_min(h, pos + 1);
    if (a->window) {
        if (a->window_left != POSENC_UNBOUNDED && pos > a->window_left)
            l = pos - a->window_left;
        if (a->window_right < m)   /* a wider bound leaves every key */
            h = posenc_min(h, pos + a->window_right + 1);
    }
    if (c->doc_range) {
        const size_t *range = c->doc_range + 2 * (b * c->p->n + i);
        l = posenc_max(l, range[0]);
        h = posenc_min(h, range[1]);
    }
    *lo = l < h ? l : 0;
    *hi = l < h ? h : 0;
}

/* The keys [*c0, *c1) the tile of rows [i0, i0 + rows) of batch row b computes: the
 * union of its rows' ranges, c0 rounded down to the context's alignment; [0, 0)
 * when every row is empty. */
static void attention_span(const attention_ctx *c, size_t b, size_t i0, size_t rows, size_t *c0,
                           size_t *c1)
{
    if (!c->ranged) {
        *c0 = 0;
        *c1 = c->p->m;
        return;
    }
    size_t lo = c->p->m, hi = 0;
    for (size_t r = 0; r < rows; ++r) {
        size_t l, h;
        attention_row_range(c, b, i0 + r, &l, &h);
        if (l < h) {
            lo = posenc_min(lo, l);
            hi = posenc_max(hi, h);
        }
    }
    *c0 = hi == 0 ? 0 : c->align ? lo / c->align * c->align : 0;
    *c1 = hi;
}

/* The limits of a ranged block of rows [blk0, blk0 + rows) of batch row b
 * (block_limits, in w's row_keys and key_rows; w->row_range holds each row's
 * range): per tile of mr rows its span, per tile of mr keys the rows whose
 * ranges reach it (an interval where the ranges never move back, as under
 * causality and a window; else the rows from the first to the last that
 * reach it); first and cols: the block's span. */
static block_limits attention_block_limits(const attention_ctx *c, attention_ws *w, size_t b,
                                           size_t blk0, size_t rows)
{
    const size_t mr = c->kern->mr;
    size_t first = c->p->m, cols = 0;
    int monotone = 1;
    for (size_t r = 0; r < rows; ++r) {
        size_t *range = w->row_range + 2 * r;
        attention_row_range(c, b, blk0 + r, &range[0], &range[1]);
        if (r && range[0] < range[1] && (range[0] < range[-2] || range[1] < range[-1]))
            monotone = 0;
        if (r && range[0] == range[1] && range[-2] < range[-1])
            monotone = 0;   /* an empty row after a nonempty one */
    }
    for (size_t t = 0; t * mr < rows; ++t) {
        size_t *span = w->row_keys + 2 * t;
        attention_span(c, b, blk0 + t * mr, posenc_min(mr, rows - t * mr), &span[0], &span[1]);
        if (span[0] < span[1]) {
            first = posenc_min(first, span[0]);
            cols = posenc_max(cols, span[1]);
        }
    }
    first = cols == 0 || !c->block_align ? 0 : first / c->block_align * c->block_align;
    const size_t t0 = first / mr, t1 = (cols + mr - 1) / mr;
    for (size_t t = 0; t < t1; ++t) {   /* the tiles before `first` too: GEMMs from key 0 */
        w->key_rows[2 * t] = rows;
        w->key_rows[2 * t + 1] = 0;
    }
    if (monotone) {   /* rows reaching key tile t: from the first whose range ends past it starts
                         to the last whose range starts before it ends */
        size_t r_lo = 0, r_hi = 0;
        for (size_t t = t0; t < t1; ++t) {
            const size_t j0 = t * mr, j1 = j0 + mr;
            while (r_lo < rows && (w->row_range[2 * r_lo + 1] <= j0 ||
                                   w->row_range[2 * r_lo] == w->row_range[2 * r_lo + 1]))
                ++r_lo;
            r_hi = posenc_max(r_hi, r_lo);
            while (r_hi < rows && w->row_range[2 * r_hi] < j1 &&
                   w->row_range[2 * r_hi] < w->row_range[2 * r_hi + 1])
                ++r_hi;
            if (r_lo < r_hi) {
                w->key_rows[2 * t] = r_lo;
                w->key_rows[2 * t + 1] = r_hi;
            }
        }
    } else {
        for (size_t r = 0; r < rows; ++r) {
            const size_t l = w->row_range[2 * r], h = w->row_range[2 * r + 1];
            for (size_t t = l / mr; l < h && t * mr < h; ++t) {
                w->key_rows[2 * t] = posenc_min(w->key_rows[2 * t], r);
                w->key_rows[2 * t + 1] = posenc_max(w->key_rows[2 * t + 1], r + 1);
            }
        }
    }
    for (size_t t = 0; t < t1; ++t)   /* no row: an empty range */
        if (w->key_rows[2 * t] >= w->key_rows[2 * t + 1])
            w->key_rows[2 * t] = w->key_rows[2 * t + 1] = 0;
    block_limits limits = {w->row_keys, w->key_rows, first, cols};
    return limits;
}

/* Keys [lo, hi) of row i of batch row b set to `fill` where padding or (a scattered
 * document) another document's: -inf on the logits, 0 on dS (written, not computed:
 * whatever the key's k and v, SPEC §6). */
static void attention_mask_row(const attention_ctx *c, REAL *x, size_t b, size_t i, size_t lo,
                               size_t hi, REAL fill)
{
    if (c->padding_start)
        for (size_t t = c->padding_start[b]; t < c->padding_start[b + 1]; ++t) {
            const size_t js = posenc_max(c->padding_runs[2 * t], lo);
            const size_t je = posenc_min(c->padding_runs[2 * t + 1], hi);
            if (js < je)
                c->kern->row_gather(POSENC_SET, x + js, &fill, 0, je - js);
        }
    if (c->doc_scattered && c->doc_scattered[b]) {
        const posenc_problem *p = c->p;
        const int64_t id = c->a->document_q[b * p->n + i], *doc = c->a->document_k + b * p->m;
        for (size_t j = lo; j < hi; ++j)
            if (doc[j] != id)
                x[j] = fill;
    }
}

/*
 * A masked key is never read (SPEC §6): its probability is written 0, but P.v, dO.v^T
 * and dS.k would still multiply that 0 by its v or k row (0 NaN = NaN).  Padding keys
 * are masked for every row of a unit: their rows of the packed v are zeroed
 * (attention_zero_padding).  A key at the edge of a tile's rows' ranges is seen by some
 * of its rows only: where such a key holds an Inf or NaN (attention_tile_unread, over
 * those few keys), the tile's products go row by row over each row's own range, the
 * same sums (a zero weight times a finite value adds nothing), so finite inputs give
 * the same bits on either path.  The check is all_finite (scales_impl.h):
 * sixteen sums side by side, not one chain of additions per tile.
 */

/* The padded keys of batch row b in [from, to): their rows of pb (packed from key
 * `first`: the packed v, or dq's k) set to 0. */
static void attention_zero_padding(const attention_ctx *c, const packed_b *pb, size_t b,
                                   size_t from, size_t to, size_t first)
{
    if (!c->padding_start || pb->bf16 || from >= to)
        return;
    for (size_t t = c->padding_start[b]; t < c->padding_start[b + 1]; ++t) {
        const size_t js = posenc_max(c->padding_runs[2 * t], from);
        const size_t je = posenc_min(c->padding_runs[2 * t + 1], to);
        if (js < je)
            packed_b_zero_rows(pb, c->kern->kc, js - first, je - first);
    }
}

/* Whether some key of [c0, c1) that a row of [i0, i0 + rows) of batch row b does not
 * see holds an Inf or NaN in its row of x (width elements a key): the keys outside
 * every row's range, the whole span with a scattered document, and with `padding`
 * the padded keys. */
static int attention_tile_unread(const attention_ctx *c, size_t b, size_t i0, size_t rows,
                                 size_t c0, size_t c1, const REAL *x, size_t width, int padding)
{
    size_t all_lo = c0, all_hi = c1;   /* the keys every row sees (less padding) */
    for (size_t r = 0; r < rows; ++r) {
        size_t lo, hi;
        attention_row_range(c, b, i0 + r, &lo, &hi);
        all_lo = posenc_max(all_lo, lo);
        all_hi = posenc_min(all_hi, hi);
    }
    if (all_hi <= all_lo || (c->doc_scattered && c->doc_scattered[b]))
        all_lo = all_hi = c1;
    if (!all_finite(x + c0 * width, (all_lo - c0) * width) ||
        !all_finite(x + all_hi * width, (c1 - all_hi) * width))
        return 1;
    if (padding && c->padding_start)
        for (size_t t = c->padding_start[b]; t < c->padding_start[b + 1]; ++t) {
            const size_t js = posenc_max(c->padding_runs[2 * t], all_lo);
            const size_t je = posenc_min(c->padding_runs[2 * t + 1], all_hi);
            if (js < je && !all_finite(x + js * width, (je - js) * width))
                return 1;
        }
    return 0;
}

/* Row i of batch row b's copy of keys [c0, c1) of x (width elements a key) with the
 * rows of the keys it does not see set to 0. */
static void attention_seen_rows(const attention_ctx *c, REAL *copy, const REAL *x, size_t width,
                                size_t b, size_t i, size_t c0, size_t c1)
{
    size_t lo, hi;
    attention_row_range(c, b, i, &lo, &hi);
    lo = posenc_min(posenc_max(lo, c0), c1);
    hi = posenc_max(posenc_min(hi, c1), lo);
    memset(copy, 0, sizeof(REAL) * (lo - c0) * width);
    memcpy(copy + (lo - c0) * width, x + lo * width, sizeof(REAL) * (hi - lo) * width);
    memset(copy + (hi - c0) * width, 0, sizeof(REAL) * (c1 - hi) * width);
    const posenc_problem *p = c->p;
    const uint8_t *padded = c->a->key_padding_mask ? c->a->key_padding_mask + b * p->m : NULL;
    const int scattered = c->doc_scattered && c->doc_scattered[b];
    for (size_t j = lo; j < hi && (padded || scattered); ++j)   /* padding, another document's */
        if ((padded && padded[j]) ||
            (scattered && c->a->document_k[b * p->m + j] != c->a->document_q[b * p->n + i]))
            memset(copy + (j - c0) * width, 0, sizeof(REAL) * width);
}

/* softcap: x[j] = cap tanh(x[j] / cap), j < len; with grad (the backward) also
 * grad[j] = 1 - tanh^2, the derivative (the ISA's row_softcap). */
static void attention_cap_row(const attention_ctx *c, REAL *x, REAL *grad, size_t len)
{
    c->kern->row_softcap(x, grad, len, c->softcap);
}

/* D of row i of unit (b, h), keys [0, len): w->drop_row[j] = keep_scale or 0. */
static void attention_drop_row(const attention_ctx *c, attention_ws *w, size_t b, size_t h,
                               size_t i, size_t len)
{
    c->kern->dropout_row(w->keep, len, c->a->seed, c->threshold, c->a->batch_offset + b,
                         c->a->head_offset + h, i);
    /* keep is 0 or 1: keep_scale or +0, without a branch (a tenth of them would mispredict) */
    const uint8_t *restrict keep = w->keep;
    REAL *restrict drop = w->drop_row;
    const REAL scale = c->keep_scale;
    for (size_t j = 0; j < len; ++j)
        drop[j] = scale * (REAL)keep[j];
}

/* Whether x[j], j < len, holds a NaN. */
static int attention_has_nan(const REAL *x, size_t len)
{
    for (size_t j = 0; j < len; ++j)
        if (x[j] != x[j])
            return 1;
    return 0;
}

/* x[j] = 0 for the keys j < cols that row i of batch row b
 * does not see: the backward's masked_keys' unseen_zero, a content-reading term's
 * term_seen (attention_prepare). */
static void attention_hidden_unseen(const void *c_, REAL *x, size_t b, size_t i, size_t cols)
{
    const attention_ctx *c = (const attention_ctx *)c_;
    size_t lo, hi;
    attention_row_range(c, b, i, &lo, &hi);
    lo = posenc_min(lo, cols);
    hi = posenc_max(posenc_min(hi, cols), lo);
    memset(x, 0, sizeof(REAL) * lo);
    memset(x + hi, 0, sizeof(REAL) * (cols - hi));
    attention_mask_row(c, x, b, i, lo, hi, (REAL)0);
}

/*
 * Softmax of the logits row x of query i of unit (b, h), its tile having
 * computed keys [c0, c1): the row's range (attention_row_range) capped
 * (softcap), masked, then exp(x - shift) D, and 0 elsewhere in [c0, c1);
 * returns 1 / sum (the row's scale, 0 for a row whose keys are all masked:
 * then x is 0; NaN, and x NaN, for a row whose only unmasked logits are NaN,
 * or that sees a key beside a NaN sink: SPEC §6, NaN parameters propagate)
 * and writes stats[0] + log stats[1], its lse, as two terms (the caller takes
 * a tile's logs in one loop, where they overlap: -inf, the sink or NaN and 1
 * for those rows).  The shift is the row's max, or the head's sink where it
 * is larger; the sum counts exp(sink - shift).  With x16 (the bfloat16 GEMM,
 * no dropout) the probabilities go to x16 only, rounded as the GEMM would
 * round them, and the sum is theirs before the rounding (exp_row).
 */
static REAL attention_softmax_row(const attention_ctx *c, attention_ws *w, REAL *x, size_t b,
                                  size_t h, size_t i, size_t c0, size_t c1, double *stats,
                                  uint16_t *x16)
{
    size_t lo, hi;
    attention_row_range(c, b, i, &lo, &hi);
    if (lo >= hi)
        lo = hi = c0;
    REAL *row = x + lo;
    const size_t len = hi - lo;
    const double sink = c->a->sinks ? c->a->sinks[h] : -INFINITY;
    if (c->softcap > 0)
        attention_cap_row(c, row, NULL, len);
    attention_mask_row(c, x, b, i, lo, hi, (REAL)-INFINITY);
    const double row_max = c->kern->row_max(row, len);
    memset(x + c0, 0, sizeof(REAL) * (lo - c0));
    memset(x + hi, 0, sizeof(REAL) * (c1 - hi));
    const int nan_sink = sink != sink && row_max != -INFINITY;   /* the row sees a key */
    /* every key masked, NaN among masked keys (row_max passes NaN over), or a NaN sink */
    if (row_max == -INFINITY || nan_sink) {
        const REAL fill = nan_sink || attention_has_nan(row, len) ? (REAL)NAN : (REAL)0;
        for (size_t j = 0; j < len; ++j)
            row[j] = fill;
        stats[0] = fill == 0 ? sink : (double)fill;   /* a NaN row: out and lse NaN, as the reference's */
        stats[1] = 1;
#ifdef ENGINE_BF16_GEMM
        if (x16)
            c->kern->bf16->round_row(x16 + c0, x + c0, c1 - c0);
#endif
        return fill;
    }
    const double shift = sink > row_max ? sink : row_max;
    const double sink_term = sink != -INFINITY ? exp(sink - shift) : 0.0;
#ifdef ENGINE_BF16_GEMM
    if (x16) {
        const double sum16 = c->kern->bf16->exp_row(x16 + lo, row, len, shift) + sink_term;
        stats[0] = shift;
        stats[1] = sum16;
        memset(x16 + c0, 0, sizeof(uint16_t) * (lo - c0));
        memset(x16 + hi, 0, sizeof(uint16_t) * (c1 - hi));
        return (REAL)(1.0 / sum16);
    }
#else
    (void)x16;
#endif
    const double sum = c->kern->row_exp(row, len, shift) + sink_term;
    stats[0] = shift;
    stats[1] = sum;
    if (c->dropout) {
        attention_drop_row(c, w, b, h, i, hi);
        c->kern->row_gather(POSENC_MUL, row, w->drop_row + lo, 1, len);
    }
    return (REAL)(1.0 / sum);
}

/*
 * Under `causal` a unit's tiles see more keys as they go, so its keys are
 * packed as its tiles reach them (k^T, v^T: whole panels of keys; v: rows)
 * instead of before its first tile, and the keys of the tiles ahead are
 * asked of memory (posenc_prefetch) while the current ones compute: the
 * unit's reads of k and v overlap its arithmetic instead of stalling its
 * start.  REAL panels only (the bfloat16 GEMM packs row pairs: it packs
 * everything first).
 */
typedef struct {
    const packed_b *pb;
    const REAL *x;   /* the unit's keys, `width` elements each */
    size_t width;
    int key_rows;    /* the keys are the operand's rows (v for P.v), else its columns */
} causal_operand;

typedef struct {
    causal_operand op[2];
    size_t done, asked;   /* keys packed, asked for */
} causal_keys;

/* An operand's keys [from, to) as its layout holds them: rows, or whole panels of columns. */
static void causal_operand_span(const causal_operand *o, size_t *from, size_t *to)
{
    if (o->key_rows)
        return;
    const size_t nr = o->pb->nr, m = o->pb->N;
    *from = posenc_min(m, posenc_round_up(*from, nr));
    *to = posenc_min(m, posenc_round_up(*to, nr));
}

/* The keys [0, cols) packed; those up to `ahead` asked for. */
static void causal_keys_reach(const posenc_kernels *kern, causal_keys *ck, size_t cols, size_t ahead)
{
    for (int t = 0; t < 2; ++t) {
        const causal_operand *o = &ck->op[t];
        size_t from = ck->asked, to = ahead;
        causal_operand_span(o, &from, &to);
        if (to > from)
            posenc_prefetch(o->x + from * o->width, (to - from) * o->width * sizeof(REAL));
        from = ck->done, to = cols;
        causal_operand_span(o, &from, &to);
        if (to <= from)
            continue;
        if (o->key_rows)
            pack_b_part(kern, o->pb, o->x, (ptrdiff_t)o->width, 1, from, to, 0, o->width);
        else
            pack_b_part(kern, o->pb, o->x, 1, (ptrdiff_t)o->width, 0, o->width, from, to);
    }
    ck->asked = posenc_max(ck->asked, ahead);
    ck->done = posenc_max(ck->done, cols);
}

/* The softmax rows of a tile's logits in w->scores (rows [i0, i0 + rows) of unit (b, h),
 * keys [c0, cols) computed): probabilities, w->row_scale, and the rows' lse into lse_u. */
static void attention_tile_softmax(const attention_ctx *c, attention_ws *w, size_t b, size_t h,
                                   size_t i0, size_t rows, size_t c0, size_t cols, REAL *lse_u)
{
    const size_t ld = c->logits.m_pad;
    for (size_t r = 0; r < rows; ++r)
        w->row_scale[r] = attention_softmax_row(c, w, w->scores + r * ld, b, h, i0 + r, c0,
                                                cols, w->row_stats + 2 * r,
                                                w->scores16 ? w->scores16 + r * ld : NULL);
    for (size_t r = 0; r < rows; ++r)
        lse_u[i0 + r] = (REAL)(w->row_stats[2 * r] + log(w->row_stats[2 * r + 1]));
}

/* C's rows = A's rows . B (B packed from key `first`: its keys' rows) for rows [i0, i0 +
 * rows) of batch row b, row by row over each row's range, so that no row reads a key it
 * does not see (attention_tile_unread); with a scattered document, on a copy of the
 * packed B with the other documents' keys zeroed.  P.v (A = P) and dq = dS.k. */
static void attention_rows_product(const attention_ctx *c, gemm_scratch *scratch,
                                   const packed_b *pb, const REAL *A, size_t lda, REAL *C,
                                   size_t ldc, size_t b, size_t i0, size_t rows, size_t first)
{
    const posenc_problem *p = c->p;
    const int scattered = c->doc_scattered && c->doc_scattered[b];
    const size_t size = pb->K * pb->n_pad;
    packed_b own = *pb;
    if (scattered && !(own.data = (REAL *)posenc_alloc(size, sizeof(REAL))))
        own = *pb;   /* out of memory: the rows' ranges alone */
    for (size_t r = 0; r < rows; ++r) {
        size_t lo, hi;
        attention_row_range(c, b, i0 + r, &lo, &hi);
        lo = posenc_max(lo, first);
        hi = posenc_max(hi, lo);
        const size_t k_range[2] = {lo - first, hi - first};
        if (own.data != pb->data) {
            const int64_t id = c->a->document_q[b * p->n + i0 + r];
            const int64_t *doc = c->a->document_k + b * p->m;
            memcpy(own.data, pb->data, sizeof(REAL) * size);
            for (size_t j = lo; j < hi; ++j)
                if (doc[j] != id)
                    packed_b_zero_rows(&own, c->kern->kc, j - first, j - first + 1);
        }
        gemm_packed(c->kern, scratch, 1, A + r * lda, (ptrdiff_t)lda, 1, &own, C + r * ldc,
                    (ptrdiff_t)ldc, 0, NULL, 0, NULL, 0, k_range);
    }
    if (own.data != pb->data)
        posenc_free(own.data);
}

/* The padded key runs of every batch row; 0, or -1 out of memory. */
static int attention_padding_runs(attention_ctx *c)
{
    const posenc_problem *p = c->p;
    const uint8_t *mask = c->a->key_padding_mask;
    if (!mask)
        return 0;
    size_t count = 0;
    for (size_t t = 0; t < p->B * p->m; ++t)
        count += mask[t] && (t % p->m == 0 || !mask[t - 1]);
    c->padding_start = (size_t *)posenc_alloc(p->B + 1, sizeof(size_t));
    c->padding_runs = (size_t *)posenc_alloc(2 * count, sizeof(size_t));
    if (!c->padding_start || !c->padding_runs)
        return -1;
    size_t t = 0;
    for (size_t b = 0; b < p->B; ++b) {
        c->padding_start[b] = t;
        const uint8_t *row = mask + b * p->m;
        for (size_t j = 0; j < p->m; ++j)
            if (row[j] && (j == 0 || !row[j - 1])) {
                size_t end = j;
                while (end < p->m && row[end])
                    ++end;
                c->padding_runs[2 * t] = j;
                c->padding_runs[2 * t + 1] = end;
                ++t;
            }
    }
    c->padding_start[p->B] = t;
    return 0;
}

/* Sorts the runs (id, start, end) of a batch row's documents by id, then start. */
static int attention_run_order(const void *x_, const void *y_)
{
    const int64_t *x = (const int64_t *)x_, *y = (const int64_t *)y_;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* The documents' ranges and scattered rows (attention_ctx); 0, or -1 out of memory. */
static int attention_documents(attention_ctx *c)
{
    const posenc_problem *p = c->p;
    const posenc_attention *a = c->a;
    if (!a->document_q)
        return 0;
    const size_t n = p->n, m = p->m;
    c->doc_range = (size_t *)posenc_alloc(2 * p->B * n, sizeof(size_t));
    c->doc_scattered = (uint8_t *)posenc_alloc(p->B, 1);
    int64_t *runs = (int64_t *)posenc_alloc(3 * m, sizeof(int64_t));
    if (!c->doc_range || !c->doc_scattered || !runs) {
        posenc_free(runs);
        return -1;
    }
    for (size_t b = 0; b < p->B; ++b) {
        const int64_t *doc_k = a->document_k + b * m, *doc_q = a->document_q + b * n;
        size_t count = 0;
        for (size_t j = 0; j < m; ++j) {
            if (j == 0 || doc_k[j] != doc_k[j - 1]) {
                runs[3 * count] = doc_k[j];
                runs[3 * count + 1] = (int64_t)j;
                ++count;
            }
            runs[3 * count - 1] = (int64_t)j + 1;
        }
        qsort(runs, count, 3 * sizeof(int64_t), attention_run_order);
        c->doc_scattered[b] = 0;
        for (size_t t = 1; t < count; ++t)
            c->doc_scattered[b] |= runs[3 * t] == runs[3 * (t - 1)];
        for (size_t i = 0; i < n; ++i) {   /* the id's runs: first start to last end */
            size_t lo = 0, hi = count;
            while (lo < hi) {
                const size_t mid = lo + (hi - lo) / 2;
                if (runs[3 * mid] < doc_q[i]) lo = mid + 1; else hi = mid;
            }
            size_t *range = c->doc_range + 2 * (b * n + i);
            range[0] = range[1] = 0;
            if (lo < count && runs[3 * lo] == doc_q[i]) {
                size_t last = lo;
                while (last + 1 < count && runs[3 * (last + 1)] == doc_q[i])
                    ++last;
                range[0] = (size_t)runs[3 * lo + 1];
                range[1] = (size_t)runs[3 * last + 2];
            }
        }
    }
    posenc_free(runs);
    return 0;
}

static void attention_release(attention_ctx *c)
{
    forward_release(&c->logits);
    posenc_free(c->padding_start);
    posenc_free(c->padding_runs);
    posenc_free(c->doc_range);
    posenc_free(c->doc_scattered);
}

/* The largest offset j - i of a nonzero probability: m - 1, or under `causal` the query offset. */
static ptrdiff_t attention_last_offset(const posenc_problem *p, const posenc_attention *a)
{
    return (ptrdiff_t)(a->causal ? posenc_min(p->m - 1, p->query_offset) : p->m - 1);
}

/* A head's dense block (forward_head_block: n x m per thread) only up to
 * this size: past it the attention's scratch would grow as the logits. */
#define ATTENTION_HEAD_BLOCK_BYTES ((size_t)4 << 20)
/* Calls of at most this many query rows take the decoding path (attention_decode_unit). */
#define ATTENTION_DECODE_ROWS 16

/* The attention's context, with the logits'. */
static int attention_prepare(attention_ctx *c, const posenc_problem *p, const posenc_attention *a,
                             const posenc_kernels *kern)
{
    memset(c, 0, sizeof *c);
    c->chunks = 1;   /* attention_split: the forward's decoding step may split its keys */
    c->p = p;
    c->a = a;
    c->kern = kern;
    c->dropout = a->dropout_p > 0;
    c->threshold = posenc_dropout_threshold(a->dropout_p);
    c->keep_scale = (REAL)(1.0 / (1.0 - a->dropout_p));
    int status = forward_prepare(&c->logits, p, kern, NULL, a->causal);
    c->logits.stream = 0;
    c->ranged = a->causal || a->window || a->document_q;
    c->softcap = a->softcap > 0 ? a->softcap : 0;
    /* tiles start past key 0 where the key panels (and v^T's, the backward's) are one depth
     * block and the scale tame (forward_tile) */
    const packed_b keys = packed_b_shape(kern, NULL, p->d, p->m, 1);
    if (c->ranged && !c->logits.scales.exact && p->d <= kern->kc && a->dv <= kern->kc) {
        size_t x = kern->mr, y = keys.nr;
        while (y) {
            const size_t t = x % y;
            x = y;
            y = t;
        }
        c->align = keys.nr;
        c->block_align = kern->mr / x * keys.nr;
    }
    c->grads_from_first = !(posenc_terms_by_blocks(p) || posenc_terms_vector(p) ||
                            p->product || c->logits.content >= 0);
    c->decode = p->n <= ATTENTION_DECODE_ROWS && !c->logits.scales.exact &&
                c->logits.expanded < 0;
    /* a decoding step's few rows form the modules' rows where they are read */
    forward_plan_blocks(&c->logits, ATTENTION_HEAD_BLOCK_BYTES, !c->decode);
    c->decode_terms = c->logits.modules || c->logits.content >= 0;
    c->seen.ctx = c;
    c->seen.unseen_zero = attention_hidden_unseen;
    c->logits.seen = &c->seen;
    if (status == POSENC_OK && (attention_padding_runs(c) || attention_documents(c)))
        status = POSENC_ENOMEM;
    return status;
}

/* A thread's workspaces: the logits' tiles, the gradients' (backward), the attention's. */
typedef struct {
    forward_ws logits;
    backward_ws grads;
    attention_ws attention;
} attention_thread;

/* A thread's workspaces carved from mem (t != NULL), or their size in elements;
 * g is the gradients' context (NULL: the forward). */
static size_t attention_thread_layout(const attention_ctx *c, const backward_ctx *g,
                                      attention_thread *t, REAL *mem)
{
    size_t at = forward_ws_layout(&c->logits, t ? &t->logits : NULL, mem);
    if (g)
        at += backward_ws_layout(g, t ? &t->grads : NULL, t ? mem + at : NULL);
    return at + attention_ws_layout(c, g != NULL, g ? g->row_block : 0, t ? &t->attention : NULL,
                                    t ? mem + at : NULL);
}

/* One work item of a call, on the calling thread's workspaces. */
typedef void (*attention_item)(const void *call, attention_thread *t, size_t item);

typedef struct {
    const attention_ctx *c;
    const backward_ctx *g;
    size_t items;
    attention_item run_item;
    const void *call;
} attention_team_call;

/* One thread's items (posenc_run_team; ws: its workspaces). */
static void attention_team(void *arg, void *ws)
{
    const attention_team_call *team = (const attention_team_call *)arg;
    attention_thread t;
    attention_thread_layout(team->c, team->g, &t, (REAL *)ws);
    if (team->c->decode && !team->g) {
        /* a decoding step's items are short and a busy core's thread would hold its
         * static share: each thread takes the next item (results do not depend on who) */
#pragma omp for schedule(dynamic, 1)
        for (ptrdiff_t item = 0; item < (ptrdiff_t)team->items; ++item)
            team->run_item(team->call, &t, (size_t)item);
    } else {
#pragma omp for schedule(static)
        for (ptrdiff_t item = 0; item < (ptrdiff_t)team->items; ++item)
            team->run_item(team->call, &t, (size_t)item);
    }
}

/* Every item of a call, spread over a team of at most one thread per item (posenc_team). */
static int attention_run(const attention_ctx *c, const backward_ctx *g, int num_threads,
                         size_t items, attention_item run_item, const void *call)
{
    attention_team_call team = {c, g, items, run_item, call};
    return posenc_run_team(posenc_team((size_t)(num_threads > 0 ? num_threads : 1), items, c->p),
                           attention_thread_layout(c, g, NULL, NULL) * sizeof(REAL),
                           attention_team, &team);
}

#endif /* POSENC_ENGINE_ATTENTION_IMPL_H */
