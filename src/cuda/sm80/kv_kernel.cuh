// cute_fa2's KV-cache forward (flash-decoding): attention of a few query rows against a long
// cache, where the work is reading K and V and the tensor cores idle. Three kernels on one
// stream:
//   append    the new rows k_new/v_new written into the cache at cache_seqlens[b], with
//             rotary k_new and q rotated on the way (kv_append.cuh);
//   split-KV  one CTA per (sequence, KV head, split of the keys, block of packed rows): the
//             softmax of its rows over its share of the keys, written as a partial O (fp32,
//             normalized) and its LSE; with one split, O and LSE directly;
//   combine   the splits merged per row: LSE = log Σ_s e^LSE_s, O = Σ_s e^(LSE_s − LSE) O_s
//             (docs/learn/flash-decoding.md derives it).
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
// else one per row of the thread's, all issued before its first copy and shared by K and V.
// Every table value is clamped before use (KvCacheParams, common/params.h).
//
// The MMA side is the forward's (fwd_kernel.cuh): S = Q Kᵀ from shared memory (gemm_ss), the
// online softmax in exp2 units, P in registers as O += P V's A operand (gemm_pv).
#pragma once

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
#include "cuda/sm80/kv_instance.h"

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
// cp.async of one 16-byte chunk, global → shared, cached in L2 only.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem));
}

// The rows of a tile, global → shared: dst (CPY, CPY_ROWS, CPY_COLS) is this thread's
// partition of the smem tile and coord the same partition of the tile's identity tensor;
// row_ptr(row, m) gives the first element in global memory of the tile's row `row`, the
// thread's m-th, or nullptr for a row past the data, which is zero-filled (zeros, not
// garbage, so that P·V never meets 0·NaN). kAllRows: the caller knows every row is there,
// and the copies go without a test (and without the zero stores' predicated-off issue slots).
template <bool kAllRows = false, class Dst, class Coord, class RowPtr>
__device__ __forceinline__ void load_rows(Dst&& dst, Coord const& coord, RowPtr const& row_ptr) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const auto* src = row_ptr(get<0>(coord(0, m, 0)), m);
    CUTE_UNROLL
    for (int d = 0; d < size<2>(dst); ++d) {
      void* chunk = &dst(0, m, d);
      if (kAllRows || src != nullptr)
        cp_async_16(chunk, src + get<1>(coord(0, m, d)));
      else
        *static_cast<uint4*>(chunk) = make_uint4(0, 0, 0, 0);
    }
  }
}

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

// The partials of split-KV (workspace): O [splits, rows_all, head_dim_v] and LSE
// [splits, rows_all], rows_all = batch·heads_q·seqlen_q, row (b, h, i) at (b·heads_q + h)·seqlen_q + i.
__host__ __device__ __forceinline__ int64_t kv_rows_all(const KvCacheParams& p) {
  return int64_t(p.batch) * p.heads_q * p.seqlen_q;
}
__host__ __device__ __forceinline__ float* kv_lse_partial(const KvCacheParams& p, int splits) {
  return static_cast<float*>(p.workspace) + splits * kv_rows_all(p) * p.head_dim_v;
}

// The merge of partial softmaxes of one row (split-KV's splits, or one CTA's warps), each a
// normalized O_s with its LSE_s: LSE = log Σ_s e^LSE_s, O = Σ_s e^(LSE_s − LSE) O_s, taken
// about the parts' max m. A part that saw no key has LSE_s = −inf: it weighs 0 and its O is
// not read; if no part saw a key, LSE = −inf and O = 0.
__device__ __forceinline__ float part_exp(float lse_s, float m) {  // e^(LSE_s − m)
  return m == -INFINITY ? 0.f : __expf(lse_s - m);
}
__device__ __forceinline__ float merged_lse(float m, float sum) {  // m + log Σ_s e^(LSE_s − m)
  return sum > 0.f ? m + __logf(sum) : -INFINITY;
}

// Where a CTA's results go: packed row pr of (sequence b, KV head hk) is query pr / g of
// head hk·g + pr % g; with one split its normalized O goes to out and its LSE to lse, else
// both to this split's partials.
template <class Element>
struct KvOut {
  const KvCacheParams& p;
  int b, hk, split, splits;

  // Packed row pr's query i and query head h.
  __device__ __forceinline__ int2 coords(int pr) const {
    return make_int2(pr / p.group, hk * p.group + pr % p.group);
  }
  __device__ __forceinline__ int64_t partial_row(int pr) const {
    const int2 ih = coords(pr);
    return split * kv_rows_all(p) + (int64_t(b) * p.heads_q + ih.y) * p.seqlen_q + ih.x;
  }
  // Columns col and col + 1 of packed row pr.
  __device__ __forceinline__ void o2(int pr, int col, float v0, float v1) const {
    if (splits > 1) {
      float* o = static_cast<float*>(p.workspace) + partial_row(pr) * p.head_dim_v + col;
      *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
      return;
    }
    const int2 ih = coords(pr);
    Element* o = static_cast<Element*>(p.out) + b * p.o_batch_stride + ih.x * p.o_row_stride +
                 ih.y * p.o_head_stride + col;
    o[0] = Element(v0), o[1] = Element(v1);
  }
  __device__ __forceinline__ void lse(int pr, float v) const {
    if (splits > 1) {
      kv_lse_partial(p, splits)[partial_row(pr)] = v;
    } else if (p.lse != nullptr) {
      const int2 ih = coords(pr);
      p.lse[b * p.lse_batch_stride + ih.y * p.lse_head_stride + ih.x] = v;
    }
  }
};

// grid (batch·heads_kv, splits, row blocks), Tr::kNThreads threads. Two ways to spread the
// MMAs over the 4 warps, picked at launch:
//   kKeysPerWarp = false: warp w owns packed rows [16w, 16w + 16) of the 64 and all keys of
//     a tile (the forward's arrangement); warps with no rows skip the math.
//   kKeysPerWarp = true, for blocks of at most 16 packed rows (a decode step): every warp
//     owns the 16 rows and a quarter of each tile's keys, with a softmax state of its own,
//     and the four (max, sum, O) are merged through shared memory at the end, as split-KV
//     merges splits. On an H200 a decode step's single math warp (the first arrangement)
//     kept the other warps waiting at the tile barrier for 42% of their cycles.
template <class Tr, int kStages, bool kKeysPerWarp>
__global__ void __launch_bounds__(Tr::kNThreads, Tr::kMinBlocksPerSm)
    kv_kernel(const __grid_constant__ KvCacheParams p, int splits) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kHeadDim = Tr::kHeadDim;
  constexpr int kWarps = Tr::kNWarps;
  static_assert(!kKeysPerWarp || kBlockN == 16 * kWarps, "16 keys per warp and tile");
  // Launched early (launch_after): nothing is read before the prior kernel (the append, or
  // whatever wrote q and the cache) has ended; the combine may then be launched.
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
  Tensor tQsQ = gmem_thr.partition_D(sQ);                                                // (CPY, CPY_M, CPY_D)
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<BlkM, HeadDim>{}));     // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)
  const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride;
  const Element* k_cache = static_cast<const Element*>(p.k) + hk * p.k_head_stride;
  const Element* v_cache = static_cast<const Element*>(p.v) + hk * p.v_head_stride;
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
  constexpr int kRowsPerThread = decltype(size<1>(tKVcKV))::value;
  auto load_kv = [&](int n, int st) {
    const int j0 = n * kBlockN;  // key j is cache row seq.start + j (paged: start 0)
    const int first = seq.start + j0;  // the tile's first cache row
    const int64_t k_base = tile_in_page ? cache_offset(p, seq, b, first, p.k_batch_stride, p.k_row_stride) : 0;
    const int64_t v_base = tile_in_page ? cache_offset(p, seq, b, first, p.v_batch_stride, p.v_row_stride) : 0;
    // Pages smaller than a tile: the pages of this thread's rows, all looked up before the
    // first copy is issued (one table latency per tile, not one per row), for K and V alike.
    int page[kRowsPerThread] = {};
    if (!tile_in_page) {
      CUTE_UNROLL
      for (int m = 0; m < kRowsPerThread; ++m) {
        const int row = get<0>(tKVcKV(0, m, 0)), key = j0 + row;
        if (key >= kb && key < ke) page[m] = int(page_of(p, b, first + row));
      }
    }
    auto row_of = [&](const Element* cache, int64_t base, int64_t batch_stride, int64_t row_stride) {
      return [=, &p, &page](int row, int m) -> const Element* {
        const int key = j0 + row;
        if (key < kb || key >= ke) return nullptr;
        return cache + (tile_in_page ? base + row * row_stride
                                     : page[m] * batch_stride + int64_t((first + row) % p.page_size) * row_stride);
      };
    };
    auto dst_k = gmem_thr.partition_D(sK(st));
    auto dst_v = gmem_thr.partition_D(make_tensor(make_smem_ptr(smem_v(st)), typename Tr::SmemLayoutKV{}));
    // Every tile but a sequence's first and last: all rows seen and in one page, so row r is
    // base + r·row_stride with no test per row.
    if (tile_in_page && j0 >= kb && j0 + kBlockN <= ke) {
      const Element* k_tile = k_cache + k_base;
      const Element* v_tile = v_cache + v_base;
      load_rows<true>(dst_k, tKVcKV, [&](int row, int) { return k_tile + row * p.k_row_stride; });
      load_rows<true>(dst_v, tKVcKV, [&](int row, int) { return v_tile + row * p.v_row_stride; });
      return;
    }
    load_rows(dst_k, tKVcKV, row_of(k_cache, k_base, p.k_batch_stride, p.k_row_stride));
    load_rows(dst_v, tKVcKV, row_of(v_cache, v_base, p.v_batch_stride, p.v_row_stride));
  };

  // ---- the ring: tile n in the MMAs (math(n, st)) while the next kStages − 1 tiles load ----
  // Prologue: Q and the first kStages − 1 tiles, one cp.async group each (empty groups
  // where the split has fewer tiles), so that group i holds tile n_end − 1 − i.
  auto mainloop = [&](auto&& math) {
    if (n_end > n_begin) load_rows(tQsQ, tQcQ, q_row);
    CUTE_UNROLL
    for (int i = 0; i < kStages - 1; ++i) {
      if (n_end - 1 - i >= n_begin) load_kv(n_end - 1 - i, i);
      cp_async_fence();
    }
    int st = 0;
    for (int n = n_end - 1; n >= n_begin; --n) {
      cp_async_wait<kStages - 2>();  // tile n (and Q) have landed ...
      __syncthreads();  // ... for every thread, and every warp is done with the previous stage
      const int ahead = n - (kStages - 1);
      if (ahead >= n_begin) load_kv(ahead, st == 0 ? kStages - 1 : st - 1);
      cp_async_fence();
      math(n, st);
      st = st + 1 == kStages ? 0 : st + 1;
    }
  };

  const bool softcap = mask.softcap > 0.f;
  const float scale_log2 = softcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = softcap ? p.scale / mask.softcap : 0.f;

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
    if (softcap) softcap_scores(s, softcap_pre);
    if (j0 + KeysN{} > len_k || !mask.tile_is_full(i_lo, i_hi, j0, j0 + KeysN{}, len_q, len_k))
      mask_packed(s, tScS_rc, mask, r0, g, j0, len_q, len_k);

    Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
    float rescale[kRows];
    softmax.update(s, scale_log2, rescale);
    OnlineSoftmax<kRows>::rescale_o(o, rescale);
    Tensor tOsVt = smem_copy_v.get_thread_slice(me).partition_S(vt_view(st));  // (CPY, CPY_D, CPY_N)
    gemm_pv<Element>(mma, acc_o, acc_s, tOrVt, tOsVt, smem_copy_v);
  });

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
    for (int e = 2 * tid; e < rows * kHeadDim; e += 2 * Tr::kNThreads) {
      const int row = e / kHeadDim, col = e % kHeadDim;
      float l[kWarps], m = -INFINITY;
      bool nan = false;  // a warp's part saw a NaN: so does the row
      CUTE_UNROLL
      for (int w = 0; w < kWarps; ++w) {
        m = fmaxf(m, l[w] = part_lse[w * 16 + row]);
        nan |= l[w] != l[w];
      }
      float sum = 0.f;
      CUTE_UNROLL
      for (int w = 0; w < kWarps; ++w) sum += part_exp(l[w], m);
      const float all = nan ? NAN : merged_lse(m, sum);
      float v0 = 0.f, v1 = 0.f;
      CUTE_UNROLL
      for (int w = 0; w < kWarps; ++w) {
        if (l[w] == -INFINITY) continue;
        const float weight = part_exp(l[w], all);
        v0 += weight * part_o[(w * 16 + row) * kHeadDim + col];
        v1 += weight * part_o[(w * 16 + row) * kHeadDim + col + 1];
      }
      if (nan) v0 = v1 = NAN;
      out.o2(r0 + row, col, v0, v1);
      if (col == 0) out.lse(r0 + row, all);
    }
  }
}

// ---- combine -----------------------------------------------------------------------------
// One CTA per row (b, h, i) of out and one thread per column: warp w sums columns
// [32w, 32w + 32) of every split's O_s, each load of a warp 128 contiguous bytes. Every warp
// merges the splits' LSEs itself (lane l holds splits l, l + 32, ...), so no warp waits on
// another and nothing goes through shared memory. The loads of the first 32 splits' O_s are
// issued beside the LSEs' loads, before any weight is known: a call of up to 32 splits waits
// on memory once, where a weight-first order waits twice (the LSEs, then the O_s they weigh).
// A split's weight e^(LSE_s − LSE) then multiplies its O_s. A split that saw no key has
// LSE_s = −inf and weight 0: its O_s is read and not added. A split that met a NaN has
// LSE_s = NaN (the split-KV kernel's epilogue), and the row is NaN. grid rows_all, kHeadDim
// threads.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) kv_combine_kernel(const __grid_constant__ KvCacheParams p,
                                                              int splits) {
  constexpr int kLsePerLane = kMaxSplits / 32;
  static_assert(kHeadDim % 32 == 0 && kMaxSplits % 32 == 0);
  const int64_t rows_all = kv_rows_all(p), row = blockIdx.x;
  const int lane = threadIdx.x % 32, col = threadIdx.x;
  cuda::wait_for_prior_grid();  // the split-KV kernel's partials (launched early)
  cuda::allow_dependents();
  const float* lse_s = kv_lse_partial(p, splits) + row;
  const float* o_s = static_cast<const float*>(p.workspace) + row * kHeadDim + col;
  const int64_t o_stride = rows_all * kHeadDim;  // from split s to split s + 1
  float l[kLsePerLane], o[32];
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) {
    const int s = j * 32 + lane;
    l[j] = s < splits ? lse_s[s * rows_all] : -INFINITY;
  }
  CUTE_UNROLL
  for (int s = 0; s < 32; ++s) o[s] = s < splits ? o_s[s * o_stride] : 0.f;

  float m = -INFINITY, sum = 0.f;
  bool nan = false;  // a split's part saw a NaN (its LSE is NaN): so does the row
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) m = fmaxf(m, l[j]), nan |= l[j] != l[j];
  for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) sum += part_exp(l[j], m);
  for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  nan = __any_sync(0xffffffffu, nan);
  const float lse = nan ? NAN : merged_lse(m, sum);

  // Split s's weight is lane s % 32's w[s / 32]; the splits go 32 at a time, the first 32
  // splits' O_s already loaded.
  float acc = 0.f;
  CUTE_UNROLL
  for (int j = 0; j < kLsePerLane; ++j) {
    if (j * 32 >= splits) break;
    if (j > 0) {
      CUTE_UNROLL
      for (int i = 0; i < 32; ++i) o[i] = j * 32 + i < splits ? o_s[(j * 32 + i) * o_stride] : 0.f;
    }
    const float w = l[j] == -INFINITY ? 0.f : part_exp(l[j], lse);
    CUTE_UNROLL
    for (int i = 0; i < 32; ++i) {
      const float w_s = __shfl_sync(0xffffffffu, w, i);
      if (w_s != 0.f) acc += w_s * o[i];
    }
  }

  const int i = int(row % p.seqlen_q), h = int(row / p.seqlen_q % p.heads_q),
            b = int(row / p.seqlen_q / p.heads_q);
  Element* out = static_cast<Element*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride +
                 h * p.o_head_stride;
  out[col] = Element(nan ? NAN : acc);
  if (col == 0 && p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = lse;
}

// ---- launch ------------------------------------------------------------------------------
// The kernel for p: keys spread over the warps where a block has at most 16 packed rows
// and a tile has 16 keys per warp (head dims up to 128), else rows spread over them.
template <DType kDtype, int kHeadDim>
const void* kv_kernel_for(const KvCacheParams& p) {
  using Config = KvConfig<kDtype, kHeadDim>;
  using Tr = typename Config::Traits;
  if constexpr (Tr::kBlockN == 16 * Tr::kNWarps) {
    if (kv_row_blocks(p, 16) <= 1)
      return reinterpret_cast<const void*>(kv_kernel<Tr, Config::kStages, true>);
  }
  return reinterpret_cast<const void*>(kv_kernel<Tr, Config::kStages, false>);
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
  if (p.k_new != nullptr && kv_append_rows(p) > 0) {
    KvCacheParams ap = p;
    void* append_args[] = {&ap};
    FL_CUDA_CHECK(cuda::launch_after(reinterpret_cast<const void*>(kv_append_kernel<Element>),
                                     dim3(kv_append_rows(p), p.heads_kv, p.batch), dim3(128), 0,
                                     stream, append_args, early));
  }
  // The API runs a call with no query rows only for its append (src/api/dispatch.cpp's
  // nothing_to_write): then the append is the whole call.
  const int row_blocks = int(kv_row_blocks(p, Tr::kBlockM));
  if (row_blocks == 0) return {};
  // With rotary the attention reads the q that the append kernel wrote, contiguous.
  KvCacheParams a = p;
  if (p.rotary_cos != nullptr) {
    a.q = p.q_rot;
    a.q_head_stride = p.head_dim;
    a.q_row_stride = int64_t(p.heads_q) * p.head_dim;
    a.q_batch_stride = a.q_row_stride * p.seqlen_q;
  }
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
const void* KvInstance<kDtype, kHeadDim>::kernel(const KvCacheParams& p) {
  return kv_kernel_for<kDtype, kHeadDim>(p);
}
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::smem_bytes() {
  return KvConfig<kDtype, kHeadDim>::kSmemBytes;
}
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::block_m() {
  return KvConfig<kDtype, kHeadDim>::Traits::kBlockM;
}
template <DType kDtype, int kHeadDim>
int KvInstance<kDtype, kHeadDim>::block_n() {
  return KvConfig<kDtype, kHeadDim>::Traits::kBlockN;
}

}  // namespace flashlab::sm80
