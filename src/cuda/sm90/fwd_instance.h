// The boundary between the dispatch (fwd_dispatch.cu, no CuTe) and the kernel instantiations
// (instantiations/fwd_hdim*_*.cu, one per dtype and head dim, so they compile in parallel
// and rebuild alone). Defined in fwd_kernel.cuh.
#pragma once

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm90 {

// The schedule. kFull is cute_fa3; the others turn one technique (or two) off, built for
// bf16 head dim 128 only, to measure what each adds (docs/sm90/fwd.md): the consumers'
// pingpong, their intra-warpgroup overlap, both, or the persistent tile scheduler.
enum class Schedule { kFull, kNoPingpong, kNoOverlap, kSerial, kNoPersistent };

template <DType kDtype, int kHeadDim, Schedule kSchedule = Schedule::kFull>
struct FwdInstance {
  static Status run(const FwdParams& p);  // builds the tensor maps, launches on p.stream
  static const void* kernel();            // the __global__ function, for attribute queries
  static int smem_bytes();                // dynamic shared memory per CTA
};

}  // namespace flashlab::sm90
