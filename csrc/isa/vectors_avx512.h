/*
 * vectors_avx512.h -- the AVX-512 F/VL/DQ vector layer (files compiled with
 * the AVX-512 flags only; empty elsewhere).  Instantiates VECTOR_TEMPLATE
 * (the kernels, or posenc._machine's loops) for float, then double; see
 * kernels_impl.h for what each macro means.
 */
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>

#include "transpose_avx512.h"

/* VTRANSPOSE: the n x n floats or doubles rows[0..n-1] (n = VL) transposed as words. */
#define POSENC_TRANSPOSE_AS_WORDS(rows, n, TO_WORDS, FROM_WORDS, TRANSPOSE) \
    do {                                                                     \
        __m512i words_[n];                                                   \
        _Pragma("GCC unroll 16")                                             \
        for (int u_ = 0; u_ < (n); ++u_)                                     \
            words_[u_] = TO_WORDS((rows)[u_]);                               \
        TRANSPOSE(words_);                                                   \
        _Pragma("GCC unroll 16")                                             \
        for (int u_ = 0; u_ < (n); ++u_)                                     \
            (rows)[u_] = FROM_WORDS(words_[u_]);                             \
    } while (0)

/* VREDUCE4: out[0..3] = the sums of a, b, c, d, in one tree for the four (halves of
 * pairs, then quarters, then within 128 bits) instead of four reductions. */
static inline void posenc_reduce4_ps512(__m512 a, __m512 b, __m512 c, __m512 d, float *out)
{
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
    const __m512i lanes = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(lanes, t)));
}

static inline void posenc_reduce4_pd512(__m512d a, __m512d b, __m512d c, __m512d d, double *out)
{
    const __m512d ab = _mm512_add_pd(_mm512_shuffle_f64x2(a, b, 0x44), _mm512_shuffle_f64x2(a, b, 0xEE));
    const __m512d cd = _mm512_add_pd(_mm512_shuffle_f64x2(c, d, 0x44), _mm512_shuffle_f64x2(c, d, 0xEE));
    __m512d t = _mm512_add_pd(_mm512_shuffle_f64x2(ab, cd, 0x88), _mm512_shuffle_f64x2(ab, cd, 0xDD));
    t = _mm512_add_pd(t, _mm512_permute_pd(t, 0x55));
    const __m512i lanes = _mm512_set_epi64(0, 0, 0, 0, 6, 4, 2, 0);
    _mm256_storeu_pd(out, _mm512_castpd512_pd256(_mm512_permutexvar_pd(lanes, t)));
}

#define ISA_STRING "avx512"
#define STORE_FENCE() _mm_sfence()

#define REAL float
#define VT __m512
#define VL 16
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VBCAST(x) _mm512_set1_ps(x)
#define VZERO() _mm512_setzero_ps()
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VREDUCE(v) _mm512_reduce_add_ps(v)
#define VREDUCE4(a, b, c, d, out) posenc_reduce4_ps512((a), (b), (c), (d), (out))
#define VTRANSPOSE(rows) \
    POSENC_TRANSPOSE_AS_WORDS(rows, 16, _mm512_castps_si512, _mm512_castsi512_ps, posenc_transpose_16x16_epi32)
#define VSTREAM(p, v) _mm512_stream_ps((p), (v))
#define VLOAD_PART(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1), (p))
#define VSTORE_PART(p, v, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1), (v))
#define VLOAD_RANGE(p, lo, hi) \
    _mm512_maskz_loadu_ps((__mmask16)(((1u << (hi)) - 1) & ~((1u << (lo)) - 1)), (p))
#define KNAME(x) x##_f32_avx512
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#define REAL double
#define VT __m512d
#define VL 8
#define VLOAD(p) _mm512_loadu_pd(p)
#define VSTORE(p, v) _mm512_storeu_pd((p), (v))
#define VBCAST(x) _mm512_set1_pd(x)
#define VZERO() _mm512_setzero_pd()
#define VADD(a, b) _mm512_add_pd((a), (b))
#define VMUL(a, b) _mm512_mul_pd((a), (b))
#define VFMA(a, b, c) _mm512_fmadd_pd((a), (b), (c))
#define VREDUCE(v) _mm512_reduce_add_pd(v)
#define VREDUCE4(a, b, c, d, out) posenc_reduce4_pd512((a), (b), (c), (d), (out))
#define VTRANSPOSE(rows) \
    POSENC_TRANSPOSE_AS_WORDS(rows, 8, _mm512_castpd_si512, _mm512_castsi512_pd, posenc_transpose_8x8_epi64)
#define VSTREAM(p, v) _mm512_stream_pd((p), (v))
#define VLOAD_PART(p, n) _mm512_maskz_loadu_pd((__mmask8)((1u << (n)) - 1), (p))
#define VSTORE_PART(p, v, n) _mm512_mask_storeu_pd((p), (__mmask8)((1u << (n)) - 1), (v))
#define VLOAD_RANGE(p, lo, hi) \
    _mm512_maskz_loadu_pd((__mmask8)(((1u << (hi)) - 1) & ~((1u << (lo)) - 1)), (p))
#define KNAME(x) x##_f64_avx512
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#endif /* AVX-512 */
