// cpu_flash's registry entry: what it supports, and the variant that runs it (isa.h). The
// kernel itself is flash_forward.inc and flash_backward.inc, compiled once per instruction
// set (flash_<isa>.cpp); each call goes to the variant picked for the process.
#include <cstdio>
#include <string>

#include "common/registry.h"
#include "cpu/isa.h"

namespace flashlab::cpu {
namespace {

// The most a tile's head dim may be (flash_common.h sizes the per-thread tiles from it).
constexpr int kMaxHeadDim = 512;

std::string flash_supports(const AttnParams& p) {
  if (p.device != Device::kCPU) return "runs on CPU tensors only";
  if (p.dtype == DType::kF64) return "fp64 inputs run on cpu_reference only";
  if (p.dtype != DType::kF32 && p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return std::string("dtype ") + to_string(p.dtype) + " is not supported (fp32, fp16, bf16)";
  if (p.head_dim > kMaxHeadDim || p.head_dim_v > kMaxHeadDim)
    return "head_dim " + std::to_string(p.head_dim) + " / head_dim_v " + std::to_string(p.head_dim_v) +
           " above the supported " + std::to_string(kMaxHeadDim);
  return isa_refusal();
}

std::string flash_supports_fwd(const FwdParams& p) { return flash_supports(p); }
std::string flash_supports_bwd(const BwdParams& p) { return flash_supports(p); }

const FlashVariant& active() { return *flash_variant(active_isa()); }
size_t flash_fwd_workspace(const FwdParams& p) { return active().fwd_workspace(p); }
Status flash_fwd(const FwdParams& p) { return active().fwd(p); }
size_t flash_bwd_workspace(const BwdParams& p) { return active().bwd_workspace(p); }
Status flash_bwd(const BwdParams& p) { return active().bwd(p); }

// The summary `flashlab list` shows, naming the variant this process runs (or why it runs
// none). Written once, into static storage: the registry is built without the heap.
const char* summary() {
  static char text[640];
  const int n = std::snprintf(
      text, sizeof text,
      "FlashAttention-2 on the CPU: fp32 tiles, online softmax, O(tile) memory, backward "
      "recomputed from LSE; fp32/fp16/bf16, head dims up to %d, every mask, GQA, varlen; ",
      kMaxHeadDim);
  if (isa_refusal().empty())
    std::snprintf(text + n, sizeof text - n, "runs its %s variant, for %s", isa_name(active_isa()),
                  isa_target(active_isa()));
  else
    std::snprintf(text + n, sizeof text - n, "supports no call: %s", isa_refusal().c_str());
  return text;
}

}  // namespace

KernelEntry flash_entry() {
  return {.info = {"cpu_flash", "cpu", summary()}, .auto_priority = 10,
          .supports_fwd = flash_supports_fwd, .workspace_fwd = flash_fwd_workspace,
          .run_fwd = flash_fwd, .supports_bwd = flash_supports_bwd,
          .workspace_bwd = flash_bwd_workspace, .run_bwd = flash_bwd};
}

}  // namespace flashlab::cpu
