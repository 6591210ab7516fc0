/*
 * engine_impl.h -- the engine for one dtype: REAL (float or double) and
 * REAL_DTYPE (POSENC_F32 or POSENC_F64) are defined by the translation unit
 * that includes it (engine_f32.c, engine_f64.c), so every function below is
 * a plain static name of that unit.  Compiled at the baseline ISA; all
 * arithmetic-heavy work goes through the dispatched kernel table.
 */
#include "engine.h"

#include <string.h>

#include "gemm_impl.h"              /* packing, GEMM over the microkernel */
#include "terms_impl.h"             /* the positional terms of a row tile */
#include "rope_impl.h"              /* the rotation of q and k: a unit's inputs */
#include "forward_impl.h"           /* logits */
#include "backward_impl.h"          /* gradients */
#include "backward_vectors_impl.h"  /* gradients through the vector tables */
#include "backward_product_impl.h"  /* gradients' product-mode factors */
#include "backward_slots_impl.h"    /* the backward's slots and their reduction */
#include "attention_impl.h"         /* the fused attention: its context, the forward */
#include "attention_backward_impl.h"   /* ... and its backward */
#include "matmul_impl.h"            /* dense products: the projections around it */
