// cpu_flash for the compiler's default target (x86-64: SSE2), with no extra flag.
// The source is flash_variant.inc; isa.h says how a variant is picked.
#if !FLASHLAB_CPU_NATIVE
#define FLASHLAB_CPU_ISA baseline
#include "cpu/flash_variant.inc"
#endif
