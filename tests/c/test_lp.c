/*
 * test_lp.c -- the bfloat16 and float16 engine (engine_lp.c) against its
 * definition: every result is narrow(float32 engine(widen(inputs))) bit for
 * bit, on every ISA, for logits, their gradients and the fused attention
 * (lse float32, equal to the float32 engine's), and 1 and 2 threads give
 * the same bits; the float32 engine of bfloat16 runs with bf16_gemm, as
 * engine_lp.c runs it (its GEMMs on vdpbf16ps where the CPU has them).  Two
 * exceptions: the parameter gradients of a backward (logits or attention)
 * larger than one chunk (sums of the chunks'), checked within rounding, and the
 * bfloat16 content logits that design (b) serves (test_bf16dot.c checks its
 * values), which must be its bits.  Where the bfloat16 GEMM runs, its
 * float32 results are checked near the float32 engine's without it (a
 * coarse check; the bound of docs/validation.md is the Python tests').
 * Built with a small POSENC_LP_CHUNK_BYTES (run.sh), so the forward's
 * chunks of batch rows and of heads both run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/bf16dot.h"
#include "harness.h"

static const int input_slots[] = {X_Q, X_K, X_ROPE_COS, X_ROPE_SIN, X_ROPE_COS_K, X_ROPE_SIN_K};
#define INPUTS 6
#define GRADS 2   /* the first GRADS inputs have gradients (posenc_grads' fields, grad_names'
                     entries grad_of[t]); the rest are constants.  The term modules' (float64
                     per unit in both problems: harness.h's GRAD_PQ, GRAD_PK, GRAD_TABLE,
                     GRAD_QUERY_TABLE, GRAD_KEY_TABLE, GRAD_SEGMENTS, GRAD_THETA) aside. */
static const int grad_of[GRADS] = {0, 1};
static const int module_grads[] = {GRAD_PQ, GRAD_PK, GRAD_TABLE, GRAD_QUERY_TABLE, GRAD_KEY_TABLE,
                                   GRAD_SEGMENTS, GRAD_THETA};
#define MODULE_GRADS 7

/* One problem's arrays in a 16-bit dtype and their exact float32 widening. */
typedef struct {
    uint16_t *lp[X_COUNT];
    float *wide[X_COUNT];
    posenc_problem p_lp, p_wide;
} lp_data;

static void narrow_row(posenc_dtype dt, uint16_t *dst, const float *src, size_t len)
{
    (dt == POSENC_BF16 ? posenc_convert_scalar.f32_to_bf16 : posenc_convert_scalar.f32_to_f16)(
        dst, src, len);
}

static void widen_row(posenc_dtype dt, float *dst, const uint16_t *src, size_t len)
{
    (dt == POSENC_BF16 ? posenc_convert_scalar.bf16_to_f32 : posenc_convert_scalar.f16_to_f32)(
        dst, src, len);
}

static void lp_make(lp_data *x, problem_data *pd, posenc_dtype dt)
{
    point(pd, POSENC_F32);
    for (int s = 0; s < X_COUNT; ++s) {
        x->lp[s] = NULL;
        x->wide[s] = NULL;
        if (!pd->f64[s])
            continue;
        const size_t len = pd->len[s];
        x->lp[s] = malloc(sizeof(uint16_t) * (len + 1));
        x->wide[s] = malloc(sizeof(float) * (len + 1));
        narrow_row(dt, x->lp[s], pd->f32[s], len);
        widen_row(dt, x->wide[s], x->lp[s], len);
    }
    x->p_lp = x->p_wide = pd->p;
    x->p_lp.dtype = dt;
    x->p_wide.bf16_gemm = dt == POSENC_BF16;
    const void **lp_at[INPUTS] = {&x->p_lp.q, &x->p_lp.k, &x->p_lp.rope_cos,
                                  &x->p_lp.rope_sin, &x->p_lp.rope_cos_k, &x->p_lp.rope_sin_k};
    const void **wide_at[INPUTS] = {&x->p_wide.q, &x->p_wide.k, &x->p_wide.rope_cos,
                                    &x->p_wide.rope_sin, &x->p_wide.rope_cos_k,
                                    &x->p_wide.rope_sin_k};
    for (int t = 0; t < INPUTS; ++t) {
        *lp_at[t] = *lp_at[t] ? x->lp[input_slots[t]] : NULL;
        *wide_at[t] = *wide_at[t] ? x->wide[input_slots[t]] : NULL;
    }
    /* the dense module's arrays, float32 in both (`real`: terms.h), of the 16-bit values
     * (as the binding widens a 16-bit caller's) */
    for (int a = 0; a < 2 && x->p_lp.terms[POSENC_TERM_dense].array[0].data; ++a) {
        x->p_lp.terms[POSENC_TERM_dense].array[a].data = x->wide[a ? X_PK : X_PQ];
        x->p_wide.terms[POSENC_TERM_dense].array[a].data = x->wide[a ? X_PK : X_PQ];
    }
    /* the vector tables' likewise */
    for (int side = 0; side < 2; ++side) {
        const int k = side ? POSENC_TERM_key_table : POSENC_TERM_query_table;
        if (x->p_lp.terms[k].array[0].data)
            x->p_lp.terms[k].array[0].data = x->p_wide.terms[k].array[0].data =
                x->wide[side ? X_KEY_TABLE : X_QUERY_TABLE];
    }
}

static void lp_free(lp_data *x)
{
    for (int s = 0; s < X_COUNT; ++s) {
        free(x->lp[s]);
        free(x->wide[s]);
    }
}

/* got (16-bit) == narrow(want (float32)), bit for bit */
static void expect_narrowed(const char *what, posenc_dtype dt, const uint16_t *got,
                            const float *want, size_t len)
{
    uint16_t *n = malloc(sizeof(uint16_t) * (len + 1));
    narrow_row(dt, n, want, len);
    size_t bad = len;
    for (size_t t = 0; t < len && bad == len; ++t)
        if (got[t] != n[t])
            bad = t;
    EXPECT(bad == len, "%s: element %zu is 0x%04x, narrow(float32) 0x%04x", what, bad,
           bad < len ? got[bad] : 0, bad < len ? n[bad] : 0);
    free(n);
}

/* Gradient buffers for the wanted inputs (every present one), 16-bit and float32. */
typedef struct {
    uint16_t *lp[GRADS];
    float *wide[GRADS];
    double *mod_lp[MODULE_GRADS], *mod_wide[MODULE_GRADS];   /* module_grads', or NULL */
    size_t mod_len[MODULE_GRADS];
    posenc_grads g_lp, g_wide;
} lp_grads;

static void grads_make(lp_grads *g, const problem_data *pd, const lp_data *x)
{
    for (int t = 0; t < GRADS; ++t) {
        const int s = input_slots[t];
        const size_t len = x->lp[s] ? pd->len[s] : 0;
        g->lp[t] = x->lp[s] ? calloc(len + 1, sizeof(uint16_t)) : NULL;
        g->wide[t] = x->lp[s] ? calloc(len + 1, sizeof(float)) : NULL;
    }
    g->g_lp = (posenc_grads){g->lp[0], g->lp[1]};
    g->g_wide = (posenc_grads){g->wide[0], g->wide[1]};
    for (int e = 0; e < MODULE_GRADS; ++e) {
        const int t = module_grads[e], given = grad_input(pd, t) != NULL;
        g->mod_len[e] = given ? grad_len(pd, t) : 0;
        g->mod_lp[e] = given ? calloc(g->mod_len[e] + 1, sizeof(double)) : NULL;
        g->mod_wide[e] = given ? calloc(g->mod_len[e] + 1, sizeof(double)) : NULL;
        g->g_lp.terms[grad_module(t)][grad_array(t)] = g->mod_lp[e];
        g->g_wide.terms[grad_module(t)][grad_array(t)] = g->mod_wide[e];
    }
}

/* The float32 results of the bfloat16 GEMM (got) near the float32 engine's
 * (want): |got - want| <= 2^-6 max(1, max |want|), operands rounded once
 * (2^-9) with room for the sums; NaN where want has NaN. */
static void expect_bf16_gemm_near(const char *what, const float *got, const float *want,
                                  size_t len)
{
    double scale = 1;
    for (size_t t = 0; t < len; ++t)
        scale = isfinite(want[t]) ? fmax(scale, fabs(want[t])) : scale;
    size_t bad = len;
    for (size_t t = 0; t < len && bad == len; ++t)
        if (!(fabs((double)got[t] - want[t]) <= 0x1p-6 * scale ||
              (isnan(got[t]) && isnan(want[t])) || got[t] == want[t]))
            bad = t;
    EXPECT(bad == len, "%s (bfloat16 GEMM): element %zu is %g, float32 %g", what, bad,
           bad < len ? got[bad] : 0.0, bad < len ? want[bad] : 0.0);
}

/* dq and dk (and the attention's every gradient) bit for bit; the logits
 * backward's parameter gradients too when `exact` (one chunk), else (sums
 * over the chunks) within rounding */
static void grads_expect(const char *what, posenc_dtype dt, const lp_grads *g,
                         const problem_data *pd, int exact)
{
    for (int t = 0; t < GRADS; ++t) {
        if (!g->lp[t])
            continue;
        char name[300];
        snprintf(name, sizeof name, "%s d%s", what, grad_names[grad_of[t]]);
        expect_narrowed(name, dt, g->lp[t], g->wide[t], pd->len[input_slots[t]]);
    }
    for (int e = 0; e < MODULE_GRADS; ++e)
        if (g->mod_lp[e]) {   /* float32 sums in both problems: the same bits in one chunk; batch
                               * row 0's, the sum over the batch (posenc_grads); the dense
                               * factor's where the bfloat16 GEMM runs within 2^-6 of the
                               * largest (it rounds GEMM operands that are the chunk's own
                               * sums, of G over batch rows) */
            char name[300];
            const int t = module_grads[e];
            const int gemm = !exact && dt == POSENC_BF16 && posenc_bf16_gemm_kernels() &&
                             (t == GRAD_PQ || t == GRAD_PK);
            snprintf(name, sizeof name, "%s d%s", what, grad_names[t]);
            compare_above(name, g->mod_lp[e], g->mod_wide[e],
                          pd->p.B ? g->mod_len[e] / pd->p.B : 0, gemm ? 0x1p-6 : exact ? 0 : 1e-6,
                          exact, gemm ? 1.0 : 1e-30);
        }
}

static void grads_free(lp_grads *g)
{
    for (int t = 0; t < GRADS; ++t) {
        free(g->lp[t]);
        free(g->wide[t]);
    }
    for (int e = 0; e < MODULE_GRADS; ++e) {
        free(g->mod_lp[e]);
        free(g->mod_wide[e]);
    }
}

static void check_logits(const char *what, posenc_dtype dt, problem_data *pd, lp_data *x,
                         int threads)
{
    const posenc_problem *p = &pd->p;
    const size_t len = p->B * p->H * p->n * p->m;
    uint16_t *out = malloc(sizeof(uint16_t) * (len + 1));
    float *want = malloc(sizeof(float) * (len + 1));
    EXPECT(posenc_forward(&x->p_lp, out, threads) == POSENC_OK, "%s forward status", what);
    EXPECT(posenc_forward(&x->p_wide, want, threads) == POSENC_OK, "%s f32 forward", what);
    uint16_t *fast = malloc(sizeof(uint16_t) * (len + 1));
    if (posenc_bf16_content_forward(&x->p_lp, fast, threads) >= 0)   /* design (b) serves it */
        EXPECT(memcmp(out, fast, sizeof(uint16_t) * len) == 0, "%s: the vdpbf16ps path's", what);
    else
        expect_narrowed(what, dt, out, want, len);
    free(fast);
    lp_grads g;
    grads_make(&g, pd, x);
    EXPECT(posenc_backward(&x->p_lp, x->lp[X_G], &g.g_lp, threads) == POSENC_OK,
           "%s backward status", what);
    EXPECT(posenc_backward(&x->p_wide, x->wide[X_G], &g.g_wide, threads) == POSENC_OK,
           "%s f32 backward", what);
    /* the backward runs in chunks of POSENC_LP_CHUNK_BYTES of float32 G (engine_lp.c) */
    grads_expect(what, dt, &g, pd, len * sizeof(float) <= POSENC_LP_CHUNK_BYTES);
    grads_free(&g);
    free(out);
    free(want);
}

static void check_attention(const char *what, posenc_dtype dt, problem_data *pd, lp_data *x,
                            const posenc_attention *a, int threads)
{
    const posenc_problem *p = &pd->p;
    const size_t n_out = p->B * p->H * p->n * a->dv, n_lse = p->B * p->H * p->n;
    const size_t n_v = p->B * p->H_kv * p->m * a->dv;
    posenc_attention a_lp = *a, a_wide = *a;
    a_lp.v = x->lp[X_V];
    a_wide.v = x->wide[X_V];
    uint16_t *out = malloc(sizeof(uint16_t) * (n_out + 1));
    uint16_t *grad_v = malloc(sizeof(uint16_t) * (n_v + 1));
    float *want_out = malloc(sizeof(float) * (n_out + 1));
    float *want_grad_v = malloc(sizeof(float) * (n_v + 1));
    float *lse = malloc(sizeof(float) * (n_lse + 1)), *want_lse = malloc(sizeof(float) * (n_lse + 1));
    EXPECT(posenc_attention_forward(&x->p_lp, &a_lp, out, lse, threads) == POSENC_OK,
           "%s attention status", what);
    EXPECT(posenc_attention_forward(&x->p_wide, &a_wide, want_out, want_lse, threads) == POSENC_OK,
           "%s f32 attention", what);
    expect_narrowed(what, dt, out, want_out, n_out);
    EXPECT(memcmp(lse, want_lse, sizeof(float) * n_lse) == 0, "%s lse (float32) bitwise", what);
    /* the backward from the 16-bit out, as a caller has it; the float32
     * engine gets its widening */
    widen_row(dt, want_out, out, n_out);
    lp_grads g;
    grads_make(&g, pd, x);
    double sinks_lp[8] = {0}, sinks_wide[8] = {0};   /* H <= 8 here */
    a_lp.grad_sinks = a->sinks ? sinks_lp : NULL;
    a_wide.grad_sinks = a->sinks ? sinks_wide : NULL;
    EXPECT(posenc_attention_backward(&x->p_lp, &a_lp, x->lp[X_D_OUT], out, lse, &g.g_lp, grad_v,
                                     threads) == POSENC_OK,
           "%s attention backward status", what);
    EXPECT(posenc_attention_backward(&x->p_wide, &a_wide, x->wide[X_D_OUT], want_out, want_lse,
                                     &g.g_wide, want_grad_v, threads) == POSENC_OK,
           "%s f32 attention backward", what);
    char name[300];
    snprintf(name, sizeof name, "%s dv", what);
    expect_narrowed(name, dt, grad_v, want_grad_v, n_v);
    /* parameters' gradients: sums over the chunks (engine_lp.c), of units here: one unit is one
     * chunk (the float32 engine's bits), more may be several (equal to rounding) */
    grads_expect(what, dt, &g, pd, p->B * p->H == 1);
    for (size_t h = 0; a->sinks && h < p->H; ++h)   /* chunks' sums in order: equal to rounding */
        EXPECT(fabs(sinks_lp[h] - sinks_wide[h]) <= 1e-9 * (1 + fabs(sinks_wide[h])),
               "%s dsinks[%zu] %.17g vs %.17g", what, h, sinks_lp[h], sinks_wide[h]);
    grads_free(&g);
    free(out); free(grad_v); free(want_out); free(want_grad_v); free(lse); free(want_lse);
}

/* Where the bfloat16 GEMM runs: the float32 engine with bf16_gemm (as the
 * bfloat16 engine runs it) near the same engine without, for the logits,
 * their gradients and the attention with its gradients. */
static void check_bf16_gemm(const char *what, problem_data *pd, lp_data *x,
                            const posenc_attention *a, int threads)
{
    if (!posenc_bf16_gemm_kernels())
        return;
    const posenc_problem *p = &pd->p;
    const size_t len = p->B * p->H * p->n * p->m, n_out = p->B * p->H * p->n * a->dv;
    const size_t n_v = p->B * p->H_kv * p->m * a->dv, n_lse = p->B * p->H * p->n;
    posenc_problem run[2] = {x->p_wide, x->p_wide};
    run[1].bf16_gemm = 0;
    posenc_attention att = *a;
    att.v = x->wide[X_V];
    float *logits[2], *out[2], *lse[2], *grad_v[2];
    lp_grads g[2];
    for (int k = 0; k < 2; ++k) {
        logits[k] = malloc(sizeof(float) * (len + 1));
        out[k] = malloc(sizeof(float) * (n_out + 1));
        lse[k] = malloc(sizeof(float) * (n_lse + 1));
        grad_v[k] = malloc(sizeof(float) * (n_v + 1));
        grads_make(&g[k], pd, x);
        EXPECT(posenc_forward(&run[k], logits[k], threads) == POSENC_OK, "%s forward", what);
        EXPECT(posenc_attention_forward(&run[k], &att, out[k], lse[k], threads) == POSENC_OK,
               "%s attention", what);
    }
    expect_bf16_gemm_near(what, logits[0], logits[1], len);
    expect_bf16_gemm_near(what, out[0], out[1], n_out);
    expect_bf16_gemm_near(what, lse[0], lse[1], n_lse);
    for (int pass = 0; pass < 2; ++pass) {   /* the logits' backward, then the attention's */
        for (int k = 0; k < 2; ++k)          /* both from the same out and lse */
            EXPECT((pass ? posenc_attention_backward(&run[k], &att, x->wide[X_D_OUT], out[1],
                                                     lse[1], &g[k].g_wide, grad_v[k], threads)
                         : posenc_backward(&run[k], x->wide[X_G], &g[k].g_wide, threads)) ==
                       POSENC_OK, "%s backward", what);
        for (int t = 0; t < GRADS; ++t)
            if (g[0].wide[t]) {
                char name[300];
                snprintf(name, sizeof name, "%s %s d%s", what, pass ? "attention" : "logits",
                         grad_names[grad_of[t]]);
                expect_bf16_gemm_near(name, g[0].wide[t], g[1].wide[t], pd->len[input_slots[t]]);
            }
        for (int e = 0; e < MODULE_GRADS; ++e)
            if (g[0].mod_wide[e]) {
                char name[300];
                snprintf(name, sizeof name, "%s %s d%s (bfloat16 GEMM)", what,
                         pass ? "attention" : "logits", grad_names[module_grads[e]]);
                compare_above(name, g[0].mod_wide[e], g[1].mod_wide[e], g[0].mod_len[e], 0x1p-6,
                              0, 1.0);
            }
    }
    expect_bf16_gemm_near(what, grad_v[0], grad_v[1], n_v);
    for (int k = 0; k < 2; ++k) {
        free(logits[k]); free(out[k]); free(lse[k]); free(grad_v[k]);
        grads_free(&g[k]);
    }
}

void test_lp(void)
{
    const size_t sizes[][6] = {{1, 1, 1, 1, 1, 1}, {2, 3, 7, 5, 3, 4}, {3, 2, 17, 33, 9, 3},
                               {2, 1, 33, 17, 16, 16}, {2, 2, 70, 64, 16, 0}};
    const posenc_dtype dtypes[2] = {POSENC_BF16, POSENC_F16};
    for (size_t c = 0; c < config_count; ++c)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            const size_t *z = sizes[s], dv = z[5];
            if (quick && (c + s) % 2)
                continue;
            problem_data pd;
            build(&pd, &configs[c], z[0], z[1], z[2], z[3], z[4], (int)(c + s) % 2);
            fill(&pd, X_V, z[0] * pd.p.H_kv * z[3] * dv);
            fill(&pd, X_D_OUT, z[0] * z[1] * z[2] * dv);
            uint8_t *mask = malloc(z[0] * z[3] + 1);
            for (size_t t = 0; t < z[0] * z[3]; ++t)   /* batch row 1 all padding */
                mask[t] = (uint8_t)(t / z[3] == 1 || (t % z[3]) * 3 >= 2 * z[3]);
            posenc_attention a = {NULL, dv, (c + s) % 2 ? mask : NULL, (int)(c % 2),
                                  s == 2 ? 0.25 : 0.0, 0x5eed0000ull + s};
            /* SPEC §7 on two sizes: a window and documents (ids in runs of 3, query i at
             * position query_offset + i), a softcap and sinks */
            int64_t *doc_q = malloc(sizeof(int64_t) * (z[0] * z[2] + 1));
            int64_t *doc_k = malloc(sizeof(int64_t) * (z[0] * z[3] + 1));
            for (size_t t = 0; t < z[0] * z[2]; ++t)
                doc_q[t] = (int64_t)((pd.p.query_offset + t % z[2]) / 3);
            for (size_t t = 0; t < z[0] * z[3]; ++t)
                doc_k[t] = (int64_t)(t % z[3] / 3);
            const double sinks[8] = {-1.0, 0.5, 2.0, -0.25, 1.0, 0.0, -2.0, 0.75};
            if (s == 1 || s == 3) {
                a.window = 1;
                a.window_left = s == 1 ? 2 : POSENC_UNBOUNDED;
                a.window_right = 1;
                a.document_q = s == 3 ? doc_q : NULL;
                a.document_k = s == 3 ? doc_k : NULL;
                a.softcap = 1.25;
                a.sinks = sinks;
            }
            for (int k = 0; k < 2; ++k) {
                lp_data x;
                lp_make(&x, &pd, dtypes[k]);
                for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
                    if (!posenc_isa_supported((posenc_isa)isa))
                        continue;
                    posenc_set_isa((posenc_isa)isa);
                    for (int threads = 1; threads <= 2; ++threads) {
                        char what[256];
                        snprintf(what, sizeof what, "lp %s %s size#%zu %s %d thread(s)",
                                 configs[c].name, k ? "f16" : "bf16", s,
                                 posenc_isa_name((posenc_isa)isa), threads);
                        check_logits(what, dtypes[k], &pd, &x, threads);
                        check_attention(what, dtypes[k], &pd, &x, &a, threads);
                        if (dtypes[k] == POSENC_BF16)
                            check_bf16_gemm(what, &pd, &x, &a, threads);
                    }
                }
                lp_free(&x);
            }
            free(mask);
            free(doc_q);
            free(doc_k);
            release(&pd);
        }
}
