// The boundary between the dispatch (dispatch.cu, no CuTe) and the KV-cache forward's kernel
// instantiations (instantiations/kv_hdim*_*.cu, one per dtype and head dim). Defined in
// kv_kernel.cuh.
#pragma once

#include <cstddef>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

template <DType kDtype, int kHeadDim>
struct KvInstance {
  // Appends the new rows, runs the split-KV kernel and, with splits > 1, the combine; on
  // p.stream. splits: kv_splits()'s choice, its partials in p.workspace (kv_workspace_bytes).
  static Status run(const KvCacheParams& p, int splits);
  static const void* kernel(const KvCacheParams& p);  // p's split-KV __global__ function
  static int smem_bytes();      // its dynamic shared memory per CTA
  static int block_m();         // packed query rows per CTA
  static int block_n();         // keys per K/V tile
};

}  // namespace flashlab::sm80
