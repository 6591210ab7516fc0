/* engine_f32.c -- the engine in float: the templates, then the public entry points. */
#define REAL float
#define REAL_DTYPE POSENC_F32
#include "engine_impl.h"

int posenc_forward_f32(const posenc_problem *p, void *out, int threads) { return forward(p, out, threads); }
int posenc_backward_f32(const posenc_problem *p, const void *G, const posenc_grads *g, int threads) { return backward(p, G, g, threads); }
int posenc_attention_forward_f32(const posenc_problem *p, const posenc_attention *a, void *out, void *lse, int threads) { return attention_forward(p, a, out, lse, threads); }
int posenc_attention_backward_f32(const posenc_problem *p, const posenc_attention *a, const void *d_out, const void *out, const void *lse, const posenc_grads *g, void *grad_v, int threads) { return attention_backward(p, a, d_out, out, lse, g, grad_v, threads); }
