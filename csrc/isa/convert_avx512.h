/*
 * convert_avx512.h -- the AVX-512 blocks of the conversions (convert_impl.h),
 * 16 elements each, AVX-512F only: float16 by vcvtps2ph / vcvtph2ps,
 * bfloat16 by integers, convert_scalar.h's formula on lanes.  Included by
 * isa/avx512.c and isa/avx512bf16.c (which replaces the bfloat16 rounding
 * where the CPU has AVX512-BF16).
 */
#ifndef POSENC_CONVERT_AVX512_H
#define POSENC_CONVERT_AVX512_H

#include <immintrin.h>

#include "convert_scalar.h"

/* Float bits -> bfloat16 bits in the low half of each 32-bit lane. */
#define BLEND_AVX512(mask, a, b) _mm512_mask_blend_epi32((mask), (b), (a))
static inline __m512i bf16_round_avx512(__m512i u)
{
    return POSENC_BF16_ROUND_LANES(u, _mm512_srli_epi32, _mm512_and_si512, _mm512_add_epi32,
                                   _mm512_or_si512, _mm512_set1_epi32, _mm512_cmpgt_epu32_mask,
                                   BLEND_AVX512);
}
static inline void f32_to_bf16_avx512(uint16_t *d, const float *s)
{
    _mm256_storeu_si256((__m256i *)d, _mm512_cvtepi32_epi16(bf16_round_avx512(_mm512_loadu_si512(s))));
}
static inline void bf16_to_f32_avx512(float *d, const uint16_t *s)
{
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s));
    _mm512_storeu_si512(d, _mm512_slli_epi32(h, 16));
}
static inline void f32_to_f16_avx512(uint16_t *d, const float *s)
{
    _mm256_storeu_si256((__m256i *)d, _mm512_cvtps_ph(_mm512_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT));
}
static inline void f16_to_f32_avx512(float *d, const uint16_t *s)
{
    _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)));
}

#define CVL 16

#endif /* POSENC_CONVERT_AVX512_H */
