// Every GPU kernel of the registry (arch other than "cpu") against the fp64 oracle on the
// host, forward and (when it has one) backward, on device buffers: fp16 and bf16, fp32
// where the kernel takes it, head dims 64 and 128 and others, the nasty shapes of the CPU
// suite (cases whose rows see few keys get many heads, see tests/cpu/kernels_test.cpp).
// Outputs are poisoned on the device first and all checked written; every CUDA return
// code is checked. Kernels join by being registered.
//
// Without a device (or without CUDA in the build) the fixture skips with the reason; a
// CPU-only build has no GPU kernel, so the parametrized suite has no instance at all and
// GpuTest.DeviceVisible carries the reason into the output.
#include <gtest/gtest.h>

#include <iostream>

#include "gpu/gpu_fixture.h"
#include "kernel_check.h"

namespace flashlab::test {
namespace {

constexpr DType kF32 = DType::kF32, kF16 = DType::kF16, kBF16 = DType::kBF16;

[[maybe_unused]] std::vector<Case> gpu_cases() {
  std::vector<Case> cs;
  auto add = [&](std::string name, const Problem& p) { cs.push_back({std::move(name), p}); };

  for (DType dt : {kF16, kBF16, kF32}) {
    const std::string t = std::string(to_string(dt)) + "_";
    // Strides stay multiples of 16 bytes in every dtype (the API's CUDA rule).
    const int64_t pad16 = int64_t(16 / dtype_size(dt));
    // Windows (causal as right bound 0, one-sided, seqlen_q on either side of seqlen_k), softcap,
    // varlen with empty sequences and a single row at head dim d; at 192 and 256 they run
    // through cute_fa3's wide step (96- and 80-key blocks, bwd_wide.cuh).
    auto masks_softcap_varlen = [&](int d) {
      const std::string hd = "hdim" + std::to_string(d) + "_";
      add(t + hd + "seqlen1", dense(dt, 3, 1, 1, 2, 1, d));
      add(t + hd + "sq_gt_sk_causal_masked_rows", dense(dt, 2, 300, 65, 8, 2, d).make_causal());
      add(t + hd + "window_3_unbounded", dense(dt, 1, 150, 150, 2, 2, d).window(3, -1));
      add(t + hd + "window_unbounded_5", dense(dt, 1, 150, 150, 2, 2, d).window(-1, 5));
      add(t + hd + "window_32_8_sq_lt_sk", dense(dt, 1, 100, 220, 2, 1, d).window(32, 8));
      add(t + hd + "window_128_0", dense(dt, 1, 300, 300, 2, 1, d).window(128, 0));
      add(t + hd + "softcap_causal", dense(dt, 1, 160, 160, 4, 2, d).cap(5.f).make_causal());
      add(t + hd + "varlen_zero_lengths",
          varlen(dt, {5, 0, 130, 1, 0, 64}, {7, 3, 0, 200, 0, 64}, 4, 2, d).make_causal());
      add(t + hd + "varlen_window_softcap",
          varlen(dt, {33, 1, 190}, {80, 9, 190}, 2, 1, d).window(17, 4).cap(20.f));
    };
    for (int d : {64, 128}) {
      const std::string hd = "hdim" + std::to_string(d) + "_";
      masks_softcap_varlen(d);
      add(t + hd + "basic", dense(dt, 2, 256, 256, 4, 4, d));
      add(t + hd + "causal", dense(dt, 2, 200, 200, 4, 2, d).make_causal());
      add(t + hd + "seqlen3", dense(dt, 4, 3, 3, 8, 4, d).make_causal());
      add(t + hd + "seqlen127", dense(dt, 1, 127, 127, 4, 1, d));
      add(t + hd + "seqlen1000_causal", dense(dt, 1, 1000, 1000, 2, 1, d).make_causal());
      add(t + hd + "sq_lt_sk", dense(dt, 2, 65, 300, 2, 2, d));
      add(t + hd + "gqa8to1", dense(dt, 1, 129, 129, 16, 2, d));
      add(t + hd + "mqa_causal", dense(dt, 2, 77, 77, 8, 1, d).make_causal());
      add(t + hd + "window_0_0", dense(dt, 1, 150, 150, 2, 2, d).window(0, 0));
      // 70 sequences (more than a warp's 32 at a time in cute_fa3's backward, which maps its
      // compact varlen grid by a warp scan over the sequences' key blocks), empty ones among
      // them and at a 32-sequence edge, lengths from 0 to 3 key blocks of 128.
      {
        std::vector<int> lens_q, lens_k;
        for (int i = 0; i < 70; ++i) {
          lens_q.push_back(i % 9 == 4 ? 0 : (i * 53) % 300 + 1);
          lens_k.push_back(i % 7 == 3 || i == 31 || i == 32 ? 0 : (i * 97) % 390 + 1);
        }
        add(t + hd + "varlen_70_seqs_causal", varlen(dt, lens_q, lens_k, 2, 1, d).make_causal());
      }
      add(t + hd + "padded_strides", dense(dt, 2, 90, 110, 4, 2, d).padded({1, 3, 1, pad16}));
      // Queries and keys never in the same sequence: no pair at all, so no key block of
      // cute_fa3's backward has a step, and dQ is the preprocess's zeros alone.
      add(t + hd + "varlen_no_pairs", varlen(dt, {3, 0, 70}, {0, 130, 0}, 2, 1, d));
      add(t + hd + "seqlen17", dense(dt, 2, 17, 17, 4, 4, d));
      // More query tiles than an H100 has SMs: a persistent kernel (the ablation
      // cute_fa3_persistent's, bf16 head dim 128) serves two or three per CTA.
      add(t + hd + "many_tiles", dense(dt, 2, 384, 384, 48, 8, d));
      add(t + hd + "many_tiles_causal", dense(dt, 2, 384, 384, 48, 8, d).make_causal());
      // Most query tiles see no key (bottom-right causal, seqlen_q > seqlen_k), in runs.
      add(t + hd + "many_tiles_no_keys", dense(dt, 2, 2048, 64, 48, 8, d).make_causal());
      // Varlen with many tiles: a persistent CTA skips the empty sequences' tiles between
      // its others.
      add(t + hd + "many_tiles_varlen",
          varlen(dt, {5, 0, 700, 1, 0, 300}, {7, 3, 0, 700, 0, 300}, 48, 8, d).make_causal());
      add(t + hd + "many_tiles_window_softcap",
          dense(dt, 1, 384, 384, 96, 8, d).window(100, 0).cap(30.f));
      add(t + hd + "dropout_causal_gqa",
          dense(dt, 2, 200, 200, 4, 2, d).make_causal().drop(0.17f, 0x5eed + d));
      // Each key tile (walked last to first) raises the rows' running max, by more than the
      // lazy rescale's 8 (log2 units) from tile to tile and by more than 16 at the end, where
      // cute_fa3's exponentials-first softmax computes S again (fwd_softmax.cuh).
      add(t + hd + "growing_keys", dense(dt, 1, 128, 512, 2, 1, d).growing_keys(2.f));
      add(t + hd + "growing_keys_causal",
          dense(dt, 2, 384, 384, 4, 2, d).growing_keys(2.f).make_causal());
      // With softcap and no other mask (cute_fa3's refill at head dim 128 applies the softcap
      // again); faster growth, since the cap flattens it.
      add(t + hd + "growing_keys_softcap",
          dense(dt, 1, 128, 512, 2, 1, d).growing_keys(3.f).cap(30.f));
      add(t + hd + "varlen_dropout_window_softcap",
          varlen(dt, {33, 1, 190}, {80, 9, 190}, 2, 1, d).window(17, 4).cap(20.f).drop(0.4f, 99, 7));
    }
    add(t + "hdim32", dense(dt, 2, 128, 128, 2, 2, 32));
    add(t + "hdim96_causal", dense(dt, 1, 128, 190, 2, 2, 96).make_causal());
    // Head dim 96 (cute_fa3's backward: K in 32-byte swizzle atoms, dQ halves of 48 columns).
    add(t + "hdim96_seqlen127_gqa8to1", dense(dt, 1, 127, 129, 16, 2, 96));
    add(t + "hdim96_varlen_zero_lengths",
        varlen(dt, {5, 0, 130, 1, 0, 64}, {7, 3, 0, 200, 0, 64}, 4, 2, 96).make_causal());
    add(t + "hdim96_varlen_window_softcap",
        varlen(dt, {33, 1, 190}, {80, 9, 190}, 2, 1, 96).window(17, 4).cap(20.f));
    add(t + "hdim96_many_tiles_causal", dense(dt, 2, 384, 384, 48, 8, 96).make_causal());
    add(t + "hdim96_padded_strides", dense(dt, 2, 90, 110, 4, 2, 96).padded({1, 3, 1, pad16}));
    add(t + "hdim96_window_32_8_sq_lt_sk", dense(dt, 1, 100, 220, 2, 1, 96).window(32, 8));
    add(t + "hdim96_sq_gt_sk_causal_masked_rows", dense(dt, 2, 300, 65, 8, 2, 96).make_causal());
    add(t + "hdim192_causal", dense(dt, 1, 100, 130, 2, 1, 192).make_causal());
    // Head dim 192 (cute_fa3's backward: 64 query rows × 96 keys, three consumer warpgroups).
    add(t + "hdim192_mqa_ragged", dense(dt, 1, 127, 161, 8, 1, 192));
    add(t + "hdim192_many_tiles", dense(dt, 2, 512, 400, 4, 2, 192));
    add(t + "hdim192_varlen_softcap", varlen(dt, {33, 1, 190}, {80, 9, 190}, 2, 1, 192).cap(20.f));
    add(t + "hdim256", dense(dt, 1, 64, 64, 2, 1, 256));
    add(t + "hdim256_growing_keys", dense(dt, 1, 64, 320, 2, 1, 256).growing_keys(4.f));
    add(t + "hdim256_many_tiles_causal", dense(dt, 1, 384, 384, 96, 8, 256).make_causal());
    // Head dim 256 (cute_fa3's backward: 64 query rows × 80 keys, dQ by atomics): ragged query
    // and key blocks, GQA and MQA, seqlen_q on either side of seqlen_k, causal or not.
    add(t + "hdim256_causal_sq_lt_sk_gqa", dense(dt, 2, 100, 230, 4, 2, 256).make_causal());
    add(t + "hdim256_mqa_ragged", dense(dt, 1, 127, 161, 8, 1, 256));
    add(t + "hdim256_many_tiles", dense(dt, 2, 512, 400, 4, 2, 256));
    add(t + "hdim256_padded_strides", dense(dt, 2, 90, 110, 4, 2, 256).padded({1, 3, 1, pad16}));
    for (int d : {192, 256}) masks_softcap_varlen(d);
    add(t + "batch0", dense(dt, 0, 64, 64, 2, 2, 64));
    add(t + "seqlen_k0", dense(dt, 2, 33, 0, 2, 2, 64));
    add(t + "seqlen_q0", dense(dt, 2, 0, 33, 2, 2, 64));
    add(t + "varlen_all_empty", varlen(dt, {0, 0, 0}, {0, 0, 0}, 2, 2, 64));
    add(t + "no_lse", dense(dt, 2, 100, 100, 2, 2, 64).no_lse());
    add(t + "scale_1_peaked", dense(dt, 1, 128, 128, 2, 2, 64).scaled(1.f));
  }
  add("fp16_seqlen2048_causal", dense(kF16, 1, 2048, 2048, 2, 1, 128).make_causal());
  add("bf16_seqlen4097_causal", dense(kBF16, 1, 4097, 4097, 2, 1, 128).make_causal());
  add("bf16_batch8_varlen_padded",
      varlen(kBF16, {100, 1, 256, 0, 17, 64, 3, 200}, {100, 300, 256, 5, 0, 64, 3, 120}, 4, 2, 128)
          .padded({0, 8}));
  return cs;
}

class GpuKernelTest : public GpuParamTest<std::string> {};

TEST_P(GpuKernelTest, Forward) {
#if FLASHLAB_WITH_CUDA
  run_suite(GetParam(), false, gpu_cases(), make_device_placement);
#endif
}

TEST_P(GpuKernelTest, Backward) {
#if FLASHLAB_WITH_CUDA
  run_suite(GetParam(), true, gpu_cases(), make_device_placement);
#endif
}

// Dropout's mask as the kernel draws it: exactly DropoutPolicy's, at a fraction within 0.01
// of p (kernel_check.h). Kernels without dropout skip with that reason.
TEST_P(GpuKernelTest, DropoutMask) {
#if FLASHLAB_WITH_CUDA
  check_dropout_mask(GetParam(), kBF16, make_device_placement);
#endif
}

INSTANTIATE_TEST_SUITE_P(Registry, GpuKernelTest, ::testing::ValuesIn(gpu_kernels_under_test()),
                         kernel_param_name);
// CPU-only builds register no GPU kernel: the suite then has no instance.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuKernelTest);

// Always present, so a run without a GPU says why its GPU tests did not run.
TEST_F(GpuTest, DeviceVisible) {
#if FLASHLAB_WITH_CUDA
  int device = -1;
  ASSERT_TRUE(cuda_ok(cudaGetDevice(&device), "cudaGetDevice"));
  cudaDeviceProp prop{};
  ASSERT_TRUE(cuda_ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  std::cout << "device " << device << ": " << prop.name << ", sm_" << prop.major << prop.minor
            << ", " << (prop.totalGlobalMem >> 20) << " MiB" << std::endl;
  EXPECT_GE(prop.major, 8) << prop.name << " is sm_" << prop.major << prop.minor
                           << "; FlashLab's GPU kernels need sm_80 or newer";
  EXPECT_TRUE(cuda_available());
  EXPECT_FALSE(gpu_kernels_under_test().empty()) << "a CUDA build registers its GPU kernels";
#endif
}

// The harness's own device path: a placed tensor comes back bit for bit, poison included.
TEST_F(GpuTest, PlacementRoundTrip) {
#if FLASHLAB_WITH_CUDA
  FLASHLAB_SEED_TRACE();
  std::mt19937_64 rng = rng_for("GpuTest.PlacementRoundTrip");
  HostTensor t(DType::kBF16, {3, 5, 2, 40}, {0, 1, 0, 8});
  t.poison();
  t.fill_random(rng);
  const std::vector<std::byte> before = t.storage();
  DevicePlacement where;
  const Tensor v = where.place(t);
  ASSERT_TRUE(where.ok());
  EXPECT_EQ(v.device, Device::kCUDA);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 16, 0u);
  t.poison();
  ASSERT_TRUE(where.fetch(t));
  EXPECT_TRUE(t.storage() == before);
#endif
}

}  // namespace
}  // namespace flashlab::test
