/*
 * kernels_impl.h -- the per-ISA kernels, written once against a vector
 * macro layer.  isa/<isa>.c defines the register tile (MR, NRV) and the
 * optional hooks, sets VECTOR_TEMPLATE to this file and includes its
 * vector layer (vectors_<isa>.h), which defines the macros below for one
 * dtype and includes this file, for float and then double.
 *
 * From the vector layer:
 *   REAL            float or double
 *   KNAME(x)        x ## _<dtype>_<isa>, the kernel names: one per dtype and
 *                   ISA, as a file includes this twice and every ISA's
 *                   tables link into one module
 *   ISA_STRING      "avx512", ...
 *   VT, VL          vector type and its number of lanes
 *   VLOAD(p), VSTORE(p, v)    unaligned load / store of VL elements
 *   VBCAST(x), VZERO()
 *   VADD(a, b), VMUL(a, b), VFMA(a, b, c) = a * b + c
 *   VREDUCE(v)      sum of the lanes
 *   VTRANSPOSE(rows)   rows[u] = column u of the VL x VL block rows[0..VL-1]
 *   VSTREAM(p, v)   a store that bypasses the caches where the ISA has one
 *                   (non-temporal), else a plain store; p aligned to the vector
 *   STORE_FENCE()   orders those stores before what follows (sfence on x86)
 *   VLOAD_PART(p, n), VSTORE_PART(p, v, n)   optional: the first n < VL
 *                   lanes only (masked instructions), else through a buffer
 *   VLOAD_RANGE(p, lo, hi)   optional: lanes lo <= t < hi only, likewise
 * From isa/<isa>.c:
 *   MR, NRV         register tile: MR rows by NRV vectors (nr = NRV * VL)
 *   KC, KEY_BLOCK   block sizes, when not the defaults below
 * Optional hooks of isa/<isa>.c:
 *   KEY_ROW_GATHER(op, dst, proj, ld, bucket, b_min, j0, j1)   one row of
 *       tile_gather_key with the ISA's gathers (else plain C);
 *   KEY_ROW_SCATTER(grad, ld, bucket, b_min, src, j0, j1)      one row of
 *       tile_scatter_key;
 *   KEY_TILE_GATHER(op, P, ldp, map_r0, b_min, proj, ld, j0, j1, rows),
 *   KEY_TILE_SCATTER(grad, ld, map_r0, b_min, src, ld_src, j0, j1, r0, rows),
 *   QUERY_TILE_GATHER(op, P, ldp, map_r0, b_min, proj, ld, m, rows)   the whole
 *       of tile_gather_key, tile_scatter_key, tile_gather_query, nonzero where
 *       it took it (for that REAL), bitwise their plain loops' results;
 *   SUFFIX_INTERP_ROW(x, pos, g, t, k0, cols, last)   one row of suffix_interp
 *       (positions_impl.h) with the ISA's vectors, nonzero where it took it;
 *   SUFFIX_INTERP_GRAD_ROW(gc, dqe, G, g, pos, t, first, cols, last)   likewise
 *       suffix_interp_grad;
 *   SIGMOID_ROW(g, z, len)   likewise row_sigmoid.
 */

#define NR (NRV * VL)

/* The first n < VL lanes of a vector: a load that leaves the others zero
 * and reads nothing past them, a store that writes nothing past them.  The
 * vector layer may give its masked instructions; by default, a copy
 * through a lane buffer. */
#ifndef VLOAD_PART
static inline VT KNAME(vload_part)(const REAL *p, size_t n)
{
    REAL lane[VL] = {0};
    for (size_t t = 0; t < n; ++t)
        lane[t] = p[t];
    return VLOAD(lane);
}
static inline void KNAME(vstore_part)(REAL *p, VT v, size_t n)
{
    REAL lane[VL];
    VSTORE(lane, v);
    for (size_t t = 0; t < n; ++t)
        p[t] = lane[t];
}
#define VLOAD_PART(p, n) KNAME(vload_part)((p), (n))
#define VSTORE_PART(p, v, n) KNAME(vstore_part)((p), (v), (n))
#define VPART_DEFAULT
#endif

/* Lanes lo <= t < hi of p (p[t]), the others zero; reads nothing else. */
#ifndef VLOAD_RANGE
static inline VT KNAME(vload_range)(const REAL *p, size_t lo, size_t hi)
{
    if (lo == 0 && hi == VL)
        return VLOAD(p);
    REAL lane[VL] = {0};
    for (size_t t = lo; t < hi; ++t)
        lane[t] = p[t];
    return VLOAD(lane);
}
#define VLOAD_RANGE(p, lo, hi) KNAME(vload_range)((p), (lo), (hi))
#define VRANGE_DEFAULT
#endif

/* Depth of a packed block: an MR x KC panel of A and a KC x NR panel of B
 * stay in L1 (32 KB and up) next to the tile. */
#ifndef KC
#define KC (sizeof(REAL) == 4 ? 256 : 128)
#define KC_DEFAULT
#endif

/* Keys per block of the key-side gathers and scatters: a block's rows of
 * the projections (one cache line each) stay in L1 while a tile's rows
 * sweep them. */
#ifndef KEY_BLOCK
#define KEY_BLOCK 64
#define KEY_BLOCK_DEFAULT
#endif

/* The register-tiled microkernels (ukr_impl.h): the main one, NRV vectors
 * wide, and a narrow one of one vector for GEMMs whose N pads less to it
 * (the backward's dq = G.k and dk = G^T.q with a small head size d). */
#define UKR_NAME KNAME(posenc_ukr)
#define UKR_NRV NRV
#include "ukr_impl.h"
#define UKR_NAME KNAME(posenc_ukr_narrow)
#define UKR_NRV 1
#include "ukr_impl.h"

/*
 * Unit-stride row loops in vectors: whole ones, then the first lanes of one
 * more, each element through the same single operation as a scalar loop
 * (so the results do not depend on the split).  STEP(j, LOAD, STORE)
 * handles the lanes from j.
 */
#define ROW_VECTORS(len, STEP)                                           \
    do {                                                                 \
        size_t j = 0;                                                    \
        for (; j + VL <= (len); j += VL)                                 \
            STEP(j, VLOAD, VSTORE);                                      \
        if (j < (len)) {                                                 \
            const size_t tail = (len) - j;                               \
            STEP(j, ROW_LOAD_TAIL, ROW_STORE_TAIL);                      \
        }                                                                \
    } while (0)
#define ROW_LOAD_TAIL(p) VLOAD_PART((p), tail)
#define ROW_STORE_TAIL(p, v) VSTORE_PART((p), (v), tail)

/* ROW_DST[j] op= ROW_SOURCE(j, LOAD) for j < len (op POSENC_SET, ADD, else MUL), through
 * ROW_VECTORS: the caller defines ROW_DST and ROW_SOURCE around it. */
#define ROW_STEP_SET(j, LOAD, STORE) STORE(ROW_DST + (j), ROW_SOURCE(j, LOAD))
#define ROW_STEP_ADD(j, LOAD, STORE) \
    STORE(ROW_DST + (j), VADD(LOAD(ROW_DST + (j)), ROW_SOURCE(j, LOAD)))
#define ROW_STEP_MUL(j, LOAD, STORE) \
    STORE(ROW_DST + (j), VMUL(LOAD(ROW_DST + (j)), ROW_SOURCE(j, LOAD)))
#define ROW_OP_VECTORS(op, len)                   \
    do {                                          \
        if ((op) == POSENC_SET)                   \
            ROW_VECTORS(len, ROW_STEP_SET);       \
        else if ((op) == POSENC_ADD)              \
            ROW_VECTORS(len, ROW_STEP_ADD);       \
        else                                      \
            ROW_VECTORS(len, ROW_STEP_MUL);       \
    } while (0)

/* dst[j] op= s[j] (unit) or s[0] (not unit); inlined where unit is a constant. */
static inline void KNAME(row_apply_from)(int op, REAL *restrict dst, const REAL *restrict s,
                                         int unit, size_t len)
{
    const VT value = unit ? VZERO() : VBCAST(s[0]);
#define ROW_DST dst
#define ROW_SOURCE(j, LOAD) (unit ? LOAD(s + (j)) : value)
    ROW_OP_VECTORS(op, len);
#undef ROW_DST
#undef ROW_SOURCE
}

/* row_apply_from, a long row's stores aligned to the vector (a store across
 * two cache lines costs two): its first lanes up to the boundary apart. */
static inline void KNAME(row_apply)(int op, REAL *restrict dst, const REAL *restrict s, int unit,
                                    size_t len)
{
    const size_t bytes = VL * sizeof(REAL);
    const size_t head = (bytes - (uintptr_t)dst % bytes) % bytes / sizeof(REAL);
    if (len >= 4 * VL && head) {
        KNAME(row_apply_from)(op, dst, s, unit, head);
        dst += head;
        s += unit ? head : 0;
        len -= head;
    }
    KNAME(row_apply_from)(op, dst, s, unit, len);
}

/* dst[j] op= src[j * stride].  Unit and zero strides are the hot cases. */
static void KNAME(posenc_row_gather)(int op, void *dst_, const void *src_,
                                     ptrdiff_t stride, size_t len)
{
    REAL *restrict dst = (REAL *)dst_;
    const REAL *src = (const REAL *)src_;
    if (stride == 0) {
        KNAME(row_apply)(op, dst, src, 0, len);
    } else if (stride == 1) {
        KNAME(row_apply)(op, dst, src, 1, len);
    } else if (stride == -1) {   /* a run whose bucket falls as the key rises (DeBERTa) */
        const REAL *restrict s = src - (len - 1);   /* s[len - 1 - j] == src[-j] */
        if (op == POSENC_SET)
            for (size_t j = 0; j < len; ++j) dst[j] = s[len - 1 - j];
        else if (op == POSENC_ADD)
            for (size_t j = 0; j < len; ++j) dst[j] += s[len - 1 - j];
        else
            for (size_t j = 0; j < len; ++j) dst[j] *= s[len - 1 - j];
    } else {
        if (op == POSENC_SET)
            for (size_t j = 0; j < len; ++j) dst[j] = src[(ptrdiff_t)j * stride];
        else if (op == POSENC_ADD)
            for (size_t j = 0; j < len; ++j) dst[j] += src[(ptrdiff_t)j * stride];
        else
            for (size_t j = 0; j < len; ++j) dst[j] *= src[(ptrdiff_t)j * stride];
    }
}

/* dst[j] op= sign ((a - x[j]) + (b - y[j])), op POSENC_SET or ADD, sign +-1: the
 * differences of a pair of prefix sums held as two parts (FoX's decay,
 * engine/term_fox_impl.h); a - x as a + (-1) x, the same bits. */
static void KNAME(posenc_row_difference)(int op, void *dst_, double a_, double b_,
                                         const void *x_, const void *y_, double sign_, size_t len)
{
    REAL *restrict dst = (REAL *)dst_;
    const REAL *x = (const REAL *)x_, *y = (const REAL *)y_;
    const VT a = VBCAST((REAL)a_), b = VBCAST((REAL)b_), sign = VBCAST((REAL)sign_);
    const VT minus = VBCAST((REAL)-1);
#define ROW_DST dst
#define ROW_SOURCE(j, LOAD) \
    VMUL(sign, VADD(VADD(a, VMUL(minus, LOAD(x + (j)))), VADD(b, VMUL(minus, LOAD(y + (j))))))
    ROW_OP_VECTORS(op, len);
#undef ROW_DST
#undef ROW_SOURCE
}

/* dst[j * stride] += src[j]; with stride 0, dst[0] += sum(src). */
static void KNAME(posenc_row_scatter_add)(void *dst_, ptrdiff_t stride, const void *src_,
                                          size_t len)
{
    REAL *dst = (REAL *)dst_;
    const REAL *src = (const REAL *)src_;
    if (stride == 0) {
        VT acc0 = VZERO(), acc1 = VZERO();
        size_t j = 0;
        for (; j + 2 * VL <= len; j += 2 * VL) {
            acc0 = VADD(acc0, VLOAD(src + j));
            acc1 = VADD(acc1, VLOAD(src + j + VL));
        }
        if (j + VL <= len) {
            acc0 = VADD(acc0, VLOAD(src + j));
            j += VL;
        }
        REAL total = VREDUCE(VADD(acc0, acc1));
        for (; j < len; ++j) total += src[j];
        dst[0] += total;
    } else if (stride == 1) {
        KNAME(row_apply)(POSENC_ADD, dst, src, 1, len);
    } else if (stride == -1) {
        REAL *restrict d = dst - (len - 1);          /* d[len - 1 - j] == dst[-j] */
        const REAL *restrict s = src;
        for (size_t j = 0; j < len; ++j) d[len - 1 - j] += s[j];
    } else {
        for (size_t j = 0; j < len; ++j) dst[(ptrdiff_t)j * stride] += src[j];
    }
}

/* A row's pieces from a table (posenc_piece), and their adjoint: one call for a row of
 * short pieces (a raster's runs are a grid row, often a few dozen keys). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static void KNAME(posenc_row_pieces)(int op, void *dst_, const void *table_,
                                     const posenc_piece *pieces, size_t count)
{
    REAL *dst = (REAL *)dst_;
    const REAL *table = (const REAL *)table_;
    for (size_t e = 0; e < count; ++e) {
        REAL *restrict d = dst + pieces[e].j;
        const REAL *restrict s = table + pieces[e].at;
        const int unit = pieces[e].step != 0;
        const size_t len = pieces[e].len;
        const VT value = unit ? VZERO() : VBCAST(s[0]);
        /* a piece's vectors as written, not a call of memcpy (a compiler turns a copy loop
         * into one: on pieces of a few dozen keys its call cost more than the copy) */
#define ROW_DST d
#define ROW_SOURCE(j, LOAD) (unit ? LOAD(s + (j)) : value)
        ROW_OP_VECTORS(op, len);
#undef ROW_DST
#undef ROW_SOURCE
    }
}

static void KNAME(posenc_row_pieces_take)(void *table_, const void *src_,
                                          const posenc_piece *pieces, size_t count)
{
    REAL *table = (REAL *)table_;
    const REAL *src = (const REAL *)src_;
    for (size_t e = 0; e < count; ++e)
        KNAME(posenc_row_scatter_add)(table + pieces[e].at, (ptrdiff_t)pieces[e].step,
                                      src + pieces[e].j, pieces[e].len);
}

/* dst[j] = a[j] * b[j] */
static void KNAME(posenc_row_mul)(void *dst_, const void *a_, const void *b_, size_t len)
{
    REAL *restrict dst = (REAL *)dst_;
    const REAL *restrict a = (const REAL *)a_;
    const REAL *restrict s = (const REAL *)b_;
#define ROW_PRODUCT(j, LOAD, STORE) STORE(dst + (j), VMUL(LOAD(a + (j)), LOAD(s + (j))))
    ROW_VECTORS(len, ROW_PRODUCT);
#undef ROW_PRODUCT
}

#undef ROW_OP_VECTORS
#undef ROW_STEP_SET
#undef ROW_STEP_ADD
#undef ROW_STEP_MUL
#undef ROW_VECTORS
#undef ROW_LOAD_TAIL
#undef ROW_STORE_TAIL

/*
 * Sums along the diagonals of a block (the scalar table's gradient, T5 and
 * the like): dst[j - r] += src[r * ld + j] for r < rows, j0 <= j < m, dst
 * indexed from j0 - (rows - 1).  Short rows: a vector of dst is loaded once
 * per DIAGONAL_ROWS rows, gets each row's diagonal slice in row order (a
 * lane outside a row's keys adds 0) and is stored once: a row at a time,
 * each row's stores would be reloaded, shifted by one element, by the next
 * (a store-forwarding stall per row).
 */
/* The sums of short rows [0, rows), at most DIAGONAL_ROWS of them (see below). */
static void KNAME(diagonal_sums_rows)(REAL *dst, const REAL *src, size_t ld, size_t rows,
                                      size_t j0, size_t m)
{
    /* GROUP vectors of dst at a time: independent chains of additions */
    enum { GROUP = 4 };
    const ptrdiff_t t_end = (ptrdiff_t)m, first = (ptrdiff_t)j0;
    for (ptrdiff_t t0 = first - (ptrdiff_t)(rows - 1); t0 < t_end; t0 += GROUP * VL) {
        VT acc[GROUP];
        size_t width[GROUP];
#pragma GCC unroll 4
        for (int g = 0; g < GROUP; ++g) {
            const ptrdiff_t t = t0 + g * VL;
            width[g] = t >= t_end ? 0 : t_end - t < VL ? (size_t)(t_end - t) : VL;
            acc[g] = width[g] == VL ? VLOAD(dst + t) : VLOAD_PART(dst + t, width[g]);
        }
        /* rows r reach a lane of the group where first <= t0 + r + lane < m; in
         * [full_lo, full_hi) every lane of every vector of the group */
        const ptrdiff_t r_lo = first - t0 - (GROUP * VL - 1) > 0 ? first - t0 - (GROUP * VL - 1) : 0;
        const ptrdiff_t r_hi = t_end - t0 < (ptrdiff_t)rows ? t_end - t0 : (ptrdiff_t)rows;
        ptrdiff_t full_lo = first - t0, full_hi = t_end - t0 - GROUP * VL + 1;
        full_lo = full_lo < r_lo ? r_lo : full_lo > r_hi ? r_hi : full_lo;
        full_hi = width[GROUP - 1] < VL || full_hi < full_lo ? full_lo : full_hi > r_hi ? r_hi : full_hi;
#define DIAGONAL_EDGE_ROW(r)                                                                    \
        do {                                                                                    \
            _Pragma("GCC unroll 4")                                                             \
            for (int g = 0; g < GROUP; ++g) {                                                   \
                const ptrdiff_t j = t0 + g * VL + (r);   /* the key of lane 0 */                \
                if (width[g] == 0 || j + VL <= first || j >= t_end)                             \
                    continue;                                                                   \
                const size_t lo = first > j ? (size_t)(first - j) : 0;                          \
                const size_t hi = t_end - j < (ptrdiff_t)width[g] ? (size_t)(t_end - j) : width[g]; \
                acc[g] = VADD(acc[g], VLOAD_RANGE(src + (r) * (ptrdiff_t)ld + j, lo, hi));      \
            }                                                                                   \
        } while (0)
        for (ptrdiff_t r = r_lo; r < full_lo; ++r)
            DIAGONAL_EDGE_ROW(r);
        for (ptrdiff_t r = full_lo; r < full_hi; ++r) {
            const REAL *row = src + r * (ptrdiff_t)ld + t0 + r;
#pragma GCC unroll 4
            for (int g = 0; g < GROUP; ++g)
                acc[g] = VADD(acc[g], VLOAD(row + g * VL));
        }
        for (ptrdiff_t r = full_hi; r < r_hi; ++r)
            DIAGONAL_EDGE_ROW(r);
#undef DIAGONAL_EDGE_ROW
#pragma GCC unroll 4
        for (int g = 0; g < GROUP; ++g) {
            if (width[g] == VL)
                VSTORE(dst + t0 + g * VL, acc[g]);
            else if (width[g] > 0)
                VSTORE_PART(dst + t0 + g * VL, acc[g], width[g]);
        }
    }
}

/* Rows a time: their slices of src stay in L1 while the vectors of dst sweep them. */
#define DIAGONAL_ROWS 32

static void KNAME(posenc_diagonal_sums)(void *dst_, const void *src_, size_t ld, size_t rows,
                                        size_t j0, size_t m)
{
    REAL *dst = (REAL *)dst_;
    const REAL *src = (const REAL *)src_;
    if (j0 >= m)
        return;
    if (m - j0 >= 4 * VL) {
        /* long rows: a row's stores retire long before the next row reloads
         * them, and row by row needs no masks */
        for (size_t r = 0; r < rows; ++r)
            KNAME(row_apply)(POSENC_ADD, dst + j0 - r, src + r * ld + j0, 1, m - j0);
        return;
    }
    for (size_t r0 = 0; r0 < rows; r0 += DIAGONAL_ROWS)
        KNAME(diagonal_sums_rows)(dst - r0, src + r0 * ld, ld,
                                  rows - r0 < DIAGONAL_ROWS ? rows - r0 : DIAGONAL_ROWS, j0, m);
}

#undef DIAGONAL_ROWS

/*
 * A B panel from rows (BLIS's packing, the row-major case): dst[l * nr + c]
 * = alpha * src[l * rs + c] for c < cols, 0 for cols <= c < nr (nr a
 * multiple of VL), l < kc.
 */
static void KNAME(posenc_pack_rows)(void *dst_, size_t nr, const void *src_, ptrdiff_t rs,
                                    size_t kc, size_t cols, double alpha)
{
    REAL *dst = (REAL *)dst_;
    const REAL *src = (const REAL *)src_;
    const VT scale = VBCAST((REAL)alpha);
    for (size_t l = 0; l < kc; ++l) {
        REAL *d = dst + l * nr;
        const REAL *s = src + (ptrdiff_t)l * rs;
        size_t c = 0;
        for (; c + VL <= cols; c += VL)
            VSTORE(d + c, VMUL(scale, VLOAD(s + c)));
        if (c < cols) {
            VSTORE(d + c, VMUL(scale, VLOAD_PART(s + c, cols - c)));
            c += VL;
        }
        for (; c < nr; c += VL)
            VSTORE(d + c, VZERO());
    }
}

/*
 * A B panel from columns (the transposing case, B's column c a row of
 * memory): dst[l * nr + c] = alpha * src[c * cs + l] for c < cols, 0 for
 * cols <= c < nr, l < kc.  VL x VL blocks: VL columns' runs of VL elements
 * loaded and scaled (each element alpha * x, as pack_rows), transposed in
 * registers, stored as VL panel rows.
 */
static void KNAME(posenc_pack_cols)(void *dst_, size_t nr, const void *src_, ptrdiff_t cs,
                                    size_t kc, size_t cols, double alpha)
{
    REAL *dst = (REAL *)dst_;
    const REAL *src = (const REAL *)src_;
    const VT scale = VBCAST((REAL)alpha);
    for (size_t c0 = 0; c0 < nr; c0 += VL)
        for (size_t l0 = 0; l0 < kc; l0 += VL) {
            const size_t depth = kc - l0 < VL ? kc - l0 : VL;
            if (c0 >= cols) {   /* padding */
                for (size_t u = 0; u < depth; ++u)
                    VSTORE(dst + (l0 + u) * nr + c0, VZERO());
                continue;
            }
            VT block[VL];
#pragma GCC unroll 16
            for (size_t u = 0; u < VL; ++u) {
                if (c0 + u >= cols) {
                    block[u] = VZERO();
                    continue;
                }
                const REAL *s = src + (ptrdiff_t)(c0 + u) * cs + (ptrdiff_t)l0;
                block[u] = VMUL(scale, depth == VL ? VLOAD(s) : VLOAD_PART(s, depth));
            }
            VTRANSPOSE(block);
#pragma GCC unroll 16
            for (size_t u = 0; u < VL; ++u)
                if (u < depth)
                    VSTORE(dst + (l0 + u) * nr + c0, block[u]);
        }
}

/*
 * Key-side table terms of a row tile (M4, M4M, DeBERTa p2c), keys
 * [j0, j1): row r of the tile needs proj[j * ld + map(j - i0 - r) - b_min],
 * with map_r0[j - r] = map(j - i0 - r).  Along a row that is a diagonal of
 * proj (one cache line per element), so the engine passes keys in blocks
 * of KEY_BLOCK, the tile's rows inside: a block's rows of proj stay in L1
 * and each row is one gather.
 */
static void KNAME(posenc_tile_gather_key)(int op, void *P_, size_t ldp, const int64_t *map_r0,
                                          ptrdiff_t b_min, const void *proj_, size_t ld, size_t j0,
                                          size_t j1, size_t rows)
{
    REAL *P = (REAL *)P_;
    const REAL *proj = (const REAL *)proj_;
#ifdef KEY_TILE_GATHER   /* the ISA's tile at once, where it has one for REAL */
    if (KEY_TILE_GATHER(op, P, ldp, map_r0, b_min, proj, ld, j0, j1, rows))
        return;
#endif
    for (size_t r = 0; r < rows; ++r) {
        REAL *restrict dst = P + r * ldp;
        const int64_t *restrict bucket = map_r0 - r;
#ifdef KEY_ROW_GATHER   /* the ISA's gather instructions */
        KEY_ROW_GATHER(op, dst, proj, ld, bucket, b_min, j0, j1);
        continue;
#endif
        if (op == POSENC_SET)
            for (size_t j = j0; j < j1; ++j) dst[j] = proj[j * ld + (size_t)(bucket[j] - b_min)];
        else if (op == POSENC_ADD)
            for (size_t j = j0; j < j1; ++j) dst[j] += proj[j * ld + (size_t)(bucket[j] - b_min)];
        else
            for (size_t j = j0; j < j1; ++j) dst[j] *= proj[j * ld + (size_t)(bucket[j] - b_min)];
    }
}

/*
 * Query-side table terms of a row tile when the map's runs are short (DeBERTa's
 * log buckets): P[r, j] op= proj[r * ld + map_r0[j - r] - b_min], one gather
 * per row from the row's projections (in L1) instead of one call per run.
 */
static void KNAME(posenc_tile_gather_query)(int op, void *P_, size_t ldp, const int64_t *map_r0,
                                            ptrdiff_t b_min, const void *proj_, size_t ld, size_t m,
                                            size_t rows)
{
    REAL *P = (REAL *)P_;
    const REAL *proj = (const REAL *)proj_;
#ifdef QUERY_TILE_GATHER   /* the ISA's tile at once, where it has one for REAL */
    if (QUERY_TILE_GATHER(op, P, ldp, map_r0, b_min, proj, ld, m, rows))
        return;
#endif
    for (size_t r = 0; r < rows; ++r) {
        REAL *restrict dst = P + r * ldp;
        const REAL *restrict row = proj + r * ld;
        const int64_t *restrict bucket = map_r0 - r;
#ifdef KEY_ROW_GATHER   /* the same gather with a row stride of 0 */
        KEY_ROW_GATHER(op, dst, row, 0, bucket, b_min, 0, m);
        continue;
#endif
        if (op == POSENC_SET)
            for (size_t j = 0; j < m; ++j) dst[j] = row[bucket[j] - b_min];
        else if (op == POSENC_ADD)
            for (size_t j = 0; j < m; ++j) dst[j] += row[bucket[j] - b_min];
        else
            for (size_t j = 0; j < m; ++j) dst[j] *= row[bucket[j] - b_min];
    }
}

/* The adjoint: grad[j * ld + map(j - i0 - r) - b_min] += src[r * ld_src + j] for
 * rows [r0, rows), keys [j0, j1).  Per bucket the sum runs over rows in order. */
static void KNAME(posenc_tile_scatter_key)(void *grad_, size_t ld, const int64_t *map_r0,
                                           ptrdiff_t b_min, const void *src_, size_t ld_src,
                                           size_t j0, size_t j1, size_t r0, size_t rows)
{
    REAL *grad = (REAL *)grad_;
    const REAL *src = (const REAL *)src_;
#ifdef KEY_TILE_SCATTER   /* the ISA's tile at once, where it has one for REAL */
    if (KEY_TILE_SCATTER(grad, ld, map_r0, b_min, src, ld_src, j0, j1, r0, rows))
        return;
#endif
    for (size_t r = r0; r < rows; ++r) {
        const REAL *restrict s = src + r * ld_src;
        const int64_t *restrict bucket = map_r0 - r;
#ifdef KEY_ROW_SCATTER
        KEY_ROW_SCATTER(grad, ld, bucket, b_min, s, j0, j1);
        continue;
#endif
        for (size_t j = j0; j < j1; ++j)
            grad[j * ld + (size_t)(bucket[j] - b_min)] += s[j];
    }
}

#include "softmax_impl.h"   /* row_max, row_exp: the fused attention's softmax */
#include "decode_impl.h"    /* rows_dot, rows_axpy: the decoding path's products */
#include "positions_impl.h" /* row_sigmoid, suffix_interp(_grad): contextual positions (CoPE) */

/* The dropout's rows: the ISA's vector generator (isa/avx512.c, isa/avx2.c), else the plain C. */
#ifndef DROPOUT_ROW
#include "../engine/philox.h"
#define DROPOUT_ROW posenc_dropout_row
#define DROPOUT_ROW_DEFAULT
#endif

static void KNAME(posenc_store_fence)(void)
{
    STORE_FENCE();
}

const posenc_kernels KNAME(posenc_kernels) = {
    .name = ISA_STRING,
    /* the GEMMs: the microkernels with their blocks, and B's packing */
    .mr = MR, .nr = NR, .nr_narrow = VL, .kc = KC,
    .ukr = KNAME(posenc_ukr), .ukr_narrow = KNAME(posenc_ukr_narrow),
    .pack_rows = KNAME(posenc_pack_rows), .pack_cols = KNAME(posenc_pack_cols),
    /* rows of the positional terms and their gradients */
    .row_gather = KNAME(posenc_row_gather), .row_scatter_add = KNAME(posenc_row_scatter_add),
    .row_mul = KNAME(posenc_row_mul), .diagonal_sums = KNAME(posenc_diagonal_sums),
    .row_pieces = KNAME(posenc_row_pieces), .row_pieces_take = KNAME(posenc_row_pieces_take),
    .row_difference = KNAME(posenc_row_difference),
    /* the vector tables' tiles, keys in blocks */
    .key_block = KEY_BLOCK,
    .tile_gather_key = KNAME(posenc_tile_gather_key),
    .tile_scatter_key = KNAME(posenc_tile_scatter_key),
    .tile_gather_query = KNAME(posenc_tile_gather_query),
    /* the fused attention's softmax rows */
    .row_max = KNAME(posenc_row_max), .row_exp = KNAME(posenc_row_exp),
    .row_softcap = KNAME(posenc_row_softcap),
    .dropout_row = DROPOUT_ROW,
    /* the decoding path's products, k and v streamed in place */
    .rows_dot = KNAME(posenc_rows_dot), .rows_axpy = KNAME(posenc_rows_axpy),
    /* contextual positions along rows and their tables' values */
    .suffix_interp = KNAME(posenc_suffix_interp),
    .suffix_interp_grad = KNAME(posenc_suffix_interp_grad),
    .row_sigmoid = KNAME(posenc_row_sigmoid),
    .store_fence = KNAME(posenc_store_fence),
};

#undef NR
#ifdef VPART_DEFAULT
#undef VLOAD_PART
#undef VSTORE_PART
#undef VPART_DEFAULT
#endif
#ifdef VRANGE_DEFAULT
#undef VLOAD_RANGE
#undef VRANGE_DEFAULT
#endif
#ifdef KC_DEFAULT
#undef KC
#undef KC_DEFAULT
#endif
#ifdef KEY_BLOCK_DEFAULT
#undef KEY_BLOCK
#undef KEY_BLOCK_DEFAULT
#endif
#ifdef DROPOUT_ROW_DEFAULT
#undef DROPOUT_ROW
#undef DROPOUT_ROW_DEFAULT
#endif
