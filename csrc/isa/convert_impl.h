/*
 * convert_impl.h -- the rows of the conversions between float and the
 * 16-bit floats (posenc_convert, posenc.h) for one ISA, written once: the
 * ISA's file defines the block operations it has, then includes this file,
 * which defines the row functions posenc_convert_<op>_<isa> and the table
 * posenc_convert_<isa>.
 *
 * From isa/<isa>.c:
 *   CONVERT_ISA           the ISA's name, a token: scalar, avx2, ...
 *   CVL                   elements per block
 *   BF16_TO_F32(d, s)     one block: float *d from const uint16_t *s
 *   F32_TO_BF16(d, s)     uint16_t *d from const float *s
 *   F16_TO_F32(d, s)
 *   F32_TO_F16(d, s)
 *   F64_TO_BF16(d, s)     uint16_t *d from const double *s, rounded once
 * Each block operation is optional: a table entry the ISA leaves out is
 * NULL, and dispatch.c fills it with the scalar one (bf16_sum comes with
 * BF16_TO_F32).  A row is whole
 * blocks, then its last len % CVL elements through one block on
 * zero-padded lane buffers: no block reads or writes past the row.
 */
#include <string.h>

#define CONVERT_GLUE(op, isa) posenc_convert_##op##_##isa
#define CONVERT_NAME(op, isa) CONVERT_GLUE(op, isa)
#define CONVERT_TABLE_GLUE(isa) posenc_convert_##isa
#define CONVERT_TABLE(isa) CONVERT_TABLE_GLUE(isa)
#define CONVERT_STRING_GLUE(isa) #isa
#define CONVERT_STRING(isa) CONVERT_STRING_GLUE(isa)

#define CONVERT_ROW(op, DST, SRC, BLOCK)                                              \
    static void CONVERT_NAME(op, CONVERT_ISA)(DST *dst, const SRC *src, size_t len)   \
    {                                                                                 \
        size_t j = 0;                                                                 \
        for (; j + CVL <= len; j += CVL)                                              \
            BLOCK(dst + j, src + j);                                                  \
        if (j < len) {                                                                \
            SRC in[CVL] = {0};                                                        \
            DST out[CVL];                                                             \
            memcpy(in, src + j, (len - j) * sizeof(SRC));                             \
            BLOCK(out, in);                                                           \
            memcpy(dst + j, out, (len - j) * sizeof(DST));                            \
        }                                                                             \
    }

#ifdef BF16_TO_F32
CONVERT_ROW(bf16_to_f32, float, uint16_t, BF16_TO_F32)
#define CONVERT_ENTRY_BF16_TO_F32 CONVERT_NAME(bf16_to_f32, CONVERT_ISA)

/* CVL lanes from lane j of row src (a partial block through zero-padded
 * lanes: no read past the row) widened into x. */
static inline __attribute__((always_inline)) void CONVERT_NAME(bf16_lanes, CONVERT_ISA)(float *x, const uint16_t *src,
                                                         size_t lanes)
{
    if (lanes == CVL) {
        BF16_TO_F32(x, src);
    } else {
        uint16_t in[CVL] = {0};
        memcpy(in, src, lanes * sizeof(uint16_t));
        BF16_TO_F32(x, in);
    }
}

/* Lanes [j, j + lanes) of bf16_sum (lanes <= CVL; inlined with CVL for whole blocks). */
static inline __attribute__((always_inline)) void
CONVERT_NAME(bf16_sum_lanes, CONVERT_ISA)(float *dst, const uint16_t *const *src, size_t count,
                                          size_t j, size_t lanes, int accumulate)
{
    float sum[CVL] = {0}, x[CVL];
    size_t i = 0;
    if (accumulate) {
        memcpy(sum, dst + j, lanes * sizeof(float));
    } else if (count) {
        CONVERT_NAME(bf16_lanes, CONVERT_ISA)(sum, src[0] + j, lanes);
        i = 1;
    }
    for (; i < count; ++i) {
        CONVERT_NAME(bf16_lanes, CONVERT_ISA)(x, src[i] + j, lanes);
        for (size_t e = 0; e < CVL; ++e)
            sum[e] += x[e];
    }
    memcpy(dst + j, sum, lanes * sizeof(float));
}

/* posenc_convert.bf16_sum: CVL lanes at a time, the rows' in order. */
static void CONVERT_NAME(bf16_sum, CONVERT_ISA)(float *dst, const uint16_t *const *src,
                                                size_t count, size_t len, int accumulate)
{
    size_t j = 0;
    for (; j + CVL <= len; j += CVL)
        CONVERT_NAME(bf16_sum_lanes, CONVERT_ISA)(dst, src, count, j, CVL, accumulate);
    if (j < len)
        CONVERT_NAME(bf16_sum_lanes, CONVERT_ISA)(dst, src, count, j, len - j, accumulate);
}
#define CONVERT_ENTRY_BF16_SUM CONVERT_NAME(bf16_sum, CONVERT_ISA)
#else
#define CONVERT_ENTRY_BF16_TO_F32 NULL
#define CONVERT_ENTRY_BF16_SUM NULL
#endif

#ifdef F32_TO_BF16
CONVERT_ROW(f32_to_bf16, uint16_t, float, F32_TO_BF16)
#define CONVERT_ENTRY_F32_TO_BF16 CONVERT_NAME(f32_to_bf16, CONVERT_ISA)
#else
#define CONVERT_ENTRY_F32_TO_BF16 NULL
#endif

#ifdef F64_TO_BF16
CONVERT_ROW(f64_to_bf16, uint16_t, double, F64_TO_BF16)
#define CONVERT_ENTRY_F64_TO_BF16 CONVERT_NAME(f64_to_bf16, CONVERT_ISA)
#else
#define CONVERT_ENTRY_F64_TO_BF16 NULL
#endif

#ifdef F16_TO_F32
CONVERT_ROW(f16_to_f32, float, uint16_t, F16_TO_F32)
#define CONVERT_ENTRY_F16_TO_F32 CONVERT_NAME(f16_to_f32, CONVERT_ISA)
#else
#define CONVERT_ENTRY_F16_TO_F32 NULL
#endif

#ifdef F32_TO_F16
CONVERT_ROW(f32_to_f16, uint16_t, float, F32_TO_F16)
#define CONVERT_ENTRY_F32_TO_F16 CONVERT_NAME(f32_to_f16, CONVERT_ISA)
#else
#define CONVERT_ENTRY_F32_TO_F16 NULL
#endif

const posenc_convert CONVERT_TABLE(CONVERT_ISA) = {
    .name = CONVERT_STRING(CONVERT_ISA),
    .bf16_to_f32 = CONVERT_ENTRY_BF16_TO_F32,
    .f32_to_bf16 = CONVERT_ENTRY_F32_TO_BF16,
    .f16_to_f32 = CONVERT_ENTRY_F16_TO_F32,
    .f32_to_f16 = CONVERT_ENTRY_F32_TO_F16,
    .bf16_sum = CONVERT_ENTRY_BF16_SUM,
    .f64_to_bf16 = CONVERT_ENTRY_F64_TO_BF16,
};

#undef CONVERT_GLUE
#undef CONVERT_NAME
#undef CONVERT_TABLE_GLUE
#undef CONVERT_TABLE
#undef CONVERT_STRING_GLUE
#undef CONVERT_STRING
#undef CONVERT_ROW
#undef CONVERT_ENTRY_BF16_TO_F32
#undef CONVERT_ENTRY_F32_TO_BF16
#undef CONVERT_ENTRY_F16_TO_F32
#undef CONVERT_ENTRY_F32_TO_F16
#undef CONVERT_ENTRY_F64_TO_BF16
#undef CONVERT_ENTRY_BF16_SUM
