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
 * validation of coordinates and table lengths.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

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

void test_terms(void)
{
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
    printf("term modules: fox, relative_bias_2d\n");
}
