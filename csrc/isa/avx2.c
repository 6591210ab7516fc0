/*
 * avx2.c -- AVX2 + FMA kernels (compiled with -mavx2 -mfma only).
 * Register tile 6 x 2 vectors: 12 accumulators, 2 B vectors, 1 broadcast
 * of the 16 ymm registers.
 */
#include "../posenc.h"

#define MR 6
#define NRV 2
#include "vector_exp.h"   /* VEXP, VMAX: the hooks of the softmax rows */
#define VECTOR_TEMPLATE "kernels_impl.h"
#include "vectors_avx2.h"
