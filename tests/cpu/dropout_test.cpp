// The dropout policy (src/common/dropout.h) on the host: Philox4x32-10 against the known-answer
// vectors of its authors' Random123 library, the drop fraction, and the 2×2 block layout the
// GPU kernels rely on (one Philox call per m16n8 accumulator fragment).
#include <gtest/gtest.h>

#include <random>

#include "common/dropout.h"
#include "test_util.h"

namespace flashlab::test {
namespace {

TEST(Dropout, PhiloxKnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const Philox4 r = philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.w[w], k.out[w]) << "word " << w;
  }
}

TEST(Dropout, OffByDefaultAndThresholds) {
  EXPECT_FALSE(DropoutPolicy{}.enabled());
  EXPECT_FALSE(DropoutPolicy::make(0.f, 1, 2).enabled());
  const DropoutPolicy d = DropoutPolicy::make(0.25f, 1, 2);
  EXPECT_TRUE(d.enabled());
  EXPECT_EQ(d.threshold, 0x40000000u);
  EXPECT_FLOAT_EQ(d.rescale, 1.f / 0.75f);
}

TEST(Dropout, FractionIsP) {
  FLASHLAB_SEED_TRACE();
  std::mt19937_64 rng = rng_for("Dropout.FractionIsP");
  for (float p : {0.05f, 0.3f, 0.5f, 0.9f}) {
    const DropoutPolicy d = DropoutPolicy::make(p, rng(), rng());
    int64_t dropped = 0, total = 0;
    for (uint32_t bh = 0; bh < 4; ++bh)
      for (int i = 0; i < 256; ++i)
        for (int j = 0; j < 256; ++j, ++total) dropped += !d.keep(bh, i, j);
    EXPECT_NEAR(double(dropped) / double(total), p, 0.01) << "p = " << p;
  }
}

// Rows {i, i + 8} × keys {j, j + 1} (i mod 16 < 8, j even) share one call, in the word order
// (i, j), (i, j + 1), (i + 8, j), (i + 8, j + 1); different blocks, seeds or offsets differ.
TEST(Dropout, BlockLayout) {
  const DropoutPolicy d = DropoutPolicy::make(0.5f, 0x123456789abcdefull, 42);
  for (int i0 : {0, 16, 48}) {
    for (int j0 : {0, 2, 62}) {
      const Philox4 bits = d.block_bits(3, i0 + 5, j0);
      const int rows[4] = {i0 + 5, i0 + 5, i0 + 13, i0 + 13};
      const int keys[4] = {j0, j0 + 1, j0, j0 + 1};
      for (int w = 0; w < 4; ++w) {
        EXPECT_EQ(DropoutPolicy::word_of(rows[w], keys[w]), w);
        EXPECT_EQ(d.block_bits(3, rows[w], keys[w]).w[w], bits.w[w]);
        EXPECT_EQ(d.keep(3, rows[w], keys[w]), bits.w[w] >= d.threshold);
      }
    }
  }
  const Philox4 a = d.block_bits(3, 0, 0);
  EXPECT_NE(d.block_bits(3, 16, 0).w[0], a.w[0]);
  EXPECT_NE(d.block_bits(3, 0, 2).w[0], a.w[0]);
  EXPECT_NE(d.block_bits(4, 0, 0).w[0], a.w[0]);
  EXPECT_NE(DropoutPolicy::make(0.5f, 0x123456789abcdefull, 43).block_bits(3, 0, 0).w[0], a.w[0]);
  EXPECT_NE(DropoutPolicy::make(0.5f, 0x123456789abcdeeull, 42).block_bits(3, 0, 0).w[0], a.w[0]);
}

}  // namespace
}  // namespace flashlab::test
