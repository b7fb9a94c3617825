// The Hopper backward's per-row work around the main kernel, and the workspace it lives in:
//   preprocess   D = rowsum(dO ∘ O) and LSE·log2 e per query row, the dQ accumulator cleared
// (the postprocess, dQ = softmax_scale · the accumulator rounded to the input type, reads
// the accumulator in the main kernel's fragment order: bwd_kernel.cuh). The preprocess is a
// SIMT kernel of 16-byte loads and stores: it reads O and dO once and clears the accumulator,
// memory-bound work of a few percent of the main kernel's time.
#pragma once

#include <cuda_runtime.h>

#include <cute/config.hpp>  // CUTE_UNROLL

#include <cstddef>
#include <cstdint>

#include "common/constants.h"
#include "common/params.h"
#include "cuda/common.cuh"

namespace flashlab::sm90 {

// Rows are packed per head like the sequences: row i of (batch b, head h) is row
// h·rows + start(b) + i of each array, where start(b) is the sequence's first packed row
// (cu_seqlens_q[b], or b·seqlen_q) plus b·block_m, rounded down to a whole query block, so
// that every sequence's blocks (its last one whole) are disjoint and 16-byte aligned, and
// rows = total_q + batch·block_m rounded up to a block. A varlen batch needs no more than its
// tokens and a block per sequence.
//   dq_accum [heads_q, rows, D] fp32   dQ before the scale, summed over key blocks; each
//                                      block of block_m rows in the order of BwdTraits::dq_slot
//   dsum     [heads_q, rows]   fp32    D_i = rowsum(dO ∘ O); 0 past the sequence
//   lse_log2 [heads_q, rows]   fp32    LSE·log2 e; +inf past the sequence and for a row that
//                                      saw no key, so that its P is 0
//   dq_turn  [heads_q, rows / block_m] int  deterministic mode only: how many key blocks have
//                                      added into the query block
struct BwdRows {
  float* dq_accum;
  float* dsum;
  float* lse_log2;
  int* dq_turn;  // deterministic: [heads_q, rows / block_m] key blocks added, else null
  int64_t rows;
  int block_m;

  // The first row of (b, h); `seq` is cuda::seq_info(p, b).
  __device__ int64_t row(const BwdParams& p, const cuda::SeqInfo& seq, int b, int h) const {
    const int64_t start = p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q;
    return h * rows + (start + int64_t(b) * block_m) / block_m * block_m;
  }
  // The turn counter of query block m of (b, h).
  __device__ int* turn(const BwdParams& p, const cuda::SeqInfo& seq, int b, int h, int m) const {
    return dq_turn + row(p, seq, b, h) / block_m + m;
  }
};

inline int64_t bwd_packed_rows(const BwdParams& p, int block_m) {
  const int64_t total = p.varlen ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  return (total + int64_t(p.batch) * block_m + block_m - 1) / block_m * block_m;
}

// Byte offsets in the caller's workspace, each array on its own 256 bytes.
struct BwdRowsLayout {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, dq_turn = 0, total = 0;
};

inline BwdRowsLayout bwd_rows_layout(const BwdParams& p, int block_m) {
  constexpr size_t kAlign = 256;
  auto aligned = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  const size_t all_rows = size_t(p.heads_q) * size_t(bwd_packed_rows(p, block_m));
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
          bwd_packed_rows(p, block_m), block_m};
}

// The three kernels are chained by programmatic dependent launch (cuda::launch_after,
// cuda/common.cuh): the preprocess lets the main kernel start once all its CTAs are running,
// the main kernel lets the postprocess start once its own are, and each waits
// (cuda::wait_for_prior_grid) only before it reads what the kernel before it wrote. A wait
// covers the kernel just before: the postprocess, which reads the preprocess's zeros where no
// key block added, relies on every main-kernel CTA with a key block waiting, so that the
// main kernel cannot end before the preprocess. The compact varlen grid's CTAs past the real
// count of key blocks exit without waiting, so after it the postprocess runs in stream order.

// The preprocess's shape: kThreadsPerRow threads share a row, each with 16 bytes of O and dO
// (kHeadDim / 8 of them carry data, a power of two for the shuffle reduction), and a CTA of
// 256 threads walks kRowsPerCta rows, kIters rows per thread group, loads unrolled.
template <int kHeadDim>
struct BwdPreprocessShape {
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kThreadsPerRow = kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kGroups = 256 / kThreadsPerRow;
  static constexpr int kRowsPerCta = 64;
  static constexpr int kIters = kRowsPerCta / kGroups;
  static_assert(kHeadDim % 8 == 0 && kChunks <= 32 && kRowsPerCta % kGroups == 0);
};

// grid (ceil(rows / kRowsPerCta), heads_q, batch), 256 threads, over the sequence's whole
// query blocks (rows past the sequence are the last block's padding).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const __grid_constant__ BwdParams p,
                                                             BwdRows ws) {
  using Pre = BwdPreprocessShape<kHeadDim>;
  cuda::allow_dependents();
  const int b = blockIdx.z, h = blockIdx.y;
  const int sub = threadIdx.x % Pre::kThreadsPerRow, group = threadIdx.x / Pre::kThreadsPerRow;
  const cuda::SeqInfo seq = cuda::seq_info(p, b);
  const int padded = (seq.len_q + ws.block_m - 1) / ws.block_m * ws.block_m;
  const int64_t first = ws.row(p, seq, b, h);
  const Element* o = static_cast<const Element*>(p.out) + b * p.o_batch_stride + seq.start_q * p.o_row_stride +
                     h * p.o_head_stride;
  const Element* dout = static_cast<const Element*>(p.dout) + b * p.do_batch_stride +
                        seq.start_q * p.do_row_stride + h * p.do_head_stride;
  float dsum[Pre::kIters];
  CUTE_UNROLL
  for (int it = 0; it < Pre::kIters; ++it) {
    const int i = blockIdx.x * Pre::kRowsPerCta + it * Pre::kGroups + group;
    dsum[it] = 0.f;
    if (i < seq.len_q && sub < Pre::kChunks) {  // 16-byte loads: the API checks the alignment
      alignas(16) Element ov[8], dv[8];
      *reinterpret_cast<uint4*>(ov) = *reinterpret_cast<const uint4*>(o + int64_t(i) * p.o_row_stride + sub * 8);
      *reinterpret_cast<uint4*>(dv) = *reinterpret_cast<const uint4*>(dout + int64_t(i) * p.do_row_stride + sub * 8);
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) dsum[it] += float(ov[j]) * float(dv[j]);
    }
    if (i < padded) {
      float4* dq = reinterpret_cast<float4*>(ws.dq_accum + (first + i) * kHeadDim);
      for (int f = sub; f < kHeadDim / 4; f += Pre::kThreadsPerRow) dq[f] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  CUTE_UNROLL
  for (int it = 0; it < Pre::kIters; ++it) {
    CUTE_UNROLL
    for (int s = Pre::kThreadsPerRow / 2; s > 0; s /= 2) dsum[it] += __shfl_xor_sync(0xffffffffu, dsum[it], s);
    const int i = blockIdx.x * Pre::kRowsPerCta + it * Pre::kGroups + group;
    if (sub != 0 || i >= padded) continue;
    const int64_t r = first + i;
    ws.dsum[r] = dsum[it];
    const float lse =
        i < seq.len_q ? p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + seq.start_q + i] : -INFINITY;
    ws.lse_log2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    if (ws.dq_turn != nullptr && i % ws.block_m == 0) *ws.turn(p, seq, b, h, i / ws.block_m) = 0;
  }
}

}  // namespace flashlab::sm90
