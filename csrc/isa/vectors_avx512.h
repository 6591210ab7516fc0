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
