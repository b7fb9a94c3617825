// The ldmatrix address arithmetic of gemm_ss_lines (line_address, sm80/traits_common.h) against
// CuTe: for every thread of every head dim whose operands are stored in 64-element swizzle
// lines, the address computed for (m-tile or n-pair, k-step) must be the one CuTe's ldmatrix
// partition of the same tile gives: the forward's Q and K, the backward's Q/dO and K/V.
// Layout algebra only: runs on the host.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm80/bwd_traits.h"
#include "cuda/sm80/fwd_traits.h"

namespace flashlab::test {
namespace {

using namespace cute;

// Byte offset of a partition's value 0 at (tile i, k-step k) from the tile's start.
template <class Part, class Element>
int offset_of(Part const& part, int i, int k, Element const* base) {
  return int(reinterpret_cast<const char*>(&part(0, i, k)) -
             reinterpret_cast<const char*>(base));
}

// Checks one operand: `part(tid)` is thread tid's ldmatrix partition (CPY, tiles, k-steps)
// of a tile at `base`; returns how many (thread, tile, k-step) addresses it compared.
template <class PartOf, class Element>
int check_operand(const char* what, int threads, PartOf part_of, const Element* base,
                  int tile_bytes, int block_bytes) {
  int checked = 0;
  for (int tid = 0; tid < threads; ++tid) {
    auto part = part_of(tid);
    const uint32_t a0 = uint32_t(offset_of(part, 0, 0, base));
    for (int k = 0; k < int(size<2>(part)); ++k)
      for (int i = 0; i < int(size<1>(part)); ++i, ++checked) {
        const int mine = int(sm80::line_address(a0, k, block_bytes)) + i * tile_bytes;
        if (mine != offset_of(part, i, k, base)) {
          ADD_FAILURE() << what << ": thread " << tid << ", tile " << i << ", k-step " << k
                        << ": " << mine << " against CuTe's " << offset_of(part, i, k, base);
          return checked;
        }
      }
  }
  return checked;
}

// One A·Bᵀ product whose operands are both (rows, D) tiles in 64-element lines: A with
// layout LayoutA (rows_a rows), B with LayoutB, read through CopyAtom as TiledMma's A and B
// operands by `threads` threads whose warps stack warps_m along M and warps_n along N.
// The partitions must have the shapes gemm_ss_lines assumes: D/16 k-steps,
// rows/(16·warps) tiles a warp.
template <class Element, class TiledMma, class CopyAtom, class LayoutA, class LayoutB>
void check_product(int threads, int head_dim, int rows_a, int rows_b, int warps_m,
                   int warps_n, int tile_a, int block_a, int tile_b, int block_b) {
  // A 1 KiB-aligned stand-in for the smem tiles (only addresses are compared).
  static Element storage[cosize_v<LayoutA> > cosize_v<LayoutB> ? cosize_v<LayoutA>
                                                                : cosize_v<LayoutB>]
      __attribute__((aligned(1024)));
  Element* base = &storage[0];
  cute::Tensor sA = make_tensor(base, LayoutA{});  // (rows_a, D)
  cute::Tensor sB = make_tensor(base, LayoutB{});  // (rows_b, D)
  TiledMma mma;
  auto copy_a = make_tiled_copy_A(CopyAtom{}, mma);
  auto copy_b = make_tiled_copy_B(CopyAtom{}, mma);
  const int a = check_operand(
      "A", threads, [&](int t) { return copy_a.get_thread_slice(t).partition_S(sA); }, base,
      tile_a, block_a);
  const int b = check_operand(
      "B", threads, [&](int t) { return copy_b.get_thread_slice(t).partition_S(sB); }, base,
      tile_b, block_b);
  EXPECT_EQ(a, threads * (head_dim / 16) * (rows_a / (16 * warps_m)));
  EXPECT_EQ(b, threads * (head_dim / 16) * (rows_b / (16 * warps_n)));
}

// The forward's S = Q Kᵀ (warps stacked along M only).
template <DType kDtype, int kHeadDim>
void check_forward() {
  using Tr = typename sm80::FwdConfig<kDtype, kHeadDim>::Traits;
  static_assert(Tr::kLineAddressing, "only head dims stored in 64-element lines");
  SCOPED_TRACE(testing::Message() << "forward Q (A), K (B), head dim " << kHeadDim);
  check_product<typename Tr::Element, typename Tr::TiledMma, typename Tr::SmemCopyAtomQK,
                typename Tr::SmemLayoutQ, typename Tr::SmemLayoutKV>(
      Tr::kNThreads, kHeadDim, Tr::kBlockM, Tr::kBlockN, Tr::kNWarps, 1, Tr::kQTileBytes,
      Tr::kQBlockBytes, Tr::kKPairBytes, Tr::kKVBlockBytes);
}

// The backward's S = Q Kᵀ and dP = dO Vᵀ (the same layouts for Q and dO, K and V).
template <class Tr>
void check_backward() {
  static_assert(Tr::kLineAddressing, "only head dims stored in 64-element lines");
  SCOPED_TRACE(testing::Message() << "backward Q/dO (A), K/V (B), head dim " << Tr::kHeadDim);
  check_product<typename Tr::Element, typename Tr::TiledMmaSdP, typename Tr::SmemCopyAtom,
                typename Tr::SmemLayoutQdO, typename Tr::SmemLayoutKV>(
      Tr::kNThreads, Tr::kHeadDim, Tr::kBlockM, Tr::kBlockN, Tr::kWarpsMSdP, Tr::kWarpsNSdP,
      Tr::kQdOTileBytes, Tr::kQdOBlockBytes, Tr::kKVTileBytes, Tr::kKVBlockBytes);
}

TEST(Sm80LineAddress, ForwardMatchesCuteForEveryThread) {
  check_forward<DType::kBF16, 64>();
  check_forward<DType::kBF16, 128>();
  check_forward<DType::kBF16, 192>();
  check_forward<DType::kBF16, 256>();
  check_forward<DType::kF16, 128>();
  static_assert(!sm80::FwdConfig<DType::kBF16, 96>::Traits::kLineAddressing,
                "head dim 96 keeps 32-element lines and CuTe's addresses");
}

TEST(Sm80LineAddress, BackwardMatchesCuteForEveryThread) {
  check_backward<sm80::BwdConfig<DType::kBF16, 64>::Traits>();
  check_backward<sm80::BwdConfig<DType::kBF16, 128>::Traits>();
  check_backward<sm80::BwdConfig<DType::kBF16, 192>::Traits>();
  check_backward<sm80::BwdConfig<DType::kBF16, 256>::Traits>();
  check_backward<sm80::BwdConfig<DType::kBF16, 256>::TraitsLargeSmem>();
  check_backward<sm80::BwdConfig<DType::kF16, 64>::Traits>();
  static_assert(!sm80::BwdConfig<DType::kBF16, 96>::Traits::kLineAddressing,
                "head dim 96 keeps 32-element lines and CuTe's addresses");
}

}  // namespace
}  // namespace flashlab::test
