// cpu_flash's variants and the choice among them (isa.h). CMakeLists.txt decides which
// variants a build has: FLASHLAB_CPU_DISPATCH (x86-64, the default) adds avx2 and avx512 to
// the baseline; FLASHLAB_CPU_NATIVE replaces them all with native.
#include "cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace flashlab::cpu {

#if FLASHLAB_CPU_NATIVE
namespace native { const FlashVariant& variant(); }
#else
namespace baseline { const FlashVariant& variant(); }
#endif
#if FLASHLAB_CPU_DISPATCH
namespace avx2 { const FlashVariant& variant(); }
namespace avx512 { const FlashVariant& variant(); }
#endif

namespace {

// Each variant's name and target, in Isa's order.
struct IsaWords {
  const char* name;
  const char* target;
};
constexpr IsaWords kWords[] = {
#if defined(__x86_64__)
    {"baseline", "x86-64 (SSE2)"},
#else
    {"baseline", "the compiler's default target"},
#endif
    {"avx2", "x86-64-v3 (AVX2, FMA)"},
    {"avx512", "x86-64-v4 (AVX-512)"},
    {"native", "this machine (-march=native)"},
};
static_assert(std::size(kWords) == std::size(kAllIsas));

}  // namespace

const char* isa_name(Isa isa) { return kWords[int(isa)].name; }
const char* isa_target(Isa isa) { return kWords[int(isa)].target; }

const FlashVariant* flash_variant(Isa isa) {
  switch (isa) {
#if FLASHLAB_CPU_NATIVE
    case Isa::kNative: return &native::variant();
#else
    case Isa::kBaseline: return &baseline::variant();
#endif
#if FLASHLAB_CPU_DISPATCH
    case Isa::kAvx2: return &avx2::variant();
    case Isa::kAvx512: return &avx512::variant();
#endif
    default: return nullptr;
  }
}

namespace {

// Whether the CPU has what `isa`'s compiler target may emit. GCC 12 and later name the
// x86-64 levels directly; otherwise the features that define them (every CPU with AVX2,
// FMA and BMI2 also has the rest of x86-64-v3: F16C, LZCNT, MOVBE). Both check the OS
// saves the wider registers, not only CPUID.
bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::kBaseline:
    case Isa::kNative:  // compiled for the building machine: it is the user's to run there
      return true;
#if defined(__x86_64__)
    case Isa::kAvx2:
      __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
      return __builtin_cpu_supports("x86-64-v3");
#else
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
#endif
    case Isa::kAvx512:
      __builtin_cpu_init();
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
      return __builtin_cpu_supports("x86-64-v4");
#else
      return cpu_has(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#endif
#endif
    default:
      return false;
  }
}

std::string compiled_list() {
  std::string s;
  for (Isa isa : kAllIsas)
    if (flash_variant(isa)) s += std::string(s.empty() ? "" : ", ") + isa_name(isa);
  return s;
}

struct Choice {
  Isa isa = Isa::kBaseline;
  std::string refusal;
};

const Choice& process_choice() {
  static const Choice c = [] {
    Choice r;
    choose_isa(nullptr, isa_runs_here, &r.isa);  // never refused: the fallback
    r.refusal = choose_isa(std::getenv("FLASHLAB_CPU_ISA"), isa_runs_here, &r.isa);
    return r;
  }();
  return c;
}

std::atomic<int> g_forced{-1};  // a ScopedIsa's variant, or -1

}  // namespace

bool isa_runs_here(Isa isa) { return flash_variant(isa) != nullptr && cpu_has(isa); }

std::string choose_isa(const char* request, bool (*runs)(Isa), Isa* isa) {
  if (request == nullptr || *request == '\0') {
    for (Isa c : kAllIsas)  // in increasing order: the last that runs wins
      if (flash_variant(c) && runs(c)) *isa = c;
    return "";
  }
  for (Isa c : kAllIsas) {
    if (!flash_variant(c) || std::strcmp(request, isa_name(c)) != 0) continue;
    if (runs(c)) {
      *isa = c;
      return "";
    }
    Isa best = *isa;
    choose_isa(nullptr, runs, &best);
    return std::string("FLASHLAB_CPU_ISA=") + request + " asks for cpu_flash's " + isa_target(c) +
           " variant, which this CPU cannot run; unset it, or ask for " + isa_name(best) +
           " or lower (this build has " + compiled_list() + ")";
  }
  return std::string("FLASHLAB_CPU_ISA=") + request + " names no variant of cpu_flash; this build has " +
         compiled_list();
}

Isa active_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced >= 0 ? Isa(forced) : process_choice().isa;
}

const std::string& isa_refusal() {
  static const std::string none;
  return g_forced.load(std::memory_order_relaxed) >= 0 ? none : process_choice().refusal;
}

ScopedIsa::ScopedIsa(Isa isa) : previous_(g_forced.exchange(int(isa))) {}
ScopedIsa::~ScopedIsa() { g_forced.store(previous_); }

}  // namespace flashlab::cpu
