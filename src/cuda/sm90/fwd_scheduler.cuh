// Tile scheduler of the Hopper forward: one CTA per (batch, head, 128-row query block), the
// longest first, and the key tiles its rows can see (cuda::schedule_fwd in
// cuda/cute_common.cuh, shared with the sm80 forward). The producer and both consumer
// warpgroups compute the same answer, so they agree on the number of K/V tiles that pass
// through the pipelines.
#pragma once

#include "common/params.h"
#include "cuda/cute_common.cuh"

namespace flashlab::sm90 {

using cuda::FwdBlock;

template <class Tr>
__device__ __forceinline__ FwdBlock schedule(const FwdParams& p) {
  return cuda::schedule_fwd<Tr::kBlockM, Tr::kBlockN>(p);
}

}  // namespace flashlab::sm90
