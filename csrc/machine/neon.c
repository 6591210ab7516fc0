/* machine/neon.c -- posenc._machine's loops for neon (compiled with the ISA's flags). */
#include "machine.h"

#define VECTOR_TEMPLATE "../machine/machine_impl.h"
#include "../isa/vectors_neon.h"
