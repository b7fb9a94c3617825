// Validation of the scalar options, kernel selection and the workspace, and the valid edge
// cases where there is nothing (or only zeros) to write.
#include "cpu/validation_fixture.h"

namespace flashlab::test {
namespace {

// ---- scalar options ------------------------------------------------------------------------------

TEST_F(ValidationTest, NonFiniteScale) {
  for (float s : {kNaN, kInfF, -kInfF}) {
    SCOPED_TRACE(s);
    ForwardArgs a = fwd();
    a.softmax_scale = s;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"softmax_scale must be finite"});
    BackwardArgs b = bwd();
    b.softmax_scale = s;
    expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"softmax_scale must be finite"});
  }
}

TEST_F(ValidationTest, NegativeWindowOtherThanMinusOne) {
  ForwardArgs a = fwd();
  a.window_left = -2;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"window_left must be -1 (unbounded) or >= 0"});
  a = fwd();
  a.window_right = -7;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"window_right must be -1 (unbounded) or >= 0"});
  BackwardArgs b = bwd();
  b.window_left = INT32_MIN;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"window_left"});
}

TEST_F(ValidationTest, NegativeOrNonFiniteSoftcap) {
  for (float c : {-1.f, -1e-30f, kNaN, kInfF}) {
    SCOPED_TRACE(c);
    ForwardArgs a = fwd();
    a.softcap = c;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"softcap must be finite and >= 0"});
  }
}

TEST_F(ValidationTest, DropoutOutsideZeroToOne) {
  for (float d : {-0.1f, 1.f, 1.5f, kNaN}) {
    SCOPED_TRACE(d);
    ForwardArgs a = fwd();
    a.dropout_p = d;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"dropout_p must be in [0, 1)"});
  }
}

// A kernel without dropout refuses the call by name; auto passes it to one that has it.
TEST_F(ValidationTest, DropoutNeedsAKernelThatTakesIt) {
  ForwardArgs a = fwd();
  a.dropout_p = 0.2f;
  a.kernel = "cpu_flash";
  std::string name;
  EXPECT_TRUE(status_is(select_kernel(a, &name), StatusCode::kUnsupported,
                        {"kernel 'cpu_flash'", "dropout_p > 0 is not supported"}));
  a.kernel = kAutoKernel;
  EXPECT_OK(select_kernel(a, &name));
  EXPECT_EQ(name, "cpu_reference");
}

TEST_F(ValidationTest, NegativeThreadCount) {
  ForwardArgs a = fwd();
  a.num_threads = -1;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"num_threads must be >= 0"});
}

// ---- kernel selection --------------------------------------------------------------------------------

TEST_F(ValidationTest, UnknownKernel) {
  ForwardArgs a = fwd();
  a.kernel = "no_such_kernel";
  const Status s = forward(a);
  EXPECT_TRUE(status_is(s, StatusCode::kNotFound, {"'no_such_kernel' is not in this build", "known kernels:"}));
  for (const KernelInfo& k : kernels())
    EXPECT_NE(s.message().find(std::string(k.name)), std::string::npos) << "lists " << k.name;
  expect_fwd_rejected(a, StatusCode::kNotFound, {"no_such_kernel"});
  BackwardArgs b = bwd();
  b.kernel = "no_such_kernel";
  expect_bwd_rejected(b, StatusCode::kNotFound, {"no_such_kernel"});
}

TEST_F(ValidationTest, NamedKernelThatDoesNotSupportTheCall) {
  // cpu_reference refuses calls whose O(seqlen²) workspace exceeds the caller's limit.
  ForwardArgs a = fwd();
  a.quadratic_workspace_limit = 16;
  expect_fwd_rejected(a, StatusCode::kUnsupported,
                      {"kernel 'cpu_reference' does not support this call:", "quadratic_workspace_limit"});
  BackwardArgs b = bwd();
  b.quadratic_workspace_limit = 16;
  expect_bwd_rejected(b, StatusCode::kUnsupported,
                      {"kernel 'cpu_reference' does not support this call:", "quadratic_workspace_limit"});
  // ... and tensors it cannot reach.
  ForwardArgs c = fwd_on_cuda();
  expect_fwd_rejected(c, StatusCode::kUnsupported, {"cpu_reference", "CPU tensors only"});
}

TEST_F(ValidationTest, NamedKernelWithoutThatPass) {
  for (const KernelEntry& e : registry()) {
    if (e.run_fwd && e.run_bwd) continue;
    SCOPED_TRACE(std::string(e.info.name));
    if (!e.run_fwd) {
      ForwardArgs a = fwd();
      a.kernel = e.info.name;
      const std::string want = std::string(e.info.name).append("' has no forward pass");
      expect_fwd_rejected(a, StatusCode::kUnsupported, {want});
    }
    if (!e.run_bwd) {
      BackwardArgs b = bwd();
      b.kernel = e.info.name;
      const std::string want = std::string(e.info.name).append("' has no backward pass");
      expect_bwd_rejected(b, StatusCode::kUnsupported, {want});
    }
    return;
  }
  GTEST_SKIP() << "every kernel in this build has both passes";
}

TEST_F(ValidationTest, NoKernelSupportsTheCall) {
  // fp64 on the device: no GPU kernel takes fp64 and no CPU kernel takes device tensors.
  // Only the queries are asked: nothing may run on the fake addresses.
  ForwardArgs a = fwd_on_cuda();
  for (Tensor* t : {&a.q, &a.k, &a.v, &a.out}) t->dtype = DType::kF64;
  a.kernel = kAutoKernel;
  std::string name;
  const Status s = select_kernel(a, &name);
  EXPECT_TRUE(status_is(s, StatusCode::kUnsupported,
                        {"no kernel supports this forward call", "cpu_reference: runs on CPU tensors only"}));
  size_t bytes = 0;
  EXPECT_EQ(workspace_size(a, &bytes).message(), s.message());
}

TEST_F(ValidationTest, AutoPicksAKernelThatSupportsTheCall) {
  ForwardArgs a = fwd();
  a.kernel = kAutoKernel;
  std::string name;
  ASSERT_OK(select_kernel(a, &name));
  bool known = false;
  for (const KernelInfo& k : kernels()) known = known || k.name == name;
  EXPECT_TRUE(known) << name;
}

// ---- workspace ---------------------------------------------------------------------------------------

TEST_F(ValidationTest, WorkspaceTooSmall) {
  ForwardArgs a = fwd();
  size_t need = 0;
  ASSERT_OK(workspace_size(a, &need));
  ASSERT_GT(need, 0u) << "cpu_reference needs workspace";
  for (size_t have : {size_t(0), need - 1}) {
    a.workspace_bytes = have;
    out.poison();
    const Status s = forward(a);
    EXPECT_TRUE(status_is(s, StatusCode::kWorkspaceTooSmall,
                          {"workspace_bytes (" + std::to_string(have) + ")", std::to_string(need),
                           "cpu_reference"}));
    EXPECT_TRUE(out.untouched("out"));
  }
  BackwardArgs b = bwd();
  b.workspace_bytes = 0;
  poison_outputs();
  EXPECT_TRUE(status_is(backward(b), StatusCode::kWorkspaceTooSmall, {"workspace_bytes (0)"}));
  EXPECT_TRUE(dq.untouched("dq"));
}

TEST_F(ValidationTest, NullWorkspaceWithBytes) {
  ForwardArgs a = fwd();
  a.workspace = nullptr;
  a.workspace_bytes = size_t(1) << 30;
  out.poison();
  EXPECT_TRUE(status_is(forward(a), StatusCode::kInvalidArgument, {"workspace is null", "cpu_reference"}));
  EXPECT_TRUE(out.untouched("out"));
}

TEST_F(ValidationTest, MisalignedWorkspace) {
  ForwardArgs a = fwd();
  a.workspace = reinterpret_cast<char*>(workspace.data()) + 8;
  a.workspace_bytes -= 8;
  out.poison();
  EXPECT_TRUE(status_is(forward(a), StatusCode::kInvalidArgument,
                        {"workspace must be 16-byte aligned", "cpu_reference"}));
  EXPECT_TRUE(out.untouched("out"));
  BackwardArgs b = bwd();
  b.workspace = a.workspace;
  b.workspace_bytes = a.workspace_bytes;
  poison_outputs();
  EXPECT_TRUE(status_is(backward(b), StatusCode::kInvalidArgument, {"workspace must be 16-byte aligned"}));
  EXPECT_TRUE(dq.untouched("dq"));
}

TEST_F(ValidationTest, QueriesIgnoreTheWorkspaceFields) {
  ForwardArgs a = fwd();
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  size_t bytes = 0;
  std::string name;
  EXPECT_OK(workspace_size(a, &bytes));
  EXPECT_OK(select_kernel(a, &name));
  EXPECT_EQ(name, "cpu_reference");
}

// ---- valid edge cases --------------------------------------------------------------------------------

TEST_F(ValidationTest, BatchZeroIsValidAndWritesNothing) {
  HostTensor q0(DType::kF32, {0, Sq, Hq, D}), k0(DType::kF32, {0, Sk, Hkv, D}),
      v0(DType::kF32, {0, Sk, Hkv, D}), o0(DType::kF32, {0, Sq, Hq, D}), l0(DType::kF32, {0, Hq, Sq});
  ForwardArgs a = expect_empty_forward_ok(q0, k0, v0, o0, l0);
  // Null data is fine for empty tensors.
  a.q.data = a.k.data = a.v.data = a.out.data = a.maybe_lse.data = nullptr;
  EXPECT_OK(forward(a));
  HostTensor g0(DType::kF32, {0, Sq, Hq, D}), gk(DType::kF32, {0, Sk, Hkv, D}), gv(DType::kF32, {0, Sk, Hkv, D});
  g0.poison();
  const BackwardArgs b = bwd_with(q0, k0, v0, o0, o0, l0, g0, gk, gv);
  EXPECT_OK(backward(b));
  EXPECT_TRUE(g0.untouched("dq"));
}

TEST_F(ValidationTest, SeqlenQZeroIsValidAndWritesNothing) {
  HostTensor q0(DType::kF32, {B, 0, Hq, D}), o0(DType::kF32, {B, 0, Hq, D}), l0(DType::kF32, {B, Hq, 0});
  expect_empty_forward_ok(q0, k, v, o0, l0);
}

TEST_F(ValidationTest, SeqlenKZeroWritesZeroAndMinusInfinity) {
  HostTensor k0(DType::kF32, {B, 0, Hkv, D}), v0(DType::kF32, {B, 0, Hkv, D});
  out.poison();
  lse.poison();
  ForwardArgs a = fwd();
  a.k = k0.view();
  a.v = v0.view();
  ASSERT_OK(forward(a));
  EXPECT_TRUE(out.written_exactly("out"));
  for (double x : out.to_f64()) EXPECT_EQ(x, 0.0);
  for (double x : lse.to_f64()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
}

// No query rows but keys: the backward still owes dk = dv = 0 (every key's gradient is an
// empty sum), so the API runs the kernel; dq is empty.
TEST_F(ValidationTest, SeqlenQZeroBackwardZeroesKeyGradients) {
  HostTensor q0(DType::kF32, {B, 0, Hq, D}), o0(DType::kF32, {B, 0, Hq, D}), l0(DType::kF32, {B, Hq, 0});
  for (std::string_view kernel : {"cpu_reference", "cpu_flash"}) {
    SCOPED_TRACE(std::string(kernel));
    BackwardArgs b = bwd();
    b.kernel = kernel;
    b.q = b.dq = q0.view();
    b.out = b.dout = o0.view();
    b.lse = l0.view();
    b.dq.data = nullptr;
    poison_outputs();
    ASSERT_OK(backward(b));
    EXPECT_TRUE(dk.written_exactly("dk"));
    EXPECT_TRUE(dv.written_exactly("dv"));
    for (double x : dk.to_f64()) EXPECT_EQ(x, 0.0);
    for (double x : dv.to_f64()) EXPECT_EQ(x, 0.0);
  }
}

// A window bound means exactly that bound (docs/DESIGN.md, src/common/mask.h), also when it
// is wider than the keys: seqlen_q 4, seqlen_k 2, window (-1, 2). Row i sits on the diagonal
// key i - 2 and sees keys j <= i: row 0 sees key 0 only, rows 1..3 see both keys.
TEST(MaskSemanticsTest, RightBoundWiderThanTheKeysIsExact) {
  constexpr int Sq = 4, Sk = 2, D = 4;
  std::mt19937_64 rng = rng_for("exact window");
  HostTensor q(DType::kF32, {1, Sq, 1, D}), k(DType::kF32, {1, Sk, 1, D}), v(DType::kF32, {1, Sk, 1, D}),
      out(DType::kF32, {1, Sq, 1, D});
  for (HostTensor* t : {&q, &k, &v}) t->fill_random(rng);
  // The answer by hand, in double.
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> want(Sq * D);
  for (int i = 0; i < Sq; ++i) {
    const int keys = i == 0 ? 1 : 2;
    double s[2], m = -INFINITY, l = 0;
    for (int j = 0; j < keys; ++j) {
      s[j] = 0;
      for (int d = 0; d < D; ++d) s[j] += q.get(i * D + d) * k.get(j * D + d) * scale;
      m = std::max(m, s[j]);
    }
    for (int j = 0; j < keys; ++j) l += std::exp(s[j] - m);
    for (int d = 0; d < D; ++d) {
      want[i * D + d] = 0;
      for (int j = 0; j < keys; ++j) want[i * D + d] += std::exp(s[j] - m) / l * v.get(j * D + d);
    }
  }
  std::vector<double> workspace(size_t(1) << 16);
  for (std::string_view kernel : {"cpu_reference", "cpu_flash"}) {
    SCOPED_TRACE(std::string(kernel));
    ForwardArgs a;
    a.kernel = kernel;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.window_left = -1;
    a.window_right = 2;
    a.workspace = workspace.data();
    a.workspace_bytes = workspace.size() * sizeof(double);
    size_t need = 0;
    ASSERT_OK(workspace_size(a, &need));
    ASSERT_LE(need, a.workspace_bytes);
    out.poison();
    ASSERT_OK(forward(a));
    for (int d = 0; d < D; ++d) EXPECT_EQ(out.get(d), v.get(d)) << "row 0 = v[0], d = " << d;
    const MaxError e = max_abs_err(out.to_f64(), want);
    EXPECT_LE(e.value, 1e-6) << describe(e);
  }
}

}  // namespace
}  // namespace flashlab::test
