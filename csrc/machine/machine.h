/*
 * machine.h -- posenc._machine: the machine's limits, measured, so that
 * benchmark results can be stated as a fraction of them.  Benchmarks only:
 * nothing here is part of the engine or of posenc._C.
 */
#ifndef POSENC_MACHINE_H
#define POSENC_MACHINE_H

#include "../posenc.h"

/*
 * A peak loop `name(iterations)`: 16 independent accumulator chains (enough
 * to cover an FMA's latency x ports on every target: 4 cycles x 2 ports on
 * recent x86 needs 8) of `VT` vectors, each set to init(t) and stepped by
 * step(acc) per iteration; returns their sum, a value the compiler cannot
 * drop.  The FMA loops (machine_impl.h) and the bfloat16 dot products
 * (avx512bf16.c) are this loop with their own step.
 */
#define POSENC_PEAK_LOOP(name, VT, init, step, add, reduce)    \
    static double name(size_t iterations)                      \
    {                                                          \
        VT acc[16];                                            \
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; ++t)  \
            acc[t] = init(t);                                  \
        for (size_t it = 0; it < iterations; ++it) {           \
            _Pragma("GCC unroll 16") for (int t = 0; t < 16; ++t) \
                acc[t] = step(acc[t]);                         \
        }                                                      \
        VT total = acc[0];                                     \
        for (int t = 1; t < 16; ++t)                           \
            total = add(total, acc[t]);                        \
        return (double)reduce(total);                          \
    }

/* The loops one ISA provides for one dtype (machine_impl.h). */
typedef struct {
    /* an FMA-throughput loop: returns a value the compiler cannot drop */
    double (*fma_peak)(size_t iterations);
    size_t fma_peak_flops;                 /* FLOPs of one iteration */
    /* stores zeros to dst with the ISA's non-temporal stores, then fences */
    void (*stream_zero)(void *dst, size_t bytes);
} posenc_machine_loops;

/* Per-ISA loops (machine/<isa>.c when compiled). */
extern const posenc_machine_loops posenc_machine_f32_scalar, posenc_machine_f64_scalar;
extern const posenc_machine_loops posenc_machine_f32_avx2, posenc_machine_f64_avx2;
extern const posenc_machine_loops posenc_machine_f32_avx512, posenc_machine_f64_avx512;
extern const posenc_machine_loops posenc_machine_f32_neon, posenc_machine_f64_neon;
/* bfloat16 dot products (VDPBF16PS), float32 accumulators; no stream_zero. */
extern const posenc_machine_loops posenc_machine_bf16_avx512bf16;

/* The loops of an ISA this build compiled and the CPU runs, else NULL;
 * POSENC_BF16: the bf16 dot-product loop, on avx512 with AVX512-BF16 only. */
const posenc_machine_loops *posenc_machine_loops_for(posenc_isa isa, posenc_dtype dtype);

/* FLOP/s of the ISA's FMA loop on `threads` threads, each running about
 * `seconds`; -1 for an ISA it cannot run. */
double posenc_measure_fma(posenc_isa isa, posenc_dtype dtype, int threads, double seconds);

/* bytes/s of storing a fresh `bytes` buffer, split over `threads`, with
 * plain or non-temporal stores, best of `repeats`; -1 on failure. */
double posenc_measure_store(posenc_isa isa, size_t bytes, int threads, int nontemporal, int repeats);

#endif /* POSENC_MACHINE_H */
