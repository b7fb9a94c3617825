// Non-finite V on the tiles a mask cuts, for the tensor-core forwards.
//
// docs/DESIGN.md: a NaN or Inf reaches only the rows that see it. The mask zeroes a masked
// key's probability, but an MMA still multiplies that zero by the key's V, and 0 · NaN and
// 0 · Inf are NaN: on a tile the mask cuts, one non-finite V value would reach every row
// of the tile. Tiles the mask leaves whole pay nothing: their rows see every key, so the
// product's NaN is the right answer. On a cut tile the block (or warpgroup) checks V's
// 16-byte chunks and votes; only when one holds a non-finite value, which finite inputs
// never do, does it take a slow path:
//   1. each warp records which keys hold a non-finite value (nonfinite_keys);
//   2. the product leaves those values out: fa2_mma and cute_fa2, whose blocks own their
//      cp.async tiles, zero them in shared memory between two barriers
//      (drop_nonfinite_values); cute_fa3, whose TMA ring both consumer warpgroups read,
//      zeroes them in registers on a per-warp mma.sync product instead (sm90/fwd_nonfinite.cuh);
//   3. each row that sees one of those keys has its O accumulator set to NaN (any_key_in).
// A row that sees a non-finite V value therefore ends as NaN across the row (an Inf that the
// plain product would keep in its own column becomes NaN too); every other row gets exactly
// the product without them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashlab::cuda {

// Sign-bit position of each 16-bit half of a word whose exponent bits are all ones
// (Inf or NaN): adding one exponent unit to an all-ones exponent carries into the sign bit,
// and into it only, so both halves are tested at once.
template <bool kBf16>
__device__ __forceinline__ uint32_t nonfinite_halves(uint32_t w) {
  constexpr uint32_t kExp = kBf16 ? 0x7F807F80u : 0x7C007C00u;
  constexpr uint32_t kUnit = kBf16 ? 0x00800080u : 0x04000400u;
  return ((w & kExp) + kUnit) & 0x80008000u;
}

// True when any of the eight 16-bit values of a 16-byte chunk is Inf or NaN.
template <bool kBf16>
__device__ __forceinline__ bool chunk_nonfinite(const uint4& c) {
  return (nonfinite_halves<kBf16>(c.x) | nonfinite_halves<kBf16>(c.y) |
          nonfinite_halves<kBf16>(c.z) | nonfinite_halves<kBf16>(c.w)) != 0;
}

// The word (two 16-bit values) with its Inf and NaN values replaced by +0.
template <bool kBf16>
__device__ __forceinline__ uint32_t word_zero_nonfinite(uint32_t w) {
  const uint32_t sign = nonfinite_halves<kBf16>(w);  // 0x8000 per non-finite half
  return w & ~(sign | (sign - (sign >> 15)));         // ... widened to 0xFFFF
}

// The chunk with its Inf and NaN values replaced by +0.
template <bool kBf16>
__device__ __forceinline__ uint4 chunk_zero_nonfinite(uint4 c) {
  return make_uint4(word_zero_nonfinite<kBf16>(c.x), word_zero_nonfinite<kBf16>(c.y),
                    word_zero_nonfinite<kBf16>(c.z), word_zero_nonfinite<kBf16>(c.w));
}

// The vote's input: does any of this thread's kOwn chunks (own(i): a pointer to its i-th
// 16-byte chunk of the tile in shared memory) hold an Inf or NaN?
template <bool kBf16, int kOwn, class Own>
__device__ __forceinline__ bool own_chunks_nonfinite(Own own) {
  bool bad = false;
#pragma unroll
  for (int i = 0; i < kOwn; ++i) bad |= chunk_nonfinite<kBf16>(*own(i));
  return bad;
}

// Step 1 for one warp: bit j of keys[j / 32] is set when key row j of the tile
// (row_chunk(j, c): a pointer to its chunk c in shared memory) holds a non-finite value.
template <bool kBf16, int kKeys, int kChunksPerRow, class RowChunk>
__device__ __forceinline__ void nonfinite_keys(RowChunk row_chunk, int lane,
                                               uint32_t (&keys)[kKeys / 32]) {
  static_assert(kKeys % 32 == 0, "one ballot word per 32 keys");
#pragma unroll
  for (int w = 0; w < kKeys / 32; ++w) {
    bool bad = false;
#pragma unroll 4
    for (int c = 0; c < kChunksPerRow; ++c)
      bad |= chunk_nonfinite<kBf16>(*row_chunk(32 * w + lane, c));
    keys[w] = __ballot_sync(0xffffffffu, bad);
  }
}

// Steps 1 and 2 where the block may rewrite the tile (cp.async tiles: fa2_mma, cute_fa2),
// called by every thread once the vote found a value: the keys, then every non-finite value
// zeroed in shared memory, each thread its own chunks (own(i)).
template <bool kBf16, int kKeys, int kChunksPerRow, int kOwn, class RowChunk, class Own>
__device__ __forceinline__ void drop_nonfinite_values(RowChunk row_chunk, Own own, int lane,
                                                      uint32_t (&keys)[kKeys / 32]) {
  nonfinite_keys<kBf16, kKeys, kChunksPerRow>(row_chunk, lane, keys);
  __syncthreads();  // every warp has read the tile before any thread writes it
#pragma unroll
  for (int i = 0; i < kOwn; ++i) *own(i) = chunk_zero_nonfinite<kBf16>(*own(i));
  __syncthreads();  // the zeroed tile is what P V reads
}

// Step 3's test: does any key in [lo, hi) (tile-relative, clamped here) have its bit set?
template <int kWords>
__device__ __forceinline__ bool any_key_in(const uint32_t (&keys)[kWords], int lo, int hi) {
  bool hit = false;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const int a = max(lo - 32 * w, 0), b = min(hi - 32 * w, 32);
    if (a < b) {
      const uint32_t upto_b = b == 32 ? 0xffffffffu : (1u << b) - 1u;
      hit |= (keys[w] & upto_b & ~((1u << a) - 1u)) != 0;
    }
  }
  return hit;
}

}  // namespace flashlab::cuda
