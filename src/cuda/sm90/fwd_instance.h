// The boundary between the dispatch (fwd_dispatch.cu and ablations.cu, no CuTe) and the kernel instantiations
// (instantiations/fwd_hdim*_*.cu, one per dtype and head dim, so they compile in parallel
// and rebuild alone). Defined in fwd_kernel.cuh.
#pragma once

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm90 {

// The schedule. kFull is cute_fa3; the others are its ablations (ablations.cu), built for
// bf16 head dim 128 only, to measure what a technique adds: three turn off the consumers'
// pingpong, their intra-warpgroup overlap, or both; kPersistent turns on the persistent tile
// scheduler, which measured slower than one CTA per tile (fwd_traits.h's FwdConfig).
enum class Schedule { kFull, kNoPingpong, kNoOverlap, kSerial, kPersistent };

template <DType kDtype, int kHeadDim, Schedule kSchedule = Schedule::kFull>
struct FwdInstance {
  static Status run(const FwdParams& p);  // builds the tensor maps, launches on p.stream
  static const void* kernel();            // the __global__ function, for attribute queries
  static int smem_bytes();                // dynamic shared memory per CTA
};

}  // namespace flashlab::sm90
