// 01_layouts: what a CuTe layout is, on the host. A layout is a shape and a stride of the same
// nesting; it maps a coordinate to an offset, offset = Σ coordᵢ · strideᵢ, and a single
// integer to the coordinate it names in column-major (colexicographic) order first. Every
// table below is printed by cute::print_layout and every mapping is checked against the
// formula written out by hand. Host-only C++: no GPU, no nvcc.
//   run: examples/basics/cute/01_layouts      (page: docs/learn/basics/cute-layouts.md)
#include <cute/tensor.hpp>

#include "check.h"

using namespace cute;

int main() {
  basics::Check check;
  char what[128];

  // 1. Shape and stride. (4,8) with no stride is column-major: strides (1,4), the prefix
  //    products of the shape. LayoutRight gives row-major: (8,1).
  auto col = make_layout(make_shape(Int<4>{}, Int<8>{}));
  auto row = make_layout(make_shape(Int<4>{}, Int<8>{}), LayoutRight{});
  print("1. column-major "), print_layout(col);
  print("   row-major "), print_layout(row);
  for (int m = 0; m < 4; ++m) {
    for (int n = 0; n < 8; ++n) {
      std::snprintf(what, sizeof what, "col(%d,%d) == m + 4n, row(%d,%d) == 8m + n", m, n, m, n);
      check.expect(col(m, n) == m + 4 * n && row(m, n) == 8 * m + n, what);
    }
  }
  // One integer i is the coordinate (i % 4, i / 4): column-major order whatever the strides.
  for (int i = 0; i < 32; ++i) {
    std::snprintf(what, sizeof what, "col(%d) == %d, row(%d) == 8·(i%%4) + i/4", i, i, i);
    check.expect(col(i) == i && row(i) == 8 * (i % 4) + i / 4, what);
  }
  check.done("shape-stride");

  // 2. Hierarchy. An 8 x 8 matrix stored as 2 x 2 blocks of 4 x 4, each block row-major and
  //    contiguous (16 elements), the blocks row-major too. Row m = m0 + 4·m1 has the nested
  //    shape (4,2) with strides (4,32); column n = n0 + 4·n1 has (4,2) with strides (1,16).
  auto blocked = make_layout(make_shape(make_shape(Int<4>{}, Int<2>{}), make_shape(Int<4>{}, Int<2>{})),
                             make_stride(make_stride(Int<4>{}, Int<32>{}), make_stride(Int<1>{}, Int<16>{})));
  print("2. blocked 8x8 "), print_layout(blocked);
  for (int m = 0; m < 8; ++m) {
    for (int n = 0; n < 8; ++n) {
      const int want = (m / 4) * 32 + (n / 4) * 16 + (m % 4) * 4 + n % 4;
      std::snprintf(what, sizeof what, "blocked(%d,%d) == %d", m, n, want);
      check.expect(blocked(m, n) == want, what);
    }
  }
  check.expect(size(blocked) == 64 && cosize(blocked) == 64, "blocked: 64 elements, no gaps");
  check.done("hierarchy");

  // 3. Composition: (A ∘ B)(c) = A(B(c)). B chooses coordinates, A turns them into offsets.
  //    By mode, with B = (2:2, 4:2), it keeps every other row and every other column of the
  //    4 x 8 row-major A: a 2 x 4 strided view, itself a layout, (2,4):(16,2).
  auto every_other = composition(row, make_tile(Layout<_2, _2>{}, Layout<_4, _2>{}));
  print("3. row-major 4x8 o (2:2, 4:2) = "), print(every_other), print("\n");
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      std::snprintf(what, sizeof what, "every_other(%d,%d) == row(%d,%d)", i, j, 2 * i, 2 * j);
      check.expect(every_other(i, j) == row(2 * i, 2 * j), what);
    }
  }
  // As functions of one integer: (row ∘ b)(k) = row(b(k)) for every k, and CuTe builds
  // the result as a new shape and stride rather than a table.
  auto b = make_layout(make_shape(Int<8>{}, Int<4>{}), make_stride(Int<4>{}, Int<1>{}));
  auto ab = composition(row, b);
  print("   row-major 4x8 o (8,4):(4,1) = "), print(ab), print("\n");
  for (int k = 0; k < 32; ++k) {
    std::snprintf(what, sizeof what, "(row o b)(%d) == row(b(%d))", k, k);
    check.expect(ab(k) == row(b(k)), what);
  }
  check.done("composition");

  // 4. Division: cut an 8 x 16 row-major matrix into 4 x 8 tiles. zipped_divide gives
  //    ((tile coordinates), (which tile)) = ((4,8),(2,2)): mode 0 walks inside one tile,
  //    mode 1 picks the tile. This is how a CTA's tile of a matrix is named.
  auto mat = make_layout(make_shape(Int<8>{}, Int<16>{}), LayoutRight{});
  auto tiles = zipped_divide(mat, make_shape(Int<4>{}, Int<8>{}));
  print("4. zipped_divide(8x16 row-major, 4x8) = "), print(tiles), print("\n");
  for (int ti = 0; ti < 2; ++ti) {
    for (int tj = 0; tj < 2; ++tj) {
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 8; ++j) {
          std::snprintf(what, sizeof what, "tile (%d,%d) element (%d,%d)", ti, tj, i, j);
          check.expect(tiles(make_coord(i, j), make_coord(ti, tj)) == mat(4 * ti + i, 8 * tj + j),
                       what);
        }
      }
    }
  }
  check.done("divide");

  // 5. Products: repeat a 2 x 2 block over a 3 x 4 grid. blocked_product keeps each block's
  //    elements together (the block is the inner mode); raked_product interleaves them
  //    (element (m, n) of block (bm, bn) lands at row m·3 + bm). Thread layouts for copies are
  //    built this way: blocked gives each thread a contiguous piece, raked a strided one.
  auto block = make_layout(make_shape(Int<2>{}, Int<2>{}));  // (2,2):(1,2)
  auto grid = make_layout(make_shape(Int<3>{}, Int<4>{}));   // (3,4):(1,3)
  auto bp = blocked_product(block, grid);
  auto rp = raked_product(block, grid);
  print("5. blocked_product "), print_layout(bp);
  print("   raked_product "), print_layout(rp);
  for (int m = 0; m < 6; ++m) {
    for (int n = 0; n < 8; ++n) {
      const int want_b = block(m % 2, n % 2) + 4 * grid(m / 2, n / 2);
      const int want_r = block(m / 3, n / 4) + 4 * grid(m % 3, n % 4);
      std::snprintf(what, sizeof what, "blocked(%d,%d) == %d, raked == %d", m, n, want_b, want_r);
      check.expect(bp(m, n) == want_b && rp(m, n) == want_r, what);
    }
  }
  check.done("product");
  return check.exit_code();
}
