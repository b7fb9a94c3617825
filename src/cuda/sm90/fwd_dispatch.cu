// The Hopper forward (`cute_fa3`, sm_90a): runtime → compile-time switching in one place,
// supports(), run() and the registry entry. This file has no CuTe in it: each (dtype, head
// dim) is compiled in its own instantiations/fwd_hdim*_*.cu, for sm_90a only
// (cmake/sm90_kernels.cmake). The schedule ablations register from ablations.cu.
//
// Structure: fwd_traits.h (every compile-time choice), fwd_scheduler.cuh, fwd_mainloop.cuh,
// fwd_softmax.cuh, fwd_epilogue.cuh, fwd_consumer.cuh (a consumer warpgroup's loop),
// fwd_kernel.cuh (the kernel and its launch), docs/sm90/fwd.md (the design and the numbers).
#include <climits>
#include <cstdint>
#include <string>

#include "common/registry.h"
#include "cuda/common.cuh"
#include "cuda/head_dims.h"
#include "cuda/refusals.h"
#include "cuda/sm90/bwd_instance.h"
#include "cuda/sm90/fwd_dispatch.h"

namespace flashlab::sm90 {

std::string tma_rules(const char* name, const void* ptr, int elem_bytes, int64_t rows,
                      int64_t row_stride, int heads, int64_t head_stride, int batch,
                      int64_t batch_stride) {
  const std::string n(name);
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
    return n + " must be 16-byte aligned (TMA tensor map)";
  if (rows > INT32_MAX) return n + " has more than 2^31 rows";
  auto bad = [&](int64_t extent, int64_t stride) {
    const int64_t bytes = stride * elem_bytes;
    return extent > 1 && (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t(1) << 40));
  };
  if (bad(rows, row_stride)) return n + "'s row stride must be a positive multiple of 16 bytes (TMA)";
  if (bad(heads, head_stride)) return n + "'s head stride must be a positive multiple of 16 bytes (TMA)";
  if (bad(batch, batch_stride)) return n + "'s batch stride must be a positive multiple of 16 bytes (TMA)";
  return "";
}

namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "CuTe Hopper forward (sm_90a): TMA loads into K/V rings on mbarriers, wgmma (S = Q K^T from "
    "shared memory, O += P V with P in registers), one producer and two consumer warpgroups (three "
    "at head dim 64) with setmaxnreg, pingpong, intra-warpgroup overlap, lazy rescaling; "
    "fp16/bf16, head dim 64/128/256, causal, window, softcap, GQA/MQA, varlen, LSE; backward at "
    "head dims 64, 96 and 128 (keys per CTA, P and dS as register operands, dQ by bulk reduce-add), varlen, "
    "deterministic on request, and 192 and 256 (P and dS through shared memory, dQ by atomics, not "
    "deterministic); otherwise auto runs cute_fa2's backward";

// The head dims cute_fa3 has instantiations for.
constexpr int kHeadDims[] = {64, 128, 256};

// One head dim's instantiation; none for a head dim this build did not compile
// (FLASHLAB_HEAD_DIMS), which supports_instance refuses before it is needed.
template <int kHeadDim>
Instance of_dtype(bool fp16) {
  if constexpr (cuda::head_dim_built(kHeadDim))
    return fp16 ? instance<DType::kF16, kHeadDim>() : instance<DType::kBF16, kHeadDim>();
  else
    return {};
}

// The runtime → compile-time switch: the instantiation that serves p (dtype and head dim
// checked by supports_instance()).
Instance instance_for(const FwdParams& p) {
  const bool fp16 = p.dtype == DType::kF16;
  switch (p.head_dim) {
    case 64: return of_dtype<64>(fp16);
    case 128: return of_dtype<128>(fp16);
    default: return of_dtype<256>(fp16);
  }
}

// Q, K, V and O against tma_rules, as the launch maps them (varlen: every sequence packed in
// rows, one "batch"). A problem with no query row is never launched (the API returns before
// any kernel runs: src/api/dispatch.cpp), so it builds no tensor map and no rule applies;
// with no key, K and V get no map of their own (fwd_kernel.cuh's launch).
std::string refuse_tensor_maps(const FwdParams& p) {
  if (p.batch == 0 || p.total_q == 0 || p.seqlen_q == 0) return "";
  constexpr int kElemBytes = 2;  // fp16 or bf16
  const int64_t q_rows = p.varlen ? p.total_q : p.seqlen_q;
  const int64_t kv_rows = p.varlen ? p.total_k : p.seqlen_k;
  const int batch = p.varlen ? 1 : p.batch;
  FL_REFUSE_IF(tma_rules("q", p.q, kElemBytes, q_rows, p.q_row_stride, p.heads_q,
                         p.q_head_stride, batch, p.q_batch_stride));
  if (kv_rows > 0) {
    FL_REFUSE_IF(tma_rules("k", p.k, kElemBytes, kv_rows, p.k_row_stride, p.heads_kv,
                           p.k_head_stride, batch, p.k_batch_stride));
    FL_REFUSE_IF(tma_rules("v", p.v, kElemBytes, kv_rows, p.v_row_stride, p.heads_kv,
                           p.v_head_stride, batch, p.v_batch_stride));
  }
  // O leaves by TMA store.
  return tma_rules("out", p.out, kElemBytes, q_rows, p.o_row_stride, p.heads_q, p.o_head_stride,
                   batch, p.o_batch_stride);
}

std::string supports(const FwdParams& p) { return supports_instance(p, instance_for(p)); }

Status run(const FwdParams& p) { return run_instance(p, instance_for(p)); }

}  // namespace

std::string supports_instance(const FwdParams& p, const Instance& in) {
  FL_REFUSE_IF(cuda::refuse_placement(p, cuda::Inputs::kHalf, "the wgmma path"));
  FL_REFUSE_IF(cuda::refuse_unequal_head_dims(p));
  FL_REFUSE_IF(cuda::refuse_head_dim(p.head_dim, kHeadDims, "64, 128 or 256"));
  // The running max is kept in raw-score units and scaled inside the exp2's FMA, which
  // orders scores correctly only for a positive scale (softcap's tanh path scales first).
  if (p.scale < 0.f && p.mask.softcap <= 0.f)
    return "softmax_scale must be >= 0 without softcap, got " + std::to_string(p.scale);
  FL_REFUSE_IF(cuda::refuse_grid_heads_batch(p));
  // The persistent scheduler numbers the tiles with an int (query blocks of at least 128
  // rows; varlen: seqlen_q is max_seqlen_q, the caller's bound).
  if ((int64_t(p.seqlen_q) + 127) / 128 * int64_t(p.heads_q) * p.batch > INT32_MAX)
    return "ceil(seqlen_q / 128) * heads_q * batch must be < 2^31 (the query tile count; "
           "varlen: seqlen_q is max_seqlen_q)";
  FL_REFUSE_IF(refuse_tensor_maps(p));

  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device_index) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, p.device_index) !=
          cudaSuccess) {
    cudaGetLastError();
    return "cannot query CUDA device " + std::to_string(p.device_index);
  }
  if (major != 9 || minor != 0)
    return "needs compute capability 9.0 (sm_90a: TMA, wgmma, setmaxnreg); device " +
           std::to_string(p.device_index) + " is " + std::to_string(major) + "." +
           std::to_string(minor);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

Status run_instance(const FwdParams& p, const Instance& in) {
  cuda::DeviceGuard guard(p.device_index);
  return in.run(p);
}

// auto's GPU forward on sm90: above cute_fa2 (40); and its backward where built
// (bwd_dispatch.cu), where it supports the call.
KernelEntry cute_fa3_entry() {
  KernelEntry e{.info = {"cute_fa3", "sm90a", kSummary}, .auto_priority = 50};
  e.supports_fwd = supports, e.run_fwd = run;
#if FLASHLAB_SM90_BWD
  e.supports_bwd = supports_bwd, e.workspace_bwd = workspace_bwd, e.run_bwd = run_bwd;
#endif
  return e;
}

}  // namespace flashlab::sm90
