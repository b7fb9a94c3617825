// Which query blocks the Hopper backward's CTA for one key block visits (BwdSteps), and in
// deterministic mode the order in which the key blocks add into a query block's dQ
// (bwd_turn). Shared by the main kernel's producer, consumers and dQ warp (bwd_kernel.cuh).
#pragma once

#include <cstdint>

#include "common/params.h"
#include "cuda/common.cuh"

namespace flashlab::sm90 {

// The steps of the CTA that owns key block n_block: for each query head of its KV head's
// group, the query blocks [m_begin, m_end) whose rows see any of its keys (docs/DESIGN.md's
// mask: row i sees keys [i + len_k − len_q − left, i + len_k − len_q + right]).
struct BwdSteps {
  int m_begin = 0, per_head = 0, total = 0;

  __device__ BwdSteps(const BwdParams& p, const cuda::SeqInfo& seq, int n_block, int block_m, int block_n) {
    const int64_t off = int64_t(seq.len_k) - seq.len_q;
    const int64_t j0 = int64_t(n_block) * block_n;
    if (j0 >= seq.len_k) return;  // varlen: a sequence shorter than the longest
    const int64_t j1 = j0 + block_n < seq.len_k ? j0 + block_n : seq.len_k;
    int64_t lo = 0, hi = seq.len_q;
    if (p.mask.window_right >= 0) lo = j0 - off - p.mask.window_right > 0 ? j0 - off - p.mask.window_right : 0;
    if (p.mask.window_left >= 0 && j1 - off + p.mask.window_left < hi) hi = j1 - off + p.mask.window_left;
    if (lo >= hi) return;
    m_begin = int(lo / block_m);
    per_head = int((hi + block_m - 1) / block_m) - m_begin;
    total = per_head * p.group;
  }
  __device__ int head(int step, int h_kv, int group) const { return h_kv * group + step / per_head; }
  __device__ int m_block(int step) const { return m_begin + step % per_head; }
  __device__ bool visits(int m) const { return total > 0 && m >= m_begin && m < m_begin + per_head; }
};

// The deterministic mode's order: the key blocks that add into query block m take turns, so
// that block n waits for the count of visitors before it. The visitors of m are a contiguous
// range of key blocks (both ends of a key block's query range grow with n, and a key block
// without steps can only come before or after every visitor), which contains n, so a binary
// search for the range's end gives the count. Without a right bound the order is ascending.
// With one (causal), a query block's last visitor reaches it within its first steps, so the
// order is descending and the CTAs launch in that order too (bwd_n_block): each key block
// then finds its earlier visitors done, where ascending order would hold key block n about
// n steps at its first query block.
__device__ __forceinline__ bool bwd_descending(const BwdParams& p) {
  return p.deterministic && p.mask.window_right >= 0;
}
// The key block of this CTA (grid x: the key blocks, launched last first when descending).
__device__ __forceinline__ int bwd_n_block(const BwdParams& p) {
  return bwd_descending(p) ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
}
__device__ __forceinline__ int bwd_turn(const BwdParams& p, const cuda::SeqInfo& seq, int n_block, int m,
                                        int block_m, int block_n) {
  auto visits = [&](int n) { return BwdSteps(p, seq, n, block_m, block_n).visits(m); };
  if (bwd_descending(p))  // the visitors after n: up to the first key block past n that is none
    return cuda::first_true(n_block + 1, int(gridDim.x), [&](int n) { return !visits(n); }) - 1 - n_block;
  return n_block - cuda::first_true(0, n_block, visits);  // the visitors before n
}

}  // namespace flashlab::sm90
