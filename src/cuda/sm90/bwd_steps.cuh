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
// The CTA's work, key block n_block(p) of KV head h_kv() of batch entry b(), in one of two
// forms that every reader takes alike.
// The 3-D grid (key blocks, KV heads, batch): dense problems and the deterministic mode,
// whose turns (bwd_turn) rely on the launch order of the key blocks. It reads blockIdx
// where each value is used.
struct BwdGridTile {
  static constexpr bool kCompact = false;
  __device__ int b() const { return int(blockIdx.z); }
  __device__ int h_kv() const { return int(blockIdx.y); }
  __device__ int n_block(const BwdParams& p) const { return bwd_n_block(p); }
};
// The compact grid's (bwd_varlen_tile): b() < 0 is a CTA without a key block.
struct BwdTile {
  static constexpr bool kCompact = true;
  int b_, h_kv_, n_block_;
  __device__ int b() const { return b_; }
  __device__ int h_kv() const { return h_kv_; }
  __device__ int n_block(const BwdParams&) const { return n_block_; }
};
// Varlen (not deterministic): grid (an upper bound on Σ_b ⌈len_k(b)/block_n⌉, KV heads), one
// CTA per key block that exists, batch entry by batch entry and key block 0 first in each.
// Each warp maps blockIdx.x back to (b, n_block) by itself (no barrier is needed): 32 entries
// at a time, each lane one entry's block count (its len_k clamped as cuda::seq_info does), a
// warp-inclusive scan, and the first lane whose running sum passes the index. A CTA past the
// real count (the bound counts a partial block per entry) gets b = −1 and exits.
__device__ __forceinline__ BwdTile bwd_varlen_tile(const BwdParams& p, int block_n) {
  const int lane = int(threadIdx.x % 32);
  int rest = int(blockIdx.x);  // the index among the blocks of the entries not yet passed
  for (int base = 0; base < p.batch; base += 32) {
    const int b = base + lane;
    int blocks = 0;
    if (b < p.batch) {
      const int64_t start = cuda::clamp64(p.cu_seqlens_k[b], 0, p.total_k);
      const int64_t len = cuda::clamp64(cuda::clamp64(p.cu_seqlens_k[b + 1], 0, p.total_k) - start, 0, p.seqlen_k);
      blocks = int((len + block_n - 1) / block_n);
    }
    int incl = blocks;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += up;
    }
    const unsigned past = __ballot_sync(0xffffffffu, incl > rest);
    if (past != 0) {
      const int owner = __ffs(past) - 1;
      const int before = __shfl_sync(0xffffffffu, incl - blocks, owner);
      return {base + owner, int(blockIdx.y), rest - before};
    }
    rest -= __shfl_sync(0xffffffffu, incl, 31);
  }
  return {-1, int(blockIdx.y), 0};
}
// The compact grid's x extent, on the host from the arguments alone: Σ_b ⌈len_k(b)/block_n⌉
// <= (total_k + batch·(block_n − 1)) / block_n for well-formed cu_seqlens (docs/DESIGN.md),
// and never more than the 3-D grid's batch·⌈seqlen_k/block_n⌉.
inline int64_t bwd_varlen_blocks(const BwdParams& p, int block_n) {
  const int64_t packed = (p.total_k + int64_t(p.batch) * (block_n - 1)) / block_n;
  const int64_t padded = int64_t(p.batch) * ((p.seqlen_k + block_n - 1) / block_n);
  return packed < padded ? packed : padded;
}
__device__ __forceinline__ int bwd_turn(const BwdParams& p, const cuda::SeqInfo& seq, int n_block, int m,
                                        int block_m, int block_n) {
  auto visits = [&](int n) { return BwdSteps(p, seq, n, block_m, block_n).visits(m); };
  if (bwd_descending(p))  // the visitors after n: up to the first key block past n that is none
    return cuda::first_true(n_block + 1, int(gridDim.x), [&](int n) { return !visits(n); }) - 1 - n_block;
  return n_block - cuda::first_true(0, n_block, visits);  // the visitors before n
}

}  // namespace flashlab::sm90
