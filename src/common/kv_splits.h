// The split-KV decode's split count (dispatch.cu's kv_splits) as arithmetic on what CUDA
// reports, with no CUDA in it, so that the CPU tests can pin the counts it picks
// (tests/cpu/kv_splits_test.cpp). docs/learn/flash-decoding.md, "How many splits", derives
// the model and measures it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flashlab {

struct KvSplitInputs {
  int sms = 1;          // the device's SMs
  int resident = 1;     // the kernel's CTAs resident per SM (the occupancy API's answer)
  int per_sm = 1;       // the CTAs per SM a wave counts (by bytes in flight; at most resident)
  int64_t ctas = 1;     // batch · KV heads · row blocks: the CTAs of one split
  int n_tiles = 1;      // key tiles of the cache's capacity
  int most = 1;         // the largest count allowed: min(kMaxSplits, n_tiles)
};

// The CTAs of s splits run in ceil(ctas·s / slots) waves of `slots` = SMs × per_sm, and a CTA
// of each wave streams ceil(tiles / s) key tiles plus about one tile's worth of fixed cost (Q,
// the ring's first loads, its partials): time(s) = waves(s) · (ceil(tiles / s) + 1). The count
// is the smallest within 5% of the best time (fewer splits: fewer partials for the combine).
//
// Below 80% of a wave, the splits' CTAs stay within one wave of resident CTAs: a count that
// spills past it leaves a second wave of a few CTAs, which the model above counts as a whole
// wave of slots but which runs with most SMs idle (head dim 128, batch 12 at a 4k cache on an
// H200: 96 CTAs, 4 splits read 8% slower than one; head dim 64, batch 24: 192 CTAs, 4 splits
// 8% slower).
//
// Where the CTAs already fill 80% of a wave: one split, unless the CTAs run in waves of every
// resident slot and the last of them leaves SMs without a CTA. Those SMs issue no loads, and
// the memory is under-used while that wave runs (at a 4k cache on an H200, head dim 128, a
// last wave of 8 to 120 CTAs on 132 SMs read 3-6% slower than whole waves, one of 240 or 248
// about 1%). There the model runs on resident slots. Within one wave, or with a CTA on every
// SM in the last, more splits cost up to 20% at batches 16 to 32 and 3-5% at batches 64 and
// 128.
inline int kv_split_count(const KvSplitInputs& in) {
  const int64_t sms = std::max(in.sms, 1), resident = std::max(in.resident, 1);
  const int64_t ctas = std::max<int64_t>(in.ctas, 1);
  const int n_tiles = std::max(in.n_tiles, 1);
  int most = std::max(in.most, 1);
  int64_t slots = sms * std::clamp<int64_t>(in.per_sm, 1, resident);
  const int64_t resident_slots = sms * resident;
  if (ctas * 5 >= slots * 4) {
    const int64_t last = ctas % resident_slots;
    if (ctas <= resident_slots || last == 0 || last >= sms) return 1;
    slots = resident_slots;
  } else {
    most = int(std::min<int64_t>(most, std::max<int64_t>(1, resident_slots / ctas)));
  }
  auto time = [&](int s) {
    const int64_t waves = (ctas * s + slots - 1) / slots;
    return waves * ((n_tiles + s - 1) / s + 1);
  };
  int64_t best = time(1);
  for (int s = 2; s <= most; ++s) best = std::min(best, time(s));
  for (int s = 1; s <= most; ++s)
    if (time(s) * 20 <= best * 21) return s;
  return 1;
}

}  // namespace flashlab
