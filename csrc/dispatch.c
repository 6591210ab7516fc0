/*
 * dispatch.c -- which ISA runs.  Detection happens once, at import
 * (posenc_dispatch_init): cpuid *and* XGETBV on x86 (the OS must save the
 * ymm/zmm state, STYLE.md 4), getauxval on Linux/AArch64.  The active table
 * for each dtype starts as the scalar kernels and is overridden entry by
 * entry by the selected ISA (STYLE.md 2), so every entry has a fallback.
 */
#include "posenc.h"

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define POSENC_X86 1
#include <cpuid.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

static const char *const isa_names[POSENC_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

static int supported[POSENC_ISA_COUNT];
/* composed[isa][dtype]: immutable after init; switching ISA swaps an index,
 * so a kernel running in another thread never sees a half-written table. */
static posenc_kernels composed[POSENC_ISA_COUNT][2];
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

#ifdef POSENC_X86
static unsigned long long read_xcr0(void)
{
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void detect_x86(void)
{
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return;
    const int osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, fma = (ecx >> 12) & 1;
    if (!osxsave || !avx)
        return;
    const unsigned long long xcr0 = read_xcr0();
    const int os_ymm = (xcr0 & 0x6) == 0x6;      /* SSE and AVX state */
    const int os_zmm = (xcr0 & 0xe6) == 0xe6;    /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const int avx2 = (ebx >> 5) & 1;
    const int avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1, avx512vl = (ebx >> 31) & 1;
    supported[POSENC_ISA_AVX2] = os_ymm && avx2 && fma;
    supported[POSENC_ISA_AVX512] = os_ymm && os_zmm && avx512f && avx512dq && avx512vl && fma;
}
#endif

/* Scalar first, then each entry the ISA provides (STYLE.md 2). */
static void fill_table(posenc_kernels *dst, posenc_isa isa, posenc_dtype dtype)
{
    const posenc_kernels *base = compiled_table(POSENC_ISA_SCALAR, dtype);
    const posenc_kernels *over = compiled_table(isa, dtype);
    *dst = *base;
    if (!over || over == base)
        return;
    dst->name = over->name;
    if (over->ukr) {                    /* the microkernel and its tile go together */
        dst->ukr = over->ukr;
        dst->mr = over->mr;
        dst->nr = over->nr;
    }
    if (over->row_gather) dst->row_gather = over->row_gather;
    if (over->row_scatter_add) dst->row_scatter_add = over->row_scatter_add;
    if (over->row_mul) dst->row_mul = over->row_mul;
    if (over->tile_gather_key) dst->tile_gather_key = over->tile_gather_key;
    if (over->tile_scatter_key) dst->tile_scatter_key = over->tile_scatter_key;
    if (over->tile_gather_query) dst->tile_gather_query = over->tile_gather_query;
    if (over->fma_peak) {
        dst->fma_peak = over->fma_peak;
        dst->fma_peak_flops = over->fma_peak_flops;
    }
    if (over->stream_zero) dst->stream_zero = over->stream_zero;
    if (over->store_fence) dst->store_fence = over->store_fence;
}

void posenc_dispatch_init(void)
{
    if (initialized)
        return;
    memset(supported, 0, sizeof supported);
    supported[POSENC_ISA_SCALAR] = 1;
#ifdef POSENC_X86
    detect_x86();
#endif
#if defined(__aarch64__)
#if defined(__linux__)
    supported[POSENC_ISA_NEON] = (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
    supported[POSENC_ISA_NEON] = 1; /* Advanced SIMD is mandatory on AArch64 */
#endif
#endif
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (!compiled_table((posenc_isa)isa, POSENC_F32))
            supported[isa] = 0;
        if (supported[isa]) {
            fill_table(&composed[isa][POSENC_F32], (posenc_isa)isa, POSENC_F32);
            fill_table(&composed[isa][POSENC_F64], (posenc_isa)isa, POSENC_F64);
        }
    }
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

const posenc_kernels *posenc_kernels_for(posenc_isa isa, posenc_dtype dtype)
{
    return posenc_isa_supported(isa) ? &composed[isa][dtype] : NULL;
}

const posenc_kernels *posenc_active_kernels(posenc_dtype dtype)
{
    return &composed[posenc_get_isa()][dtype];
}

const char *posenc_isa_name(posenc_isa isa)
{
    return (isa >= 0 && isa < POSENC_ISA_COUNT) ? isa_names[isa] : "unknown";
}

int posenc_isa_from_name(const char *name)
{
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa)
        if (strcmp(name, isa_names[isa]) == 0)
            return isa;
    return -1;
}

int posenc_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int posenc_default_threads(void) { return posenc_max_threads(); }
