// The registry entry `cute_fa2`: the CuTe FlashAttention-2 forward and backward (sm80 path).
// Runtime → compile-time switching in one place, supports() with its reasons, the backward's
// workspace size, and run() for both passes. This file has no CuTe in it: each (pass, dtype,
// head dim) is compiled in its own instantiations/*.cu behind fwd_instance.h and
// bwd_instance.h.
//
// Structure: fwd_traits.h, bwd_traits.h (every compile-time choice); fwd_kernel.cuh,
// bwd_kernel.cuh (the layers wired into kernels, and their launch); docs/sm80/fwd.md and
// docs/sm80/bwd.md (the traits tables and numbers).
#include <cstdint>
#include <string>

#include "common/registry.h"
#include "cuda/common.cuh"
#include "cuda/head_dims.h"
#include "cuda/refusals.h"
#include "cuda/sm80/bwd_instance.h"
#include "cuda/sm80/fwd_instance.h"

namespace flashlab::sm80 {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "CuTe FlashAttention-2 (sm80 path): TiledMMA m16n8k16, cp.async, swizzled smem, ldmatrix; "
    "forward with P in registers, backward with dQ in fp32 atomics (deterministic on request); "
    "fp16/bf16, head dim 64/96/128/192/256, causal, window, softcap, GQA/MQA, varlen, LSE, dropout";

// One instantiation's entry points (fwd_instance.h, bwd_instance.h): the two structs are
// alike because the passes' instances are; each pass has its own signatures.
struct FwdEntries {
  Status (*run)(const FwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();

  template <DType kDtype, int kHeadDim>
  static constexpr FwdEntries of() {
    using I = FwdInstance<kDtype, kHeadDim>;
    return {&I::run, &I::kernel, &I::smem_bytes};
  }
};
struct BwdEntries {
  Status (*run)(const BwdParams&);
  size_t (*workspace_bytes)(const BwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();

  template <DType kDtype, int kHeadDim>
  static constexpr BwdEntries of() {
    using I = BwdInstance<kDtype, kHeadDim>;
    return {&I::run, &I::workspace_bytes, &I::kernel, &I::smem_bytes};
  }
};

// The runtime → compile-time switch: the instantiation that serves p (dtype and head dim
// already checked by refuse_common).
// A head dim this build did not compile (FLASHLAB_HEAD_DIMS) has no entries: refuse_common
// refuses it before they are needed.
template <class Entries, int kHeadDim>
Entries of_dtype(bool fp16) {
  if constexpr (cuda::head_dim_built(kHeadDim))
    return fp16 ? Entries::template of<DType::kF16, kHeadDim>()
                : Entries::template of<DType::kBF16, kHeadDim>();
  else
    return {};
}
template <class Entries>
Entries entries_for(const AttnParams& p) {
  const bool fp16 = p.dtype == DType::kF16;
  switch (p.head_dim) {
    case 64: return of_dtype<Entries, 64>(fp16);
    case 96: return of_dtype<Entries, 96>(fp16);
    case 128: return of_dtype<Entries, 128>(fp16);
    case 192: return of_dtype<Entries, 192>(fp16);
    default: return of_dtype<Entries, 256>(fp16);
  }
}

// What both passes refuse alike: "" when their instantiations could serve p.
std::string refuse_common(const AttnParams& p) {
  FL_REFUSE_IF(cuda::refuse_placement(p, cuda::Inputs::kHalf, "the m16n8k16 tensor-core MMA"));
  FL_REFUSE_IF(cuda::refuse_unequal_head_dims(p));
  FL_REFUSE_IF(
      cuda::refuse_head_dim(p.head_dim, cuda::kCuteHeadDims, "64, 96, 128, 192 or 256"));
  return cuda::refuse_grid_heads_batch(p);
}

// ---- forward -----------------------------------------------------------------------------
std::string supports_fwd(const FwdParams& p) {
  FL_REFUSE_IF(refuse_common(p));
  // The running max is kept in raw-score units and scaled inside the exp2's FMA, which
  // orders scores correctly only for a positive scale (softcap's tanh path scales first).
  if (p.scale < 0.f && p.mask.softcap <= 0.f)
    return "softmax_scale must be >= 0 without softcap, got " + std::to_string(p.scale);
  const FwdEntries in = entries_for<FwdEntries>(p);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

Status run_fwd(const FwdParams& p) {
  cuda::DeviceGuard guard(p.device_index);
  return entries_for<FwdEntries>(p).run(p);
}

// ---- backward ----------------------------------------------------------------------------
std::string supports_bwd(const BwdParams& p) {
  FL_REFUSE_IF(refuse_common(p));
  const BwdEntries in = entries_for<BwdEntries>(p);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

// fp32 dQ accumulator, D and LSE·log2 e per query row and head, and in deterministic mode a
// turn counter per (batch, head, query block of BLK_M rows): O(seqlen), see bwd_workspace.cuh.
size_t workspace_bwd(const BwdParams& p) { return entries_for<BwdEntries>(p).workspace_bytes(p); }

Status run_bwd(const BwdParams& p) {
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return {StatusCode::kInvalidArgument,
            "cute_fa2's backward needs a 16-byte aligned workspace (fp32 accumulators)"};
  cuda::DeviceGuard guard(p.device_index);
  return entries_for<BwdEntries>(p).run(p);
}

}  // namespace

// auto's GPU forward and backward: above fa2_mma (30) and fa2_simt_bwd (20). Both passes
// take dropout: the forward applies common/dropout.h's Philox mask per fragment, the
// backward regenerates it.
KernelEntry cute_fa2_entry() {
  return {.info = {.name = "cute_fa2", .arch = "sm80+", .summary = kSummary,
                   .forward_dropout = true, .backward_dropout = true},
          .auto_priority = 40, .supports_fwd = supports_fwd, .run_fwd = run_fwd,
          .supports_bwd = supports_bwd, .workspace_bwd = workspace_bwd, .run_bwd = run_bwd};
}

}  // namespace flashlab::sm80
