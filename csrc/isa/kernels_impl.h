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
 */

#define NR (NRV * VL)

/*
 * The register-tiled microkernel (BLIS style): an MR x NR tile of A.B from
 * packed panels, then the epilogue.  kc may be 0 (d = 0: content term zero).
 */
static void KNAME(posenc_ukr)(size_t kc, const void *a_, const void *b_, void *c_,
                              ptrdiff_t ldc, const void *p_, ptrdiff_t ldp, int flags)
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

    for (size_t l = 0; l < kc; ++l) {
        VT bv[NRV];
#pragma GCC unroll 8
        for (int v = 0; v < NRV; ++v)
            bv[v] = VLOAD(b + l * NR + (size_t)v * VL);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            VT ar = VBCAST(a[l * MR + (size_t)r]);
#pragma GCC unroll 8
            for (int v = 0; v < NRV; ++v)
                acc[r][v] = VFMA(ar, bv[v], acc[r][v]);
        }
    }

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
    KNAME(posenc_fma_peak),
    FMA_PEAK_FLOPS,
    KNAME(posenc_stream_zero),
    KNAME(posenc_store_fence),
};

#undef FMA_PEAK_FLOPS

#undef NR
