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

/* acc + the products of 1.0 and 2^-24 (bfloat16 0x3f80, 0x3380), pairwise */
#define BF16_INIT(t) _mm512_set1_ps((float)(t))
#define BF16_STEP(acc)                                                         \
    _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi16(0x3f80),                 \
                     (__m512bh)_mm512_set1_epi16(0x3380))
POSENC_PEAK_LOOP(bf16_dot_peak, __m512, BF16_INIT, BF16_STEP, _mm512_add_ps, _mm512_reduce_add_ps)

const posenc_machine_loops posenc_machine_bf16_avx512bf16 = {
    .fma_peak = bf16_dot_peak,
    .fma_peak_flops = POSENC_PEAK_CHAINS * 32 * 2,
    .stream_zero = NULL,
};
#endif
