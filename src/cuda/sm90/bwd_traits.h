// Every compile-time choice of the Hopper backward (`cute_fa3`'s backward, sm_90a) in one
// struct: roles and registers, tile sizes, the five warpgroup MMAs, the shared-memory
// layouts (and the transposed views the MMAs read them through), the TMA copies, the
// pipelines and the shared storage. The layers (bwd_rows.cuh, bwd_kernel.cuh) only compose
// what is named here.
//
// The design is FlashAttention-3's: a CTA owns kBlockN keys of one (batch, head), holds K
// and V in shared memory, and walks the query blocks of kBlockM rows. Per query block:
//   Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (keys on the wgmma M side, so each consumer warpgroup owns 64
//   whole keys), P and dS recomputed in registers from LSE and D = rowsum(dO ∘ O),
//   dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ and dSᵀ straight from those registers (the
//   accumulator of Sᵀ is the A operand of dV's MMA, value for value), dS through shared
//   memory to dQ = dS K (a warpgroup's dQ columns need the other warpgroup's keys), staged
//   in shared memory and added into an fp32 accumulator in global memory by one bulk
//   reduce-add per step, which a warp of the producer warpgroup issues.
// The rows' LSE·log2 e and D come with each Q and dO tile (bulk copies on the same barrier).
//
// Shapes are written (rows, cols) with the contiguous dimension last, as in global memory.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cstdint>
#include <type_traits>

#include "cuda/cute_common.cuh"
#include "flashlab/flashlab.h"

// The MMA selectors below need wgmma widths that are no power of two times 16 (48 columns
// of dQ per warpgroup at head dim 96), which CuTe enumerates only under this macro, defined
// before any CuTe header (the instantiation files define it first).
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#error "bwd_traits.h needs CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED defined before CuTe's headers"
#endif

#include "cuda/sm90/bwd_traits_wide.h"  // head dim 256

namespace flashlab::sm90 {

using namespace cute;
using cute::Tensor;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_>
struct BwdTraits {
  using Element = Element_;
  static_assert(sizeof(Element) == 2, "the wgmma path here takes 16-bit inputs");
  static constexpr bool kWide = false;      // bwd_consume, not bwd_consume_wide (bwd_traits_wide.h)
  static constexpr bool kDqAtomic = false;  // dQ leaves through the dQ warp's bulk reduce-add

  // ---- roles: warpgroup 0 loads (warp 0, one thread) and writes dQ (warp 1), warpgroups 1
  // and 2 compute --------------------------------------------------------------------------
  static constexpr int kNConsumerWarpgroups = 2;
  static constexpr int kNConsumerThreads = 128 * kNConsumerWarpgroups;
  static constexpr int kNThreads = 128 + kNConsumerThreads;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barriers (CUTLASS adds its reserved ids): both consumers' dS are in shared memory;
  // varlen: the consumers have zeroed a tile's rows past its sequence (bwd_kernel.cuh); per
  // consumer warpgroup, its half of the dQ stage is full (the warpgroup arrives, the dQ warp
  // waits) and free again (the dQ warp arrives once its bulk reduce has read it, the
  // warpgroup waits). Each warpgroup meets only the dQ warp there, never the other one. After
  // the last step both consumers meet twice on one more: K and V read by both (their tiles
  // then stage dK and dV), and the staged tiles written (bwd_store_dkv_staged).
  static constexpr int kDsBarrier = 0;
  static constexpr int kZeroedBarrier = 1;
  static constexpr int kDqBarrierThreads = 128 + 32;
  static constexpr int dq_full_barrier(int wg) { return 2 + wg; }
  static constexpr int dq_empty_barrier(int wg) { return 4 + wg; }
  static constexpr int kEpilogueBarrier = 6;

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA: 64 per consumer warpgroup
  static constexpr int kStages = 2;         // Q and dO tiles in flight; dS buffers
  static constexpr int kStagesDo = kStages;
  static_assert(kBlockN == 64 * kNConsumerWarpgroups, "each consumer owns 64 keys");
  static_assert(kBlockM % 16 == 0 && kBlockM <= 256, "queries are the wgmma N of S and dP");
  // A step's LSE goes into registers right after S is issued, one copy per score the thread
  // holds, where that is at most 32 (64 query rows); with 128 rows (head dim 64) the 64 more
  // live registers spilled, and LSE and D are read from shared memory at use
  // (BwdScores::form, bwd_scores.cuh).
  static constexpr bool kLseInRegisters = kBlockM * kBlockN / kNConsumerThreads <= 32;
  static_assert(kHeadDim % 32 == 0, "head dims of whole 64-byte lines (smem_atom picks the swizzle)");

  using BlkM = Int<kBlockM>;
  using BlkN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;
  using Stages = Int<kStages>;
  using HalfD = Int<kHeadDim / kNConsumerWarpgroups>;

  // ---- the five MMAs -------------------------------------------------------------------
  // Sᵀ = K Qᵀ, dPᵀ = V dOᵀ: (keys, queries, D), both operands K-major in shared memory;
  // warpgroup w computes keys [64w, 64w + 64).
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlkM, HeadDim>>(),
      Layout<Shape<Int<kNConsumerWarpgroups>, _1, _1>>{}));
  // dV += Pᵀ dO, dK += dSᵀ Q: (keys, D, queries); A from registers (Pᵀ, dSᵀ), B = dOᵀ, Qᵀ
  // read MN-major from Q's and dO's bytes; warpgroup w owns its 64 keys' rows of dK, dV.
  using TiledMmaDkv = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, HeadDim, BlkM>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kNConsumerWarpgroups>, _1, _1>>{}));
  // dQ = dS K: (queries, D, keys); A = dS (K-major, keys contiguous), B = Kᵀ read MN-major
  // from K's bytes, over all keys. With 64 query rows per consumer warpgroup (head dim 64)
  // the warpgroups split it by rows; else by head-dim columns, w computing
  // [w·D/2, (w + 1)·D/2), so that K's swizzle atom (below) must fit D/2 a whole number of times.
  static constexpr bool kDqSplitsRows = kBlockM == 64 * kNConsumerWarpgroups;
  static auto dq_tiled_mma() {
    if constexpr (kDqSplitsRows)
      return make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, HeadDim, BlkN>,
                                                 GMMA::Major::K, GMMA::Major::MN>(),
                            Layout<Shape<Int<kNConsumerWarpgroups>, _1, _1>>{});
    else
      return make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<BlkM, HalfD, BlkN>,
                                                 GMMA::Major::K, GMMA::Major::MN>(),
                            Layout<Shape<_1, Int<kNConsumerWarpgroups>, _1>>{});
  }
  using TiledMmaDq = decltype(dq_tiled_mma());
  // One wgmma covers a warpgroup's slice of dQ: CuTe's selector, compiled without the wide
  // shapes (the macro above, defined after a CuTe header), would split it into 16-wide ones.
  static_assert(decltype(size<1>(typename TiledMmaDq::AtomShape_MNK{}))::value ==
                    (kDqSplitsRows ? kHeadDim : kHeadDim / kNConsumerWarpgroups),
                "one wgmma per warpgroup's dQ slice");

  // ---- shared memory --------------------------------------------------------------------
  // The widest swizzle whose atom (8 rows of 128, 64 or 32 bytes) tiles `cols` columns of a
  // row-contiguous tile: at head dim 96, 64-byte atoms for Q, dO and V (96 = 3 × 32 columns)
  // and 32-byte atoms for K, whose dQ halves are 48 columns wide.
  template <int kCols>
  static auto smem_atom() {
    if constexpr (kCols % 64 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};  // (8, 64)
    else if constexpr (kCols % 32 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};  // (8, 32)
    else {
      static_assert(kCols % 16 == 0, "a 16-column multiple");
      return GMMA::Layout_K_SW32_Atom<Element>{};  // (8, 16)
    }
  }
  using SmemLayoutAtom = decltype(smem_atom<kHeadDim>());
  using SmemLayoutAtomK = decltype(smem_atom<kDqSplitsRows ? kHeadDim : kHeadDim / kNConsumerWarpgroups>());
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkM, HeadDim, Stages>{}));  // (BLK_M, D, STAGES)
  using SmemLayoutDo = SmemLayoutQ;
  using SmemLayoutK = decltype(tile_to_shape(SmemLayoutAtomK{}, Shape<BlkN, HeadDim>{}));  // (BLK_N, D)
  using SmemLayoutV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkN, HeadDim>{}));   // (BLK_N, D)
  // dS (queries, keys), keys contiguous, one buffer per stage.
  using SmemLayoutDs = decltype(tile_to_shape(smem_atom<kBlockN>(), Shape<BlkM, BlkN, Stages>{}));  // (BLK_M, BLK_N, STAGES)
  // Transposed views over the same bytes (the MMAs that read an operand MN-major).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<HeadDim, BlkM, Stages>{}, Step<_2, _1, _3>{})));  // (D, BLK_M, STAGES)
  using SmemLayoutDot = SmemLayoutQt;
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<HeadDim, BlkN>{}, Step<_2, _1>{})));  // (D, BLK_N)
  // dSᵀ (keys, queries) over dS's bytes: where a consumer writes its accumulator's values.
  using SmemLayoutDst = decltype(composition(
      SmemLayoutDs{}, make_ordered_layout(Shape<BlkN, BlkM, Stages>{}, Step<_2, _1, _3>{})));  // (BLK_N, BLK_M, STAGES)

  // ---- TMA --------------------------------------------------------------------------------
  // Global tensors as (rows, D, heads, batch), D contiguous.
  using GmemLayout = Layout<Shape<int, int, int, int>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                          GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                      take<0, 2>(SmemLayoutQ{})));  // one (BLK_M, D) stage
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{}));
  static constexpr uint32_t kTmaBytesQ = uint32_t(kBlockM * kHeadDim * sizeof(Element));
  static constexpr uint32_t kTmaBytesKV = uint32_t(kBlockN * kHeadDim * sizeof(Element));
  static constexpr uint32_t kRowBytes = uint32_t(kBlockM * sizeof(float));  // a tile's LSE or D

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;  // Q tiles; the dO ring is alike
  using PipelineDo = PipelineQ;
  using PipelineState = typename PipelineQ::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutDo>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutDs>, 1024> ds;
    // dQ of one step in the accumulator's fragment order (dq_slot), fp32.
    cute::array_aligned<float, kBlockM * kHeadDim, 128> dq;
    cute::array_aligned<float, kBlockM * kStages, 128> lse_log2;  // with the Q ring
    cute::array_aligned<float, kBlockM * kStages, 128> dsum;      // with the dO ring
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineDo::SharedStorage pipeline_do;
    uint64_t barrier_kv;  // mbarrier: K and V have landed
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  // Where value e of consumer thread t's dQ accumulator goes in a step's block of
  // kBlockM·kHeadDim floats (shared memory and the global accumulator alike): each consumer
  // warpgroup's values in one contiguous half (its own bulk reduce), in it groups of four
  // values per thread side by side, so that a warp's 16-byte stores cover 512 contiguous
  // bytes. The postprocess reads the block back through the same map.
  static constexpr int kDqHalf = kBlockM * kHeadDim / 2;
  static __host__ __device__ constexpr int dq_slot(int t, int e) {
    return (t / 128) * kDqHalf + (e / 4) * (128 * 4) + (t % 128) * 4 + e % 4;
  }
};

// The tile shapes per head dim, two consumer warpgroups (of 64 keys each up to head dim 128):
// - head dim 128: 64 query rows × 128 keys (FlashAttention-3's masked configuration). Per
//   consumer thread, fp32: Sᵀ 32 + dPᵀ 32 + dK 64 + dV 64 + dQ 32, with P and dS rounded into
//   16 registers each. Shared memory: Q 32 + dO 32 + K 32 + V 32 + dS 32 + dQ 32 KiB, and
//   1 KiB of LSE and D.
// - head dim 96: as at 128, 64 query rows × 128 keys, each consumer's dQ 48 columns wide (K
//   in 32-byte swizzle atoms, Q, dO and V in 64-byte ones). Per consumer thread, fp32: Sᵀ 32 +
//   dPᵀ 32 + dK 48 + dV 48 + dQ 24. Shared memory: Q 24 + dO 24 + K 24 + V 24 + dS 32 + dQ
//   24 KiB, and 1 KiB of LSE and D.
// - head dim 64: 128 query rows × 128 keys, dQ split by rows. Per consumer thread, fp32:
//   Sᵀ 64 + dPᵀ 64 + dK 32 + dV 32 + dQ 32, P and dS in 32 registers each: the same peak as at
//   head dim 128 (Sᵀ, dPᵀ, dK and dV while the scores are formed). Shared memory: Q 32 +
//   dO 32 + K 16 + V 16 + dS 64 + dQ 32 KiB, and 2 KiB of LSE and D.
// - head dim 256: 64 query rows × 80 keys in BwdTraitsWide (bwd_traits_wide.h), two consumer
//   warpgroups of 40 keys each, two P/dS buffers, dQ by vector reductions from registers.
//   Per consumer thread, fp32: dKᵀ 80 + dVᵀ 80 + S 20 + dP 20 at the peak, then a 32-value
//   dQ slab. Shared memory: Q 64 (two stages) + dO 32 (one) + K 40 + V 40 + P 20 + dS 20 KiB,
//   and 0.75 KiB of LSE and D.
// - head dim 192: 64 query rows × 96 keys in BwdTraitsWide, three consumer warpgroups of 32
//   keys each at 160 registers (FlashAttention-3's tiles), two P/dS buffers, one 192-column
//   dQ slab. Per consumer thread, fp32: dKᵀ 48 + dVᵀ 48 + S 16 + dP 16, then 32 of dQ.
//   Shared memory: Q 48 (two stages) + dO 24 + K 36 + V 36 + P 24 + dS 24 KiB.
template <DType kDtype, int kHeadDim>
struct BwdConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "the Hopper backward has instances at head dims 64, 96, 128, 192 and 256");
  using Element = typename cuda::ElementFor<kDtype>::type;
  using Traits = std::conditional_t<
      kHeadDim == 256, BwdTraitsWide<Element, 256, 64, 80, 2, 2>,
      std::conditional_t<kHeadDim == 192, BwdTraitsWide<Element, 192, 64, 96, 3, 2>,
                         BwdTraits<Element, kHeadDim, kHeadDim == 64 ? 128 : 64, 128>>>;
};

}  // namespace flashlab::sm90
