/*
 * machine_impl.h -- the measuring loops of one ISA and dtype, written once
 * against the vector layer (isa/vectors_<isa>.h, which includes this file
 * as its VECTOR_TEMPLATE; the macros are listed in isa/kernels_impl.h).
 */

/* 16 independent accumulator chains: enough to cover FMA latency x ports
 * on every target (4 cycles x 2 ports on recent x86 needs 8). */
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
    STORE_FENCE();
}

const posenc_machine_loops KNAME(posenc_machine) = {
    .fma_peak = KNAME(posenc_fma_peak),
    .fma_peak_flops = 16 * VL * 2,
    .stream_zero = KNAME(posenc_stream_zero),
};
