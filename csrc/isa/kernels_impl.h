/*
 * kernels_impl.h -- the per-ISA kernels, written once against a vector
 * macro layer.  isa/<isa>.c defines the register tile (MR, NRV) and the
 * optional hooks, sets VECTOR_TEMPLATE to this file and includes its
 * vector layer (vectors_<isa>.h), which defines the macros below for one
 * dtype and includes this file, for float and then double.
 *
 * From the vector layer:
 *   REAL            float or double
 *   KNAME(x)        x ## _<dtype>_<isa>, the kernel names (STYLE.md 1)
 *   ISA_STRING      "avx512", ...
 *   VT, VL          vector type and its number of lanes
 *   VLOAD(p), VSTORE(p, v)    unaligned load / store of VL elements
 *   VBCAST(x), VZERO()
 *   VADD(a, b), VMUL(a, b), VFMA(a, b, c) = a * b + c
 *   VREDUCE(v)      sum of the lanes
 *   VSTREAM(p, v)   a store that bypasses the caches where the ISA has one
 *                   (non-temporal), else a plain store; p aligned to the vector
 *   STORE_FENCE()   orders those stores before what follows (sfence on x86)
 * From isa/<isa>.c:
 *   MR, NRV         register tile: MR rows by NRV vectors (nr = NRV * VL)
 *   KC, KEY_BLOCK   block sizes, when not the defaults below
 * Optional hooks of isa/<isa>.c:
 *   KEY_ROW_GATHER(op, dst, proj, ld, bucket, b_min, j0, j1)   one row of
 *       tile_gather_key with the ISA's gathers (else plain C);
 *   KEY_ROW_SCATTER(grad, ld, bucket, b_min, src, j0, j1)      one row of
 *       tile_scatter_key.
 */

#define NR (NRV * VL)

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

/*
 * The register-tiled microkernel (BLIS style): an MR x NR tile of A.B from a
 * packed B panel and A in any of the layouts of posenc.h, then the epilogue.
 * kc may be 0 (d = 0: content term zero).
 */
static void KNAME(posenc_ukr)(size_t kc, const void *a_, ptrdiff_t lda, const void *b_, void *c_,
                              ptrdiff_t ldc, const void *p_, ptrdiff_t ldp, const void *const *rows,
                              int flags)
{
    const REAL *a = (const REAL *)a_;
    const REAL *b = (const REAL *)b_;
    REAL *c = (REAL *)c_;
    const REAL *p = (const REAL *)p_;
    VT acc[MR][NRV];

#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NRV; ++v)
            acc[r][v] = VZERO();

    /* One rank-1 update per l; A(r, l) is broadcast straight from memory. */
#define UKR_LOOP(A_AT)                                                   \
    for (size_t l = 0; l < kc; ++l) {                                    \
        VT bv[NRV];                                                      \
        _Pragma("GCC unroll 8")                                          \
        for (int v = 0; v < NRV; ++v)                                    \
            bv[v] = VLOAD(b + l * NR + (size_t)v * VL);                  \
        _Pragma("GCC unroll 16")                                         \
        for (int r = 0; r < MR; ++r) {                                   \
            VT ar = VBCAST(A_AT);                                        \
            _Pragma("GCC unroll 8")                                      \
            for (int v = 0; v < NRV; ++v)                                \
                acc[r][v] = VFMA(ar, bv[v], acc[r][v]);                  \
        }                                                                \
    }
    if (flags & POSENC_UKR_A_ROWS) {
        const REAL *a_row[MR];
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
            a_row[r] = a + (ptrdiff_t)r * lda;
        UKR_LOOP(a_row[r][l])
    } else if (lda == MR) {          /* a packed panel: constant offsets */
        UKR_LOOP(a[l * MR + (size_t)r])
    } else {
        UKR_LOOP(a[(ptrdiff_t)l * lda + r])
    }
#undef UKR_LOOP

#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
        REAL *crow = c + r * ldc;
#pragma GCC unroll 8
        for (int v = 0; v < NRV; ++v) {
            VT x = acc[r][v];
            if (flags & POSENC_UKR_ACCUMULATE)
                x = VADD(x, VLOAD(crow + v * VL));
            if (flags & POSENC_UKR_ADD_P)
                x = VADD(x, VLOAD(p + r * ldp + v * VL));
            else if (flags & POSENC_UKR_MUL_P)
                x = VMUL(x, VLOAD(p + r * ldp + v * VL));
            if (flags & POSENC_UKR_ADD_ROWS)
                x = VADD(x, VLOAD((const REAL *)rows[r] + v * VL));
            if (flags & POSENC_UKR_STREAM)
                VSTREAM(crow + v * VL, x);
            else
                VSTORE(crow + v * VL, x);
        }
    }
}

/* dst[j] op= src[j * stride].  Unit and zero strides are the hot cases. */
static void KNAME(posenc_row_gather)(int op, void *dst_, const void *src_,
                                     ptrdiff_t stride, size_t len)
{
    REAL *restrict dst = (REAL *)dst_;
    const REAL *src = (const REAL *)src_;
    if (stride == 0) {
        const REAL value = src[0];
        if (op == POSENC_SET)
            for (size_t j = 0; j < len; ++j) dst[j] = value;
        else if (op == POSENC_ADD)
            for (size_t j = 0; j < len; ++j) dst[j] += value;
        else
            for (size_t j = 0; j < len; ++j) dst[j] *= value;
    } else if (stride == 1) {
        const REAL *restrict s = src;
        if (op == POSENC_SET)
            for (size_t j = 0; j < len; ++j) dst[j] = s[j];
        else if (op == POSENC_ADD)
            for (size_t j = 0; j < len; ++j) dst[j] += s[j];
        else
            for (size_t j = 0; j < len; ++j) dst[j] *= s[j];
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
        REAL *restrict d = dst;
        const REAL *restrict s = src;
        for (size_t j = 0; j < len; ++j) d[j] += s[j];
    } else if (stride == -1) {
        REAL *restrict d = dst - (len - 1);          /* d[len - 1 - j] == dst[-j] */
        const REAL *restrict s = src;
        for (size_t j = 0; j < len; ++j) d[len - 1 - j] += s[j];
    } else {
        for (size_t j = 0; j < len; ++j) dst[(ptrdiff_t)j * stride] += src[j];
    }
}

static void KNAME(posenc_row_mul)(void *dst_, const void *a_, const void *b_, size_t len)
{
    REAL *restrict dst = (REAL *)dst_;
    const REAL *restrict a = (const REAL *)a_;
    const REAL *restrict b = (const REAL *)b_;
    for (size_t j = 0; j < len; ++j) dst[j] = a[j] * b[j];
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

static void KNAME(posenc_store_fence)(void)
{
    STORE_FENCE();
}

const posenc_kernels KNAME(posenc_kernels) = {
    .name = ISA_STRING,
    .mr = MR,
    .nr = NR,
    .kc = KC,
    .key_block = KEY_BLOCK,
    .ukr = KNAME(posenc_ukr),
    .row_gather = KNAME(posenc_row_gather),
    .row_scatter_add = KNAME(posenc_row_scatter_add),
    .row_mul = KNAME(posenc_row_mul),
    .tile_gather_key = KNAME(posenc_tile_gather_key),
    .tile_scatter_key = KNAME(posenc_tile_scatter_key),
    .tile_gather_query = KNAME(posenc_tile_gather_query),
    .store_fence = KNAME(posenc_store_fence),
};

#undef NR
#ifdef KC_DEFAULT
#undef KC
#undef KC_DEFAULT
#endif
#ifdef KEY_BLOCK_DEFAULT
#undef KEY_BLOCK
#undef KEY_BLOCK_DEFAULT
#endif
