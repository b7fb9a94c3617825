// Non-finite V on the tiles a mask cuts, for the tensor-core forwards (fa2_mma, cute_fa2,
// cute_fa3).
//
// docs/DESIGN.md: a NaN or Inf reaches only the rows that see it. The mask zeroes a masked
// key's probability, but an MMA still multiplies that zero by the key's V, and 0 · NaN and
// 0 · Inf are NaN: on a tile the mask cuts, one non-finite V value would reach every row of
// the tile, and a row that sees no key at all would end as NaN instead of 0.
//
// The mainloops are left as they are. The wrong rows are found where they show: a row that
// a masked key's V reached holds a NaN in O's accumulator after the mainloop. Each thread
// tests its own accumulator values there, and where one of a row's is not finite it sums its
// columns of that row again from global memory (sum_rows_again), in fp32, over the row's
// visible keys only, with the softmax's final max (V changes neither the max nor the sum):
// a masked key's V is never read, and a visible one's Inf or NaN lands in its own columns,
// as in the oracle. Finite inputs pay one test per accumulator value per query block. The
// sum is slow (a thread walks its row's keys one by one) and runs only for rows that hold a
// NaN or Inf.
//
// A check inside the mainloops costs more than it saves: on the H100 a scan of each cut
// tile's V and a warpgroup vote slowed cute_fa3's causal forwards by 4-15% (worst at head
// dim 64 and at 1k tokens), and in cute_fa3 any skipped wgmma or write to O's accumulator between
// wgmmas makes ptxas serialize every wgmma of the kernel (C7515).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/constants.h"
#include "common/params.h"

namespace flashlab::cuda {

// The factor that takes a forward's score into log2 units: softcap · log2(e) when the score
// is a softcap's tanh, else scale · log2(e) (as every forward scales its scores).
__host__ __device__ __forceinline__ float score_scale_log2(const FwdParams& p) {
  return p.mask.softcap > 0.f ? p.mask.softcap * kLog2e : p.scale_log2;
}

// What sum_rows_again works on: one thread's share of O's accumulator, as rows × columns.
template <int kRows, int kCols>
struct RowsAgain {
  float o[kRows][kCols];  // O's accumulator values (in); rows with bit r of `bad`, summed again (out)
  float m_log2[kRows];    // each row's final max, in log2 units (the softmax's, not recomputed)
  int row[kRows];         // each row's index in its sequence
  int col[kCols];         // each column's index in the head dim
  unsigned bad;           // bit r: row r holds a NaN or an Inf
};

// Rows r of a.o with bit r of a.bad set, summed again: o[r][c] = Σ over row row[r]'s visible
// keys j of 2^(score(q · k_j) − m_log2[r]) · v[j][col[c]], in fp32 from global memory; keys
// that dropout drops are left out as the kernel left them out (bh: its (batch, head) index).
// q, k, v: the sequence's row 0 of this head.
//
// Out of line, and RowsAgain passes by value both ways: no address of the caller's arrays
// escapes into the call, so the caller keeps its softmax state and O in registers through
// the mainloop (with the row max passed by reference, ptxas stored it to the stack at every
// key block of cute_fa3). What the test and this call cost is in docs/RESULTS.md ("What the
// non-finite guarantee costs"): within noise for cute_fa2 and fa2_mma and at head dim 128;
// at head dim 64, cute_fa3 2-4% (H100).
template <class T, int kHeadDim, int kRows, int kCols>
__device__ __noinline__ RowsAgain<kRows, kCols> sum_rows_again(const FwdParams& p, const T* q,
                                                              const T* k, const T* v, int len_q,
                                                              int len_k, uint32_t bh,
                                                              RowsAgain<kRows, kCols> a) {
  const float cap = p.mask.softcap;
  const float scale_log2 = score_scale_log2(p);
  const float softcap_pre = cap > 0.f ? p.scale / cap : 0.f;  // the score: tanh(q·k · this)
  for (int r = 0; r < kRows; ++r) {
    if (!((a.bad >> r) & 1u)) continue;
    const int i = a.row[r];
    for (int c = 0; c < kCols; ++c) a.o[r][c] = 0.f;
    const T* qi = q + i * p.q_row_stride;
    const int je = p.mask.key_end(i, len_q, len_k);
    for (int j = p.mask.key_begin(i, len_q, len_k); j < je; ++j) {
      if (p.dropout.enabled() && !p.dropout.keep(bh, i, j)) continue;
      const T* kj = k + j * p.k_row_stride;
      float dot = 0.f;
#pragma unroll 8
      for (int d = 0; d < kHeadDim; ++d)
        dot += static_cast<float>(qi[d]) * static_cast<float>(kj[d]);
      const float s = softcap_pre != 0.f ? tanhf(dot * softcap_pre) : dot;
      const float pr = exp2f(s * scale_log2 - a.m_log2[r]);
      const T* vj = v + j * p.v_row_stride;
#pragma unroll 4
      for (int c = 0; c < kCols; ++c) a.o[r][c] += pr * static_cast<float>(vj[a.col[c]]);
    }
  }
  return a;
}

}  // namespace flashlab::cuda
