// The Hopper backward's traits at wide head dims (192 and 256): the names the kernel and the launch
// use (bwd_kernel.cuh), for a second consumer step (bwd_wide.cuh).
//
// Why another design. With keys on the wgmma M side (BwdTraits), a consumer warpgroup owns
// 64 keys, and its dK and dV rows are 2·64·D/128 fp32 registers a thread: 256 at D = 256,
// more than the 240 a consumer has. Here S = Q Kᵀ and dP = dO Vᵀ are unswapped: queries on M
// (kBlockM = 64 rows), the warpgroups split the kBlockN keys as the wgmma N. dK and dV are
// computed transposed, dVᵀ += dOᵀ P and dKᵀ += Qᵀ dS, so that the warpgroups split the head
// dim instead (each D/W rows of dKᵀ and dVᵀ: 2·kBlockN·D/(128·W) = 160 registers at 80
// keys); each then needs every key's P and dS, which go through shared memory, and all five
// MMAs read both operands from shared memory. dQ = dS K is computed in slabs of 64·W head-dim
// columns (each warpgroup 64 of them), one fp32 accumulator reused per slab, and added into
// the global accumulator from registers with vector reductions (red.global.add, 16 bytes).
// These are FlashAttention-3's sm90 tiles at head dim 256: 64 × 80, two consumer warpgroups.
//
// Shapes are written (rows, cols) with the contiguous dimension last, as in global memory.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cstdint>

#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#error "bwd_traits_wide.h needs CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED defined before CuTe's headers"
#endif

namespace flashlab::sm90 {

using namespace cute;

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNConsumerWarpgroups_, int kStagesPdS_>
struct BwdTraitsWide {
  using Element = Element_;
  static_assert(sizeof(Element) == 2, "the wgmma path here takes 16-bit inputs");
  static constexpr bool kWide = true;      // bwd_kernel.cuh runs bwd_consume_wide
  static constexpr bool kDqAtomic = true;  // dQ leaves from registers: no dQ warp, no dQ stage

  // ---- roles: warpgroup 0 loads (warp 0, one thread) with 24 registers; the others compute
  // with 240 (two of them) or 160 (three) ---------------------------------------------------
  static constexpr int kNConsumerWarpgroups = kNConsumerWarpgroups_, kNConsumerThreads = 128 * kNConsumerWarpgroups;
  static constexpr int kNThreads = 128 + kNConsumerThreads, kProducerRegs = 24;
  static constexpr int kConsumerRegs = kNConsumerWarpgroups == 2 ? 240 : 160;  // 64K registers an SM
  // Named barriers (CUTLASS adds its reserved ids): every consumer's P and dS are in shared
  // memory; varlen: the consumers have zeroed a tile's rows past its sequence.
  static constexpr int kDsBarrier = 0;
  static constexpr int kZeroedBarrier = 3;

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step: the wgmma M of S and dP
  static constexpr int kBlockN = kBlockN_;  // keys per CTA, kBlockN / W per warpgroup
  static constexpr int kStages = 2;         // Q tiles in flight
  static constexpr int kStagesDo = 1;       // dO tiles (a second one does not fit)
  static constexpr int kStagesPdS = kStagesPdS_;  // P and dS buffers
  static constexpr int kNPerWarpgroup = kBlockN / kNConsumerWarpgroups;
  static constexpr int kSlabCols = 64 * kNConsumerWarpgroups;  // dQ columns per slab
  static constexpr int kDqSlabs = kHeadDim / kSlabCols;
  static_assert(kBlockM == 64, "the queries are one wgmma M block");
  static_assert(kNPerWarpgroup % 8 == 0, "a warpgroup's keys are a wgmma N");
  static_assert(kHeadDim % (64 * kNConsumerWarpgroups) == 0,
                "each warpgroup's dKᵀ, dVᵀ rows and dQ columns are whole 64-column swizzle atoms");
  static_assert(kStagesPdS == 1 || kStagesPdS == 2);

  using BlkM = Int<kBlockM>;
  using BlkN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;
  using Stages = Int<kStages>;
  using StagesDo = Int<kStagesDo>;
  using StagesPdS = Int<kStagesPdS>;
  using SlabCols = Int<kSlabCols>;
  using W = Int<kNConsumerWarpgroups>;

  // ---- the five MMAs, all with both operands in shared memory -----------------------------
  // S = Q Kᵀ, dP = dO Vᵀ: (queries, keys, D), both K-major; warpgroup w computes keys
  // [w·N/W, (w + 1)·N/W).
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BlkM, Int<kNPerWarpgroup>, HeadDim>>(),
      Layout<Shape<_1, W, _1>>{}));
  // dVᵀ += dOᵀ P, dKᵀ += Qᵀ dS: (D, keys, queries); A = dOᵀ, Qᵀ read MN-major from dO's and
  // Q's bytes, B = Pᵀ, dSᵀ read MN-major from P's and dS's. The warpgroups take 64-row blocks
  // of D in turn (w, w + W, ...).
  using TiledMmaDkv = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlkN, BlkM>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<W, _1, _1>>{}));
  // One dQ slab = dS K[:, slab]: (queries, slab columns, keys); A = dS (K-major), B = Kᵀ read
  // MN-major from K's bytes; warpgroup w computes the slab's columns [64w, 64w + 64). Over the
  // whole head dim (the postprocess's view) the slabs are the TiledMma's repeats along N, so
  // value e of slab j is value 32·j + e of that fragment (dq_slot's order).
  using TiledMmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BlkM, _64, BlkN>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, W, _1>>{}));
  static_assert(decltype(size<1>(typename TiledMmaSdP::AtomShape_MNK{}))::value == kNPerWarpgroup,
                "one wgmma per warpgroup's keys");
  static_assert(decltype(size<1>(typename TiledMmaDkv::AtomShape_MNK{}))::value == kBlockN,
                "one wgmma covers all keys of dKᵀ, dVᵀ");

  // ---- shared memory --------------------------------------------------------------------
  // Q, dO, K, V in 128-byte swizzle atoms (8 × 64): every warpgroup's slice of the head dim
  // (dOᵀ and Qᵀ row blocks, Kᵀ slab columns) is whole atoms. P and dS (queries, keys), keys
  // contiguous, in the widest K-major atom that divides one warpgroup's keys (the S
  // accumulator's columns, where stmatrix writes): 40 keys take the unswizzled 8 × 8 atom.
  template <int kCols>
  static auto k_atom() {
    if constexpr (kCols % 64 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};
    else if constexpr (kCols % 32 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};
    else if constexpr (kCols % 16 == 0) return GMMA::Layout_K_SW32_Atom<Element>{};
    else return GMMA::Layout_K_INTER_Atom<Element>{};
  }
  using SmemLayoutAtom = decltype(k_atom<kHeadDim>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkM, HeadDim, Stages>{}));    // (BLK_M, D, STAGES)
  using SmemLayoutDo = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkM, HeadDim, StagesDo>{}));  // (BLK_M, D, 1)
  using SmemLayoutK = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkN, HeadDim>{}));             // (BLK_N, D)
  using SmemLayoutV = SmemLayoutK;
  using SmemLayoutPdS = decltype(tile_to_shape(k_atom<kNPerWarpgroup>(), Shape<BlkM, BlkN, StagesPdS>{}));  // (BLK_M, BLK_N, S)
  // Transposed views over the same bytes (the MMAs that read an operand MN-major).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<HeadDim, BlkM, Stages>{}, Step<_2, _1, _3>{})));  // (D, BLK_M, STAGES)
  using SmemLayoutDot = decltype(composition(
      SmemLayoutDo{}, make_ordered_layout(Shape<HeadDim, BlkM, StagesDo>{}, Step<_2, _1, _3>{})));  // (D, BLK_M, 1)
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<HeadDim, BlkN>{}, Step<_2, _1>{})));  // (D, BLK_N)
  using SmemLayoutPdSt = decltype(composition(
      SmemLayoutPdS{}, make_ordered_layout(Shape<BlkN, BlkM, StagesPdS>{}, Step<_2, _1, _3>{})));  // (BLK_N, BLK_M, S)
  // P and dS leave the S and dP accumulators by stmatrix, untransposed (queries are rows in
  // both): 16-byte rows need 16 values a thread per 8-column group pair; a warpgroup's 40 keys
  // are 5 groups, so two 8 × 8 tiles per instruction.
  using StsmPdS = std::conditional_t<(kBlockM * kBlockN / kNConsumerThreads) % 8 == 0, SM90_U32x4_STSM_N,
                                     SM90_U32x2_STSM_N>;

  // ---- TMA --------------------------------------------------------------------------------
  // Global tensors as (rows, D, heads, batch), D contiguous.
  using GmemLayout = Layout<Shape<int, int, int, int>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                          GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{},
                                      take<0, 2>(SmemLayoutQ{})));  // one (BLK_M, D) stage; dO's alike
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{}));
  using TmaV = TmaK;
  // Bytes per barrier: a Q or dO tile, K and V each, a tile's LSE or D.
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * 2, kTmaBytesKV = kBlockN * kHeadDim * 2;
  static constexpr uint32_t kRowBytes = kBlockM * 4;

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;
  using PipelineDo = cutlass::PipelineTmaAsync<kStagesDo>;
  using PipelineState = typename PipelineQ::PipelineState;

  struct SharedStorage {  // 1024-byte aligned arrays (the 128-byte swizzle's period)
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutDo>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutPdS>, 1024> p;
    cute::array_aligned<Element, cosize_v<SmemLayoutPdS>, 1024> ds;
    uint64_t barrier_kv;  // mbarrier: K and V have landed
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineDo::SharedStorage pipeline_do;
    cute::array_aligned<float, kBlockM * kStages, 128> lse_log2;  // with the Q ring
    cute::array_aligned<float, kBlockM * kStagesDo, 128> dsum;    // with the dO ring
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "fits an H100's 227 KiB of shared memory per block");

  // Where value e of consumer thread t's dQ fragment over the whole head dim goes in a
  // step's block of kBlockM·kHeadDim floats of the global accumulator (value e of slab j is
  // e = 32·j + its index in the slab): groups of four values per thread side by side, so
  // that a warp's 16-byte reductions cover 512 contiguous bytes. The postprocess reads the
  // block back through the same map.
  static __host__ __device__ constexpr int dq_slot(int t, int e) {
    return (e / 4) * (kNConsumerThreads * 4) + t * 4 + e % 4;
  }
};

}  // namespace flashlab::sm90
