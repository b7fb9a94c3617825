#include "kernel_check.h"

#include <cstdlib>

#include <cctype>
#include <cstring>
#include <iostream>

namespace flashlab::test {

void* HostPlacement::scratch(size_t bytes) {
  if (bytes == 0) return nullptr;
  scratch_.push_back(std::make_unique<std::byte[]>(bytes));
  std::memset(scratch_.back().get(), 0xff, bytes);  // NaN as float, -1 as int
  return scratch_.back().get();
}

std::unique_ptr<Placement> make_host_placement() { return std::make_unique<HostPlacement>(); }

void Tally::finish(std::string_view kernel, std::string_view pass, size_t cases) const {
  std::string reasons;
  for (const std::string& r : unsupported) reasons += "\n    " + r;
  std::cout << "[ " << kernel << " " << pass << " ] ran " << ran << " cases, "
            << unsupported.size() << " unsupported" << (unsupported.empty() ? "" : ":")
            << reasons << std::endl;
  ::testing::Test::RecordProperty("cases_ran", ran);
  ::testing::Test::RecordProperty("cases_unsupported", int(unsupported.size()));
  if (ran == 0)
    ADD_FAILURE() << "kernel '" << kernel << "' ran none of the " << cases << " " << pass
                  << " cases (" << unsupported.size() << " unsupported):" << reasons;
}

namespace {

// The rule's yardstick (run_lowp in the input dtype) and the same code in fp32 on the same
// inputs. The fp32 run proves that the yardstick and the oracle compute the same attention
// (a mask convention, say): it must match the oracle to 1e-4 of the values' size, which
// holds by construction (fp32 rounds ~1e-7, so even a thousandfold cancellation stays 100x
// below). The rounded run cannot serve as that proof: in bf16 its gradients stray by up to
// a tenth of their size where long rows cancel (a softcapped row of 1k keys reached 12%).
struct Yardstick {
  Results lowp, fp32;
};

Yardstick run_yardstick(const Problem& p, const Inputs& in, bool with_backward) {
  Yardstick y;
  y.lowp = run_lowp(p, in, with_backward);
  Problem p32 = p;
  p32.dtype = DType::kF32;
  y.fp32 = p.dtype == DType::kF32 ? y.lowp : run_lowp(p32, in, with_backward);
  return y;
}

// Checks one output quantity against the oracle under the rule, after checking that the
// yardstick computes what the oracle computes.
void expect_rule(std::string_view name, const std::vector<double>& kernel,
                 const std::vector<double>& lowp, const std::vector<double>& fp32,
                 const std::vector<double>& oracle, double magnitude, double from_out = 0) {
  const MaxError ek = max_abs_err(kernel, oracle);
  const MaxError el = max_abs_err(lowp, oracle);
  const MaxError e32 = max_abs_err(fp32, oracle);
  EXPECT_LE(e32.value, yardstick_cap(DType::kF32, oracle))
      << name << ": the yardstick in fp32 strays from the oracle by " << describe(e32)
      << "; they disagree on what attention computes here, so the rule would prove nothing";
  EXPECT_TRUE(within_rule(name, ek, el, magnitude, from_out));
}

// The inputs' bytes before the run, to prove the kernel did not write them.
struct Snapshot {
  const HostTensor* t;
  std::string name;
  std::vector<std::byte> bytes;
};

void expect_unchanged(const std::vector<Snapshot>& snaps) {
  for (const Snapshot& s : snaps)
    EXPECT_TRUE(s.t->storage() == s.bytes) << "the kernel wrote its input '" << s.name << "'";
}

bool fetch_all(Placement& where, std::initializer_list<HostTensor*> ts) {
  bool ok = true;
  for (HostTensor* t : ts)
    if (t->rank() > 0) ok = where.fetch(*t) && ok;
  return ok && where.ok();
}

// select_kernel for the named kernel: true to go on, false (tallied or failed) to stop.
template <class Args>
bool selectable(std::string_view kernel, const Case& c, const Args& a, Tally* tally) {
  std::string name;
  const Status s = select_kernel(a, &name);
  if (s.code() == StatusCode::kUnsupported) {
    tally->unsupported.push_back(c.name + ": " + s.message());
    return false;
  }
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "select_kernel for a valid call";
  if (!s.ok()) return false;
  EXPECT_EQ(name, kernel);
  return true;
}

template <class Args>
bool give_workspace(Args* a, Placement& where) {
  size_t bytes = 0;
  const Status s = workspace_size(*a, &bytes);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "workspace_size after select_kernel agreed";
  if (!s.ok()) return false;
  a->workspace = where.scratch(bytes);
  a->workspace_bytes = bytes;
  return where.ok();
}

}  // namespace

void check_forward(std::string_view kernel, const Case& c, PlacementFactory make_placement,
                   Tally* tally) {
  const Problem& p = c.problem;
  FLASHLAB_SEED_TRACE();
  SCOPED_TRACE("case '" + c.name + "': " + p.describe());
  std::mt19937_64 rng = rng_for(std::string(kernel) + "/forward/" + c.name);
  Inputs in = make_inputs(p, rng);
  HostTensor out = make_out(p);
  HostTensor lse = p.with_lse ? make_lse(p) : HostTensor();
  std::unique_ptr<Placement> where = make_placement();

  ForwardArgs a = forward_args(p, where->place(in.q), where->place(in.k), where->place(in.v),
                               where->place(out), where->place(lse), where->place(in.cu_q),
                               where->place(in.cu_k));
  if (!where->ok()) return;
  a.kernel = kernel;
  a.stream = where->stream();
  if (!selectable(kernel, c, a, tally)) return;
  if (!give_workspace(&a, *where)) return;
  const std::vector<Snapshot> inputs = {
      {&in.q, "q", in.q.storage()}, {&in.k, "k", in.k.storage()}, {&in.v, "v", in.v.storage()}};

  const Status s = forward(a);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "forward of a call select_kernel accepted";
  if (!s.ok() || !fetch_all(*where, {&out, &lse, &in.q, &in.k, &in.v})) return;
  ++tally->ran;

  EXPECT_TRUE(out.written_exactly("out"));
  if (p.with_lse) {
    EXPECT_TRUE(lse.written_exactly("lse"));
  }
  expect_unchanged(inputs);

  const Results oracle = run_reference_fp64(p, in, false);
  const Yardstick y = run_yardstick(p, in, false);
  if (oracle.out.size() != size_t(p.total_q() * p.heads_q * p.head_dim_v)) return;  // reported
  expect_rule("out", out.to_f64(), y.lowp.out, y.fp32.out, oracle.out, magnitude_of(oracle.out));
  if (p.with_lse) {
    expect_rule("lse", lse.to_f64(), y.lowp.lse, y.fp32.lse, oracle.lse, magnitude_of(oracle.lse));
  }
}

void check_backward(std::string_view kernel, const Case& c, PlacementFactory make_placement,
                    Tally* tally) {
  Problem p = c.problem;
  p.with_lse = true;  // the backward needs the forward's LSE
  FLASHLAB_SEED_TRACE();
  SCOPED_TRACE("case '" + c.name + "': " + p.describe());
  std::mt19937_64 rng = rng_for(std::string(kernel) + "/backward/" + c.name);
  Inputs in = make_inputs(p, rng);
  HostTensor out = make_out(p), lse = make_lse(p);
  HostTensor dq = make_like_q(p), dk = make_like_kv(p, p.head_dim),
             dv = make_like_kv(p, p.head_dim_v);
  std::unique_ptr<Placement> where = make_placement();

  BackwardArgs a = backward_args(p, where->place(in.q), where->place(in.k), where->place(in.v),
                                 where->place(out), where->place(in.dout), where->place(lse),
                                 where->place(dq), where->place(dk), where->place(dv),
                                 where->place(in.cu_q), where->place(in.cu_k));
  if (!where->ok()) return;
  a.kernel = kernel;
  a.stream = where->stream();
  if (!selectable(kernel, c, a, tally)) return;

  const Results oracle = run_reference_fp64(p, in, true);
  const Yardstick y = run_yardstick(p, in, true);
  if (oracle.dq.size() != size_t(p.total_q() * p.heads_q * p.head_dim)) return;  // reported

  // The forward of record, as in training: the kernel's own forward when it takes this
  // call, else what "auto" runs on the same device (a backward-only kernel's partner),
  // else the oracle's outputs rounded to the dtype. The backward must cancel the error of
  // a real forward's LSE against its own recomputed scores; the oracle's fp64 LSE would
  // not let it (a peaked softmax then amplifies the score error).
  ForwardArgs fa = forward_args(p, a.q, a.k, a.v, a.out, a.lse, a.maybe_cu_seqlens_q,
                                a.maybe_cu_seqlens_k);
  fa.stream = a.stream;
  const KernelInfo* info = find_kernel(kernel);
  std::string fwd_name;
  fa.kernel = kernel;
  bool have_forward = info && info->has_forward && select_kernel(fa, &fwd_name).ok();
  if (!have_forward) {
    fa.kernel = "auto";
    have_forward = select_kernel(fa, &fwd_name).ok();
  }
  if (have_forward) {
    SCOPED_TRACE("forward of record: " + fwd_name);
    if (!give_workspace(&fa, *where)) return;
    const Status s = forward(fa);
    EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "forward of record (" << fwd_name << ")";
    if (!s.ok() || !fetch_all(*where, {&out, &lse})) return;
  } else {
    std::cout << "  (" << kernel << " backward, case '" << c.name
              << "': no forward on this device takes the call; the oracle's out and lse are "
                 "its input)"
              << std::endl;
    out.assign(oracle.out);
    lse.assign(oracle.lse);
    where->place(out);  // re-uploads into the same view
    where->place(lse);
    if (!where->ok()) return;
  }
  if (!give_workspace(&a, *where)) return;
  const std::vector<Snapshot> inputs = {
      {&in.q, "q", in.q.storage()},          {&in.k, "k", in.k.storage()},
      {&in.v, "v", in.v.storage()},          {&out, "out", out.storage()},
      {&in.dout, "dout", in.dout.storage()}, {&lse, "lse", lse.storage()}};

  const Status s = backward(a);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "backward of a call select_kernel accepted";
  if (!s.ok() || !fetch_all(*where, {&dq, &dk, &dv, &in.q, &in.k, &in.v, &out, &in.dout, &lse}))
    return;
  ++tally->ran;

  EXPECT_TRUE(dq.written_exactly("dq"));
  EXPECT_TRUE(dk.written_exactly("dk"));
  EXPECT_TRUE(dv.written_exactly("dv"));
  expect_unchanged(inputs);
  expect_rule("dq", dq.to_f64(), y.lowp.dq, y.fp32.dq, oracle.dq,
              gradient_magnitude(oracle.dq, y.lowp.dq_terms), y.lowp.dq_from_out);
  expect_rule("dk", dk.to_f64(), y.lowp.dk, y.fp32.dk, oracle.dk,
              gradient_magnitude(oracle.dk, y.lowp.dk_terms), y.lowp.dk_from_out);
  expect_rule("dv", dv.to_f64(), y.lowp.dv, y.fp32.dv, oracle.dv, magnitude_of(oracle.dv));
}

void run_suite(std::string_view kernel, bool backward, const std::vector<Case>& cases,
               PlacementFactory where) {
  const KernelInfo* info = find_kernel(kernel);
  ASSERT_NE(info, nullptr) << "kernel '" << kernel << "' is not in the registry";
  if (!info->has_forward && !info->has_backward) {
    ADD_FAILURE() << "kernel '" << kernel << "' registers neither a forward nor a backward pass ("
                  << info->summary << "): it ran 0 cases";
    return;
  }
  if (backward ? !info->has_backward : !info->has_forward)
    GTEST_SKIP() << "kernel '" << kernel << "' has no " << (backward ? "backward" : "forward")
                 << " pass (" << info->summary << ")";
  // FLASHLAB_TEST_CASES=a,b,... keeps the cases whose name contains one of the parts: the
  // reduced set that runs under compute-sanitizer (scripts/gpu-check.sh).
  std::vector<std::string> parts;
  if (const char* env = std::getenv("FLASHLAB_TEST_CASES"); env && *env) {
    std::string list = env;
    for (size_t pos = 0; pos <= list.size();) {
      const size_t comma = std::min(list.find(',', pos), list.size());
      if (comma > pos) parts.push_back(list.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  const auto selected = [&](const Case& c) {
    if (parts.empty()) return true;
    for (const std::string& part : parts)
      if (c.name.find(part) != std::string::npos) return true;
    return false;
  };
  Tally tally;
  size_t count = 0;
  for (const Case& c : cases) {
    if (!selected(c)) continue;
    ++count;
    if (backward) check_backward(kernel, c, where, &tally);
    else check_forward(kernel, c, where, &tally);
  }
  tally.finish(kernel, backward ? "backward" : "forward", count);
}

void check_dropout_mask(std::string_view kernel, DType dtype, PlacementFactory make_placement) {
  const KernelInfo* info = find_kernel(kernel);
  ASSERT_NE(info, nullptr) << "kernel '" << kernel << "' is not in the registry";
  if (!info->forward_dropout)
    GTEST_SKIP() << "kernel '" << kernel << "' takes no dropout (" << info->summary << ")";
  FLASHLAB_SEED_TRACE();
  std::mt19937_64 rng = rng_for(std::string(kernel) + "/dropout mask");
  constexpr int kKeys = 64;  // = head_dim_v: V is the identity
  constexpr float kP = 0.3f;
  Problem p = dense(dtype, 2, 300, kKeys, 4, 2, 64).no_lse().scaled(0.05f);
  p.drop(kP, rng(), rng() >> 40);
  SCOPED_TRACE(p.describe());
  Inputs in = make_inputs(p, rng);
  for (int64_t e = 0; e < in.v.numel(); ++e) {
    const int64_t d = e % kKeys, j = (e / (kKeys * p.heads_kv)) % kKeys;  // [b, j, hk, d]
    in.v.set(e, d == j ? 1.0 : 0.0);
  }
  HostTensor out = make_out(p);
  std::unique_ptr<Placement> where = make_placement();
  ForwardArgs a = forward_args(p, where->place(in.q), where->place(in.k), where->place(in.v),
                               where->place(out), Tensor{}, Tensor{}, Tensor{});
  if (!where->ok()) return;
  a.kernel = kernel;
  a.stream = where->stream();
  std::string name;
  const Status sel = select_kernel(a, &name);
  if (sel.code() == StatusCode::kUnsupported) GTEST_SKIP() << sel.message();
  ASSERT_OK(sel);
  if (!give_workspace(&a, *where)) return;
  ASSERT_OK(forward(a));
  ASSERT_TRUE(fetch_all(*where, {&out}));

  // out[b, i, h, j] = P_ij · M_ij / (1 − p): zero exactly where the mask drops (b, h, i, j).
  const DropoutPolicy policy = dropout_of(p);
  const std::vector<double> o = out.to_f64();
  int64_t dropped = 0, wrong = 0, total = 0;
  std::string first_wrong;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.seqlen_q; ++i)
      for (int h = 0; h < p.heads_q; ++h)
        for (int j = 0; j < kKeys; ++j) {
          const double x = o[size_t(((int64_t(b) * p.seqlen_q + i) * p.heads_q + h) * kKeys + j)];
          const bool want_kept = policy.keep(uint32_t(b * p.heads_q + h), i, j);
          dropped += x == 0.0;
          ++total;
          if ((x != 0.0) != want_kept && wrong++ == 0)
            first_wrong = "(b " + std::to_string(b) + ", i " + std::to_string(i) + ", h " +
                          std::to_string(h) + ", j " + std::to_string(j) + ") out " +
                          std::to_string(x) + (want_kept ? ", kept by the policy" : ", dropped by the policy");
        }
  EXPECT_EQ(wrong, 0) << wrong << " of " << total << " elements disagree with "
                      << "DropoutPolicy::keep; first " << first_wrong;
  const double fraction = double(dropped) / double(total);
  EXPECT_NEAR(fraction, kP, 0.01) << dropped << " of " << total << " dropped";
  std::cout << "[ " << kernel << " dropout ] dropped " << fraction << " of " << total
            << " (p = " << kP << ")" << std::endl;
}

std::vector<std::string> cpu_kernels_under_test() {
  std::vector<std::string> names;
  for (const KernelInfo& k : kernels())
    if (k.arch == "cpu" && k.name != "cpu_reference") names.emplace_back(k.name);
  return names;
}

std::vector<std::string> gpu_kernels_under_test() {
  std::vector<std::string> names;
  for (const KernelInfo& k : kernels())
    if (k.arch != "cpu") names.emplace_back(k.name);
  return names;
}

const KernelInfo* find_kernel(std::string_view name) {
  for (const KernelInfo& k : kernels())
    if (k.name == name) return &k;
  return nullptr;
}

std::string kernel_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

}  // namespace flashlab::test
