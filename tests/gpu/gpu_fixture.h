// The GPU side of the tests: a fixture that skips, with the reason, when this process
// cannot reach a CUDA device (or the build has no CUDA at all), and in CUDA builds a
// device buffer and the device Placement that kernel_check.h runs GPU kernels through.
// Every CUDA return code is checked and reported as a test failure naming the call.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "kernel_check.h"

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlab::test {

// Why GPU tests cannot run in this process, or "" when they can.
const std::string& gpu_unavailable_reason();

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string& why = gpu_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

template <class Param>
class GpuParamTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (const std::string& why = gpu_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

#if FLASHLAB_WITH_CUDA

// Reports a failed CUDA call as a test failure; true when `err` is cudaSuccess.
bool cuda_ok(cudaError_t err, const char* what);

// One cudaMalloc'd allocation, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool ok() const { return ok_; }
  bool upload(const void* src, size_t bytes);
  bool download(void* dst, size_t bytes) const;
  bool fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool ok_ = true;
};

// Mirrors each placed HostTensor's whole storage (poison padding and canaries included)
// on the current device; kernels run on a stream of their own.
class DevicePlacement final : public Placement {
 public:
  DevicePlacement();
  ~DevicePlacement() override;
  Device device() const override { return Device::kCUDA; }
  void* stream() override { return stream_; }
  Tensor place(const HostTensor& t) override;
  void* scratch(size_t bytes) override;
  bool fetch(HostTensor& t) override;
  bool ok() const override { return ok_; }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::map<const void*, DeviceBuffer> mirrors_;  // by host storage address
  std::vector<DeviceBuffer> scratch_;
  bool ok_ = true;
};

std::unique_ptr<Placement> make_device_placement();

#endif  // FLASHLAB_WITH_CUDA

}  // namespace flashlab::test
