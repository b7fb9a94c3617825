// What the CUDA backend needs from the runtime, in one place.
#include <cuda_runtime.h>

#include "flashlab/flashlab.h"

namespace flashlab {

bool cuda_available() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

}  // namespace flashlab
