// One test per rule that src/api.cpp checks. Each breaks exactly one rule of an
// otherwise valid call and expects
//   - the StatusCode, and a message that names the argument,
//   - the same answer from forward/backward, workspace_size and select_kernel,
//   - nothing written: the poisoned outputs stay poisoned.
// Then the valid edge cases: batch 0, empty sequences, no keys at all.
//
// Rules that only GPU kernels need (16-byte alignment) are checked with Tensor views on
// Device::kCUDA over fake, never dereferenced addresses: validation rejects them before
// any kernel runs, so these tests need no GPU. They name cpu_reference as the kernel, so
// even a validation bug could not launch anything on those addresses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/registry.h"
#include "test_util.h"

namespace flashlab::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInfF = std::numeric_limits<float>::infinity();

// A fake device address: validation must never dereference it.
Tensor on_cuda(Tensor t, uintptr_t address) {
  t.data = reinterpret_cast<void*>(address);
  t.device = Device::kCUDA;
  return t;
}

class ValidationTest : public ::testing::Test {
 protected:
  // fp32, batch 2, seqlen_q 3, seqlen_k 4, heads 4 / 2 (GQA), head_dim 8.
  static constexpr int B = 2, Sq = 3, Sk = 4, Hq = 4, Hkv = 2, D = 8;
  HostTensor q{DType::kF32, {B, Sq, Hq, D}}, k{DType::kF32, {B, Sk, Hkv, D}},
      v{DType::kF32, {B, Sk, Hkv, D}}, out{DType::kF32, {B, Sq, Hq, D}},
      lse{DType::kF32, {B, Hq, Sq}}, dout{DType::kF32, {B, Sq, Hq, D}},
      dq{DType::kF32, {B, Sq, Hq, D}}, dk{DType::kF32, {B, Sk, Hkv, D}},
      dv{DType::kF32, {B, Sk, Hkv, D}};
  std::vector<double> workspace = std::vector<double>(size_t(1) << 16);

  void SetUp() override {
    std::mt19937_64 rng = rng_for("validation");
    for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_random(rng);
    // out and lse hold a real forward's values for the backward; they are inputs there.
    ASSERT_OK(forward(fwd()));
    poison_outputs();
  }

  void poison_outputs() {
    for (HostTensor* t : {&dq, &dk, &dv}) t->poison();
  }

  void common(CommonArgs* a) {
    a->kernel = "cpu_reference";
    a->workspace = workspace.data();
    a->workspace_bytes = workspace.size() * sizeof(double);
  }

  ForwardArgs fwd() {
    ForwardArgs a;
    common(&a);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.maybe_lse = lse.view();
    return a;
  }

  BackwardArgs bwd() {
    BackwardArgs a;
    common(&a);
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.dout = dout.view();
    a.lse = lse.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    return a;
  }

  // The forward refuses `a` with `code` naming `names`, writes nothing, and
  // workspace_size / select_kernel give the same answer.
  void expect_fwd_rejected(const ForwardArgs& a, StatusCode code,
                           std::initializer_list<std::string_view> names) {
    HostTensor out_before = out, lse_before = lse;
    const Status s = forward(a);
    EXPECT_TRUE(status_is(s, code, names));
    EXPECT_TRUE(out.storage() == out_before.storage()) << "forward wrote out on an error";
    EXPECT_TRUE(lse.storage() == lse_before.storage()) << "forward wrote lse on an error";
    size_t bytes = 12345;
    const Status ws = workspace_size(a, &bytes);
    EXPECT_EQ(ws.code(), s.code()) << "workspace_size: " << ws.message();
    EXPECT_EQ(ws.message(), s.message());
    EXPECT_EQ(bytes, 12345u) << "workspace_size wrote its result on an error";
    std::string name = "untouched";
    const Status sk = select_kernel(a, &name);
    EXPECT_EQ(sk.code(), s.code()) << "select_kernel: " << sk.message();
    EXPECT_EQ(sk.message(), s.message());
    EXPECT_EQ(name, "untouched") << "select_kernel wrote its result on an error";
  }

  void expect_bwd_rejected(const BackwardArgs& a, StatusCode code,
                           std::initializer_list<std::string_view> names) {
    poison_outputs();
    const Status s = backward(a);
    EXPECT_TRUE(status_is(s, code, names));
    EXPECT_TRUE(dq.untouched("dq"));
    EXPECT_TRUE(dk.untouched("dk"));
    EXPECT_TRUE(dv.untouched("dv"));
    size_t bytes = 12345;
    const Status ws = workspace_size(a, &bytes);
    EXPECT_EQ(ws.code(), s.code()) << "workspace_size: " << ws.message();
    EXPECT_EQ(ws.message(), s.message());
    std::string name;
    const Status sk = select_kernel(a, &name);
    EXPECT_EQ(sk.code(), s.code()) << "select_kernel: " << sk.message();
    EXPECT_EQ(sk.message(), s.message());
  }

  // The same call with every tensor on the device at distinct, 256-byte aligned fake
  // addresses (what cudaMalloc returns): valid as far as alignment goes.
  ForwardArgs fwd_on_cuda() {
    ForwardArgs a = fwd();
    a.q = on_cuda(a.q, 0x100000);
    a.k = on_cuda(a.k, 0x200000);
    a.v = on_cuda(a.v, 0x300000);
    a.out = on_cuda(a.out, 0x400000);
    a.maybe_lse = on_cuda(a.maybe_lse, 0x500000);
    a.workspace = nullptr;
    a.workspace_bytes = 0;
    return a;
  }
  BackwardArgs bwd_on_cuda() {
    BackwardArgs a = bwd();
    uintptr_t addr = 0x100000;
    for (Tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.lse, &a.dq, &a.dk, &a.dv}) {
      *t = on_cuda(*t, addr);
      addr += 0x100000;
    }
    a.workspace = nullptr;
    a.workspace_bytes = 0;
    return a;
  }
};

// ---- the baseline is valid ----------------------------------------------------------------

TEST_F(ValidationTest, BaselineIsValidAndWrites) {
  out.poison();
  lse.poison();
  ASSERT_OK(forward(fwd()));
  EXPECT_TRUE(out.written_exactly("out"));
  EXPECT_TRUE(lse.written_exactly("lse"));
  ASSERT_OK(backward(bwd()));
  EXPECT_TRUE(dq.written_exactly("dq"));
  EXPECT_TRUE(dk.written_exactly("dk"));
  EXPECT_TRUE(dv.written_exactly("dv"));
}

// ---- null pointers --------------------------------------------------------------------------

TEST_F(ValidationTest, NullDataPointer) {
  for (Tensor ForwardArgs::*t : {&ForwardArgs::q, &ForwardArgs::k, &ForwardArgs::v,
                                 &ForwardArgs::out, &ForwardArgs::maybe_lse}) {
    ForwardArgs a = fwd();
    (a.*t).data = nullptr;
    const std::string name = t == &ForwardArgs::q     ? "q"
                             : t == &ForwardArgs::k   ? "k"
                             : t == &ForwardArgs::v   ? "v"
                             : t == &ForwardArgs::out ? "out"
                                                      : "maybe_lse";
    SCOPED_TRACE(name);
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {name + ".data is null"});
  }
}

TEST_F(ValidationTest, NullDataPointerBackward) {
  for (auto [t, name] : {std::pair{&BackwardArgs::dout, "dout"}, std::pair{&BackwardArgs::lse, "lse"},
                         std::pair{&BackwardArgs::dq, "dq"}, std::pair{&BackwardArgs::dk, "dk"},
                         std::pair{&BackwardArgs::dv, "dv"}}) {
    SCOPED_TRACE(name);
    BackwardArgs a = bwd();
    (a.*t).data = nullptr;
    expect_bwd_rejected(a, StatusCode::kInvalidArgument, {std::string(name) + ".data is null"});
  }
}

TEST_F(ValidationTest, NullOutputPointerOfQueries) {
  size_t* no_bytes = nullptr;
  std::string* no_name = nullptr;
  EXPECT_TRUE(status_is(workspace_size(fwd(), no_bytes), StatusCode::kInvalidArgument, {"bytes"}));
  EXPECT_TRUE(status_is(workspace_size(bwd(), no_bytes), StatusCode::kInvalidArgument, {"bytes"}));
  EXPECT_TRUE(status_is(select_kernel(fwd(), no_name), StatusCode::kInvalidArgument, {"name"}));
  EXPECT_TRUE(status_is(select_kernel(bwd(), no_name), StatusCode::kInvalidArgument, {"name"}));
}

// ---- ranks, sizes, strides ----------------------------------------------------------------

TEST_F(ValidationTest, WrongRank) {
  ForwardArgs a = fwd();
  a.q.rank = 3;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"q must have rank 4"});
  a = fwd();
  a.q = Tensor{};  // absent
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"q must have rank 4", "got rank 0"});
  BackwardArgs b = bwd();
  b.dk.rank = 2;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"dk must have rank 4"});
}

TEST_F(ValidationTest, NegativeShape) {
  ForwardArgs a = fwd();
  a.k.shape[1] = -4;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"k.shape[1] is negative"});
}

TEST_F(ValidationTest, ShapeAbove32Bits) {
  ForwardArgs a = fwd();
  a.v.shape[1] = int64_t(1) << 31;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"v.shape[1] exceeds 2^31 - 1"});
}

TEST_F(ValidationTest, NegativeStride) {
  ForwardArgs a = fwd();
  a.out.stride[0] = -a.out.stride[0];
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out.stride[0] is negative"});
}

TEST_F(ValidationTest, NonContiguousLastDim) {
  for (Tensor ForwardArgs::*t : {&ForwardArgs::q, &ForwardArgs::k, &ForwardArgs::v, &ForwardArgs::out}) {
    ForwardArgs a = fwd();
    (a.*t).stride[3] = 2;
    const std::string name = t == &ForwardArgs::q ? "q" : t == &ForwardArgs::k ? "k" : t == &ForwardArgs::v ? "v" : "out";
    SCOPED_TRACE(name);
    expect_fwd_rejected(a, StatusCode::kInvalidArgument,
                        {name + " must be contiguous in its last dimension"});
  }
  BackwardArgs b = bwd();
  b.dout.stride[3] = 3;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"dout must be contiguous in its last dimension"});
}

// ---- dtypes and devices ---------------------------------------------------------------------

TEST_F(ValidationTest, UnsupportedDtype) {
  ForwardArgs a = fwd();
  for (Tensor* t : {&a.q, &a.k, &a.v, &a.out}) t->dtype = DType::kI32;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"q.dtype must be fp16, bf16, fp32 or fp64", "int32"});
}

TEST_F(ValidationTest, DtypeMismatch) {
  for (auto [t, name] : {std::pair{&ForwardArgs::k, "k"}, std::pair{&ForwardArgs::v, "v"},
                         std::pair{&ForwardArgs::out, "out"}}) {
    SCOPED_TRACE(name);
    ForwardArgs a = fwd();
    (a.*t).dtype = DType::kF16;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument,
                        {std::string(name) + ".dtype (fp16) must match q.dtype (fp32)"});
  }
  BackwardArgs b = bwd();
  b.dq.dtype = DType::kBF16;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"dq.dtype (bf16) must match q.dtype"});
}

TEST_F(ValidationTest, DeviceMismatch) {
  ForwardArgs a = fwd();
  a.v = on_cuda(a.v, 0x100000);
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"v is on cuda:0 but q is on cpu:0"});
  a = fwd();
  a.out.device_index = 1;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out is on cpu:1 but q is on cpu:0"});
  BackwardArgs b = bwd();
  b.dv = on_cuda(b.dv, 0x100000);
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"dv is on cuda:0"});
}

// ---- shapes that disagree -------------------------------------------------------------------

TEST_F(ValidationTest, BatchMismatch) {
  for (auto [t, name] : {std::pair{&ForwardArgs::k, "k"}, std::pair{&ForwardArgs::v, "v"},
                         std::pair{&ForwardArgs::out, "out"}}) {
    SCOPED_TRACE(name);
    ForwardArgs a = fwd();
    (a.*t).shape[0] = 1;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {std::string(name) + ".shape[0] (batch) must be 2"});
  }
}

TEST_F(ValidationTest, SeqlenMismatch) {
  ForwardArgs a = fwd();
  a.v.shape[1] = 3;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"v.shape[1] (seqlen_k) must be 4"});
  a = fwd();
  a.out.shape[1] = 4;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out.shape[1] (seqlen_q) must be 3"});
}

TEST_F(ValidationTest, HeadsMismatch) {
  ForwardArgs a = fwd();
  a.v.shape[2] = 1;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"v.shape[2] (heads_kv) must be 2"});
  a = fwd();
  a.out.shape[2] = 2;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out.shape[2] (heads_q) must be 4"});
}

TEST_F(ValidationTest, HeadDimMismatch) {
  ForwardArgs a = fwd();
  a.k.shape[3] = 4;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"k.shape[3] (head_dim) must be 8"});
  a = fwd();
  a.out.shape[3] = 4;  // head_dim_v comes from v
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out.shape[3] (head_dim_v) must be 8"});
}

TEST_F(ValidationTest, GradientShapeMismatch) {
  for (auto [t, name, like] : {std::tuple{&BackwardArgs::dout, "dout", "out"},
                               std::tuple{&BackwardArgs::dq, "dq", "q"},
                               std::tuple{&BackwardArgs::dk, "dk", "k"},
                               std::tuple{&BackwardArgs::dv, "dv", "v"}}) {
    SCOPED_TRACE(name);
    BackwardArgs a = bwd();
    (a.*t).shape[1] -= 1;
    expect_bwd_rejected(a, StatusCode::kInvalidArgument,
                        {std::string(name) + " [", std::string("must have the shape of ") + like});
  }
}

TEST_F(ValidationTest, LseShapeMismatch) {
  ForwardArgs a = fwd();
  a.maybe_lse.rank = 2;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse must have rank 3"});
  a = fwd();
  a.maybe_lse.shape[0] = 1;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse.shape[0] (batch) must be 2"});
  a = fwd();
  a.maybe_lse.shape[1] = 2;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse.shape[1] (heads_q) must be 4"});
  a = fwd();
  a.maybe_lse.shape[2] = 4;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse.shape[2] (seqlen_q) must be 3"});
  BackwardArgs b = bwd();
  b.lse.shape[2] = 2;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"lse.shape[2] (seqlen_q) must be 3"});
}

TEST_F(ValidationTest, LseDtypeAndDevice) {
  ForwardArgs a = fwd();
  a.maybe_lse.dtype = DType::kF64;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse.dtype must be fp32", "fp64"});
  a = fwd();
  a.maybe_lse = on_cuda(a.maybe_lse, 0x100000);
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse must be on the device of q"});
}

TEST_F(ValidationTest, BackwardRequiresLse) {
  BackwardArgs b = bwd();
  b.lse = Tensor{};
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"lse is required"});
}

// ---- heads and head dims ----------------------------------------------------------------------

TEST_F(ValidationTest, ZeroHeads) {
  ForwardArgs a = fwd();
  a.q.shape[2] = 0;
  a.out.shape[2] = 0;
  a.maybe_lse = Tensor{};
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"heads_q (q.shape[2]) must be >= 1"});
  a = fwd();
  a.k.shape[2] = 0;
  a.v.shape[2] = 0;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"heads_kv (k.shape[2]) must be >= 1"});
}

TEST_F(ValidationTest, HeadsQNotMultipleOfHeadsKv) {
  HostTensor k3(DType::kF32, {B, Sk, 3, D}), v3(DType::kF32, {B, Sk, 3, D});
  ForwardArgs a = fwd();
  a.k = k3.view();
  a.v = v3.view();
  expect_fwd_rejected(a, StatusCode::kInvalidArgument,
                      {"heads_q (4) must be a multiple of heads_kv (3)"});
}

TEST_F(ValidationTest, UnsupportedHeadDim) {
  // 0 and 1025 are outside what any kernel could take: the API refuses them itself.
  for (int64_t d : {int64_t(0), int64_t(1025)}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    HostTensor q1(DType::kF32, {1, 1, 1, d}), k1(DType::kF32, {1, 1, 1, d}),
        v1(DType::kF32, {1, 1, 1, 8}), o1(DType::kF32, {1, 1, 1, 8});
    ForwardArgs a = fwd();
    a.q = q1.view();
    a.k = k1.view();
    a.v = v1.view();
    a.out = o1.view();
    a.maybe_lse = Tensor{};
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"head_dim must be in [1, 1024]"});
    HostTensor q8(DType::kF32, {1, 1, 1, 8}), k8(DType::kF32, {1, 1, 1, 8}),
        vd(DType::kF32, {1, 1, 1, d}), od(DType::kF32, {1, 1, 1, d});
    a.q = q8.view();
    a.k = k8.view();
    a.v = vd.view();
    a.out = od.view();
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"head_dim_v must be in [1, 1024]"});
  }
}

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

// ---- varlen ------------------------------------------------------------------------------------

class VarlenValidationTest : public ValidationTest {
 protected:
  // Three sequences: q lengths 2, 0, 3 (total 5); k lengths 1, 4, 0 (total 5).
  HostTensor cu_q{DType::kI32, {4}}, cu_k{DType::kI32, {4}};
  HostTensor vq{DType::kF32, {5, Hq, D}}, vk{DType::kF32, {5, Hkv, D}}, vv{DType::kF32, {5, Hkv, D}},
      vout{DType::kF32, {5, Hq, D}}, vlse{DType::kF32, {Hq, 5}};

  void SetUp() override {
    ValidationTest::SetUp();
    cu_q.assign({0, 2, 2, 5});
    cu_k.assign({0, 1, 5, 5});
    std::mt19937_64 rng = rng_for("varlen validation");
    for (HostTensor* t : {&vq, &vk, &vv}) t->fill_random(rng);
    vout.poison();
    vlse.poison();
  }

  ForwardArgs vfwd() {
    ForwardArgs a = fwd();
    a.q = vq.view();
    a.k = vk.view();
    a.v = vv.view();
    a.out = vout.view();
    a.maybe_lse = vlse.view();
    a.maybe_cu_seqlens_q = cu_q.view();
    a.maybe_cu_seqlens_k = cu_k.view();
    a.max_seqlen_q = 3;
    a.max_seqlen_k = 4;
    return a;
  }

  void expect_varlen_rejected(const ForwardArgs& a, std::initializer_list<std::string_view> names) {
    vout.poison();
    vlse.poison();
    const Status s = forward(a);
    EXPECT_TRUE(status_is(s, StatusCode::kInvalidArgument, names));
    EXPECT_TRUE(vout.untouched("out"));
    EXPECT_TRUE(vlse.untouched("lse"));
    size_t bytes = 0;
    std::string name;
    EXPECT_EQ(workspace_size(a, &bytes).message(), s.message());
    EXPECT_EQ(select_kernel(a, &name).message(), s.message());
  }
};

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
  expect_varlen_rejected(a, {"maybe_cu_seqlens_q and maybe_cu_seqlens_k must both be given"});
}

TEST_F(VarlenValidationTest, VarlenTensorsHaveRank3) {
  ForwardArgs a = vfwd();
  a.q = q.view();  // [B, S, H, D] with cu_seqlens
  expect_varlen_rejected(a, {"q must have rank 3", "[total_q, heads_q, head_dim]"});
}

TEST_F(VarlenValidationTest, CuSeqlensRank) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_q.rank = 2;
  expect_varlen_rejected(a, {"maybe_cu_seqlens_q must have rank 1"});
}

TEST_F(VarlenValidationTest, CuSeqlensDtype) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_k.dtype = DType::kF32;
  expect_varlen_rejected(a, {"maybe_cu_seqlens_k.dtype must be int32"});
}

TEST_F(VarlenValidationTest, CuSeqlensDevice) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_q = on_cuda(a.maybe_cu_seqlens_q, 0x100000);
  expect_varlen_rejected(a, {"maybe_cu_seqlens_q must be on the device of q"});
}

TEST_F(VarlenValidationTest, CuSeqlensEmpty) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_q.shape[0] = 0;
  a.maybe_cu_seqlens_k.shape[0] = 0;
  expect_varlen_rejected(a, {"maybe_cu_seqlens_q must have batch + 1 >= 1 entries"});
}

TEST_F(VarlenValidationTest, CuSeqlensLengthsDiffer) {
  ForwardArgs a = vfwd();
  a.maybe_cu_seqlens_k.shape[0] = 3;
  expect_varlen_rejected(a, {"maybe_cu_seqlens_q and maybe_cu_seqlens_k must have the same length"});
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
  expect_varlen_rejected(a, {"maybe_lse.shape[1] (total_q) must be 5"});
}

TEST_F(VarlenValidationTest, CuSeqlensMustStartAtZero) {
  cu_q.assign({1, 2, 2, 5});
  expect_varlen_rejected(vfwd(), {"maybe_cu_seqlens_q[0] must be 0"});
}

TEST_F(VarlenValidationTest, CuSeqlensMustBeNonDecreasing) {
  cu_k.assign({0, 3, 1, 5});
  expect_varlen_rejected(vfwd(), {"maybe_cu_seqlens_k must be non-decreasing"});
}

TEST_F(VarlenValidationTest, SequenceLongerThanMaxSeqlen) {
  ForwardArgs a = vfwd();
  a.max_seqlen_k = 3;
  expect_varlen_rejected(a, {"maybe_cu_seqlens_k: sequence 1 has length 4 > max_seqlen_k = 3"});
}

TEST_F(VarlenValidationTest, CuSeqlensBeyondPackedRows) {
  cu_q.assign({0, 2, 2, 6});
  ForwardArgs a = vfwd();
  a.max_seqlen_q = 4;
  expect_varlen_rejected(a, {"maybe_cu_seqlens_q[3] = 6 exceeds the 5 rows"});
}

// ---- alignment for GPU kernels (fake device addresses, never touched) ------------------------------

TEST_F(ValidationTest, MisalignedDevicePointer) {
  ForwardArgs a = fwd_on_cuda();
  a.q.data = reinterpret_cast<void*>(0x100002);
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"q.data must be 16-byte aligned"});
  BackwardArgs b = bwd_on_cuda();
  b.dq.data = reinterpret_cast<void*>(static_cast<char*>(b.dq.data) + 8);
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"dq.data must be 16-byte aligned"});
}

TEST_F(ValidationTest, MisalignedDeviceStride) {
  // fp16 [2, 3, 2, 64] with a row stride of 100 elements = 200 bytes, not a multiple of 16.
  ForwardArgs a = fwd_on_cuda();
  for (Tensor* t : {&a.q, &a.k, &a.v, &a.out}) t->dtype = DType::kF16;
  a.k = Tensor::strided(a.k.data, DType::kF16, {B, Sk, 2, 8}, {Sk * 100, 100, 8, 1}, Device::kCUDA);
  expect_fwd_rejected(a, StatusCode::kInvalidArgument,
                      {"k.stride[1] (100 elements = 200 bytes) must be a multiple of 16 bytes"});
}

TEST_F(ValidationTest, MisalignedDeviceLse) {
  ForwardArgs a = fwd_on_cuda();
  a.maybe_lse.data = reinterpret_cast<void*>(0x500002);
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"maybe_lse.data must be 4-byte aligned"});
}

TEST_F(ValidationTest, AlignmentIsOnlyRequiredOnTheDevice) {
  // A head stride of 9 floats (36 bytes) would be refused on the device; the CPU takes it.
  HostTensor k_odd(DType::kF32, {B, Sk, Hkv, D}, {0, 0, 0, 1});  // head stride 9 floats
  ForwardArgs a = fwd();
  k_odd.assign(k.to_f64());
  a.k = k_odd.view();
  EXPECT_OK(forward(a));
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
  o0.poison();
  l0.poison();
  ForwardArgs a = fwd();
  a.q = q0.view();
  a.k = k0.view();
  a.v = v0.view();
  a.out = o0.view();
  a.maybe_lse = l0.view();
  EXPECT_OK(forward(a));
  EXPECT_TRUE(o0.untouched("out"));
  EXPECT_TRUE(l0.untouched("lse"));
  // Null data is fine for empty tensors.
  a.q.data = a.k.data = a.v.data = a.out.data = a.maybe_lse.data = nullptr;
  EXPECT_OK(forward(a));
  HostTensor g0(DType::kF32, {0, Sq, Hq, D}), gk(DType::kF32, {0, Sk, Hkv, D}), gv(DType::kF32, {0, Sk, Hkv, D});
  g0.poison();
  BackwardArgs b = bwd();
  b.q = q0.view();
  b.k = k0.view();
  b.v = v0.view();
  b.out = o0.view();
  b.dout = o0.view();
  b.lse = l0.view();
  b.dq = g0.view();
  b.dk = gk.view();
  b.dv = gv.view();
  EXPECT_OK(backward(b));
  EXPECT_TRUE(g0.untouched("dq"));
}

TEST_F(ValidationTest, SeqlenQZeroIsValidAndWritesNothing) {
  HostTensor q0(DType::kF32, {B, 0, Hq, D}), o0(DType::kF32, {B, 0, Hq, D}), l0(DType::kF32, {B, Hq, 0});
  o0.poison();
  l0.poison();
  ForwardArgs a = fwd();
  a.q = q0.view();
  a.out = o0.view();
  a.maybe_lse = l0.view();
  EXPECT_OK(forward(a));
  EXPECT_TRUE(o0.untouched("out"));
  EXPECT_TRUE(l0.untouched("lse"));
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

TEST_F(VarlenValidationTest, AllSequencesEmptyIsValid) {
  cu_q.assign({0, 0, 0, 0});
  cu_k.assign({0, 0, 0, 0});
  HostTensor e_q(DType::kF32, {0, Hq, D}), e_k(DType::kF32, {0, Hkv, D}), e_o(DType::kF32, {0, Hq, D}),
      e_l(DType::kF32, {Hq, 0});
  e_o.poison();
  e_l.poison();
  ForwardArgs a = vfwd();
  a.q = e_q.view();
  a.k = e_k.view();
  a.v = e_k.view();
  a.out = e_o.view();
  a.maybe_lse = e_l.view();
  a.max_seqlen_q = a.max_seqlen_k = 0;
  EXPECT_OK(forward(a));
  EXPECT_TRUE(e_o.untouched("out"));
  EXPECT_TRUE(e_l.untouched("lse"));
}

}  // namespace
}  // namespace flashlab::test
