// The boundary between the dispatch (dispatch.cu, no CuTe) and the backward's kernel
// instantiations (instantiations/bwd_hdim*_*.cu, one per dtype and head dim, so that they
// compile in parallel and rebuild alone). Defined in bwd_kernel.cuh.
#pragma once

#include <cstddef>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

template <DType kDtype, int kHeadDim>
struct BwdInstance {
  static Status run(const BwdParams& p);          // launches on p.stream; p.workspace sized below
  static size_t workspace_bytes(const BwdParams& p);
  static const void* kernel();                    // the main __global__, for attribute queries
  static int smem_bytes();                        // its dynamic shared memory per CTA
};

}  // namespace flashlab::sm80
