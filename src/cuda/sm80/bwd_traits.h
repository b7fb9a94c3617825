// Every compile-time choice of the CuTe FlashAttention-2 backward (sm80 path) in one struct:
// tile sizes, warps, the three tensor-core arrangements (one per shape of product), the
// shared-memory layouts with their transposed views, and the copies. The layers
// (bwd_mainloop.cuh, bwd_softmax.cuh, bwd_epilogue.cuh, wired by bwd_kernel.cuh) only
// compose what is named here; BwdConfig at the bottom is the table of tile shapes per head
// dim.
//
// Shapes are written (rows, cols) with the contiguous dimension last, as in global memory:
// Q and dO tiles are (kBlockM, kHeadDim), K and V tiles (kBlockN, kHeadDim), P and dS
// (kBlockM, kBlockN). A "t" view is the same bytes read transposed: Pᵀ is (kBlockN, kBlockM).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/sm80/traits_common.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_,
          int kWarpsMSdP_, int kWarpsNdKV_, int kWarpsMdQ_, int kStagesQdO_,
          bool kStorePEarly_ = false>
struct BwdTraits {
  using Element = Element_;
  static_assert(sizeof(Element) == 2, "the m16n8k16 MMA takes 16-bit inputs");

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step of the main loop
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = 32 * kNWarps;
  // Q and dO buffers: with 2, the next query block's loads start as this one's begin.
  static constexpr int kStagesQdO = kStagesQdO_;
  static_assert(kStagesQdO == 1 || kStagesQdO == 2, "one or two Q/dO buffers");
  // P to shared memory right after it is computed (true: its stores interleave with
  // dP = dO Vᵀ), or together with dS (false).
  static constexpr bool kStorePEarly = kStorePEarly_;

  using BlkM = Int<kBlockM>;
  using BlkN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;

  // ---- tensor cores: one arrangement per product -------------------------------------------
  // S = Q Kᵀ and dP = dO Vᵀ   (BLK_M, BLK_N), reducing over D
  static constexpr int kWarpsMSdP = kWarpsMSdP_, kWarpsNSdP = kNWarps / kWarpsMSdP_;
  using TiledMmaSdP = TiledMmaOf<Element, kWarpsMSdP, kWarpsNSdP>;
  // dV = Pᵀ dO and dK = dSᵀ Q  (BLK_N, D), reducing over BLK_M
  static constexpr int kWarpsNdKV = kWarpsNdKV_, kWarpsDdKV = kNWarps / kWarpsNdKV_;
  using TiledMmadKV = TiledMmaOf<Element, kWarpsNdKV, kWarpsDdKV>;
  // dQ = dS K                  (BLK_M, D), reducing over BLK_N
  static constexpr int kWarpsMdQ = kWarpsMdQ_, kWarpsDdQ = kNWarps / kWarpsMdQ_;
  using TiledMmadQ = TiledMmaOf<Element, kWarpsMdQ, kWarpsDdQ>;

  static_assert(kBlockM % (16 * kWarpsMSdP) == 0 && kBlockN % (16 * kWarpsNSdP) == 0,
                "S and dP are whole tiled steps");
  static_assert(kBlockN % (16 * kWarpsNdKV) == 0 && kHeadDim % (16 * kWarpsDdKV) == 0,
                "dK and dV are whole tiled steps");
  static_assert(kBlockM % (16 * kWarpsMdQ) == 0 && kHeadDim % (16 * kWarpsDdQ) == 0,
                "dQ is whole tiled steps");

  // ---- shared memory --------------------------------------------------------------------
  using SmemAtomD = typename SwizzleAtom<kHeadDim>::type;  // rows of D elements
  using SmemAtomN = typename SwizzleAtom<kBlockN>::type;   // rows of BLK_N elements
  using SmemLayoutQdO = decltype(tile_to_shape(SmemAtomD{}, Shape<BlkM, HeadDim>{}));  // (BLK_M, D)
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtomD{}, Shape<BlkN, HeadDim>{}));   // (BLK_N, D)
  using SmemLayoutPdS = decltype(tile_to_shape(SmemAtomN{}, Shape<BlkM, BlkN>{}));     // (BLK_M, BLK_N)
  // Transposed views over the same bytes, the operands of the products that reduce over
  // rows (dK, dV: Qᵀ, dOᵀ, Pᵀ, dSᵀ) or over keys (dQ: Kᵀ).
  using SmemLayoutQdOt = decltype(composition(
      SmemLayoutQdO{}, make_layout(Shape<HeadDim, BlkM>{}, GenRowMajor{})));  // (D, BLK_M)
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<HeadDim, BlkN>{}, GenRowMajor{})));   // (D, BLK_N)
  using SmemLayoutPdSt = decltype(composition(
      SmemLayoutPdS{}, make_layout(Shape<BlkN, BlkM>{}, GenRowMajor{})));     // (BLK_N, BLK_M)
  // Without the swizzle: only the register fragments' shapes come from these.
  using SmemLayoutQdOtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQdOt{}));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));
  using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));

  // ldmatrix addresses of S = Q Kᵀ and dP = dO Vᵀ from one base per operand (gemm_ss_lines,
  // collective_common.cuh) where rows are 64-element lines: a warp's m-tiles are
  // 16·kWarpsMSdP lines apart, its n-pairs 16·kWarpsNSdP.
  static constexpr bool kLineAddressing = SwizzleAtom<kHeadDim>::kLine == 64;
  static constexpr int kLineBytes = 64 * int(sizeof(Element));
  static constexpr int kQdOBlockBytes = kBlockM * kLineBytes;  // between 64-column blocks
  static constexpr int kKVBlockBytes = kBlockN * kLineBytes;   // between 64-column blocks
  static constexpr int kQdOTileBytes = 16 * kWarpsMSdP * kLineBytes;
  static constexpr int kKVTileBytes = 16 * kWarpsNSdP * kLineBytes;

  static constexpr int kSmemQdOBytes = int(cosize_v<SmemLayoutQdO>) * int(sizeof(Element));
  static constexpr int kQdOStageElems = int(cosize_v<SmemLayoutQdO>);  // one Q or dO buffer
  static constexpr int kSmemKVBytes = int(cosize_v<SmemLayoutKV>) * int(sizeof(Element));
  static constexpr int kSmemPdSBytes = int(cosize_v<SmemLayoutPdS>) * int(sizeof(Element));
  // Q (stages), dO (stages), K, V, P, dS; dK and dV leave through K's and V's bytes.
  static constexpr int kSmemBytes =
      2 * kStagesQdO * kSmemQdOBytes + 2 * kSmemKVBytes + 2 * kSmemPdSBytes;

  // ---- global → shared: 16-byte cp.async, cached in L2 only ---------------------------------
  static constexpr int kGmemElemsPerChunk = 16 / int(sizeof(Element));
  static constexpr int kGmemThreadsPerRow = SwizzleAtom<kHeadDim>::kLine / kGmemElemsPerChunk;
  static constexpr int kGmemRowsPerPass = kNThreads / kGmemThreadsPerRow;
  static_assert(kBlockM % kGmemRowsPerPass == 0 && kBlockN % kGmemRowsPerPass == 0,
                "a tile is a whole number of row passes");
  using GmemThreadLayout = Layout<Shape<Int<kGmemRowsPerPass>, Int<kGmemThreadsPerRow>>,
                                  Stride<Int<kGmemThreadsPerRow>, _1>>;  // row-major threads
  using GmemValLayout = Layout<Shape<_1, Int<kGmemElemsPerChunk>>>;      // one 16-byte chunk
  using GmemTiledCopyQKV =
      decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{},
                               GmemThreadLayout{}, GmemValLayout{}));
  using GmemTiledCopydKV = decltype(make_tiled_copy(
      Copy_Atom<UniversalCopy<uint128_t>, Element>{}, GmemThreadLayout{}, GmemValLayout{}));

  // ---- shared ↔ registers ----------------------------------------------------------------
  // The same copy atoms as the forward's traits (fwd_traits.h), named for the backward's
  // operands.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;   // operand stored [m|n][k]
  using SmemCopyAtomT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // operand stored [k][m|n]
  // Accumulators (P, dS, dK, dV) registers → shared, two elements per store.
  using SmemCopyAtomC = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

// The tile shapes per head dim (backward). One CTA owns kBlockN keys and keeps their dK and
// dV accumulators in registers for the whole loop over query blocks; 8 warps.
// Registers per thread: dK + dV hold 2·BLK_N·D/256 floats, S + dP 2·BLK_M·BLK_N/256,
// dQ (live only after S and dP are dead) BLK_M·D/256.
//   hdim  BLK_M × BLK_N  dK+dV  S+dP  dQ  Q/dO stages  smem               warps (S/dP, dK/dV, dQ)
//     64   128 × 128       64   128   32       2       160 KiB            4×2, 4×2, 4×2
//     96    64 × 64        48    32   24       2        88 KiB            4×2, 4×2, 4×2
//    128    64 × 128      128    64   32       2       160 KiB            2×4, 4×2, 2×4
//    192    64 × 64        96    32   48       2       160 KiB            4×2, 2×4, 2×4
//    256    64 × 64       128    32   64     1 (2)     144 (208) KiB      4×2, 2×4, 2×4
// The arrangements give each warp as large a piece of every product as the tile allows
// (32 × 32 or 32 × 64 per step), so that each fragment read from shared memory with
// ldmatrix feeds as many MMAs as possible: the loop is bound by shared-memory reads as much
// as by the tensor cores. Head dim 64 takes 128 query rows per step: half the barriers and
// per-block overhead of 64 rows for the same products, and stores P early (its stores
// interleave with dP = dO Vᵀ).
// Head dim 256 keeps one Q/dO buffer to stay under the 164 KiB an A100 block may use; where
// a block may use 208 KiB (sm_90), its plain kernel (no softcap, no dropout) takes two
// (TraitsLargeSmem, measured +3% on the H100).
// Shaped as FwdConfig (fwd_traits.h), head-dim check included: each pass picks its own tiles,
// warps and stages per head dim, so each keeps its own table.
template <DType kDtype, int kHeadDim>
struct BwdConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 ||
                    kHeadDim == 256,
                "no tile shape for this head dim");
  static constexpr bool kWideN = kHeadDim == 64 || kHeadDim == 128;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;
  static constexpr int kBlockN = kWideN ? 128 : 64;
  static constexpr int kWarpsMSdP = kHeadDim == 128 ? 2 : 4;
  static constexpr int kWarpsNdKV = kWideN || kHeadDim == 96 ? 4 : 2;
  static constexpr int kWarpsMdQ = kHeadDim <= 96 ? 4 : 2;
  static constexpr int kStagesQdO = kHeadDim == 256 ? 1 : 2;
  static constexpr bool kStorePEarly = kHeadDim == 64;
  using Element = typename ElementFor<kDtype>::type;
  using Traits = BwdTraits<Element, kHeadDim, kBlockM, kBlockN, 8, kWarpsMSdP, kWarpsNdKV,
                           kWarpsMdQ, kStagesQdO, kStorePEarly>;
  // The plain kernel where the device allows more shared memory per block than Traits uses
  // (the same tiles, so the same workspace); Traits itself where it would not help.
  static constexpr bool kHasLargeSmem = kHeadDim == 256;
  using TraitsLargeSmem = BwdTraits<Element, kHeadDim, kBlockM, kBlockN, 8, kWarpsMSdP,
                                    kWarpsNdKV, kWarpsMdQ, kHasLargeSmem ? 2 : kStagesQdO,
                                    kStorePEarly>;
};

}  // namespace flashlab::sm80
