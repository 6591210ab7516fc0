/*
 * engine_impl.h -- the engine for one dtype: REAL (float or double) and
 * REAL_DTYPE (POSENC_F32 or POSENC_F64) are defined by the translation unit
 * that includes it (engine_f32.c, engine_f64.c), so every function below is
 * a plain static name of that unit.  Compiled at the baseline ISA; all
 * arithmetic-heavy work goes through the dispatched kernel table.
 *
 * Each template header includes the ones it uses (the order here does not
 * matter) and compiles on its own for either REAL; the layers, bottom up:
 * gemm_impl.h (packing, GEMM over the microkernel); scales_impl.h (a call's
 * scales); the term kinds (term_kinds_impl.h over their files, csrc/terms.h)
 * and rope_impl.h (the rotation: a unit's inputs); forward_impl.h (logits);
 * backward_rows_impl.h and its parts backward_product_impl.h,
 * backward_slots_impl.h under backward_impl.h (gradients); attention_impl.h
 * (the fused attention's context) under attention_forward_impl.h (with
 * attention_decode_impl.h and attention_split_impl.h) and
 * attention_backward_impl.h; matmul_impl.h (dense products).
 */
#ifndef POSENC_ENGINE_ENGINE_IMPL_H
#define POSENC_ENGINE_ENGINE_IMPL_H

#include "engine.h"

#include <string.h>

#include "forward_impl.h"
#include "backward_impl.h"
#include "attention_forward_impl.h"
#include "attention_backward_impl.h"
#include "matmul_impl.h"

#endif /* POSENC_ENGINE_ENGINE_IMPL_H */
