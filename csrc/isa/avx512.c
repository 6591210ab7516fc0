/*
 * avx512.c -- AVX-512 F/VL/DQ kernels (compiled with the AVX-512 flags only).
 * Register tile 12 x 2 vectors: 24 accumulators, 2 B vectors, broadcasts
 * from memory, of the 32 zmm registers.
 */
#include "../posenc.h"

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include <immintrin.h>
#include <stdint.h>

#include "vector_exp.h"   /* VEXP, VMAX: the hooks of the softmax rows */
#include "transpose_avx512.h"   /* the key-side tile gather's 16 x 16 */

#define MR 12
#define NRV 2

/*
 * Key-side table gathers and their adjoint (see tile_gather_key): element j
 * of a row reads proj[j * ld + bucket[j] - b_min], 8 keys per instruction
 * with 64-bit indices.  The 8 keys of a scatter are distinct rows of the
 * gradient, so its lanes never collide.
 */
#define KEY_LANES 8

/* The element offsets of keys j .. j + 7, advanced by KEY_LANES keys per step. */
typedef struct {
    __m512i offset, advance;
} key_cursor;

static inline key_cursor key_cursor_at(size_t j, size_t ld, ptrdiff_t b_min)
{
    const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i row = _mm512_add_epi64(lane, _mm512_set1_epi64((long long)j));
    key_cursor cursor;
    cursor.offset = _mm512_sub_epi64(_mm512_mullo_epi64(row, _mm512_set1_epi64((long long)ld)),
                                     _mm512_set1_epi64((long long)b_min));
    cursor.advance = _mm512_set1_epi64((long long)(KEY_LANES * ld));
    return cursor;
}

/* The indices of the next 8 keys, whose buckets start at bucket_j. */
static inline __m512i key_cursor_next(key_cursor *cursor, const int64_t *bucket_j)
{
    const __m512i index = _mm512_add_epi64(cursor->offset, _mm512_loadu_si512(bucket_j));
    cursor->offset = _mm512_add_epi64(cursor->offset, cursor->advance);
    return index;
}

#define KEY_ROW_FUNCTIONS(REAL_T, SUF, VEC_T, GATHER, SCATTER, LOAD, STORE, ADD, MUL)              \
    static inline void key_row_gather_##SUF(int op, REAL_T *dst, const REAL_T *proj, size_t ld,     \
                                            const int64_t *bucket, ptrdiff_t b_min, size_t j0,      \
                                            size_t j1)                                              \
    {                                                                                               \
        size_t j = j0;                                                                              \
        for (key_cursor at = key_cursor_at(j, ld, b_min); j + KEY_LANES <= j1; j += KEY_LANES) {   \
            VEC_T v = GATHER(key_cursor_next(&at, bucket + j), proj, sizeof(REAL_T));               \
            if (op == POSENC_ADD) v = ADD(v, LOAD(dst + j));                                        \
            else if (op == POSENC_MUL) v = MUL(v, LOAD(dst + j));                                   \
            STORE(dst + j, v);                                                                      \
        }                                                                                           \
        for (; j < j1; ++j) {                                                                       \
            const REAL_T v = proj[j * ld + (size_t)(bucket[j] - b_min)];                            \
            dst[j] = op == POSENC_SET ? v : op == POSENC_ADD ? dst[j] + v : dst[j] * v;             \
        }                                                                                           \
    }                                                                                               \
    static inline void key_row_scatter_##SUF(REAL_T *grad, size_t ld, const int64_t *bucket,        \
                                             ptrdiff_t b_min, const REAL_T *src, size_t j0,         \
                                             size_t j1)                                             \
    {                                                                                               \
        size_t j = j0;                                                                              \
        for (key_cursor at = key_cursor_at(j, ld, b_min); j + KEY_LANES <= j1; j += KEY_LANES) {   \
            const __m512i index = key_cursor_next(&at, bucket + j);                                 \
            SCATTER(grad, index, ADD(GATHER(index, grad, sizeof(REAL_T)), LOAD(src + j)),           \
                    sizeof(REAL_T));                                                                \
        }                                                                                           \
        for (; j < j1; ++j)                                                                         \
            grad[j * ld + (size_t)(bucket[j] - b_min)] += src[j];                                   \
    }

KEY_ROW_FUNCTIONS(float, f32, __m256, _mm512_i64gather_ps, _mm512_i64scatter_ps, _mm256_loadu_ps,
                  _mm256_storeu_ps, _mm256_add_ps, _mm256_mul_ps)
KEY_ROW_FUNCTIONS(double, f64, __m512d, _mm512_i64gather_pd, _mm512_i64scatter_pd, _mm512_loadu_pd,
                  _mm512_storeu_pd, _mm512_add_pd, _mm512_mul_pd)
#undef KEY_ROW_FUNCTIONS

/*
 * float32 with 32-bit indices where every offset of the keys fits them
 * (j1 ld < 2^31; always with tile_gather_query's row stride ld of 0): 16
 * keys per instruction, half the gathers (and scatters) of the 64-bit
 * indices' 8, the same elements; the rest as above.
 */
#define KEY_LANES32 16

static inline int key_fits_int32(size_t j1, size_t ld)
{
    return ld == 0 || j1 + 1 <= (size_t)INT32_MAX / ld;   /* ld 0: tile_gather_query */
}

/* The 32-bit offsets of keys j .. j + 15 from the next 16 buckets (bucket_j). */
static inline __m512i key_index32(__m512i offset, const int64_t *bucket_j)
{
    const __m256i lo = _mm512_cvtepi64_epi32(_mm512_loadu_si512(bucket_j));
    const __m256i hi = _mm512_cvtepi64_epi32(_mm512_loadu_si512(bucket_j + 8));
    return _mm512_add_epi32(offset, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

static inline __m512i key_offset32(size_t j, size_t ld, ptrdiff_t b_min)
{
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_sub_epi32(
        _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32((int)j)), _mm512_set1_epi32((int)ld)),
        _mm512_set1_epi32((int)b_min));
}

static inline void key_row_gather_f32x16(int op, float *dst, const float *proj, size_t ld,
                                         const int64_t *bucket, ptrdiff_t b_min, size_t j0,
                                         size_t j1)
{
    size_t j = j0;
    if (key_fits_int32(j1, ld)) {
        const __m512i advance = _mm512_set1_epi32((int)(KEY_LANES32 * ld));
        for (__m512i offset = key_offset32(j, ld, b_min); j + KEY_LANES32 <= j1;
             j += KEY_LANES32, offset = _mm512_add_epi32(offset, advance)) {
            __m512 v = _mm512_i32gather_ps(key_index32(offset, bucket + j), proj, sizeof(float));
            if (op == POSENC_ADD) v = _mm512_add_ps(v, _mm512_loadu_ps(dst + j));
            else if (op == POSENC_MUL) v = _mm512_mul_ps(v, _mm512_loadu_ps(dst + j));
            _mm512_storeu_ps(dst + j, v);
        }
    }
    key_row_gather_f32(op, dst, proj, ld, bucket, b_min, j, j1);
}

static inline void key_row_scatter_f32x16(float *grad, size_t ld, const int64_t *bucket,
                                          ptrdiff_t b_min, const float *src, size_t j0, size_t j1)
{
    size_t j = j0;
    if (key_fits_int32(j1, ld)) {
        const __m512i advance = _mm512_set1_epi32((int)(KEY_LANES32 * ld));
        for (__m512i offset = key_offset32(j, ld, b_min); j + KEY_LANES32 <= j1;
             j += KEY_LANES32, offset = _mm512_add_epi32(offset, advance)) {
            const __m512i index = key_index32(offset, bucket + j);
            _mm512_i32scatter_ps(grad, index,
                                 _mm512_add_ps(_mm512_i32gather_ps(index, grad, sizeof(float)),
                                               _mm512_loadu_ps(src + j)),
                                 sizeof(float));
        }
    }
    key_row_scatter_f32(grad, ld, bucket, b_min, src, j, j1);
}

/*
 * The key-side tile gather and scatter in blocks of 16 keys x up to 16 rows
 * without gather instructions (float32).  Element (r, j) of the tile is at
 * bucket map_r0[j - r] of row j of proj: for one key j the rows' buckets are
 * a reversed slice of the map, which the maps keep within a few buckets
 * (they are monotone and step by at most one bucket per offset: clipped,
 * DeBERTa's log buckets); then one load of row j and a permute give key j's
 * values for every row, and a 16 x 16 transpose turns those columns into the
 * tile's rows (the scatter: rows into columns, each added to its row of
 * proj's gradient in one masked load and store, where the buckets are one
 * apart: a cell then takes one row's term, as the row scatter adds it).  A
 * block whose map does not allow it goes to the row gathers and scatters.
 * The same elements, added or multiplied as those do (the table's value
 * first): bitwise their results.
 */
typedef struct {
    __m512i lo, hi;   /* window[s] = map_r0[jb - 16 + s] as int32, s < 16, and s >= 16 */
    int rising, falling;   /* its steps where the rows read it: all >= 0, all <= 0 */
    int unit;              /* every such step +1 (rising) or -1 (falling) */
} key_window;

/* The map for keys jb .. jb + 15 and rows 0 .. rows - 1 (1 <= rows <= 16): row r of key
 * u reads window[16 + u - r], s >= 17 - rows; the rest of the window is 0. */
static inline key_window key_window_of(const int64_t *map_r0, size_t jb, size_t rows)
{
    const int64_t *w = map_r0 + jb - 16;
    const __mmask16 read = (__mmask16)(0xFFFFu << (17 - rows));
    const __m256i w0 = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64((__mmask8)read, w));
    const __m256i w1 = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64((__mmask8)(read >> 8), w + 8));
    const __m256i w2 = _mm512_cvtepi64_epi32(_mm512_loadu_si512(w + 16));
    const __m256i w3 = _mm512_cvtepi64_epi32(_mm512_loadu_si512(w + 24));
    key_window x;
    x.lo = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
    x.hi = _mm512_inserti64x4(_mm512_castsi256_si512(w2), w3, 1);
    /* steps window[s] - window[s - 1] for s > 17 - rows */
    const __m512i step_lo = _mm512_sub_epi32(x.lo, _mm512_alignr_epi32(x.lo, x.lo, 15));
    const __m512i step_hi = _mm512_sub_epi32(x.hi, _mm512_alignr_epi32(x.hi, x.lo, 15));
    const __mmask16 in_lo = (__mmask16)(read << 1);
    const __mmask16 in_hi = rows > 1 ? (__mmask16)0xFFFF : (__mmask16)0xFFFE;
    const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
    x.rising = !_mm512_mask_cmplt_epi32_mask(in_lo, step_lo, zero) &&
               !_mm512_mask_cmplt_epi32_mask(in_hi, step_hi, zero);
    x.falling = !_mm512_mask_cmpgt_epi32_mask(in_lo, step_lo, zero) &&
                !_mm512_mask_cmpgt_epi32_mask(in_hi, step_hi, zero);
    const __m512i signed_one = x.rising ? one : _mm512_sub_epi32(zero, one);
    x.unit = (x.rising || x.falling) &&
             !_mm512_mask_cmpneq_epi32_mask(in_lo, step_lo, signed_one) &&
             !_mm512_mask_cmpneq_epi32_mask(in_hi, step_hi, signed_one);
    return x;
}

static const int32_t key_lanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static inline int key_block16_f32(int op, float *P, size_t ldp, const int64_t *map_r0,
                                  ptrdiff_t b_min, const float *proj, size_t ld, size_t jb,
                                  size_t rows)
{
    const key_window x = key_window_of(map_r0, jb, rows);
    const __m512i lane = _mm512_loadu_si512(key_lanes);
    /* key u's rows read window[16 + u - r], r < rows: between its ends, which must lie
     * within 16 buckets of each other; base[u] the lower */
    const __m512i first = x.hi;
    const __m512i last = _mm512_permutex2var_epi32(
        x.lo, _mm512_add_epi32(lane, _mm512_set1_epi32((int)(17 - rows))), x.hi);
    if (!(x.rising || x.falling) ||
        _mm512_cmpge_epu32_mask(_mm512_abs_epi32(_mm512_sub_epi32(first, last)),
                                _mm512_set1_epi32(16)))
        return 0;
    int32_t base[16];
    _mm512_storeu_si512(base, _mm512_min_epi32(first, last));
    __m512i select = _mm512_sub_epi32(_mm512_set1_epi32(16), lane);   /* lane r: 16 + u - r */
    __m512i column[16];
#pragma GCC unroll 16
    for (size_t u = 0; u < 16; ++u) {
        const __m512i rel = _mm512_sub_epi32(_mm512_permutex2var_epi32(x.lo, select, x.hi),
                                             _mm512_set1_epi32(base[u]));
        select = _mm512_add_epi32(select, _mm512_set1_epi32(1));
        const size_t col = (size_t)((ptrdiff_t)base[u] - b_min), avail = ld - col;
        const float *at = proj + (jb + u) * ld + col;
        const __m512 values = avail >= 16 ? _mm512_loadu_ps(at)
                                          : _mm512_maskz_loadu_ps((__mmask16)((1u << avail) - 1), at);
        column[u] = _mm512_castps_si512(_mm512_permutexvar_ps(rel, values));
    }
    posenc_transpose_16x16_epi32(column);
    for (size_t r = 0; r < rows; ++r) {
        float *dst = P + r * ldp + jb;
        __m512 v = _mm512_castsi512_ps(column[r]);
        if (op == POSENC_ADD) v = _mm512_add_ps(v, _mm512_loadu_ps(dst));
        else if (op == POSENC_MUL) v = _mm512_mul_ps(v, _mm512_loadu_ps(dst));
        _mm512_storeu_ps(dst, v);
    }
    return 1;
}

/* grad[(jb + u) ld + map_r0[jb + u - r] - b_min] += src[r ld_src + jb + u], u < 16,
 * r < rows, where the map steps by one bucket over the rows read (else 0, nothing
 * added): the rows' terms of key u fill `rows` adjacent cells, from the lowest bucket. */
static inline int key_scatter_block16_f32(float *grad, size_t ld, const int64_t *map_r0,
                                          ptrdiff_t b_min, const float *src, size_t ld_src,
                                          size_t jb, size_t rows)
{
    const key_window x = key_window_of(map_r0, jb, rows);
    if (!x.unit)
        return 0;
    __m512i column[16];
#pragma GCC unroll 16
    for (size_t r = 0; r < 16; ++r)
        column[r] = r < rows ? _mm512_loadu_si512(src + r * ld_src + jb) : _mm512_setzero_si512();
    posenc_transpose_16x16_epi32(column);   /* column[u], lane r: row r's term of key u */
    /* rising: the cells of key u from window[16 + u] - (rows - 1), row rows - 1 - c at cell c;
     * falling: from window[16 + u], row c at cell c */
    const __m512i lane = _mm512_loadu_si512(key_lanes);
    const __m512i order = x.rising ? _mm512_sub_epi32(_mm512_set1_epi32((int)rows - 1), lane) : lane;
    int32_t base[16];
    _mm512_storeu_si512(base, x.rising ? _mm512_sub_epi32(x.hi, _mm512_set1_epi32((int)rows - 1))
                                       : x.hi);
    const __mmask16 cells = (__mmask16)((1u << rows) - 1);
#pragma GCC unroll 16
    for (size_t u = 0; u < 16; ++u) {
        float *at = grad + (jb + u) * ld + (size_t)((ptrdiff_t)base[u] - b_min);
        const __m512 terms = _mm512_permutexvar_ps(order, _mm512_castsi512_ps(column[u]));
        const __m512 sums = _mm512_add_ps(_mm512_maskz_loadu_ps(cells, at), terms);
        _mm512_mask_storeu_ps(at, cells, sums);
    }
    return 1;
}

static inline int key_tile_gather_f32(int op, float *P, size_t ldp, const int64_t *map_r0,
                                      ptrdiff_t b_min, const float *proj, size_t ld, size_t j0,
                                      size_t j1, size_t rows)
{
    for (size_t r0 = 0; r0 < rows; r0 += 16) {
        const size_t tile = rows - r0 < 16 ? rows - r0 : 16;
        float *Pr = P + r0 * ldp;
        const int64_t *map_r = map_r0 - r0;
        size_t j = j0;
        for (; j + 16 <= j1; j += 16)
            if (!key_block16_f32(op, Pr, ldp, map_r, b_min, proj, ld, j, tile))
                for (size_t r = 0; r < tile; ++r)
                    key_row_gather_f32x16(op, Pr + r * ldp, proj, ld, map_r - r, b_min, j, j + 16);
        for (size_t r = 0; j < j1 && r < tile; ++r)
            key_row_gather_f32x16(op, Pr + r * ldp, proj, ld, map_r - r, b_min, j, j1);
    }
    return 1;
}

static inline int key_tile_gather_f64(int op, double *P, size_t ldp, const int64_t *map_r0,
                                      ptrdiff_t b_min, const double *proj, size_t ld, size_t j0,
                                      size_t j1, size_t rows)
{
    (void)op, (void)P, (void)ldp, (void)map_r0, (void)b_min, (void)proj, (void)ld, (void)j0,
        (void)j1, (void)rows;
    return 0;   /* the row gathers */
}

static inline int key_tile_scatter_f32(float *grad, size_t ld, const int64_t *map_r0,
                                       ptrdiff_t b_min, const float *src, size_t ld_src, size_t j0,
                                       size_t j1, size_t r0, size_t rows)
{
    /* rows in order, 16 at a time: a cell that takes terms of several rows takes them in
     * the rows' order, as the row scatter adds them */
    for (size_t c0 = r0; c0 < rows; c0 += 16) {
        const size_t tile = rows - c0 < 16 ? rows - c0 : 16;
        const int64_t *map_c = map_r0 - c0;
        const float *src_c = src + c0 * ld_src;
        size_t j = j0;
        for (; j + 16 <= j1; j += 16)
            if (!key_scatter_block16_f32(grad, ld, map_c, b_min, src_c, ld_src, j, tile))
                for (size_t r = 0; r < tile; ++r)
                    key_row_scatter_f32x16(grad, ld, map_c - r, b_min, src_c + r * ld_src, j, j + 16);
        for (size_t r = 0; j < j1 && r < tile; ++r)
            key_row_scatter_f32x16(grad, ld, map_c - r, b_min, src_c + r * ld_src, j, j1);
    }
    return 1;
}

static inline int key_tile_scatter_f64(double *grad, size_t ld, const int64_t *map_r0,
                                       ptrdiff_t b_min, const double *src, size_t ld_src,
                                       size_t j0, size_t j1, size_t r0, size_t rows)
{
    (void)grad, (void)ld, (void)map_r0, (void)b_min, (void)src, (void)ld_src, (void)j0,
        (void)j1, (void)r0, (void)rows;
    return 0;   /* the row scatters */
}

/*
 * The query-side tile gather (float32): element (r, j) reads row r of proj
 * at bucket map_r0[j - r].  The map is taken to int32 once per chunk of keys
 * for all the tile's rows; where 16 keys' buckets span at most 32 (runs of
 * step 1 and log buckets), two loads of the row and a permute stand for the
 * gather instruction.  The same elements, added or multiplied as the row
 * gathers do: bitwise their results.
 */
#define QUERY_CHUNK 256

static inline int query_tile_gather_f32(int op, float *P, size_t ldp, const int64_t *map_r0,
                                        ptrdiff_t b_min, const float *proj, size_t ld, size_t m,
                                        size_t rows)
{
    if (rows > 32 || ld > (size_t)INT32_MAX)
        return 0;   /* the row gathers */
    int32_t window[QUERY_CHUNK + 32];
    const __m512i thirty_two = _mm512_set1_epi32(32);
    for (size_t c0 = 0; c0 < m; c0 += QUERY_CHUNK) {
        const size_t c1 = m - c0 < QUERY_CHUNK ? m : c0 + QUERY_CHUNK;
        /* window[s] = map_r0[c0 - (rows - 1) + s] - b_min: row r's key j at s = j - c0 + rows - 1 - r */
        const int64_t *from = map_r0 + c0 - (rows - 1);
        for (size_t s = 0; s < c1 - c0 + rows - 1; ++s)
            window[s] = (int32_t)(from[s] - b_min);
        for (size_t r = 0; r < rows; ++r) {
            float *dst = P + r * ldp;
            const float *row = proj + r * ld;
            const int32_t *at = window + (rows - 1 - r) - c0;   /* at[j]: key j's column */
            size_t j = c0;
            for (; j + 16 <= c1; j += 16) {
                const __m512i index = _mm512_loadu_si512(at + j);
                const int32_t a = at[j], b = at[j + 15], base = a < b ? a : b;
                const __m512i rel = _mm512_sub_epi32(index, _mm512_set1_epi32(base));
                __m512 v;
                if (_mm512_cmplt_epu32_mask(rel, thirty_two) == 0xFFFF) {
                    const size_t avail = ld - (size_t)base;
                    const __mmask16 m0 = avail >= 16 ? 0xFFFF : (__mmask16)((1u << avail) - 1);
                    const __mmask16 m1 = avail >= 32   ? 0xFFFF
                                         : avail > 16 ? (__mmask16)((1u << (avail - 16)) - 1)
                                                      : 0;
                    v = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(m0, row + base), rel,
                                               _mm512_maskz_loadu_ps(m1, row + base + 16));
                } else {
                    v = _mm512_i32gather_ps(index, row, sizeof(float));
                }
                if (op == POSENC_ADD) v = _mm512_add_ps(v, _mm512_loadu_ps(dst + j));
                else if (op == POSENC_MUL) v = _mm512_mul_ps(v, _mm512_loadu_ps(dst + j));
                _mm512_storeu_ps(dst + j, v);
            }
            if (j < c1)
                key_row_gather_f32(op, dst, row, 0, map_r0 - r, b_min, j, c1);
        }
    }
    return 1;
}

static inline int query_tile_gather_f64(int op, double *P, size_t ldp, const int64_t *map_r0,
                                        ptrdiff_t b_min, const double *proj, size_t ld, size_t m,
                                        size_t rows)
{
    (void)op, (void)P, (void)ldp, (void)map_r0, (void)b_min, (void)proj, (void)ld, (void)m,
        (void)rows;
    return 0;   /* the row gathers */
}

/* The kernels' hooks (kernels_impl.h), by the dtype of the destination. */
#define KEY_ROW_GATHER(op, dst, ...) \
    _Generic((dst), float *: key_row_gather_f32x16, double *: key_row_gather_f64)(op, dst, __VA_ARGS__)
#define KEY_ROW_SCATTER(grad, ...) \
    _Generic((grad), float *: key_row_scatter_f32x16, double *: key_row_scatter_f64)(grad, __VA_ARGS__)
#define KEY_TILE_GATHER(op, P, ...) \
    _Generic((P), float *: key_tile_gather_f32, double *: key_tile_gather_f64)(op, P, __VA_ARGS__)
#define KEY_TILE_SCATTER(grad, ...) \
    _Generic((grad), float *: key_tile_scatter_f32, double *: key_tile_scatter_f64)(grad, __VA_ARGS__)
#define QUERY_TILE_GATHER(op, P, ...) \
    _Generic((P), float *: query_tile_gather_f32, double *: query_tile_gather_f64)(op, P, __VA_ARGS__)

/*
 * One row of suffix_interp (positions_impl.h) in float32: 16 keys at a time
 * from the last, their gates widened to double and summed within the 16 as
 * suffix sums (lanes shifted down and added, three times per 8), plus the
 * sum of the keys after them; the table's values read from registers by
 * permutes where it has at most 64 entries (CoPE's tables are of that
 * size: gathers took half the row's time on AMD Zen 4), else by gathers.  The sums'
 * order is not the plain C's (the positions may differ from it in the last
 * bit of a double before their rounding); the forward and the backward read
 * the same.  double: the plain C (returns 0).
 */
static inline __m512d suffix_sums_pd(__m512d v)
{
    const __m512i zero = _mm512_setzero_si512();
    v = _mm512_add_pd(v, _mm512_castsi512_pd(_mm512_alignr_epi64(zero, _mm512_castpd_si512(v), 1)));
    v = _mm512_add_pd(v, _mm512_castsi512_pd(_mm512_alignr_epi64(zero, _mm512_castpd_si512(v), 2)));
    return _mm512_add_pd(v, _mm512_castsi512_pd(_mm512_alignr_epi64(zero, _mm512_castpd_si512(v), 4)));
}

/* A table of up to 64 floats in four registers (entries past it 0), or read by gathers. */
typedef struct {
    const float *t;
    size_t span;   /* its entries: the lookups' indices are below it */
    __m512 r[4];
} table_lookup;

static inline table_lookup table_lookup_of(const float *t, size_t span)
{
    table_lookup x = {t, span, {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                                _mm512_setzero_ps()}};
    for (size_t q = 0; span <= 64 && q < 4 && 16 * q < span; ++q) {
        const size_t len = span - 16 * q < 16 ? span - 16 * q : 16;
        x.r[q] = _mm512_maskz_loadu_ps((__mmask16)((1u << len) - 1), t + 16 * q);
    }
    return x;
}

/* t[index] in the lanes of `lanes` (the others: 0, or from registers any entry: the
 * callers store those lanes nowhere). */
static inline __m512 table_lookup_at(const table_lookup *x, __m512i index, __mmask16 lanes)
{
    if (x->span <= 16)
        return _mm512_permutexvar_ps(index, x->r[0]);
    if (x->span <= 32)
        return _mm512_permutex2var_ps(x->r[0], index, x->r[1]);
    if (x->span <= 64)
        return _mm512_mask_blend_ps(_mm512_test_epi32_mask(index, _mm512_set1_epi32(32)),
                                    _mm512_permutex2var_ps(x->r[0], index, x->r[1]),
                                    _mm512_permutex2var_ps(x->r[2], index, x->r[3]));
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, index, x->t, sizeof(float));
}

static inline int suffix_interp_row_f32(float *x, float *pos, const float *g, const float *t,
                                        size_t k0, size_t cols, double last)
{
    const table_lookup table = table_lookup_of(t, x ? (size_t)last + 1 : 0);
    const __m512d last_v = _mm512_set1_pd(last);
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    const __m512i first_lane = _mm512_setzero_si512();
    __m512d after = _mm512_setzero_pd();   /* the keys' sum after the 16, in every lane */
    /* Once the sum passes last, every key before is at last (gates are not negative)
     * until a NaN gate: its value w t[c] + (1 - w) t[f] with w 0, f = c = last, once. */
    const float at_last = t ? t[(size_t)last] : 0.0f;
    const __m512 clamped_e = _mm512_set1_ps(0.0f * at_last + 1.0f * at_last);
    const __m512 clamped_at = _mm512_set1_ps((float)last);
    for (size_t j = cols; j > k0;) {
        const size_t len = j - k0 < 16 ? j - k0 : 16;
        j -= len;
        const __mmask16 keys = (__mmask16)((1u << len) - 1);
        const __m512 gates = _mm512_maskz_loadu_ps(keys, g + j);
        if (_mm_cvtsd_f64(_mm512_castpd512_pd128(after)) > last &&
            !_mm512_cmp_ps_mask(gates, gates, _CMP_UNORD_Q)) {   /* clamped, no NaN */
            if (pos)
                _mm512_mask_storeu_ps(pos + j, keys, clamped_at);
            if (x)
                _mm512_mask_storeu_ps(x + j, keys,
                                      _mm512_add_ps(_mm512_maskz_loadu_ps(keys, x + j), clamped_e));
            continue;
        }
        /* the 16's suffix sums, then the keys' after them: one addition on the chain */
        const __m512d hi16 = suffix_sums_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(gates, 1)));
        const __m512d lo16 = _mm512_add_pd(suffix_sums_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(gates))),
                                           _mm512_permutexvar_pd(first_lane, hi16));
        /* min(last, s): s where s is NaN */
        const __m512d hi = _mm512_min_pd(last_v, _mm512_add_pd(hi16, after));
        const __m512d lo = _mm512_min_pd(last_v, _mm512_add_pd(lo16, after));
        after = _mm512_add_pd(after, _mm512_permutexvar_pd(first_lane, lo16));
        const __m512 at = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)),
                                             _mm512_cvtpd_ps(hi), 1);
        if (pos)
            _mm512_mask_storeu_ps(pos + j, keys, at);
        if (!x)
            continue;
        /* floor (0 where NaN), w, the next row where w > 0; w t[c] + (1 - w) t[f] */
        const __m512i f = _mm512_maskz_cvttps_epi32(_mm512_cmp_ps_mask(at, zero, _CMP_GE_OQ), at);
        const __m512 w = _mm512_sub_ps(at, _mm512_cvtepi32_ps(f));
        const __m512i c = _mm512_mask_add_epi32(f, _mm512_cmp_ps_mask(w, zero, _CMP_GT_OQ), f,
                                                _mm512_set1_epi32(1));
        const __m512 at_f = table_lookup_at(&table, f, keys);
        const __m512 at_c = table_lookup_at(&table, c, keys);
        const __m512 e = _mm512_add_ps(_mm512_mul_ps(w, at_c), _mm512_mul_ps(_mm512_sub_ps(one, w), at_f));
        _mm512_mask_storeu_ps(x + j, keys, _mm512_add_ps(_mm512_maskz_loadu_ps(keys, x + j), e));
    }
    return 1;
}

static inline int suffix_interp_row_f64(double *x, double *pos, const double *g, const double *t,
                                        size_t k0, size_t cols, double last)
{
    (void)x, (void)pos, (void)g, (void)t, (void)k0, (void)cols, (void)last;
    return 0;
}

/*
 * One row of suffix_interp_grad (positions_impl.h) in float32: 8 keys at a
 * time in double, the running sum of G (t[c] - t[f]) along the keys as
 * prefix sums within the 8 (lanes shifted up and added) plus the sum before
 * them; dqe's two entries of a run of keys sharing a floor summed in vectors
 * while whole blocks of 8 share it (the clamped keys), lane by lane where a
 * block holds several floors or a NaN position.  The sums' order is not the
 * plain C's.
 */
static inline __m512d prefix_sums_pd(__m512d v)
{
    const __m512i zero = _mm512_setzero_si512();
    v = _mm512_add_pd(v, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(v), zero, 7)));
    v = _mm512_add_pd(v, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(v), zero, 6)));
    return _mm512_add_pd(v, _mm512_castsi512_pd(_mm512_alignr_epi64(_mm512_castpd_si512(v), zero, 4)));
}

/* The run's sums: the vectors' into the scalars. */
typedef struct {
    __m512d floor_v, next_v;
    double at_floor, at_next;
    ptrdiff_t run;
} grad_run;

static inline void grad_run_fold(grad_run *r)
{
    r->at_floor += _mm512_reduce_add_pd(r->floor_v);
    r->at_next += _mm512_reduce_add_pd(r->next_v);
    r->floor_v = r->next_v = _mm512_setzero_pd();
}

static inline void grad_run_end(grad_run *r, double *dqe, size_t span)
{
    grad_run_fold(r);
    if (r->run >= 0) {
        dqe[r->run] += r->at_floor;
        if ((size_t)r->run + 1 < span)
            dqe[r->run + 1] += r->at_next;
    }
    r->at_floor = r->at_next = 0;
}

static inline int suffix_interp_grad_row_f32(float *gc, double *dqe, const float *G,
                                             const float *gates, const float *pos,
                                             const float *t, size_t first, size_t cols,
                                             double last)
{
    const size_t span = (size_t)last + 1;
    const table_lookup table = table_lookup_of(t, span);
    const __m256 zero = _mm256_setzero_ps();
    const __m512d one = _mm512_set1_pd(1.0), zero_d = _mm512_setzero_pd();
    const __m512i last_lane = _mm512_set1_epi64(7);
    __m512d before = _mm512_setzero_pd();   /* the sum of the keys before the 8, every lane */
    grad_run r = {_mm512_setzero_pd(), _mm512_setzero_pd(), 0, 0, -1};
    for (size_t j = first; j < cols; j += 8) {
        const size_t len = cols - j < 8 ? cols - j : 8;
        const __mmask8 keys = (__mmask8)((1u << len) - 1);
        const __m256 x = _mm256_maskz_loadu_ps(keys, pos + j);
        const __mmask8 ok = _mm256_cmp_ps_mask(x, zero, _CMP_GE_OQ) & keys;   /* not NaN */
        const __m256i f = _mm256_maskz_cvttps_epi32(ok, x);
        const __m256 w = _mm256_sub_ps(x, _mm256_cvtepi32_ps(f));
        const __mmask8 up = _mm256_cmp_ps_mask(w, zero, _CMP_GT_OQ) & ok;   /* c = f + 1 */
        const __m256i c = _mm256_mask_add_epi32(f, up, f, _mm256_set1_epi32(1));
        const __m512d at_f = _mm512_cvtps_pd(_mm512_castps512_ps256(
            table_lookup_at(&table, _mm512_castsi256_si512(f), ok)));
        const __m512d at_c = _mm512_cvtps_pd(_mm512_castps512_ps256(
            table_lookup_at(&table, _mm512_castsi256_si512(c), ok)));
        const __m512d g_v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(keys, G + j));
        const __m512d w_d = _mm512_cvtps_pd(w);
        /* dL/dp, NaN at a NaN position (the sums NaN from it on) */
        __m512d dp = _mm512_mul_pd(g_v, _mm512_sub_pd(at_c, at_f));
        dp = _mm512_mask_mov_pd(dp, keys & (__mmask8)~ok, _mm512_cvtps_pd(x));
        const __m512d sum = _mm512_add_pd(prefix_sums_pd(dp), before);
        before = _mm512_permutexvar_pd(last_lane, sum);
        const __m512d gate = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(keys, gates + j));
        const __m512d slope = _mm512_mul_pd(gate, _mm512_sub_pd(one, gate));
        const __m512d out = _mm512_mask_add_pd(g_v, _mm512_cmp_pd_mask(slope, zero_d, _CMP_NEQ_UQ),
                                               g_v, _mm512_mul_pd(sum, slope));
        _mm256_mask_storeu_ps(gc + j, keys, _mm512_cvtpd_ps(out));
        /* dqe: (1 - w) G to the floor, w G to the next entry; w 0: both to the floor */
        const __m512d low = _mm512_mul_pd(_mm512_sub_pd(one, w_d), g_v);
        const __m512d high = _mm512_mul_pd(w_d, g_v);
        const __m512d to_floor = _mm512_maskz_mov_pd(
            ok, _mm512_mask_blend_pd(up, _mm512_add_pd(low, high), low));
        const __m512d to_next = _mm512_maskz_mov_pd(up, high);
        const int run0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(f));
        const __mmask8 same = _mm256_cmpeq_epi32_mask(f, _mm256_set1_epi32(run0));
        if (ok == keys && (same & keys) == keys) {   /* one floor: the run's vectors */
            if (run0 != r.run) {
                grad_run_end(&r, dqe, span);
                r.run = run0;
            }
            r.floor_v = _mm512_add_pd(r.floor_v, to_floor);
            r.next_v = _mm512_add_pd(r.next_v, to_next);
            continue;
        }
        int32_t floors[8];
        double lows[8], highs[8];
        _mm256_storeu_si256((__m256i *)(void *)floors, f);
        _mm512_storeu_pd(lows, to_floor);
        _mm512_storeu_pd(highs, to_next);
        for (size_t l = 0; l < len; ++l) {
            if (!((ok >> l) & 1))
                continue;
            if (floors[l] != r.run) {
                grad_run_end(&r, dqe, span);
                r.run = floors[l];
            }
            r.at_floor += lows[l];
            r.at_next += highs[l];
        }
    }
    grad_run_end(&r, dqe, span);
    return 1;
}

static inline int suffix_interp_grad_row_f64(double *gc, double *dqe, const double *G,
                                             const double *gates, const double *pos,
                                             const double *t, size_t first, size_t cols,
                                             double last)
{
    (void)gc, (void)dqe, (void)G, (void)gates, (void)pos, (void)t, (void)first, (void)cols;
    (void)last;
    return 0;
}

#define SUFFIX_INTERP_GRAD_ROW(gc, ...)                                                    \
    _Generic((gc), float *: suffix_interp_grad_row_f32, double *: suffix_interp_grad_row_f64)( \
        gc, __VA_ARGS__)

/* row_sigmoid (positions_impl.h) in float32 in one pass instead of three: -|z| by its
 * sign bit, the exponential of the softmax rows (posenc_vexp_f32, as row_exp), the
 * division.  double: the plain C. */
static inline int sigmoid_row_f32(float *g, const float *z, size_t len)
{
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (size_t j = 0; j < len; j += 16) {
        const size_t count = len - j < 16 ? len - j : 16;
        const __mmask16 lanes = (__mmask16)((1u << count) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(lanes, z + j);
        const __m512 e = posenc_vexp_f32(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), sign)));
        const __m512 top = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ), e, one);
        _mm512_mask_storeu_ps(g + j, lanes, _mm512_div_ps(top, _mm512_add_ps(one, e)));
    }
    return 1;
}

static inline int sigmoid_row_f64(double *g, const double *z, size_t len)
{
    (void)g, (void)z, (void)len;
    return 0;
}

#define SIGMOID_ROW(g, ...) \
    _Generic((g), float *: sigmoid_row_f32, double *: sigmoid_row_f64)(g, __VA_ARGS__)

#define SUFFIX_INTERP_ROW(x, ...) \
    _Generic((x), float *: suffix_interp_row_f32, double *: suffix_interp_row_f64)(x, __VA_ARGS__)

/*
 * The dropout's keep decisions (philox_impl.h) on 16 blocks (64 keys) at a
 * time: each round's 32 x 32 -> 64-bit products by vpmuludq on the even and
 * the odd lanes; each block's four words compared with the threshold and
 * moved to key order by 4 x 4 transposes.
 */
#include "../engine/philox.h"

static inline void philox_mul(__m512i a, __m512i m, __m512i *hi, __m512i *lo)
{
    const __m512i even = _mm512_mul_epu32(a, m);                         /* lanes 0, 2, ... */
    const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);   /* lanes 1, 3, ... */
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

static inline void philox_store(uint8_t *keep, __m512i c0, __m512i c1, __m512i c2, __m512i c3,
                                __m512i limit)
{
    /* word t of block l as 0 or 1 in lane l of v_t; then per 128-bit group g (blocks
     * 4g .. 4g + 3), r_a holds block 4g + a's four words: keys 16g + 4a .. + 3 */
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i v0 = _mm512_maskz_mov_epi32(_mm512_cmpge_epu32_mask(c0, limit), one);
    const __m512i v1 = _mm512_maskz_mov_epi32(_mm512_cmpge_epu32_mask(c1, limit), one);
    const __m512i v2 = _mm512_maskz_mov_epi32(_mm512_cmpge_epu32_mask(c2, limit), one);
    const __m512i v3 = _mm512_maskz_mov_epi32(_mm512_cmpge_epu32_mask(c3, limit), one);
    const __m512i t0 = _mm512_unpacklo_epi32(v0, v1), t1 = _mm512_unpackhi_epi32(v0, v1);
    const __m512i t2 = _mm512_unpacklo_epi32(v2, v3), t3 = _mm512_unpackhi_epi32(v2, v3);
    const __m512i r0 = _mm512_unpacklo_epi64(t0, t2), r1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i r2 = _mm512_unpacklo_epi64(t1, t3), r3 = _mm512_unpackhi_epi64(t1, t3);
    /* keys 16g .. 16g + 15: group g of r0, r1, r2, r3 */
    const __m512i u0 = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i u1 = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i u2 = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i u3 = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i q[4] = {_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)),
                          _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(3, 1, 3, 1))};
    for (int g = 0; g < 4; ++g)
        _mm_storeu_si128((__m128i *)(void *)(keep + 16 * g), _mm512_cvtepi32_epi8(q[g]));
}

#define PHILOX_NAME dropout_row_avx512
#define PHILOX_V __m512i
#define PHILOX_LANES 16
#define PHILOX_SET1(x) _mm512_set1_epi32((int)(uint32_t)(x))
#define PHILOX_LANE_INDEX _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define PHILOX_ADD _mm512_add_epi32
#define PHILOX_XOR _mm512_xor_si512
#include "philox_impl.h"

#define VECTOR_TEMPLATE "kernels_impl.h"
#include "vectors_avx512.h"

/* The conversions (convert_impl.h); isa/avx512bf16.c replaces the bfloat16
 * rounding where the CPU has AVX512-BF16. */
#include "convert_avx512.h"
#define CONVERT_ISA avx512
#define BF16_TO_F32 bf16_to_f32_avx512
#define F32_TO_BF16 f32_to_bf16_avx512
#define F16_TO_F32 f16_to_f32_avx512
#define F32_TO_F16 f32_to_f16_avx512
#define F64_TO_BF16 f64_to_bf16_avx512
#include "convert_impl.h"

#endif /* AVX-512 */
