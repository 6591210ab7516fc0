/*
 * avx2.c -- AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c only).
 * Register tile 6 x 2 vectors: 12 accumulators, 2 B vectors, 1 broadcast
 * of the 16 ymm registers.
 */
#include "../posenc.h"

#define MR 6
#define NRV 2
#include "vector_exp.h"   /* VEXP, VMAX: the hooks of the softmax rows */
#define VECTOR_TEMPLATE "kernels_impl.h"
#include "vectors_avx2.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#include "convert_scalar.h"

/* The conversions (convert_impl.h), 8 elements a block: float16 by F16C,
 * bfloat16 by integers, convert_scalar.h's formula on lanes. */
#define BLEND_AVX2(mask, a, b) _mm256_blendv_epi8((b), (a), (mask))
static inline void f32_to_bf16_avx2(uint16_t *d, const float *s)
{
    const __m256i u = _mm256_loadu_si256((const __m256i *)s);
    const __m256i r = POSENC_BF16_ROUND_LANES(u, _mm256_srli_epi32, _mm256_and_si256, _mm256_add_epi32,
                                              _mm256_or_si256, _mm256_set1_epi32, _mm256_cmpgt_epi32,
                                              BLEND_AVX2);
    /* lanes <= 0xffff: the saturating pack keeps them */
    _mm_storeu_si128((__m128i *)d, _mm_packus_epi32(_mm256_castsi256_si128(r),
                                                    _mm256_extracti128_si256(r, 1)));
}
static inline void bf16_to_f32_avx2(float *d, const uint16_t *s)
{
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s));
    _mm256_storeu_si256((__m256i *)d, _mm256_slli_epi32(h, 16));
}
static inline void f32_to_f16_avx2(uint16_t *d, const float *s)
{
    _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(_mm256_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT));
}
static inline void f16_to_f32_avx2(float *d, const uint16_t *s)
{
    _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s)));
}

#define CONVERT_ISA avx2
#define CVL 8
#define BF16_TO_F32 bf16_to_f32_avx2
#define F32_TO_BF16 f32_to_bf16_avx2
#define F16_TO_F32 f16_to_f32_avx2
#define F32_TO_F16 f32_to_f16_avx2
#include "convert_impl.h"
#endif /* AVX2 + F16C */
