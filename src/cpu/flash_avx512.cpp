// cpu_flash compiled for x86-64-v4 (AVX-512 F, BW, DQ, VL): CMakeLists.txt adds -march=x86-64-v4.
// The source is flash_variant.inc; isa.h says how a variant is picked.
#if FLASHLAB_CPU_DISPATCH
#define FLASHLAB_CPU_ISA avx512
#include "cpu/flash_variant.inc"
#endif
