/*
 * scalar.c -- the portable kernels: plain C at the baseline of the target,
 * the fallback for every entry of the dispatch table (STYLE.md 2).
 */
#include "../posenc.h"

#define VL 1
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VBCAST(x) (x)
#define VZERO() ((REAL)0)
#define VADD(a, b) ((a) + (b))
#define VMUL(a, b) ((a) * (b))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VREDUCE(v) (v)
#define MR 4
#define NRV 4
#define ISA_STRING "scalar"
#define STORE_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define VSTREAM(p, v) VSTORE(p, v)

#define REAL float
#define VT float
#define KNAME(x) x##_f32_scalar
#define KTABLE posenc_kernels_f32_scalar
#include "kernels_impl.h"
#undef REAL
#undef VT
#undef KNAME
#undef KTABLE

#define REAL double
#define VT double
#define KNAME(x) x##_f64_scalar
#define KTABLE posenc_kernels_f64_scalar
#include "kernels_impl.h"
