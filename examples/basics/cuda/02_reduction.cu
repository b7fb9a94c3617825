// Basics 2 — reduction: shared memory, the tree, warp shuffles.
//
// The sum of n ints, four ways. Each block reduces its part to one value and adds it to the
// result with one atomicAdd:
//   tree_interleaved  one element per thread into shared memory, then log2(256) steps where
//                     thread t adds s[k + stride] into s[k], k = 2·stride·t: the active
//                     threads are packed, but their words are 2·stride apart, so in step
//                     `stride` up to 2·stride lanes (at most 16) hit one of the 32 banks and
//                     the access is replayed that many times (a bank conflict)
//   tree_sequential   the same tree with the active threads packed at the front: in step
//                     `half`, threads t < half add s[t + half]; a warp is all active or all
//                     idle, and 32 consecutive words fall in 32 different banks
//   warp_shuffle      each warp sums its 32 values in registers with __shfl_down_sync
//                     (5 steps, no shared memory), and shared memory holds one value per warp
//   grid_stride       a grid of 4 blocks per SM whose threads first sum many elements in a
//                     register, then the warp_shuffle block reduction: the tree runs once per
//                     thread, not once per element
//
// What it shows: a reduction reads 4 bytes per element and does one add, so it is memory
// bound, and its GB/s is compared with a device-to-device cudaMemcpy. The first three differ
// only in the in-block part, which runs once per 256 elements loaded; the last one amortises
// it over the whole array. Measured: docs/learn/basics/02-reduction.md.
//
// CPU check: the serial sum against a CPU replay of the sequential-addressing tree (blocks of
// 256, then the per-block sums). The data are small integers and the total fits an int, so
// every order gives the same sum and each GPU variant must match exactly; a float sum would
// change with the order (the program prints by how much for these data).
#include <cstdint>
#include <string>

#include "basics.cuh"

constexpr int kThreads = 256;

__global__ void reduce_tree_interleaved(const int* x, int64_t n, int* out) {
  __shared__ int s[kThreads];
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0;
  __syncthreads();
  for (int stride = 1; stride < kThreads; stride *= 2) {
    int k = 2 * stride * threadIdx.x;
    if (k < kThreads) s[k] += s[k + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, s[0]);
}

__global__ void reduce_tree_sequential(const int* x, int64_t n, int* out) {
  __shared__ int s[kThreads];
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, s[0]);
}

// The sum of v over the 32 lanes of a warp, in lane 0. Step k adds the value held 16, 8, 4,
// 2, 1 lanes to the right; the mask says all 32 lanes take part.
__device__ inline int warp_sum(int v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// The block's sum: warp sums into shared memory (one word per warp), then warp 0 sums those.
__device__ inline int block_sum(int v) {
  __shared__ int per_warp[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) per_warp[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? per_warp[lane] : 0;
  return warp == 0 ? warp_sum(v) : 0;
}

__global__ void reduce_warp_shuffle(const int* x, int64_t n, int* out) {
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  int v = block_sum(i < n ? x[i] : 0);
  if (threadIdx.x == 0) atomicAdd(out, v);
}

__global__ void reduce_grid_stride(const int* x, int64_t n, int* out) {
  int v = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    v += x[i];
  v = block_sum(v);
  if (threadIdx.x == 0) atomicAdd(out, v);
}

// The CPU replay of tree_sequential: per block of 256, the halving tree; then the block sums.
static int64_t tree_sum(const std::vector<int>& x) {
  int64_t total = 0;
  std::vector<int64_t> s(kThreads);
  for (size_t base = 0; base < x.size(); base += kThreads) {
    for (int t = 0; t < kThreads; ++t) s[t] = base + t < x.size() ? x[base + t] : 0;
    for (int half = kThreads / 2; half > 0; half /= 2)
      for (int t = 0; t < half; ++t) s[t] += s[t + half];
    total += s[0];
  }
  return total;
}

int main(int argc, char** argv) {
  const bool quick = basics::quick_mode(argc, argv);
  // 4 MiB or 256 MiB of ints; a length that is not a multiple of 256 tests the tail.
  const int64_t n = quick ? (int64_t(1) << 20) + 77 : (int64_t(1) << 26);
  std::vector<int> x(n);
  std::vector<float> xf(n);
  int64_t serial = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = int((uint32_t(i) * 2654435761u) >> 16) % 7 - 3;  // -3..3
    xf[i] = float(x[i]) + 0.1f;
    serial += x[i];
  }
  std::printf("reduction, n = %lld ints (%.0f MiB), sum = %lld\n", (long long)n,
              n * 4.0 / (1 << 20), (long long)serial);
  basics::require(tree_sum(x) == serial, "cpu check: the tree order gives the serial sum");
  {
    double exact = 0;
    float forward = 0, backward = 0;
    for (int64_t i = 0; i < n; ++i) exact += xf[i], forward += xf[i], backward += xf[n - 1 - i];
    std::printf("(the same data + 0.1 as floats: serial sums, forward %.6g and backward %.6g, "
                "against %.6g in double)\n", forward, backward, exact);
  }
  if (!basics::gpu_or_skip()) return 0;

  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int all_blocks = int((n + kThreads - 1) / kThreads);
  int* dx = basics::to_device(x);
  int* dsum = nullptr;
  CUDA_CHECK(cudaMalloc(&dsum, sizeof(int)));

  struct Variant {
    const char* name;
    void (*kernel)(const int*, int64_t, int*);
    int blocks;
  };
  const Variant variants[] = {
      {"tree_interleaved", reduce_tree_interleaved, all_blocks},
      {"tree_sequential", reduce_tree_sequential, all_blocks},
      {"warp_shuffle", reduce_warp_shuffle, all_blocks},
      {"grid_stride", reduce_grid_stride, 4 * sms},
  };
  auto run = [&](const Variant& v) {
    CUDA_CHECK(cudaMemsetAsync(dsum, 0, sizeof(int)));
    v.kernel<<<v.blocks, kThreads>>>(dx, n, dsum);
  };
  for (const Variant& v : variants) {
    run(v);
    CUDA_CHECK(cudaGetLastError());
    std::string what = std::string("gpu check: ") + v.name + " equals the CPU sum";
    basics::require(basics::to_host(dsum, 1)[0] == serial, what.c_str());
  }

  const double ceiling = basics::copy_ceiling_gbps(n * sizeof(int));
  std::printf("\n%-18s %10s %10s %10s\n", "kernel", "ms", "GB/s", "of copy");
  std::printf("%-18s %10s %10.0f %9.0f%%\n", "cudaMemcpy D2D", "", ceiling, 100.0);
  for (const Variant& v : variants) {
    // The kernel alone (the sum it leaves is not read): no memset in the timed region.
    float ms = basics::median_ms([&] { v.kernel<<<v.blocks, kThreads>>>(dx, n, dsum); });
    double rate = basics::gbps(double(n) * sizeof(int), ms);  // each int read once
    std::printf("%-18s %10.3f %10.0f %9.0f%%\n", v.name, ms, rate, 100.0 * rate / ceiling);
  }
  CUDA_CHECK(cudaFree(dx));
  CUDA_CHECK(cudaFree(dsum));
  return 0;
}
