// The plain-data half of the public API: names of codes and types, element sizes, and the
// Tensor view's constructors. Nothing here validates; src/api/validate.cpp does.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "flashlab/flashlab.h"

namespace flashlab {

const char* to_string(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kWorkspaceTooSmall: return "workspace too small";
    case StatusCode::kCudaError: return "CUDA error";
  }
  return "unknown";
}

namespace {

// Every DType's name and element size, in one switch (the compiler flags a DType left out).
struct DTypeFacts {
  const char* name;
  size_t size;
};
DTypeFacts facts(DType dtype) {
  switch (dtype) {
    case DType::kF32: return {"fp32", 4};
    case DType::kF16: return {"fp16", 2};
    case DType::kBF16: return {"bf16", 2};
    case DType::kF64: return {"fp64", 8};
    case DType::kI32: return {"int32", 4};
  }
  return {"?", 0};
}

}  // namespace

const char* to_string(DType dtype) noexcept { return facts(dtype).name; }

const char* to_string(Device device) noexcept {
  return device == Device::kCPU ? "cpu" : "cuda";
}

size_t dtype_size(DType dtype) noexcept { return facts(dtype).size; }

namespace {

// a·b, or INT64_MAX where the product of two sizes >= 0 does not fit.
int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

}  // namespace

int64_t Tensor::numel() const noexcept {
  if (rank == 0) return 0;
  for (int i = 0; i < rank; ++i)
    if (shape[i] == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n = saturating_mul(n, shape[i]);
  return n;
}

Tensor Tensor::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                          Device device, int device_index) noexcept {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.rank = int(std::min<size_t>(shape.size(), kMaxRank));
  int i = 0;
  for (int64_t s : shape) {
    if (i == kMaxRank) break;
    t.shape[i++] = s;
  }
  int64_t st = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = st;
    st = saturating_mul(st, std::max<int64_t>(t.shape[d], 1));
  }
  return t;
}

Tensor Tensor::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> stride, Device device,
                       int device_index) noexcept {
  Tensor t = contiguous(data, dtype, shape, device, device_index);
  int i = 0;
  for (int64_t s : stride) {
    if (i == t.rank) break;
    t.stride[i++] = s;
  }
  return t;
}

}  // namespace flashlab
