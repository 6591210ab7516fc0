/*
 * machine_impl.h -- the measuring loops of one ISA and dtype, written once
 * against the vector layer (isa/vectors_<isa>.h, which includes this file
 * as its VECTOR_TEMPLATE; the macros are listed in isa/kernels_impl.h).
 */

#define PEAK_INIT(t) VBCAST((REAL)(t))
#define PEAK_STEP(acc) VFMA(acc, VBCAST((REAL)0.999999), VBCAST((REAL)1e-7))
POSENC_PEAK_LOOP(KNAME(posenc_fma_peak), VT, PEAK_INIT, PEAK_STEP, VADD, VREDUCE)
#undef PEAK_INIT
#undef PEAK_STEP

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
    .fma_peak_flops = POSENC_PEAK_CHAINS * VL * 2,
    .stream_zero = KNAME(posenc_stream_zero),
};
