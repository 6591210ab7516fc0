/*
 * vector_exp_impl.h -- exp of one vector with 2^n built from n's bits (the
 * AVX2 and NEON parts of vector_exp.h), written once against the macros
 * vector_exp.h defines for one ISA and dtype before including it, and
 * forgets after:
 *   EXP_F32          defined for float (else double)
 *   EXP_NAME         the function's name; EXP_VT its vector type, EXP_MASK a comparison's
 *   EXP_SET(c)       broadcast; EXP_MUL, EXP_FMA(a, b, c) = a b + c, EXP_FNMADD = c - a b
 *   EXP_MIN, EXP_MAX returning NaN when the second operand is NaN
 *   EXP_ROUND        to the nearest integer; EXP_LT, EXP_GT ordered comparisons
 *   EXP_ZERO_WHERE(mask, v), EXP_SELECT(mask, a, b) = mask ? a : b
 *   EXP_POW2(n)      2^n for an integral n of the normal exponents
 *
 * n stays in the normal exponents: arguments below ln(FLT_MIN) (DBL_MIN)
 * give 0 (their denormal results flushed), above ln(FLT_MAX) (DBL_MAX) inf;
 * n is capped one short of the inf exponent.
 */
#ifdef EXP_F32
#define EXP_LO -87.33654            /* ln(FLT_MIN) */
#define EXP_HI 88.72283             /* ln(FLT_MAX) */
#define EXP_N_MAX 127.0
#define EXP_LN2_HI EXP_LN2_HI_F
#define EXP_LN2_LO EXP_LN2_LO_F
#define EXP_DEGREE 7
#else
#define EXP_LO -708.3964185322641   /* ln(DBL_MIN) */
#define EXP_HI 709.782712893384     /* ln(DBL_MAX) */
#define EXP_N_MAX 1023.0
#define EXP_LN2_HI EXP_LN2_HI_D
#define EXP_LN2_LO EXP_LN2_LO_D
#define EXP_DEGREE 13
#endif

static inline EXP_VT EXP_NAME(EXP_VT x)
{
    const EXP_VT lo = EXP_SET(EXP_LO), hi = EXP_SET(EXP_HI);
    const EXP_MASK under = EXP_LT(x, lo), over = EXP_GT(x, hi);
    x = EXP_MIN(hi, EXP_MAX(lo, x));
    const EXP_VT n = EXP_MIN(EXP_ROUND(EXP_MUL(x, EXP_SET(EXP_LOG2E))), EXP_SET(EXP_N_MAX));
    EXP_VT r = EXP_FNMADD(n, EXP_SET(EXP_LN2_HI), x);
    r = EXP_FNMADD(n, EXP_SET(EXP_LN2_LO), r);
    EXP_VT p;
    EXP_POLY(EXP_VT, EXP_FMA, EXP_SET, r, EXP_DEGREE, p);
    p = EXP_ZERO_WHERE(under, EXP_MUL(p, EXP_POW2(n)));
    return EXP_SELECT(over, EXP_SET(__builtin_inf()), p);
}

#undef EXP_F32
#undef EXP_NAME
#undef EXP_VT
#undef EXP_MASK
#undef EXP_SET
#undef EXP_MUL
#undef EXP_FMA
#undef EXP_FNMADD
#undef EXP_MIN
#undef EXP_MAX
#undef EXP_ROUND
#undef EXP_LT
#undef EXP_GT
#undef EXP_ZERO_WHERE
#undef EXP_SELECT
#undef EXP_POW2
#undef EXP_LO
#undef EXP_HI
#undef EXP_N_MAX
#undef EXP_LN2_HI
#undef EXP_LN2_LO
#undef EXP_DEGREE
