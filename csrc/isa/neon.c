/*
 * neon.c -- AArch64 NEON (Advanced SIMD) kernels; empty elsewhere.
 * Register tile 8 x 2 vectors: 16 accumulators of the 32 v registers.
 */
#include "../posenc.h"

#define MR 8
#define NRV 2
#include "vector_exp.h"   /* VEXP, VMAX: the hooks of the softmax rows */
#define VECTOR_TEMPLATE "kernels_impl.h"
#include "vectors_neon.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "convert_scalar.h"

/* The conversions (convert_impl.h), 4 elements a block: float16 by fcvtn /
 * fcvtl, bfloat16 by integers (BFCVTN needs FEAT_BF16), convert_scalar.h's
 * formula on lanes. */
static inline void f32_to_bf16_neon(uint16_t *d, const float *s)
{
    const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(s));
    vst1_u16(d, vmovn_u32(POSENC_BF16_ROUND_LANES(u, vshrq_n_u32, vandq_u32, vaddq_u32, vorrq_u32,
                                                  vdupq_n_u32, vcgtq_u32, vbslq_u32)));
}
static inline void bf16_to_f32_neon(float *d, const uint16_t *s)
{
    vst1q_f32(d, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(s), 16)));
}
static inline void f32_to_f16_neon(uint16_t *d, const float *s)
{
    vst1_u16(d, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(s))));
}
static inline void f16_to_f32_neon(float *d, const uint16_t *s)
{
    vst1q_f32(d, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s))));
}

#define CONVERT_ISA neon
#define CVL 4
#define BF16_TO_F32 bf16_to_f32_neon
#define F32_TO_BF16 f32_to_bf16_neon
#define F16_TO_F32 f16_to_f32_neon
#define F32_TO_F16 f32_to_f16_neon
#include "convert_impl.h"
#endif /* NEON */
