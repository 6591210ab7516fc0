/*
 * transpose_avx512.h -- in-register transposes of square blocks of AVX-512
 * vectors (files compiled with the AVX-512 flags): 16 x 16 32-bit words
 * (the float kernels' B panels from columns, vectors_avx512.h; avx512bf16.c's
 * bfloat16 pair panels) and 8 x 8 64-bit words (the double kernels').
 */
#ifndef POSENC_TRANSPOSE_AVX512_H
#define POSENC_TRANSPOSE_AVX512_H

#include <immintrin.h>

/* The 4 x 4 transpose of 128-bit lanes across the vectors in[j + t stride],
 * t < 4, into out[j + t stride] (lane k of out[j + t stride] = lane t of
 * in[j + k stride]), for each j < stride: even and odd lanes of pairs, then
 * again. */
static inline void posenc_transpose_lanes128(const __m512i *in, __m512i *out, int stride)
{
#pragma GCC unroll 4
    for (int j = 0; j < stride; ++j) {
        const __m512i *x = in + j;
        const __m512i even01 = _mm512_shuffle_i64x2(x[0], x[stride], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i odd01 = _mm512_shuffle_i64x2(x[0], x[stride], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i even23 = _mm512_shuffle_i64x2(x[2 * stride], x[3 * stride], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i odd23 = _mm512_shuffle_i64x2(x[2 * stride], x[3 * stride], _MM_SHUFFLE(3, 1, 3, 1));
        out[j] = _mm512_shuffle_i64x2(even01, even23, _MM_SHUFFLE(2, 0, 2, 0));
        out[j + stride] = _mm512_shuffle_i64x2(odd01, odd23, _MM_SHUFFLE(2, 0, 2, 0));
        out[j + 2 * stride] = _mm512_shuffle_i64x2(even01, even23, _MM_SHUFFLE(3, 1, 3, 1));
        out[j + 3 * stride] = _mm512_shuffle_i64x2(odd01, odd23, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* rows[u] = column u of the 16 x 16 matrix of 32-bit words rows[0..15]:
 * pairs of words interleaved, then pairs of pairs (s[4 i + j], 128-bit lane
 * k: word 4 k + j of rows 4 i .. 4 i + 3), then 128-bit lanes. */
static inline void posenc_transpose_16x16_epi32(__m512i rows[16])
{
    __m512i t[16], s[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        s[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        s[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    posenc_transpose_lanes128(s, rows, 4);
}

/* rows[u] = column u of the 8 x 8 matrix of 64-bit words rows[0..7]: pairs
 * of words interleaved (t[2 i + e], 128-bit lane k: word 2 k + e of rows
 * 2 i, 2 i + 1), then 128-bit lanes. */
static inline void posenc_transpose_8x8_epi64(__m512i rows[8])
{
    __m512i t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
        t[i] = i & 1 ? _mm512_unpackhi_epi64(rows[i - 1], rows[i])
                     : _mm512_unpacklo_epi64(rows[i], rows[i + 1]);
    posenc_transpose_lanes128(t, rows, 2);
}

#endif /* POSENC_TRANSPOSE_AVX512_H */
