/*
 * scalar.c -- the portable kernels: plain C at the baseline of the target,
 * the fallback for every entry of the dispatch table (dispatch.c's
 * fill_table lays each ISA's own entries over these).
 * Register tile 4 x 4.  Its conversions are the bit-level reference
 * (convert_scalar.h).
 */
#include "../posenc.h"

#include <string.h>

#define MR 4
#define NRV 4
#define VECTOR_TEMPLATE "kernels_impl.h"
#include "vectors_scalar.h"

#include "convert_scalar.h"

/* One element per block, through float's bits. */
static inline void f32_to_bf16_scalar(uint16_t *d, const float *s)
{
    uint32_t u;
    memcpy(&u, s, sizeof u);
    *d = posenc_bf16_from_f32_bits(u);
}
static inline void f32_to_f16_scalar(uint16_t *d, const float *s)
{
    uint32_t u;
    memcpy(&u, s, sizeof u);
    *d = posenc_f16_from_f32_bits(u);
}
static inline void bf16_to_f32_scalar(float *d, const uint16_t *s)
{
    const uint32_t u = posenc_f32_bits_from_bf16(*s);
    memcpy(d, &u, sizeof u);
}
static inline void f16_to_f32_scalar(float *d, const uint16_t *s)
{
    const uint32_t u = posenc_f32_bits_from_f16(*s);
    memcpy(d, &u, sizeof u);
}

static inline void f64_to_bf16_scalar(uint16_t *d, const double *s)
{
    uint64_t u;
    memcpy(&u, s, sizeof u);
    *d = posenc_bf16_from_f64_bits(u);
}

#define CONVERT_ISA scalar
#define CVL 1
#define BF16_TO_F32 bf16_to_f32_scalar
#define F32_TO_BF16 f32_to_bf16_scalar
#define F16_TO_F32 f16_to_f32_scalar
#define F32_TO_F16 f32_to_f16_scalar
#define F64_TO_BF16 f64_to_bf16_scalar
#include "convert_impl.h"
