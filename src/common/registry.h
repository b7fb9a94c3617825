// The kernel registry: every kernel, CPU or GPU, ladder rung or production, is one entry,
// listed once in src/kernel_list.h. Dispatch, the tests and the benchmark iterate over it,
// so a new kernel is tested and measured the moment it is registered.
#pragma once

#include <span>
#include <string>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab {

struct KernelEntry {
  KernelInfo info;  // has_forward / has_backward / has_kvcache: filled in by the registry from run_*
  // Higher wins when the caller asks for "auto"; 0 = never chosen automatically.
  int auto_priority = 0;

  // Each returns "" when the kernel can run `p`, else the reason in words.
  std::string (*supports_fwd)(const FwdParams& p) = nullptr;
  size_t (*workspace_fwd)(const FwdParams& p) = nullptr;  // nullptr: needs none
  Status (*run_fwd)(const FwdParams& p) = nullptr;

  std::string (*supports_bwd)(const BwdParams& p) = nullptr;
  size_t (*workspace_bwd)(const BwdParams& p) = nullptr;
  Status (*run_bwd)(const BwdParams& p) = nullptr;

  // forward_kvcache on the kernel's device (CPU calls compose forward() instead).
  std::string (*supports_kv)(const KvCacheParams& p) = nullptr;
  size_t (*workspace_kv)(const KvCacheParams& p) = nullptr;
  Status (*run_kv)(const KvCacheParams& p) = nullptr;
};

// Every entry of src/kernel_list.h, in its order.
std::span<const KernelEntry> registry() noexcept;

}  // namespace flashlab
