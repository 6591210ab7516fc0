/*
 * backward_impl.h -- gradients of sum(G * A) for one dtype (REAL, set by
 * engine_<dtype>.c): the phases and a unit's flow.  In their own files: the
 * context and workspace (backward_rows_impl.h), the product mode's factors
 * (backward_product_impl.h), the slots and their reduction
 * (backward_slots_impl.h); the kinds' own gradients in theirs (csrc/terms.h:
 * the vector tables' sums and GEMMs, term_vectors_grad_impl.h).
 *
 * Phase 1, parallel over (b, h) units, each owned by one thread:
 *   dq = s Gc.k (+ Gq.query_table),  dk = s Gc^T.q (+ Gk.key_table),
 *   where Gc is G (sum) or G times the positional factors (product), Gq
 *   (n x buckets) and Gk (m x buckets) are G scattered into buckets along
 *   each bucket's diagonals, and the unit's partial table / vector-table
 *   gradients go to a slot of their own, the term modules' (the reset's
 *   theta among them) to their per-unit gradients.  The GEMMs through
 *   Gq and Gk skip, tile by tile, the buckets (or rows) a tile cannot reach
 *   (posenc_spans): with DeBERTa's 2k buckets about a third of their work.
 * Phase 2, parallel over heads: the gradients of the term modules that go by
 *   blocks (term_kind's grad_block: TUPE's dense factor, dpos_q = ds S_h.pos_k,
 *   dpos_k = ds S_h^T.pos_q) from S_h = sum_b G[b, h], as unit (0, h)'s.
 * Phase 3: the slots are summed in a fixed (h, b) order.
 * No sum ever depends on which thread ran what: the gradients are bitwise
 * identical for any number of threads.
 */
#ifndef POSENC_ENGINE_BACKWARD_IMPL_H
#define POSENC_ENGINE_BACKWARD_IMPL_H

#include "gemm_impl.h"
#include "rope_impl.h"
#include "scales_impl.h"
#include "backward_rows_impl.h"
#include "backward_product_impl.h"
#include "backward_slots_impl.h"

static size_t backward_ws_layout(const backward_ctx *c, backward_ws *w, REAL *mem)
{
    const posenc_problem *p = c->p;
    const size_t nr = c->kern->nr, n = p->n, m = p->m, d = p->d;
    size_t at = 0;
    if (w) {
        memset(w, 0, sizeof *w);
        gemm_scratch_carve(&w->scratch, mem, c->kern, c->p);
        w->env = term_env_of(c->p, c->kern, &w->scratch, c->terms);
        w->env.whole = 1;   /* its tiles read past a causal forward's reach */
        w->env.seen = c->masked_keys ? c->seen : NULL;
    }
    at += posenc_round_up(gemm_scratch_size(c->kern), 16);
    const size_t depth = posenc_max(posenc_max(n, m), c->row_block);
    WS_TAKE(w, mem, at, b_pack, packed_b_size(depth, d, nr));
    /* the logits' backward rotates (widens: unit_inputs_widen; copies: strided) its own;
     * the attention's shares */
    if (unit_inputs_copied(p, c->content >= 0 && c->kern->bf16) && c->G) {
        WS_TAKE(w, mem, at, inputs.q_rot, n * d);
        WS_TAKE(w, mem, at, inputs.k_rot, m * d);
    }
    if (c->g->k && posenc_kv_group(p) > 1)
        WS_TAKE(w, mem, at, dk_unit, m * d);
    if (c->sums) {
        WS_TAKE(w, mem, at, term_grad_ws, terms_grad_layout(p, c->kern, c->grad_data,
                                                            w ? &w->env : NULL));
        if (w)
            w->env.grad_ws = w->term_grad_ws;
    }
    if (c->scales.exact && c->sums)
        WS_TAKE(w, mem, at, vector_grad, posenc_max(n, m) * d);
    if (p->product)
        backward_product_ws(c, w, mem, &at);
    if (c->need_blocks)
        WS_TAKE(w, mem, at, grad_sum, c->row_block * m);
    if (c->kern->bf16 && c->reads_g)
        WS_TAKE(w, mem, at, g_block, c->row_block * m);
    if (c->need_modules || c->need_blocks || c->content >= 0)
        WS_TAKE(w, mem, at, term_scratch,
                terms_grad_scratch(p, c->kern) * (sizeof(double) / sizeof(REAL)));
    if (c->content >= 0) {   /* scales.exact: q's rows through the term held to the unit's end */
        WS_TAKE(w, mem, at, term_grad, c->row_block * m);
        WS_TAKE(w, mem, at, term_dq, (c->scales.exact ? n : c->row_block) * d);
    }
    if (c->content >= 0 && !c->G) {   /* the fused attention's: its logits keep (forward_keep) */
        const size_t ld = terms_content_keep(p, c->content);
        WS_TAKE(w, mem, at, keep.data, c->row_block * ld);
        WS_TAKE(w, mem, at, keep.range,
                (2 * c->row_block * sizeof(size_t) + sizeof(REAL) - 1) / sizeof(REAL));
        if (w)
            w->keep.ld = ld;
    }
    return posenc_round_up(at, POSENC_ALIGN / sizeof(REAL));
}

/* Sum mode: the positional gradients of rows [blk0, blk0 + rows) straight from G (keys
 * [0, cols)). */
static void backward_sum_rows(const backward_ctx *c, backward_ws *w, size_t u, size_t blk0,
                              size_t rows, const REAL *G_blk, size_t first, size_t cols)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t m = p->m;
    if (c->sums)   /* the kinds' sums leave the reset's cells out themselves */
        terms_grad_sums(p, kern, &w->env, -1, u / p->H, u % p->H, G_blk, m, blk0, rows, cols);
    const size_t skip = c->cls_row0 && blk0 == 0;   /* the [CLS] row */
    double *scratch = (double *)(void *)w->term_scratch;
    const uint16_t *G16 = NULL;   /* G_blk's twin where backward_g_rows left it unwritten */
#ifdef ENGINE_BF16_GEMM
    if (c->g16_rows)
        G16 = gemm_unwritten_twin(&w->scratch, G_blk, rows * m);
#endif
    if (c->need_modules && c->masked)   /* the reset's own cells: all of G */
        terms_grad_rows(p, kern, &w->env, c->g, TERMS_OVERRIDING, u, G_blk, G16, m, blk0, rows,
                        first, cols, scratch);
    if (c->need_modules && rows > skip)   /* the others: not the reset's row and column 0 */
        terms_grad_rows(p, kern, &w->env, c->g, TERMS_ADDING, u, G_blk + skip * m,
                        G16 ? G16 + skip * m : NULL, m, blk0 + skip, rows - skip,
                        posenc_max(first, c->masked ? (size_t)1 : 0), cols, scratch);
}

/* backward_sum_rows over a block: at once, or with `limits` tile by tile of mr rows over
 * the keys each tile sees (the same sums in the same order, less their zeros). */
static void backward_sum_block(const backward_ctx *c, backward_ws *w, size_t u, size_t blk0,
                               size_t rows, const REAL *G_blk, size_t cols,
                               const block_limits *limits)
{
    const size_t step = limits ? c->kern->mr : rows;
    for (size_t t0 = 0; t0 < rows; t0 += step)
        backward_sum_rows(c, w, u, blk0 + t0, posenc_min(step, rows - t0),
                          G_blk + t0 * c->p->m, limits ? limits->first : 0,
                          limits ? limits->row_keys[2 * (t0 / step) + 1] : cols);
}

/*
 * Where unit u's dk goes: its key head's gradient itself, or with grouped-query
 * attention (several query heads read one key head) the thread's dk_unit,
 * added into the key head's by backward_unit_commit_dk once the unit is done,
 * the query heads of a group in order on one thread: the same sums for any
 * number of threads.  NULL: dk is not wanted.
 */
static REAL *backward_unit_dk(const backward_ctx *c, const backward_ws *w, size_t u)
{
    if (!c->g->k)
        return NULL;
    return w->dk_unit ? w->dk_unit : (REAL *)c->g->k + u * c->p->m * c->p->d;
}

static void backward_unit_commit_dk(const backward_ctx *c, const backward_ws *w, size_t u)
{
    if (!w->dk_unit)
        return;
    const size_t len = c->p->m * c->p->d;
    REAL *dk = (REAL *)c->g->k + posenc_kv_unit(c->p, u) * len;
    if (u % posenc_kv_group(c->p) == 0)   /* the group's first query head */
        memcpy(dk, w->dk_unit, sizeof(REAL) * len);
    else
        for (size_t t = 0; t < len; ++t)
            dk[t] += w->dk_unit[t];
}

/* Unit u's start: the kinds' sums begun; in product mode s k^T packed into k_packed and
 * the factor kinds' unit data (the key table's projections). */
static void backward_unit_begin(const backward_ctx *c, backward_ws *w, size_t u,
                                packed_b *k_packed)
{
    const posenc_problem *p = c->p;
    const size_t m = p->m, d = p->d, h = u % p->H;
    const REAL *k_u = w->inputs.k;
    w->env.q = w->inputs.q;
    w->env.k = k_u;
    if (c->need_modules)
        terms_grads_begin(p, c->g, u);
    if (c->sums)
        terms_grad_begin(p, c->kern, &w->env, u / p->H, h);
    const masked_keys *hidden = c->masked_keys;
    w->k_unread = hidden && p->product && !c->kern->bf16 &&
                  hidden->unread_nonfinite(hidden->attention, u / p->H, k_u);
    if (p->product) {
        pack_b(c->kern, &w->scratch, k_packed, w->k_pack, k_u, 1, (ptrdiff_t)d, d, m, (REAL)p->scale);
        if (w->term_unit)
            terms_unit(p, c->kern, &w->env, 0, POSENC_TERM_COUNT, u / p->H, h, w->term_unit);
    }
}

/* Rows [blk0, blk0 + rows_blk) of unit u (rows_blk <= row_block) from
 * their rows of G: row i at G_blk + (i - blk0) m, zero past column cols
 * (m, or the keys a causal block sees: never fewer than a previous block's)
 * and outside `limits` (NULL: no other zeros); the sum mode reads only the
 * keys of cols, or of limits' tiles of rows, the product mode those of
 * block_width (the zeros its factors' gradients would add are left out). */
static void backward_unit_block(const backward_ctx *c, backward_ws *w, size_t u,
                                const packed_b *k_packed, size_t blk0, size_t rows_blk,
                                const REAL *G_blk, size_t cols, const block_limits *limits)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const posenc_grads *g = c->g;
    const size_t n = p->n, m = p->m, d = p->d, b = u / p->H, h = u % p->H;
    const REAL *q_u = w->inputs.q, *k_u = w->inputs.k;
    REAL *dq_u = g->q ? (REAL *)g->q + u * n * d : NULL;
    REAL *dk_u = backward_unit_dk(c, w, u);
    const REAL s = (REAL)p->scale;
    const REAL *Gc = G_blk;
    size_t ldg = m;
    if (p->product) {
        for (size_t i0 = blk0; i0 < blk0 + rows_blk; i0 += kern->mr)
            backward_product_tile(c, w, u, b, h, k_packed, blk0, i0,
                                  posenc_min(kern->mr, blk0 + rows_blk - i0), G_blk,
                                  block_width(limits, (i0 - blk0) / kern->mr, cols, kern->mr));
        Gc = w->content_grad;
        ldg = c->m_pad;
    } else {
        backward_sum_block(c, w, u, blk0, rows_blk, G_blk, cols, limits);
    }
    /* the GEMMs through Gc over its keys [first, cols) only (a ranged attention:
     * the rest of the block's rows are 0), and within them over `limits` */
    const size_t first = limits ? limits->first : 0, mr = kern->mr;
    REAL *term_dq = w->term_dq + (c->scales.exact ? blk0 * d : 0);
    if (c->content >= 0) {   /* G's path through a term that reads the content logits */
        terms_content_grad(p, kern, &w->env, g, c->content, u, q_u, k_u, c->scales.scale, G_blk,
                           w->term_grad, m, blk0, rows_blk, first, cols, c->seen, term_dq,
                           (double *)(void *)w->term_scratch, w->keep.data ? &w->keep : NULL);
        Gc = w->term_grad;
    }
    if (dq_u && c->need_content) {
        size_t from_first[2 * BLOCK_TILES_MAX];   /* row_keys counted from `first` */
        const size_t tiles = (rows_blk + mr - 1) / mr;
        const size_t skip = first && tiles <= BLOCK_TILES_MAX ? first : 0;
        for (size_t t = 0; skip && t < 2 * tiles; ++t)
            from_first[t] = posenc_max(limits->row_keys[t], skip) - skip;
        const masked_keys *hidden = c->masked_keys;
        const size_t *k_range = skip ? from_first : limits ? limits->row_keys : NULL;
        if (!hidden || kern->bf16) {
            gemm(kern, &w->scratch, w->b_pack, rows_blk, d, cols - skip, Gc + skip,
                 (ptrdiff_t)ldg, 1, k_u + skip * d, (ptrdiff_t)d, 1, s, dq_u + blk0 * d,
                 (ptrdiff_t)d, 0, k_range);
        } else if (rows_blk && d) {
            packed_b keys;
            pack_b(kern, &w->scratch, &keys, w->b_pack, k_u + skip * d, (ptrdiff_t)d, 1,
                   cols - skip, d, s);
            hidden->zero_keys(hidden->attention, &keys, b, skip);
            for (size_t i0 = blk0; i0 < blk0 + rows_blk; i0 += mr) {   /* tile by tile */
                const size_t tile = posenc_min(mr, blk0 + rows_blk - i0), t = (i0 - blk0) / mr;
                const size_t *range = k_range ? k_range + 2 * t : NULL;
                const REAL *G_tile = Gc + (i0 - blk0) * ldg + skip;
                REAL *dq_tile = dq_u + i0 * d;
                if (!hidden->rows(hidden->attention, &w->scratch, &keys, G_tile, ldg, dq_tile, d,
                                  b, i0, tile, skip, range ? skip + range[1] : cols, k_u))
                    gemm_packed(kern, &w->scratch, tile, G_tile, (ptrdiff_t)ldg, 1, &keys,
                                dq_tile, (ptrdiff_t)d, 0, NULL, 0, NULL, 0, range);
            }
        }
    }
    if (dq_u && c->content >= 0 && !c->scales.exact)   /* exact: after the scaling */
        kern->row_gather(POSENC_ADD, dq_u + blk0 * d, term_dq, 1, rows_blk * d);
    if (dk_u && c->need_content) {
        if (blk0 == 0) {   /* keys no block reaches yet */
            memset(dk_u, 0, sizeof(REAL) * first * d);
            memset(dk_u + cols * d, 0, sizeof(REAL) * (m - cols) * d);
        }
        gemm(kern, &w->scratch, w->b_pack, cols - first, d, rows_blk, Gc + first, 1,
             (ptrdiff_t)ldg, q_u + blk0 * d, (ptrdiff_t)d, 1, s, dk_u + first * d, (ptrdiff_t)d,
             blk0 > 0, limits ? limits->key_rows + 2 * (first / mr) : NULL);
    }
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

/* Unit u's end, once every row block is in: a product's module gradients
 * scaled (scales.exact), dq and dk back through the rotation (rope, which
 * has no vector table: where scales.exact scales the sums after, the
 * rotation scales them first, in the reference's order), the gradients
 * through the kinds' sums (the vector tables: terms_grad_end), q's then k's. */
static void backward_unit_end(const backward_ctx *c, backward_ws *w, size_t u)
{
    const posenc_problem *p = c->p;
    const posenc_grads *g = c->g;
    const size_t n = p->n, m = p->m, d = p->d, b = u / p->H, h = u % p->H;
    if (c->scales.exact && p->product && c->need_modules)   /* the module factor's: s left out */
        terms_grads_scale(p, g, u, c->scales.scale);
    if (posenc_rotates(p)) {
        unit_inputs_grads(p, g, &w->scratch, &w->inputs, u, g->q ? (REAL *)g->q + u * n * d : NULL,
                          backward_unit_dk(c, w, u), c->scales.exact ? &c->scales.scale : NULL);
        return;
    }
    for (int key_side = 0; key_side < 2; ++key_side) {
        const size_t rows = key_side ? m : n;
        const int vector = key_side ? 2 : 1;   /* the kinds that read k, or q */
        const REAL *x = key_side ? w->inputs.k : w->inputs.q;
        REAL *dx = key_side ? backward_unit_dk(c, w, u) : g->q ? (REAL *)g->q + u * n * d : NULL;
        if (!c->scales.exact) {
            if (c->sums)
                terms_grad_end(p, c->kern, &w->env, vector, b, h, x, dx);
            continue;
        }
        /* the vector part apart, so that each part is scaled after its sums */
        const int side = c->sums && terms_grad_reads(c->grad_data, vector);
        if (side && dx)
            memset(w->vector_grad, 0, sizeof(REAL) * rows * d);
        if (side)
            terms_grad_end(p, c->kern, &w->env, vector, b, h, x, dx ? w->vector_grad : NULL);
        if (dx)
            exact_content_grad(c, dx, side ? w->vector_grad : NULL, rows * d);
        if (dx && !key_side && c->content >= 0)   /* q's rows through the term, unscaled */
            for (size_t t = 0; t < rows * d; ++t)
                dx[t] = (REAL)((double)dx[t] + (double)w->term_dq[t]);
    }
}

/*
 * Rows [row0, row0 + rows) of G (rows of every unit counted) as float32: in
 * place, or where engine_lp.c left them unwritten (a bfloat16 G that the
 * GEMMs read through its twin) and the positional gradients read them,
 * widened into w->g_block, which becomes the twin's float32 side.  With
 * G_WIDEN_RESET (phase 1 where the reset is all that reads G: TUPE) only its
 * entries are widened, the [CLS] row and column 0; with G_WIDEN_NONE (phase 1
 * where the modules that read G read the twin: c->g16_rows) none, g_block
 * staying an unwritten twin's float32 side; the rest of g_block keeps no
 * values, which no one reads (the GEMMs take the twin).
 */
enum { G_WIDEN_ALL, G_WIDEN_RESET, G_WIDEN_NONE };

static const REAL *backward_g_rows(const backward_ctx *c, backward_ws *w, size_t row0,
                                   size_t rows, int widen)
{
    const size_t m = c->p->m, n = c->p->n;
    const REAL *G = c->G + row0 * m;
#ifdef ENGINE_BF16_GEMM
    const uint16_t *twin = w->g_block ? gemm_unwritten_twin(&w->scratch, G, rows * m) : NULL;
    if (twin) {
        if (widen == G_WIDEN_ALL)
            posenc_active_convert()->bf16_to_f32(w->g_block, twin, rows * m);
        else if (widen == G_WIDEN_RESET)
            for (size_t r = 0; r < rows; ++r) {
                const int cls = c->cls_row0 && (row0 + r) % n == 0;
                for (size_t j = 0; j < (cls ? m : 1); ++j)
                    w->g_block[r * m + j] = (REAL)bf16_value(twin[r * m + j]);
            }
        gemm_twin_set(&w->scratch, w->g_block, twin, rows * m);
        w->scratch.local.unwritten = widen == G_WIDEN_NONE;
        return w->g_block;
    }
#else
    (void)w;
    (void)n;
    (void)widen;
#endif
    return G;
}

static void backward_unit(const backward_ctx *c, backward_ws *w, size_t u)
{
    const size_t n = c->p->n;
    packed_b k_packed;
    unit_inputs_at(c->p, &w->scratch, &w->inputs, u / c->p->H, u % c->p->H, 0, n);
    if (c->content >= 0 && c->kern->bf16)   /* the term reads q and k themselves */
        unit_inputs_widen(&w->scratch, &w->inputs, n, c->p->m, c->p->d, 0, n);
    backward_unit_begin(c, w, u, &k_packed);
    for (size_t blk0 = 0; blk0 < n; blk0 += c->row_block) {
        const size_t rows = posenc_min(c->row_block, n - blk0);
        const int widen = c->g16_rows ? G_WIDEN_NONE : c->unit_reads_g ? G_WIDEN_ALL
                                                                          : G_WIDEN_RESET;
        backward_unit_block(c, w, u, &k_packed, blk0, rows,
                            backward_g_rows(c, w, u * n + blk0, rows, widen), c->p->m, NULL);
    }
    w->scratch.local.src = NULL;
    backward_unit_end(c, w, u);
    backward_unit_commit_dk(c, w, u);
}

/* Rows [blk0, blk0 + rows) of a gradient S (row r at S + r lds, keys [0, cols)) of unit
 * u (the fused attention's; the logits' phase 2: head u's sum over the batch) into the
 * slots of the term modules that go by blocks (term_kind's grad_block; zero where `limits`
 * skips), the reset's cells (the [CLS] row, column 0) zeroed in S first: they belong to
 * the reset. */
static void backward_block_grads(const backward_ctx *c, backward_ws *w, size_t u, REAL *S,
                                 size_t lds, size_t blk0, size_t rows, size_t cols,
                                 const block_limits *limits)
{
    for (size_t r = 0; r < rows && c->masked && cols; ++r) {
        if (c->cls_row0 && blk0 + r == 0)
            memset(S + r * lds, 0, sizeof(REAL) * cols);
        S[r * lds] = 0;
    }
    terms_grad_blocks(c->p, c->kern, &w->env, c->block_slots, u, c->G ? 0 : u / c->p->H,
                      u % c->p->H, S, lds, blk0, rows, cols, limits,
                      (double *)(void *)w->term_scratch);
}

#ifdef ENGINE_BF16_GEMM
/* Rows [blk0, blk0 + rows) of S = sum_b G[b, h] where each batch row's block of G is a
 * bfloat16 twin engine_lp.c left unwritten (backward_g_rows): SUM_ROWS batch rows at a
 * time widened and added in one pass per row (posenc_convert.bf16_sum), each element's
 * float32 additions in batch order, as row_gather's row by row sum makes them.  0 (S
 * untouched) where a block has no such twin. */
static int backward_g_sum_twins(const backward_ctx *c, backward_ws *w, size_t h, size_t blk0,
                                size_t rows, REAL *S)
{
    enum { SUM_ROWS = 16 };
    const posenc_problem *p = c->p;
    const size_t m = p->m, block = rows * m;
    const uint16_t *twin[SUM_ROWS], *row[SUM_ROWS];
#define G_BLOCK(b) (c->G + (((b) * p->H + h) * p->n + blk0) * m)
    for (size_t b = 0; b < p->B; ++b)
        if (!w->g_block || !gemm_unwritten_twin(&w->scratch, G_BLOCK(b), block))
            return 0;
    for (size_t b0 = 0; b0 < p->B; b0 += SUM_ROWS) {
        const size_t count = posenc_min(SUM_ROWS, p->B - b0);
        for (size_t t = 0; t < count; ++t)
            twin[t] = gemm_unwritten_twin(&w->scratch, G_BLOCK(b0 + t), block);
        for (size_t r = 0; r < rows; ++r) {
            for (size_t t = 0; t < count; ++t)
                row[t] = twin[t] + r * m;
            posenc_active_convert()->bf16_sum(S + r * m, row, count, m, b0 > 0);
        }
    }
#undef G_BLOCK
    return 1;
}
#endif

/* Phase 2: head h's gradients of the term modules that go by blocks, from S_h = sum_b
 * G[b, h] block by block, into their slots' unit h (backward_reduce writes them). */
static void backward_head_blocks(const backward_ctx *c, backward_ws *w, size_t h)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t n = p->n, m = p->m, H = p->H;
    REAL *S = w->grad_sum;
    for (size_t blk0 = 0; blk0 < n; blk0 += c->row_block) {
        const size_t rows = posenc_min(c->row_block, n - blk0);
        int summed = 0;
#ifdef ENGINE_BF16_GEMM
        summed = backward_g_sum_twins(c, w, h, blk0, rows, S);
#endif
        for (size_t b = 0; b < p->B && !summed; ++b)   /* row by row: a widened row stays in L1 */
            for (size_t r = 0; r < rows; ++r)
                kern->row_gather(b == 0 ? POSENC_SET : POSENC_ADD, S + r * m,
                                 backward_g_rows(c, w, (b * H + h) * n + blk0 + r, 1, G_WIDEN_ALL),
                                 1, m);
        w->scratch.local.src = NULL;
        backward_block_grads(c, w, h, S, m, blk0, rows, m, NULL);
    }
}

/* One thread's part of phases 1 and 2 (posenc_run_team; arg: the context). */
static void backward_team(void *arg, void *ws)
{
    const backward_ctx *c = (const backward_ctx *)arg;
    const posenc_problem *p = c->p;
    const int phase1 = c->need_content || c->sums || c->need_modules;
    backward_ws w;
    backward_ws_layout(c, &w, (REAL *)ws);
    if (phase1) {
        /* a key head's query heads on one thread, in order (backward_unit_dk) */
        const size_t group = posenc_kv_group(p);
#pragma omp for schedule(static)
        for (ptrdiff_t ku = 0; ku < (ptrdiff_t)(p->B * p->H / group); ++ku)
            for (size_t t = 0; t < group; ++t)
                backward_unit(c, &w, (size_t)ku * group + t);
    }
    if (c->need_blocks) {
#pragma omp for schedule(static)
        for (ptrdiff_t h = 0; h < (ptrdiff_t)p->H; ++h)
            backward_head_blocks(c, &w, (size_t)h);
    }
}

static int backward(const posenc_problem *p, const void *grad, const posenc_grads *g,
                    int num_threads)
{
    const size_t BH = p->B * p->H;
    if (BH == 0 || p->n == 0 || p->m == 0) {
        backward_zero(p, g);
        return POSENC_OK;
    }
    backward_ctx c;
    const posenc_kernels *kern = posenc_engine_kernels(p, REAL_DTYPE);
    int status = backward_prepare(&c, p, kern, (const REAL *)grad, g,
                                  (ptrdiff_t)p->m - 1, NULL);
    if (status == POSENC_OK)
        status = posenc_run_team(posenc_team((size_t)(num_threads > 0 ? num_threads : 1), BH, p),
                                 backward_ws_layout(&c, NULL, NULL) * sizeof(REAL), backward_team,
                                 &c);
    if (status == POSENC_OK)
        backward_reduce(&c);
    backward_release(&c);
    return status;
}

#endif /* POSENC_ENGINE_BACKWARD_IMPL_H */
