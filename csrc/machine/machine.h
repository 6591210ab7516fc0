/*
 * machine.h -- posenc._machine: the machine's limits, measured, so that
 * benchmark results can be stated as a fraction of them.  Benchmarks only:
 * nothing here is part of the engine or of posenc._C.
 */
#ifndef POSENC_MACHINE_H
#define POSENC_MACHINE_H

#include "../posenc.h"

/*
 * A peak loop `name(iterations)`: POSENC_PEAK_CHAINS independent accumulator
 * chains of `VT` vectors, each set to init(t) and stepped by step(acc) per
 * iteration; returns their sum, a value the compiler cannot drop.  The FMA
 * loops (machine_impl.h) and the bfloat16 dot products (avx512bf16.c) are this
 * loop with their own step.  16 chains where the ISA has 32 vector registers
 * (AVX-512, NEON: 4 FMA pipes x 4 cycles on the widest Arm cores need 16);
 * AVX2's 16 registers hold 12 and the step's two constants (16 chains
 * spilled three to the stack, whose store-to-load latency then bounded the
 * loop: 76 % of the FMA rate on a Zen 3, below what the GEMM itself
 * reached).  12 still covers an FMA's latency x ports on x86 (4 cycles x 2
 * ports needs 8).
 */
#ifndef POSENC_PEAK_CHAINS
#define POSENC_PEAK_CHAINS 16
#endif
#define POSENC_PEAK_LOOP(name, VT, init, step, add, reduce)    \
    static double name(size_t iterations)                      \
    {                                                          \
        VT acc[POSENC_PEAK_CHAINS];                            \
        _Pragma("GCC unroll 16")                               \
        for (int t = 0; t < POSENC_PEAK_CHAINS; ++t)           \
            acc[t] = init(t);                                  \
        for (size_t it = 0; it < iterations; ++it) {           \
            _Pragma("GCC unroll 16")                           \
            for (int t = 0; t < POSENC_PEAK_CHAINS; ++t)       \
                acc[t] = step(acc[t]);                         \
        }                                                      \
        VT total = acc[0];                                     \
        for (int t = 1; t < POSENC_PEAK_CHAINS; ++t)           \
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
