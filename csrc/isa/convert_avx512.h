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
#include <string.h>

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
/* Doubles -> bfloat16, rounded once (posenc_bf16_from_f64_bits): lanes whose magnitude
 * rounds to a normal bfloat16 or to the infinity, and zeros, by its first formula on 64-bit
 * lanes; a block with any other lane (a subnormal result, inf, NaN, double subnormals)
 * by the scalar function, element by element. */
static inline void f64_to_bf16_avx512(uint16_t *d, const double *s)
{
    __m128i half[2];
    for (int h = 0; h < 2; ++h) {
        const __m512i u = _mm512_loadu_si512(s + 8 * h);
        const __m512i a = _mm512_and_si512(u, _mm512_set1_epi64(0x7fffffffffffffffll));
        const __mmask8 normal = _mm512_cmple_epu64_mask(
            _mm512_sub_epi64(_mm512_srli_epi64(a, 52), _mm512_set1_epi64(897)),
            _mm512_set1_epi64(253));
        const __mmask8 zero = _mm512_cmpeq_epi64_mask(a, _mm512_setzero_si512());
        if ((__mmask8)(normal | zero) != 0xff) {
            for (int t = 0; t < 16; ++t) {
                uint64_t bits;
                memcpy(&bits, s + t, sizeof bits);
                d[t] = posenc_bf16_from_f64_bits(bits);
            }
            return;
        }
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi64(a, 45), _mm512_set1_epi64(1));
        const __m512i kept = _mm512_srli_epi64(
            _mm512_add_epi64(_mm512_add_epi64(a, _mm512_set1_epi64(0x0fffffffffffll)), odd), 45);
        const __m512i r = _mm512_maskz_sub_epi64(normal, kept, _mm512_set1_epi64(896 << 7));
        const __m512i sign = _mm512_and_si512(_mm512_srli_epi64(u, 48), _mm512_set1_epi64(0x8000));
        half[h] = _mm512_cvtepi64_epi16(_mm512_or_si512(sign, r));
    }
    _mm256_storeu_si256((__m256i *)d, _mm256_set_m128i(half[1], half[0]));
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
