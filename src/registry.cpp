// The one registry: CPU entries, then (in CUDA builds) the GPU entries.
#include <vector>

#include "common/registry.h"
#include "cpu/cpu_kernels.h"

namespace flashlab {

std::span<const KernelEntry> cpu_kernels() noexcept {
  static const KernelEntry entries[] = {cpu_reference_entry(), cpu_flash_entry()};
  return entries;
}

std::span<const KernelEntry> registry() noexcept {
  static const std::vector<KernelEntry> all = [] {
    std::vector<KernelEntry> v;
    for (const KernelEntry& e : cpu_kernels()) v.push_back(e);
#if FLASHLAB_WITH_CUDA
    for (const KernelEntry& e : cuda_kernels()) v.push_back(e);
#endif
    return v;
  }();
  return all;
}

std::span<const KernelInfo> kernels() noexcept {
  static const std::vector<KernelInfo> infos = [] {
    std::vector<KernelInfo> v;
    for (const KernelEntry& e : registry()) v.push_back(e.info);
    return v;
  }();
  return infos;
}

#if !FLASHLAB_WITH_CUDA
bool cuda_available() noexcept { return false; }
#endif

}  // namespace flashlab
