// Every compile-time choice of the Hopper forward (`cute_fa3`, sm_90a) in one struct: the
// warp-group roles and their register budgets, the tile sizes, the two warpgroup MMAs
// (wgmma), the shared-memory layouts the tensor cores and the copy engine agree on, the TMA
// copies, the K/V pipelines and the shared storage. The layers (fwd_scheduler.cuh,
// fwd_mainloop.cuh, fwd_softmax.cuh, fwd_epilogue.cuh, fwd_kernel.cuh) only compose what is
// named here; FwdConfig at the bottom is the table of tile shapes per head dim.
//
// Shapes are written (rows, cols) with the contiguous dimension last, as in global memory:
// Q and O tiles are (kBlockM, kHeadDim), K and V tiles (kBlockN, kHeadDim) per stage.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cstdint>

#include "cuda/cute_common.cuh"
#include "cuda/sm90/fwd_instance.h"  // Schedule
#include "flashlab/flashlab.h"

namespace flashlab::sm90 {

using namespace cute;
using cute::Tensor;  // not flashlab::Tensor (the public API's view)

using cuda::ElementFor;  // cuda/cute_common.cuh

// Where the softmax finds each row's max relative to its exponentials (fwd_softmax.cuh):
//   kVoteFirst  Softmax::update_voted: each thread's own max, one warp vote, the quad
//               shuffles only where some row moves its reference max
//   kExpFirst   Softmax::update_exp_first: the exponentials against the reference max while
//               the tile's lead over it is still being found (the max of the exponents'
//               arguments, written over the scores); a rescale (or a refill) where it moved
enum class MaxOrder { kVoteFirst, kExpFirst };

template <class Element_, int kHeadDim_, int kBlockN_, int kStages_, int kNConsumerWarpgroups_ = 2,
          bool kPingpong_ = true, bool kIntraOverlap_ = true, bool kPersistent_ = false,
          bool kSoftmaxUnderPv_ = true, bool kPollKvEarly_ = false,
          MaxOrder kMaxOrder_ = MaxOrder::kVoteFirst>
struct FwdTraits {
  using Element = Element_;
  static_assert(sizeof(Element) == 2, "the wgmma path here takes 16-bit inputs");

  // ---- roles -----------------------------------------------------------------------------
  // Warpgroup 0 produces (one thread issues every TMA copy); warpgroups 1 .. kNConsumer
  // consume, each owning 64 of the kBlockM = 64 · kNConsumer query rows. setmaxnreg moves
  // registers from the producer, which needs few, to the consumers, which hold S, P and O:
  // two consumers 128·24 + 256·240, three 128·24 + 384·160 = 64 512 of the SM's 65 536.
  static constexpr int kNConsumerWarpgroups = kNConsumerWarpgroups_;
  static_assert(kNConsumerWarpgroups == 2 || kNConsumerWarpgroups == 3, "two or three consumers");
  static constexpr int kNConsumerThreads = 128 * kNConsumerWarpgroups;
  static constexpr int kNThreads = 128 + kNConsumerThreads;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kNConsumerWarpgroups == 2 ? 240 : 160;
  // Named barrier of consumer warpgroup w's epilogue: kEpilogueBarrier + w (CUTLASS's
  // NamedBarrier adds its reserved ids on top).
  static constexpr int kEpilogueBarrier = 0;

  // ---- schedule (the ablations turn each switch off to measure what it adds) -------------
  // Pingpong: the consumer warpgroups take turns issuing their wgmma batches, in a ring
  // (named barrier kSchedulerBarrier + w: warpgroup w waits, w − 1 arrives), so one's
  // softmax runs while another's GEMMs keep the tensor cores busy.
  static constexpr bool kPingpong = kPingpong_;
  static constexpr int kSchedulerBarrier = kEpilogueBarrier + kNConsumerWarpgroups;
  // Intra-warpgroup overlap: S(n) = Q K(n)ᵀ and O += P(n+1) V(n+1) are issued together, in
  // one turn, so the tensor cores get both GEMMs back to back.
  static constexpr bool kIntraOverlap = kIntraOverlap_;
  // With the overlap, where a warpgroup waits for its P V: after S(n)'s softmax, which then
  // runs while P V is still on the tensor cores (true), or before it, so that the softmax
  // has the issue slots and the exp unit to itself (false). FwdConfig picks per head dim.
  static constexpr bool kSoftmaxUnderPv = kSoftmaxUnderPv_;
  // With the overlap: test the next turn's K and V barriers (mbarrier.test_wait, which does
  // not block) before the softmax, so that the turn finds them landed without waiting on a
  // barrier read (fwd_consumer.cuh's overlapped_tile). FwdConfig picks per head dim.
  static constexpr bool kPollKvEarly = kPollKvEarly_;
  // Where the softmax finds each row's max relative to its exponentials (MaxOrder,
  // fwd_softmax.cuh). FwdConfig picks per kernel.
  static constexpr MaxOrder kMaxOrder = kMaxOrder_;
  // Persistent: one CTA per SM takes tiles of one order as it frees up (fwd_scheduler.cuh's
  // TileOrder and DynamicTiles); Q's buffer is handed back to the producer after each
  // tile's epilogue. Only the ablation cute_fa3_persistent (FwdConfig).
  static constexpr bool kPersistent = kPersistent_;

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64 * kNConsumerWarpgroups;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;                   // keys per K/V tile
  static constexpr int kStages = kStages_;                   // K/V tiles in flight

  using BlkM = Int<kBlockM>;
  using BlkN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;
  using Stages = Int<kStages>;

  static_assert(kHeadDim % 64 == 0, "rows are whole 128-byte swizzle lines");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N is a multiple of 8 up to 256");

  // ---- tensor cores (wgmma) ----------------------------------------------------------------
  // S = Q Kᵀ: both operands from shared memory, K-major (the head dim is contiguous in both).
  // O += P V: P from registers (S's accumulator, rounded), V from shared memory read
  // MN-major (V is stored (keys, D) with D contiguous; the MMA wants (D, keys)).
  // The two warpgroup atoms stack along M: consumer warpgroup w computes rows [64w, 64w + 64).
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlkN, HeadDim>>(),
      Layout<Shape<Int<kNConsumerWarpgroups>, _1, _1>>{}));  // tile (BLK_M, BLK_N, D)
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, HeadDim, BlkN>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kNConsumerWarpgroups>, _1, _1>>{}));  // tile (BLK_M, D, BLK_N)

  // ---- shared memory --------------------------------------------------------------------
  // The 128-byte swizzle atom (8 rows × 64 elements): the layout TMA writes with
  // CU_TENSOR_MAP_SWIZZLE_128B and wgmma's descriptors read, so neither needs a shuffle.
  using SmemLayoutAtom = GMMA::Layout_K_SW128_Atom<Element>;                           // (8, 64)
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkM, HeadDim>{}));  // (BLK_M, D)
  using SmemLayoutK =
      decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkN, HeadDim, Stages>{}));  // (BLK_N, D, STAGES)
  using SmemLayoutV = SmemLayoutK;                                                // (BLK_N, D, STAGES)
  // V seen as Vᵀ over the same bytes, the B operand of P V: (D, BLK_N, STAGES).
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<HeadDim, BlkN, Stages>{}, Step<_2, _1, _3>{})));
  using SmemLayoutO = SmemLayoutQ;  // O is staged in Q's bytes: (BLK_M, D)

  // ---- global → shared: TMA ---------------------------------------------------------------
  // The global tensors as TMA sees them: (rows, D, heads, batch), D contiguous. Varlen packs
  // every sequence in rows (batch extent 1) and the kernel offsets by cu_seqlens.
  using GmemLayout = Layout<Shape<int, int, int, int>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                          GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutQ{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                       take<0, 2>(SmemLayoutK{})));  // one (BLK_N, D) stage
  // Bytes each copy lands; the copy engine counts zero-filled out-of-bounds rows too.
  static constexpr uint32_t kTmaBytesQ = uint32_t(kBlockM * kHeadDim * sizeof(Element));
  static constexpr uint32_t kTmaBytesKV = uint32_t(kBlockN * kHeadDim * sizeof(Element));

  // ---- pipelines ----------------------------------------------------------------------------
  // K and V have a ring each, so that S = Q K(n)ᵀ starts before V(n) has landed.
  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename PipelineKV::PipelineState;

  // ---- shared → global: the O epilogue ------------------------------------------------------
  // Each consumer warpgroup stores its 64 rows of O, staged in its rows of Q's buffer: one
  // TMA store of a (64, D) box (the copy engine clips rows past the tensor), or, where the
  // next packed sequence follows (varlen, a partial tile), 16-byte stores by the threads,
  // kHeadDim / 8 consecutive threads per row, rows past the sequence skipped.
  using GmemTensorO = decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)),
                                           GmemLayout{}));
  using SmemLayoutOWg = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<_64, HeadDim>{}));  // (64, D)
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensorO{}, SmemLayoutOWg{}));
  static constexpr int kGmemThreadsPerRow = kHeadDim / 8;
  static_assert(128 % kGmemThreadsPerRow == 0, "a warpgroup covers whole rows");
  using GmemTiledCopyO = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<uint128_t>, Element>{},
      Layout<Shape<Int<128 / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
             Stride<Int<kGmemThreadsPerRow>, _1>>{},  // (thread rows, thread cols), row-major
      Layout<Shape<_1, _8>>{}));                      // one 16-byte chunk

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle repeats every 8 rows of 128 bytes, and TMA
    // and wgmma compute it from the address bits.
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    typename PipelineKV::SharedStorage pipeline_k;
    typename PipelineKV::SharedStorage pipeline_v;
    uint64_t barrier_q;        // mbarrier: Q has landed (one phase per tile; no copy for a
                               // tile with no key)
    uint64_t barrier_q_empty;  // mbarrier: the consumers are done with Q's (and O's) bytes,
                               // one phase per tile (persistent only)
    int tile;                  // the tile the producer took (persistent only; -1: none left)
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

// The tile shapes per head dim. kBlockM = 64 per consumer warpgroup.
//   hdim  BLK_M × BLK_N  consumers  stages  smem (Q + K ring + V ring)   S + P + O / thread
//     64    192 × 128        3          3    24 + 48 + 48  = 120 KiB      64 + 32 + 32
//    128    128 × 128        2          3    32 + 96 + 96  = 224 KiB      64 + 32 + 64
//    256    128 ×  64        2          2    64 + 64 + 64  = 192 KiB      32 + 16 + 128
// Head dim 64 is bound by the softmax more than by its short GEMMs: with three consumer
// warpgroups two softmaxes overlap each warpgroup's GEMMs (4x4096x32x64 bf16: 481 TFLOP/s
// against 406 with two), and at 160 registers a thread its kernels do not spill. At head
// dim 256, O's 128 accumulators a thread leave room for a 64-key S only. At head dim 128 a
// third stage is worth more than wider key tiles (176 keys on two stages: 7% slower at 4k,
// level at 8k–16k).
// Each choice below was measured on H100 (bf16, alternating A/B in one process, 4k–16k
// tokens; docs/sm90/fwd.md, "What each technique is worth" and "Alternatives measured").
template <DType kDtype, int kHeadDim, Schedule kSchedule = Schedule::kFull>
struct FwdConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "no tile shape for this head dim");
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
  // Three K/V stages where they fit in the 227 KiB a block may use (head dim 256: 192 KiB
  // with two).
  static constexpr int kStages = kHeadDim <= 128 ? 3 : 2;
  static constexpr int kConsumers = kHeadDim == 64 ? 3 : 2;
  static constexpr bool kPingpong = kSchedule != Schedule::kNoPingpong && kSchedule != Schedule::kSerial;
  static constexpr bool kOverlap = kSchedule != Schedule::kNoOverlap && kSchedule != Schedule::kSerial;
  // One CTA per tile under every mask. The persistent kernel (the ablation
  // cute_fa3_persistent, head dim 128) is 5–8% slower without a mask, level under a causal
  // mask at 4k and 2–7% slower at 8k–16k: ptxas schedules its loop's exponentials worse. At
  // head dim 64 it spilled inside the consumer loop, at 256 it lost with and without a mask.
  static constexpr bool kPersistent = kSchedule == Schedule::kPersistent;
  static_assert(!kPersistent || kHeadDim == 128, "the persistent ablation is built at 128 only");
  // The softmax under P V, against after P V has completed: +13–17% at head dim 256,
  // +1.5–3.6% under causal masks at 128 (level without a mask), 5.5–8% slower at 64, where
  // three consumer warpgroups keep the exp unit the busiest pipe.
  static constexpr bool kSoftmaxUnderPv = kHeadDim >= 128;
  // The early K/V test: +5–13% at head dim 128 without a mask together with the tree row
  // max (+1–8% each alone), level under a causal mask; level at head dim 64. So only at 128.
  static constexpr bool kPollKvEarly = kHeadDim == 128;
  // The softmax's order: at head dim 128 without a mask the exponentials first gain 0–4%
  // over the vote first, and writing the exponent's argument over the score 2–3.5% more; at
  // 64 and 256 that form measured level to 5% slower than the vote first and spilled. So
  // kExpFirst at 128 (the persistent ablation too, so that it differs from cute_fa3 in the
  // schedule alone), kVoteFirst elsewhere.
  static constexpr MaxOrder kMaxOrder =
      kHeadDim == 128 ? MaxOrder::kExpFirst : MaxOrder::kVoteFirst;
  using Traits = FwdTraits<typename ElementFor<kDtype>::type, kHeadDim, kBlockN, kStages,
                           kConsumers, kPingpong, kOverlap, kPersistent, kSoftmaxUnderPv,
                           kPollKvEarly, kMaxOrder>;
};

}  // namespace flashlab::sm90
