/*
 * vectors_scalar.h -- the portable "vector" layer: one lane of plain C at
 * the baseline of the target.  Instantiates VECTOR_TEMPLATE (the kernels,
 * or posenc._machine's loops) for float, then double; see kernels_impl.h
 * for what each macro means.
 */
#define VL 1
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VBCAST(x) (x)
#define VZERO() ((REAL)0)
#define VADD(a, b) ((a) + (b))
#define VMUL(a, b) ((a) * (b))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VREDUCE(v) (v)
#define VTRANSPOSE(rows) ((void)(rows))   /* a 1 x 1 block */
#define VSTREAM(p, v) VSTORE(p, v)
#define ISA_STRING "scalar"
#define STORE_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

#define REAL float
#define VT float
#define KNAME(x) x##_f32_scalar
#include VECTOR_TEMPLATE
#undef REAL
#undef VT
#undef KNAME

#define REAL double
#define VT double
#define KNAME(x) x##_f64_scalar
#include VECTOR_TEMPLATE
#undef REAL
#undef VT
#undef KNAME
