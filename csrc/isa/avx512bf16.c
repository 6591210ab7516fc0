/*
 * avx512bf16.c -- avx512's kernels that AVX512-BF16 makes faster (compiled
 * with the AVX-512 flags plus -mavx512bw -mavx512bf16, where the compiler
 * takes them; used where cpu.c finds AVX512-BF16 and AVX512-BW on top of
 * the avx512 ISA): the float -> bfloat16 rounding, which dispatch.c lays
 * over avx512's conversions, and the bfloat16 content GEMM
 * (posenc_bf16_kernels: vdpbf16ps on pair panels, docs/low_precision.md §1
 * design (b)), which engine/bf16dot.c drives.
 */
#include "../posenc.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <string.h>

#include "convert_avx512.h"
#include "transpose_avx512.h"

/* vcvtneps2bf16 rounds to nearest even and quiets NaNs as the reference
 * does, but flushes subnormal inputs to zero: a block holding one is
 * rounded by integers instead (convert_avx512.h). */
static inline __mmask16 subnormal_lanes(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
           _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

static inline __m256i bf16_narrow_avx512bf16(__m512 x)
{
    return subnormal_lanes(x) ? _mm512_cvtepi32_epi16(bf16_round_avx512(_mm512_castps_si512(x)))
                              : (__m256i)_mm512_cvtneps_pbh(x);
}

/* The same on 32 lanes, lo's then hi's, by one vcvtne2ps2bf16. */
static inline __m512i bf16_narrow2_avx512bf16(__m512 lo, __m512 hi)
{
    if (subnormal_lanes(lo) | subnormal_lanes(hi))
        return _mm512_inserti64x4(_mm512_castsi256_si512(bf16_narrow_avx512bf16(lo)),
                                  bf16_narrow_avx512bf16(hi), 1);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

static inline void f32_to_bf16_avx512bf16(uint16_t *d, const float *s)
{
    _mm256_storeu_si256((__m256i *)d, bf16_narrow_avx512bf16(_mm512_loadu_ps(s)));
}

#define CONVERT_ISA avx512bf16
#define F32_TO_BF16 f32_to_bf16_avx512bf16
#include "convert_impl.h"

/* ------------------------------------------------- the bfloat16 content GEMM */

/* Register tile MR x 2 vectors of 16 float32 lanes: 24 accumulators, 2 B
 * vectors, the broadcasts from memory, of the 32 zmm registers; a row of
 * the tile is 32 bfloat16, one 64-byte store. */
#define MR 12
#define NRV 2
#define NR (NRV * 16)
_Static_assert(NRV == 2, "the epilogue narrows a row of two vectors at once");

/* A pair of bfloat16 (elements l, l + 1 of a row: l in the low half, as
 * vdpbf16ps pairs them) broadcast to every 32-bit lane. */
static inline __m512bh pair_bcast(const uint16_t *at)
{
    uint32_t pair;
    memcpy(&pair, at, sizeof pair);
    return (__m512bh)_mm512_set1_epi32((int)pair);
}

/* The last element of an odd depth with a zero above it (no read past the row). */
static inline __m512bh last_bcast(const uint16_t *at)
{
    return (__m512bh)_mm512_set1_epi32((int)*at);
}

/* posenc_bf16_kernels.ukr (posenc.h): the depth in pairs, an odd one ending
 * on a pair of (last element, 0). */
static void bf16_ukr_avx512bf16(size_t kc, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                                uint16_t *c, ptrdiff_t ldc, size_t rows, size_t cols, float scale,
                                const float *p, ptrdiff_t ldp, int flags)
{
    __m512 acc[MR][NRV];
#pragma GCC unroll 32
    for (int t = 0; t < MR * NRV; ++t)
        acc[t / NRV][t % NRV] = _mm512_setzero_ps();

    const size_t pairs = kc / 2;
    /* one step: the pair panel row t of B against the broadcasts A_AT(r) */
#define BF16_STEP(t, BCAST, A_AT)                                                   \
    do {                                                                            \
        __m512bh bv[NRV];                                                           \
        _Pragma("GCC unroll 4")                                                     \
        for (int v = 0; v < NRV; ++v)                                               \
            bv[v] = (__m512bh)_mm512_loadu_si512(b + (t) * 2 * NR + (size_t)v * 32);\
        _Pragma("GCC unroll 16")                                                    \
        for (int r = 0; r < MR; ++r) {                                              \
            const __m512bh ar = BCAST(A_AT);                                        \
            _Pragma("GCC unroll 4")                                                 \
            for (int v = 0; v < NRV; ++v)                                           \
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);                 \
        }                                                                           \
    } while (0)
    if (rows == MR) {
        /* a full tile: rows a fixed stride apart */
        for (size_t t = 0; t < pairs; ++t)
            BF16_STEP(t, pair_bcast, a + (ptrdiff_t)r * lda + (ptrdiff_t)(2 * t));
        if (kc & 1)
            BF16_STEP(pairs, last_bcast, a + (ptrdiff_t)r * lda + (ptrdiff_t)(kc - 1));
    } else {
        /* rows past `rows` repeat the last one: read, computed, never stored */
        const uint16_t *a_row[MR];
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
            a_row[r] = a + (ptrdiff_t)((size_t)r < rows ? (size_t)r : rows - 1) * lda;
        for (size_t t = 0; t < pairs; ++t)
            BF16_STEP(t, pair_bcast, a_row[r] + 2 * t);
        if (kc & 1)
            BF16_STEP(pairs, last_bcast, a_row[r] + (kc - 1));
    }
#undef BF16_STEP

    /* The epilogue in float32, then one rounding to bfloat16 of each row's
     * 32 lanes (a partial row: the same operations on its first lanes). */
    const __m512 s = _mm512_set1_ps(scale);
    const int add = (flags & POSENC_UKR_ADD_P) != 0, mul = !add && (flags & POSENC_UKR_MUL_P);
    const __mmask32 lanes = cols >= NR ? ~(__mmask32)0 : (((__mmask32)1 << cols) - 1);
    const __mmask16 lanes_lo = (__mmask16)lanes, lanes_hi = (__mmask16)(lanes >> 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        if ((size_t)r >= rows)
            break;
        __m512 lo = _mm512_mul_ps(acc[r][0], s), hi = _mm512_mul_ps(acc[r][1], s);
        if (add || mul) {
            const float *prow = p + (ptrdiff_t)r * ldp;
            const __m512 p_lo = _mm512_maskz_loadu_ps(lanes_lo, prow);
            const __m512 p_hi = _mm512_maskz_loadu_ps(lanes_hi, prow + 16);
            lo = add ? _mm512_add_ps(lo, p_lo) : _mm512_mul_ps(lo, p_lo);
            hi = add ? _mm512_add_ps(hi, p_hi) : _mm512_mul_ps(hi, p_hi);
        }
        uint16_t *crow = c + (ptrdiff_t)r * ldc;
        if (cols >= NR && (flags & POSENC_UKR_STREAM))
            _mm512_stream_si512((__m512i *)crow, bf16_narrow2_avx512bf16(lo, hi));
        else if (cols >= NR)
            _mm512_storeu_si512(crow, bf16_narrow2_avx512bf16(lo, hi));
        else
            _mm512_mask_storeu_epi16(crow, lanes, bf16_narrow2_avx512bf16(lo, hi));
    }
}

/* A pair panel (posenc_bf16_kernels.pack): the pair t of key row c is the
 * 32-bit word t * nr + c, so blocks of 16 rows x 16 pairs are transposed as
 * words; rows and elements past the ends are read as zeros (masked loads). */
static void bf16_pack_avx512bf16(uint16_t *dst, const uint16_t *src, ptrdiff_t rs, size_t kc,
                                 size_t cols)
{
    const size_t pairs = (kc + 1) / 2;
    for (size_t c0 = 0; c0 < NR; c0 += 16) {
        for (size_t t0 = 0; t0 < pairs; t0 += 16) {
            const size_t l0 = 2 * t0, count = kc - l0 < 32 ? kc - l0 : 32;
            const __mmask32 elements = count == 32 ? ~(__mmask32)0 : (((__mmask32)1 << count) - 1);
            __m512i block[16];
#pragma GCC unroll 16
            for (size_t u = 0; u < 16; ++u)
                block[u] = c0 + u < cols ? _mm512_maskz_loadu_epi16(
                                               elements, src + (ptrdiff_t)(c0 + u) * rs + (ptrdiff_t)l0)
                                         : _mm512_setzero_si512();
            posenc_transpose_16x16_epi32(block);
            const size_t steps = pairs - t0 < 16 ? pairs - t0 : 16;
            for (size_t u = 0; u < steps; ++u)
                _mm512_storeu_si512(dst + 2 * ((t0 + u) * NR + c0), block[u]);
        }
    }
}

static void bf16_store_fence_avx512bf16(void) { _mm_sfence(); }

const posenc_bf16_kernels posenc_bf16_kernels_avx512bf16 = {
    "avx512bf16", MR, NR, bf16_ukr_avx512bf16, bf16_pack_avx512bf16, bf16_store_fence_avx512bf16,
};

#endif /* AVX512-BF16 */
