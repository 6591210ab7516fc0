/*
 * convert_scalar.h -- the bit-level reference of the conversions between
 * float and the 16-bit floats (posenc_convert, posenc.h): integer
 * operations on the bit patterns only, so no floating-point environment
 * (MXCSR's DAZ/FTZ, FPCR's FZ) changes a result.  Every ISA's conversions
 * give these bits exactly (tests/c/test_convert.c).
 *
 * bfloat16 is float's upper half: sign, 8 exponent bits, 7 mantissa bits.
 * float16 (IEEE binary16): sign, 5 exponent bits (bias 15), 10 mantissa bits.
 */
#ifndef POSENC_CONVERT_SCALAR_H
#define POSENC_CONVERT_SCALAR_H

#include <stdint.h>

/* float bits -> bfloat16, round to nearest, ties to even: adding 0x7fff
 * plus the kept part's last bit carries into it exactly when the dropped
 * half is above a tie, or a tie with an odd last bit; the largest finite
 * floats round up to the infinity.  A NaN keeps its sign and leading
 * payload and is made quiet (the truncation alone could give an infinity);
 * as AVX512-BF16's vcvtneps2bf16. */
static inline uint16_t posenc_bf16_from_f32_bits(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The same on a vector of 32-bit lanes u, with the ISA's integer
 * operations (the vector ISAs have no rounding instruction for it but
 * AVX512-BF16's): SRL(v, 16) a logical shift, AND, ADD, OR, SET1(c), GT(a, b)
 * a lane mask of a > b (a, b < 2^31), SELECT(mask, a, b) a where the mask is
 * set, else b.  The lanes hold the bfloat16 bits in their low halves. */
#define POSENC_BF16_ROUND_LANES(u, SRL, AND, ADD, OR, SET1, GT, SELECT)                       \
    SELECT(GT(AND((u), SET1(0x7fffffff)), SET1(0x7f800000)), OR(SRL((u), 16), SET1(0x40)),    \
           SRL(ADD((u), ADD(AND(SRL((u), 16), SET1(1)), SET1(0x7fff))), 16))

/* double bits -> bfloat16, rounded once to nearest, ties to even (through float the
 * value would be rounded twice: 1 + 2^-8 + 2^-30 would tie to 1).  Normal results keep 8
 * significant bits of the 53; below 2^-126 bfloat16's subnormals, units of 2^-133; from
 * (2 - 2^-8) 2^127 up the infinity; a NaN the quiet NaN of its sign (as ml_dtypes'
 * float -> bfloat16); double subnormals (< 2^-1022) round to a zero. */
static inline uint16_t posenc_bf16_from_f64_bits(uint64_t u)
{
    const uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    const uint64_t a = u & 0x7fffffffffffffffull;
    if ((a >> 52) - 897u <= 253u)   /* 2^-126 <= a < 2^128: a normal result, or the infinity */
        /* the bits above the lowest 45 (exponent and 7 mantissa bits) rounded as
         * posenc_bf16_from_f32_bits rounds a float's upper half, the exponent then rebiased
         * 1023 -> 127: a carry into it, past 2^128, gives the infinity */
        return (uint16_t)(sign | (((a + 0x0fffffffffffull + ((a >> 45) & 1u)) >> 45) - (896u << 7)));
    if (a > 0x7ff0000000000000ull)
        return (uint16_t)(sign | 0x7fc0u);
    const int e = (int)(a >> 52) - 1023;   /* a = 1.m 2^e (a normal double) */
    if (e > 127)
        return (uint16_t)(sign | 0x7f80u);
    if (e < -134)   /* below 2^-134, half the least subnormal (and double subnormals) */
        return sign;
    const uint64_t sig = (a & 0x000fffffffffffffull) | 0x0010000000000000ull;
    /* the kept bits: 8 (implicit 1 included) for a normal result, fewer below 2^-126 */
    const int shift = e >= -126 ? 45 : 45 + (-126 - e);
    /* rounded to nearest even without a branch (as posenc_bf16_from_f32_bits): adding half
     * an ulp less one, plus the kept part's last bit, carries exactly when it should */
    const uint64_t kept = (sig + (1ull << (shift - 1)) - 1 + ((sig >> shift) & 1u)) >> shift;
    /* normal: (e + 127) << 7 plus the mantissa, the implicit 1 of `kept` adding one exponent
     * step; subnormal: kept alone.  A carry of the rounding moves into the exponent, to the
     * infinity past the largest finite */
    const uint64_t bits = (e >= -126 ? ((uint64_t)(e + 126) << 7) : 0) + kept;
    return (uint16_t)(sign | bits);
}

/* bfloat16 -> float bits: exact, its bits as the upper half. */
static inline uint32_t posenc_f32_bits_from_bf16(uint16_t h)
{
    return (uint32_t)h << 16;
}

/* float bits -> float16, round to nearest, ties to even. */
static inline uint16_t posenc_f16_from_f32_bits(uint32_t u)
{
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)   /* NaN: quiet, the leading 9 payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)  /* 65520 (65504 + half an ulp, a tie to the even 2^16) and up: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {   /* 2^-14 and up: normal; the exponent rebiased 127 -> 15 */
        const uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u)  /* up to 2^-25, half the least subnormal (the tie goes to the even 0) */
        return sign;
    /* subnormal: 1.m 2^(e - 127) in units of 2^-24 is (1.m << 23) >> (126 - e),
     * shift in [14, 24], rounded on the bits shifted out */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
    const uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return (uint16_t)(sign | (q + (rest > half || (rest == half && (q & 1u)))));
}

/* float16 -> float bits: exact; a NaN keeps its sign and payload and is
 * made quiet (as F16C's vcvtph2ps and NEON's fcvtl do). */
static inline uint32_t posenc_f32_bits_from_f16(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu)
        return sign | 0x7f800000u | (m ? 0x00400000u | (m << 13) : 0u);
    if (e != 0)
        return sign | ((e + 112u) << 23) | (m << 13);
    if (m == 0)
        return sign;
    uint32_t exponent = 113u;   /* subnormal m 2^-24: normalised, 1.m' 2^(exponent - 127) */
    while (!(m & 0x400u)) {
        m <<= 1;
        --exponent;
    }
    return sign | (exponent << 23) | ((m & 0x3ffu) << 13);
}

#endif /* POSENC_CONVERT_SCALAR_H */
