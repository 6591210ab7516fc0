/*
 * vectors_avx2.h -- the AVX2 + FMA vector layer (files compiled with
 * -mavx2 -mfma only; empty elsewhere).  Instantiates VECTOR_TEMPLATE (the
 * kernels, or posenc._machine's loops) for float, then double; see
 * kernels_impl.h for what each macro means.
 */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define ISA_STRING "avx2"
#define STORE_FENCE() _mm_sfence()

static inline float posenc_hsum_ps256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline double posenc_hsum_pd256(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
}

/* VTRANSPOSE: rows[u] = column u of the 8 x 8 floats rows[0..7]: pairs of
 * floats interleaved, then pairs of pairs (s[4 i + j], 128-bit lane k:
 * float 4 k + j of rows 4 i .. 4 i + 3), then 128-bit lanes. */
static inline void posenc_transpose_ps256(__m256 rows[8])
{
    __m256 s[8];
    const __m256 t[8] = {_mm256_unpacklo_ps(rows[0], rows[1]), _mm256_unpackhi_ps(rows[0], rows[1]),
                         _mm256_unpacklo_ps(rows[2], rows[3]), _mm256_unpackhi_ps(rows[2], rows[3]),
                         _mm256_unpacklo_ps(rows[4], rows[5]), _mm256_unpackhi_ps(rows[4], rows[5]),
                         _mm256_unpacklo_ps(rows[6], rows[7]), _mm256_unpackhi_ps(rows[6], rows[7])};
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        rows[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
        rows[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
    }
}

/* The same for 4 x 4 doubles: pairs interleaved (t[e], t[2 + e]: double
 * 2 k + e of rows 0, 1 and 2, 3 in 128-bit lane k), then 128-bit lanes. */
static inline void posenc_transpose_pd256(__m256d rows[4])
{
    const __m256d t[4] = {_mm256_unpacklo_pd(rows[0], rows[1]), _mm256_unpackhi_pd(rows[0], rows[1]),
                          _mm256_unpacklo_pd(rows[2], rows[3]), _mm256_unpackhi_pd(rows[2], rows[3])};
#pragma GCC unroll 2
    for (int e = 0; e < 2; ++e) {
        rows[e] = _mm256_permute2f128_pd(t[e], t[2 + e], 0x20);
        rows[2 + e] = _mm256_permute2f128_pd(t[e], t[2 + e], 0x31);
    }
}

/* Lanes t < n of a masked load or store (maskload reads nothing elsewhere). */
static inline __m256i posenc_lanes_epi32(size_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256i posenc_lanes_epi64(size_t n)
{
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long)n), _mm256_setr_epi64x(0, 1, 2, 3));
}

#define REAL float
#define VT __m256
#define VL 8
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VBCAST(x) _mm256_set1_ps(x)
#define VZERO() _mm256_setzero_ps()
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VREDUCE(v) posenc_hsum_ps256(v)
#define VTRANSPOSE(rows) posenc_transpose_ps256(rows)
#define VSTREAM(p, v) _mm256_stream_ps((p), (v))
#define VLOAD_PART(p, n) _mm256_maskload_ps((p), posenc_lanes_epi32(n))
#define VSTORE_PART(p, v, n) _mm256_maskstore_ps((p), posenc_lanes_epi32(n), (v))
#define VLOAD_RANGE(p, lo, hi) \
    _mm256_maskload_ps((p), _mm256_andnot_si256(posenc_lanes_epi32(lo), posenc_lanes_epi32(hi)))
#define KNAME(x) x##_f32_avx2
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#define REAL double
#define VT __m256d
#define VL 4
#define VLOAD(p) _mm256_loadu_pd(p)
#define VSTORE(p, v) _mm256_storeu_pd((p), (v))
#define VBCAST(x) _mm256_set1_pd(x)
#define VZERO() _mm256_setzero_pd()
#define VADD(a, b) _mm256_add_pd((a), (b))
#define VMUL(a, b) _mm256_mul_pd((a), (b))
#define VFMA(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define VREDUCE(v) posenc_hsum_pd256(v)
#define VTRANSPOSE(rows) posenc_transpose_pd256(rows)
#define VSTREAM(p, v) _mm256_stream_pd((p), (v))
#define VLOAD_PART(p, n) _mm256_maskload_pd((p), posenc_lanes_epi64(n))
#define VSTORE_PART(p, v, n) _mm256_maskstore_pd((p), posenc_lanes_epi64(n), (v))
#define VLOAD_RANGE(p, lo, hi) \
    _mm256_maskload_pd((p), _mm256_andnot_si256(posenc_lanes_epi64(lo), posenc_lanes_epi64(hi)))
#define KNAME(x) x##_f64_avx2
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#endif /* __AVX2__ && __FMA__ */
