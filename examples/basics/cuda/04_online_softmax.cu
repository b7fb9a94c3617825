// Basics 4 — the online softmax: one row, one block, and the recurrence FlashAttention uses.
//
// y = softmax(x) along each row of a [rows, cols] fp32 matrix, one 256-thread block per row:
//   three_pass  the safe softmax as written: read the row for its max m, read it again for
//               l = Σ exp(x − m), read it a third time to write exp(x − m) / l
//   online      one read computes (m, l) together: a thread keeps a running max and a sum
//               rescaled by exp(m_old − m_new) whenever the max grows; the block then merges
//               the 256 pairs with the same rule; a second read writes the outputs
//   registers   the row (cols ≤ 4096) is read once into registers, 16 values per thread;
//               max, sum and outputs come from there: one read, one write
//
// What it shows: the running (m, l) pair and its merge rule
//   (m_a, l_a) ⊕ (m_b, l_b) = (m, l_a·exp(m_a − m) + l_b·exp(m_b − m)),  m = max(m_a, m_b)
// are associative, so the sum can be split across threads, warps and (in FlashAttention)
// key tiles, and the max never has to be known in advance. Softmax moves 8 bytes per element
// at best (read x, write y): GB/s is counted on those bytes and compared with a
// device-to-device cudaMemcpy. Measured: docs/learn/basics/04-online-softmax.md.
//
// CPU check (double): the two-pass softmax (max, then sum) against the serial online
// recurrence and against 64-element tiles merged with ⊕, to 1e-12 relative. Every seventh row
// is scaled by 100 (values up to ~400, whose exp overflows fp32 without the max subtracted).
// GPU check: |y − y_cpu| ≤ 1e-5·y_cpu + 1e-9 for every element.
#include <cmath>
#include <cstdint>
#include <string>

#include "basics.cuh"

constexpr int kThreads = 256;
constexpr int kPerThread = 16;  // the registers kernel: cols ≤ 256·16

struct MaxSum {
  float m, l;  // running max, and Σ exp(x − m) over the values seen
};

__host__ __device__ inline MaxSum merge(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};  // both empty
  return {m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};
}

// One value into a running pair: one exp per value (the larger of x and m is the new max).
__device__ inline MaxSum push(MaxSum s, float x) {
  if (x > s.m) return {x, s.l * expf(s.m - x) + 1.f};
  return {s.m, s.l + expf(x - s.m)};
}

// The merge of every thread's pair, returned to every thread: warp shuffles, then one pair
// per warp through shared memory, then the same merge over the 8 warp pairs.
__device__ MaxSum block_merge(MaxSum s) {
  __shared__ MaxSum per_warp[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    s = merge(s, {__shfl_xor_sync(0xffffffffu, s.m, offset),
                  __shfl_xor_sync(0xffffffffu, s.l, offset)});
  if (threadIdx.x % 32 == 0) per_warp[threadIdx.x / 32] = s;
  __syncthreads();
  MaxSum t = per_warp[0];
  for (int w = 1; w < kThreads / 32; ++w) t = merge(t, per_warp[w]);
  __syncthreads();  // per_warp may be reused by the caller's next block_merge
  return t;
}

__global__ void softmax_three_pass(const float* x, float* y, int cols) {
  const float* row = x + size_t(blockIdx.x) * cols;
  float* out = y + size_t(blockIdx.x) * cols;
  MaxSum s{-INFINITY, 0.f};
  for (int j = threadIdx.x; j < cols; j += kThreads) s.m = fmaxf(s.m, row[j]);
  const float m = block_merge({s.m, 0.f}).m;  // l = 0 everywhere: a max reduction
  float l = 0.f;
  for (int j = threadIdx.x; j < cols; j += kThreads) l += expf(row[j] - m);
  const float total = block_merge({m, l}).l;  // every thread has the same m: a sum
  for (int j = threadIdx.x; j < cols; j += kThreads) out[j] = expf(row[j] - m) / total;
}

__global__ void softmax_online(const float* x, float* y, int cols) {
  const float* row = x + size_t(blockIdx.x) * cols;
  float* out = y + size_t(blockIdx.x) * cols;
  MaxSum s{-INFINITY, 0.f};
  for (int j = threadIdx.x; j < cols; j += kThreads) s = push(s, row[j]);
  s = block_merge(s);
  const float inv = 1.f / s.l;
  for (int j = threadIdx.x; j < cols; j += kThreads) out[j] = expf(row[j] - s.m) * inv;
}

__global__ void softmax_registers(const float* x, float* y, int cols) {
  const float* row = x + size_t(blockIdx.x) * cols;
  float* out = y + size_t(blockIdx.x) * cols;
  float v[kPerThread];
  float m = -INFINITY;
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    int j = threadIdx.x + t * kThreads;
    v[t] = j < cols ? row[j] : -INFINITY;
    m = fmaxf(m, v[t]);
  }
  m = block_merge({m, 0.f}).m;
  float l = 0.f;
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) l += (v[t] = expf(v[t] - m));  // exp(-inf) = 0
  const float inv = 1.f / block_merge({m, l}).l;
#pragma unroll
  for (int t = 0; t < kPerThread; ++t) {
    int j = threadIdx.x + t * kThreads;
    if (j < cols) out[j] = v[t] * inv;
  }
}

// The CPU references, in double, for one row.
static void softmax_two_pass(const float* x, double* y, int cols) {
  double m = -INFINITY, l = 0;
  for (int j = 0; j < cols; ++j) m = std::max(m, double(x[j]));
  for (int j = 0; j < cols; ++j) l += std::exp(x[j] - m);
  for (int j = 0; j < cols; ++j) y[j] = std::exp(x[j] - m) / l;
}

// (m, l) by the serial recurrence (tile = 1) or by tiles of `tile` values merged with ⊕.
static void online_max_sum(const float* x, int cols, int tile, double& m, double& l) {
  m = -INFINITY, l = 0;
  for (int j0 = 0; j0 < cols; j0 += tile) {
    double tm = -INFINITY, tl = 0;
    for (int j = j0; j < std::min(cols, j0 + tile); ++j) tm = std::max(tm, double(x[j]));
    for (int j = j0; j < std::min(cols, j0 + tile); ++j) tl += std::exp(x[j] - tm);
    const double nm = std::max(m, tm);
    l = l * std::exp(m - nm) + tl * std::exp(tm - nm);  // m = -inf only before the first tile
    m = nm;
  }
}

int main(int argc, char** argv) {
  const bool quick = basics::quick_mode(argc, argv);
  const int rows = quick ? 64 : 16384, cols = quick ? 4000 : 4096;  // 4000: a ragged tail
  std::vector<float> x(size_t(rows) * cols);
  uint32_t state = 12345u;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) {
      state = state * 1664525u + 1013904223u;
      float u = float(state >> 8) / float(1 << 24) * 8.f - 4.f;  // uniform in [-4, 4)
      x[size_t(r) * cols + j] = r % 7 == 3 ? 100.f * u : u;
    }
  std::printf("softmax, %d rows x %d cols fp32 (%.0f MiB in, as much out)\n", rows, cols,
              x.size() * 4.0 / (1 << 20));

  std::vector<double> y_ref(x.size());
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    const float* row = &x[size_t(r) * cols];
    softmax_two_pass(row, &y_ref[size_t(r) * cols], cols);
    for (int tile : {1, 64}) {
      double m, l;
      online_max_sum(row, cols, tile, m, l);
      for (int j = 0; j < cols; ++j) {
        double y = std::exp(row[j] - m) / l, want = y_ref[size_t(r) * cols + j];
        worst = std::max(worst, std::abs(y - want) / (want + 1e-300));  // y = 0: exp underflows
      }
    }
  }
  std::printf("(online against two-pass: largest relative difference %.2g)\n", worst);
  basics::require(worst <= 1e-12, "cpu check: online and tiled (m, l) equal the two-pass");
  if (!basics::gpu_or_skip()) return 0;
  if (cols > kThreads * kPerThread) {
    std::fprintf(stderr, "softmax: the registers kernel holds at most %d columns\n",
                 kThreads * kPerThread);
    return 1;
  }

  float* dx = basics::to_device(x);
  float* dy = nullptr;
  CUDA_CHECK(cudaMalloc(&dy, x.size() * sizeof(float)));
  struct Variant {
    const char* name;
    void (*kernel)(const float*, float*, int);
  };
  const Variant variants[] = {{"three_pass", softmax_three_pass},
                              {"online", softmax_online},
                              {"registers", softmax_registers}};
  for (const Variant& v : variants) {
    CUDA_CHECK(cudaMemset(dy, 0, x.size() * sizeof(float)));
    v.kernel<<<rows, kThreads>>>(dx, dy, cols);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> y = basics::to_host(dy, x.size());
    bool ok = true;
    for (size_t i = 0; i < y.size(); ++i)
      ok = ok && std::abs(y[i] - y_ref[i]) <= 1e-5 * y_ref[i] + 1e-9;
    std::string what = std::string("gpu check: ") + v.name + " within 1e-5·y + 1e-9";
    basics::require(ok, what.c_str());
  }

  const double ceiling = basics::copy_ceiling_gbps(x.size() * sizeof(float));
  std::printf("\n%-16s %10s %10s %10s\n", "kernel", "ms", "GB/s", "of copy");
  std::printf("%-16s %10s %10.0f %9.0f%%\n", "cudaMemcpy D2D", "", ceiling, 100.0);
  for (const Variant& v : variants) {
    float ms = basics::median_ms([&] { v.kernel<<<rows, kThreads>>>(dx, dy, cols); });
    double rate = basics::gbps(2.0 * x.size() * sizeof(float), ms);  // read x once, write y
    std::printf("%-16s %10.3f %10.0f %9.0f%%\n", v.name, ms, rate, 100.0 * rate / ceiling);
  }
  CUDA_CHECK(cudaFree(dx));
  CUDA_CHECK(cudaFree(dy));
  return 0;
}
