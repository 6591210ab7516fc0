/*
 * vectors_avx512.h -- the AVX-512 F/VL/DQ vector layer (files compiled with
 * the AVX-512 flags only; empty elsewhere).  Instantiates VECTOR_TEMPLATE
 * (the kernels, or posenc._machine's loops) for float, then double; see
 * kernels_impl.h for what each macro means.
 */
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>

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
#define VSTREAM(p, v) _mm512_stream_pd((p), (v))
#define VLOAD_PART(p, n) _mm512_maskz_loadu_pd((__mmask8)((1u << (n)) - 1), (p))
#define VSTORE_PART(p, v, n) _mm512_mask_storeu_pd((p), (__mmask8)((1u << (n)) - 1), (v))
#define VLOAD_RANGE(p, lo, hi) \
    _mm512_maskz_loadu_pd((__mmask8)(((1u << (hi)) - 1) & ~((1u << (lo)) - 1)), (p))
#define KNAME(x) x##_f64_avx512
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#endif /* AVX-512 */
