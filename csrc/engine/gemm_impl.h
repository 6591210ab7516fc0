/*
 * gemm_impl.h -- packing and GEMM over the ISA's microkernel, for one dtype
 * (REAL, set by engine_<dtype>.c).  BLIS-style: B packed into kc x nr
 * panels (kc, mr, nr from the kernel table), A read in place where it can
 * be, a per-tile epilogue that adds or multiplies a positional row block;
 * the microkernel stores the tails itself.
 */
#ifndef POSENC_ENGINE_GEMM_IMPL_H
#define POSENC_ENGINE_GEMM_IMPL_H

#include "engine.h"

#include <math.h>
#include <string.h>

#ifdef ENGINE_BF16_GEMM
#include "../isa/convert_scalar.h"   /* posenc_bf16_from_f32_bits */

/* The tiles of an A read by columns that one pair panel of the bfloat16
 * GEMM holds: packed together, their source rows are read along their
 * length (a panel per tile reads mr elements of each row, rows often 2^k
 * bytes apart: conflict misses in L1).  gemm_scratch's a_pack holds them. */
#define BF16_GROUP 8
#endif

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

/* Per-thread scratch every gemm needs: a packed A panel; the problem's
 * bfloat16 twins of its float32 arrays (the bfloat16 GEMM's operands). */
/*
 * Where a ranged block's rows of G may be nonzero (a fused attention's
 * causality, window or documents), as gemm_packed's k_range (NULL:
 * everywhere in [0, cols)): per tile of mr rows of the block, the keys it
 * sees (row_keys); per tile of mr keys, the block's rows that see it
 * (key_rows, rows counted from the block's first); every row is 0 before
 * key `first` (a multiple of mr: the GEMMs start there) and from `cols` on.
 */
typedef struct {
    const size_t *row_keys, *key_rows;
    size_t first, cols;
} block_limits;

typedef struct {
    REAL *a_pack;   /* mr x kc (the bfloat16 GEMM: gemm_scratch_size) */
    const posenc_bf16_shadow *shadows;
    size_t shadow_count;
    posenc_bf16_shadow local;   /* a twin of the thread's own (src NULL: none), gemm_shadow's first */
} gemm_scratch;

static size_t gemm_scratch_size(const posenc_kernels *kern)
{
#ifdef ENGINE_BF16_GEMM
    if (kern->bf16)   /* BF16_GROUP tiles' pair panels, and pack_pairs' slack */
        return posenc_max(kern->mr * kern->kc, BF16_GROUP * kern->mr * ((kern->kc + 1) / 2) + 16);
#endif
    return kern->mr * kern->kc;
}

static void gemm_scratch_carve(gemm_scratch *s, REAL *mem, const posenc_kernels *kern,
                               const posenc_problem *p)
{
    s->a_pack = mem;
    s->shadows = kern->bf16 && p ? p->bf16_shadows : NULL;   /* p NULL: no twins (posenc_matmul) */
    s->shadow_count = kern->bf16 && p ? p->bf16_shadow_count : 0;
    s->local = (posenc_bf16_shadow){NULL, NULL, 0, 0, 0, 0, 0};
}

#ifdef ENGINE_BF16_GEMM
/* The bfloat16 twin of x[0 .. extent) (posenc_bf16_shadow), when one unit of
 * a shadowed array holds it; NULL otherwise.  *unwritten (unless NULL): x
 * holds no values, only the twin does. */
static const uint16_t *gemm_twin(const gemm_scratch *s, const REAL *x, size_t extent,
                                 int *unwritten)
{
    for (size_t t = 0; s && t <= s->shadow_count; ++t) {
        const posenc_bf16_shadow *sh = t == 0 ? &s->local : &s->shadows[t - 1];
        if (!sh->src)
            continue;
        if (x < sh->base || x >= sh->base + sh->units * sh->per_unit)
            continue;
        const size_t at = (size_t)(x - sh->base), u = at / sh->per_unit, in = at % sh->per_unit;
        if (in + extent > sh->per_unit)
            return NULL;
        if (unwritten)
            *unwritten = sh->unwritten;
        return sh->src + ((u / sh->units_per_row) * sh->src_units_per_row + u % sh->units_per_row) *
                             sh->per_unit + in;
    }
    return NULL;
}

static const uint16_t *gemm_shadow(const gemm_scratch *s, const REAL *x, size_t extent)
{
    return gemm_twin(s, x, extent, NULL);
}

/* The twin of x[0 .. extent) where x holds no values (engine_lp.c left it
 * unwritten: what reads it widens the twin), else NULL. */
static const uint16_t *gemm_unwritten_twin(const gemm_scratch *s, const REAL *x, size_t extent)
{
    int unwritten = 0;
    const uint16_t *twin = gemm_twin(s, x, extent, &unwritten);
    return unwritten ? twin : NULL;
}

/* x16 made the bfloat16 twin of the thread's own x[0 .. count) (gemm_twin's
 * first look), until s->local.src is cleared. */
static void gemm_twin_set(gemm_scratch *s, const REAL *x, const uint16_t *x16, size_t count)
{
    s->local = (posenc_bf16_shadow){x, x16, 1, count, 1, 1, 0};
}

/* The float value of a bfloat16 twin's element (exact). */
static float bf16_value(uint16_t h)
{
    const uint32_t bits = posenc_f32_bits_from_bf16(h);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Elements from the first to one past the last of a K x N operand with strides rs, cs. */
static size_t gemm_extent(size_t K, size_t N, ptrdiff_t rs, ptrdiff_t cs)
{
    return K && N ? (size_t)((ptrdiff_t)(K - 1) * rs + (ptrdiff_t)(N - 1) * cs) + 1 : 0;
}
#endif

/* Asks for x[0 .. count) ahead of a GEMM that reads it in place (posenc_prefetch): its bfloat16
 * twin instead where it has one, which is what the bfloat16 GEMM reads. */
static void gemm_prefetch(const gemm_scratch *s, const REAL *x, size_t count)
{
#ifdef ENGINE_BF16_GEMM
    const uint16_t *twin = gemm_shadow(s, x, count);
    if (twin) {
        posenc_prefetch(twin, count * sizeof(uint16_t));
        return;
    }
#else
    (void)s;
#endif
    posenc_prefetch(x, count * sizeof(REAL));
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
    /* the bfloat16 GEMM (kern->bf16, float32 only): data holds its pair
     * panels (bfloat16: block pc at + pc * n_pad, panel jp of a block of
     * depth kc at + jp * posenc_round_up(kc, 2) * nr), B unscaled and `scale`
     * applied to each tile's sums; NULL: REAL panels with the scale in them */
    const posenc_bf16_kernels *bf16;
    REAL scale;
} packed_b;

/* Elements of a packed K x N operand, at most (either microkernel). */
static size_t packed_b_size(size_t K, size_t N, size_t nr)
{
    return posenc_max(K, 1) * posenc_round_up(posenc_max(N, 1), nr);
}

/* The shape of a packed K x N operand in `buffer` (packed or to be packed
 * with scale alpha). */
static packed_b packed_b_shape(const posenc_kernels *kern, REAL *buffer, size_t K, size_t N,
                               REAL alpha)
{
    const size_t n1 = posenc_max(N, 1);
    const int narrow = !kern->bf16 &&
                       posenc_round_up(n1, kern->nr_narrow) < posenc_round_up(n1, kern->nr);
    packed_b pb = {buffer, K, N, 0, narrow ? kern->nr_narrow : kern->nr,
                   narrow ? kern->ukr_narrow : kern->ukr, kern->bf16, alpha};
    pb.n_pad = posenc_round_up(n1, pb.nr);
    return pb;
}

/* The columns from `first` (a multiple of nr) of a packed operand of one block (K <= kc). */
static void packed_b_skip(packed_b *pb, size_t first)
{
#ifdef ENGINE_BF16_GEMM
    if (pb->bf16) {
        uint16_t *data = (uint16_t *)(void *)pb->data + first * posenc_round_up(pb->K, 2);
        pb->data = (REAL *)(void *)data;
        pb->N -= first;
        return;
    }
#endif
    pb->data += first * pb->K;
    pb->N -= first;
}

/* Rows [l0, l1) of K of a packed REAL operand set to 0 in every panel: keys that its
 * GEMM must not read (a masked key's NaN times its zero weight would be NaN). */
static void packed_b_zero_rows(const packed_b *pb, size_t kc_max, size_t l0, size_t l1)
{
    const size_t nr = pb->nr;
    for (size_t pc = l0 / kc_max * kc_max; pc < l1; pc += kc_max) {
        const size_t kc = posenc_min(kc_max, pb->K - pc);
        const size_t lo = posenc_max(pc, l0), hi = posenc_min(pc + kc, l1);
        REAL *block = pb->data + pc * pb->n_pad + (lo - pc) * nr;
        for (size_t j = 0; j < pb->N; j += nr)
            memset(block + (j / nr) * kc * nr, 0, sizeof(REAL) * (hi - lo) * nr);
    }
}

#ifdef ENGINE_BF16_GEMM
/* pack_b for the bfloat16 GEMM (rs or cs 1, as there): B's rows or columns
 * rounded into pair panels, or taken from its bfloat16 twin (gemm_shadow). */
static void pack_b_bf16(const posenc_kernels *kern, const gemm_scratch *s, const packed_b *pb,
                        const REAL *B, ptrdiff_t rs, ptrdiff_t cs)
{
    const posenc_bf16_kernels *bk = pb->bf16;
    const size_t nr = pb->nr, K = pb->K, N = pb->N;
    const uint16_t *twin = gemm_shadow(s, B, gemm_extent(K, N, rs, cs));
    for (size_t pc = 0; pc < K; pc += kern->kc) {
        const size_t kc = posenc_min(kern->kc, K - pc);
        uint16_t *block = (uint16_t *)(void *)pb->data + pc * pb->n_pad;
        for (size_t j0 = 0; j0 < N; j0 += nr) {
            uint16_t *panel = block + (j0 / nr) * posenc_round_up(kc, 2) * nr;
            const size_t cols = posenc_min(nr, N - j0);
            const ptrdiff_t offset = (ptrdiff_t)pc * rs + (ptrdiff_t)j0 * cs;
            const REAL *at = B + offset;
            const size_t range[2] = {0, kc};
            if (cs == 1 && twin)
                bk->pack_pairs16(panel, nr, twin + offset, rs, range, nr, cols);
            else if (cs == 1)
                bk->pack_pairs(panel, nr, at, rs, range, nr, cols);
            else if (twin)   /* rs == 1 */
                bk->pack(panel, twin + offset, cs, kc, cols);
            else
                bk->pack_f32(panel, at, cs, kc, cols);
        }
    }
}
#endif

/* Rows [l0, l1) of K and the panels of columns [j0, j1) of N (j0 a multiple
 * of nr) of a packed REAL operand pb (pack_b's layout and scale): the rest
 * of it untouched, so that a caller can pack an operand in parts, as its
 * tiles come to need them. */
static void pack_b_part(const posenc_kernels *kern, const packed_b *pb, const REAL *B,
                        ptrdiff_t rs, ptrdiff_t cs, size_t l0, size_t l1, size_t j0, size_t j1)
{
    const size_t nr = pb->nr, kc_max = kern->kc;
    for (size_t pc = l0 / kc_max * kc_max; pc < l1; pc += kc_max) {
        const size_t kc = posenc_min(kc_max, pb->K - pc);
        const size_t lo = posenc_max(pc, l0), hi = posenc_min(pc + kc, l1);
        REAL *block = pb->data + pc * pb->n_pad + (lo - pc) * nr;
        for (size_t j = j0; j < j1; j += nr) {
            REAL *panel = block + (j / nr) * kc * nr;
            const size_t cols = posenc_min(nr, pb->N - j);
            if (cs == 1)
                kern->pack_rows(panel, nr, B + (ptrdiff_t)lo * rs + (ptrdiff_t)j, rs, hi - lo, cols,
                                (double)pb->scale);
            else   /* rs == 1 */
                kern->pack_cols(panel, nr, B + (ptrdiff_t)j * cs + (ptrdiff_t)lo, cs, hi - lo, cols,
                                (double)pb->scale);
        }
    }
}

/* B (element (l, j) at B[l * rs + j * cs]) packed with scale alpha into
 * `buffer` (s: the thread's scratch, for the bfloat16 GEMM's twins). */
static void pack_b(const posenc_kernels *kern, const gemm_scratch *s, packed_b *pb, REAL *buffer,
                   const REAL *B, ptrdiff_t rs, ptrdiff_t cs, size_t K, size_t N, REAL alpha)
{
    *pb = packed_b_shape(kern, buffer, K, N, alpha);
#ifdef ENGINE_BF16_GEMM
    if (pb->bf16) {
        pack_b_bf16(kern, s, pb, B, rs, cs);
        return;
    }
#else
    (void)s;
#endif
    pack_b_part(kern, pb, B, rs, cs, 0, K, 0, N);
}

/* C + offset elements: REAL ones, or bfloat16 ones with POSENC_UKR_BF16_OUT in flags. */
static REAL *gemm_c_at(REAL *C, ptrdiff_t offset, int flags)
{
    return flags & POSENC_UKR_BF16_OUT ? (REAL *)(void *)((uint16_t *)(void *)C + offset)
                                       : C + offset;
}

/*
 * One A tile (rows <= mr; a[l * lda + r], or a[r * lda + l] with
 * POSENC_UKR_A_ROWS in flags) against every panel of a packed B block; the
 * microkernel stores only the tile's rows x cols.  add_rows: the tile's
 * row pointers of the second additive source (POSENC_UKR_ADD_ROWS), or NULL.
 */
static void gemm_tile_row(const packed_b *pb, size_t kc, const void *a, ptrdiff_t lda,
                          const void *block, size_t panel_ld, size_t rows, REAL *C, ptrdiff_t ldc,
                          const REAL *P, ptrdiff_t ldp, const REAL *const *add_rows, int flags)
{
    enum { MR_MAX = 32 };
    const size_t nr = pb->nr, N = pb->N;
    const void *row_cols[MR_MAX];
    for (size_t j0 = 0; j0 < N; j0 += nr) {
        if (flags & POSENC_UKR_ADD_ROWS)
            for (size_t r = 0; r < rows; ++r)
                row_cols[r] = add_rows[r] + j0;
        const size_t cols = posenc_min(nr, N - j0);
#ifdef ENGINE_BF16_GEMM
        if (pb->bf16) {   /* block and a hold bfloat16; panel_ld counts them; C may too */
            pb->bf16->ukr_f32(kc, (const uint16_t *)a, lda,
                              (const uint16_t *)block + (j0 / nr) * panel_ld,
                              gemm_c_at(C, (ptrdiff_t)j0, flags), ldc, rows, cols, pb->scale,
                              P ? P + j0 : NULL, ldp, row_cols, flags);
            continue;
        }
#endif
        pb->ukr(kc, a, lda, (const REAL *)block + (j0 / nr) * panel_ld, C + j0, ldc, rows, cols,
                P ? P + j0 : NULL, ldp, row_cols, flags);
    }
}

#ifdef ENGINE_BF16_GEMM
/* The tiles [first, end) of a gemm_packed call that a_pack holds, width words a pair row. */
typedef struct {
    size_t first, end, width;
} bf16_group;

/*
 * The A block of tile i0 (rows <= mr) for the bfloat16 GEMM: rows x
 * [pc, k_end) of A (element (i, l) at A[i * a_rs + l * a_cs], M x Kd) as
 * bfloat16 from the even element lo = pc & ~1 (B's pairs start at even
 * ones: kc is even), zeros outside [pc, k_end): rows (A with a unit column
 * stride: the microkernel's POSENC_UKR_A_ROWS) or a pair panel; *a_out and
 * *lda where the microkernel reads it.  A read by columns in one depth
 * block (Kd <= kc) is packed BF16_GROUP tiles at a time (`group`, each tile
 * its k_range), other A tile by tile; from A's bfloat16 twin where it has
 * one (gemm_shadow, or NULL).  Returns the flags with POSENC_UKR_A_ROWS set
 * or cleared.
 */
static int gemm_a_bf16(const posenc_kernels *kern, const gemm_scratch *s, bf16_group *group,
                       const REAL *A, const uint16_t *twin, ptrdiff_t a_rs, ptrdiff_t a_cs,
                       size_t M, size_t Kd, const size_t *k_range, size_t i0, size_t rows,
                       size_t pc, size_t k_end, const uint16_t **a_out, ptrdiff_t *lda, int flags)
{
    const size_t mr = kern->mr, lo = pc & ~(size_t)1, kc2 = posenc_round_up(k_end - lo, 2);
    uint16_t *dst = (uint16_t *)(void *)s->a_pack;
    *a_out = dst;
    if (a_cs == 1 && twin && lo == pc) {   /* A's bfloat16 rows, read in place */
        *a_out = twin + (ptrdiff_t)i0 * a_rs + (ptrdiff_t)pc;
        *lda = a_rs;
        return flags | POSENC_UKR_A_ROWS;
    }
    if (a_cs == 1) {
        for (size_t r = 0; r < rows && kc2 > 0; ++r) {
            uint16_t *row = dst + r * kc2;
            row[0] = row[kc2 - 1] = 0;   /* the pads, when there are */
            kern->bf16->round_row(row + (pc - lo), A + (ptrdiff_t)(i0 + r) * a_rs + (ptrdiff_t)pc,
                                  k_end - pc);
        }
        *lda = (ptrdiff_t)kc2;
        return flags | POSENC_UKR_A_ROWS;
    }
    *lda = (ptrdiff_t)mr;
    if (a_rs == 1 && Kd <= kern->kc) {
        const size_t tile = i0 / mr;
        if (tile < group->first || tile >= group->end) {
            const size_t tiles = posenc_min(BF16_GROUP, (M - i0 + mr - 1) / mr);
            size_t ranges[2 * BF16_GROUP];
            for (size_t t = 0; t < tiles; ++t) {
                ranges[2 * t] = k_range ? k_range[2 * (tile + t)] : 0;
                ranges[2 * t + 1] = k_range ? k_range[2 * (tile + t) + 1] : Kd;
            }
            *group = (bf16_group){tile, tile + tiles, tiles * mr};
            if (twin)
                kern->bf16->pack_pairs16(dst, group->width, twin + i0, a_cs, ranges, mr,
                                         posenc_min(group->width, M - i0));
            else
                kern->bf16->pack_pairs(dst, group->width, A + i0, a_cs, ranges, mr,
                                       posenc_min(group->width, M - i0));
        }
        *a_out = dst + 2 * ((lo / 2) * group->width + (tile - group->first) * mr);
        *lda = (ptrdiff_t)group->width;
    } else if (a_rs == 1) {
        const size_t range[2] = {pc - lo, k_end - lo};
        kern->bf16->pack_pairs(dst, mr, A + i0 + (ptrdiff_t)lo * a_cs, a_cs, range, mr, rows);
    } else {   /* neither stride unit: element by element */
        memset(dst, 0, sizeof(uint16_t) * kc2 * mr);
        for (size_t l = pc; l < k_end; ++l)
            for (size_t r = 0; r < rows; ++r) {
                uint32_t bits;
                memcpy(&bits, A + (ptrdiff_t)(i0 + r) * a_rs + (ptrdiff_t)l * a_cs, sizeof bits);
                dst[((l - lo) / 2 * mr + r) * 2 + (l - lo) % 2] = posenc_bf16_from_f32_bits(bits);
            }
    }
    return flags & ~POSENC_UKR_A_ROWS;
}
#endif

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
#ifdef ENGINE_BF16_GEMM
    bf16_group group = {0, 0, 0};   /* no tiles packed yet */
    const uint16_t *a_twin = pb->bf16 ? gemm_shadow(s, A, gemm_extent(M, Kd, a_rs, a_cs)) : NULL;
#endif
    for (size_t i0 = 0; i0 < M; i0 += mr) {
        const size_t rows = posenc_min(mr, M - i0);
        const REAL *a_tile = A + (ptrdiff_t)i0 * a_rs;
        REAL *c_tile = gemm_c_at(C, (ptrdiff_t)i0 * ldc, p_flags);
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
            const void *a_ukr = a_blk, *b_ukr;
            size_t panel_ld = blk_kc * pb->nr, depth = kc;
            ptrdiff_t lda = a_cs == 1 ? a_rs : a_cs;
#ifdef ENGINE_BF16_GEMM
            if (pb->bf16) {   /* A rounded from the even element below pc (gemm_a_bf16) */
                const size_t lo = pc & ~(size_t)1;
                const uint16_t *a_bf16;
                flags = gemm_a_bf16(kern, s, &group, A, a_twin, a_rs, a_cs, M, Kd, k_range, i0,
                                    rows, pc, pc + kc, &a_bf16, &lda, flags);
                a_ukr = a_bf16;
                depth = pc + kc - lo;
                panel_ld = posenc_round_up(blk_kc, 2) * pb->nr;
                b_ukr = (const uint16_t *)(const void *)pb->data + blk * pb->n_pad +
                        (lo - blk) * pb->nr;
            } else
#endif
            {
                if (a_cs == 1) {
                    flags |= POSENC_UKR_A_ROWS;
                } else if (a_rs != 1 || rows < mr) {
                    pack_a(s->a_pack, a_blk, a_rs, a_cs, rows, kc, mr);
                    a_ukr = s->a_pack;
                    lda = (ptrdiff_t)mr;
                }
                b_ukr = pb->data + blk * pb->n_pad + (pc - blk) * pb->nr;
            }
            gemm_tile_row(pb, depth, a_ukr, lda, b_ukr, panel_ld, rows, c_tile, ldc,
                          last ? p_tile : NULL, ldp, add_rows ? add_rows + i0 : NULL,
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
    pack_b(kern, s, &pb, b_pack, B, b_rs, b_cs, Kd, N, beta);
    gemm_packed(kern, s, M, A, a_rs, a_cs, &pb, C, ldc, accumulate, NULL, 0, NULL, 0, k_range);
}

#endif /* POSENC_ENGINE_GEMM_IMPL_H */
