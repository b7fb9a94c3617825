// Device-side helpers every CUDA rung shares: element conversion, sequence bounds (the
// device twin of host_seq_bounds in params.h) and the launch-side device guard.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/params.h"
#include "cuda/check.cuh"

namespace flashlab::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Programmatic dependent launch (sm_90 and newer). A kernel launched by launch_after() may
// start while the kernel before it on the stream is still running, so that its CTAs are
// resident and set up by the time that kernel ends, instead of paying the launch after it.
// Such a kernel calls wait_for_prior_grid() before it reads anything from global memory: it
// returns once every prior grid has completed and its writes are visible. A kernel calls
// allow_dependents() to let the next such launch start before it ends (at once if it never
// calls it: at its exit). Both compile to nothing before sm_90 and return at once in a kernel
// launched the ordinary way.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether `kernel` may be launched early on the current device: it was compiled for sm_90 or
// newer, so that its wait_for_prior_grid() is in the code (__CUDA_ARCH__ follows the PTX
// target: compute_80 PTX that the driver compiles for an H100 at load time runs sm_90
// machine code with empty waits, so the PTX version decides, not the binary's).
inline bool has_dependent_launch(const void* kernel) {
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
}

// Launches `kernel` (args: pointers to its arguments, as cudaLaunchKernel takes them) on
// `stream`, allowed to start before the prior kernel ends where `early` (see
// wait_for_prior_grid), else in stream order.
inline cudaError_t launch_after(const void* kernel, dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, void** args, bool early) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = early ? 1 : 0;
  return cudaLaunchKernelExC(&config, kernel, args);
}

// Sequence bounds of batch entry b. Varlen offsets are clamped to the packed tensors and
// lengths to max_seqlen, so a wrong cu_seqlens (which the host cannot check on the device
// without a copy) can give wrong answers but never an out-of-bounds access.
struct SeqInfo {
  int64_t start_q = 0, start_k = 0;
  int len_q = 0, len_k = 0;
};

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

__device__ __forceinline__ SeqInfo seq_info(const AttnParams& p, int b) {
  SeqInfo s;
  if (p.varlen) {
    s.start_q = clamp64(p.cu_seqlens_q[b], 0, p.total_q);
    s.start_k = clamp64(p.cu_seqlens_k[b], 0, p.total_k);
    s.len_q = int(clamp64(clamp64(p.cu_seqlens_q[b + 1], 0, p.total_q) - s.start_q, 0, p.seqlen_q));
    s.len_k = int(clamp64(clamp64(p.cu_seqlens_k[b + 1], 0, p.total_k) - s.start_k, 0, p.seqlen_k));
  } else {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
  }
  return s;
}

// Makes the tensors' device current for a launch and restores the caller's afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device) {
      if (cudaSetDevice(device) == cudaSuccess) switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// The device half of a rung's supports(): compute capability 8.0 or newer, `smem_bytes`
// of opt-in shared memory per block, and code for this device in the build (`kernel` is the
// instantiation the call would launch). "" when all hold, else the reason.
inline std::string device_supports(int device, int smem_bytes, const void* kernel) {
  int major = 0, minor = 0, smem_optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();  // the failed query is answered here, not by the next launch check
    return "cannot query CUDA device " + std::to_string(device);
  }
  const std::string where = "device " + std::to_string(device) + " (compute capability " +
                            std::to_string(major) + "." + std::to_string(minor) + ")";
  if (major < 8) return "needs compute capability 8.0 or newer; " + where;
  {
    DeviceGuard guard(device);
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
      cudaGetLastError();
      return "this build has no code for " + where + "; add its arch to FLASHLAB_CUDA_ARCHS";
    }
  }
  if (smem_optin < smem_bytes)
    return "needs " + std::to_string(smem_bytes) + " bytes of shared memory per block; " + where +
           " allows " + std::to_string(smem_optin);
  return "";
}

// Calls f.template operator()<T>() with T the CUDA element type of `dtype`.
template <class F>
Status dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f.template operator()<float>();
    case DType::kF16: return f.template operator()<__half>();
    case DType::kBF16: return f.template operator()<__nv_bfloat16>();
    default: return {StatusCode::kUnsupported, std::string("dtype ") + to_string(dtype) + " has no CUDA kernel"};
  }
}

// Device-scope acquire load and release add of a turn counter (the backwards' deterministic
// modes: key blocks take turns adding into a query block's dQ).
__device__ __forceinline__ int load_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* ptr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}

// The first i of [lo, hi) where pred(i) holds, for a pred that is false and then true on
// it (hi when it never holds): a binary search.
template <class Pred>
__device__ __forceinline__ int first_true(int lo, int hi, Pred pred) {
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pred(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

}  // namespace flashlab::cuda
