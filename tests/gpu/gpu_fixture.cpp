#include "gpu/gpu_fixture.h"

#include <utility>

namespace flashlab::test {

const std::string& gpu_unavailable_reason() {
  static const std::string why = []() -> std::string {
#if !FLASHLAB_WITH_CUDA
    return "built without CUDA (FLASHLAB_CUDA=OFF): this build has no GPU kernels";
#else
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error
      return std::string("no CUDA device: cudaGetDeviceCount failed: ") + cudaGetErrorName(err) +
             " (" + cudaGetErrorString(err) + ")";
    }
    if (n == 0) return "no CUDA device: cudaGetDeviceCount found none";
    if (!cuda_available()) return "no CUDA device: flashlab::cuda_available() is false";
    return "";
#endif
  }();
  return why;
}

#if FLASHLAB_WITH_CUDA

bool cuda_ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  ADD_FAILURE() << what << " failed: " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err)
                << ")";
  return false;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) ok_ = cuda_ok(cudaMalloc(&ptr_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cuda_ok(cudaFree(ptr_), "cudaFree");
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), ok_(o.ok_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cuda_ok(cudaFree(ptr_), "cudaFree");
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    ok_ = o.ok_;
  }
  return *this;
}

bool DeviceBuffer::upload(const void* src, size_t bytes) {
  if (bytes > bytes_) {
    ADD_FAILURE() << "upload of " << bytes << " bytes into a buffer of " << bytes_;
    return false;
  }
  // cudaMemcpy from pageable memory and cudaMemset may return before the device has the
  // data, and the kernels run on a non-blocking stream that does not wait for the legacy
  // default stream: synchronize so the kernel never races its own inputs.
  return bytes == 0 || (cuda_ok(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice),
                                "cudaMemcpy host to device") &&
                        cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after upload"));
}

bool DeviceBuffer::download(void* dst, size_t bytes) const {
  if (bytes > bytes_) {
    ADD_FAILURE() << "download of " << bytes << " bytes from a buffer of " << bytes_;
    return false;
  }
  return bytes == 0 || cuda_ok(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost),
                               "cudaMemcpy device to host");
}

bool DeviceBuffer::fill_bytes(int value) {
  return bytes_ == 0 || (cuda_ok(cudaMemset(ptr_, value, bytes_), "cudaMemset") &&
                         cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after memset"));
}

DevicePlacement::DevicePlacement() {
  ok_ = cuda_ok(cudaGetDevice(&device_), "cudaGetDevice") &&
        cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

DevicePlacement::~DevicePlacement() {
  if (stream_) {
    cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    cuda_ok(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }
}

Tensor DevicePlacement::place(const HostTensor& t) {
  if (t.rank() == 0) return Tensor{};
  const void* key = t.storage().data();
  auto it = mirrors_.find(key);
  if (it == mirrors_.end()) it = mirrors_.emplace(key, DeviceBuffer(t.storage_bytes())).first;
  DeviceBuffer& buf = it->second;
  // The kernel may still be using the buffer on its stream.
  ok_ = ok_ && buf.ok() && cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize") &&
        buf.upload(t.storage().data(), t.storage_bytes());
  Tensor v = t.view();
  v.data = static_cast<std::byte*>(buf.get()) + HostTensor::kCanaryBytes;
  v.device = Device::kCUDA;
  v.device_index = device_;
  return v;
}

void* DevicePlacement::scratch(size_t bytes) {
  if (bytes == 0) return nullptr;
  scratch_.emplace_back(bytes);
  ok_ = ok_ && scratch_.back().ok() && scratch_.back().fill_bytes(0xff);
  return scratch_.back().get();
}

bool DevicePlacement::fetch(HostTensor& t) {
  auto it = mirrors_.find(t.storage().data());
  if (it == mirrors_.end()) {
    ADD_FAILURE() << "fetch of a tensor that was never placed";
    return ok_ = false;
  }
  // Launch errors first (the kernel's own checks should have caught them), then the
  // asynchronous ones the kernel could not see.
  ok_ = ok_ && cuda_ok(cudaGetLastError(), "a kernel launch (cudaGetLastError)") &&
        cuda_ok(cudaStreamSynchronize(stream_), "the kernel (cudaStreamSynchronize)") &&
        cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize") &&
        it->second.download(t.storage().data(), t.storage_bytes());
  return ok_;
}

std::unique_ptr<Placement> make_device_placement() { return std::make_unique<DevicePlacement>(); }

#endif  // FLASHLAB_WITH_CUDA

}  // namespace flashlab::test
