// The Hopper forward (`cute_fa3`, sm_90a): runtime → compile-time switching in one place,
// supports(), run() and the registry entry. This file has no CuTe in it: each (dtype, head
// dim) is compiled in its own instantiations/fwd_hdim*_*.cu, for sm_90a only
// (cmake/sm90_kernels.cmake).
//
// Structure: fwd_traits.h (every compile-time choice), fwd_scheduler.cuh, fwd_mainloop.cuh,
// fwd_softmax.cuh, fwd_epilogue.cuh, fwd_kernel.cuh (the kernel and its launch),
// docs/sm90/fwd.md (the design and the numbers).
#include <climits>
#include <cstdint>
#include <string>

#include "cuda/common.cuh"
#include "common/registry.h"
#include "cuda/sm90/fwd_instance.h"

namespace flashlab::sm90 {
namespace {

// One instantiation's entry points (fwd_instance.h).
struct Instance {
  Status (*run)(const FwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();
};

template <DType kDtype, int kHeadDim, Schedule kSchedule = Schedule::kFull>
constexpr Instance instance() {
  using I = FwdInstance<kDtype, kHeadDim, kSchedule>;
  return {&I::run, &I::kernel, &I::smem_bytes};
}

// The runtime → compile-time switch: the instantiation that serves p (dtype and head dim
// already checked by supports()).
Instance instance_for(const FwdParams& p) {
  const bool fp16 = p.dtype == DType::kF16;
  switch (p.head_dim) {
    case 64: return fp16 ? instance<DType::kF16, 64>() : instance<DType::kBF16, 64>();
    case 128: return fp16 ? instance<DType::kF16, 128>() : instance<DType::kBF16, 128>();
    default: return fp16 ? instance<DType::kF16, 256>() : instance<DType::kBF16, 256>();
  }
}

bool head_dim_supported(int d) { return d == 64 || d == 128 || d == 256; }

// A tensor map's rules for one tensor: a 16-byte-aligned base, and every stride of a mode
// with more than one index (rows, heads, batch) a nonzero multiple of 16 bytes below 2^40.
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

// The checks every schedule shares; `in` is the instantiation that would serve p.
std::string supports_with(const FwdParams& p, Instance (*pick)(const FwdParams&)) {
  if (p.device != Device::kCUDA) return "runs on CUDA tensors only";
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return std::string(to_string(p.dtype)) +
           " is not supported: the wgmma path here takes fp16 or bf16 inputs";
  if (p.head_dim != p.head_dim_v)
    return "head_dim (" + std::to_string(p.head_dim) + ") must equal head_dim_v (" +
           std::to_string(p.head_dim_v) + ")";
  if (!head_dim_supported(p.head_dim))
    return "head_dim must be 64, 128 or 256 (the instantiations built), got " +
           std::to_string(p.head_dim);
  // The running max is kept in raw-score units and scaled inside the exp2's FMA, which
  // orders scores correctly only for a positive scale (softcap's tanh path scales first).
  if (p.scale < 0.f && p.mask.softcap <= 0.f)
    return "softmax_scale must be >= 0 without softcap, got " + std::to_string(p.scale);
  if (p.heads_q > 65535) return "heads_q must be <= 65535 (grid y)";
  if (p.batch > 65535) return "batch must be <= 65535 (grid z)";
  // The persistent scheduler numbers the tiles with an int (query blocks of at least 128
  // rows; varlen: seqlen_q is max_seqlen_q, the caller's bound).
  if ((int64_t(p.seqlen_q) + 127) / 128 * int64_t(p.heads_q) * p.batch > INT32_MAX)
    return "ceil(seqlen_q / 128) * heads_q * batch must be < 2^31 (the query tile count; "
           "varlen: seqlen_q is max_seqlen_q)";

  const int eb = p.dtype == DType::kF16 || p.dtype == DType::kBF16 ? 2 : 4;
  const int64_t q_rows = p.varlen ? p.total_q : p.seqlen_q;
  const int64_t kv_rows = p.varlen ? p.total_k : p.seqlen_k;
  const int batch = p.varlen ? 1 : p.batch;
  // No query row: run() returns before any tensor map is built, so no TMA rule applies.
  const bool empty = q_rows == 0 || batch == 0 || p.heads_q == 0;
  std::string why;
  if (!empty)
    why = tma_rules("q", p.q, eb, q_rows, p.q_row_stride, p.heads_q, p.q_head_stride, batch,
                    p.q_batch_stride);
  if (why.empty() && !empty && kv_rows > 0)
    why = tma_rules("k", p.k, eb, kv_rows, p.k_row_stride, p.heads_kv, p.k_head_stride, batch,
                    p.k_batch_stride);
  if (why.empty() && !empty && kv_rows > 0)
    why = tma_rules("v", p.v, eb, kv_rows, p.v_row_stride, p.heads_kv, p.v_head_stride, batch,
                    p.v_batch_stride);
  if (why.empty() && !empty)  // O leaves by TMA store
    why = tma_rules("out", p.out, eb, q_rows, p.o_row_stride, p.heads_q, p.o_head_stride, batch,
                    p.o_batch_stride);
  if (!why.empty()) return why;

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
  const Instance in = pick(p);
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel());
}

std::string supports(const FwdParams& p) { return supports_with(p, instance_for); }

Status run(const FwdParams& p) {
  if (p.seqlen_q == 0 || p.batch == 0 || p.heads_q == 0) return {};  // no row to write
  cuda::DeviceGuard guard(p.device_index);
  return instance_for(p).run(p);
}

// The persistent kernel's tile counter (fwd_scheduler.cuh's DynamicTiles), zeroed on the
// stream before each launch: the ablation cute_fa3_persistent's only (cute_fa3 runs one CTA
// per tile and needs no workspace).
size_t workspace(const FwdParams&) { return 16; }

// The schedule ablations: bf16, head dim 128 only.
template <Schedule kSchedule>
Instance ablation_instance(const FwdParams&) {
  return instance<DType::kBF16, 128, kSchedule>();
}
template <Schedule kSchedule>
std::string supports_ablation(const FwdParams& p) {
  if (p.dtype != DType::kBF16 || p.head_dim != 128)
    return "a schedule ablation of cute_fa3, built for bf16 head dim 128 only";
  return supports_with(p, ablation_instance<kSchedule>);
}
template <Schedule kSchedule>
Status run_ablation(const FwdParams& p) {
  if (p.seqlen_q == 0 || p.batch == 0 || p.heads_q == 0) return {};
  cuda::DeviceGuard guard(p.device_index);
  return ablation_instance<kSchedule>(p).run(p);
}

}  // namespace
}  // namespace flashlab::sm90

namespace flashlab {

KernelEntry cute_fa3_entry() {
  KernelEntry e;
  e.info = {"cute_fa3", "sm90a",
            "CuTe Hopper forward (sm_90a): TMA loads into K/V rings on mbarriers, wgmma "
            "(S = Q K^T from shared memory, O += P V with P in registers), one producer and "
            "two consumer warpgroups (three at head dim 64) with setmaxnreg, pingpong, "
            "intra-warpgroup overlap, lazy rescaling; fp16/bf16, head dim 64/128/256, causal, "
            "window, softcap, GQA/MQA, varlen, LSE",
            true, false};
  e.auto_priority = 50;  // auto's GPU forward on sm90: above cute_fa2 (40)
  e.supports_fwd = sm90::supports;
  e.run_fwd = sm90::run;
  return e;
}

namespace {
// One schedule ablation of cute_fa3 (bf16 head dim 128 only; never auto's pick).
template <sm90::Schedule kSchedule>
KernelEntry ablation_entry(const char* name, const char* description) {
  KernelEntry e;
  e.info = {name, "sm90a", description, true, false};
  e.supports_fwd = sm90::supports_ablation<kSchedule>;
  e.run_fwd = sm90::run_ablation<kSchedule>;
  if constexpr (kSchedule == sm90::Schedule::kPersistent) e.workspace_fwd = sm90::workspace;
  e.auto_priority = 0;
  return e;
}
}  // namespace

KernelEntry cute_fa3_ablation_entry(int which) {
  using sm90::Schedule;
  switch (which) {
    case 0:
      return ablation_entry<Schedule::kNoPingpong>(
          "cute_fa3_no_pingpong",
          "cute_fa3 without pingpong (both consumer warpgroups issue their wgmma at will); "
          "bf16 head dim 128 only, to measure what pingpong adds");
    case 1:
      return ablation_entry<Schedule::kNoOverlap>(
          "cute_fa3_no_overlap",
          "cute_fa3 without the intra-warpgroup overlap (each wgmma batch waited for in "
          "place, pingpong kept); bf16 head dim 128 only");
    case 2:
      return ablation_entry<Schedule::kSerial>(
          "cute_fa3_serial",
          "cute_fa3 with neither pingpong nor the intra-warpgroup overlap: warp "
          "specialization, TMA and wgmma alone; bf16 head dim 128 only");
    default:
      return ablation_entry<Schedule::kPersistent>(
          "cute_fa3_persistent",
          "cute_fa3 with the persistent tile scheduler (one CTA per SM taking tiles longest "
          "first) in place of one CTA per query tile; bf16 head dim 128 only");
  }
}

}  // namespace flashlab

#if FLASHLAB_ABLATIONS
namespace flashlab {
KernelEntry cute_fa3_no_pingpong_entry() { return cute_fa3_ablation_entry(0); }
KernelEntry cute_fa3_no_overlap_entry() { return cute_fa3_ablation_entry(1); }
KernelEntry cute_fa3_serial_entry() { return cute_fa3_ablation_entry(2); }
KernelEntry cute_fa3_persistent_entry() { return cute_fa3_ablation_entry(3); }
}  // namespace flashlab
#endif
