// Tile scheduler of the Hopper forward. A tile is (batch entry, query head, 64·consumers-row
// query block) with the key tiles its rows can see (cuda::fwd_block in cuda/cute_common.cuh,
// shared with the sm80 forward). The producer and the consumer warpgroups walk the same
// tiles and compute the same answer, so they agree on the number of K/V tiles that pass
// through the pipelines.
//
// Two schedules (Tr::kPersistent):
//   one CTA per tile   grid (query blocks, heads_q, batch), each head's query blocks longest
//                      first (schedule()); cute_fa3's, under every mask
//   persistent         one CTA per SM taking tiles of one order (TileOrder) as it frees up
//                      (DynamicTiles): the next tile's first K/V loads go out while this
//                      one's epilogue runs, and no CTA is launched or torn down per tile.
//                      The ablation cute_fa3_persistent: 5-8% slower than one CTA per tile
//                      at head dim 128 without a mask, level at causal 4k, 2-7% slower at
//                      causal 8k-16k (H100, bf16); the time it loses is in its loop, whose
//                      exponentials ptxas schedules worse (docs/sm90/fwd.md, "Scheduling")
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>

#include "common/params.h"
#include "cuda/cute_common.cuh"

namespace flashlab::sm90 {

using cuda::FwdBlock;

template <class Tr>
__device__ __forceinline__ FwdBlock schedule(const FwdParams& p) {
  return cuda::schedule_fwd<Tr::kBlockM, Tr::kBlockN>(p);
}

// The persistent order. (batch, head) pairs, batch-major, are cut into groups of `group`
// pairs whose K and V fit in L2 together (kL2Bytes); a group's tiles come before the next
// group's, query block by query block from the last (the longest under a causal mask) to
// the first, every pair of the group at one query block before the next.
// The tiles are handed out dynamically (DynamicTiles): CTA c starts with tile c, and a CTA
// that finishes takes the next tile of the order not yet taken, so the longest tiles go
// first and the short ones fill the gaps at the end (longest-processing-time-first). A
// fixed deal (round-robin; then a snake, c, 2G − 1 − c, 2G + c, ...) was measured first:
// under a causal mask it hands some CTAs far more work than others (docs/sm90/fwd.md).
struct TileOrder {
  static constexpr int64_t kL2Bytes = int64_t(32) << 20;  // of the H100's 50 MiB
  int m_blocks = 0;  // query blocks per (batch, head): ceil(seqlen_q / kBlockM)
  int pairs = 0;     // batch · heads_q
  int group = 1;     // (batch, head) pairs per group

  // kv_bytes: K and V of one KV head (2 · seqlen_k · D · element size); `gqa` query heads
  // share it.
  static TileOrder make(int m_blocks, int batch, int heads_q, int gqa, int64_t kv_bytes) {
    TileOrder o;
    o.m_blocks = m_blocks;
    o.pairs = batch * heads_q;
    const int64_t per_pair = kv_bytes / (gqa > 0 ? gqa : 1);
    const int64_t fit = per_pair > 0 ? kL2Bytes / per_pair : int64_t(o.pairs);
    o.group = int(std::max<int64_t>(1, std::min<int64_t>(fit, o.pairs)));
    return o;
  }
  __host__ __device__ int tiles() const { return m_blocks * pairs; }

  // The t-th tile of the order as (b, h, m_block).
  __device__ __forceinline__ void tile(int t, int heads_q, int& b, int& h, int& m_block) const {
    const int per_group = group * m_blocks;
    const int g = t / per_group;
    const int r = t - g * per_group;
    const int first = g * group;
    const int size = min(group, pairs - first);  // the last group may be smaller
    const int pair = first + r % size;
    m_block = m_blocks - 1 - r / size;
    b = pair / heads_q;
    h = pair - b * heads_q;
  }
};

// The dynamic hand-out. `counter` is an int in the caller's workspace, zeroed before the
// launch; each CTA's producer thread takes its next tile with one atomicAdd while the
// present one is still loading, and tells the consumers which tile it took through shared
// memory (publish / read, ordered by Q's mbarrier: the producer writes, then arrives; the
// consumers wait, then read).
struct DynamicTiles {
  int* counter;
  // The tile after this CTA's present one (tiles() or more: none left).
  __device__ __forceinline__ int take_next() const { return atomicAdd(counter, 1) + int(gridDim.x); }
  // The asm statements (with a memory clobber) stay where they are relative to the
  // mbarrier's asm arrive and wait.
  __device__ __forceinline__ static void publish(int* slot, int tile) {
    asm volatile("st.shared.s32 [%0], %1;" ::"r"(cute::cast_smem_ptr_to_uint(slot)), "r"(tile)
                 : "memory");
  }
  __device__ __forceinline__ static int read(const int* slot) {
    int tile;
    asm volatile("ld.shared.s32 %0, [%1];"
                 : "=r"(tile)
                 : "r"(cute::cast_smem_ptr_to_uint(slot))
                 : "memory");
    return tile;
  }
};

}  // namespace flashlab::sm90
