// The backward's workspace (sm80 path): the fp32 dQ accumulator that the key blocks add into,
// D = rowsum(dO ∘ O) and LSE·log2 e per query row, and in deterministic mode a turn counter
// per (batch, head, query block). The preprocess fills it, the main kernel reads and adds,
// the postprocess reads dQ out; all three find their rows here. O(seqlen) bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/params.h"
#include "cuda/common.cuh"

namespace flashlab::sm80 {

// Row i of (batch b, head h) is packed row h·total_q + seq_start(b) + i of dsum and lse_log2,
// where seq_start(b) is cu_seqlens_q[b] (varlen) or b·seqlen_q.
//
// dq_accum is not row-major: each (head, batch entry, query block) owns a contiguous chunk of
// kBlockM · D floats in the order the main kernel's threads hold dQ (DqChunk below), so that
// a warp's vector reduction covers 512 contiguous bytes: four cache lines, where a row-major
// accumulator took eight lines for 256 bytes, and the load/store unit that also serves the
// ldmatrix reads spent four times the wavefronts on the adds. A sequence's chunks start at
// padded row seq_start(b) + b · kBlockM, so that its last, ragged block has a whole chunk.
struct BwdWorkspace {
  float* dq_accum;  // [heads_q, total_q + batch·kBlockM, D]  dQ in fp32 in DqChunk order
  float* dsum;      // [heads_q, total_q]     D_i = rowsum(dO ∘ O)
  float* lse_log2;  // [heads_q, total_q]     LSE·log2 e; +inf for rows that saw no key
  int* dq_turn;     // [batch, heads_q, m_blocks]  deterministic only: key blocks done, else null
};

// Byte offsets of the arrays in the caller's workspace, each on its own 256 bytes.
struct BwdWorkspaceLayout {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, dq_turn = 0, total = 0;
};

inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p, int block_m) {
  constexpr size_t kAlign = 256;
  auto aligned = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  const size_t rows = size_t(p.heads_q) * size_t(p.total_q);
  const size_t dq_rows = size_t(p.heads_q) * (size_t(p.total_q) + size_t(p.batch) * block_m);
  const size_t m_blocks = (size_t(p.seqlen_q) + block_m - 1) / block_m;
  BwdWorkspaceLayout l;
  l.dsum = aligned(dq_rows * size_t(p.head_dim) * sizeof(float));
  l.lse_log2 = l.dsum + aligned(rows * sizeof(float));
  l.dq_turn = l.lse_log2 + aligned(rows * sizeof(float));
  l.total = l.dq_turn + (p.deterministic ? aligned(size_t(p.batch) * size_t(p.heads_q) * m_blocks *
                                                   sizeof(int))
                                         : 0);
  return l;
}

// The arrays of BwdWorkspaceLayout in the caller's workspace p.workspace.
inline BwdWorkspace bwd_workspace(const BwdParams& p, int block_m) {
  const BwdWorkspaceLayout l = bwd_workspace_layout(p, block_m);
  char* base = static_cast<char*>(p.workspace);
  return {reinterpret_cast<float*>(base + l.dq_accum), reinterpret_cast<float*>(base + l.dsum),
          reinterpret_cast<float*>(base + l.lse_log2),
          p.deterministic ? reinterpret_cast<int*>(base + l.dq_turn) : nullptr};
}

// The packed row of (batch b, head h)'s row 0 in dsum and lse_log2.
__device__ __forceinline__ int64_t bwd_ws_row(const BwdParams& p, const cuda::SeqInfo& seq, int b,
                                              int h) {
  return int64_t(h) * p.total_q + (p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q);
}

// The dQ accumulator chunk of (batch b, head h, the query block starting at row i0): the
// main kernel's thread t holds float4 j of it at chunk + 4 · (j · kNThreads + t), float4 j
// being values 4j … 4j + 3 of its dQ = dS K accumulator (one m16n8 fragment). Rows past a
// ragged block's end fall in the chunk's padding, which only the main kernel adds into.
template <class Tr>
struct DqChunk {
  static constexpr int kFloats = Tr::kBlockM * Tr::kHeadDim;
  static constexpr int kQuadsPerThread = kFloats / (4 * Tr::kNThreads);
  static_assert(kFloats % (4 * Tr::kNThreads) == 0, "every thread holds whole float4s of dQ");
  __device__ __forceinline__ static float4* at(const BwdParams& p, const BwdWorkspace& ws,
                                               const cuda::SeqInfo& seq, int b, int h, int i0) {
    const int64_t rows_per_head = p.total_q + int64_t(p.batch) * Tr::kBlockM;
    const int64_t seq_start = p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q;
    const int64_t row = int64_t(h) * rows_per_head + seq_start + int64_t(b) * Tr::kBlockM + i0;
    return reinterpret_cast<float4*>(ws.dq_accum + row * Tr::kHeadDim);
  }
};

}  // namespace flashlab::sm80
