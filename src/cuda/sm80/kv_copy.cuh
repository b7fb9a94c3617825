// The KV-cache kernel's global → shared copies (kv_kernel.cuh): a tile's rows by cp.async,
// one source address per row, rows past the data zero-filled.
#pragma once

#include <cute/tensor.hpp>

namespace flashlab::sm80 {

using namespace cute;

// cp.async of one 16-byte chunk, global → shared, cached in L2 only.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem));
}

// The rows of a tile, global → shared: dst (CPY, CPY_ROWS, CPY_COLS) is this thread's
// partition of the smem tile and coord the same partition of the tile's identity tensor;
// row_ptr(row, m) gives the first element in global memory of the tile's row `row`, the
// thread's m-th, or nullptr for a row past the data, which is zero-filled (zeros, not
// garbage, so that P·V never meets 0·NaN). kAllRows: the caller knows every row is there,
// and the copies go without a test (and without the zero stores' predicated-off issue slots).
template <bool kAllRows = false, class Dst, class Coord, class RowPtr>
__device__ __forceinline__ void load_rows(Dst&& dst, Coord const& coord, RowPtr const& row_ptr) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const auto* src = row_ptr(get<0>(coord(0, m, 0)), m);
    CUTE_UNROLL
    for (int d = 0; d < size<2>(dst); ++d) {
      void* chunk = &dst(0, m, d);
      if (kAllRows || src != nullptr)
        cp_async_16(chunk, src + get<1>(coord(0, m, d)));
      else
        *static_cast<uint4*>(chunk) = make_uint4(0, 0, 0, 0);
    }
  }
}

}  // namespace flashlab::sm80
