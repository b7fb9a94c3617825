// The memory rules of a call's views: every view's extent fits 64-bit offsets, and every
// output owns its bytes.
//
// A view covers the bytes [data, data + extent) with extent = (1 + Σ (shape_i − 1)·stride_i)
// · element size. Two views may share a byte only if these ranges meet. Ranges that meet
// can still be disjoint when the views interleave, as q, k, v of a packed qkv [B, S, 3, H, D]
// do (or dq, dk, dv of FlashAttention's packed dqkv): with a period P that every outer byte
// stride is a multiple of, each view's addresses modulo P stay in one window of P (its
// inner dimensions' footprint), and windows that do not meet prove the views apart. Views
// that neither test separates are refused: the test is exact for the layouts FlashAttention
// callers build and errs on the side of refusing for anything more exotic.
#include "api/validate.h"

namespace flashlab::api {

Status check_extent(const Tensor& t, const char* name) {
  if (t.numel() == 0) return {};
  int64_t elements = 1, bytes = 0;
  bool fits = true;
  for (int i = 0; i < t.rank && fits; ++i) {
    int64_t step = 0;
    fits = checked_mul(t.shape[i] - 1, t.stride[i], &step) && checked_add(elements, step, &elements);
  }
  fits = fits && checked_mul(elements, int64_t(dtype_size(t.dtype)), &bytes);
  uintptr_t last = 0;
  fits = fits && !__builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), uintptr_t(bytes - 1), &last);
  if (!fits)
    return invalid(std::string(name) + " spans more than 2^63 - 1 bytes or runs past the end of the "
                   "address space (shape " + dims_str(t.shape, t.rank) + ", strides " +
                   dims_str(t.stride, t.rank) + ")");
  return {};
}

namespace {

uintptr_t address(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); }
int64_t elem_bytes(const Tensor& t) { return int64_t(dtype_size(t.dtype)); }

// Bytes from the first element to one past the last (check_extent has bounded it).
int64_t extent_bytes(const Tensor& t) {
  int64_t elements = 1;
  for (int i = 0; i < t.rank; ++i) elements += (t.shape[i] - 1) * t.stride[i];
  return elements * elem_bytes(t);
}

// Two elements of `t` share memory: with the dimensions of size > 1 in increasing stride,
// some stride is smaller than the span of the dimensions inside it (a zero stride is the
// plainest case). Layouts that pass this test never repeat an element.
bool overlaps_itself(const Tensor& t) {
  std::array<int, kMaxRank> dims{};
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;
    int j = n++;  // insertion by stride: at most kMaxRank entries
    for (; j > 0 && t.stride[dims[j - 1]] > t.stride[i]; --j) dims[j] = dims[j - 1];
    dims[j] = i;
  }
  int64_t span = 1;
  for (int j = 0; j < n; ++j) {
    const int i = dims[j];
    if (t.stride[i] < span) return true;
    span += (t.shape[i] - 1) * t.stride[i];
  }
  return false;
}

// The bytes one period P of `t` touches, from its first element's address modulo P: every
// byte stride >= P must be a multiple of P, and the smaller ones must fit in P together.
// False when `t` is not periodic in P.
bool window_in_period(const Tensor& t, int64_t period, int64_t* width) {
  int64_t w = elem_bytes(t);
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;
    const int64_t s = t.stride[i] * elem_bytes(t);
    if (s >= period) {
      if (s % period != 0) return false;
    } else {
      w += (t.shape[i] - 1) * s;
    }
  }
  *width = w;
  return w <= period;
}

// `a` and `b` are periodic in P and their windows modulo P do not meet.
bool apart_in_period(const Tensor& a, const Tensor& b, int64_t period) {
  int64_t wa = 0, wb = 0;
  if (!window_in_period(a, period, &wa) || !window_in_period(b, period, &wb)) return false;
  const int64_t p = period;
  const int64_t from_a = (int64_t(address(b) % uint64_t(p)) - int64_t(address(a) % uint64_t(p)) + p) % p;
  return from_a >= wa && from_a + wb <= p;
}

bool share_bytes(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const uintptr_t a_last = address(a) + uintptr_t(extent_bytes(a) - 1);
  const uintptr_t b_last = address(b) + uintptr_t(extent_bytes(b) - 1);
  if (a_last < address(b) || b_last < address(a)) return false;
  for (const Tensor* t : {&a, &b})
    for (int i = 0; i < t->rank; ++i)
      if (t->shape[i] > 1 && t->stride[i] > 0 && apart_in_period(a, b, t->stride[i] * elem_bytes(*t)))
        return false;
  return true;
}

Status overlap(const char* output, const char* other) {
  return invalid(std::string(output) + " overlaps " + other +
                 " in memory: an output must not share memory with an input or another output");
}

}  // namespace

Status check_outputs_disjoint(std::span<const NamedView> outputs, std::span<const NamedView> inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = *outputs[i].t;
    if (o.numel() == 0) continue;
    if (overlaps_itself(o))
      return invalid(std::string(outputs[i].name) + " overlaps itself (shape " + dims_str(o.shape, o.rank) +
                     ", strides " + dims_str(o.stride, o.rank) +
                     "): an output's elements must not share memory (no zero stride on a dimension "
                     "of size > 1, and each stride at least the span of the dimensions inside it)");
    for (const NamedView& in : inputs)
      if (share_bytes(o, *in.t)) return overlap(outputs[i].name, in.name);
    for (size_t j = 0; j < i; ++j)
      if (share_bytes(o, *outputs[j].t)) return overlap(outputs[i].name, outputs[j].name);
  }
  return {};
}

}  // namespace flashlab::api
