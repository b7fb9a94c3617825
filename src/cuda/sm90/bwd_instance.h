// The boundary between the dispatch (bwd_dispatch.cu, no CuTe) and the Hopper backward's
// instantiations (instantiations/bwd_hdim*_*.cu). Defined in bwd_kernel.cuh.
#pragma once

#include <cstddef>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm90 {

template <DType kDtype, int kHeadDim>
struct BwdInstance {
  static Status run(const BwdParams& p);              // pre, main, post on p.stream
  static const void* kernel();                        // the main __global__ function
  static int smem_bytes();                            // its dynamic shared memory per CTA
  static size_t workspace_bytes(const BwdParams& p);  // dQ accumulator, D, LSE·log2 e
};

// cute_fa3's backward pass for the registry (bwd_dispatch.cu).
std::string supports_bwd(const BwdParams& p);
size_t workspace_bwd(const BwdParams& p);
Status run_bwd(const BwdParams& p);

}  // namespace flashlab::sm90
