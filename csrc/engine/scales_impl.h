/*
 * scales_impl.h -- a call's scales as the terms' builders read them, for one dtype (REAL,
 * set by engine_<dtype>.c): whether each may ride on an operand (scale_tame), and the unit
 * problem the engine computes with when one may not (call_scales: the forward's exact path,
 * the backward's scaled sums); whether an operand is finite (all_finite, x_all_finite: the
 * backward's IEEE-exact fallbacks, a masked key's Inf or NaN).
 */
#ifndef POSENC_ENGINE_SCALES_IMPL_H
#define POSENC_ENGINE_SCALES_IMPL_H

#include "gemm_impl.h"

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

/* Whether x[0 .. count) are all finite: x - x is 0 for a finite x, NaN for
 * Inf or NaN (16 sums side by side, so that the compiler vectorizes them). */
static int all_finite(const REAL *x, size_t count)
{
    REAL acc[16] = {0};
    size_t t = 0;
    for (; t + 16 <= count; t += 16)
        for (int k = 0; k < 16; ++k)
            acc[k] += x[t + k] - x[t + k];
    for (; t < count; ++t)
        acc[0] += x[t] - x[t];
    REAL sum = 0;
    for (int k = 0; k < 16; ++k)
        sum += acc[k];
    return sum == 0;
}

#ifdef ENGINE_BF16_GEMM
/* Whether a bfloat16 twin's x[0 .. count) are all finite (exponent bits not all ones). */
static int twin_all_finite(const uint16_t *x, size_t count)
{
    unsigned bad = 0;
    for (size_t t = 0; t < count; ++t)
        bad |= (x[t] & 0x7f80u) == 0x7f80u;
    return !bad;
}
#endif

/*
 * x[0 .. count) (q or k of a unit), finite or not; *values: where its
 * values are (x, or where engine_lp.c left x unwritten and one is not
 * finite, x widened from its twin into `spare`, for vector_table_exact).
 */
static int x_all_finite(const gemm_scratch *s, const REAL *x, size_t count, REAL *spare,
                        const REAL **values)
{
    *values = x;
#ifdef ENGINE_BF16_GEMM
    const uint16_t *twin = gemm_unwritten_twin(s, x, count);
    if (twin) {
        if (twin_all_finite(twin, count))
            return 1;
        posenc_active_convert()->bf16_to_f32(spare, twin, count);
        *values = spare;
        return 0;
    }
#else
    (void)s; (void)spare;
#endif
    return all_finite(x, count);
}

#endif /* POSENC_ENGINE_SCALES_IMPL_H */
