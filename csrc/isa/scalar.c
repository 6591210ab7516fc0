/*
 * scalar.c -- the portable kernels: plain C at the baseline of the target,
 * the fallback for every entry of the dispatch table (STYLE.md 2).
 * Register tile 4 x 4.
 */
#include "../posenc.h"

#define MR 4
#define NRV 4
#define VECTOR_TEMPLATE "kernels_impl.h"
#include "vectors_scalar.h"
