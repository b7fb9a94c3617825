// The ldmatrix address arithmetic of gemm_ss_lines (line_address, sm80/fwd_traits.h) against
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

template <DType kDtype, int kHeadDim>
void check_forward() {
  using Tr = typename sm80::FwdConfig<kDtype, kHeadDim>::Traits;
  using Element = typename Tr::Element;
  static_assert(Tr::kLineAddressing, "only head dims stored in 64-element lines");
  // A 1 KiB-aligned stand-in for the smem tiles (only addresses are compared).
  static Element storage[cosize_v<typename Tr::SmemLayoutQ>] __attribute__((aligned(1024)));
  Element* base = &storage[0];
  cute::Tensor sQ = make_tensor(base, typename Tr::SmemLayoutQ{});   // (BLK_M, D)
  cute::Tensor sK = make_tensor(base, typename Tr::SmemLayoutKV{});  // (BLK_N, D)
  typename Tr::TiledMma mma;
  auto copy_q = make_tiled_copy_A(typename Tr::SmemCopyAtomQK{}, mma);
  auto copy_k = make_tiled_copy_B(typename Tr::SmemCopyAtomQK{}, mma);
  SCOPED_TRACE(testing::Message() << "forward, head dim " << kHeadDim);
  const int q = check_operand(
      "Q", Tr::kNThreads, [&](int t) { return copy_q.get_thread_slice(t).partition_S(sQ); },
      base, Tr::kQTileBytes, Tr::kQBlockBytes);
  const int k = check_operand(
      "K", Tr::kNThreads, [&](int t) { return copy_k.get_thread_slice(t).partition_S(sK); },
      base, Tr::kKPairBytes, Tr::kKVBlockBytes);
  // The partitions have the shapes assumed: D/16 k-steps, BLK_M/(16·warps) m-tiles a warp,
  // BLK_N/16 n-pairs.
  EXPECT_EQ(q, Tr::kNThreads * (kHeadDim / 16) * (Tr::kBlockM / (16 * Tr::kNWarps)));
  EXPECT_EQ(k, Tr::kNThreads * (kHeadDim / 16) * (Tr::kBlockN / 16));
}

template <class Tr>
void check_backward() {
  using Element = typename Tr::Element;
  static_assert(Tr::kLineAddressing, "only head dims stored in 64-element lines");
  static Element storage[cosize_v<typename Tr::SmemLayoutQdO>] __attribute__((aligned(1024)));
  Element* base = &storage[0];
  cute::Tensor sQ = make_tensor(base, typename Tr::SmemLayoutQdO{});  // (BLK_M, D)
  cute::Tensor sK = make_tensor(base, typename Tr::SmemLayoutKV{});   // (BLK_N, D)
  typename Tr::TiledMmaSdP mma;
  auto copy_a = make_tiled_copy_A(typename Tr::SmemCopyAtom{}, mma);
  auto copy_b = make_tiled_copy_B(typename Tr::SmemCopyAtom{}, mma);
  SCOPED_TRACE(testing::Message() << "backward, head dim " << Tr::kHeadDim);
  const int q = check_operand(
      "Q/dO", Tr::kNThreads, [&](int t) { return copy_a.get_thread_slice(t).partition_S(sQ); },
      base, Tr::kQdOTileBytes, Tr::kQdOBlockBytes);
  const int k = check_operand(
      "K/V", Tr::kNThreads, [&](int t) { return copy_b.get_thread_slice(t).partition_S(sK); },
      base, Tr::kKVTileBytes, Tr::kKVBlockBytes);
  EXPECT_EQ(q, Tr::kNThreads * (Tr::kHeadDim / 16) * (Tr::kBlockM / (16 * Tr::kWarpsMSdP)));
  EXPECT_EQ(k, Tr::kNThreads * (Tr::kHeadDim / 16) * (Tr::kBlockN / (16 * Tr::kWarpsNSdP)));
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
