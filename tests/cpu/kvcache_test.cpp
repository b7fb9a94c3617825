// forward_kvcache on the CPU kernels against the fp64 oracle on the gathered cache.
//
// Each case draws a cache (contiguous, or paged with its pages shuffled through the pool),
// optional new rows, cache lengths and a query, runs forward_kvcache with the named kernel,
// and checks:
//   - the cache afterwards equals, byte for byte over its whole storage, a copy of the
//     cache before with the new rows written at cache_seqlens[b] by hand;
//   - out and LSE, over all sequences, within docs/DESIGN.md's rule against the oracle
//     (cpu_reference on fp64 copies) run per sequence on that sequence's rows [0, L_b) of
//     the expected cache, with the yardstick run on the same rows; a sequence with L_b = 0
//     must give out rows 0 and LSE -inf;
//   - every out and LSE element written, nothing around them, and the inputs unchanged.
// Then every refusal of the API, by message, with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "test_util.h"

namespace flashlab::test {
namespace {

constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct KvCase {
  std::string name;
  DType dtype;
  int seqlen_q, heads_q, heads_kv;
  int capacity;             // rows per sequence: seqlen_cache, or max_pages·page_size
  int page_size;            // 0: contiguous cache
  std::vector<int> cached;  // cache_seqlens (batch = its size)
  int seqlen_new = 0;       // 0: no append
  bool permuted = false;    // contiguous: cache_batch_idx a permutation over batch + 1 rows
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
};

constexpr int kDim = 32;

// The tensors of one case and the call over them.
struct KvCall {
  HostTensor q, k_cache, v_cache, k_new, v_new, seqlens, batch_idx, block_table, out, lse;
  std::vector<double> workspace;

  KvCacheArgs args(std::string_view kernel) const {
    KvCacheArgs a;
    a.kernel = kernel;
    a.q = q.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
    a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view();
    a.maybe_cache_seqlens = seqlens.view(), a.maybe_cache_batch_idx = batch_idx.view();
    a.maybe_block_table = block_table.view();
    a.out = out.view(), a.maybe_lse = lse.view();
    return a;
  }
};

// 0, 1, ..., n - 1 in a random order.
std::vector<double> shuffled(int64_t n, std::mt19937_64& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

KvCall make_call(const KvCase& c, std::mt19937_64& rng) {
  const int B = int(c.cached.size());
  KvCall k;
  k.q = HostTensor(c.dtype, {B, c.seqlen_q, c.heads_q, kDim});
  k.q.fill_random(rng);
  int64_t rows = B + (c.permuted ? 1 : 0), per_row = c.capacity;
  if (c.page_size > 0) {
    const int max_pages = c.capacity / c.page_size;
    rows = int64_t(B) * max_pages + 3;  // pages no sequence uses stay in the pool
    per_row = c.page_size;
    std::vector<double> pages = shuffled(rows, rng);
    pages.resize(size_t(B) * max_pages);
    for (int b = 0; b < B; ++b)  // entries past the pages a sequence uses are never read
      for (int j = 0; j < max_pages; ++j)
        if (int64_t(j) * c.page_size >= c.cached[b] + c.seqlen_new) pages[b * max_pages + j] = -1;
    k.block_table = HostTensor(DType::kI32, {B, max_pages});
    k.block_table.assign(pages);
  } else if (c.permuted) {
    std::vector<double> idx = shuffled(rows, rng);
    idx.resize(B);
    k.batch_idx = HostTensor(DType::kI32, {B});
    k.batch_idx.assign(idx);
  }
  // Padded head strides, so that the caches' and new rows' strides are not their shapes'.
  k.k_cache = HostTensor(c.dtype, {rows, per_row, c.heads_kv, kDim}, {0, 3});
  k.v_cache = HostTensor(c.dtype, {rows, per_row, c.heads_kv, kDim}, {0, 5});
  k.k_cache.fill_random(rng);
  k.v_cache.fill_random(rng);
  if (c.seqlen_new > 0) {
    k.k_new = HostTensor(c.dtype, {B, c.seqlen_new, c.heads_kv, kDim}, {1, 0});
    k.v_new = HostTensor(c.dtype, {B, c.seqlen_new, c.heads_kv, kDim});
    k.k_new.fill_random(rng);
    k.v_new.fill_random(rng);
  }
  k.seqlens = HostTensor(DType::kI32, {B});
  k.seqlens.assign(std::vector<double>(c.cached.begin(), c.cached.end()));
  k.out = HostTensor(c.dtype, {B, c.seqlen_q, c.heads_q, kDim});
  k.lse = HostTensor(DType::kF32, {B, c.heads_q, c.seqlen_q});
  k.out.poison();
  k.lse.poison();
  return k;
}

// Logical index of row `pos` (head 0, element 0) of sequence b in a cache.
int64_t cache_index(const KvCall& k, const KvCase& c, int b, int pos) {
  const int64_t row_elems = int64_t(c.heads_kv) * kDim;
  if (c.page_size > 0) {
    const int64_t page = int64_t(k.block_table.get(b * k.block_table.shape()[1] + pos / c.page_size));
    return (page * c.page_size + pos % c.page_size) * row_elems;
  }
  const int64_t r = c.permuted ? int64_t(k.batch_idx.get(b)) : b;
  return (r * c.capacity + pos) * row_elems;
}

// The caches as they must be after the call: the new rows written by hand.
void append_by_hand(const KvCall& k, const KvCase& c, HostTensor* kc, HostTensor* vc) {
  const int64_t row_elems = int64_t(c.heads_kv) * kDim;
  for (int b = 0; b < int(c.cached.size()); ++b)
    for (int t = 0; t < c.seqlen_new; ++t)
      for (int64_t e = 0; e < row_elems; ++e) {
        const int64_t dst = cache_index(k, c, b, c.cached[b] + t) + e;
        const int64_t src = (int64_t(b) * c.seqlen_new + t) * row_elems + e;
        kc->set(dst, k.k_new.get(src));
        vc->set(dst, k.v_new.get(src));
      }
}

// Sequence b alone: q[b] and rows [0, len) of its expected cache, as a dense problem.
Inputs sequence_inputs(const KvCall& k, const KvCase& c, const HostTensor& kc, const HostTensor& vc,
                       int b, int len) {
  Inputs in;
  in.q = HostTensor(c.dtype, {1, c.seqlen_q, c.heads_q, kDim});
  const int64_t q_elems = int64_t(c.seqlen_q) * c.heads_q * kDim;
  for (int64_t i = 0; i < q_elems; ++i) in.q.set(i, k.q.get(b * q_elems + i));
  in.k = HostTensor(c.dtype, {1, len, c.heads_kv, kDim});
  in.v = HostTensor(c.dtype, {1, len, c.heads_kv, kDim});
  const int64_t row_elems = int64_t(c.heads_kv) * kDim;
  for (int pos = 0; pos < len; ++pos)
    for (int64_t e = 0; e < row_elems; ++e) {
      in.k.set(pos * row_elems + e, kc.get(cache_index(k, c, b, pos) + e));
      in.v.set(pos * row_elems + e, vc.get(cache_index(k, c, b, pos) + e));
    }
  return in;
}

void append_to(std::vector<double>* all, const std::vector<double>& part) {
  all->insert(all->end(), part.begin(), part.end());
}

void check_case(std::string_view kernel, const KvCase& c) {
  FLASHLAB_SEED_TRACE();
  SCOPED_TRACE("case " + c.name);
  std::mt19937_64 rng = rng_for(std::string(kernel) + "/kvcache/" + c.name);
  KvCall k = make_call(c, rng);
  HostTensor want_k = k.k_cache, want_v = k.v_cache;
  append_by_hand(k, c, &want_k, &want_v);
  const HostTensor q0 = k.q, kn0 = k.k_new, vn0 = k.v_new, bt0 = k.block_table;

  KvCacheArgs a = k.args(kernel);
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  size_t bytes = 0;
  ASSERT_OK(workspace_size(a, &bytes));
  k.workspace.assign(bytes / sizeof(double) + 1, std::numeric_limits<double>::quiet_NaN());
  a.workspace = k.workspace.data();
  a.workspace_bytes = bytes;
  ASSERT_OK(forward_kvcache(a));

  EXPECT_TRUE(k.k_cache.storage() == want_k.storage()) << "k_cache is not the cache plus the new rows";
  EXPECT_TRUE(k.v_cache.storage() == want_v.storage()) << "v_cache is not the cache plus the new rows";
  EXPECT_TRUE(k.q.storage() == q0.storage() && k.k_new.storage() == kn0.storage() &&
              k.v_new.storage() == vn0.storage() && k.block_table.storage() == bt0.storage())
      << "forward_kvcache wrote an input";
  EXPECT_TRUE(k.out.written_exactly("out"));
  EXPECT_TRUE(k.lse.written_exactly("lse"));

  Results oracle, lowp;
  for (int b = 0; b < int(c.cached.size()); ++b) {
    const int len = c.cached[b] + c.seqlen_new;
    if (len == 0) {  // no key: out rows 0, LSE -inf, exactly
      const std::vector<double> zeros(size_t(c.seqlen_q) * c.heads_q * kDim, 0.0);
      const std::vector<double> empty(size_t(c.heads_q) * c.seqlen_q, -kInf);
      for (Results* r : {&oracle, &lowp}) append_to(&r->out, zeros), append_to(&r->lse, empty);
      continue;
    }
    Problem p = dense(c.dtype, 1, c.seqlen_q, len, c.heads_q, c.heads_kv, kDim)
                    .window(c.window_left, c.window_right)
                    .cap(c.softcap);
    p.causal = c.causal;
    const Inputs in = sequence_inputs(k, c, want_k, want_v, b, len);
    const Results o = run_reference_fp64(p, in, false), l = run_lowp(p, in, false);
    append_to(&oracle.out, o.out), append_to(&oracle.lse, o.lse);
    append_to(&lowp.out, l.out), append_to(&lowp.lse, l.lse);
  }
  const std::vector<double> got_out = k.out.to_f64(), got_lse = k.lse.to_f64();
  ASSERT_EQ(oracle.out.size(), got_out.size());
  ASSERT_EQ(oracle.lse.size(), got_lse.size());
  EXPECT_TRUE(within_rule("out", max_abs_err(got_out, oracle.out), max_abs_err(lowp.out, oracle.out),
                          magnitude_of(oracle.out)));
  EXPECT_TRUE(within_rule("lse", max_abs_err(got_lse, oracle.lse), max_abs_err(lowp.lse, oracle.lse),
                          magnitude_of(oracle.lse)));
}

std::vector<KvCase> cases() {
  std::vector<KvCase> cs;
  cs.push_back({"fp32_contiguous_decode", kF32, 1, 8, 8, 256, 0, {100, 37, 250}});
  cs.push_back({"bf16_contiguous_append4_causal_gqa4", kBF16, 4, 8, 2, 256, 0, {60, 0, 200}, 4});
  cs.back().causal = true;
  cs.push_back({"fp32_paged16_append1_gqa4", kF32, 1, 8, 2, 256, 16, {150, 33, 0}, 1});
  cs.push_back({"bf16_paged64_append16_causal", kBF16, 16, 8, 2, 384, 64, {100, 300, 7}, 16});
  cs.back().causal = true;
  cs.push_back({"fp32_zero_length_caches", kF32, 4, 8, 8, 128, 0, {0, 50, 0}});
  cs.push_back({"fp32_paged16_zero_length", kF32, 4, 8, 2, 128, 16, {0, 80}});
  cs.push_back({"bf16_paged64_window_softcap", kBF16, 4, 8, 2, 256, 64, {120, 200, 64}, 4});
  cs.back().window_left = 32, cs.back().window_right = 0, cs.back().softcap = 10.f;
  cs.push_back({"fp32_permuted_batch_idx_append2", kF32, 1, 8, 2, 256, 0, {10, 200, 90}, 2, true});
  cs.push_back({"bf16_permuted_window_sq16", kBF16, 16, 8, 8, 192, 0, {150, 40}, 0, true});
  cs.back().window_left = 20, cs.back().window_right = 5;
  return cs;
}

class KvCacheTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCacheTest, MatchesOracleOnTheGatheredCache) {
  for (const KvCase& c : cases()) check_case(GetParam(), c);
}

INSTANTIATE_TEST_SUITE_P(Cpu, KvCacheTest, ::testing::Values("cpu_reference", "cpu_flash"));

// One valid call (fp32, batch 2, seqlen_q 2, heads 4 / 2, a paged pool or a contiguous
// cache of 2 rows of 32, one new row), each test breaking it in one place.
class KvCacheValidationTest : public ::testing::Test {
 protected:
  KvCase contiguous{"contiguous", kF32, 2, 4, 2, 32, 0, {5, 9}, 1};
  KvCase paged{"paged", kF32, 2, 4, 2, 32, 16, {5, 20}, 1};

  // `a` is refused with `code` naming `names`; nothing is written: the caches, out and lse
  // keep their bytes, and workspace_size gives the same answer.
  void expect_rejected(const KvCall& k, const KvCacheArgs& a, StatusCode code,
                       std::initializer_list<std::string_view> names) {
    const HostTensor kc = k.k_cache, vc = k.v_cache;
    const Status s = forward_kvcache(a);
    EXPECT_TRUE(status_is(s, code, names));
    EXPECT_TRUE(k.k_cache.storage() == kc.storage() && k.v_cache.storage() == vc.storage())
        << "a refused call wrote the cache";
    EXPECT_TRUE(k.out.untouched("out"));
    EXPECT_TRUE(k.lse.untouched("lse"));
    size_t bytes = 12345;
    const Status ws = workspace_size(a, &bytes);
    if (code != StatusCode::kWorkspaceTooSmall) {
      EXPECT_EQ(ws.message(), s.message());
      EXPECT_EQ(bytes, 12345u);
    }
  }

  KvCall call(const KvCase& c) {
    std::mt19937_64 rng = rng_for("kvcache validation " + c.name);
    return make_call(c, rng);
  }

  // The call with enough workspace.
  KvCacheArgs valid(KvCall& k) {
    KvCacheArgs a = k.args("cpu_reference");
    size_t bytes = 0;
    EXPECT_OK(workspace_size(a, &bytes));
    k.workspace.assign(bytes / sizeof(double) + 1, 0.0);
    a.workspace = k.workspace.data();
    a.workspace_bytes = bytes;
    return a;
  }
};

TEST_F(KvCacheValidationTest, TheBaselinesRun) {
  for (const KvCase& c : {contiguous, paged}) {
    KvCall k = call(c);
    EXPECT_OK(forward_kvcache(valid(k)));
  }
}

TEST_F(KvCacheValidationTest, OptionsItRefuses) {
  KvCall k = call(contiguous);
  KvCacheArgs a = valid(k);
  a.dropout_p = 0.1f;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"dropout_p must be 0"});
  a = valid(k);
  a.maybe_cu_seqlens_q = a.maybe_cu_seqlens_k = k.seqlens.view();
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cu_seqlens_q and cu_seqlens_k"});
  a = valid(k);
  a.maybe_v_new = {};
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"k_new and v_new"});
  a = valid(k);
  a.maybe_k_new.shape[2] = 3;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"k_new.shape[2] (heads_kv) must be 2"});
  a = valid(k);
  a.k_cache.shape[0] = a.v_cache.shape[0] = 1;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"k_cache.shape[0]", "batch_cache"});
  a = valid(k);
  a.workspace_bytes -= 1;
  if (a.workspace_bytes + 1 > 0) expect_rejected(k, a, StatusCode::kWorkspaceTooSmall, {"workspace_bytes"});
}

TEST_F(KvCacheValidationTest, TablesAreChecked) {
  KvCall k = call(contiguous);
  KvCacheArgs a = valid(k);
  k.seqlens.set(1, -1);
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cache_seqlens[1] must be >= 0"});
  k.seqlens.set(1, 31);  // 31 + 1 new row fits 32; 32 + 1 does not
  EXPECT_OK(forward_kvcache(valid(k)));
  k.out.poison(), k.lse.poison();
  k.seqlens.set(0, 32);
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cache_seqlens[0] + seqlen_new", "seqlen_cache"});
  k.seqlens.set(0, 5);
  a.maybe_cache_seqlens = {};  // absent: every cache full, and one new row does not fit
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cache_seqlens[0] + seqlen_new"});

  HostTensor fp32_lens(DType::kF32, {2});
  a = valid(k);
  a.maybe_cache_seqlens = fp32_lens.view();
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cache_seqlens.dtype must be int32"});

  KvCall p = call(KvCase{"permuted", kF32, 2, 4, 2, 32, 0, {5, 9}, 1, true});
  a = valid(p);
  p.batch_idx.set(1, 3);
  expect_rejected(p, a, StatusCode::kInvalidArgument, {"cache_batch_idx[1] = 3", "batch_cache = 3"});
}

TEST_F(KvCacheValidationTest, PagesAreChecked) {
  KvCall k = call(paged);
  KvCacheArgs a = valid(k);
  k.block_table.set(3, 7);  // sequence 1's second page; the pool holds 2·2 + 3 = 7 pages
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"block_table[1][1] = 7", "num_pages = 7"});
  k.block_table.set(3, -2);
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"block_table[1][1] = -2"});
  k.block_table.set(3, 0);
  k.seqlens.set(1, 32);
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"max_pages·page_size"});
  k.seqlens.set(1, 20);
  HostTensor idx(DType::kI32, {2});
  idx.assign({0, 1});
  a.maybe_cache_batch_idx = idx.view();
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cache_batch_idx and block_table"});
}

TEST_F(KvCacheValidationTest, WrittenCachesOwnTheirMemory) {
  KvCall k = call(contiguous);
  KvCacheArgs a = valid(k);
  a.v_cache = a.k_cache;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"v_cache overlaps k_cache"});
  a = valid(k);
  a.out.data = a.k_cache.data;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"k_cache overlaps out"});
  a = valid(k);
  a.maybe_k_new.data = a.v_cache.data;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"v_cache overlaps k_new"});
  // Without new rows the caches are only read, and may be one tensor.
  a = valid(k);
  a.maybe_k_new = a.maybe_v_new = {};
  a.v_cache = a.k_cache;
  EXPECT_OK(forward_kvcache(a));
}

// The gathered pages live in the workspace: a workspace that shares memory with a tensor of
// the call is refused before any row is appended.
TEST_F(KvCacheValidationTest, PagedWorkspaceOwnsItsMemory) {
  KvCall k = call(paged);
  KvCacheArgs a = valid(k);
  const HostTensor kc = k.k_cache, vc = k.v_cache;
  a.out.data = k.workspace.data();  // out inside the workspace (the buffer holds both)
  EXPECT_TRUE(status_is(forward_kvcache(a), StatusCode::kInvalidArgument, {"workspace overlaps out"}));
  EXPECT_TRUE(k.k_cache.storage() == kc.storage() && k.v_cache.storage() == vc.storage())
      << "a refused call wrote the cache";
}

TEST_F(KvCacheValidationTest, CudaTensorsAreRefused) {
  KvCall k = call(contiguous);
  KvCacheArgs a = valid(k);
  uintptr_t address = 0x100000;
  for (Tensor* t : {&a.q, &a.k_cache, &a.v_cache, &a.maybe_k_new, &a.maybe_v_new, &a.out, &a.maybe_lse}) {
    t->data = reinterpret_cast<void*>(address += 0x100000);
    t->device = Device::kCUDA;
  }
  expect_rejected(k, a, StatusCode::kUnsupported, {"forward_kvcache: no CUDA kernel yet; CPU tensors only"});
}

}  // namespace
}  // namespace flashlab::test
