// The one registry, built from src/kernel_list.h: a static table, filled in on first use
// without touching the heap.
#include <array>

#include "common/registry.h"

namespace flashlab {

#define FL_KERNEL(ns, f) namespace ns { KernelEntry f(); }
#include "kernel_list.h"
#undef FL_KERNEL

namespace {

constexpr size_t kCount = 0
#define FL_KERNEL(ns, f) +1
#include "kernel_list.h"
#undef FL_KERNEL
    ;

// The entries as their files define them; a pass exists where its run() does, so the info's
// has_forward / has_backward are filled in here rather than written twice in every entry.
const std::array<KernelEntry, kCount>& table() noexcept {
  static const std::array<KernelEntry, kCount> entries = [] {
    std::array<KernelEntry, kCount> a = {
#define FL_KERNEL(ns, f) ns::f(),
#include "kernel_list.h"
#undef FL_KERNEL
    };
    for (KernelEntry& e : a) {
      e.info.has_forward = e.run_fwd != nullptr;
      e.info.has_backward = e.run_bwd != nullptr;
      e.info.has_kvcache = e.run_kv != nullptr;
    }
    return a;
  }();
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
