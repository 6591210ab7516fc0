/*
 * vector_exp.h -- exp and max of one vector, the hooks of softmax_impl.h
 * (the fused attention's softmax rows), for the ISA its file is compiled
 * for: included by isa/avx512.c, isa/avx2.c and isa/neon.c (the scalar ISA
 * has no hook: libm's exp).  VEXP(v) and VMAX(a, b) pick the float or the
 * double version by the vector's type, as do VMAX_NUMBERS(a, b) (lane by
 * lane, a NaN lane counted as -inf) and VMAX_LANES(v) (the largest lane
 * that is not NaN, -inf when there is none), which let a row's maximum
 * take its tail as one more full vector and end in a few steps, not in a
 * chain of VL scalar comparisons.
 *
 * exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln 2 in two parts
 * (Cody-Waite; ln 2's high part, EXP_LN2_HI_*, has trailing zero bits, so n
 * times it is exact), exp(r) on |r| <= ln(2)/2 by its Taylor polynomial
 * (degree 7 in float: truncation below 5e-9; 13 in double: below 5e-18),
 * Horner with FMA.  -inf and arguments whose exp underflows give +0
 * exactly (a masked logit); NaN stays NaN; +inf and overflowing arguments
 * give +inf.  The softmax rows' float exp on AVX-512 and AVX2
 * (VSOFTMAX_EXP, posenc_softmax_exp_f32) is 2^t, t = (x - shift) log2 e,
 * split at floor(t) instead: the same special values, fewer operations.
 */
#ifndef POSENC_VECTOR_EXP_H
#define POSENC_VECTOR_EXP_H

#define EXP_LOG2E 1.4426950408889634
#define EXP_LN2_HI_F 0.693359375f                      /* Cephes: 9 significant bits */
#define EXP_LN2_LO_F -2.12194440e-4f
#define EXP_LN2_HI_D 6.93147180369123816490e-01        /* fdlibm: 32 significant bits */
#define EXP_LN2_LO_D 1.90821492927058770002e-10

/* Taylor coefficients 1/k!, highest first, through Horner: p = c[0]; p = p r + c[k]. */
#define EXP_POLY(T, FMA, BCAST, r, degree, result)                           \
    do {                                                                     \
        static const double inverse_factorial[14] = {                        \
            1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720,      \
            1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800,            \
            1.0 / 39916800, 1.0 / 479001600, 1.0 / 6227020800.0};            \
        T acc_ = BCAST(inverse_factorial[(degree)]);                         \
        _Pragma("GCC unroll 16")                                             \
        for (int k_ = (degree) - 1; k_ >= 0; --k_)                           \
            acc_ = FMA(acc_, (r), BCAST(inverse_factorial[k_]));             \
        (result) = acc_;                                                     \
    } while (0)

/*
 * 2^r on [0, 1], r = t - floor(t), for the softmax rows' 2^t (AVX-512's and AVX2's
 * posenc_softmax_exp_f32, AVX-512's bfloat16 exp): polynomials minimax in relative error
 * (float Horner, highest coefficient last).  Degree 6 (float's softmax): within 6.2e-8;
 * degree 4 (bfloat16's, whose P is rounded to 2^-8): within 2.7e-6
 * (_dtypes.SOFTMAX_EXP_ERROR).
 */
static const float posenc_exp2_poly6[7] = {
    1.0f, 0.6931470036506653f, 0.24022983014583588f, 0.055483341217041016f,
    0.009678840637207031f, 0.001243968727067113f, 0.00021702254889532924f};
static const float posenc_exp2_poly4[5] = {
    1.0000026226043701f, 0.6930038332939148f, 0.2414427548646927f, 0.052011460065841675f,
    0.013534167781472206f};

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>

#define EXP_VF32 __m512
#define EXP_VF64 __m512d
#define EXP_MAX_F32 _mm512_max_ps
#define EXP_MAX_F64 _mm512_max_pd
#define EXP_SET_F32 _mm512_set1_ps
#define EXP_SET_F64 _mm512_set1_pd
#define EXP_EQ_F32(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ)
#define EXP_EQ_F64(a, b) _mm512_cmp_pd_mask((a), (b), _CMP_EQ_OQ)
#define EXP_SELECT_F32(mask, a, b) _mm512_mask_blend_ps((mask), (b), (a))
#define EXP_SELECT_F64(mask, a, b) _mm512_mask_blend_pd((mask), (b), (a))
#define EXP_HMAX_F32 _mm512_reduce_max_ps
#define EXP_HMAX_F64 _mm512_reduce_max_pd
#define EXP_LT_F32(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define EXP_LT_F64(a, b) _mm512_cmp_pd_mask((a), (b), _CMP_LT_OQ)
#define EXP_MIN_F32 _mm512_min_ps
#define EXP_MIN_F64 _mm512_min_pd
#define EXP_MUL_F32 _mm512_mul_ps
#define EXP_MUL_F64 _mm512_mul_pd
#define EXP_ADD_F32 _mm512_add_ps
#define EXP_ADD_F64 _mm512_add_pd
#define EXP_DIV_F32 _mm512_div_ps
#define EXP_DIV_F64 _mm512_div_pd
#define EXP_FMA_F32 _mm512_fmadd_ps
#define EXP_FMA_F64 _mm512_fmadd_pd
#define EXP_ALL_F32(mask) ((mask) == 0xFFFF)
#define EXP_ALL_F64(mask) ((mask) == 0xFF)

/* AVX-512: scalef builds 2^n itself, with the underflow to 0 and the
 * overflow to inf, so only the argument is clamped (NaN passes: max and min
 * return their second operand when one is NaN). */
static inline __m512 posenc_vexp_f32(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-120.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps((float)EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI_F), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO_F), r);
    __m512 p;
#define BCAST_PS512(c) _mm512_set1_ps((float)(c))
    EXP_POLY(__m512, _mm512_fmadd_ps, BCAST_PS512, r, 7, p);
#undef BCAST_PS512
    return _mm512_scalef_ps(p, n);
}

/*
 * 2^t for the softmax rows' exps below: r = t - floor(t) in [0, 1) by vreduceps
 * (exact), 2^r by posenc_exp2_poly6 or _poly4 (above), and scalef(2^r, t), which
 * scales by 2^floor(t) with the underflow to 0 and the overflow to inf.  No clamp:
 * t = -inf gives r = 0 and +0, t = +inf +inf, NaN stays NaN.
 */

static inline __m512 posenc_exp2_poly(__m512 t, const float *poly, int degree)
{
    const __m512 r = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(poly[degree]);
    _Pragma("GCC unroll 8")   /* the constants in registers, not broadcast from memory */
    for (int k = degree - 1; k >= 0; --k)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(poly[k]));
    return _mm512_scalef_ps(p, t);
}

/* float's softmax exp(x + c), c = -shift (softmax_impl.h's row_exp): y = x + c, exact
 * where x is within a factor 2 of the shift (the row's largest probabilities), then
 * 2^(y log2(e)), t's rounding a logit error of 2^-24 |y| as Cody-Waite's float
 * reduction's; 11 vector operations with the row's sum where posenc_vexp_f32 takes 15.
 * (c = -shift log2(e) folded into one FMA, as bfloat16's below, saves one more but rounds
 * c: the backward's P = exp(S - lse), whose lse no normalisation cancels, 10-30 % further
 * from float64 in RMS.) */
static inline __m512 posenc_softmax_exp_f32(__m512 x, __m512 c)
{
    const __m512 y = _mm512_add_ps(x, c);
    return posenc_exp2_poly(_mm512_mul_ps(y, _mm512_set1_ps((float)EXP_LOG2E)), posenc_exp2_poly6, 6);
}
#define POSENC_SOFTMAX_EXP_F32 1

/* bfloat16's softmax exp(x - shift) (isa/avx512bf16.c's exp_row and grad_row) as 2^t,
 * t = x log2(e) + c by one FMA, c = -shift log2(e) rounded once (posenc_bf16_shift, with
 * float's log2(e): t - (x - shift) log2(e) is that rounding, common to the row, and t's
 * own, a logit error of 2^-24 |x - shift|). */
static inline __m512 posenc_bf16_shift(double shift)
{
    return _mm512_set1_ps((float)(-shift * (double)(float)EXP_LOG2E));
}
static inline __m512 posenc_softmax_exp_bf16(__m512 x, __m512 c)
{
    return posenc_exp2_poly(_mm512_fmadd_ps(x, _mm512_set1_ps((float)EXP_LOG2E), c),
                            posenc_exp2_poly4, 4);
}

static inline __m512d posenc_vexp_f64(__m512d x)
{
    x = _mm512_min_pd(_mm512_set1_pd(710.0), _mm512_max_pd(_mm512_set1_pd(-750.0), x));
    const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(EXP_LOG2E)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(EXP_LN2_HI_D), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(EXP_LN2_LO_D), r);
    __m512d p;
    EXP_POLY(__m512d, _mm512_fmadd_pd, _mm512_set1_pd, r, 13, p);
    return _mm512_scalef_pd(p, n);
}



#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define EXP_VF32 __m256
#define EXP_VF64 __m256d
#define EXP_MAX_F32 _mm256_max_ps
#define EXP_MAX_F64 _mm256_max_pd
#define EXP_SET_F32 _mm256_set1_ps
#define EXP_SET_F64 _mm256_set1_pd
#define EXP_EQ_F32(a, b) _mm256_cmp_ps((a), (b), _CMP_EQ_OQ)
#define EXP_EQ_F64(a, b) _mm256_cmp_pd((a), (b), _CMP_EQ_OQ)
#define EXP_SELECT_F32(mask, a, b) _mm256_blendv_ps((b), (a), (mask))
#define EXP_SELECT_F64(mask, a, b) _mm256_blendv_pd((b), (a), (mask))
#define EXP_HMAX_F32 posenc_hmax_ps256
#define EXP_HMAX_F64 posenc_hmax_pd256
#define EXP_LT_F32(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define EXP_LT_F64(a, b) _mm256_cmp_pd((a), (b), _CMP_LT_OQ)
#define EXP_MIN_F32 _mm256_min_ps
#define EXP_MIN_F64 _mm256_min_pd
#define EXP_MUL_F32 _mm256_mul_ps
#define EXP_MUL_F64 _mm256_mul_pd
#define EXP_ADD_F32 _mm256_add_ps
#define EXP_ADD_F64 _mm256_add_pd
#define EXP_DIV_F32 _mm256_div_ps
#define EXP_DIV_F64 _mm256_div_pd
#define EXP_FMA_F32 _mm256_fmadd_ps
#define EXP_FMA_F64 _mm256_fmadd_pd
#define EXP_ALL_F32(mask) (_mm256_movemask_ps(mask) == 0xFF)
#define EXP_ALL_F64(mask) (_mm256_movemask_pd(mask) == 0xF)

/* the largest lane (no NaN lanes): halves, then quarters, then the pair */
static inline float posenc_hmax_ps256(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline double posenc_hmax_pd256(__m256d v)
{
    const __m128d m = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_max_sd(m, _mm_unpackhi_pd(m, m)));
}

/* AVX2: 2^n from n's bits (vector_exp_impl.h) */
static inline __m256 posenc_pow2_ps256(__m256 n)
{
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

/* n + 1023 into the low bits of 2^52 + n + 1023, then shifted into the exponent */
static inline __m256d posenc_pow2_pd256(__m256d n)
{
    const __m256d biased = _mm256_add_pd(n, _mm256_set1_pd(4503599627370496.0 + 1023.0));
    return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_castpd_si256(biased), 52));
}

/*
 * float's softmax exp(x + c), c = -shift (softmax_impl.h's row_exp), as AVX-512's
 * posenc_softmax_exp_f32 without vreduceps and scalef: y = x + c, t = y log2(e)
 * clamped to [-127, 128], n = floor(t), r = t - n in [0, 1) exactly, 2^r by
 * posenc_exp2_poly6 times 2^n from n's bits.  n = -127 gives the bits of +0 (results
 * below 2^-126 flushed, as posenc_vexp_f32 flushes them), n = 128 those of +inf; -inf
 * gives +0, +inf +inf, NaN NaN (max and min return their second operand, t, when it
 * is NaN).  16 vector operations with the row's sum where posenc_vexp_f32 (Cody-Waite,
 * clamps and selects) takes 23.
 */
static inline __m256 posenc_softmax_exp_f32(__m256 x, __m256 c)
{
    __m256 t = _mm256_mul_ps(_mm256_add_ps(x, c), _mm256_set1_ps((float)EXP_LOG2E));
    t = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), t));
    const __m256 n = _mm256_floor_ps(t);
    const __m256 r = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(posenc_exp2_poly6[6]);
    _Pragma("GCC unroll 8")
    for (int k = 5; k >= 0; --k)
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(posenc_exp2_poly6[k]));
    return _mm256_mul_ps(p, posenc_pow2_ps256(n));
}
#define POSENC_SOFTMAX_EXP_F32 1

#define EXP_F32
#define EXP_NAME posenc_vexp_f32
#define EXP_VT __m256
#define EXP_MASK __m256
#define EXP_SET(c) _mm256_set1_ps((float)(c))
#define EXP_MUL(a, b) _mm256_mul_ps((a), (b))
#define EXP_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define EXP_FNMADD(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define EXP_MIN(a, b) _mm256_min_ps((a), (b))
#define EXP_MAX(a, b) _mm256_max_ps((a), (b))
#define EXP_ROUND(a) _mm256_round_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define EXP_LT(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define EXP_GT(a, b) _mm256_cmp_ps((a), (b), _CMP_GT_OQ)
#define EXP_ZERO_WHERE(mask, v) _mm256_andnot_ps((mask), (v))
#define EXP_SELECT(mask, a, b) _mm256_blendv_ps((b), (a), (mask))
#define EXP_POW2(n) posenc_pow2_ps256(n)
#include "vector_exp_impl.h"

#define EXP_NAME posenc_vexp_f64
#define EXP_VT __m256d
#define EXP_MASK __m256d
#define EXP_SET(c) _mm256_set1_pd((double)(c))
#define EXP_MUL(a, b) _mm256_mul_pd((a), (b))
#define EXP_FMA(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define EXP_FNMADD(a, b, c) _mm256_fnmadd_pd((a), (b), (c))
#define EXP_MIN(a, b) _mm256_min_pd((a), (b))
#define EXP_MAX(a, b) _mm256_max_pd((a), (b))
#define EXP_ROUND(a) _mm256_round_pd((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define EXP_LT(a, b) _mm256_cmp_pd((a), (b), _CMP_LT_OQ)
#define EXP_GT(a, b) _mm256_cmp_pd((a), (b), _CMP_GT_OQ)
#define EXP_ZERO_WHERE(mask, v) _mm256_andnot_pd((mask), (v))
#define EXP_SELECT(mask, a, b) _mm256_blendv_pd((b), (a), (mask))
#define EXP_POW2(n) posenc_pow2_pd256(n)
#include "vector_exp_impl.h"



#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define EXP_VF32 float32x4_t
#define EXP_VF64 float64x2_t
#define EXP_MAX_F32 vmaxq_f32
#define EXP_MAX_F64 vmaxq_f64
#define EXP_SET_F32 vdupq_n_f32
#define EXP_SET_F64 vdupq_n_f64
#define EXP_EQ_F32 vceqq_f32
#define EXP_EQ_F64 vceqq_f64
#define EXP_SELECT_F32 vbslq_f32
#define EXP_SELECT_F64 vbslq_f64
#define EXP_HMAX_F32 vmaxvq_f32
#define EXP_HMAX_F64 vmaxvq_f64
#define EXP_LT_F32 vcltq_f32
#define EXP_LT_F64 vcltq_f64
#define EXP_MIN_F32 vminq_f32
#define EXP_MIN_F64 vminq_f64
#define EXP_MUL_F32 vmulq_f32
#define EXP_MUL_F64 vmulq_f64
#define EXP_ADD_F32 vaddq_f32
#define EXP_ADD_F64 vaddq_f64
#define EXP_DIV_F32 vdivq_f32
#define EXP_DIV_F64 vdivq_f64
#define EXP_FMA_F32(a, b, c) vfmaq_f32((c), (a), (b))
#define EXP_FMA_F64(a, b, c) vfmaq_f64((c), (a), (b))
#define EXP_ALL_F32(mask) (vminvq_u32(mask) != 0)
#define EXP_ALL_F64(mask) (vminvq_u32(vreinterpretq_u32_u64(mask)) != 0)

/* NEON: as AVX2 (2^n from n's bits); vmaxq/vminq propagate NaN. */
static inline float32x4_t posenc_pow2_f32x4(float32x4_t n)
{
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}

static inline float64x2_t posenc_pow2_f64x2(float64x2_t n)
{
    return vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(vcvtq_s64_f64(n), vdupq_n_s64(1023)), 52));
}

#define EXP_F32
#define EXP_NAME posenc_vexp_f32
#define EXP_VT float32x4_t
#define EXP_MASK uint32x4_t
#define EXP_SET(c) vdupq_n_f32((float)(c))
#define EXP_MUL(a, b) vmulq_f32((a), (b))
#define EXP_FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define EXP_FNMADD(a, b, c) vfmsq_f32((c), (a), (b))
#define EXP_MIN(a, b) vminq_f32((a), (b))
#define EXP_MAX(a, b) vmaxq_f32((a), (b))
#define EXP_ROUND(a) vrndnq_f32(a)
#define EXP_LT(a, b) vcltq_f32((a), (b))
#define EXP_GT(a, b) vcgtq_f32((a), (b))
#define EXP_ZERO_WHERE(mask, v) vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), (mask)))
#define EXP_SELECT(mask, a, b) vbslq_f32((mask), (a), (b))
#define EXP_POW2(n) posenc_pow2_f32x4(n)
#include "vector_exp_impl.h"

#define EXP_NAME posenc_vexp_f64
#define EXP_VT float64x2_t
#define EXP_MASK uint64x2_t
#define EXP_SET(c) vdupq_n_f64((double)(c))
#define EXP_MUL(a, b) vmulq_f64((a), (b))
#define EXP_FMA(a, b, c) vfmaq_f64((c), (a), (b))
#define EXP_FNMADD(a, b, c) vfmsq_f64((c), (a), (b))
#define EXP_MIN(a, b) vminq_f64((a), (b))
#define EXP_MAX(a, b) vmaxq_f64((a), (b))
#define EXP_ROUND(a) vrndnq_f64(a)
#define EXP_LT(a, b) vcltq_f64((a), (b))
#define EXP_GT(a, b) vcgtq_f64((a), (b))
#define EXP_ZERO_WHERE(mask, v) vreinterpretq_f64_u64(vbicq_u64(vreinterpretq_u64_f64(v), (mask)))
#define EXP_SELECT(mask, a, b) vbslq_f64((mask), (a), (b))
#define EXP_POW2(n) posenc_pow2_f64x2(n)
#include "vector_exp_impl.h"



#endif

#ifdef EXP_VF32   /* the ISA's float and double vectors */
static inline EXP_VF32 posenc_vmax_f32(EXP_VF32 a, EXP_VF32 b) { return EXP_MAX_F32(a, b); }
static inline EXP_VF64 posenc_vmax_f64(EXP_VF64 a, EXP_VF64 b) { return EXP_MAX_F64(a, b); }

/* v with its NaN lanes set to -inf (a lane equals itself unless it is NaN) */
static inline EXP_VF32 posenc_numbers_f32(EXP_VF32 v)
{
    EXP_VF32 minus_inf = EXP_SET_F32(-__builtin_inff());
    return EXP_SELECT_F32(EXP_EQ_F32(v, v), v, minus_inf);
}
static inline EXP_VF64 posenc_numbers_f64(EXP_VF64 v)
{
    EXP_VF64 minus_inf = EXP_SET_F64(-__builtin_inf());
    return EXP_SELECT_F64(EXP_EQ_F64(v, v), v, minus_inf);
}
static inline EXP_VF32 posenc_vmax_numbers_f32(EXP_VF32 a, EXP_VF32 b)
{
    return EXP_MAX_F32(posenc_numbers_f32(a), posenc_numbers_f32(b));
}
static inline EXP_VF64 posenc_vmax_numbers_f64(EXP_VF64 a, EXP_VF64 b)
{
    return EXP_MAX_F64(posenc_numbers_f64(a), posenc_numbers_f64(b));
}
static inline float posenc_vmax_lanes_f32(EXP_VF32 v) { return EXP_HMAX_F32(posenc_numbers_f32(v)); }
static inline double posenc_vmax_lanes_f64(EXP_VF64 v) { return EXP_HMAX_F64(posenc_numbers_f64(v)); }

/*
 * tanh of one vector (the softcap of SPEC §7: softmax_impl.h's row_softcap):
 * for |u| below `small` its odd Taylor polynomial to u^13 (truncation below
 * 1e-10 relative at 0.3 in float, 4e-16 at 0.125 in double), else
 * (e - 1) / (e + 1) with e = exp(2 |u|), |u| capped at `large` (tanh is 1 there
 * to the type's precision), its sign restored; relative error a few ulp.  NaN
 * stays NaN.
 */
#define POSENC_VTANH(S, s, T, SMALL, LARGE)                                                \
    static inline T posenc_vtanh_##s(T u)                                                   \
    {                                                                                       \
        const T one = EXP_SET_##S(1), minus_one = EXP_SET_##S(-1);                          \
        const T a = EXP_MIN_##S(EXP_SET_##S(LARGE), EXP_MAX_##S(u, EXP_MUL_##S(u, minus_one))); \
        static const double c[7] = {1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835,       \
                                    -1382.0 / 155925, 21844.0 / 6081075};                   \
        const T u2 = EXP_MUL_##S(u, u);                                                     \
        T p = EXP_SET_##S(c[6]);                                                            \
        for (int k_ = 5; k_ >= 0; --k_)                                                     \
            p = EXP_FMA_##S(p, u2, EXP_SET_##S(c[k_]));                                     \
        p = EXP_MUL_##S(p, u);                                                              \
        const __typeof__(EXP_LT_##S(a, a)) small = EXP_LT_##S(a, EXP_SET_##S(SMALL));       \
        if (EXP_ALL_##S(small))   /* logits well inside the cap: the polynomial alone */    \
            return p;                                                                       \
        const T e = posenc_vexp_##s(EXP_ADD_##S(a, a));                                      \
        const T r = EXP_DIV_##S(EXP_ADD_##S(e, minus_one), EXP_ADD_##S(e, one));             \
        const T big = EXP_SELECT_##S(EXP_LT_##S(u, EXP_SET_##S(0)), EXP_MUL_##S(r, minus_one), r); \
        return EXP_SELECT_##S(small, p, big);                                               \
    }
POSENC_VTANH(F32, f32, EXP_VF32, 0.3, 9.5)
POSENC_VTANH(F64, f64, EXP_VF64, 0.125, 19.5)
#undef POSENC_VTANH

/* The softmax rows' exp(x + c), c = -shift in the type (softmax_impl.h's row_exp):
 * AVX-512's float by 2^t (posenc_softmax_exp_f32), the others exp(x + c). */
#ifndef POSENC_SOFTMAX_EXP_F32
static inline EXP_VF32 posenc_softmax_exp_f32(EXP_VF32 x, EXP_VF32 c)
{
    return posenc_vexp_f32(EXP_ADD_F32(x, c));
}
#endif
static inline EXP_VF64 posenc_softmax_exp_f64(EXP_VF64 x, EXP_VF64 c)
{
    return posenc_vexp_f64(EXP_ADD_F64(x, c));
}
#define VSOFTMAX_EXP(x, c) \
    _Generic((x), EXP_VF32: posenc_softmax_exp_f32, EXP_VF64: posenc_softmax_exp_f64)((x), (c))

#define VEXP(v) _Generic((v), EXP_VF32: posenc_vexp_f32, EXP_VF64: posenc_vexp_f64)(v)
#define VTANH(v) _Generic((v), EXP_VF32: posenc_vtanh_f32, EXP_VF64: posenc_vtanh_f64)(v)
#define VMAX(a, b) _Generic((a), EXP_VF32: posenc_vmax_f32, EXP_VF64: posenc_vmax_f64)((a), (b))
#define VMAX_NUMBERS(a, b) \
    _Generic((a), EXP_VF32: posenc_vmax_numbers_f32, EXP_VF64: posenc_vmax_numbers_f64)((a), (b))
#define VMAX_LANES(v) _Generic((v), EXP_VF32: posenc_vmax_lanes_f32, EXP_VF64: posenc_vmax_lanes_f64)(v)
#endif
#endif /* POSENC_VECTOR_EXP_H */
