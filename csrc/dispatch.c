/*
 * dispatch.c -- which kernels run.  At import (posenc_dispatch_init) the
 * ISAs the CPU and OS support (cpu.c) and this build compiled are composed
 * into one table per ISA and dtype: the scalar kernels first, then
 * overridden entry by entry by the ISA (the entries posenc.h's
 * POSENC_KERNEL_ENTRIES lists), so every entry has a fallback.
 */
#include "posenc.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int supported[POSENC_ISA_COUNT];
/* composed[isa][dtype]: immutable after init; switching ISA swaps an index,
 * so a kernel running in another thread never sees a half-written table. */
static posenc_kernels composed[POSENC_ISA_COUNT][2];
/* avx512's float32 kernels with AVX512-BF16's GEMM (posenc_bf16_gemm_kernels) */
static posenc_kernels composed_bf16_gemm;
static int active_isa = POSENC_ISA_SCALAR;
static int initialized;

static const posenc_kernels *compiled_table(posenc_isa isa, posenc_dtype dtype)
{
    switch (isa) {
    case POSENC_ISA_SCALAR:
        return dtype == POSENC_F32 ? &posenc_kernels_f32_scalar : &posenc_kernels_f64_scalar;
#ifdef POSENC_HAVE_AVX2
    case POSENC_ISA_AVX2:
        return dtype == POSENC_F32 ? &posenc_kernels_f32_avx2 : &posenc_kernels_f64_avx2;
#endif
#ifdef POSENC_HAVE_AVX512
    case POSENC_ISA_AVX512:
        return dtype == POSENC_F32 ? &posenc_kernels_f32_avx512 : &posenc_kernels_f64_avx512;
#endif
#ifdef POSENC_HAVE_NEON
    case POSENC_ISA_NEON:
        return dtype == POSENC_F32 ? &posenc_kernels_f32_neon : &posenc_kernels_f64_neon;
#endif
    default:
        return NULL;
    }
}

/* posenc_kernels has the entries POSENC_KERNEL_ENTRIES lists and no others
 * (besides name and bf16): fill_table copies every one of them. */
#define COUNT_FN(...) +sizeof(void (*)(void))
#define COUNT_SIZE(...) +sizeof(size_t)
_Static_assert(sizeof(posenc_kernels) == sizeof(const char *) + sizeof(const void *)
                   POSENC_KERNEL_ENTRIES(COUNT_FN, COUNT_SIZE, COUNT_FN),
               "posenc_kernels has an entry POSENC_KERNEL_ENTRIES does not list");
_Static_assert(sizeof(posenc_convert) == sizeof(const char *) POSENC_CONVERT_ENTRIES(COUNT_FN),
               "posenc_convert has an entry POSENC_CONVERT_ENTRIES does not list");
#undef COUNT_FN
#undef COUNT_SIZE

/* Scalar first, then each entry the ISA provides, so that every entry has a
 * fallback; a group of entries (the microkernels with their packing and
 * block sizes) is taken only whole. */
static void fill_table(posenc_kernels *dst, posenc_isa isa, posenc_dtype dtype)
{
    const posenc_kernels *base = compiled_table(POSENC_ISA_SCALAR, dtype);
    const posenc_kernels *over = compiled_table(isa, dtype);
    *dst = *base;
    if (!over || over == base)
        return;
    dst->name = over->name;
    int gemm = 1, key_tile = 1;   /* the groups of POSENC_KERNEL_ENTRIES: all set by `over` */
#define NOTHING(...)
#define COMPLETE(group, entry) group = group && over->entry;
    POSENC_KERNEL_ENTRIES(COMPLETE, NOTHING, NOTHING)
#define TAKE_GROUP(group, entry) if (group) dst->entry = over->entry;
#define TAKE(entry) if (over->entry) dst->entry = over->entry;
    POSENC_KERNEL_ENTRIES(TAKE_GROUP, TAKE_GROUP, TAKE)
}

/* The conversions (posenc_convert): composed[isa] like the kernels, scalar first. */
static posenc_convert composed_convert[POSENC_ISA_COUNT];

static const posenc_convert *compiled_convert(posenc_isa isa)
{
    switch (isa) {
    case POSENC_ISA_SCALAR:
        return &posenc_convert_scalar;
#ifdef POSENC_HAVE_AVX2
    case POSENC_ISA_AVX2:
        return &posenc_convert_avx2;
#endif
#ifdef POSENC_HAVE_AVX512
    case POSENC_ISA_AVX512:
        return &posenc_convert_avx512;
#endif
#ifdef POSENC_HAVE_NEON
    case POSENC_ISA_NEON:
        return &posenc_convert_neon;
#endif
    default:
        return NULL;
    }
}

/* The entries `over` has replace dst's. */
static void override_convert(posenc_convert *dst, const posenc_convert *over)
{
    dst->name = over->name;
    POSENC_CONVERT_ENTRIES(TAKE)
}
#undef NOTHING
#undef COMPLETE
#undef TAKE_GROUP
#undef TAKE

/* Scalar, the ISA's, then on avx512 AVX512-BF16's where the CPU has it. */
static void fill_convert(posenc_convert *dst, posenc_isa isa)
{
    const posenc_convert *over = compiled_convert(isa);
    *dst = posenc_convert_scalar;
    if (over && over != &posenc_convert_scalar)
        override_convert(dst, over);
#ifdef POSENC_HAVE_AVX512BF16
    if (isa == POSENC_ISA_AVX512 && posenc_cpu_has_avx512bf16())
        override_convert(dst, &posenc_convert_avx512bf16);
#endif
}

void posenc_dispatch_init(void)
{
    if (initialized)
        return;
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        supported[isa] = posenc_cpu_has((posenc_isa)isa) && compiled_table((posenc_isa)isa, POSENC_F32);
        if (supported[isa]) {
            fill_table(&composed[isa][POSENC_F32], (posenc_isa)isa, POSENC_F32);
            fill_table(&composed[isa][POSENC_F64], (posenc_isa)isa, POSENC_F64);
            fill_convert(&composed_convert[isa], (posenc_isa)isa);
        }
    }
#ifdef POSENC_HAVE_AVX512BF16
    if (supported[POSENC_ISA_AVX512] && posenc_cpu_has_avx512bf16()) {
        composed_bf16_gemm = composed[POSENC_ISA_AVX512][POSENC_F32];
        composed_bf16_gemm.bf16 = &posenc_bf16_kernels_avx512bf16;
    }
#endif
    /* Best available: avx512 > avx2 > neon > scalar. */
    posenc_isa best = POSENC_ISA_SCALAR;
    if (supported[POSENC_ISA_NEON]) best = POSENC_ISA_NEON;
    if (supported[POSENC_ISA_AVX2]) best = POSENC_ISA_AVX2;
    if (supported[POSENC_ISA_AVX512]) best = POSENC_ISA_AVX512;
    initialized = 1;
    posenc_set_isa(best);
}

int posenc_isa_compiled(posenc_isa isa)
{
    return isa >= 0 && isa < POSENC_ISA_COUNT && compiled_table(isa, POSENC_F32) != NULL;
}

int posenc_isa_supported(posenc_isa isa)
{
    return isa >= 0 && isa < POSENC_ISA_COUNT && supported[isa];
}

int posenc_set_isa(posenc_isa isa)
{
    if (!posenc_isa_supported(isa))
        return -1;
    __atomic_store_n(&active_isa, (int)isa, __ATOMIC_RELEASE);
    return 0;
}

posenc_isa posenc_get_isa(void) { return (posenc_isa)__atomic_load_n(&active_isa, __ATOMIC_ACQUIRE); }

const posenc_kernels *posenc_kernels_compiled(posenc_isa isa, posenc_dtype dtype)
{
    return isa >= 0 && isa < POSENC_ISA_COUNT && (dtype == POSENC_F32 || dtype == POSENC_F64)
               ? compiled_table(isa, dtype)
               : NULL;
}

const posenc_convert *posenc_convert_compiled(posenc_isa isa)
{
    return isa >= 0 && isa < POSENC_ISA_COUNT ? compiled_convert(isa) : NULL;
}

const posenc_kernels *posenc_kernels_for(posenc_isa isa, posenc_dtype dtype)
{
    return posenc_isa_supported(isa) ? &composed[isa][dtype] : NULL;
}

const posenc_kernels *posenc_active_kernels(posenc_dtype dtype)
{
    return &composed[posenc_get_isa()][dtype];
}

const posenc_convert *posenc_convert_for(posenc_isa isa)
{
    return posenc_isa_supported(isa) ? &composed_convert[isa] : NULL;
}

const posenc_convert *posenc_active_convert(void)
{
    return &composed_convert[posenc_get_isa()];
}

const posenc_bf16_kernels *posenc_active_bf16_kernels(void)
{
#ifdef POSENC_HAVE_AVX512BF16
    if (posenc_get_isa() == POSENC_ISA_AVX512 && posenc_cpu_has_avx512bf16())
        return &posenc_bf16_kernels_avx512bf16;
#endif
    return NULL;
}

const posenc_kernels *posenc_bf16_gemm_kernels(void)
{
    return posenc_active_bf16_kernels() ? &composed_bf16_gemm : NULL;
}

int posenc_max_threads(void)
{
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
    return threads < 1 ? 1 : threads > POSENC_MAX_THREADS ? POSENC_MAX_THREADS : threads;
#else
    return 1;
#endif
}
