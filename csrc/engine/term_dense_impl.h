/*
 * term_dense_impl.h -- the dense factor of TUPE and DIET-ABS, ds pos_q_i .
 * pos_k_j (docs/spec.md §3.8, §3.9), a term module (csrc/terms.h) for one
 * dtype (REAL): the kind whose rows are a GEMM.
 *
 * Arrays, per head (no batch axis: the batch shares them), in the problem's
 * compute type (`real`): pos_q, n x d_p; pos_k, m x d_p.  Its scale ds is
 * the problem's dense_scale (TUPE's s, DIET-ABS's 1; where the scales are
 * not tame the engine's unit problem holds 1 there and the exact path
 * applies ds in double: term_kind's `scaled`).  Formed once per unit: ds
 * pos_k^T packed as a GEMM's B operand (gemm_impl.h), which the forward's
 * head blocks form once per head.  Its rows on a tile: one GEMM of the
 * tile's rows of pos_q by it, from key 0.  Its gradient, per row block of
 * the logits' gradient S (term_kind's `grad_block`, keys [0, cols), zero
 * where `limits` skips): dpos_q = ds S pos_k, dpos_k = ds S^T pos_q, two
 * GEMMs into the engine's REAL slots (per unit in the fused attention, per
 * head in the logits' backward, which hands it sum_b G[b, h]: it is linear
 * in S), which the engine sums over the batch into the double gradients.
 */
#ifndef POSENC_ENGINE_TERM_DENSE_IMPL_H
#define POSENC_ENGINE_TERM_DENSE_IMPL_H

#include "engine.h"

enum { DENSE_POS_Q, DENSE_POS_K };

/* d_p, the depth of pos_q and pos_k (0 where n and m are). */
static inline size_t dense_depth(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_dense].array;
    return p->m ? a[DENSE_POS_K].per_unit / p->m : p->n ? a[DENSE_POS_Q].per_unit / p->n : 0;
}

/* The list's condition: n x d_p and m x d_p per head, no batch axis. */
static inline int term_dense_valid(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_dense].array;
    const size_t dp = dense_depth(p);
    return !a[DENSE_POS_Q].batch_stride && !a[DENSE_POS_K].batch_stride &&
           a[DENSE_POS_Q].per_unit == p->n * dp && a[DENSE_POS_K].per_unit == p->m * dp;
}

#ifdef REAL

#include "term_unit_impl.h"

/* The unit data: ds pos_k^T packed (d_p x m). */
static size_t term_dense_unit_scratch(const posenc_problem *p, const posenc_kernels *kern,
                                 const terms_call *call)
{
    return packed_b_size(dense_depth(p), p->m, kern->nr);
}

static void term_dense_unit(const term_unit *t)
{
    const size_t dp = dense_depth(t->p);
    packed_b pb;
    pack_b(t->kern, t->gemm, &pb, t->unit_data, t->real[DENSE_POS_K], 1, (ptrdiff_t)dp, dp,
           t->p->m, (REAL)t->p->dense_scale);
}

/* Rows [i0, i0 + rows), keys [0, cols) (from key 0 whatever k0: the GEMM's panels start
 * there), set (op SET) or added. */
static void term_dense_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                            size_t rows, size_t k0, size_t cols)
{
    const size_t dp = dense_depth(t->p);
    (void)k0;
    packed_b keys = packed_b_shape(t->kern, t->unit_data, dp, t->p->m, (REAL)t->p->dense_scale);
    keys.N = cols;   /* the first cols columns of the packed panels */
    gemm_packed(t->kern, t->gemm, rows, t->real[DENSE_POS_Q] + i0 * dp, (ptrdiff_t)dp, 1, &keys,
                P, (ptrdiff_t)ldp, op != POSENC_SET, NULL, 0, NULL, 0, NULL);
}

/* The gradients of rows [i0, i0 + rows) of S (row r at S + r lds, keys [0, cols), zero
 * where limits skip) into the unit's REAL slots: pos_q's rows set, pos_k's rows [0, cols)
 * accumulated (set by the first block, i0 = 0, its rows past cols zeroed); scratch: the
 * thread's grad_scratch doubles, room to pack a GEMM's B operand. */
static void term_dense_grad_block(const term_unit *t, REAL *const *slot, const REAL *S,
                                  size_t lds, size_t i0, size_t rows, size_t cols,
                                  const block_limits *limits, double *scratch)
{
    const size_t dp = dense_depth(t->p), m = t->p->m;
    const REAL ds = (REAL)t->p->dense_scale;
    REAL *b_pack = (REAL *)(void *)scratch;
    if (slot[DENSE_POS_Q] && rows && cols)
        gemm(t->kern, t->gemm, b_pack, rows, dp, cols, S, (ptrdiff_t)lds, 1,
             t->real[DENSE_POS_K], (ptrdiff_t)dp, 1, ds, slot[DENSE_POS_Q] + i0 * dp,
             (ptrdiff_t)dp, 0, limits ? limits->row_keys : NULL);
    else if (slot[DENSE_POS_Q])
        memset(slot[DENSE_POS_Q] + i0 * dp, 0, sizeof(REAL) * rows * dp);
    if (slot[DENSE_POS_K] && i0 == 0)
        memset(slot[DENSE_POS_K] + cols * dp, 0, sizeof(REAL) * (m - cols) * dp);
    if (slot[DENSE_POS_K] && rows && cols)
        gemm(t->kern, t->gemm, b_pack, cols, dp, rows, S, 1, (ptrdiff_t)lds,
             t->real[DENSE_POS_Q] + i0 * dp, (ptrdiff_t)dp, 1, ds, slot[DENSE_POS_K],
             (ptrdiff_t)dp, i0 > 0, limits ? limits->key_rows : NULL);
}

/* The doubles of a thread's scratch: a GEMM's B operand packed, depth up to max(n, m). */
static size_t term_dense_grad_scratch(const posenc_problem *p, const posenc_kernels *kern)
{
    const size_t reals = packed_b_size(posenc_max(p->n, p->m), dense_depth(p), kern->nr);
    return (reals * sizeof(REAL) + sizeof(double) - 1) / sizeof(double);
}

/* It adds rows: it does not read the content logits; its gradient goes by blocks. */
#define term_dense_grad_rows NULL
#define term_dense_content NULL
#define term_dense_content_grad NULL
#define term_dense_content_keep NULL
#define term_dense_expand_rows NULL
#define term_dense_expand NULL
#define term_dense_row_of NULL
#define term_dense_rows_at NULL
#define term_dense_prepare NULL
#define term_dense_release NULL
#define term_dense_content_row NULL
#define term_dense_fuses NULL
#define term_dense_grad_prepare NULL
#define term_dense_grad_release NULL
#define term_dense_grad_unit_scratch NULL
#define term_dense_grad_begin NULL
#define term_dense_grad_sums NULL
#define term_dense_grad_end NULL
#define term_dense_grad_reduce NULL
#define term_dense_overrides 0
#define term_dense_scaled 1
#define term_dense_grad_bf16 0

#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_dense_factor 0
/* Its gradient goes by blocks, head by head in the logits' backward (posenc_term_by_blocks:
 * the fold, the low-precision chunks, the fused attention's first key and split keys). */
#define term_dense_by_blocks 1
#define term_dense_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_DENSE_IMPL_H */
