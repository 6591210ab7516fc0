/*
 * cpu.c -- what the CPU and the OS can run, detected once: cpuid *and*
 * XGETBV on x86 (the OS must save the ymm/zmm state, STYLE.md 4), getauxval
 * on Linux/AArch64.  Compiled into posenc._C (dispatch.c) and posenc._machine
 * alike; whether an ISA's kernels were compiled is each module's business.
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

static void detect_x86(int *has)
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
    has[POSENC_ISA_AVX2] = os_ymm && avx2 && fma;
    has[POSENC_ISA_AVX512] = os_ymm && os_zmm && avx512f && avx512dq && avx512vl && fma;
}
#endif

static void detect(int *has)
{
    has[POSENC_ISA_SCALAR] = 1;
#ifdef POSENC_X86
    detect_x86(has);
#endif
#if defined(__aarch64__)
#if defined(__linux__)
    has[POSENC_ISA_NEON] = (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
#else
    has[POSENC_ISA_NEON] = 1; /* Advanced SIMD is mandatory on AArch64 */
#endif
#endif
}

int posenc_cpu_has(posenc_isa isa)
{
    /* Detected on first use; every caller asks first from its module's
     * initialisation, under the import lock, so no two threads race here. */
    static int has[POSENC_ISA_COUNT], detected;
    if (!detected) {
        detect(has);
        detected = 1;
    }
    return isa >= 0 && isa < POSENC_ISA_COUNT && has[isa];
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
