/* engine_f64.c -- the engine in double: the templates, then its entry points. */
#define REAL double
#define REAL_DTYPE POSENC_F64
#include "engine_impl.h"

const posenc_engine posenc_engine_f64 = {forward, backward, attention_forward, attention_backward,
                                         matmul, term_kinds_check};
