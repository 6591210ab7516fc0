/* engine_f32.c -- the engine in float: the templates, then its entry points. */
#define REAL float
#define REAL_DTYPE POSENC_F32
#define ENGINE_BF16_GEMM   /* the bfloat16 GEMM of posenc_bf16_gemm_kernels (gemm_impl.h) */
#include "engine_impl.h"

const posenc_engine posenc_engine_f32 = {forward, backward, attention_forward, attention_backward,
                                        matmul, term_kinds_check};
