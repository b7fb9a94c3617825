// CUDA error handling for kernels' launchers: every runtime call and every launch is
// checked, and a failure becomes a Status that names the call and where it was.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashlab/flashlab.h"

namespace flashlab {

inline Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return {};
  return {StatusCode::kCudaError, std::string(what) + " failed: " + cudaGetErrorString(err) +
                                      " (" + file + ":" + std::to_string(line) + ")"};
}

}  // namespace flashlab

// Return a Status from the enclosing function when a CUDA call fails.
#define FL_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    ::flashlab::Status s_ = ::flashlab::cuda_status((call), #call, __FILE__, __LINE__); \
    if (!s_.ok()) return s_;                                                           \
  } while (0)

// After a launch: configuration errors (bad grid, too much shared memory) surface here.
#define FL_CUDA_CHECK_LAUNCH() FL_CUDA_CHECK(cudaGetLastError())
