// 05_gemm: a basic CuTe GEMM in the style of CUTLASS's sgemm_sm80 tutorial, C = A·Bᵀ with A
// (M x K) and B (N x K) K-contiguous bf16 and C (M x N, row-major) fp32, the shape of
// attention's S = Q·Kᵀ. One CTA of 128 threads per 128 x 128 tile of C; K is walked in tiles of
// 64 through a 3-stage cp.async ring in Swizzle<3,3,3> shared memory; each k-block of 16 goes
// shared → registers by ldmatrix and into a TiledMMA of 2 x 2 warps over mma.sync m16n8k16
// (each warp owns 64 x 64 of the tile, 128 fp32 accumulators per thread). No bounds checks:
// M and N must be multiples of 128 and K of 64, and other sizes are refused.
// The CPU check: the kernel's decomposition (CTA tiles, k-tiles, k-blocks) replayed on the CPU
// in fp32 equals an fp64 GEMM on inputs whose sums are exact (multiples of 1/8 in [-2, 2]).
// On a GPU: the kernel equals the CPU at a small size and cuBLAS (cublasGemmEx, bf16 in, fp32
// compute) at the timed size (exact data: a wrong product would move an element by a multiple
// of 1/64, and the check allows less than 1/128); both are timed (median of 10 runs, cudaEvent).
//   run: examples/basics/cute/05_gemm [--quick] [--size N]   (page: docs/learn/basics/cute-gemm.md)
#include <cublas_v2.h>
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>

#include <cmath>
#include <vector>

#include "../cuda/basics.cuh"
#include "check.h"

using namespace cute;
using bf16 = cutlass::bfloat16_t;

namespace gemm_sm80 {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3, kThreads = 128;

using Mma = decltype(make_tiled_mma(SM80_16x8x16_F32BF16BF16F32_TN{}, Layout<Shape<_2, _2, _1>>{},
                                    Tile<_32, _32, _16>{}));
using G2S = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, bf16>{},
                                     Layout<Shape<_16, _8>, Stride<_8, _1>>{}, Layout<Shape<_1, _8>>{}));
using S2R = Copy_Atom<SM75_U32x4_LDSM_N, bf16>;
using SmemAtom = decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, Int<kBK>>, Stride<Int<kBK>, _1>>{}));
using SmemA = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBM>, Int<kBK>, Int<kStages>>{}));
using SmemB = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBN>, Int<kBK>, Int<kStages>>{}));
constexpr int kSmemBytes = int(cosize(SmemA{}) + cosize(SmemB{})) * int(sizeof(bf16));

__global__ void __launch_bounds__(kThreads) gemm_kernel(const bf16* a, const bf16* b, float* c, int M, int N, int K) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* smem_a = reinterpret_cast<bf16*>(smem);
  bf16* smem_b = smem_a + cosize(SmemA{});
  // The whole matrices, then this CTA's pieces: gA (BM, BK, k-tiles), gB (BN, BK, k-tiles).
  Tensor mA = make_tensor(make_gmem_ptr(a), make_layout(make_shape(M, K), make_stride(K, _1{})));
  Tensor mB = make_tensor(make_gmem_ptr(b), make_layout(make_shape(N, K), make_stride(K, _1{})));
  Tensor mC = make_tensor(make_gmem_ptr(c), make_layout(make_shape(M, N), make_stride(N, _1{})));
  auto cta = make_tile(Int<kBM>{}, Int<kBN>{}, Int<kBK>{});
  auto coord = make_coord(blockIdx.x, blockIdx.y, _);
  Tensor gA = local_tile(mA, cta, coord, Step<_1, X, _1>{});
  Tensor gB = local_tile(mB, cta, coord, Step<X, _1, _1>{});
  Tensor gC = local_tile(mC, cta, coord, Step<_1, _1, X>{});
  Tensor sA = make_tensor(make_smem_ptr(smem_a), SmemA{});  // (BM, BK, stage)
  Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemB{});
  const int tid = threadIdx.x;

  auto g2s = G2S{}.get_slice(tid);
  Tensor tAg = g2s.partition_S(gA);  // (CPY, CPY_M, CPY_K, k-tile)
  Tensor tAs = g2s.partition_D(sA);  // (CPY, CPY_M, CPY_K, stage)
  Tensor tBg = g2s.partition_S(gB);
  Tensor tBs = g2s.partition_D(sB);

  Mma mma;
  auto thr = mma.get_slice(tid);
  Tensor rA = thr.partition_fragment_A(sA(_, _, 0));  // (MMA, MMA_M, MMA_K)
  Tensor rB = thr.partition_fragment_B(sB(_, _, 0));
  Tensor rC = thr.partition_fragment_C(gC);  // (MMA, MMA_M, MMA_N): 4 x 2 x 8 x ... per thread
  clear(rC);
  auto s2r_a = make_tiled_copy_A(S2R{}, mma);
  auto s2r_b = make_tiled_copy_B(S2R{}, mma);
  Tensor tCsA = s2r_a.get_slice(tid).partition_S(sA);  // (CPY, MMA_M, MMA_K, stage)
  Tensor tCsB = s2r_b.get_slice(tid).partition_S(sB);
  Tensor tCrA = s2r_a.get_slice(tid).retile_D(rA);
  Tensor tCrB = s2r_b.get_slice(tid).retile_D(rB);

  // Prologue: k-tiles 0 .. kStages-2 in flight, one commit group each.
  const int k_tiles = size<3>(tAg);
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) {
      copy(G2S{}, tAg(_, _, _, s), tAs(_, _, _, s));
      copy(G2S{}, tBg(_, _, _, s), tBs(_, _, _, s));
    }
    cp_async_fence();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    // Tile kt has landed once at most kStages-2 groups are pending; the barrier shares every
    // thread's copies and says every warp is done with the stage refilled next.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      copy(G2S{}, tAg(_, _, _, next), tAs(_, _, _, next % kStages));
      copy(G2S{}, tBg(_, _, _, next), tBs(_, _, _, next % kStages));
    }
    cp_async_fence();  // an empty group at the tail keeps the count uniform
    const int stage = kt % kStages;
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(rA); ++kb) {
      copy(s2r_a, tCsA(_, _, kb, stage), tCrA(_, _, kb));
      copy(s2r_b, tCsB(_, _, kb, stage), tCrB(_, _, kb));
      gemm(mma, rA(_, _, kb), rB(_, _, kb), rC);
    }
  }
  copy(rC, thr.partition_C(gC));
}

// The kernel's decomposition on the CPU, in fp32: CTA tiles, then k-tiles of 64, then
// k-blocks of 16, accumulating in that order.
std::vector<float> cpu_tiled(const std::vector<bf16>& a, const std::vector<bf16>& b, int M, int N, int K) {
  std::vector<float> c(size_t(M) * N, 0.f);
  for (int m0 = 0; m0 < M; m0 += kBM) {
    for (int n0 = 0; n0 < N; n0 += kBN) {
      for (int k0 = 0; k0 < K; k0 += kBK) {
        for (int kb = k0; kb < k0 + kBK; kb += 16) {
          for (int m = m0; m < m0 + kBM; ++m) {
            for (int n = n0; n < n0 + kBN; ++n) {
              float acc = c[size_t(m) * N + n];
              for (int k = kb; k < kb + 16; ++k) acc += float(a[size_t(m) * K + k]) * float(b[size_t(n) * K + k]);
              c[size_t(m) * N + n] = acc;
            }
          }
        }
      }
    }
  }
  return c;
}

double max_diff_fp64(const std::vector<bf16>& a, const std::vector<bf16>& b, const std::vector<float>& c, int M,
                     int N, int K) {
  double worst = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += double(a[size_t(m) * K + k]) * double(b[size_t(n) * K + k]);
      worst = std::max(worst, std::abs(ref - double(c[size_t(m) * N + n])));
    }
  }
  return worst;
}

std::vector<bf16> exact_values(size_t n, unsigned seed) {
  std::vector<bf16> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = bf16(float(int((seed >> 8) % 33) - 16) / 8.f);  // multiples of 1/8 in [-2, 2]
  }
  return v;
}

void launch(const bf16* a, const bf16* b, float* c, int M, int N, int K) {
  gemm_kernel<<<dim3(M / kBM, N / kBN), kThreads, kSmemBytes>>>(a, b, c, M, N, K);
}

// cuBLAS is column-major: C row-major (M x N) is Cᵀ column-major (N x M) = B·Aᵀ, with B
// (N x K row-major) read as the transpose of a K x N column-major matrix.
void cublas_gemm(cublasHandle_t h, const bf16* a, const bf16* b, float* c, int M, int N, int K) {
  const float one = 1.f, zero = 0.f;
  cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b, CUDA_R_16BF, K, a, CUDA_R_16BF, K,
                                   &zero, c, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx failed: %d\n", int(st));
    std::exit(1);
  }
}

}  // namespace gemm_sm80

int main(int argc, char** argv) {
  using namespace gemm_sm80;
  basics::Check check;
  const bool quick = basics::quick_mode(argc, argv);
  const int size = int(basics::int_flag(argc, argv, "--size", quick ? 1024 : 4096));
  if (size <= 0 || size % kBM != 0 || size % kBK != 0) {
    std::printf("--size must be a positive multiple of %d (this kernel has no bounds checks)\n", kBM);
    return 2;
  }

  // The CPU check, at M = 256, N = 384, K = 512 (2 x 3 CTA tiles, 8 k-tiles).
  const int m = 256, n = 384, k = 512;
  const auto a = exact_values(size_t(m) * k, 1), b = exact_values(size_t(n) * k, 2);
  const auto ref = cpu_tiled(a, b, m, n, k);
  check.expect(max_diff_fp64(a, b, ref, m, n, k) == 0.0, "tiled fp32 CPU GEMM == fp64 GEMM (256x384x512)");
  std::printf("shared memory per CTA: %d bytes (%d stages of A and B tiles)\n", kSmemBytes, kStages);
  check.expect(kSmemBytes == kStages * (kBM + kBN) * kBK * 2, "shared memory = stages x (A + B tiles)");
  check.done("cpu");
  if (check.exit_code() != 0 || !basics::gpu_or_skip()) return check.exit_code();

  CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  {
    bf16 *da = basics::to_device(a), *db = basics::to_device(b);
    float* dc = nullptr;
    CUDA_CHECK(cudaMalloc(&dc, ref.size() * sizeof(float)));
    launch(da, db, dc, m, n, k);
    CUDA_CHECK(cudaGetLastError());
    const double diff = basics::max_abs_diff(basics::to_host(dc, ref.size()), ref);
    std::printf("max |CuTe - CPU| = %g (256x384x512)\n", diff);
    check.expect(diff < basics::kExactTolerance, "CuTe GEMM == CPU (256x384x512)");
    check.done("gpu-small");
    CUDA_CHECK(cudaFree(da));
    CUDA_CHECK(cudaFree(db));
    CUDA_CHECK(cudaFree(dc));
  }

  // The timed size: M = N = K = size, against cuBLAS.
  const size_t elems = size_t(size) * size;
  const auto big_a = exact_values(elems, 3), big_b = exact_values(elems, 4);
  bf16 *da = basics::to_device(big_a), *db = basics::to_device(big_b);
  float *dc = nullptr, *dc_ref = nullptr;
  CUDA_CHECK(cudaMalloc(&dc, elems * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&dc_ref, elems * sizeof(float)));
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasCreate failed\n");
    return 1;
  }
  const float ms_cute = basics::median_ms([&] { launch(da, db, dc, size, size, size); });
  const float ms_cublas = basics::median_ms([&] { cublas_gemm(handle, da, db, dc_ref, size, size, size); });
  const double diff = basics::max_abs_diff(basics::to_host(dc, elems), basics::to_host(dc_ref, elems));
  std::printf("max |CuTe - cuBLAS| = %g (%d^3)\n", diff, size);
  check.expect(diff < basics::kExactTolerance, "CuTe GEMM == cuBLAS");
  check.done("gpu-vs-cublas");
  const double flop = 2.0 * size * size * double(size);
  std::printf("\n%-34s %10s %10s\n", "bf16 in, fp32 out, M = N = K", "ms", "TFLOP/s");
  std::printf("%-34s %10.3f %10.1f\n", "CuTe GEMM (128x128x64, 3 stages)", ms_cute, flop / ms_cute / 1e9);
  std::printf("%-34s %10.3f %10.1f\n", "cuBLAS (cublasGemmEx)", ms_cublas, flop / ms_cublas / 1e9);
  std::printf("size %d: CuTe at %.2fx cuBLAS's throughput\n", size, ms_cublas / ms_cute);
  cublasDestroy(handle);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dc));
  CUDA_CHECK(cudaFree(dc_ref));
  return check.exit_code();
}
