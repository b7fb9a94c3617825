// The GPU kernels of the registry: the ladder in order (the benchmark's --ladder compares
// each rung with the one before it), then the production kernels.
#include "common/registry.h"
#include "cuda/cuda_kernels.h"

namespace flashlab {

std::span<const KernelEntry> cuda_kernels() noexcept {
  static const KernelEntry entries[] = {
      naive_entry(),    fa1_entry(),          fa2_simt_entry(),
      fa2_mma_entry(),  fa2_simt_bwd_entry(), cute_fa2_fwd_entry(),
#if defined(FLASHLAB_WITH_SM90)
      cute_fa3_fwd_entry(),  // built only when 90a is in FLASHLAB_CUDA_ARCHS
      cute_fa3_ablation_entry(0), cute_fa3_ablation_entry(1), cute_fa3_ablation_entry(2),
      cute_fa3_ablation_entry(3),
#endif
  };
  return entries;
}

}  // namespace flashlab
