// 03_swizzle: why Swizzle<3,3,3> removes shared-memory bank conflicts, counted on the host.
// Shared memory has 32 banks of 4 bytes; a request of 16 bytes per thread (ldmatrix, a 128-bit
// load or store, cp.async's write) is served a quarter-warp at a time: in each phase 8 threads
// name 8 addresses, and the phase takes as many wavefronts as the busiest bank has distinct
// 4-byte words to deliver. The program lays a 64 x 64 bf16 tile (the A tile of 05_gemm.cu)
// out three ways, plain row-major, padded rows and swizzled, replays two access patterns on each
// and counts wavefronts: the ldmatrix.x4 reads that feed mma.sync (8 rows of one 16-byte
// column chunk per phase) and the cp.async writes (one 128-byte row per phase).
// Host-only C++.
//   run: examples/basics/cute/03_swizzle      (page: docs/learn/basics/cute-swizzle.md)
#include <cute/tensor.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "check.h"

using namespace cute;

namespace {

constexpr int kRows = 64, kCols = 64, kElem = 2;  // bf16

// Wavefronts of one phase: 8 addresses of 16 bytes each.
int wavefronts(const std::vector<int>& byte_addrs) {
  std::set<int> words[32];
  for (int a : byte_addrs) {
    for (int w = a / 4; w < a / 4 + 4; ++w) words[w % 32].insert(w);
  }
  size_t most = 0;
  for (const auto& s : words) most = std::max(most, s.size());
  return int(most);
}

struct Count {
  int phases = 0, waves = 0, worst = 0;
  void add(int w) { ++phases, waves += w, worst = std::max(worst, w); }
};

// ldmatrix.x4 over every 16 x 16 block of the tile: phase p of a block at (r0, c0) reads
// rows r0 + 8·(p%2) .. +7 at columns c0 + 8·(p/2) .. +7 (matrix p of the four).
template <class Layout>
Count ldmatrix_reads(const Layout& layout) {
  Count c;
  for (int r0 = 0; r0 < kRows; r0 += 16) {
    for (int c0 = 0; c0 < kCols; c0 += 16) {
      for (int p = 0; p < 4; ++p) {
        std::vector<int> addrs;
        for (int i = 0; i < 8; ++i) addrs.push_back(int(layout(r0 + 8 * (p % 2) + i, c0 + 8 * (p / 2))) * kElem);
        c.add(wavefronts(addrs));
      }
    }
  }
  return c;
}

// The copy of 02_tensors.cpp: 128 threads as 16 x 8, thread t writes 16 bytes at row
// t/8 + 16·i, column 8·(t%8); a phase is 8 consecutive threads, one row.
template <class Layout>
Count cp_async_writes(const Layout& layout) {
  Count c;
  for (int i = 0; i < kRows / 16; ++i) {
    for (int phase = 0; phase < 16; ++phase) {
      std::vector<int> addrs;
      for (int t = 8 * phase; t < 8 * phase + 8; ++t) addrs.push_back(int(layout(t / 8 + 16 * i, 8 * (t % 8))) * kElem);
      c.add(wavefronts(addrs));
    }
  }
  return c;
}

template <class Layout>
void report(const char* name, const Layout& layout, int bytes, Count& ld, Count& st) {
  ld = ldmatrix_reads(layout);
  st = cp_async_writes(layout);
  std::printf("%-22s %8d %10d %9.2f %11d %12d %9.2f\n", name, bytes, ld.phases, double(ld.waves) / ld.phases,
              ld.waves - ld.phases, st.phases, double(st.waves) / st.phases);
}

}  // namespace

int main() {
  basics::Check check;
  char what[128];

  // Swizzle<3,3,3> on an element offset: bits [3,6) (the 16-byte chunk within a 128-byte row)
  // are XORed with bits [6,9) (the row mod 8). Chunk j of row r is stored at chunk j ^ (r % 8).
  // The atom is 8 rows x 64 bf16; tile_to_shape repeats it over the 64 x 64 tile.
  auto atom = composition(Swizzle<3, 3, 3>{}, make_layout(make_shape(Int<8>{}, Int<64>{}), LayoutRight{}));
  auto swizzled = tile_to_shape(atom, make_shape(Int<kRows>{}, Int<kCols>{}));
  auto plain = make_layout(make_shape(Int<kRows>{}, Int<kCols>{}), LayoutRight{});
  auto padded = make_layout(make_shape(Int<kRows>{}, Int<kCols>{}), make_stride(Int<kCols + 8>{}, Int<1>{}));

  // The same swizzle on chunk indices (8 chunks of 16 bytes per row): row r, chunk j.
  print("Swizzle<3,0,3> on 8 rows of 8 16-byte chunks: the offset, in chunks, of (row, chunk)\n");
  print_layout(composition(Swizzle<3, 0, 3>{}, make_layout(make_shape(Int<8>{}, Int<8>{}), LayoutRight{})));
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const int want = r * kCols + ((c / 8) ^ (r % 8)) * 8 + c % 8;
      std::snprintf(what, sizeof what, "swizzled(%d,%d) == %d", r, c, want);
      check.expect(int(swizzled(r, c)) == want, what);
    }
  }
  check.done("swizzle-formula");

  std::printf("\n%-22s %8s %10s %9s %11s %12s %9s\n", "64 x 64 bf16 tile", "bytes", "ldmatrix", "waves", "conflicts",
              "cp.async", "waves");
  std::printf("%-22s %8s %10s %9s %11s %12s %9s\n", "", "", "phases", "/phase", "(extra)", "phases", "/phase");
  Count ld_plain, st_plain, ld_pad, st_pad, ld_swz, st_swz;
  report("row-major", plain, kRows * kCols * kElem, ld_plain, st_plain);
  report("padded rows (+8)", padded, kRows * (kCols + 8) * kElem, ld_pad, st_pad);
  report("Swizzle<3,3,3>", swizzled, kRows * kCols * kElem, ld_swz, st_swz);

  // Row-major: 8 rows 128 bytes apart start in the same bank, so the 8 addresses of a phase
  // fall in the same 4 banks: 8 wavefronts where 1 would do.
  check.expect(ld_plain.worst == 8 && ld_plain.waves == 8 * ld_plain.phases, "row-major ldmatrix: 8-way");
  check.expect(ld_pad.worst == 1 && ld_swz.worst == 1, "padded and swizzled ldmatrix: conflict-free");
  check.expect(st_plain.worst == 1 && st_pad.worst == 1 && st_swz.worst == 1, "row writes: conflict-free in all three");
  check.done("bank-conflicts");
  return check.exit_code();
}
