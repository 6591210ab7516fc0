/*
 * measure.c -- the machine's limits, measured: the FMA throughput of an ISA
 * (FLOP/s) and the bandwidth of storing a buffer much larger than the caches
 * (bytes/s), with plain and with non-temporal stores.
 */
#define _POSIX_C_SOURCE 200809L
#include "machine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

const posenc_machine_loops *posenc_machine_loops_for(posenc_isa isa, posenc_dtype dtype)
{
    if (!posenc_cpu_has(isa))
        return NULL;
    if (dtype == POSENC_BF16) {
#ifdef POSENC_HAVE_AVX512BF16
        if (isa == POSENC_ISA_AVX512 && posenc_cpu_has_avx512bf16())
            return &posenc_machine_bf16_avx512bf16;
#endif
        return NULL;
    }
    const int f32 = dtype == POSENC_F32;
    switch (isa) {
    case POSENC_ISA_SCALAR:
        return f32 ? &posenc_machine_f32_scalar : &posenc_machine_f64_scalar;
#ifdef POSENC_HAVE_AVX2
    case POSENC_ISA_AVX2:
        return f32 ? &posenc_machine_f32_avx2 : &posenc_machine_f64_avx2;
#endif
#ifdef POSENC_HAVE_AVX512
    case POSENC_ISA_AVX512:
        return f32 ? &posenc_machine_f32_avx512 : &posenc_machine_f64_avx512;
#endif
#ifdef POSENC_HAVE_NEON
    case POSENC_ISA_NEON:
        return f32 ? &posenc_machine_f32_neon : &posenc_machine_f64_neon;
#endif
    default:
        return NULL;
    }
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

volatile double posenc_machine_sink;

double posenc_measure_fma(posenc_isa isa, posenc_dtype dtype, int threads, double seconds)
{
    const posenc_machine_loops *L = posenc_machine_loops_for(isa, dtype);
    if (!L || threads < 1)
        return -1.0;
    /* calibrate the iteration count on one thread to about `seconds` */
    size_t iterations = 1u << 16;
    for (;;) {
        const double t0 = now_seconds();
        posenc_machine_sink += L->fma_peak(iterations);
        const double dt = now_seconds() - t0;
        if (dt > seconds / 4 || iterations > ((size_t)1 << 40))
            break;
        iterations *= 2;
    }
    double elapsed = 0;
#pragma omp parallel num_threads(threads)
    {
        double local = 0;
#pragma omp barrier
        const double t0 = now_seconds();
        local += L->fma_peak(iterations);
        const double dt = now_seconds() - t0;
#pragma omp critical
        {
            posenc_machine_sink += local;
            if (dt > elapsed)
                elapsed = dt;
        }
    }
    return (double)iterations * (double)L->fma_peak_flops * threads / elapsed;
}

double posenc_measure_store(posenc_isa isa, size_t bytes, int threads, int nontemporal, int repeats)
{
    const posenc_machine_loops *L = posenc_machine_loops_for(isa, POSENC_F32);
    if (!L || threads < 1 || repeats < 1)
        return -1.0;
    bytes = bytes / (64 * (size_t)threads) * (64 * (size_t)threads);
    char *buffer = NULL;
    if (bytes == 0 || posix_memalign((void **)&buffer, 64, bytes) != 0)
        return -1.0;
    memset(buffer, 1, bytes);   /* fault the pages in: measure stores, not page faults */
    const size_t share = bytes / (size_t)threads;
    double best = 1e300;
    for (int r = 0; r < repeats; ++r) {
        const double t0 = now_seconds();
#pragma omp parallel num_threads(threads)
        {
#ifdef _OPENMP
            char *part = buffer + (size_t)omp_get_thread_num() * share;
#else
            char *part = buffer;
#endif
            if (nontemporal)
                L->stream_zero(part, share);
            else
                memset(part, 0, share);
        }
        const double dt = now_seconds() - t0;
        if (dt < best)
            best = dt;
    }
    posenc_machine_sink += buffer[bytes / 2];
    free(buffer);
    return (double)bytes / best;
}
