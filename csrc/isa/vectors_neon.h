/*
 * vectors_neon.h -- the AArch64 NEON (Advanced SIMD) vector layer.  NEON is
 * mandatory on AArch64, so it needs no extra flag there; elsewhere it is
 * empty.  Instantiates VECTOR_TEMPLATE (the kernels, or posenc._machine's
 * loops) for float, then double; see kernels_impl.h for what each macro
 * means.  NEON has no non-temporal vector store worth the name here: plain
 * stores.
 */
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define ISA_STRING "neon"
#define STORE_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

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
#define VSTREAM(p, v) VSTORE(p, v)
#define KNAME(x) x##_f32_neon
#include VECTOR_TEMPLATE
#include "vector_undef.h"

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
#define VSTREAM(p, v) VSTORE(p, v)
#define KNAME(x) x##_f64_neon
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#endif /* NEON */
