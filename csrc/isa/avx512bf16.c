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
#include "vector_exp.h"   /* posenc_softmax_exp_bf16: the softmax's exp */

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

/* The accumulators of an MR x NR tile: A as bfloat16 rows (a_rows: row r at
 * a + r * lda, rows past `rows` repeat the last one: read, computed, never
 * stored) or as a pair panel (word t * lda + r), the depth kc in pairs, an
 * odd one ending on a pair of (last element, 0). */
static inline __attribute__((always_inline)) void
bf16_tile(__m512 acc[MR][NRV], size_t kc, const uint16_t *a, ptrdiff_t lda, int a_rows,
          const uint16_t *b, size_t rows)
{
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
    if (!a_rows) {
        /* a pair panel: constant offsets, its odd depth padded with zeros */
        for (size_t t = 0; t < (kc + 1) / 2; ++t)
            BF16_STEP(t, pair_bcast, a + 2 * ((ptrdiff_t)t * lda + r));
    } else if (rows == MR) {
        /* a full tile: rows a fixed stride apart */
        for (size_t t = 0; t < pairs; ++t)
            BF16_STEP(t, pair_bcast, a + (ptrdiff_t)r * lda + (ptrdiff_t)(2 * t));
        if (kc & 1)
            BF16_STEP(pairs, last_bcast, a + (ptrdiff_t)r * lda + (ptrdiff_t)(kc - 1));
    } else {
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
}

/* posenc_bf16_kernels.ukr_f32 (posenc.h): float32 results through the
 * float32 microkernel's epilogue (ukr_impl.h): s A.B, + C (ACCUMULATE), + or
 * * P, + the row pointers' (ADD_ROWS), stored for rows x cols; with
 * POSENC_UKR_BF16_OUT each row's 32 lanes rounded to bfloat16 at once. */
static void bf16_ukr_f32_avx512bf16(size_t kc, const uint16_t *a, ptrdiff_t lda,
                                    const uint16_t *b, float *c, ptrdiff_t ldc, size_t rows,
                                    size_t cols, float scale, const float *p, ptrdiff_t ldp,
                                    const void *const *add_rows, int flags)
{
    __m512 acc[MR][NRV];
    bf16_tile(acc, kc, a, lda, (flags & POSENC_UKR_A_ROWS) != 0, b, rows);

    const __m512 s = _mm512_set1_ps(scale);
    const int add = (flags & POSENC_UKR_ADD_P) != 0, mul = !add && (flags & POSENC_UKR_MUL_P);
    const int stream = cols >= NR && (flags & POSENC_UKR_STREAM);
    if (flags & POSENC_UKR_BF16_OUT) {
        /* a row's 32 lanes at once: masked loads (zeros past cols), one rounding */
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
            if (flags & POSENC_UKR_ADD_ROWS) {
                const float *qrow = (const float *)add_rows[r];
                lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(lanes_lo, qrow));
                hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(lanes_hi, qrow + 16));
            }
            uint16_t *crow = (uint16_t *)(void *)c + (ptrdiff_t)r * ldc;
            const __m512i narrow = bf16_narrow2_avx512bf16(lo, hi);
            if (stream)
                _mm512_stream_si512((__m512i *)crow, narrow);
            else if (cols >= NR)
                _mm512_storeu_si512(crow, narrow);
            else
                _mm512_mask_storeu_epi16(crow, lanes, narrow);
        }
        return;
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        if ((size_t)r >= rows)
            break;
        const float *prow = p ? p + (ptrdiff_t)r * ldp : NULL;
        const float *qrow = (flags & POSENC_UKR_ADD_ROWS) ? (const float *)add_rows[r] : NULL;
        float *crow = c + (ptrdiff_t)r * ldc;
#pragma GCC unroll 2
        for (int v = 0; v < NRV; ++v) {
            const size_t col = (size_t)v * 16;
            if (col >= cols)
                break;
            /* a full vector by plain loads and stores (masked stores are slow on
             * AMD's cores), the last one of a partial row masked */
            const int full = cols - col >= 16;
            const __mmask16 m = full ? (__mmask16)0xffff
                                     : (__mmask16)(((unsigned)1 << (cols - col)) - 1);
#define UKR_F32_LOAD(at) (full ? _mm512_loadu_ps(at) : _mm512_maskz_loadu_ps(m, (at)))
            __m512 x = _mm512_mul_ps(acc[r][v], s);
            if (flags & POSENC_UKR_ACCUMULATE)
                x = _mm512_add_ps(x, UKR_F32_LOAD(crow + col));
            if (add)
                x = _mm512_add_ps(x, UKR_F32_LOAD(prow + col));
            else if (mul)
                x = _mm512_mul_ps(x, UKR_F32_LOAD(prow + col));
            if (qrow)
                x = _mm512_add_ps(x, UKR_F32_LOAD(qrow + col));
#undef UKR_F32_LOAD
            if (stream)
                _mm512_stream_ps(crow + col, x);
            else if (full)
                _mm512_storeu_ps(crow + col, x);
            else
                _mm512_mask_storeu_ps(crow + col, m, x);
        }
    }
}

/* posenc_bf16_kernels.ukr (posenc.h): bfloat16 A rows and results. */
static void bf16_ukr_avx512bf16(size_t kc, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                                uint16_t *c, ptrdiff_t ldc, size_t rows, size_t cols, float scale,
                                const float *p, ptrdiff_t ldp, int flags)
{
    const int epilogue = flags & (POSENC_UKR_ADD_P | POSENC_UKR_MUL_P | POSENC_UKR_STREAM);
    bf16_ukr_f32_avx512bf16(kc, a, lda, b, (float *)(void *)c, ldc, rows, cols, scale, p, ldp,
                            NULL, epilogue | POSENC_UKR_A_ROWS | POSENC_UKR_BF16_OUT);
}

/* Up to 32 elements of one row of B^T from l0 as 32 bfloat16 (zeros past
 * `count`): loaded as they are, or rounded from float32 (vcvtne2ps2bf16). */
static inline __attribute__((always_inline)) __m512i
bf16_load_row(const void *row, size_t l0, size_t count, int from_f32)
{
    const __mmask32 elements = count >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << count) - 1);
    if (!from_f32)
        return _mm512_maskz_loadu_epi16(elements, (const uint16_t *)row + l0);
    const float *x = (const float *)row + l0;
    const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)elements, x);
    const __m512 hi = _mm512_maskz_loadu_ps((__mmask16)(elements >> 16), x + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* A pair panel from rows of B^T (pack, pack_f32): the pair t of key row c is
 * the 32-bit word t * nr + c, so blocks of 16 rows x 16 pairs are transposed
 * as words; rows and elements past the ends are read as zeros (masked loads). */
static inline __attribute__((always_inline)) void
bf16_pack_panel(uint16_t *dst, const void *src, ptrdiff_t rs, size_t kc, size_t cols, int from_f32)
{
    const size_t pairs = (kc + 1) / 2, size = from_f32 ? sizeof(float) : sizeof(uint16_t);
    for (size_t c0 = 0; c0 < NR; c0 += 16) {
        for (size_t t0 = 0; t0 < pairs; t0 += 16) {
            const size_t l0 = 2 * t0, count = kc - l0 < 32 ? kc - l0 : 32;
            __m512i block[16];
#pragma GCC unroll 16
            for (size_t u = 0; u < 16; ++u)
                block[u] = c0 + u < cols
                               ? bf16_load_row((const char *)src +
                                                   (ptrdiff_t)((c0 + u) * size) * rs,
                                               l0, count, from_f32)
                               : _mm512_setzero_si512();
            posenc_transpose_16x16_epi32(block);
            const size_t steps = pairs - t0 < 16 ? pairs - t0 : 16;
            for (size_t u = 0; u < steps; ++u)
                _mm512_storeu_si512(dst + 2 * ((t0 + u) * NR + c0), block[u]);
        }
    }
}

static void bf16_pack_avx512bf16(uint16_t *dst, const uint16_t *src, ptrdiff_t rs, size_t kc,
                                 size_t cols)
{
    bf16_pack_panel(dst, src, rs, kc, cols, 0);
}

static void bf16_pack_f32_avx512bf16(uint16_t *dst, const float *src, ptrdiff_t rs, size_t kc,
                                     size_t cols)
{
    bf16_pack_panel(dst, src, rs, kc, cols, 1);
}

/* 16 pairs: word c holds x0[c] (its low half) and x1[c], rounded to bfloat16. */
static inline __m512i bf16_interleave(__m512 x0, __m512 x1)
{
    const __m512i index = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(index, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
}

/* 16 pairs from bfloat16: word c holds y0[c] (its low half) and y1[c]. */
static inline __m512i bf16_interleave16(__m256i y0, __m256i y1)
{
    return _mm512_or_si512(_mm512_cvtepu16_epi32(y0),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(y1), 16));
}

/* 32 pairs from bfloat16: words c of *lo and *hi hold (a[c], b[c]) and (a[16 + c],
 * b[16 + c]), a's in the low half: two vpermt2w for what bf16_interleave16 takes
 * six instructions and four loads to do for 16. */
static inline void bf16_interleave32(__m512i a, __m512i b, __m512i *lo, __m512i *hi)
{
    static const uint16_t index[2][32] = {
        {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
         8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
        {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
         24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
    *lo = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(index[0]), b);
    *hi = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(index[1]), b);
}

/* pack_pairs and pack_pairs16: per pair row t (in order, so that the
 * source's rows are read along their length), 16 columns at a time: rows
 * 2 t and 2 t + 1 rounded by one vcvtne2ps2bf16 and interleaved by one
 * vpermw (float32), or widened and merged (bfloat16), each lane masked to
 * its column's depth range (per tile of columns); whole vectors stored
 * (masked stores are slow on AMD's cores): zeros past `cols`, and the words
 * past `width` overwritten by the next pair row's or left in the slack
 * after the panel. */
static inline __attribute__((always_inline)) void
bf16_pack_pairs_body(uint16_t *dst, size_t width, const void *src, ptrdiff_t rs,
                     const size_t *ranges, size_t tile, size_t cols, int from_f32)
{
    enum { CHUNKS = 8 };   /* width <= 128 */
    __m512i lo[CHUNKS], hi[CHUNKS];   /* per lane: its column's range, 0 past cols */
    /* per pair of chunks 2 b, 2 b + 1 with all 32 columns < cols: the depths every one
     * of its columns holds, [whole_lo[b], whole_hi[b]) (bfloat16: bf16_interleave32) */
    size_t whole_lo[CHUNKS / 2], whole_hi[CHUNKS / 2];
    size_t end = 0;
    const size_t chunks = (width + 15) / 16;
    for (size_t k = 0; k < chunks && k < CHUNKS; ++k) {
        uint32_t l0[16], l1[16];
        if (k % 2 == 0) {
            whole_lo[k / 2] = 0;
            whole_hi[k / 2] = 16 * k + 32 <= cols && 16 * k + 32 <= width ? SIZE_MAX : 0;
        }
        for (size_t lane = 0; lane < 16; ++lane) {
            const size_t c = 16 * k + lane, r = c < cols && c < width ? c / tile : 0;
            l0[lane] = c < cols && c < width ? (uint32_t)ranges[2 * r] : 0;
            l1[lane] = c < cols && c < width ? (uint32_t)ranges[2 * r + 1] : 0;
            end = l1[lane] > end ? l1[lane] : end;
            whole_lo[k / 2] = l0[lane] > whole_lo[k / 2] ? l0[lane] : whole_lo[k / 2];
            whole_hi[k / 2] = l1[lane] < whole_hi[k / 2] ? l1[lane] : whole_hi[k / 2];
        }
        lo[k] = _mm512_loadu_si512(l0);
        hi[k] = _mm512_loadu_si512(l1);
    }
    uint32_t *out = (uint32_t *)(void *)dst;
    for (size_t t = 0; 2 * t < end; ++t) {
        const __m512i even = _mm512_set1_epi32((int)(2 * t));
        const __m512i odd = _mm512_set1_epi32((int)(2 * t + 1));
        for (size_t k = 0; k < chunks && k < CHUNKS; ++k) {
            if (!from_f32 && k % 2 == 0 && whole_lo[k / 2] <= 2 * t &&
                2 * t + 1 < whole_hi[k / 2]) {   /* 32 columns, both rows in every one's range */
                const uint16_t *y = (const uint16_t *)src + (ptrdiff_t)(2 * t) * rs + 16 * k;
                __m512i words_lo, words_hi;
                bf16_interleave32(_mm512_loadu_si512(y), _mm512_loadu_si512(y + rs), &words_lo,
                                  &words_hi);
                _mm512_storeu_si512(out + t * width + 16 * k, words_lo);
                _mm512_storeu_si512(out + t * width + 16 * k + 16, words_hi);
                ++k;
                continue;
            }
            const __mmask16 m0 = _mm512_cmple_epu32_mask(lo[k], even) &
                                 _mm512_cmplt_epu32_mask(even, hi[k]);
            const __mmask16 m1 = _mm512_cmple_epu32_mask(lo[k], odd) &
                                 _mm512_cmplt_epu32_mask(odd, hi[k]);
            /* a row's address is formed only where a lane reads it */
            const ptrdiff_t at0 = (ptrdiff_t)(2 * t) * rs + (ptrdiff_t)(16 * k), at1 = at0 + rs;
            __m512i words;
            if (from_f32) {
                const float *x = (const float *)src;
                words = bf16_interleave(
                    m0 ? _mm512_maskz_loadu_ps(m0, x + at0) : _mm512_setzero_ps(),
                    m1 ? _mm512_maskz_loadu_ps(m1, x + at1) : _mm512_setzero_ps());
            } else {
                const uint16_t *y = (const uint16_t *)src;
                words = bf16_interleave16(
                    m0 ? _mm256_maskz_loadu_epi16(m0, y + at0) : _mm256_setzero_si256(),
                    m1 ? _mm256_maskz_loadu_epi16(m1, y + at1) : _mm256_setzero_si256());
            }
            _mm512_storeu_si512(out + t * width + 16 * k, words);
        }
    }
}

/* posenc_bf16_kernels.pack_pairs (bf16_pack_pairs_body) */
static void bf16_pack_pairs_avx512bf16(uint16_t *dst, size_t width, const float *src,
                                       ptrdiff_t rs, const size_t *ranges, size_t tile,
                                       size_t cols)
{
    bf16_pack_pairs_body(dst, width, src, rs, ranges, tile, cols, 1);
}

/* posenc_bf16_kernels.pack_pairs16 (bf16_pack_pairs_body) */
static void bf16_pack_pairs16_avx512bf16(uint16_t *dst, size_t width, const uint16_t *src,
                                         ptrdiff_t rs, const size_t *ranges, size_t tile,
                                         size_t cols)
{
    bf16_pack_pairs_body(dst, width, src, rs, ranges, tile, cols, 0);
}

/* posenc_bf16_kernels.exp_row: the avx512 float32 row_exp (isa/softmax_impl.h)
 * in its order -- its 16 lanes' sums, its tail (the row's last 16 elements
 * when the row has more, else one masked vector) summed in order after
 * them -- with posenc_softmax_exp_bf16's exp, stored only in bfloat16, as vcvtneps2bf16
 * rounds (round_row's rounding).  The softmax of the attention forward, whose
 * P the bfloat16 GEMM reads from dst: P is not written in float32 and not
 * rounded again. */
static double bf16_exp_row_avx512bf16(uint16_t *dst, const float *x, size_t len, double shift)
{
    const __m512 c = posenc_bf16_shift(shift);
    __m512 acc = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= len; j += 16) {
        const __m512 e = posenc_softmax_exp_bf16(_mm512_loadu_ps(x + j), c);
        _mm256_storeu_si256((__m256i *)(dst + j), (__m256i)_mm512_cvtneps_pbh(e));
        acc = _mm512_add_ps(acc, e);
    }
    float tail[16];
    size_t t0 = j;   /* tail[t] holds element t0 + t */
    if (j < len) {
        __m512 e;
        if (len > 16) {   /* the row's last 16 elements, whole */
            t0 = len - 16;
            e = posenc_softmax_exp_bf16(_mm512_loadu_ps(x + t0), c);
            _mm256_storeu_si256((__m256i *)(dst + t0), (__m256i)_mm512_cvtneps_pbh(e));
        } else {
            const __mmask16 part = (__mmask16)(((uint32_t)1 << (len - j)) - 1);
            e = posenc_softmax_exp_bf16(_mm512_maskz_loadu_ps(part, x + j), c);
            _mm256_mask_storeu_epi16(dst + j, part, (__m256i)_mm512_cvtneps_pbh(e));
        }
        _mm512_storeu_ps(tail, e);
    }
    float total = _mm512_reduce_add_ps(acc);
    for (; j < len; ++j)
        total += tail[j - t0];
    return (double)total;
}

/* posenc_bf16_kernels.grad_row: 16 lanes at a time, the tail masked; P as exp_row's
 * (posenc_softmax_exp_bf16), both rows rounded as exp_row and round_row round. */
static void bf16_grad_row_avx512bf16(uint16_t *p16, uint16_t *ds16, float *ds, const float *s,
                                     size_t len, double lse, float minus_delta)
{
    const __m512 c = posenc_bf16_shift(lse);
    const __m512 md = _mm512_set1_ps(minus_delta);
    for (size_t j = 0; j < len; j += 16) {
        const __mmask16 lanes = len - j >= 16 ? (__mmask16)0xffff
                                              : (__mmask16)(((uint32_t)1 << (len - j)) - 1);
        const __m512 p = posenc_softmax_exp_bf16(_mm512_maskz_loadu_ps(lanes, s + j), c);
        const __m512 d = _mm512_mul_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(lanes, ds + j), md), p);
        if (lanes == 0xffff) {   /* whole vectors: no masked stores (slow on AMD's cores) */
            _mm256_storeu_si256((__m256i *)(p16 + j), (__m256i)_mm512_cvtneps_pbh(p));
            _mm256_storeu_si256((__m256i *)(ds16 + j), (__m256i)_mm512_cvtneps_pbh(d));
            _mm512_storeu_ps(ds + j, d);
        } else {
            _mm256_mask_storeu_epi16(p16 + j, lanes, (__m256i)_mm512_cvtneps_pbh(p));
            _mm256_mask_storeu_epi16(ds16 + j, lanes, (__m256i)_mm512_cvtneps_pbh(d));
            _mm512_mask_storeu_ps(ds + j, lanes, d);
        }
    }
}

/* posenc_bf16_kernels.round_row: 32 elements per vcvtne2ps2bf16, the tail masked. */
static void bf16_round_row_avx512bf16(uint16_t *dst, const float *src, size_t len)
{
    size_t j = 0;
    for (; j + 32 <= len; j += 32)   /* whole vectors: no masked stores (slow on AMD's cores) */
        _mm512_storeu_si512(dst + j, bf16_load_row(src, j, 32, 1));
    if (j < len)
        _mm512_mask_storeu_epi16(dst + j, ((__mmask32)1 << (len - j)) - 1,
                                 bf16_load_row(src, j, len - j, 1));
}

static void bf16_store_fence_avx512bf16(void) { _mm_sfence(); }

const posenc_bf16_kernels posenc_bf16_kernels_avx512bf16 = {
    "avx512bf16", MR, NR, bf16_ukr_avx512bf16, bf16_pack_avx512bf16, bf16_store_fence_avx512bf16,
    bf16_ukr_f32_avx512bf16, bf16_pack_f32_avx512bf16, bf16_pack_pairs_avx512bf16,
    bf16_round_row_avx512bf16, bf16_pack_pairs16_avx512bf16, bf16_exp_row_avx512bf16,
    bf16_grad_row_avx512bf16,
};

#endif /* AVX512-BF16 */
