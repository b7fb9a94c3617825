// The harness checks itself: a test helper that always passes would make every kernel
// test pass with it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <random>
#include <string_view>
#include <limits>

#include "test_util.h"

namespace flashlab::test {
namespace {

TEST(TestUtil, PaddedStridesKeepTheLastDimContiguous) {
  HostTensor t(DType::kF16, {2, 3, 4, 5}, {0, 1, 0, 8});
  EXPECT_EQ(t.stride(), (std::vector<int64_t>{4 * 4 * 13, 4 * 13, 13, 1}));
  EXPECT_FALSE(t.contiguous());
  const Tensor v = t.view();
  EXPECT_EQ(v.rank, 4);
  EXPECT_EQ(v.stride[2], 13);
  EXPECT_EQ(v.shape[3], 5);
  // Logical element (1, 2, 3, 4) sits at 1·208 + 2·52 + 3·13 + 4.
  EXPECT_EQ(t.offset(((1 * 3 + 2) * 4 + 3) * 5 + 4), 208 + 104 + 39 + 4);
  // Varlen rank 3: the pad list aligns to the trailing dims.
  HostTensor u(DType::kF32, {7, 2, 6}, {0, 1, 8});
  EXPECT_EQ(u.stride(), (std::vector<int64_t>{3 * 14, 14, 1}));
}

TEST(TestUtil, PoisonAndWrittenChecks) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    SCOPED_TRACE(to_string(dt));
    HostTensor t(dt, {2, 3, 2, 4}, {0, 0, 1, 4});
    t.poison();
    EXPECT_FALSE(t.written_exactly("t"));
    EXPECT_TRUE(t.padding_untouched("t"));
    for (int64_t i = 0; i + 1 < t.numel(); ++i) t.set(i, 1.0);
    EXPECT_FALSE(t.written_exactly("t")) << "one element left unwritten";
    t.set(t.numel() - 1, -2.0);
    EXPECT_TRUE(t.written_exactly("t"));
    // A write just past the view (into the trailing canary) is caught.
    std::byte* end = static_cast<std::byte*>(t.data()) + (t.offset(t.numel() - 1) + 1) * dtype_size(dt);
    *end = std::byte{0};
    EXPECT_FALSE(t.written_exactly("t"));
  }
  // A write before the view (into the leading canary) is caught too.
  HostTensor e(DType::kF32, {0, 4, 2, 8});
  e.poison();
  EXPECT_TRUE(e.written_exactly("empty"));
  static_cast<float*>(e.data())[-1] = 0.f;
  EXPECT_FALSE(e.written_exactly("empty"));
}

TEST(TestUtil, RandomFillIsNonzeroAndVaried) {
  FLASHLAB_SEED_TRACE();
  std::mt19937_64 rng = rng_for("fill");
  HostTensor t(DType::kBF16, {1, 64, 2, 32});
  t.fill_random(rng);
  double lo = 1e9, hi = -1e9;
  for (double x : t.to_f64()) {
    ASSERT_NE(x, 0.0);
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_LT(lo, -1.0);
  EXPECT_GT(hi, 1.0);
  // The same name gives the same stream: a failing case reproduces from its seed.
  std::mt19937_64 a = rng_for("same"), b = rng_for("same"), c = rng_for("other");
  EXPECT_EQ(a(), b());
  EXPECT_NE(rng_for("same")(), c());
}

TEST(TestUtil, MaxAbsErrTreatsInfinitiesAndNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(max_abs_err({1.0, -inf, 3.0}, {1.5, -inf, 3.0}).value, 0.5);
  EXPECT_EQ(max_abs_err({1.0, -inf}, {1.0, -inf}).value, 0.0);
  EXPECT_EQ(max_abs_err({1.0, 0.0}, {1.0, -inf}).value, inf);
  EXPECT_EQ(max_abs_err({std::nan("")}, {1.0}).value, inf);
  EXPECT_EQ(max_abs_err({1.0}, {1.0, 2.0}).value, inf) << "size mismatch";
  const MaxError e = max_abs_err({0.0, 2.0, 5.0}, {0.0, 1.0, 5.5});
  EXPECT_EQ(e.index, 1);
  EXPECT_TRUE(within_rule("x", MaxError{2e-5}, MaxError{1e-5}));
  EXPECT_FALSE(within_rule("x", MaxError{4e-5}, MaxError{1e-5}));
  EXPECT_FALSE(within_rule("x", MaxError{inf}, MaxError{inf}));
}

// The yardstick must be close to the oracle (else the rule passes anything) and, in
// fp16/bf16, measurably away from it (else the rule would demand the impossible).
TEST(TestUtil, LowPrecisionPathTracksTheOracle) {
  FLASHLAB_SEED_TRACE();
  const Problem shapes[] = {
      dense(DType::kF32, 2, 40, 50, 4, 2, 32).make_causal(),
      dense(DType::kF32, 1, 30, 20, 2, 1, 16).window(3, 2).cap(4.f),
      varlen(DType::kF32, {5, 0, 17}, {9, 4, 0}, 2, 2, 24).make_causal(),
      dense(DType::kF32, 1, 25, 25, 2, 2, 16).dim_v(8).scaled(0.7f),
  };
  for (const Problem& shape : shapes) {
    double prev_err = -1;
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      Problem p = shape;
      p.dtype = dt;
      SCOPED_TRACE(p.describe());
      std::mt19937_64 rng = rng_for("yardstick " + p.describe());
      const Inputs in = make_inputs(p, rng);
      const Results oracle = run_reference_fp64(p, in, true);
      const Results lowp = run_lowp(p, in, true);
      const std::vector<double>* pairs[][2] = {{&lowp.out, &oracle.out}, {&lowp.lse, &oracle.lse},
                                               {&lowp.dq, &oracle.dq},   {&lowp.dk, &oracle.dk},
                                               {&lowp.dv, &oracle.dv}};
      const char* names[] = {"out", "lse", "dq", "dk", "dv"};
      double worst = 0;
      for (int i = 0; i < 5; ++i) {
        const MaxError e = max_abs_err(*pairs[i][0], *pairs[i][1]);
        const double cap = dt == DType::kF32 ? 1e-5 : yardstick_cap(dt, *pairs[i][1]);
        EXPECT_LE(e.value, cap) << names[i] << " " << describe(e);
        worst = std::max(worst, e.value);
      }
      if (dt != DType::kF32) {
        EXPECT_GT(worst, 1e-4) << "the yardstick rounds nothing?";
      }
      EXPECT_GT(worst, prev_err) << "fp32 < fp16 < bf16 error order";
      prev_err = worst;
    }
  }
}

// The input on which the GPU suite's old yardstick check fired (fa2_simt_bwd's backward,
// case bf16_hdim128_growing_keys_softcap, FLASHLAB_TEST_SEED=13624713663102183911): a
// softcapped row of 512 keys whose gradients cancel. The yardstick rounded to bf16 strays
// from the oracle by more than yardstick_cap there, although it computes the same attention;
// the same code in fp32 (what kernel_check.cpp now checks) stays within 1e-4 of the values'
// size, as fp32 rounding guarantees.
TEST(TestUtil, YardstickCheckHoldsWhereLongRowsCancel) {
  const uint64_t seed = 13624713663102183911ull;
  const std::string_view name = "fa2_simt_bwd/backward/bf16_hdim128_growing_keys_softcap";
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32),
                    uint32_t(std::hash<std::string_view>{}(name))};
  std::mt19937_64 rng(seq);
  Problem p = dense(DType::kBF16, 1, 128, 512, 2, 1, 128).growing_keys(3.f).cap(30.f);
  p.with_lse = true;
  const Inputs in = make_inputs(p, rng);
  const Results oracle = run_reference_fp64(p, in, true);
  const Results lowp = run_lowp(p, in, true);
  Problem p32 = p;
  p32.dtype = DType::kF32;
  const Results fp32 = run_lowp(p32, in, true);
  const std::vector<double>* grads[][3] = {{&oracle.dq, &lowp.dq, &fp32.dq},
                                           {&oracle.dk, &lowp.dk, &fp32.dk},
                                           {&oracle.dv, &lowp.dv, &fp32.dv}};
  double worst_ratio = 0;
  for (const auto& g : grads) {
    const double cap = yardstick_cap(DType::kBF16, *g[0]);
    worst_ratio = std::max(worst_ratio, max_abs_err(*g[1], *g[0]).value / cap);
    EXPECT_LE(max_abs_err(*g[2], *g[0]).value, yardstick_cap(DType::kF32, *g[0]));
  }
  std::cout << "  bf16 yardstick error / old cap: " << worst_ratio << std::endl;
}

TEST(TestUtil, StatusIsNamesTheMismatch) {
  const Status s(StatusCode::kInvalidArgument, "q.dtype must be fp16");
  EXPECT_TRUE(status_is(s, StatusCode::kInvalidArgument, {"q.dtype"}));
  EXPECT_FALSE(status_is(s, StatusCode::kInvalidArgument, {"k.dtype"}));
  EXPECT_FALSE(status_is(s, StatusCode::kUnsupported));
  EXPECT_TRUE(status_is(Status{}, StatusCode::kOk));
}

}  // namespace
}  // namespace flashlab::test
