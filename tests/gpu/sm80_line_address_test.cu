// The forward's ldmatrix address arithmetic (line_address, sm80/fwd_traits.h) against CuTe:
// for every thread of every head dim whose Q and K tiles are stored in 64-element swizzle
// lines, the address gemm_qk_lines computes for (m-tile or n-pair, k-step) must be the one
// CuTe's ldmatrix partition of the same tile gives. Layout algebra only: runs on the host.
#include <gtest/gtest.h>

#include <cstdint>

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

template <DType kDtype, int kHeadDim>
void check_line_addresses() {
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
  int checked = 0;
  for (int tid = 0; tid < Tr::kNThreads; ++tid) {
    cute::Tensor q = copy_q.get_thread_slice(tid).partition_S(sQ);  // (CPY, CPY_M, CPY_D)
    cute::Tensor k = copy_k.get_thread_slice(tid).partition_S(sK);  // (CPY, CPY_N, CPY_D)
    const uint32_t q0 = uint32_t(offset_of(q, 0, 0, base));
    const uint32_t k0 = uint32_t(offset_of(k, 0, 0, base));
    for (int s = 0; s < int(size<2>(q)); ++s) {
      for (int m = 0; m < int(size<1>(q)); ++m, ++checked)
        ASSERT_EQ(int(sm80::line_address(q0, s, Tr::kQBlockBytes)) + m * Tr::kQTileBytes,
                  offset_of(q, m, s, base))
            << "Q: head dim " << kHeadDim << ", thread " << tid << ", m-tile " << m
            << ", k-step " << s;
      for (int n = 0; n < int(size<1>(k)); ++n, ++checked)
        ASSERT_EQ(int(sm80::line_address(k0, s, Tr::kKVBlockBytes)) + n * Tr::kKPairBytes,
                  offset_of(k, n, s, base))
            << "K: head dim " << kHeadDim << ", thread " << tid << ", n-pair " << n
            << ", k-step " << s;
    }
  }
  // The partitions have the shapes gemm_qk_lines assumes: D/16 k-steps, BLK_M/(16·warps)
  // m-tiles a warp, BLK_N/16 n-pairs.
  EXPECT_EQ(checked, Tr::kNThreads * (kHeadDim / 16) *
                         (Tr::kBlockM / (16 * Tr::kNWarps) + Tr::kBlockN / 16));
}

TEST(Sm80LineAddress, MatchesCuteForEveryThread) {
  check_line_addresses<DType::kBF16, 64>();
  check_line_addresses<DType::kBF16, 128>();
  check_line_addresses<DType::kBF16, 192>();
  check_line_addresses<DType::kBF16, 256>();
  check_line_addresses<DType::kF16, 128>();
  static_assert(!sm80::FwdConfig<DType::kBF16, 96>::Traits::kLineAddressing,
                "head dim 96 keeps 32-element lines and CuTe's addresses");
}

}  // namespace
}  // namespace flashlab::test
