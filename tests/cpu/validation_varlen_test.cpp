// Validation of the varlen arguments: cu_seqlens (rank, dtype, device, contents) and
// max_seqlen, with zero-length sequences as valid edge cases.
#include "cpu/validation_fixture.h"

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashlab::test {
namespace {

TEST_F(VarlenValidationTest, ValidWithZeroLengthSequences) {
  ASSERT_OK(forward(vfwd()));
  EXPECT_TRUE(vout.written_exactly("out"));
  EXPECT_TRUE(vlse.written_exactly("lse"));
  // Sequence 2 has 3 queries and no keys: out 0, lse -inf.
  for (int64_t t = 2; t < 5; ++t)
    for (int h = 0; h < Hq; ++h) {
      EXPECT_EQ(vlse.get(h * 5 + t), -std::numeric_limits<double>::infinity());
      for (int d = 0; d < D; ++d) EXPECT_EQ(vout.get((t * Hq + h) * D + d), 0.0);
    }
}

TEST_F(VarlenValidationTest, CuSeqlensBothOrNeither) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_k = Tensor{};
  expect_varlen_rejected(a, {"cu_seqlens_q and cu_seqlens_k must both be given"});
}

TEST_F(VarlenValidationTest, VarlenTensorsHaveRank3) {
  ForwardArgs a = vfwd();
  a.q = q.view();  // [B, S, H, D] with cu_seqlens
  expect_varlen_rejected(a, {"q must have rank 3", "[total_q, heads_q, head_dim]"});
}

TEST_F(VarlenValidationTest, CuSeqlensRank) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_q.rank = 2;
  expect_varlen_rejected(a, {"cu_seqlens_q must have rank 1"});
}

TEST_F(VarlenValidationTest, CuSeqlensDtype) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_k.dtype = DType::kF32;
  expect_varlen_rejected(a, {"cu_seqlens_k.dtype must be int32"});
}

TEST_F(VarlenValidationTest, CuSeqlensDevice) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_q = on_cuda(a.maybe_cu_seqlens_q, 0x100000);
  expect_varlen_rejected(a, {"cu_seqlens_q must be on the device of q"});
}

TEST_F(VarlenValidationTest, CuSeqlensEmpty) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_q.shape[0] = 0;
  a.maybe_cu_seqlens_k.shape[0] = 0;
  expect_varlen_rejected(a, {"cu_seqlens_q must have batch + 1 >= 1 entries"});
}

TEST_F(VarlenValidationTest, CuSeqlensLengthsDiffer) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_k.shape[0] = 3;
  expect_varlen_rejected(a, {"cu_seqlens_q and cu_seqlens_k must have the same length"});
}

TEST_F(VarlenValidationTest, NegativeMaxSeqlen) {
  ForwardArgs a = vfwd();
  a.max_seqlen_q = -1;
  expect_varlen_rejected(a, {"max_seqlen_q must be >= 0"});
  a = vfwd();
  a.max_seqlen_k = -1;
  expect_varlen_rejected(a, {"max_seqlen_k must be >= 0"});
}

TEST_F(VarlenValidationTest, TotalTokensMismatch) {
  ForwardArgs a = vfwd();
  a.v.shape[0] = 4;
  expect_varlen_rejected(a, {"v.shape[0] (total_k) must be 5"});
  a = vfwd();
  a.out.shape[0] = 6;
  expect_varlen_rejected(a, {"out.shape[0] (total_q) must be 5"});
  a = vfwd();
  a.maybe_lse.shape[1] = 4;
  expect_varlen_rejected(a, {"lse.shape[1] (total_q) must be 5"});
}

TEST_F(VarlenValidationTest, CuSeqlensMustStartAtZero) {
  cu_q.assign({1, 2, 2, 5});
  expect_varlen_rejected(vfwd(), {"cu_seqlens_q[0] must be 0"});
}

TEST_F(VarlenValidationTest, CuSeqlensMustBeNonDecreasing) {
  cu_k.assign({0, 3, 1, 5});
  expect_varlen_rejected(vfwd(), {"cu_seqlens_k must be non-decreasing"});
}

TEST_F(VarlenValidationTest, SequenceLongerThanMaxSeqlen) {
  ForwardArgs a = vfwd();
  a.max_seqlen_k = 3;
  expect_varlen_rejected(a, {"cu_seqlens_k: sequence 1 has length 4 > max_seqlen_k = 3"});
}

// Messages name the arguments as the caller knows them (cu_seqlens_q, lse: the Python
// package's names, and the C++ fields' without the maybe_ of an optional), first thing.
TEST_F(VarlenValidationTest, MessagesUseTheCallersNames) {
  struct Case {
    const char* starts;
    void (*edit)(ForwardArgs&, HostTensor& cu_q);
  };
  const Case cases[] = {
      {"cu_seqlens_q[0] must be 0", [](ForwardArgs&, HostTensor& c) { c.assign({1, 2, 2, 5}); }},
      {"cu_seqlens_q[3] = 6 exceeds", [](ForwardArgs& a, HostTensor& c) { c.assign({0, 2, 2, 6}), a.max_seqlen_q = 4; }},
      {"cu_seqlens_k.dtype must be int32", [](ForwardArgs& a, HostTensor&) { a.maybe_cu_seqlens_k.dtype = DType::kF32; }},
      {"cu_seqlens_q and cu_seqlens_k must have the same length", [](ForwardArgs& a, HostTensor&) { a.maybe_cu_seqlens_k.shape[0] = 3; }},
      {"cu_seqlens_q and cu_seqlens_k must both be given", [](ForwardArgs& a, HostTensor&) { a.maybe_cu_seqlens_k = {}; }},
      {"lse.shape[1] (total_q) must be 5", [](ForwardArgs& a, HostTensor&) { a.maybe_lse.shape[1] = 4; }},
      {"lse overlaps cu_seqlens_k", [](ForwardArgs& a, HostTensor&) { a.maybe_lse.data = a.maybe_cu_seqlens_k.data; }},
  };
  for (const Case& c : cases) {
    cu_q.assign({0, 2, 2, 5});
    ForwardArgs a = vfwd();
    c.edit(a, cu_q);
    const Status s = forward(a);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.starts;
    EXPECT_EQ(s.message().rfind(c.starts, 0), 0u) << s.message();
    EXPECT_EQ(s.message().find("maybe_"), std::string::npos) << s.message();
  }
}

TEST_F(VarlenValidationTest, CuSeqlensBeyondPackedRows) {
  cu_q.assign({0, 2, 2, 6});
  ForwardArgs a = vfwd();
  a.max_seqlen_q = 4;
  expect_varlen_rejected(a, {"cu_seqlens_q[3] = 6 exceeds the 5 rows"});
}

TEST_F(VarlenValidationTest, AllSequencesEmptyIsValid) {
  cu_q.assign({0, 0, 0, 0});
  cu_k.assign({0, 0, 0, 0});
  HostTensor e_q(DType::kF32, {0, Hq, D}), e_k(DType::kF32, {0, Hkv, D}), e_o(DType::kF32, {0, Hq, D}),
      e_l(DType::kF32, {Hq, 0});
  e_o.poison();
  e_l.poison();
  ForwardArgs a = vfwd_with(e_q, e_k, e_k, e_o, e_l);
  a.max_seqlen_q = a.max_seqlen_k = 0;
  EXPECT_OK(forward(a));
  EXPECT_TRUE(e_o.untouched("out"));
  EXPECT_TRUE(e_l.untouched("lse"));
}

// ---- cu_seqlens on the device ------------------------------------------------------------------

// The varlen call with every tensor on the device at fake addresses, except the cu_seqlens
// views the caller passes.
ForwardArgs on_device(const ForwardArgs& varlen, Tensor cu_q, Tensor cu_k) {
  ForwardArgs a = to_cuda(varlen);
  a.maybe_cu_seqlens_q = cu_q;
  a.maybe_cu_seqlens_k = cu_k;
  return a;
}

// Without check_inputs, device cu_seqlens are not read (kernels clamp them); validation
// passes and cpu_reference, named, refuses the device tensors.
TEST_F(VarlenValidationTest, DeviceCuSeqlensAreNotReadByDefault) {
  const ForwardArgs a = on_device(vfwd(), on_cuda(cu_q.view(), 0x600000), on_cuda(cu_k.view(), 0x700000));
  std::string name;
  EXPECT_TRUE(status_is(select_kernel(a, &name), StatusCode::kUnsupported, {"CPU tensors only"}));
}

#if !FLASHLAB_WITH_CUDA
TEST_F(VarlenValidationTest, CheckInputsNeedsTheCudaRuntime) {
  ForwardArgs a = on_device(vfwd(), on_cuda(cu_q.view(), 0x600000), on_cuda(cu_k.view(), 0x700000));
  a.check_inputs = true;
  std::string name;
  EXPECT_TRUE(status_is(select_kernel(a, &name), StatusCode::kUnsupported,
                        {"check_inputs", "cu_seqlens_q", "no CUDA runtime"}));
}
#else
// With check_inputs, validation copies device cu_seqlens to the host and checks them as it
// checks host ones.
TEST_F(VarlenValidationTest, DeviceCuSeqlensAreCheckedOnRequest) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  void* mem = nullptr;
  ASSERT_EQ(cudaMalloc(&mem, 8 * sizeof(int32_t)), cudaSuccess);
  int32_t* d = static_cast<int32_t*>(mem);
  const int32_t host[8] = {0, 2, 2, 5, /* k, not non-decreasing: */ 0, 3, 1, 5};
  ASSERT_EQ(cudaMemcpy(d, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);
  const Tensor good = on_cuda(cu_q.view(), reinterpret_cast<uintptr_t>(d));
  const Tensor bad = on_cuda(cu_k.view(), reinterpret_cast<uintptr_t>(d + 4));
  ForwardArgs a = on_device(vfwd(), good, bad);
  std::string name;
  EXPECT_TRUE(status_is(select_kernel(a, &name), StatusCode::kUnsupported, {"CPU tensors only"}));
  a.check_inputs = true;
  EXPECT_TRUE(status_is(select_kernel(a, &name), StatusCode::kInvalidArgument,
                        {"cu_seqlens_k must be non-decreasing: [2] = 1 < [1] = 3"}));
  a.maybe_cu_seqlens_k = good;
  a.max_seqlen_k = 3;
  EXPECT_TRUE(status_is(select_kernel(a, &name), StatusCode::kUnsupported, {"CPU tensors only"}));
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}
#endif

}  // namespace
}  // namespace flashlab::test
