// The Hopper backward's per-element work, shared by both consumer steps (bwd_consume in
// bwd_kernel.cuh, bwd_consume_wide in bwd_wide.cuh): P and dS from the scores (BwdScores),
// the zeroing of a ragged varlen tile's rows, and the dK/dV epilogues.
#pragma once

#include <climits>
#include <utility>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/constants.h"
#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm90/bwd_steps.cuh"     // BwdTile
#include "cuda/sm90/fwd_mainloop.cuh"  // warpgroup_wait_for

namespace flashlab::sm90 {

using namespace cute;

// The step's elementwise work, in two halves so that each overlaps an MMA: P (in acc_s)
// from S while dP runs, then dS = P ∘ (dP − D) (in acc_dp). The coordinates (tScS) give
// each value's (key, query), whichever of the two is the accumulator's rows. The
// softmax scale is applied to dK and dQ at the end. Masked pairs and keys past the sequence
// get P = dS = 0 by selection, so that no NaN or Inf of a masked key's score reaches dK, dV
// or dQ's sums; rows past the sequence have LSE = +inf, so their P is 0. Row i sees key j
// when j < len_k and lo <= j − i <= hi (docs/DESIGN.md's mask with the bounds as
// differences), a test of a few instructions per value, made only on the tiles the mask
// cuts. With softcap, t = cap·tanh(s/cap), P = exp(t − LSE) and dS = P ∘ (dP − D) ∘
// (1 − (t/cap)²) need t in both halves, so both are done at once after dP.
template <class Tr>
struct BwdScores {
  static constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN;
  const BwdParams& p;
  const float* lse_log2;
  const float* dsum;
  int i0, j0, len_k, lo, hi;
  bool full;

  __device__ BwdScores(const BwdParams& p_, const cuda::SeqInfo& seq, const float* lse, const float* ds,
                       int i0_, int j0_)
      : p(p_), lse_log2(lse), dsum(ds), i0(i0_), j0(j0_), len_k(seq.len_k) {
    const int len_q = seq.len_q, off = len_k - len_q;
    full = j0 + kN <= len_k &&
           (!p.mask.is_local() ||
            p.mask.tile_is_full(i0, i0 + kM < len_q ? i0 + kM : len_q, j0, j0 + kN, len_q, len_k));
    lo = p.mask.window_left >= 0 ? off - p.mask.window_left : INT_MIN;
    hi = p.mask.window_right >= 0 ? off + p.mask.window_right : INT_MAX;
  }
  template <bool kMasked, class Coord>
  __device__ bool seen(const Coord& tScS, int e) const {
    if constexpr (!kMasked) {
      return true;
    } else {
      const int j = j0 + get<0>(tScS(e)), d = j - (i0 + get<1>(tScS(e)));
      return (j < len_k) & (d >= lo) & (d <= hi);
    }
  }
  // Calls f with the tile's kind: whether the mask test is needed.
  template <class F>
  __device__ void dispatch(F&& f) const {
    if (full)
      f(cute::false_type{});
    else
      f(cute::true_type{});
  }

  // Where probs and dscores find each value's LSE or D: read from shared memory at use
  // (at(v, tScS)), or from a copy in registers (regs(r)) that gather() made earlier.
  template <class Coord>
  struct at {
    const float* v;
    const Coord& tScS;
    __device__ float operator()(int e) const { return v[get<1>(tScS(e))]; }
  };
  template <int kN>
  struct regs {
    const float (&r)[kN];
    __device__ float operator()(int e) const { return r[e]; }
  };
  // Each value's entry of a per-query vector in shared memory (LSE or D), into registers: read
  // as soon as its stage has landed, before the MMA wait that would hold the reads back (the
  // wait's memory clobber). Values of one query share an address, read once.
  template <class Coord, int kN>
  __device__ void gather(const float* v, const Coord& tScS, float (&r)[kN]) const {
    CUTE_UNROLL
    for (int e = 0; e < kN; ++e) r[e] = v[get<1>(tScS(e))];
  }
  template <class Acc, class Coord, class Lse>
  __device__ void probs(Acc& acc_s, const Coord& tScS, const Lse& lse) const {
    dispatch([&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const float scale_log2 = p.scale_log2;
      CUTE_UNROLL
      for (int e = 0; e < size(acc_s); ++e) {
        const float pe = cuda::exp2_approx(acc_s(e) * scale_log2 - lse(e));
        acc_s(e) = seen<kMasked>(tScS, e) ? pe : 0.f;
      }
    });
  }
  template <class Acc, class Coord, class D>
  __device__ void dscores(const Acc& acc_s, Acc& acc_dp, const Coord& tScS, const D& d) const {
    dispatch([&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      CUTE_UNROLL
      for (int e = 0; e < size(acc_dp); ++e) {
        const float ds = acc_s(e) * (acc_dp(e) - d(e));
        acc_dp(e) = seen<kMasked>(tScS, e) ? ds : 0.f;
      }
    });
  }
  template <class Acc, class Coord>
  __device__ void softcapped(Acc& acc_s, Acc& acc_dp, const Coord& tScS) const {
    dispatch([&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const float cap = p.mask.softcap, pre = p.scale / cap, inv_cap = 1.f / cap;
      CUTE_UNROLL
      for (int e = 0; e < size(acc_s); ++e) {
        const int q = get<1>(tScS(e));
        const float t = cap * tanhf(acc_s(e) * pre), u = t * inv_cap;
        const float pe = cuda::exp2_approx(t * kLog2e - lse_log2[q]);
        const bool ok = seen<kMasked>(tScS, e);
        acc_s(e) = ok ? pe : 0.f;
        acc_dp(e) = ok ? pe * (acc_dp(e) - dsum[q]) * (1.f - u * u) : 0.f;
      }
    });
  }
  // Both halves, each once its MMA is done (S, then dP, issued in that order): P while dP
  // runs; with softcap both after dP. LSE and D are read from shared memory at use.
  template <bool kSoftcap, class Acc, class Coord>
  __device__ void form(Acc& acc_s, Acc& acc_dp, const Coord& tScS) const {
    if constexpr (kSoftcap) {
      warpgroup_wait_for<0>(acc_s, acc_dp);
      softcapped(acc_s, acc_dp, tScS);
    } else {
      warpgroup_wait_for<1>(acc_s);  // S is done, dP runs on
      probs(acc_s, tScS, at<Coord>{lse_log2, tScS});
      warpgroup_wait_for<0>(acc_dp);
      dscores(acc_s, acc_dp, tScS, at<Coord>{dsum, tScS});
    }
  }
  // The same with LSE in registers: `lse` is gather()'s copy, which the caller made right
  // after issuing S; D is gathered here after P, before the dP wait. Each copy holds one
  // value per score of the thread (Tr::kLseInRegisters).
  template <bool kSoftcap, class Acc, class Coord, int kN>
  __device__ void form(Acc& acc_s, Acc& acc_dp, const Coord& tScS, const float (&lse)[kN]) const {
    if constexpr (kSoftcap) {
      form<kSoftcap>(acc_s, acc_dp, tScS);
    } else {
      warpgroup_wait_for<1>(acc_s);  // S is done, dP runs on
      probs(acc_s, tScS, regs<kN>{lse});
      float d[kN];
      gather(dsum, tScS, d);
      warpgroup_wait_for<0>(acc_dp);
      dscores(acc_s, acc_dp, tScS, regs<kN>{d});
    }
  }
};

// Varlen packs every sequence into one tensor map, so a tile that runs past its sequence's end
// holds the next sequence's rows (or whatever follows the last one) where a padded batch's
// map gives zeros. Their P and dS are 0 by selection, but the MMAs still multiply those zeros
// by the rows (0 · NaN = NaN), so the consumers zero the rows from `valid` on in each shared
// tile first, then make the writes visible to the wgmma (async proxy) reads of both
// warpgroups. Only those rows, 16 bytes per shared store: the GMMA swizzles permute 16-byte
// units of the byte address (a swizzle base of 4 bits), so a row's 8 columns from a multiple
// of 8 stay one aligned 16-byte unit (checked on the tile's layout below).
template <class Layout, int kRows, int kCols>
constexpr bool bwd_rows_in_16_bytes() {
  constexpr Layout l{};
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; c += 8)
      if (l(r, c) % 8 != 0 || l(r, c + 7) != l(r, c) + 7) return false;
  return true;
}
// The same for a shared tile (rows, cols) of 16-bit elements, swizzle included: its
// swizzle moves whole 16-byte units (a base of at least 4 bits) and its layout keeps them.
template <class Tile>
constexpr bool bwd_tile_in_16_bytes() {
  using Swizzle = get_swizzle_t<decltype(std::declval<Tile&>().data())>;
  using TileShape = decltype(std::declval<Tile&>().shape());
  constexpr int kRows = decltype(size<0>(TileShape{}))::value, kCols = decltype(size<1>(TileShape{}))::value;
  return sizeof(typename Tile::value_type) == 2 && kCols % 8 == 0 &&
         (Swizzle::num_bits == 0 || Swizzle::num_base >= 4) &&
         bwd_rows_in_16_bytes<decltype(std::declval<Tile&>().layout()), kRows, kCols>();
}
template <class Tr, class... SmemTiles>
__device__ __forceinline__ void bwd_zero_rows(int valid, int ctid, SmemTiles... tiles) {
  auto zero = [&](auto tile) {  // (rows, D)
    constexpr int kRows = decltype(size<0>(tile))::value, kCols = decltype(size<1>(tile))::value;
    static_assert(bwd_tile_in_16_bytes<decltype(tile)>(),
                  "8 columns from a multiple of 8 are one aligned 16-byte unit");
    constexpr int kUnits = kCols / 8;  // per row
    for (int e = ctid; e < (kRows - valid) * kUnits; e += Tr::kNConsumerThreads) {
      const int r = valid + e / kUnits, c = e % kUnits * 8;
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(cast_smem_ptr_to_uint(&tile(r, c))), "r"(0)
                   : "memory");
    }
  };
  (zero(tiles), ...);
  cutlass::arch::fence_view_async_shared();
  cutlass::arch::NamedBarrier::sync(Tr::kNConsumerThreads, Tr::kZeroedBarrier);
}

// ---- epilogues: dK = scale · Σ dSᵀ Q and dV, from the consumers' registers; keys past the
// sequence are not written ----
// bwd_consume's (head dims 64-128): staged through shared memory so that global memory gets
// whole 16-byte chunks of each row. Once both warpgroups' last MMAs have read K and V (the
// caller's barrier), their tiles take dK and dV: stmatrix writes the accumulators' 8×8
// tiles as 16-byte rows into the same swizzled layouts, then every consumer thread copies
// 16-byte chunks out, consecutive threads along a row. From registers the stores were 2 bytes
// each, a warp's instruction touching 8 rows.
template <class Tr, class Tile, class Acc, class TiledMma, class SmemK, class SmemV>
__device__ __forceinline__ void bwd_store_dkv_staged(const BwdParams& p, const cuda::SeqInfo& seq, const Tile& tile,
                                                     int n_block, Acc& acc_dk, const Acc& acc_dv,
                                                     const TiledMma& mma_dkv, SmemK sK, SmemV sV, int ctid) {
  using Element = typename Tr::Element;
  constexpr int kN = Tr::kBlockN, kD = Tr::kHeadDim, kThreads = Tr::kNConsumerThreads;
  static_assert(bwd_tile_in_16_bytes<SmemK>(), "8 columns from a multiple of 8 are one aligned 16-byte unit of K's tile");
  static_assert(bwd_tile_in_16_bytes<SmemV>(), "8 columns from a multiple of 8 are one aligned 16-byte unit of V's tile");
  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= p.scale;
  Tensor rdk = round_to<Element>(acc_dk);
  Tensor rdv = round_to<Element>(acc_dv);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
  auto r2s_thr = r2s.get_thread_slice(ctid);
  cute::copy(r2s, r2s_thr.retile_S(rdk), r2s_thr.partition_D(sK));
  cute::copy(r2s, r2s_thr.retile_S(rdv), r2s_thr.partition_D(sV));
  cutlass::arch::NamedBarrier::sync(kThreads, Tr::kEpilogueBarrier);

  const int h_kv = tile.h_kv(), b = tile.b(), key0 = n_block * kN;
  const int keys = min(kN, seq.len_k - key0);
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch_stride + (seq.start_k + key0) * p.dk_row_stride +
                h_kv * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch_stride + (seq.start_k + key0) * p.dv_row_stride +
                h_kv * p.dv_head_stride;
  constexpr int kUnits = kD / 8;  // 16-byte chunks per row
  static_assert(kN * kUnits % kThreads == 0, "every thread copies the same number of chunks");
  CUTE_UNROLL
  for (int it = 0; it < kN * kUnits / kThreads; ++it) {
    const int u = it * kThreads + ctid, r = u / kUnits, c = u % kUnits * 8;
    if (r >= keys) continue;
    const uint4 k = *reinterpret_cast<const uint4*>(&sK(r, c));
    const uint4 v = *reinterpret_cast<const uint4*>(&sV(r, c));
    *reinterpret_cast<uint4*>(dk + int64_t(r) * p.dk_row_stride + c) = k;
    *reinterpret_cast<uint4*>(dv + int64_t(r) * p.dv_row_stride + c) = v;
  }
}

// bwd_consume_wide's (head dims 192, 256; the 3-D grid): straight from registers, c giving
// each value's (key in the block, d).
template <class Tr, class Acc, class Coord>
__device__ __forceinline__ void bwd_store_dkv(const BwdParams& p, const cuda::SeqInfo& seq, int n_block,
                                              const Acc& acc_dk, const Acc& acc_dv, const Coord& c) {
  using Element = typename Tr::Element;
  const BwdGridTile tile{};
  const int h_kv = tile.h_kv(), b = tile.b();
  Element* dk = static_cast<Element*>(p.dk) + b * p.dk_batch_stride + seq.start_k * p.dk_row_stride +
                h_kv * p.dk_head_stride;
  Element* dv = static_cast<Element*>(p.dv) + b * p.dv_batch_stride + seq.start_k * p.dv_row_stride +
                h_kv * p.dv_head_stride;
  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) {
    const int key = n_block * Tr::kBlockN + get<0>(c(e)), d = get<1>(c(e));
    if (key >= seq.len_k) continue;
    dk[int64_t(key) * p.dk_row_stride + d] = Element(acc_dk(e) * p.scale);
    dv[int64_t(key) * p.dv_row_stride + d] = Element(acc_dv(e));
  }
}

}  // namespace flashlab::sm90
