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
