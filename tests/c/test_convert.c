/*
 * test_convert.c -- the conversions between float and bfloat16 / float16
 * (posenc_convert, posenc.h; csrc/isa/convert_*.h):
 *
 *   1. The scalar table against oracles written from the formats'
 *      definitions in double, not from its bit operations: every one of the
 *      2^16 patterns widened (sign * m * 2^e); the float patterns below
 *      narrowed to a nearest value of the format, ties to the even pattern,
 *      overflow to inf at the rounding boundary, NaN quiet with sign and
 *      leading payload; and a few known answers.
 *   2. Every table compiled in that this CPU runs (scalar, avx2, avx512,
 *      avx512bf16, neon, and the composed tables of dispatch.c) bit for bit
 *      against the scalar one: all 2^16 patterns widened, the float
 *      patterns narrowed (in one row, and again from an unaligned start),
 *      and rows of every length up to 3 vectors of 16 between guards; the
 *      widening sums of bfloat16 rows (bf16_sum) against the scalar widening
 *      added in float32 in order.  On
 *      x86 again with MXCSR's DAZ and FTZ set (torch.set_flush_denormal).
 *   3. dispatch.c's wiring: avx512 takes AVX512-BF16's rounding where the
 *      CPU has it.
 *   4. posenc_narrow_bf16 (float64 -> bfloat16, rounded once) against an
 *      oracle from the definition (test_narrow_f64).
 *
 * The float patterns: every bfloat16 pattern with the 16 bits below it set
 * to 0, 1, a tie and its neighbours, and all ones (ties, NaN payloads,
 * signalling NaNs, infinities, subnormals, overflow); every finite float16
 * value, the midpoints to its successor and their neighbours, both signs
 * (ties in the normal and subnormal range, 65504 / 65520); and a stride
 * through all 2^32 patterns.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define TEST_MXCSR 1
#endif

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ------------------------------------------------------------------ oracles */

/* The value of a float16 pattern from its definition (NaN for a NaN). */
static double f16_value(uint16_t h)
{
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31)
        return m ? NAN : sign * INFINITY;
    return e ? sign * ldexp(1024.0 + m, e - 25) : sign * ldexp((double)m, -24);
}

/* Of two neighbours lo < hi (patterns pl, ph, magnitudes), the nearer to |x|, ties to the even. */
static uint32_t nearer(double ax, double lo, double hi, uint32_t pl, uint32_t ph)
{
    const double below = ax - lo, above = hi - ax;
    return below < above ? pl : above < below ? ph : (pl & 1u) ? ph : pl;
}

/* float -> bfloat16 from the definition: the two bfloat16 neighbours of |x|
 * (the truncation and its successor, 2^128 past the largest finite one). */
static uint16_t bf16_oracle(uint32_t u)
{
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    if (a == 0x7f800000u)
        return (uint16_t)(sign | 0x7f80u);
    const uint32_t t = a >> 16;
    const double lo = (double)float_of(t << 16);
    const double hi = t == 0x7f7fu ? ldexp(1.0, 128) : (double)float_of((t + 1) << 16);
    return (uint16_t)(sign | nearer((double)float_of(a), lo, hi, t, t + 1));
}

/* float -> float16 from the definition: the largest finite pattern not above
 * |x| by bisection over the values of the (monotone) positive patterns, and
 * its successor (2^16 past 65504: rounding up to it is the overflow to inf). */
static uint16_t f16_oracle(uint32_t u)
{
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    static double value[0x7c01];   /* of the positive patterns, 2^16 for 0x7c00 */
    if (value[0x7c00] == 0.0) {
        for (uint32_t h = 0; h < 0x7c00; ++h)
            value[h] = f16_value((uint16_t)h);
        value[0x7c00] = 65536.0;
    }
    const double ax = (double)float_of(a);
    uint32_t lo = 0, hi = 0x7bffu;   /* the answer's bracket: value[lo] <= ax */
    while (lo < hi) {
        const uint32_t mid = (lo + hi + 1) / 2;
        if (value[mid] <= ax) lo = mid;
        else hi = mid - 1;
    }
    return (uint16_t)(sign | nearer(ax, value[lo], value[lo + 1], lo, lo + 1));
}

/* --------------------------------------------------------------- patterns */

static uint32_t *float_patterns(size_t *count)
{
    enum { STRIDE = 4099 };
    static const uint32_t low[6] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    const size_t total = 65536 * 6 + 0x7c00 * 10 + (size_t)(0x100000000ull / STRIDE) + 1;
    uint32_t *p = malloc(sizeof(uint32_t) * total);
    size_t t = 0;
    for (uint32_t h = 0; h < 65536; ++h)
        for (int l = 0; l < 6; ++l)
            p[t++] = (h << 16) | low[l];
    for (uint32_t h = 0; h < 0x7c00; ++h) {
        const double next = h == 0x7bffu ? 65536.0 : f16_value((uint16_t)(h + 1));
        const uint32_t value = bits_of((float)f16_value((uint16_t)h));
        const uint32_t mid = bits_of((float)((f16_value((uint16_t)h) + next) / 2));   /* exact */
        const uint32_t around[5] = {value + 1, value ? value - 1 : 0x80000001u, mid, mid - 1, mid + 1};
        for (int s = 0; s < 5; ++s) {
            p[t++] = around[s];
            p[t++] = around[s] ^ 0x80000000u;
        }
    }
    for (uint64_t u = 0; u < 0x100000000ull; u += STRIDE)
        p[t++] = (uint32_t)u;
    *count = t;
    return p;
}

/* ------------------------------------------------------- 1. scalar vs oracles */

static void test_scalar_oracles(const uint32_t *pattern, size_t count)
{
    const posenc_convert *ref = &posenc_convert_scalar;
    uint16_t *all = malloc(sizeof(uint16_t) * 65536);
    float *wide = malloc(sizeof(float) * 65536);
    for (uint32_t h = 0; h < 65536; ++h)
        all[h] = (uint16_t)h;
    int bad = 0;
    ref->bf16_to_f32(wide, all, 65536);
    for (uint32_t h = 0; h < 65536; ++h)
        bad += bits_of(wide[h]) != h << 16;
    EXPECT(bad == 0, "scalar bf16 -> f32: %d of 2^16 patterns not their bits << 16", bad);
    bad = 0;
    ref->f16_to_f32(wide, all, 65536);
    for (uint32_t h = 0; h < 65536; ++h) {
        const double v = f16_value((uint16_t)h);
        const uint32_t nan = ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
        bad += isnan(v) ? bits_of(wide[h]) != nan : (double)wide[h] != v || !signbit(wide[h]) != !signbit(v);
    }
    EXPECT(bad == 0, "scalar f16 -> f32: %d of 2^16 patterns not their value", bad);

    float *src = malloc(sizeof(float) * count);
    uint16_t *got = malloc(sizeof(uint16_t) * count);
    for (size_t t = 0; t < count; ++t)
        src[t] = float_of(pattern[t]);
    int bad_bf16 = 0, bad_f16 = 0;
    ref->f32_to_bf16(got, src, count);
    for (size_t t = 0; t < count; ++t)
        if (got[t] != bf16_oracle(pattern[t]) && bad_bf16++ < 5)
            fprintf(stderr, "  f32 %08x -> bf16 %04x, want %04x\n", pattern[t], got[t], bf16_oracle(pattern[t]));
    ref->f32_to_f16(got, src, count);
    for (size_t t = 0; t < count; ++t)
        if (got[t] != f16_oracle(pattern[t]) && bad_f16++ < 5)
            fprintf(stderr, "  f32 %08x -> f16 %04x, want %04x\n", pattern[t], got[t], f16_oracle(pattern[t]));
    EXPECT(bad_bf16 == 0 && bad_f16 == 0, "scalar narrowing of %zu patterns vs the oracles: %d bf16, %d f16 wrong",
           count, bad_bf16, bad_f16);

    /* known answers: (float bits, bf16, f16) */
    static const uint32_t known[][3] = {
        {0x3f800000u, 0x3f80u, 0x3c00u},   /* 1 */
        {0x3f808000u, 0x3f80u, 0x3c04u},   /* 1 + 2^-8: a bf16 tie to the even 1 */
        {0x3f818000u, 0x3f82u, 0x3c0cu},   /* 1 + 3 2^-8: a bf16 tie to the even 1 + 2^-6 */
        {0x3f801000u, 0x3f80u, 0x3c00u},   /* 1 + 2^-11: an f16 tie to the even 1 */
        {0x3f803000u, 0x3f80u, 0x3c02u},   /* 1 + 3 2^-11: an f16 tie up to the even 1 + 2^-9 */
        {0x477fe000u, 0x4780u, 0x7bffu},   /* 65504, the largest float16 */
        {0x477fefffu, 0x4780u, 0x7bffu},   /* just below 65520 */
        {0x477ff000u, 0x4780u, 0x7c00u},   /* 65520: the tie overflows to inf */
        {0x7f7fffffu, 0x7f80u, 0x7c00u},   /* the largest float: both round to inf */
        {0x33000000u, 0x3300u, 0x0000u},   /* 2^-25: a tie to the even 0 */
        {0x33000001u, 0x3300u, 0x0001u},   /* above it: the least subnormal float16 */
        {0x33c00000u, 0x33c0u, 0x0002u},   /* 1.5 2^-24: a subnormal f16 tie up to the even 2 */
        {0x34200000u, 0x3420u, 0x0002u},   /* 2.5 2^-24: a subnormal f16 tie down to the even 2 */
        {0x00000001u, 0x0000u, 0x0000u},   /* the least subnormal float */
        {0x00018000u, 0x0002u, 0x0000u},   /* a subnormal bf16 tie up to the even 2 */
        {0x7f800001u, 0x7fc0u, 0x7e00u},   /* a signalling NaN: quiet */
        {0xffc12345u, 0xffc1u, 0xfe09u},   /* a quiet NaN keeps sign and leading payload */
        {0xff800000u, 0xff80u, 0xfc00u},   /* -inf */
        {0x80000000u, 0x8000u, 0x8000u},   /* -0 */
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; ++k) {
        const float x = float_of(known[k][0]);
        uint16_t b, f;
        ref->f32_to_bf16(&b, &x, 1);
        ref->f32_to_f16(&f, &x, 1);
        EXPECT(b == known[k][1] && f == known[k][2], "known answer f32 %08x: bf16 %04x (want %04x), f16 %04x (want %04x)",
               known[k][0], b, known[k][1], f, known[k][2]);
    }
    free(all);
    free(wide);
    free(src);
    free(got);
}

/* ------------------------------------------ 4. float64 -> bfloat16 rounded once */

static double double_of(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The value of a bfloat16 pattern (as the float of its bits; 2^128 for 0x7f80). */
static double bf16_value(uint32_t h)
{
    return h == 0x7f80u ? ldexp(1.0, 128) : (double)float_of(h << 16);
}

/* double -> bfloat16 from the definition: the two bfloat16 neighbours of |x| (the largest
 * pattern not above it, by bisection over the monotone positive patterns, and its
 * successor, 2^128 past the largest finite), the nearer, ties to the even; NaN the quiet
 * NaN of its sign. */
static uint16_t bf16_of_double_oracle(double x)
{
    const uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x))
        return (uint16_t)(sign | 0x7fc0u);
    const double ax = fabs(x);
    if (ax >= ldexp(1.0, 128))
        return (uint16_t)(sign | 0x7f80u);
    uint32_t lo = 0, hi = 0x7f7fu;
    while (lo < hi) {
        const uint32_t mid = (lo + hi + 1) / 2;
        if (bf16_value(mid) <= ax) lo = mid;
        else hi = mid - 1;
    }
    return (uint16_t)(sign | nearer(ax, bf16_value(lo), bf16_value(lo + 1), lo, lo + 1));
}

/* A narrowing of doubles to bfloat16 (posenc_narrow_bf16, a table's f64_to_bf16) against
 * the oracle: every positive finite bfloat16 value v, the midpoint to its successor and the
 * doubles either side of it and of v, a sticky bit far below the midpoint, both signs;
 * infinities, NaNs (quiet, signalling, payloads), zeros, double subnormals, the subnormal
 * and overflow boundaries; a stride through all 2^64 patterns; rows of every length up to
 * 40 between guards (from offsets 3 len: starts across a block of 16). */
static void test_narrow_f64(const char *label,
                            void (*narrow)(uint16_t *dst, const double *src, size_t count))
{
    const size_t strided = 1u << 20;
    const size_t total = 0x7f80u * 12 + 16 + strided;
    double *x = malloc(sizeof(double) * total);
    uint16_t *got = malloc(sizeof(uint16_t) * (total + 2));
    size_t t = 0;
    for (uint32_t h = 0; h < 0x7f80u; ++h) {
        const double v = bf16_value(h), mid = (v + bf16_value(h + 1)) / 2;   /* exact */
        const double around[6] = {v, nextafter(v, INFINITY), mid, nextafter(mid, 0.0),
                                  nextafter(mid, INFINITY), mid + ldexp(v > 0 ? v : 1e-300, -40)};
        for (int e = 0; e < 6; ++e) {
            x[t++] = around[e];
            x[t++] = -around[e];
        }
    }
    static const uint64_t special[16] = {
        0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull,
        0xfff8123456789abcull, 0x7ff0000000000001ull, 0x0000000000000001ull,
        0x800fffffffffffffull, 0x0000000000000000ull, 0x8000000000000000ull,
        0x3770000000000000ull /* 2^-136 */, 0x3790000000000000ull /* 2^-134: a tie to 0 */,
        0x3790000000000001ull, 0x47efe00000000000ull /* (2 - 2^-8) 2^127: a tie to inf */,
        0x47efdfffffffffffull, 0x7fefffffffffffffull, 0x3ff0100000000040ull /* 1 + 2^-8 + 2^-46 */};
    for (int e = 0; e < 16; ++e)
        x[t++] = double_of(special[e]);
    for (uint64_t k = 0, u = 0x9e3779b97f4a7c15ull; k < strided; ++k, u += 0x9e3779b97f4a7c15ull)
        x[t++] = double_of(u);
    got[0] = got[total + 1] = 0x5a5au;   /* guards */
    narrow(got + 1, x, total);
    int bad = 0;
    for (size_t e = 0; e < total; ++e) {
        const uint16_t want = bf16_of_double_oracle(x[e]);
        if (got[e + 1] != want && bad++ < 5) {
            uint64_t u;
            memcpy(&u, &x[e], sizeof u);
            fprintf(stderr, "  f64 %016llx -> bf16 %04x, want %04x\n", (unsigned long long)u,
                    got[e + 1], want);
        }
    }
    EXPECT(bad == 0 && got[0] == 0x5a5au && got[total + 1] == 0x5a5au,
           "%s of %zu doubles vs the oracle: %d wrong, guards %04x %04x", label, total, bad,
           got[0], got[total + 1]);
    for (size_t len = 0; len <= 40; ++len) {   /* rows between guards */
        got[0] = got[len + 1] = 0x5a5au;
        narrow(got + 1, x + 3 * len, len);
        int row_bad = got[0] != 0x5a5au || got[len + 1] != 0x5a5au;
        for (size_t e = 0; e < len; ++e)
            row_bad |= got[e + 1] != bf16_of_double_oracle(x[3 * len + e]);
        EXPECT(!row_bad, "%s: a row of %zu is wrong or writes past it", label, len);
    }
    free(x);
    free(got);
}

/* ------------------------------------------------------ 2. every table vs scalar */

/* What differs from the reference in one conversion of `len` elements (a count). */
static int differ16(const uint16_t *a, const uint16_t *b, size_t len)
{
    int bad = 0;
    for (size_t t = 0; t < len; ++t)
        bad += a[t] != b[t];
    return bad;
}

static int differ32(const float *a, const float *b, size_t len)
{
    int bad = 0;
    for (size_t t = 0; t < len; ++t)
        bad += bits_of(a[t]) != bits_of(b[t]);
    return bad;
}

/* Rows of every length up to 3 vectors of 16, from offsets 0 and 1, between guards. */
static int rows_against(const posenc_convert *tab, const uint32_t *pattern, size_t count)
{
    enum { MAX_LEN = 49, GUARD16 = 0xdeadu };
    const posenc_convert *ref = &posenc_convert_scalar;
    float src[MAX_LEN + 1], wide[MAX_LEN + 2], wide_ref[MAX_LEN];
    uint16_t half[MAX_LEN + 1], narrow[MAX_LEN + 2], narrow_ref[MAX_LEN];
    const uint32_t guard32 = 0x7fbadbadu;
    int bad = 0;
    for (size_t len = 0; len <= MAX_LEN; ++len)
        for (size_t off = 0; off < 2; ++off) {
            for (size_t t = 0; t < len + off; ++t) {   /* a window of the patterns */
                const uint32_t u = pattern[(len * 7919 + t * 104729) % count];
                src[t] = float_of(u);
                half[t] = (uint16_t)(u >> (t % 2 ? 16 : 3));
            }
            for (int op = 0; op < 4; ++op) {
                void (*narrowing)(uint16_t *, const float *, size_t) = op == 0 ? tab->f32_to_bf16 : tab->f32_to_f16;
                void (*widening)(float *, const uint16_t *, size_t) = op == 2 ? tab->bf16_to_f32 : tab->f16_to_f32;
                if (op < 2 && narrowing) {
                    for (size_t t = 0; t < len + 2; ++t) narrow[t] = GUARD16;
                    narrowing(narrow + 1, src + off, len);
                    (op == 0 ? ref->f32_to_bf16 : ref->f32_to_f16)(narrow_ref, src + off, len);
                    bad += differ16(narrow + 1, narrow_ref, len) + (narrow[0] != GUARD16) +
                           (narrow[len + 1] != GUARD16);
                } else if (op >= 2 && widening) {
                    for (size_t t = 0; t < len + 2; ++t) wide[t] = float_of(guard32);
                    widening(wide + 1, half + off, len);
                    (op == 2 ? ref->bf16_to_f32 : ref->f16_to_f32)(wide_ref, half + off, len);
                    bad += differ32(wide + 1, wide_ref, len) + (bits_of(wide[0]) != guard32) +
                           (bits_of(wide[len + 1]) != guard32);
                }
            }
        }
    return bad;
}

/* bf16_sum against the scalar widening summed in float32 in order: 1 to 19 rows of
 * every length up to 3 vectors of 16 and one, from offsets 0 and 1, starting from the
 * rows or from dst's values, between guards; the rows' bits from the patterns (specials)
 * or finite values of mixed signs and exponents (the sums' rounding).  Returns the
 * lanes that differ (a NaN matches any NaN: which one two NaNs give is the adds'). */
static int sums_against(const posenc_convert *tab, const uint32_t *pattern, size_t count)
{
    enum { MAX_LEN = 49, MAX_ROWS = 19 };
    const posenc_convert *ref = &posenc_convert_scalar;
    static const size_t row_counts[] = {1, 2, 3, 4, 8, 16, 17, 19};
    uint16_t rows[MAX_ROWS][MAX_LEN + 1];
    const uint16_t *at[MAX_ROWS];
    float got[MAX_LEN + 2], start[MAX_LEN];
    const uint32_t guard32 = 0x7fbadbadu;
    uint32_t state = 12345u;
    int bad = 0;
    if (!tab->bf16_sum)
        return 0;
    for (size_t c = 0; c < sizeof row_counts / sizeof row_counts[0]; ++c)
        for (size_t len = 0; len <= MAX_LEN; ++len)
            for (int accumulate = 0; accumulate < 2; ++accumulate) {
                const size_t k = row_counts[c], off = (k + len) % 2;
                const int specials = (len + k) % 3 == 0;
                for (size_t i = 0; i < k; ++i) {
                    for (size_t t = 0; t < len + off; ++t) {
                        state = state * 1664525u + 1013904223u;
                        rows[i][t] = specials ? (uint16_t)(pattern[(state >> 8) % count] >> 16)
                                              : (uint16_t)((state >> 16 & 0x8000u) |
                                                           (0x3c00u + (state >> 9 & 0x7ffu)));
                    }
                    at[i] = rows[i] + off;
                }
                for (size_t t = 0; t < len; ++t) {
                    state = state * 1664525u + 1013904223u;
                    start[t] = (float)((double)(state >> 8) / 16777216.0 - 0.5) * 64.0f;
                }
                for (size_t t = 0; t < len + 2; ++t)
                    got[t] = t == 0 || t == len + 1 ? float_of(guard32) : start[t - 1];
                tab->bf16_sum(got + 1, at, k, len, accumulate);
                bad += (bits_of(got[0]) != guard32) + (bits_of(got[len + 1]) != guard32);
                for (size_t t = 0; t < len; ++t) {
                    float want = accumulate ? start[t] : 0.0f, x;
                    for (size_t i = 0; i < k; ++i) {
                        ref->bf16_to_f32(&x, at[i] + t, 1);
                        want = i == 0 && !accumulate ? x : want + x;
                    }
                    const float g = got[t + 1];
                    bad += !(bits_of(g) == bits_of(want) || (isnan(g) && isnan(want)));
                }
            }
    return bad;
}

/* tab (its non-NULL entries) against the scalar table's bits. */
static void against_scalar(const char *label, const posenc_convert *tab, const uint32_t *pattern,
                           const float *src, size_t count, uint16_t *got, uint16_t *want)
{
    const posenc_convert *ref = &posenc_convert_scalar;
    uint16_t *all = malloc(sizeof(uint16_t) * 65536);
    float *wide = malloc(sizeof(float) * 65536), *wide_ref = malloc(sizeof(float) * 65536);
    for (uint32_t h = 0; h < 65536; ++h)
        all[h] = (uint16_t)h;
    int bad[4] = {0, 0, 0, 0};
    if (tab->bf16_to_f32) {
        tab->bf16_to_f32(wide, all, 65536);
        ref->bf16_to_f32(wide_ref, all, 65536);
        bad[0] = differ32(wide, wide_ref, 65536);
    }
    if (tab->f16_to_f32) {
        tab->f16_to_f32(wide, all, 65536);
        ref->f16_to_f32(wide_ref, all, 65536);
        bad[1] = differ32(wide, wide_ref, 65536);
    }
    for (int f = 0; f < 2; ++f) {
        void (*narrowing)(uint16_t *, const float *, size_t) = f ? tab->f32_to_f16 : tab->f32_to_bf16;
        void (*reference)(uint16_t *, const float *, size_t) = f ? ref->f32_to_f16 : ref->f32_to_bf16;
        if (!narrowing)
            continue;
        reference(want, src, count);
        narrowing(got, src, count);
        bad[2 + f] = differ16(got, want, count);
        narrowing(got, src + 1, count - 1);   /* from an unaligned start */
        bad[2 + f] += differ16(got, want + 1, count - 1);
        for (size_t t = 0; t < count && bad[2 + f]; ++t)
            if (got[t] != want[t + 1]) {
                fprintf(stderr, "  %s: f32 %08x -> %04x, want %04x\n", label, pattern[t + 1], got[t],
                        want[t + 1]);
                break;
            }
    }
    const int rows = rows_against(tab, pattern, count), sums = sums_against(tab, pattern, count);
    EXPECT(!bad[0] && !bad[1] && !bad[2] && !bad[3] && !rows && !sums,
           "%s vs scalar: bf16->f32 %d, f16->f32 %d of 2^16; f32->bf16 %d, f32->f16 %d of 2 x %zu; rows %d; bf16 sums %d",
           label, bad[0], bad[1], bad[2], bad[3], count, rows, sums);
    free(all);
    free(wide);
    free(wide_ref);
}

void test_convert(void)
{
    size_t count;
    uint32_t *pattern = float_patterns(&count);
    float *src = malloc(sizeof(float) * count);
    uint16_t *got = malloc(sizeof(uint16_t) * count), *want = malloc(sizeof(uint16_t) * count);
    for (size_t t = 0; t < count; ++t)
        src[t] = float_of(pattern[t]);
    test_scalar_oracles(pattern, count);
    test_narrow_f64("posenc_narrow_bf16", posenc_narrow_bf16);

    /* the compiled tables this CPU runs, then the composed ones */
    typedef struct {
        char label[40];
        const posenc_convert *tab;
        int composed;
    } named_table;
    named_table tables[2 * POSENC_ISA_COUNT + 1];
    size_t n_tables = 0;
#define ADD_TABLE(lab, table, comp)                                                        \
    do {                                                                                   \
        snprintf(tables[n_tables].label, sizeof tables[n_tables].label, "%s", (lab));      \
        tables[n_tables].tab = (table);                                                    \
        tables[n_tables++].composed = (comp);                                              \
    } while (0)
    const char *bf16_note = "";
#ifdef POSENC_HAVE_AVX2
    if (posenc_cpu_has(POSENC_ISA_AVX2)) ADD_TABLE("avx2", &posenc_convert_avx2, 0);
#endif
#ifdef POSENC_HAVE_AVX512
    if (posenc_cpu_has(POSENC_ISA_AVX512)) ADD_TABLE("avx512", &posenc_convert_avx512, 0);
#endif
#ifdef POSENC_HAVE_AVX512BF16
    if (posenc_cpu_has_avx512bf16()) ADD_TABLE("avx512bf16", &posenc_convert_avx512bf16, 0);
    else bf16_note = " (avx512bf16 compiled, skipped: the CPU lacks AVX512-BF16)";
#elif defined(__x86_64__)
    bf16_note = " (avx512bf16 not compiled)";
#endif
#ifdef POSENC_HAVE_NEON
    if (posenc_cpu_has(POSENC_ISA_NEON)) ADD_TABLE("neon", &posenc_convert_neon, 0);
#endif
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa)
        if (posenc_isa_supported((posenc_isa)isa)) {
            char label[40];
            snprintf(label, sizeof label, "composed %s", posenc_isa_name((posenc_isa)isa));
            ADD_TABLE(label, posenc_convert_for((posenc_isa)isa), 1);
        }
#undef ADD_TABLE
    printf("conversions vs scalar (%zu float patterns):", count);
    for (size_t t = 0; t < n_tables; ++t)
        printf(tables[t].composed ? ", %s (%s)" : " %s", tables[t].label, tables[t].tab->name);
    printf("%s\n", bf16_note);
    int passes = 1;
#ifdef TEST_MXCSR
    passes = 2;
#endif
    for (int pass = 0; pass < passes; ++pass) {
#ifdef TEST_MXCSR
        const unsigned int csr = _mm_getcsr();
        if (pass == 1)
            _mm_setcsr(csr | 0x8040u);   /* FTZ | DAZ */
#endif
        for (size_t t = 0; t < n_tables; ++t) {
            char label[128];
            const posenc_convert *tab = tables[t].tab;
            snprintf(label, sizeof label, "%.40s (%.24s)%s", tables[t].label, tab->name, pass ? " under DAZ, FTZ" : "");
            EXPECT(!tables[t].composed || (tab->bf16_to_f32 && tab->f32_to_bf16 && tab->f16_to_f32 && tab->f32_to_f16 &&
                                             tab->bf16_sum && tab->f64_to_bf16),
                   "%s: an entry is NULL", label);
            against_scalar(label, tab, pattern, src, count, got, want);
            if (tab->f64_to_bf16 && pass == 0) {
                char what[160];
                snprintf(what, sizeof what, "%s f64_to_bf16", label);
                test_narrow_f64(what, tab->f64_to_bf16);
            }
        }
#ifdef TEST_MXCSR
        _mm_setcsr(csr);
#endif
    }
    /* 3. avx512's composed rounding is AVX512-BF16's where the CPU has it */
#if defined(POSENC_HAVE_AVX512BF16)
    if (posenc_isa_supported(POSENC_ISA_AVX512))
        EXPECT(posenc_convert_for(POSENC_ISA_AVX512)->f32_to_bf16 ==
                   (posenc_cpu_has_avx512bf16() ? posenc_convert_avx512bf16.f32_to_bf16
                                                : posenc_convert_avx512.f32_to_bf16),
               "avx512's f32 -> bf16 is not AVX512-BF16's where the CPU has it");
#endif
    free(pattern);
    free(src);
    free(got);
    free(want);
}
