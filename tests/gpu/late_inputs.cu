// late_inputs.h: the late-copying kernel and its launch.
#include "late_inputs.h"

namespace flashlab::test {
namespace {

__global__ void late_copies(const LateCopy* copies, int n, const volatile int* go, int* timed_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    while (*go == 0) {
      if (clock64() - t0 > 2000000000ll) {
        *timed_out = 1;
        break;
      }
      __nanosleep(1000);
    }
  }
  __syncthreads();
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int i = 0; i < n; ++i) {
    auto* dst = static_cast<unsigned char*>(copies[i].dst);
    const auto* src = static_cast<const unsigned char*>(copies[i].src);
    for (size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < copies[i].bytes; j += stride)
      dst[j] = src[j];
  }
}

__global__ void early_peek(const unsigned char* src, int* seen) {
  *static_cast<volatile int*>(seen) = *static_cast<const volatile unsigned char*>(src);
  __threadfence_system();
}

}  // namespace

cudaError_t launch_early_peek(const void* src, int* seen, cudaStream_t stream) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, early_peek, static_cast<const unsigned char*>(src), seen);
}

cudaError_t launch_late_copies(const LateCopy* copies, int n, const volatile int* go, int* timed_out,
                               cudaStream_t stream) {
  late_copies<<<64, 256, 0, stream>>>(copies, n, go, timed_out);
  return cudaGetLastError();
}

}  // namespace flashlab::test
