// The split-KV decode's split count (src/common/kv_splits.h) on the inputs an H100 or H200
// reports (132 SMs): the counts docs/learn/flash-decoding.md, "How many splits", lists and
// measured, so that a change to the model that moves one of them fails here first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "common/kv_splits.h"

namespace flashlab::test {
namespace {

// GQA 32:8, one query token, bf16, on 132 SMs. Head dim 128: 64-key tiles, two CTAs resident
// per SM and one counted by bytes in flight; head dim 64: four resident, two counted; head
// dim 256: 32-key tiles, two resident, both counted.
int splits(int batch, int cache, int head_dim = 128) {
  KvSplitInputs in;
  in.sms = 132;
  const int block_n = head_dim == 256 ? 32 : 64;
  in.resident = head_dim == 64 ? 4 : 2;
  in.per_sm = head_dim == 128 ? 1 : 2;
  in.ctas = int64_t(batch) * 8;
  in.n_tiles = (cache + block_n - 1) / block_n;
  in.most = std::min(128, in.n_tiles);
  return kv_split_count(in);
}

TEST(KvSplits, BatchOneFillsTheSms) {
  // 8 CTAs of one split; 16 splits fill 128 of the 132 SMs.
  EXPECT_EQ(splits(1, 4096), 16);
  EXPECT_EQ(splits(1, 16384), 16);
  EXPECT_EQ(splits(1, 65536), 16);
  EXPECT_EQ(splits(8, 8192), 2);
  EXPECT_EQ(splits(4, 32768), 4);
}

TEST(KvSplits, FewCtasSplitWithinOneWaveOfResidentCtas) {
  // Batch 12 (96 CTAs, 264 resident slots): 4 splits would leave a second wave of 120 CTAs;
  // 2 fit but the model gains nothing from them.
  EXPECT_EQ(splits(12, 4096), 1);
  EXPECT_EQ(splits(24, 4096, 64), 1);   // 192 CTAs, 528 slots: 2 fit, 4 would not
  EXPECT_EQ(splits(16, 4096, 64), 2);   // 128 CTAs: 2 splits fill 256 of 528
  EXPECT_EQ(splits(24, 4096, 256), 1);  // 192 CTAs, 264 slots
  EXPECT_EQ(splits(16, 4096, 256), 2);
  EXPECT_EQ(splits(8, 4096, 256), 4);
  EXPECT_EQ(splits(8, 4096), 2);
  EXPECT_EQ(splits(4, 4096), 4);
}

TEST(KvSplits, OneWaveOfResidentCtasStaysWhole) {
  // 128 to 264 CTAs: more splits read 4-20% slower at a 4k cache on an H200.
  for (int batch : {16, 20, 24, 32, 33}) EXPECT_EQ(splits(batch, 4096), 1) << "batch " << batch;
  EXPECT_EQ(splits(16, 16384), 1);
}

TEST(KvSplits, ALastWaveWithACtaOnEverySmStaysWhole) {
  // Batch 64: 512 CTAs in waves of 264, 248 in the last; 2 splits read 4% slower.
  for (int batch : {56, 64, 66, 96, 99, 128}) EXPECT_EQ(splits(batch, 4096), 1) << "batch " << batch;
  EXPECT_EQ(splits(64, 16384), 1);
  EXPECT_EQ(splits(64, 4096, 256), 1);
  // Head dim 64, four resident: batch 96's last wave holds 240 of 528, one on every SM.
  EXPECT_EQ(splits(64, 4096, 64), 1);
  EXPECT_EQ(splits(96, 4096, 64), 1);
}

TEST(KvSplits, ALastWaveThatLeavesSmsEmptySplits) {
  // Each count read 2-18% faster than one split on an H200 (flash-decoding.md, "Many CTAs:
  // the last wave").
  EXPECT_EQ(splits(40, 4096), 4);   // 56 CTAs in the last wave of 264
  EXPECT_EQ(splits(48, 4096), 2);   // 120
  EXPECT_EQ(splits(67, 4096), 4);   // 8
  EXPECT_EQ(splits(80, 4096), 2);   // 112
  EXPECT_EQ(splits(40, 16384), 4);
  EXPECT_EQ(splits(48, 4096, 256), 2);
}

TEST(KvSplits, DegenerateInputsGiveOneSplit) {
  KvSplitInputs in;  // every field at its smallest
  EXPECT_EQ(kv_split_count(in), 1);
  in.sms = 0, in.resident = 0, in.per_sm = 0, in.ctas = 0, in.n_tiles = 0, in.most = 0;
  EXPECT_EQ(kv_split_count(in), 1);
  in = KvSplitInputs{};
  in.sms = 132, in.resident = 2, in.per_sm = 1, in.ctas = 8, in.n_tiles = 1, in.most = 1;
  EXPECT_EQ(kv_split_count(in), 1);  // one key tile: nothing to split
}

}  // namespace
}  // namespace flashlab::test
