/*
 * cpu.c -- what the CPU and the OS can run, detected once: cpuid *and*
 * XGETBV on x86 (the OS must save the ymm/zmm state, else AVX faults),
 * getauxval on Linux/AArch64.  Compiled into posenc._C (dispatch.c) and
 * posenc._machine alike; whether an ISA's kernels were compiled is each
 * module's business.
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

static const char *const isa_names[POSENC_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

#ifdef POSENC_X86
static unsigned long long read_xcr0(void)
{
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

/* has[isa], and *bf16 for AVX512-BF16 (+ AVX512-BW) on top of avx512. */
static void detect_x86(int *has, int *bf16)
{
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return;
    const int osxsave = (ecx >> 27) & 1, avx = (ecx >> 28) & 1, fma = (ecx >> 12) & 1;
    const int f16c = (ecx >> 29) & 1;
    if (!osxsave || !avx)
        return;
    const unsigned long long xcr0 = read_xcr0();
    const int os_ymm = (xcr0 & 0x6) == 0x6;      /* SSE and AVX state */
    const int os_zmm = (xcr0 & 0xe6) == 0xe6;    /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned int subleaves = eax;
    const int avx2 = (ebx >> 5) & 1;
    const int avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1, avx512vl = (ebx >> 31) & 1;
    const int avx512bw = (ebx >> 30) & 1;
    /* F16C (float16 conversions) came before AVX2 on every CPU that has both */
    has[POSENC_ISA_AVX2] = os_ymm && avx2 && fma && f16c;
    has[POSENC_ISA_AVX512] = os_ymm && os_zmm && avx512f && avx512dq && avx512vl && fma;
    if (subleaves >= 1) {
        __cpuid_count(7, 1, eax, ebx, ecx, edx);
        *bf16 = has[POSENC_ISA_AVX512] && avx512bw && ((eax >> 5) & 1);
    }
}
#endif

static void detect(int *has, int *bf16)
{
    has[POSENC_ISA_SCALAR] = 1;
#ifdef POSENC_X86
    detect_x86(has, bf16);
#endif
#if defined(__aarch64__)
#if defined(__linux__)
    has[POSENC_ISA_NEON] = (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
    has[POSENC_ISA_NEON] = 1; /* Advanced SIMD is mandatory on AArch64 */
#endif
#endif
}

/* Detected on first use; every caller asks first from its module's
 * initialisation, under the import lock, so no two threads race here. */
static int has_isa[POSENC_ISA_COUNT], has_avx512bf16, detected;

static void detect_once(void)
{
    if (!detected) {
        detect(has_isa, &has_avx512bf16);
        detected = 1;
    }
}

int posenc_cpu_has(posenc_isa isa)
{
    detect_once();
    return isa >= 0 && isa < POSENC_ISA_COUNT && has_isa[isa];
}

int posenc_cpu_has_avx512bf16(void)
{
    detect_once();
    return has_avx512bf16;
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
