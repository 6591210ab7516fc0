/*
 * gemm_impl.h -- packing and GEMM over the ISA's microkernel, for one dtype
 * (REAL, set by engine_<dtype>.c).  BLIS-style: B packed into kc x nr
 * panels (kc, mr, nr from the kernel table), A read in place where it can
 * be, a per-tile epilogue that adds or multiplies a positional row block;
 * the microkernel stores the tails itself.
 */

/* dst[l * mr + r] = A[r * rs + l * cs], zero for rows >= rows. */
static void pack_a(REAL *restrict dst, const REAL *A, ptrdiff_t rs, ptrdiff_t cs, size_t rows,
                   size_t kc, size_t mr)
{
    if (rows < mr)
        memset(dst, 0, sizeof(REAL) * mr * kc);
    for (size_t l = 0; l < kc; ++l) {
        const REAL *src = A + (ptrdiff_t)l * cs;
        for (size_t r = 0; r < rows; ++r)
            dst[l * mr + r] = src[(ptrdiff_t)r * rs];
    }
}

/*
 * A packed B operand (K x N, element (l, j) at B[l * rs + j * cs], rs or
 * cs 1: rows of B or of its transpose, k^T, v^T, the tables^T):
 * kc-blocks of K, each cut into nr-wide panels, zero-padded past N, for the
 * microkernel ukr of that width: the main one, or the narrow one when N
 * pads to less with it.  Block pc starts at data + pc * n_pad, panel jp of
 * a block of depth kc at + jp * kc * nr.
 */
typedef struct {
    REAL *data;
    size_t K, N, n_pad, nr;
    posenc_ukr ukr;
} packed_b;

/* Elements of a packed K x N operand, at most (either microkernel). */
static size_t packed_b_size(size_t K, size_t N, size_t nr)
{
    return posenc_max(K, 1) * posenc_round_up(posenc_max(N, 1), nr);
}

/* The shape of a packed K x N operand in `buffer` (packed or to be packed). */
static packed_b packed_b_shape(const posenc_kernels *kern, REAL *buffer, size_t K, size_t N)
{
    const size_t n1 = posenc_max(N, 1);
    const int narrow = posenc_round_up(n1, kern->nr_narrow) < posenc_round_up(n1, kern->nr);
    packed_b pb = {buffer, K, N, 0, narrow ? kern->nr_narrow : kern->nr,
                   narrow ? kern->ukr_narrow : kern->ukr};
    pb.n_pad = posenc_round_up(n1, pb.nr);
    return pb;
}

static void pack_b(const posenc_kernels *kern, packed_b *pb, REAL *buffer, const REAL *B,
                   ptrdiff_t rs, ptrdiff_t cs, size_t K, size_t N, REAL alpha)
{
    *pb = packed_b_shape(kern, buffer, K, N);
    const size_t nr = pb->nr, kc_max = kern->kc;
    for (size_t pc = 0; pc < K; pc += kc_max) {
        const size_t kc = posenc_min(kc_max, K - pc);
        REAL *block = buffer + pc * pb->n_pad;
        for (size_t j0 = 0; j0 < N; j0 += nr) {
            REAL *panel = block + (j0 / nr) * kc * nr;
            const size_t cols = posenc_min(nr, N - j0);
            if (cs == 1)
                kern->pack_rows(panel, nr, B + (ptrdiff_t)pc * rs + (ptrdiff_t)j0, rs, kc, cols,
                                (double)alpha);
            else   /* rs == 1 */
                kern->pack_cols(panel, nr, B + (ptrdiff_t)j0 * cs + (ptrdiff_t)pc, cs, kc, cols,
                                (double)alpha);
        }
    }
}

/*
 * Workspace layout: a region of `count` elements of the thread's arena per
 * field, each starting 64 bytes aligned (16 elements), so that a region may
 * hold pointers too.  With w == NULL the layout only counts (`at`).
 */
#define WS_TAKE(w, mem, at, field, count)                 \
    do {                                                  \
        if (w)                                            \
            (w)->field = (void *)((mem) + (at));          \
        (at) += posenc_round_up((count), 16);             \
    } while (0)

/* Per-thread scratch every gemm needs: a packed A panel. */
typedef struct {
    REAL *a_pack;   /* mr x kc */
} gemm_scratch;

static size_t gemm_scratch_size(const posenc_kernels *kern)
{
    return kern->mr * kern->kc;
}

static void gemm_scratch_carve(gemm_scratch *s, REAL *mem, const posenc_kernels *kern)
{
    s->a_pack = mem;
}

/*
 * One A tile (rows <= mr; a[l * lda + r], or a[r * lda + l] with
 * POSENC_UKR_A_ROWS in flags) against every panel of a packed B block; the
 * microkernel stores only the tile's rows x cols.  add_rows: the tile's
 * row pointers of the second additive source (POSENC_UKR_ADD_ROWS), or NULL.
 */
static void gemm_tile_row(const packed_b *pb, size_t kc, const REAL *a, ptrdiff_t lda,
                          const REAL *block, size_t panel_ld, size_t rows, REAL *C, ptrdiff_t ldc,
                          const REAL *P, ptrdiff_t ldp, const REAL *const *add_rows, int flags)
{
    enum { MR_MAX = 32 };
    const size_t nr = pb->nr, N = pb->N;
    const void *row_cols[MR_MAX];
    for (size_t j0 = 0; j0 < N; j0 += nr) {
        if (flags & POSENC_UKR_ADD_ROWS)
            for (size_t r = 0; r < rows; ++r)
                row_cols[r] = add_rows[r] + j0;
        pb->ukr(kc, a, lda, block + (j0 / nr) * panel_ld, C + j0, ldc, rows,
                posenc_min(nr, N - j0), P ? P + j0 : NULL, ldp, row_cols, flags);
    }
}

/*
 * C (M x N) = A.B [+ C if accumulate], then the epilogue with P (row i of
 * P at P + i * ldp; p_flags POSENC_UKR_ADD_P / MUL_P or 0) and add_rows
 * (row i at add_rows[i], with POSENC_UKR_ADD_ROWS).  A (M x K) element
 * (i, l) at A[i * a_rs + l * a_cs]; B already packed (with its scale).
 * k_range (or NULL: all of K): per tile of mr rows, [k_range[2t],
 * k_range[2t + 1]) the part of K where the tile's A may be nonzero; the
 * rest is skipped.  K = 0 gives 0 (the content term of d = 0).
 */
static void gemm_packed(const posenc_kernels *kern, const gemm_scratch *s, size_t M,
                        const REAL *A, ptrdiff_t a_rs, ptrdiff_t a_cs, const packed_b *pb,
                        REAL *C, ptrdiff_t ldc, int accumulate, const REAL *P, ptrdiff_t ldp,
                        const REAL *const *add_rows, int p_flags, const size_t *k_range)
{
    const size_t mr = kern->mr, kc_max = kern->kc, Kd = pb->K;
    for (size_t i0 = 0; i0 < M; i0 += mr) {
        const size_t rows = posenc_min(mr, M - i0);
        const REAL *a_tile = A + (ptrdiff_t)i0 * a_rs;
        REAL *c_tile = C + (ptrdiff_t)i0 * ldc;
        const REAL *p_tile = P ? P + (ptrdiff_t)i0 * ldp : NULL;
        size_t k_end = k_range ? k_range[2 * (i0 / mr) + 1] : Kd;
        size_t pc = k_range ? k_range[2 * (i0 / mr)] : 0;
        if (pc >= k_end) {
            if (accumulate && !p_flags && !add_rows)
                continue;   /* nothing to add */
            pc = k_end = 0; /* kc = 0: the epilogue alone */
        }
        int first = 1;
        do {
            /* the packed block holding pc, and the part of it up to k_end */
            const size_t blk = pc / kc_max * kc_max, blk_kc = posenc_min(kc_max, Kd - blk);
            const size_t kc = posenc_min(blk + blk_kc, k_end) - pc;
            const int last = pc + kc >= k_end;
            int flags = (!first || accumulate) ? POSENC_UKR_ACCUMULATE : 0;
            if (last)
                flags |= p_flags;   /* incl. POSENC_UKR_STREAM: only the final store streams */
            /* A with a unit stride is read in place (BLIS packs it for
             * locality; here the panel of a tile is re-read from L1 by only
             * N / nr microkernels, fewer than the copy would cost): rows of
             * any tile, columns of a full one (a partial one would read
             * past A's end). */
            const REAL *a_blk = a_tile + (ptrdiff_t)pc * a_cs;
            const REAL *a_ukr = a_blk;
            ptrdiff_t lda = a_cs == 1 ? a_rs : a_cs;
            if (a_cs == 1) {
                flags |= POSENC_UKR_A_ROWS;
            } else if (a_rs != 1 || rows < mr) {
                pack_a(s->a_pack, a_blk, a_rs, a_cs, rows, kc, mr);
                a_ukr = s->a_pack;
                lda = (ptrdiff_t)mr;
            }
            gemm_tile_row(pb, kc, a_ukr, lda, pb->data + blk * pb->n_pad + (pc - blk) * pb->nr,
                          blk_kc * pb->nr, rows, c_tile, ldc, last ? p_tile : NULL, ldp,
                          add_rows ? add_rows + i0 : NULL,
                          last ? flags : flags & ~POSENC_UKR_ADD_ROWS);
            pc += kc;
            first = 0;
        } while (pc < k_end);
    }
}

/* gemm_packed after packing B (K x N) into `b_pack` with scale beta; k_range as there. */
static void gemm(const posenc_kernels *kern, const gemm_scratch *s, REAL *b_pack, size_t M,
                 size_t N, size_t Kd, const REAL *A, ptrdiff_t a_rs, ptrdiff_t a_cs,
                 const REAL *B, ptrdiff_t b_rs, ptrdiff_t b_cs, REAL beta, REAL *C,
                 ptrdiff_t ldc, int accumulate, const size_t *k_range)
{
    if (M == 0 || N == 0)
        return;
    packed_b pb;
    pack_b(kern, &pb, b_pack, B, b_rs, b_cs, Kd, N, beta);
    gemm_packed(kern, s, M, A, a_rs, a_cs, &pb, C, ldc, accumulate, NULL, 0, NULL, 0, k_range);
}
