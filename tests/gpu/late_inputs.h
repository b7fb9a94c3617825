// A kernel that hands a call its inputs late, for testing programmatic dependent launch: it
// lets the next kernel on the stream launch at once (griddepcontrol.launch_dependents, sm_90),
// spins about 20 µs, and only then copies each buffer's real bytes in. A kernel launched
// early after it that read an input before its griddepcontrol.wait would read what was
// there before (kvcache_gpu_test.cpp fills it with 0xff: NaN).
#pragma once

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>

#include <cstddef>

namespace flashlab::test {

struct LateCopy {
  void* dst;
  const void* src;
  size_t bytes;
};

// copies: n LateCopy in device memory.
cudaError_t launch_late_copies(const LateCopy* copies, int n, cudaStream_t stream);

}  // namespace flashlab::test
#endif
