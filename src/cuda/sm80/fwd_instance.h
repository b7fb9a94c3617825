// The boundary between the dispatch (dispatch.cu, no CuTe) and the forward's kernel
// instantiations (instantiations/fwd_hdim*_*.cu, one per dtype and head dim, so they compile
// in parallel and rebuild alone). Defined in fwd_kernel.cuh.
#pragma once

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

template <DType kDtype, int kHeadDim>
struct FwdInstance {
  static Status run(const FwdParams& p);  // launches on p.stream
  static const void* kernel();            // the __global__ function, for attribute queries
  static int smem_bytes();                // dynamic shared memory per CTA
};

}  // namespace flashlab::sm80
