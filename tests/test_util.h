// What every FlashLab test shares: host tensors that own their storage, fresh random
// inputs with a reproducible seed, poisoned outputs, error measures, the fp64 oracle
// (cpu_reference on fp64 copies) and the tolerance yardstick of docs/DESIGN.md's correctness
// rule (a straightforward attention in the input dtype, rounded where PyTorch's math path
// rounds).
//
// Layout vocabulary follows the API: padded problems are [batch, seqlen, heads, dim],
// varlen problems pack [total_tokens, heads, dim] with cu_seqlens; LSE is fp32
// [batch, heads_q, seqlen_q] or [heads_q, total_q].
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/dropout.h"
#include "common/mask.h"
#include "flashlab/flashlab.h"

namespace flashlab::test {

// ---------------------------------------------------------------------------------------
// Seeds: a fresh one per process (std::random_device) unless FLASHLAB_TEST_SEED is set.
// Each case derives its own generator from the seed and its name, so one failing case
// reproduces alone: FLASHLAB_TEST_SEED=<seed> ./flashlab_tests --gtest_filter=...
// ---------------------------------------------------------------------------------------
uint64_t test_seed();
std::mt19937_64 rng_for(std::string_view what);
// "FLASHLAB_TEST_SEED=<seed>": what SCOPED_TRACE prints so a failure can be rerun.
std::string seed_note();
#define FLASHLAB_SEED_TRACE() SCOPED_TRACE(::flashlab::test::seed_note())

// ---------------------------------------------------------------------------------------
// HostTensor: owning storage plus a flashlab::Tensor view of it.
// ---------------------------------------------------------------------------------------
class HostTensor {
 public:
  HostTensor() = default;
  // Row-major over `shape`, each dimension allocated `pad[i]` elements longer than it is
  // seen (pad of the last dimension = a wider head stride), so strides can be
  // non-contiguous while the last dimension stays contiguous. `pad` aligns to the
  // trailing dimensions ({pad_heads, pad_dim} works for any rank). Storage has canaries
  // before and after the view, so even a zero-element view has poison around it that a
  // stray write would destroy.
  HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> pad = {});

  DType dtype() const { return dtype_; }
  int rank() const { return int(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& stride() const { return stride_; }
  int64_t numel() const;
  bool contiguous() const;

  // The view's first element; storage has kCanaryBytes of poison before and after it.
  void* data() { return storage_.data() + kCanaryBytes; }
  const void* data() const { return storage_.data() + kCanaryBytes; }
  size_t storage_bytes() const { return storage_.size(); }
  static constexpr size_t kCanaryBytes = 64;
  std::vector<std::byte>& storage() { return storage_; }
  const std::vector<std::byte>& storage() const { return storage_; }

  // The view the API takes (on the CPU). An absent tensor (default) gives rank 0.
  Tensor view() const;

  // Storage offset (in elements) of logical element `i` (row-major index into shape).
  int64_t offset(int64_t i) const;
  double get(int64_t i) const;       // logical element i, as double
  void set(int64_t i, double x);     // rounded to dtype
  std::vector<double> to_f64() const;           // logical elements, row-major
  void assign(const std::vector<double>& xs);   // logical elements, rounded to dtype

  // Normal(0, 1) values rounded to dtype, redrawn until nonzero.
  void fill_random(std::mt19937_64& rng);
  // Every byte of storage (padding included) becomes NaN of this dtype.
  void poison();
  // The kernel wrote every logical element (none is NaN) and nothing else (the padding
  // is still poison). Outputs are poisoned before a run, so this proves both. With
  // nan_written, a NaN counts as written unless it holds the poison's own bits (outputs
  // that must be NaN where an input NaN reaches them).
  ::testing::AssertionResult written_exactly(std::string_view name, bool nan_written = false) const;
  // The padding is still poison.
  ::testing::AssertionResult padding_untouched(std::string_view name) const;
  // Every element, seen or not, is still poison: nothing was written at all.
  ::testing::AssertionResult untouched(std::string_view name) const;

  // A contiguous copy in another dtype (fp64 copies for the oracle).
  HostTensor converted(DType dtype) const;

 private:
  // For each storage element: does the view see it?
  std::vector<bool> seen_by_view() const;
  size_t elem_bytes() const;

  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_, stride_, extent_;
  std::vector<std::byte> storage_;
};

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------
struct MaxError {
  double value = 0;      // max |got - want| (+inf where a NaN or a mismatched inf occurs)
  int64_t index = -1;    // where it occurs (logical element), -1 when empty
  double got = 0, want = 0;
};
// Equal infinities (the -inf LSE of a fully masked row) count as exact.
MaxError max_abs_err(const std::vector<double>& got, const std::vector<double>& want);
std::string describe(const MaxError& e);

// docs/DESIGN.md's correctness rule: the kernel's max abs error against the fp64 oracle must
// be at most 2x that of the low-precision path, plus 1e-5 of the values' size (`magnitude`,
// the largest finite |oracle| and at least 1: magnitude_of). The slack is relative because an
// fp32 yardstick's own error is a few ulps, and two valid fp32 summation orders over
// thousands of terms differ by more than 1e-5 absolute on values of size 8.
inline constexpr double kErrFactor = 2.0;
inline constexpr double kErrSlack = 1e-5;
double magnitude_of(const std::vector<double>& oracle);
// dq's and dk's magnitude: the larger of their values' and of the terms their sums cancel.
double gradient_magnitude(const std::vector<double>& oracle, double terms);
// from_out: for dq and dk, what O's rounding can move them by (Results::dq_from_out), which
// the bound adds; 0 elsewhere.
double rule_bound(const MaxError& lowp, double magnitude, double from_out = 0);
::testing::AssertionResult within_rule(std::string_view name, const MaxError& kernel,
                                       const MaxError& lowp, double magnitude = 1.0,
                                       double from_out = 0);
// A sanity cap on the yardstick itself, relative to the size of the values: if the
// low-precision path strays this far from the oracle, the two disagree on what is
// computed (a mask convention, say), and the rule would pass anything.
double yardstick_cap(DType dtype, const std::vector<double>& oracle);

// Status checks with the message in the failure text.
::testing::AssertionResult status_is(const Status& s, StatusCode code,
                                     std::initializer_list<std::string_view> substrings = {});
#define EXPECT_OK(expr) EXPECT_TRUE(::flashlab::test::status_is((expr), ::flashlab::StatusCode::kOk))
#define ASSERT_OK(expr) ASSERT_TRUE(::flashlab::test::status_is((expr), ::flashlab::StatusCode::kOk))

// ---------------------------------------------------------------------------------------
// Problems: one attention call described by sizes and options, and its random inputs.
// ---------------------------------------------------------------------------------------
struct Problem {
  DType dtype = DType::kF32;
  int batch = 1;
  int seqlen_q = 1, seqlen_k = 1;  // padded problems; varlen: derived maxima
  int heads_q = 1, heads_kv = 1;
  int head_dim = 32, head_dim_v = 32;
  std::vector<int> lens_q, lens_k;  // varlen when non-empty (batch = lens_q.size())

  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float dropout_p = 0.f;  // with dropout_seed/offset: the mask of common/dropout.h
  uint64_t dropout_seed = 0, dropout_offset = 0;
  std::optional<float> scale;
  std::vector<int64_t> pad;  // extra allocated elements per dim of q/k/v/out/grads
  bool with_lse = true;      // forward: pass maybe_lse
  // > 0: key row j of each sequence is multiplied by key_growth^((len_k − 1 − j) / 128), so a
  // row's scores grow from the last key tile to the first, the order the forward kernels
  // walk them, and each tile raises the running max (dense problems only).
  float key_growth = 0.f;
  int num_threads = 0;

  bool varlen() const { return !lens_q.empty(); }
  int64_t total_q() const;
  int64_t total_k() const;
  int max_len_q() const;  // seqlen_q, or the longest varlen sequence
  int max_len_k() const;
  std::string describe() const;

  // Builders, so tables of cases read as one line each.
  Problem& with_dtype(DType d) { dtype = d; return *this; }
  Problem& make_causal() { causal = true; return *this; }
  Problem& window(int l, int r) { window_left = l; window_right = r; return *this; }
  Problem& cap(float c) { softcap = c; return *this; }
  Problem& drop(float prob, uint64_t seed, uint64_t offset = 0) {
    dropout_p = prob; dropout_seed = seed; dropout_offset = offset; return *this;
  }
  Problem& dim_v(int d) { head_dim_v = d; return *this; }
  Problem& padded(std::vector<int64_t> p) { pad = std::move(p); return *this; }
  Problem& threads(int n) { num_threads = n; return *this; }
  Problem& no_lse() { with_lse = false; return *this; }
  Problem& scaled(float s) { scale = s; return *this; }
  Problem& growing_keys(float g) { key_growth = g; return *this; }
};

// A padded problem [batch, seqlen, heads, dim].
Problem dense(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
              int head_dim);
// A varlen problem with per-sequence lengths (zero allowed).
Problem varlen(DType dtype, std::vector<int> lens_q, std::vector<int> lens_k, int heads_q,
               int heads_kv, int head_dim);

// The mask the API builds from a problem: MaskPolicy::make over the problem's longest
// sequences (causal folded in, bounds that cannot bind dropped).
MaskPolicy mask_of(const Problem& p);
DropoutPolicy dropout_of(const Problem& p);
float scale_of(const Problem& p);

struct Inputs {
  HostTensor q, k, v, dout;
  HostTensor cu_q, cu_k;  // int32 [batch + 1] (varlen only)
};
Inputs make_inputs(const Problem& p, std::mt19937_64& rng);

// Output tensors shaped for the problem, poisoned, in the problem's dtype and padding.
HostTensor make_out(const Problem& p);
HostTensor make_lse(const Problem& p);  // fp32, contiguous
HostTensor make_like_q(const Problem& p);
HostTensor make_like_kv(const Problem& p, int dim);

// The argument structs over tensors that live wherever `view` put them.
ForwardArgs forward_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, const Tensor& cu_q,
                         const Tensor& cu_k);
BackwardArgs backward_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& dout, const Tensor& lse,
                           const Tensor& dq, const Tensor& dk, const Tensor& dv,
                           const Tensor& cu_q, const Tensor& cu_k);

// Results in logical (row-major, contiguous) order.
struct Results {
  std::vector<double> out, lse, dq, dk, dv;
  // run_lowp's backward only: the size of the terms that dq's and dk's sums cancel, the
  // largest over rows (keys) of |scale| · Σ P · (|dP| + |D|) · |dlogit| · max |k| (max |q|).
  // The rule's slack for dq and dk is relative to it (docs/DESIGN.md).
  double dq_terms = 0, dk_terms = 0;
  // run_lowp's backward only: the most that O's rounding can move dq (dk), the largest over
  // rows (keys). A backward reads O in the input dtype as some forward stored it, and
  // D = rowsum(dO ∘ O) carries that rounding into every dS of the row: 2u · Σ_j P_j Σ_d
  // |dO_d v_jd| for D (u the dtype's unit roundoff), times |scale| · Σ_j P_j |dlogit| max |k|.
  // The rule adds it to dq's and dk's bound (docs/DESIGN.md).
  double dq_from_out = 0, dk_from_out = 0;
};

// The oracle: cpu_reference through the public API on fp64 copies of the inputs, so out
// and the gradients are fp64 (LSE is fp32 by the API's contract). Fails the current test
// (and returns empty results) if the reference refuses.
Results run_reference_fp64(const Problem& p, const Inputs& in, bool with_backward);

// The yardstick: attention in the input dtype, rounded where PyTorch's math path
// (_scaled_dot_product_attention_math, reduced-precision reductions allowed) rounds. That
// path splits the scale as sqrt(scale) on both operands before the matmul:
//   forward:  Qs = round(Q·√scale), Ks = round(K·√scale), S = round(Qs Ksᵀ) (fp32
//             accumulate); softcap as FlashAttention's reference writes it,
//             U = round(tanh(round(S/cap))), S = round(U·cap); softmax in fp32,
//             P = round(P); O = round(P V) (fp32 accumulate); LSE in fp32 from the
//             rounded logits (a fully masked row: O = 0, LSE = -inf).
//   backward: autograd of the above, each intermediate tensor rounded:
//             dV_h = round(Pᵀ dO), dP = round(dO Vᵀ), dS = round(P∘(dP − rowsum(dP∘P))),
//             softcap: dS = round(round(round(dS·cap)·(1 − U²))/cap),
//             dQ = round(round(dS Ks)·√scale), dK_h = round(round(dSᵀ Qs)·√scale);
//             GQA sums the per-head dK_h, dV_h in fp32 and rounds (repeat_interleave).
// round() is to the input dtype (identity for fp32, where the arithmetic is fp32).
Results run_lowp(const Problem& p, const Inputs& in, bool with_backward);

// What a FlashAttention-2 kernel rounds, emulated on the host: logits, softmax and LSE in
// fp32; O = round((Σ round(exp(S − m)) V) / l); backward with P = exp(S − LSE) in fp32,
// dV = round(Σ round(P)ᵀ dO), D = rowsum(dO ∘ O) with the forward's rounded O,
// dS = round(P∘(dP − D)∘dlogit) (dP in fp32), dQ = round(scale·dS K), dK = round(scale·dSᵀ Q)
// (GQA summed in fp32). Not a yardstick: the harness uses it to show the rule is within
// reach of a real kernel's rounding on every case of a table, whatever the seed.
Results run_fa2_emulation(const Problem& p, const Inputs& in, bool with_backward);

}  // namespace flashlab::test
