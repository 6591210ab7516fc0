/*
 * test_engine.c -- the C engine without Python: every term kind, sum and
 * product mode, float and double, odd sizes, on every ISA this CPU supports.
 *
 *   1. The forward of the scalar ISA equals a naive double-precision loop
 *      written from SPEC.md's formulas (maps here are synthetic: clipped,
 *      reversed clipped, irregular random), so the engine is checked on its
 *      own, including on AArch64 under qemu where Python is not used.
 *   2. Every other ISA (avx2, avx512 or neon) equals the scalar ISA, forward
 *      and every backward output, within a dtype tolerance.
 *   3. 1 and 2 threads give bitwise identical results.
 *   4. Philox-4x32-10 gives Random123's known answers.
 *   5. The fused attention (SPEC §6): on the scalar ISA in double, out, lse
 *      and dv equal naive loops over the naive logits (mask, softmax, the
 *      dropout's keep decisions, matmuls), and every other gradient equals
 *      the logits' backward (checked by 1-3) of the naive dS; every ISA and
 *      dtype equals it within a tolerance, 1 and 2 threads bitwise.
 *
 * Build and run: tests/c/run.sh (native, cross to aarch64 + qemu, valgrind).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "posenc.h"
#include "engine/philox.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void)   /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static int failures, checks;

#define EXPECT(cond, ...)                         \
    do {                                          \
        ++checks;                                 \
        if (!(cond)) {                            \
            ++failures;                           \
            fprintf(stderr, "FAIL: " __VA_ARGS__); \
            fputc('\n', stderr);                  \
        }                                         \
    } while (0)

typedef struct {
    const char *name;
    int dense, table, query_table, key_table, segments, theta, product;
    int map;   /* 0 clipped j-i, 1 clipped i-j, 2 irregular */
    size_t query_offset;   /* SPEC §1: moves TUPE's [CLS] row (the maps here are synthetic) */
} config;

static const config configs[] = {
    {"content", 0, 0, 0, 0, 0, 0, 0, 0},
    {"shaw", 0, 0, 1, 0, 0, 0, 0, 0},
    {"t5-like", 0, 1, 0, 0, 0, 0, 0, 2},
    {"m2", 0, 1, 0, 0, 0, 0, 1, 0},
    {"m4", 0, 0, 1, 1, 0, 0, 0, 0},
    {"m4m", 0, 0, 1, 1, 0, 0, 1, 0},
    {"deberta-like", 0, 0, 1, 1, 0, 0, 0, 1},
    {"tupe", 1, 1, 0, 0, 0, 1, 0, 2},
    {"diet_abs", 1, 0, 0, 0, 1, 0, 0, 0},
    {"diet_rel", 0, 1, 0, 0, 1, 0, 0, 1},
    {"everything", 1, 1, 1, 1, 1, 1, 0, 2},
    {"tupe@offset", 1, 1, 0, 0, 0, 1, 0, 2, 2},
    {"everything@offset", 1, 1, 1, 1, 1, 1, 0, 2, 1},
    {"product-all", 0, 1, 1, 1, 0, 0, 1, 2},
};

enum { MAX_ARRAYS = 16 };

/* The problem's inputs in double; f32 copies made on demand. */
typedef struct {
    posenc_problem p;
    size_t len[MAX_ARRAYS];
    double *f64[MAX_ARRAYS];
    float *f32[MAX_ARRAYS];
    int64_t *maps[3];
    int64_t *segment_q, *segment_k;
} problem_data;

enum { X_Q, X_K, X_PQ, X_PK, X_TABLE, X_QUERY_TABLE, X_KEY_TABLE, X_SEGMENT_TABLE, X_THETA, X_G,
       X_V, X_D_OUT, X_COUNT };

static double *fill(problem_data *pd, int slot, size_t len)
{
    pd->len[slot] = len;
    pd->f64[slot] = malloc(sizeof(double) * (len ? len : 1));
    pd->f32[slot] = malloc(sizeof(float) * (len ? len : 1));
    for (size_t t = 0; t < len; ++t) {
        pd->f64[slot][t] = (double)(float)urand();   /* exactly representable in float */
        pd->f32[slot][t] = (float)pd->f64[slot][t];
    }
    return pd->f64[slot];
}

static int64_t *make_map(int kind, size_t n, size_t m, size_t rows)
{
    const size_t offsets = n + m - 1;
    int64_t *map = malloc(sizeof(int64_t) * offsets);
    const ptrdiff_t t = (ptrdiff_t)(rows - 1) / 2;
    for (size_t idx = 0; idx < offsets; ++idx) {
        ptrdiff_t o = (ptrdiff_t)idx - (ptrdiff_t)(n - 1);
        if (kind == 1)
            o = -o;
        if (kind == 2) {
            map[idx] = (int64_t)((urand() + 1.0) * 0.5 * (double)rows);
            if (map[idx] >= (int64_t)rows) map[idx] = (int64_t)rows - 1;
            if (idx % 3) map[idx] = idx ? map[idx - 1] : map[idx];   /* some runs */
            continue;
        }
        map[idx] = (o < -t ? -t : o > t ? t : o) + t;
    }
    return map;
}

static void build(problem_data *pd, const config *c, size_t B, size_t H, size_t n, size_t m,
                  size_t d, int shared)
{
    memset(pd, 0, sizeof *pd);
    posenc_problem *p = &pd->p;
    const size_t Hp = shared ? 1 : H, rows = 7, dp = 3, S = 3;
    p->product = c->product;
    p->query_offset = c->query_offset;
    p->B = B; p->H = H; p->n = n; p->m = m; p->d = d;
    p->scale = 0.37;
    p->dense_scale = 0.8;
    p->vector_scale = c->product ? 1.0 : 0.37;
    fill(pd, X_Q, B * H * n * d);
    fill(pd, X_K, B * H * m * d);
    fill(pd, X_G, B * H * n * m);
    if (c->dense) {
        fill(pd, X_PQ, Hp * n * dp);
        fill(pd, X_PK, H * m * dp);          /* pos_k per head, pos_q maybe shared */
        p->pos_q_heads = Hp; p->pos_k_heads = H; p->d_p = dp;
    }
    if (c->table) {
        fill(pd, X_TABLE, Hp * rows);
        p->table_heads = Hp; p->table_rows = rows;
        pd->maps[0] = make_map(c->map, n, m, rows);
        p->table_map = pd->maps[0];
    }
    if (c->query_table) {
        fill(pd, X_QUERY_TABLE, Hp * rows * d);
        p->query_table_heads = Hp; p->query_table_rows = rows;
        pd->maps[1] = make_map(c->map, n, m, rows);
        p->query_map = pd->maps[1];
    }
    if (c->key_table) {
        fill(pd, X_KEY_TABLE, H * rows * d);
        p->key_table_heads = H; p->key_table_rows = rows;
        pd->maps[2] = make_map(c->map == 2 ? 0 : c->map, n, m, rows);
        p->key_map = pd->maps[2];
    }
    if (c->segments) {
        fill(pd, X_SEGMENT_TABLE, Hp * S * S);
        p->segment_table_heads = Hp; p->n_segments = S;
        pd->segment_q = malloc(sizeof(int64_t) * (B * n + 1));
        pd->segment_k = malloc(sizeof(int64_t) * (B * m + 1));
        for (size_t t = 0; t < B * n; ++t) pd->segment_q[t] = (int64_t)((urand() + 1) * 1.5) % 3;
        for (size_t t = 0; t < B * m; ++t) pd->segment_k[t] = (int64_t)(t * 3 / (B * m + 1)) % 3;
        p->segment_q = pd->segment_q; p->segment_k = pd->segment_k;
    }
    if (c->theta) {
        fill(pd, X_THETA, Hp * 2);
        p->theta_heads = Hp;
    }
}

static void point(problem_data *pd, posenc_dtype dtype)
{
    posenc_problem *p = &pd->p;
#define PTR(slot) (pd->len[slot] || pd->f64[slot] ? (dtype == POSENC_F32 ? (void *)pd->f32[slot] : (void *)pd->f64[slot]) : NULL)
    p->dtype = dtype;
    p->q = PTR(X_Q); p->k = PTR(X_K);
    p->pos_q = PTR(X_PQ); p->pos_k = PTR(X_PK);
    p->table = PTR(X_TABLE); p->query_table = PTR(X_QUERY_TABLE); p->key_table = PTR(X_KEY_TABLE);
    p->segment_table = PTR(X_SEGMENT_TABLE); p->theta = PTR(X_THETA);
#undef PTR
}

static void release(problem_data *pd)
{
    for (int t = 0; t < MAX_ARRAYS; ++t) { free(pd->f64[t]); free(pd->f32[t]); }
    for (int t = 0; t < 3; ++t) free(pd->maps[t]);
    free(pd->segment_q);
    free(pd->segment_k);
}

/* SPEC §3 written as loops, in double. */
static double naive_logit(const problem_data *pd, size_t b, size_t h, size_t i, size_t j)
{
    const posenc_problem *p = &pd->p;
    const size_t n = p->n, m = p->m, d = p->d, H = p->H;
    const double *q = pd->f64[X_Q] + ((b * H + h) * n + i) * d;
    const double *k = pd->f64[X_K] + ((b * H + h) * m + j) * d;
    const size_t o = j + n - 1 - i;
    double qk = 0;
    for (size_t l = 0; l < d; ++l) qk += q[l] * k[l];
    double fq = 0, fk = 0, t = 0, pos = 0;
    if (p->query_table) {
        const double *a = pd->f64[X_QUERY_TABLE] + ((p->query_table_heads == 1 ? 0 : h) * p->query_table_rows + (size_t)p->query_map[o]) * d;
        for (size_t l = 0; l < d; ++l) fq += q[l] * a[l];
        fq *= p->vector_scale;
    }
    if (p->key_table) {
        const double *a = pd->f64[X_KEY_TABLE] + ((p->key_table_heads == 1 ? 0 : h) * p->key_table_rows + (size_t)p->key_map[o]) * d;
        for (size_t l = 0; l < d; ++l) fk += k[l] * a[l];
        fk *= p->vector_scale;
    }
    if (p->table)
        t = pd->f64[X_TABLE][(p->table_heads == 1 ? 0 : h) * p->table_rows + (size_t)p->table_map[o]];
    if (p->product) {
        double value = p->scale * qk;
        if (p->table) value *= t;
        if (p->query_table) value *= fq;
        if (p->key_table) value *= fk;
        return value;
    }
    pos = fq + fk + t;
    if (p->pos_q) {
        const double *pq = pd->f64[X_PQ] + ((p->pos_q_heads == 1 ? 0 : h) * n + i) * p->d_p;
        const double *pk = pd->f64[X_PK] + ((p->pos_k_heads == 1 ? 0 : h) * m + j) * p->d_p;
        double dot = 0;
        for (size_t l = 0; l < p->d_p; ++l) dot += pq[l] * pk[l];
        pos += p->dense_scale * dot;
    }
    if (p->segment_table) {
        const size_t S = p->n_segments;
        pos += pd->f64[X_SEGMENT_TABLE][(p->segment_table_heads == 1 ? 0 : h) * S * S +
                              (size_t)p->segment_q[b * n + i] * S + (size_t)p->segment_k[b * m + j]];
    }
    if (p->theta) {
        const double *theta = pd->f64[X_THETA] + (p->theta_heads == 1 ? 0 : h) * 2;
        if (p->query_offset + i == 0) pos = theta[0];
        else if (j == 0) pos = theta[1];
    }
    return p->scale * qk + pos;
}

typedef struct {
    double *out;
    double *grads[9];
    size_t grad_len[9];
} result;

static double *widen(const void *src, size_t len, posenc_dtype dtype)
{
    double *dst = malloc(sizeof(double) * (len ? len : 1));
    for (size_t t = 0; t < len; ++t)
        dst[t] = dtype == POSENC_F32 ? (double)((const float *)src)[t] : ((const double *)src)[t];
    return dst;
}

static int run(problem_data *pd, posenc_dtype dtype, int threads, result *r)
{
    const posenc_problem *p = &pd->p;
    const size_t es = dtype == POSENC_F32 ? sizeof(float) : sizeof(double);
    const size_t logits = p->B * p->H * p->n * p->m;
    void *out = malloc(es * (logits ? logits : 1));
    const size_t lens[9] = {pd->len[X_Q], pd->len[X_K], pd->len[X_PQ], pd->len[X_PK], pd->len[X_TABLE],
                            pd->len[X_QUERY_TABLE], pd->len[X_KEY_TABLE], pd->len[X_SEGMENT_TABLE], pd->len[X_THETA]};
    const void *inputs[9] = {p->q, p->k, p->pos_q, p->pos_k, p->table, p->query_table, p->key_table,
                             p->segment_table, p->theta};
    void *g[9];
    for (int t = 0; t < 9; ++t) g[t] = inputs[t] ? malloc(es * (lens[t] ? lens[t] : 1)) : NULL;
    posenc_grads grads = {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]};
    const void *G = dtype == POSENC_F32 ? (const void *)pd->f32[X_G] : (const void *)pd->f64[X_G];
    const char *why = NULL;
    int status = posenc_validate(p, &why);   /* the engine trusts a validated problem */
    EXPECT(status == POSENC_OK, "invalid problem: %s", why ? why : "");
    if (status == POSENC_OK)
        status = posenc_forward(p, out, threads);
    if (status == POSENC_OK)
        status = posenc_backward(p, G, &grads, threads);
    r->out = widen(out, logits, dtype);
    for (int t = 0; t < 9; ++t) {
        r->grad_len[t] = g[t] ? lens[t] : 0;
        r->grads[t] = g[t] ? widen(g[t], lens[t], dtype) : NULL;
        free(g[t]);
    }
    free(out);
    return status;
}

static void free_result(result *r)
{
    free(r->out);
    for (int t = 0; t < 9; ++t) free(r->grads[t]);
}

static double max_abs(const double *x, size_t len)
{
    double v = 0;
    for (size_t t = 0; t < len; ++t) v = fmax(v, fabs(x[t]));
    return v;
}

static void compare_above(const char *what, const double *a, const double *b, size_t len,
                          double rtol, int bitwise, double floor)
{
    const double scale = fmax(max_abs(b, len), floor);
    double worst = 0;
    for (size_t t = 0; t < len; ++t) {
        const double diff = fabs(a[t] - b[t]);
        if (bitwise ? memcmp(&a[t], &b[t], sizeof(double)) != 0 : !(diff <= rtol * scale))
            worst = fmax(worst, diff / scale + (diff != diff ? 1e300 : 0) + (bitwise ? 1 : 0));
    }
    EXPECT(worst == 0, "%s: relative error %.3g (tolerance %.3g%s)", what, worst, rtol,
           bitwise ? ", bitwise" : "");
}

/* a and b equal within rtol times b's largest entry (bitwise: exactly) */
static void compare(const char *what, const double *a, const double *b, size_t len, double rtol,
                    int bitwise)
{
    compare_above(what, a, b, len, rtol, bitwise, 1e-30);
}

static const char *const grad_names[9] = {"q", "k", "pos_q", "pos_k", "table", "query_table", "key_table", "segment_table", "theta"};

/* ---------------------------------------------------------------- Philox */

static void test_philox(void)
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

/* ---------------------------------------------------------------- attention */

typedef struct {
    const char *name;
    int causal, padding;
    double dropout_p;
} attention_case;

static const attention_case attention_cases[] = {
    {"plain", 0, 0, 0.0}, {"causal", 1, 0, 0.0}, {"padded", 0, 1, 0.0},
    {"causal+padded+dropout", 1, 1, 0.3}, {"dropout", 0, 0, 0.5},
};

/* key j of batch row b is padding: the last third, and every key of batch row 1
 * (a batch whose rows are all masked) */
static int is_padding(size_t b, size_t j, size_t m) { return b == 1 || j * 3 >= 2 * m; }

typedef struct {
    double *out, *lse, *grad_v, *ds;   /* naive, in double */
} attention_naive;

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
    r->grad_v = calloc(B * H * m * dv + 1, sizeof(double));
    r->ds = calloc(B * H * n * m + 1, sizeof(double));
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t i = 0; i < n; ++i) {
                const size_t u = b * H + h, row = u * n + i;
                double row_max = -INFINITY, sum = 0;
                for (size_t j = 0; j < m; ++j) {
                    const int masked = (a->causal && j > p->query_offset + i) ||
                                       (a->key_padding_mask && a->key_padding_mask[b * m + j]);
                    P[j] = masked ? -INFINITY : naive_logit(pd, b, h, i, j);
                    row_max = fmax(row_max, P[j]);
                }
                if (row_max == -INFINITY) {
                    r->lse[row] = -INFINITY;
                    continue;   /* out, dv and dS rows 0 */
                }
                for (size_t j = 0; j < m; ++j)
                    sum += P[j] = exp(P[j] - row_max);
                r->lse[row] = row_max + log(sum);
                posenc_dropout_row(keep, m, a->seed, threshold, b, h, i);
                double delta = 0;
                for (size_t j = 0; j < m; ++j) {
                    P[j] /= sum;
                    const double D = keep[j] ? 1.0 / (1.0 - a->dropout_p) : 0.0;
                    for (size_t l = 0; l < dv; ++l) {
                        r->out[row * dv + l] += P[j] * D * v[(u * m + j) * dv + l];
                        r->grad_v[(u * m + j) * dv + l] += P[j] * D * d_out[row * dv + l];
                    }
                }
                for (size_t l = 0; l < dv; ++l)
                    delta += d_out[row * dv + l] * r->out[row * dv + l];
                for (size_t j = 0; j < m; ++j) {
                    const double D = keep[j] ? 1.0 / (1.0 - a->dropout_p) : 0.0;
                    double dp = 0;
                    for (size_t l = 0; l < dv; ++l)
                        dp += d_out[row * dv + l] * v[(u * m + j) * dv + l];
                    r->ds[row * m + j] = P[j] * (D * dp - delta);
                }
            }
    free(P);
    free(keep);
}

typedef struct {
    double *out, *lse, *grad_v, *grads[9];
} attention_result;

static int run_attention(problem_data *pd, posenc_attention *a, posenc_dtype dtype, int threads,
                         attention_result *r)
{
    const posenc_problem *p = &pd->p;
    const size_t es = dtype == POSENC_F32 ? sizeof(float) : sizeof(double);
    const size_t n_out = p->B * p->H * p->n * a->dv, n_lse = p->B * p->H * p->n;
    const size_t n_v = p->B * p->H * p->m * a->dv;
    const size_t lens[9] = {pd->len[X_Q], pd->len[X_K], pd->len[X_PQ], pd->len[X_PK], pd->len[X_TABLE],
                            pd->len[X_QUERY_TABLE], pd->len[X_KEY_TABLE], pd->len[X_SEGMENT_TABLE], pd->len[X_THETA]};
    const void *inputs[9] = {p->q, p->k, p->pos_q, p->pos_k, p->table, p->query_table, p->key_table,
                             p->segment_table, p->theta};
    void *out = malloc(es * (n_out + 1)), *lse = malloc(es * (n_lse + 1));
    void *grad_v = malloc(es * (n_v + 1)), *g[9];
    for (int t = 0; t < 9; ++t) g[t] = inputs[t] ? malloc(es * (lens[t] + 1)) : NULL;
    posenc_grads grads = {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]};
    a->v = dtype == POSENC_F32 ? (const void *)pd->f32[X_V] : (const void *)pd->f64[X_V];
    const void *d_out = dtype == POSENC_F32 ? (const void *)pd->f32[X_D_OUT] : (const void *)pd->f64[X_D_OUT];
    int status = posenc_attention_forward(p, a, out, lse, threads);
    if (status == POSENC_OK)
        status = posenc_attention_backward(p, a, d_out, out, lse, &grads, grad_v, threads);
    r->out = widen(out, n_out, dtype);
    r->lse = widen(lse, n_lse, dtype);
    r->grad_v = widen(grad_v, n_v, dtype);
    for (int t = 0; t < 9; ++t) {
        r->grads[t] = g[t] ? widen(g[t], lens[t], dtype) : NULL;
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
    for (int t = 0; t < 9; ++t) free(r->grads[t]);
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

static void test_attention(void)
{
    const size_t sizes[][6] = {{1, 1, 1, 1, 1, 1}, {2, 3, 7, 5, 3, 4}, {1, 2, 17, 33, 9, 3},
                               {2, 1, 33, 17, 16, 16}, {3, 2, 9, 9, 0, 2}, {2, 2, 70, 64, 16, 0},
                               {2, 1, 300, 200, 8, 5}};
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; ++c)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s)
            for (size_t k = 0; k < sizeof attention_cases / sizeof attention_cases[0]; ++k) {
                const size_t *z = sizes[s], dv = z[5];
                const attention_case *ac = &attention_cases[k];
                if ((c + s + k) % 2 || (z[2] >= 300 && c % 4))   /* half the combinations; */
                    continue;                                    /* the large size for a few */
                problem_data pd;
                build(&pd, &configs[c], z[0], z[1], z[2], z[3], z[4], (int)(s + k) % 2);
                fill(&pd, X_V, z[0] * z[1] * z[3] * dv);
                fill(&pd, X_D_OUT, z[0] * z[1] * z[2] * dv);
                uint8_t *mask = malloc(z[0] * z[3] + 1);
                for (size_t t = 0; t < z[0] * z[3]; ++t)
                    mask[t] = (uint8_t)is_padding(t / z[3], t % z[3], z[3]);
                posenc_attention a = {NULL, dv, ac->padding ? mask : NULL, ac->causal,
                                      ac->dropout_p, 0x9e3779b97f4a7c15ull + s};
                point(&pd, POSENC_F64);
                attention_naive naive;
                naive_attention(&pd, &a, &naive);
                /* the naive dS through the logits' backward (scalar, double) */
                const size_t lens[9] = {pd.len[X_Q], pd.len[X_K], pd.len[X_PQ], pd.len[X_PK], pd.len[X_TABLE],
                                        pd.len[X_QUERY_TABLE], pd.len[X_KEY_TABLE], pd.len[X_SEGMENT_TABLE], pd.len[X_THETA]};
                const void *inputs[9] = {pd.p.q, pd.p.k, pd.p.pos_q, pd.p.pos_k, pd.p.table, pd.p.query_table,
                                         pd.p.key_table, pd.p.segment_table, pd.p.theta};
                double *want[9];
                for (int t = 0; t < 9; ++t) want[t] = inputs[t] ? malloc(sizeof(double) * (lens[t] + 1)) : NULL;
                posenc_grads wg = {want[0], want[1], want[2], want[3], want[4], want[5], want[6], want[7], want[8]};
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
                        attention_result one, two;
                        char what[256];
                        snprintf(what, sizeof what, "attention %s %s %s size#%zu %s", configs[c].name,
                                 ac->name, dt ? "f64" : "f32", s, posenc_isa_name((posenc_isa)isa));
                        EXPECT(run_attention(&pd, &a, dtype, 1, &one) == POSENC_OK, "%s status", what);
                        EXPECT(run_attention(&pd, &a, dtype, 2, &two) == POSENC_OK, "%s status", what);
                        const size_t n_out = z[0] * z[1] * z[2] * dv, n_lse = z[0] * z[1] * z[2];
                        const size_t n_v = z[0] * z[1] * z[3] * dv;
                        compare(what, one.out, naive.out, n_out, rtol, 0);
                        compare(what, two.out, one.out, n_out, 0, 1);
                        compare_lse(what, one.lse, naive.lse, n_lse, rtol, 0);
                        compare_lse(what, two.lse, one.lse, n_lse, 0, 1);
                        compare(what, one.grad_v, naive.grad_v, n_v, rtol, 0);
                        compare(what, two.grad_v, one.grad_v, n_v, 0, 1);
                        for (int t = 0; t < 9; ++t) {
                            if (!want[t])
                                continue;
                            char grad_what[300];
                            snprintf(grad_what, sizeof grad_what, "%s d%s", what, grad_names[t]);
                            /* some vanish (a segment gradient through rows that sum to 0):
                             * relative to at least 1 */
                            compare_above(grad_what, one.grads[t], want[t], lens[t], rtol, 0, 1.0);
                            compare(grad_what, two.grads[t], one.grads[t], lens[t], 0, 1);
                        }
                        free_attention(&one);
                        free_attention(&two);
                    }
                }
                for (int t = 0; t < 9; ++t) free(want[t]);
                free(naive.out); free(naive.lse); free(naive.grad_v); free(naive.ds);
                free(mask);
                release(&pd);
            }
}

int main(void)
{
    posenc_dispatch_init();
    const size_t sizes[][5] = {{1, 1, 1, 1, 1}, {2, 3, 7, 5, 3}, {1, 2, 17, 33, 9},
                               {2, 1, 33, 17, 16}, {1, 1, 65, 40, 31}, {3, 2, 9, 9, 0},
                               /* above the one-thread threshold: units, then row chunks */
                               {2, 3, 70, 64, 16}, {1, 1, 300, 200, 8}};
    printf("ISAs supported:");
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa)
        if (posenc_isa_supported((posenc_isa)isa))
            printf(" %s", posenc_isa_name((posenc_isa)isa));
    printf("\n");
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; ++c) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            for (int shared = 0; shared < 2; ++shared) {
                problem_data pd;
                const size_t *z = sizes[s];
                build(&pd, &configs[c], z[0], z[1], z[2], z[3], z[4], shared);
                for (int dt = 0; dt < 2; ++dt) {
                    const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
                    const double rtol = dt ? 1e-12 : 2e-5;
                    char what[256];
                    point(&pd, dtype);
                    posenc_set_isa(POSENC_ISA_SCALAR);
                    result base;
                    EXPECT(run(&pd, dtype, 1, &base) == POSENC_OK, "%s status", configs[c].name);
                    /* 1. scalar forward against the naive loops */
                    const size_t logits = z[0] * z[1] * z[2] * z[3];
                    double *naive = malloc(sizeof(double) * (logits ? logits : 1));
                    for (size_t b = 0, t = 0; b < z[0]; ++b)
                        for (size_t h = 0; h < z[1]; ++h)
                            for (size_t i = 0; i < z[2]; ++i)
                                for (size_t j = 0; j < z[3]; ++j)
                                    naive[t++] = naive_logit(&pd, b, h, i, j);
                    snprintf(what, sizeof what, "%s %s size#%zu shared=%d scalar vs naive",
                             configs[c].name, dt ? "f64" : "f32", s, shared);
                    compare(what, base.out, naive, logits, rtol, 0);
                    free(naive);
                    /* 2. every other ISA against scalar; 3. threads bitwise */
                    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
                        if (!posenc_isa_supported((posenc_isa)isa))
                            continue;
                        posenc_set_isa((posenc_isa)isa);
                        result one, two;
                        EXPECT(run(&pd, dtype, 1, &one) == POSENC_OK, "status");
                        EXPECT(run(&pd, dtype, 2, &two) == POSENC_OK, "status");
                        snprintf(what, sizeof what, "%s %s size#%zu shared=%d %s logits",
                                 configs[c].name, dt ? "f64" : "f32", s, shared,
                                 posenc_isa_name((posenc_isa)isa));
                        compare(what, one.out, base.out, logits, rtol, 0);
                        compare(what, two.out, one.out, logits, 0, 1);
                        for (int t = 0; t < 9; ++t) {
                            if (!base.grads[t])
                                continue;
                            snprintf(what, sizeof what, "%s %s size#%zu shared=%d %s d%s",
                                     configs[c].name, dt ? "f64" : "f32", s, shared,
                                     posenc_isa_name((posenc_isa)isa), grad_names[t]);
                            compare(what, one.grads[t], base.grads[t], base.grad_len[t], rtol, 0);
                            compare(what, two.grads[t], one.grads[t], base.grad_len[t], 0, 1);
                        }
                        free_result(&one);
                        free_result(&two);
                    }
                    free_result(&base);
                }
                release(&pd);
            }
        }
    }
    test_philox();
    test_attention();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
