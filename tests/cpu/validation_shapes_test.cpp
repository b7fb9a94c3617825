// Validation of the tensors themselves: pointers, ranks, sizes, strides, dtypes, devices,
// shapes that disagree, heads and head dims, and the alignment GPU kernels need.
#include "cpu/validation_fixture.h"

namespace flashlab::test {
namespace {

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
                                                      : "lse";
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
  expect_extent_rejected(&ForwardArgs::v, 1, 3, "v.shape[1] (seqlen_k) must be 4");
  expect_extent_rejected(&ForwardArgs::out, 1, 4, "out.shape[1] (seqlen_q) must be 3");
}

TEST_F(ValidationTest, HeadsMismatch) {
  expect_extent_rejected(&ForwardArgs::v, 2, 1, "v.shape[2] (heads_kv) must be 2");
  expect_extent_rejected(&ForwardArgs::out, 2, 2, "out.shape[2] (heads_q) must be 4");
}

TEST_F(ValidationTest, HeadDimMismatch) {
  expect_extent_rejected(&ForwardArgs::k, 3, 4, "k.shape[3] (head_dim) must be 8");
  // head_dim_v comes from v
  expect_extent_rejected(&ForwardArgs::out, 3, 4, "out.shape[3] (head_dim_v) must be 8");
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
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse must have rank 3"});
  a = fwd();
  a.maybe_lse.shape[0] = 1;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse.shape[0] (batch) must be 2"});
  a = fwd();
  a.maybe_lse.shape[1] = 2;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse.shape[1] (heads_q) must be 4"});
  a = fwd();
  a.maybe_lse.shape[2] = 4;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse.shape[2] (seqlen_q) must be 3"});
  BackwardArgs b = bwd();
  b.lse.shape[2] = 2;
  expect_bwd_rejected(b, StatusCode::kInvalidArgument, {"lse.shape[2] (seqlen_q) must be 3"});
}

TEST_F(ValidationTest, LseDtypeAndDevice) {
  ForwardArgs a = fwd();
  a.maybe_lse.dtype = DType::kF64;
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse.dtype must be fp32", "fp64"});
  a = fwd();
  a.maybe_lse = on_cuda(a.maybe_lse, 0x100000);
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse must be on the device of q"});
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
    ForwardArgs a = fwd_with(q1, k1, v1, o1);
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
  expect_fwd_rejected(a, StatusCode::kInvalidArgument, {"lse.data must be 4-byte aligned"});
}

TEST_F(ValidationTest, AlignmentIsOnlyRequiredOnTheDevice) {
  // A head stride of 9 floats (36 bytes) would be refused on the device; the CPU takes it.
  HostTensor k_odd(DType::kF32, {B, Sk, Hkv, D}, {0, 0, 0, 1});  // head stride 9 floats
  ForwardArgs a = fwd();
  k_odd.assign(k.to_f64());
  a.k = k_odd.view();
  EXPECT_OK(forward(a));
}

}  // namespace
}  // namespace flashlab::test
