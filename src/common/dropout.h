// The dropout policy: one definition of which attention probabilities are dropped, shared by
// the CPU reference, the CPU kernels and every GPU kernel, so that a backward regenerates the
// forward's mask exactly and a test can rebuild it on the host.
//
// With dropout probability p, the forward computes  O = (P ∘ M / (1 − p)) V  where M is a
// 0/1 mask drawn per (batch·head, query row, key) and P the softmax; LSE is that of P (the
// mask does not touch it). M comes from Philox4x32-10 (Salmon et al., SC'11), a counter-based
// generator: the bits of an element are a pure function of (seed, offset, where it is), so no
// state is stored and any thread can draw any element in any order.
//
// Where an element is: bh = batch·heads_q + head, i = query row and j = key, both counted
// from the start of the sequence (so varlen and padded layouts draw the same bits).
// One Philox call gives four 32-bit words and covers the 2×2 block
//   rows {i, i + 8} × keys {j, j + 1}    (i mod 16 < 8, j even)
// which is the four accumulators one thread holds of a 16×8 tile of the m16n8k16 tensor-core
// MMA, so a GPU thread draws each of its score fragments with one call:
//   counter = ( j >> 1,  (i >> 4)·8 + (i & 7),  bh,  offset_lo ),   key = ( seed_lo, seed_hi ^ offset_hi )
//   word    = ((i >> 3) & 1)·2 + (j & 1)
// and element (bh, i, j) is kept when word ≥ threshold = ⌊p · 2³²⌋.
#pragma once

#include <cstdint>

#include "common/mask.h"  // FL_HOST_DEVICE

namespace flashlab {

struct Philox4 {
  uint32_t w[4];
};

FL_HOST_DEVICE Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                     uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c0;
    const uint64_t p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {{c0, c1, c2, c3}};
}

struct DropoutPolicy {
  float p = 0.f;        // probability of dropping; 0 = off
  float rescale = 1.f;  // 1 / (1 − p), applied to the kept probabilities
  uint32_t threshold = 0;
  uint32_t seed_lo = 0, seed_hi = 0;
  uint32_t offset_lo = 0, offset_hi = 0;

  static DropoutPolicy make(float p, uint64_t seed, uint64_t offset) {
    DropoutPolicy d;
    if (!(p > 0.f)) return d;
    d.p = p;
    d.rescale = float(1.0 / (1.0 - double(p)));
    const double t = double(p) * 4294967296.0;
    d.threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : uint32_t(t);
    d.seed_lo = uint32_t(seed);
    d.seed_hi = uint32_t(seed >> 32);
    d.offset_lo = uint32_t(offset);
    d.offset_hi = uint32_t(offset >> 32);
    return d;
  }

  FL_HOST_DEVICE bool enabled() const { return p > 0.f; }

  // The four words of the 2×2 block holding (i, j); see the file comment.
  FL_HOST_DEVICE Philox4 block_bits(uint32_t bh, int i, int j) const {
    return philox4x32_10(uint32_t(j) >> 1, (uint32_t(i) >> 4) * 8u + (uint32_t(i) & 7u), bh,
                         offset_lo, seed_lo, seed_hi ^ offset_hi);
  }
  FL_HOST_DEVICE static int word_of(int i, int j) { return ((i >> 3) & 1) * 2 + (j & 1); }

  FL_HOST_DEVICE bool keep(uint32_t bh, int i, int j) const {
    return block_bits(bh, i, j).w[word_of(i, j)] >= threshold;
  }
};

}  // namespace flashlab
