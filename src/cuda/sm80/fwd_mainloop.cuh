// The forward's collective mainloop (sm80 path): loads and MMAs. Q once, then one K and one V
// tile per step, each a cp.async copy global → shared (copy_rows, collective_common.cuh),
// read into registers with ldmatrix and multiplied on mma.sync: S = Q Kᵀ with both operands
// in shared memory (gemm_ss_lines, or gemm_ss where rows are 32-element lines), then
// O += P V with P straight from S's accumulator registers (below). fwd_kernel.cuh orders the
// loads against the math: V(n) lands during S = Q K(n)ᵀ, K(n − 1) during the softmax and P V.
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.h"
#include "cuda/nonfinite.cuh"
#include "cuda/sm80/collective_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

// The accumulator of S = Q Kᵀ over keys (N) as the A operand of O = P V over keys (K): two
// adjacent 8-key n-tiles are one 16-key k-step, element for element.
// ((2, 2), MMA_M, MMA_N) → ((2, 2, 2), MMA_M, MMA_N / 2)
template <class Layout>
__device__ __forceinline__ auto acc_as_a_operand(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3, "(MMA, MMA_M, MMA_N)");
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// O += P V: P is S's accumulator (MMA, MMA_M, MMA_N) rounded to Element in registers and
// read as the A operand; Vᵀ comes from shared memory (sVt, its ldmatrix partition), the
// ldmatrix of k-step k + 1 issued before the MMAs of k-step k.
//   acc_o (MMA, MMA_M, MMA_D), rVt (MMA, MMA_D, MMA_N): Vᵀ's register fragments
template <class Element, class TiledMma, class AccO, class AccS, class RB, class SB, class CopyB>
__device__ __forceinline__ void gemm_pv(TiledMma const& mma, AccO& acc_o, AccS const& acc_s,
                                        RB& rVt, SB const& sVt, CopyB const& copy_v) {
  Tensor rP = round_to<Element>(acc_s);                                // (MMA, MMA_M, MMA_N)
  Tensor rA = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_K)
  Tensor rB_view = make_tensor(rVt.data(), copy_v.retile(rVt.layout()));  // (CPY, CPY_D, CPY_K)
  copy(copy_v, sVt(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) copy(copy_v, sVt(_, _, k + 1), rB_view(_, _, k + 1));
    gemm(mma, rA(_, _, k), rVt(_, _, k), acc_o);
  }
}

// ---- non-finite V on a cut tile (cuda/nonfinite.cuh) ---------------------------------------
// The vote's input: does a chunk this thread copied into V's tile (tVsV, its cp.async
// partition (CPY, CPY_N, CPY_D), one 16-byte chunk per (n, d)) hold an Inf or NaN?
template <class Element, class TV>
__device__ __forceinline__ bool own_chunks_nonfinite(TV const& tVsV) {
  static_assert(decltype(size<0>(tVsV))::value * sizeof(Element) == 16, "16-byte chunks");
  constexpr int kRows = decltype(size<1>(tVsV))::value;
  constexpr int kOwn = kRows * decltype(size<2>(tVsV))::value;
  auto own = [&](int i) {
    return reinterpret_cast<const uint4*>(&tVsV(0, i % kRows, i / kRows));
  };
  return cuda::own_chunks_nonfinite<std::is_same_v<Element, bfloat16_t>, kOwn>(own);
}

// The slow path, when the vote found one (every thread of the CTA calls it): the values
// are zeroed in V's tile sV (BLK_N, D) and the O rows (o: acc_o as (rows, cols), rows as in
// coords, S's (row, key) identity partition) that see one of those keys become NaN.
template <class Element, int kBlockN, int kHeadDim, class SV, class TV, class C, class O>
__device__ __forceinline__ void drop_nonfinite_v(SV const& sV, TV& tVsV, C const& coords, O& o,
                                                 const MaskPolicy& mask, int i0, int j0,
                                                 int len_q, int len_k) {
  constexpr int kElemsPerChunk = 16 / int(sizeof(Element));
  constexpr int kRows = decltype(size<1>(tVsV))::value;
  constexpr int kOwn = kRows * decltype(size<2>(tVsV))::value;
  auto row_chunk = [&](int j, int c) {
    return reinterpret_cast<const uint4*>(&sV(j, c * kElemsPerChunk));
  };
  auto own = [&](int i) { return reinterpret_cast<uint4*>(&tVsV(0, i % kRows, i / kRows)); };
  uint32_t keys[kBlockN / 32];
  cuda::drop_nonfinite_values<std::is_same_v<Element, bfloat16_t>, kBlockN,
                              kHeadDim / kElemsPerChunk, kOwn>(row_chunk, own,
                                                               int(threadIdx.x % 32), keys);
  CUTE_UNROLL
  for (int r = 0; r < size<0>(o); ++r) {
    const int i = i0 + get<0>(coords(r, 0));
    if (cuda::any_key_in(keys, mask.key_begin(i, len_q, len_k) - j0,
                         mask.key_end(i, len_q, len_k) - j0)) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) = NAN;
    }
  }
}

}  // namespace flashlab::sm80
