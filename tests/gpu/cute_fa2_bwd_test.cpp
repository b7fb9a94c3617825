// The tensor-core backwards beyond the registry suite (kernels_gpu_test.cpp runs every case of
// its table through them already): the deterministic mode of cute_fa2 and cute_fa3. Twenty backward runs with
// deterministic = true must give bitwise-equal dQ, dK and dV, on shapes where many key
// blocks add into each query row (GQA, causal, a ragged end, varlen with an empty
// sequence), and those gradients must pass docs/DESIGN.md's rule like the default mode's.
// dK and dV never go through atomics, so the two modes must agree on them bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/head_dims.h"
#include "gpu/gpu_fixture.h"
#include "kernel_check.h"

namespace flashlab::test {
namespace {

#if FLASHLAB_WITH_CUDA

constexpr int kRuns = 20;

struct Grads {
  std::vector<std::byte> dq, dk, dv;
};

void check_deterministic(const std::string& kernel, const std::string& name, const Problem& p) {
  SCOPED_TRACE(kernel + ", case '" + name + "': " + p.describe());
  if (!cuda::head_dim_built(p.head_dim)) {  // a build of some head dims (FLASHLAB_HEAD_DIMS)
    std::printf("[   NOTE   ] %s, case '%s' left out: head dim %d is not in this build\n", kernel.c_str(),
                name.c_str(), p.head_dim);
    return;
  }
  FLASHLAB_SEED_TRACE();
  std::mt19937_64 rng = rng_for(kernel + "/deterministic/" + name);
  Inputs in = make_inputs(p, rng);
  HostTensor out = make_out(p), lse = make_lse(p);
  HostTensor dq = make_like_q(p), dk = make_like_kv(p, p.head_dim),
             dv = make_like_kv(p, p.head_dim_v);
  DevicePlacement where;
  const Tensor q = where.place(in.q), k = where.place(in.k), v = where.place(in.v);
  const Tensor cu_q = where.place(in.cu_q), cu_k = where.place(in.cu_k);
  const Tensor out_d = where.place(out), lse_d = where.place(lse), dout_d = where.place(in.dout);
  ASSERT_TRUE(where.ok());

  ForwardArgs fa = forward_args(p, q, k, v, out_d, lse_d, cu_q, cu_k);
  fa.kernel = "auto";
  fa.stream = where.stream();
  size_t bytes = 0;
  ASSERT_OK(workspace_size(fa, &bytes));
  fa.workspace = bytes > 0 ? where.scratch(bytes) : nullptr;
  fa.workspace_bytes = bytes;
  ASSERT_OK(forward(fa));

  auto run_backward = [&](bool deterministic, Grads* g) {
    dq.poison();
    dk.poison();
    dv.poison();
    BackwardArgs a = backward_args(p, q, k, v, out_d, dout_d, lse_d, where.place(dq),
                                   where.place(dk), where.place(dv), cu_q, cu_k);
    a.kernel = kernel;
    a.stream = where.stream();
    a.deterministic = deterministic;
    size_t ws = 0;
    ASSERT_OK(workspace_size(a, &ws));
    a.workspace = ws > 0 ? where.scratch(ws) : nullptr;  // garbage-filled, as the API allows
    a.workspace_bytes = ws;
    ASSERT_OK(backward(a));
    ASSERT_TRUE(where.fetch(dq) && where.fetch(dk) && where.fetch(dv));
    EXPECT_TRUE(dq.written_exactly("dq"));
    EXPECT_TRUE(dk.written_exactly("dk"));
    EXPECT_TRUE(dv.written_exactly("dv"));
    *g = {dq.storage(), dk.storage(), dv.storage()};
  };

  Grads first;
  run_backward(true, &first);
  if (::testing::Test::HasFatalFailure()) return;
  // The deterministic gradients are right, not only reproducible.
  const Results oracle = run_reference_fp64(p, in, true);
  const Results lowp = run_lowp(p, in, true);
  ASSERT_FALSE(oracle.dq.empty());
  EXPECT_TRUE(within_rule("dq", max_abs_err(dq.to_f64(), oracle.dq), max_abs_err(lowp.dq, oracle.dq),
                          gradient_magnitude(oracle.dq, lowp.dq_terms), lowp.dq_from_out));
  EXPECT_TRUE(within_rule("dk", max_abs_err(dk.to_f64(), oracle.dk), max_abs_err(lowp.dk, oracle.dk),
                          gradient_magnitude(oracle.dk, lowp.dk_terms), lowp.dk_from_out));
  EXPECT_TRUE(within_rule("dv", max_abs_err(dv.to_f64(), oracle.dv), max_abs_err(lowp.dv, oracle.dv),
                          magnitude_of(oracle.dv)));

  for (int run = 1; run < kRuns; ++run) {
    Grads g;
    run_backward(true, &g);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_TRUE(g.dq == first.dq) << "dq differs bitwise from run 0 in run " << run;
    EXPECT_TRUE(g.dk == first.dk) << "dk differs bitwise from run 0 in run " << run;
    EXPECT_TRUE(g.dv == first.dv) << "dv differs bitwise from run 0 in run " << run;
  }

  Grads atomic;
  run_backward(false, &atomic);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(atomic.dk == first.dk) << "dk of the two modes differs";
  EXPECT_TRUE(atomic.dv == first.dv) << "dv of the two modes differs";
}

class CuteFa2BwdTest : public GpuTest {};

struct DeterministicCase {
  const char* name;
  Problem problem;
};

TEST_F(CuteFa2BwdTest, DeterministicIsBitwiseReproducible) {
  // 1000 queries × 1000 keys: 16 key blocks add into each of 16 query blocks; GQA 4:1.
  const DeterministicCase cases[] = {
      {"bf16_gqa4_causal_1000", dense(DType::kBF16, 2, 1000, 1000, 8, 2, 128).make_causal()},
      {"fp16_mqa_window_2000", dense(DType::kF16, 1, 300, 2000, 4, 1, 64).window(700, 200)},
      {"bf16_varlen_empty_hdim256", varlen(DType::kBF16, {300, 0, 517}, {700, 64, 517}, 4, 2, 256)}};
  for (const DeterministicCase& c : cases) check_deterministic("cute_fa2", c.name, c.problem);
}

// Why cute_fa3's backward cannot run here ("" when it can): the build has none, or the device
// is not sm_90.
std::string fa3_backward_missing() {
  bool built = false;
  for (const KernelInfo& k : kernels()) built = built || (k.name == "cute_fa3" && k.has_backward);
  if (!built) return "this build has no cute_fa3 backward";
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    ADD_FAILURE() << "the device's compute capability could not be read";  // an error, not a skip
    return "the device's compute capability could not be read";
  }
  return major == 9 ? "" : "cute_fa3 needs an sm_90 device (this one is sm_" + std::to_string(major) + "x)";
}

// cute_fa3's backward (head dims 64, 96 and 128): its dQ warp adds each query block's partial sums in
// a fixed key-block order (ascending, or descending under a causal mask). Needs an sm_90 device;
// elsewhere the test says why it skips.
TEST_F(CuteFa2BwdTest, Fa3DeterministicIsBitwiseReproducible) {
  if (const std::string why = fa3_backward_missing(); !why.empty()) GTEST_SKIP() << why;
  const DeterministicCase cases[] = {
      {"bf16_gqa4_causal_1000", dense(DType::kBF16, 2, 1000, 1000, 8, 2, 128).make_causal()},
      {"fp16_mqa_window_2000", dense(DType::kF16, 1, 300, 2000, 4, 1, 128).window(700, 200)},
      {"bf16_varlen_empty", varlen(DType::kBF16, {300, 0, 517}, {700, 64, 517}, 4, 2, 128)},
      {"fp16_causal_sq_gt_sk", dense(DType::kF16, 2, 1000, 300, 4, 4, 128).make_causal()},
      // More CTAs than SMs (16 key blocks × 16 heads × 4): the turns then span waves.
      {"bf16_causal_multiwave", dense(DType::kBF16, 4, 2048, 2048, 16, 16, 128).make_causal()},
      // Head dim 64: 128-row query blocks, dQ split between the warpgroups by rows.
      {"bf16_hdim64_gqa4_causal_1000", dense(DType::kBF16, 2, 1000, 1000, 8, 2, 64).make_causal()},
      {"fp16_hdim64_varlen_empty", varlen(DType::kF16, {300, 0, 517}, {700, 64, 517}, 4, 2, 64)},
      // Head dim 96: dQ split by columns, 48 per warpgroup.
      {"bf16_hdim96_gqa4_causal_1000", dense(DType::kBF16, 2, 1000, 1000, 8, 2, 96).make_causal()},
      {"fp16_hdim96_mqa_1000", dense(DType::kF16, 1, 1000, 1000, 4, 1, 96)}};
  for (const DeterministicCase& c : cases) check_deterministic("cute_fa3", c.name, c.problem);
}

// At head dims 192 and 256 cute_fa3's backward (the wide step) refuses the deterministic mode
// with the reason, and `auto` then picks cute_fa2's; without it cute_fa3 takes dense and
// varlen problems, with windows and softcap.
TEST_F(CuteFa2BwdTest, Fa3WideStepRefusesDeterministicAndAutoPicksCuteFa2) {
  if (const std::string why = fa3_backward_missing(); !why.empty()) GTEST_SKIP() << why;
  for (int d : {192, 256}) {
    if (!cuda::head_dim_built(d)) continue;
    const Problem problems[] = {
        dense(DType::kBF16, 1, 128, 128, 2, 1, d).make_causal(),
        varlen(DType::kBF16, {33, 0, 190}, {80, 9, 190}, 2, 1, d).window(17, 4).cap(20.f)};
    for (const Problem& p : problems) {
      SCOPED_TRACE("head dim " + std::to_string(d) + ": " + p.describe());
      std::mt19937_64 rng = rng_for("wide-refusal/" + std::to_string(d));
      Inputs in = make_inputs(p, rng);
      HostTensor out = make_out(p), lse = make_lse(p), dq = make_like_q(p), dk = make_like_kv(p, d),
                 dv = make_like_kv(p, d);
      DevicePlacement where;
      BackwardArgs a = backward_args(p, where.place(in.q), where.place(in.k), where.place(in.v),
                                     where.place(out), where.place(in.dout), where.place(lse),
                                     where.place(dq), where.place(dk), where.place(dv),
                                     where.place(in.cu_q), where.place(in.cu_k));
      ASSERT_TRUE(where.ok());
      a.deterministic = true;
      std::string name;
      a.kernel = "cute_fa3";
      const Status s = select_kernel(a, &name);
      EXPECT_TRUE(status_is(s, StatusCode::kUnsupported));
      EXPECT_NE(s.message().find("deterministic"), std::string::npos) << s.message();
      a.kernel = "auto";
      ASSERT_OK(select_kernel(a, &name));
      EXPECT_EQ(name, "cute_fa2");
      a.deterministic = false;  // and without it, cute_fa3 takes the call
      ASSERT_OK(select_kernel(a, &name));
      EXPECT_EQ(name, "cute_fa3");
    }
  }
}

#endif  // FLASHLAB_WITH_CUDA

}  // namespace
}  // namespace flashlab::test
