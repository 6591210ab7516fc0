/*
 * backward_slots_impl.h -- a backward call's per-unit slots, for one dtype:
 * allocated and zeroed (backward_prepare), summed into the outputs in a
 * fixed (h, b) order (backward_reduce: the gradients are bitwise identical
 * for any number of threads), released; and the zero gradients of an empty
 * problem.  Types in backward_rows_impl.h, phases in backward_impl.h.
 */
#ifndef POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H
#define POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H

#include "scales_impl.h"
#include "backward_rows_impl.h"

/* Phase 3: every wanted table gradient from its slots, in a fixed order. */
static void backward_reduce(const backward_ctx *c)
{
    const posenc_problem *p = c->p;
    const posenc_grads *g = c->g;
    /* the kinds' that go through a unit's sums (the vector tables'): their slots over the
     * batch, then the scale the exact path's sums left out */
    terms_grad_reduce(p, g, c->grad_data, c->scales.exact ? &c->scales : NULL);
    /* the modules' that go by blocks: their slots over the batch (one head's sum in the
     * logits' backward), the exact path's dense scale on a `scaled` kind's */
    terms_block_grads_reduce(p, g, c->block_slots, c->G ? 1 : p->B,
                             c->scales.exact ? c->scales.dense_scale : 1);
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
    terms_grad_release(c->grad_data);
    terms_release(&c->own_terms);
    terms_block_slots_free(c->block_slots);
}

/* The call's context; o_max: the largest offset j - i where G may be nonzero (m - 1, or a
 * causal attention's query_offset), past which the spans take the bucket matrices as zero;
 * terms: the call's term data when another context built it (the fused attention's
 * logits'), else NULL: built here. */
static int backward_prepare(backward_ctx *c, const posenc_problem *p, const posenc_kernels *kern,
                            const REAL *G, const posenc_grads *g, ptrdiff_t o_max,
                            const terms_call *terms)
{
    const size_t BH = p->B * p->H;
    memset(c, 0, sizeof *c);
    c->p = call_scales_init(&c->scales, p);
    c->kern = kern;
    c->g = g;
    c->G = G;
    c->m_pad = posenc_round_up(p->m, kern->nr);
    c->row_block = kern->kc;   /* a row block's dk update is one packed depth: see backward_unit */
    c->masked = terms_override_kind(p) >= 0;
    c->cls_row0 = c->masked && p->query_offset == 0;
    c->need_content = g->q || g->k;
    c->need_modules = terms_grads_wanted(p, g, TERMS_EVERY);
    c->need_blocks = terms_block_grads_wanted(p, g);
    c->content = c->need_content || c->need_modules ? terms_content_kind(p) : -1;
    c->own_terms.reach = -1;
    c->terms = terms ? terms : &c->own_terms;
    if (!terms && terms_prepare(p, &c->own_terms))
        return POSENC_ENOMEM;
    const term_grad_plan plan = {g, o_max, c->masked, c->cls_row0, BH};
    if (terms_grad_prepare(p, kern, c->terms, &plan, c->grad_data))
        return POSENC_ENOMEM;
    c->sums = terms_grad_any(c->grad_data);
    c->unit_reads_g = p->product || c->sums || terms_grads_wanted(p, g, TERMS_ADDING) ||
                      c->content >= 0;
    c->reads_g = c->unit_reads_g || c->masked || c->need_blocks;
    c->g16_rows = kern->bf16 && G && !p->product && !c->sums && c->content < 0 && !c->masked &&
                  terms_grad_bf16(p, g);
    if (terms_block_slots_alloc(p, g, G ? p->H : BH, c->block_slots))
        return POSENC_ENOMEM;
    return POSENC_OK;
}

#endif /* POSENC_ENGINE_BACKWARD_SLOTS_IMPL_H */
