// Registry entries of the CUDA backend: the ladder in order, then the production kernels.
#pragma once

#include "common/registry.h"

namespace flashlab {

KernelEntry naive_entry();         // src/cuda/ladder/01_naive.cu
KernelEntry fa1_entry();           // src/cuda/ladder/02_fa1.cu
KernelEntry fa2_simt_entry();      // src/cuda/ladder/03_fa2_simt.cu
KernelEntry fa2_mma_entry();       // src/cuda/ladder/04_fa2_mma.cu
KernelEntry fa2_simt_bwd_entry();  // src/cuda/ladder/05_fa2_simt_bwd.cu
KernelEntry cute_fa2_fwd_entry();  // src/cuda/sm80/fwd_dispatch.cu
KernelEntry cute_fa3_fwd_entry();  // src/cuda/sm90/fwd_dispatch.cu (builds with 90a only)
// cute_fa3 with pingpong (0), the intra-warpgroup overlap (1) or both (2) turned off.
KernelEntry cute_fa3_ablation_entry(int which);  // src/cuda/sm90/fwd_dispatch.cu
// Fills in cute_fa2's backward (supports, workspace, run, dropout flag).
void cute_fa2_add_backward(KernelEntry& e);  // src/cuda/sm80/bwd_dispatch.cu

}  // namespace flashlab
