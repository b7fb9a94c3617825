// The oracle itself (cpu_reference): every other kernel is judged against it, so it is
// checked against things that do not depend on it — a case small enough to compute by
// hand, finite differences of its own forward (for its backward), and properties that
// attention must have (masked rows, GQA = repeated heads, varlen = separate calls).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace flashlab::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- a hand-computed case -----------------------------------------------------------------
//
// batch 1, seqlen 4, 1 head, head dim 2, fp64 tensors, default scale. The API's scale is
// fp32: 1/sqrt(2) becomes 0.7071067690849304, and that is the scale used below.
// Expected values computed in fp64 with NumPy, printed to 10 significant digits:
//   S = scale * (q @ k.T);  causal: S[i, j] = -inf for j > i
//   lse = m + log(sum(exp(S - m), axis=1)),  m = max(S, axis=1)
//   out = exp(S - lse[:, None]) @ v
// The scores S (non-causal) are
//   [ 0.7071067691  0.3535533845 -0.8838834614  0.7071067691]
//   [ 0.5303300768 -1.0606601536  0.8838834614  1.4142135382]
//   [-0.6187184229  0.8838834614 -0.6187184229 -1.4142135382]
//   [ 0.7071067691  1.4142135382 -2.1213203073  0.          ]
constexpr double kQ[4][2] = {{1.0, 0.5}, {-0.5, 1.0}, {0.25, -1.0}, {2.0, 0.0}};
constexpr double kK[4][2] = {{0.5, 1.0}, {1.0, -1.0}, {-1.5, 0.5}, {0.0, 2.0}};
constexpr double kV[4][2] = {{1.0, 2.0}, {-1.0, 0.5}, {3.0, -2.0}, {0.5, 1.5}};

constexpr double kOut[4][2] = {{0.4848676394, 1.185048398},
                               {1.243783702, 0.5713102661},
                               {-0.03854527317, 0.4209986762},
                               {-0.1687750045, 1.01540647}};
constexpr double kLse[4] = {1.773854149, 2.149346634, 1.319263638, 1.982550405};

// Causal: row 0 sees only key 0 (out = v[0], lse = S[0][0]); row 3 sees every key, as above.
constexpr double kOutCausal[4][2] = {{1.0, 2.0},
                                     {0.6615107519, 1.746133064},
                                     {-0.07597987841, 0.3459966464},
                                     {-0.1687750045, 1.01540647}};
constexpr double kLseCausal[4] = {0.7071067691, 0.7157499774, 1.252062477, 1.982550405};

constexpr double kOutTol = 1e-9;  // the literals carry 10 significant digits
constexpr double kLseTol = 1e-6;  // LSE is fp32 by contract

struct TinyRun {
  HostTensor out, lse;
};

// Queries [first_q, 4) against all four keys.
TinyRun run_tiny(bool causal, int first_q = 0) {
  const int sq = 4 - first_q;
  HostTensor q(DType::kF64, {1, sq, 1, 2}), k(DType::kF64, {1, 4, 1, 2}), v(DType::kF64, {1, 4, 1, 2});
  for (int i = 0; i < sq; ++i)
    for (int d = 0; d < 2; ++d) q.set(i * 2 + d, kQ[first_q + i][d]);
  for (int j = 0; j < 4; ++j)
    for (int d = 0; d < 2; ++d) {
      k.set(j * 2 + d, kK[j][d]);
      v.set(j * 2 + d, kV[j][d]);
    }
  TinyRun r{HostTensor(DType::kF64, {1, sq, 1, 2}), HostTensor(DType::kF32, {1, 1, sq})};
  r.out.poison();
  r.lse.poison();
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = r.out.view();
  a.maybe_lse = r.lse.view();
  a.causal = causal;
  a.kernel = "cpu_reference";
  size_t bytes = 0;
  EXPECT_OK(workspace_size(a, &bytes));
  std::vector<double> ws(bytes / sizeof(double) + 1);
  a.workspace = ws.data();
  a.workspace_bytes = bytes;
  EXPECT_OK(forward(a));
  return r;
}

TEST(Reference, HandComputedTinyCase) {
  const TinyRun r = run_tiny(false);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(r.lse.get(i), kLse[i], kLseTol) << "row " << i;
    for (int d = 0; d < 2; ++d) EXPECT_NEAR(r.out.get(i * 2 + d), kOut[i][d], kOutTol) << i << "," << d;
  }
}

TEST(Reference, HandComputedTinyCaseCausal) {
  const TinyRun r = run_tiny(true);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(r.lse.get(i), kLseCausal[i], kLseTol) << "row " << i;
    for (int d = 0; d < 2; ++d)
      EXPECT_NEAR(r.out.get(i * 2 + d), kOutCausal[i][d], kOutTol) << i << "," << d;
  }
}

// Causal is aligned bottom-right: the last two queries alone against all four keys see
// what rows 2 and 3 of the square causal case see.
TEST(Reference, HandComputedCausalIsBottomRightAligned) {
  const TinyRun r = run_tiny(true, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(r.lse.get(i), kLseCausal[2 + i], kLseTol) << "row " << i;
    for (int d = 0; d < 2; ++d)
      EXPECT_NEAR(r.out.get(i * 2 + d), kOutCausal[2 + i][d], kOutTol) << i << "," << d;
  }
}

// ---- the backward against finite differences ------------------------------------------------
//
// loss = Σ out ∘ dout for a fixed random dout, so d loss / d x is exactly what the backward
// returns for x in {q, k, v}. Central differences of the fp64 forward with step h have
// error O(h²) + O(eps/h): about 1e-10 here.

constexpr double kStep = 1e-5;
constexpr double kFdTol = 1e-7;

double loss_of(const Problem& p, const Inputs& in) {
  const Results r = run_reference_fp64(p, in, false);
  const std::vector<double> d = in.dout.to_f64();
  double l = 0;
  for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * d[i];
  return l;
}

void expect_matches_finite_differences(Problem p) {
  p.dtype = DType::kF64;
  FLASHLAB_SEED_TRACE();
  SCOPED_TRACE(p.describe());
  std::mt19937_64 rng = rng_for("finite differences " + p.describe());
  Inputs in = make_inputs(p, rng);
  const Results grads = run_reference_fp64(p, in, true);
  ASSERT_FALSE(grads.dq.empty() && p.total_q() > 0);

  struct Wrt {
    const char* name;
    HostTensor* x;
    const std::vector<double>* grad;
  };
  for (const Wrt& w : {Wrt{"dq", &in.q, &grads.dq}, Wrt{"dk", &in.k, &grads.dk},
                       Wrt{"dv", &in.v, &grads.dv}}) {
    ASSERT_EQ(int64_t(w.grad->size()), w.x->numel()) << w.name;
    for (int64_t i = 0; i < w.x->numel(); ++i) {
      const double x0 = w.x->get(i);
      w.x->set(i, x0 + kStep);
      const double up = loss_of(p, in);
      w.x->set(i, x0 - kStep);
      const double down = loss_of(p, in);
      w.x->set(i, x0);
      const double fd = (up - down) / (2 * kStep);
      const double g = (*w.grad)[size_t(i)];
      ASSERT_TRUE(std::isfinite(g)) << w.name << "[" << i << "]";
      EXPECT_NEAR(g, fd, kFdTol * std::max(1.0, std::abs(fd))) << w.name << "[" << i << "]";
    }
  }
}

TEST(ReferenceBackward, MatchesFiniteDifferences) {
  expect_matches_finite_differences(dense(DType::kF64, 2, 5, 6, 2, 2, 3));
}

TEST(ReferenceBackward, MatchesFiniteDifferencesCausalGqaSoftcap) {
  // seqlen_q > seqlen_k: the first rows are fully masked and must get zero gradients.
  expect_matches_finite_differences(dense(DType::kF64, 1, 6, 4, 4, 2, 3).make_causal().cap(1.5f));
}

TEST(ReferenceBackward, MatchesFiniteDifferencesVarlenWindow) {
  expect_matches_finite_differences(
      varlen(DType::kF64, {3, 0, 4, 2}, {2, 5, 3, 0}, 2, 1, 2).window(1, 1));
}

TEST(ReferenceBackward, MatchesFiniteDifferencesScaleAndHeadDimV) {
  expect_matches_finite_differences(dense(DType::kF64, 1, 4, 7, 2, 1, 3).dim_v(2).scaled(0.8f));
}

// ---- properties -------------------------------------------------------------------------------

TEST(Reference, FullyMaskedRowsWriteZeroAndMinusInfinity) {
  FLASHLAB_SEED_TRACE();
  // causal with seqlen_q > seqlen_k: row i sees keys j <= i + 3 - 7, so rows 0..3 see none.
  const Problem p = dense(DType::kF64, 2, 7, 3, 2, 1, 4).make_causal();
  std::mt19937_64 rng = rng_for("fully masked rows");
  const Inputs in = make_inputs(p, rng);
  const Results r = run_reference_fp64(p, in, true);
  ASSERT_EQ(r.lse.size(), size_t(2 * 2 * 7));
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 7; ++i) {
        const double lse = r.lse[size_t((b * 2 + h) * 7 + i)];
        if (i < 4) EXPECT_EQ(lse, -kInf) << b << "," << h << "," << i;
        else EXPECT_TRUE(std::isfinite(lse)) << b << "," << h << "," << i;
        for (int d = 0; d < 4; ++d) {
          const size_t o = size_t(((b * 7 + i) * 2 + h) * 4 + d);
          if (i < 4) {
            EXPECT_EQ(r.out[o], 0.0);
            EXPECT_EQ(r.dq[o], 0.0);
          }
          EXPECT_TRUE(std::isfinite(r.out[o]));
          EXPECT_TRUE(std::isfinite(r.dq[o]));
        }
      }
  for (double x : r.dk) EXPECT_TRUE(std::isfinite(x));
  for (double x : r.dv) EXPECT_TRUE(std::isfinite(x));
}

TEST(Reference, NoKeysAtAllGivesZeroAndMinusInfinity) {
  FLASHLAB_SEED_TRACE();
  const Problem p = dense(DType::kF64, 2, 3, 0, 2, 2, 8);
  std::mt19937_64 rng = rng_for("no keys");
  const Inputs in = make_inputs(p, rng);
  const Results r = run_reference_fp64(p, in, true);
  ASSERT_EQ(r.out.size(), size_t(2 * 3 * 2 * 8));
  for (double x : r.out) EXPECT_EQ(x, 0.0);
  for (double x : r.lse) EXPECT_EQ(x, -kInf);
  for (double x : r.dq) EXPECT_EQ(x, 0.0);
}

// Softmax rows are convex weights: with every value row equal to c, every row that sees a
// key outputs c exactly (up to rounding), whatever the mask.
TEST(Reference, ConstantValuesPassThrough) {
  FLASHLAB_SEED_TRACE();
  const Problem p = dense(DType::kF64, 1, 9, 9, 2, 2, 5).window(2, 1).cap(3.f);
  std::mt19937_64 rng = rng_for("constant values");
  Inputs in = make_inputs(p, rng);
  const double c[5] = {0.5, -1.25, 2.0, 3.5, -0.75};
  for (int64_t i = 0; i < in.v.numel(); ++i) in.v.set(i, c[i % 5]);
  const Results r = run_reference_fp64(p, in, false);
  for (size_t i = 0; i < r.out.size(); ++i) EXPECT_NEAR(r.out[i], c[i % 5], 1e-12) << i;
}

// GQA is MHA with each kv head repeated over its group of query heads (and dK, dV summed).
TEST(Reference, GqaEqualsRepeatedHeads) {
  FLASHLAB_SEED_TRACE();
  const int group = 3;
  const Problem gqa = dense(DType::kF64, 2, 6, 8, 6, 2, 4).make_causal();
  Problem mha = gqa;
  mha.heads_kv = gqa.heads_q;
  std::mt19937_64 rng = rng_for("gqa");
  Inputs in = make_inputs(gqa, rng);
  Inputs rep = in;
  rep.k = HostTensor(DType::kF64, {2, 8, 6, 4});
  rep.v = HostTensor(DType::kF64, {2, 8, 6, 4});
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 8; ++j)
      for (int h = 0; h < 6; ++h)
        for (int d = 0; d < 4; ++d) {
          const int64_t src = ((b * 8 + j) * 2 + h / group) * 4 + d;
          const int64_t dst = ((b * 8 + j) * 6 + h) * 4 + d;
          rep.k.set(dst, in.k.get(src));
          rep.v.set(dst, in.v.get(src));
        }
  const Results a = run_reference_fp64(gqa, in, true);
  const Results b = run_reference_fp64(mha, rep, true);
  EXPECT_LE(max_abs_err(a.out, b.out).value, 1e-14);
  EXPECT_LE(max_abs_err(a.lse, b.lse).value, 0.0);
  EXPECT_LE(max_abs_err(a.dq, b.dq).value, 1e-14);
  ASSERT_EQ(a.dk.size() * group, b.dk.size());
  for (int b_ = 0; b_ < 2; ++b_)
    for (int j = 0; j < 8; ++j)
      for (int hk = 0; hk < 2; ++hk)
        for (int d = 0; d < 4; ++d) {
          double sk = 0, sv = 0;
          for (int h = hk * group; h < (hk + 1) * group; ++h) {
            sk += b.dk[size_t(((b_ * 8 + j) * 6 + h) * 4 + d)];
            sv += b.dv[size_t(((b_ * 8 + j) * 6 + h) * 4 + d)];
          }
          const size_t i = size_t(((b_ * 8 + j) * 2 + hk) * 4 + d);
          EXPECT_NEAR(a.dk[i], sk, 1e-13);
          EXPECT_NEAR(a.dv[i], sv, 1e-13);
        }
}

// A varlen batch equals one padded call per sequence.
TEST(Reference, VarlenEqualsSeparateCalls) {
  FLASHLAB_SEED_TRACE();
  const std::vector<int> lq = {3, 0, 5, 2}, lk = {4, 2, 5, 0};
  const int H = 2, D = 4;
  const Problem vp = varlen(DType::kF64, lq, lk, H, H, D).make_causal();
  std::mt19937_64 rng = rng_for("varlen vs separate");
  const Inputs in = make_inputs(vp, rng);
  const Results all = run_reference_fp64(vp, in, true);
  int64_t sq = 0, sk = 0;
  for (size_t b = 0; b < lq.size(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    Problem one = dense(DType::kF64, 1, lq[b], lk[b], H, H, D).make_causal();
    Inputs sub;
    sub.q = HostTensor(DType::kF64, {1, lq[b], H, D});
    sub.k = HostTensor(DType::kF64, {1, lk[b], H, D});
    sub.v = HostTensor(DType::kF64, {1, lk[b], H, D});
    sub.dout = HostTensor(DType::kF64, {1, lq[b], H, D});
    for (int64_t i = 0; i < sub.q.numel(); ++i) {
      sub.q.set(i, in.q.get(sq * H * D + i));
      sub.dout.set(i, in.dout.get(sq * H * D + i));
    }
    for (int64_t i = 0; i < sub.k.numel(); ++i) {
      sub.k.set(i, in.k.get(sk * H * D + i));
      sub.v.set(i, in.v.get(sk * H * D + i));
    }
    const Results r = run_reference_fp64(one, sub, true);
    for (size_t i = 0; i < r.out.size(); ++i) {
      EXPECT_EQ(r.out[i], all.out[size_t(sq * H * D) + i]);
      EXPECT_EQ(r.dq[i], all.dq[size_t(sq * H * D) + i]);
    }
    for (size_t i = 0; i < r.dk.size(); ++i) {
      EXPECT_EQ(r.dk[i], all.dk[size_t(sk * H * D) + i]);
      EXPECT_EQ(r.dv[i], all.dv[size_t(sk * H * D) + i]);
    }
    // LSE: padded [1, H, len] vs varlen [H, total_q].
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < lq[b]; ++i)
        EXPECT_EQ(r.lse[size_t(h * lq[b] + i)], all.lse[size_t(h * vp.total_q() + sq + i)]);
    sq += lq[b];
    sk += lk[b];
  }
}

// Causal is the window (-1, 0); a window as wide as the keys is no window.
TEST(Reference, CausalIsWindowAndWideWindowIsNone) {
  FLASHLAB_SEED_TRACE();
  const Problem base = dense(DType::kF64, 1, 9, 12, 2, 1, 4);
  std::mt19937_64 rng = rng_for("window equivalences");
  const Inputs in = make_inputs(base, rng);
  Problem causal = base, left = base, wide = base;
  causal.make_causal();
  left.window(-1, 0);
  wide.window(12, 40);
  EXPECT_EQ(max_abs_err(run_reference_fp64(causal, in, false).out,
                        run_reference_fp64(left, in, false).out).value, 0.0);
  EXPECT_EQ(max_abs_err(run_reference_fp64(base, in, false).out,
                        run_reference_fp64(wide, in, false).out).value, 0.0);
}

}  // namespace
}  // namespace flashlab::test
