// The harness's buffers, copies, fills and random inputs (memory.h).
#include "bench/memory.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/check.cuh"
#endif

#include "common/dtype.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

constexpr size_t kHostAlign = 64;                 // host buffers start on a cache line
constexpr int64_t kFillChunk = int64_t(1) << 16;  // elements per independently seeded chunk
constexpr uint8_t kPoisonByte = 0xFF;             // all-ones is NaN in fp32, fp16 and bf16

Status no_memory(const char* where, size_t bytes) {
  return {StatusCode::kUnsupported, std::string("cannot allocate ") + format_bytes(bytes) +
                                        " of " + where + " memory for the benchmark"};
}

Status no_cuda() { return {StatusCode::kCudaError, "this build of flashlab has no CUDA"}; }

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sum of the four 16-bit uniforms in 64 random bits, shifted and scaled to mean 0 and
// variance 1: close to a normal, bounded and cheap.
float normalish(uint64_t bits) {
  constexpr int kTerms = 4, kBits = 16;
  constexpr uint64_t kMax = (uint64_t(1) << kBits) - 1;
  constexpr double kMean = kTerms * double(kMax) / 2;
  // Each term has variance ~ 2^32 / 12, so the sum has standard deviation 2^16 / sqrt(3).
  constexpr double kInvStd = 1.7320508075688772 / double(kMax + 1);
  int64_t sum = 0;
  for (int i = 0; i < kTerms; ++i) sum += int64_t((bits >> (kBits * i)) & kMax);
  return float((double(sum) - kMean) * kInvStd);
}

}  // namespace

// ---- buffers ----------------------------------------------------------------------------

Status Buffer::allocate(Device device, size_t bytes) {
  release();
  device_ = device;
  if (bytes == 0) return {};
  if (device == Device::kCPU) {
    data_ = ::operator new(bytes, std::align_val_t{kHostAlign}, std::nothrow);
    if (!data_) return no_memory("host", bytes);
  } else {
#if FLASHLAB_WITH_CUDA
    if (cudaMalloc(&data_, bytes) != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      data_ = nullptr;
      return no_memory("GPU", bytes);
    }
#else
    return no_memory("GPU", bytes);
#endif
  }
  bytes_ = bytes;
  return {};
}

void Buffer::release() {
  if (data_ && device_ == Device::kCPU) ::operator delete(data_, std::align_val_t{kHostAlign});
#if FLASHLAB_WITH_CUDA
  if (data_ && device_ == Device::kCUDA) cudaFree(data_);
#endif
  data_ = nullptr;
  bytes_ = 0;
}

void Buffer::swap(Buffer& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  std::swap(device_, o.device_);
}

// ---- copies -----------------------------------------------------------------------------

Status upload(const Buffer& dst, const void* host, void* stream) {
  if (dst.device() == Device::kCPU) {
    std::memcpy(dst.data(), host, dst.bytes());
    return {};
  }
#if FLASHLAB_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  FL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.bytes(), cudaMemcpyHostToDevice, s));
  FL_CUDA_CHECK(cudaStreamSynchronize(s));
  return {};
#else
  (void)stream;
  return no_cuda();
#endif
}

Status poison(const Buffer& b, void* stream) {
  if (b.device() == Device::kCPU) {
    std::memset(b.data(), kPoisonByte, b.bytes());
    return {};
  }
#if FLASHLAB_WITH_CUDA
  FL_CUDA_CHECK(cudaMemsetAsync(b.data(), kPoisonByte, b.bytes(), static_cast<cudaStream_t>(stream)));
  return {};
#else
  (void)stream;
  return no_cuda();
#endif
}

Status synchronize(Device device, void* stream) {
#if FLASHLAB_WITH_CUDA
  if (device == Device::kCUDA) FL_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
#else
  (void)device;
  (void)stream;
#endif
  return {};
}

Status host_view(const Tensor& t, void* stream, Buffer* keep, Tensor* host) {
  *host = t;
  if (!t.present() || t.device == Device::kCPU) return {};
  int64_t span = 1;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] == 0) return {};
    if (t.stride[d] < 0) return {StatusCode::kInvalidArgument, "negative strides are not read"};
    span += (t.shape[d] - 1) * t.stride[d];
  }
#if FLASHLAB_WITH_CUDA
  if (Status s = keep->allocate(Device::kCPU, size_t(span) * dtype_size(t.dtype)); !s.ok()) return s;
  auto st = static_cast<cudaStream_t>(stream);
  FL_CUDA_CHECK(cudaMemcpyAsync(keep->data(), t.data, keep->bytes(), cudaMemcpyDeviceToHost, st));
  FL_CUDA_CHECK(cudaStreamSynchronize(st));
  host->data = keep->data();
  host->device = Device::kCPU;
  return {};
#else
  (void)stream, (void)keep;
  return no_cuda();
#endif
}

// ---- random inputs ----------------------------------------------------------------------

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t state = seed ^ (a * 0xD1B54A32D192ED03ull) ^ (b * 0x8CB92BA72F3D8DD7ull);
  return splitmix64(&state);
}

void fill_normalish(void* dst, DType dtype, int64_t n, uint64_t seed) {
  const int64_t chunks = (n + kFillChunk - 1) / kFillChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t state = mix_seed(seed, uint64_t(c), 0);
    const int64_t end = std::min(n, (c + 1) * kFillChunk);
    for (int64_t i = c * kFillChunk; i < end; ++i) {
      float x = 0.f;
      while (x == 0.f) x = round_to(dtype, normalish(splitmix64(&state)));
      store_from_double(dst, dtype, i, x);
    }
  }
}

// ---- the CUDA device --------------------------------------------------------------------

Status l2_cache_bytes(size_t* bytes) {
  *bytes = 0;
#if FLASHLAB_WITH_CUDA
  int l2 = 0;
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  *bytes = size_t(l2);
#endif
  return {};
}

Status free_device_bytes(size_t* bytes) {
  *bytes = 0;
#if FLASHLAB_WITH_CUDA
  size_t total = 0;
  FL_CUDA_CHECK(cudaMemGetInfo(bytes, &total));
#endif
  return {};
}

Status create_stream(void** stream) {
#if FLASHLAB_WITH_CUDA
  FL_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  FL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return {};
#else
  *stream = nullptr;
  return {StatusCode::kUnsupported, "this build of flashlab has no CUDA kernels"};
#endif
}

void destroy_stream(void* stream) {
#if FLASHLAB_WITH_CUDA
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
#else
  (void)stream;
#endif
}

}  // namespace flashlab::bench
