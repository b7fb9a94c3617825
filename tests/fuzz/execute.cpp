#include "execute.h"

#include <gtest/gtest-spi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "common/mask.h"

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlab::fuzz {

std::string device_error(const Env& env) {
#if FLASHLAB_WITH_CUDA
  if (env.device != Device::kCUDA) return "";
  cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(env.stream));
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess)
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
#else
  (void)env;
#endif
  return "";
}

namespace {

// Above this the call is accepted but not run (only extreme calls may get here).
constexpr size_t kMaxWorkspace = size_t(1) << 30;

Outcome fail(const char* cls, std::string msg) { return {Outcome::kFailed, cls, std::move(msg)}; }

std::string status_str(const Status& s) {
  return std::string(to_string(s.code())) + (s.message().empty() ? "" : " (" + s.message() + ")");
}

Status call_api(const ForwardArgs& a) { return forward(a); }
Status call_api(const BackwardArgs& a) { return backward(a); }

// The oracle's answer and the yardstick's: the same-dtype run (the rule's bound) and the
// same code in fp32, which proves that the yardstick computes what the oracle computes
// (tests/kernel_check.cpp's sanity check).
struct Reference {
  test::Results oracle, lowp, fp32;
};

// docs/DESIGN.md's rule for one output quantity: "" when it holds. *against_rule is set when
// it fails the rule proper (test_util's rule_bound), not a fallback bound.
std::string rule(const std::string& name, DType dt, const std::vector<double>& got,
                 const std::vector<double>& lowp, const std::vector<double>& fp32,
                 const std::vector<double>& oracle, double magnitude, double from_out,
                 bool* against_rule) {
  *against_rule = false;
  const test::MaxError ek = test::max_abs_err(got, oracle);
  if (dt == DType::kF64) {
    const double bound = 1e-9 * magnitude;
    if (ek.value <= bound) return "";
    return name + ": max abs error vs the fp64 oracle " + test::describe(ek) + " > " +
           std::to_string(bound) + " (fp64: 1e-9 of the values' magnitude)";
  }
  const test::MaxError e32 = test::max_abs_err(fp32, oracle);
  if (e32.value <= test::yardstick_cap(DType::kF32, oracle)) {
    const ::testing::AssertionResult r =
        test::within_rule(name, ek, test::max_abs_err(lowp, oracle), magnitude, from_out);
    *against_rule = !r && std::isfinite(ek.value);
    return r ? "" : r.message();
  }
  // The yardstick overflows fp32 (huge logits): the rule would pass anything, so the bound
  // is the cap test_util puts on a yardstick's own error.
  const double cap = test::yardstick_cap(dt, oracle);
  if (std::isfinite(ek.value) && ek.value <= cap) return "";
  return name + ": max abs error vs the fp64 oracle " + test::describe(ek) + " > " +
         std::to_string(cap) + " (the fp32 yardstick strays by " + test::describe(e32) +
         ", so the bound is test_util's yardstick_cap)";
}

class Run {
 public:
  Run(const Call& c, const Env& env) : c_(c), env_(env) {}

  std::string allocate();
  Tensor view(int slot) const {
    return buf_[slot].present() ? buf_[slot].view(env_.device, env_.device_index) : Tensor{};
  }
  // Scratch of exactly `bytes`, filled with 0xff (kernels must not expect zeros).
  void* scratch(size_t bytes, std::string* err);
  std::string forward_of_record(const BackwardArgs& a);
  void snapshot_inputs();
  std::string download();
  Outcome judge();

 private:
  std::string oracle(bool with_backward, test::Results* oracle, Reference* yardstick);
  std::string nonfinite_rows(const test::Results& got);
  void mask_rows(test::Results* r) const;

  const Call& c_;
  const Env& env_;
  std::array<Buf, kSlots> buf_;
  std::array<std::vector<std::byte>, kSlots> before_;
  test::Problem po_;  // the problem and its inputs as the oracle and yardsticks see them
  test::Inputs in_;
  std::vector<size_t> masked_out_, masked_lse_;  // elements of rows that see an Inf or NaN
  std::vector<std::unique_ptr<Storage>> scratch_;
};

std::string Run::allocate() {
  std::mt19937_64 rng(c_.data_seed);
  for (int slot = 0; slot < kSlots; ++slot) {
    const Layout& l = c_.layout[slot];
    if (l.rank() == 0) continue;
    const DType dt = c_.dtype_of(slot);
    if (c_.same_as[slot] >= 0) {
      buf_[slot] = buf_[c_.same_as[slot]];
      continue;
    }
    if (slot == c_.alias_slot) {
      buf_[slot] = Buf(dt, l, buf_[c_.alias_into], c_.alias_byte_offset);
      continue;
    }
    size_t extra = 0;
    if (slot == c_.alias_into) {
      const size_t own = size_t(l.span()) * dtype_size(dt);
      const size_t need = c_.alias_byte_offset + size_t(c_.layout[c_.alias_slot].span()) *
                                                     dtype_size(c_.dtype_of(c_.alias_slot));
      extra = need > own ? need - own : 0;
    }
    buf_[slot] = Buf(dt, l, env_.device, extra);
    std::memset(buf_[slot].storage().host(), 0xff, buf_[slot].storage().bytes());
    if (!buf_[slot].storage().error().empty()) return buf_[slot].storage().error();
  }
  if (c_.p.varlen())
    for (int slot : {kCuQ, kCuK}) {
      const std::vector<int>& lens = slot == kCuQ ? c_.p.lens_q : c_.p.lens_k;
      int64_t acc = 0;
      buf_[slot].set(0, 0);
      for (size_t b = 0; b < lens.size(); ++b)
        buf_[slot].set(int64_t(b) + 1, double(acc += lens[b]));
    }
  for (int slot : {kQ, kK, kV, kDout}) {
    if (!buf_[slot].present() || c_.same_as[slot] >= 0) continue;
    buf_[slot].fill_random(rng);
    if (c_.nan_padding && slot != kDout) buf_[slot].set_unseen(std::nan(""));
  }
  for (const NonFinite& n : c_.nonfinite) buf_[n.slot].set(n.index, n.value);
  for (int slot : {kOut, kLse, kDq, kDk, kDv})
    if (buf_[slot].present()) buf_[slot].poison();
  if (c_.edit_data) c_.edit_data(buf_);
  for (const Buf& b : buf_)
    if (b.present() && !b.storage().upload()) return b.storage().error();
  return "";
}

void* Run::scratch(size_t bytes, std::string* err) {
  if (bytes == 0) return nullptr;
  scratch_.push_back(std::make_unique<Storage>(bytes, env_.device));
  Storage& s = *scratch_.back();
  std::memset(s.host(), 0xff, bytes);
  if (!s.upload()) *err = s.error();
  return s.where();
}

std::string Run::download() {
  for (const Buf& b : buf_)
    if (b.present() && !b.storage().download()) return b.storage().error();
  return "";
}

void Run::snapshot_inputs() {
  for (int slot = 0; slot < kSlots; ++slot)
    if (buf_[slot].present() && is_input(c_, slot)) before_[slot] = buf_[slot].span_copy();
}

std::string Run::oracle(bool with_backward, test::Results* oracle, Reference* yardstick) {
  po_ = c_.p;
  po_.num_threads = 0;
  in_ = {};
  in_.q = buf_[kQ].logical();
  in_.k = buf_[kK].logical();
  in_.v = buf_[kV].logical();
  if (with_backward) in_.dout = buf_[kDout].logical();
  if (po_.varlen()) {
    in_.cu_q = buf_[kCuQ].logical();
    in_.cu_k = buf_[kCuK].logical();
  }
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter capture(&failures);
    *oracle = test::run_reference_fp64(po_, in_, with_backward);
  }
  if (failures.size() > 0) return failures.GetTestPartResult(0).message();
  if (!yardstick) return "";
  yardstick->lowp = test::run_lowp(po_, in_, with_backward);
  test::Problem p32 = po_;
  p32.dtype = DType::kF32;
  yardstick->fp32 =
      po_.dtype == DType::kF32 ? yardstick->lowp : test::run_lowp(p32, in_, with_backward);
  return "";
}

// The forward whose out and LSE the backward gets, as in training: the kernel's own when it
// takes the call, else what "auto" runs on the device, else the oracle's rounded to dtype.
std::string Run::forward_of_record(const BackwardArgs& a) {
  ForwardArgs f;
  static_cast<CommonArgs&>(f) = static_cast<const CommonArgs&>(a);
  f.q = a.q;
  f.k = a.k;
  f.v = a.v;
  f.out = a.out;
  f.maybe_lse = a.lse;
  std::string name;
  bool ok = false;
  for (const KernelInfo& k : kernels())
    if (k.name == c_.kernel) ok = k.has_forward && select_kernel(f, &name).ok();
  if (!ok) {
    f.kernel = kAutoKernel;
    ok = select_kernel(f, &name).ok();
  }
  if (!ok) {
    test::Results o;
    if (std::string err = oracle(false, &o, nullptr); !err.empty()) return "oracle forward: " + err;
    for (size_t i = 0; i < o.out.size(); ++i) buf_[kOut].set(int64_t(i), o.out[i]);
    for (size_t i = 0; i < o.lse.size(); ++i) buf_[kLse].set(int64_t(i), o.lse[i]);
    if (!buf_[kOut].storage().upload() || !buf_[kLse].storage().upload())
      return buf_[kOut].storage().error() + buf_[kLse].storage().error();
    return "";
  }
  size_t need = 0;
  if (Status s = workspace_size(f, &need); !s.ok())
    return "forward of record (" + name + ") workspace_size: " + status_str(s);
  std::string err;
  f.workspace = scratch(need, &err);
  f.workspace_bytes = need;
  if (!err.empty()) return err;
  const Status s = forward(f);
  if (err = device_error(env_); !err.empty()) return "forward of record (" + name + "): " + err;
  if (!s.ok()) return "forward of record (" + name + "): " + status_str(s);
  for (int slot : {kOut, kLse})
    if (!buf_[slot].storage().download()) return buf_[slot].storage().error();
  return "";
}

// Rows that see a NaN (in their query, or a visible key's K or V) and no Inf must be
// non-finite; rows that see no non-finite value stay in the rule's comparison; the others
// (an Inf among what they see: all their logits may be -inf) leave it.
// docs/DESIGN.md: a NaN or Inf reaches only the rows that see it, and a row that sees no key
// is 0 with LSE -inf.
std::string Run::nonfinite_rows(const test::Results& got) {
  const test::Problem& p = c_.p;
  const int Hq = p.heads_q, Hk = p.heads_kv, D = p.head_dim, Dv = p.head_dim_v, G = Hq / Hk;
  auto row_flags = [](const Buf& b, int64_t row, int dim) {
    int f = 0;
    for (int d = 0; d < dim; ++d) {
      const double x = b.get(row * dim + d);
      f |= std::isnan(x) ? 1 : std::isinf(x) ? 2 : 0;
    }
    return f;
  };
  const MaskPolicy mask = MaskPolicy::make(p.window_left, p.window_right, p.causal, p.max_len_q(),
                                           p.max_len_k(), p.softcap);
  int64_t start_q = 0, start_k = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int lq = p.varlen() ? p.lens_q[b] : p.seqlen_q,
              lk = p.varlen() ? p.lens_k[b] : p.seqlen_k;
    for (int i = 0; i < lq; ++i)
      for (int h = 0; h < Hq; ++h) {
        const int64_t t = start_q + i;
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        // A row that sees no key is 0 with LSE -inf whatever its query holds.
        int lse_f = jb < je ? row_flags(buf_[kQ], t * Hq + h, D) : 0, out_f = 0;
        for (int j = jb; j < je; ++j) {
          lse_f |= row_flags(buf_[kK], (start_k + j) * Hk + h / G, D);
          out_f |= row_flags(buf_[kV], (start_k + j) * Hk + h / G, Dv);
        }
        out_f |= lse_f;
        const std::string where = "(batch " + std::to_string(b) + ", row " + std::to_string(i) +
                                  ", head " + std::to_string(h) + ")";
        const int64_t orow = (t * Hq + h) * Dv;
        bool finite = true;
        for (int d = 0; d < Dv; ++d) finite = finite && std::isfinite(got.out[size_t(orow + d)]);
        if (out_f == 1 && finite) return "out row " + where + " sees a NaN but is finite";
        for (int d = 0; d < Dv && out_f; ++d) masked_out_.push_back(size_t(orow + d));
        if (got.lse.empty()) continue;
        const size_t li = size_t(p.varlen() ? int64_t(h) * p.total_q() + t
                                            : (int64_t(b) * Hq + h) * p.seqlen_q + i);
        if (lse_f == 1 && std::isfinite(got.lse[li]))
          return "lse " + where + " sees a NaN but is finite";
        if (lse_f) masked_lse_.push_back(li);
      }
    start_q += lq;
    start_k += lk;
  }
  return "";
}

void Run::mask_rows(test::Results* r) const {
  for (size_t i : masked_out_) r->out[i] = 0;
  for (size_t i : masked_lse_)
    if (!r->lse.empty()) r->lse[i] = 0;
}

Outcome Run::judge() {
  for (int slot = 0; slot < kSlots; ++slot) {
    if (!buf_[slot].present() || !is_input(c_, slot)) continue;
    const std::vector<std::byte> now = buf_[slot].span_copy();
    if (now != before_[slot]) {
      const size_t at =
          size_t(std::mismatch(now.begin(), now.end(), before_[slot].begin()).first - now.begin());
      return fail(kWrongResult, std::string("the call wrote its input ") + slot_name(slot) +
                                    " (byte " + std::to_string(at) + " of its span)");
    }
  }
  test::Results got;
  for (int slot : {kOut, kLse, kDq, kDk, kDv}) {
    const Buf& b = buf_[slot];
    if (!b.present() || !is_output(c_, slot)) continue;
    const std::vector<bool> seen = b.seen();
    for (size_t e = 0; e < seen.size(); ++e)
      if (!seen[e] && !b.is_poison(int64_t(e)))
        return fail(kWrongResult, std::string("the call wrote outside the view of ") +
                                      slot_name(slot) + " (element offset " + std::to_string(e) +
                                      ")");
    if (c_.expect == Expect::kNoCrash) continue;
    int64_t unwritten = 0, first = -1;
    for (int64_t i = 0; i < b.layout().numel(); ++i)
      if (b.is_poison(b.offset(i)) && unwritten++ == 0) first = i;
    if (unwritten)
      return fail(kWrongResult, std::to_string(unwritten) + " of " +
                                    std::to_string(b.layout().numel()) + " elements of " +
                                    slot_name(slot) + " never written (first: logical element " +
                                    std::to_string(first) + ")");
    std::vector<double>* dst[] = {&got.out, &got.lse, &got.dq, &got.dk, &got.dv};
    *dst[slot - kOut] = b.values();
  }
  if (c_.expect == Expect::kNoCrash) return {};

  Reference ref;
  if (std::string err = oracle(c_.backward(), &ref.oracle, &ref); !err.empty())
    return fail(kOracleFailure, err);
  if (!c_.nonfinite.empty() && !c_.backward()) {
    if (std::string err = nonfinite_rows(got); !err.empty()) return fail(kWrongResult, err);
    for (test::Results* r : {&got, &ref.oracle, &ref.lowp, &ref.fp32}) mask_rows(r);
  }
  // A quantity that fails the rule proper passes when it is within 2x the error of
  // FlashAttention-2's own rounding (test_util's emulation): the rule is then out of reach
  // for this call, which the summary counts apart.
  std::optional<test::Results> fa2;
  bool out_of_reach = false;
  // dq's and dk's slack is relative to the terms their sums cancel (test_util).
  auto magnitude_of = [&](std::vector<double> test::Results::*q) {
    if (q == &test::Results::dq) return test::gradient_magnitude(ref.oracle.dq, ref.lowp.dq_terms);
    if (q == &test::Results::dk) return test::gradient_magnitude(ref.oracle.dk, ref.lowp.dk_terms);
    return test::magnitude_of(ref.oracle.*q);
  };
  // ... and their bound adds what O's rounding can move them by (test_util).
  auto from_out = [&](std::vector<double> test::Results::*q) {
    if (q == &test::Results::dq) return ref.lowp.dq_from_out;
    if (q == &test::Results::dk) return ref.lowp.dk_from_out;
    return 0.0;
  };
  auto check = [&](const char* name, std::vector<double> test::Results::*q) {
    bool against_rule = false;
    const double magnitude = magnitude_of(q);
    std::string e = rule(name, c_.p.dtype, got.*q, ref.lowp.*q, ref.fp32.*q, ref.oracle.*q,
                         magnitude, from_out(q), &against_rule);
    if (e.empty() || !against_rule) return e;
    if (!fa2) {
      fa2 = test::run_fa2_emulation(po_, in_, c_.backward());
      mask_rows(&*fa2);
    }
    const test::MaxError ef = test::max_abs_err((*fa2).*q, ref.oracle.*q);
    const double bound = test::rule_bound(ef, magnitude, from_out(q));
    if (test::max_abs_err(got.*q, ref.oracle.*q).value > bound)
      return e + "; FlashAttention-2's rounding errs by " + test::describe(ef);
    out_of_reach = true;
    return std::string();
  };
  std::string err;
  if (c_.backward()) {
    err = check("dq", &test::Results::dq);
    if (err.empty()) err = check("dk", &test::Results::dk);
    if (err.empty()) err = check("dv", &test::Results::dv);
  } else {
    err = check("out", &test::Results::out);
    if (err.empty() && buf_[kLse].present()) err = check("lse", &test::Results::lse);
  }
  if (err.empty() && c_.check_values) err = c_.check_values(got);
  if (!err.empty()) return fail(kWrongResult, err);
  if (out_of_reach)
    return {Outcome::kOutOfReach, "",
            "within 2x FlashAttention-2's rounding, not 2x the yardstick's"};
  return {};
}

template <class Args>
Outcome run_pass(Run& r, const Call& c, const Env& env, Args& a) {
  std::string chosen;
  const Status sel = select_kernel(a, &chosen);
  size_t need = 0;
  const Status wss = workspace_size(a, &need);
  if (sel.code() != wss.code())
    return fail(kDisagreement,
                "select_kernel: " + status_str(sel) + "; workspace_size: " + status_str(wss));
  if (!sel.ok()) {
    // The pass must refuse it the same way, before touching anything.
    Args b = a;
    b.workspace = nullptr;
    b.workspace_bytes = 0;
    const Status s = call_api(b);
    if (std::string err = device_error(env); !err.empty()) return fail(kCudaError, err);
    if (s.code() != sel.code())
      return fail(s.ok() ? kInvalidAccepted : kDisagreement,
                  "select_kernel: " + status_str(sel) + "; the pass itself: " + status_str(s));
    if (c.expect != Expect::kValid) return {Outcome::kRefused, "", status_str(sel)};
    if (sel.code() == StatusCode::kUnsupported && !sel.message().empty())
      return {Outcome::kUnsupported, "", sel.message()};
    return fail(kValidRefused, status_str(sel));
  }
  if (c.expect == Expect::kInvalid && c.workspace == Workspace::kGiven)
    return fail(kInvalidAccepted, "select_kernel chose " + chosen + " (workspace " +
                                      std::to_string(need) + " bytes)");
  if (c.kernel != kAutoKernel && chosen != c.kernel)
    return fail(kDisagreement, "select_kernel chose " + chosen + " for kernel = " + c.kernel);
  if (need > kMaxWorkspace) {
    if (c.expect == Expect::kValid)
      return fail(kWrongResult,
                  "workspace_size asks " + std::to_string(need) + " bytes for a small call");
    return {Outcome::kNotRun, "",
            "accepted by " + chosen + " with a workspace of " + std::to_string(need) + " bytes"};
  }
  const bool refusal_due = c.workspace != Workspace::kGiven && need > 0;
  std::string err;
  const size_t given = c.workspace == Workspace::kShort && need > 0 ? need - 1 : need;
  a.workspace = c.workspace == Workspace::kNull ? nullptr : r.scratch(given, &err);
  a.workspace_bytes = given;
  if (!err.empty()) return fail(kCudaError, err);
  if constexpr (std::is_same_v<Args, BackwardArgs>) {
    if (err = r.forward_of_record(a); !err.empty()) return fail(kWrongResult, err);
  }
  r.snapshot_inputs();
  const Status s = call_api(a);
  if (err = device_error(env); !err.empty()) return fail(kCudaError, err);
  if (refusal_due) {
    if (s.ok())
      return fail(kInvalidAccepted, "ran with workspace_bytes " + std::to_string(given) + " of " +
                                        std::to_string(need));
    return {Outcome::kRefused, "", status_str(s)};
  }
  if (!s.ok())
    return fail(kDisagreement, "select_kernel accepted it (" + chosen + ") but the pass returned " +
                                   status_str(s));
  if (err = r.download(); !err.empty()) return fail(kCudaError, err);
  return r.judge();
}

}  // namespace

Outcome execute(const Call& c, const Env& env) {
  Run r(c, env);
  if (std::string err = r.allocate(); !err.empty()) return fail(kCudaError, err);
  const test::Problem& p = c.p;
  auto common = [&](auto& a, Target& t) {
    a.kernel = c.kernel;
    a.stream = env.stream;
    if (c.max_seqlen_q >= 0) a.max_seqlen_q = c.max_seqlen_q;
    if (c.max_seqlen_k >= 0) a.max_seqlen_k = c.max_seqlen_k;
    if (c.quadratic_limit) a.quadratic_workspace_limit = c.quadratic_limit;
    if constexpr (requires { a.check_inputs; }) a.check_inputs = c.check_inputs;
    t.c = &a;
    t.t[kCuQ] = &a.maybe_cu_seqlens_q;
    t.t[kCuK] = &a.maybe_cu_seqlens_k;
    t.t[kQ] = &a.q;
    t.t[kK] = &a.k;
    t.t[kV] = &a.v;
    t.t[kOut] = &a.out;
  };
  Target t;
  if (c.backward()) {
    BackwardArgs a = test::backward_args(p, r.view(kQ), r.view(kK), r.view(kV), r.view(kOut),
                                         r.view(kDout), r.view(kLse), r.view(kDq), r.view(kDk),
                                         r.view(kDv), r.view(kCuQ), r.view(kCuK));
    a.deterministic = c.deterministic;
    common(a, t);
    t.t[kLse] = &a.lse;
    t.t[kDout] = &a.dout;
    t.t[kDq] = &a.dq;
    t.t[kDk] = &a.dk;
    t.t[kDv] = &a.dv;
    if (c.edit_args) c.edit_args(t);
    return run_pass(r, c, env, a);
  }
  ForwardArgs a = test::forward_args(p, r.view(kQ), r.view(kK), r.view(kV), r.view(kOut),
                                     r.view(kLse), r.view(kCuQ), r.view(kCuK));
  common(a, t);
  t.t[kLse] = &a.maybe_lse;
  if (c.edit_args) c.edit_args(t);
  return run_pass(r, c, env, a);
}

}  // namespace flashlab::fuzz
