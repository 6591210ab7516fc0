/*
 * term_relative_bias_2d_impl.h -- the 2-D relative position bias of Swin and
 * BEiT (docs/spec.md §3.19), a term module (csrc/terms.h), for one dtype
 * (REAL).
 *
 * Arrays, per unit (b, h), float64: bias, the table (T or T + 3 entries,
 * T = (2 t_y + 1)(2 t_x + 1)); coords_q (y, x of each query, 2n) and coords_k
 * (2m), integers, (-1, -1) for a global token; distance, (t_y, t_x).  With
 * dy = clip(y_k - y_q, t_y), dx = clip(x_k - x_q, t_x) the term is
 * bias[(dy + t_y)(2 t_x + 1) + dx + t_x]; a global query reads bias[T] (bias[T + 2]
 * for a global key), an ordinary query a global key bias[T + 1].
 *
 * Keys come in runs: consecutive keys of one grid row whose x rises by one (a
 * raster's rows; run_end[j] the end of j's run, formed per unit).  Along a run
 * dy is one value and the bucket rises by one, clipped at both ends: a row's
 * run is at most three pieces, a clipped bucket repeated, a stretch of the
 * table, the other clipped bucket (the kernels' row_gather, strides 0 and 1);
 * nothing of n x m is indexed.  The gradient takes the same pieces back: the
 * sum of a clipped piece into its bucket, the stretch added entry by entry, in
 * a REAL table per call (a block of rows), added to the double gradient after.
 */
#ifndef POSENC_ENGINE_TERM_RELATIVE_BIAS_2D_IMPL_H
#define POSENC_ENGINE_TERM_RELATIVE_BIAS_2D_IMPL_H

#include <math.h>

#include "engine.h"

enum { RB2D_BIAS, RB2D_COORDS_Q, RB2D_COORDS_K, RB2D_DISTANCE };
#define RB2D_LIMIT 1073741824.0   /* coordinates and distances below 2^30 */

/* Whether x is a coordinate: an integer in [0, 2^30). */
static inline int rb2d_coordinate(double x)
{
    return x >= 0 && x < RB2D_LIMIT && x == floor(x);
}

/* Whether every token of coords (len pairs) is a coordinate pair or (-1, -1); *global
 * set when one is (-1, -1). */
static inline int rb2d_coords_valid(const double *c, size_t len, int *global)
{
    for (size_t t = 0; t < len; ++t) {
        if (c[2 * t] == -1 && c[2 * t + 1] == -1)
            *global = 1;
        else if (!rb2d_coordinate(c[2 * t]) || !rb2d_coordinate(c[2 * t + 1]))
            return 0;
    }
    return 1;
}

/* The list's condition: distances and coordinates integers in [0, 2^30) (or a global
 * token), every batch's, and the table T entries, or T + 3 (required with a global). */
static inline int term_relative_bias_2d_valid(const posenc_problem *p)
{
    const posenc_term_array *a = p->terms[POSENC_TERM_relative_bias_2d].array;
    const double *distance = (const double *)a[RB2D_DISTANCE].data;
    /* one (t_y, t_x) for the call; coordinates shared by the heads (head axis 1) */
    if (a[RB2D_DISTANCE].batch_stride || a[RB2D_DISTANCE].head_stride ||
        a[RB2D_COORDS_Q].head_stride || a[RB2D_COORDS_K].head_stride ||
        !rb2d_coordinate(distance[0]) || !rb2d_coordinate(distance[1]))
        return 0;
    int global = 0;
    for (size_t b = 0; b < p->B; ++b)
        for (int side = RB2D_COORDS_Q; side <= RB2D_COORDS_K; ++side) {
            const posenc_term_array *c = &a[side];
            if (b && !c->batch_stride)
                continue;   /* one batch's, shared */
            if (!rb2d_coords_valid((const double *)c->data + b * c->batch_stride,
                                   c->per_unit / 2, &global))
                return 0;
        }
    const size_t T = (size_t)(2 * distance[0] + 1) * (size_t)(2 * distance[1] + 1);
    return a[RB2D_BIAS].per_unit == T + 3 || (!global && a[RB2D_BIAS].per_unit == T);
}

#ifdef REAL

#include "term_unit_impl.h"

/* clip(v, -t, t) */
static inline int64_t rb2d_clip(int64_t v, int64_t t)
{
    return v < -t ? -t : v > t ? t : v;
}

/* run_end[j]: the end of key j's run (csrc/engine/term_relative_bias_2d_impl.h's
 * header): j + 1 for a global key, or where the next key leaves the grid row or the
 * step of one. */
static void rb2d_runs(int32_t *run_end, const double *coords_k, size_t m)
{
    for (size_t j = m; j-- > 0;) {
        const double *c = coords_k + 2 * j;
        const int joined = j + 1 < m && c[0] >= 0 && c[2] == c[0] && c[3] == c[1] + 1;
        run_end[j] = joined ? run_end[j + 1] : (int32_t)(j + 1);
    }
}

/* The unit's table in REAL (bias' entries), then the keys' runs (m int32). */
static void term_relative_bias_2d_unit(const term_unit *t)
{
    const size_t L = t->term->array[RB2D_BIAS].per_unit;
    const double *bias = t->array[RB2D_BIAS];
    for (size_t e = 0; e < L; ++e)
        t->unit_data[e] = (REAL)bias[e];
    rb2d_runs((int32_t *)(void *)(t->unit_data + posenc_round_up(L, 16)), t->array[RB2D_COORDS_K],
              t->p->m);
}

/* Pieces handed to the kernels at once (a row's runs: a few dozen; a row of more goes in
 * several calls). */
#define RB2D_BATCH 256

/* The unit's table, its keys' runs, a batch of a row's pieces (a thread's). */
static size_t term_relative_bias_2d_unit_scratch(const posenc_problem *p,
                                                 const posenc_kernels *kern,
                                 const terms_call *call)
{
    (void)kern;
    const size_t L = p->terms[POSENC_TERM_relative_bias_2d].array[RB2D_BIAS].per_unit;
    return posenc_round_up(L, 16) + term_reals(p->m * sizeof(int32_t)) +
           term_reals(RB2D_BATCH * sizeof(posenc_piece));
}

/*
 * The pieces of row i (query coordinates cq) over keys [k0, cols), at most three per
 * run (posenc_piece: keys [j, j + len) read bucket at, at + 1, ... or at alone), each
 * handed to `piece`: the loop the forward and the backward share.
 */
#define RB2D_PIECES(cq, coords_k, run_end, T, ty, tx, k0, cols, PIECE)                        \
    do {                                                                                     \
        const int global_q_ = (cq)[0] < 0;                                                   \
        const int64_t qy_ = (int64_t)(cq)[0], qx_ = (int64_t)(cq)[1];                        \
        const int64_t wx_ = 2 * (tx) + 1;                                                    \
        for (size_t j_ = (k0); j_ < (cols);) {                                               \
            const double *ck_ = (coords_k) + 2 * j_;                                         \
            const size_t end_ = posenc_min((size_t)(run_end)[j_], (cols)), len_ = end_ - j_; \
            if (ck_[0] < 0 || global_q_) {   /* global key or query: one bucket */           \
                const size_t at_ = (T) + (global_q_ ? (ck_[0] < 0 ? 2 : 0) : 1);             \
                PIECE(((posenc_piece){j_, ck_[0] < 0 ? 1 : len_, at_, 0}));                     \
                j_ += ck_[0] < 0 ? 1 : len_;                                                 \
                continue;                                                                    \
            }                                                                                \
            const int64_t dy_ = rb2d_clip((int64_t)ck_[0] - qy_, (ty));               \
            const int64_t base_ = (dy_ + (ty)) * wx_ + (tx);   /* dx = 0's bucket */          \
            const int64_t dx0_ = (int64_t)ck_[1] - qx_;                                      \
            /* keys u < lead_ have dx < -tx, u >= tail_ dx > tx */                           \
            const size_t lead_ = dx0_ < -(tx) ? posenc_min((size_t)(-(tx) - dx0_), len_) : 0; \
            const size_t tail_ = dx0_ > (tx) ? 0 : posenc_min((size_t)((tx) - dx0_ + 1), len_); \
            if (lead_)                                                                       \
                PIECE(((posenc_piece){j_, lead_, (size_t)(base_ - (tx)), 0}));                 \
            if (tail_ > lead_)                                                               \
                PIECE(((posenc_piece){j_ + lead_, tail_ - lead_,                               \
                                    (size_t)(base_ + dx0_ + (int64_t)lead_), 1}));           \
            if (len_ > tail_)                                                                \
                PIECE(((posenc_piece){j_ + tail_, len_ - tail_, (size_t)(base_ + (tx)), 0}));  \
            j_ = end_;                                                                       \
        }                                                                                    \
    } while (0)

/* A piece collected into the row's batch (count: its pieces so far), the batch handed to
 * FLUSH when full. */
#define RB2D_COLLECT_(piece)                   \
    do {                                       \
        pieces[count++] = (piece);             \
        if (count == RB2D_BATCH) {             \
            RB2D_FLUSH_;                       \
            count = 0;                         \
        }                                      \
    } while (0)

static void term_relative_bias_2d_rows(const term_unit *t, int op, REAL *P, size_t ldp, size_t i0,
                                       size_t rows, size_t k0, size_t cols)
{
    const posenc_kernels *kern = t->kern;
    const double *coords_q = t->array[RB2D_COORDS_Q], *coords_k = t->array[RB2D_COORDS_K];
    const int64_t ty = (int64_t)t->array[RB2D_DISTANCE][0], tx = (int64_t)t->array[RB2D_DISTANCE][1];
    const size_t T = (size_t)((2 * ty + 1) * (2 * tx + 1));
    const size_t L = t->term->array[RB2D_BIAS].per_unit;
    const REAL *table = t->unit_data;
    const int32_t *run_end = (const int32_t *)(const void *)(table + posenc_round_up(L, 16));
    posenc_piece *pieces = (posenc_piece *)(void *)(t->unit_data + posenc_round_up(L, 16) +
                                                    term_reals(t->p->m * sizeof(int32_t)));
    for (size_t e = 0; e < rows; ++e) {   /* a row's pieces, then a kernel call */
        size_t count = 0;
#define RB2D_FLUSH_ kern->row_pieces(op, P + e * ldp, table, pieces, count)
        RB2D_PIECES(coords_q + 2 * (i0 + e), coords_k, run_end, T, ty, tx, k0, cols,
                    RB2D_COLLECT_);
        RB2D_FLUSH_;
#undef RB2D_FLUSH_
    }
}

/* term_relative_bias_2d_grad_rows' scratch, in doubles: runs (m int32), table (L REAL), a
 * batch of pieces, then a widened row of G (m REAL); `at` the offsets of the last three. */
static size_t rb2d_grad_scratch(const posenc_problem *p, size_t at[3])
{
    const size_t L = p->terms[POSENC_TERM_relative_bias_2d].array[RB2D_BIAS].per_unit;
    at[0] = posenc_round_up((p->m + 1) / 2, 8);
    at[1] = at[0] + posenc_round_up(L, 8);
    at[2] = at[1] + posenc_round_up(RB2D_BATCH * (sizeof(posenc_piece) / sizeof(double)), 8);
    return at[2] + posenc_round_up(p->m * sizeof(REAL) / sizeof(double) + 1, 8);
}

/* The table's gradient of rows [i0, i0 + rows): each piece's G added back into its buckets
 * of a REAL table (a stretch entry by entry, a clipped piece's sum into its bucket: the
 * kernels' row_scatter_add), added to the unit's double gradient once per call.  From G's
 * bfloat16 twin (t->g16) a row at a time, widened into the scratch (term_grad_row) and
 * taken by the same kernel. */
static void term_relative_bias_2d_grad_rows(const term_unit *t, double *const *grad,
                                            const REAL *G, size_t ldg, size_t i0, size_t rows,
                                            size_t first, size_t cols, double *scratch)
{
    const posenc_kernels *kern = t->kern;
    double *dbias = grad[RB2D_BIAS];
    const double *coords_q = t->array[RB2D_COORDS_Q], *coords_k = t->array[RB2D_COORDS_K];
    const int64_t ty = (int64_t)t->array[RB2D_DISTANCE][0], tx = (int64_t)t->array[RB2D_DISTANCE][1];
    const size_t T = (size_t)((2 * ty + 1) * (2 * tx + 1));
    const size_t L = t->term->array[RB2D_BIAS].per_unit, m = t->p->m;
    if (!dbias || !rows || first >= cols)
        return;
    size_t at[3];
    rb2d_grad_scratch(t->p, at);
    int32_t *run_end = (int32_t *)(void *)scratch;
    REAL *table = (REAL *)(void *)(scratch + at[0]);
    posenc_piece *pieces = (posenc_piece *)(void *)(scratch + at[1]);
    REAL *wide = (REAL *)(void *)(scratch + at[2]);
    rb2d_runs(run_end, coords_k, m);
    memset(table, 0, sizeof(REAL) * L);
    for (size_t e = 0; e < rows; ++e) {
        size_t count = 0;
        const REAL *row = term_grad_row(t, G, ldg, e, first, cols, wide);
#define RB2D_FLUSH_ kern->row_pieces_take(table, row, pieces, count)
        RB2D_PIECES(coords_q + 2 * (i0 + e), coords_k, run_end, T, ty, tx, first, cols,
                    RB2D_COLLECT_);
        RB2D_FLUSH_;
#undef RB2D_FLUSH_
    }
    for (size_t e = 0; e < L; ++e)
        dbias[e] += (double)table[e];
}

static size_t term_relative_bias_2d_grad_scratch(const posenc_problem *p,
                                                 const posenc_kernels *kern)
{
    (void)kern;
    size_t at[3];
    return rb2d_grad_scratch(p, at);
}

/* It adds rows: it does not read the content logits. */
#undef RB2D_COLLECT_

#define term_relative_bias_2d_content NULL
#define term_relative_bias_2d_content_grad NULL
#define term_relative_bias_2d_content_keep NULL
#define term_relative_bias_2d_expand_rows NULL
#define term_relative_bias_2d_expand NULL
#define term_relative_bias_2d_row_of NULL
#define term_relative_bias_2d_prepare NULL
#define term_relative_bias_2d_release NULL
#define term_relative_bias_2d_content_row NULL
#define term_relative_bias_2d_fuses NULL
#define term_relative_bias_2d_grad_prepare NULL
#define term_relative_bias_2d_grad_release NULL
#define term_relative_bias_2d_grad_unit_scratch NULL
#define term_relative_bias_2d_grad_begin NULL
#define term_relative_bias_2d_grad_sums NULL
#define term_relative_bias_2d_grad_end NULL
#define term_relative_bias_2d_grad_reduce NULL
#define term_relative_bias_2d_overrides 0
#define term_relative_bias_2d_grad_block NULL
#define term_relative_bias_2d_scaled 0
#define term_relative_bias_2d_grad_bf16 1
#define term_relative_bias_2d_rows_at NULL

#endif /* REAL */

/* Not a factor of the product mode (entry.c's validation reads it). */
#define term_relative_bias_2d_factor 0
/* Its gradient goes by rows (engine_lp.c's chunks read it). */
#define term_relative_bias_2d_by_blocks 0
#define term_relative_bias_2d_vector 0   /* not a vector table (term_vectors.h) */

#endif /* POSENC_ENGINE_TERM_RELATIVE_BIAS_2D_IMPL_H */
