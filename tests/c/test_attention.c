/*
 * test_attention.c -- Philox-4x32-10 against Random123's known answers, and
 * the fused attention (SPEC §6) against naive loops (see test_engine.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "engine/philox.h"

/* ---------------------------------------------------------------- Philox */

void test_philox(void)
{
    /* Random123 kat_vectors, philox4x32_10 */
    static const uint32_t counter[3][4] = {{0, 0, 0, 0},
                                           {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                           {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int t = 0; t < 3; ++t) {
        uint32_t out[4];
        posenc_philox4x32_10(counter[t], key[t], out);
        EXPECT(memcmp(out, want[t], sizeof out) == 0, "philox known answer %d: %08x %08x %08x %08x",
               t, out[0], out[1], out[2], out[3]);
    }
    /* a row's decisions are words j mod 4 of the blocks at counter (j / 4, i, h, b) */
    uint8_t keep[7];
    uint32_t words[4];
    const uint64_t seed = 0x123456789abcdefull;
    const uint32_t block[4] = {1, 5, 2, 3}, seed_key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    posenc_dropout_row(keep, 7, seed, 0x80000000u, 3, 2, 5);
    posenc_philox4x32_10(block, seed_key, words);
    for (int t = 0; t < 3; ++t)
        EXPECT(keep[4 + t] == (words[t] >= 0x80000000u), "dropout row key %d", 4 + t);
    EXPECT(posenc_dropout_threshold(0.0) == 0 && posenc_dropout_threshold(0.5) == 0x80000000u &&
           posenc_dropout_threshold(0.1) == 429496729u, "dropout threshold");
}

/* Every ISA's dropout rows (posenc_kernels' dropout_row: AVX2 draws 32 keys at a time,
 * AVX-512 64) against the plain C's, over lengths around both steps, thresholds at the ends
 * of the range, and counters that wrap. */
void test_dropout_rows(void)
{
    enum { MAX_LEN = 200 };
    static const uint32_t thresholds[5] = {0, 1, 0x80000000u, 0xFFFFFFFFu, 429496729u};
    static const size_t units[3][3] = {{0, 0, 0}, {7, 11, 1000003}, {SIZE_MAX, 0xFFFFFFFFu, 4096}};
    uint8_t got[MAX_LEN + 1], want[MAX_LEN + 1];
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (!posenc_isa_supported((posenc_isa)isa))
            continue;
        posenc_set_isa((posenc_isa)isa);
        const posenc_kernels *kern = posenc_active_kernels(POSENC_F32);
        for (size_t len = 0; len <= MAX_LEN; len += len < 70 ? 1 : 13)
            for (int t = 0; t < 5; ++t)
                for (int u = 0; u < 3; ++u) {
                    const uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(len + 1 + (size_t)t);
                    const size_t *at = units[u];
                    memset(got, 0xAB, sizeof got);
                    kern->dropout_row(got, len, seed, thresholds[t], at[0], at[1], at[2] + len);
                    posenc_dropout_row(want, len, seed, thresholds[t], at[0], at[1], at[2] + len);
                    EXPECT(memcmp(got, want, len) == 0 && got[len] == 0xAB,
                           "dropout_row %s len %zu threshold %08x unit %d",
                           posenc_isa_name((posenc_isa)isa), len, thresholds[t], u);
                }
    }
}

/* ---------------------------------------------------------------- softmax rows */

/* Row `len` of a test (values in [-8, 8), with NaN, +-inf and +-0 mixed in) between two
 * guard elements, as the dtype. */
static void softmax_row(double *row, size_t len, int specials)
{
    static const double special[6] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, -NAN};
    row[0] = row[len + 1] = 12345.0;   /* the guards */
    for (size_t j = 1; j <= len; ++j) {
        const double u = urand();
        row[j] = specials && u > 0.8 ? special[(size_t)((u - 0.8) * 30.0) % 6] : 8.0 * urand();
    }
}

/* The row kernels of every ISA and dtype against plain loops, over lengths around the
 * vector widths: row_max is the largest element (-inf when none; never NaN);
 * row_exp writes exp(x - shift) to exactly x[0, len), each element the one the same
 * kernel gives it alone, and returns their sum. */
static void softmax_rows(const posenc_kernels *kern, posenc_isa isa, int dt, void *ctx)
{
    enum { MAX_LEN = 41 };
    double row[MAX_LEN + 2], alone_d[1];
    float row_f[MAX_LEN + 2], alone_f[1];
    (void)ctx;
    for (size_t len = 0; len <= MAX_LEN; ++len)
        for (int trial = 0; trial < 6; ++trial) {
            const int specials = trial % 2;
            softmax_row(row, len, specials);
            for (size_t j = 0; j < len + 2; ++j)
                row_f[j] = (float)row[j];
            void *x = dt ? (void *)(row + 1) : (void *)(row_f + 1);
            double want = -INFINITY;
            int nan = 0;
            for (size_t j = 1; j <= len; ++j) {
                const double v = dt ? row[j] : (double)row_f[j];
                nan |= isnan(v);
                want = v > want ? v : want;
            }
            const double got = kern->row_max(x, len);
            /* with a NaN, a vector lane's maximum restarts after it (its result is NaN
             * whatever the shift): at most the maximum, never NaN */
            EXPECT(nan ? !isnan(got) && got <= want : got == want, "row_max %s %s len %zu trial %d: %g, want %g",
                   posenc_isa_name(isa), dt ? "f64" : "f32", len, trial, got, want);
            if (want == -INFINITY || want == INFINITY)
                continue;
            double expected[MAX_LEN], sum = 0;
            for (size_t j = 0; j < len; ++j) {   /* each element alone */
                alone_d[0] = row[j + 1];
                alone_f[0] = row_f[j + 1];
                kern->row_exp(dt ? (void *)alone_d : (void *)alone_f, 1, want);
                expected[j] = dt ? alone_d[0] : (double)alone_f[0];
                sum += expected[j];
            }
            const double total = kern->row_exp(x, len, want);
            int same = 1;
            for (size_t j = 0; j < len; ++j) {
                const double v = dt ? row[j + 1] : (double)row_f[j + 1];
                same &= v == expected[j] || (isnan(v) && isnan(expected[j]));
            }
            const int guards = dt ? row[0] == 12345.0 && row[len + 1] == 12345.0
                                  : row_f[0] == 12345.0f && row_f[len + 1] == 12345.0f;
            EXPECT(same && guards, "row_exp %s %s len %zu trial %d: elements %d, guards %d",
                   posenc_isa_name(isa), dt ? "f64" : "f32", len, trial, same,
                   guards);
            EXPECT(nan ? isnan(total) : fabs(total - sum) <= 1e-5 * sum,
                   "row_exp %s %s len %zu trial %d: sum %g, want %g",
                   posenc_isa_name(isa), dt ? "f64" : "f32", len, trial, total,
                   sum);
        }
}

/* row_exp's exp against exp in double through one-element rows (their sum is the exp):
 * within the polynomial's error and Horner's (2.5e-7 in float, 1e-14 in double) and the
 * reduction's, a logit error of 2^-(p-1) |x - shift| (t's rounding and log2(e)'s in
 * float's AVX-512 exp, isa/vector_exp.h; the subtraction x - shift elsewhere) and
 * 2^-(p-1) |shift| (the row's constant), from 120 below the shift to 5 above it; below
 * the type's normal range within its smallest normal.  -inf and -1e30 give +0, +inf and
 * 1e30 +inf, NaN NaN, with finite shifts. */
static void softmax_exp(const posenc_kernels *kern, posenc_isa isa, int dt, void *ctx)
{
    const double unit = dt ? 0x1p-52 : 0x1p-23, poly = dt ? 1e-14 : 2.5e-7;
    const double tiny = dt ? 0x1p-1022 : 0x1p-126;
    size_t off = 0;
    double worst = 0;
    (void)ctx;
    for (int i = 0; i <= 25000; ++i)
        for (int s = 0; s < 3; ++s) {
            const double shift = s == 0 ? 0.0 : s == 1 ? 4.25 : -37.3;
            double x = shift + 5.0 - 125.0 * i / 25000.0, xd = x;
            float xf = (float)x;
            x = dt ? x : (double)xf;   /* the row's element */
            const double got = dt ? kern->row_exp(&xd, 1, shift) : kern->row_exp(&xf, 1, shift);
            const double want = exp(x - shift);
            const double slack = poly + unit * (fabs(x - shift) + fabs(shift));
            const double err = fabs(got - want);
            const double rel = want >= tiny ? err / want : 0.0;
            worst = rel > worst ? rel : worst;
            off += !(want >= tiny ? rel <= slack : err <= tiny);
        }
    EXPECT(off == 0, "row_exp %s %s: %zu of 3 x 25001 one-element rows off (worst %.3g)",
           posenc_isa_name(isa), dt ? "f64" : "f32", off, worst);
    static const double specials[5][2] = {
        {-INFINITY, 0.0}, {-1e30, 0.0}, {INFINITY, INFINITY}, {1e30, INFINITY}, {NAN, NAN}};
    for (int k = 0; k < 5; ++k)
        for (int s = 0; s < 2; ++s) {
            const double shift = s ? -3.5 : 2.0, want = specials[k][1];
            double xd = specials[k][0];
            float xf = (float)xd;
            const double got = dt ? kern->row_exp(&xd, 1, shift) : kern->row_exp(&xf, 1, shift);
            EXPECT(isnan(want) ? isnan(got) : got == want && !signbit(got),
                   "row_exp %s %s: exp(%g - %g) = %g, want %g", posenc_isa_name(isa),
                   dt ? "f64" : "f32", specials[k][0], shift, got, want);
        }
}

void test_softmax_rows(void)
{
    for_each_kernels(softmax_rows, NULL);
    for_each_kernels(softmax_exp, NULL);
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    const char *name;
    int causal, padding;
    double dropout_p;
    /* SPEC §7 */
    int window;
    size_t left, right;    /* POSENC_UNBOUNDED: no bound */
    int documents;         /* packed documents (doc_id), batch row 1's scattered */
    double softcap;
    int sinks;
} attention_case;

#define UNB POSENC_UNBOUNDED
static const attention_case attention_cases[] = {
    {"plain", 0, 0, 0.0, 0, 0, 0, 0, 0, 0}, {"causal", 1, 0, 0.0, 0, 0, 0, 0, 0, 0},
    {"padded", 0, 1, 0.0, 0, 0, 0, 0, 0, 0}, {"causal+padded+dropout", 1, 1, 0.3, 0, 0, 0, 0, 0, 0},
    {"dropout", 0, 0, 0.5, 0, 0, 0, 0, 0, 0},
    {"window(3,1)", 0, 0, 0.0, 1, 3, 1, 0, 0, 0},
    {"window(4,-)+causal+documents+padded", 1, 1, 0.0, 1, 4, UNB, 1, 0, 0},
    {"documents+dropout", 0, 0, 0.2, 0, 0, 0, 1, 0, 0},
    {"softcap+sinks+padded", 0, 1, 0.0, 0, 0, 0, 0, 1.5, 1},
    {"everything", 1, 1, 0.25, 1, 6, 0, 1, 2.0, 1},
};

/* The document of key (or query position) j of batch row b of m keys: runs of
 * lengths 1, 2, 3, ... in batch row 0 (and others), batch row 1's ids 0, 1 in
 * turns of two (a scattered document: its range holds the other's keys). */
static int64_t doc_id(size_t b, size_t j)
{
    if (b == 1)
        return (int64_t)(j / 2 % 2);
    int64_t id = 0;
    for (size_t start = 0, len = 1; start + len <= j; start += len, ++len)
        ++id;
    return id;
}

/* key j of batch row b is padding: the last third, and every key of batch row 1
 * (a batch whose rows are all masked) */
static int is_padding(size_t b, size_t j, size_t m) { return b == 1 || j * 3 >= 2 * m; }

typedef struct {
    double *out, *lse, *grad_v, *ds, *grad_sinks;   /* naive, in double */
} attention_naive;

/* Whether key j of query i of batch row b is masked (SPEC §6, §7). */
static int naive_masked(const problem_data *pd, const posenc_attention *a, size_t b, size_t i,
                        size_t j)
{
    const posenc_problem *p = &pd->p;
    const size_t pos = p->query_offset + i;
    if (a->causal && j > pos)
        return 1;
    if (a->window && ((a->window_left != UNB && j + a->window_left < pos) ||
                      (a->window_right != UNB && j > pos + a->window_right)))
        return 1;
    if (a->document_q && a->document_q[b * p->n + i] != a->document_k[b * p->m + j])
        return 1;
    return a->key_padding_mask && a->key_padding_mask[b * p->m + j];
}

/* SPEC §6 as loops over naive_logit, in double: out, lse, dv and dS (the
 * gradient of the logits, for the logits' backward). */
static void naive_attention(const problem_data *pd, const posenc_attention *a, attention_naive *r)
{
    const posenc_problem *p = &pd->p;
    const size_t B = p->B, H = p->H, n = p->n, m = p->m, dv = a->dv;
    const double *v = pd->f64[X_V], *d_out = pd->f64[X_D_OUT];
    const uint32_t threshold = posenc_dropout_threshold(a->dropout_p);
    double *P = malloc(sizeof(double) * (m + 1));
    uint8_t *keep = malloc(m + 1);
    r->out = calloc(B * H * n * dv + 1, sizeof(double));
    r->lse = calloc(B * H * n + 1, sizeof(double));
    r->grad_v = calloc(B * p->H_kv * m * dv + 1, sizeof(double));
    r->ds = calloc(B * H * n * m + 1, sizeof(double));
    r->grad_sinks = calloc(H + 1, sizeof(double));
    double *cap_grad = malloc(sizeof(double) * (m + 1));
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t i = 0; i < n; ++i) {
                const size_t u = b * H + h, row = u * n + i;
                const size_t uv = b * p->H_kv + h / (H / p->H_kv);   /* v's unit */
                const double sink = a->sinks ? a->sinks[h] : -INFINITY;
                double row_max = -INFINITY, sum = 0;
                for (size_t j = 0; j < m; ++j) {
                    double logit = naive_logit(pd, b, h, i, j);
                    cap_grad[j] = 1;
                    if (a->softcap > 0) {
                        const double t = tanh(logit / a->softcap);
                        logit = a->softcap * t;
                        cap_grad[j] = 1 - t * t;
                    }
                    P[j] = naive_masked(pd, a, b, i, j) ? -INFINITY : logit;
                    row_max = fmax(row_max, P[j]);
                }
                if (row_max == -INFINITY) {
                    r->lse[row] = sink;
                    continue;   /* out, dv and dS rows 0; the sink's gradient 0 (delta 0) */
                }
                const double shift = fmax(row_max, sink);
                for (size_t j = 0; j < m; ++j)
                    sum += P[j] = exp(P[j] - shift);
                sum += a->sinks ? exp(sink - shift) : 0;
                r->lse[row] = shift + log(sum);
                posenc_dropout_row(keep, m, a->seed, threshold, b, h, i);
                double delta = 0;
                for (size_t j = 0; j < m; ++j) {
                    P[j] /= sum;
                    const double D = keep[j] ? 1.0 / (1.0 - a->dropout_p) : 0.0;
                    for (size_t l = 0; l < dv; ++l) {
                        r->out[row * dv + l] += P[j] * D * v[(uv * m + j) * dv + l];
                        r->grad_v[(uv * m + j) * dv + l] += P[j] * D * d_out[row * dv + l];
                    }
                }
                for (size_t l = 0; l < dv; ++l)
                    delta += d_out[row * dv + l] * r->out[row * dv + l];
                if (a->sinks)
                    r->grad_sinks[h] -= exp(sink - r->lse[row]) * delta;
                for (size_t j = 0; j < m; ++j) {
                    const double D = keep[j] ? 1.0 / (1.0 - a->dropout_p) : 0.0;
                    double dp = 0;
                    for (size_t l = 0; l < dv; ++l)
                        dp += d_out[row * dv + l] * v[(uv * m + j) * dv + l];
                    r->ds[row * m + j] = P[j] * (D * dp - delta) * cap_grad[j];
                }
            }
    free(cap_grad);
    free(P);
    free(keep);
}

typedef struct {
    double *out, *lse, *grad_v, *grads[GRAD_COUNT], grad_sinks[8];
} attention_result;

/* A (B, heads, rows, cols) input of `es`-byte elements laid out (B, rows, heads, cols + 1),
 * as a model's projections hold it: a copy (free()'s), its strides in *s (posenc.h). */
static void *transposed(const void *x, size_t B, size_t heads, size_t rows, size_t cols,
                        size_t es, posenc_strides *s)
{
    const size_t ld = cols + 1;
    char *y = calloc(B * rows * heads * ld + 1, es);
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < heads; ++h)
            for (size_t i = 0; i < rows; ++i)
                memcpy(y + ((b * rows + i) * heads + h) * ld * es,
                       (const char *)x + ((b * heads + h) * rows + i) * cols * es, cols * es);
    *s = (posenc_strides){(ptrdiff_t)(rows * heads * ld), (ptrdiff_t)ld, (ptrdiff_t)(heads * ld)};
    return y;
}

/* The attention of pd's problem forward and backward into r; `strided`: q, k, v and d_out
 * read from transposed() copies. */
static int run_attention(problem_data *pd, posenc_attention *a, posenc_dtype dtype, int threads,
                         attention_result *r, int strided)
{
    posenc_problem strided_p = pd->p;
    const posenc_problem *p = strided ? &strided_p : &pd->p;
    const size_t es = dtype == POSENC_F32 ? sizeof(float) : sizeof(double);
    const size_t n_out = p->B * p->H * p->n * a->dv, n_lse = p->B * p->H * p->n;
    const size_t n_v = p->B * p->H_kv * p->m * a->dv;
    size_t lens[GRAD_COUNT];
    void *out = malloc(es * (n_out + 1)), *lse = malloc(es * (n_lse + 1));
    void *grad_v = malloc(es * (n_v + 1)), *g[GRAD_COUNT];
    for (int t = 0; t < GRAD_COUNT; ++t) {
        lens[t] = grad_len(pd, t);
        g[t] = grad_input(pd, t) ? malloc(grad_size(t, es) * (lens[t] + 1)) : NULL;
    }
    posenc_grads grads = grads_of(g);
    a->v = dtype == POSENC_F32 ? (const void *)pd->f32[X_V] : (const void *)pd->f64[X_V];
    a->grad_sinks = a->sinks ? r->grad_sinks : NULL;
    const void *d_out = dtype == POSENC_F32 ? (const void *)pd->f32[X_D_OUT] : (const void *)pd->f64[X_D_OUT];
    void *copies[4] = {NULL, NULL, NULL, NULL};
    posenc_attention sa = *a;
    if (strided) {
        const size_t H_kv = p->H_kv ? p->H_kv : p->H;
        strided_p.q = copies[0] =
            transposed(p->q, p->B, p->H, p->n, p->d, es, &strided_p.q_strides);
        strided_p.k = copies[1] =
            transposed(p->k, p->B, H_kv, p->m, p->d, es, &strided_p.k_strides);
        sa.v = copies[2] = transposed(a->v, p->B, H_kv, p->m, a->dv, es, &sa.v_strides);
        d_out = copies[3] = transposed(d_out, p->B, p->H, p->n, a->dv, es, &sa.d_out_strides);
    }
    int status = posenc_attention_forward(p, &sa, out, lse, threads);
    if (status == POSENC_OK)
        status = posenc_attention_backward(p, &sa, d_out, out, lse, &grads, grad_v, threads);
    for (int t = 0; t < 4; ++t)
        free(copies[t]);
    r->out = widen(out, n_out, dtype);
    r->lse = widen(lse, n_lse, dtype);
    r->grad_v = widen(grad_v, n_v, dtype);
    for (int t = 0; t < GRAD_COUNT; ++t) {
        r->grads[t] = g[t] ? widen_grad(g[t], lens[t], t, dtype) : NULL;
        free(g[t]);
    }
    free(out);
    free(lse);
    free(grad_v);
    return status;
}

static void free_attention(attention_result *r)
{
    free(r->out); free(r->lse); free(r->grad_v);
    for (int t = 0; t < GRAD_COUNT; ++t) free(r->grads[t]);
}

/* lse compared with its -inf entries equal and the finite ones within rtol */
static void compare_lse(const char *what, const double *a, const double *b, size_t len, double rtol,
                        int bitwise)
{
    int bad = 0;
    for (size_t t = 0; t < len; ++t) {
        if (bitwise ? memcmp(&a[t], &b[t], sizeof(double)) != 0
                    : (isinf(b[t]) ? a[t] != b[t] : !(fabs(a[t] - b[t]) <= rtol * fmax(1.0, fabs(b[t])))))
            bad = 1;
    }
    EXPECT(!bad, "%s lse%s", what, bitwise ? " (bitwise)" : "");
}

void test_attention(void)
{
    const size_t sizes[][6] = {{1, 1, 1, 1, 1, 1}, {2, 3, 7, 5, 3, 4}, {1, 2, 17, 33, 9, 3},
                               {2, 1, 33, 17, 16, 16}, {3, 2, 9, 9, 0, 2}, {2, 2, 70, 64, 16, 0},
                               {2, 1, 300, 200, 8, 5},
                               {1, 2, 5, 301, 19, 7},     /* the decoding path, long keys */
                               /* its rows held in registers: d = 4 or 8 vectors (rows_dot):
                                  NEON float32 16, 32; float64 8, 16; AVX2 32, 16; ... */
                               {1, 2, 2, 37, 16, 5}, {1, 2, 1, 41, 32, 3}, {1, 2, 2, 19, 8, 3},
                               {1, 2, 3, 4500, 9, 5}};    /* keys split into chunks of 2048 */
    for (size_t c = 0; c < config_count; ++c)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s)
            for (size_t k = 0; k < sizeof attention_cases / sizeof attention_cases[0]; ++k) {
                const size_t *z = sizes[s], dv = z[5];
                const attention_case *ac = &attention_cases[k];
                /* half the combinations (a third: quick), the large size for a few */
                if ((c + s + k) % (quick ? 3 : 2) || (z[2] >= 300 && c % 4) ||
                    skip_size(z[2], z[3]))
                    continue;
                problem_data pd;
                build(&pd, &configs[c], z[0], z[1], z[2], z[3], z[4], (int)(s + k) % 2);
                fill(&pd, X_V, z[0] * pd.p.H_kv * z[3] * dv);
                fill(&pd, X_D_OUT, z[0] * z[1] * z[2] * dv);
                uint8_t *mask = malloc(z[0] * z[3] + 1);
                for (size_t t = 0; t < z[0] * z[3]; ++t)
                    mask[t] = (uint8_t)is_padding(t / z[3], t % z[3], z[3]);
                int64_t *doc_q = malloc(sizeof(int64_t) * (z[0] * z[2] + 1));
                int64_t *doc_k = malloc(sizeof(int64_t) * (z[0] * z[3] + 1));
                for (size_t t = 0; t < z[0] * z[2]; ++t)   /* query i at position query_offset + i */
                    doc_q[t] = doc_id(t / z[2], pd.p.query_offset + t % z[2]);
                for (size_t t = 0; t < z[0] * z[3]; ++t)
                    doc_k[t] = doc_id(t / z[3], t % z[3]);
                double sinks[8];
                for (size_t h = 0; h < 8; ++h)
                    sinks[h] = 0.5 * (double)h - 1.0;
                posenc_attention a = {NULL, dv, ac->padding ? mask : NULL, ac->causal,
                                      ac->dropout_p, 0x9e3779b97f4a7c15ull + s};
                a.window = ac->window;
                a.window_left = ac->left;
                a.window_right = ac->right;
                a.document_q = ac->documents ? doc_q : NULL;
                a.document_k = ac->documents ? doc_k : NULL;
                a.softcap = ac->softcap;
                a.sinks = ac->sinks ? sinks : NULL;
                point(&pd, POSENC_F64);
                attention_naive naive;
                naive_attention(&pd, &a, &naive);
                /* the naive dS through the logits' backward (scalar, double) */
                size_t lens[GRAD_COUNT];
                double *want[GRAD_COUNT];
                for (int t = 0; t < GRAD_COUNT; ++t) {
                    lens[t] = grad_len(&pd, t);
                    want[t] = grad_input(&pd, t) ? malloc(sizeof(double) * (lens[t] + 1)) : NULL;
                }
                posenc_grads wg = grads_of((void **)want);
                posenc_set_isa(POSENC_ISA_SCALAR);
                EXPECT(posenc_backward(&pd.p, naive.ds, &wg, 1) == POSENC_OK, "backward of dS");
                for (int dt = 1; dt >= 0; --dt) {
                    const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
                    const double rtol = dt ? 1e-11 : 1e-4;
                    point(&pd, dtype);
                    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
                        if (!posenc_isa_supported((posenc_isa)isa))
                            continue;
                        posenc_set_isa((posenc_isa)isa);
                        attention_result one, two, three;
                        char what[256];
                        snprintf(what, sizeof what, "attention %s %s %s size#%zu %s", configs[c].name,
                                 ac->name, dt ? "f64" : "f32", s, posenc_isa_name((posenc_isa)isa));
                        EXPECT(run_attention(&pd, &a, dtype, 1, &one, 0) == POSENC_OK,
                               "%s status", what);
                        EXPECT(run_attention(&pd, &a, dtype, 2, &two, 0) == POSENC_OK,
                               "%s status", what);
                        EXPECT(run_attention(&pd, &a, dtype, 1, &three, 1) == POSENC_OK,
                               "%s strided status", what);
                        const size_t n_out = z[0] * z[1] * z[2] * dv, n_lse = z[0] * z[1] * z[2];
                        const size_t n_v = z[0] * pd.p.H_kv * z[3] * dv;
                        compare(what, one.out, naive.out, n_out, rtol, 0);
                        compare(what, two.out, one.out, n_out, 0, 1);
                        compare_lse(what, one.lse, naive.lse, n_lse, rtol, 0);
                        compare_lse(what, two.lse, one.lse, n_lse, 0, 1);
                        compare(what, one.grad_v, naive.grad_v, n_v, rtol, 0);
                        compare(what, two.grad_v, one.grad_v, n_v, 0, 1);
                        /* q, k, v, d_out strided: the same sums, bit for bit */
                        compare(what, three.out, one.out, n_out, 0, 1);
                        compare_lse(what, three.lse, one.lse, n_lse, 0, 1);
                        compare(what, three.grad_v, one.grad_v, n_v, 0, 1);
                        if (a.sinks) {
                            compare_above(what, one.grad_sinks, naive.grad_sinks, z[1], rtol, 0, 1.0);
                            compare(what, two.grad_sinks, one.grad_sinks, z[1], 0, 1);
                            compare(what, three.grad_sinks, one.grad_sinks, z[1], 0, 1);
                        }
                        for (int t = 0; t < GRAD_COUNT; ++t) {
                            if (!want[t])
                                continue;
                            char grad_what[300];
                            snprintf(grad_what, sizeof grad_what, "%s d%s", what, grad_names[t]);
                            /* some vanish (a segment gradient through rows that sum to 0):
                             * relative to at least 1; a module's, batch row 0's: the sum
                             * over the batch (posenc_grads) */
                            const size_t rows = grad_module(t) >= 0 && z[0] ? z[0] : 1;
                            compare_above(grad_what, one.grads[t], want[t], lens[t] / rows, rtol, 0,
                                          1.0);
                            compare(grad_what, two.grads[t], one.grads[t],
                                    grad_written_len(&pd, t), 0, 1);
                            compare(grad_what, three.grads[t], one.grads[t],
                                    grad_written_len(&pd, t), 0, 1);
                        }
                        free_attention(&one);
                        free_attention(&two);
                        free_attention(&three);
                    }
                }
                for (int t = 0; t < GRAD_COUNT; ++t) free(want[t]);
                free(naive.out); free(naive.lse); free(naive.grad_v); free(naive.ds);
                free(naive.grad_sinks);
                free(mask); free(doc_q); free(doc_k);
                release(&pd);
            }
}
