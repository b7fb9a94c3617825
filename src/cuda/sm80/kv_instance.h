// The boundary between the dispatch (dispatch.cu, no CuTe) and the KV-cache forward's kernel
// instantiations (instantiations/kv_hdim*_*.cu, one per dtype and head dim). Defined in
// kv_kernel.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

// The blocks of block_m packed query rows of one KV head: its group's query heads times
// seqlen_q rows (GQA packing, kv_kernel.cuh).
inline int64_t kv_row_blocks(const KvCacheParams& p, int block_m) {
  return (int64_t(p.seqlen_q) * p.group + block_m - 1) / block_m;
}

// The most splits of a sequence's keys: the combine keeps one weight per split in shared
// memory (kv_kernel.cuh).
constexpr int kMaxSplits = 128;

template <DType kDtype, int kHeadDim>
struct KvInstance {
  // Appends the new rows, runs the split-KV kernel and, with splits > 1, the combine; on
  // p.stream. splits: dispatch.cu's kv_splits(), the partials in p.workspace (workspace_kv).
  static Status run(const KvCacheParams& p, int splits);
  static const void* kernel(const KvCacheParams& p);  // p's split-KV __global__ function
  static int smem_bytes();      // its dynamic shared memory per CTA
  static int block_m();         // packed query rows per CTA
  static int block_n();         // keys per K/V tile
  static int bytes_in_flight(); // K and V bytes a CTA's ring has in flight (kStages − 1 tiles)
  static bool keys_per_warp(const KvCacheParams& p);  // p's kernel spreads keys over its warps
};

}  // namespace flashlab::sm80
