// The Hopper backward's per-row work around the main kernel, and the workspace it lives in:
//   preprocess   D = rowsum(dO ∘ O) and LSE·log2 e per query row, the dQ accumulator cleared
// (the postprocess, dQ = softmax_scale · the accumulator rounded to the input type, reads
// the accumulator in the main kernel's fragment order: bwd_kernel.cuh). The preprocess is a
// SIMT kernel, one warp per row: it reads O and dO once, a few percent of the main kernel's
// bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/constants.h"
#include "common/params.h"
#include "cuda/common.cuh"

namespace flashlab::sm90 {

// Row i of (batch b, head h) is row (b·heads_q + h)·rows + i of each array, rows = seqlen_q
// rounded up to whole query blocks, so that the main kernel's last block needs no guard.
//   dq_accum [batch, heads_q, rows, D] fp32   dQ before the scale, summed over key blocks;
//                                             each block of kBlockM rows in the order of
//                                             BwdTraits::dq_slot
//   dsum     [batch, heads_q, rows]   fp32    D_i = rowsum(dO ∘ O); 0 past the sequence
//   lse_log2 [batch, heads_q, rows]   fp32    LSE·log2 e; +inf past the sequence and for a row
//                                             that saw no key, so that its P is 0
//   dq_turn  [batch, heads_q, rows / block_m] int  deterministic mode only: how many key blocks
//                                             have added into the query block
struct BwdRows {
  float* dq_accum;
  float* dsum;
  float* lse_log2;
  int* dq_turn;  // deterministic: [batch, heads_q, rows / block_m] key blocks added, else null
  int rows, block_m;

  __host__ __device__ int64_t row(const BwdParams& p, int b, int h) const {
    return (int64_t(b) * p.heads_q + h) * rows;
  }
  // The turn counter of query block m of (b, h).
  __host__ __device__ int* turn(const BwdParams& p, int b, int h, int m) const {
    return dq_turn + row(p, b, h) / block_m + m;
  }
};

// Byte offsets in the caller's workspace, each array on its own 256 bytes.
struct BwdRowsLayout {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, dq_turn = 0, total = 0;
};

inline BwdRowsLayout bwd_rows_layout(const BwdParams& p, int block_m) {
  constexpr size_t kAlign = 256;
  auto aligned = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  const size_t rows = (size_t(p.seqlen_q) + block_m - 1) / block_m * block_m;
  const size_t all_rows = size_t(p.batch) * size_t(p.heads_q) * rows;
  BwdRowsLayout l;
  l.dsum = aligned(all_rows * size_t(p.head_dim) * sizeof(float));
  l.lse_log2 = l.dsum + aligned(all_rows * sizeof(float));
  l.dq_turn = l.lse_log2 + aligned(all_rows * sizeof(float));
  l.total = l.dq_turn + (p.deterministic ? aligned(all_rows / block_m * sizeof(int)) : 0);
  return l;
}

inline BwdRows bwd_rows(const BwdParams& p, int block_m) {
  const BwdRowsLayout l = bwd_rows_layout(p, block_m);
  char* base = static_cast<char*>(p.workspace);
  auto at = [&](size_t offset) { return reinterpret_cast<float*>(base + offset); };
  return {at(l.dq_accum), at(l.dsum), at(l.lse_log2),
          p.deterministic ? reinterpret_cast<int*>(base + l.dq_turn) : nullptr,
          int((int64_t(p.seqlen_q) + block_m - 1) / block_m * block_m), block_m};
}

// grid (ceil(rows / 8), heads_q, batch), 256 threads: warp w takes row 8·blockIdx.x + w.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const __grid_constant__ BwdParams p,
                                                             BwdRows ws) {
  const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x % 32;
  const int i = blockIdx.x * 8 + threadIdx.x / 32;
  if (i >= ws.rows) return;
  const int64_t r = ws.row(p, b, h) + i;
  float* dq = ws.dq_accum + r * kHeadDim;
  for (int d = lane; d < kHeadDim; d += 32) dq[d] = 0.f;
  if (ws.dq_turn != nullptr && lane == 0 && i % ws.block_m == 0) *ws.turn(p, b, h, i / ws.block_m) = 0;
  float dsum = 0.f;
  const cuda::SeqInfo seq = cuda::seq_info(p, b);  // varlen: rows past this sequence are padding
  const int64_t row = seq.start_q + i;
  if (i < seq.len_q) {
    const Element* o = static_cast<const Element*>(p.out) + b * p.o_batch_stride + row * p.o_row_stride +
                       h * p.o_head_stride;
    const Element* dout = static_cast<const Element*>(p.dout) + b * p.do_batch_stride +
                          row * p.do_row_stride + h * p.do_head_stride;
    for (int d = lane; d < kHeadDim; d += 32) dsum += float(o[d]) * float(dout[d]);
  }
  for (int s = 16; s > 0; s /= 2) dsum += __shfl_xor_sync(0xffffffffu, dsum, s);
  if (lane == 0) {
    ws.dsum[r] = dsum;
    const float lse =
        i < seq.len_q ? p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + row] : -INFINITY;
    ws.lse_log2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

}  // namespace flashlab::sm90
