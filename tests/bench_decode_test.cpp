// The harness's decode problems (Problem::decode, the KV-cache call): the caches and tables
// it makes, the check against a dense forward on the gathered cache (which a call that
// reads the pages in the wrong order fails), the bytes and the GB/s of a row, and the
// CPU kernels through forward_kvcache's CPU path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "bench/check.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

Problem decode(int batch, int heads_q, int heads_kv, int seqlen_q, int cache, int page_size, int append) {
  Problem p;
  p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q, p.seqlen_k = cache;
  p.head_dim = p.head_dim_v = 32;
  p.decode = true, p.page_size = page_size, p.seqlen_new = append;
  return p;
}

Options quiet() {
  Options o;
  o.progress = false;
  o.seed = 5;
  o.threads = 2;
  o.timing.warmup = 0, o.timing.iters = 2;
  return o;
}

TEST(BenchDecode, TheCachesAndTablesMatchTheProblem) {
  const Problem p = decode(3, 4, 2, 1, 100, 16, 2);
  EXPECT_EQ(pages_per_sequence(p), 7);  // ceil(100 / 16)
  const Tensor k = slot_view(p, kK, nullptr);
  EXPECT_EQ(k.shape[0], 21);
  EXPECT_EQ(k.shape[1], 16);
  EXPECT_EQ(slot_view(p, kKNew, nullptr).shape[1], 2);
  EXPECT_EQ(table_values(p, kSeqlens, 1), std::vector<int32_t>(3, 98));
  std::vector<int32_t> pages = table_values(p, kTable, 1);
  EXPECT_NE(pages, table_values(p, kTable, 2));  // each input set has its own shuffle
  std::sort(pages.begin(), pages.end());
  std::vector<int32_t> all(21);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(pages, all);  // every page of the pool once
  Problem contiguous = decode(3, 4, 2, 1, 100, 0, 0);
  EXPECT_EQ(slot_view(contiguous, kK, nullptr).shape[1], 100);
  EXPECT_FALSE(slot_view(contiguous, kTable, nullptr).present());
  EXPECT_FALSE(slot_view(contiguous, kKNew, nullptr).present());
}

TEST(BenchDecode, BytesAndNames) {
  Problem p = decode(2, 8, 2, 1, 4096, 0, 0);
  p.dtype = DType::kBF16;
  EXPECT_EQ(kv_bytes(p), 2.0 * 2 * 4096 * 2 * 32 * 2);
  EXPECT_EQ(pass_flops(p), 2 * 8 * 1 * 4096 * 2.0 * (32 + 32));
  EXPECT_EQ(shape_string(p), "2x8/2x1/4096x32 bf16 kvcache");
  p.page_size = 256, p.seqlen_new = 1;
  EXPECT_EQ(shape_string(p), "2x8/2x1/4096x32 bf16 kvcache paged(256) append(1)");
  p.rotary = true;
  EXPECT_EQ(shape_string(p), "2x8/2x1/4096x32 bf16 kvcache paged(256) append(1) rotary");
  Row r;
  r.kv_bytes = 4e9, r.time_ms = 2;
  EXPECT_DOUBLE_EQ(r.gbps(), 2000);
  r.status = RowStatus::kFail;
  EXPECT_TRUE(std::isnan(r.gbps()));
}

TEST(BenchDecode, ABackwardOrAnAppendLongerThanTheCacheIsRefused) {
  std::unique_ptr<Bench> b;
  Problem p = decode(1, 2, 2, 1, 64, 0, 0);
  p.backward = true;
  EXPECT_EQ(Bench::create(p, quiet(), &b).code(), StatusCode::kInvalidArgument);
  p = decode(1, 2, 2, 1, 64, 0, 65);
  EXPECT_EQ(Bench::create(p, quiet(), &b).code(), StatusCode::kInvalidArgument);
  p = decode(1, 2, 2, 1, 64, 0, 0);
  p.rotary = true;  // nothing appended: no keys to turn
  EXPECT_EQ(Bench::create(p, quiet(), &b).code(), StatusCode::kInvalidArgument);
}

// Both CPU kernels through forward_kvcache, paged and appending, causal over several query
// rows: checked against the dense forward, timed, with GB/s.
TEST(BenchDecode, CpuKernelsPassTheCheck) {
  for (int page_size : {0, 16}) {
    Problem p = decode(2, 4, 2, 3, 90, page_size, 2);
    p.causal = true;
    p.rotary = page_size > 0;  // with the identity tables the call checks as without
    Options o = quiet();
    o.kernels = {"cpu_flash", "cpu_reference"};
    Report r;
    ASSERT_TRUE(run_bench(p, o, &r).ok());
    ASSERT_EQ(r.rows.size(), 2u);
    for (const Row& row : r.rows) {
      EXPECT_EQ(row.status, RowStatus::kOk) << row.kernel << ": " << row.reason;
      EXPECT_LT(row.err_out, 1e-5) << row.kernel;
      EXPECT_GT(row.gbps(), 0) << row.kernel;
      EXPECT_EQ(row.kv_bytes, kv_bytes(p));
    }
  }
}

// A peer that calls forward_kvcache on the harness's operands, with the block table of the
// input set or with the pages in pool order; only the first matches the dense reference
// on the gathered cache.
RowStatus peer_status(bool table_in_order, std::string* why) {
  const Problem p = decode(2, 4, 2, 1, 64, 16, 1);
  Options o = quiet();
  std::unique_ptr<Bench> b;
  EXPECT_TRUE(Bench::create(p, o, &b).ok());
  std::vector<float> out(size_t(slot_view(p, kOut, nullptr).numel()));
  std::vector<int32_t> in_order(size_t(p.batch * pages_per_sequence(p)));
  std::iota(in_order.begin(), in_order.end(), 0);
  std::vector<char> ws;
  auto launch = [&](int set) {
    KvCacheArgs a;
    a.q = b->input(set, Operand::kQ), a.k_cache = b->input(set, Operand::kK), a.v_cache = b->input(set, Operand::kV);
    a.maybe_k_new = b->input(set, Operand::kKNew), a.maybe_v_new = b->input(set, Operand::kVNew);
    a.maybe_cache_seqlens = b->input(set, Operand::kCacheSeqlens);
    a.maybe_block_table = b->input(set, Operand::kBlockTable);
    if (table_in_order) a.maybe_block_table.data = in_order.data();
    a.out = slot_view(p, kOut, out.data());
    a.kernel = "cpu_flash";
    size_t bytes = 0;
    if (Status s = workspace_size(a, &bytes); !s.ok()) return s;
    ws.resize(bytes);
    a.workspace = ws.data(), a.workspace_bytes = ws.size();
    return forward_kvcache(a);
  };
  Entry e;
  const Status s = b->add("peer", launch, [&](Outputs* w) {
    w->out = slot_view(p, kOut, out.data());
    return Status{};
  }, &e);
  EXPECT_TRUE(s.ok()) << s.message();
  *why = e.row.reason;
  return e.row.status;
}

TEST(BenchDecode, TheCheckReadsTheCacheThroughTheBlockTable) {
  std::string why;
  EXPECT_EQ(peer_status(false, &why), RowStatus::kOk) << why;
  EXPECT_EQ(peer_status(true, &why), RowStatus::kFail);
  EXPECT_NE(why.find("out: error"), std::string::npos) << why;
}

TEST(BenchDecode, ProblemsRunOneAfterTheOtherInOneReport) {
  Options o = quiet();
  o.kernels = {"cpu_flash"};
  const Problem ps[] = {decode(1, 2, 1, 1, 32, 0, 0), decode(1, 2, 1, 1, 80, 0, 0)};
  Report r;
  std::vector<size_t> groups;
  ASSERT_TRUE(run_problems(ps, o, &r, &groups).ok());
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(groups, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(r.rows[1].problem.seqlen_k, 80);
  EXPECT_EQ(r.rows[1].status, RowStatus::kOk) << r.rows[1].reason;
}

}  // namespace
}  // namespace flashlab::bench
