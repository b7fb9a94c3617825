// The host-side check every CuTe basics program uses: named groups of expectations, each
// group printing one line, failures counted into the exit code. The .cu programs take the
// rest (CUDA_CHECK, the no-GPU skip, the timer) from ../cuda/basics.cuh.
#pragma once

#include <cstdio>

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

}  // namespace basics
