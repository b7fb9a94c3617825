// Split-KV's partial results and their merge (the combine kernel, the last of a KV-cache
// call's kernels, kv_kernel.cuh): where each CTA of the split-KV kernel writes its rows'
// normalized O and LSE (KvOut), and the kernel that merges a row's splits into out.
#pragma once

#include <cute/config.hpp>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm80/kv_instance.h"

namespace flashlab::sm80 {

// The partials of split-KV (workspace): O [splits, rows_all, head_dim_v] and LSE
// [splits, rows_all], rows_all = batch·heads_q·seqlen_q, row (b, h, i) at (b·heads_q + h)·seqlen_q + i.
__host__ __device__ __forceinline__ int64_t kv_rows_all(const KvCacheParams& p) {
  return int64_t(p.batch) * p.heads_q * p.seqlen_q;
}
__host__ __device__ __forceinline__ float* kv_lse_partial(const KvCacheParams& p, int splits) {
  return static_cast<float*>(p.workspace) + splits * kv_rows_all(p) * p.head_dim_v;
}

// The merge of partial softmaxes of one row (split-KV's splits, or one CTA's warps), each a
// normalized O_s with its LSE_s: LSE = log Σ_s e^LSE_s, O = Σ_s e^(LSE_s − LSE) O_s, taken
// about the parts' max m. A part that saw no key has LSE_s = −inf: it weighs 0 and its O is
// not read; if no part saw a key, LSE = −inf and O = 0.
__device__ __forceinline__ float part_exp(float lse_s, float m) {  // e^(LSE_s − m)
  return m == -INFINITY ? 0.f : __expf(lse_s - m);
}
__device__ __forceinline__ float merged_lse(float m, float sum) {  // m + log Σ_s e^(LSE_s − m)
  return sum > 0.f ? m + __logf(sum) : -INFINITY;
}

// Where a CTA's results go: packed row pr of (sequence b, KV head hk) is query pr / g of
// head hk·g + pr % g; with one split its normalized O goes to out and its LSE to lse, else
// both to this split's partials.
template <class Element>
struct KvOut {
  const KvCacheParams& p;
  int b, hk, split, splits;

  // Packed row pr's query i and query head h.
  __device__ __forceinline__ int2 coords(int pr) const {
    return make_int2(pr / p.group, hk * p.group + pr % p.group);
  }
  __device__ __forceinline__ int64_t partial_row(int pr) const {
    const int2 ih = coords(pr);
    return split * kv_rows_all(p) + (int64_t(b) * p.heads_q + ih.y) * p.seqlen_q + ih.x;
  }
  // Columns col and col + 1 of packed row pr.
  __device__ __forceinline__ void o2(int pr, int col, float v0, float v1) const {
    if (splits > 1) {
      float* o = static_cast<float*>(p.workspace) + partial_row(pr) * p.head_dim_v + col;
      *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
      return;
    }
    const int2 ih = coords(pr);
    Element* o = static_cast<Element*>(p.out) + b * p.o_batch_stride + ih.x * p.o_row_stride +
                 ih.y * p.o_head_stride + col;
    o[0] = Element(v0), o[1] = Element(v1);
  }
  __device__ __forceinline__ void lse(int pr, float v) const {
    if (splits > 1) {
      kv_lse_partial(p, splits)[partial_row(pr)] = v;
    } else if (p.lse != nullptr) {
      const int2 ih = coords(pr);
      p.lse[b * p.lse_batch_stride + ih.y * p.lse_head_stride + ih.x] = v;
    }
  }
};

// ---- combine -----------------------------------------------------------------------------
// One CTA per row (b, h, i) of out and one thread per column: warp w sums columns
// [32w, 32w + 32) of every split's O_s, each load of a warp 128 contiguous bytes. Every warp
// merges the splits' LSEs itself (lane l holds splits l, l + 32, ...), so no warp waits on
// another and nothing goes through shared memory. The loads of the first 32 splits' O_s are
// issued beside the LSEs' loads, before any weight is known: a call of up to 32 splits waits
// on memory once, where a weight-first order waits twice (the LSEs, then the O_s they weigh).
// A split's weight e^(LSE_s − LSE) then multiplies its O_s. A split that saw no key has
// LSE_s = −inf and weight 0: its O_s is read and not added. A split that met a NaN has
// LSE_s = NaN (the split-KV kernel's epilogue), and the row is NaN. grid rows_all, kHeadDim
// threads.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) kv_combine_kernel(const __grid_constant__ KvCacheParams p,
                                                              int splits) {
  constexpr int kLsePerLane = kMaxSplits / 32;
  static_assert(kHeadDim % 32 == 0 && kMaxSplits % 32 == 0);
  const int64_t rows_all = kv_rows_all(p), row = blockIdx.x;
  const int lane = threadIdx.x % 32, col = threadIdx.x;
  cuda::wait_for_prior_grid();  // the split-KV kernel's partials (launched early)
  cuda::allow_dependents();
  const float* lse_s = kv_lse_partial(p, splits) + row;
  const float* o_s = static_cast<const float*>(p.workspace) + row * kHeadDim + col;
  const int64_t o_stride = rows_all * kHeadDim;  // from split s to split s + 1
  float l[kLsePerLane], o[32];
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) {
    const int s = j * 32 + lane;
    l[j] = s < splits ? lse_s[s * rows_all] : -INFINITY;
  }
  CUTE_UNROLL
  for (int s = 0; s < 32; ++s) o[s] = s < splits ? o_s[s * o_stride] : 0.f;

  float m = -INFINITY, sum = 0.f;
  bool nan = false;  // a split's part saw a NaN (its LSE is NaN): so does the row
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) m = fmaxf(m, l[j]), nan |= l[j] != l[j];
  for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) sum += part_exp(l[j], m);
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  nan = __any_sync(0xffffffffu, nan);
  const float lse = nan ? NAN : merged_lse(m, sum);

  // Split s's weight is lane s % 32's w[s / 32]; the splits go 32 at a time, the first 32
  // splits' O_s already loaded.
  float acc = 0.f;
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) {
    if (j * 32 >= splits) break;
    if (j > 0) {
      CUTE_UNROLL
      for (int i = 0; i < 32; ++i) o[i] = j * 32 + i < splits ? o_s[(j * 32 + i) * o_stride] : 0.f;
    }
    const float w = l[j] == -INFINITY ? 0.f : part_exp(l[j], lse);
    CUTE_UNROLL
    for (int i = 0; i < 32; ++i) {
      const float w_s = __shfl_sync(0xffffffffu, w, i);
      if (w_s != 0.f) acc += w_s * o[i];
    }
  }

  const int i = int(row % p.seqlen_q), h = int(row / p.seqlen_q % p.heads_q),
            b = int(row / p.seqlen_q / p.heads_q);
  Element* out = static_cast<Element*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride +
                 h * p.o_head_stride;
  out[col] = Element(nan ? NAN : acc);
  if (col == 0 && p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = lse;
}

}  // namespace flashlab::sm80
