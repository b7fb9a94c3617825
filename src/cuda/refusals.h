// The refusals CUDA kernels share: each returns "" when the call passes, else the reason in
// words, so every entry's supports() says the same thing the same way. Host-only (no CUDA
// headers), so dispatch files and tests can include it.
#pragma once

#include <cstdint>
#include <string>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::cuda {

// What a kernel's inputs may be: any CUDA float type the SIMT rungs take, or the fp16/bf16
// that tensor-core MMAs take.
enum class Inputs { kFloat, kHalf };

// The largest |softmax_scale| a CUDA kernel takes. Their scores, scaled by log2(e), are fp32:
// far above any model's scale (1/sqrt(head_dim), or a softcap's ~50) they overflow or lose
// the row's spread, while the CPU kernels take any finite scale (cpu_flash switches to a
// double-precision path above 2^16).
inline constexpr float kMaxCudaScale = 1024.f;
// The largest softcap a CUDA kernel takes (models use 30 to 50): their softcap path scales
// fp32 scores by softcap·log2(e), which overflows near 2.4e38.
inline constexpr float kMaxCudaSoftcap = 65536.f;

// The tensors are CUDA tensors of a dtype the kernel takes (`engine` names what needs fp16/bf16,
// e.g. "the m16n8k16 tensor-core MMA"), and the scale is one fp32 scores can carry.
inline std::string refuse_placement(const AttnParams& p, Inputs inputs, const char* engine = "") {
  if (p.device != Device::kCUDA) return "runs on CUDA tensors only";
  if (!(p.scale <= kMaxCudaScale && p.scale >= -kMaxCudaScale))
    return "|softmax_scale| must be <= 1024 on CUDA kernels (fp32 scores; the CPU kernels take "
           "any finite scale), got " + std::to_string(p.scale);
  if (p.mask.softcap > kMaxCudaSoftcap)
    return "softcap must be <= 65536 on CUDA kernels (softcap·log2(e) scales fp32 scores; the "
           "CPU kernels take any finite softcap), got " + std::to_string(p.mask.softcap);
  if (inputs == Inputs::kFloat) {
    if (p.dtype == DType::kF64) return "fp64 is not supported (fp32, fp16, bf16 are)";
    return "";
  }
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return std::string(to_string(p.dtype)) + " is not supported: " + engine +
           " takes fp16 or bf16 inputs";
  return "";
}

// head_dim == head_dim_v, for kernels that tile Q·Kᵀ and P·V with one head dim.
inline std::string refuse_unequal_head_dims(const AttnParams& p) {
  if (p.head_dim != p.head_dim_v)
    return "head_dim (" + std::to_string(p.head_dim) + ") must equal head_dim_v (" +
           std::to_string(p.head_dim_v) + ")";
  return "";
}

// Grids that put heads on y and batch on z (at most 65535 each).
inline std::string refuse_grid_heads_batch(const AttnParams& p) {
  if (p.heads_q > 65535) return "heads_q must be <= 65535 (grid y)";
  if (p.batch > 65535) return "batch must be <= 65535 (grid z)";
  return "";
}

// Grids that put batch·heads_q on one axis of at most `limit` blocks.
inline std::string refuse_grid_batch_heads(const AttnParams& p, int64_t limit, const char* axis) {
  if (int64_t(p.batch) * p.heads_q > limit)
    return std::string("batch·heads_q must be <= ") + std::to_string(limit) + " (grid " + axis +
           ")";
  return "";
}

}  // namespace flashlab::cuda

// Returns the first non-empty refusal of a list of checks from the enclosing supports().
#define FL_REFUSE_IF(expr)                           \
  do {                                               \
    if (std::string why_ = (expr); !why_.empty()) return why_; \
  } while (0)
