// The collective pieces that the forward and the backward both build on: views of an m16n8
// accumulator fragment, tiles copied global → shared with cp.async (ragged tiles
// zero-filled) and staged tiles stored shared → global, and the MMA loops over k-steps with
// their ldmatrix loads from shared memory. The products differ between the passes
// (fwd_mainloop.cuh, bwd_mainloop.cuh); how a tile moves and how a k-step is loaded and
// issued do not.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

#include "cuda/cute_common.cuh"
#include "cuda/sm80/traits_common.h"

namespace flashlab::sm80 {

using namespace cute;

using cuda::exp2_approx;  // cuda/cute_common.cuh
using cuda::round_to;

// ---- fragment views ------------------------------------------------------------------------
// An m16n8 accumulator fragment ((2 cols, 2 rows), MMA_M, MMA_N) seen as a matrix
// ((2 rows, MMA_M), (2 cols, MMA_N)): mode 0 walks this thread's rows, mode 1 its columns.
template <class Layout>
__device__ __forceinline__ auto acc_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3, "(MMA, MMA_M, MMA_N)");
  auto l = logical_divide(acc, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// ---- copies ------------------------------------------------------------------------------
// A tile's rows global → shared through `tiled_copy` (partitions (CPY, CPY_ROWS, CPY_COLS)).
// With kGuard, rows at or past rows_valid are zero-filled in smem and read nothing:
// zeros, not garbage, so that P·V never meets 0·NaN. `coord` is the partitioned identity
// tensor of the tile, giving each chunk's row.
template <bool kGuard, class TiledCopy, class Src, class Dst, class Coord>
__device__ __forceinline__ void copy_rows(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                          Coord const& coord, int rows_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (!kGuard || get<0>(coord(0, m, 0)) < rows_valid)
      copy(tiled_copy, src(_, m, _), dst(_, m, _));
    else
      clear(dst(_, m, _));
  }
}

// A tile staged in shared memory → global through `tiled_copy` (16-byte row stores), rows at
// or past rows_valid left unwritten. s_tile, g_tile: (rows, cols), g_tile's shape static.
template <class TiledCopy, class STile, class GTile>
__device__ __forceinline__ void store_rows(TiledCopy const& tiled_copy, int tid,
                                           STile const& s_tile, GTile&& g_tile, int rows_valid) {
  using Element = typename std::remove_reference_t<GTile>::value_type;
  auto thr = tiled_copy.get_thread_slice(tid);
  Tensor src = thr.partition_S(s_tile);                                 // (CPY, CPY_ROWS, CPY_COLS)
  Tensor dst = thr.partition_D(g_tile);                                 // (CPY, CPY_ROWS, CPY_COLS)
  Tensor coord = thr.partition_D(make_identity_tensor(shape(g_tile)));  // (CPY, CPY_ROWS, CPY_COLS)
  Tensor staged = make_tensor<Element>(shape(dst));                     // (CPY, CPY_ROWS, CPY_COLS)
  copy(tiled_copy, src, staged);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m)
    if (get<0>(coord(0, m, 0)) < rows_valid) copy(tiled_copy, staged(_, m, _), dst(_, m, _));
}

// ---- MMA loops ---------------------------------------------------------------------------
// One k-step of acc += A·B on register fragments, m-tile by m-tile: A(m) is dead after its
// row of n-tiles and B(n) is reused by every m-tile, so the next k-step's ldmatrix of each
// fragment can be issued about half a k-step (8 MMAs at 32 × 64) before it is needed.
// CuTe's gemm walks n-tiles in the outer loop, which keeps both A fragments live to the end
// of the k-step and leaves the next A load right before its first MMA. Measured alone on the
// H100 (docs/sm80/fwd.md, bwd.md): forward +3-8% at head dim 128, +1-3% at 64, -3 to +1%
// at 256; backward -0.8 to +1.7%.
//   rA (MMA, MMA_M), rB (MMA, MMA_N), acc (MMA, MMA_M, MMA_N)
template <class TiledMma, class Acc, class RA, class RB>
__device__ __forceinline__ void mma_k_step(TiledMma const& mma, Acc& acc, RA const& rA,
                                           RB const& rB) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(acc); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(acc); ++n) gemm(mma, rA(_, m), rB(_, n), acc(_, m, n));
  }
}

// acc += A·B with both operands in shared memory: the ldmatrix of k-step k + 1 is issued
// before the MMAs of k-step k, so the loads hide behind the tensor cores.
//   rA (MMA, MMA_M, MMA_K), rB (MMA, MMA_N, MMA_K): register fragments
//   sA, sB: the ldmatrix partitions of the smem tiles; acc (MMA, MMA_M, MMA_N)
// on_step(k), when given, runs after the MMAs of k-step k: work to interleave with them.
struct NoStep {
  __device__ __forceinline__ void operator()(int) const {}
};
template <class TiledMma, class Acc, class RA, class RB, class SA, class SB, class CopyA,
          class CopyB, class OnStep = NoStep>
__device__ __forceinline__ void gemm_ss(TiledMma const& mma, Acc& acc, RA& rA, RB& rB,
                                        SA const& sA, SB const& sB, CopyA const& copy_a,
                                        CopyB const& copy_b, OnStep const& on_step = {}) {
  Tensor rA_view = make_tensor(rA.data(), copy_a.retile(rA.layout()));  // (CPY, CPY_M, CPY_K)
  Tensor rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));  // (CPY, CPY_N, CPY_K)
  copy(copy_a, sA(_, _, _0{}), rA_view(_, _, _0{}));
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    mma_k_step(mma, acc, rA(_, _, k), rB(_, _, k));
    on_step(k);
  }
}

// ldmatrix .x4 (four 8 × 8 b16 matrices) from an explicit shared-memory address into the
// four 32-bit registers of `dst`.
template <class Frag>
__device__ __forceinline__ void ldsm_x4(uint32_t addr, Frag&& dst) {
  Tensor d = recast<uint32_t>(dst);
  static_assert(decltype(size(d))::value == 4, "one x4 ldmatrix fills four registers");
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d(0)), "=r"(d(1)), "=r"(d(2)), "=r"(d(3))
               : "r"(addr));
}

// gemm_ss for A·Bᵀ products whose operands are both stored (rows, k) in 64-element swizzle
// lines (S = Q Kᵀ in the forward; S = Q Kᵀ and dP = dO Vᵀ in the backward): each k-step's
// ldmatrix addresses come from one base address per operand (line_address, traits_common.h)
// instead of CuTe's per-(tile, k-step) addresses. The compiler hoists those out of the key
// loop, 16 registers at head dim 128 that the fragments then lack; here the bases are
// laundered (an empty asm the compiler must assume changes them) before every k-step, so
// each address is one XOR computed next to its load. Measured on the H100, with mma_k_step
// against neither: forward +5-11% at head dim 128, 0-3% at 64, -1 to +3% at 256; on top of
// mma_k_step in the backward (S and dP) -0.3 to +2.6%, and the spills at head dim 256 are
// gone. tests/gpu/sm80_line_address_test.cu checks the arithmetic against CuTe's partitions.
//   a0, b0: this thread's shared-memory address of A(m = 0, k = 0) and B(n = 0, k = 0)
//   kTileBytesA/B: bytes between a thread's m-tiles / n-pairs (16·warps along M / N lines)
//   kBlockBytesA/B: bytes between 64-column blocks (the tile's rows × 128)
template <int kTileBytesA, int kBlockBytesA, int kTileBytesB, int kBlockBytesB, class TiledMma,
          class Acc, class RA, class RB, class CopyA, class CopyB>
__device__ __forceinline__ void gemm_ss_lines(TiledMma const& mma, Acc& acc, RA& rA, RB& rB,
                                              uint32_t a0, uint32_t b0, CopyA const& copy_a,
                                              CopyB const& copy_b) {
  Tensor rA_view = make_tensor(rA.data(), copy_a.retile(rA.layout()));  // (CPY, CPY_M, CPY_K)
  Tensor rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));  // (CPY, CPY_N, CPY_K)
  auto load = [&](int k) {
    asm volatile("" : "+r"(a0), "+r"(b0));
    const uint32_t a = line_address(a0, k, kBlockBytesA);
    const uint32_t b = line_address(b0, k, kBlockBytesB);
    CUTE_UNROLL
    for (int m = 0; m < size<1>(rA_view); ++m) ldsm_x4(a + m * kTileBytesA, rA_view(_, m, k));
    CUTE_UNROLL
    for (int n = 0; n < size<1>(rB_view); ++n) ldsm_x4(b + n * kTileBytesB, rB_view(_, n, k));
  };
  load(0);
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) load(k + 1);
    mma_k_step(mma, acc, rA(_, _, k), rB(_, _, k));
  }
}

}  // namespace flashlab::sm80
