// forward_kvcache on CUDA tensors (cute_fa2's split-KV, src/cuda/sm80/kv_kernel.cuh) against
// the fp64 oracle on the gathered cache (kvcache_check.h says what each case checks): both
// half dtypes, head dims 64/96/128/192/256, GQA 1/4/8, query lengths 1/4/16, contiguous caches
// (with and without cache_batch_idx) and paged ones of every page size from 16 to 256,
// append, zero-length caches, left padding, causal, windows and softcap, NaN in the rows no
// query sees, rotary (both pair layouts, rotary_dim below head_dim, q per query or at the
// cache's end),
// scores that rise along the cache (O rescaled past a split's first tile), and split counts
// chosen by the kernel, forced to 1 and forced above the key tiles a sequence has.
// Then the device tables' clamping: out-of-range cache_seqlens, cache_batch_idx and
// block_table values, and rotary positions past the tables, give results in bounds.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "cuda/head_dims.h"
#include "gpu_fixture.h"
#include "kvcache_check.h"
#include "late_inputs.h"

namespace flashlab::test {
namespace {

#if FLASHLAB_WITH_CUDA
constexpr DType kF16 = DType::kF16, kBF16 = DType::kBF16;

std::vector<KvCase> gpu_cases() {
  std::vector<KvCase> cs;
  auto add = [&](KvCase c, int head_dim) {
    c.head_dim = head_dim;
    cs.push_back(std::move(c));
    return &cs.back();
  };
  // Decode: one query, GQA 32:8 as 8:2, long caches split across CTAs.
  add({"bf16_d128_decode_gqa4", kBF16, 1, 8, 2, 2048, 0, {2000, 1, 777}}, 128);
  add({"fp16_d64_decode_mqa8", kF16, 1, 8, 1, 1024, 0, {1000, 513}}, 64);
  add({"bf16_d256_decode_gqa1", kBF16, 1, 4, 4, 512, 0, {500, 64, 33}}, 256);
  // Append, speculative and chunked query lengths, causal aligned to the cache's end.
  add({"bf16_d128_append1_causal_gqa4", kBF16, 1, 8, 2, 1024, 0, {600, 0, 1000}, 1}, 128)->causal = true;
  add({"fp16_d128_append4_causal_gqa8", kF16, 4, 16, 2, 512, 0, {300, 100}, 4}, 128)->causal = true;
  add({"bf16_d64_append16_causal_gqa4", kBF16, 16, 8, 2, 640, 0, {500, 17, 0}, 16}, 64)->causal = true;
  // Paged, every page size, pages shuffled through the pool.
  add({"bf16_d128_paged16_append1_gqa4", kBF16, 1, 8, 2, 1024, 16, {1000, 15, 300}, 1}, 128);
  add({"fp16_d128_paged32_gqa8", kF16, 1, 16, 2, 1024, 32, {999, 32}}, 128);
  add({"bf16_d64_paged64_append4_causal", kBF16, 4, 4, 4, 1024, 64, {700, 64, 1}, 4}, 64)->causal = true;
  add({"bf16_d128_paged128_append16_causal_gqa4", kBF16, 16, 8, 2, 1024, 128, {900, 128}, 16}, 128)
      ->causal = true;
  add({"fp16_d256_paged256_gqa4", kF16, 1, 8, 2, 1024, 256, {1000, 255, 256}}, 256);
  // Zero-length caches and a permuted cache_batch_idx.
  add({"bf16_d128_zero_length", kBF16, 1, 8, 2, 512, 0, {0, 300, 0}}, 128);
  add({"fp16_d128_paged16_zero_length_append", kF16, 4, 8, 2, 256, 16, {0, 80}, 4}, 128);
  add({"bf16_d128_permuted_append2", kBF16, 2, 8, 2, 512, 0, {10, 500, 90}, 2, true}, 128);
  // Windows and softcap.
  auto* w = add({"bf16_d128_window_softcap_gqa4", kBF16, 4, 8, 2, 1024, 64, {1000, 200, 64}, 4}, 128);
  w->window_left = 100, w->window_right = 0, w->softcap = 30.f;
  auto* w2 = add({"fp16_d64_window_both_sq16", kF16, 16, 8, 8, 768, 0, {700, 40}, 0, true}, 64);
  w2->window_left = 50, w2->window_right = 7;
  // NaN in the cache rows left of every query's window: out unchanged (zero-filled loads).
  auto* h1 = add({"bf16_d128_window_nan_hidden_decode", kBF16, 1, 8, 2, 1024, 0, {1000, 300, 90}, 1}, 128);
  h1->window_left = 100, h1->nan_hidden = true;
  auto* h2 = add({"fp16_d64_paged32_causal_window_nan_hidden", kF16, 4, 8, 2, 1024, 32, {900, 200}, 4}, 64);
  h2->causal = true, h2->window_left = 150, h2->nan_hidden = true;
  // Left-padded caches (keys from row cache_leftpad[b]; NaN before it).
  add({"bf16_d128_leftpad_decode_gqa4", kBF16, 1, 8, 2, 1024, 0, {1000, 300, 64}, 1}, 128)->leftpad = {333, 299, 0};
  auto* lp = add({"fp16_d64_leftpad_append4_causal_window", kF16, 4, 8, 2, 512, 0, {400, 90}, 4, true}, 64);
  lp->causal = true, lp->window_left = 70, lp->leftpad = {130, 90};
  // Head dims 96 (keys per warp) and 192 (32-key tiles, two stages).
  add({"bf16_d96_decode_gqa4", kBF16, 1, 8, 2, 1024, 0, {1000, 77}}, 96);
  add({"fp16_d192_paged64_append4_causal", kF16, 4, 4, 2, 512, 64, {400, 3}, 4}, 192)->causal = true;
  // More splits than 32: each lane of the combine's LSE merge holds several (l, l + 32, ...).
  add({"bf16_d128_100_splits", kBF16, 1, 8, 2, 8192, 0, {8000, 6500}}, 128)->num_splits = 100;
  // Split counts: one, and more than the shortest sequence has key tiles (empty splits).
  add({"bf16_d128_one_split", kBF16, 1, 8, 2, 2048, 0, {2000, 700}}, 128)->num_splits = 1;
  add({"bf16_d128_many_splits", kBF16, 4, 8, 2, 2048, 32, {2000, 70, 0}, 4}, 128)->num_splits = 40;
  // A NaN in a key every query sees: the rows are NaN through one split (the keys-per-warp
  // merge), many splits (the combine) and the rows-per-warp arrangement.
  auto* n1 = add({"bf16_d128_nan_visible_decode", kBF16, 1, 8, 2, 2048, 0, {2000, 700}}, 128);
  n1->nan_visible = 5, n1->num_splits = 1;
  auto* n2 = add({"fp16_d128_nan_visible_8_splits_sq4", kF16, 4, 8, 2, 2048, 0, {1500, 900}}, 128);
  n2->nan_visible = 1400, n2->num_splits = 8;
  auto* n3 = add({"bf16_d64_nan_visible_one_split_sq16", kBF16, 16, 8, 2, 1024, 0, {1000, 64}}, 64);
  n3->nan_visible = 0, n3->num_splits = 1;
  // Scores that rise along the ring (k_ramp): O rescaled past the first tile, in the
  // keys-per-warp kernel (one split and several), the rows-per-warp one, and with softcap
  // and an append.
  auto* g1 = add({"bf16_d128_rising_scores_decode_one_split", kBF16, 1, 8, 2, 2048, 0, {2000, 1500}}, 128);
  g1->k_ramp = 64, g1->num_splits = 1;
  add({"fp16_d128_rising_scores_decode_paged16", kF16, 1, 8, 2, 2048, 16, {2000, 999}}, 128)->k_ramp = 32;
  auto* g2 = add({"fp16_d64_rising_scores_sq16_causal", kF16, 16, 8, 2, 1024, 0, {1000, 700}}, 64);
  g2->k_ramp = 32, g2->causal = true, g2->num_splits = 2;
  auto* g3 = add({"bf16_d256_rising_scores_softcap_append2", kBF16, 2, 8, 2, 512, 0, {500, 300}, 2}, 256);
  g3->k_ramp = 16, g3->softcap = 30.f, g3->causal = true;
  // Softcap in the rows-per-warp kernel, appending.
  auto* c1 = add({"bf16_d128_paged32_softcap_sq16_append3_causal", kBF16, 16, 8, 2, 1024, 32, {900, 40}, 3}, 128);
  c1->softcap = 20.f, c1->causal = true;
  // Rotary in the append kernel, q read from the workspace (after the partials with splits).
  add({"bf16_d128_rotary_interleaved_decode_gqa4", kBF16, 1, 8, 2, 2048, 0, {2000, 1, 777}, 1}, 128)
      ->rotary_dim = 128;
  auto* r1 = add({"fp16_d128_paged16_rotary_halves_append4_causal_gqa8", kF16, 4, 16, 2, 1024, 16, {900, 33}, 4}, 128);
  r1->causal = true, r1->rotary_dim = 128, r1->rotary_interleaved = false;
  auto* r2 = add({"bf16_d64_rotary_rd32_halves_append16_causal", kBF16, 16, 8, 2, 640, 0, {500, 17, 0}, 16}, 64);
  r2->causal = true, r2->rotary_dim = 32, r2->rotary_interleaved = false, r2->num_splits = 1;
  auto* r3 = add({"bf16_d128_paged64_rotary_sq4_at_cache_end", kBF16, 4, 8, 2, 1024, 64, {700, 64, 1}, 2}, 128);
  r3->rotary_dim = 64, r3->num_splits = 7;
  auto* r4 = add({"fp16_d128_rotary_leftpad_window_permuted", kF16, 3, 8, 2, 512, 0, {400, 90}, 3, true}, 128);
  r4->window_left = 70, r4->leftpad = {130, 90}, r4->rotary_dim = 96;
  auto* r5 = add({"bf16_d256_rotary_append2_causal_gqa4", kBF16, 2, 8, 2, 512, 0, {500, 3}, 2}, 256);
  r5->causal = true, r5->rotary_dim = 256;
  // Rotary where the head dim's pairs do not fill the block's threads in whole rows (96: two
  // rows a pass, 32 threads idle; 192: one row a pass), the second with rotary_dim below the
  // head dim.
  auto* r6 = add({"bf16_d96_rotary_halves_sq4_append4_causal_gqa4", kBF16, 4, 8, 2, 1024, 0, {900, 50}, 4}, 96);
  r6->causal = true, r6->rotary_dim = 96, r6->rotary_interleaved = false;
  auto* r7 = add({"fp16_d192_paged64_rotary_rd128_sq2_append2", kF16, 2, 4, 2, 512, 64, {400, 65}, 2}, 192);
  r7->rotary_dim = 128;
  // A build of some head dims (FLASHLAB_HEAD_DIMS) runs the cases it can, and says so.
  const size_t all = cs.size();
  std::erase_if(cs, [](const KvCase& c) { return !cuda::head_dim_built(c.head_dim); });
  if (cs.size() < all)
    std::printf("[   NOTE   ] %zu of %zu KV cases left out: their head dims are not in this build\n",
                all - cs.size(), all);
  return cs;
}
#endif  // FLASHLAB_WITH_CUDA

#if FLASHLAB_WITH_CUDA
// A device placement whose tensors hold 0xff bytes (NaN; -1 in the int32 tables) until a
// kernel enqueued right before the call copies their real bytes in, after letting the next
// kernel launch early and after the host says the call is enqueued (late_inputs.h): the first
// fetch, which check_kvcache_case makes once forward_kvcache has returned. The workspace is
// asked for last, just before the call, so the late kernel goes there, after the
// workspace's own fill: it is the kernel the call's first kernel follows. (Only that first
// kernel follows it; the others of the call follow the call's own kernels.)
class LateInputs final : public Placement {
 public:
  LateInputs() {
    ok_ = cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped),
                  "cudaHostAlloc");
    if (ok_) flags_[0] = flags_[1] = 0;  // go, timed_out
  }
  ~LateInputs() override {
    release();
    cudaStreamSynchronize(static_cast<cudaStream_t>(inner_.stream()));  // the late kernel is done
    if (flags_ != nullptr) cudaFreeHost(flags_);
  }
  Device device() const override { return Device::kCUDA; }
  void* stream() override { return inner_.stream(); }
  Tensor place(const HostTensor& t) override {
    Tensor v = inner_.place(t);
    if (!v.present()) return v;
    std::byte* base = static_cast<std::byte*>(v.data) - HostTensor::kCanaryBytes;
    staged_.emplace_back(t.storage_bytes());
    ok_ = ok_ && staged_.back().ok() && staged_.back().upload(t.storage().data(), t.storage_bytes()) &&
          cuda_ok(cudaMemset(base, 0xff, t.storage_bytes()), "cudaMemset");
    copies_.push_back({base, staged_.back().get(), t.storage_bytes()});
    return v;
  }
  void* scratch(size_t bytes) override {
    void* workspace = inner_.scratch(bytes);
    int* flags_dev = nullptr;
    list_ = DeviceBuffer(copies_.size() * sizeof(LateCopy));
    ok_ = ok_ && list_.ok() && list_.upload(copies_.data(), copies_.size() * sizeof(LateCopy)) &&
          cuda_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flags_dev), flags_, 0),
                  "cudaHostGetDevicePointer") &&
          cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize") &&
          cuda_ok(launch_late_copies(static_cast<const LateCopy*>(list_.get()), int(copies_.size()),
                                     flags_dev, flags_dev + 1, static_cast<cudaStream_t>(inner_.stream())),
                  "launch_late_copies");
    return workspace;
  }
  bool fetch(HostTensor& t) override {
    release();
    return inner_.fetch(t);
  }
  bool ok() const override {
    return ok_ && inner_.ok() && (flags_ == nullptr || reinterpret_cast<volatile int*>(flags_)[1] == 0);
  }

 private:
  void release() {
    if (flags_ != nullptr) reinterpret_cast<volatile int*>(flags_)[0] = 1;
  }
  std::vector<DeviceBuffer> staged_;
  std::vector<LateCopy> copies_;
  DeviceBuffer list_;
  int* flags_ = nullptr;  // mapped host memory: [0] go, [1] timed out
  bool ok_ = true;
  DevicePlacement inner_;  // last, so that it is destroyed first (its stream synchronizes)
};
#endif

class KvCacheGpuTest : public GpuParamTest<std::string> {};

TEST_P(KvCacheGpuTest, MatchesOracleOnTheGatheredCache) {
#if FLASHLAB_WITH_CUDA
  for (const KvCase& c : gpu_cases()) {
    DevicePlacement device;  // one per case: a placement maps each host tensor once
    check_kvcache_case(GetParam(), c, device);
  }
#endif
}

// The same cases with every input written by the kernel just before the call, which lets
// the call's kernels launch early on sm_90: each must wait for it before reading anything.
TEST_P(KvCacheGpuTest, WaitsForInputsTheKernelBeforeWrites) {
#if FLASHLAB_WITH_CUDA
  for (const KvCase& c : gpu_cases()) {
    {  // the case's kernels loaded first: with lazy loading a kernel's first launch may wait
       // for the device to be idle, and the late kernel waits for the host
      DevicePlacement warm;
      check_kvcache_case(GetParam(), c, warm);
    }
    LateInputs late;
    check_kvcache_case(GetParam(), c, late);
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(Cuda, KvCacheGpuTest, ::testing::Values("auto", "cute_fa2"));

#if FLASHLAB_WITH_CUDA
// The control for WaitsForInputsTheKernelBeforeWrites: on sm_90 a kernel launched early after
// the late kernel that reads without griddepcontrol.wait runs before the late copy and sees
// the bytes from before it, so the window that test relies on is really open.
class KvCacheGpuLateTest : public GpuTest {};

TEST_F(KvCacheGpuLateTest, AnEarlyReaderSeesTheBytesBeforeTheLateCopy) {
  int major = 0;
  ASSERT_TRUE(cuda_ok(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
                      "cudaDeviceGetAttribute"));
  if (major < 9) GTEST_SKIP() << "programmatic dependent launch needs compute capability 9.0 or newer";
  HostTensor t(DType::kF32, {64});
  for (int64_t i = 0; i < 64; ++i) t.set(i, 1.0);
  LateInputs late;
  const Tensor v = late.place(t);
  int* seen = nullptr;
  int* seen_dev = nullptr;
  ASSERT_TRUE(cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&seen), sizeof(int), cudaHostAllocMapped),
                      "cudaHostAlloc"));
  ASSERT_TRUE(cuda_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&seen_dev), seen, 0), "pointer"));
  // The reader once on an idle device first: with lazy loading (CUDA's default) a kernel's
  // first launch loads it, which may wait for the device to be idle, and the late kernel
  // below waits for the host.
  const auto stream = static_cast<cudaStream_t>(late.stream());
  ASSERT_TRUE(cuda_ok(launch_early_peek(v.data, seen_dev, stream), "peek (loading)"));
  ASSERT_TRUE(cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  *reinterpret_cast<volatile int*>(seen) = -1;
  ASSERT_NE(late.scratch(16), nullptr);  // the late kernel, waiting for the host
  ASSERT_TRUE(cuda_ok(launch_early_peek(v.data, seen_dev, stream), "peek"));
  // The reader must finish while the late kernel still waits: up to a second.
  const auto t0 = std::chrono::steady_clock::now();
  while (*reinterpret_cast<volatile int*>(seen) == -1 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
  }
  const int byte = *reinterpret_cast<volatile int*>(seen);
  ASSERT_TRUE(late.fetch(t));  // releases the late kernel and waits for it
  ASSERT_TRUE(late.ok());
  cudaFreeHost(seen);
  EXPECT_EQ(byte, 0xff) << "the early reader did not run before the late copy (-1: not at all)";
  EXPECT_EQ(t.get(0), 1.0) << "the late copy did not land";
}
#endif

// Device tables are clamped, never trusted: each bad value still gives a call that succeeds
// and writes every out and LSE element (which rows it read is unspecified), and nothing
// outside the tensors: the caches' padding keeps its poison. Named *Gpu* so that
// scripts/gpu-check.sh runs it under compute-sanitizer, which checks the "in bounds" part on
// these exact-size allocations.
class KvCacheGpuClampTest : public GpuTest {};

TEST_F(KvCacheGpuClampTest, BadTablesStayInBounds) {
#if FLASHLAB_WITH_CUDA
  // Pages of 64 rows (one table read per tile) and of 16 (one per row), and a contiguous cache.
  KvCase paged64{"clamp_paged64", kBF16, 1, 8, 2, 256, 64, {100, 200}, 1};
  KvCase paged16{"clamp_paged16", kBF16, 1, 8, 2, 256, 16, {100, 200}, 1};
  KvCase contiguous{"clamp_contiguous", kBF16, 1, 8, 2, 256, 0, {100, 200}, 1, true};
  // Rotary with causal q rows past seqlen_new: positions up to c_b + 3 against tables of
  // exactly the cache's 256 rows (the host's bound), so the clamp to the last row is needed.
  KvCase rotary{"clamp_rotary", kBF16, 4, 8, 2, 256, 0, {100, 200}, 1};
  rotary.causal = true, rotary.rotary_dim = 128;
  struct Variant {
    const char* what;
    KvCase* c;
    void (*bad)(KvCall&);
  };
  const Variant variants[] = {
      {"cache_seqlens below 0 and past the cache", &paged64, [](KvCall& k) { k.seqlens.assign({-5, 1 << 30}); }},
      {"pages past the pool, 64-row pages", &paged64,
       [](KvCall& k) { k.block_table.assign(std::vector<double>(k.block_table.numel(), 1e9)); }},
      {"negative pages, 64-row pages", &paged64,
       [](KvCall& k) { k.block_table.assign(std::vector<double>(k.block_table.numel(), -7)); }},
      {"pages past the pool, 16-row pages", &paged16,
       [](KvCall& k) { k.block_table.assign(std::vector<double>(k.block_table.numel(), 1e9)); }},
      {"negative pages, 16-row pages", &paged16,
       [](KvCall& k) { k.block_table.assign(std::vector<double>(k.block_table.numel(), -7)); }},
      {"cache rows outside the cache", &contiguous, [](KvCall& k) { k.batch_idx.assign({-1, 99}); }},
      {"rotary positions past the tables", &rotary,
       [](KvCall& k) {
         k.seqlens.assign({-5, 1 << 30});
         for (HostTensor* t : {&k.rotary_cos, &k.rotary_sin}) {
           *t = HostTensor(DType::kBF16, {256, 64});
           t->assign(std::vector<double>(t->numel(), 0.5));
         }
       }},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    v.c->head_dim = 128;
    std::mt19937_64 rng = rng_for(std::string("kvcache clamp ") + v.what);
    KvCall k = make_call(*v.c, rng);
    v.bad(k);
    DevicePlacement device;
    KvCacheArgs a = k.args("cute_fa2", device);
    a.causal = v.c->causal;
    size_t bytes = 0;
    ASSERT_OK(workspace_size(a, &bytes));
    a.workspace = device.scratch(bytes);
    a.workspace_bytes = bytes;
    ASSERT_OK(forward_kvcache(a));
    ASSERT_TRUE(device.fetch(k.out) && device.fetch(k.lse) && device.fetch(k.k_cache) &&
                device.fetch(k.v_cache) && device.ok());
    EXPECT_TRUE(k.out.written_exactly("out"));
    EXPECT_TRUE(k.lse.written_exactly("lse"));
    EXPECT_TRUE(k.k_cache.padding_untouched("k_cache"));
    EXPECT_TRUE(k.v_cache.padding_untouched("v_cache"));
  }
#endif
}

}  // namespace
}  // namespace flashlab::test
