// The forward's collective mainloop (sm80 path): loads and MMAs. Q once, then one K and one V
// tile per step, each a cp.async copy global → shared (copy_rows, collective_common.cuh),
// read into registers with ldmatrix and multiplied on mma.sync: S = Q Kᵀ with both operands
// in shared memory (gemm_ss_lines, or gemm_ss where rows are 32-element lines), then
// O += P V with P straight from S's accumulator registers (below). fwd_kernel.cuh orders the
// loads against the math: V(n) lands during S = Q K(n)ᵀ, K(n − 1) during the softmax and P V.
#pragma once

#include <cute/tensor.hpp>

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

}  // namespace flashlab::sm80
