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


}  // namespace flashlab::sm90
