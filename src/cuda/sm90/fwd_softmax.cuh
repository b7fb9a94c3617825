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
using cuda::OnlineSoftmax;

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

// The Hopper forward's online softmax: cuda::OnlineSoftmax (exp2 units, lazy rescaling, the
// tree row max) with its steps reordered: the warp's vote before the row max's shuffles
// (update_voted), or the exponentials before the row max (update_exp_first). The traits'
// MaxOrder picks one per kernel.
template <int kRows>
struct Softmax : OnlineSoftmax<kRows> {
  using Base = OnlineSoftmax<kRows>;
  using Base::kLazyLog2;
  using Base::row_max;
  using Base::row_sum;

  // The max of this thread's own columns of row r, by a tree.
  template <class S>
  __device__ __forceinline__ static float cols_max(S const& s, int r) {
    constexpr int kCols = decltype(cute::size<1>(s))::value;
    float v[kCols];
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) v[c] = s(r, c);
    Base::template tree_max<kCols>(v);
    return v[0];
  }
  // Row r's reference max and this thread's own columns of it.
  template <class S>
  __device__ __forceinline__ float own_max(S const& s, int r) const {
    return fmaxf(row_max[r], cols_max(s, r));
  }

  // update() with the warp's vote first: each thread takes the tree max of its own columns
  // only, and the quad max (two shuffles a row) and the max's bookkeeping run only when some
  // lane's own max would move its row. The results are update()'s, bit for bit: a row's quad
  // max exceeds its reference by more than kLazyLog2 exactly when one of the quad's own maxima
  // does. On most tiles the exponentials then start right after the vote. Returns whether any
  // row of the warp moved (warp-uniform), for rescale_o below.
  template <class S>
  __device__ __forceinline__ bool update_voted(S& s, float scale_log2, float (&rescale)[kRows]) {
    constexpr int kCols = decltype(cute::size<1>(s))::value;
    float m[kRows];
    bool move = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      m[r] = own_max(s, r);
      move |= row_max[r] == -INFINITY || (m[r] - row_max[r]) * scale_log2 > kLazyLog2;
    }
    const bool moved = __any_sync(0xffffffffu, move);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) rescale[r] = 1.f;
    if (moved) {  // update()'s bookkeeping, on the quad max
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 1));
        m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 2));
        if (row_max[r] == -INFINITY || (m[r] - row_max[r]) * scale_log2 > kLazyLog2) {
          const float m_scaled = m[r] == -INFINITY ? 0.f : m[r] * scale_log2;
          rescale[r] = exp2_approx(row_max[r] * scale_log2 - m_scaled);
          row_max[r] = m[r];
          row_sum[r] *= rescale[r];
        }
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float m_scaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * scale_log2;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        s(r, c) = exp2_approx(s(r, c) * scale_log2 - m_scaled);
        row_sum[r] += s(r, c);
      }
    }
    return moved;
  }

  // update() with the exponentials first: each row's P is taken against its current
  // reference max while the tile's max is still being found. The exponent's argument
  // x = s·scale_log2 − m_ref·scale_log2 is written over the score (one FFMA in place), and
  // the tile's lead over the reference is the tree max of x, in log2 units; the MUFU.EX2
  // then take x in place too, so each score lives in one register from S to P and ptxas
  // interleaves the max's FMNMX with the exponentials. (Written the first way, the max over
  // the raw scores and the exponentials of s·scale_log2 − m_scaled, every exponential
  // needed a temporary; ptxas ran runs of them through one register, each FFMA waiting for
  // the previous MUFU.EX2 to read it, and that form measured 2–3.5% slower at head dim 128
  // on H100: docs/sm90/fwd.md, "The softmax".) Then one warp vote: where no row leads by
  // more than kLazyLog2 (most tiles), P is final; where one does, its P, ℓ and this tile's
  // sum are rescaled by the factor O gets, 2^(−lead), and its reference moves up by the
  // lead (P = 2^(s − m_new) up to one more rounding). Two cases take another path:
  // - a row of the warp that has seen no key yet (no reference): update() with the chain
  //   max, decided from the state alone, before any exponential. (With update_voted()'s tree
  //   there, ptxas computed the tree once above the branch, before the exponentials.)
  // - a tile that leads a row's reference by more than kExpFirstLog2: refill() writes the
  //   scores into s again (the caller recomputes S from K's stage, which it holds until
  //   then), then update_voted(). The bound keeps P_old and its sum far inside fp32's
  //   range; it is low (16 in log2 units, 11 in nats) so that the tests reach the refill
  //   with scores that a low-precision yardstick still computes well.
  // Returns whether rescale may hold a factor other than 1 (warp-uniform).
  static constexpr float kExpFirstLog2 = 16.f;
  template <class S, class Refill>
  __device__ __forceinline__ bool update_exp_first(S& s, float scale_log2, float (&rescale)[kRows],
                                                   Refill&& refill) {
    constexpr int kCols = decltype(cute::size<1>(s))::value;
    bool unstarted = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) unstarted |= row_max[r] == -INFINITY;
    if (__any_sync(0xffffffffu, unstarted)) {
      // The chain max here, not the tree: with the same tree on both sides of the branch
      // ptxas computed a row's tree once, above the branch, before any exponential.
      this->template update</*kTreeMax=*/false>(s, scale_log2, rescale);
      return true;
    }
    float m[kRows], tile_sum[kRows];
    bool move = false, far = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float m_scaled = row_max[r] * scale_log2;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) s(r, c) = s(r, c) * scale_log2 - m_scaled;
      m[r] = cols_max(s, r);  // this thread's lead over the reference, in log2 units
      tile_sum[r] = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        s(r, c) = exp2_approx(s(r, c));
        tile_sum[r] += s(r, c);
      }
      move |= m[r] > kLazyLog2;
      far |= m[r] > kExpFirstLog2;
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) rescale[r] = 1.f;
    const bool moved = __any_sync(0xffffffffu, move);
    if (moved) {
      if (__any_sync(0xffffffffu, far)) {
        refill();
        return update_voted(s, scale_log2, rescale);
      }
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 1));
        m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], 2));
        if (m[r] > kLazyLog2) {
          rescale[r] = exp2_approx(-m[r]);
          row_max[r] += m[r] / scale_log2;
          row_sum[r] *= rescale[r];
          tile_sum[r] *= rescale[r];
          CUTE_UNROLL
          for (int c = 0; c < kCols; ++c) s(r, c) *= rescale[r];
        }
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_sum[r] += tile_sum[r];
    return moved;
  }

  // OnlineSoftmax::rescale_o with the answer of update_voted() or update_exp_first() in
  // place of its own vote.
  template <class O>
  __device__ __forceinline__ static void rescale_o(O& o, const float (&rescale)[kRows], bool moved) {
    if (moved) Base::scale_rows(o, rescale);
  }
};

}  // namespace flashlab::sm90
