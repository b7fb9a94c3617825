// forward_kvcache on the CPU kernels against the fp64 oracle on the gathered cache
// (kvcache_check.h says what each case checks), then every refusal of the API, by message,
// with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kvcache_check.h"
#include "test_util.h"

namespace flashlab::test {
namespace {

constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16;

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
  cs.push_back({"fp32_paged16_window_nan_hidden", kF32, 1, 8, 2, 256, 16, {200, 90, 30}, 1});
  cs.back().window_left = 40, cs.back().nan_hidden = true;
  cs.push_back({"fp32_nan_visible_sq4_causal", kF32, 4, 8, 2, 256, 0, {200, 90}});
  cs.back().causal = true, cs.back().nan_visible = 150;  // the last query sees it, the first 3 too
  cs.push_back({"bf16_leftpad_append3_causal_gqa4", kBF16, 3, 8, 2, 256, 0, {200, 9, 40}, 3});
  cs.back().causal = true, cs.back().leftpad = {17, 9, 0};
  cs.push_back({"fp32_leftpad_permuted_window", kF32, 1, 8, 8, 128, 0, {100, 60}, 0, true});
  cs.back().window_left = 30, cs.back().leftpad = {50, 1};
  // Rotary: both pair layouts, rotary_dim below head_dim, q per query (causal, window) or at
  // cache_seqlens[b] (neither, or a window too wide to bind), positions as rows with leftpad.
  cs.push_back({"bf16_rotary_interleaved_append3_causal_gqa4", kBF16, 3, 8, 2, 256, 0, {60, 0, 200}, 3});
  cs.back().causal = true, cs.back().rotary_dim = 32;
  cs.push_back({"fp32_paged16_rotary_halves_rd16_decode", kF32, 1, 8, 2, 256, 16, {150, 33, 0}, 1});
  cs.back().rotary_dim = 16, cs.back().rotary_interleaved = false;
  cs.push_back({"bf16_permuted_rotary_halves_sq4_at_cache_end", kBF16, 4, 8, 8, 128, 0, {50, 100}, 2, true});
  cs.back().rotary_dim = 32, cs.back().rotary_interleaved = false;
  cs.push_back({"fp32_rotary_leftpad_window_rd24", kF32, 2, 8, 2, 128, 0, {100, 60}, 2});
  cs.back().window_left = 30, cs.back().leftpad = {50, 1}, cs.back().rotary_dim = 24;
  cs.push_back({"bf16_paged64_rotary_unbinding_window_sq3", kBF16, 3, 8, 2, 256, 64, {100, 7}, 3});
  cs.back().window_left = 256, cs.back().rotary_dim = 32;
  return cs;
}

class KvCacheTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCacheTest, MatchesOracleOnTheGatheredCache) {
  HostPlacement host;
  for (const KvCase& c : cases()) check_kvcache_case(GetParam(), c, host);
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

// Rotary's rules: both tables, with k_new, in q's dtype, of one shape, rotary_dim within
// head_dim, seqlen_ro at least the cache's rows and (host tables) every q position below it;
// the tables are inputs the written caches may not overlap, and the rotated q lives in the
// workspace, which may not overlap a tensor of the call.
TEST_F(KvCacheValidationTest, RotaryIsChecked) {
  KvCase rotary = contiguous;  // 32 rows a sequence: tables of 34 rows of 8 (rotary_dim 16)
  rotary.rotary_dim = 16;
  KvCall k = call(rotary);
  EXPECT_OK(forward_kvcache(valid(k)));
  k.out.poison(), k.lse.poison();
  struct Broken {
    void (*breaks)(KvCacheArgs&);
    const char* name;
  };
  const Broken broken[] = {
      {[](KvCacheArgs& a) { a.maybe_rotary_sin = {}; }, "rotary_cos and rotary_sin must both be given"},
      {[](KvCacheArgs& a) { a.maybe_k_new = a.maybe_v_new = {}; }, "rotary_cos/rotary_sin need k_new and v_new"},
      {[](KvCacheArgs& a) { a.maybe_rotary_sin.dtype = DType::kF64; }, "rotary_sin.dtype (fp64) must match q.dtype"},
      {[](KvCacheArgs& a) { a.maybe_rotary_sin.shape[0] = 33; },
       "rotary_sin.shape[0] (seqlen_ro, as rotary_cos) must be 34"},
      {[](KvCacheArgs& a) { a.maybe_rotary_cos.shape[1] = a.maybe_rotary_sin.shape[1] = 17; },
       "rotary_dim (2·rotary_cos.shape[1] = 34) must be in [2, head_dim = 32]"},
      {[](KvCacheArgs& a) { a.maybe_rotary_cos.shape[0] = a.maybe_rotary_sin.shape[0] = 31; },
       "seqlen_ro = 31) must be at least the 32 rows"},
      {[](KvCacheArgs& a) { a.maybe_rotary_cos.data = static_cast<char*>(a.k_cache.data) + 4; },
       "k_cache overlaps rotary_cos"},
  };
  for (const Broken& b : broken) {
    KvCacheArgs a = valid(k);
    b.breaks(a);
    expect_rejected(k, a, StatusCode::kInvalidArgument, {b.name});
  }
  // seqlen_ro = 32: causal q rows sit at cache_seqlens[b] + i, and 31 + 1 passes the table.
  KvCacheArgs a = valid(k);
  a.maybe_rotary_cos.shape[0] = a.maybe_rotary_sin.shape[0] = 32;
  a.causal = true;
  k.seqlens.set(1, 31);
  expect_rejected(k, a, StatusCode::kInvalidArgument,
                  {"rotary position of q[1]'s last row", "cache_seqlens[1] + seqlen_q - 1 = 32", "seqlen_ro = 32"});
  a.causal = false;  // every query at cache_seqlens[1] = 31: within the table
  size_t bytes = 0;
  ASSERT_OK(workspace_size(a, &bytes));
  k.workspace.assign(bytes / sizeof(double) + 1, 0.0);
  a.workspace = k.workspace.data(), a.workspace_bytes = bytes;
  EXPECT_OK(forward_kvcache(a));
  k.out.poison(), k.lse.poison();
  k.seqlens.set(1, 9);
  a = valid(k);
  const HostTensor kc = k.k_cache;
  a.out.data = k.workspace.data();  // the rotated q goes to the workspace's start
  EXPECT_TRUE(status_is(forward_kvcache(a), StatusCode::kInvalidArgument, {"workspace overlaps out"}));
  EXPECT_TRUE(k.k_cache.storage() == kc.storage()) << "a refused call wrote the cache";
}

// CUDA tensors go to a kernel with a KV-cache pass on their device (cute_fa2); a CPU kernel
// named for them is refused before anything runs.
TEST_F(KvCacheValidationTest, CudaTensorsNeedADeviceKernel) {
  KvCall k = call(contiguous);
  KvCacheArgs a = valid(k);
  a.kernel = "cpu_flash";
  uintptr_t address = 0x100000;
  for (Tensor* t : {&a.q, &a.k_cache, &a.v_cache, &a.maybe_k_new, &a.maybe_v_new, &a.out, &a.maybe_lse,
                    &a.maybe_cache_seqlens}) {
    t->data = reinterpret_cast<void*>(address += 0x100000);
    t->device = Device::kCUDA;
  }
  expect_rejected(k, a, StatusCode::kUnsupported, {"kernel 'cpu_flash' has no KV-cache forward pass"});
}

// On a device the tables are not read by the host (the kernel clamps them): what the shapes
// decide is checked before any kernel is chosen, on fake device tensors that nothing reads.
TEST_F(KvCacheValidationTest, DeviceCallsAreCheckedOnTheHost) {
  KvCall k = call(contiguous);
  KvCacheArgs base = valid(k);
  uintptr_t address = 0x100000;
  for (Tensor* t : {&base.q, &base.k_cache, &base.v_cache, &base.maybe_k_new, &base.maybe_v_new, &base.out,
                    &base.maybe_lse, &base.maybe_cache_seqlens}) {
    t->data = reinterpret_cast<void*>(address += 0x100000);
    t->device = Device::kCUDA;
  }
  KvCacheArgs a = base;
  a.num_splits = -1;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"num_splits must be >= 0"});
  a = base;
  a.maybe_cache_seqlens = {};
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"cache_seqlens must be given with k_new"});
  a = base;
  a.maybe_k_new.shape[1] = a.maybe_v_new.shape[1] = 33;  // seqlen_cache is 32
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"seqlen_new (33) exceeds the 32 rows"});
  HostTensor table(DType::kF32, {31, 8});  // seqlen_ro 31 < the cache's 32 rows
  a = base;
  a.maybe_rotary_cos = a.maybe_rotary_sin = table.view();
  a.maybe_rotary_cos.device = a.maybe_rotary_sin.device = Device::kCUDA;
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"seqlen_ro = 31) must be at least the 32 rows"});
  a.maybe_k_new = a.maybe_v_new = {};
  expect_rejected(k, a, StatusCode::kInvalidArgument, {"rotary_cos/rotary_sin need k_new and v_new"});

  KvCall pk = call(paged);
  KvCacheArgs pa = valid(pk);
  for (Tensor* t : {&pa.q, &pa.k_cache, &pa.v_cache, &pa.maybe_k_new, &pa.maybe_v_new, &pa.out, &pa.maybe_lse,
                    &pa.maybe_cache_seqlens, &pa.maybe_block_table}) {
    t->data = reinterpret_cast<void*>(address += 0x100000);
    t->device = Device::kCUDA;
  }
  KvCacheArgs b = pa;
  b.k_cache.shape[0] = b.v_cache.shape[0] = 0;  // an empty pool: nothing to clamp a page to
  expect_rejected(pk, b, StatusCode::kInvalidArgument, {"num_pages (k_cache.shape[0]) must be >= 1"});
  b = pa;
  b.maybe_block_table.shape[1] = int64_t(1) << 28;  // 16-row pages: 2^32 rows a sequence
  b.maybe_block_table.stride[0] = int64_t(1) << 28;
  expect_rejected(pk, b, StatusCode::kInvalidArgument, {"max_pages·page_size", "must be < 2^31"});
}

}  // namespace
}  // namespace flashlab::test
