/*
 * backward_product_impl.h -- the product mode's backward (M2, M4M: A = s
 * q.k * module * query table * key table, the module a factor kind of
 * csrc/terms.h: M2's table), for one dtype: per row tile the factors are
 * rebuilt (the module's read where they lie, term_kind's rows_at) and
 * multiplied into the effective gradients that backward_impl.h's GEMMs and
 * scatters and the module's grad_rows consume.
 */
#ifndef POSENC_ENGINE_BACKWARD_PRODUCT_IMPL_H
#define POSENC_ENGINE_BACKWARD_PRODUCT_IMPL_H

#include "gemm_impl.h"
#include "term_vectors_impl.h"
#include "backward_rows_impl.h"

/* The product mode's workspace regions (see backward_ws). */
static void backward_product_ws(const backward_ctx *c, backward_ws *w, REAL *mem, size_t *at)
{
    const posenc_problem *p = c->p;
    const size_t mr = c->kern->mr, nr = c->kern->nr, m = p->m, d = p->d;
    const size_t proj_ld = posenc_round_up(posenc_max(c->query->buckets, 1), nr);
    WS_TAKE(w, mem, *at, k_pack, packed_b_size(d, m, nr));
    WS_TAKE(w, mem, *at, content, mr * c->m_pad);
    WS_TAKE(w, mem, *at, row_grad, c->m_pad);
    WS_TAKE(w, mem, *at, content_grad, c->row_block * c->m_pad);
    if (terms_factor_kind(p) >= 0) {
        WS_TAKE(w, mem, *at, term_unit,   /* the factor's alone (terms_unit) */
                terms_unit_scratch(p, c->kern, c->terms, terms_factor_kind(p) + 1));
        WS_TAKE(w, mem, *at, module_grad, mr * c->m_pad);
    }
    if (posenc_term_present(p, POSENC_TERM_query_table)) {
        WS_TAKE(w, mem, *at, query_factor, mr * c->m_pad);
        WS_TAKE(w, mem, *at, query_proj, mr * proj_ld);
        WS_TAKE(w, mem, *at, query_table_pack, packed_b_size(d, c->query->buckets, nr));
    }
    if (posenc_term_present(p, POSENC_TERM_key_table)) {
        WS_TAKE(w, mem, *at, key_factor, mr * c->m_pad);
        WS_TAKE(w, mem, *at, key_proj, m * c->key->buckets + key_edge_size(&c->key->edges, m));
        WS_TAKE(w, mem, *at, key_table_pack, packed_b_size(d, c->key->buckets, nr));
        WS_TAKE(w, mem, *at, key_tile_grad, mr * c->m_pad);
    }
}

/*
 * Rebuild the factors of tile [i0, i0 + rows) and form the effective
 * gradients: Gc = G prod(F) (rows of content_grad from blk0), and per
 * wanted factor x, G (s C) prod(F without x), scattered at once (query
 * side) or tile by tile (key side, the module's grad_rows); keys [0, width)
 * (G is 0 past them, and Gc is read no further: a causal attention's
 * block_width).
 */
static void backward_product_tile(const backward_ctx *c, backward_ws *w, size_t u, size_t b,
                                  size_t h, const packed_b *k_packed, size_t blk0, size_t i0,
                                  size_t rows, const REAL *G_blk, size_t width)
{
    const posenc_problem *p = c->p;
    const posenc_kernels *kern = c->kern;
    const size_t n = p->n, m = p->m, d = p->d, ld = c->m_pad;
    const REAL *q_u = w->inputs.q;
    packed_b keys = *k_packed;
    keys.N = width;

    gemm_packed(kern, &w->scratch, rows, q_u + i0 * d, (ptrdiff_t)d, 1, &keys,
                w->content, (ptrdiff_t)ld, 0, NULL, 0, NULL, 0, NULL);
    if (posenc_term_present(p, POSENC_TERM_query_table))
    {
        const ptrdiff_t head = (ptrdiff_t)head_of(c->query->table.heads, h);
        const packed_b table = query_table_packed(kern, &w->scratch, p, c->query,
                                                  w->query_table_pack, h,
                                                  w->cached_query_table != head);
        w->cached_query_table = head;
        term_query_rows(kern, &w->scratch, p, c->query, &table, w->query_proj, q_u, POSENC_SET,
                        w->query_factor, ld, i0, rows, 0, width, NULL);
    }
    if (posenc_term_present(p, POSENC_TERM_key_table))
        term_key_table(kern, POSENC_SET, w->key_factor, ld, c->key->table.map, c->key->runs.b_min,
                       w->key_proj, c->key->buckets, &c->key->edges, n, m, width, i0, rows);
    /* a masked key's Inf or NaN k: q.k and k's factor 0 at the keys a row does not see */
    for (size_t r = 0; w->k_unread && r < rows; ++r) {
        const masked_keys *hidden = c->masked_keys;
        hidden->unseen_zero(hidden->attention, w->content + r * ld, b, i0 + r, width);
        if (posenc_term_present(p, POSENC_TERM_key_table))
            hidden->unseen_zero(hidden->attention, w->key_factor + r * ld, b, i0 + r, width);
    }

    const int module = terms_factor_kind(p);
    ptrdiff_t module_ld = 0;
    const REAL *module_rows = module >= 0 ? term_rows_at(p, kern, &w->env, module, b, h, i0,
                                                         w->term_unit, &module_ld)
                                          : NULL;
    enum { FACTOR_MODULE, FACTOR_QUERY, FACTOR_KEY };
    for (size_t r = 0; r < rows; ++r) {
        const size_t i = i0 + r;
        const REAL *g_row = G_blk + (i - blk0) * m;
        const REAL *factor[3];
        int kind[3], wanted[3], nf = 0;
        if (module_rows) {
            factor[nf] = module_rows + (ptrdiff_t)r * module_ld;
            kind[nf] = FACTOR_MODULE; wanted[nf++] = c->need_modules;
        }
        if (posenc_term_present(p, POSENC_TERM_query_table)) {
            factor[nf] = w->query_factor + r * ld; kind[nf] = FACTOR_QUERY; wanted[nf++] = c->need_query_side;
        }
        if (posenc_term_present(p, POSENC_TERM_key_table)) {
            factor[nf] = w->key_factor + r * ld; kind[nf] = FACTOR_KEY; wanted[nf++] = c->need_key_side;
        }
        if (c->need_content) {
            REAL *gc = w->content_grad + (i - blk0) * ld;
            kern->row_mul(gc, g_row, factor[0], width);
            for (int f = 1; f < nf; ++f)
                kern->row_gather(POSENC_MUL, gc, factor[f], 1, width);
        }
        /* one effective gradient per factor: G (s C) times the other factors */
        for (int x = 0; x < nf; ++x) {
            if (!wanted[x])
                continue;
            /* the key side and the module go tile by tile: their rows are kept */
            REAL *eff = kind[x] == FACTOR_KEY      ? w->key_tile_grad + r * ld
                        : kind[x] == FACTOR_MODULE ? w->module_grad + r * ld
                                                   : w->row_grad;
            kern->row_mul(eff, g_row, w->content + r * ld, width);
            for (int f = 0; f < nf; ++f)
                if (f != x)
                    kern->row_gather(POSENC_MUL, eff, factor[f], 1, width);
            if (kind[x] == FACTOR_QUERY)
                backward_row_query_side(c, w, i, eff, width);
        }
    }
    if (c->need_key_side)
        scatter_key_side(c, w, w->key_tile_grad, ld, width, i0, rows, 0, 0);
    if (module_rows && c->need_modules)   /* its rows are linear in its arrays */
        terms_grad_rows(p, kern, &w->env, c->g, TERMS_ADDING, u, w->module_grad, ld, i0, rows,
                        0, width, (double *)(void *)w->term_scratch);
}

#endif /* POSENC_ENGINE_BACKWARD_PRODUCT_IMPL_H */
