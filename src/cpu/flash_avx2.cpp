// cpu_flash compiled for x86-64-v3 (AVX2, FMA, BMI1/2, F16C): CMakeLists.txt adds -march=x86-64-v3.
// The source is flash_variant.inc; isa.h says how a variant is picked.
#if FLASHLAB_CPU_DISPATCH
#define FLASHLAB_CPU_ISA avx2
#include "cpu/flash_variant.inc"
#endif
