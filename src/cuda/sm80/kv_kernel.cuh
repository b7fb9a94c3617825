// cute_fa2's KV-cache forward (flash-decoding): attention of a few query rows against a long
// cache, where the work is reading K and V and the tensor cores idle. Two kernels on one
// stream:
//   split-KV  one CTA per (sequence, KV head, split of the keys, block of packed rows): the
//             softmax of its rows over its share of the keys, written as a partial O (fp32,
//             normalized) and its LSE; with one split, O and LSE directly. It also appends:
//             the new rows k_new/v_new go into the cache at cache_seqlens[b] (dealt over the
//             CTAs of their sequence and KV head, k rotated with rotary), and the CTAs that
//             attend to them read them from k_new/v_new; with rotary each CTA turns its q
//             rows and those new keys in shared memory once they have landed;
//   combine   the splits merged per row: LSE = log Σ_s e^LSE_s, O = Σ_s e^(LSE_s − LSE) O_s
//             (kv_partials.cuh; docs/learn/flash-decoding.md derives it).
// A call with no query rows runs kv_append.cuh's append kernel alone.
//
// GQA packing: the g = heads_q / heads_kv query heads that share a KV head are one CTA's rows,
// packed row r = i·g + j for query i and head j of the group, so K and V are read once per
// KV head instead of once per query head. A decode step (one query, GQA 32:8) is 4 rows of
// a 64-row block; the MMAs are 16x wider than needed, which costs nothing while the loads
// are the bound.
//
// Loads: a ring of (K, V) tiles in shared memory (KvConfig::kStages), filled by cp.async
// with one address per cache row; the tiles after the one in the MMAs are in flight while
// they run. A paged cache costs one block_table read per tile where pages hold whole tiles,
// else one per row of the thread's, shared by K and V and issued one tile ahead (right after
// the previous tile's copies). Every table value is clamped before use (common/params.h).
//
// The MMA side is the forward's (fwd_kernel.cuh): S = Q Kᵀ from shared memory (gemm_ss), the
// online softmax in exp2 units, P in registers as O += P V's A operand (gemm_pv).
#pragma once

#include <climits>

#include <cute/tensor.hpp>

#include "common/constants.h"
#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/cute_common.cuh"
#include "cuda/sm80/collective_common.cuh"
#include "cuda/sm80/fwd_mainloop.cuh"
#include "cuda/sm80/fwd_softmax.cuh"
#include "cuda/sm80/fwd_traits.h"
#include "cuda/sm80/kv_append.cuh"
#include "cuda/sm80/kv_copy.cuh"
#include "cuda/sm80/kv_instance.h"
#include "cuda/sm80/kv_partials.cuh"

namespace flashlab::sm80 {

using namespace cute;

// Tiles: 64 packed rows on 4 warps (16 rows each), 64 keys per tile (32 past head dim 128),
// and shared memory for Q plus a ring of kStages (K, V) tiles, so that kStages − 1 tiles are
// in flight while the MMAs read one:
//   hdim  BLK_N  stages  smem (Q + stages·(K + V))  CTAs/SM (H100)
//     64    64     3       8 + 48  = 56 KiB           3 (4 by smem; at 4 by registers, the
//                                                       64-row arrangement spilled 188 B)
//     96    64     3      12 + 72  = 84 KiB           2
//    128    64     3      16 + 96  = 112 KiB          2
//    192    32     2      24 + 48  = 72 KiB           2
//    256    32     2      32 + 64  = 96 KiB           2
template <DType kDtype, int kHeadDim>
struct KvConfig {
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = kHeadDim <= 128 ? 3 : 2;
  static constexpr int kMinBlocksPerSm = kHeadDim <= 64 ? 3 : 2;
  using Traits =
      FwdTraits<typename ElementFor<kDtype>::type, kHeadDim, 64, kBlockN, 4, kMinBlocksPerSm>;
  static constexpr int kSmemBytes = Traits::kSmemQBytes + kStages * 2 * Traits::kSmemKVBytes;
};

// ---- split-KV ----------------------------------------------------------------------------
// The mask on a tile of packed rows: s and coords are (rows, cols) views of the scores and
// of the tile's identity tensor; packed row r0 + r is query (r0 + r) / g.
template <class S, class C>
__device__ __forceinline__ void mask_packed(S& s, C const& coords, const MaskPolicy& mask, int r0,
                                            int g, int j0, int len_q, int len_k) {
  CUTE_UNROLL
  for (int r = 0; r < size<0>(s); ++r) {
    const int i = (r0 + get<0>(coords(r, 0))) / g;
    const int lo = mask.key_begin(i, len_q, len_k) - j0;
    const int hi = mask.key_end(i, len_q, len_k) - j0;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s); ++c) {
      const int j = get<1>(coords(r, c));
      if (j < lo || j >= hi) s(r, c) = -INFINITY;
    }
  }
}

// O's rows times rescale (OnlineSoftmax::rescale_o), as a branch the warp takes only when
// some row's max moved. Written as an if around the multiplies, the compiler predicates
// them (64 FMULs at head dim 128) and every tile issues them; a call is not predicated.
template <int N>
struct Floats {
  float v[N];
};
// o: an m16n8 accumulator's values in fragment order (4 per fragment, rows i and i + 8).
template <int N>
__device__ __noinline__ Floats<N> scale_fragments(Floats<N> o, float top, float bottom) {
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) o.v[i] *= (i % 4) < 2 ? top : bottom;
  return o;
}
// A row whose max was -inf before the tile (no key seen) has O = 0: the call is skipped for
// it, so the first tile costs none.
template <class Acc>
__device__ __forceinline__ void rescale_o_branch(Acc& acc, const float (&rescale)[2],
                                                 const float (&old_max)[2]) {
  static_assert(decltype(size<0>(acc))::value == 4 && decltype(size<1>(acc))::value == 1,
                "one m16n8 fragment row per warp");
  bool moved = false;
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) moved |= old_max[r] != -INFINITY && rescale[r] != 1.f;
  if (!__any_sync(0xffffffffu, moved)) return;
  constexpr int N = decltype(size(acc))::value;
  Floats<N> f;
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) f.v[i] = acc(i);
  f = scale_fragments<N>(f, rescale[0], rescale[1]);
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) acc(i) = f.v[i];
}

// grid (batch·heads_kv, splits, row blocks), Tr::kNThreads threads. Two ways to spread the
// MMAs over the 4 warps, picked at launch:
//   kKeysPerWarp = false: warp w owns packed rows [16w, 16w + 16) of the 64 and all keys of
//     a tile (the forward's arrangement); warps with no rows skip the math.
//   kKeysPerWarp = true, for blocks of at most 16 packed rows (a decode step): every warp
//     owns the 16 rows and a quarter of each tile's keys, with a softmax state of its own,
//     and the four (max, sum, O) are merged through shared memory at the end, as split-KV
//     merges splits. On an H200 a decode step's single math warp (the first arrangement)
//     kept the other warps waiting at the tile barrier for 42% of their cycles.
// kAppend: the call appends (k_new given). A call without is compiled without the append's
// code, which costs the paged loop registers and time. kRotary (appending only): the call
// turns q and the new keys. Apart too: as a run-time test, ptxas reloaded the rotary_cos
// pointer from the parameters at every step of the ring to test it, and a call without
// rotary carried the rotation's code.
// kSoftcap: the call caps its scores. Compiled apart, since a run-time test does not branch
// around softcap's tanh: the compiler predicates its 122 instructions (head dim 128), and
// every tile issued them with softcap off.
template <class Tr, int kStages, bool kKeysPerWarp, bool kAppend, bool kRotary, bool kSoftcap>
__global__ void __launch_bounds__(Tr::kNThreads, Tr::kMinBlocksPerSm)
    kv_kernel(const __grid_constant__ KvCacheParams p, int splits) {
  static_assert(kAppend || !kRotary, "rotary turns the new keys: appending only");
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kHeadDim = Tr::kHeadDim;
  constexpr int kWarps = Tr::kNWarps;
  static_assert(!kKeysPerWarp || kBlockN == 16 * kWarps, "16 keys per warp and tile");
  // Launched early (launch_after): nothing is read before the prior kernel (whatever wrote q,
  // the new rows and the cache) has ended; the combine may then be launched.
  cuda::wait_for_prior_grid();
  cuda::allow_dependents();

  const int b = blockIdx.x / p.heads_kv, hk = blockIdx.x % p.heads_kv, split = blockIdx.y;
  const int g = p.group, len_q = p.seqlen_q;
  const int r0 = blockIdx.z * kBlockM;                     // first packed row
  const int rows = min(kBlockM, len_q * g - r0);           // packed rows that exist
  const CacheSeq seq = cache_seq(p, b);
  const int len_k = seq.len;
  const MaskPolicy mask = p.mask;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const KvOut<Element> out{p, b, hk, split, splits};

  // ---- the append, fused: new row t goes to cache row c_b + t, written by one of the CTAs
  // of its (sequence, KV head), dealt round-robin. A CTA's first row is read into registers
  // before its first copies (with rotary, once they are issued) and written after its last
  // tile (HeldRow); any further rows (more new rows than CTAs) go the same way there, each
  // read then written. A CTA whose keys include new rows reads them from k_new/v_new instead
  // (rotated in shared memory), so no CTA of this grid reads a cache row that another writes.
  const bool append = kAppend && p.seqlen_new > 0;
  constexpr bool rotary = kRotary;
  // Tiles from n_fresh on hold new keys: the sequence's first c_b − s_b keys are the cache's.
  const int n_fresh = append ? (seq.cached - seq.start) / kBlockN : INT_MAX;
  const int writers = int(gridDim.y * gridDim.z), writer = int(blockIdx.z * gridDim.y + blockIdx.y);
  HeldRow<Element, kRotary> held;
  // With rotary and a ring of three stages or more, the held row and the rotary tables are
  // read right after the first tile's copies are issued (mainloop's step 0): at head dim 128,
  // batch 1, a 4k cache on an H200, that is 2% faster than reading them first, while the
  // appending kernel without rotary is 2.5% slower so (the two builds timed in alternating
  // processes, each against its own plain decode).
  // A two-stage ring turns Q right after its first tile's issue, so it reads them here.
  constexpr bool kReadLate = kRotary && kStages > 2;
  if (!kReadLate && append) {
    int w = writer;  // keys per warp: through an empty asm, so the held row's address
    if constexpr (kKeysPerWarp) asm volatile("" : "+r"(w));  // arithmetic stays in its branch
    held.read(p, seq, b, hk, w);
  }
  auto write_new_rows = [&] {
    if constexpr (kAppend) {
#pragma unroll 1
      for (int t = writer; t < p.seqlen_new; t += writers) {
        if (t != writer) held.read(p, seq, b, hk, t);
        held.write(p, seq, hk);
      }
    }
  };

  // The key tiles some row of this block sees, and this split's share of them.
  const int i_lo = r0 / g, i_hi = (r0 + rows - 1) / g + 1;
  const int kb = mask.block_key_begin(i_lo, i_hi, len_q, len_k);
  const int ke = mask.block_key_end(i_lo, i_hi, len_q, len_k);
  const int nb0 = kb / kBlockN, nb1 = ke > kb ? (ke + kBlockN - 1) / kBlockN : nb0;
  const int per_split = (nb1 - nb0 + splits - 1) / splits;
  const int n_begin = min(nb0 + split * per_split, nb1), n_end = min(n_begin + per_split, nb1);

  // ---- shared tensors: Q, then kStages stages of (K, V) ----
  extern __shared__ __align__(128) unsigned char smem[];
  Element* smem_q = reinterpret_cast<Element*>(smem);
  auto smem_k = [&](int st) {
    return reinterpret_cast<Element*>(smem + Tr::kSmemQBytes + st * 2 * Tr::kSmemKVBytes);
  };
  auto smem_v = [&](int st) { return smem_k(st) + Tr::kSmemKVBytes / int(sizeof(Element)); };
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQ{});  // (BLK_M, D)
  auto sK = [&](int st) { return make_tensor(make_smem_ptr(smem_k(st)), typename Tr::SmemLayoutKV{}); };
  auto sVt = [&](int st) { return make_tensor(make_smem_ptr(smem_v(st)), typename Tr::SmemLayoutVt{}); };

  // ---- global → shared: Q's packed rows and the cache's rows, one address per row ----
  typename Tr::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  // Q's rows: a block of at most 16 (kKeysPerWarp) loads 16 (or one pass of the copy's
  // threads, if more), not the tile's 64.
  constexpr int kCopyRows = Tr::kNThreads / Tr::kGmemThreadsPerRow;
  using QRows = Int<kKeysPerWarp ? (kCopyRows > 16 ? kCopyRows : 16) : kBlockM>;
  static_assert(QRows{} % kCopyRows == 0 && QRows{} <= kBlockM, "the copy's threads cover Q's rows");
  Tensor tQsQ = gmem_thr.partition_D(local_tile(sQ, Shape<QRows, HeadDim>{}, make_coord(0, 0)));
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<QRows, HeadDim>{}));  // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)
  const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride;
  const Element* k_cache = static_cast<const Element*>(p.k) + hk * p.k_head_stride;
  const Element* v_cache = static_cast<const Element*>(p.v) + hk * p.v_head_stride;
  // The new rows of this (sequence, KV head), row t at k_fresh + t·kn_row_stride (appending).
  // The keys-per-warp kernel computes them where it reads them, in load_kv (below).
  const Element* k_fresh = append ? static_cast<const Element*>(p.k_new) + b * p.kn_batch_stride + hk * p.kn_head_stride : nullptr;
  const Element* v_fresh = append ? static_cast<const Element*>(p.v_new) + b * p.vn_batch_stride + hk * p.vn_head_stride : nullptr;
  auto q_row = [&](int row, int) -> const Element* {
    if (row >= rows) return nullptr;
    const int pr = r0 + row;
    return q + (pr / g) * p.q_row_stride + (hk * g + pr % g) * p.q_head_stride;
  };
  // Tile n's rows from the cache into stage st. Where a page holds whole tiles, the tile's
  // rows are consecutive in one page: one table read per tile instead of one per row. Rows
  // that no query of the block sees ([kb, ke) is what they see) are zero-filled, not read:
  // the mask hides them anyway, and a NaN or Inf there would reach every row through the
  // MMA's 0 · NaN (docs/DESIGN.md, non-finite values).
  const bool tile_in_page = p.block_table == nullptr || p.page_size % kBlockN == 0;
  const bool pages_split_tile = !tile_in_page && kBlockN % p.page_size == 0 && (p.page_size & (p.page_size - 1)) == 0;
  constexpr int kRowsPerThread = decltype(size<1>(tKVcKV))::value;
  // A paged cache's table reads for tile n, the entries as written: where pages hold whole
  // tiles the page of its first row (tile_page), else the pages of this thread's rows (page[m];
  // rows outside [kb, ke) are not looked up). load_kv clamps them when it uses them.
  auto read_pages = [&](int n, int* page, int& tile_page) {
    if (p.block_table == nullptr) return;
    const int j0 = n * kBlockN, first = seq.start + j0;
    if (tile_in_page) {
      tile_page = page_entry(p, b, first);
      return;
    }
    CUTE_UNROLL
    for (int m = 0; m < kRowsPerThread; ++m) {
      const int row = get<0>(tKVcKV(0, m, 0)), key = j0 + row;
      page[m] = key >= kb && key < ke ? page_entry(p, b, first + row) : 0;
    }
  };
  // The ring goes down one tile at a time (n, then n − 1), and reads tile n − 1's table
  // entries right after issuing tile n's copies (the ring's step, below): their latency
  // passes during a tile's math instead of holding back the next tile's copies. load_kv(n)
  // finds tile n's entries in page_next/tile_page_next.
  int page_next[kRowsPerThread] = {}, tile_page_next = 0;
  auto load_kv = [&](int n, int st) {
    const int j0 = n * kBlockN;  // key j is cache row seq.start + j (paged: start 0)
    const int first = seq.start + j0;  // the tile's first cache row
    int page[kRowsPerThread], tile_page = tile_page_next;
    CUTE_UNROLL
    for (int m = 0; m < kRowsPerThread; ++m) page[m] = clamp_to(page_next[m], 0, p.cache_rows - 1);
    tile_page = clamp_to(tile_page, 0, p.cache_rows - 1);
    const int64_t k_base = tile_in_page ? row_offset(p, seq, tile_page, first, p.k_batch_stride, p.k_row_stride) : 0;
    const int64_t v_base = tile_in_page ? row_offset(p, seq, tile_page, first, p.v_batch_stride, p.v_row_stride) : 0;
    auto dst_k = gmem_thr.partition_D(sK(st));
    auto dst_v = gmem_thr.partition_D(make_tensor(make_smem_ptr(smem_v(st)), typename Tr::SmemLayoutKV{}));
    const bool fresh = n >= n_fresh;  // the tile holds new rows
    const bool all_seen = !fresh && j0 >= kb && j0 + kBlockN <= ke;
    if (tile_in_page && all_seen) {
      // Every tile but a sequence's first and last: all rows seen and in one page, so row r
      // is base + r·row_stride with no test per row.
      const Element* k_tile = k_cache + k_base;
      const Element* v_tile = v_cache + v_base;
      load_rows<true>(dst_k, tKVcKV, [&](int row, int) { return k_tile + row * p.k_row_stride; });
      load_rows<true>(dst_v, tKVcKV, [&](int row, int) { return v_tile + row * p.v_row_stride; });
    } else if (pages_split_tile && all_seen) {
      // Pages of 2^k rows that split the tile, all rows seen: no test per row, no modulo.
      const int mask_rows = p.page_size - 1;
      load_rows<true>(dst_k, tKVcKV, [&](int row, int m) {
        return k_cache + page[m] * p.k_batch_stride + int64_t(row & mask_rows) * p.k_row_stride;
      });
      load_rows<true>(dst_v, tKVcKV, [&](int row, int m) {
        return v_cache + page[m] * p.v_batch_stride + int64_t(row & mask_rows) * p.v_row_stride;
      });
    } else {  // a sequence's first or last tile, or pages of any size; new rows from k_new/v_new
      // The keys-per-warp kernel's new rows: b and hk pass through an empty asm, so that the
      // compiler cannot hoist this 64-bit arithmetic out of the branch into every CTA's start,
      // before its first copies (at batch 1 and a 4k cache on an H200, appending ran 0.6-0.9%
      // faster). The rows-per-warp kernels keep it at the start: there the move spilled 24-40
      // bytes at head dim 256.
      const Element* kf = nullptr;
      const Element* vf = nullptr;
      if constexpr (kKeysPerWarp) {
        if (append) {
          int bb = b, hh = hk;
          asm volatile("" : "+r"(bb), "+r"(hh));
          kf = static_cast<const Element*>(p.k_new) + bb * p.kn_batch_stride + hh * p.kn_head_stride;
          vf = static_cast<const Element*>(p.v_new) + bb * p.vn_batch_stride + hh * p.vn_head_stride;
        }
      } else {
        kf = k_fresh, vf = v_fresh;
      }
      // Row `row` of the cache (base, strides) or, appending, new row t from `fresh`.
      auto row_of = [&](const Element* cache, int64_t base, int64_t batch_stride, int64_t row_stride,
                        const Element* fresh, int64_t fresh_row_stride) {
        return [=, &p, &page](int row, int m) -> const Element* {
          const int key = j0 + row;
          if (key < kb || key >= ke) return nullptr;
          if (append && first + row >= seq.cached) return fresh + (first + row - seq.cached) * fresh_row_stride;
          return cache + (tile_in_page ? base + row * row_stride
                                       : page[m] * batch_stride + int64_t((first + row) % p.page_size) * row_stride);
        };
      };
      load_rows(dst_k, tKVcKV, row_of(k_cache, k_base, p.k_batch_stride, p.k_row_stride, kf, p.kn_row_stride));
      load_rows(dst_v, tKVcKV, row_of(v_cache, v_base, p.v_batch_stride, p.v_row_stride, vf, p.vn_row_stride));
    }
  };

  // ---- rotary: q's rows and the new keys turned in shared memory ----
  // The block turns each pair in place: q's row of query i at c_b + i (rotary_per_query) or
  // c_b, a new key (from k_new) at its cache row c_b + t, as HeldRow turns the cache's copy.
  // Thread t turns pair t % (D/2) of rows t / (D/2), t / (D/2) + kRowsPerPass, ...: the rows
  // spread over every warp (a decode step's 4 rows of q are 2 per thread at head dim 128),
  // and no thread divides by a run-time value to find its pairs. Q's rows come in a cp.async
  // group of their own and are turned as soon as they land, while the ring's first tiles are
  // still in flight; a tile's new keys are turned at its turn in the ring. The tables of the
  // thread's first q row and (in the one split whose first tile holds new keys) of its first
  // kRotaryAhead new keys of that tile are read right after the ring's first copies are
  // issued (before them in a two-stage ring) and kept unconverted until used.
  constexpr int kRotaryAhead = 2;
  constexpr int kPairSlots = kHeadDim / 2, kRowsPerPass = Tr::kNThreads / kPairSlots;
  static_assert(kRowsPerPass >= 1, "a thread for each pair of a row");
  const int half = p.rotary_dim / 2, c_mine = tid % kPairSlots, r_mine = tid / kPairSlots;
  const bool turns = c_mine < half && r_mine < kRowsPerPass;  // this thread turns pairs
  auto fresh_rows = [&](int n, int& lo, int& hi) {  // tile n's new keys to turn: rows [lo, hi)
    const int first = seq.start + n * kBlockN;
    lo = max(0, seq.cached - first), hi = min(kBlockN, seq.cached + p.seqlen_new - first);
    if (!rotary || lo >= hi) lo = hi = 0;  // a tile below n_fresh gives lo ≥ kBlockN ≥ hi
    return lo < hi;
  };
  auto table = [&](int pos, Element& cs, Element& sn) {  // pair c_mine's at position pos
    const int64_t row = clamp_to(pos, 0, p.seqlen_ro - 1);
    cs = static_cast<const Element*>(p.rotary_cos)[row * p.rotary_cos_stride + c_mine];
    sn = static_cast<const Element*>(p.rotary_sin)[row * p.rotary_sin_stride + c_mine];
  };
  auto turn = [&](auto&& m, int row, Element cs, Element sn) {  // pair c_mine of m's row
    const int ia = p.rotary_interleaved ? 2 * c_mine : c_mine, ib = p.rotary_interleaved ? 2 * c_mine + 1 : c_mine + half;
    rotate_pair(m(row, ia), m(row, ib), Element(m(row, ia)), Element(m(row, ib)), float(cs), float(sn));
  };
  auto q_pos = [&](int row) { return seq.cached + (p.rotary_per_query ? (r0 + row) / g : 0); };
  auto key_pos = [&](int n, int row) { return seq.start + n * kBlockN + row; };
  Element q_cs = Element(0), q_sn = Element(0), k_cs[kRotaryAhead], k_sn[kRotaryAhead];
  auto rotate_q = [&] {  // q's rows, by the block
    if (!turns) return;
    for (int row = r_mine; row < rows; row += kRowsPerPass) {
      Element cs = q_cs, sn = q_sn;
      if (p.rotary_per_query && row != r_mine) table(q_pos(row), cs, sn);
      turn(sQ, row, cs, sn);
    }
  };
  // Tile n's new keys [lo, hi) in stage st, by the block; `first`: the ring's first tile
  // (tables read ahead).
  auto rotate_keys = [&](int n, int st, int lo, int hi, bool first) {
    if (!turns) return;
    for (int row = lo + r_mine, i = 0; row < hi; row += kRowsPerPass, ++i) {
      Element cs = Element(0), sn = Element(0);
      if (first && i < kRotaryAhead) {
        CUTE_UNROLL
        for (int j = 0; j < kRotaryAhead; ++j)
          if (j == i) cs = k_cs[j], sn = k_sn[j];
      } else {
        table(key_pos(n, row), cs, sn);
      }
      turn(sK(st), row, cs, sn);
    }
  };

  // ---- the ring: tile n in the MMAs (math(n, st)) while the next kStages − 1 tiles load ----
  // Step j issues tile n_end − 1 − j (a cp.async group per step, empty past n_begin; Q goes
  // in group 0, or with rotary in a group before it) and, from step kStages − 1 on, computes
  // the tile issued kStages − 1 steps before. One loop for the ring's filling and its steady
  // state: one copy of load_kv's code, which matters in a kernel whose loads saturate the
  // memory: a warp that misses in the instruction cache waits behind them; the appending
  // kernel's code past its first 64 KiB missed the instruction cache on every pass
  // (docs/learn/flash-decoding.md, "One loop for the ring"). A split with no tile runs the
  // ring's first steps with no copies, then writes its held row like any other.
  auto mainloop = [&](auto&& math) {
    const bool any = n_end > n_begin;
    // The rotary tables of the thread's first q row and of the first tile's first new keys, if any.
    // With kReadLate they are read, with the held row, right after the first tile's copies
    // are issued (the step j = 0 below): everything before those copies delays every tile of
    // the split, and in the compiled head-dim-128 kernels the first copy was instruction 328
    // of the plain kernel and 483 and 646 of the appending ones when these reads came first.
    auto read_tables = [&] {
      if (any && rotary && turns) {
        int lo = 0, hi = 0;
        table(q_pos(r_mine), q_cs, q_sn);
        // Only the split whose first tile holds new keys reads their tables. lo and hi pass
        // through an empty asm so that the compiler cannot hoist the tables' address
        // arithmetic out of the branch into every CTA (it did: 52 instructions before the
        // ring in each CTA of the head-dim-128 kernel, for loads predicated off).
        if (fresh_rows(n_end - 1, lo, hi)) {
          asm volatile("" : "+r"(lo), "+r"(hi));
          CUTE_UNROLL
          for (int j = 0; j < kRotaryAhead; ++j) {
            const int row = lo + r_mine + j * kRowsPerPass;
            if (row < hi) table(key_pos(n_end - 1, row), k_cs[j], k_sn[j]);
          }
        }
      }
    };
    if (!kReadLate) read_tables();
    if (any) load_rows(tQsQ, tQcQ, q_row);
    if (any && rotary) cp_async_fence();  // Q's own group
    int st_load = 0, st = 0;
    const int steps = max(n_end - n_begin, 0) + kStages - 1;
#pragma unroll 1
    for (int j = -1; j < steps; ++j) {  // step −1 reads the first tile's table entries
      const int n = n_end - 1 - (j - (kStages - 1));  // the tile computed at this step
      if (j >= kStages - 1) {
        cp_async_wait<kStages - 2>();  // tile n (and Q) have landed ...
        __syncthreads();  // ... for every thread, and every warp is done with the previous stage
      }
      const int n_load = n_end - 1 - j;  // the tile issued at this step
      if (j >= 0 && n_load >= n_begin) load_kv(n_load, st_load);
      if (n_load - 1 >= n_begin) read_pages(n_load - 1, page_next, tile_page_next);
      if (j < 0) continue;
      cp_async_fence();
      st_load = st_load + 1 == kStages ? 0 : st_load + 1;
      if (kReadLate && j == 0) {  // the held row and the tables, behind the first tile's copies
        if (append) {
          // writer through an empty asm, for the same reason: the held row's address
          // arithmetic then stays in the CTAs that hold a row. With both, a warp of the
          // head-dim-128 rotary kernel executes 49 fewer instructions at batch 1, 4k (2,884),
          // and the append with rotary reads 1% faster there (flash-decoding.md, section 7).
          int w = writer;
          asm volatile("" : "+r"(w));
          held.read(p, seq, b, hk, w);
        }
        read_tables();
      }
      if (j == kStages - 2 && any && rotary) {  // the ring's first tiles issued: Q turned meanwhile
        cp_async_wait<kStages - 1>();  // Q's group has landed ...
        __syncthreads();  // ... for every thread (the first compute step's barrier publishes the turn)
        rotate_q();
      }
      if (j < kStages - 1) continue;
      int lo, hi;
      if (rotary && fresh_rows(n, lo, hi)) {  // the same answer in every thread
        rotate_keys(n, st, lo, hi, n == n_end - 1);
        __syncthreads();
      }
      math(n, st);
      st = st + 1 == kStages ? 0 : st + 1;
    }
  };

  const float scale_log2 = kSoftcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = kSoftcap ? p.scale / mask.softcap : 0.f;

  // ---- the math: S = Q Kᵀ, mask, online softmax, O += P V on one tile's keys ----
  //   mma: the TiledMma of the arrangement (one warp's, or the four warps'); q_view, k_view,
  //   vt_view: what it reads of Q and of stage st's K and Vᵀ; keys0: the first key of this
  //   warp's view in the tile.
  using MmaOne = TiledMmaOf<Element, 1, 1>;  // kKeysPerWarp: one warp, 16 rows
  using Mma = std::conditional_t<kKeysPerWarp, MmaOne, typename Tr::TiledMma>;
  using RowsM = std::conditional_t<kKeysPerWarp, _16, BlkM>;
  using KeysN = std::conditional_t<kKeysPerWarp, _16, BlkN>;
  Mma mma;
  auto thr_mma = mma.get_thread_slice(kKeysPerWarp ? lane : tid);
  const int me = kKeysPerWarp ? lane : tid;
  auto q_view = [&] {
    if constexpr (kKeysPerWarp) return local_tile(sQ, Shape<_16, HeadDim>{}, make_coord(0, 0));
    else return sQ;
  };
  auto k_view = [&](int st) {  // this warp's keys of stage st: (KeysN, D)
    if constexpr (kKeysPerWarp) return local_tile(sK(st), Shape<_16, HeadDim>{}, make_coord(warp, 0));
    else return sK(st);
  };
  auto vt_view = [&](int st) {  // (D, KeysN)
    if constexpr (kKeysPerWarp) return local_tile(sVt(st), Shape<HeadDim, _16>{}, make_coord(0, warp));
    else return sVt(st);
  };
  const int keys0 = kKeysPerWarp ? 16 * warp : 0;
  Tensor tSrQ = thr_mma.partition_fragment_A(q_view());                  // (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_mma.partition_fragment_B(k_view(0));                 // (MMA, MMA_N, MMA_D)
  Tensor tOrVt = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem_v(0)), make_layout(Shape<HeadDim, KeysN>{})));  // (MMA, MMA_D, MMA_N)
  Tensor acc_o = partition_fragment_C(mma, Shape<RowsM, HeadDim>{});      // (MMA, MMA_M, MMA_D)
  clear(acc_o);
  auto smem_copy_q = make_tiled_copy_A(typename Tr::SmemCopyAtomQK{}, mma);
  auto smem_copy_k = make_tiled_copy_B(typename Tr::SmemCopyAtomQK{}, mma);
  auto smem_copy_v = make_tiled_copy_B(typename Tr::SmemCopyAtomVt{}, mma);
  Tensor tSsQ = smem_copy_q.get_thread_slice(me).partition_S(q_view());  // (CPY, CPY_M, CPY_D)
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<RowsM, KeysN>{}));  // (MMA, MMA_M, MMA_N)
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));         // (rows, cols)
  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax;
  // A warp whose rows are all past the block's packed rows (a decode step's 4 rows in the
  // 64-row arrangement) loads its share of every tile and skips the math.
  const bool warp_has_rows = kKeysPerWarp || warp * 16 < rows;

  mainloop([&](int n, int st) {
    if (!warp_has_rows) return;
    const int j0 = n * kBlockN + keys0;
    Tensor acc_s = partition_fragment_C(mma, Shape<RowsM, KeysN>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);
    Tensor tSsK = smem_copy_k.get_thread_slice(me).partition_S(k_view(st));  // (CPY, CPY_N, CPY_D)
    gemm_ss(mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, smem_copy_q, smem_copy_k);

    Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
    if constexpr (kSoftcap) softcap_scores(s, softcap_pre);
    if (j0 + KeysN{} > len_k || !mask.tile_is_full(i_lo, i_hi, j0, j0 + KeysN{}, len_q, len_k))
      mask_packed(s, tScS_rc, mask, r0, g, j0, len_q, len_k);

    float rescale[kRows], old_max[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) old_max[r] = softmax.row_max[r];
    softmax.update(s, scale_log2, rescale);
    rescale_o_branch(acc_o, rescale, old_max);
    Tensor tOsVt = smem_copy_v.get_thread_slice(me).partition_S(vt_view(st));  // (CPY, CPY_D, CPY_N)
    gemm_pv<Element>(mma, acc_o, acc_s, tOrVt, tOsVt, smem_copy_v);
  });
  write_new_rows();  // the held row's loads landed long ago: its stores leave without a wait

  // ---- epilogue: normalized O and LSE per packed row ----
  Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
  float lse[kRows];
  softmax.finish(o, scale_log2, 1.f, lse);
  // A NaN or +Inf among the row's visible scores (in q or a visible key) leaves ℓ NaN: finish
  // writes O = NaN (every column) and LSE = −inf, which the merges below would weigh 0 like
  // a part that saw no key. Its LSE becomes NaN, so that the merges pass the NaN on.
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r)
    if (lse[r] == -INFINITY && o(r, 0) != o(r, 0)) lse[r] = NAN;
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<RowsM, HeadDim>{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));  // (rows, cols)
  if constexpr (!kKeysPerWarp) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(tOcO_rc(r, 0));
      if (row >= rows) continue;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); c += 2) out.o2(r0 + row, get<1>(tOcO_rc(r, c)), o(r, c), o(r, c + 1));
      if (get<1>(tOcO_rc(r, 0)) == 0) out.lse(r0 + row, lse[r]);
    }
  } else {
    // The warps' (LSE, O) through shared memory (the ring's bytes, then merged like splits:
    // LSE = log Σ_w e^LSE_w, O = Σ_w e^(LSE_w − LSE) O_w, a warp that saw no key left out.
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring
    float* part_o = reinterpret_cast<float*>(smem_k(0));  // [warp][16][D]
    float* part_lse = reinterpret_cast<float*>(smem_q);   // [warp][16]
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(tOcO_rc(r, 0));
      if (row >= rows) continue;  // the merge reads the block's rows only
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) part_o[(warp * 16 + row) * kHeadDim + get<1>(tOcO_rc(r, c))] = o(r, c);
      if (get<1>(tOcO_rc(r, 0)) == 0) part_lse[warp * 16 + row] = lse[r];
    }
    __syncthreads();
    // Warp w's weight is e^(LSE_w − LSE) = e^(LSE_w − m) / Σ_w' e^(LSE_w' − m): one
    // exponential a warp, and the log only where the LSE is written.
    for (int e = 2 * tid; e < rows * kHeadDim; e += 2 * Tr::kNThreads) {
      const int row = e / kHeadDim, col = e % kHeadDim;
      float l[kWarps], x[kWarps], m = -INFINITY, sum = 0.f;
      bool nan = false;  // a warp's part saw a NaN: so does the row
      CUTE_UNROLL
      for (int w = 0; w < kWarps; ++w) {
        m = fmaxf(m, l[w] = part_lse[w * 16 + row]);
        nan |= l[w] != l[w];
      }
      CUTE_UNROLL
      for (int w = 0; w < kWarps; ++w) sum += x[w] = part_exp(l[w], m);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      float v0 = 0.f, v1 = 0.f;
      CUTE_UNROLL
      for (int w = 0; w < kWarps; ++w) {
        if (l[w] == -INFINITY) continue;
        const float weight = x[w] * inv;
        v0 += weight * part_o[(w * 16 + row) * kHeadDim + col];
        v1 += weight * part_o[(w * 16 + row) * kHeadDim + col + 1];
      }
      if (nan) v0 = v1 = NAN;
      out.o2(r0 + row, col, v0, v1);
      if (col == 0) out.lse(r0 + row, nan ? NAN : merged_lse(m, sum));
    }
  }
}

// ---- launch ------------------------------------------------------------------------------
// The kernel for p: keys spread over the warps where a block has at most 16 packed rows
// and a tile has 16 keys per warp (head dims up to 128), else rows spread over them; the
// appending kernel where p appends (with or without rotary), the capping one where p has
// softcap: 12 instantiations per dtype at head dims up to 128, 6 past it (rows per warp only).
template <DType kDtype, int kHeadDim, bool kAppend, bool kRotary, bool kSoftcap>
const void* kv_kernel_of(const KvCacheParams& p) {
  using Config = KvConfig<kDtype, kHeadDim>;
  using Tr = typename Config::Traits;
  if constexpr (Tr::kBlockN == 16 * Tr::kNWarps) {
    if (KvInstance<kDtype, kHeadDim>::keys_per_warp(p))
      return reinterpret_cast<const void*>(kv_kernel<Tr, Config::kStages, true, kAppend, kRotary, kSoftcap>);
  }
  return reinterpret_cast<const void*>(kv_kernel<Tr, Config::kStages, false, kAppend, kRotary, kSoftcap>);
}
template <DType kDtype, int kHeadDim, bool kAppend, bool kRotary>
const void* kv_kernel_capped(const KvCacheParams& p) {
  return p.mask.softcap > 0.f ? kv_kernel_of<kDtype, kHeadDim, kAppend, kRotary, true>(p)
                              : kv_kernel_of<kDtype, kHeadDim, kAppend, kRotary, false>(p);
}
template <DType kDtype, int kHeadDim>
const void* kv_kernel_for(const KvCacheParams& p) {
  if (p.k_new == nullptr || p.seqlen_new <= 0) return kv_kernel_capped<kDtype, kHeadDim, false, false>(p);
  return p.rotary_cos != nullptr ? kv_kernel_capped<kDtype, kHeadDim, true, true>(p)
                                 : kv_kernel_capped<kDtype, kHeadDim, true, false>(p);
}

template <DType kDtype, int kHeadDim>
Status KvInstance<kDtype, kHeadDim>::run(const KvCacheParams& p, int splits) {
  using Config = KvConfig<kDtype, kHeadDim>;
  using Tr = typename Config::Traits;
  using Element = typename Tr::Element;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  // Where the device runs sm_90 code for these kernels (one translation unit, one set of
  // archs), every kernel of the call is launched early (launch_after): each is resident and
  // waiting when the kernel before it ends.
  const void* combine = reinterpret_cast<const void*>(kv_combine_kernel<Element, kHeadDim>);
  const bool early = cuda::has_dependent_launch(combine);
  // The split-KV kernel appends itself (see kv_kernel); a call with no query rows appends
  // through the append kernel alone.
  const int row_blocks = int(kv_row_blocks(p, Tr::kBlockM));
  if (row_blocks == 0 && p.k_new != nullptr && p.seqlen_new > 0) {
    KvCacheParams ap = p;
    void* append_args[] = {&ap};
    FL_CUDA_CHECK(cuda::launch_after(reinterpret_cast<const void*>(kv_append_kernel<Element>),
                                     dim3(p.seqlen_new, p.heads_kv, p.batch), dim3(128), 0,
                                     stream, append_args, early));
  }
  // The API runs a call with no query rows only for its append (src/api/dispatch.cpp's
  // nothing_to_write): then the append is the whole call.
  if (row_blocks == 0) return {};
  KvCacheParams a = p;
  const void* kernel = kv_kernel_for<kDtype, kHeadDim>(a);
  if (Config::kSmemBytes > 48 * 1024)
    FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Config::kSmemBytes));
  void* args[] = {&a, &splits};
  FL_CUDA_CHECK(cuda::launch_after(kernel, dim3(p.batch * p.heads_kv, splits, row_blocks),
                                   dim3(Tr::kNThreads), size_t(Config::kSmemBytes), stream, args,
                                   early));
  if (splits > 1)
    FL_CUDA_CHECK(cuda::launch_after(combine, dim3(unsigned(kv_rows_all(p))), dim3(kHeadDim), 0,
                                     stream, args, early));
  return {};
}
template <DType kDtype, int kHeadDim>
const void* KvInstance<kDtype, kHeadDim>::kernel(const KvCacheParams& p) { return kv_kernel_for<kDtype, kHeadDim>(p); }
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::smem_bytes() { return KvConfig<kDtype, kHeadDim>::kSmemBytes; }
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::block_m() { return KvConfig<kDtype, kHeadDim>::Traits::kBlockM; }
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::block_n() { return KvConfig<kDtype, kHeadDim>::Traits::kBlockN; }
template <DType kDtype, int kHeadDim>
bool KvInstance<kDtype, kHeadDim>::keys_per_warp(const KvCacheParams& p) {
  using Tr = typename KvConfig<kDtype, kHeadDim>::Traits;
  return Tr::kBlockN == 16 * Tr::kNWarps && kv_row_blocks(p, 16) <= 1;
}
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::bytes_in_flight() {
  using Config = KvConfig<kDtype, kHeadDim>;
  return (Config::kStages - 1) * 2 * Config::Traits::kSmemKVBytes;
}

}  // namespace flashlab::sm80
