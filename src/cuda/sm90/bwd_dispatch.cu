// cute_fa3's backward (sm_90a): supports(), the workspace size and run(), which the registry
// entry in fwd_dispatch.cu points at. No CuTe here: the kernels are instantiated in
// instantiations/bwd_hdim*_*.cu (bwd_kernel.cuh).
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/head_dims.h"
#include "cuda/refusals.h"
#include "cuda/sm90/bwd_instance.h"
#include "cuda/sm90/fwd_dispatch.h"

namespace flashlab::sm90 {
namespace {

struct BwdEntries {
  Status (*run)(const BwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();
  size_t (*workspace_bytes)(const BwdParams&);
};

template <DType kDtype, int kHeadDim>
constexpr BwdEntries entries() {
  using I = BwdInstance<kDtype, kHeadDim>;
  return {&I::run, &I::kernel, &I::smem_bytes, &I::workspace_bytes};
}

// The instances that serve p; none for a head dim this build did not compile
// (FLASHLAB_HEAD_DIMS), which supports_bwd refuses before they are needed.
BwdEntries entries_for(const BwdParams& p) {
  const bool fp16 = p.dtype == DType::kF16;
  auto at = [fp16](auto head_dim) -> BwdEntries {  // head_dim: an integral_constant
    constexpr int d = decltype(head_dim)::value;
    if constexpr (cuda::head_dim_built(d)) return fp16 ? entries<DType::kF16, d>() : entries<DType::kBF16, d>();
    return {};
  };
  switch (p.head_dim) {
    case 64: return at(std::integral_constant<int, 64>{});
    case 96: return at(std::integral_constant<int, 96>{});
    case 192: return at(std::integral_constant<int, 192>{});
    case 256: return at(std::integral_constant<int, 256>{});
    default: return at(std::integral_constant<int, 128>{});
  }
}

constexpr int kHeadDims[] = {64, 96, 128, 192, 256};

// Head dims 192 and 256's step (bwd_wide.cuh) adds dQ into the fp32 accumulator by
// unordered vector reductions from the consumers' registers: it has no fixed order of key
// blocks, so the deterministic mode runs on cute_fa2. Varlen, softcap and every window take
// paths both steps share (BwdScores, BwdSteps, bwd_zero_rows, the workspace rows).
std::string refuse_wide(const BwdParams& p) {
  if ((p.head_dim != 192 && p.head_dim != 256) || !p.deterministic) return "";
  return "deterministic must be false at head_dim " + std::to_string(p.head_dim) +
         " (the Hopper backward's wide step adds dQ by unordered atomics; cute_fa2 runs it)";
}

}  // namespace

std::string supports_bwd(const BwdParams& p) {
  FL_REFUSE_IF(cuda::refuse_placement(p, cuda::Inputs::kHalf, "the wgmma path"));
  FL_REFUSE_IF(cuda::refuse_unequal_head_dims(p));
  FL_REFUSE_IF(cuda::refuse_head_dim(p.head_dim, kHeadDims,
                                     "64, 96, 128, 192 or 256 (the Hopper backward's instances; other head dims run on cute_fa2)"));
  FL_REFUSE_IF(refuse_wide(p));
  FL_REFUSE_IF(cuda::refuse_grid_heads_batch(p));
  // Q, dO, K and V as the launch maps them (bwd_kernel.cuh; varlen: every sequence packed in
  // rows, one "batch"). With no key the kernel is not launched; with no query row Q and dO
  // get K's map.
  constexpr int kElemBytes = 2;  // fp16 or bf16
  const int64_t q_rows = p.varlen ? p.total_q : p.seqlen_q;
  const int64_t kv_rows = p.varlen ? p.total_k : p.seqlen_k;
  const int batch = p.varlen ? 1 : p.batch;
  if (kv_rows > 0) {
    FL_REFUSE_IF(tma_rules("k", p.k, kElemBytes, kv_rows, p.k_row_stride, p.heads_kv, p.k_head_stride,
                           batch, p.k_batch_stride));
    FL_REFUSE_IF(tma_rules("v", p.v, kElemBytes, kv_rows, p.v_row_stride, p.heads_kv, p.v_head_stride,
                           batch, p.v_batch_stride));
    if (q_rows > 0) {
      FL_REFUSE_IF(tma_rules("q", p.q, kElemBytes, q_rows, p.q_row_stride, p.heads_q, p.q_head_stride,
                             batch, p.q_batch_stride));
      FL_REFUSE_IF(tma_rules("dout", p.dout, kElemBytes, q_rows, p.do_row_stride, p.heads_q,
                             p.do_head_stride, batch, p.do_batch_stride));
    }
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device_index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, p.device_index) != cudaSuccess) {
    cudaGetLastError();
    return "cannot query CUDA device " + std::to_string(p.device_index);
  }
  if (major != 9 || minor != 0) return "needs compute capability 9.0 (sm_90a)";
  const BwdEntries in = entries_for(p);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

size_t workspace_bwd(const BwdParams& p) { return entries_for(p).workspace_bytes(p); }

Status run_bwd(const BwdParams& p) {
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return {StatusCode::kInvalidArgument,
            "cute_fa3's backward needs a 16-byte aligned workspace (fp32 accumulators)"};
  cuda::DeviceGuard guard(p.device_index);
  return entries_for(p).run(p);
}

}  // namespace flashlab::sm90
