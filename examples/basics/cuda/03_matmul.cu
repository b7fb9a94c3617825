// Basics 3 — matmul: from one thread per output to register tiles and tensor cores.
//
// C = A·B, row-major, A [M, K], B [K, N], fp32 accumulation, four hand-written kernels:
//   naive       one thread per C element, 16x16 threads per block; every FMA loads one A and
//               one B value (lanes share the A value and read consecutive B values)
//   smem_tile   32x32 tiles of A and B staged in shared memory; each value loaded from global
//               memory is used 32 times
//   reg_tile    a 128x128 block tile, k-steps of 8, 256 threads each holding 8x8 outputs in
//               registers: per k, a thread reads 8 A and 8 B values from shared memory and
//               does 64 FMAs
//   wmma_bf16   tensor cores through nvcuda::wmma: bf16 A and B, each warp computes a 32x32
//               tile as 2x2 fragments of 16x16, k-steps of 16, fragments loaded from global
//               memory (through L1/L2) without staging
// and two ceilings from cuBLAS (CUDA::cublas): cublasSgemm for the fp32 kernels and
// cublasGemmEx (bf16 in, fp32 accumulate and out) for wmma_bf16.
//
// What it shows: the FLOPs are fixed (2·M·N·K); what changes is how many bytes each FMA
// fetches from global memory, shared memory and registers, i.e. the arithmetic intensity
// at each level. The kernels assume M, N, K multiples of 128 (checked before any launch).
// Measured: docs/learn/basics/03-matmul.md has the table and its command.
//
// CPU check: the naive i-j-k loop against a blocked i-k-j loop (32x32x32 blocks), exactly.
// The inputs are integers in -2..2: every product and partial sum is an integer below 2^24,
// so fp32 and bf16 hold them exactly in any summation order, and every GPU kernel (and
// cuBLAS) must equal the CPU result exactly. The full size checks 128 rows, row 129·k mod M
// for k < 128: every row position of every 128-row tile, over all columns.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>
#include <functional>
#include <string>

#include "basics.cuh"

// cuBLAS calls return a cublasStatus_t, not a cudaError_t: the same check, for them.
static void cublas_check(cublasStatus_t status, const char* expr, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, line, expr, int(status));
  std::exit(1);
}
#define CUBLAS_CHECK(expr) cublas_check((expr), #expr, __LINE__)

__global__ void matmul_naive(const float* A, const float* B, float* C, int M, int N, int K) {
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = acc;
}

constexpr int kTile = 32;

__global__ void matmul_smem_tile(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[kTile][kTile], Bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    As[ty][tx] = A[row * K + k0 + tx];    // lanes (tx) read consecutive addresses: coalesced
    Bs[ty][tx] = B[(k0 + ty) * N + col];
    __syncthreads();                      // the tiles are complete before anyone reads them
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();                      // everyone is done before the next tiles land
  }
  C[row * N + col] = acc;
}

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;
constexpr int kRegThreads = (kBM / kTM) * (kBN / kTN);  // 256

// Thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 16·m and columns tx + 16·n of the
// block tile (m, n < 8): along a warp, tx is consecutive, so the B reads from shared memory
// fall in distinct banks and the C stores are coalesced. As is stored k-major (As[k][m]) so a
// thread reads its 8 A values along one row of As; its 4 words of padding put the 32 stores
// of a warp (8 k by 4 m) in 32 different banks.
__global__ void __launch_bounds__(kRegThreads)
matmul_reg_tile(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[kBK][kBM + 4], Bs[kBK][kBN];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const float* Ablk = A + blockIdx.y * kBM * K;
  const float* Bblk = B + blockIdx.x * kBN;
  float acc[kTM][kTN] = {};
  for (int k0 = 0; k0 < K; k0 += kBK) {
    for (int i = tid; i < kBM * kBK; i += kRegThreads)  // 128x8 of A: 32 bytes per row
      As[i % kBK][i / kBK] = Ablk[(i / kBK) * K + k0 + i % kBK];
    for (int i = tid; i < kBK * kBN; i += kRegThreads)  // 8x128 of B: 512 bytes per row
      Bs[i / kBN][i % kBN] = Bblk[(k0 + i / kBN) * N + i % kBN];
    __syncthreads();
    for (int k = 0; k < kBK; ++k) {
      float a[kTM], b[kTN];
      for (int m = 0; m < kTM; ++m) a[m] = As[k][ty + 16 * m];
      for (int n = 0; n < kTN; ++n) b[n] = Bs[k][tx + 16 * n];
      for (int m = 0; m < kTM; ++m)
        for (int n = 0; n < kTN; ++n) acc[m][n] += a[m] * b[n];
    }
    __syncthreads();
  }
  for (int m = 0; m < kTM; ++m)
    for (int n = 0; n < kTN; ++n)
      C[(blockIdx.y * kBM + ty + 16 * m) * N + blockIdx.x * kBN + tx + 16 * n] = acc[m][n];
}

// 4 warps per block in a 2x2 arrangement, each a 32x32 tile: a 64x64 block tile.
__global__ void matmul_wmma_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C,
                                 int M, int N, int K) {
  using namespace nvcuda;
  const int warp = threadIdx.x / 32;
  const int row0 = blockIdx.y * 64 + (warp / 2) * 32, col0 = blockIdx.x * 64 + (warp % 2) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b[2];
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], A + (row0 + 16 * i) * K + k0, K);
    for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], B + k0 * N + col0 + 16 * j, N);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(C + (row0 + 16 * i) * N + col0 + 16 * j, acc[i][j], N,
                              wmma::mem_row_major);
}

// C = A·B on the CPU for rows `rows` of C, i-k-j order in 32x32x32 blocks (the inner loop
// runs along a row of B and of C: contiguous, so the compiler vectorizes it).
static void cpu_blocked(const std::vector<float>& A, const std::vector<float>& B,
                        std::vector<float>& C, int N, int K, const std::vector<int>& rows) {
  for (size_t r0 = 0; r0 < rows.size(); r0 += 32)
    for (int k0 = 0; k0 < K; k0 += 32)
      for (int j0 = 0; j0 < N; j0 += 32)
        for (size_t r = r0; r < std::min(rows.size(), r0 + 32); ++r) {
          const int i = rows[r];
          if (k0 == 0 && j0 == 0) std::fill(&C[size_t(i) * N], &C[size_t(i) * N] + N, 0.f);
          for (int k = k0; k < std::min(K, k0 + 32); ++k) {
            const float a = A[size_t(i) * K + k];
            for (int j = j0; j < std::min(N, j0 + 32); ++j)
              C[size_t(i) * N + j] += a * B[size_t(k) * N + j];
          }
        }
}

static bool rows_equal(const std::vector<float>& x, const std::vector<float>& y, int N,
                       const std::vector<int>& rows) {
  for (int i : rows)
    if (!std::equal(&x[size_t(i) * N], &x[size_t(i) * N] + N, &y[size_t(i) * N])) return false;
  return true;
}

int main(int argc, char** argv) {
  const bool quick = basics::quick_mode(argc, argv);
  const int M = quick ? 256 : 4096, N = M, K = M;
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), C_ref(size_t(M) * N);
  for (size_t i = 0; i < A.size(); ++i)
    A[i] = float(int((uint32_t(i) * 2654435761u) >> 20) % 5 - 2);
  for (size_t i = 0; i < B.size(); ++i)
    B[i] = float(int((uint32_t(i) * 40503u + 17u) >> 9) % 5 - 2);

  std::vector<int> rows;  // the rows the GPU results are checked on
  if (quick) {
    for (int i = 0; i < M; ++i) rows.push_back(i);
  } else {
    for (int k = 0; k < 128; ++k) rows.push_back(int((129LL * k) % M));
  }
  std::printf("matmul, M = N = K = %d, fp32 (bf16 for wmma), %.3g GFLOP\n", M,
              2.0 * M * N * K / 1e9);
  cpu_blocked(A, B, C_ref, N, K, rows);
  if (quick) {  // the naive i-j-k loop, independently, over every element
    std::vector<float> C_naive(size_t(M) * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) acc += A[size_t(i) * K + k] * B[size_t(k) * N + j];
        C_naive[size_t(i) * N + j] = acc;
      }
    basics::require(C_naive == C_ref, "cpu check: naive i-j-k equals blocked i-k-j");
  }
  if (!basics::gpu_or_skip()) return 0;
  if (M % 128 || N % 128 || K % 128) {
    std::fprintf(stderr, "matmul: M, N, K must be multiples of 128\n");
    return 1;
  }

  std::vector<__nv_bfloat16> Ah(A.size()), Bh(B.size());
  for (size_t i = 0; i < A.size(); ++i) Ah[i] = __float2bfloat16(A[i]);
  for (size_t i = 0; i < B.size(); ++i) Bh[i] = __float2bfloat16(B[i]);
  float *dA = basics::to_device(A), *dB = basics::to_device(B), *dC = nullptr;
  __nv_bfloat16 *dAh = basics::to_device(Ah), *dBh = basics::to_device(Bh);
  CUDA_CHECK(cudaMalloc(&dC, C_ref.size() * sizeof(float)));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // fp32 FMA, no TF32
  const float one = 1.f, zero = 0.f;

  struct Variant {
    const char* name;
    std::function<void()> launch;
  };
  // cuBLAS is column-major: row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ.
  const std::vector<Variant> variants = {
      {"naive", [&] {
         matmul_naive<<<dim3(N / 16, M / 16), dim3(16, 16)>>>(dA, dB, dC, M, N, K);
       }},
      {"smem_tile", [&] {
         matmul_smem_tile<<<dim3(N / kTile, M / kTile), dim3(kTile, kTile)>>>(dA, dB, dC, M, N, K);
       }},
      {"reg_tile", [&] {
         matmul_reg_tile<<<dim3(N / kBN, M / kBM), kRegThreads>>>(dA, dB, dC, M, N, K);
       }},
      {"cublasSgemm", [&] {
         CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, dB, N, dA, K,
                                  &zero, dC, N));
       }},
      {"wmma_bf16", [&] {
         matmul_wmma_bf16<<<dim3(N / 64, M / 64), 128>>>(dAh, dBh, dC, M, N, K);
       }},
      {"cublasGemmEx bf16", [&] {
         CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, dBh,
                                   CUDA_R_16BF, N, dAh, CUDA_R_16BF, K, &zero, dC, CUDA_R_32F, N,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
       }},
  };
  for (const Variant& v : variants) {
    CUDA_CHECK(cudaMemset(dC, 0, C_ref.size() * sizeof(float)));
    v.launch();
    CUDA_CHECK(cudaGetLastError());
    std::string what = std::string("gpu check: ") + v.name + " equals the CPU exactly";
    basics::require(rows_equal(basics::to_host(dC, C_ref.size()), C_ref, N, rows), what.c_str());
  }

  // Each fp32 kernel is compared with cublasSgemm (entry 3), wmma_bf16 with cublasGemmEx (5).
  const int ceiling_of[] = {3, 3, 3, 3, 5, 5};
  std::vector<float> ms;
  for (const Variant& v : variants) ms.push_back(basics::median_ms(v.launch, quick ? 3 : 10));
  std::printf("\n%-18s %10s %10s %10s\n", "kernel", "ms", "TFLOP/s", "of cuBLAS");
  for (size_t i = 0; i < variants.size(); ++i)
    std::printf("%-18s %10.3f %10.1f %9.0f%%\n", variants[i].name, ms[i],
                2.0 * M * N * K / (ms[i] * 1e-3) / 1e12, 100.0 * ms[ceiling_of[i]] / ms[i]);
  CUBLAS_CHECK(cublasDestroy(handle));
  for (void* p : {(void*)dA, (void*)dB, (void*)dC, (void*)dAh, (void*)dBh}) CUDA_CHECK(cudaFree(p));
  return 0;
}
