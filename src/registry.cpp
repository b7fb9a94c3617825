// The one registry, built from src/kernel_list.h: a static table, filled in on first use
// without touching the heap.
#include <array>

#include "common/registry.h"

namespace flashlab {

#define FL_KERNEL(f) KernelEntry f();
#include "kernel_list.h"
#undef FL_KERNEL

namespace {

constexpr size_t kCount = 0
#define FL_KERNEL(f) +1
#include "kernel_list.h"
#undef FL_KERNEL
    ;

const std::array<KernelEntry, kCount>& table() noexcept {
  static const std::array<KernelEntry, kCount> entries = {
#define FL_KERNEL(f) f(),
#include "kernel_list.h"
#undef FL_KERNEL
  };
  return entries;
}

}  // namespace

std::span<const KernelEntry> registry() noexcept { return table(); }

std::span<const KernelInfo> kernels() noexcept {
  static const std::array<KernelInfo, kCount> infos = [] {
    std::array<KernelInfo, kCount> v{};
    for (size_t i = 0; i < kCount; ++i) v[i] = table()[i].info;
    return v;
  }();
  return infos;
}

#if !FLASHLAB_WITH_CUDA
bool cuda_available() noexcept { return false; }
#endif

}  // namespace flashlab
