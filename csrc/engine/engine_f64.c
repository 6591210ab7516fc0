/* engine_f64.c -- the engine in double: the templates, then the public entry points. */
#define REAL double
#define REAL_DTYPE POSENC_F64
#include "engine_impl.h"

int posenc_forward_f64(const posenc_problem *p, void *out, int threads) { return forward(p, out, threads); }
int posenc_backward_f64(const posenc_problem *p, const void *G, const posenc_grads *g, int threads) { return backward(p, G, g, threads); }
