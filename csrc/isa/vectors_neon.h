/*
 * neon.c -- AArch64 NEON (Advanced SIMD) kernels.  NEON is mandatory on
 * AArch64, so this file needs no extra flag there; elsewhere it is empty.
 * Register tile 8 x 2 vectors: 16 accumulators of the 32 v registers.
 */
#include "../posenc.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define MR 8
#define NRV 2
#define ISA_STRING "neon"
#define STORE_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define VSTREAM(p, v) VSTORE(p, v)

#define REAL float
#define VT float32x4_t
#define VL 4
#define VLOAD(p) vld1q_f32(p)
#define VSTORE(p, v) vst1q_f32((p), (v))
#define VBCAST(x) vdupq_n_f32(x)
#define VZERO() vdupq_n_f32(0.0f)
#define VADD(a, b) vaddq_f32((a), (b))
#define VMUL(a, b) vmulq_f32((a), (b))
#define VFMA(a, b, c) vfmaq_f32((c), (a), (b))
#define VREDUCE(v) vaddvq_f32(v)
#define KNAME(x) x##_f32_neon
#define KTABLE posenc_kernels_f32_neon
#include "kernels_impl.h"
#include "vector_undef.h"
#define VSTREAM(p, v) VSTORE(p, v)

#define REAL double
#define VT float64x2_t
#define VL 2
#define VLOAD(p) vld1q_f64(p)
#define VSTORE(p, v) vst1q_f64((p), (v))
#define VBCAST(x) vdupq_n_f64(x)
#define VZERO() vdupq_n_f64(0.0)
#define VADD(a, b) vaddq_f64((a), (b))
#define VMUL(a, b) vmulq_f64((a), (b))
#define VFMA(a, b, c) vfmaq_f64((c), (a), (b))
#define VREDUCE(v) vaddvq_f64(v)
#define KNAME(x) x##_f64_neon
#define KTABLE posenc_kernels_f64_neon
#include "kernels_impl.h"

#endif /* NEON */
