// Validation of memory overlap: an output (out, lse; dq, dk, dv) must share no byte with an
// input or another output, and no two of its own elements may share memory. Inputs may
// alias each other, and views that interleave in one buffer without sharing a byte (q, k, v
// of a packed qkv; dq, dk, dv of a packed dqkv) are accepted.
#include "cpu/validation_fixture.h"

namespace flashlab::test {
namespace {

::testing::AssertionResult refused(const ForwardArgs& a, std::initializer_list<std::string_view> names) {
  std::string name;
  return status_is(select_kernel(a, &name), StatusCode::kInvalidArgument, names);
}
::testing::AssertionResult refused(const BackwardArgs& a, std::initializer_list<std::string_view> names) {
  std::string name;
  return status_is(select_kernel(a, &name), StatusCode::kInvalidArgument, names);
}

TEST_F(ValidationTest, OutputOverlappingAnInput) {
  ForwardArgs a = fwd();
  a.out = a.q;  // the same shape: an in-place forward
  ASSERT_TRUE(refused(a, {"out overlaps q"}));
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out overlaps q", "must not share memory"});
  a = fwd();
  a.out.data = k.data();  // out's strides over k's bytes
  ASSERT_TRUE(refused(a, {"out overlaps k"}));
  a = fwd();
  a.maybe_lse.data = static_cast<float*>(v.data()) + 3;
  ASSERT_TRUE(refused(a, {"lse overlaps v"}));
}

TEST_F(ValidationTest, OutputsOverlappingEachOther) {
  ForwardArgs a = fwd();
  a.maybe_lse.data = static_cast<float*>(out.data()) + 8;
  ASSERT_TRUE(refused(a, {"lse overlaps out"}));
  BackwardArgs b = bwd();
  b.dv = b.dk;
  ASSERT_TRUE(refused(b, {"dv overlaps dk"}));
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"dv overlaps dk"});
}

TEST_F(ValidationTest, GradientOverlappingAnInput) {
  for (auto [grad, input, name] :
       {std::tuple{&BackwardArgs::dq, &BackwardArgs::q, "dq overlaps q"},
        std::tuple{&BackwardArgs::dq, &BackwardArgs::dout, "dq overlaps dout"},
        std::tuple{&BackwardArgs::dk, &BackwardArgs::k, "dk overlaps k"},
        std::tuple{&BackwardArgs::dv, &BackwardArgs::v, "dv overlaps v"}}) {
    SCOPED_TRACE(name);
    BackwardArgs b = bwd();
    b.*grad = b.*input;
    ASSERT_TRUE(refused(b, {name}));
  }
  BackwardArgs b = bwd();
  b.dq.data = out.data();  // dq [2, 3, 4, 8] over the forward's out, an input here
  ASSERT_TRUE(refused(b, {"dq overlaps out"}));
  b = bwd();
  b.lse.data = dk.data();  // the forward's lse read from where dk is written
  ASSERT_TRUE(refused(b, {"dk overlaps lse"}));
}

TEST_F(ValidationTest, OutputOverlappingItself) {
  ForwardArgs a = fwd();
  a.out.stride[1] = 0;  // the Sq rows of a sequence share one row of memory
  ASSERT_TRUE(refused(a, {"out overlaps itself", "no zero stride"}));
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"out overlaps itself"});
  a = fwd();
  a.out.stride[2] = 4;  // head h's second half is head h + 1's first half
  ASSERT_TRUE(refused(a, {"out overlaps itself"}));
  BackwardArgs b = bwd();
  b.dk.stride[0] = 0;
  ASSERT_TRUE(refused(b, {"dk overlaps itself"}));
  // A dimension of size 1 may have any stride: it never repeats an element.
  HostTensor o1(DType::kF32, {B, Sq, Hq, D});
  a = fwd();
  a.out = o1.view();
  a.out.stride[0] = 0;
  a.out.shape[0] = 1;
  a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = 1;
  a.maybe_lse = Tensor{};
  EXPECT_OK(forward(a));
}

TEST_F(VarlenValidationTest, OutputOverlappingCuSeqlens) {
  ForwardArgs a = vfwd();
  a.maybe_lse.data = cu_k.data();
  ASSERT_TRUE(refused(a, {"lse overlaps cu_seqlens_k"}));
}

TEST_F(ValidationTest, InputsMayAliasEachOther) {
  // v = k: one tensor read twice. The result must be the one of two equal copies.
  ForwardArgs a = fwd();
  v.assign(k.to_f64());
  out.poison();
  ASSERT_OK(forward(a));
  const std::vector<double> want = out.to_f64();
  a.v = a.k;
  out.poison();
  ASSERT_OK(forward(a));
  EXPECT_EQ(out.to_f64(), want);
}

// q, k, v as interleaved views of one qkv [B, S, 3, H, D], and dq, dk, dv of one dqkv, as
// FlashAttention's qkvpacked functions pass them: accepted, with the results of separate
// tensors.
class PackedTest : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, S = 5, H = 2, D = 8;
  HostTensor qkv{DType::kF32, {B, S, 3, H, D}}, dqkv{DType::kF32, {B, S, 3, H, D}};
  HostTensor sep[3] = {HostTensor(DType::kF32, {B, S, H, D}), HostTensor(DType::kF32, {B, S, H, D}),
                       HostTensor(DType::kF32, {B, S, H, D})};
  HostTensor grads[3] = {HostTensor(DType::kF32, {B, S, H, D}), HostTensor(DType::kF32, {B, S, H, D}),
                         HostTensor(DType::kF32, {B, S, H, D})};
  HostTensor out{DType::kF32, {B, S, H, D}}, dout{DType::kF32, {B, S, H, D}}, lse{DType::kF32, {B, H, S}};
  std::vector<double> workspace = std::vector<double>(size_t(1) << 14);

  void SetUp() override {
    std::mt19937_64 rng = rng_for("packed qkv");
    for (HostTensor& t : sep) t.fill_random(rng);
    dout.fill_random(rng);
    for (int64_t i = 0; i < B * S; ++i)
      for (int64_t t = 0; t < 3; ++t)
        for (int64_t j = 0; j < H * D; ++j) qkv.set((i * 3 + t) * H * D + j, sep[t].get(i * H * D + j));
  }

  // Element t of the packed dimension of `packed`, as a [B, S, H, D] view.
  static Tensor part(HostTensor& packed, int t) {
    return Tensor::strided(static_cast<float*>(packed.data()) + t * H * D, DType::kF32, {B, S, H, D},
                           {S * 3 * H * D, 3 * H * D, D, 1});
  }

  template <class Args>
  void common(Args* a) {
    a->kernel = "cpu_reference";
    a->causal = true;
    a->workspace = workspace.data();
    a->workspace_bytes = workspace.size() * sizeof(double);
  }
};

TEST_F(PackedTest, InterleavedInputsAndGradients) {
  ForwardArgs f;
  common(&f);
  f.q = part(qkv, 0);
  f.k = part(qkv, 1);
  f.v = part(qkv, 2);
  f.out = out.view();
  f.maybe_lse = lse.view();
  ASSERT_OK(forward(f));
  const std::vector<double> out_packed = out.to_f64();
  f.q = sep[0].view();
  f.k = sep[1].view();
  f.v = sep[2].view();
  ASSERT_OK(forward(f));
  EXPECT_EQ(out.to_f64(), out_packed);

  BackwardArgs b;
  common(&b);
  b.q = sep[0].view();
  b.k = sep[1].view();
  b.v = sep[2].view();
  b.out = out.view();
  b.dout = dout.view();
  b.lse = lse.view();
  b.dq = grads[0].view();
  b.dk = grads[1].view();
  b.dv = grads[2].view();
  ASSERT_OK(backward(b));
  b.q = part(qkv, 0);
  b.k = part(qkv, 1);
  b.v = part(qkv, 2);
  dqkv.poison();
  b.dq = part(dqkv, 0);
  b.dk = part(dqkv, 1);
  b.dv = part(dqkv, 2);
  ASSERT_OK(backward(b));
  EXPECT_TRUE(dqkv.written_exactly("dqkv"));
  for (int64_t i = 0; i < B * S; ++i)
    for (int t = 0; t < 3; ++t)
      for (int64_t j = 0; j < H * D; ++j)
        ASSERT_EQ(dqkv.get((i * 3 + t) * H * D + j), grads[t].get(i * H * D + j)) << "part " << t;

  // Interleaved views that do share bytes are refused: dk shifted half a head into dq.
  b.dk = Tensor::strided(static_cast<float*>(dqkv.data()) + D / 2, DType::kF32, {B, S, H, D},
                         {S * 3 * H * D, 3 * H * D, D, 1});
  ASSERT_TRUE(refused(b, {"dk overlaps dq"}));
}

}  // namespace
}  // namespace flashlab::test
