// Huge logits in the CPU kernels. With softmax_scale large enough (the API accepts any
// finite scale), scores leave the range where fp32 can hold them pre-scaled, and a row's LSE
// = m + log(l) rounds log(l) away. What must still hold:
//   - tied keys share the weight: n keys tied at the max get 1/n each (both kernels; the
//     oracle included, whose own probabilities must not come from a rounded LSE);
//   - cpu_flash's forward and backward agree with the oracle at any finite scale.
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
// Backward with dO = g: dV = g/2 for each key; dP = (Σg, 3Σg), D = dO·O = 2Σg, so
// dS = ±Σg/2 · scale, dK = dS · q = ∓Σg/2 · scale · q and dQ = dS₀k + dS₁k = 0.
class TiedHugeLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(TiedHugeLogits, ShareTheWeight) {
  constexpr int kD = 4;
  const double kScale = double(1e20f);
  const Problem p = dense(DType::kF32, 1, 1, 2, 1, 1, kD).scaled(1e20f);
  std::mt19937_64 rng = rng_for("TiedHugeLogits");
  Inputs in = make_inputs(p, rng);
  double g_sum = 0;
  for (int d = 0; d < kD; ++d) {
    in.q.set(d, 1.0);
    in.k.set(d, 1.0);
    in.k.set(kD + d, 1.0);
    in.v.set(d, 1.0);
    in.v.set(kD + d, 3.0);
    g_sum += in.dout.get(d);
  }
  const Results r = run_kernel(GetParam(), p, in, true);
  ASSERT_EQ(r.out.size(), size_t(kD));
  ASSERT_EQ(r.dk.size(), size_t(2 * kD));
  for (int d = 0; d < kD; ++d) EXPECT_NEAR(r.out[d], 2.0, 1e-6) << "out[" << d << "]";
  EXPECT_EQ(r.lse[0], double(float(kD * kScale))) << "LSE = 4e20 + log 2, which is 4e20 in fp32";
  const double tol = 1e-5 * kScale * (std::fabs(g_sum) + 1);
  for (int d = 0; d < kD; ++d) {
    const double g = in.dout.get(d);
    EXPECT_NEAR(r.dv[d], g / 2, 1e-6) << "dv[0][" << d << "]";
    EXPECT_NEAR(r.dv[kD + d], g / 2, 1e-6) << "dv[1][" << d << "]";
    EXPECT_NEAR(r.dq[d], 0.0, tol) << "dq[" << d << "]";
    EXPECT_NEAR(r.dk[d], -g_sum / 2 * kScale, tol) << "dk[0][" << d << "]";
    EXPECT_NEAR(r.dk[kD + d], g_sum / 2 * kScale, tol) << "dk[1][" << d << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, TiedHugeLogits, ::testing::Values("cpu_reference"),
                         kernel_param_name);

}  // namespace
}  // namespace flashlab::test
