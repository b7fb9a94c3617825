// The harness's memory: owning buffers on the host or the GPU, the copies and fills it
// makes on its stream, and the random inputs. The library itself never allocates; the
// harness does, freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flashlab/flashlab.h"

namespace flashlab::bench {

// Owning memory on the host (cache-line aligned) or the GPU.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  Status allocate(Device device, size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release();
  void swap(Buffer& o) noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::kCPU;
};

// Copies and fills go on `stream` (CUDA), so they are ordered with the kernels; upload and
// download wait for it.
Status upload(const Buffer& dst, const void* host, void* stream);
Status poison(const Buffer& b, void* stream);  // all-ones bytes: NaN in fp32, fp16 and bf16
Status synchronize(Device device, void* stream);

// `t` readable on the host: `t` itself when it is there, else a copy of the span of memory
// it covers (any strides >= 0, so a transposed peer output too) kept in `keep`.
Status host_view(const Tensor& t, void* stream, Buffer* keep, Tensor* host);

// n values of `dtype` near a unit normal (bounded: |x| < 3.47, so fp16 logits cannot
// overflow), never zero after rounding; chunks are seeded independently, so the values
// depend on the seed only, not on the number of threads.
void fill_normalish(void* dst, DType dtype, int64_t n, uint64_t seed);
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b);

// CUDA device 0: its L2 size and free memory (0 without CUDA), a stream of the harness's
// own, and its description.
Status l2_cache_bytes(size_t* bytes);
Status free_device_bytes(size_t* bytes);
Status create_stream(void** stream);
void destroy_stream(void* stream);

}  // namespace flashlab::bench
