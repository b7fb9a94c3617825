// Every CPU kernel of the registry (except the oracle itself) against the fp64 oracle,
// forward and backward, over a table of shapes chosen to break tiled kernels: lengths
// that are not multiples of any tile (1, 3, 127, 1000), seqlen_q != seqlen_k both ways,
// fully masked rows, every mask, GQA and MQA, odd head dims, zero-length varlen
// sequences, padded strides, batch 0. A kernel registered with arch "cpu" joins here by
// itself (INSTANTIATE_TEST_SUITE_P over the registry).
//
// Work per case stays small (short sequences except one 1000-long per dtype) so the suite
// runs in seconds. Cases whose rows see only a few keys get many heads: the rule compares
// two maxima of rounding noise, and over a handful of elements that comparison is a coin
// toss for any real kernel (KernelHarness below measures it); over 32 heads it is not.
#include <gtest/gtest.h>

#include <set>

#include "common/registry.h"
#include "kernel_check.h"

namespace flashlab::test {
namespace {

constexpr DType kF32 = DType::kF32, kF16 = DType::kF16, kBF16 = DType::kBF16;

std::vector<Case> cpu_cases() {
  std::vector<Case> cs;
  auto add = [&](std::string name, const Problem& p) { cs.push_back({std::move(name), p}); };

  for (DType dt : {kF32, kF16, kBF16}) {
    const std::string t = std::string(to_string(dt)) + "_";
    add(t + "basic", dense(dt, 2, 64, 64, 2, 2, 64));
    add(t + "causal", dense(dt, 2, 96, 96, 2, 2, 64).make_causal());
    add(t + "seqlen1", dense(dt, 3, 1, 1, 2, 1, 32));
    add(t + "seqlen3_causal", dense(dt, 4, 3, 3, 8, 4, 40).make_causal());
    add(t + "seqlen127_hdim72", dense(dt, 1, 127, 127, 2, 1, 72));
    add(t + "gqa8to1", dense(dt, 1, 33, 45, 16, 2, 32));
    add(t + "varlen_zero_lengths_causal",
        varlen(dt, {5, 0, 17, 1, 0}, {7, 3, 0, 20, 0}, 4, 2, 64).make_causal());
    add(t + "sq_gt_sk_causal_masked_rows", dense(dt, 2, 70, 17, 8, 2, 32).make_causal());
    add(t + "softcap", dense(dt, 1, 80, 80, 2, 1, 64).cap(5.f));
  }
  add("fp32_seqlen1000_window", dense(kF32, 1, 1000, 1000, 1, 1, 32).window(100, 20));
  add("fp16_seqlen1000_causal", dense(kF16, 1, 1000, 1000, 1, 1, 64).make_causal());
  add("bf16_seqlen1000", dense(kBF16, 1, 1000, 1000, 1, 1, 32));
  add("bf16_seqlen1000_gqa_local_softcap",
      dense(kBF16, 1, 1000, 1000, 4, 2, 64).window(256, 0).cap(20.f));
  add("fp16_decode_sq1_sk1000_gqa", dense(kF16, 4, 1, 1000, 8, 2, 128));
  add("fp32_varlen_long", varlen(kF32, {1000, 1, 0, 300}, {1000, 700, 5, 0}, 2, 1, 64).make_causal());

  // seqlen_q != seqlen_k, both ways; bottom-right causal alignment.
  add("fp32_sq_lt_sk", dense(kF32, 2, 17, 130, 2, 2, 32));
  add("fp16_sq_lt_sk_causal", dense(kF16, 2, 17, 130, 2, 1, 64).make_causal());
  add("bf16_sq_gt_sk", dense(kBF16, 1, 130, 17, 2, 2, 64));
  add("fp32_seqlen1_q_many_k_causal", dense(kF32, 2, 1, 300, 4, 1, 64).make_causal());

  // Sliding windows (left, right), -1 unbounded; causal + window = causal-local.
  add("fp16_window_0_0", dense(kF16, 1, 70, 70, 2, 2, 64).window(0, 0));
  add("fp32_window_3_unbounded", dense(kF32, 1, 70, 70, 2, 2, 64).window(3, -1));
  add("bf16_window_unbounded_5", dense(kBF16, 1, 70, 70, 2, 2, 64).window(-1, 5));
  add("fp16_window_16_16_sq_lt_sk", dense(kF16, 1, 50, 90, 2, 1, 64).window(16, 16));
  add("fp32_window_2_1_sq_gt_sk", dense(kF32, 1, 60, 25, 2, 1, 32).window(2, 1));
  add("fp32_causal_window_8", dense(kF32, 1, 80, 80, 2, 2, 32).make_causal().window(8, -1));
  add("bf16_window_wider_than_keys", dense(kBF16, 1, 40, 20, 2, 2, 32).window(25, 30));

  // Softcap, alone and with everything else.
  add("fp32_softcap30", dense(kF32, 2, 64, 64, 2, 2, 64).cap(30.f));
  add("fp16_softcap2_causal_gqa", dense(kF16, 1, 100, 100, 4, 2, 64).cap(2.f).make_causal());
  add("bf16_softcap_window", dense(kBF16, 1, 64, 64, 2, 2, 64).cap(10.f).window(7, 2));

  // Heads: MQA, GQA 8:1 with causal; head dims 32..128 including odd ones.
  add("fp16_mqa_hdim128", dense(kF16, 2, 40, 40, 4, 1, 128));
  add("bf16_gqa8to1_causal_hdim96", dense(kBF16, 1, 64, 64, 8, 1, 96).make_causal());
  add("fp32_hdim40", dense(kF32, 1, 50, 50, 2, 2, 40));
  add("fp16_hdim72_causal", dense(kF16, 1, 50, 61, 2, 2, 72).make_causal());
  add("fp32_hdim128", dense(kF32, 1, 64, 64, 1, 1, 128));
  add("fp16_hdim64_dimv32", dense(kF16, 1, 40, 40, 2, 2, 64).dim_v(32));

  // Varlen: zero-length q and/or k sequences, masks, padded strides.
  add("fp32_varlen", varlen(kF32, {1, 64, 3}, {1, 80, 127}, 2, 1, 64));
  add("fp16_varlen_zero_q", varlen(kF16, {0, 0, 5}, {10, 4, 8}, 2, 2, 64));
  add("bf16_varlen_zero_k_causal",
      varlen(kBF16, {6, 9, 5, 3}, {0, 3, 2, 3}, 8, 4, 64).make_causal());
  add("fp16_varlen_window_softcap",
      varlen(kF16, {30, 1, 45}, {50, 7, 45}, 4, 2, 40).window(5, 3).cap(20.f));
  add("fp32_varlen_all_empty", varlen(kF32, {0, 0}, {0, 0}, 2, 2, 32));
  add("bf16_varlen_padded_gqa", varlen(kBF16, {20, 33}, {41, 9}, 4, 1, 64).padded({1, 8}));

  // Non-contiguous strides (padded seqlen, heads and head_dim).
  add("fp32_padded_strides", dense(kF32, 2, 33, 47, 4, 2, 64).padded({1, 3, 1, 8}));
  add("bf16_padded_causal_hdim128", dense(kBF16, 2, 50, 50, 2, 2, 128).padded({0, 0, 0, 16}).make_causal());

  // Empty problems: write nothing, or (no keys) out 0 and lse -inf, dq 0.
  add("fp16_batch0", dense(kF16, 0, 16, 16, 2, 2, 64));
  add("fp32_seqlen_k0", dense(kF32, 2, 5, 0, 2, 2, 32));
  add("fp32_seqlen_q0", dense(kF32, 2, 0, 5, 2, 2, 32));

  // Dropout: the oracle, the yardstick and the FA2 emulation draw one mask (dropout.h).
  add("fp32_dropout0.1_sq_lt_sk", dense(kF32, 1, 64, 80, 2, 2, 32).drop(0.1f, 1234));
  add("fp16_dropout0.17_causal_gqa", dense(kF16, 2, 70, 70, 4, 2, 64).make_causal().drop(0.17f, 0x5eed));
  add("bf16_dropout0.5_varlen_window_softcap",
      varlen(kBF16, {30, 1, 45}, {50, 7, 45}, 4, 2, 64).window(5, 3).cap(20.f).drop(0.5f, 77, 3));

  // Options: explicit scale, no LSE, thread counts.
  add("fp32_scale_0.3", dense(kF32, 1, 64, 64, 2, 2, 64).scaled(0.3f));
  add("fp16_scale_1_peaked", dense(kF16, 1, 64, 64, 2, 2, 64).scaled(1.f));
  add("bf16_no_lse", dense(kBF16, 1, 64, 64, 2, 2, 64).no_lse());
  add("fp32_one_thread", dense(kF32, 2, 65, 65, 2, 1, 64).threads(1).make_causal());
  add("fp16_three_threads", dense(kF16, 3, 33, 33, 3, 3, 32).threads(3));
  return cs;
}

class CpuKernelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuKernelTest, Forward) { run_suite(GetParam(), false, cpu_cases(), make_host_placement); }

TEST_P(CpuKernelTest, Backward) { run_suite(GetParam(), true, cpu_cases(), make_host_placement); }

INSTANTIATE_TEST_SUITE_P(Registry, CpuKernelTest, ::testing::ValuesIn(cpu_kernels_under_test()),
                         kernel_param_name);
// A build may hold no CPU kernel besides the oracle; then there is nothing to run here.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CpuKernelTest);

// The registry itself: what the tests and the benchmark iterate over must be coherent.
TEST(Registry, EntriesAreConsistent) {
  std::set<std::string_view> names;
  const auto entries = registry();
  ASSERT_EQ(entries.size(), kernels().size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const KernelEntry& e = entries[i];
    SCOPED_TRACE(std::string(e.info.name));
    EXPECT_FALSE(e.info.name.empty());
    EXPECT_NE(e.info.name, kAutoKernel);
    EXPECT_TRUE(names.insert(e.info.name).second) << "duplicate kernel name";
    EXPECT_FALSE(e.info.arch.empty());
    EXPECT_FALSE(e.info.summary.empty());
    EXPECT_EQ(e.info.name, kernels()[i].name);
    EXPECT_EQ(e.info.has_forward, e.run_fwd != nullptr) << "has_forward vs run_fwd";
    EXPECT_EQ(e.info.has_backward, e.run_bwd != nullptr) << "has_backward vs run_bwd";
    if (e.run_fwd) {
      EXPECT_NE(e.supports_fwd, nullptr);
    }
    if (e.run_bwd) {
      EXPECT_NE(e.supports_bwd, nullptr);
    }
    EXPECT_GE(e.auto_priority, 0);
  }
  EXPECT_TRUE(names.count("cpu_reference")) << "the oracle must always be registered";
}

// The harness on a kernel that is right by construction: cpu_reference run in the input
// dtype computes in fp64 and rounds once, so it must meet the rule on every case. If it
// does not, the yardstick is too strict (or the harness is broken), not the kernels.
TEST(KernelHarness, RoundedOracleMeetsTheRuleForward) {
  run_suite("cpu_reference", false, cpu_cases(), make_host_placement);
}

TEST(KernelHarness, RoundedOracleMeetsTheRuleBackward) {
  run_suite("cpu_reference", true, cpu_cases(), make_host_placement);
}

// The oracle's dropout mask is the policy's (GPU kernels get the same check on the device).
TEST(Dropout, OracleAppliesThePolicyMask) {
  check_dropout_mask("cpu_reference", DType::kBF16, make_host_placement);
}

// ... and on FlashAttention-2's own rounding (run_fa2_emulation): the rule must be within
// reach of a real kernel on every case, for any seed, or the suite would be flaky.
TEST(KernelHarness, Fa2RoundingMeetsTheRule) {
  FLASHLAB_SEED_TRACE();
  for (const Case& c : cpu_cases()) {
    const Problem& p = c.problem;
    SCOPED_TRACE("case '" + c.name + "': " + p.describe());
    std::mt19937_64 rng = rng_for("fa2 emulation/" + c.name);
    const Inputs in = make_inputs(p, rng);
    const Results oracle = run_reference_fp64(p, in, true);
    const Results lowp = run_lowp(p, in, true);
    const Results fa2 = run_fa2_emulation(p, in, true);
    auto rule = [&](const char* name, auto member) {
      EXPECT_TRUE(within_rule(name, max_abs_err(fa2.*member, oracle.*member),
                              max_abs_err(lowp.*member, oracle.*member)));
    };
    rule("out", &Results::out);
    rule("lse", &Results::lse);
    rule("dq", &Results::dq);
    rule("dk", &Results::dk);
    rule("dv", &Results::dv);
  }
}

}  // namespace
}  // namespace flashlab::test
