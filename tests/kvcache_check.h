// forward_kvcache against the fp64 oracle on the gathered cache, for any kernel and device
// (tests/cpu/kvcache_test.cpp, tests/gpu/kvcache_gpu_test.cpp).
//
// Each case draws a cache (contiguous, or paged with its pages shuffled through the pool),
// optional new rows, cache lengths and a query, runs forward_kvcache with the named kernel
// where the Placement puts the tensors, and checks:
//   - the cache afterwards equals, byte for byte over its whole storage, a copy of the
//     cache before with the new rows written at cache_seqlens[b] by hand; with rotary the
//     rotated channels of the new k rows are compared with the fp64 rotation instead, to
//     within its rounding to the dtype plus fp32 arithmetic's error;
//   - out and LSE, over all sequences, within docs/DESIGN.md's rule against the oracle
//     (cpu_reference on fp64 copies) run per sequence on that sequence's rows [0, L_b) of
//     the expected cache and q (with rotary: q rotated in fp64 from the given tables and
//     rounded to the dtype, at the positions of docs/DESIGN.md's rule), with the yardstick
//     run on the same rows; a sequence with L_b = 0
//     must give out rows 0 and LSE -inf;
//   - every out and LSE element written, nothing around them, and the inputs unchanged.
#pragma once

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_check.h"
#include "test_util.h"

namespace flashlab::test {

struct KvCase {
  std::string name;
  DType dtype;
  int seqlen_q, heads_q, heads_kv;
  int capacity;             // rows per sequence: seqlen_cache, or max_pages·page_size
  int page_size;            // 0: contiguous cache
  std::vector<int> cached;  // cache_seqlens (batch = its size)
  int seqlen_new = 0;       // 0: no append
  bool permuted = false;    // contiguous: cache_batch_idx a permutation over batch + 1 rows
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  int head_dim = 32;
  int num_splits = 0;
  // NaN in every K and V row of the cache that no query of its sequence sees (left of the
  // first query's window): the output must not change (docs/DESIGN.md, non-finite values).
  bool nan_hidden = false;
  // >= 0: a NaN in one K element of that cache row of sequence 0, KV head 0, a key every query
  // of the sequence sees: their out rows and LSEs must be NaN (whichever split or warp met it),
  // every other row as the oracle says.
  int nan_visible = -1;
  // cache_leftpad (empty: none; contiguous caches): sequence b's keys start at row
  // leftpad[b]; the rows before them hold NaN, which must not reach the outputs.
  std::vector<int> leftpad = {};
  // Rotary (needs seqlen_new > 0): RoPE tables of capacity + seqlen_q rows and rotary_dim / 2
  // columns (row stride padded), pairs (2i, 2i + 1) when interleaved, else halves.
  int rotary_dim = 0;
  bool rotary_interleaved = true;
  // > 0: K cache row pos times 1 + (capacity − pos) / k_ramp, so that the scores grow toward
  // the cache's first rows. The split-KV ring reads a split's tiles from the last down, so a
  // row's running max keeps rising by more than the lazy rescale's threshold and O is
  // rescaled on later tiles, not only the first.
  int k_ramp = 0;
};

// The tensors of one case, on the host.
struct KvCall {
  HostTensor q, k_cache, v_cache, k_new, v_new, seqlens, batch_idx, block_table, leftpad, out, lse;
  HostTensor rotary_cos, rotary_sin;
  std::vector<double> workspace;

  // The call over the host tensors.
  KvCacheArgs args(std::string_view kernel) const;
  // The call over the tensors placed by `pl` (absent ones stay absent).
  KvCacheArgs args(std::string_view kernel, Placement& pl) const;
};

// Random inputs for case c; out and lse poisoned.
KvCall make_call(const KvCase& c, std::mt19937_64& rng);

// Runs case c with `kernel` on `pl`'s device and checks everything above.
void check_kvcache_case(std::string_view kernel, const KvCase& c, Placement& pl);

}  // namespace flashlab::test
