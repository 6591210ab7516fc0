/*
 * bf16dot_timing.c -- throughput of the bfloat16 content logits
 * (posenc_bf16_content_forward, engine/bf16dot.c) beside posenc's float32
 * content logits (posenc_forward, POSENC_F32) on the same shape, and the
 * peaks of vdpbf16ps and of float32 FMA on registers.  A benchmark, not a
 * test; C only, no Python.  GFLOP/s = 2 B H n m d / time, median (and best)
 * of the runs after one warm-up; the peaks per core, one thread.
 *
 * Build and run from the repository root (x86-64 with AVX512-BF16; only
 * this file and isa/ take ISA flags; tests/c/run.sh's objects would do too):
 *
 *   O=/tmp/bf16dot-timing; mkdir -p $O
 *   A="-mavx512f -mavx512vl -mavx512dq -mavx2 -mfma"
 *   gcc -O3 -std=c11 -Icsrc -c csrc/isa/scalar.c -o $O/scalar.o
 *   gcc -O3 -std=c11 -Icsrc -mavx2 -mfma -mf16c -c csrc/isa/avx2.c -o $O/avx2.o
 *   gcc -O3 -std=c11 -Icsrc $A -c csrc/isa/avx512.c -o $O/avx512.o
 *   gcc -O3 -std=c11 -Icsrc $A -mavx512bw -mavx512bf16 -c csrc/isa/avx512bf16.c -o $O/bf16.o
 *   gcc -O3 -std=c11 -Icsrc $A -mavx512bw -mavx512bf16 -c benchmarks/bf16dot_timing.c -o $O/main.o
 *   gcc -O3 -std=c11 -Icsrc -fopenmp -DPOSENC_HAVE_AVX2 -DPOSENC_HAVE_AVX512 \
 *       -DPOSENC_HAVE_AVX512BF16 csrc/dispatch.c csrc/cpu.c csrc/engine/entry.c \
 *       csrc/engine/engine_f32.c csrc/engine/engine_f64.c csrc/engine/runs.c csrc/engine/spans.c \
 *       csrc/engine/alloc.c csrc/engine/threads.c csrc/engine/philox.c csrc/engine/bf16dot.c \
 *       $O/scalar.o $O/avx2.o $O/avx512.o $O/bf16.o $O/main.o -lm -o $O/bf16dot_timing
 *   $O/bf16dot_timing [B H n m d runs]        (default 8 12 512 512 64 9)
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/bf16dot.h"
#include "posenc.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { MAX_RUNS = 64, PEAK_ACC = 24 };

/* Seconds of each of `runs` calls after a warm-up, sorted. */
static int time_calls(int (*call)(const posenc_problem *, void *, int), const posenc_problem *p,
                      void *out, int threads, int runs, double *seconds)
{
    if (call(p, out, threads) != POSENC_OK)
        return -1;
    for (int r = 0; r < runs; ++r) {
        const double t0 = now();
        call(p, out, threads);
        seconds[r] = now() - t0;
    }
    qsort(seconds, (size_t)runs, sizeof *seconds, by_value);
    return 0;
}

/* GFLOP/s of PEAK_ACC independent chains of one instruction (a core's peak). */
#define PEAK_LOOP(name, VEC, ZERO, OP, A, B, REDUCE, FLOPS)                        \
    static double name(long iters)                                                 \
    {                                                                              \
        VEC acc[PEAK_ACC];                                                         \
        for (int i = 0; i < PEAK_ACC; ++i)                                         \
            acc[i] = ZERO;                                                         \
        const double t0 = now();                                                   \
        for (long it = 0; it < iters; ++it)                                        \
            for (int i = 0; i < PEAK_ACC; ++i)                                     \
                acc[i] = OP(acc[i], A, B);                                         \
        const double t = now() - t0;                                               \
        volatile float sink = 0;                                                   \
        for (int i = 0; i < PEAK_ACC; ++i)                                         \
            sink += REDUCE(acc[i]);                                                \
        (void)sink;                                                                \
        return (double)FLOPS * PEAK_ACC * (double)iters / t * 1e-9;                \
    }
#define DPBF16(acc, a, b) _mm512_dpbf16_ps((acc), (a), (b))
#define FMA(acc, a, b) _mm512_fmadd_ps((a), (b), (acc))
PEAK_LOOP(peak_dpbf16, __m512, _mm512_setzero_ps(), DPBF16,
          (__m512bh)_mm512_set1_epi32(0x3f803f80), (__m512bh)_mm512_set1_epi32(0x3f003f00),
          _mm512_reduce_add_ps, 64)
PEAK_LOOP(peak_fma, __m512, _mm512_setzero_ps(), FMA, _mm512_set1_ps(1.0f),
          _mm512_set1_ps(0.5f), _mm512_reduce_add_ps, 32)

int main(int argc, char **argv)
{
    size_t B = 8, H = 12, n = 512, m = 512, d = 64;
    int runs = 9;
    if (argc == 7) {
        B = strtoul(argv[1], NULL, 10), H = strtoul(argv[2], NULL, 10);
        n = strtoul(argv[3], NULL, 10), m = strtoul(argv[4], NULL, 10);
        d = strtoul(argv[5], NULL, 10), runs = atoi(argv[6]);
    }
    if (runs < 1 || runs > MAX_RUNS)
        runs = 9;
    posenc_dispatch_init();
    if (posenc_set_isa(POSENC_ISA_AVX512) != 0 || !posenc_active_bf16_kernels()) {
        printf("no avx512 ISA with AVX512-BF16 here\n");
        return 2;
    }
    const size_t nq = B * H * n * d, nk = B * H * m * d, logits = B * H * n * m;
    /* 64-byte aligned, as the engine's own allocations (both may then stream their logits) */
    void *mem[6] = {NULL};
    const size_t bytes[6] = {2 * nq, 2 * nk, 2 * logits, 4 * nq, 4 * nk, 4 * logits};
    for (int a = 0; a < 6; ++a)
        if (posix_memalign(&mem[a], 64, bytes[a] ? bytes[a] : 1) != 0)
            return 1;
    uint16_t *q16 = mem[0], *k16 = mem[1], *out16 = mem[2];
    float *q32 = mem[3], *k32 = mem[4], *out32 = mem[5];
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (size_t t = 0; t < nq + nk; ++t) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        const float x = (float)((double)(state >> 11) / 9007199254740992.0 * 2 - 1);
        uint32_t u;
        memcpy(&u, &x, 4);
        u &= 0xffff0000u;   /* exactly a bfloat16: both dtypes see the same values */
        float v;
        memcpy(&v, &u, 4);
        if (t < nq)
            q16[t] = (uint16_t)(u >> 16), q32[t] = v;
        else
            k16[t - nq] = (uint16_t)(u >> 16), k32[t - nq] = v;
    }
    memset(out16, 0, 2 * logits);
    memset(out32, 0, 4 * logits);
    posenc_problem p;
    memset(&p, 0, sizeof p);
    p.B = B, p.H = H, p.n = n, p.m = m, p.d = d, p.scale = 0.125;
    const double flops = 2.0 * (double)logits * (double)d;
    printf("B=%zu H=%zu n=%zu m=%zu d=%zu, %d runs each (median, best GFLOP/s)\n", B, H, n, m, d,
           runs);
    for (int threads = 1; threads <= 2; ++threads) {
        double s16[MAX_RUNS], s32[MAX_RUNS];
        p.dtype = POSENC_BF16, p.q = q16, p.k = k16;
        if (time_calls(posenc_bf16_content_forward, &p, out16, threads, runs, s16) != 0)
            return 1;
        p.dtype = POSENC_F32, p.q = q32, p.k = k32;
        if (time_calls(posenc_forward, &p, out32, threads, runs, s32) != 0)
            return 1;
        const double g16 = flops / s16[runs / 2] * 1e-9, g32 = flops / s32[runs / 2] * 1e-9;
        printf("threads=%d  bf16dot %7.1f (best %7.1f)  f32 %7.1f (best %7.1f)  ratio %.2f\n",
               threads, g16, flops / s16[0] * 1e-9, g32, flops / s32[0] * 1e-9, g16 / g32);
    }
    double peaks[2][5];
    for (int r = 0; r < 5; ++r) {   /* interleaved, best of 5 */
        peaks[0][r] = peak_dpbf16(20000000L);
        peaks[1][r] = peak_fma(20000000L);
    }
    qsort(peaks[0], 5, sizeof(double), by_value);
    qsort(peaks[1], 5, sizeof(double), by_value);
    printf("peak per core: vdpbf16ps zmm %.1f GFLOP/s, float32 vfmadd zmm %.1f GFLOP/s\n",
           peaks[0][4], peaks[1][4]);
    for (int a = 0; a < 6; ++a)
        free(mem[a]);
    return 0;
}
