// A kernel that hands a call its inputs late, for testing programmatic dependent launch: it
// lets the next kernel on the stream launch at once (griddepcontrol.launch_dependents, sm_90),
// waits until the host says the call has been enqueued (`go`, in mapped host memory; at most
// about a second, then `*timed_out` = 1), and only then copies each buffer's real bytes in. A
// kernel launched early after it that read an input before its griddepcontrol.wait would read
// what was there before (kvcache_gpu_test.cpp fills it with 0xff: NaN).
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

// copies: n LateCopy in device memory; go, timed_out: device pointers of mapped host ints.
cudaError_t launch_late_copies(const LateCopy* copies, int n, const volatile int* go, int* timed_out,
                               cudaStream_t stream);

// The control: a kernel launched early (programmatic stream serialization) that reads the
// first byte at `src` WITHOUT griddepcontrol.wait and stores it to *seen (mapped host memory):
// after the late kernel it must see the byte from before the late copy.
cudaError_t launch_early_peek(const void* src, int* seen, cudaStream_t stream);

}  // namespace flashlab::test
#endif
