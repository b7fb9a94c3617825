// The registry entry `cute_fa2`: the CuTe FlashAttention-2 forward and backward (sm80 path).
// Runtime → compile-time switching in one place, supports() with its reasons, the backward's
// workspace size, and run() for both passes. This file has no CuTe in it: each (pass, dtype,
// head dim) is compiled in its own instantiations/*.cu behind fwd_instance.h and
// bwd_instance.h.
//
// Structure: fwd_traits.h, bwd_traits.h (every compile-time choice); fwd_kernel.cuh,
// bwd_kernel.cuh (the layers wired into kernels, and their launch); docs/sm80/fwd.md and
// docs/sm80/bwd.md (the traits tables and numbers).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/kv_splits.h"
#include "common/registry.h"
#include "cuda/common.cuh"
#include "cuda/head_dims.h"
#include "cuda/refusals.h"
#include "cuda/sm80/bwd_instance.h"
#include "cuda/sm80/fwd_instance.h"
#include "cuda/sm80/kv_instance.h"

namespace flashlab::sm80 {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "CuTe FlashAttention-2 (sm80 path): TiledMMA m16n8k16, cp.async, swizzled smem, ldmatrix; "
    "forward with P in registers, backward with dQ in fp32 atomics (deterministic on request); "
    "fp16/bf16, head dim 64/96/128/192/256, causal, window, softcap, GQA/MQA, varlen, LSE, dropout; "
    "KV cache: split-KV with GQA packing, paged or contiguous, append, rotary";

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
struct KvEntries {
  Status (*run)(const KvCacheParams&, int);
  const void* (*kernel)(const KvCacheParams&);
  int (*smem_bytes)();
  int (*block_m)();
  int (*block_n)();
  int (*bytes_in_flight)();
  bool (*keys_per_warp)(const KvCacheParams&);

  template <DType kDtype, int kHeadDim>
  static constexpr KvEntries of() {
    using I = KvInstance<kDtype, kHeadDim>;
    return {&I::run, &I::kernel, &I::smem_bytes, &I::block_m, &I::block_n, &I::bytes_in_flight,
            &I::keys_per_warp};
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

// ---- KV cache (kv_kernel.cuh) ---------------------------------------------------------------
std::string supports_kv(const KvCacheParams& p) {
  FL_REFUSE_IF(refuse_common(p));
  if (p.scale < 0.f && p.mask.softcap <= 0.f)
    return "softmax_scale must be >= 0 without softcap, got " + std::to_string(p.scale);
  const KvEntries in = entries_for<KvEntries>(p);
  if (int64_t(p.batch) * p.heads_kv > INT32_MAX) return "batch·heads_kv must be < 2^31 (grid x)";
  if (int64_t(p.batch) * p.heads_q * p.seqlen_q > INT32_MAX)
    return "batch·heads_q·seqlen_q must be < 2^31 (the split combine's grid x)";
  if (kv_row_blocks(p, in.block_m()) > 65535)
    return "seqlen_q·heads_q/heads_kv must be <= " + std::to_string(65535 * in.block_m()) +
           " (grid z of 64-row blocks)";
  return cuda::device_supports(p.device_index, in.smem_bytes(), in.kernel(p));
}

// The SM count of `device` and `kernel`'s resident CTAs per SM there, asked of CUDA once per
// (device, kernel) and then kept: the three queries took microseconds of host time per call,
// against a GPU time of 15–20 µs for a decode step over a 4k cache, and workspace_kv and
// run_kv each ask. A fixed table behind a mutex (no allocation); past its 64 entries the
// queries run every call.
struct KvOccupancy {
  int sms = 0, resident = 0;
};
bool kv_occupancy(const void* kernel, int device, int smem_bytes, KvOccupancy* out) {
  struct Entry {
    const void* kernel;
    int device;
    KvOccupancy occ;
  };
  static std::mutex mutex;
  static Entry table[64];
  static int used = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (int i = 0; i < used; ++i)
      if (table[i].kernel == kernel && table[i].device == device) {
        *out = table[i].occ;
        return true;
      }
  }
  // The attribute and occupancy queries act on the current device: make it `device`
  // (workspace_kv is called without a guard).
  cuda::DeviceGuard guard(device);
  KvOccupancy occ;
  if (cudaDeviceGetAttribute(&occ.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ.resident, kernel, 128, size_t(smem_bytes)) !=
          cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (used < 64) table[used++] = {kernel, device, occ};
  *out = occ;
  return true;
}

// How many splits the keys of each (sequence, KV head, row block) get: the caller's
// num_splits (at most kMaxSplits and the cache's key tiles), or with 0 the count that a model
// of the critical path finishes soonest with (kv_split_count, common/kv_splits.h).
// A wave counts as many CTAs per SM as keep kBytesInFlightPerSm of K and V in flight, at most
// the resident ones: one at head dim 128 (64 KiB each), two at 64 (32 KiB each), where
// filling every resident slot read less (docs/learn/flash-decoding.md, "How many splits").
// A paged cache keeps every resident slot: each tile's loads wait for a table read (one per
// tile where pages hold whole tiles, else one per row) and the page arithmetic, and more CTAs
// per SM hide both. At 64k keys, one CTA per SM read 10% less than every resident CTA with
// 16-row pages on an H100, and 64-row pages at 0.85 of the contiguous cache's rate on an H200,
// against 0.97 with every resident CTA (flash-decoding.md, "How many splits"). So does a
// kernel that spreads rows over its warps (a block of more than 16 packed rows): each warp
// multiplies its 16 rows by the whole tile, four times the MMA work per byte of the
// keys-per-warp kernel, and a lone CTA per SM leaves the memory idle while it computes.
int kv_splits(const KvCacheParams& p) {
  const KvEntries in = entries_for<KvEntries>(p);
  const int n_tiles = std::max(1, (p.seqlen_k + in.block_n() - 1) / in.block_n());
  const int most = std::min(kMaxSplits, n_tiles);
  if (p.num_splits > 0) return std::min(p.num_splits, most);
  KvOccupancy occ;
  if (!kv_occupancy(in.kernel(p), p.device_index, in.smem_bytes(), &occ)) return 1;
  constexpr int kBytesInFlightPerSm = 64 * 1024;
  const int per_ring = std::max(in.bytes_in_flight(), 1);
  const bool by_bytes = p.block_table == nullptr && in.keys_per_warp(p);
  KvSplitInputs model;  // kv_split_count clamps per_sm to [1, resident]
  model.sms = occ.sms;
  model.resident = occ.resident;
  model.per_sm = by_bytes ? (kBytesInFlightPerSm + per_ring - 1) / per_ring : occ.resident;
  model.ctas = int64_t(p.batch) * p.heads_kv * kv_row_blocks(p, in.block_m());
  model.n_tiles = n_tiles;
  model.most = most;
  return kv_split_count(model);
}

// The workspace: split-KV's partial O and LSE per split and row (kv_kernel.cuh; none with
// one split).
size_t kv_workspace_bytes(const KvCacheParams& p, int splits) {
  if (splits == 1) return 0;
  return size_t(splits) * size_t(p.batch) * size_t(p.heads_q) * size_t(p.seqlen_q) *
         size_t(p.head_dim_v + 1) * sizeof(float);
}
size_t workspace_kv(const KvCacheParams& p) { return kv_workspace_bytes(p, kv_splits(p)); }

Status run_kv(const KvCacheParams& p) {
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return {StatusCode::kInvalidArgument,
            "cute_fa2's KV-cache forward needs a 16-byte aligned workspace (fp32 partials)"};
  cuda::DeviceGuard guard(p.device_index);
  const int splits = kv_splits(p);
  // The API sized the workspace with workspace_kv's own kv_splits; the two agree unless a
  // CUDA query failed in one of them (then kv_splits falls back to one split).
  if (kv_workspace_bytes(p, splits) > p.workspace_bytes)
    return {StatusCode::kInvalidArgument,
            "workspace_bytes (" + std::to_string(p.workspace_bytes) + ") is smaller than the " +
                std::to_string(splits) + " splits of this call need (" +
                std::to_string(kv_workspace_bytes(p, splits)) + ")"};
  return entries_for<KvEntries>(p).run(p, splits);
}

}  // namespace

// auto's GPU forward and backward: above fa2_mma (30) and fa2_simt_bwd (20). Both passes
// take dropout: the forward applies common/dropout.h's Philox mask per fragment, the
// backward regenerates it.
// forward_kvcache on CUDA tensors is this entry's too (the only kernel with that pass).
KernelEntry cute_fa2_entry() {
  KernelEntry e{.info = {.name = "cute_fa2", .arch = "sm80+", .summary = kSummary,
                         .forward_dropout = true, .backward_dropout = true},
                .auto_priority = 40};
  e.supports_fwd = supports_fwd, e.run_fwd = run_fwd;
  e.supports_bwd = supports_bwd, e.workspace_bwd = workspace_bwd, e.run_bwd = run_bwd;
  e.supports_kv = supports_kv, e.workspace_kv = workspace_kv, e.run_kv = run_kv;
  return e;
}

}  // namespace flashlab::sm80
