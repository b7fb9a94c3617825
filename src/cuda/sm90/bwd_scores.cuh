// The Hopper backward's per-element work, shared by both consumer steps (bwd_consume in
// bwd_kernel.cuh, bwd_consume_wide in bwd_wide.cuh): P and dS from the scores (BwdScores),
// the zeroing of a ragged varlen tile's rows, and the dK/dV epilogue.
#pragma once

#include <climits>

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

  template <class Acc, class Coord>
  __device__ void probs(Acc& acc_s, const Coord& tScS) const {
    dispatch([&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const float scale_log2 = p.scale_log2;
      CUTE_UNROLL
      for (int e = 0; e < size(acc_s); ++e) {
        const float pe = cuda::exp2_approx(acc_s(e) * scale_log2 - lse_log2[get<1>(tScS(e))]);
        acc_s(e) = seen<kMasked>(tScS, e) ? pe : 0.f;
      }
    });
  }
  template <class Acc, class Coord>
  __device__ void dscores(const Acc& acc_s, Acc& acc_dp, const Coord& tScS) const {
    dispatch([&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      CUTE_UNROLL
      for (int e = 0; e < size(acc_dp); ++e) {
        const float ds = acc_s(e) * (acc_dp(e) - dsum[get<1>(tScS(e))]);
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
  // runs; with softcap both after dP.
  template <bool kSoftcap, class Acc, class Coord>
  __device__ void form(Acc& acc_s, Acc& acc_dp, const Coord& tScS) const {
    if constexpr (kSoftcap) {
      warpgroup_wait_for<0>(acc_s, acc_dp);
      softcapped(acc_s, acc_dp, tScS);
    } else {
      warpgroup_wait_for<1>(acc_s);  // S is done, dP runs on
      probs(acc_s, tScS);
      warpgroup_wait_for<0>(acc_dp);
      dscores(acc_s, acc_dp, tScS);
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
template <class Tr, class... SmemTiles>
__device__ __forceinline__ void bwd_zero_rows(int valid, int ctid, SmemTiles... tiles) {
  auto zero = [&](auto tile) {  // (rows, D)
    constexpr int kRows = decltype(size<0>(tile))::value, kCols = decltype(size<1>(tile))::value;
    using Swizzle = get_swizzle_t<decltype(tile.data())>;
    static_assert(sizeof(typename Tr::Element) == 2 && kCols % 8 == 0 &&
                      (Swizzle::num_bits == 0 || Swizzle::num_base >= 4) &&
                      bwd_rows_in_16_bytes<decltype(tile.layout()), kRows, kCols>(),
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

// ---- epilogue: dK = scale · Σ dSᵀ Q and dV from the consumers' registers; keys past the
// sequence are not written. c gives each value's (key in the block, d). ----
template <class Tr, class Tile, class Acc, class Coord>
__device__ __forceinline__ void bwd_store_dkv(const BwdParams& p, const cuda::SeqInfo& seq, const Tile& tile,
                                              int n_block, const Acc& acc_dk, const Acc& acc_dv, const Coord& c) {
  using Element = typename Tr::Element;
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
// The 3-D grid's CTA (bwd_consume_wide).
template <class Tr, class Acc, class Coord>
__device__ __forceinline__ void bwd_store_dkv(const BwdParams& p, const cuda::SeqInfo& seq, int n_block,
                                              const Acc& acc_dk, const Acc& acc_dv, const Coord& c) {
  bwd_store_dkv<Tr>(p, seq, BwdGridTile{}, n_block, acc_dk, acc_dv, c);
}

}  // namespace flashlab::sm90
