// What the sm80 forward and backward dispatch (fwd_dispatch.cu, bwd_dispatch.cu) refuse
// alike: the checks of supports() that hold for both passes. No CuTe here.
#pragma once

#include <string>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm80 {

inline bool head_dim_supported(int d) {
  return d == 64 || d == 96 || d == 128 || d == 192 || d == 256;
}

// "" when both passes' instantiations could serve p, else the reason in words.
inline std::string refuse_common(const AttnParams& p) {
  if (p.device != Device::kCUDA) return "runs on CUDA tensors only";
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return std::string(to_string(p.dtype)) +
           " is not supported: the m16n8k16 tensor-core MMA takes fp16 or bf16 inputs";
  if (p.head_dim != p.head_dim_v)
    return "head_dim (" + std::to_string(p.head_dim) + ") must equal head_dim_v (" +
           std::to_string(p.head_dim_v) + ")";
  if (!head_dim_supported(p.head_dim))
    return "head_dim must be 64, 96, 128, 192 or 256 (the instantiations built), got " +
           std::to_string(p.head_dim);
  if (p.heads_q > 65535) return "heads_q must be <= 65535 (grid y)";
  if (p.batch > 65535) return "batch must be <= 65535 (grid z)";
  return "";
}

}  // namespace flashlab::sm80
