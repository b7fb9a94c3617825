// Validation of the sizes that would overflow the kernels' arithmetic: element counts, a
// view's extent, the (batch, head) task count, max_seqlen against the packed totals, the
// problem's workspace bound, and the thread count. Every rule here is a case where a
// call that wraps some 32- or 64-bit product could otherwise pass validation and read or
// write outside its buffers. Views that must never be touched sit on null or fake
// addresses, and the tests ask select_kernel before forward, so that a rule that fails to
// hold fails the test instead of running a kernel on them.
#include "cpu/validation_fixture.h"

namespace flashlab::test {
namespace {

constexpr int64_t k2e30 = int64_t(1) << 30;

// select_kernel refuses `a` with kInvalidArgument and a message holding `names`.
::testing::AssertionResult refused(const ForwardArgs& a,
                                   std::initializer_list<std::string_view> names) {
  std::string name;
  return status_is(select_kernel(a, &name), StatusCode::kInvalidArgument, names);
}

// ---- element counts -------------------------------------------------------------------------

TEST(TensorTest, NumelSaturatesInsteadOfWrapping) {
  // 2^30 · 2^30 · 16 = 2^64, which wraps to 0 in int64 arithmetic.
  const Tensor t = Tensor::contiguous(nullptr, DType::kF32, {k2e30, k2e30, 16, 1});
  EXPECT_EQ(t.numel(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Tensor::contiguous(nullptr, DType::kF32, {k2e30, 0, 16, 1}).numel(), 0);
  EXPECT_EQ(Tensor::contiguous(nullptr, DType::kF32, {3, 5, 7}).numel(), 105);
  EXPECT_EQ(Tensor{}.numel(), 0);
}

TEST_F(ValidationTest, ElementCountAbove63Bits) {
  // Null data: the null check must not be fooled by a count that wraps to 0.
  ForwardArgs a = fwd();
  a.q = a.k = a.v = a.out = Tensor::contiguous(nullptr, DType::kF32, {k2e30, k2e30, 16, 1});
  a.maybe_lse = Tensor{};
  ASSERT_TRUE(refused(a, {"q "}));
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"q has more than 2^63 - 1 elements"});
}

// ---- extents ------------------------------------------------------------------------------

TEST_F(ValidationTest, ExtentAbove63Bits) {
  // q [4, 1, 1, 1] with a batch stride of 2^62 + 1 over one float: the last element would
  // sit 3·(2^62 + 1) elements past the first.
  HostTensor one(DType::kF32, {1});
  HostTensor k4(DType::kF32, {4, 1, 1, 1}), v4(DType::kF32, {4, 1, 1, 1}), o4(DType::kF32, {4, 1, 1, 1});
  ForwardArgs a = fwd_with(k4, k4, v4, o4);
  a.q = Tensor::strided(one.data(), DType::kF32, {4, 1, 1, 1}, {(int64_t(1) << 62) + 1, 1, 1, 1});
  ASSERT_TRUE(refused(a, {"q spans more than 2^63 - 1 bytes"}));
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"q spans more than 2^63 - 1 bytes"});
  // 2^62 + 1 elements fit int64, their 4·(2^62 + 1) bytes do not.
  a.q = Tensor::strided(one.data(), DType::kF32, {4, 1, 1, 1}, {0, 0, 0, 1});
  a.k = Tensor::strided(k4.data(), DType::kF32, {3, 1, 1, 1}, {int64_t(1) << 61, 1, 1, 1});
  a.q.shape[0] = a.v.shape[0] = a.out.shape[0] = 3;
  ASSERT_TRUE(refused(a, {"k spans more than 2^63 - 1 bytes"}));
}

TEST_F(ValidationTest, ExtentRunsPastTheAddressSpace) {
  ForwardArgs a = fwd();
  a.q.data = reinterpret_cast<void*>(~uintptr_t(0) - 64);
  ASSERT_TRUE(refused(a, {"q spans more than 2^63 - 1 bytes or runs past the end"}));
}

// ---- task counts -----------------------------------------------------------------------------

TEST_F(ValidationTest, BatchTimesHeadsAbove31Bits) {
  // batch 65536 × heads 65536 over one float each (zero strides): 2^32 (batch, head) tasks.
  HostTensor one(DType::kF32, {1});
  ForwardArgs a = fwd();
  a.q = a.k = a.v = a.out =
      Tensor::strided(one.data(), DType::kF32, {65536, 1, 65536, 1}, {0, 0, 0, 1});
  a.maybe_lse = Tensor{};
  ASSERT_TRUE(refused(a, {"batch·heads_q = 65536·65536 = 4294967296 exceeds 2^31 - 1"}));
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"batch·heads_q"});
  BackwardArgs b = bwd();
  b.q = b.k = b.v = b.out = b.dout = b.dq = b.dk = b.dv = a.q;
  b.lse = Tensor::strided(one.data(), DType::kF32, {65536, 65536, 1}, {0, 0, 1});
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"batch·heads_q"});
}

// ---- max_seqlen and the packed totals ------------------------------------------------------------

TEST_F(ValidationTest, MaxSeqlenAboveTheTotalsIsReadAsTheTotals) {
  // One token, head dim 1: the caller's max_seqlen over-estimates by ~2^31. FlashAttention
  // accepts an over-estimate; the workspace must be the one of the real maxima (1 and 1).
  HostTensor cu(DType::kI32, {2}), q1(DType::kF32, {1, 1, 1}), k1(DType::kF32, {1, 1, 1}),
      v1(DType::kF32, {1, 1, 1}), o1(DType::kF32, {1, 1, 1});
  cu.assign({0, 1});
  q1.assign({0.5});
  k1.assign({-2});
  v1.assign({3.25});
  o1.poison();
  ForwardArgs a = fwd_with(q1, k1, v1, o1);
  a.maybe_cu_seqlens_q = a.maybe_cu_seqlens_k = cu.view();
  a.max_seqlen_q = a.max_seqlen_k = 1;
  size_t exact = 0, huge = 0;
  ASSERT_OK(workspace_size(a, &exact));
  a.max_seqlen_q = 1073764992;
  a.max_seqlen_k = 2147437306;
  ASSERT_OK(workspace_size(a, &huge));
  ASSERT_EQ(huge, exact) << "the workspace of max_seqlen_q/k must be bounded by total_q/k";
  ASSERT_OK(forward(a));
  EXPECT_EQ(o1.get(0), 3.25);  // one key: out = v
}

// ---- the problem's size ---------------------------------------------------------------------------

TEST_F(ValidationTest, ProblemAbove64BitWorkspaces) {
  // seqlen_q = seqlen_k = 2^31 - 1 with zero-stride q/k/v (fake device addresses, never
  // read): the O(seqlen_q·seqlen_k) workspace of the reference and the naive rung is
  // 2^62 scores, 2^65 bytes in fp64.
  constexpr int64_t S = INT32_MAX;
  ForwardArgs a = fwd_on_cuda();
  for (Tensor* t : {&a.q, &a.k, &a.v})
    *t = on_cuda(Tensor::strided(nullptr, DType::kF16, {1, S, 1, 8}, {0, 0, 0, 1}), 0x100000);
  a.out = on_cuda(Tensor::contiguous(nullptr, DType::kF16, {1, S, 1, 8}), 0x200000);
  a.maybe_lse = Tensor{};
  ASSERT_TRUE(refused(a, {"the problem is too large", "2^63 - 1"}));
}

// ---- threads ---------------------------------------------------------------------------------------

TEST_F(ValidationTest, ThreadCountIsBounded) {
  // OpenMP aborts the process when it cannot create a thread: 2000 threads under a limit of
  // 200 processes ended in "libgomp: Thread creation failed" instead of a Status.
  ForwardArgs a = fwd();
  a.num_threads = kMaxThreads;  // runs min(tasks, kMaxThreads) threads
  EXPECT_OK(forward(a));
  for (int n : {kMaxThreads + 1, 2000, INT32_MAX}) {
    SCOPED_TRACE(n);
    a.num_threads = n;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"num_threads must be in [0, 1024]"});
  }
  BackwardArgs b = bwd();
  b.num_threads = kMaxThreads + 1;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"num_threads"});
}

}  // namespace
}  // namespace flashlab::test
