// The fixture of the validation tests (tests/cpu/validation_*_test.cpp): one valid call,
// small enough to check by eye, that each test breaks in exactly one place, and the checks
// every refusal must pass:
//   - the StatusCode, and a message that names the argument,
//   - the same answer from forward/backward, workspace_size and select_kernel,
//   - nothing written: the poisoned outputs stay poisoned.
//
// Rules that only GPU kernels need (16-byte alignment) are checked with Tensor views on
// Device::kCUDA over fake, never dereferenced addresses: validation rejects them before
// any kernel runs, so these tests need no GPU. They name cpu_reference as the kernel, so
// even a validation bug could not launch anything on those addresses.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/registry.h"
#include "test_util.h"

namespace flashlab::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInfF = std::numeric_limits<float>::infinity();

// A fake device address: validation must never dereference it.
inline Tensor on_cuda(Tensor t, uintptr_t address) {
  t.data = reinterpret_cast<void*>(address);
  t.device = Device::kCUDA;
  return t;
}

// The call with every tensor on the device at distinct, 256-byte aligned fake addresses
// (what cudaMalloc returns): valid as far as alignment goes.
inline ForwardArgs to_cuda(ForwardArgs a) {
  a.q = on_cuda(a.q, 0x100000);
  a.k = on_cuda(a.k, 0x200000);
  a.v = on_cuda(a.v, 0x300000);
  a.out = on_cuda(a.out, 0x400000);
  a.maybe_lse = on_cuda(a.maybe_lse, 0x500000);
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  return a;
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

  ForwardArgs fwd() { return fwd_with(q, k, v, out, lse.view()); }

  // The baseline on other q, k, v, out tensors, and with `lse_` as maybe_lse (none unless
  // given).
  ForwardArgs fwd_with(const HostTensor& q_, const HostTensor& k_, const HostTensor& v_,
                       const HostTensor& out_, Tensor lse_ = {}) {
    ForwardArgs a;
    common(&a);
    a.q = q_.view(), a.k = k_.view(), a.v = v_.view(), a.out = out_.view();
    a.maybe_lse = lse_;
    return a;
  }

  // The forward into empty out_ and lse_ is valid and writes nothing (they stay poisoned);
  // returns its arguments.
  ForwardArgs expect_empty_forward_ok(const HostTensor& q_, const HostTensor& k_,
                                      const HostTensor& v_, HostTensor& out_, HostTensor& lse_) {
    out_.poison();
    lse_.poison();
    ForwardArgs a = fwd_with(q_, k_, v_, out_, lse_.view());
    EXPECT_OK(forward(a));
    EXPECT_TRUE(out_.untouched("out"));
    EXPECT_TRUE(lse_.untouched("lse"));
    return a;
  }

  BackwardArgs bwd() { return bwd_with(q, k, v, out, dout, lse, dq, dk, dv); }

  // The backward on other tensors.
  BackwardArgs bwd_with(const HostTensor& q_, const HostTensor& k_, const HostTensor& v_,
                        const HostTensor& out_, const HostTensor& dout_, const HostTensor& lse_,
                        const HostTensor& dq_, const HostTensor& dk_, const HostTensor& dv_) {
    BackwardArgs a;
    common(&a);
    a.q = q_.view(), a.k = k_.view(), a.v = v_.view(), a.out = out_.view();
    a.dout = dout_.view(), a.lse = lse_.view();
    a.dq = dq_.view(), a.dk = dk_.view(), a.dv = dv_.view();
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

  // The baseline forward with extent `dim` of tensor `t` set to `extent` is refused with
  // kInvalidArgument and `message`.
  void expect_extent_rejected(Tensor ForwardArgs::*t, int dim, int64_t extent,
                              std::string_view message) {
    ForwardArgs a = fwd();
    (a.*t).shape[dim] = extent;
    expect_fwd_rejected(a, StatusCode::kInvalidArgument, {message});
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

  ForwardArgs fwd_on_cuda() { return to_cuda(fwd()); }
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

  ForwardArgs vfwd() { return vfwd_with(vq, vk, vv, vout, vlse); }

  // The varlen baseline on other q, k, v, out, lse tensors.
  ForwardArgs vfwd_with(const HostTensor& q_, const HostTensor& k_, const HostTensor& v_,
                        const HostTensor& out_, const HostTensor& lse_) {
    ForwardArgs a = fwd_with(q_, k_, v_, out_, lse_.view());
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

}  // namespace flashlab::test
