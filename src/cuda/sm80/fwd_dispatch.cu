// The CuTe FlashAttention-2 forward (sm80 path): runtime → compile-time switching in one
// place, supports(), run() and the registry entry `cute_fa2`. This file has no CuTe in it:
// each (dtype, head dim) is compiled in its own instantiations/fwd_hdim*_*.cu.
//
// Structure: fwd_traits.h (every compile-time choice), fwd_kernel.cuh (scheduler,
// mainloop, softmax, epilogue, launch), docs/sm80/fwd.md (the traits table and numbers).
#include <string>

#include "cuda/common.cuh"
#include "common/registry.h"
#include "cuda/sm80/dispatch_common.h"
#include "cuda/sm80/fwd_instance.h"

namespace flashlab::sm80 {
namespace {

// One instantiation's entry points (fwd_instance.h).
struct Instance {
  Status (*run)(const FwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();
};

template <DType kDtype, int kHeadDim>
constexpr Instance instance() {
  using I = FwdInstance<kDtype, kHeadDim>;
  return {&I::run, &I::kernel, &I::smem_bytes};
}

// The runtime → compile-time switch: the instantiation that serves p (dtype and head dim
// already checked by supports()).
Instance instance_for(const FwdParams& p) {
  const bool fp16 = p.dtype == DType::kF16;
  switch (p.head_dim) {
    case 64: return fp16 ? instance<DType::kF16, 64>() : instance<DType::kBF16, 64>();
    case 96: return fp16 ? instance<DType::kF16, 96>() : instance<DType::kBF16, 96>();
    case 128: return fp16 ? instance<DType::kF16, 128>() : instance<DType::kBF16, 128>();
    case 192: return fp16 ? instance<DType::kF16, 192>() : instance<DType::kBF16, 192>();
    default: return fp16 ? instance<DType::kF16, 256>() : instance<DType::kBF16, 256>();
  }
}

std::string supports(const FwdParams& p) {
  if (std::string why = refuse_common(p); !why.empty()) return why;
  // The running max is kept in raw-score units and scaled inside the exp2's FMA, which
  // orders scores correctly only for a positive scale (softcap's tanh path scales first).
  if (p.scale < 0.f && p.mask.softcap <= 0.f)
    return "softmax_scale must be >= 0 without softcap, got " + std::to_string(p.scale);
  const Instance in = instance_for(p);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

Status run(const FwdParams& p) {
  if (p.seqlen_q == 0 || p.batch == 0 || p.heads_q == 0) return {};  // no row to write
  cuda::DeviceGuard guard(p.device_index);
  return instance_for(p).run(p);
}

}  // namespace
}  // namespace flashlab::sm80

namespace flashlab {

void cute_fa2_add_backward(KernelEntry& e);  // src/cuda/sm80/bwd_dispatch.cu

KernelEntry cute_fa2_entry() {
  KernelEntry e;
  e.info = {"cute_fa2", "sm80+",
            "CuTe FlashAttention-2 (sm80 path): TiledMMA m16n8k16, cp.async, swizzled smem, "
            "ldmatrix; forward with P in registers, backward with dQ in fp32 atomics "
            "(deterministic on request); fp16/bf16, head dim 64/96/128/192/256, causal, "
            "window, softcap, GQA/MQA, varlen, LSE, dropout",
            true, true};
  e.auto_priority = 40;  // auto's GPU forward and backward: above fa2_mma (30), fa2_simt_bwd (20)
  e.supports_fwd = sm80::supports;
  e.run_fwd = sm80::run;
  e.info.forward_dropout = true;  // Philox mask of common/dropout.h, one call per fragment
  cute_fa2_add_backward(e);       // bwd_dispatch.cu
  return e;
}

}  // namespace flashlab
