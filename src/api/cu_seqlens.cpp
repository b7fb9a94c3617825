// The contents of cu_seqlens, which GPU kernels would otherwise have to trust. Host arrays
// are read in place. Device arrays are read only when the caller sets check_inputs: they
// are copied to the host on the caller's stream (after the work that produced them) in
// chunks that live on the stack, and checked by the same code. Without check_inputs the
// kernels clamp device offsets to the packed tensors and lengths to max_seqlen, so a bad
// array cannot make them touch memory outside the views, but its rows are silently wrong.
#include <algorithm>

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "api/validate.h"

namespace flashlab::api {
namespace {

constexpr int64_t kChunk = 1024;  // int32 entries read per copy: 4 KiB of stack

// `count` entries of device memory at `src` into `dst` on the host, ordered on `stream`.
Status copy_to_host(const int32_t* src, int64_t count, int32_t* dst, void* stream, const char* name) {
#if FLASHLAB_WITH_CUDA
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(dst, src, size_t(count) * sizeof(int32_t), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) return {};
  cudaGetLastError();  // a failed copy's error is not sticky: clear it for the next call
  return {StatusCode::kCudaError,
          std::string("check_inputs: copying ") + name + " to the host failed: " + cudaGetErrorString(e)};
#else
  (void)src, (void)count, (void)dst, (void)stream;
  return {StatusCode::kUnsupported, std::string("check_inputs: ") + name +
                                        " is on a CUDA device and this build has no CUDA runtime to read it"};
#endif
}

}  // namespace

Status check_cu_contents(const CommonArgs& a, const Tensor& cu, const char* name, int64_t total,
                         int max_len, const char* max_name) {
  const bool on_device = cu.device != Device::kCPU;
  if (on_device && !a.check_inputs) return {};
  const auto* entries = static_cast<const int32_t*>(cu.data);
  const int64_t n = cu.shape[0];
  int32_t chunk[kChunk];
  int64_t prev = 0;
  for (int64_t first = 0; first < n; first += kChunk) {
    const int64_t count = std::min(kChunk, n - first);
    const int32_t* c = entries + first;
    if (on_device) {
      FL_CHECK(copy_to_host(c, count, chunk, a.stream, name));
      c = chunk;
    }
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = first + j, value = c[j];
      if (i == 0 && value != 0)
        return invalid(std::string(name) + "[0] must be 0, got " + std::to_string(value));
      const int64_t len = value - prev;
      if (len < 0)
        return invalid(std::string(name) + " must be non-decreasing: [" + std::to_string(i) + "] = " +
                       std::to_string(value) + " < [" + std::to_string(i - 1) + "] = " + std::to_string(prev));
      if (len > max_len)
        return invalid(std::string(name) + ": sequence " + std::to_string(i - 1) + " has length " +
                       std::to_string(len) + " > " + max_name + " = " + std::to_string(max_len));
      prev = value;
    }
  }
  if (prev > total)
    return invalid(std::string(name) + "[" + std::to_string(n - 1) + "] = " + std::to_string(prev) +
                   " exceeds the " + std::to_string(total) + " rows of the packed tensor");
  return {};
}

}  // namespace flashlab::api
