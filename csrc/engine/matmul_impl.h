/*
 * matmul_impl.h -- a dense product C = A B [+ bias] on the engine's GEMM
 * (posenc_matmul): the projections around an attention (q, k, v and the
 * output's) and their gradients, X W^T, G W and G^T X, each a strided view
 * of row-major arrays.  BLIS's loop order over gemm_packed: for each
 * thread's rows of C, blocks of nc columns, in them blocks of kc of the
 * depth, each packed once (kc x nc in L2) and swept by every mr-row tile
 * of A (mr x kc in L1).  Threads split C's rows in whole tiles, each
 * packing its own B blocks: the results do not depend on the team.
 */
#ifndef POSENC_ENGINE_MATMUL_IMPL_H
#define POSENC_ENGINE_MATMUL_IMPL_H

#include "gemm_impl.h"

/* Columns of a packed B block: kc x nc of REAL in about 256 KiB (L2). */
static size_t matmul_nc(const posenc_kernels *kern)
{
    const size_t nc = ((size_t)256 << 10) / (kern->kc * sizeof(REAL));
    return posenc_max(kern->nr, nc / kern->nr * kern->nr);
}

/* A thread's workspace: gemm's scratch and one packed kc x nc block of B. */
typedef struct {
    REAL *a_pack, *b_pack;
} matmul_ws;

static size_t matmul_ws_layout(const posenc_kernels *kern, matmul_ws *w, REAL *mem)
{
    size_t at = 0;
    WS_TAKE(w, mem, at, a_pack, gemm_scratch_size(kern));
    WS_TAKE(w, mem, at, b_pack, packed_b_size(kern->kc, matmul_nc(kern), kern->nr));
    return at;
}

typedef struct {
    const posenc_matmul_problem *mm;
    const posenc_kernels *kern;
    size_t rows_per_item, items;
} matmul_call;

/* Rows [r0, r1) of C, on one thread's workspace. */
static void matmul_rows(const matmul_call *call, void *ws, size_t r0, size_t r1)
{
    const posenc_matmul_problem *mm = call->mm;
    const posenc_kernels *kern = call->kern;
    const size_t nc = matmul_nc(kern), K = mm->K;
    matmul_ws w;
    matmul_ws_layout(kern, &w, (REAL *)ws);
    gemm_scratch s;
    gemm_scratch_carve(&s, w.a_pack, kern, NULL);
    const REAL *A = (const REAL *)mm->a + (ptrdiff_t)r0 * mm->a_rs;
    const REAL *B = (const REAL *)mm->b, *bias = (const REAL *)mm->bias;
    REAL *C = (REAL *)mm->c + (ptrdiff_t)r0 * mm->ldc;
    for (size_t j0 = 0; j0 < mm->N; j0 += nc) {
        const size_t cols = posenc_min(nc, mm->N - j0);
        const REAL *bias_j = bias ? bias + j0 : NULL;
        /* K = 0: one block of depth 0, whose epilogue alone gives C = bias, or 0 */
        for (size_t l0 = 0; l0 == 0 || l0 < K; l0 += kern->kc) {
            const size_t depth = posenc_min(kern->kc, K - l0);
            const int last = l0 + depth == K;
            packed_b pb;
            pack_b(kern, &s, &pb, w.b_pack,
                   B + (ptrdiff_t)l0 * mm->b_rs + (ptrdiff_t)j0 * mm->b_cs, mm->b_rs, mm->b_cs,
                   depth, cols, (REAL)1);
            /* the bias as a row added to every row of C (P with ldp 0), after the last block */
            gemm_packed(kern, &s, r1 - r0, A + (ptrdiff_t)l0 * mm->a_cs, mm->a_rs, mm->a_cs, &pb,
                        C + (ptrdiff_t)j0, mm->ldc, l0 > 0, last ? bias_j : NULL, 0, NULL,
                        last && bias_j ? POSENC_UKR_ADD_P : 0, NULL);
        }
    }
}

/* One thread's items (posenc_run_team). */
static void matmul_team(void *arg, void *ws)
{
    const matmul_call *call = (const matmul_call *)arg;
#pragma omp for schedule(static)
    for (ptrdiff_t item = 0; item < (ptrdiff_t)call->items; ++item) {
        const size_t r0 = (size_t)item * call->rows_per_item;
        matmul_rows(call, ws, r0, posenc_min(call->mm->M, r0 + call->rows_per_item));
    }
}

static int matmul(const posenc_matmul_problem *mm, int num_threads)
{
    if (mm->M == 0 || mm->N == 0)
        return POSENC_OK;
    const posenc_kernels *kern = posenc_active_kernels(REAL_DTYPE);
    const size_t threads = (size_t)(num_threads > 0 ? num_threads : 1);
    matmul_call call = {mm, kern, posenc_rows_per_item(1, mm->M, kern->mr, threads), 0};
    call.items = (mm->M + call.rows_per_item - 1) / call.rows_per_item;
    const size_t work = posenc_mul_size(posenc_mul_size(mm->M, mm->N), mm->K + 1);
    return posenc_run_team(posenc_team_for(threads, call.items, work),
                           matmul_ws_layout(kern, NULL, NULL) * sizeof(REAL), matmul_team, &call);
}

#endif /* POSENC_ENGINE_MATMUL_IMPL_H */
