// CuTe smoke test: proves the CUTLASS headers were found (or fetched by cmake/cutlass.cmake)
// and that CuTe compiles with this nvcc and these -gencode flags, on the host and, when a
// device is present, inside a kernel. Deliberately tiny: layout algebra only.
#include <gtest/gtest.h>

#include <cute/layout.hpp>
#include <vector>

#include "gpu/gpu_fixture.h"

namespace flashlab::test {
namespace {

using namespace cute;

// An 8 x 16 tile, column-major by default: element (m, n) at m + 8·n.
using Tile = decltype(make_layout(make_shape(Int<8>{}, Int<16>{})));

TEST(CuteSmoke, HostLayoutAlgebra) {
  const Tile tile{};
  EXPECT_EQ(int(size(tile)), 128);
  EXPECT_EQ(int(cosize(tile)), 128);
  EXPECT_EQ(int(tile(3, 2)), 3 + 8 * 2);
  EXPECT_EQ(int(tile(7, 15)), 127);

  // Row-major with a padded row (stride 20): cosize counts the padding it skips.
  const auto padded = make_layout(make_shape(Int<8>{}, Int<16>{}), make_stride(Int<20>{}, Int<1>{}));
  EXPECT_EQ(int(size(padded)), 128);
  EXPECT_EQ(int(cosize(padded)), 7 * 20 + 15 + 1);
  EXPECT_EQ(int(padded(3, 2)), 3 * 20 + 2);
  static_assert(decltype(size(Tile{}))::value == 128, "static sizes stay compile-time");
}

// Each thread writes the offset the layout gives its (m, n) coordinate.
__global__ void layout_offsets(int* out) {
  const Tile tile{};
  const int i = int(threadIdx.x);
  const int m = i % 8, n = i / 8;
  out[i] = int(tile(m, n));
}

TEST_F(GpuTest, CuteLayoutInKernel) {
  constexpr int kN = 128;
  DeviceBuffer buf(kN * sizeof(int));
  ASSERT_TRUE(buf.ok());
  layout_offsets<<<1, kN>>>(static_cast<int*>(buf.get()));
  ASSERT_TRUE(cuda_ok(cudaGetLastError(), "layout_offsets launch"));
  ASSERT_TRUE(cuda_ok(cudaDeviceSynchronize(), "layout_offsets"));
  std::vector<int> got(kN, -1);
  ASSERT_TRUE(buf.download(got.data(), kN * sizeof(int)));
  for (int i = 0; i < kN; ++i) EXPECT_EQ(got[i], i) << "thread " << i;
}

}  // namespace
}  // namespace flashlab::test
