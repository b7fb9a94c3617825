// 02_tensors: a CuTe tensor is a pointer (or an iterator) and a layout; tiling and partitioning
// are layout algebra on it, so they can be checked on the host. The identity tensor, whose
// element at (m, n) is the coordinate (m, n) itself, shows which coordinates a partition hands
// to each thread: the program checks a thread partition, the 16-byte copy partition that the
// GEMM of 05_gemm.cu uses, and the mma.sync m16n8k16 fragments against the register tables of
// NVIDIA's PTX ISA. Host-only C++.
//   run: examples/basics/cute/02_tensors      (page: docs/learn/basics/cute-layouts.md)
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>

#include <vector>

#include "check.h"

using namespace cute;

int main() {
  basics::Check check;
  char what[160];

  // 1. A tensor over host memory: a 16 x 32 row-major matrix whose (m, n) holds 100·m + n.
  std::vector<float> data(16 * 32);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 32; ++n) data[m * 32 + n] = float(100 * m + n);
  }
  Tensor mat = make_tensor(data.data(), make_layout(make_shape(Int<16>{}, Int<32>{}), LayoutRight{}));
  print("1. tensor "), print(mat.layout()), print("\n");
  check.expect(mat(3, 5) == 305.f && &mat(3, 5) == &data[3 * 32 + 5], "mat(3,5) reads data[101]");

  // 2. local_tile: the 8 x 8 tile at tile coordinate (1, 2), rows 8-15, columns 16-23. The
  //    tile is a tensor too: its pointer moved to the tile's corner, its strides unchanged.
  Tensor tile = local_tile(mat, make_shape(Int<8>{}, Int<8>{}), make_coord(1, 2));
  print("2. local_tile(mat, 8x8, (1,2)) "), print(tile.layout()), print("\n");
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) std::printf("%6.0f", tile(i, j));
    std::printf("\n");
  }
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      std::snprintf(what, sizeof what, "tile(%d,%d) == mat(%d,%d)", i, j, 8 + i, 16 + j);
      check.expect(tile(i, j) == float(100 * (8 + i) + 16 + j), what);
    }
  }
  check.done("tile");

  // 3. local_partition: 8 threads as a 2 x 4 grid (row-major ids) share the 8 x 8 tile; thread
  //    (tm, tn) gets the 4 x 2 elements (tm + 2i, tn + 4j), a strided (interleaved) partition.
  auto threads = make_layout(make_shape(Int<2>{}, Int<4>{}), LayoutRight{});
  Tensor coords = make_identity_tensor(make_shape(Int<8>{}, Int<8>{}));
  int owners[8][8] = {};
  for (int t = 0; t < 8; ++t) {
    Tensor mine = local_partition(coords, threads, t);  // (4, 2) coordinates
    const int tm = t / 4, tn = t % 4;
    for (int i = 0; i < size<0>(mine); ++i) {
      for (int j = 0; j < size<1>(mine); ++j) {
        const auto c = mine(i, j);
        ++owners[get<0>(c)][get<1>(c)];
        std::snprintf(what, sizeof what, "thread %d element (%d,%d) is (%d,%d)", t, i, j,
                      tm + 2 * i, tn + 4 * j);
        check.expect(get<0>(c) == tm + 2 * i && get<1>(c) == tn + 4 * j, what);
      }
    }
  }
  for (int m = 0; m < 8; ++m) {
    for (int n = 0; n < 8; ++n) check.expect(owners[m][n] == 1, "every element has one owner");
  }
  check.done("local_partition");

  // 4. A TiledCopy: 128 threads as 16 x 8 (row-major), each moving 8 contiguous bf16 (16 bytes,
  //    one cp.async or one vector load), over a 64 x 64 tile. Thread t copies row t/8 + 16·i,
  //    columns 8·(t%8) .. +7: eight threads cover one 128-byte row, so a warp's loads coalesce.
  auto copy = make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, bfloat16_t>{},
                              make_layout(make_shape(Int<16>{}, Int<8>{}), LayoutRight{}),
                              make_layout(make_shape(Int<1>{}, Int<8>{})));
  Tensor tile_coords = make_identity_tensor(make_shape(Int<64>{}, Int<64>{}));
  int copied[64][64] = {};
  for (int t = 0; t < 128; ++t) {
    Tensor src = copy.get_slice(t).partition_S(tile_coords);  // (CPY = 8, CPY_M = 4, CPY_N = 1)
    if (t == 0) print("4. TiledCopy 16x8 threads x 8 values: thread 0's partition "), print(src.layout()), print("\n");
    for (int v = 0; v < 8; ++v) {
      for (int i = 0; i < 4; ++i) {
        const auto c = src(v, i, 0);
        ++copied[get<0>(c)][get<1>(c)];
        std::snprintf(what, sizeof what, "copy thread %d value %d block %d", t, v, i);
        check.expect(get<0>(c) == t / 8 + 16 * i && get<1>(c) == 8 * (t % 8) + v, what);
      }
    }
  }
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 64; ++n) check.expect(copied[m][n] == 1, "every element copied once");
  }
  check.done("tiled_copy");

  // 5. The MMA atom's fragments. mma.sync.m16n8k16 with bf16 inputs: lane = 4·g + t (g the
  //    group, t the thread in the group). The PTX ISA's tables: A (16 x 16) register i holds
  //    row g + 8·((i/2)%2), column 2t + i%2 + 8·(i/4); B (stored N x K here, 8 x 16) register i
  //    holds n = g, k = 2t + i%2 + 8·(i/2); C (16 x 8) register i holds row g + 8·(i/2),
  //    column 2t + i%2. CuTe's atom must agree with all three.
  auto mma = make_tiled_mma(SM80_16x8x16_F32BF16BF16F32_TN{});
  char table[16][8][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    auto thr = mma.get_slice(lane);
    const int g = lane / 4, t = lane % 4;
    Tensor a = thr.partition_A(make_identity_tensor(make_shape(Int<16>{}, Int<16>{})));
    Tensor b = thr.partition_B(make_identity_tensor(make_shape(Int<8>{}, Int<16>{})));
    Tensor c = thr.partition_C(make_identity_tensor(make_shape(Int<16>{}, Int<8>{})));
    for (int i = 0; i < 8; ++i) {
      std::snprintf(what, sizeof what, "lane %d A register %d", lane, i);
      check.expect(get<0>(a(i)) == g + 8 * ((i / 2) % 2) && get<1>(a(i)) == 2 * t + i % 2 + 8 * (i / 4), what);
    }
    for (int i = 0; i < 4; ++i) {
      std::snprintf(what, sizeof what, "lane %d B register %d", lane, i);
      check.expect(get<0>(b(i)) == g && get<1>(b(i)) == 2 * t + i % 2 + 8 * (i / 2), what);
      std::snprintf(what, sizeof what, "lane %d C register %d", lane, i);
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      check.expect(get<0>(c(i)) == row && get<1>(c(i)) == col, what);
      std::snprintf(table[row][col], sizeof table[row][col], "T%d.%d", lane, i);
    }
  }
  print("5. mma.sync m16n8k16 C fragment: which lane.register holds C(m, n)\n");
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) std::printf("%7s", table[m][n]);
    std::printf("\n");
  }
  check.done("mma_fragments");
  return check.exit_code();
}
