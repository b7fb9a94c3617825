// Exact-size tensor storage for the fuzzer.
//
// Every storage holds exactly the bytes its views can reach: on the host a new[] of that
// size (so AddressSanitizer flags a read one element past a view), and for CUDA runs a
// cudaMalloc of the same size with no caching allocator in between (so compute-sanitizer
// memcheck flags it on the device). Views take any strides — padded, permuted, zero (inputs
// only) — and several views may share one storage: an input read twice (k = v), or the
// overlaps the API must refuse (out inside q).
//
// Outputs are poisoned with 0xff bytes, a NaN in every float dtype that no arithmetic
// produces (a propagated NaN keeps its payload; a new one is 0x7fc00000 or 0xffc00000), so
// "this element is still poison" means "nothing wrote it", even where NaN is a valid result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flashlab/flashlab.h"
#include "test_util.h"

namespace flashlab::fuzz {

// Sizes and strides of one view, in elements; rank 0 is an absent tensor.
struct Layout {
  std::vector<int64_t> shape, stride;

  int rank() const { return int(shape.size()); }
  int64_t numel() const;
  int64_t span() const;                  // last reachable offset + 1; 0 when empty
  std::vector<int64_t> offsets() const;  // of each logical element, in row-major order
  bool contiguous() const;
  std::string describe() const;  // "[2,5,3,8]/[120,24,8,1]"
};

Layout contiguous(std::vector<int64_t> shape);

struct LayoutOptions {
  bool permute = false;  // the non-last dims in a random memory order
  bool pad = false;      // 0..3 unseen elements after each dim
  bool zero = false;     // some dims broadcast (stride 0): inputs only
  int64_t align = 1;     // strides that matter are multiples of this (CUDA: 16 bytes)
};
Layout random_layout(std::vector<int64_t> shape, const LayoutOptions& o, std::mt19937_64& rng);

// Bytes on the host and, for CUDA runs, their exact-size mirror on the device.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  size_t bytes() const { return bytes_; }
  std::byte* host() { return host_.get(); }
  const std::byte* host() const { return host_.get(); }
  void* where() const;  // what a view's data points into: the device copy for CUDA runs
  // Host to device and back; no-ops on the CPU. False (with error()) on a CUDA failure.
  bool upload();
  bool download();
  const std::string& error() const { return error_; }

 private:
  size_t bytes_;
  Device device_;
  std::unique_ptr<std::byte[]> host_;
  void* device_ptr_ = nullptr;
  std::string error_;
};

// One view (dtype, layout, byte offset) into a storage.
class Buf {
 public:
  Buf() = default;
  // Its own storage of exactly the view's span, plus `extra_bytes` (room for a view
  // placed inside it).
  Buf(DType dtype, Layout layout, Device device, size_t extra_bytes = 0);
  // A view inside another buffer's storage.
  Buf(DType dtype, Layout layout, const Buf& host, size_t byte_offset);

  bool present() const { return layout_.rank() > 0; }
  DType dtype() const { return dtype_; }
  const Layout& layout() const { return layout_; }
  Storage& storage() const { return *storage_; }
  bool shares_storage_with(const Buf& o) const { return storage_ == o.storage_; }
  size_t span_bytes() const;

  Tensor view(Device device, int device_index) const;
  double get(int64_t i) const;    // logical element i, from the host copy
  void set(int64_t i, double x);  // rounded to the dtype
  // Random nonzero values in every element of the span, unseen padding included.
  void fill_random(std::mt19937_64& rng);
  void set_unseen(double x);             // the span's elements that the view does not see
  void poison();                         // 0xff over the span
  bool is_poison(int64_t offset) const;  // element at this offset from the view's start
  int64_t offset(int64_t i) const { return offsets_[size_t(i)]; }  // of logical element i
  std::vector<bool> seen() const;                                  // per element of the span
  std::vector<std::byte> span_copy() const;

  std::vector<double> values() const;  // logical, row-major
  test::HostTensor logical() const;    // contiguous copy in the same dtype (oracle input)

 private:
  std::byte* base() const { return storage_->host() + offset_; }
  DType dtype_ = DType::kF32;
  Layout layout_;
  std::vector<int64_t> offsets_;  // of each logical element
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
};

}  // namespace flashlab::fuzz
