/* machine/avx512.c -- posenc._machine's loops for avx512 (compiled with the ISA's flags). */
#include "machine.h"

#define VECTOR_TEMPLATE "../machine/machine_impl.h"
#include "../isa/vectors_avx512.h"
