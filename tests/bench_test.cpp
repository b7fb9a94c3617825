// The benchmark harness (include/flashlab/bench.h): the FLOP formula against a brute-force
// count of visible pairs, the run plan, alternating rounds, the check of an
// implementation's outputs (against a reference made once per problem), the checked
// slice of a large problem, and packed varlen problems.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench/check.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

// ---- FLOPs ------------------------------------------------------------------------------

// Visible (query, key) pairs of one sequence, straight from the definition in
// docs/DESIGN.md: row i's diagonal key is i + len_k - len_q, it sees keys within
// [diag - left, diag + right] (a bound of -1 is unbounded; causal is right = 0).
int64_t brute_pairs(int len_q, int len_k, int left, int right, bool causal) {
  if (causal) right = 0;
  int64_t n = 0;
  for (int i = 0; i < len_q; ++i)
    for (int j = 0; j < len_k; ++j) {
      const int diag = i + len_k - len_q;
      n += (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
    }
  return n;
}

Problem problem(int b, int hq, int hkv, int sq, int sk, int d, int dv) {
  Problem p;
  p.batch = b, p.heads_q = hq, p.heads_kv = hkv, p.seqlen_q = sq, p.seqlen_k = sk;
  p.head_dim = d, p.head_dim_v = dv;
  return p;
}

double flops_of(const Problem& p) {
  double f = -1;
  EXPECT_TRUE(attention_flops(shape_args(p), &f).ok());
  return f;
}

TEST(BenchFlops, DenseIsFourBHSSDWhenDvEqualsD) {
  const Problem p = problem(2, 3, 3, 64, 96, 32, 32);
  EXPECT_EQ(flops_of(p), 4.0 * 2 * 3 * 64 * 96 * 32);
}

TEST(BenchFlops, MasksCountExactlyTheVisiblePairs) {
  struct Mask {
    int left, right;
    bool causal;
  };
  const Mask masks[] = {{-1, -1, true}, {-1, 0, false}, {16, 0, false}, {7, 3, false},
                        {-1, 5, false}, {40, -1, false}, {3, 2, true}, {0, 0, false}};
  const std::pair<int, int> lengths[] = {{64, 64}, {40, 100}, {100, 40}, {1, 77}, {77, 1}};
  for (const Mask& m : masks) {
    for (auto [sq, sk] : lengths) {
      Problem p = problem(3, 4, 2, sq, sk, 64, 48);
      p.window_left = m.left, p.window_right = m.right, p.causal = m.causal;
      const double want = 3.0 * 4 * 2 * (64 + 48) * double(brute_pairs(sq, sk, m.left, m.right, m.causal));
      EXPECT_EQ(flops_of(p), want) << "window (" << m.left << ", " << m.right << "), causal "
                                   << m.causal << ", " << sq << "x" << sk;
    }
  }
}

TEST(BenchFlops, CausalSquareIsTheTriangleWithItsDiagonal) {
  Problem p = problem(2, 8, 8, 1024, 1024, 128, 128);
  p.causal = true;
  EXPECT_EQ(flops_of(p), 2.0 * 8 * 2 * (128 + 128) * (1024.0 * 1025 / 2));
}

TEST(BenchFlops, BackwardIsTwoAndAHalfForwards) {
  Problem p = problem(1, 2, 2, 100, 200, 64, 64);
  p.causal = true;
  const double fwd = pass_flops(p);
  p.backward = true;
  EXPECT_EQ(pass_flops(p), kBackwardFlopFactor * fwd);
}

TEST(BenchFlops, VarlenSumsEverySequenceWithHostCuSeqlens) {
  const std::vector<int32_t> cu_q = {0, 5, 5, 105, 140}, cu_k = {0, 9, 39, 139, 141};
  const int heads_q = 6, heads_kv = 3, d = 64, dv = 32;
  ForwardArgs a;
  a.q = Tensor::contiguous(nullptr, DType::kF16, {140, heads_q, d});
  a.k = Tensor::contiguous(nullptr, DType::kF16, {141, heads_kv, d});
  a.v = Tensor::contiguous(nullptr, DType::kF16, {141, heads_kv, dv});
  a.maybe_cu_seqlens_q = Tensor::contiguous(const_cast<int32_t*>(cu_q.data()), DType::kI32, {5});
  a.maybe_cu_seqlens_k = Tensor::contiguous(const_cast<int32_t*>(cu_k.data()), DType::kI32, {5});
  a.window_left = 20;
  a.causal = true;
  int64_t pairs = 0;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b)
    pairs += brute_pairs(cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b], 20, -1, true);
  double f = 0;
  ASSERT_TRUE(attention_flops(a, &f).ok());
  EXPECT_EQ(f, double(pairs) * heads_q * 2 * (d + dv));

  a.maybe_cu_seqlens_q.device = Device::kCUDA;
  const Status s = attention_flops(a, &f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.message();
}

TEST(BenchFlops, BytesOfADecodeCallAreItsKeysAndValues) {
  Sweep s;
  s.decode_seqlens = {4096};
  const Problem p = decode_problems(s).at(0);
  EXPECT_EQ(p.seqlen_q, 1);
  EXPECT_EQ(kv_bytes(p), 2.0 * 1 * 4096 * 8 * 128 * 2);  // bf16 K and V
}

TEST(BenchSweep, FixedTokensAndHiddenSize) {
  Sweep s;
  // 2048 / 96 = 21.3 heads, rounded down; 4096 is wider than the hidden size.
  s.head_dims = {64, 96, 256, 4096};
  s.seqlens = {1024, 3000, 16384};  // 3000 does not divide 16384 tokens
  s.causal = {true};
  s.backward = false;
  const std::vector<Problem> ps = sweep_problems(s);
  ASSERT_EQ(ps.size(), 6u);
  EXPECT_EQ(ps[0].batch, 16);
  EXPECT_EQ(ps[0].heads_q, 32);
  EXPECT_EQ(ps[2].heads_q, 21);
  EXPECT_EQ(ps[2].heads_kv, 21);
  EXPECT_EQ(ps[5].batch, 1);
  EXPECT_EQ(ps[5].heads_q, 8);
  for (const Problem& p : ps) EXPECT_TRUE(p.causal && !p.backward);
}

// ---- timing -----------------------------------------------------------------------------

TEST(BenchTiming, PlanFitsTheBudget) {
  TimingOptions o;
  o.warmup = 5, o.iters = 20, o.budget_ms = 3000;
  EXPECT_EQ(plan_runs(3500, o).timed, 1);  // over budget: one timed call, no warm-up
  EXPECT_EQ(plan_runs(3500, o).warmup, 0);
  EXPECT_EQ(plan_runs(500, o).timed, 6);   // six calls fit
  EXPECT_EQ(plan_runs(500, o).warmup, 1);  // warm-up: at most a quarter of them
  EXPECT_EQ(plan_runs(1, o).timed, 20);
  EXPECT_EQ(plan_runs(1, o).warmup, 5);
  EXPECT_EQ(plan_runs(1000, o).timed, kMinTimedRuns);
  o.rounds = 3;  // each round gets a third of the budget
  EXPECT_EQ(plan_runs(500, o).timed, 3);
  EXPECT_EQ(plan_runs(1500, o).timed, 1);
}

TEST(BenchTiming, MedianOfEvenAndOdd) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 2, 3}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
}

Options quiet_options() {
  Options o;
  o.progress = false;
  o.seed = 7;
  o.threads = 2;
  return o;
}

std::unique_ptr<Bench> make_bench(const Problem& p, const Options& o) {
  std::unique_ptr<Bench> b;
  const Status s = Bench::create(p, o, &b);
  EXPECT_TRUE(s.ok()) << s.message();
  return b;
}

TEST(BenchTiming, RoundsAlternateTheEntriesAndTakeTheMedianOfTheirMedians) {
  Options o = quiet_options();
  o.check = false;
  o.timing.warmup = 1, o.timing.iters = 3, o.timing.rounds = 4;
  auto b = make_bench(problem(1, 1, 1, 8, 8, 16, 16), o);
  std::string calls;
  std::vector<Entry> entries(3);
  for (int i = 0; i < 3; ++i) {
    const char name = char('a' + i);
    const Status s = b->add(std::string(1, name), [&calls, name](int) {
      calls += name;
      return Status{};
    }, [](Outputs*) { return Status{}; }, &entries[size_t(i)]);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(entries[size_t(i)].row.status, RowStatus::kUnchecked);
  }
  std::vector<Entry*> all = {&entries[0], &entries[1], &entries[2]};
  ASSERT_TRUE(b->time(all).ok());
  calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
  EXPECT_EQ(calls, "abc" "abc" "bca" "cab" "abc");  // the checked calls, then four rounds
  for (const Entry& e : entries) {
    ASSERT_EQ(e.row.round_ms.size(), 4u) << e.row.kernel;
    EXPECT_EQ(e.row.time_ms, median(e.row.round_ms));
    EXPECT_EQ(e.row.timed_runs, 4 * 3);
    EXPECT_EQ(e.row.warmup_runs, 4 * 1);
  }
}

// ---- the check --------------------------------------------------------------------------

// forward() with cpu_flash and a workspace of its own.
Status cpu_flash_forward(ForwardArgs a) {
  a.kernel = "cpu_flash";
  size_t bytes = 0;
  if (Status s = workspace_size(a, &bytes); !s.ok()) return s;
  std::vector<std::byte> ws(bytes);
  a.workspace = ws.data(), a.workspace_bytes = bytes;
  return forward(a);
}

// A peer that computes the forward with cpu_flash into its own buffer, then `spoil`s it.
struct Peer {
  std::vector<float> out;
  Tensor view;
  Status run(const Bench& b, void (*spoil)(std::vector<float>&)) {
    const Problem& p = b.problem();
    out.assign(size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim_v, 0.f);
    view = Tensor::contiguous(out.data(), DType::kF32, {p.batch, p.seqlen_q, p.heads_q, p.head_dim_v});
    ForwardArgs a;
    a.q = b.input(0, Operand::kQ), a.k = b.input(0, Operand::kK), a.v = b.input(0, Operand::kV);
    a.out = view;
    a.causal = p.causal;
    if (Status s = cpu_flash_forward(a); !s.ok()) return s;
    spoil(out);
    return {};
  }
};

RowStatus check_peer(void (*spoil)(std::vector<float>&), std::string* reason) {
  Problem p = problem(2, 4, 2, 33, 47, 16, 24);
  p.causal = true;
  auto b = make_bench(p, quiet_options());
  Peer peer;
  Entry e;
  const Status s = b->add("peer", [&](int) { return peer.run(*b, spoil); },
                          [&](Outputs* o) {
                            o->out = peer.view;
                            return Status{};
                          },
                          &e);
  EXPECT_TRUE(s.ok()) << s.message();
  *reason = e.row.reason;
  EXPECT_EQ(bool(e.launch), e.row.status == RowStatus::kOk);
  return e.row.status;
}

TEST(BenchCheck, APeerIsComparedWithTheFp64Reference) {
  std::string why;
  EXPECT_EQ(check_peer([](std::vector<float>&) {}, &why), RowStatus::kOk) << why;
  EXPECT_EQ(check_peer([](std::vector<float>& o) { o[100] += 1e-3f; }, &why), RowStatus::kFail);
  EXPECT_NE(why.find("out: error"), std::string::npos) << why;
  EXPECT_EQ(check_peer([](std::vector<float>& o) { o[7] = NAN; o[9] = NAN; }, &why), RowStatus::kFail);
  EXPECT_NE(why.find("out: 2 of"), std::string::npos) << why;
}

TEST(BenchCheck, AWrongShapeFails) {
  auto b = make_bench(problem(1, 2, 2, 16, 16, 16, 16), quiet_options());
  std::vector<float> out(16 * 2 * 16);
  Entry e;
  ASSERT_TRUE(b->add("peer", [](int) { return Status{}; },
                     [&](Outputs* o) {
                       o->out = Tensor::contiguous(out.data(), DType::kF32, {1, 2, 16, 16});
                       return Status{};
                     },
                     &e).ok());
  EXPECT_EQ(e.row.status, RowStatus::kFail);
  EXPECT_NE(e.row.reason.find("expected [1, 16, 2, 16]"), std::string::npos) << e.row.reason;
}

// The rows of run_bench on `p` with `kernels` (one timed call each).
Report bench_rows(const Problem& p, std::vector<std::string> kernels, double check_flops = 80e9) {
  Options o = quiet_options();
  o.kernels = std::move(kernels);
  o.timing.warmup = 0, o.timing.iters = 1;
  o.check_flops = check_flops;
  Report r;
  const Status s = run_bench(p, o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

// On fp32, cpu_reference's checked call is the reference (fp64 arithmetic rounded once to
// fp32), not a second fp64 run: it agrees with itself exactly, and another kernel's error
// moves by at most that rounding from what the computed reference gives.
TEST(BenchCheck, CpuReferenceOnFp32GivesTheReferenceWithItsCheckedCall) {
  for (bool backward : {false, true}) {
    Problem p = problem(2, 4, 2, 40, 56, 16, 16);
    p.causal = true;
    p.backward = backward;
    // The backward is checked on a slice: the reference is read off the full outputs.
    const double budget = backward ? pass_flops(p) / 4 : 80e9;
    const Report alone = bench_rows(p, {"cpu_flash"}, budget);
    const Report both = bench_rows(p, {"cpu_flash", "cpu_reference"}, budget);
    ASSERT_EQ(both.rows.size(), 2u);
    EXPECT_EQ(both.rows[0].kernel, "cpu_flash");  // rows keep the order asked for
    const Row& flash = both.rows[0];
    const Row& ref = both.rows[1];
    EXPECT_EQ(flash.status, RowStatus::kOk) << flash.reason;
    EXPECT_EQ(ref.status, RowStatus::kOk) << ref.reason;
    EXPECT_NE(both.checked.find("its checked call"), std::string::npos) << both.checked;
    EXPECT_EQ(alone.checked.find("its checked call"), std::string::npos) << alone.checked;
    const std::pair<double Row::*, const char*> errs[] = {
        {&Row::err_out, "out"}, {&Row::err_lse, "lse"}, {&Row::err_dq, "dq"},
        {&Row::err_dk, "dk"}, {&Row::err_dv, "dv"}};
    for (const auto& [err, name] : errs) {
      const double mine = ref.*err, before = alone.rows[0].*err, now = flash.*err;
      if (std::isnan(before)) {
        EXPECT_TRUE(std::isnan(now)) << name;
        continue;
      }
      EXPECT_EQ(mine, 0.0) << name;
      EXPECT_NEAR(now, before, 1e-6) << name;  // 2^-24 of values of a few units
    }
  }
}

TEST(BenchCheck, CpuReferenceOnBf16IsComparedWithTheFp64Reference) {
  Problem p = problem(1, 2, 2, 32, 32, 16, 16);
  p.dtype = DType::kBF16;
  const Report r = bench_rows(p, {"cpu_reference"});
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].status, RowStatus::kOk) << r.rows[0].reason;
  EXPECT_GT(r.rows[0].err_out, 0.0);  // its bf16 outputs against the fp64 ones
  EXPECT_EQ(r.checked.find("its checked call"), std::string::npos) << r.checked;
}

// ---- the slice --------------------------------------------------------------------------

TEST(BenchSlice, ABackwardSliceComparesTheKeysOnlyItsRowsSee) {
  Problem p = problem(2, 4, 2, 200, 200, 32, 32);
  p.backward = true;
  p.causal = true;
  const Slice s = choose_slice(p, pass_flops(p) / 20, 2);
  EXPECT_FALSE(s.full);
  EXPECT_EQ(s.heads_q % 2, 0);  // whole kv groups
  EXPECT_GT(s.row0, 0);
  EXPECT_EQ(s.key0, s.row0);  // causal, square: rows before row0 see keys before row0
  p.causal = false;
  EXPECT_FALSE(choose_slice(p, pass_flops(p) / 20, 2).keys_compared());
}

TEST(BenchSlice, ASlicedCheckPassesACorrectKernel) {
  for (bool causal : {true, false}) {
    Problem p = problem(2, 4, 2, 150, 170, 32, 32);
    p.backward = true;
    p.causal = causal;
    Options o = quiet_options();
    o.check_flops = pass_flops(p) / 10;
    auto b = make_bench(p, o);
    Entry e;
    ASSERT_TRUE(b->add_kernel("cpu_flash", &e).ok());
    EXPECT_EQ(e.row.status, RowStatus::kOk) << e.row.reason;
    EXPECT_FALSE(std::isnan(e.row.err_dq));
    EXPECT_EQ(std::isnan(e.row.err_dk), !causal);  // without a right bound: not compared
    Report r;
    b->describe(&r);
    EXPECT_NE(r.checked.find("query rows"), std::string::npos) << r.checked;
  }
}

// ---- varlen -----------------------------------------------------------------------------

TEST(BenchVarlen, DocumentsAreDeterministicAndFillTheTokensExactly) {
  std::vector<int> a, b, c;
  ASSERT_TRUE(document_lengths(16384, 100, 4000, 5, &a).ok());
  ASSERT_TRUE(document_lengths(16384, 100, 4000, 5, &b).ok());
  ASSERT_TRUE(document_lengths(16384, 100, 4000, 6, &c).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const std::vector<int>& docs : {a, c}) {
    EXPECT_EQ(std::accumulate(docs.begin(), docs.end(), 0), 16384);
    ASSERT_GE(docs.size(), 5u);  // 16384 / 4000
    for (size_t i = 0; i + 1 < docs.size(); ++i) {
      EXPECT_GE(docs[i], 100);
      EXPECT_LE(docs[i], 4000);
    }
    EXPECT_GE(docs.back(), 1);  // the last one cut to fill exactly
    EXPECT_LE(docs.back(), 4000);
  }
  ASSERT_TRUE(document_lengths(50, 100, 4000, 5, &a).ok());
  EXPECT_EQ(a, std::vector<int>{50});
  ASSERT_TRUE(document_lengths(30, 10, 10, 0, &a).ok());
  EXPECT_EQ(a, (std::vector<int>{10, 10, 10}));
  EXPECT_EQ(document_lengths(100, 0, 10, 0, &a).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(document_lengths(100, 20, 10, 0, &a).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(document_lengths(0, 1, 10, 0, &a).code(), StatusCode::kInvalidArgument);
}

Problem varlen_problem(std::vector<int> lengths, bool causal, bool backward) {
  Problem p = problem(1, 4, 2, 1, 1, 32, 16);
  p.causal = causal;
  p.backward = backward;
  set_lengths(p, std::move(lengths));
  return p;
}

TEST(BenchVarlen, FlopsAreTheSumOfTheSequencesDenseFlops) {
  const std::vector<int> lengths = {37, 5, 64, 1, 20};
  for (bool causal : {false, true})
    for (bool backward : {false, true}) {
      const Problem p = varlen_problem(lengths, causal, backward);
      EXPECT_EQ(p.batch, 5);
      EXPECT_EQ(p.seqlen_q, 64);
      double dense = 0;
      for (int len : lengths) {
        Problem one = problem(1, 4, 2, len, len, 32, 16);
        one.causal = causal, one.backward = backward;
        dense += pass_flops(one);
      }
      EXPECT_EQ(pass_flops(p), dense) << "causal " << causal << ", backward " << backward;
    }
  const Problem p = varlen_problem(lengths, true, false);
  EXPECT_EQ(kv_bytes(p), 127.0 * 2 * (32 + 16) * 4);  // K and V of every token, fp32
  EXPECT_EQ(shape_string(p), "varlen(5 docs, 127 tokens, max 64)x4/2x32/16 fp32");
  EXPECT_EQ(cu_seqlens_of(p), (std::vector<int32_t>{0, 37, 42, 106, 107, 127}));
}

// A peer that runs cpu_flash on the packed tokens as one sequence: right shapes, wrong
// attention (documents see each other).
struct OneSequencePeer {
  std::vector<float> out;
  Tensor view;
  Status run(const Bench& b) {
    const Problem& p = b.problem();
    const int64_t total = cu_seqlens_of(p).back();
    out.assign(size_t(total) * p.heads_q * p.head_dim_v, 0.f);
    view = Tensor::contiguous(out.data(), DType::kF32, {total, p.heads_q, p.head_dim_v});
    auto as_one = [&](Tensor t) {
      return Tensor::contiguous(t.data, t.dtype, {1, t.shape[0], t.shape[1], t.shape[2]});
    };
    ForwardArgs a;
    a.q = as_one(b.input(0, Operand::kQ)), a.k = as_one(b.input(0, Operand::kK));
    a.v = as_one(b.input(0, Operand::kV)), a.out = as_one(view);
    a.causal = p.causal;
    return cpu_flash_forward(a);
  }
};

TEST(BenchVarlen, CpuFlashIsCheckedAndTimedAgainstCpuReference) {
  for (bool backward : {false, true})
    for (bool sliced : {false, true}) {
      const Problem p = varlen_problem({37, 5, 64, 1, 20}, true, backward);
      // Sliced: the budget holds a part of the longest document alone.
      const Report r = bench_rows(p, {"cpu_flash", "cpu_reference"}, sliced ? pass_flops(p) / 8 : 80e9);
      ASSERT_EQ(r.rows.size(), 2u);
      for (const Row& row : r.rows) {
        EXPECT_EQ(row.status, RowStatus::kOk) << row.kernel << ": " << row.reason;
        EXPECT_GT(row.time_ms, 0.0) << row.kernel;
        EXPECT_EQ(row.flops, pass_flops(p));
        EXPECT_LT(backward ? row.err_dq : row.err_out, 1e-4) << row.kernel;
        EXPECT_LT(backward ? row.err_dk : row.err_lse, 1e-4) << row.kernel;  // NaN: not compared
      }
      EXPECT_EQ(r.checked.find("document 2 of 5 (64 tokens from token 42)") != std::string::npos, sliced)
          << r.checked;
      EXPECT_NE(r.inputs.find("documents (tokens): 37, 5, 64, 1, 20"), std::string::npos) << r.inputs;
    }
}

TEST(BenchVarlen, AnAttentionAcrossDocumentsFailsTheCheck) {
  for (bool sliced : {false, true}) {
    const Problem p = varlen_problem({37, 5, 64, 1, 20}, false, false);
    Options o = quiet_options();
    o.check_flops = sliced ? pass_flops(p) / 4 : 80e9;
    auto b = make_bench(p, o);
    OneSequencePeer peer;
    Entry e;
    ASSERT_TRUE(b->add("one sequence", [&](int) { return peer.run(*b); },
                       [&](Outputs* out) {
                         out->out = peer.view;
                         return Status{};
                       },
                       &e).ok());
    EXPECT_EQ(e.row.status, RowStatus::kFail) << "sliced " << sliced;
    EXPECT_NE(e.row.reason.find("out: error"), std::string::npos) << e.row.reason;
  }
}

TEST(BenchVarlen, TheSweepBecomesOneProblemPerHeadDimMaskAndDirection) {
  Sweep s;
  s.head_dims = {64, 128};
  std::vector<int> docs;
  ASSERT_TRUE(document_lengths(s.tokens, 100, 4000, 0, &docs).ok());
  const std::vector<Problem> ps = varlen_problems(s, docs);
  ASSERT_EQ(ps.size(), 2u * 2 * 2);
  for (const Problem& p : ps) {
    EXPECT_EQ(p.lengths, docs);
    EXPECT_EQ(p.heads_q * p.head_dim, s.hidden);
    EXPECT_EQ(cu_seqlens_of(p).back(), s.tokens);
  }
  EXPECT_FALSE(ps[0].backward || ps[0].causal);  // per head dim: each mask, forward then backward
  EXPECT_TRUE(ps[1].backward && ps[2].causal && !ps[2].backward);
}

}  // namespace
}  // namespace flashlab::bench
