/*
 * backward_product_impl.h -- the product mode's backward (M2, M4M: A = s q.k times the
 * factor kinds' rows, csrc/terms.h: one factor module, M2's table, and the vector tables),
 * for one dtype: per row tile the factors are rebuilt (a kind's rows read where they lie
 * where it has rows_at, else formed by its rows into a tile of their own) and multiplied
 * into the effective gradients that backward_impl.h's GEMMs, the kinds' sums
 * (terms_grad_sums) and the module's grad_rows consume.
 */
#ifndef POSENC_ENGINE_BACKWARD_PRODUCT_IMPL_H
#define POSENC_ENGINE_BACKWARD_PRODUCT_IMPL_H

#include "gemm_impl.h"
#include "backward_rows_impl.h"

/* Whether kind k is a factor of p's product, and whether its effective gradient is wanted
 * (its own gradient by rows, or through its sums: terms_grad_prepare). */
static int product_factor(const posenc_problem *p, int k)
{
    return term_adds(p, k) && term_kinds[k].factor;
}

static int product_factor_wanted(const backward_ctx *c, int k)
{
    return term_kinds[k].grad_sums ? c->grad_data[k] != NULL : c->need_modules;
}

/* The product mode's workspace regions (see backward_ws). */
static void backward_product_ws(const backward_ctx *c, backward_ws *w, REAL *mem, size_t *at)
{
    const posenc_problem *p = c->p;
    const size_t mr = c->kern->mr, nr = c->kern->nr, m = p->m, d = p->d;
    WS_TAKE(w, mem, *at, k_pack, packed_b_size(d, m, nr));
    WS_TAKE(w, mem, *at, content, mr * c->m_pad);
    WS_TAKE(w, mem, *at, content_grad, c->row_block * c->m_pad);
    const size_t units = terms_unit_scratch(p, c->kern, c->terms, POSENC_TERM_COUNT);
    if (units)
        WS_TAKE(w, mem, *at, term_unit, units);
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        if (!product_factor(p, k))
            continue;
        if (!term_kinds[k].rows_at)
            WS_TAKE(w, mem, *at, factor[k], mr * c->m_pad);
        if (product_factor_wanted(c, k))
            WS_TAKE(w, mem, *at, factor_grad[k], mr * c->m_pad);
    }
}

/*
 * Rebuild the factors of tile [i0, i0 + rows) and form the effective gradients: Gc = G
 * prod(F) (rows of content_grad from blk0), and per wanted factor x, G (s C) prod(F
 * without x), handed to its kind tile by tile (its sums, or the module's grad_rows); keys
 * [0, width) (G is 0 past them, and Gc is read no further: a causal attention's
 * block_width).
 */
static void backward_product_tile(const backward_ctx *c, backward_ws *w, size_t u, size_t b,
                                  size_t h, const packed_b *k_packed, size_t blk0, size_t i0,
                                  size_t rows, const REAL *G_blk, size_t width)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t m = p->m, d = p->d, ld = c->m_pad;
    const REAL *q_u = w->inputs.q;
    packed_b keys = *k_packed;
    keys.N = width;

    gemm_packed(kern, &w->scratch, rows, q_u + i0 * d, (ptrdiff_t)d, 1, &keys,
                w->content, (ptrdiff_t)ld, 0, NULL, 0, NULL, 0, NULL);
    /* the factors in the list's order: F[f] row r at F[f] + r ldf[f] */
    const REAL *F[POSENC_TERM_COUNT];
    ptrdiff_t ldf[POSENC_TERM_COUNT];
    int kind[POSENC_TERM_COUNT], nf = 0;
    for (int k = 0; k < POSENC_TERM_COUNT; ++k) {
        if (!product_factor(p, k))
            continue;
        if (term_kinds[k].rows_at) {
            F[nf] = term_rows_at(p, kern, &w->env, k, b, h, i0, w->term_unit, &ldf[nf]);
        } else {
            term_rows(p, kern, &w->env, k, POSENC_SET, w->factor[k], ld, b, h, i0, rows, 0,
                      width, w->term_unit);
            /* a masked key's Inf or NaN k: a factor that reads k 0 where a row does not
             * see the key */
            for (size_t r = 0; w->k_unread && term_kinds[k].vector == 2 && r < rows; ++r)
                c->masked_keys->unseen_zero(c->masked_keys->attention, w->factor[k] + r * ld, b,
                                            i0 + r, width);
            F[nf] = w->factor[k];
            ldf[nf] = (ptrdiff_t)ld;
        }
        kind[nf++] = k;
    }
    /* ... and q.k 0 at the keys a row does not see */
    for (size_t r = 0; w->k_unread && r < rows; ++r)
        c->masked_keys->unseen_zero(c->masked_keys->attention, w->content + r * ld, b, i0 + r,
                                    width);

    for (size_t r = 0; r < rows; ++r) {
        const size_t i = i0 + r;
        const REAL *g_row = G_blk + (i - blk0) * m;
        if (c->need_content) {
            REAL *gc = w->content_grad + (i - blk0) * ld;
            kern->row_mul(gc, g_row, F[0] + (ptrdiff_t)r * ldf[0], width);
            for (int f = 1; f < nf; ++f)
                kern->row_gather(POSENC_MUL, gc, F[f] + (ptrdiff_t)r * ldf[f], 1, width);
        }
        /* one effective gradient per wanted factor: G (s C) times the other factors */
        for (int x = 0; x < nf; ++x) {
            if (!w->factor_grad[kind[x]])
                continue;
            REAL *eff = w->factor_grad[kind[x]] + r * ld;
            kern->row_mul(eff, g_row, w->content + r * ld, width);
            for (int f = 0; f < nf; ++f)
                if (f != x)
                    kern->row_gather(POSENC_MUL, eff, F[f] + (ptrdiff_t)r * ldf[f], 1, width);
        }
    }
    for (int x = 0; x < nf; ++x) {
        const int k = kind[x];
        if (!w->factor_grad[k])
            continue;
        if (term_kinds[k].grad_sums)
            terms_grad_sums(p, kern, &w->env, k, b, h, w->factor_grad[k], ld, i0, rows, width);
        else   /* its rows are linear in its arrays */
            terms_grad_rows(p, kern, &w->env, c->g, TERMS_ADDING, u, w->factor_grad[k], NULL,
                            ld, i0, rows, 0, width, (double *)(void *)w->term_scratch);
    }
}

#endif /* POSENC_ENGINE_BACKWARD_PRODUCT_IMPL_H */
