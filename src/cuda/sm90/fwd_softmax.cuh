// Softmax of the Hopper forward: the online softmax in exp2 units over the wgmma
// accumulator, and the mask (MaskPolicy, the same struct the CPU reference uses).
//
// A wgmma m64nN accumulator gives each thread of the warpgroup two rows (lane / 4 and
// lane / 4 + 8 of its warp's 16) and, per 8-column block, two adjacent columns; the 4 lanes
// of a quad hold the same rows, so a row's max and sum are two shuffles away.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

#include "common/mask.h"
#include "cuda/cute_common.cuh"

namespace flashlab::sm90 {

using namespace cute;

using cuda::apply_mask;  // cuda/cute_common.cuh
using cuda::exp2_approx;
using cuda::kLn2;
using cuda::kLog2e;

// A wgmma accumulator ((2 cols, 2 rows, N/8 col blocks), MMA_M, MMA_N) seen as a matrix
// ((2 rows, MMA_M), (2 cols, N/8, MMA_N)): mode 0 walks this thread's rows, mode 1 its
// columns.
template <class Layout>
CUTE_HOST_DEVICE auto acc_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3, "(MMA, MMA_M, MMA_N)");
  static_assert(decltype(rank(get<0>(acc)))::value == 3, "a wgmma accumulator: (2, 2, N/8)");
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The running max m (in raw-score units) and this thread's part of ℓ, for the kRows rows
// whose accumulators this thread holds.
template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];

  __device__ __forceinline__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s (rows, cols): this tile's scores, replaced by P = 2^(s·scale_log2 - m·scale_log2);
  // rescale[r]: the factor by which row r's O accumulator must be multiplied (the max moved),
  // applied by rescale_o, which the intra-warpgroup overlap defers until the previous tile's
  // P V has completed.
  // Lazy rescaling: the max a row's P is taken against moves only when the tile's max
  // exceeds it by more than 2^kLazyLog2 (FlashAttention-4's trick). Below that P stays under
  // 2^kLazyLog2 = 256, harmless for bf16/fp16 P and for ℓ and O in fp32, and the O rescale,
  // one FMUL per accumulator, is skipped (rescale = 1) on most tiles.
  static constexpr float kLazyLog2 = 8.f;
  template <class S>
  __device__ __forceinline__ void update(S& s, float scale_log2, float (&rescale)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      float m = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      // The quad agrees on m, so on this branch. A row that has seen no key yet keeps
      // P = 0 and O = 0 (not 2^(-inf + inf)).
      rescale[r] = 1.f;
      if (row_max[r] == -INFINITY || (m - row_max[r]) * scale_log2 > kLazyLog2) {
        const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
        rescale[r] = exp2_approx(row_max[r] * scale_log2 - m_scaled);  // 0 at first
        row_max[r] = m;
        row_sum[r] *= rescale[r];
      }
      const float m_scaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2_approx(s(r, c) * scale_log2 - m_scaled);
        row_sum[r] += s(r, c);
      }
    }
  }

  // o (rows, cols): the O accumulator, row r multiplied by rescale[r]; skipped when no row of
  // the warp moved its max (the common case under lazy rescaling).
  template <class O>
  __device__ __forceinline__ static void rescale_o(O& o, const float (&rescale)[kRows]) {
    bool moved = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) moved |= rescale[r] != 1.f;
    if (!__any_sync(0xffffffffu, moved)) return;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(o); ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= rescale[r];
    }
  }

  // Sums ℓ over the quad, divides O by it and returns each row's LSE (natural log); a row
  // that saw no key gets O = 0 and LSE = -inf.
  template <class O>
  __device__ __forceinline__ void finish(O& o, float scale_log2, float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      lse[r] = l > 0.f ? (row_max[r] * scale_log2 + log2f(l)) * kLn2 : -INFINITY;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= inv_l;
    }
  }
};

}  // namespace flashlab::sm90
