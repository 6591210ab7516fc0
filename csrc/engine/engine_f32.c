/* engine_f32.c -- the engine in float: the templates, then the public entry points. */
#define REAL float
#define REAL_DTYPE POSENC_F32
#include "engine_impl.h"

int posenc_forward_f32(const posenc_problem *p, void *out, int threads) { return forward(p, out, threads); }
int posenc_backward_f32(const posenc_problem *p, const void *G, const posenc_grads *g, int threads) { return backward(p, G, g, threads); }
