/*
 * machine/avx512bf16.c -- posenc._machine's bfloat16 dot-product peak:
 * VDPBF16PS (AVX512-BF16), 32 bf16 products per instruction, each pair of
 * them summed into one of 16 float32 lanes (64 FLOPs).  Compiled where the
 * compiler takes -mavx512bf16 (setup.py's ISA_EXTENSIONS); measured where
 * the CPU has it.  The ceiling for issue 16's bf16 logits.
 */
#include "machine.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

/* 16 independent accumulator chains, as the FMA loop (machine_impl.h). */
static double bf16_dot_peak(size_t iterations)
{
    __m512 acc[16];
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);   /* 1.0 */
    const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3380);   /* 2^-24 */
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t)
        acc[t] = _mm512_set1_ps((float)t);
    for (size_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t)
            acc[t] = _mm512_dpbf16_ps(acc[t], x, y);
    }
    __m512 total = acc[0];
    for (int t = 1; t < 16; ++t)
        total = _mm512_add_ps(total, acc[t]);
    return (double)_mm512_reduce_add_ps(total);
}

const posenc_machine_loops posenc_machine_bf16_avx512bf16 = {
    .fma_peak = bf16_dot_peak,
    .fma_peak_flops = 16 * 32 * 2,
    .stream_zero = NULL,
};
#endif
