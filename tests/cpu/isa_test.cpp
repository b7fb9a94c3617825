// cpu_flash's instruction-set variants (src/cpu/isa.h). The rest of the suite runs the
// variant the process picks (the highest this CPU runs); here every variant this CPU runs
// is checked in turn:
//   - each was compiled for the target its name says (the compiler's macros in its TU);
//   - each meets docs/DESIGN.md's rule forward and backward, through the public API, on
//     cases that reach the code the variants compile differently: micro-kernel row
//     remainders, padded head dims, the fp16/bf16 conversions, softcap's tanh, masks, GQA,
//     varlen and the split path of huge scales;
//   - each gives the baseline's results on inputs with NaN and Inf (masked keys whose V is
//     NaN, +inf scores): the same non-finite entries and finite values within fp32 noise;
//   - FLASHLAB_CPU_ISA's choice: no request gives the highest variant that runs, a lower
//     one is taken, one the CPU cannot run or that the build lacks is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/registry.h"
#include "cpu/isa.h"
#include "kernel_check.h"
#include "run_kernel.h"

namespace flashlab::test {
namespace {

using cpu::Isa;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Isa> runnable() {
  std::vector<Isa> v;
  for (Isa isa : cpu::kAllIsas)
    if (cpu::isa_runs_here(isa)) v.push_back(isa);
  return v;
}

bool compiled_for(Isa isa, const char* feature) {
  return std::string(cpu::flash_variant(isa)->compiled_for).find(std::string(" ") + feature) !=
         std::string::npos;
}

TEST(CpuFlashIsa, VariantsAreCompiledForTheirTargets) {
  ASSERT_FALSE(runnable().empty()) << "no variant runs here";
  EXPECT_TRUE(cpu::isa_runs_here(Isa::kBaseline) || cpu::isa_runs_here(Isa::kNative));
  for (Isa isa : cpu::kAllIsas) {
    if (!cpu::flash_variant(isa)) continue;
    SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ": " + cpu::flash_variant(isa)->compiled_for);
    // The baseline adds no flag to the compiler's default target, which this file has too.
    if (isa == Isa::kBaseline) {
#if defined(__AVX__)
      EXPECT_TRUE(compiled_for(isa, "avx"));
#else
      EXPECT_FALSE(compiled_for(isa, "avx")) << "the baseline must run on any x86-64 CPU";
#endif
    }
    if (isa == Isa::kAvx2) {
      EXPECT_TRUE(compiled_for(isa, "avx2") && compiled_for(isa, "fma"));
      EXPECT_FALSE(compiled_for(isa, "avx512f"));
    }
    if (isa == Isa::kAvx512) {
      for (const char* f : {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"})
        EXPECT_TRUE(compiled_for(isa, f)) << f;
    }
  }
  // `flashlab list` names the variant in use.
  const KernelInfo* k = find_kernel("cpu_flash");
  ASSERT_NE(k, nullptr);
  EXPECT_NE(std::string(k->summary).find(std::string(cpu::isa_name(cpu::active_isa())) + " variant"),
            std::string::npos)
      << k->summary;
}

std::vector<Case> isa_cases() {
  constexpr DType kF32 = DType::kF32, kF16 = DType::kF16, kBF16 = DType::kBF16;
  // One line per case: the rows are alike by design.
  return {
      {"fp32_rows_1_to_5_left", dense(kF32, 1, 131, 131, 4, 2, 64)},
      {"fp32_hdim40_causal", dense(kF32, 2, 77, 77, 2, 1, 40).make_causal()},
      {"fp16_hdim128_gqa", dense(kF16, 1, 200, 150, 8, 2, 128)},
      {"bf16_hdim72_window", dense(kBF16, 1, 150, 150, 4, 4, 72).window(20, 5)},
      {"fp32_softcap_causal", dense(kF32, 1, 160, 160, 4, 2, 64).cap(5.f).make_causal()},
      {"fp16_softcap_dimv32", dense(kF16, 1, 70, 90, 4, 2, 64).dim_v(32).cap(30.f)},
      {"bf16_varlen_causal", varlen(kBF16, {37, 0, 130}, {50, 9, 130}, 4, 2, 64).make_causal()},
      {"fp32_padded_strides", dense(kF32, 2, 33, 47, 4, 2, 64).padded({1, 3, 1, 8})},
      {"fp32_one_thread", dense(kF32, 1, 129, 129, 2, 1, 32).threads(1)},
  };
}

TEST(CpuFlashIsa, EachVariantMeetsTheRule) {
  for (Isa isa : runnable()) {
    SCOPED_TRACE(std::string("variant ") + cpu::isa_name(isa));
    const cpu::ScopedIsa use(isa);
    run_suite("cpu_flash", false, isa_cases(), make_host_placement);
    run_suite("cpu_flash", true, isa_cases(), make_host_placement);
  }
}

// Non-finite entries equal (NaN for NaN, the same infinity), finite ones within `rel` of the
// largest finite |want|.
void expect_same(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                 double rel) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  for (size_t e = 0; e < got.size(); ++e) {
    const bool same = std::isnan(want[e]) ? std::isnan(got[e])
                      : std::isinf(want[e]) ? got[e] == want[e]
                                            : std::fabs(got[e] - want[e]) <= rel * scale;
    ASSERT_TRUE(same) << what << "[" << e << "] = " << got[e] << ", the baseline's " << want[e];
  }
}

TEST(CpuFlashIsa, VariantsAgreeOnNonFiniteInputs) {
  FLASHLAB_SEED_TRACE();
  const Isa base = cpu::isa_runs_here(Isa::kBaseline) ? Isa::kBaseline : Isa::kNative;
  struct Poisoned {
    std::string name;
    Problem problem;
    bool value_nan;  // V row `key` NaN; else K row `key` +inf in column 0 with q[.][0] > 0
    int key;
    bool backward = true;
  };
  const std::vector<Poisoned> cases = {
      {"causal_value_nan", dense(DType::kF32, 1, 200, 200, 2, 1, 32).make_causal(), true, 150},
      {"window_value_nan_bf16", dense(DType::kBF16, 1, 200, 200, 2, 1, 64).window(16, 4), true, 100},
      {"causal_score_inf", dense(DType::kF32, 1, 200, 200, 2, 1, 32).make_causal(), false, 150},
      {"huge_scale", dense(DType::kF32, 1, 70, 150, 2, 1, 32).scaled(1e30f).make_causal(), true, 149,
       false},
  };
  for (const Poisoned& c : cases) {
    SCOPED_TRACE("case " + c.name + ": " + c.problem.describe());
    const Problem& p = c.problem;
    std::mt19937_64 rng = rng_for("isa/" + c.name);
    Inputs in = make_inputs(p, rng);
    const int Sk = p.seqlen_k, D = p.head_dim, Dv = p.head_dim_v;
    if (c.value_nan) {
      for (int d = 0; d < Dv; ++d) in.v.set(bshd(0, c.key, 0, d, Sk, p.heads_kv, Dv), kNaN);
    } else {
      for (int64_t e = 0; e < in.q.numel(); e += D) in.q.set(e, std::fabs(in.q.get(e)));
      in.k.set(bshd(0, c.key, 0, 0, Sk, p.heads_kv, D), kInf);
    }
    Results want;
    {
      const cpu::ScopedIsa use(base);
      want = run_kernel("cpu_flash", p, in, c.backward);
    }
    ASSERT_FALSE(want.out.empty());
    for (Isa isa : runnable()) {
      if (isa == base) continue;
      SCOPED_TRACE(std::string("variant ") + cpu::isa_name(isa));
      const cpu::ScopedIsa use(isa);
      const Results got = run_kernel("cpu_flash", p, in, c.backward);
      ASSERT_FALSE(got.out.empty());
      // fp32 noise of another summation order (FMA or not), or one ulp of fp16/bf16 rounding.
      const bool f32 = p.dtype == DType::kF32;
      expect_same("out", got.out, want.out, f32 ? 1e-5 : 1e-2);
      expect_same("lse", got.lse, want.lse, 1e-6);
      expect_same("dq", got.dq, want.dq, f32 ? 1e-4 : 1e-2);
      expect_same("dk", got.dk, want.dk, f32 ? 1e-4 : 1e-2);
      expect_same("dv", got.dv, want.dv, f32 ? 1e-5 : 1e-2);
    }
  }
}

bool runs_up_to_avx2(Isa isa) { return isa == Isa::kBaseline || isa == Isa::kAvx2; }
bool runs_all(Isa) { return true; }

TEST(CpuFlashIsa, RequestsAreTakenOrRefused) {
  Isa isa = Isa::kNative;
  if (!cpu::flash_variant(Isa::kAvx2)) {
    // A native or non-x86 build: one variant, taken with no request, refused by other names.
    EXPECT_EQ(cpu::choose_isa(nullptr, runs_all, &isa), "");
    EXPECT_NE(cpu::flash_variant(isa), nullptr);
    EXPECT_NE(cpu::choose_isa("avx2", runs_all, &isa).find("names no variant"), std::string::npos);
    return;
  }
  EXPECT_EQ(cpu::choose_isa(nullptr, runs_all, &isa), "");
  EXPECT_EQ(isa, Isa::kAvx512);
  EXPECT_EQ(cpu::choose_isa("", runs_up_to_avx2, &isa), "");
  EXPECT_EQ(isa, Isa::kAvx2);
  EXPECT_EQ(cpu::choose_isa("baseline", runs_all, &isa), "");
  EXPECT_EQ(isa, Isa::kBaseline);
  EXPECT_EQ(cpu::choose_isa("avx2", runs_up_to_avx2, &isa), "");
  EXPECT_EQ(isa, Isa::kAvx2);

  const std::string too_high = cpu::choose_isa("avx512", runs_up_to_avx2, &isa);
  EXPECT_EQ(isa, Isa::kAvx2) << "a refused request changes nothing";
  EXPECT_NE(too_high.find("FLASHLAB_CPU_ISA=avx512"), std::string::npos) << too_high;
  EXPECT_NE(too_high.find("cannot run"), std::string::npos) << too_high;
  EXPECT_NE(too_high.find("avx2 or lower"), std::string::npos) << too_high;
  for (const char* bad : {"native", "AVX2", "sse4"}) {
    const std::string why = cpu::choose_isa(bad, runs_all, &isa);
    EXPECT_NE(why.find("names no variant"), std::string::npos) << why;
    EXPECT_NE(why.find("baseline, avx2, avx512"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace flashlab::test
