// The compile-time building blocks that the forward's and the backward's traits (fwd_traits.h,
// bwd_traits.h) both compose: the m16n8k16 MMA per input type, a warp arrangement of it, the
// swizzled shared-memory atom, and the ldmatrix address arithmetic of 64-element swizzle
// lines. One definition each, so that both passes tile shared memory and the tensor cores the
// same way.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "cuda/cute_common.cuh"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

using namespace cute;
using cute::Tensor;  // not flashlab::Tensor (the public API's view)

using cuda::ElementFor;  // cuda/cute_common.cuh

// The m16n8k16 tensor-core instruction for each 16-bit input type (fp32 accumulate).
template <class Element>
struct MmaAtomFor;
template <>
struct MmaAtomFor<cutlass::half_t> {
  using type = SM80_16x8x16_F32F16F16F32_TN;
};
template <>
struct MmaAtomFor<cutlass::bfloat16_t> {
  using type = SM80_16x8x16_F32BF16BF16F32_TN;
};

// A warp arrangement of m16n8k16 MMAs: kWarpsM × kWarpsN warps, each taking a 16 × 16 piece
// of every tiled step (two 8-wide n-tiles, so one ldmatrix.x4 fetches a B k-step).
template <class Element, int kWarpsM, int kWarpsN>
using TiledMmaOf = TiledMMA<MMA_Atom<typename MmaAtomFor<Element>::type>,
                            Layout<Shape<Int<kWarpsM>, Int<kWarpsN>, _1>>,  // (warps_M, warps_N, warps_K)
                            Tile<Int<16 * kWarpsM>, Int<16 * kWarpsN>, _16>>;  // (M, N, K) of one step

// The (8, kLine) swizzle atom of a tile whose rows hold `kCols` elements: rows are cut into
// 64-element (128-byte) lines when they fit, else 32-element (64-byte) ones. Within each
// 8-row atom the 16-byte chunk index is XOR-ed with the row, so that the 8 rows one ldmatrix
// phase reads, and the chunks one cp.async phase writes, land in different bank groups.
template <int kCols>
struct SwizzleAtom {
  static constexpr int kLine = kCols % 64 == 0 ? 64 : 32;
  static_assert(kCols % kLine == 0, "rows are whole swizzle lines");
  using type = decltype(composition(Swizzle<kLine == 64 ? 3 : 2, 3, 3>{},
                                    Layout<Shape<_8, Int<kLine>>, Stride<Int<kLine>, _1>>{}));
};

// The ldmatrix address of k-step k (16 elements along a 64-element swizzle line) from k-step
// 0's, for a thread whose rows and 16-byte chunks are fixed: k-step k reads chunks 2k and
// 2k + 1 of the line, the swizzle XORs the chunk index with the row (mod 8), and XOR
// commutes with itself, so the address is addr0 ^ 32·(k mod 4); every 4 k-steps the next
// 64-column block begins, block_bytes further. Needs 128-byte-aligned tiles (smem offsets
// are multiples of the tile size). gemm_ss_lines (collective_common.cuh) computes with it.
__host__ __device__ constexpr uint32_t line_address(uint32_t addr0, int k, int block_bytes) {
  return (addr0 ^ uint32_t((k & 3) << 5)) + uint32_t((k >> 2) * block_bytes);
}

}  // namespace flashlab::sm80
