// The host-side check every CuTe basics program uses: named groups of expectations, each
// group printing one line, failures counted into the exit code. The .cu programs take the
// rest (CUDA_CHECK, the no-GPU skip, the timer) from ../cuda/basics.cuh.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace basics {

// check.expect(cond, "what") prints nothing on success and one line per failure;
// check.done("name") prints `check <name>: ok (N expectations)` or the failure count.
struct Check {
  int passed = 0, failed = 0;
  bool expect(bool ok, const char* what) {
    if (ok) {
      ++passed;
    } else if (++failed <= 10) {
      std::printf("  FAILED: %s\n", what);
    }
    return ok;
  }
  void done(const char* name) {
    if (failed == 0) {
      std::printf("check %s: ok (%d expectations)\n", name, passed);
    } else {
      std::printf("check %s: FAILED (%d of %d)\n", name, failed, passed + failed);
    }
    total_failed += failed;
    passed = failed = 0;
  }
  int exit_code() const { return total_failed == 0 ? 0 : 1; }
  int total_failed = 0;
};

// The largest |got - want|. The GEMM programs feed multiples of 1/8 in [-2, 2]: every product
// is a multiple of 1/64 and every partial sum is exact in fp32, so a correct result differs
// by 0 in any summation order, and a wrong or missing product by a multiple of 1/64.
constexpr double kExactTolerance = 1.0 / 128;
inline double max_abs_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = got.size() == want.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (std::isnan(d)) return INFINITY;  // an element never written (or NaN) fails any tolerance
    worst = std::max(worst, d);
  }
  return worst;
}

}  // namespace basics
