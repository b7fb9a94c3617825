// What every basics example shares: the CUDA error check, the no-GPU skip, the cudaEvent
// timer (median of several runs) and the bandwidth ceiling (a device-to-device cudaMemcpy).
//
// The order in each program is fixed: build the inputs, run the CPU check (a CPU reference
// checked against a second, independent CPU formulation), then, only where a device exists,
// run every kernel variant, check it against the CPU result and time it. Without a device the
// program prints "skip: <reason>" after its CPU check and exits 0, which is what CI sees.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// Every CUDA runtime call goes through this: on an error it names the call, the file and the
// line, and ends the program. Kernel launches return nothing, so a launch is followed by
// CUDA_CHECK(cudaGetLastError()) (a bad configuration, no kernel image for this GPU).
#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t err_ = (expr);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,              \
                   cudaGetErrorString(err_));                                         \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace basics {

// --quick: small sizes, for CI and for a first run.
inline bool quick_mode(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--quick") == 0) return true;
  return false;
}

// "name value" pairs on the command line, e.g. --rounds 64; `fallback` when absent.
inline long long int_flag(int argc, char** argv, const char* name, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

// A failed check ends the program with exit status 1; a passed one prints one line.
inline void require(bool ok, const char* what) {
  std::printf("%-58s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) std::exit(1);
}

// True when a CUDA device can run the GPU part. Otherwise prints "skip: <reason>" and returns
// false: cudaGetDeviceCount fails (no driver, driver too old) or finds no device.
inline bool gpu_or_skip() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    std::printf("skip: no usable CUDA device (cudaGetDeviceCount: %s)\n",
                cudaGetErrorString(err));
    return false;
  }
  if (count == 0) {
    std::printf("skip: no CUDA device (cudaGetDeviceCount found 0)\n");
    return false;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  return true;
}

// Median time in milliseconds of `reps` runs of launch() on `stream`, after one untimed run
// (the first launch pays for loading the module and warming the caches). Each run is bracketed
// by its own pair of events, so one slow run moves the median little.
template <class Launch>
float median_ms(Launch&& launch, int reps = 10, cudaStream_t stream = nullptr) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  launch();
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    launch();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
  }
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

// GB/s (1e9 bytes per second) of `bytes` moved in `ms` milliseconds.
inline double gbps(double bytes, float ms) { return bytes / (ms * 1e-3) / 1e9; }

// The bandwidth ceiling the memory-bound examples are compared with: a device-to-device
// cudaMemcpy of `bytes`, counted as 2·bytes moved (each byte read once and written once).
inline double copy_ceiling_gbps(size_t bytes) {
  void *src = nullptr, *dst = nullptr;
  CUDA_CHECK(cudaMalloc(&src, bytes));
  CUDA_CHECK(cudaMalloc(&dst, bytes));
  CUDA_CHECK(cudaMemset(src, 0, bytes));
  float ms = median_ms([&] { CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(dst));
  return gbps(2.0 * bytes, ms);
}

// A device buffer holding a copy of `host`, freed by the caller with cudaFree.
template <class T>
T* to_device(const std::vector<T>& host) {
  T* ptr = nullptr;
  CUDA_CHECK(cudaMalloc(&ptr, host.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return ptr;
}

template <class T>
std::vector<T> to_host(const T* device, size_t n) {
  std::vector<T> host(n);
  CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace basics
