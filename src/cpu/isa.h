// cpu_flash's instruction sets. Its hot loops (the tile GEMMs of gemm.h, exp2 and the
// softmax, the element conversions) vectorize for whatever the compiler targets, so one
// compilation cannot be both portable and fast. The library is compiled for the baseline
// (x86-64: SSE2), so it loads on any x86-64 CPU, and cpu_flash itself is compiled several
// times from one source (flash_variant.inc), each copy in its own namespace:
//
//   variant    target                                    file
//   baseline   x86-64 (SSE2)                             flash_baseline.cpp
//   avx2       x86-64-v3 (AVX2, FMA, BMI1/2, F16C)       flash_avx2.cpp    (-march=x86-64-v3)
//   avx512     x86-64-v4 (AVX-512 F, BW, DQ, VL)         flash_avx512.cpp  (-march=x86-64-v4)
//
// The registry entry (flash.cpp) runs the highest variant the CPU supports, picked once per
// process with __builtin_cpu_supports. FLASHLAB_CPU_ISA=baseline|avx2|avx512 asks for one
// (to test or compare a lower one); a variant the CPU cannot run, or a name this build has
// no variant for, is refused: cpu_flash then supports no call, and says why.
// FLASHLAB_CPU_NATIVE=ON compiles one variant instead, "native" (-march=native: this
// machine only). A non-x86 build has the baseline alone (the compiler's default target).
//
// Why a namespace per variant: an inline function compiled under -march=x86-64-v4 in one
// translation unit and under the baseline in another is one symbol, and the linker keeps
// one copy for every caller, so a baseline caller could run AVX-512 instructions. Everything
// a variant compiles (flash_common.h, gemm.h, the forward and the backward) is in
// flashlab::cpu::<variant>; what it includes from outside (common/*.h, the standard
// library) is inlined into it at -O3. CTest's isa.symbols (tests/isa_symbols.cmake) checks
// it on every build that compiles variants: `nm -C --defined-only` of each flash_<isa>.cpp
// object lists global and weak symbols in flashlab::cpu::<isa> only, the rest local
// (OpenMP's outlined regions, the anonymous namespaces).
#pragma once

#include <cstddef>
#include <string>

#include "common/params.h"

namespace flashlab::cpu {

enum class Isa { kBaseline, kAvx2, kAvx512, kNative };
inline constexpr Isa kAllIsas[] = {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512, Isa::kNative};

// "baseline", "avx2", "avx512", "native": the names FLASHLAB_CPU_ISA takes.
const char* isa_name(Isa isa);
// The target in words, e.g. "x86-64-v3 (AVX2, FMA)".
const char* isa_target(Isa isa);

// One compiled copy of cpu_flash.
struct FlashVariant {
  // The instruction-set macros the copy was compiled with (e.g. "sse2 avx avx2 fma"): what
  // the compiler really targeted, which the tests compare with the variant's name.
  const char* compiled_for;
  size_t (*fwd_workspace)(const FwdParams& p);
  Status (*fwd)(const FwdParams& p);
  size_t (*bwd_workspace)(const BwdParams& p);
  Status (*bwd)(const BwdParams& p);
};

// The copy compiled for `isa`; nullptr when this build has none.
const FlashVariant* flash_variant(Isa isa);
// Whether this build has a copy for `isa` and this CPU can run it.
bool isa_runs_here(Isa isa);

// The variant FLASHLAB_CPU_ISA = `request` picks, given which ones `runs` says run: with
// no request (nullptr or ""), the highest that runs. Returns "" and sets *isa, or says why
// the request is refused (*isa unchanged).
std::string choose_isa(const char* request, bool (*runs)(Isa), Isa* isa);

// The process's choice, made on first use from FLASHLAB_CPU_ISA and this CPU: the variant
// cpu_flash runs, and "" or why FLASHLAB_CPU_ISA was refused.
Isa active_isa();
const std::string& isa_refusal();

// Tests: cpu_flash runs `isa` (which must run here) while this object lives, whatever
// FLASHLAB_CPU_ISA says. Not for concurrent use with calls to cpu_flash.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  int previous_;
};

}  // namespace flashlab::cpu
