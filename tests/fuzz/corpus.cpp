#include "corpus.h"

#include <cmath>
#include <limits>

#include "generate.h"

namespace flashlab::fuzz {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Sizes the device's kernels take: a tensor-core head dim in fp16 on CUDA, the smallest
// the case needs in fp32 on the CPU.
struct Base {
  DType dtype;
  int dim;
};
Base base(const Env& env, int cpu_dim) {
  return env.device == Device::kCUDA ? Base{DType::kF16, 64} : Base{DType::kF32, cpu_dim};
}

Call make(Pass pass, test::Problem p, Expect expect) {
  Call c;
  c.pass = pass;
  c.p = std::move(p);
  c.expect = expect;
  c.data_seed = 0x5eed;
  contiguous_layouts(&c);
  return c;
}

// Row r of a logical [.., rows, dim] tensor set to x.
void set_row(Buf& b, int64_t row, int dim, double x) {
  for (int d = 0; d < dim; ++d) b.set(row * dim + d, x);
}

std::string expect_row(const std::vector<double>& got, int64_t row, int dim, double want,
                       double tol, const std::string& what) {
  for (int d = 0; d < dim; ++d) {
    const double g = got[size_t(row * dim + d)];
    if (!(std::abs(g - want) <= tol))
      return what + ": element " + std::to_string(d) + " is " + std::to_string(g) + ", want " +
             std::to_string(want);
  }
  return "";
}

}  // namespace

std::vector<CorpusCase> corpus(const Env& env) {
  std::vector<CorpusCase> cases;
  // Each case on every kernel of the device with the pass.
  auto add = [&](int number, const std::string& what, const Call& c) {
    for (const KernelInfo& k : env.kernels) {
      if (!(c.backward() ? k.has_backward : k.has_forward)) continue;
      CorpusCase cc{number, what, c};
      cc.call.kernel = std::string(k.name);
      cc.call.kind = "corpus case " + std::to_string(number);
      cases.push_back(std::move(cc));
    }
  };
  const Base b1 = base(env, 1), b4 = base(env, 4), b8 = base(env, 8);
  const Pass kFwd = Pass::kForward, kBwd = Pass::kBackward;

  {  // (1) quadratic workspace of max_seqlen_q · max_seqlen_k wraps around 2^64
    Call c = make(kFwd, test::varlen(b1.dtype, {1}, {1}, 1, 1, b1.dim), Expect::kRefuseOrCorrect);
    c.max_seqlen_q = 1073764992;
    c.max_seqlen_k = 2147437306;
    c.twist = "max_seqlen_q * max_seqlen_k * 8 bytes wraps past 2^64";
    add(1, "huge max_seqlen: refused or right", c);
    c.pass = kBwd;
    contiguous_layouts(&c);
    add(1, "huge max_seqlen: refused or right", c);
  }
  for (Pass pass : {kFwd, kBwd}) {  // (2) element counts past int64
    Call c = make(pass, test::dense(b1.dtype, 1, 1, 1, 1, 1, 1), Expect::kInvalid);
    const std::array<int64_t, 4> shape = {int64_t(1) << 30, int64_t(1) << 30, 16, 1};
    c.twist = "q, k, v, out [2^30, 2^30, 16, 1], null data";
    c.edit_args = [shape](Target& t) {
      reshape_all(t, shape, contiguous_strides(shape));
      for (Tensor* x : t.t)
        if (x) x->data = nullptr;
    };
    add(2, "element count past int64: refused", c);
  }
  for (Pass pass : {kFwd, kBwd}) {  // (3) 2^32 (batch, head) pairs over zero strides
    Call c = make(pass, test::dense(b1.dtype, 1, 1, 1, 1, 1, b1.dim), Expect::kInvalid);
    const int D = b1.dim;
    c.twist = "batch 65536 x heads 65536, strides [0, 0, 0, 1]";
    c.edit_args = [D](Target& t) { reshape_all(t, {65536, 1, 65536, D}, {0, 0, 0, 1}); };
    add(3, "batch * heads past 2^31: refused", c);
  }
  {  // (4) a byte offset past int64
    Call c = make(kFwd, test::dense(b1.dtype, 4, 1, 1, 1, 1, b1.dim), Expect::kInvalid);
    c.twist = "q.stride[0] = 2^62 + 1";
    c.edit_args = [](Target& t) { t.t[kQ]->stride[0] = (int64_t(1) << 62) + 1; };
    add(4, "stride past int64 bytes: refused", c);
  }
  for (auto [pass, scale] :
       {std::pair{kFwd, 2.4e38f}, std::pair{kBwd, 2.4e38f}, std::pair{kBwd, 1e30f}}) {
    Call c = make(pass, test::dense(b8.dtype, 1, 4, 4, 1, 1, b8.dim).scaled(scale),
                  Expect::kRefuseOrCorrect);
    add(5, "huge softmax_scale: refused or right", c);  // (5)
  }
  {  // (6) a masked key's NaN V must not reach the row; a row that sees none is 0
    Call c = make(kFwd, test::dense(b1.dtype, 1, 3, 2, 1, 1, b1.dim).make_causal(), Expect::kValid);
    const int D = b1.dim;
    c.nonfinite.push_back({kV, int64_t(D), kNaN});  // v row 1, element 0
    c.edit_data = [D](std::array<Buf, kSlots>& b) { set_row(b[kV], 0, D, 1.0); };
    c.check_values = [D](const test::Results& got) {
      std::string e = expect_row(got.out, 0, D, 0.0, 0.0, "row 0 (sees no key)");
      if (e.empty() && got.lse[0] != -std::numeric_limits<double>::infinity())
        e = "row 0's LSE is not -inf";
      if (e.empty()) e = expect_row(got.out, 1, D, 1.0, 1e-3, "row 1 (sees key 0 only)");
      return e;
    };
    add(6, "causal sq 3 sk 2, v = [1, NaN]: rows 0 and 1 finite", c);
  }
  for (DType dt : {b1.dtype, DType::kF64}) {  // (7) n tied huge logits weigh 1/n each
    if (dt == DType::kF64 && env.device == Device::kCUDA) continue;
    Call c = make(kFwd, test::dense(dt, 1, 1, 2, 1, 1, b1.dim).scaled(1e20f), Expect::kValid);
    const int D = b1.dim;
    c.edit_data = [D](std::array<Buf, kSlots>& b) {
      for (int d = 0; d < D; ++d) {
        b[kQ].set(d, d == 0 ? 1.0 : 0.0);
        b[kK].set(d, d == 0 ? 1.0 : 0.0);
        b[kK].set(D + d, d == 0 ? 1.0 : 0.0);
      }
      set_row(b[kV], 0, D, 1.0);
      set_row(b[kV], 1, D, 3.0);
    };
    c.check_values = [D](const test::Results& got) {
      return expect_row(got.out, 0, D, 2.0, 1e-3, "two tied keys with v = 1 and 3");
    };
    add(7, "two identical keys, v = [1, 3], scale 1e20: out = 2", c);
  }
  for (Pass pass : {kFwd, kBwd}) {  // (8)
    Call c = make(pass, test::dense(b8.dtype, 2, 8, 8, 2, 2, b8.dim).threads(2000),
                  Expect::kRefuseOrCorrect);
    add(8, "num_threads 2000: refused or right", c);
  }
  {  // (10) outputs over inputs or over themselves
    const test::Problem p = test::dense(b4.dtype, 1, 4, 4, 2, 2, b4.dim);
    for (int into : {int(kQ), int(kK)}) {
      Call c = make(kFwd, p, Expect::kInvalid);
      c.alias_slot = kOut;
      c.alias_into = into;
      add(10, std::string("out = ") + slot_name(into) + ": refused", c);
    }
    Call z = make(kFwd, p, Expect::kInvalid);
    z.layout[kOut].stride[1] = 0;
    add(10, "out.stride[1] = 0: refused", z);
    Call g = make(kBwd, p, Expect::kInvalid);
    g.alias_slot = kDq;
    g.alias_into = kQ;
    add(10, "dq = q: refused", g);
  }
  {  // (12) exact window bounds: row 0 of sq 4, sk 2 under (-1, 2) sees key 0 only
    Call c = make(kFwd, test::dense(b4.dtype, 1, 4, 2, 1, 1, b4.dim).window(-1, 2), Expect::kValid);
    const int D = b4.dim;
    c.edit_data = [D](std::array<Buf, kSlots>& b) {
      set_row(b[kV], 0, D, 0.5);
      set_row(b[kV], 1, D, -2.0);
    };
    c.check_values = [D](const test::Results& got) {
      return expect_row(got.out, 0, D, 0.5, 1e-3, "row 0 (sees key 0 only)");
    };
    add(12, "window (-1, 2), sq 4, sk 2: row 0 = v[0]", c);
  }
  return cases;
}

}  // namespace flashlab::fuzz
