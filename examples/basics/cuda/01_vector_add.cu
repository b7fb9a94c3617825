// Basics 1 — vector add: thread indices, the grid-stride loop, coalescing.
//
// c[i] = a[i] + b[i] over n floats, four ways:
//   one_per_thread  i = blockIdx.x·blockDim.x + threadIdx.x, one element per thread, a grid
//                   of ceil(n / 256) blocks, `if (i < n)` for the last block
//   grid_stride     a fixed grid (4 blocks per SM) whose threads step by gridDim.x·blockDim.x
//                   until they pass n: any n runs on any grid
//   strided         the same work with the 32 lanes of a warp reading 32 elements that are
//                   n/32 floats apart: each lane needs its own 32-byte sector, 8x the bytes
//                   the coalesced warp fetches for the same 128 useful bytes
//   float4          grid_stride with one 16-byte load per array per iteration
//
// What it shows: a memory-bound kernel is judged by GB/s against what the memory can do,
// and the ceiling here is a device-to-device cudaMemcpy (each byte read once, written once).
// The add moves 12 bytes per element (read a, read b, write c) for one FLOP.
// Measured: docs/learn/basics/01-threads-and-memory.md has the table and its command.
//
// CPU check: c from a plain loop, against c from a CPU replay of each kernel's index mapping
// (every element written exactly once, for several n and grid shapes). The data are small
// integers, so every GPU result must equal the CPU one exactly.
#include <cstdint>
#include <string>

#include "basics.cuh"

constexpr int kThreads = 256;

__global__ void add_one_per_thread(const float* a, const float* b, float* c, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

__global__ void add_grid_stride(const float* a, const float* b, float* c, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    c[i] = a[i] + b[i];
}

// Logical index i goes to element (i % 32)·(n / 32) + i / 32: lane l of a warp touches column l
// of an n/32-wide layout, so neighbouring lanes are n/32 floats apart. Needs n % 32 == 0 (then
// the mapping is a permutation of 0..n-1; the CPU check proves it).
__host__ __device__ inline int64_t strided_index(int64_t i, int64_t n) {
  return (i % 32) * (n / 32) + i / 32;
}

__global__ void add_strided(const float* a, const float* b, float* c, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t j = strided_index(i, n);
    c[j] = a[j] + b[j];
  }
}

// n4 = n / 4 float4 elements (n % 4 == 0; cudaMalloc returns 256-byte aligned pointers).
__global__ void add_float4(const float4* a, const float4* b, float4* c, int64_t n4) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 x = a[i], y = b[i];
    c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

// The CPU replay of a grid-stride mapping: how many times each element is written.
static bool covers_each_once(int64_t n, int64_t blocks, int64_t threads, bool strided) {
  std::vector<int> writes(n, 0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t t = 0; t < threads; ++t)
      for (int64_t i = b * threads + t; i < n; i += blocks * threads)
        ++writes[strided ? strided_index(i, n) : i];
  return std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; });
}

int main(int argc, char** argv) {
  const bool quick = basics::quick_mode(argc, argv);
  const int64_t n = quick ? (int64_t(1) << 20) : (int64_t(1) << 26);  // 4 MiB or 256 MiB/array
  std::vector<float> a(n), b(n), c_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = float(i % 1000);
    b[i] = float((i * 7) % 1001);
    c_ref[i] = a[i] + b[i];
  }

  std::printf("vector add, n = %lld floats (%.0f MiB per array)\n", (long long)n,
              n * 4.0 / (1 << 20));
  bool ok = true;
  for (int64_t m : {1, 31, 32, 1000, 4096, 12345}) {
    ok = ok && covers_each_once(m, 1, 1, false) && covers_each_once(m, 3, 32, false) &&
         covers_each_once(m, (m + 255) / 256, 256, false) && covers_each_once(m, 7, 64, false);
    if (m % 32 == 0)
      ok = ok && covers_each_once(m, 3, 32, true) && covers_each_once(m, 2, 256, true);
  }
  basics::require(ok, "cpu check: grid-stride and strided maps write each i once");
  if (!basics::gpu_or_skip()) return 0;

  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int stride_blocks = 4 * sms;
  const int one_per_thread_blocks = int((n + kThreads - 1) / kThreads);
  float* da = basics::to_device(a);
  float* db = basics::to_device(b);
  float* dc = nullptr;
  CUDA_CHECK(cudaMalloc(&dc, n * sizeof(float)));

  struct Variant {
    const char* name;
    void (*launch)(const float*, const float*, float*, int64_t, int, int);
  };
  const Variant variants[] = {
      {"one_per_thread", [](const float* x, const float* y, float* z, int64_t m, int blocks, int) {
         add_one_per_thread<<<blocks, kThreads>>>(x, y, z, m);
       }},
      {"grid_stride", [](const float* x, const float* y, float* z, int64_t m, int, int blocks) {
         add_grid_stride<<<blocks, kThreads>>>(x, y, z, m);
       }},
      {"strided", [](const float* x, const float* y, float* z, int64_t m, int, int blocks) {
         add_strided<<<blocks, kThreads>>>(x, y, z, m);
       }},
      {"float4", [](const float* x, const float* y, float* z, int64_t m, int, int blocks) {
         add_float4<<<blocks, kThreads>>>(reinterpret_cast<const float4*>(x),
                                          reinterpret_cast<const float4*>(y),
                                          reinterpret_cast<float4*>(z), m / 4);
       }},
  };

  for (const Variant& v : variants) {
    CUDA_CHECK(cudaMemset(dc, 0, n * sizeof(float)));
    v.launch(da, db, dc, n, one_per_thread_blocks, stride_blocks);
    CUDA_CHECK(cudaGetLastError());
    std::string what = std::string("gpu check: ") + v.name + " equals the CPU exactly";
    basics::require(basics::to_host(dc, n) == c_ref, what.c_str());
  }

  const double ceiling = basics::copy_ceiling_gbps(n * sizeof(float));
  std::printf("\n%-16s %10s %10s %10s\n", "kernel", "ms", "GB/s", "of copy");
  std::printf("%-16s %10s %10.0f %9.0f%%\n", "cudaMemcpy D2D", "", ceiling, 100.0);
  for (const Variant& v : variants) {
    float ms = basics::median_ms(
        [&] { v.launch(da, db, dc, n, one_per_thread_blocks, stride_blocks); });
    double rate = basics::gbps(3.0 * n * sizeof(float), ms);  // read a, read b, write c
    std::printf("%-16s %10.3f %10.0f %9.0f%%\n", v.name, ms, rate, 100.0 * rate / ceiling);
  }
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dc));
  return 0;
}
