/*
 * test_terms.c -- the term modules of csrc/terms.h without Python: FoX's decay
 * (csrc/engine/term_fox_impl.h) on the logits and their gradients, float32 and
 * float64, against naive double loops written from docs/spec.md §3.17; every
 * ISA against scalar, one and two threads bitwise; a gate of -inf (the rows
 * summed as written); the fused attention's decoding rows equal to the full
 * call's; posenc_validate's refusal of a query past the keys.  The 2-D
 * relative bias (csrc/engine/term_relative_bias_2d_impl.h) the same way from
 * docs/spec.md §3.19: rasters whose rows clip, a global token, keys out of
 * order, a table shared by the heads and coordinates by the batch; the
 * validation of coordinates and table lengths.  The rotation's per-token tables
 * (csrc/engine/term_rope_token_impl.h, read by rope_impl.h) from docs/spec.md
 * §3.16: logits, dq, dk (grouped-query heads) and the four tables' gradients
 * against naive loops, every ISA, threads, and their validation.  CoPE
 * (csrc/engine/term_cope_impl.h) from docs/spec.md §3.18: logits, dq, dk and the
 * table's gradient against its forward and backward written out as loops, with and
 * without the logits' causal gates, tables longer and shorter than the positions;
 * the kernels its rows run on (suffix_interp and its gradient) against their
 * formulas, and the gates' row_sigmoid.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "engine/engine.h"   /* posenc_engine_f32, _f64: term_kinds_check */

/* A FoX problem's inputs, in double, and its problem (pointers set per dtype). */
typedef struct {
    size_t B, H, n, m, d, offset;
    double *q, *k, *gates, *back, *cum, *cum_back, *G;
    float *q32, *k32, *G32;
    posenc_problem p;
} fox_data;

static double *doubles(size_t len)
{
    double *x = malloc(sizeof(double) * (len ? len : 1));
    for (size_t t = 0; t < len; ++t)
        x[t] = urand();
    return x;
}

static float *floats(const double *x, size_t len)
{
    float *y = malloc(sizeof(float) * (len ? len : 1));
    for (size_t t = 0; t < len; ++t)
        y[t] = (float)x[t];
    return y;
}

/* Inclusive prefix sums along the keys of (B, H, m) gates; NULL where one is not finite. */
static double *prefix(const double *gates, size_t units, size_t m)
{
    const size_t len = units * m;
    double *c = malloc(sizeof(double) * (len > 0 ? len : 1));
    for (size_t u = 0; u < units; ++u) {
        double sum = 0;
        for (size_t t = 0; t < m; ++t) {
            if (!isfinite(gates[u * m + t])) {
                free(c);
                return NULL;
            }
            c[u * m + t] = sum += gates[u * m + t];
        }
    }
    return c;
}

static void fox_build(fox_data *f, size_t B, size_t H, size_t n, size_t m, size_t d, size_t offset,
                      int reverse, int bad_gate)
{
    memset(f, 0, sizeof *f);
    f->B = B, f->H = H, f->n = n, f->m = m, f->d = d, f->offset = offset;
    f->q = doubles(B * H * n * d);
    f->k = doubles(B * H * m * d);
    f->G = doubles(B * H * n * m);
    f->gates = doubles(B * H * m);
    for (size_t t = 0; t < B * H * m; ++t)
        f->gates[t] = -0.5 * (f->gates[t] + 1.0);   /* log gates in (-1, 0] */
    if (bad_gate && m > 2)
        f->gates[m / 2] = -INFINITY;                 /* unit 0: a forget gate of exactly 0 */
    f->back = reverse ? doubles(B * H * m) : NULL;
    f->cum = prefix(f->gates, B * H, m);
    f->cum_back = f->back ? prefix(f->back, B * H, m) : NULL;
    f->q32 = floats(f->q, B * H * n * d);
    f->k32 = floats(f->k, B * H * m * d);
    f->G32 = floats(f->G, B * H * n * m);
}

static void fox_point(fox_data *f, posenc_dtype dtype)
{
    posenc_problem *p = &f->p;
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    p->B = f->B, p->H = f->H, p->n = f->n, p->m = f->m, p->d = f->d;
    p->scale = 0.5;
    p->query_offset = f->offset;
    p->q = dtype == POSENC_F64 ? (const void *)f->q : f->q32;
    p->k = dtype == POSENC_F64 ? (const void *)f->k : f->k32;
    posenc_term *t = &p->terms[POSENC_TERM_fox];
    const double *arrays[4] = {f->gates, f->back, f->cum, f->cum_back};
    for (int a = 0; a < 4; ++a)
        if (arrays[a])
            t->array[a] = (posenc_term_array){arrays[a], f->H * f->m, f->m, f->m};
}

static void fox_release(fox_data *f)
{
    double *d[] = {f->q, f->k, f->gates, f->back, f->cum, f->cum_back, f->G};
    float *s[] = {f->q32, f->k32, f->G32};
    for (size_t t = 0; t < sizeof d / sizeof d[0]; ++t)
        free(d[t]);
    for (size_t t = 0; t < sizeof s / sizeof s[0]; ++t)
        free(s[t]);
}

/* The naive logit (b, h, i, j) and the naive gradients of the gates, docs/spec.md §3.17. */
static double fox_naive_logit(const fox_data *f, size_t b, size_t h, size_t i, size_t j)
{
    const size_t u = b * f->H + h, t = f->offset + i;
    double dot = 0, decay = 0;
    for (size_t e = 0; e < f->d; ++e)
        dot += f->q[(u * f->n + i) * f->d + e] * f->k[(u * f->m + j) * f->d + e];
    if (j <= t)
        for (size_t l = j + 1; l <= t; ++l)
            decay += f->gates[u * f->m + l];
    else if (f->back)
        for (size_t l = t + 1; l <= j; ++l)
            decay += f->back[u * f->m + l];
    return 0.5 * dot + decay;
}

static void fox_naive_grads(const fox_data *f, double *dgates, double *dback)
{
    const size_t units = f->B * f->H, n = f->n, m = f->m;
    memset(dgates, 0, sizeof(double) * units * m);
    memset(dback, 0, sizeof(double) * units * m);
    for (size_t u = 0; u < units; ++u)
        for (size_t i = 0; i < n; ++i)
            for (size_t j = 0; j < m; ++j) {
                const size_t t = f->offset + i;
                const double g = f->G[(u * n + i) * m + j];
                if (j <= t)
                    for (size_t l = j + 1; l <= t; ++l)
                        dgates[u * m + l] += g;
                else if (f->back)
                    for (size_t l = t + 1; l <= j; ++l)
                        dback[u * m + l] += g;
            }
}

/* Forward and backward of f in dtype, on the active ISA: logits and the gates' gradients
 * in double. */
static int fox_run(fox_data *f, posenc_dtype dtype, int threads, double *out, double *dgates,
                   double *dback)
{
    fox_point(f, dtype);
    const size_t logits = f->B * f->H * f->n * f->m, grads = f->B * f->H * f->m;
    const size_t size = dtype == POSENC_F64 ? sizeof(double) : sizeof(float);
    void *raw = malloc(size * (logits ? logits : 1));
    posenc_grads g;
    memset(&g, 0, sizeof g);
    g.terms[POSENC_TERM_fox][0] = dgates;
    g.terms[POSENC_TERM_fox][1] = f->back ? dback : NULL;
    const char *why = NULL;
    int status = posenc_validate(&f->p, &why);
    if (status == POSENC_OK)
        status = posenc_forward(&f->p, raw, threads);
    if (status == POSENC_OK)
        status = posenc_backward(&f->p, dtype == POSENC_F64 ? (const void *)f->G : f->G32, &g,
                                 threads);
    for (size_t t = 0; t < logits; ++t)
        out[t] = dtype == POSENC_F64 ? ((double *)raw)[t] : ((float *)raw)[t];
    if (!f->back)
        memset(dback, 0, sizeof(double) * grads);
    free(raw);
    return status;
}

/* Equal where both are finite (within rtol of the scale), the same non-finite elsewhere. */
static void compare_ieee(const char *what, const double *got, const double *want, size_t len,
                         double rtol)
{
    double scale = 0;
    for (size_t t = 0; t < len; ++t)
        if (isfinite(want[t]))
            scale = fmax(scale, fabs(want[t]));
    size_t bad = 0;
    for (size_t t = 0; t < len; ++t) {
        const int ok = isfinite(want[t]) ? isfinite(got[t]) && fabs(got[t] - want[t]) <= rtol * (scale + 1)
                       : isnan(want[t]) ? isnan(got[t]) : got[t] == want[t];
        bad += !ok;
    }
    EXPECT(bad == 0, "%s: %zu of %zu elements differ", what, bad, len);
}

/* A naive per-unit gradient (B, H, per_unit) of kind k's array a as the engine gives it
 * (posenc_grads): an array without a batch axis summed over the batch rows, in order, into
 * batch row 0's units; the other rows' (the engine's own parts, or untouched) cleared. */
static void naive_batch_fold(const posenc_problem *p, int k, int a, double *grad)
{
    const posenc_term_array *x = &p->terms[k].array[a];
    const size_t row = p->H * x->per_unit;
    for (size_t b = 1; !x->batch_stride && b < p->B; ++b)
        for (size_t e = 0; e < row; ++e) {
            grad[e] += grad[b * row + e];
            grad[b * row + e] = 0;
        }
}

/* The engine's gradient of kind k's array a with the batch rows past 0 of an array without
 * a batch axis cleared: what posenc_grads specifies is batch row 0's sum. */
static void batch_rows_cleared(const posenc_problem *p, int k, int a, double *grad)
{
    const posenc_term_array *x = &p->terms[k].array[a];
    const size_t row = p->H * x->per_unit;
    if (!x->batch_stride && p->B > 1)
        memset(grad + row, 0, sizeof(double) * (p->B - 1) * row);
}

static void fox_case(size_t B, size_t H, size_t n, size_t m, size_t d, size_t offset, int reverse,
                     int bad_gate)
{
    fox_data f;
    fox_build(&f, B, H, n, m, d, offset, reverse, bad_gate);
    const size_t logits = B * H * n * m, grads = B * H * m;
    double *naive = malloc(sizeof(double) * (logits ? logits : 1));
    double *dg = malloc(sizeof(double) * (grads ? grads : 1));
    double *db = malloc(sizeof(double) * (grads ? grads : 1));
    for (size_t b = 0, t = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t i = 0; i < n; ++i)
                for (size_t j = 0; j < m; ++j)
                    naive[t++] = fox_naive_logit(&f, b, h, i, j);
    fox_naive_grads(&f, dg, db);
    for (int dt = 0; dt < 2; ++dt) {
        const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
        const double rtol = dt ? 1e-12 : 2e-5;
        double *base[3], *one[3], *two[3];
        for (int x = 0; x < 3; ++x) {
            const size_t len = x ? grads : logits;
            base[x] = malloc(sizeof(double) * (len ? len : 1));
            one[x] = malloc(sizeof(double) * (len ? len : 1));
            two[x] = malloc(sizeof(double) * (len ? len : 1));
        }
        char what[200];
        posenc_set_isa(POSENC_ISA_SCALAR);
        EXPECT(fox_run(&f, dtype, 1, base[0], base[1], base[2]) == POSENC_OK, "fox status");
        snprintf(what, sizeof what, "fox %s %zux%zux%zux%zu offset %zu%s%s scalar vs naive",
                 dt ? "f64" : "f32", B, H, n, m, offset, reverse ? " reverse" : "",
                 bad_gate ? " -inf gate" : "");
        compare_ieee(what, base[0], naive, logits, rtol);
        compare_ieee(what, base[1], dg, grads, rtol);
        compare_ieee(what, base[2], db, grads, rtol);
        for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
            if (!posenc_isa_supported((posenc_isa)isa))
                continue;
            posenc_set_isa((posenc_isa)isa);
            EXPECT(fox_run(&f, dtype, 1, one[0], one[1], one[2]) == POSENC_OK, "fox status");
            EXPECT(fox_run(&f, dtype, 2, two[0], two[1], two[2]) == POSENC_OK, "fox status");
            for (int x = 0; x < 3; ++x) {
                snprintf(what, sizeof what, "fox %s %zux%zux%zux%zu %s %s", dt ? "f64" : "f32", B,
                         H, n, m, posenc_isa_name((posenc_isa)isa), x ? "gradient" : "logits");
                compare_ieee(what, one[x], base[x], x ? grads : logits, rtol);
                EXPECT(memcmp(one[x], two[x], sizeof(double) * (x ? grads : logits)) == 0,
                       "%s: 1 and 2 threads differ", what);
            }
        }
        for (int x = 0; x < 3; ++x) {
            free(base[x]);
            free(one[x]);
            free(two[x]);
        }
    }
    free(naive);
    free(dg);
    free(db);
    fox_release(&f);
}

/* A decoding step (one query row at position t over keys 0..t) of the fused attention
 * equals row t of the full causal call. */
static void fox_decoding_rows(void)
{
    const size_t B = 2, H = 3, n = 12, d = 8, dv = 5;
    fox_data f;
    fox_build(&f, B, H, n, n, d, 0, 0, 0);
    double *v = doubles(B * H * n * dv);
    double *full = malloc(sizeof(double) * B * H * n * dv), *lse = malloc(sizeof(double) * B * H * n);
    posenc_attention a;
    memset(&a, 0, sizeof a);
    a.v = v, a.dv = dv, a.causal = 1;
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (!posenc_isa_supported((posenc_isa)isa))
            continue;
        posenc_set_isa((posenc_isa)isa);
        fox_point(&f, POSENC_F64);
        EXPECT(posenc_attention_forward(&f.p, &a, full, lse, 1) == POSENC_OK, "fox attention");
        double worst = 0;
        for (size_t t = 0; t < n; ++t) {
            /* the step's q row t and keys 0..t: gathered per unit */
            double *q = malloc(sizeof(double) * B * H * d), *k = malloc(sizeof(double) * B * H * (t + 1) * d);
            double *vv = malloc(sizeof(double) * B * H * (t + 1) * dv);
            double *gates = malloc(sizeof(double) * B * H * (t + 1)), *cum = malloc(sizeof(double) * B * H * (t + 1));
            double out[B * H * dv], step_lse[B * H];
            for (size_t u = 0; u < B * H; ++u) {
                memcpy(q + u * d, f.q + (u * n + t) * d, sizeof(double) * d);
                memcpy(k + u * (t + 1) * d, f.k + u * n * d, sizeof(double) * (t + 1) * d);
                memcpy(vv + u * (t + 1) * dv, v + u * n * dv, sizeof(double) * (t + 1) * dv);
                memcpy(gates + u * (t + 1), f.gates + u * n, sizeof(double) * (t + 1));
                memcpy(cum + u * (t + 1), f.cum + u * n, sizeof(double) * (t + 1));
            }
            posenc_problem p = f.p;
            p.n = 1, p.m = t + 1, p.query_offset = t, p.q = q, p.k = k;
            p.terms[POSENC_TERM_fox].array[0] = (posenc_term_array){gates, H * (t + 1), t + 1, t + 1};
            p.terms[POSENC_TERM_fox].array[2] = (posenc_term_array){cum, H * (t + 1), t + 1, t + 1};
            posenc_attention sa = a;
            sa.v = vv;
            EXPECT(posenc_validate(&p, NULL) == POSENC_OK, "fox step valid");
            EXPECT(posenc_attention_forward(&p, &sa, out, step_lse, 1) == POSENC_OK, "fox step");
            for (size_t u = 0; u < B * H; ++u)
                for (size_t e = 0; e < dv; ++e)
                    worst = fmax(worst, fabs(out[u * dv + e] - full[(u * n + t) * dv + e]));
            free(q), free(k), free(vv), free(gates), free(cum);
        }
        EXPECT(worst <= 1e-13, "fox decoding rows (%s): differ from the full call by %g",
               posenc_isa_name((posenc_isa)isa), worst);
    }
    free(v), free(full), free(lse);
    fox_release(&f);
}

/* ------------------------------------------------------------ relative_bias_2d */

/* A 2-D relative bias problem: coordinates (y, x) per batch (B|1 = cb), a table per head
 * (H|1 = hb) of T + 3 entries. */
typedef struct {
    size_t B, H, n, m, d, cb, hb, ty, tx, L;
    double *q, *k, *G, *bias, *cq, *ck, distance[2];
    float *q32, *k32, *G32;
    posenc_problem p;
} rb2d_data;

static void rb2d_build(rb2d_data *r, size_t B, size_t H, size_t n, size_t m, size_t d,
                       size_t width, size_t ty, size_t tx, int shared, int shuffle)
{
    memset(r, 0, sizeof *r);
    r->B = B, r->H = H, r->n = n, r->m = m, r->d = d, r->ty = ty, r->tx = tx;
    r->cb = shared ? 1 : B, r->hb = shared ? 1 : H;
    r->L = (2 * ty + 1) * (2 * tx + 1) + 3;
    r->q = doubles(B * H * n * d), r->k = doubles(B * H * m * d), r->G = doubles(B * H * n * m);
    r->bias = doubles(r->hb * r->L);
    r->cq = malloc(sizeof(double) * (2 * r->cb * n + 1));
    r->ck = malloc(sizeof(double) * (2 * r->cb * m + 1));
    for (size_t b = 0; b < r->cb; ++b) {
        const size_t w = width + b, start = m > n ? m - n : 0;
        for (size_t i = 0; i < n; ++i)
            r->cq[2 * (b * n + i)] = (double)((start + i) / w), r->cq[2 * (b * n + i) + 1] = (double)((start + i) % w);
        for (size_t j = 0; j < m; ++j)
            r->ck[2 * (b * m + j)] = (double)(j / w), r->ck[2 * (b * m + j) + 1] = (double)(j % w);
        if (b == 0 && n > 1 && m > 1)   /* a global token on both sides */
            r->cq[0] = r->cq[1] = r->ck[0] = r->ck[1] = -1;
        if (shuffle && m > 3)           /* keys out of order: runs of one */
            for (size_t j = 1; j + 1 < m; j += 3) {
                double *x = r->ck + 2 * (b * m + j), y0 = x[0], x0 = x[1];
                x[0] = x[2], x[1] = x[3], x[2] = y0, x[3] = x0;
            }
    }
    r->distance[0] = (double)ty, r->distance[1] = (double)tx;
    r->q32 = floats(r->q, B * H * n * d), r->k32 = floats(r->k, B * H * m * d);
    r->G32 = floats(r->G, B * H * n * m);
}

static void rb2d_point(rb2d_data *r, posenc_dtype dtype)
{
    posenc_problem *p = &r->p;
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    p->B = r->B, p->H = r->H, p->n = r->n, p->m = r->m, p->d = r->d;
    p->scale = 0.5;
    p->q = dtype == POSENC_F64 ? (const void *)r->q : r->q32;
    p->k = dtype == POSENC_F64 ? (const void *)r->k : r->k32;
    posenc_term_array *a = p->terms[POSENC_TERM_relative_bias_2d].array;
    a[0] = (posenc_term_array){r->bias, 0, r->hb > 1 ? r->L : 0, r->L};
    a[1] = (posenc_term_array){r->cq, r->cb > 1 ? 2 * r->n : 0, 0, 2 * r->n};
    a[2] = (posenc_term_array){r->ck, r->cb > 1 ? 2 * r->m : 0, 0, 2 * r->m};
    a[3] = (posenc_term_array){r->distance, 0, 0, 2};
}

static void rb2d_release(rb2d_data *r)
{
    double *d[] = {r->q, r->k, r->G, r->bias, r->cq, r->ck};
    float *s[] = {r->q32, r->k32, r->G32};
    for (size_t t = 0; t < sizeof d / sizeof d[0]; ++t)
        free(d[t]);
    for (size_t t = 0; t < sizeof s / sizeof s[0]; ++t)
        free(s[t]);
}

/* The table entry of pair (b, i, j), docs/spec.md §3.19, written out. */
static size_t rb2d_naive_at(const rb2d_data *r, size_t b, size_t i, size_t j)
{
    const size_t c = r->cb > 1 ? b : 0, T = r->L - 3;
    const double *cq = r->cq + 2 * (c * r->n + i), *ck = r->ck + 2 * (c * r->m + j);
    if (cq[0] < 0)
        return ck[0] < 0 ? T + 2 : T;
    if (ck[0] < 0)
        return T + 1;
    const double ty = (double)r->ty, tx = (double)r->tx;
    const double dy = fmin(fmax(ck[0] - cq[0], -ty), ty), dx = fmin(fmax(ck[1] - cq[1], -tx), tx);
    return (size_t)((dy + ty) * (2 * tx + 1) + dx + tx);
}

/* Logits (B, H, n, m) and the per-unit table gradient (B, H, L) of r in dtype. */
static int rb2d_run(rb2d_data *r, posenc_dtype dtype, int threads, double *out, double *dbias)
{
    rb2d_point(r, dtype);
    const size_t logits = r->B * r->H * r->n * r->m;
    void *raw = malloc((dtype == POSENC_F64 ? sizeof(double) : sizeof(float)) * (logits ? logits : 1));
    posenc_grads g;
    memset(&g, 0, sizeof g);
    g.terms[POSENC_TERM_relative_bias_2d][0] = dbias;
    int status = posenc_validate(&r->p, NULL);
    if (status == POSENC_OK)
        status = posenc_forward(&r->p, raw, threads);
    if (status == POSENC_OK)
        status = posenc_backward(&r->p, dtype == POSENC_F64 ? (const void *)r->G : r->G32, &g,
                                 threads);
    batch_rows_cleared(&r->p, POSENC_TERM_relative_bias_2d, 0, dbias);
    for (size_t t = 0; t < logits; ++t)
        out[t] = dtype == POSENC_F64 ? ((double *)raw)[t] : ((float *)raw)[t];
    free(raw);
    return status;
}

static void rb2d_case(size_t B, size_t H, size_t n, size_t m, size_t d, size_t width, size_t ty,
                      size_t tx, int shared, int shuffle)
{
    rb2d_data r;
    rb2d_build(&r, B, H, n, m, d, width, ty, tx, shared, shuffle);
    const size_t logits = B * H * n * m, grads = B * H * r.L;
    double *naive = calloc(logits + 1, sizeof(double)), *dnaive = calloc(grads + 1, sizeof(double));
    for (size_t b = 0, t = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t i = 0; i < n; ++i)
                for (size_t j = 0; j < m; ++j, ++t) {
                    const size_t u = b * H + h, at = rb2d_naive_at(&r, b, i, j);
                    double dot = 0;
                    for (size_t e = 0; e < d; ++e)
                        dot += r.q[(u * n + i) * d + e] * r.k[(u * m + j) * d + e];
                    naive[t] = 0.5 * dot + r.bias[(r.hb > 1 ? h : 0) * r.L + at];
                    dnaive[u * r.L + at] += r.G[t];
                }
    rb2d_point(&r, POSENC_F64);   /* the problem whose arrays say which fold */
    naive_batch_fold(&r.p, POSENC_TERM_relative_bias_2d, 0, dnaive);
    for (int dt = 0; dt < 2; ++dt) {
        const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
        const double rtol = dt ? 1e-12 : 2e-5;
        double *base[2], *one[2], *two[2];
        for (int x = 0; x < 2; ++x) {
            const size_t len = (x ? grads : logits) + 1;
            base[x] = malloc(sizeof(double) * len), one[x] = malloc(sizeof(double) * len);
            two[x] = malloc(sizeof(double) * len);
        }
        char what[200];
        posenc_set_isa(POSENC_ISA_SCALAR);
        EXPECT(rb2d_run(&r, dtype, 1, base[0], base[1]) == POSENC_OK, "relative_bias_2d status");
        snprintf(what, sizeof what, "relative_bias_2d %s %zux%zux%zux%zu (%zu, %zu)%s%s scalar vs naive",
                 dt ? "f64" : "f32", B, H, n, m, ty, tx, shared ? " shared" : "",
                 shuffle ? " shuffled" : "");
        compare_ieee(what, base[0], naive, logits, rtol);
        compare_ieee(what, base[1], dnaive, grads, rtol * (double)(n + m));
        for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
            if (!posenc_isa_supported((posenc_isa)isa))
                continue;
            posenc_set_isa((posenc_isa)isa);
            EXPECT(rb2d_run(&r, dtype, 1, one[0], one[1]) == POSENC_OK, "relative_bias_2d status");
            EXPECT(rb2d_run(&r, dtype, 2, two[0], two[1]) == POSENC_OK, "relative_bias_2d status");
            for (int x = 0; x < 2; ++x) {
                snprintf(what, sizeof what, "relative_bias_2d %s %zux%zux%zux%zu %s %s",
                         dt ? "f64" : "f32", B, H, n, m, posenc_isa_name((posenc_isa)isa),
                         x ? "gradient" : "logits");
                compare_ieee(what, one[x], base[x], x ? grads : logits, rtol * (x ? (double)(n + m) : 1));
                EXPECT(memcmp(one[x], two[x], sizeof(double) * (x ? grads : logits)) == 0,
                       "%s: 1 and 2 threads differ", what);
            }
        }
        for (int x = 0; x < 2; ++x)
            free(base[x]), free(one[x]), free(two[x]);
    }
    free(naive), free(dnaive);
    rb2d_release(&r);
}

/* posenc_validate: coordinates, distances and the table's length. */
static void rb2d_validation(void)
{
    rb2d_data r;
    rb2d_build(&r, 2, 2, 4, 5, 3, 3, 1, 2, 0, 0);
    const char *why = NULL;
    rb2d_point(&r, POSENC_F64);
    EXPECT(posenc_validate(&r.p, &why) == POSENC_OK, "relative_bias_2d: refused (%s)", why ? why : "");
    const double saved = r.ck[5];
    r.ck[5] = -1;                                           /* (y, -1): not a global token */
    EXPECT(posenc_validate(&r.p, &why) == POSENC_EINVAL && why && strstr(why, "relative_bias_2d"),
           "relative_bias_2d: a coordinate (y, -1) accepted");
    r.ck[5] = 2.5;
    EXPECT(posenc_validate(&r.p, &why) == POSENC_EINVAL, "relative_bias_2d: a coordinate 2.5 accepted");
    r.ck[5] = saved;
    r.p.terms[POSENC_TERM_relative_bias_2d].array[0].per_unit = r.L - 3;   /* T with a global token */
    EXPECT(posenc_validate(&r.p, &why) == POSENC_EINVAL, "relative_bias_2d: T entries with a global token accepted");
    rb2d_point(&r, POSENC_F64);
    r.distance[1] = -1;
    EXPECT(posenc_validate(&r.p, &why) == POSENC_EINVAL, "relative_bias_2d: distance -1 accepted");
    r.distance[1] = 2;
    r.p.terms[POSENC_TERM_relative_bias_2d].array[1].head_stride = 2 * r.n;   /* per-head coordinates */
    EXPECT(posenc_validate(&r.p, &why) == POSENC_EINVAL, "relative_bias_2d: per-head coordinates accepted");
    rb2d_release(&r);
}

/* ------------------------------------------------------------ segments, reset */

/* posenc_validate of the segments module (the harness's diet_abs: 3 segments, float64
 * ids): ids integers within the table, shared by the heads, the table a square; of the
 * toeplitz (the harness's m2): rows integers within its table, shared, one per offset, the
 * one module of a product; and of the reset's theta (2 entries a unit). */
static void segments_validation(void)
{
    const config diet = {"diet_abs", 1, 0, 0, 0, 1, 0, 0, 0};
    const config tupe = {"tupe-no-table", 1, 0, 0, 0, 0, 1, 0, 0};
    problem_data pd;
    const char *why = NULL;
    build(&pd, &diet, 2, 3, 5, 7, 4, 0);
    point(&pd, POSENC_F64);
    posenc_term_array *a = pd.p.terms[POSENC_TERM_segments].array;
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_OK, "segments: refused (%s)", why ? why : "");
    const double bad_ids[] = {3, 2.5, -1, NAN};
    for (size_t t = 0; t < sizeof bad_ids / sizeof bad_ids[0]; ++t) {
        const double saved = pd.segment_k[9];   /* batch row 1's */
        pd.segment_k[9] = bad_ids[t];
        why = NULL;
        EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL && why && strstr(why, "segments"),
               "segments: a key id %g accepted", bad_ids[t]);
        pd.segment_k[9] = saved;
    }
    a[0].per_unit = 8;   /* not a square */
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL, "segments: a table of 8 entries accepted");
    a[0].per_unit = 9;
    a[1].head_stride = pd.p.n;   /* per-head query ids */
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL, "segments: per-head ids accepted");
    a[1].head_stride = 0;
    a[2].per_unit = pd.p.m - 1;   /* the keys' ids one short */
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL, "segments: m - 1 key ids accepted");
    a[2].per_unit = pd.p.m;
    pd.p.product = 1;             /* a module in product mode */
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL, "segments: product mode accepted");
    pd.p.product = 0;
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_OK, "segments: restored problem refused");
    release(&pd);
    /* the toeplitz: rows within its table, shared; a factor of a product, alone */
    const config m2 = {"m2", 0, 1, 0, 0, 0, 0, 1, 0};
    build(&pd, &m2, 2, 3, 5, 7, 4, 0);
    point(&pd, POSENC_F64);
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_OK, "toeplitz: refused (%s)", why ? why : "");
    const double bad_rows[] = {7, 1.5, -1, NAN, INFINITY};   /* a table of 7 entries */
    for (size_t t = 0; t < sizeof bad_rows / sizeof bad_rows[0]; ++t) {
        const double saved = pd.toeplitz[4];
        pd.toeplitz[4] = bad_rows[t];
        why = NULL;
        EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL && why && strstr(why, "toeplitz"),
               "toeplitz: a row %g accepted", bad_rows[t]);
        pd.toeplitz[4] = saved;
    }
    posenc_term_array *ta = pd.p.terms[POSENC_TERM_toeplitz].array;
    ta[1].head_stride = ta[1].per_unit;   /* per-head rows */
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL, "toeplitz: per-head rows accepted");
    ta[1].head_stride = 0;
    ta[1].per_unit -= 1;                  /* one offset short */
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL, "toeplitz: n + m - 2 rows accepted");
    ta[1].per_unit += 1;
    const double theta[2] = {0.5, -0.5};   /* a module that is no factor, in the product */
    pd.p.terms[POSENC_TERM_reset].array[0] = (posenc_term_array){theta, 0, 0, 2};
    why = NULL;
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL && why && strstr(why, "factor"),
           "toeplitz: a reset in a product accepted");
    pd.p.terms[POSENC_TERM_reset].array[0] = (posenc_term_array){NULL, 0, 0, 0};
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_OK, "toeplitz: restored problem refused");
    release(&pd);
    build(&pd, &tupe, 2, 3, 5, 7, 4, 1);
    point(&pd, POSENC_F64);
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_OK, "reset: refused (%s)", why ? why : "");
    pd.p.terms[POSENC_TERM_reset].array[0].per_unit = 3;
    EXPECT(posenc_validate(&pd.p, &why) == POSENC_EINVAL && why && strstr(why, "reset"),
           "reset: a theta of 3 entries accepted");
    release(&pd);
}

/* ------------------------------------------------------------ rope_token */

/* Per-token tables: the queries' (B, H, n, pairs) and the keys' per query head (B, H, m,
 * pairs, a key head's repeated for its group), cos then sin, as the binding passes them;
 * `shared`: the queries' without a batch axis (batch 0's rows for every batch row: the
 * engine sums their gradients over the batch). */
typedef struct {
    size_t B, H, H_kv, n, m, d, pairs;
    int shared;
    double *q, *k, *G, *table[4];
    float *q32, *k32, *G32;
    posenc_problem p;
} token_data;

static void token_build(token_data *t, size_t B, size_t H, size_t H_kv, size_t n, size_t m,
                        size_t d, size_t pairs, int shared)
{
    memset(t, 0, sizeof *t);
    t->B = B, t->H = H, t->H_kv = H_kv, t->n = n, t->m = m, t->d = d, t->pairs = pairs;
    t->shared = shared;
    t->q = doubles(B * H * n * d), t->k = doubles(B * H_kv * m * d), t->G = doubles(B * H * n * m);
    for (int a = 0; a < 4; ++a) {
        const size_t rows = a < 2 ? n : m;
        t->table[a] = doubles(B * H * rows * pairs);
        if (a >= 2)   /* a key head's rows, the same for the query heads of its group */
            for (size_t b = 0; b < B; ++b)
                for (size_t h = 0; h < H; ++h)
                    memcpy(t->table[a] + (b * H + h) * rows * pairs,
                           t->table[a] + (b * H + h - h % (H / H_kv)) * rows * pairs,
                           sizeof(double) * rows * pairs);
        for (size_t b = 1; shared && a < 2 && b < B; ++b)
            memcpy(t->table[a] + b * H * rows * pairs, t->table[a], sizeof(double) * H * rows * pairs);
    }
    t->q32 = floats(t->q, B * H * n * d), t->k32 = floats(t->k, B * H_kv * m * d);
    t->G32 = floats(t->G, B * H * n * m);
}

static void token_point(token_data *t, posenc_dtype dtype)
{
    posenc_problem *p = &t->p;
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    p->B = t->B, p->H = t->H, p->H_kv = t->H_kv, p->n = t->n, p->m = t->m, p->d = t->d;
    p->scale = 0.5;
    p->rope_pairs = t->pairs;
    p->q = dtype == POSENC_F64 ? (const void *)t->q : t->q32;
    p->k = dtype == POSENC_F64 ? (const void *)t->k : t->k32;
    for (int a = 0; a < 4; ++a) {
        const size_t len = (a < 2 ? t->n : t->m) * t->pairs;
        p->terms[POSENC_TERM_rope_token].array[a] =
            (posenc_term_array){t->table[a], t->shared && a < 2 ? 0 : t->H * len, len, len};
    }
}

static void token_release(token_data *t)
{
    double *d[] = {t->q, t->k, t->G, t->table[0], t->table[1], t->table[2], t->table[3]};
    float *s[] = {t->q32, t->k32, t->G32};
    for (size_t x = 0; x < sizeof d / sizeof d[0]; ++x)
        free(d[x]);
    for (size_t x = 0; x < sizeof s / sizeof s[0]; ++x)
        free(s[x]);
}

/* Row r of unit (b, h)'s side (0: q, 1: k) rotated by its own table row (half split). */
static void token_rotate(const token_data *t, int side, size_t b, size_t h, size_t r, double *y)
{
    const size_t d = t->d, pairs = t->pairs, rows = side ? t->m : t->n;
    const double *x = side ? t->k + ((b * t->H_kv + h / (t->H / t->H_kv)) * t->m + r) * d
                           : t->q + ((b * t->H + h) * t->n + r) * d;
    const double *c = t->table[2 * side] + ((b * t->H + h) * rows + r) * pairs;
    const double *s = t->table[2 * side + 1] + ((b * t->H + h) * rows + r) * pairs;
    for (size_t e = 0; e < d; ++e)
        y[e] = x[e];
    for (size_t u = 0; u < pairs; ++u) {
        y[u] = x[u] * c[u] - x[u + pairs] * s[u];
        y[u + pairs] = x[u + pairs] * c[u] + x[u] * s[u];
    }
}

/* The naive logits, dq, dk and the tables' per-unit gradients (docs/spec.md §3.16). */
static void token_naive(const token_data *t, double *A, double *dq, double *dk, double **dt)
{
    const size_t B = t->B, H = t->H, n = t->n, m = t->m, d = t->d, pairs = t->pairs;
    double *qr = malloc(sizeof(double) * n * d), *kr = malloc(sizeof(double) * m * d);
    double *gq = calloc(n * d + 1, sizeof(double)), *gk = calloc(m * d + 1, sizeof(double));
    memset(dk, 0, sizeof(double) * B * t->H_kv * m * d);
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h) {
            const size_t u = b * H + h, kv = b * t->H_kv + h / (H / t->H_kv);
            for (size_t i = 0; i < n; ++i) token_rotate(t, 0, b, h, i, qr + i * d);
            for (size_t j = 0; j < m; ++j) token_rotate(t, 1, b, h, j, kr + j * d);
            memset(gq, 0, sizeof(double) * n * d), memset(gk, 0, sizeof(double) * m * d);
            for (size_t i = 0; i < n; ++i)
                for (size_t j = 0; j < m; ++j) {
                    double dot = 0;
                    for (size_t e = 0; e < d; ++e) dot += qr[i * d + e] * kr[j * d + e];
                    A[(u * n + i) * m + j] = 0.5 * dot;
                    const double g = 0.5 * t->G[(u * n + i) * m + j];
                    for (size_t e = 0; e < d; ++e) {
                        gq[i * d + e] += g * kr[j * d + e];
                        gk[j * d + e] += g * qr[i * d + e];
                    }
                }
            for (int side = 0; side < 2; ++side) {   /* the adjoint, and the tables' */
                const size_t rows = side ? m : n;
                const double *g = side ? gk : gq;
                for (size_t r = 0; r < rows; ++r) {
                    const double *x = side ? t->k + (kv * m + r) * d : t->q + (u * n + r) * d;
                    const double *c = t->table[2 * side] + (u * rows + r) * pairs;
                    const double *s = t->table[2 * side + 1] + (u * rows + r) * pairs;
                    double *out = side ? dk + (kv * m + r) * d : dq + (u * n + r) * d;
                    for (size_t e = 2 * pairs; e < d; ++e)
                        out[e] = (side ? out[e] : 0) + g[r * d + e];
                    for (size_t v = 0; v < pairs; ++v) {
                        const double g0 = g[r * d + v], g1 = g[r * d + v + pairs];
                        out[v] = (side ? out[v] : 0) + g0 * c[v] + g1 * s[v];
                        out[v + pairs] = (side ? out[v + pairs] : 0) + g1 * c[v] - g0 * s[v];
                        dt[2 * side][(u * rows + r) * pairs + v] = g0 * x[v] + g1 * x[v + pairs];
                        dt[2 * side + 1][(u * rows + r) * pairs + v] = g1 * x[v] - g0 * x[v + pairs];
                    }
                }
            }
        }
    free(qr), free(kr), free(gq), free(gk);
}

/* The logits, dq and dk of problem p (its dtype's G: G64 or G32; H_kv key heads) widened
 * to double into A, dq, dk, and the gradients of term kind `kind`'s arrays a < arrays
 * into grads[a] (float64 per unit); posenc_validate's status, or the calls'. */
static int run_logits_and_grads(const posenc_problem *p, int kind, double *const *grads,
                                int arrays, const double *G64, const float *G32, int threads,
                                double *A, double *dq, double *dk)
{
    const size_t sizes[3] = {p->B * p->H * p->n * p->m, p->B * p->H * p->n * p->d,
                             p->B * (p->H_kv ? p->H_kv : p->H) * p->m * p->d};
    const size_t item = p->dtype == POSENC_F64 ? sizeof(double) : sizeof(float);
    void *raw[3];
    for (int x = 0; x < 3; ++x)
        raw[x] = malloc(item * (sizes[x] + 1));
    posenc_grads g;
    memset(&g, 0, sizeof g);
    g.q = raw[1], g.k = raw[2];
    for (int a = 0; a < arrays; ++a)
        g.terms[kind][a] = grads[a];
    int status = posenc_validate(p, NULL);
    if (status == POSENC_OK)
        status = posenc_forward(p, raw[0], threads);
    if (status == POSENC_OK)
        status = posenc_backward(p, p->dtype == POSENC_F64 ? (const void *)G64 : G32, &g,
                                 threads);
    double *outs[3] = {A, dq, dk};
    for (int x = 0; x < 3; ++x) {
        for (size_t e = 0; e < sizes[x]; ++e)
            outs[x][e] = p->dtype == POSENC_F64 ? ((double *)raw[x])[e] : ((float *)raw[x])[e];
        free(raw[x]);
    }
    return status;
}

/* Logits, dq, dk and the tables' gradients of t in dtype (all in double). */
static int token_run(token_data *t, posenc_dtype dtype, int threads, double *A, double *dq,
                     double *dk, double **dt)
{
    token_point(t, dtype);
    const int status = run_logits_and_grads(&t->p, POSENC_TERM_rope_token, dt, 4, t->G, t->G32,
                                            threads, A, dq, dk);
    for (int a = 0; a < 4; ++a)
        batch_rows_cleared(&t->p, POSENC_TERM_rope_token, a, dt[a]);
    return status;
}

static void token_case(size_t B, size_t H, size_t H_kv, size_t n, size_t m, size_t d, size_t pairs,
                       int shared)
{
    token_data t;
    token_build(&t, B, H, H_kv, n, m, d, pairs, shared);
    /* outputs: logits, dq, dk, the four tables' gradients */
    const size_t len[7] = {B * H * n * m, B * H * n * d, B * H_kv * m * d, B * H * n * pairs,
                           B * H * n * pairs, B * H * m * pairs, B * H * m * pairs};
    double *naive[7], *base[7], *one[7], *two[7];
    for (int x = 0; x < 7; ++x) {
        naive[x] = calloc(len[x] + 1, sizeof(double)), base[x] = calloc(len[x] + 1, sizeof(double));
        one[x] = calloc(len[x] + 1, sizeof(double)), two[x] = calloc(len[x] + 1, sizeof(double));
    }
    token_naive(&t, naive[0], naive[1], naive[2], naive + 3);
    token_point(&t, POSENC_F64);   /* the problem whose arrays say which fold */
    for (int a = 0; a < 4; ++a)
        naive_batch_fold(&t.p, POSENC_TERM_rope_token, a, naive[3 + a]);
    for (int dt = 0; dt < 2; ++dt) {
        const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
        const double rtol = (dt ? 1e-12 : 2e-5) * (double)(n + m + d);
        char what[200];
        posenc_set_isa(POSENC_ISA_SCALAR);
        EXPECT(token_run(&t, dtype, 1, base[0], base[1], base[2], base + 3) == POSENC_OK,
               "rope_token status");
        for (int x = 0; x < 7; ++x) {
            snprintf(what, sizeof what, "rope_token %s %zux%zux%zux%zu output %d scalar vs naive",
                     dt ? "f64" : "f32", B, H, n, m, x);
            compare_ieee(what, base[x], naive[x], len[x], rtol);
        }
        for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
            if (!posenc_isa_supported((posenc_isa)isa))
                continue;
            posenc_set_isa((posenc_isa)isa);
            EXPECT(token_run(&t, dtype, 1, one[0], one[1], one[2], one + 3) == POSENC_OK, "status");
            EXPECT(token_run(&t, dtype, 2, two[0], two[1], two[2], two + 3) == POSENC_OK, "status");
            for (int x = 0; x < 7; ++x) {
                snprintf(what, sizeof what, "rope_token %s %zux%zux%zux%zu %s output %d",
                         dt ? "f64" : "f32", B, H, n, m, posenc_isa_name((posenc_isa)isa), x);
                compare_ieee(what, one[x], base[x], len[x], rtol);
                EXPECT(memcmp(one[x], two[x], sizeof(double) * len[x]) == 0,
                       "%s: 1 and 2 threads differ", what);
            }
        }
    }
    /* validation: positions beside per-token tables, a table of the wrong length */
    token_point(&t, POSENC_F64);
    const int64_t positions[64] = {0};
    t.p.positions_q = B * n <= 64 ? positions : NULL;
    EXPECT(!t.p.positions_q || posenc_validate(&t.p, NULL) == POSENC_EINVAL,
           "rope_token: positions accepted");
    token_point(&t, POSENC_F64);
    t.p.terms[POSENC_TERM_rope_token].array[2].per_unit += 1;
    EXPECT(posenc_validate(&t.p, NULL) == POSENC_EINVAL, "rope_token: a table's length accepted");
    for (int x = 0; x < 7; ++x)
        free(naive[x]), free(base[x]), free(one[x]), free(two[x]);
    token_release(&t);
}

/* ------------------------------------------------------------ cope */

/* A CoPE problem: q (B, H, n, d), k (B, H, m, d), a table (H, P, d) per head, the logits'
 * causal flag (docs/spec.md §3.18). */
typedef struct {
    size_t B, H, n, m, d, P, offset;
    int causal;
    double *q, *k, *G, *table, shape[2];
    float *q32, *k32, *G32;
    posenc_problem p;
} cope_data;

static void cope_build(cope_data *c, size_t B, size_t H, size_t n, size_t m, size_t d, size_t P,
                       int causal)
{
    memset(c, 0, sizeof *c);
    c->B = B, c->H = H, c->n = n, c->m = m, c->d = d, c->P = P, c->causal = causal;
    c->offset = m > n ? m - n : 0;
    c->q = doubles(B * H * n * d), c->k = doubles(B * H * m * d), c->G = doubles(B * H * n * m);
    c->table = doubles(H * P * d);
    c->q32 = floats(c->q, B * H * n * d), c->k32 = floats(c->k, B * H * m * d);
    c->G32 = floats(c->G, B * H * n * m);
    c->shape[0] = (double)P, c->shape[1] = causal;
}

static void cope_point(cope_data *c, posenc_dtype dtype)
{
    posenc_problem *p = &c->p;
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    p->B = c->B, p->H = c->H, p->H_kv = c->H, p->n = c->n, p->m = c->m, p->d = c->d;
    p->scale = 0.7;
    p->query_offset = c->offset;
    p->q = dtype == POSENC_F64 ? (const void *)c->q : c->q32;
    p->k = dtype == POSENC_F64 ? (const void *)c->k : c->k32;
    p->terms[POSENC_TERM_cope].array[0] =
        (posenc_term_array){c->table, 0, c->P * c->d, c->P * c->d};
    p->terms[POSENC_TERM_cope].array[1] = (posenc_term_array){c->shape, 0, 0, 2};
}

static void cope_release(cope_data *c)
{
    free(c->q), free(c->k), free(c->G), free(c->table);
    free(c->q32), free(c->k32), free(c->G32);
}

/* The naive logits, dq, dk and the table's per-unit gradient (B, H, P d), the forward and
 * its backward written out as loops (docs/spec.md §3.18). */
static void cope_naive(const cope_data *c, double *A, double *dq, double *dk, double *dt)
{
    const size_t B = c->B, H = c->H, n = c->n, m = c->m, d = c->d, P = c->P;
    double *z = malloc(sizeof(double) * (m + 1)), *g = malloc(sizeof(double) * (m + 1));
    double *pos = malloc(sizeof(double) * (m + 1)), *qe = malloc(sizeof(double) * P);
    double *dqe = malloc(sizeof(double) * P);
    memset(dq, 0, sizeof(double) * B * H * n * d);
    memset(dk, 0, sizeof(double) * B * H * m * d);
    memset(dt, 0, sizeof(double) * B * H * P * d);
    for (size_t u = 0; u < B * H; ++u) {
        const double *table = c->table + (u % H) * P * d;
        for (size_t i = 0; i < n; ++i) {
            const double *qi = c->q + (u * n + i) * d;
            for (size_t j = 0; j < m; ++j) {
                double dot = 0;
                for (size_t e = 0; e < d; ++e) dot += qi[e] * c->k[(u * m + j) * d + e];
                z[j] = 0.7 * dot;
                g[j] = c->causal && j > c->offset + i ? 0 : 1 / (1 + exp(-z[j]));
            }
            for (size_t j = m; j-- > 0;) {
                double sum = 0;
                for (size_t t = j; t < m; ++t) sum += g[t];
                pos[j] = sum < (double)(P - 1) ? sum : (double)(P - 1);
            }
            for (size_t t = 0; t < P; ++t) {
                qe[t] = 0, dqe[t] = 0;
                for (size_t e = 0; e < d; ++e) qe[t] += qi[e] * table[t * d + e];
            }
            double acc = 0;   /* dL/dg_j: the dL/dp of the keys up to j */
            for (size_t j = 0; j < m; ++j) {
                const size_t lo = (size_t)floor(pos[j]), hi = (size_t)ceil(pos[j]);
                const double w = pos[j] - floor(pos[j]), G = c->G[(u * n + i) * m + j];
                A[(u * n + i) * m + j] = z[j] + w * qe[hi] + (1 - w) * qe[lo];
                dqe[lo] += (1 - w) * G, dqe[hi] += w * G;
                acc += G * (qe[hi] - qe[lo]);
                const double dz = 0.7 * (G + acc * g[j] * (1 - g[j]));
                for (size_t e = 0; e < d; ++e) {
                    dq[(u * n + i) * d + e] += dz * c->k[(u * m + j) * d + e];
                    dk[(u * m + j) * d + e] += dz * qi[e];
                }
            }
            for (size_t t = 0; t < P; ++t)
                for (size_t e = 0; e < d; ++e) {
                    dq[(u * n + i) * d + e] += dqe[t] * table[t * d + e];
                    dt[(u * P + t) * d + e] += dqe[t] * qi[e];
                }
        }
    }
    free(z), free(g), free(pos), free(qe), free(dqe);
}

/* Logits, dq, dk and the table's per-unit gradient of c in dtype (all in double). */
static int cope_run(cope_data *c, posenc_dtype dtype, int threads, double *A, double *dq,
                    double *dk, double *dt)
{
    cope_point(c, dtype);
    const int status = run_logits_and_grads(&c->p, POSENC_TERM_cope, &dt, 1, c->G, c->G32,
                                            threads, A, dq, dk);
    batch_rows_cleared(&c->p, POSENC_TERM_cope, 0, dt);
    return status;
}

static void cope_case(size_t B, size_t H, size_t n, size_t m, size_t d, size_t P, int causal)
{
    cope_data c;
    cope_build(&c, B, H, n, m, d, P, causal);
    const size_t len[4] = {B * H * n * m, B * H * n * d, B * H * m * d, B * H * P * d};
    double *naive[4], *base[4], *one[4], *two[4];
    for (int x = 0; x < 4; ++x) {
        naive[x] = calloc(len[x] + 1, sizeof(double)), base[x] = calloc(len[x] + 1, sizeof(double));
        one[x] = calloc(len[x] + 1, sizeof(double)), two[x] = calloc(len[x] + 1, sizeof(double));
    }
    cope_naive(&c, naive[0], naive[1], naive[2], naive[3]);
    cope_point(&c, POSENC_F64);   /* the problem whose arrays say which fold */
    naive_batch_fold(&c.p, POSENC_TERM_cope, 0, naive[3]);
    for (int dt = 0; dt < 2; ++dt) {
        const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
        const double rtol = (dt ? 1e-12 : 2e-5) * (double)(n + m + d);
        char what[200];
        posenc_set_isa(POSENC_ISA_SCALAR);
        EXPECT(cope_run(&c, dtype, 1, base[0], base[1], base[2], base[3]) == POSENC_OK,
               "cope status");
        for (int x = 0; x < 4; ++x) {
            snprintf(what, sizeof what, "cope %s %zux%zux%zux%zu P %zu causal %d output %d "
                     "scalar vs naive", dt ? "f64" : "f32", B, H, n, m, P, causal, x);
            compare_ieee(what, base[x], naive[x], len[x], rtol);
        }
        for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
            if (!posenc_isa_supported((posenc_isa)isa))
                continue;
            posenc_set_isa((posenc_isa)isa);
            EXPECT(cope_run(&c, dtype, 1, one[0], one[1], one[2], one[3]) == POSENC_OK, "status");
            EXPECT(cope_run(&c, dtype, 2, two[0], two[1], two[2], two[3]) == POSENC_OK, "status");
            for (int x = 0; x < 4; ++x) {
                snprintf(what, sizeof what, "cope %s %zux%zux%zux%zu %s output %d",
                         dt ? "f64" : "f32", B, H, n, m, posenc_isa_name((posenc_isa)isa), x);
                compare_ieee(what, one[x], base[x], len[x], rtol);
                EXPECT(memcmp(one[x], two[x], sizeof(double) * len[x]) == 0,
                       "%s: 1 and 2 threads differ", what);
            }
        }
    }
    /* validation: P not an integer, a table of the wrong length, another term beside it */
    cope_point(&c, POSENC_F64);
    c.shape[0] = (double)P + 0.5;
    EXPECT(posenc_validate(&c.p, NULL) == POSENC_EINVAL, "cope: P = %g accepted", c.shape[0]);
    c.shape[0] = (double)P;
    c.p.terms[POSENC_TERM_cope].array[0].per_unit += 1;
    EXPECT(posenc_validate(&c.p, NULL) == POSENC_EINVAL, "cope: a table's length accepted");
    cope_point(&c, POSENC_F64);
    const double gates[64] = {0};
    c.p.terms[POSENC_TERM_fox].array[0] = (posenc_term_array){gates, 0, 0, m};
    EXPECT(m > 64 || posenc_validate(&c.p, NULL) == POSENC_EINVAL, "cope: fox beside it accepted");
    for (int x = 0; x < 4; ++x)
        free(naive[x]), free(base[x]), free(one[x]), free(two[x]);
    cope_release(&c);
}

/*
 * The kernels CoPE's rows run on (isa/positions_impl.h), every ISA and dtype:
 * suffix_interp (positions, values, either alone) and suffix_interp_grad against
 * the formulas as loops in double, on tables whose sizes take each of the
 * AVX-512 row's lookups (registers up to 16, 32, 64 entries, gathers past them),
 * rows of odd lengths from k0 > 0, positions clamped and not, a NaN gate; nothing
 * written outside the row's keys.
 */
/* row_sigmoid: 1 / (1 + exp(-z)) within a few ulp (absolutely below the normal numbers), from the tails (|z| up to 120: e^-z
 * underflows or the result is 1) to 0, -0, +-inf (0 and 1) and NaN, lengths around the
 * vectors; nothing written past the row. */
static void sigmoid_kernel(const posenc_kernels *kern, posenc_isa isa, int dt)
{
    enum { LEN = 40 };
    const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 120.0, -120.0, 1e-30, -88.0};
    for (size_t len = 0; len <= LEN; ++len) {
        double z[LEN + 1];
        unsigned char raw_z[(LEN + 1) * sizeof(double)], raw_g[(LEN + 1) * sizeof(double)];
        const size_t size = dt ? sizeof(double) : sizeof(float);
        for (size_t j = 0; j <= len; ++j) {
            z[j] = j < sizeof specials / sizeof specials[0] && len % 2 ? specials[j] : 20 * urand();
            if (dt) {
                memcpy(raw_z + j * size, &z[j], size);
            } else {
                const float f = (float)z[j];
                memcpy(raw_z + j * size, &f, size);
                z[j] = f;
            }
        }
        memset(raw_g, 0x7f, sizeof raw_g);
        kern->row_sigmoid(raw_g, raw_z, len);
        size_t bad = 0;
        for (size_t j = 0; j < len; ++j) {
            const double got = dt ? ((double *)(void *)raw_g)[j] : ((float *)(void *)raw_g)[j];
            const double want = 1 / (1 + exp(-z[j]));
            /* relative, but for results below the dtype's normal range */
            bad += isnan(want) ? !isnan(got)
                               : !(fabs(got - want) <= (dt ? 1e-15 : 1e-6) * want + (dt ? 1e-300 : 1e-37));
        }
        bad += memcmp(raw_g + len * size, "\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", size) != 0;
        EXPECT(bad == 0, "row_sigmoid %s %s len %zu: %zu wrong", posenc_isa_name(isa),
               dt ? "f64" : "f32", len, bad);
    }
}

static void positions_kernels(const posenc_kernels *kern, posenc_isa isa, int dt, void *ctx)
{
    enum { LEN = 160, GUARD = 3 };
    const size_t spans[] = {1, 5, 16, 17, 24, 32, 33, 40, 64, 65, 100};
    const size_t lens[] = {1, 7, 8, 9, 16, 17, 33, 150};
    (void)ctx;
    sigmoid_kernel(kern, isa, dt);
    const size_t size = dt ? sizeof(double) : sizeof(float);
    const double tol = dt ? 1e-12 : 1e-5;
    for (size_t a = 0; a < sizeof spans / sizeof spans[0]; ++a)
        for (size_t b = 0; b < sizeof lens / sizeof lens[0]; ++b)
            for (int nan = 0; nan < 2; ++nan) {
                const size_t P = spans[a], len = lens[b], k0 = 3, cols = k0 + len;
                double g[LEN + 2 * GUARD], t[LEN], G[LEN + 2 * GUARD], x[LEN + 2 * GUARD];
                double want_x[LEN + 2 * GUARD], want_pos[LEN + 2 * GUARD];
                unsigned char raw[7][(LEN + 2 * GUARD) * sizeof(double)];
                for (size_t j = 0; j < LEN + 2 * GUARD; ++j)
                    g[j] = urand() * 0.5 + 0.5, G[j] = urand(), x[j] = urand();
                if (nan && len > 2)
                    g[k0 + len / 2] = NAN;
                for (size_t e = 0; e < P; ++e)
                    t[e] = urand();
                const double last = (double)(P - 1);
                /* the arrays in the dtype: g, t, G, x, pos, gc (and x again) */
                for (size_t j = 0; j < cols + GUARD || j < P; ++j) {
                    const double v[4] = {g[j], j < P ? t[j] : 0, G[j], x[j]};
                    for (int w = 0; w < 4; ++w) {
                        if (dt)
                            memcpy(raw[w] + j * size, &v[w], size);
                        else {
                            const float f = (float)v[w];
                            memcpy(raw[w] + j * size, &f, size);
                        }
                    }
                }
#define AT(w, j) (dt ? ((double *)(void *)raw[w])[j] : (double)((float *)(void *)raw[w])[j])
                for (size_t j = 0; j < cols + GUARD; ++j)
                    g[j] = AT(0, j), G[j] = AT(2, j), x[j] = AT(3, j);
                for (size_t e = 0; e < P; ++e)
                    t[e] = AT(1, e);
                double s = 0;   /* the formula, in double */
                for (size_t j = cols; j-- > k0;) {
                    s += g[j];
                    want_pos[j] = s > last ? last : s;
                    const double at = want_pos[j], f = isnan(at) ? 0 : floor(at);
                    const double w = at - f;
                    want_x[j] = x[j] + w * t[(size_t)f + (w > 0)] + (1 - w) * t[(size_t)f];
                }
                memset(raw[4], 0x7f, sizeof raw[4]);   /* guards */
                memcpy(raw[6], raw[3], sizeof raw[6]);
                kern->suffix_interp(raw[3], 0, raw[4], raw[0], 0, raw[1], 0, 1, k0, cols, last);
                kern->suffix_interp(NULL, 0, raw[5], raw[0], 0, NULL, 0, 1, k0, cols, last);
                kern->suffix_interp(raw[6], 0, NULL, raw[0], 0, raw[1], 0, 1, k0, cols, last);
                size_t bad = 0;
                for (size_t j = 0; j < cols + GUARD; ++j) {
                    const int inside = j >= k0 && j < cols;
                    if (!inside) {
                        bad += AT(3, j) != x[j] || AT(6, j) != x[j] ||
                               memcmp(raw[4] + j * size, "\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", size) != 0;
                        continue;
                    }
                    const double px = AT(4, j), vx = AT(3, j);
                    bad += isnan(want_pos[j]) ? !isnan(px) || !isnan(vx) || !isnan(AT(5, j))
                           : fabs(px - want_pos[j]) > tol * (1 + want_pos[j]) ||
                             AT(5, j) != px || AT(6, j) != vx ||
                             fabs(vx - want_x[j]) > tol * (2 + fabs(want_x[j]));
                }
                EXPECT(bad == 0, "suffix_interp %s %s P %zu len %zu nan %d: %zu keys wrong",
                       posenc_isa_name(isa), dt ? "f64" : "f32", P, len, nan, bad);
                /* the gradient, from the kernel's positions */
                double want_gc[LEN + 2 * GUARD], want_dqe[LEN], dqe[LEN];
                memset(want_dqe, 0, sizeof want_dqe);
                memset(dqe, 0, sizeof dqe);
                double sum = 0;
                for (size_t j = k0; j < cols; ++j) {
                    const double at = AT(4, j);
                    if (isnan(at)) {
                        sum = NAN;
                    } else {
                        const size_t f = (size_t)at, c = f + (at > (double)f);
                        const double w = at - (double)f;
                        want_dqe[f] += (1 - w) * G[j];
                        want_dqe[c] += w * G[j];
                        sum += G[j] * (t[c] - t[f]);
                    }
                    const double slope = g[j] * (1 - g[j]);
                    want_gc[j] = slope != 0 ? G[j] + sum * slope : G[j];
                }
                memset(raw[5], 0x7f, sizeof raw[5]);
                kern->suffix_interp_grad(raw[5], dqe, raw[2], raw[0], raw[4], raw[1], k0, cols, last);
                bad = 0;
                for (size_t j = 0; j < cols + GUARD; ++j) {
                    if (j < k0 || j >= cols) {
                        bad += memcmp(raw[5] + j * size, "\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", size) != 0;
                        continue;
                    }
                    const double v = AT(5, j);
                    bad += isnan(want_gc[j]) ? !isnan(v)
                           : fabs(v - want_gc[j]) > tol * (double)len * (1 + fabs(want_gc[j]));
                }
                for (size_t e = 0; e < P; ++e)
                    bad += fabs(dqe[e] - want_dqe[e]) > tol * (double)len;
                EXPECT(bad == 0, "suffix_interp_grad %s %s P %zu len %zu nan %d: %zu wrong",
                       posenc_isa_name(isa), dt ? "f64" : "f32", P, len, nan, bad);
#undef AT
            }
}

void test_terms(void)
{
    /* a kind's gradient by blocks has two sources (its grad_block, what the engine calls;
     * its term_<name>_by_blocks flag, what the LP chunks and the fold read): they agree */
    EXPECT(posenc_engine_f32.term_kinds_check() == -1, "float32 engine: kind %d's grad_block "
           "and by_blocks disagree", posenc_engine_f32.term_kinds_check());
    EXPECT(posenc_engine_f64.term_kinds_check() == -1, "float64 engine: kind %d's grad_block "
           "and by_blocks disagree", posenc_engine_f64.term_kinds_check());
    const size_t sizes[][6] = {{1, 1, 1, 1, 1, 0}, {2, 3, 7, 9, 3, 2}, {1, 2, 17, 33, 9, 16},
                               {2, 1, 33, 33, 16, 0}, {1, 1, 65, 70, 31, 5}, {2, 3, 70, 80, 16, 10}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        const size_t *z = sizes[s];
        if (skip_size(z[2], z[3]))
            continue;
        for (int reverse = 0; reverse < 2; ++reverse)
            fox_case(z[0], z[1], z[2], z[3], z[4], z[5], reverse, s == 2);
    }
    fox_decoding_rows();
    fox_data f;   /* a query past the keys */
    fox_build(&f, 1, 1, 4, 4, 2, 1, 0, 0);
    fox_point(&f, POSENC_F64);
    const char *why = NULL;
    EXPECT(posenc_validate(&f.p, &why) == POSENC_EINVAL && why && strstr(why, "fox"),
           "fox: query_offset + n > m accepted");
    f.p.query_offset = 0;   /* prefix sums without the gates they sum: refused */
    f.p.terms[POSENC_TERM_fox].array[0].data = NULL;
    EXPECT(posenc_validate(&f.p, &why) == POSENC_EINVAL && why && strstr(why, "gates"),
           "fox: cum without gates accepted");
    fox_release(&f);
    const size_t grids[][10] = {{1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {2, 3, 7, 17, 3, 4, 1, 2, 0, 1},
                                {1, 2, 33, 33, 9, 6, 2, 1, 1, 0}, {2, 1, 17, 65, 16, 8, 3, 3, 0, 1},
                                {2, 3, 70, 80, 16, 9, 8, 8, 1, 0}, {1, 2, 65, 70, 5, 70, 0, 5, 0, 0}};
    for (size_t s = 0; s < sizeof grids / sizeof grids[0]; ++s) {
        const size_t *z = grids[s];
        if (!skip_size(z[2], z[3]))
            rb2d_case(z[0], z[1], z[2], z[3], z[4], z[5], z[6], z[7], (int)z[8], (int)z[9]);
    }
    rb2d_validation();
    segments_validation();
    /* B, H, H_kv, n, m, d, pairs, shared (the queries' tables without a batch axis: with
     * 3 key heads summed as the units run on one thread, after them on two: the same bits) */
    const size_t tokens[][8] = {{1, 1, 1, 1, 1, 2, 1, 0}, {2, 4, 2, 7, 17, 8, 3, 0},
                                {1, 2, 1, 33, 20, 16, 8, 0}, {2, 2, 2, 65, 70, 32, 16, 0},
                                {3, 3, 3, 7, 17, 8, 3, 1}, {2, 4, 4, 33, 20, 16, 8, 1}};
    for (size_t s = 0; s < sizeof tokens / sizeof tokens[0]; ++s) {
        const size_t *z = tokens[s];
        if (!skip_size(z[3], z[4]))
            token_case(z[0], z[1], z[2], z[3], z[4], z[5], z[6], (int)z[7]);
    }
    const size_t copes[][7] = {{1, 1, 1, 1, 1, 1, 0}, {2, 3, 7, 9, 3, 4, 1}, {1, 2, 17, 33, 8, 40, 0},
                               {2, 1, 33, 33, 16, 5, 1}, {1, 2, 65, 70, 31, 9, 1},
                               /* tables the AVX-512 rows read by permutes of two, and by gathers */
                               {1, 2, 17, 80, 8, 24, 0}, {1, 1, 9, 150, 8, 100, 1}};
    for (size_t s = 0; s < sizeof copes / sizeof copes[0]; ++s) {
        const size_t *z = copes[s];
        if (!skip_size(z[2], z[3]))
            cope_case(z[0], z[1], z[2], z[3], z[4], z[5], (int)z[6]);
    }
    for_each_kernels(positions_kernels, NULL);
    printf("term modules: fox, relative_bias_2d, rope_token, cope\n");
}
