/*
 * avx512bf16.c -- avx512's kernels that AVX512-BF16 makes faster (compiled
 * with the AVX-512 flags plus -mavx512bw -mavx512bf16, where the compiler
 * takes them; used where cpu.c finds AVX512-BF16 and AVX512-BW on top of
 * the avx512 ISA).  So far the float -> bfloat16 rounding; dispatch.c lays
 * these entries over avx512's.
 */
#include "../posenc.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include "convert_avx512.h"

/* vcvtneps2bf16 rounds to nearest even and quiets NaNs as the reference
 * does, but flushes subnormal inputs to zero: a block holding one is
 * rounded by integers instead (convert_avx512.h). */
static inline void f32_to_bf16_avx512bf16(uint16_t *d, const float *s)
{
    const __m512 x = _mm512_loadu_ps(s);
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 subnormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                                _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
    const __m256i r = subnormal ? _mm512_cvtepi32_epi16(bf16_round_avx512(u))
                                : (__m256i)_mm512_cvtneps_pbh(x);
    _mm256_storeu_si256((__m256i *)d, r);
}

#define CONVERT_ISA avx512bf16
#define F32_TO_BF16 f32_to_bf16_avx512bf16
#include "convert_impl.h"

#endif /* AVX512-BF16 */
