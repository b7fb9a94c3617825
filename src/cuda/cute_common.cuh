// What the CuTe kernels of both paths share (sm80: cute_fa2, sm90: cute_fa3): the CUTLASS
// element type of a dtype, exp2 on the special-function unit, fp32 fragments rounded to the
// input type, the mask applied to a tile of scores, the online softmax (with lazy
// rescaling), the forward's one-tile-per-CTA schedule and the rows summed again when a
// masked key's NaN or Inf reached them. Each path pulls these into its namespace with
// using-declarations.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include <cmath>
#include <utility>

#include "common/constants.h"
#include "common/mask.h"
#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/nonfinite.cuh"
#include "flashlab/flashlab.h"

namespace flashlab::cuda {

// The CUTLASS element type of a FlashLab dtype.
template <DType kDtype>
struct ElementFor;
template <>
struct ElementFor<DType::kF16> {
  using type = cutlass::half_t;
};
template <>
struct ElementFor<DType::kBF16> {
  using type = cutlass::bfloat16_t;
};

using ::flashlab::kLn2;    // common/constants.h: log2 units → nats (the LSE)
using ::flashlab::kLog2e;  // nats → log2 units

// 2^x on the special-function unit; 2^-inf = +0, which is what a masked logit needs.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A register fragment of fp32 rounded to Element (pairs become one cvt.rn.*x2), as an
// owning fragment of the same shape.
template <class Element, class Tensor_>
__device__ __forceinline__ auto round_to(Tensor_ const& acc) {
  using From = typename Tensor_::value_type;
  constexpr int kN = decltype(cute::size(acc))::value;
  cutlass::NumericArrayConverter<Element, From, kN> convert;
  cute::Tensor out = cute::make_tensor_like<Element>(acc);
  *reinterpret_cast<cutlass::Array<Element, kN>*>(out.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kN> const*>(acc.data()));
  return out;
}

// The same rounding into an existing fragment (a P reused across key tiles).
template <class Src, class Dst>
__device__ __forceinline__ void round_into(Src const& acc, Dst& out) {
  using From = typename Src::value_type;
  using To = typename Dst::value_type;
  constexpr int kN = decltype(cute::size(acc))::value;
  static_assert(kN == decltype(cute::size(out))::value, "same number of values");
  cutlass::NumericArrayConverter<To, From, kN> convert;
  *reinterpret_cast<cutlass::Array<To, kN>*>(out.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kN> const*>(acc.data()));
}

// Sets the scores of (row, key) pairs the mask hides to -inf. s and coords are (rows, cols)
// views of the S accumulator and of the tile's identity tensor; the tile starts at query
// row i0 and key j0 of the sequence. Keys at or past len_k are hidden too (key_end clamps).
template <class S, class C>
__device__ __forceinline__ void apply_mask(S& s, C const& coords, const MaskPolicy& mask, int i0,
                                           int j0, int len_q, int len_k) {
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(s); ++r) {
    const int i = i0 + cute::get<0>(coords(r, 0));
    const int lo = mask.key_begin(i, len_q, len_k) - j0;
    const int hi = mask.key_end(i, len_q, len_k) - j0;
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(s); ++c) {
      const int j = cute::get<1>(coords(r, c));
      if (j < lo || j >= hi) s(r, c) = -INFINITY;
    }
  }
}

// ---- the online softmax ---------------------------------------------------------------------
// The running max m (in raw-score units) and this thread's part of ℓ, for the kRows rows
// whose accumulators this thread holds. The 4 lanes of a quad hold the same rows (both the
// m16n8 fragments of sm80 and the wgmma accumulators of sm90), so a row's max and sum are
// two shuffles away.
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
  // Lazy rescaling (FlashAttention-4's trick): the max a row's P is taken against moves
  // only when the tile's max exceeds it by more than kLazyLog2 in log2 units. Until then P
  // stays below 2^kLazyLog2 = 256, harmless for a bf16/fp16 P and for ℓ and O in fp32, and
  // the O rescale, one FMUL per accumulator, is skipped (rescale = 1) on most tiles.
  static constexpr float kLazyLog2 = 8.f;

  // v[0] = max of v[0, kN), kN a power of two, by halving (a template, so that every index
  // is a constant and v stays in registers; a loop over the halving width put it in local
  // memory).
  template <int kN>
  __device__ __forceinline__ static void tree_max(float* v) {
    static_assert(kN >= 1 && (kN & (kN - 1)) == 0, "a power of two");
    if constexpr (kN > 1) {
      CUTE_UNROLL
      for (int c = 0; c < kN / 2; ++c) v[c] = fmaxf(v[c], v[c + kN / 2]);
      tree_max<kN / 2>(v);
    }
  }
  // kTreeMax: the row max as a tree of pairwise maxima (depth log2 cols) instead of one
  // chain of cols dependent FMNMX; the Hopper forward takes it (docs/sm90/fwd.md).
  template <bool kTreeMax = false, class S>
  __device__ __forceinline__ void update(S& s, float scale_log2, float (&rescale)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(s); ++r) {
      float m = row_max[r];
      if constexpr (kTreeMax) {
        constexpr int kCols = decltype(cute::size<1>(s))::value;
        float v[kCols];
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) v[c] = s(r, c);
        tree_max<kCols>(v);
        m = fmaxf(m, v[0]);
      } else {
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(s); ++c) m = fmaxf(m, s(r, c));
      }
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
      for (int c = 0; c < cute::size<1>(s); ++c) {
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
    if (__any_sync(0xffffffffu, moved)) scale_rows(o, rescale);
  }
  // Row r of o times rescale[r], unconditionally.
  template <class O>
  __device__ __forceinline__ static void scale_rows(O& o, const float (&rescale)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(o); ++r) {
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= rescale[r];
    }
  }

  // Sums ℓ over the quad, divides O by it (times out_scale: dropout's 1/(1 − p)) and
  // returns each row's LSE (natural log); a row that saw no key gets O = 0 and LSE = -inf.
  template <class O>
  __device__ __forceinline__ void finish(O& o, float scale_log2, float out_scale,
                                         float (&lse)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float l = row_sum[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv_l = l > 0.f ? out_scale / l : 0.f;
      lse[r] = l > 0.f ? (row_max[r] * scale_log2 + log2f(l)) * kLn2 : -INFINITY;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= inv_l;
    }
  }
};

// ---- the forward's tile scheduler ------------------------------------------------------------
// Which rows a CTA owns: batch entry b, query head h (KV head hk), rows [i0, i0 + rows) of
// its sequence; and the key tiles [n_begin, n_end) that hold keys some of those rows see
// (empty: no key, O = 0).
struct FwdBlock {
  int b, h, hk, m_block, i0, rows;
  int n_begin, n_end;
  SeqInfo seq;
};

// The tile of (batch entry b, query head h, query block m_block).
template <int kBlockM, int kBlockN>
__device__ __forceinline__ FwdBlock fwd_block(const FwdParams& p, int b, int h, int m_block) {
  FwdBlock blk;
  blk.b = b;
  blk.h = h;
  blk.hk = blk.h / p.group;
  blk.m_block = m_block;
  blk.i0 = blk.m_block * kBlockM;
  blk.seq = seq_info(p, blk.b);
  blk.rows = min(kBlockM, blk.seq.len_q - blk.i0);  // <= 0: varlen, a shorter sequence
  blk.n_begin = blk.n_end = 0;
  if (blk.rows > 0) {
    const int len_q = blk.seq.len_q, len_k = blk.seq.len_k;
    const int key_lo = p.mask.block_key_begin(blk.i0, blk.i0 + blk.rows, len_q, len_k);
    const int key_hi = p.mask.block_key_end(blk.i0, blk.i0 + blk.rows, len_q, len_k);
    if (key_hi > key_lo) {
      blk.n_begin = key_lo / kBlockN;
      blk.n_end = (key_hi + kBlockN - 1) / kBlockN;
    }
  }
  return blk;
}

// One CTA per tile. Query blocks run in reverse: under a causal mask the last ones see the
// most keys, and starting the longest first shortens the tail of the grid.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ FwdBlock schedule_fwd(const FwdParams& p) {
  return fwd_block<kBlockM, kBlockN>(p, int(blockIdx.z), int(blockIdx.y),
                                     int(gridDim.x) - 1 - int(blockIdx.x));
}

// ---- the rows a masked key's NaN or Inf V reached (cuda/nonfinite.cuh) ---------------------
// After a CuTe forward's mainloop (cute_fa2, cute_fa3), before its epilogue: each row of
// this thread whose O values are not all finite is summed again from global memory.
//
// The kernel itself holds only the test of O's values and, on the branch where one is not
// finite, the call to redo_rows with O, the row maxima and the tile's (b, h, m_block).
// Everything else is recomputed inside that out-of-line call: the block (fwd_block), the
// rows and columns of this thread's values (coords_of), the tensors' addresses. Built in the
// kernel from its own copies (the block's lengths and starts, O's identity tensor), those
// values changed how the compiler laid out the key loop even though they are used only
// after it: the mask's 64-bit per-row key bounds were recomputed in every key tile instead
// of once before the loop. SASS instructions of the key loop (nvcc 13 -O3, sm_90a cubin,
// bf16, plain kernel), with the test and call built in the kernel / as here / with no redo
// at all: cute_fa3 d64 805 / 736 / 715, d128 2487 (8 bytes spilled) / 2326 / 2323;
// cute_fa2 d64 1049 / 937 / 937 (the same instructions); cute_fa2 d128 1376 / 1239 / 1518
// (all three spill at its register limit). What is left at cute_fa3 d64 is ptxas keeping
// fewer of Q's wgmma descriptors in registers across key tiles.

// Rows r with bit r of `bad` set, summed again (sum_rows_again). v: each row's final max in
// the softmax's units (kRows values, scaled here into log2 units), then O's values row by
// row (kRows · kCols); coords_of(): each value's (row, column) in the query block as a
// (rows, cols) tensor. Returns O's values, those of the rows summed again replaced.
template <class Tr, int kRows, int kCols, class CoordsOf, class... V>
__device__ __noinline__ RowsAgain<kRows, kCols> redo_rows(const FwdParams& p, int b, int h,
                                                         int m_block, CoordsOf coords_of,
                                                         unsigned bad, V... v) {
  static_assert(sizeof...(V) == kRows + kRows * kCols);
  using Element = typename Tr::Element;
  const float in[] = {v...};
  RowsAgain<kRows, kCols> a;
  a.bad = bad;
  const FwdBlock blk = fwd_block<Tr::kBlockM, Tr::kBlockN>(p, b, h, m_block);
  const auto coords = coords_of();
  const float scale_log2 = score_scale_log2(p);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    a.m_log2[r] = in[r] * scale_log2;
    a.row[r] = blk.i0 + cute::get<0>(coords(r, 0));
    if (a.row[r] >= blk.seq.len_q) a.bad &= ~(1u << r);  // past the sequence: not stored
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) a.o[r][c] = in[kRows + r * kCols + c];
  }
  if (a.bad == 0) return a;
  CUTE_UNROLL
  for (int c = 0; c < kCols; ++c) a.col[c] = cute::get<1>(coords(0, c));
  // Row 0 of this sequence and head of a [batch, seq, heads, dim] (or packed) tensor.
  auto row0 = [&](const void* t, int64_t b_stride, int64_t r_stride, int64_t h_stride,
                  int64_t start, int head) {
    return static_cast<const Element*>(t) + blk.b * b_stride + start * r_stride +
           head * h_stride;
  };
  return sum_rows_again<Element, Tr::kHeadDim>(
      p, row0(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, blk.seq.start_q, blk.h),
      row0(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, blk.seq.start_k, blk.hk),
      row0(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, blk.seq.start_k, blk.hk),
      blk.seq.len_q, blk.seq.len_k, uint32_t(blk.b * p.heads_q + blk.h), a);
}

// o: the O accumulator as (rows, cols), each row relative to the softmax's final max (what
// the epilogue divides by the row's sum); coords_of: a callable that builds each value's
// (row, column) in the query block, run only inside redo_rows. The values go to redo_rows
// one by one: a struct passed by value is copied through a stack slot whose address the
// kernel would then hold in two registers through the mainloop.
template <class Tr, class O, class CoordsOf, class S>
__device__ __forceinline__ void redo_nonfinite_rows(const FwdParams& p, const FwdBlock& blk,
                                                    O& o, CoordsOf coords_of,
                                                    S const& softmax) {
  constexpr int kRows = decltype(cute::size<0>(o))::value;
  constexpr int kCols = decltype(cute::size<1>(o))::value;
  unsigned bad = 0;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    bool finite = true;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) finite &= isfinite(o(r, c));
    if (!finite) bad |= 1u << r;
  }
  if (bad == 0) return;
  // Value i of redo_rows' list: row i's max, then O's values row by row.
  auto value = [&](int i) -> float {
    return i < kRows ? softmax.row_max[i] : o((i - kRows) / kCols, (i - kRows) % kCols);
  };
  const auto a = [&]<int... I>(std::integer_sequence<int, I...>) {
    return redo_rows<Tr, kRows, kCols>(p, blk.b, blk.h, blk.m_block, coords_of, bad,
                                       value(I)...);
  }(std::make_integer_sequence<int, kRows + kRows * kCols>{});
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r)
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) o(r, c) = a.o[r][c];
}

}  // namespace flashlab::cuda
