/*
 * avx512.c -- AVX-512 F/VL/DQ kernels (compiled with the AVX-512 flags only).
 * Register tile 12 x 2 vectors: 24 accumulators, 2 B vectors, broadcasts
 * from memory, of the 32 zmm registers.
 */
#include "../posenc.h"

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>

#define MR 12
#define NRV 2

/*
 * Key-side table gathers and their adjoint (see tile_gather_key): element j
 * of a row reads ka[j * ldka + bucket[j] - b_min], 8 keys per instruction
 * with 64-bit indices.  The 8 keys of a scatter are distinct rows of gk, so
 * its lanes never collide.
 */
#define KEY_LANES 8

static inline __m512i key_offsets(size_t j, size_t ld, ptrdiff_t b_min)
{
    const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm512_sub_epi64(_mm512_mullo_epi64(_mm512_add_epi64(lane, _mm512_set1_epi64((long long)j)),
                                               _mm512_set1_epi64((long long)ld)),
                            _mm512_set1_epi64((long long)b_min));
}

#define KEY_ROW_FUNCTIONS(REAL_T, SUF, VEC_T, GATHER, SCATTER, LOAD, STORE, ADD, MUL)              \
    static inline void key_row_gather_##SUF(int op, REAL_T *dst, const REAL_T *ka, size_t ldka,     \
                                            const int64_t *bucket, ptrdiff_t b_min, size_t j0,      \
                                            size_t j1)                                              \
    {                                                                                               \
        size_t j = j0;                                                                              \
        __m512i offset = key_offsets(j, ldka, b_min);                                               \
        const __m512i advance = _mm512_set1_epi64((long long)(KEY_LANES * ldka));                   \
        for (; j + KEY_LANES <= j1; j += KEY_LANES) {                                               \
            const __m512i index = _mm512_add_epi64(offset, _mm512_loadu_si512(bucket + j));        \
            VEC_T v = GATHER(index, ka, sizeof(REAL_T));                                            \
            if (op == POSENC_ADD) v = ADD(v, LOAD(dst + j));                                        \
            else if (op == POSENC_MUL) v = MUL(v, LOAD(dst + j));                                   \
            STORE(dst + j, v);                                                                      \
            offset = _mm512_add_epi64(offset, advance);                                             \
        }                                                                                           \
        for (; j < j1; ++j) {                                                                       \
            const REAL_T v = ka[j * ldka + (size_t)(bucket[j] - b_min)];                            \
            dst[j] = op == POSENC_SET ? v : op == POSENC_ADD ? dst[j] + v : dst[j] * v;             \
        }                                                                                           \
    }                                                                                               \
    static inline void key_row_scatter_##SUF(REAL_T *gk, size_t ldgk, const int64_t *bucket,        \
                                             ptrdiff_t b_min, const REAL_T *src, size_t j0,         \
                                             size_t j1)                                             \
    {                                                                                               \
        size_t j = j0;                                                                              \
        __m512i offset = key_offsets(j, ldgk, b_min);                                               \
        const __m512i advance = _mm512_set1_epi64((long long)(KEY_LANES * ldgk));                   \
        for (; j + KEY_LANES <= j1; j += KEY_LANES) {                                               \
            const __m512i index = _mm512_add_epi64(offset, _mm512_loadu_si512(bucket + j));        \
            const VEC_T sum = ADD(GATHER(index, gk, sizeof(REAL_T)), LOAD(src + j));                \
            SCATTER(gk, index, sum, sizeof(REAL_T));                                                \
            offset = _mm512_add_epi64(offset, advance);                                             \
        }                                                                                           \
        for (; j < j1; ++j)                                                                         \
            gk[j * ldgk + (size_t)(bucket[j] - b_min)] += src[j];                                   \
    }

KEY_ROW_FUNCTIONS(float, f32, __m256, _mm512_i64gather_ps, _mm512_i64scatter_ps, _mm256_loadu_ps,
                  _mm256_storeu_ps, _mm256_add_ps, _mm256_mul_ps)
KEY_ROW_FUNCTIONS(double, f64, __m512d, _mm512_i64gather_pd, _mm512_i64scatter_pd, _mm512_loadu_pd,
                  _mm512_storeu_pd, _mm512_add_pd, _mm512_mul_pd)
#undef KEY_ROW_FUNCTIONS
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
#define KEY_ROW_GATHER(...) key_row_gather_f32(__VA_ARGS__)
#define KEY_ROW_SCATTER(...) key_row_scatter_f32(__VA_ARGS__)
#define KNAME(x) x##_f32_avx512
#define KTABLE posenc_kernels_f32_avx512
#include "kernels_impl.h"
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
#define KEY_ROW_GATHER(...) key_row_gather_f64(__VA_ARGS__)
#define KEY_ROW_SCATTER(...) key_row_scatter_f64(__VA_ARGS__)
#define KNAME(x) x##_f64_avx512
#define KTABLE posenc_kernels_f64_avx512
#include "kernels_impl.h"

#endif /* AVX-512 */
