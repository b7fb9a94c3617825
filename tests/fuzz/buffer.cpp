#include "buffer.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/dtype.h"

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashlab::fuzz {

// ---- Layout -------------------------------------------------------------------------------

int64_t Layout::numel() const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t Layout::span() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < rank(); ++d) last += (shape[d] - 1) * stride[d];
  return last + 1;
}

std::vector<int64_t> Layout::offsets() const {
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  std::vector<int64_t> index(size_t(rank()), 0);
  int64_t off = 0;
  for (size_t n = 0; n < out.size(); ++n) {
    out[n] = off;
    // An odometer: step the last dim, carry into the ones before it.
    for (int d = rank() - 1; d >= 0; --d) {
      off += stride[d];
      if (++index[size_t(d)] < shape[d]) break;
      off -= stride[d] * shape[d];
      index[size_t(d)] = 0;
    }
  }
  return out;
}

bool Layout::contiguous() const { return stride == fuzz::contiguous(shape).stride; }

std::string Layout::describe() const {
  auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ",";
      s += std::to_string(v[i]);
    }
    return s + "]";
  };
  return list(shape) + "/" + list(stride);
}

Layout contiguous(std::vector<int64_t> shape) {
  Layout l;
  l.stride.assign(shape.size(), 1);
  int64_t st = 1;
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    l.stride[d] = st;
    st *= std::max<int64_t>(shape[d], 1);
  }
  l.shape = std::move(shape);
  return l;
}

Layout random_layout(std::vector<int64_t> shape, const LayoutOptions& o, std::mt19937_64& rng) {
  const int r = int(shape.size());
  Layout l = contiguous(shape);
  if (r == 0) return l;
  auto pad = [&] { return o.pad ? int64_t(rng() % 4) : 0; };
  auto round_up = [&](int64_t x) { return (x + o.align - 1) / o.align * o.align; };
  // Memory order of the non-last dims, outermost first; the last dim stays innermost.
  std::vector<int> order(r - 1);
  std::iota(order.begin(), order.end(), 0);
  if (o.permute) std::shuffle(order.begin(), order.end(), rng);
  // A size-1 last dim may have any stride (its stride is never used).
  l.stride[r - 1] = shape[r - 1] == 1 && o.pad ? 1 + int64_t(rng() % 5) : 1;
  int64_t extent = std::max<int64_t>(shape[r - 1], 1) + pad();
  for (int k = r - 2; k >= 0; --k) {
    const int d = order[k];
    l.stride[d] = round_up(extent);
    extent = l.stride[d] * (std::max<int64_t>(shape[d], 1) + pad());
  }
  if (o.zero)
    for (int d = 0; d + 1 < r; ++d)
      if (shape[d] > 1 && rng() % 3 == 0) l.stride[d] = 0;
  return l;
}

// ---- Storage ------------------------------------------------------------------------------

Storage::Storage(size_t bytes, Device device)
    : bytes_(bytes), device_(device), host_(new std::byte[bytes]) {
#if FLASHLAB_WITH_CUDA
  if (device_ == Device::kCUDA && bytes_ > 0) {
    const cudaError_t err = cudaMalloc(&device_ptr_, bytes_);
    if (err != cudaSuccess) {
      device_ptr_ = nullptr;
      error_ =
          std::string("cudaMalloc(") + std::to_string(bytes_) + "): " + cudaGetErrorString(err);
    }
  }
#endif
}

Storage::~Storage() {
#if FLASHLAB_WITH_CUDA
  if (device_ptr_) cudaFree(device_ptr_);
#endif
}

void* Storage::where() const {
  return device_ == Device::kCUDA ? device_ptr_ : static_cast<void*>(host_.get());
}

bool Storage::upload() {
#if FLASHLAB_WITH_CUDA
  if (device_ != Device::kCUDA || bytes_ == 0) return error_.empty();
  // A copy from pageable memory may return before the device has the data, and the kernels
  // run on a non-blocking stream that does not wait for the legacy one.
  cudaError_t err = cudaMemcpy(device_ptr_, host_.get(), bytes_, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) error_ = std::string("upload: ") + cudaGetErrorString(err);
#endif
  return error_.empty();
}

bool Storage::download() {
#if FLASHLAB_WITH_CUDA
  if (device_ != Device::kCUDA || bytes_ == 0) return error_.empty();
  const cudaError_t err = cudaMemcpy(host_.get(), device_ptr_, bytes_, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) error_ = std::string("download: ") + cudaGetErrorString(err);
#endif
  return error_.empty();
}

// ---- Buf ----------------------------------------------------------------------------------

Buf::Buf(DType dtype, Layout layout, Device device, size_t extra_bytes)
    : dtype_(dtype), layout_(std::move(layout)), offsets_(layout_.offsets()) {
  storage_ = std::make_shared<Storage>(span_bytes() + extra_bytes, device);
}

Buf::Buf(DType dtype, Layout layout, const Buf& host, size_t byte_offset)
    : dtype_(dtype),
      layout_(std::move(layout)),
      offsets_(layout_.offsets()),
      storage_(host.storage_),
      offset_(byte_offset) {}

size_t Buf::span_bytes() const { return size_t(layout_.span()) * dtype_size(dtype_); }

Tensor Buf::view(Device device, int device_index) const {
  Tensor t;
  if (!present()) return t;
  if (void* w = storage_->where()) t.data = static_cast<std::byte*>(w) + offset_;
  t.dtype = dtype_;
  t.device = device;
  t.device_index = device_index;
  t.rank = layout_.rank();
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = layout_.shape[d];
    t.stride[d] = layout_.stride[d];
  }
  return t;
}

double Buf::get(int64_t i) const { return load_as_double(base(), dtype_, offsets_[size_t(i)]); }

void Buf::set(int64_t i, double x) { store_from_double(base(), dtype_, offsets_[size_t(i)], x); }

void Buf::fill_random(std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t e = 0; e < layout_.span(); ++e) {
    double x;
    do {
      store_from_double(base(), dtype_, e, normal(rng));
      x = load_as_double(base(), dtype_, e);
    } while (x == 0.0);
  }
}

std::vector<bool> Buf::seen() const {
  std::vector<bool> s(size_t(layout_.span()), false);
  for (int64_t off : offsets_) s[size_t(off)] = true;
  return s;
}

void Buf::set_unseen(double x) {
  const std::vector<bool> s = seen();
  for (size_t e = 0; e < s.size(); ++e)
    if (!s[e]) store_from_double(base(), dtype_, int64_t(e), x);
}

void Buf::poison() { std::memset(base(), 0xff, span_bytes()); }

bool Buf::is_poison(int64_t offset) const {
  const size_t es = dtype_size(dtype_);
  const std::byte* p = base() + size_t(offset) * es;
  return std::all_of(p, p + es, [](std::byte b) { return b == std::byte{0xff}; });
}

std::vector<std::byte> Buf::span_copy() const { return {base(), base() + span_bytes()}; }

std::vector<double> Buf::values() const {
  std::vector<double> v(size_t(layout_.numel()));
  for (int64_t i = 0; i < layout_.numel(); ++i) v[size_t(i)] = get(i);
  return v;
}

test::HostTensor Buf::logical() const {
  if (!present()) return {};
  test::HostTensor t(dtype_, layout_.shape);
  for (int64_t i = 0; i < layout_.numel(); ++i) t.set(i, get(i));
  return t;
}

}  // namespace flashlab::fuzz
