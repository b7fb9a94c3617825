// The GPU kernels of the registry: the ladder in order (the benchmark's --ladder compares
// each rung with the one before it), then the production kernels.
#include "common/registry.h"
#include "cuda/cuda_kernels.h"

namespace flashlab {

std::span<const KernelEntry> cuda_kernels() noexcept {
  static const KernelEntry entries[] = {
      naive_entry(),    fa1_entry(),          fa2_simt_entry(),
      fa2_mma_entry(),  fa2_simt_bwd_entry(), cute_fa2_fwd_entry(),
  };
  return entries;
}

}  // namespace flashlab
