// 04_copy_mma: CuTe's copy and MMA atoms on one 64 x 64 x 64 tile, C = A·Bᵀ (A is M x K, B is
// N x K, both K-contiguous bf16; C fp32), one CTA of 128 threads.
//   sm80 path (any GPU from sm_80): global → shared with the cp.async copy atom (16 bytes per
//     thread), shared → registers with ldmatrix (SM75_U32x4_LDSM_N), then a TiledMMA of 2 x 2
//     warps over the mma.sync m16n8k16 atom. Two instances: shared memory swizzled with
//     Swizzle<3,3,3>, and plain row-major, for ncu's bank-conflict counters (03_swizzle.cpp
//     predicts 8 wavefronts per ldmatrix phase for the plain one, 1 for the swizzled one).
//   sm90a path (only when built for sm_90a and run on sm_90): the tile arrives by TMA (one
//     thread issues the copy, an mbarrier counts its bytes) into 128-byte-swizzled shared
//     memory, and one warpgroup multiplies it with wgmma (64 x 64 x 16, both operands from
//     shared memory through descriptors).
// The CPU check: the partitions cover C and the shared tile exactly once, and the fp32 CPU
// GEMM equals the fp64 one on inputs chosen so that every sum is exact (multiples of 1/8 in
// [-2, 2]: every product and partial sum is exact in fp32). Every GPU result must then equal
// the CPU's (a wrong product would move an element by a multiple of 1/64; the check allows
// less than 1/128). Without a GPU: `skip: <reason>`.
//   run: examples/basics/cute/04_copy_mma     (page: docs/learn/basics/cute-copy-mma.md)
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>

#include <cmath>
#include <vector>

#include "../cuda/basics.cuh"
#include "check.h"

using namespace cute;
using bf16 = cutlass::bfloat16_t;

// A named namespace: nvcc's kernel stubs cannot name types in an anonymous one here.
namespace copy_mma {

constexpr int kM = 64, kN = 64, kK = 64, kThreads = 128;

using Mma = decltype(make_tiled_mma(SM80_16x8x16_F32BF16BF16F32_TN{}, Layout<Shape<_2, _2, _1>>{},
                                    Tile<_32, _32, _16>{}));
using G2S = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, bf16>{},
                                     Layout<Shape<_16, _8>, Stride<_8, _1>>{}, Layout<Shape<_1, _8>>{}));
using S2R = Copy_Atom<SM75_U32x4_LDSM_N, bf16>;
using SmemSwizzled = decltype(tile_to_shape(
    composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}), Shape<_64, _64>{}));
using SmemPlain = Layout<Shape<_64, _64>, Stride<_64, _1>>;

// One tile: cp.async into shared memory, ldmatrix into registers, mma.sync, C to global.
template <class SmemLayout>
__global__ void __launch_bounds__(kThreads) copy_mma_tile(const bf16* a, const bf16* b, float* c) {
  __shared__ alignas(128) bf16 smem_a[kM * kK], smem_b[kN * kK];
  auto rowmajor = [](auto rows) { return make_layout(make_shape(rows, Int<kK>{}), make_stride(Int<kK>{}, _1{})); };
  Tensor gA = make_tensor(make_gmem_ptr(a), rowmajor(Int<kM>{}));
  Tensor gB = make_tensor(make_gmem_ptr(b), rowmajor(Int<kN>{}));
  Tensor gC = make_tensor(make_gmem_ptr(c), make_layout(make_shape(Int<kM>{}, Int<kN>{}), LayoutRight{}));
  Tensor sA = make_tensor(make_smem_ptr(smem_a), SmemLayout{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemLayout{});
  const int tid = threadIdx.x;

  // Global → shared: every thread issues its 16-byte cp.async copies, then waits for its own
  // group; the barrier makes every thread's copies visible to every other.
  auto g2s = G2S{}.get_slice(tid);
  copy(G2S{}, g2s.partition_S(gA), g2s.partition_D(sA));
  copy(G2S{}, g2s.partition_S(gB), g2s.partition_D(sB));
  cp_async_fence();
  cp_async_wait<0>();
  __syncthreads();

  // Shared → registers through ldmatrix, in the register layout the MMA atom wants.
  Mma mma;
  auto thr = mma.get_slice(tid);
  Tensor rA = thr.partition_fragment_A(sA);  // (MMA, MMA_M, MMA_K)
  Tensor rB = thr.partition_fragment_B(sB);  // (MMA, MMA_N, MMA_K)
  Tensor rC = partition_fragment_C(mma, Shape<Int<kM>, Int<kN>>{});
  clear(rC);
  auto s2r_a = make_tiled_copy_A(S2R{}, mma).get_slice(tid);
  auto s2r_b = make_tiled_copy_B(S2R{}, mma).get_slice(tid);
  copy(make_tiled_copy_A(S2R{}, mma), s2r_a.partition_S(sA), s2r_a.retile_D(rA));
  copy(make_tiled_copy_B(S2R{}, mma), s2r_b.partition_S(sB), s2r_b.retile_D(rB));
  gemm(mma, rA, rB, rC);  // every k-block: mma.sync m16n8k16 per (atom, M repeat, N repeat)
  copy(rC, thr.partition_C(gC));
}

#if FLASHLAB_BASICS_SM90A
// ---- sm_90a: TMA and wgmma ---------------------------------------------------------------
using SmemGmma = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<_64, _64>{}));
using GmemLayout = Layout<Shape<_64, _64>, Stride<_64, _1>>;
using Tma = decltype(make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr<bf16>(nullptr), GmemLayout{}),
                                   SmemGmma{}));

__global__ void __launch_bounds__(kThreads) tma_wgmma_tile(const __grid_constant__ Tma tma_a,
                                                           const __grid_constant__ Tma tma_b, float* c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // 128-byte swizzled tiles must start on a 1024-byte boundary (the swizzle's period).
  __shared__ alignas(1024) bf16 smem_a[kM * kK];
  __shared__ alignas(1024) bf16 smem_b[kN * kK];
  __shared__ uint64_t full;
  Tensor sA = make_tensor(make_smem_ptr(smem_a), SmemGmma{});
  Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemGmma{});
  const int tid = threadIdx.x;
  if (tid == 0) {
    initialize_barrier(full, 1);            // one arrival: the thread that issues the copies
    cutlass::arch::fence_barrier_init();    // make the initialized barrier visible to the TMA unit
  }
  __syncthreads();
  if (tid == 0) {
    set_barrier_transaction_bytes(full, 2 * kM * kK * sizeof(bf16));  // arrive, expect the bytes
    auto [tAg, tAs] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA),
                                    group_modes<0, 2>(tma_a.get_tma_tensor(shape(GmemLayout{}))));
    auto [tBg, tBs] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB),
                                    group_modes<0, 2>(tma_b.get_tma_tensor(shape(GmemLayout{}))));
    copy(tma_a.with(full), tAg, tAs);
    copy(tma_b.with(full), tBg, tBs);
  }
  wait_barrier(full, 0);  // phase 0 completes when both tiles' bytes have landed

  auto mma = make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{});
  auto thr = mma.get_slice(tid);
  Tensor dA = thr.make_fragment_A(thr.partition_A(sA));  // descriptors, not registers
  Tensor dB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor gC = make_tensor(make_gmem_ptr(c), make_layout(make_shape(Int<kM>{}, Int<kN>{}), LayoutRight{}));
  Tensor rC = thr.partition_fragment_C(gC);
  clear(rC);
  warpgroup_fence_operand(rC);
  warpgroup_arrive();
  gemm(mma, dA, dB, rC);  // four wgmma.m64n64k16, issued asynchronously
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(rC);
  copy(rC, thr.partition_C(gC));
#endif
}
#endif

// ---- host ----------------------------------------------------------------------------------
// C = A·Bᵀ in fp32, k in order (what every GPU path must reproduce on exact data).
std::vector<float> cpu_gemm(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  std::vector<float> c(kM * kN);
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      float acc = 0.f;
      for (int k = 0; k < kK; ++k) acc += float(a[m * kK + k]) * float(b[n * kK + k]);
      c[m * kN + n] = acc;
    }
  }
  return c;
}

void host_checks(basics::Check& check, const std::vector<bf16>& a, const std::vector<bf16>& b,
                 const std::vector<float>& c) {
  // The TiledMMA's C partition: 128 threads x 32 values, each of the 4096 elements once.
  std::vector<int> owners(kM * kN, 0);
  Tensor coords = make_identity_tensor(make_shape(Int<kM>{}, Int<kN>{}));
  for (int t = 0; t < kThreads; ++t) {
    Tensor mine = Mma{}.get_slice(t).partition_C(coords);
    for (int i = 0; i < size(mine); ++i) ++owners[get<0>(mine(i)) * kN + get<1>(mine(i))];
  }
  bool once = true;
  for (int o : owners) once = once && o == 1;
  check.expect(once, "TiledMMA 2x2 warps: every C element in exactly one thread's registers");
  // The ldmatrix copy reads every element of the A tile exactly once per k-block.
  std::fill(owners.begin(), owners.end(), 0);
  for (int t = 0; t < kThreads; ++t) {
    Tensor src = make_tiled_copy_A(S2R{}, Mma{}).get_slice(t).partition_S(coords);
    for (int i = 0; i < size(src); ++i) ++owners[get<0>(src(i)) * kK + get<1>(src(i))];
  }
  // 2 x 2 warps: the two warps of a warp-row both read that row's A, so each element twice.
  once = true;
  for (int o : owners) once = once && o == 2;
  check.expect(once, "ldmatrix partition of A: every element read by the 2 warps of its row");
  double worst = 0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      double ref = 0;
      for (int k = 0; k < kK; ++k) ref += double(a[m * kK + k]) * double(b[n * kK + k]);
      worst = std::max(worst, std::abs(ref - double(c[m * kN + n])));
    }
  }
  check.expect(worst == 0.0, "fp32 CPU GEMM == fp64 GEMM on exact data");
  check.done("cpu");
}

}  // namespace copy_mma

int main() {
  using namespace copy_mma;
  basics::Check check;
  std::vector<bf16> a(kM * kK), b(kN * kK);
  unsigned x = 12345;
  auto next = [&x] { x = x * 1664525u + 1013904223u; return int((x >> 8) % 33) - 16; };  // -16..16
  for (auto& v : a) v = bf16(next() / 8.f);
  for (auto& v : b) v = bf16(next() / 8.f);
  const std::vector<float> ref = cpu_gemm(a, b);
  host_checks(check, a, b, ref);
  if (check.exit_code() != 0 || !basics::gpu_or_skip()) return check.exit_code();

  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  bf16* da = basics::to_device(a);
  bf16* db = basics::to_device(b);
  float* dc = nullptr;
  CUDA_CHECK(cudaMalloc(&dc, kM * kN * sizeof(float)));
  auto run = [&](const char* name, auto launch) {
    CUDA_CHECK(cudaMemset(dc, 0xff, kM * kN * sizeof(float)));  // NaN until written
    launch();
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    const double diff = basics::max_abs_diff(basics::to_host(dc, kM * kN), ref);
    std::printf("%s: max |C - CPU| = %g\n", name, diff);
    check.expect(diff < basics::kExactTolerance, name);
    check.done(name);
  };
  run("cp.async + ldmatrix + mma.sync, Swizzle<3,3,3>",
      [&] { copy_mma_tile<SmemSwizzled><<<1, kThreads>>>(da, db, dc); });
  run("cp.async + ldmatrix + mma.sync, row-major smem",
      [&] { copy_mma_tile<SmemPlain><<<1, kThreads>>>(da, db, dc); });
#if FLASHLAB_BASICS_SM90A
  if (prop.major == 9) {
    auto gmem = [](const bf16* p) { return make_tensor(make_gmem_ptr(p), GmemLayout{}); };
    Tma ta = make_tma_copy(SM90_TMA_LOAD{}, gmem(da), SmemGmma{});
    Tma tb = make_tma_copy(SM90_TMA_LOAD{}, gmem(db), SmemGmma{});
    run("TMA + wgmma (sm_90a)", [&] { tma_wgmma_tile<<<1, kThreads>>>(ta, tb, dc); });
  } else {
    std::printf("skip: TMA + wgmma: the device is sm_%d%d; wgmma runs on sm_90 only\n", prop.major, prop.minor);
  }
#else
  std::printf("skip: TMA + wgmma: this build has no sm_90a code (FLASHLAB_CUDA_ARCHS lacks 90a)\n");
#endif
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dc));
  return check.exit_code();
}
