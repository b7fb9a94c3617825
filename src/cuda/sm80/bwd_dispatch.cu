// The CuTe FlashAttention-2 backward (sm80 path): runtime → compile-time switching in one
// place, supports(), the workspace size, run(), and the backward half of the registry entry
// `cute_fa2` (cute_fa2_add_backward, called by fwd_dispatch.cu). This file has no CuTe in
// it: each (dtype, head dim) is compiled in its own instantiations/bwd_hdim*_*.cu.
//
// Structure: bwd_traits.h (every compile-time choice), bwd_kernel.cuh (preprocess,
// scheduler, mainloop, epilogue, postprocess, launch), docs/sm80/bwd.md (tables, numbers).
#include <cstdint>
#include <string>

#include "cuda/common.cuh"
#include "common/registry.h"
#include "cuda/sm80/dispatch_common.h"
#include "cuda/sm80/bwd_instance.h"

namespace flashlab::sm80 {
namespace {

// One instantiation's entry points (bwd_instance.h).
struct Instance {
  Status (*run)(const BwdParams&);
  size_t (*workspace_bytes)(const BwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();
};

template <DType kDtype, int kHeadDim>
constexpr Instance instance() {
  using I = BwdInstance<kDtype, kHeadDim>;
  return {&I::run, &I::workspace_bytes, &I::kernel, &I::smem_bytes};
}

// The runtime → compile-time switch: the instantiation that serves p (dtype and head dim
// already checked by supports()).
Instance instance_for(const BwdParams& p) {
  const bool fp16 = p.dtype == DType::kF16;
  switch (p.head_dim) {
    case 64: return fp16 ? instance<DType::kF16, 64>() : instance<DType::kBF16, 64>();
    case 96: return fp16 ? instance<DType::kF16, 96>() : instance<DType::kBF16, 96>();
    case 128: return fp16 ? instance<DType::kF16, 128>() : instance<DType::kBF16, 128>();
    case 192: return fp16 ? instance<DType::kF16, 192>() : instance<DType::kBF16, 192>();
    default: return fp16 ? instance<DType::kF16, 256>() : instance<DType::kBF16, 256>();
  }
}

std::string supports(const BwdParams& p) {
  if (std::string why = refuse_common(p); !why.empty()) return why;
  const Instance in = instance_for(p);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

// fp32 dQ accumulator, D and LSE·log2 e per query row and head, and in deterministic mode a
// turn counter per (batch, head, query block of BLK_M rows): O(seqlen), see bwd_kernel.cuh.
size_t workspace(const BwdParams& p) { return instance_for(p).workspace_bytes(p); }

Status run(const BwdParams& p) {
  if (p.batch == 0 || p.heads_q == 0) return {};  // nothing to write
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return {StatusCode::kInvalidArgument,
            "cute_fa2's backward needs a 16-byte aligned workspace (fp32 accumulators)"};
  cuda::DeviceGuard guard(p.device_index);
  return instance_for(p).run(p);
}

}  // namespace
}  // namespace flashlab::sm80

namespace flashlab {

void cute_fa2_add_backward(KernelEntry& e) {
  e.supports_bwd = sm80::supports;
  e.workspace_bwd = sm80::workspace;
  e.run_bwd = sm80::run;
  e.info.backward_dropout = true;  // regenerates the forward's Philox mask per fragment
}

}  // namespace flashlab
