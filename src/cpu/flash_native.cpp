// cpu_flash compiled for the building machine (FLASHLAB_CPU_NATIVE=ON: -march=native on the whole library).
// The source is flash_variant.inc; isa.h says how a variant is picked.
#if FLASHLAB_CPU_NATIVE
#define FLASHLAB_CPU_ISA native
#include "cpu/flash_variant.inc"
#endif
