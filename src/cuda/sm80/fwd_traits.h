// Every compile-time choice of the CuTe FlashAttention-2 forward (sm80 path) in one struct:
// tile sizes, warps, the tensor-core MMA, the shared-memory layouts and their swizzle, and
// the copies that move tiles global → shared (cp.async), shared → registers (ldmatrix) and
// registers → shared → global (the O epilogue). The layers (fwd_mainloop.cuh,
// fwd_softmax.cuh, fwd_epilogue.cuh, wired by fwd_kernel.cuh) only compose what is named
// here; FwdConfig at the bottom is the table of tile shapes per head dim.
//
// Shapes are written (rows, cols) with the contiguous dimension last, as in global memory:
// Q and O tiles are (kBlockM, kHeadDim), K and V tiles (kBlockN, kHeadDim).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/sm80/traits_common.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_,
          int kMinBlocksPerSm_>
struct FwdTraits {
  using Element = Element_;
  static_assert(sizeof(Element) == 2, "the m16n8k16 MMA takes 16-bit inputs");

  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per K/V tile
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;  // __launch_bounds__ hint

  using BlkM = Int<kBlockM>;
  using BlkN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;

  static_assert(kHeadDim % 32 == 0, "rows are whole 64-byte swizzle lines");
  static_assert(kBlockM % (16 * kNWarps) == 0, "every warp owns whole 16-row MMA tiles");
  static_assert(kBlockN % 16 == 0, "keys come in whole 16-key MMA k-steps");

  // ---- tensor cores ---------------------------------------------------------------------
  // The warps stack along M: warp w owns rows [16w, 16w + 16) of every 16·kNWarps rows, so
  // a row's scores, max and sum never leave its warp. The N extent of 16 lets one ldmatrix.x4
  // fetch the B fragments of two 8-wide n-tiles at once.
  using TiledMma = TiledMmaOf<Element, kNWarps, 1>;

  // ---- shared memory --------------------------------------------------------------------
  // Rows of D elements in swizzle lines of 64 elements where the head dim allows, else 32.
  static constexpr int kSwizzleCols = SwizzleAtom<kHeadDim>::kLine;
  using SmemLayoutAtom = typename SwizzleAtom<kHeadDim>::type;  // (8, 64|32)
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkM, HeadDim>{}));  // (BLK_M, D)
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{}, Shape<BlkN, HeadDim>{}));  // (BLK_N, D)
  // V read as Vᵀ, the B operand of O = P V: (D, BLK_N) over the same bytes as sV.
  using SmemLayoutVt = decltype(composition(SmemLayoutKV{},
                                            make_layout(Shape<HeadDim, BlkN>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));  // fragment shape only
  using SmemLayoutO = SmemLayoutQ;  // O is staged in Q's smem: (BLK_M, D)

  // ldmatrix addresses of S = Q Kᵀ from one base per operand (line_address,
  // traits_common.h), where rows are 64-element (128-byte) swizzle lines. Q's tile is
  // 64-column blocks of BLK_M lines, K's of BLK_N lines; a warp's m-tiles are 16·kNWarps rows
  // apart (the warps stack along M) and one x4 load of K covers 16 keys.
  static constexpr bool kLineAddressing = kSwizzleCols == 64;
  static constexpr int kLineBytes = kSwizzleCols * int(sizeof(Element));
  static constexpr int kQBlockBytes = kBlockM * kLineBytes;      // between 64-column blocks
  static constexpr int kKVBlockBytes = kBlockN * kLineBytes;     // between 64-column blocks
  static constexpr int kQTileBytes = 16 * kNWarps * kLineBytes;  // between a warp's m-tiles
  static constexpr int kKPairBytes = 16 * kLineBytes;            // between 16-key n-pairs

  static constexpr int kSmemQBytes = int(cosize_v<SmemLayoutQ>) * int(sizeof(Element));
  static constexpr int kSmemKVBytes = int(cosize_v<SmemLayoutKV>) * int(sizeof(Element));
  // Q, then one K tile and one V tile: the main loop alternates their loads (fwd_kernel.cuh).
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;

  // ---- global → shared: 16-byte cp.async, cached in L2 only ---------------------------------
  // One swizzle line of a row is read by kGmemThreadsPerRow consecutive threads (128 or 64
  // contiguous bytes); a thread copies one 16-byte chunk per (row pass, line).
  static constexpr int kGmemElemsPerChunk = 16 / int(sizeof(Element));
  static constexpr int kGmemThreadsPerRow = kSwizzleCols / kGmemElemsPerChunk;
  static_assert(kNThreads % kGmemThreadsPerRow == 0, "threads cover whole rows");
  using GmemThreadLayout =
      Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
             Stride<Int<kGmemThreadsPerRow>, _1>>;  // (thread rows, thread cols), row-major
  using GmemValLayout = Layout<Shape<_1, Int<kGmemElemsPerChunk>>>;  // one 16-byte chunk
  using GmemTiledCopyQKV =
      decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{},
                               GmemThreadLayout{}, GmemValLayout{}));
  using GmemTiledCopyO = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{},
                                                  GmemThreadLayout{}, GmemValLayout{}));
  static_assert(kBlockM % (kNThreads / kGmemThreadsPerRow) == 0 &&
                    kBlockN % (kNThreads / kGmemThreadsPerRow) == 0,
                "a tile is a whole number of row passes");

  // ---- shared → registers: ldmatrix in the MMA's fragment order ----------------------------
  using SmemCopyAtomQK = Copy_Atom<SM75_U32x4_LDSM_N, Element>;  // Q (A) and K (B, [n][k])
  using SmemCopyAtomVt = Copy_Atom<SM75_U16x8_LDSM_T, Element>;  // V (B, stored [k][n])
  // ---- registers → shared for the O epilogue (2-element stores of the C fragment) ----------
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

// The tile shapes per head dim (forward), one CTA per kBlockM query rows and a 64-key K/V
// tile. Up to head dim 128, 128 rows and 4 warps: each owns 32 rows (two 16-row MMA tiles),
// so every K/V fragment it loads from smem feeds two MMAs, and S (64 floats a thread) plus
// O (D floats) fit in 255 registers. Past 128, O alone would not: head dim 192 runs 8 warps
// of 16 rows; head dim 256 runs 64 rows on 4 warps (16 rows each, O 128 floats a thread),
// so that two CTAs share an SM and one's prologue and epilogue hide under the other's
// mainloop (FA2's choice on the H100; against 128 rows on 8 warps, one CTA per SM, measured
// 311 -> 321 TFLOP/s at 8x2048x8x256 and 254 -> 275 causal).
//   hdim  BLK_M  smem (Q + K + V)        warps  CTAs/SM (H100)
//     64   128   16 + 8 + 8   = 32 KiB     4      2
//     96   128   24 + 12 + 12 = 48 KiB     4      2
//    128   128   32 + 16 + 16 = 64 KiB     4      2
//    192   128   48 + 24 + 24 = 96 KiB     8      1
//    256    64   32 + 32 + 32 = 96 KiB     4      2
// At hdim 64, 128 keys per tile (FA2's) would double S's accumulators (128 floats a
// thread): it spills 196 bytes and measured no faster (306 against 309 TFLOP/s at
// 8x2048x32x64, 250 against 261 causal).
template <DType kDtype, int kHeadDim>
struct FwdConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 ||
                    kHeadDim == 256,
                "no tile shape for this head dim");
  static constexpr int kBlockM = kHeadDim == 256 ? 64 : 128;
  static constexpr int kNWarps = kHeadDim == 192 ? 8 : 4;
  static constexpr int kMinBlocksPerSm = kHeadDim == 192 ? 1 : 2;
  using Traits = FwdTraits<typename ElementFor<kDtype>::type, kHeadDim, kBlockM, 64, kNWarps,
                           kMinBlocksPerSm>;
};

}  // namespace flashlab::sm80
