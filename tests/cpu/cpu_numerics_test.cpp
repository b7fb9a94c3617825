// Huge logits in the CPU kernels. With softmax_scale large enough (a forward accepts any
// finite scale), scores leave the range where fp32 can hold them pre-scaled, and a row's
// LSE = m + log(l) rounds log(l) away. What must still hold:
//   - tied keys share the weight: n keys tied at the max get 1/n each (both kernels; the
//     oracle included, whose own probabilities must not come from a rounded LSE);
//   - cpu_flash's forward agrees with the oracle at any finite scale;
//   - a backward below fp64 is refused above kMaxBackwardScale (docs/DESIGN.md), where O's
//     and LSE's rounding times the scale would swamp the gradients; fp64 takes any scale.
// Inputs are multiples of 1/2 in [−1, 1], so every q·k is exact in fp32 and in fp64 and
// ties are real ties; the scale then makes the softmax pick the largest dot products.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernel_check.h"
#include "run_kernel.h"

namespace flashlab::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Two identical keys with v = 1 and v = 3 (every component), one query equal to them
// (all ones, head dim 4), scale 1e20: the logits tie at 4e20, so out = (1 + 3) / 2 = 2 and
// LSE = 4e20 + log 2.
// Backward with dO = g (fp64 only: below it the scale is refused): dV = g/2 for each key;
// dP = (Σg, 3Σg), D = dO·O = 2Σg, so dS = ±Σg/2 · scale, dK = dS · q = ∓Σg/2 · scale · q and
// dQ = dS₀k + dS₁k = 0.
class TiedHugeLogits : public ::testing::TestWithParam<std::string> {};

constexpr int kTiedD = 4;
constexpr float kTiedScale = 1e20f;

Inputs tied_inputs(const Problem& p, double* g_sum) {
  std::mt19937_64 rng = rng_for("TiedHugeLogits");
  Inputs in = make_inputs(p, rng);
  *g_sum = 0;
  for (int d = 0; d < kTiedD; ++d) {
    in.q.set(d, 1.0);
    in.k.set(d, 1.0);
    in.k.set(kTiedD + d, 1.0);
    in.v.set(d, 1.0);
    in.v.set(kTiedD + d, 3.0);
    *g_sum += in.dout.get(d);
  }
  return in;
}

TEST_P(TiedHugeLogits, ShareTheWeight) {
  const Problem p = dense(DType::kF32, 1, 1, 2, 1, 1, kTiedD).scaled(kTiedScale);
  double g_sum = 0;
  const Results r = run_kernel(GetParam(), p, tied_inputs(p, &g_sum), false);
  ASSERT_EQ(r.out.size(), size_t(kTiedD));
  for (int d = 0; d < kTiedD; ++d) EXPECT_NEAR(r.out[d], 2.0, 1e-6) << "out[" << d << "]";
  EXPECT_EQ(r.lse[0], double(float(kTiedD * double(kTiedScale))))
      << "LSE = 4e20 + log 2, which is 4e20 in fp32";
}

INSTANTIATE_TEST_SUITE_P(Cpu, TiedHugeLogits, ::testing::Values("cpu_reference", "cpu_flash"),
                         kernel_param_name);

TEST(TiedHugeLogitsFp64, GradientsOfTheAverage) {
  constexpr int kD = kTiedD;
  const double kScale = double(kTiedScale);
  const Problem p = dense(DType::kF64, 1, 1, 2, 1, 1, kD).scaled(kTiedScale);
  double g_sum = 0;
  const Inputs in = tied_inputs(p, &g_sum);
  const Results r = run_kernel("cpu_reference", p, in, true);
  ASSERT_EQ(r.dk.size(), size_t(2 * kD));
  const double tol = 1e-9 * kScale * (std::fabs(g_sum) + 1);
  for (int d = 0; d < kD; ++d) {
    const double g = in.dout.get(d);
    EXPECT_NEAR(r.dv[d], g / 2, 1e-6) << "dv[0][" << d << "]";
    EXPECT_NEAR(r.dv[kD + d], g / 2, 1e-6) << "dv[1][" << d << "]";
    EXPECT_NEAR(r.dq[d], 0.0, tol) << "dq[" << d << "]";
    EXPECT_NEAR(r.dk[d], -g_sum / 2 * kScale, tol) << "dk[0][" << d << "]";
    EXPECT_NEAR(r.dk[kD + d], g_sum / 2 * kScale, tol) << "dk[1][" << d << "]";
  }
}

// Below fp64 a backward takes |softmax_scale| <= kMaxBackwardScale and names the argument
// otherwise; the bound itself is accepted, and fp64 takes any finite scale.
TEST(HugeScaleBackward, RefusedBelowFp64) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64})
    for (float scale : {kMaxBackwardScale, -kMaxBackwardScale, 1025.f, -1e30f, 3.4e38f}) {
      const Problem p = dense(dt, 1, 3, 5, 1, 1, 8).scaled(scale);
      SCOPED_TRACE(p.describe());
      std::mt19937_64 rng = rng_for("HugeScaleBackward");
      const Inputs in = make_inputs(p, rng);
      HostTensor out = make_out(p), lse = make_lse(p), dq = make_like_q(p),
                 dk = make_like_kv(p, p.head_dim), dv = make_like_kv(p, p.head_dim_v);
      BackwardArgs a = backward_args(p, in.q.view(), in.k.view(), in.v.view(), out.view(),
                                     in.dout.view(), lse.view(), dq.view(), dk.view(), dv.view(),
                                     in.cu_q.view(), in.cu_k.view());
      a.kernel = "cpu_reference";
      size_t bytes = 0;
      const Status s = workspace_size(a, &bytes);
      if (dt == DType::kF64 || std::fabs(scale) <= kMaxBackwardScale) {
        EXPECT_TRUE(status_is(s, StatusCode::kOk));
      } else {
        EXPECT_TRUE(status_is(s, StatusCode::kInvalidArgument));
        EXPECT_NE(s.message().find("softmax_scale must be within [-1024, 1024] in a backward"),
                  std::string::npos)
            << s.message();
      }
    }
}

// q and k drawn from {−1, −1/2, 0, 1/2, 1}: dot products are exact, and over 32 dims many
// keys of a row tie at its maximum.
void fill_halves(HostTensor* t, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(-2, 2);
  for (int64_t e = 0; e < t->numel(); ++e) t->set(e, 0.5 * pick(rng));
}

struct HugeCase {
  std::string name;
  Problem problem;
};

std::vector<HugeCase> huge_cases() {
  constexpr DType kF32 = DType::kF32;
  const Problem base = dense(kF32, 2, 70, 150, 2, 1, 32);
  return {
      // The largest finite fp32 scales: scale·log2(e) overflows fp32 above 2.36e38.
      {"fwd_2.4e38", Problem(base).scaled(2.4e38f)},
      {"fwd_2.4e38_causal", Problem(base).scaled(2.4e38f).make_causal()},
      {"fwd_3.4e38_window", Problem(base).scaled(3.4e38f).window(40, 10)},
      {"fwd_2.4e38_softcap", Problem(base).scaled(2.4e38f).cap(5.f)},
      {"fwd_minus_1e30", Problem(base).scaled(-1e30f)},
      {"fwd_bf16_1e30_causal", Problem(base).scaled(1e30f).make_causal().with_dtype(DType::kBF16)},
  };
}

// Each |got − want| ≤ rel · max |want| over the tensor, or with `per_element` ≤ rel · |want|
// + 1e-5 (LSE, whose rows differ by orders of magnitude). An infinite want needs the same
// infinity.
void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                  double rel, bool per_element = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  for (size_t e = 0; e < got.size(); ++e) {
    if (std::isinf(want[e]) && got[e] == want[e]) continue;
    const double allowed = per_element ? rel * std::fabs(want[e]) + 1e-5 : rel * scale;
    ASSERT_TRUE(std::isfinite(got[e]) && std::fabs(got[e] - want[e]) <= allowed)
        << what << "[" << e << "] = " << got[e] << ", want " << want[e] << " (allowed " << allowed << ")";
  }
}

TEST(CpuFlashNumerics, HugeScalesMatchTheOracle) {
  FLASHLAB_SEED_TRACE();
  for (const HugeCase& c : huge_cases()) {
    SCOPED_TRACE("case " + c.name + ": " + c.problem.describe());
    std::mt19937_64 rng = rng_for("HugeScale." + c.name);
    Inputs in = make_inputs(c.problem, rng);
    fill_halves(&in.q, rng);
    fill_halves(&in.k, rng);
    const Results want = run_reference_fp64(c.problem, in, false);
    const Results got = run_kernel("cpu_flash", c.problem, in, false);
    ASSERT_FALSE(want.out.empty() || got.out.empty());
    const double rel = c.problem.dtype == DType::kF32 ? 1e-5 : 1e-2;
    expect_close("out", got.out, want.out, rel);
    expect_close("lse", got.lse, want.lse, 1e-6, true);
  }
}

}  // namespace
}  // namespace flashlab::test
