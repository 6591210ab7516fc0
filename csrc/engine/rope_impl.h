/*
 * rope_impl.h -- the rotation of q and k (RoPE, Su et al. 2021; xPos; the
 * formulas in docs/methods.md) for one dtype (REAL, set by
 * engine_<dtype>.c), and the unit's inputs as every term reads them.
 *
 * The rotation happens where a unit's q and k are read: its rows rotated
 * once per unit into the thread's workspace (O((n + m) d) against the
 * unit's O(n m d) products), which the GEMMs then read in place of q and
 * k; its adjoint is applied in place to the unit's dq and dk once their
 * sums are complete (backward_unit_end).  Nothing of the size of q or k is
 * kept between the forward and the backward.
 */
#ifndef POSENC_ENGINE_ROPE_IMPL_H
#define POSENC_ENGINE_ROPE_IMPL_H

#include "gemm_impl.h"
#include "term_kinds_impl.h"

/* A unit's q and k as the terms read them: the inputs in place, or their
 * rotated rows (row r at q + r d, k + r d either way). */
typedef struct {
    const REAL *q, *k;
    REAL *q_rot, *k_rot;   /* rotated or strided (unit_inputs_copied): n x d and m x d of
                              the thread's workspace */
    size_t k_held;         /* a strided k without a rotation: 1 + the key unit whose rows
                              k_rot holds (the heads of a group read them in turn), 0: none */
} unit_inputs;

/* Row r's cos and sin of a (P, r) table (REAL) or of a per-token table (float64, the
 * rope_token module: row r of unit (b, h)'s): one of each pair of pointers is set. */
typedef struct {
    const REAL *c, *s;
    const double *cd, *sd;
} rope_row;

static rope_row rope_row_at(const posenc_problem *p, size_t b, size_t h, size_t r, int key_side)
{
    const size_t pairs = p->rope_pairs;
    rope_row row = {NULL, NULL, NULL, NULL};
    if (!p->rope_cos) {   /* per token */
        const posenc_term_array *a = p->terms[POSENC_TERM_rope_token].array + (key_side ? 2 : 0);
        const size_t at = r * pairs;
        row.cd = (const double *)a[0].data + b * a[0].batch_stride + h * a[0].head_stride + at;
        row.sd = (const double *)a[1].data + b * a[1].batch_stride + h * a[1].head_stride + at;
        return row;
    }
    const size_t rows = key_side ? p->m : p->n;
    const int64_t *positions = key_side ? p->positions_k : p->positions_q;
    const size_t pos = positions ? (size_t)positions[b * rows + r]
                                 : key_side ? r : p->query_offset + r;
    row.c = (const REAL *)(key_side ? p->rope_cos_k : p->rope_cos) + pos * pairs;
    row.s = (const REAL *)(key_side ? p->rope_sin_k : p->rope_sin) + pos * pairs;
    return row;
}

/* Pair t's cos and sin of a row, in double (the exact path's). */
#define ROPE_CD(row, t) ((row).c ? (double)(row).c[t] : (row).cd[t])
#define ROPE_SD(row, t) ((row).c ? (double)(row).s[t] : (row).sd[t])

/*
 * Rows [r0, r1) of unit (b, h)'s q (key_side 0) or k (key_side 1), src
 * row r at src + r d, rotated by their positions into dst (the same
 * layout; dst may be src): each pair (x, y) of a row at position pos goes
 * to (x c - y s, y c + x s) with c = cos[pos, t], s = sin[pos, t] (per-token
 * tables: their row r), or with
 * `adjoint` (the transpose: the gradient's way back) to (x c + y s, y c - x s).
 * With `scale` (not NULL) x and y are first multiplied by *scale, in double
 * with one rounding at the end (the exact path of a scale past REAL's
 * range: the reference's order, s x then the rotation).  Dimensions past the
 * 2 rope_pairs rotated ones are copied (scaled likewise).
 */
static void rope_rows(const posenc_problem *p, REAL *dst, const REAL *src, size_t b, size_t h,
                      size_t r0, size_t r1, int key_side, int adjoint, const double *scale)
{
    const size_t d = p->d, pairs = p->rope_pairs;
    const REAL sign = adjoint ? (REAL)-1 : (REAL)1;
    /* pair t is (x[t * step], x[t * step + other]) */
    const size_t step = p->rope_interleaved ? 2 : 1, other = p->rope_interleaved ? 1 : pairs;
    for (size_t r = r0; r < r1; ++r) {
        const rope_row row = rope_row_at(p, b, h, r, key_side);
        const REAL *x = src + r * d;
        REAL *y = dst + r * d;
        if (scale) {
            const double f = *scale;
            for (size_t t = 0; t < pairs; ++t) {
                const double x0 = f * (double)x[t * step], x1 = f * (double)x[t * step + other];
                const double c = ROPE_CD(row, t), sn = (double)sign * ROPE_SD(row, t);
                y[t * step] = (REAL)(x0 * c - x1 * sn);
                y[t * step + other] = (REAL)(x1 * c + x0 * sn);
            }
            for (size_t e = 2 * pairs; e < d; ++e)
                y[e] = (REAL)(f * (double)x[e]);
            continue;
        }
        if (row.c) {
            for (size_t t = 0; t < pairs; ++t) {
                const REAL x0 = x[t * step], x1 = x[t * step + other], sn = sign * row.s[t];
                y[t * step] = x0 * row.c[t] - x1 * sn;
                y[t * step + other] = x1 * row.c[t] + x0 * sn;
            }
        } else {
            for (size_t t = 0; t < pairs; ++t) {
                const REAL x0 = x[t * step], x1 = x[t * step + other];
                const REAL c = (REAL)row.cd[t], sn = sign * (REAL)row.sd[t];
                y[t * step] = x0 * c - x1 * sn;
                y[t * step + other] = x1 * c + x0 * sn;
            }
        }
        if (y != x && d > 2 * pairs)
            memcpy(y + 2 * pairs, x + 2 * pairs, sizeof(REAL) * (d - 2 * pairs));
    }
}

/* Rows [r0, r1) of a unit's x (`rows` rows of d) as REAL values to read: x
 * itself, or where engine_lp.c left it unwritten (bfloat16 inputs the GEMMs
 * read through their twins), its twin widened into the same rows of dst. */
static const REAL *unit_rows(const gemm_scratch *s, REAL *dst, const REAL *x, size_t rows,
                             size_t d, size_t r0, size_t r1)
{
#ifdef ENGINE_BF16_GEMM
    const uint16_t *twin = gemm_unwritten_twin(s, x, rows * d);
    if (twin) {
        posenc_active_convert()->bf16_to_f32(dst + r0 * d, twin + r0 * d, (r1 - r0) * d);
        return dst;
    }
#else
    (void)s; (void)dst; (void)rows; (void)d; (void)r0; (void)r1;
#endif
    return x;
}

/* Unit (b, h)'s q (rows [r0, r1)) and k (all rows) as given, rows d apart: in place, or
 * where strided copied into dst (q: the same rows) and x's k_rot (posenc_unit_rows,
 * posenc_kv_rows). */
static const REAL *unit_q_rows(const posenc_problem *p, REAL *dst, size_t b, size_t h,
                               size_t r0, size_t r1)
{
    return (const REAL *)posenc_unit_rows(dst, p->q, &p->q_strides, p->H, p->n, p->d,
                                          sizeof(REAL), b, h, r0, r1);
}

static const REAL *unit_k_rows(const posenc_problem *p, unit_inputs *x, size_t b, size_t h)
{
    const REAL *k = (const REAL *)posenc_kv_rows(x->k_rot, &x->k_held, p->k, &p->k_strides, p,
                                                 b, h, p->m, p->d, sizeof(REAL));
    if (posenc_rotates(p))
        x->k_held = 0;   /* the rotation turns k_rot in place */
    return k;
}

/* Whether a unit's inputs take room in the workspace (unit_inputs' q_rot, k_rot):
 * rotated, or read strided; `widened`: a content-reading kind on the bfloat16 GEMM
 * (unit_inputs_widen). */
static int unit_inputs_copied(const posenc_problem *p, int widened)
{
    return posenc_rotates(p) || posenc_inputs_strided(p) || widened;
}

/* Unit (b, h)'s inputs: q's rows [r0, r1) (the rows the caller computes)
 * and every row of k, rotated when the problem has a rotation (from their
 * bfloat16 twins where engine_lp.c gave only those: no float32 copy of q
 * and k is made for the whole problem), copied first where strided. */
static void unit_inputs_at(const posenc_problem *p, const gemm_scratch *s, unit_inputs *x,
                           size_t b, size_t h, size_t r0, size_t r1)
{
    const size_t n = p->n, m = p->m, d = p->d;
    const REAL *q = unit_q_rows(p, x->q_rot, b, h, r0, r1);
    const REAL *k = unit_k_rows(p, x, b, h);
    if (!posenc_rotates(p)) {
        x->q = q;
        x->k = k;
        return;
    }
    rope_rows(p, x->q_rot, unit_rows(s, x->q_rot, q, n, d, r0, r1), b, h, r0, r1, 0, 0, NULL);
    rope_rows(p, x->k_rot, unit_rows(s, x->k_rot, k, m, d, 0, m), b, h, 0, m, 1, 0, NULL);
    x->q = x->q_rot;
    x->k = x->k_rot;
}

/* x's q (rows [r0, r1) of n) and k (m rows) as values where engine_lp.c gave only
 * their bfloat16 twins, widened into q_rot and k_rot (a term module that reads them
 * beside the GEMMs: the content-reading kinds), else as they are. */
static void unit_inputs_widen(const gemm_scratch *s, unit_inputs *x, size_t n, size_t m, size_t d,
                              size_t r0, size_t r1)
{
    x->q = unit_rows(s, x->q_rot, x->q, n, d, r0, r1);
    x->k = unit_rows(s, x->k_rot, x->k, m, d, 0, m);
}

/*
 * The per-token tables' gradients of unit u's side (rope_token: grad[0] cos', grad[1]
 * sin', either NULL) from the gradient dx of its rotated rows (before the adjoint: `f`
 * the scale its sums still need, 1 when they have it) and the rows x as given: a pair
 * (x0, x1) went to (x0 c - x1 s, x1 c + x0 s), so c gets g0 x0 + g1 x1 and s gets
 * g1 x0 - g0 x1, in double, written (each row's once).
 */
static void rope_token_grads(const posenc_problem *p, double *const *grad, const REAL *dx,
                             const REAL *x, size_t rows, double f)
{
    const size_t d = p->d, pairs = p->rope_pairs;
    const size_t step = p->rope_interleaved ? 2 : 1, other = p->rope_interleaved ? 1 : pairs;
    /* a loop per table without a branch in it, so that the compiler's vectors take it */
    for (size_t r = 0; r < rows; ++r) {
        const REAL *restrict g = dx + r * d, *restrict xr = x + r * d;
        if (grad[0]) {
            double *restrict out = grad[0] + r * pairs;
            for (size_t t = 0; t < pairs; ++t)
                out[t] = f * (double)g[t * step] * (double)xr[t * step] +
                         f * (double)g[t * step + other] * (double)xr[t * step + other];
        }
        if (grad[1]) {
            double *restrict out = grad[1] + r * pairs;
            for (size_t t = 0; t < pairs; ++t)
                out[t] = f * (double)g[t * step + other] * (double)xr[t * step] -
                         f * (double)g[t * step] * (double)xr[t * step + other];
        }
    }
}

/* The gradients of unit u's rotated q and k (dq, dk: NULL where not
 * wanted) taken back through the rotation, in place: the adjoint; with
 * `scale` (the exact path) the sums scaled by it first, in double.  Per-token
 * tables get their gradients first (g's, from dq and dk and the rows as given:
 * widened into x's rotated rows, which the unit no longer reads). */
static void unit_inputs_grads(const posenc_problem *p, const posenc_grads *g, const gemm_scratch *s,
                              unit_inputs *x, size_t u, REAL *dq, REAL *dk, const double *scale)
{
    if (!posenc_rotates(p))
        return;
    const size_t b = u / p->H, h = u % p->H, n = p->n, m = p->m, d = p->d;
    if (!p->rope_cos) {
        double *grad[POSENC_TERM_ARRAYS_MAX];
        terms_unit_grads(p, g, POSENC_TERM_rope_token, u, grad);
        const double f = scale ? *scale : 1.0;
        if (dq && (grad[ROPE_TOKEN_COS] || grad[ROPE_TOKEN_SIN]))
            rope_token_grads(p, grad + ROPE_TOKEN_COS, dq,
                             unit_rows(s, x->q_rot, unit_q_rows(p, x->q_rot, b, h, 0, n), n, d, 0, n), n,
                             f);
        if (dk && (grad[ROPE_TOKEN_COS_K] || grad[ROPE_TOKEN_SIN_K]))
            rope_token_grads(p, grad + ROPE_TOKEN_COS_K, dk,
                             unit_rows(s, x->k_rot, unit_k_rows(p, x, b, h), m, d, 0, m), m, f);
    }
    if (dq)
        rope_rows(p, dq, dq, b, h, 0, n, 0, 1, scale);
    if (dk)
        rope_rows(p, dk, dk, b, h, 0, m, 1, 1, scale);
}

#endif /* POSENC_ENGINE_ROPE_IMPL_H */
