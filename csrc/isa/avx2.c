/*
 * avx2.c -- AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c only).
 * Register tile 6 x 2 vectors: 12 accumulators, 2 B vectors, 1 broadcast
 * of the 16 ymm registers.
 */
#include "../posenc.h"

#define MR 6
#define NRV 2
#include "vector_exp.h"   /* VEXP, VMAX: the hooks of the softmax rows */

#if defined(__AVX2__)
#include <immintrin.h>
#include <stdint.h>

#include "../engine/philox.h"

/*
 * The dropout's keep decisions (philox_impl.h) on 8 blocks (32 keys) at a
 * time: as isa/avx512.c, with _mm256_max_epu32 for the unsigned compare
 * AVX2 lacks, and the words packed to bytes and moved to key order by one
 * byte shuffle.
 */
static inline void philox_mul(__m256i a, __m256i m, __m256i *hi, __m256i *lo)
{
    const __m256i even = _mm256_mul_epu32(a, m);                         /* lanes 0, 2, ... */
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);   /* lanes 1, 3, ... */
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

/* All ones in the lanes where word >= limit (unsigned), else 0. */
static inline __m256i philox_keeps(__m256i word, __m256i limit)
{
    return _mm256_cmpeq_epi32(_mm256_max_epu32(word, limit), word);
}

static inline void philox_store(uint8_t *keep, __m256i c0, __m256i c1, __m256i c2, __m256i c3,
                                __m256i limit)
{
    /* per 128-bit half (blocks 4g .. 4g + 3): byte 4 t + l of word t of block 4g + l; the
     * shuffle takes it to key order, byte 4 l + t */
    const __m256i to_keys = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i words01 = _mm256_packs_epi32(philox_keeps(c0, limit), philox_keeps(c1, limit));
    const __m256i words23 = _mm256_packs_epi32(philox_keeps(c2, limit), philox_keeps(c3, limit));
    const __m256i bytes = _mm256_packs_epi16(words01, words23);
    _mm256_storeu_si256((__m256i *)(void *)keep,
                        _mm256_and_si256(_mm256_shuffle_epi8(bytes, to_keys), _mm256_set1_epi8(1)));
}

#define PHILOX_NAME dropout_row_avx2
#define PHILOX_V __m256i
#define PHILOX_LANES 8
#define PHILOX_SET1(x) _mm256_set1_epi32((int)(uint32_t)(x))
#define PHILOX_LANE_INDEX _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define PHILOX_ADD _mm256_add_epi32
#define PHILOX_XOR _mm256_xor_si256
#include "philox_impl.h"
#endif

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
