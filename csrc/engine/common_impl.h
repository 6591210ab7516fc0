/*
 * common_impl.h -- the engine's building blocks, for one dtype.
 * Included by engine.c with REAL (float/double) and T(name) (name##_f32/_f64).
 *
 *   packing      BLIS-style panels for the ISA microkernel
 *   gemm         C (op)= alpha A.B over packed panels, any strides, with a
 *                per-tile epilogue (add or multiply a positional row block P)
 *   positional   builders of the positional rows of a row tile, one per
 *                term kind, shared by the forward and the product backward
 */

/* Depth of one packed block: the microkernel's A and B panels stay in L1. */
#define T_KC (sizeof(REAL) == 4 ? 256 : 128)

/* ------------------------------------------------------------- packing */

/* dst[l * mr + r] = alpha * A[r * rs + l * cs], zero for rows >= rows. */
static void T(pack_a)(REAL *restrict dst, const REAL *A, ptrdiff_t rs, ptrdiff_t cs,
                      size_t rows, size_t kc, size_t mr, REAL alpha)
{
    if (rows < mr)
        memset(dst, 0, sizeof(REAL) * mr * kc);
    if (cs == 1) {
        for (size_t r = 0; r < rows; ++r) {
            const REAL *restrict src = A + (ptrdiff_t)r * rs;
            for (size_t l = 0; l < kc; ++l)
                dst[l * mr + r] = alpha * src[l];
        }
    } else {
        for (size_t l = 0; l < kc; ++l) {
            const REAL *src = A + (ptrdiff_t)l * cs;
            for (size_t r = 0; r < rows; ++r)
                dst[l * mr + r] = alpha * src[(ptrdiff_t)r * rs];
        }
    }
}

/*
 * A packed B operand (K x N, element (l, j) at B[l * rs + j * cs]):
 * kc-blocks of K, each cut into nr-wide panels, zero-padded past N.
 * Block pc starts at data + pc_start * n_pad, panel jp of a block of depth
 * kc at + jp * kc * nr.
 */
typedef struct {
    REAL *data;
    size_t K, N, n_pad;
} T(packed_b);

static size_t T(packed_b_size)(size_t K, size_t N, size_t nr)
{
    return posenc_max(K, 1) * posenc_round_up(posenc_max(N, 1), nr);
}

static void T(pack_b)(T(packed_b) *pb, REAL *buffer, const REAL *B, ptrdiff_t rs, ptrdiff_t cs,
                      size_t K, size_t N, size_t nr, REAL alpha)
{
    pb->data = buffer;
    pb->K = K;
    pb->N = N;
    pb->n_pad = posenc_round_up(posenc_max(N, 1), nr);
    for (size_t pc = 0; pc < K; pc += T_KC) {
        const size_t kc = posenc_min(T_KC, K - pc);
        REAL *block = buffer + pc * pb->n_pad;
        for (size_t j0 = 0; j0 < N; j0 += nr) {
            REAL *panel = block + (j0 / nr) * kc * nr;
            const size_t cols = posenc_min(nr, N - j0);
            if (cols < nr)
                memset(panel, 0, sizeof(REAL) * kc * nr);
            if (cs == 1) {
                for (size_t l = 0; l < kc; ++l) {
                    const REAL *restrict src = B + (ptrdiff_t)(pc + l) * rs + (ptrdiff_t)j0;
                    for (size_t c = 0; c < cols; ++c)
                        panel[l * nr + c] = alpha * src[c];
                }
            } else {
                for (size_t c = 0; c < cols; ++c) {
                    const REAL *src = B + (ptrdiff_t)(j0 + c) * cs + (ptrdiff_t)pc * rs;
                    for (size_t l = 0; l < kc; ++l)
                        panel[l * nr + c] = alpha * src[(ptrdiff_t)l * rs];
                }
            }
        }
    }
}

/*
 * Workspace layout: a region of `count` elements of the thread's arena per
 * field, each starting 64 bytes aligned (16 elements), so that a region may
 * hold pointers too.  With w == NULL the layout only counts (`at`).
 */
#define T_WS_TAKE(w, mem, at, field, count)               \
    do {                                                  \
        if (w)                                            \
            (w)->field = (void *)((mem) + (at));          \
        (at) += posenc_round_up((count), 16);             \
    } while (0)

/* ---------------------------------------------------------------- gemm */

/* Per-thread scratch every gemm needs. */
typedef struct {
    REAL *apack;    /* mr x T_KC */
    REAL *tmp_c;    /* mr x nr */
    REAL *tmp_p;    /* mr x nr */
} T(gemm_scratch);

static size_t T(gemm_scratch_size)(const posenc_kernels *K)
{
    return K->mr * T_KC + 2 * K->mr * K->nr;
}

static void T(gemm_scratch_carve)(T(gemm_scratch) *s, REAL *mem, const posenc_kernels *K)
{
    s->apack = mem;
    s->tmp_c = mem + K->mr * T_KC;
    s->tmp_p = s->tmp_c + K->mr * K->nr;
}

/*
 * One A tile (rows <= mr; a[l * lda + r], or a[r * lda + l] with
 * POSENC_UKR_A_ROWS in flags) against every panel of a packed B block.
 * Full tiles go straight to the microkernel; edge tiles through a zeroed
 * temporary, so the microkernel never needs a mask.  q: the tile's row
 * pointers of the second additive source (POSENC_UKR_ADD_Q), or NULL.
 */
static void T(tile_row)(const posenc_kernels *K, const T(gemm_scratch) *s, size_t kc,
                        const REAL *apack, ptrdiff_t lda, const REAL *block, size_t panel_ld,
                        size_t N, size_t rows, REAL *C, ptrdiff_t ldc, const REAL *P, ptrdiff_t ldp,
                        const REAL *const *q, int flags)
{
    enum { MR_MAX = 32 };
    const size_t mr = K->mr, nr = K->nr;
    const void *q_cols[MR_MAX];
    for (size_t j0 = 0; j0 < N; j0 += nr) {
        const REAL *panel = block + (j0 / nr) * panel_ld;
        const size_t cols = posenc_min(nr, N - j0);
        if (rows == mr && cols == nr) {
            if (flags & POSENC_UKR_ADD_Q)
                for (size_t r = 0; r < rows; ++r)
                    q_cols[r] = q[r] + j0;
            K->ukr(kc, apack, lda, panel, C + j0, ldc, P ? P + j0 : NULL, ldp, q_cols, flags);
            continue;
        }
        /* the temporary is re-read, and the second source is folded into P's */
        int edge_flags = flags & ~(POSENC_UKR_STREAM | POSENC_UKR_ADD_Q);
        memset(s->tmp_c, 0, sizeof(REAL) * mr * nr);
        memset(s->tmp_p, 0, sizeof(REAL) * mr * nr);
        for (size_t r = 0; r < rows; ++r) {
            if (flags & POSENC_UKR_ACCUMULATE)
                memcpy(s->tmp_c + r * nr, C + (ptrdiff_t)r * ldc + (ptrdiff_t)j0, sizeof(REAL) * cols);
            if (P)
                memcpy(s->tmp_p + r * nr, P + (ptrdiff_t)r * ldp + (ptrdiff_t)j0, sizeof(REAL) * cols);
            if (flags & POSENC_UKR_ADD_Q)
                for (size_t t = 0; t < cols; ++t)
                    s->tmp_p[r * nr + t] += q[r][j0 + t];
        }
        if ((flags & POSENC_UKR_ADD_Q) && !P)
            edge_flags |= POSENC_UKR_ADD_P;
        K->ukr(kc, apack, lda, panel, s->tmp_c, (ptrdiff_t)nr, s->tmp_p, (ptrdiff_t)nr, NULL, edge_flags);
        for (size_t r = 0; r < rows; ++r)
            memcpy(C + (ptrdiff_t)r * ldc + (ptrdiff_t)j0, s->tmp_c + r * nr, sizeof(REAL) * cols);
    }
}

/*
 * C (M x N) = alpha * A.B [+ C if accumulate], then the epilogue with P
 * (row i of P at P + i * ldp; p_flags POSENC_UKR_ADD_P / MUL_P or 0) and q
 * (row i at q[i], with POSENC_UKR_ADD_Q).
 * A (M x K) element (i, l) at A[i * a_rs + l * a_cs]; B already packed.
 * kr (or NULL: all of K): per tile of mr rows, [kr[2t], kr[2t + 1]) the
 * part of K where the tile's A may be nonzero; the rest is skipped.
 * K = 0 gives alpha * 0 (the content term of d = 0).
 */
static void T(gemm_packed)(const posenc_kernels *K, const T(gemm_scratch) *s, size_t M,
                           const REAL *A, ptrdiff_t a_rs, ptrdiff_t a_cs, REAL alpha,
                           const T(packed_b) *pb, REAL *C, ptrdiff_t ldc, int accumulate,
                           const REAL *P, ptrdiff_t ldp, const REAL *const *q, int p_flags,
                           const size_t *kr)
{
    const size_t mr = K->mr, nr = K->nr, Kd = pb->K;
    for (size_t i0 = 0; i0 < M; i0 += mr) {
        const size_t rows = posenc_min(mr, M - i0);
        const REAL *a_tile = A + (ptrdiff_t)i0 * a_rs;
        REAL *c_tile = C + (ptrdiff_t)i0 * ldc;
        const REAL *p_tile = P ? P + (ptrdiff_t)i0 * ldp : NULL;
        size_t k_end = kr ? kr[2 * (i0 / mr) + 1] : Kd;
        size_t pc = kr ? kr[2 * (i0 / mr)] : 0;
        if (pc >= k_end) {
            if (accumulate && !p_flags && !q)
                continue;   /* nothing to add */
            pc = k_end = 0; /* kc = 0: the epilogue alone */
        }
        int first = 1;
        do {
            /* the packed block holding pc, and the part of it up to k_end */
            const size_t blk = pc / T_KC * T_KC, blk_kc = posenc_min(T_KC, Kd - blk);
            const size_t kc = posenc_min(blk + blk_kc, k_end) - pc;
            const int last = pc + kc >= k_end;
            int flags = (!first || accumulate) ? POSENC_UKR_ACCUMULATE : 0;
            if (last)
                flags |= p_flags;   /* incl. POSENC_UKR_STREAM: only the final store streams */
            /* A full tile with a unit stride is read in place (BLIS packs it
             * for locality; here the panel of a tile is re-read from L1 by
             * only N / nr microkernels, fewer than the copy would cost). */
            const REAL *a_blk = a_tile + (ptrdiff_t)pc * a_cs;
            const REAL *a_ukr = s->apack;
            ptrdiff_t lda = (ptrdiff_t)mr;
            if (rows == mr && alpha == (REAL)1 && (a_cs == 1 || a_rs == 1)) {
                a_ukr = a_blk;
                lda = a_cs == 1 ? a_rs : a_cs;
                if (a_cs == 1)
                    flags |= POSENC_UKR_A_ROWS;
            } else {
                T(pack_a)(s->apack, a_blk, a_rs, a_cs, rows, kc, mr, alpha);
            }
            T(tile_row)(K, s, kc, a_ukr, lda, pb->data + blk * pb->n_pad + (pc - blk) * nr,
                        blk_kc * nr, pb->N, rows, c_tile, ldc, last ? p_tile : NULL, ldp,
                        q ? q + i0 : NULL, last ? flags : flags & ~POSENC_UKR_ADD_Q);
            pc += kc;
            first = 0;
        } while (pc < k_end);
    }
}

/* gemm_packed after packing B (K x N) into `bbuf` with scale beta; kr as there. */
static void T(gemm)(const posenc_kernels *K, const T(gemm_scratch) *s, REAL *bbuf, size_t M,
                    size_t N, size_t Kd, const REAL *A, ptrdiff_t a_rs, ptrdiff_t a_cs,
                    const REAL *B, ptrdiff_t b_rs, ptrdiff_t b_cs, REAL beta, REAL *C,
                    ptrdiff_t ldc, int accumulate, const size_t *kr)
{
    if (M == 0 || N == 0)
        return;
    T(packed_b) pb;
    T(pack_b)(&pb, bbuf, B, b_rs, b_cs, Kd, N, K->nr, beta);
    T(gemm_packed)(K, s, M, A, a_rs, a_cs, (REAL)1, &pb, C, ldc, accumulate, NULL, 0, NULL, 0, kr);
}

/* -------------------------------------------------- positional row builders */

/*
 * Each builder applies one term to the rows [i0, i0 + rows) of a row block
 * P (row r at P + r * ldp, columns j in [0, m)) with `op`: SET for the
 * first term, then ADD (sum) or MUL (product).
 */

/* table[h, map(j - i)] from its Toeplitz values tv[o + n - 1]. */
static void T(rows_table)(const posenc_kernels *K, int op, REAL *P, size_t ldp, const REAL *tv,
                          size_t n, size_t m, size_t i0, size_t rows)
{
    for (size_t r = 0; r < rows; ++r)
        K->row_gather(op, P + r * ldp, tv + (n - 1 - (i0 + r)), 1, m);
}

/* q-side vector table: qa[r * ldqa + (bucket - b_min)] = vec_scale q_i . vq[bucket]. */
static void T(rows_vq)(const posenc_kernels *K, int op, REAL *P, size_t ldp, const posenc_runs *runs,
                       const REAL *qa, size_t ldqa, size_t m, size_t i0, size_t rows)
{
    for (size_t r = 0; r < rows; ++r) {
        const ptrdiff_t i = (ptrdiff_t)(i0 + r);
        ptrdiff_t js, je, bs;
        for (size_t t = posenc_runs_seek(runs, -i);
             t < runs->count && posenc_run_span(&runs->runs[t], i, 0, (ptrdiff_t)m, &js, &je, &bs); ++t)
            K->row_gather(op, P + r * ldp + js, qa + r * ldqa + (bs - runs->b_min),
                          runs->runs[t].step, (size_t)(je - js));
    }
}

/*
 * k-side vector table: ka[j * ldka + (bucket - b_min)] = vec_scale k_j . vk[bucket],
 * rows [i0, i0 + rows) of P: the ISA's key-blocked tile gather (along a
 * row the needed entries form a diagonal of ka).  map[o + n - 1] is the
 * bucket of offset o.
 */
static void T(rows_vk)(const posenc_kernels *K, int op, REAL *P, size_t ldp, const int64_t *map,
                       ptrdiff_t b_min, const REAL *ka, size_t ldka, size_t n, size_t m, size_t i0,
                       size_t rows)
{
    K->tile_gather_key(op, P, ldp, map + (n - 1 - i0), b_min, ka, ldka, m, rows);
}

/*
 * The key-side projections of unit (b, h): ka = k . (vec_scale vk[h])^T over
 * the buckets the map uses, m x rk, the table packed into vk_pack.
 */
static void T(unit_ka)(const posenc_kernels *K, const T(gemm_scratch) *g, const posenc_problem *p,
                       ptrdiff_t b_min, size_t rk, REAL *vk_pack, REAL *ka, size_t h, const REAL *k_u)
{
    const size_t d = p->d, hv = p->vk_heads == 1 ? 0 : h;
    const REAL *vk = (const REAL *)p->vk_table + (hv * p->vk_rows + (size_t)b_min) * d;
    T(packed_b) pb;
    T(pack_b)(&pb, vk_pack, vk, 1, (ptrdiff_t)d, d, rk, K->nr, (REAL)p->vec_scale);
    T(gemm_packed)(K, g, p->m, k_u, (ptrdiff_t)d, 1, (REAL)1, &pb, ka, (ptrdiff_t)rk, 0, NULL, 0,
                   NULL, 0, NULL);
}

/*
 * The query-side term of a row tile: qa = q[rows] . (vec_scale vq[h])^T over
 * the buckets the map uses (the table packed once per head, cached in
 * *vq_head), then gathered into P with op.
 */
static void T(tile_vq)(const posenc_kernels *K, const T(gemm_scratch) *g, const posenc_problem *p,
                       const posenc_runs *runs, size_t rq, REAL *vq_pack, ptrdiff_t *vq_head,
                       REAL *qa, size_t h, const REAL *q_u, int op, REAL *P, size_t ldp, size_t i0,
                       size_t rows)
{
    const size_t d = p->d, rq_pad = posenc_round_up(rq, K->nr);
    const size_t hv = p->vq_heads == 1 ? 0 : h;
    T(packed_b) pb = {vq_pack, d, rq, rq_pad};
    if (*vq_head != (ptrdiff_t)hv) {
        const REAL *vq = (const REAL *)p->vq_table + (hv * p->vq_rows + (size_t)runs->b_min) * d;
        T(pack_b)(&pb, vq_pack, vq, 1, (ptrdiff_t)d, d, rq, K->nr, (REAL)p->vec_scale);
        *vq_head = (ptrdiff_t)hv;
    }
    T(gemm_packed)(K, g, rows, q_u + i0 * d, (ptrdiff_t)d, 1, (REAL)1, &pb, qa, (ptrdiff_t)rq_pad,
                   0, NULL, 0, NULL, 0, NULL);
    if (posenc_runs_short(runs, p->n + p->m - 1))
        K->tile_gather_query(op, P, ldp, p->vq_map + (p->n - 1 - i0), runs->b_min, qa, rq_pad, p->m,
                             rows);
    else
        T(rows_vq)(K, op, P, ldp, runs, qa, rq_pad, p->m, i0, rows);
}

/* seg_table[h, seg_q[b, i], seg_k[b, j]]: one broadcast per key segment run. */
static void T(rows_segment)(const posenc_kernels *K, int op, REAL *P, size_t ldp,
                            const posenc_seg_run *runs, size_t n_runs, const int64_t *seg_q_b,
                            const REAL *seg_table_h, size_t S, size_t i0, size_t rows)
{
    for (size_t r = 0; r < rows; ++r) {
        const REAL *table_row = seg_table_h + (size_t)seg_q_b[i0 + r] * S;
        for (size_t t = 0; t < n_runs; ++t)
            K->row_gather(op, P + r * ldp + runs[t].j_begin, table_row + runs[t].segment, 0,
                          runs[t].j_end - runs[t].j_begin);
    }
}

/* TUPE eq. (9): theta[0] on row 0, theta[1] on column 0 of the other rows. */
static void T(rows_reset)(const posenc_kernels *K, REAL *P, size_t ldp, const REAL *theta_h,
                          size_t m, size_t i0, size_t rows)
{
    if (m == 0)
        return;
    for (size_t r = 0; r < rows; ++r) {
        if (i0 + r == 0)
            K->row_gather(POSENC_SET, P, theta_h, 0, m);
        else
            P[r * ldp] = theta_h[1];
    }
}

/* The head of a parameter whose head axis has `heads` entries (H or 1). */
static inline size_t T(head_of)(size_t heads, size_t h) { return heads == 1 ? 0 : h; }
