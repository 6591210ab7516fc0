/*
 * terms_impl.h -- a call's scales as the terms' builders read them, for one dtype (REAL,
 * set by engine_<dtype>.c): whether each may ride on an operand (scale_tame), and the unit
 * problem the engine computes with when one may not (call_scales: the forward's exact path,
 * the backward's scaled sums).
 */
#ifndef POSENC_ENGINE_TERMS_IMPL_H
#define POSENC_ENGINE_TERMS_IMPL_H

#include "engine.h"

/*
 * Whether a scale may ride on an operand before the sums (s k^T packed, vs
 * on a table, ds on pos_k) and still give the reference's IEEE results,
 * s (q.k): finite, at most 1 in magnitude (s k_j never overflows) and not
 * lost in REAL (a nonzero that rounds to 0 would turn an Inf into NaN).
 * Otherwise the terms are computed unscaled and scaled after their sums
 * (forward_tile_exact, backward_unit_end, backward_reduce).
 */
static inline int scale_tame(double s)
{
    return s >= -1 && s <= 1 && (s == 0 || (REAL)s != 0);
}

/* A call's scales, and the problem the engine computes with. */
typedef struct {
    double scale, vector_scale, dense_scale;   /* the call's */
    int exact;              /* not all tame: computed unscaled (`unit`), scaled after the sums */
    posenc_problem unit;    /* exact: the problem with unit scales */
} call_scales;

/* s from p; returns the problem to compute with: p, or s->unit (unit scales;
 * the product mode's vector_scale, 1 for every method, stays on its factors)
 * when a scale is not tame.  s must outlive the returned problem. */
static inline const posenc_problem *call_scales_init(call_scales *s, const posenc_problem *p)
{
    s->scale = p->scale;
    s->vector_scale = p->vector_scale;
    s->dense_scale = p->dense_scale;
    s->exact = !scale_tame(p->scale) || (!p->product && !scale_tame(p->vector_scale)) ||
               !scale_tame(p->dense_scale);
    if (!s->exact)
        return p;
    s->unit = *p;
    s->unit.scale = s->unit.dense_scale = 1;
    if (!p->product)
        s->unit.vector_scale = 1;
    return &s->unit;
}

#endif /* POSENC_ENGINE_TERMS_IMPL_H */
