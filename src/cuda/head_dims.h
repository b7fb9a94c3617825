// The head dims the CuTe kernels (cute_fa2, cute_fa3) are compiled for. CMake's
// FLASHLAB_HEAD_DIMS builds a subset (fewer instantiations, a shorter build) and passes it
// to the two dispatch files and two GPU tests (KV cache, deterministic backward), the only
// ones that include this header, as FLASHLAB_HEAD_DIMS_MASK: bit i for kCuteHeadDims[i]. A
// build without it has them all.
#pragma once

#include <cstddef>
#include <string>

#ifndef FLASHLAB_HEAD_DIMS_MASK
#define FLASHLAB_HEAD_DIMS_MASK 31
#endif

namespace flashlab::cuda {

inline constexpr int kCuteHeadDims[] = {64, 96, 128, 192, 256};

constexpr bool head_dim_built(int d) {
  for (int i = 0; i < 5; ++i)
    if (kCuteHeadDims[i] == d) return (FLASHLAB_HEAD_DIMS_MASK >> i) & 1;
  return false;
}

// "" when head dim d is one of the kernel's own (`own`; `offered` says them in words, e.g.
// "64, 128 or 256") and this build compiled it; else the reason, naming the argument.
template <size_t N>
std::string refuse_head_dim(int d, const int (&own)[N], const char* offered) {
  bool is_own = false;
  for (int x : own) is_own |= x == d;
  if (!is_own) return "head_dim must be " + std::string(offered) + ", got " + std::to_string(d);
  if (head_dim_built(d)) return "";
  std::string built;
  for (int x : own)
    if (head_dim_built(x)) built += (built.empty() ? "" : ", ") + std::to_string(x);
  return "head_dim " + std::to_string(d) + " is not compiled in this build (FLASHLAB_HEAD_DIMS; " +
         (built.empty() ? std::string("none of this kernel's are") : "built: " + built) + ")";
}

}  // namespace flashlab::cuda
