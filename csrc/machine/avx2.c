/* machine/avx2.c -- posenc._machine's loops for avx2 (compiled with the ISA's flags). */
#define POSENC_PEAK_CHAINS 12   /* machine.h: 16 ymm registers */
#include "machine.h"

#define VECTOR_TEMPLATE "../machine/machine_impl.h"
#include "../isa/vectors_avx2.h"
