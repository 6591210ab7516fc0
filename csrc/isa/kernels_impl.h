/*
 * kernels_impl.h -- the per-ISA kernels, written once against a vector
 * macro layer.  Each isa/<isa>.c defines the macros below for one dtype and
 * includes this file; it is included twice per ISA (float, double).
 *
 * Required macros:
 *   REAL            float or double
 *   KNAME(x)        x ## _<dtype>_<isa>, the kernel names (STYLE.md 1)
 *   KTABLE          the posenc_kernels table to define
 *   ISA_STRING      "avx512", ...
 *   VT, VL          vector type and its number of lanes
 *   VLOAD(p), VSTORE(p, v)    unaligned load / store of VL elements
 *   VBCAST(x), VZERO()
 *   VADD(a, b), VMUL(a, b), VFMA(a, b, c) = a * b + c
 *   VREDUCE(v)      sum of the lanes
 *   MR, NRV         register tile: MR rows by NRV vectors (nr = NRV * VL)
 *   VSTREAM(p, v)   a store that bypasses the caches where the ISA has one
 *                   (non-temporal), else a plain store; p aligned to the vector
 *   STORE_FENCE()   orders those stores before what follows (sfence on x86)
 * Optional:
 *   KEY_ROW_GATHER(op, dst, ka, ldka, bucket, b_min, j0, j1)   one row of
 *       tile_gather_key with the ISA's gathers (else plain C);
 *   KEY_ROW_SCATTER(gk, ldgk, bucket, b_min, src, j0, j1)      one row of
 *       tile_scatter_key.
 */

#define NR (NRV * VL)

/*
 * The register-tiled microkernel (BLIS style): an MR x NR tile of A.B from a
 * packed B panel and A in any of the layouts of posenc.h, then the epilogue.
 * kc may be 0 (d = 0: content term zero).
 */
static void KNAME(posenc_ukr)(size_t kc, const void *a_, ptrdiff_t lda, const void *b_, void *c_,
                              ptrdiff_t ldc, const void *p_, ptrdiff_t ldp, const void *const *q,
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
        const REAL *row[MR];
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
            row[r] = a + (ptrdiff_t)r * lda;
        UKR_LOOP(row[r][l])
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
            if (flags & POSENC_UKR_ADD_Q)
                x = VADD(x, VLOAD((const REAL *)q[r] + v * VL));
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
 * Key-side table terms of a row tile (M4, M4M, DeBERTa p2c): row r of the
 * tile needs ka[j * ldka + map(j - i0 - r) - b_min] for every key j, with
 * map_r0[j - r] = map(j - i0 - r).  Along a row that is a diagonal of ka
 * (one cache line per element), so keys go in blocks, the tile's rows
 * inside: a block's rows of ka stay in L1 and each row is one gather.
 */
#define KEY_BLOCK 64

static void KNAME(posenc_tile_gather_key)(int op, void *P_, size_t ldp, const int64_t *map_r0,
                                          ptrdiff_t b_min, const void *ka_, size_t ldka, size_t m,
                                          size_t rows)
{
    REAL *P = (REAL *)P_;
    const REAL *ka = (const REAL *)ka_;
    for (size_t j0 = 0; j0 < m; j0 += KEY_BLOCK) {
        const size_t j1 = j0 + KEY_BLOCK < m ? j0 + KEY_BLOCK : m;
        for (size_t r = 0; r < rows; ++r) {
            REAL *restrict dst = P + r * ldp;
            const int64_t *restrict bucket = map_r0 - r;
#ifdef KEY_ROW_GATHER   /* the ISA's gather instructions */
            KEY_ROW_GATHER(op, dst, ka, ldka, bucket, b_min, j0, j1);
            continue;
#endif
            if (op == POSENC_SET)
                for (size_t j = j0; j < j1; ++j) dst[j] = ka[j * ldka + (size_t)(bucket[j] - b_min)];
            else if (op == POSENC_ADD)
                for (size_t j = j0; j < j1; ++j) dst[j] += ka[j * ldka + (size_t)(bucket[j] - b_min)];
            else
                for (size_t j = j0; j < j1; ++j) dst[j] *= ka[j * ldka + (size_t)(bucket[j] - b_min)];
        }
    }
}

/*
 * Query-side table terms of a row tile when the map's runs are short (DeBERTa's
 * log buckets): P[r, j] op= qa[r * ldqa + map_r0[j - r] - b_min], one gather
 * per row from the row's projections (in L1) instead of one call per run.
 */
static void KNAME(posenc_tile_gather_query)(int op, void *P_, size_t ldp, const int64_t *map_r0,
                                            ptrdiff_t b_min, const void *qa_, size_t ldqa, size_t m,
                                            size_t rows)
{
    REAL *P = (REAL *)P_;
    const REAL *qa = (const REAL *)qa_;
    for (size_t r = 0; r < rows; ++r) {
        REAL *restrict dst = P + r * ldp;
        const REAL *restrict row = qa + r * ldqa;
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

/* The adjoint: gk[j * ldgk + map(j - i0 - r) - b_min] += src[r * lds + j] for
 * rows [r0, rows), keys [jb, m).  Per bucket the sum runs over rows in order. */
static void KNAME(posenc_tile_scatter_key)(void *gk_, size_t ldgk, const int64_t *map_r0,
                                           ptrdiff_t b_min, const void *src_, size_t lds, size_t jb,
                                           size_t m, size_t r0, size_t rows)
{
    REAL *gk = (REAL *)gk_;
    const REAL *src = (const REAL *)src_;
    for (size_t j0 = jb; j0 < m; j0 += KEY_BLOCK) {
        const size_t j1 = j0 + KEY_BLOCK < m ? j0 + KEY_BLOCK : m;
        for (size_t r = r0; r < rows; ++r) {
            const REAL *restrict s = src + r * lds;
            const int64_t *restrict bucket = map_r0 - r;
#ifdef KEY_ROW_SCATTER
            KEY_ROW_SCATTER(gk, ldgk, bucket, b_min, s, j0, j1);
            continue;
#endif
            for (size_t j = j0; j < j1; ++j)
                gk[j * ldgk + (size_t)(bucket[j] - b_min)] += s[j];
        }
    }
}

#undef KEY_BLOCK

/*
 * The machine's limits, for the benchmarks: an FMA-throughput loop (16
 * independent accumulator chains, enough to cover FMA latency x ports) and
 * a streaming store of zeros.  Not used by the engine.
 */
static double KNAME(posenc_fma_peak)(size_t iterations)
{
    VT acc[16];
    const VT x = VBCAST((REAL)0.999999), y = VBCAST((REAL)1e-7);
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t)
        acc[t] = VBCAST((REAL)t);
    for (size_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t)
            acc[t] = VFMA(acc[t], x, y);
    }
    VT total = acc[0];
    for (int t = 1; t < 16; ++t)
        total = VADD(total, acc[t]);
    return (double)VREDUCE(total);
}

/* FLOPs of one posenc_fma_peak iteration. */
#define FMA_PEAK_FLOPS (16 * VL * 2)

static void KNAME(posenc_stream_zero)(void *dst_, size_t bytes)
{
    REAL *dst = (REAL *)dst_;
    const size_t count = bytes / sizeof(REAL);
    const VT zero = VZERO();
    size_t j = 0;
    for (; j + VL <= count; j += VL)
        VSTREAM(dst + j, zero);
    for (; j < count; ++j)
        dst[j] = 0;
}

static void KNAME(posenc_store_fence)(void)
{
    STORE_FENCE();
}

const posenc_kernels KTABLE = {
    ISA_STRING,
    MR,
    NR,
    KNAME(posenc_ukr),
    KNAME(posenc_row_gather),
    KNAME(posenc_row_scatter_add),
    KNAME(posenc_row_mul),
    KNAME(posenc_tile_gather_key),
    KNAME(posenc_tile_scatter_key),
    KNAME(posenc_tile_gather_query),
    KNAME(posenc_fma_peak),
    FMA_PEAK_FLOPS,
    KNAME(posenc_stream_zero),
    KNAME(posenc_store_fence),
};

#undef FMA_PEAK_FLOPS

#undef NR
