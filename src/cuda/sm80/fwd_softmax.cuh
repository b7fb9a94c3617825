// The forward's softmax (sm80 path): what happens to a tile of scores between S = Q Kᵀ and
// O += P V, in the registers of S's accumulator. Softcap's tanh, the mask (only on the tiles
// it cuts), the online softmax in exp2 units with lazy rescaling (cuda::OnlineSoftmax, shared
// with the Hopper forward; it also normalizes O in the epilogue), and dropout's zeros.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>

#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/cute_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

using cuda::apply_mask;  // cuda/cute_common.cuh
using cuda::OnlineSoftmax;

// Softcap's logit = cap·tanh(s·scale / cap), up to the factor cap that the softmax's scale
// carries: s ← tanh(s · pre), pre = scale / cap. s is any view of S's accumulator.
template <class S>
__device__ __forceinline__ void softcap_scores(S& s, float pre) {
  CUTE_UNROLL
  for (int e = 0; e < size(s); ++e) s(e) = tanhf(s(e) * pre);
}

// Zeroes the probabilities dropout drops (common/dropout.h); ℓ has already summed them, so
// O = (P ∘ M) V / ℓ and the epilogue's 1/(1 − p) complete the definition. acc (MMA, MMA_M,
// MMA_N) holds P; coords(0, m, n) is the (row, key) of value 0 of this thread's m16n8
// fragment (m, n). Its four values are rows {i, i + 8} × keys {j, j + 1} in the order
// (i, j), (i, j + 1), (i + 8, j), (i + 8, j + 1): the word order of one Philox call, so each
// fragment costs one call and no word is drawn twice.
template <class Acc, class C>
__device__ __forceinline__ void apply_dropout(Acc& acc, C const& coords, const DropoutPolicy& d,
                                              uint32_t bh, int i0, int j0) {
  static_assert(decltype(size<0>(acc))::value == 4, "an m16n8 C fragment holds 4 values");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(acc); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(acc); ++n) {
      const Philox4 bits =
          d.block_bits(bh, i0 + get<0>(coords(0, m, n)), j0 + get<1>(coords(0, m, n)));
      CUTE_UNROLL
      for (int v = 0; v < 4; ++v)
        if (bits.w[v] < d.threshold) acc(v, m, n) = 0.f;
    }
  }
}

}  // namespace flashlab::sm80
