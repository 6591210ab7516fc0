/* machine/avx2.c -- posenc._machine's loops for avx2 (compiled with the ISA's flags). */
#include "machine.h"

#define VECTOR_TEMPLATE "../machine/machine_impl.h"
#include "../isa/vectors_avx2.h"
