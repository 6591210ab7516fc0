/*
 * term_rope_token_impl.h -- rotary tables per token (docs/spec.md §3.16), a
 * term module (csrc/terms.h) that adds nothing: it rotates.  Its arrays,
 * float64 per unit (b, h): cos, sin (n rope_pairs: query row i's pairs at
 * i rope_pairs), cos_k, sin_k (m rope_pairs; a key head's tables repeated for
 * the query heads of its group).  rope_impl.h reads them where it reads the
 * (P, r) tables' rows (query row i uses row i, whatever query_offset is: the
 * offset moves the masks only), and gives their gradients from the unit's
 * dq and dk before taking those back through the rotation (rope_token_grads).
 * The rotation's other fields are p's: rope_pairs, rope_interleaved; rope_cos
 * is NULL (posenc_rotates: either form).
 */
#ifndef POSENC_ENGINE_TERM_ROPE_TOKEN_IMPL_H
#define POSENC_ENGINE_TERM_ROPE_TOKEN_IMPL_H

#include "engine.h"

enum { ROPE_TOKEN_COS, ROPE_TOKEN_SIN, ROPE_TOKEN_COS_K, ROPE_TOKEN_SIN_K };

/* The list's condition: no (P, r) tables nor positions beside them, 2 rope_pairs <= d,
 * the query tables n rope_pairs long and the keys' m rope_pairs, no product mode. */
static inline int term_rope_token_valid(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_rope_token].array;
    const size_t pairs = p->rope_pairs;
    return !p->rope_cos && !p->positions_q && !p->positions_k && 2 * pairs <= p->d &&
           a[ROPE_TOKEN_COS].per_unit == p->n * pairs && a[ROPE_TOKEN_SIN].per_unit == p->n * pairs &&
           a[ROPE_TOKEN_COS_K].per_unit == p->m * pairs &&
           a[ROPE_TOKEN_SIN_K].per_unit == p->m * pairs;
}

#ifdef REAL
/* A rotation has no rows of its own: term_kinds_impl.h skips a kind whose rows are NULL
 * (rope_impl.h applies it). */
#define term_rope_token_unit NULL
#define term_rope_token_unit_scratch NULL
#define term_rope_token_rows NULL
#define term_rope_token_grad_rows NULL
#define term_rope_token_grad_scratch NULL
#define term_rope_token_content NULL
#define term_rope_token_content_grad NULL
#define term_rope_token_content_keep NULL
#define term_rope_token_expand_rows NULL
#define term_rope_token_expand NULL
#define term_rope_token_row_of NULL
#define term_rope_token_prepare NULL
#define term_rope_token_release NULL
#define term_rope_token_content_row NULL
#define term_rope_token_fuses NULL
#define term_rope_token_grad_prepare NULL
#define term_rope_token_grad_release NULL
#define term_rope_token_grad_unit_scratch NULL
#define term_rope_token_grad_begin NULL
#define term_rope_token_grad_sums NULL
#define term_rope_token_grad_end NULL
#define term_rope_token_grad_reduce NULL
#define term_rope_token_overrides 0
#define term_rope_token_grad_block NULL
#define term_rope_token_scaled 0
#define term_rope_token_grad_bf16 0
#define term_rope_token_rows_at NULL
#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_rope_token_factor 0
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_rope_token_by_blocks 0
#define term_rope_token_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_ROPE_TOKEN_IMPL_H */
