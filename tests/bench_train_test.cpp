// The harness's training step (Problem::train): its FLOPs (3.5x the forward's), its
// operands, the registry kernels' calls (forward then backward, checked on out, LSE and
// the gradients), a peer's outputs checked the same way (out against the forward's
// tolerance, the gradients against theirs, none of them optional), and the sweep's passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/check.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

Problem train_problem(int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, bool causal) {
  Problem p;
  p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
  p.head_dim = p.head_dim_v = 16;
  p.causal = causal;
  p.train = true;
  return p;
}

Options train_options(double check_flops = 80e9) {
  Options o;
  o.progress = false, o.seed = 3, o.threads = 2;
  o.timing.warmup = 1, o.timing.iters = 2;
  o.check_flops = check_flops;
  return o;
}

TEST(BenchTrain, FlopsAreThreeAndAHalfForwards) {
  EXPECT_EQ(kTrainFlopFactor, 3.5);
  for (bool causal : {false, true}) {
    Problem p = train_problem(2, 4, 2, 100, 140, causal);
    Problem fwd = p, bwd = p;
    fwd.train = bwd.train = false;
    bwd.backward = true;
    EXPECT_EQ(pass_flops(p), 3.5 * pass_flops(fwd));
    EXPECT_EQ(pass_flops(p), pass_flops(fwd) + pass_flops(bwd));
    p.backward = true;  // ignored by a train problem
    EXPECT_EQ(pass_flops(p), 3.5 * pass_flops(fwd));
    set_lengths(p, {30, 70, 1});
    fwd.lengths = p.lengths, fwd.batch = 3, fwd.seqlen_q = fwd.seqlen_k = 70;
    EXPECT_EQ(pass_flops(p), 3.5 * pass_flops(fwd)) << "varlen";
  }
}

TEST(BenchTrain, OperandsAreTheBackwardsInputsAndEveryOutput) {
  const Problem p = train_problem(1, 2, 2, 8, 8, false);
  EXPECT_TRUE(computes_gradients(p));
  EXPECT_EQ(random_inputs_of(p), (std::vector<Slot>{kQ, kK, kV, kDout}));
  EXPECT_EQ(outputs_of(p), (std::vector<Slot>{kOut, kLse, kDq, kDk, kDv}));
  for (Slot s : {kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv}) EXPECT_TRUE(slot_used(p, s)) << slot_name(s);
}

TEST(BenchTrain, TheSweepAddsATrainPassAfterTheOthers) {
  Sweep s;
  s.head_dims = {128}, s.seqlens = {4096}, s.causal = {true};
  s.train = true;
  const std::vector<Problem> all = sweep_problems(s);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_TRUE(!all[0].backward && !all[0].train);
  EXPECT_TRUE(all[1].backward && !all[1].train);
  EXPECT_TRUE(!all[2].backward && all[2].train);
  s.forward = s.backward = false;
  const std::vector<Problem> train = sweep_problems(s);
  ASSERT_EQ(train.size(), 1u);
  EXPECT_TRUE(train[0].train && train[0].batch == 4 && train[0].heads_q == 16);
  EXPECT_EQ(varlen_problems(s, {100, 300}).size(), 1u);
}

TEST(BenchTrain, ADecodeProblemHasNoTrainingStep) {
  Problem p = train_problem(1, 4, 2, 1, 64, false);
  p.decode = true;
  std::unique_ptr<Bench> b;
  EXPECT_EQ(Bench::create(p, train_options(), &b).code(), StatusCode::kInvalidArgument);
}

// The registry kernels run the forward and then the backward in every call: the checked
// call starts from outputs poisoned with NaN, so out, LSE and the gradients all being
// written and within tolerance means both passes ran in it (timed calls use the same launch).
TEST(BenchTrain, RegistryKernelsAreCheckedOnEveryOutput) {
  for (bool causal : {false, true})
    for (bool sliced : {false, true}) {
      const Problem p = train_problem(2, 4, 2, 48, 64, causal);
      Options o = train_options(sliced ? pass_flops(p) / 8 : 80e9);
      o.kernels = {"cpu_flash", "cpu_reference"};
      Report r;
      ASSERT_TRUE(run_bench(p, o, &r).ok());
      ASSERT_EQ(r.rows.size(), 2u);
      for (const Row& row : r.rows) {
        const std::string what = row.kernel + (causal ? " causal" : "") + (sliced ? " sliced" : "");
        EXPECT_EQ(row.status, RowStatus::kOk) << what << ": " << row.reason;
        EXPECT_EQ(row.flops, pass_flops(p)) << what;
        EXPECT_GT(row.time_ms, 0.0) << what;
        EXPECT_LT(row.err_out, 1e-4) << what;
        EXPECT_LT(row.err_lse, 1e-4) << what;
        EXPECT_LT(row.err_dq, 2e-4) << what;
        // dk/dv: compared on a causal slice (keys no earlier row sees); not without a bound.
        EXPECT_EQ(std::isnan(row.err_dk), sliced && !causal) << what;
        if (!std::isnan(row.err_dk)) {
          EXPECT_LT(std::max(row.err_dk, row.err_dv), 2e-4) << what;
        }
      }
      EXPECT_NE(r.checked.find("out/lse 1.0e-04, dq/dk/dv 2.0e-04"), std::string::npos) << r.checked;
      EXPECT_EQ(r.inputs.find("out and LSE for the backward"), std::string::npos) << r.inputs;
      EXPECT_EQ(r.checked.find("query rows") != std::string::npos, sliced) << r.checked;
    }
}

// A peer's training step through the public API: forward then backward with cpu_reference
// into its own buffers; `spoil` then changes what it returns.
struct TrainPeer {
  std::vector<float> out, lse, dq, dk, dv;
  Outputs views;
  int calls = 0;

  Status run(const Bench& b) {
    ++calls;
    const Problem& p = b.problem();
    auto like = [](std::vector<float>& buf, Tensor t) {  // the harness's view, on `buf`
      buf.assign(size_t(t.numel()), 0.f);
      t.data = buf.data();
      return t;
    };
    views.out = like(out, b.input(0, Operand::kOut));
    views.lse = like(lse, b.input(0, Operand::kLse));
    views.dq = like(dq, b.input(0, Operand::kQ));
    views.dk = like(dk, b.input(0, Operand::kK));
    views.dv = like(dv, b.input(0, Operand::kV));
    ForwardArgs f;
    f.q = b.input(0, Operand::kQ), f.k = b.input(0, Operand::kK), f.v = b.input(0, Operand::kV);
    f.out = views.out, f.maybe_lse = views.lse;
    BackwardArgs g;
    g.q = f.q, g.k = f.k, g.v = f.v, g.out = views.out, g.lse = views.lse, g.dout = b.input(0, Operand::kDout);
    g.dq = views.dq, g.dk = views.dk, g.dv = views.dv;
    for (CommonArgs* a : {static_cast<CommonArgs*>(&f), static_cast<CommonArgs*>(&g)})
      a->causal = p.causal, a->kernel = "cpu_reference", a->num_threads = 2;
    std::vector<std::byte> ws;
    auto with_workspace = [&](auto& a) {
      size_t bytes = 0;
      if (Status s = workspace_size(a, &bytes); !s.ok()) return s;
      ws.resize(bytes);
      a.workspace = ws.data(), a.workspace_bytes = bytes;
      return Status{};
    };
    if (Status s = with_workspace(f); !s.ok()) return s;
    if (Status s = forward(f); !s.ok()) return s;
    if (Status s = with_workspace(g); !s.ok()) return s;
    return backward(g);
  }
};

Entry add_train_peer(Bench& b, TrainPeer& peer, void (*spoil)(TrainPeer&, Outputs&)) {
  Entry e;
  const Status s = b.add("peer", [&](int) { return peer.run(b); },
                         [&](Outputs* o) {
                           *o = peer.views;
                           spoil(peer, *o);
                           return Status{};
                         },
                         &e);
  EXPECT_TRUE(s.ok()) << s.message();
  return e;
}

TEST(BenchTrain, APeersOutAndGradientsAreCheckedAndRequired) {
  struct Case {
    const char* name;
    void (*spoil)(TrainPeer&, Outputs&);
    const char* reason;  // empty: passes
  };
  const Case cases[] = {
      {"as computed", [](TrainPeer&, Outputs&) {}, ""},
      {"without lse", [](TrainPeer&, Outputs& o) { o.lse = {}; }, ""},
      // 1.5e-4 is over out's fp32 tolerance (1e-4) but under the gradients' (2e-4 x scale):
      // out is judged as a forward's output.
      {"out off by 1.5e-4", [](TrainPeer& t, Outputs&) { t.out[5] += 1.5e-4f; }, "out: error"},
      {"dk off by 1e-2", [](TrainPeer& t, Outputs&) { t.dk[3] += 1e-2f; }, "dk: error"},
      {"dv not written", [](TrainPeer& t, Outputs&) { t.dv[0] = NAN; }, "dv: 1 of"},
      {"without out", [](TrainPeer&, Outputs& o) { o.out = {}; }, "out: not returned"},
      {"without dq", [](TrainPeer&, Outputs& o) { o.dq = {}; }, "dq: not returned"},
  };
  for (const Case& c : cases) {
    const Problem p = train_problem(2, 4, 2, 24, 40, true);
    std::unique_ptr<Bench> b;
    ASSERT_TRUE(Bench::create(p, train_options(), &b).ok());
    TrainPeer peer;
    Entry e = add_train_peer(*b, peer, c.spoil);
    const bool pass = std::string(c.reason).empty();
    EXPECT_EQ(e.row.status, pass ? RowStatus::kOk : RowStatus::kFail) << c.name << ": " << e.row.reason;
    EXPECT_NE(e.row.reason.find(c.reason), std::string::npos) << c.name << ": " << e.row.reason;
    EXPECT_EQ(bool(e.launch), pass) << c.name;
    if (!pass) continue;
    EXPECT_FALSE(std::isnan(e.row.err_out) || std::isnan(e.row.err_dq) || std::isnan(e.row.err_dk)) << c.name;
    Entry* entries[] = {&e};
    ASSERT_TRUE(b->time(entries).ok());
    EXPECT_EQ(peer.calls, 1 + e.row.warmup_runs + e.row.timed_runs) << c.name;
    Problem fwd = p;
    fwd.train = false;
    EXPECT_EQ(e.row.flops, 3.5 * pass_flops(fwd)) << c.name;
  }
}

// A backward alone must return its gradients too; its out is an input, never required.
TEST(BenchTrain, ABackwardPeerWithoutGradientsFails) {
  Problem p = train_problem(1, 2, 2, 16, 16, false);
  p.train = false, p.backward = true;
  std::unique_ptr<Bench> b;
  ASSERT_TRUE(Bench::create(p, train_options(), &b).ok());
  Entry e;
  ASSERT_TRUE(b->add("peer", [](int) { return Status{}; }, [](Outputs*) { return Status{}; }, &e).ok());
  EXPECT_EQ(e.row.status, RowStatus::kFail);
  EXPECT_NE(e.row.reason.find("dq: not returned; dk: not returned; dv: not returned"), std::string::npos)
      << e.row.reason;
}

TEST(BenchTrain, ATrainSliceTakesWholeKvGroupsAndTheKeysOnlyItsRowsSee) {
  const Problem p = train_problem(2, 4, 2, 200, 200, true);
  const Slice s = choose_slice(p, pass_flops(p) / 20, 2);
  EXPECT_FALSE(s.full);
  EXPECT_EQ(s.heads_q % 2, 0);
  EXPECT_GT(s.row0, 0);
  EXPECT_EQ(s.key0, s.row0);
  EXPECT_NE(slice_string(p, s).find("dk/dv on keys"), std::string::npos) << slice_string(p, s);
}

}  // namespace
}  // namespace flashlab::bench
