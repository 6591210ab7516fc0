/*
 * harness.c -- the C tests' shared parts (harness.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "harness.h"

int failures, checks, quick;

int skip_size(size_t n, size_t m)
{
    return quick && n * m >= 10000;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

double urand(void)   /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

void for_each_kernels(void (*run)(const posenc_kernels *kern, posenc_isa isa, int f64, void *ctx),
                      void *ctx)
{
    const posenc_isa active = posenc_get_isa();
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (!posenc_isa_supported((posenc_isa)isa))
            continue;
        posenc_set_isa((posenc_isa)isa);
        for (int dt = 0; dt < 2; ++dt)
            run(posenc_active_kernels(dt ? POSENC_F64 : POSENC_F32), (posenc_isa)isa, dt, ctx);
    }
    posenc_set_isa(active);
}

const config configs[] = {
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
    {"reset-over-vectors", 1, 1, 1, 1, 0, 1, 0, 2},   /* the reset after the tiles' own terms */
    {"tupe@offset", 1, 1, 0, 0, 0, 1, 0, 2, 2},
    {"tupe-no-table", 1, 0, 0, 0, 0, 1, 0, 0},   /* theta alone reads G in phase 1 */
    {"tupe-no-table@offset", 1, 0, 0, 0, 0, 1, 0, 0, 3},
    {"everything@offset", 1, 1, 1, 1, 1, 1, 0, 2, 1},
    {"product-all", 0, 1, 1, 1, 0, 0, 1, 2},
    {"rope@offset", 0, 0, 0, 0, 0, 0, 0, 0, 4, 1},   /* default positions query_offset + i, j */
    {"rope-interleaved-partial-positions-xpos", 0, 0, 0, 0, 0, 0, 0, 0, 2, 2},
    /* grouped-query heads: the relative tables (q-side and k-side) and the rotation */
    {"deberta-like-mqa", 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 1},
    {"tupe-mqa@offset", 1, 1, 0, 0, 0, 1, 0, 2, 2, 0, 1},
    {"rope-mqa@offset", 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 1},
};

const size_t config_count = sizeof configs / sizeof configs[0];

double *fill(problem_data *pd, int slot, size_t len)
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

int64_t *make_map(int kind, size_t n, size_t m, size_t rows)
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

/* Tables of rotation angles (cos, sin of random angles, exactly representable in
 * float) for every position a call reaches, and for variant 2 given positions. */
static void build_rope(problem_data *pd, int variant)
{
    posenc_problem *p = &pd->p;
    const size_t P = (p->n + p->query_offset > p->m ? p->n + p->query_offset : p->m) + 3;
    const size_t pairs = variant == 2 && p->d >= 4 ? p->d / 2 - 1 : p->d / 2;
    const int slots[4] = {X_ROPE_COS, X_ROPE_SIN, X_ROPE_COS_K, X_ROPE_SIN_K};
    for (int t = 0; t < 4; ++t) {
        double *x = fill(pd, slots[t], P * pairs);
        for (size_t e = 0; e < P * pairs; ++e) {
            const double angle = 3.0 * (double)(float)urand() * (double)(e / pairs + 1);
            const double scale = variant == 2 && t >= 2 ? 0.9 : 1.0;   /* xPos: the keys' own */
            x[e] = (double)(float)(scale * (t % 2 ? sin(angle) : cos(angle)));
            if (variant == 1 && t >= 2)
                x[e] = pd->f64[slots[t - 2]][e];                         /* the same tables */
            pd->f32[slots[t]][e] = (float)x[e];
        }
    }
    p->rope_positions = P;
    p->rope_pairs = pairs;
    p->rope_interleaved = variant == 2;
    if (variant == 2) {
        pd->positions_q = malloc(sizeof(int64_t) * (p->B * p->n + 1));
        pd->positions_k = malloc(sizeof(int64_t) * (p->B * p->m + 1));
        for (size_t t = 0; t < p->B * p->n; ++t)
            pd->positions_q[t] = (int64_t)((urand() + 1.0) * 0.5 * (double)P) % (int64_t)P;
        for (size_t t = 0; t < p->B * p->m; ++t)
            pd->positions_k[t] = (int64_t)(t % p->m) + (int64_t)(t / p->m) % 2;
        p->positions_q = pd->positions_q;
        p->positions_k = pd->positions_k;
    }
}

void build(problem_data *pd, const config *c, size_t B, size_t H, size_t n, size_t m,
                  size_t d, int shared)
{
    memset(pd, 0, sizeof *pd);
    posenc_problem *p = &pd->p;
    const size_t Hp = shared ? 1 : H, rows = 7, dp = 3, S = 3;
    p->product = c->product;
    p->query_offset = c->query_offset;
    p->B = B; p->H = H; p->n = n; p->m = m; p->d = d;
    p->H_kv = c->mqa ? 1 : H;
    p->scale = 0.37;
    p->dense_scale = 0.8;
    p->vector_scale = c->product ? 1.0 : 0.37;
    fill(pd, X_Q, B * H * n * d);
    fill(pd, X_K, B * p->H_kv * m * d);
    fill(pd, X_G, B * H * n * m);
    if (c->dense) {   /* the dense module: pos_q maybe shared, pos_k per head (the dtype's) */
        fill(pd, X_PQ, Hp * n * dp);
        fill(pd, X_PK, H * m * dp);
        posenc_term_array *a = p->terms[POSENC_TERM_dense].array;
        a[0] = (posenc_term_array){pd->f64[X_PQ], 0, Hp == 1 ? 0 : n * dp, n * dp};
        a[1] = (posenc_term_array){pd->f64[X_PK], 0, m * dp, m * dp};
    }
    if (c->table) {   /* the toeplitz module: the table (the dtype's: `point`) and its map */
        const size_t offsets = n + m - 1;
        fill(pd, X_TABLE, Hp * rows);
        pd->maps[0] = make_map(c->map, n, m, rows);
        pd->toeplitz = malloc(sizeof(double) * (offsets + 1));
        for (size_t o = 0; o < offsets; ++o)
            pd->toeplitz[o] = (double)pd->maps[0][o];
        posenc_term_array *a = p->terms[POSENC_TERM_toeplitz].array;
        a[0] = (posenc_term_array){pd->f64[X_TABLE], 0, Hp == 1 ? 0 : rows, rows};
        a[1] = (posenc_term_array){pd->toeplitz, 0, 0, offsets};
    }
    for (int side = 0; side < 2; ++side) {   /* the vector tables (the dtype's: `point`) */
        const size_t heads = side ? H : Hp, offsets = n && m ? n + m - 1 : 0;
        if (!(side ? c->key_table : c->query_table))
            continue;
        fill(pd, side ? X_KEY_TABLE : X_QUERY_TABLE, heads * rows * d);
        pd->maps[1 + side] = make_map(side && c->map == 2 ? 0 : c->map, n, m, rows);
        posenc_term_array *a =
            p->terms[side ? POSENC_TERM_key_table : POSENC_TERM_query_table].array;
        a[0] = (posenc_term_array){pd->f64[side ? X_KEY_TABLE : X_QUERY_TABLE], 0,
                                   heads == 1 ? 0 : rows * d, rows * d};
        a[1] = (posenc_term_array){pd->maps[1 + side], 0, 0, offsets};   /* int64 */
    }
    if (c->segments) {   /* the segments module (csrc/terms.h): float64 whatever the dtype */
        fill(pd, X_SEGMENT_TABLE, Hp * S * S);
        pd->segment_q = malloc(sizeof(double) * (B * n + 1));
        pd->segment_k = malloc(sizeof(double) * (B * m + 1));
        for (size_t t = 0; t < B * n; ++t) pd->segment_q[t] = (double)((int64_t)((urand() + 1) * 1.5) % 3);
        for (size_t t = 0; t < B * m; ++t) pd->segment_k[t] = (double)((int64_t)(t * 3 / (B * m + 1)) % 3);
        posenc_term_array *a = p->terms[POSENC_TERM_segments].array;
        a[0] = (posenc_term_array){pd->f64[X_SEGMENT_TABLE], 0, Hp == 1 ? 0 : S * S, S * S};
        a[1] = (posenc_term_array){pd->segment_q, n, 0, n};
        a[2] = (posenc_term_array){pd->segment_k, m, 0, m};
    }
    if (c->theta)   /* the reset module: float64 whatever the dtype */
        p->terms[POSENC_TERM_reset].array[0] =
            (posenc_term_array){fill(pd, X_THETA, Hp * 2), 0, Hp == 1 ? 0 : 2, 2};
    if (c->rope)
        build_rope(pd, c->rope);
}

void point(problem_data *pd, posenc_dtype dtype)
{
    posenc_problem *p = &pd->p;
#define PTR(slot) (pd->len[slot] || pd->f64[slot] ? (dtype == POSENC_F32 ? (void *)pd->f32[slot] : (void *)pd->f64[slot]) : NULL)
    p->dtype = dtype;
    p->q = PTR(X_Q); p->k = PTR(X_K);
    p->rope_cos = PTR(X_ROPE_COS); p->rope_sin = PTR(X_ROPE_SIN);
    p->rope_cos_k = PTR(X_ROPE_COS_K); p->rope_sin_k = PTR(X_ROPE_SIN_K);
    posenc_term_array *table = &p->terms[POSENC_TERM_toeplitz].array[0];   /* `real`: terms.h */
    posenc_term_array *dense = p->terms[POSENC_TERM_dense].array;
    if (table->data)
        table->data = PTR(X_TABLE);
    for (int side = 0; side < 2; ++side) {
        posenc_term_array *v =
            &p->terms[side ? POSENC_TERM_key_table : POSENC_TERM_query_table].array[0];
        if (v->data)
            v->data = PTR(side ? X_KEY_TABLE : X_QUERY_TABLE);
    }
    if (dense[0].data) {
        dense[0].data = PTR(X_PQ);
        dense[1].data = PTR(X_PK);
    }
#undef PTR
}

void release(problem_data *pd)
{
    for (int t = 0; t < MAX_ARRAYS; ++t) { free(pd->f64[t]); free(pd->f32[t]); }
    for (int t = 0; t < 3; ++t) free(pd->maps[t]);
    free(pd->toeplitz);
    free(pd->segment_q);
    free(pd->segment_k);
    free(pd->positions_q);
    free(pd->positions_k);
}

/* x (d values) rotated at position pos by the tables of `side` (0 q, 1 k), in double. */
static void rotate(const problem_data *pd, double *y, const double *x, size_t pos, int side)
{
    const posenc_problem *p = &pd->p;
    const size_t pairs = p->rope_pairs, d = p->d;
    const double *c = pd->f64[side ? X_ROPE_COS_K : X_ROPE_COS] + pos * pairs;
    const double *s = pd->f64[side ? X_ROPE_SIN_K : X_ROPE_SIN] + pos * pairs;
    for (size_t l = 0; l < d; ++l)
        y[l] = x[l];
    for (size_t t = 0; t < pairs; ++t) {
        const size_t a = p->rope_interleaved ? 2 * t : t, b = p->rope_interleaved ? 2 * t + 1 : t + pairs;
        y[a] = x[a] * c[t] - x[b] * s[t];
        y[b] = x[b] * c[t] + x[a] * s[t];
    }
}

/* The factors of a product's logit (i, j) of unit (b, h) in double: s q.k, the query and the
 * key tables' terms (1 where absent). */
static void naive_factors(const problem_data *pd, size_t b, size_t h, size_t i, size_t j,
                          double *content, double *fq, double *fk)
{
    const posenc_problem *p = &pd->p;
    const size_t n = p->n, m = p->m, d = p->d, H = p->H;
    const double *q = pd->f64[X_Q] + ((b * H + h) * n + i) * d;
    const double *k = pd->f64[X_K] + ((b * p->H_kv + h / (H / p->H_kv)) * m + j) * d;
    const size_t o = j + n - 1 - i;
    double qk = 0;
    for (size_t l = 0; l < d; ++l) qk += q[l] * k[l];
    *content = p->scale * qk;
    *fq = *fk = 1;
    for (int side = 0; side < 2; ++side) {
        const posenc_term_array *v =
            &p->terms[side ? POSENC_TERM_key_table : POSENC_TERM_query_table].array[0];
        if (!v->data)
            continue;
        const double *a = pd->f64[side ? X_KEY_TABLE : X_QUERY_TABLE] + h * v->head_stride +
                          (size_t)pd->maps[1 + side][o] * d;
        double *f = side ? fk : fq;
        *f = 0;
        for (size_t l = 0; l < d; ++l) *f += (side ? k : q)[l] * a[l];
        *f *= p->vector_scale;
    }
}

/* The table's term of logit (i, j) of head h (0 without a table). */
static double naive_table(const problem_data *pd, size_t h, size_t i, size_t j)
{
    const posenc_term_array *a = &pd->p.terms[POSENC_TERM_toeplitz].array[0];
    return a->data ? pd->f64[X_TABLE][h * a->head_stride + (size_t)pd->maps[0][j + pd->p.n - 1 - i]]
                   : 0;
}

/* SPEC §3 written as loops, in double. */
double naive_logit(const problem_data *pd, size_t b, size_t h, size_t i, size_t j)
{
    const posenc_problem *p = &pd->p;
    const size_t n = p->n, m = p->m, d = p->d, H = p->H;
    const double *q = pd->f64[X_Q] + ((b * H + h) * n + i) * d;
    const size_t kv = h / (H / p->H_kv);   /* the query head's key head */
    const double *k = pd->f64[X_K] + ((b * p->H_kv + kv) * m + j) * d;
    double qk = 0;
    if (p->rope_cos) {   /* SPEC 3.12: the rotated q_i . k_j (content only beside it) */
        double *qr = malloc(sizeof(double) * (d + 1)), *kr = malloc(sizeof(double) * (d + 1));
        rotate(pd, qr, q, p->positions_q ? (size_t)p->positions_q[b * n + i] : p->query_offset + i, 0);
        rotate(pd, kr, k, p->positions_k ? (size_t)p->positions_k[b * m + j] : j, 1);
        for (size_t l = 0; l < d; ++l) qk += qr[l] * kr[l];
        free(qr);
        free(kr);
        return p->scale * qk;
    }
    double content, fq, fk;
    naive_factors(pd, b, h, i, j, &content, &fq, &fk);
    const int table = posenc_term_present(p, POSENC_TERM_toeplitz);
    const double t = naive_table(pd, h, i, j);
    if (p->product) {
        double value = content;
        if (table) value *= t;
        if (posenc_term_present(p, POSENC_TERM_query_table)) value *= fq;
        if (posenc_term_present(p, POSENC_TERM_key_table)) value *= fk;
        return value;
    }
    double pos = (posenc_term_present(p, POSENC_TERM_query_table) ? fq : 0) +
                 (posenc_term_present(p, POSENC_TERM_key_table) ? fk : 0) + t;
    if (posenc_term_present(p, POSENC_TERM_dense)) {
        const posenc_term_array *a = p->terms[POSENC_TERM_dense].array;
        const size_t dp = a[1].per_unit / m;
        const double *pq = pd->f64[X_PQ] + h * a[0].head_stride + i * dp;
        const double *pk = pd->f64[X_PK] + h * a[1].head_stride + j * dp;
        double dot = 0;
        for (size_t l = 0; l < dp; ++l) dot += pq[l] * pk[l];
        pos += p->dense_scale * dot;
    }
    if (pd->segment_q) {
        const posenc_term_array *a = p->terms[POSENC_TERM_segments].array;
        const size_t S = (size_t)sqrt((double)a[0].per_unit);
        pos += pd->f64[X_SEGMENT_TABLE][h * a[0].head_stride + (size_t)pd->segment_q[b * n + i] * S +
                                        (size_t)pd->segment_k[b * m + j]];
    }
    if (posenc_term_present(p, POSENC_TERM_reset)) {
        const double *theta = pd->f64[X_THETA] + h * p->terms[POSENC_TERM_reset].array[0].head_stride;
        if (p->query_offset + i == 0) pos = theta[0];
        else if (j == 0) pos = theta[1];
    }
    return content + pos;
}

void naive_module_grad(const problem_data *pd, int t, double *grad)
{
    const posenc_problem *p = &pd->p;
    const size_t n = p->n, m = p->m, L = p->terms[grad_module(t)].array[grad_array(t)].per_unit;
    const size_t S = (size_t)sqrt((double)L);
    const posenc_term_array *dense = p->terms[POSENC_TERM_dense].array;
    const size_t dp = dense[0].data && m ? dense[1].per_unit / m : 0;
    const int reset = posenc_term_present(p, POSENC_TERM_reset);
    memset(grad, 0, sizeof(double) * p->H * L);
    for (size_t b = 0; b < p->B; ++b)
        for (size_t h = 0; h < p->H; ++h)
            for (size_t i = 0; i < n; ++i)
                for (size_t j = 0; j < m; ++j) {
                    const double g = pd->f64[X_G][((b * p->H + h) * n + i) * m + j];
                    const int cls = p->query_offset + i == 0;
                    if (t == GRAD_THETA && (cls || j == 0)) {
                        grad[2 * h + (cls ? 0 : 1)] += g;
                    } else if (t == GRAD_TABLE && !(reset && (cls || j == 0))) {
                        double content = 1, fq = 1, fk = 1;
                        if (p->product)
                            naive_factors(pd, b, h, i, j, &content, &fq, &fk);
                        grad[h * L + (size_t)pd->maps[0][j + n - 1 - i]] += g * content * fq * fk;
                    }
                    else if ((t == GRAD_QUERY_TABLE || t == GRAD_KEY_TABLE) &&
                             !(reset && (cls || j == 0))) {
                        const int side = t == GRAD_KEY_TABLE;
                        const size_t kv = h / (p->H / p->H_kv), d = p->d;
                        const double *x = side ? pd->f64[X_K] + ((b * p->H_kv + kv) * m + j) * d
                                               : pd->f64[X_Q] + ((b * p->H + h) * n + i) * d;
                        double content = 1, fq = 1, fk = 1, other = 1;
                        if (p->product) {
                            naive_factors(pd, b, h, i, j, &content, &fq, &fk);
                            other = content * (side ? fq : fk) *
                                    (posenc_term_present(p, POSENC_TERM_toeplitz)
                                         ? naive_table(pd, h, i, j) : 1);
                        }
                        double *row = grad + h * L + (size_t)pd->maps[1 + side][j + n - 1 - i] * d;
                        for (size_t l = 0; l < d; ++l)
                            row[l] += g * other * p->vector_scale * x[l];
                    }
                    else if (t == GRAD_SEGMENTS && !(reset && (cls || j == 0)))
                        grad[h * L + (size_t)pd->segment_q[b * n + i] * S +
                             (size_t)pd->segment_k[b * m + j]] += g;
                    else if ((t == GRAD_PQ || t == GRAD_PK) && !(reset && (cls || j == 0))) {
                        const double *pq = pd->f64[X_PQ] + h * dense[0].head_stride + i * dp;
                        const double *pk = pd->f64[X_PK] + h * dense[1].head_stride + j * dp;
                        for (size_t l = 0; l < dp; ++l)
                            grad[h * L + (t == GRAD_PQ ? i : j) * dp + l] +=
                                g * p->dense_scale * (t == GRAD_PQ ? pk[l] : pq[l]);
                    }
                }
}

double *widen(const void *src, size_t len, posenc_dtype dtype)
{
    double *dst = malloc(sizeof(double) * (len ? len : 1));
    for (size_t t = 0; t < len; ++t)
        dst[t] = dtype == POSENC_F32 ? (double)((const float *)src)[t] : ((const double *)src)[t];
    return dst;
}

double max_abs(const double *x, size_t len)
{
    double v = 0;
    for (size_t t = 0; t < len; ++t) v = fmax(v, fabs(x[t]));
    return v;
}

void compare_above(const char *what, const double *a, const double *b, size_t len,
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
void compare(const char *what, const double *a, const double *b, size_t len, double rtol,
                    int bitwise)
{
    compare_above(what, a, b, len, rtol, bitwise, 1e-30);
}


const char *const grad_names[GRAD_COUNT] = {"q", "k", "pos_q", "pos_k", "table", "query_table",
                                            "key_table", "segments table", "theta"};

const void *grad_input(const problem_data *pd, int t)
{
    const posenc_problem *p = &pd->p;
    const void *inputs[GRAD_COUNT] = {p->q, p->k, p->terms[POSENC_TERM_dense].array[0].data,
                                      p->terms[POSENC_TERM_dense].array[1].data,
                                      p->terms[POSENC_TERM_toeplitz].array[0].data,
                                      p->terms[POSENC_TERM_query_table].array[0].data,
                                      p->terms[POSENC_TERM_key_table].array[0].data,
                                      p->terms[POSENC_TERM_segments].array[0].data,
                                      p->terms[POSENC_TERM_reset].array[0].data};
    return inputs[t];
}

size_t grad_len(const problem_data *pd, int t)
{
    static const int slots[GRAD_COUNT] = {X_Q, X_K, X_PQ, X_PK, X_TABLE, X_QUERY_TABLE,
                                          X_KEY_TABLE, X_SEGMENT_TABLE, X_THETA};
    const posenc_problem *p = &pd->p;
    if (grad_module(t) >= 0)
        return p->B * p->H * p->terms[grad_module(t)].array[grad_array(t)].per_unit;
    return pd->len[slots[t]];
}

int grad_module(int t)
{
    return t == GRAD_TABLE                  ? POSENC_TERM_toeplitz
           : t == GRAD_QUERY_TABLE          ? POSENC_TERM_query_table
           : t == GRAD_KEY_TABLE            ? POSENC_TERM_key_table
           : t == GRAD_SEGMENTS             ? POSENC_TERM_segments
           : t == GRAD_THETA                ? POSENC_TERM_reset
           : t == GRAD_PQ || t == GRAD_PK   ? POSENC_TERM_dense
                                            : -1;
}

int grad_array(int t)
{
    return t == GRAD_PK ? 1 : 0;
}

size_t grad_written_len(const problem_data *pd, int t)
{
    const size_t len = grad_len(pd, t);
    return grad_module(t) >= 0 && posenc_term_summed(grad_module(t)) && pd->p.B ? len / pd->p.B
                                                                              : len;
}

size_t grad_size(int t, size_t es)
{
    return grad_module(t) >= 0 ? sizeof(double) : es;
}

posenc_grads grads_of(void *const g[GRAD_COUNT])
{
    posenc_grads grads = {g[0], g[1]};
    grads.terms[POSENC_TERM_query_table][0] = g[GRAD_QUERY_TABLE];
    grads.terms[POSENC_TERM_key_table][0] = g[GRAD_KEY_TABLE];
    grads.terms[POSENC_TERM_dense][0] = g[GRAD_PQ];
    grads.terms[POSENC_TERM_dense][1] = g[GRAD_PK];
    grads.terms[POSENC_TERM_toeplitz][0] = g[GRAD_TABLE];
    grads.terms[POSENC_TERM_segments][0] = g[GRAD_SEGMENTS];
    grads.terms[POSENC_TERM_reset][0] = g[GRAD_THETA];
    return grads;
}

double *widen_grad(const void *g, size_t len, int t, posenc_dtype dtype)
{
    return widen(g, len, grad_module(t) >= 0 ? POSENC_F64 : dtype);
}
