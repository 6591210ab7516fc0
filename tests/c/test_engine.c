/*
 * test_engine.c -- the C engine without Python: every term kind, sum and
 * product mode, float and double, odd sizes, on every ISA this CPU supports.
 *
 *   1. The forward of the scalar ISA equals a naive double-precision loop
 *      written from docs/spec.md's formulas (maps here are synthetic: clipped,
 *      reversed clipped, irregular random), so the engine is checked on its
 *      own, including on AArch64 under qemu where Python is not used.
 *   2. Every other ISA (avx2, avx512 or neon) equals the scalar ISA, forward
 *      and every backward output, within a dtype tolerance.
 *   3. 1 and 2 threads give bitwise identical results.
 *   One table on both sides (M4, M4M) gives one gradient: the two sides' sum.
 *   4. Philox-4x32-10 gives Random123's known answers.
 *   5. The fused attention (SPEC §6): on the scalar ISA in double, out, lse
 *      and dv equal naive loops over the naive logits (mask, softmax, the
 *      dropout's keep decisions, matmuls), and every other gradient equals
 *      the logits' backward (checked by 1-3) of the naive dS; every ISA and
 *      dtype equals it within a tolerance, 1 and 2 threads bitwise.
 *   6. The conversions between float and bfloat16 / float16 (test_convert.c):
 *      the scalar ones against the formats' definitions, every ISA's bit for
 *      bit against the scalar ones.
 *   7. The bfloat16 / float16 engine (test_lp.c): every result is the
 *      float32 engine's on the widened inputs, narrowed once, bit for bit.
 *   8. The B panels of every ISA (pack_rows, pack_cols, either width) are
 *      their definitions bit for bit: alpha x, zeros past the columns.
 *      (1 and 2 check them only within a tolerance.)
 *   9. The vector tables' tile gathers and scatter of every ISA are their
 *      definitions bit for bit (blocked forms and fallbacks).
 *
 * Build and run: tests/c/run.sh (native, cross to aarch64 + qemu, valgrind).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    double *out;
    double *grads[GRAD_COUNT];
    size_t grad_len[GRAD_COUNT];
} result;

/* Forward and backward of pd's problem; with shared_table, the query- and
 * key-side tables' gradients are one buffer (returned in grads[GRAD_QUERY_TABLE]). */
static int run_with(problem_data *pd, posenc_dtype dtype, int threads, result *r, int shared_table)
{
    const posenc_problem *p = &pd->p;
    const size_t es = dtype == POSENC_F32 ? sizeof(float) : sizeof(double);
    const size_t logits = p->B * p->H * p->n * p->m;
    void *out = malloc(es * (logits ? logits : 1));
    size_t lens[GRAD_COUNT];
    void *g[GRAD_COUNT];
    for (int t = 0; t < GRAD_COUNT; ++t) {
        lens[t] = grad_len(pd, t);
        g[t] = grad_input(pd, t) ? malloc(grad_size(t, es) * (lens[t] ? lens[t] : 1)) : NULL;
    }
    if (shared_table) {
        free(g[GRAD_KEY_TABLE]);
        g[GRAD_KEY_TABLE] = g[GRAD_QUERY_TABLE];
    }
    posenc_grads grads = grads_of(g);
    const void *G = dtype == POSENC_F32 ? (const void *)pd->f32[X_G] : (const void *)pd->f64[X_G];
    const char *why = NULL;
    int status = posenc_validate(p, &why);   /* the engine trusts a validated problem */
    EXPECT(status == POSENC_OK, "invalid problem: %s", why ? why : "");
    if (status == POSENC_OK)
        status = posenc_forward(p, out, threads);
    if (status == POSENC_OK)
        status = posenc_backward(p, G, &grads, threads);
    r->out = widen(out, logits, dtype);
    if (shared_table)
        g[GRAD_KEY_TABLE] = NULL;
    for (int t = 0; t < GRAD_COUNT; ++t) {
        r->grad_len[t] = g[t] ? lens[t] : 0;
        r->grads[t] = g[t] ? widen_grad(g[t], lens[t], t, dtype) : NULL;
        free(g[t]);
    }
    free(out);
    return status;
}

static int run(problem_data *pd, posenc_dtype dtype, int threads, result *r)
{
    return run_with(pd, dtype, threads, r, 0);
}

static void free_result(result *r)
{
    free(r->out);
    for (int t = 0; t < GRAD_COUNT; ++t) free(r->grads[t]);
}

/*
 * One table on both sides (M4, M4M: the key_table module's table and map are the
 * query_table module's): with the two gradient outputs one buffer, the engine sums
 * both sides' gradients into it, the same as the two separate ones added;
 * 1 and 2 threads bitwise.
 */
static void test_shared_table(void)
{
    const size_t sizes[][5] = {{2, 3, 7, 5, 3}, {1, 2, 17, 33, 9}, {2, 3, 70, 64, 16}};
    for (size_t c = 0; c < config_count; ++c) {
        if (!configs[c].query_table || !configs[c].key_table || configs[c].dense)
            continue;
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            problem_data pd;
            const size_t *z = sizes[s];
            build(&pd, &configs[c], z[0], z[1], z[2], z[3], z[4], 0);
            for (int dt = 0; dt < 2; ++dt) {
                const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
                point(&pd, dtype);
                posenc_problem *p = &pd.p;
                p->terms[POSENC_TERM_key_table] = p->terms[POSENC_TERM_query_table];
                for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
                    if (!posenc_isa_supported((posenc_isa)isa))
                        continue;
                    posenc_set_isa((posenc_isa)isa);
                    result apart, one, two;
                    EXPECT(run_with(&pd, dtype, 1, &apart, 0) == POSENC_OK, "status");
                    EXPECT(run_with(&pd, dtype, 1, &one, 1) == POSENC_OK, "status");
                    EXPECT(run_with(&pd, dtype, 2, &two, 1) == POSENC_OK, "status");
                    const size_t len = grad_written_len(&pd, GRAD_QUERY_TABLE);   /* batch row 0's */
                    double *sum = malloc(sizeof(double) * (len ? len : 1));
                    for (size_t t = 0; t < len; ++t)
                        sum[t] = apart.grads[GRAD_QUERY_TABLE][t] + apart.grads[GRAD_KEY_TABLE][t];
                    char what[256];
                    snprintf(what, sizeof what, "%s %s size#%zu %s shared table's gradient",
                             configs[c].name, dt ? "f64" : "f32", s, posenc_isa_name((posenc_isa)isa));
                    compare(what, one.grads[GRAD_QUERY_TABLE], sum, len, dt ? 1e-12 : 2e-5, 0);
                    compare(what, two.grads[GRAD_QUERY_TABLE], one.grads[GRAD_QUERY_TABLE], len, 0, 1);
                    EXPECT(one.grads[GRAD_KEY_TABLE] == NULL, "%s: no second gradient", what);
                    free(sum);
                    free_result(&apart);
                    free_result(&one);
                    free_result(&two);
                }
            }
            release(&pd);
        }
    }
}

/*
 * The dispatch tables: every entry an ISA's own table sets (POSENC_KERNEL_ENTRIES,
 * POSENC_CONVERT_ENTRIES) is the one its composed table runs, and the
 * sizes of a group come with its functions; an entry it leaves out is the
 * scalar one's (printed, so that a kernel an ISA lacks is seen).
 */
static void test_dispatch_tables(void)
{
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (!posenc_isa_supported((posenc_isa)isa))
            continue;
        const char *name = posenc_isa_name((posenc_isa)isa);
        for (int dt = 0; dt < 2; ++dt) {
            const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
            const posenc_kernels *own = posenc_kernels_compiled((posenc_isa)isa, dtype);
            const posenc_kernels *run = posenc_kernels_for((posenc_isa)isa, dtype);
            const posenc_kernels *scalar = posenc_kernels_compiled(POSENC_ISA_SCALAR, dtype);
            EXPECT(own && run && scalar, "%s: its tables", name);
            if (!own || !run || !scalar)
                continue;
            EXPECT(!strcmp(run->name, own->name), "%s %s: the table's name", name, run->name);
            char fallback[512] = "";
#define FUNCTION_TAKEN(entry)                                                                     \
    if (own->entry)                                                                               \
        EXPECT((void (*)(void))run->entry == (void (*)(void))own->entry,                          \
               "%s %s: its " #entry " is not the one run", name, dt ? "f64" : "f32");             \
    else {                                                                                        \
        EXPECT((void (*)(void))run->entry == (void (*)(void))scalar->entry,                       \
               "%s %s: " #entry " not the scalar fallback", name, dt ? "f64" : "f32");            \
        strncat(fallback, " " #entry, sizeof fallback - strlen(fallback) - 1);                    \
    }
            int gemm = 1, key_tile = 1;   /* the groups own sets whole */
#define NOTHING(...)
#define COMPLETE(group, entry) group = group && own->entry;
            POSENC_KERNEL_ENTRIES(COMPLETE, NOTHING, NOTHING)
#define GROUP_FUNCTION(group, entry) FUNCTION_TAKEN(entry)
#define GROUP_SIZE(group, entry)                                                                  \
    EXPECT(run->entry == (group ? own->entry : scalar->entry), "%s %s: " #entry " of its group",  \
           name, dt ? "f64" : "f32");
            POSENC_KERNEL_ENTRIES(GROUP_FUNCTION, GROUP_SIZE, FUNCTION_TAKEN)
#undef NOTHING
#undef COMPLETE
#undef GROUP_SIZE
#undef GROUP_FUNCTION
#undef FUNCTION_TAKEN
            if (dt == 0 && isa != POSENC_ISA_SCALAR)
                printf("dispatch: %s float32 runs the scalar kernel for:%s\n", name,
                       *fallback ? fallback : " nothing");
        }
        const posenc_convert *own = posenc_convert_compiled((posenc_isa)isa);
        const posenc_convert *run = posenc_convert_for((posenc_isa)isa);
        EXPECT(own && run, "%s: its conversions", name);
#define CONVERT_TAKEN(entry)                                                                      \
    if (own && run && own->entry)                                                                 \
        EXPECT(run->entry == own->entry ||                                                     \
                   (isa == POSENC_ISA_AVX512 && posenc_cpu_has_avx512bf16()),                              \
               "%s: its conversion " #entry " is not the one run", name);
        POSENC_CONVERT_ENTRIES(CONVERT_TAKEN)
#undef CONVERT_TAKEN
    }
}

/* 8: panels of every depth and width around the vectors' against their definitions
 * (past the columns a zero of either sign: pack_rows's tail lanes are alpha 0). */
static void test_packing(void)
{
    const size_t depths[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65};
    const double alphas[] = {1.0, 0.125, -0.3};
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa)
        for (int dt = 0; dt < 2; ++dt) {
            const posenc_kernels *kern = posenc_kernels_for((posenc_isa)isa, dt ? POSENC_F64 : POSENC_F32);
            if (!kern)   /* not compiled, or not supported here */
                continue;
            const size_t es = dt ? sizeof(double) : sizeof(float);
            for (int narrow = 0; narrow < 2; ++narrow)
                for (size_t a = 0; a < sizeof depths / sizeof depths[0]; ++a)
                    for (size_t cols = 1; cols <= (narrow ? kern->nr_narrow : kern->nr); ++cols)
                        for (int cols_major = 0; cols_major < 2; ++cols_major) {
                            const size_t nr = narrow ? kern->nr_narrow : kern->nr, kc = depths[a];
                            const double alpha = alphas[(a + cols) % 3];
                            /* src exactly as long as read: a read past it is caught by ASan */
                            const size_t ld = (cols_major ? kc : cols) + 3;
                            const size_t len = cols_major ? (cols - 1) * ld + kc : (kc - 1) * ld + cols;
                            double *src = malloc(sizeof(double) * len);
                            for (size_t t = 0; t < len; ++t)
                                src[t] = t % 11 == 5 ? -0.0 : t % 13 == 7 ? INFINITY : urand();
                            void *in = dt ? (void *)src : malloc(sizeof(float) * len);
                            for (size_t t = 0; !dt && t < len; ++t)
                                ((float *)in)[t] = (float)src[t];
                            unsigned char *dst = malloc(es * kc * nr);
                            memset(dst, 0xff, es * kc * nr);
                            if (cols_major)
                                kern->pack_cols(dst, nr, in, (ptrdiff_t)ld, kc, cols, alpha);
                            else
                                kern->pack_rows(dst, nr, in, (ptrdiff_t)ld, kc, cols, alpha);
                            size_t bad = 0;
                            for (size_t l = 0; l < kc; ++l)
                                for (size_t c = 0; c < nr; ++c) {
                                    const unsigned char *got = dst + (l * nr + c) * es;
                                    if (c >= cols) {
                                        bad += dt ? *(const double *)got != 0 : *(const float *)got != 0;
                                        continue;
                                    }
                                    const double x = src[cols_major ? c * ld + l : l * ld + c];
                                    const double want = alpha * x;
                                    const float want_f = (float)alpha * (float)x;
                                    bad += memcmp(got, dt ? (const void *)&want : (const void *)&want_f, es) != 0;
                                }
                            EXPECT(bad == 0, "%s %s %s nr=%zu kc=%zu cols=%zu: %zu elements wrong",
                                   cols_major ? "pack_cols" : "pack_rows",
                                   posenc_isa_name((posenc_isa)isa), dt ? "f64" : "f32", nr, kc,
                                   cols, bad);
                            if (!dt)
                                free(in);
                            free(src);
                            free(dst);
                        }
        }
}

/*
 * 9: the vector tables' tile gathers (tile_gather_key, tile_gather_query) and the
 * key side's scatter (tile_scatter_key) of every ISA against their definitions, bit
 * for bit: element (r, j) of a tile op= proj at bucket map_r0[j - r] - b_min, from row
 * j (key side) or row r (query side) of proj, and its adjoint, rows in order;
 * maps rising and falling by one bucket per offset, with log-like and clipped runs,
 * rising by three, jumping and random (the ISAs' blocked forms and their fallbacks), rows 1 to 33,
 * odd key ranges, proj and map exactly as long as read (ASan), the three ops.
 */
static int64_t gather_map_value(int kind, ptrdiff_t o)
{
    switch (kind) {
    case 0: return 40 + (o < -30 ? -30 : o > 30 ? 30 : o);          /* clipped, rising */
    case 1: return 40 - (o < -30 ? -30 : o > 30 ? 30 : o);          /* falling */
    case 2: {                                                       /* log-like runs */
        const ptrdiff_t a = o < 0 ? -o : o;
        const int64_t v = a < 8 ? (int64_t)a : 8 + (int64_t)(log((double)a / 8) * 6);
        return 60 + (o < 0 ? -v : v);
    }
    case 3: return 10 + (o % 7 + 7) % 7 * 9;                        /* jumps */
    case 4: return 70 + 3 * (o < -20 ? -20 : o > 20 ? 20 : o);      /* rising three a step */
    default: return (int64_t)(((uint64_t)(o + 1000) * 2654435761u) >> 7) % 97;   /* random */
    }
}

static void test_table_gathers(void)
{
    const size_t rows_list[] = {1, 2, 5, 12, 16, 17, 33};
    const size_t keys[][2] = {{0, 16}, {3, 40}, {0, 64}, {5, 100}, {16, 33}};
    size_t checked = 0;
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa)
        for (int dt = 0; dt < 2; ++dt) {
            const posenc_kernels *kern = posenc_kernels_for((posenc_isa)isa, dt ? POSENC_F64 : POSENC_F32);
            if (!kern)
                continue;
            const size_t es = dt ? sizeof(double) : sizeof(float);
            for (int kind = 0; kind < 6; ++kind)
                for (size_t a = 0; a < sizeof rows_list / sizeof rows_list[0]; ++a)
                    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; ++k)
                        for (int op = 0; op < 3; ++op) {
                            const size_t rows = rows_list[a], j0 = keys[k][0], j1 = keys[k][1];
                            const int side_key = (int)((a + k + (size_t)op) % 2);
                            /* the map entries read: j - r for j < j1, r < rows (from j0 on the key side, 0 on the query side) */
                            const size_t first_j = side_key ? j0 : 0;
                            const size_t span = j1 - first_j + rows - 1;
                            int64_t *map = malloc(sizeof(int64_t) * span);
                            const ptrdiff_t shift = (ptrdiff_t)(kind * 7) - 20;   /* offset of map_r0[0] */
                            int64_t lo_b = INT64_MAX, hi_b = 0;
                            for (size_t t = 0; t < span; ++t) {
                                map[t] = gather_map_value(kind, (ptrdiff_t)t - (ptrdiff_t)(rows - 1) + (ptrdiff_t)first_j + shift);
                                lo_b = map[t] < lo_b ? map[t] : lo_b;
                                hi_b = map[t] > hi_b ? map[t] : hi_b;
                            }
                            const int64_t *map_r0 = map + (rows - 1) - first_j;
                            const ptrdiff_t b_min = (ptrdiff_t)lo_b - (ptrdiff_t)(kind % 2);
                            const size_t ld = (size_t)(hi_b - b_min) + 1 + (size_t)(kind % 3);
                            const size_t proj_rows = side_key ? j1 : rows, ldp = j1 + 3;
                            double *proj64 = malloc(sizeof(double) * proj_rows * ld);
                            double *P64 = malloc(sizeof(double) * rows * ldp);
                            for (size_t t = 0; t < proj_rows * ld; ++t) proj64[t] = urand() - 0.5;
                            for (size_t t = 0; t < rows * ldp; ++t) P64[t] = urand() + 0.25;
                            void *proj = malloc(es * proj_rows * ld), *P = malloc(es * rows * ldp),
                                 *want = malloc(es * rows * ldp);
                            for (size_t t = 0; t < proj_rows * ld; ++t)
                                if (dt) ((double *)proj)[t] = proj64[t]; else ((float *)proj)[t] = (float)proj64[t];
                            for (size_t t = 0; t < rows * ldp; ++t)
                                if (dt) ((double *)P)[t] = P64[t]; else ((float *)P)[t] = (float)P64[t];
                            memcpy(want, P, es * rows * ldp);
                            for (size_t r = 0; r < rows; ++r)
                                for (size_t j = first_j; j < j1; ++j) {
                                    const size_t at = (side_key ? j : r) * ld + (size_t)(map_r0[j - r] - b_min);
                                    if (dt) {
                                        double *w = (double *)want + r * ldp + j;
                                        const double v = ((double *)proj)[at];
                                        *w = op == POSENC_SET ? v : op == POSENC_ADD ? v + *w : v * *w;
                                    } else {
                                        float *w = (float *)want + r * ldp + j;
                                        const float v = ((float *)proj)[at];
                                        *w = op == POSENC_SET ? v : op == POSENC_ADD ? v + *w : v * *w;
                                    }
                                }
                            if (side_key)
                                kern->tile_gather_key(op, P, ldp, map_r0, b_min, proj, ld, j0, j1, rows);
                            else
                                kern->tile_gather_query(op, P, ldp, map_r0, b_min, proj, ld, j1, rows);
                            EXPECT(memcmp(P, want, es * rows * ldp) == 0,
                                   "%s %s tile_gather_%s map %d rows=%zu keys [%zu, %zu) op %d: differs",
                                   posenc_isa_name((posenc_isa)isa), dt ? "f64" : "f32",
                                   side_key ? "key" : "query", kind, rows, first_j, j1, op);
                            ++checked;
                            if (side_key) {   /* the adjoint: P's rows [r0, rows) added into proj, rows in order */
                                const size_t r0 = (size_t)op % 2 && rows > 1 ? 1 : 0;
                                void *grad = malloc(es * proj_rows * ld);
                                memcpy(grad, proj, es * proj_rows * ld);
                                void *grad_want = malloc(es * proj_rows * ld);
                                memcpy(grad_want, grad, es * proj_rows * ld);
                                for (size_t r = r0; r < rows; ++r)
                                    for (size_t j = j0; j < j1; ++j) {
                                        const size_t at = j * ld + (size_t)(map_r0[j - r] - b_min);
                                        if (dt) ((double *)grad_want)[at] += ((double *)P)[r * ldp + j];
                                        else ((float *)grad_want)[at] += ((float *)P)[r * ldp + j];
                                    }
                                kern->tile_scatter_key(grad, ld, map_r0, b_min, P, ldp, j0, j1, r0, rows);
                                EXPECT(memcmp(grad, grad_want, es * proj_rows * ld) == 0,
                                       "%s %s tile_scatter_key map %d rows [%zu, %zu) keys [%zu, %zu): differs",
                                       posenc_isa_name((posenc_isa)isa), dt ? "f64" : "f32", kind, r0,
                                       rows, j0, j1);
                                ++checked;
                                free(grad), free(grad_want);
                            }
                            free(map), free(proj64), free(P64), free(proj), free(P), free(want);
                        }
        }
    printf("table gathers and scatters: %zu cases\n", checked);
}

/*
 * posenc_matmul against double loops, every ISA, float32 and float64: odd
 * sizes (one tile, tails of mr, nr and kc; several kc and nc blocks at
 * K = 300, N = 600), A by rows and by columns, B = W^T (column-major) and
 * row-major, with and without bias; operands exactly as long as read (ASan
 * catches a read past them); 1 and 2 threads bitwise; C's padding untouched.
 */
static void test_matmul(void)
{
    const posenc_isa active = posenc_get_isa();
    const size_t shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {13, 17, 33}, {25, 64, 65},
                                {40, 300, 70}, {70, 33, 600}, {0, 3, 4}, {5, 0, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        const size_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2], ldc = N + 2;
        double *a = malloc(sizeof(double) * (M * K + 1)), *b = malloc(sizeof(double) * (K * N + 1));
        double *bias = malloc(sizeof(double) * N), *want = malloc(sizeof(double) * (M * N + 1));
        for (size_t t = 0; t < M * K; ++t) a[t] = urand();
        for (size_t t = 0; t < K * N; ++t) b[t] = urand();
        for (size_t t = 0; t < N; ++t) bias[t] = urand();
        for (int dt = 0; dt < 2; ++dt) {
            const posenc_dtype dtype = dt ? POSENC_F64 : POSENC_F32;
            const size_t es = dt ? sizeof(double) : sizeof(float);
            unsigned char *a_x = malloc(es * (M * K + 1)), *b_x = malloc(es * (K * N + 1));
            unsigned char *bias_x = malloc(es * N), *c1 = malloc(es * (M * ldc + 1));
            unsigned char *c2 = malloc(es * (M * ldc + 1));
            for (int a_cols = 0; a_cols < 2; ++a_cols)
                for (int b_cols = 0; b_cols < 2; ++b_cols)
                    for (int with_bias = 0; with_bias < 2; ++with_bias) {
                        /* a (i, l) at i * K + l, or (a_cols) l * M + i; b (l, j) at l * N + j, or j * K + l */
                        for (size_t i = 0; i < M; ++i)
                            for (size_t l = 0; l < K; ++l) {
                                const size_t at = a_cols ? l * M + i : i * K + l;
                                if (dt) ((double *)a_x)[at] = a[i * K + l];
                                else ((float *)a_x)[at] = (float)a[i * K + l];
                            }
                        for (size_t l = 0; l < K; ++l)
                            for (size_t j = 0; j < N; ++j) {
                                const size_t at = b_cols ? j * K + l : l * N + j;
                                if (dt) ((double *)b_x)[at] = b[l * N + j];
                                else ((float *)b_x)[at] = (float)b[l * N + j];
                            }
                        for (size_t j = 0; j < N; ++j)
                            if (dt) ((double *)bias_x)[j] = bias[j];
                            else ((float *)bias_x)[j] = (float)bias[j];
                        double scale = 1e-300;
                        for (size_t i = 0; i < M; ++i)
                            for (size_t j = 0; j < N; ++j) {
                                double sum = with_bias ? (dt ? bias[j] : (double)(float)bias[j]) : 0;
                                for (size_t l = 0; l < K; ++l)
                                    sum += (dt ? a[i * K + l] : (double)(float)a[i * K + l]) *
                                           (dt ? b[l * N + j] : (double)(float)b[l * N + j]);
                                want[i * N + j] = sum;
                                if (fabs(sum) > scale) scale = fabs(sum);
                            }
                        const posenc_matmul_problem mm = {
                            dtype, M, N, K, a_x, a_cols ? 1 : (ptrdiff_t)K, a_cols ? (ptrdiff_t)M : 1,
                            b_x, b_cols ? 1 : (ptrdiff_t)N, b_cols ? (ptrdiff_t)K : 1,
                            with_bias ? bias_x : NULL, c1, (ptrdiff_t)ldc};
                        posenc_matmul_problem mm2 = mm;
                        mm2.c = c2;
                        for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
                            if (!posenc_isa_supported((posenc_isa)isa))
                                continue;
                            posenc_set_isa((posenc_isa)isa);
                            memset(c1, 0x7F, es * (M * ldc + 1));
                            memset(c2, 0x7F, es * (M * ldc + 1));
                            EXPECT(posenc_matmul(&mm, 1) == POSENC_OK && posenc_matmul(&mm2, 2) == POSENC_OK,
                                   "matmul status");
                            size_t bad = 0, padding = 0;
                            for (size_t i = 0; i < M; ++i) {
                                for (size_t j = 0; j < N; ++j) {
                                    const double got = dt ? ((double *)c1)[i * ldc + j]
                                                          : (double)((float *)c1)[i * ldc + j];
                                    bad += !(fabs(got - want[i * N + j]) <= (dt ? 1e-14 : 1e-6) *
                                                                               (double)(K + 2) * scale);
                                }
                                for (size_t j = N; j < ldc; ++j)
                                    padding += c1[(i * ldc + j) * es] != 0x7F;
                            }
                            EXPECT(bad == 0 && padding == 0,
                                   "matmul %s %s M=%zu K=%zu N=%zu a_cols=%d b_cols=%d bias=%d: %zu wrong, "
                                   "%zu padding written", posenc_isa_name((posenc_isa)isa), dt ? "f64" : "f32",
                                   M, K, N, a_cols, b_cols, with_bias, bad, padding);
                            EXPECT(memcmp(c1, c2, es * (M * ldc + 1)) == 0, "matmul %s threads differ",
                                   posenc_isa_name((posenc_isa)isa));
                        }
                    }
            const posenc_matmul_problem strided = {dtype, 2, 2, 2, a_x, 2, 1, b_x, 2, 2, NULL, c1, 2};
            EXPECT(M < 2 || K < 2 || N < 4 || posenc_matmul(&strided, 1) == POSENC_EINVAL,
                   "matmul takes a B without a unit stride");
            free(a_x); free(b_x); free(bias_x); free(c1); free(c2);
        }
        const posenc_matmul_problem half = {POSENC_BF16, 1, 1, 1, a, 1, 1, b, 1, 1, NULL, want, 1};
        EXPECT(posenc_matmul(&half, 1) == POSENC_EINVAL, "matmul takes float32 and float64 only");
        free(a); free(b); free(bias); free(want);
    }
    posenc_set_isa(active);
}

int main(void)
{
    posenc_dispatch_init();
    quick = getenv("POSENC_CTEST_QUICK") != NULL;
    const size_t sizes[][5] = {{1, 1, 1, 1, 1}, {2, 3, 7, 5, 3}, {1, 2, 17, 33, 9},
                               {2, 1, 33, 17, 16}, {1, 1, 65, 40, 31}, {3, 2, 9, 9, 0},
                               /* above the one-thread threshold: units, then row chunks */
                               {2, 3, 70, 64, 16}, {1, 1, 300, 200, 8}};
    printf("ISAs supported:");
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa)
        if (posenc_isa_supported((posenc_isa)isa))
            printf(" %s", posenc_isa_name((posenc_isa)isa));
    printf("\n");
    for (size_t c = 0; c < config_count; ++c) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            for (int shared = 0; shared < 2 && !skip_size(sizes[s][2], sizes[s][3]); ++shared) {
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
                    for (int t = 0; t < GRAD_COUNT; ++t) {
                        if (grad_module(t) < 0 || !grad_input(&pd, t))   /* a module's: batch row 0's sum */
                            continue;
                        const size_t len = grad_len(&pd, t) / z[0];
                        double *want = malloc(sizeof(double) * (len + 1));
                        naive_module_grad(&pd, t, want);
                        snprintf(what, sizeof what, "%s %s size#%zu shared=%d scalar d%s vs naive",
                                 configs[c].name, dt ? "f64" : "f32", s, shared, grad_names[t]);
                        compare(what, base.grads[t], want, len, rtol, 0);
                        free(want);
                    }
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
                        for (int t = 0; t < GRAD_COUNT; ++t) {
                            if (!base.grads[t])
                                continue;
                            snprintf(what, sizeof what, "%s %s size#%zu shared=%d %s d%s",
                                     configs[c].name, dt ? "f64" : "f32", s, shared,
                                     posenc_isa_name((posenc_isa)isa), grad_names[t]);
                            const size_t len = grad_written_len(&pd, t);
                            compare(what, one.grads[t], base.grads[t], len, rtol, 0);
                            compare(what, two.grads[t], one.grads[t], len, 0, 1);
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
    test_shared_table();
    test_dispatch_tables();
    test_packing();
    test_table_gathers();
    test_matmul();
    test_philox();
    test_dropout_rows();
    test_softmax_rows();
    test_attention();
    test_convert();
    test_lp();
    test_bf16dot();
    test_terms();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
