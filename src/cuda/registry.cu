// The GPU kernels of the registry, in ladder order (the benchmark's --ladder compares each
// rung with the one before it).
#include "common/registry.h"
#include "cuda/cuda_kernels.h"

namespace flashlab {

std::span<const KernelEntry> cuda_kernels() noexcept {
  static const KernelEntry entries[] = {
      naive_entry(), fa1_entry(), fa2_simt_entry(), fa2_mma_entry(), fa2_simt_bwd_entry(),
  };
  return entries;
}

}  // namespace flashlab
