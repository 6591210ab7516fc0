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

/* VTRANSPOSE: rows[u] = column u of the 4 x 4 floats rows[0..3] (floats
 * of row pairs interleaved, then their pairs as doubles), or of the 2 x 2
 * doubles rows[0..1]. */
static inline void posenc_transpose_f32x4(float32x4_t rows[4])
{
    const float32x4_t t[4] = {vtrn1q_f32(rows[0], rows[1]), vtrn2q_f32(rows[0], rows[1]),
                              vtrn1q_f32(rows[2], rows[3]), vtrn2q_f32(rows[2], rows[3])};
    for (int e = 0; e < 2; ++e) {
        const float64x2_t lo = vreinterpretq_f64_f32(t[e]), hi = vreinterpretq_f64_f32(t[2 + e]);
        rows[e] = vreinterpretq_f32_f64(vtrn1q_f64(lo, hi));
        rows[2 + e] = vreinterpretq_f32_f64(vtrn2q_f64(lo, hi));
    }
}

static inline void posenc_transpose_f64x2(float64x2_t rows[2])
{
    const float64x2_t first = vtrn1q_f64(rows[0], rows[1]);
    rows[1] = vtrn2q_f64(rows[0], rows[1]);
    rows[0] = first;
}

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
#define VTRANSPOSE(rows) posenc_transpose_f32x4(rows)
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
#define VTRANSPOSE(rows) posenc_transpose_f64x2(rows)
#define VSTREAM(p, v) VSTORE(p, v)
#define KNAME(x) x##_f64_neon
#include VECTOR_TEMPLATE
#include "vector_undef.h"

#endif /* NEON */
