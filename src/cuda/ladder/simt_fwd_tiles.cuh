// The forward tile layout that rung 2 (fa1) and rung 3 (fa2_simt) share, so that the
// difference between their numbers is the algorithm (loop order, where O/ℓ/m live), not
// the tiles: 64×64 tiles in fp32 shared memory, 256 threads, thread (g, t) owning rows
// 4g..4g+3 × keys 4t..4t+3 of S and the same rows × channels 64s + 4t .. +3 of O.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/ladder/simt_common.cuh"
#include "cuda/refusals.h"

namespace flashlab::cuda::simt {

// ---- compile-time shape ------------------------------------------------------------------
constexpr int kBlockM = 64;         // query rows per thread block
constexpr int kBlockN = 64;         // keys per K/V tile
constexpr int kRowsPerThread = 4;   // rows 4g .. 4g + 3
constexpr int kLanesPerRow = 16;    // threads of a row group (consecutive lanes)
constexpr int kKeysPerThread = kBlockN / kLanesPerRow;                    // keys 4t .. 4t + 3
constexpr int kThreads = kBlockM / kRowsPerThread * kLanesPerRow;         // 256
constexpr int kWarpRows = 32 / kLanesPerRow * kRowsPerThread;             // 8 rows per warp
constexpr int kSlabChannels = 4 * kLanesPerRow;                           // 64 channels per slab
static_assert(kKeysPerThread == 4 && kThreads == 256, "the layout above");

// kHeadDim is max(head_dim, head_dim_v) rounded up to 64, 128 or 256: the extra channels
// are zero in shared memory and never stored. Shared memory, all fp32:
//   Qᵀ [kHeadDim][kBlockM] + Kᵀ [kHeadDim][kBlockN] + V [kBlockN][kHeadDim] + P [kBlockM][kBlockN]
//   = 64 KB (D = 64), 112 KB (D = 128: two blocks share an H100 SM), 208 KB (D = 256).
constexpr int smem_bytes(int head_dim) {
  return int(sizeof(float)) * (kBlockM * head_dim + 2 * kBlockN * head_dim + kBlockM * kBlockN);
}
// Blocks per SM the register budget is sized for (65536 registers / (256 threads × blocks)).
constexpr int min_blocks_per_sm(int head_dim) { return head_dim <= 128 ? 2 : 1; }

inline int head_dim_bucket(const FwdParams& p) {
  const int d = std::max(p.head_dim, p.head_dim_v);
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}

// Calls f.template operator()<T, kHeadDim>() for p's dtype and head-dim bucket (both
// already checked by supports()).
template <class F>
Status dispatch(const FwdParams& p, F&& f) {
  return dispatch_dtype(p.dtype, [&]<class T>() -> Status {
    switch (head_dim_bucket(p)) {
      case 64: return f.template operator()<T, 64>();
      case 128: return f.template operator()<T, 128>();
      default: return f.template operator()<T, 256>();
    }
  });
}

// supports() of both SIMT forward rungs: any CUDA float type, head dims up to 256 (in the
// buckets above), heads on grid y and batch on z, and the device half for the instantiation
// `kernel_of.template operator()<T, kHeadDim>()` names.
template <class KernelOf>
std::string supports_simt_fwd(const FwdParams& p, KernelOf&& kernel_of) {
  FL_REFUSE_IF(refuse_placement(p, Inputs::kFloat));
  const int bucket = head_dim_bucket(p);
  if (bucket == 0)
    return "head_dim and head_dim_v must be <= 256 (run as 64, 128 or 256 with zero padding), got " +
           std::to_string(p.head_dim) + " and " + std::to_string(p.head_dim_v);
  FL_REFUSE_IF(refuse_grid_heads_batch(p));
  const void* kernel = nullptr;
  dispatch(p, [&]<class T, int kHeadDim>() -> Status {
    kernel = kernel_of.template operator()<T, kHeadDim>();
    return {};
  });
  return device_supports(p.device_index, smem_bytes(bucket), kernel);
}

// Launches a rung's kernel for bucket kHeadDim on p's stream: grid × kThreads threads, with
// the launch attributes both rungs set: the dynamic shared memory of the bucket, and the SM's
// unified L1/shared storage given to shared memory (loads go global → registers → shared and
// nothing is re-read through L1), so that min_blocks_per_sm blocks fit.
template <int kHeadDim, class... Args>
Status launch_simt_fwd(void (*kernel)(Args...), dim3 grid, const FwdParams& p,
                       const std::type_identity_t<Args>&... args) {
  constexpr int kSmem = smem_bytes(kHeadDim);
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  kernel<<<grid, kThreads, kSmem, static_cast<cudaStream_t>(p.stream)>>>(args...);
  FL_CUDA_CHECK_LAUNCH();
  return {};
}

// ---- shared-memory tiles -----------------------------------------------------------------
// Q and K are stored d-major (transposed: Qᵀ[d][row], Kᵀ[d][key]), so that the 4 rows and
// the 4 keys of a thread are one float4 each at every channel d: S = Q Kᵀ is a sum of outer
// products, 2 loads per 16 FMAs, 8 registers of operands. V is stored as it comes
// ([key][channel]): O += P V reads 16 lanes × 4 consecutive channels of one key row.
//
// P [row][key] is written by its row group (one float4 per row) and read back by the same
// warp: the two row groups of warp w read rows 8w + r and 8w + 4 + r at the same column,
// which without padding share their banks. Column col of row `row` is therefore stored at
// col ^ p_swizzle(row): bit 2 of the row flips bit 4 of the column, 16 banks away, whole
// float4 slots staying inside their 32-float span. (Padding each row by 4 floats would do
// the same for 1 KB more per block.)
__device__ __forceinline__ int p_swizzle(int row) { return (row & 4) << 2; }

// Sets s[r][c] to −inf where key j_first + c is not one that row i_first + r sees: the
// per-element mask of a tile the mask cuts (MaskPolicy::tile_is_full). The key range is
// clamped to len_k, so the zero rows past the end of the keys are outside too.
__device__ __forceinline__ void mask_cut_tile(float (&s)[kRowsPerThread][kKeysPerThread],
                                              const MaskPolicy& mask, int i_first, int j_first,
                                              int len_q, int len_k) {
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = i_first + r;
    const int lo = mask.key_begin(i, len_q, len_k) - j_first;
    const int hi = mask.key_end(i, len_q, len_k) - j_first;
#pragma unroll
    for (int c = 0; c < kKeysPerThread; ++c)
      if (c < lo || c >= hi) s[r][c] = -INFINITY;
  }
}

// simt_common.cuh's load_tile into a row-major [kRows][kCols] tile (no swizzle).
template <class T, int kRows, int kCols, int kThreads_>
__device__ __forceinline__ void load_tile(float* tile, const T* src, int64_t row_stride,
                                          int rows_valid, int cols_valid, int thread) {
  load_tile<T, kRows, kCols, kThreads_>(tile, src, row_stride, rows_valid, cols_valid, thread,
                                        [](int) { return 0; });
}

// load_tile's copy into a d-major tile [kCols][kRows] (element (r, d) at tile[d·kRows + r]).
// Consecutive threads take the same chunk column of consecutive rows, so each scalar store
// of a warp fills 32 consecutive floats (no bank conflict); a warp's 16-byte loads then
// touch 32 rows, and the next warps load the neighbouring chunks of the same sectors.
template <class T, int kRows, int kCols, int kThreads_>
__device__ __forceinline__ void load_tile_transposed(float* tile, const T* src, int64_t row_stride,
                                                     int rows_valid, int cols_valid, int thread) {
  constexpr int kElems = 16 / int(sizeof(T));
  constexpr int kChunks = kRows * (kCols / kElems);
  static_assert(kChunks % kThreads_ == 0 && kRows % 32 == 0, "whole warps per chunk column");
#pragma unroll 2
  for (int i = 0; i < kChunks / kThreads_; ++i) {
    const int chunk = thread + i * kThreads_;
    const int r = chunk % kRows, c = chunk / kRows * kElems;
    const bool row_ok = r < rows_valid;
    float x[kElems];
    load_chunk(src + (row_ok ? r * row_stride + c : 0), row_ok ? cols_valid - c : 0, x);
#pragma unroll
    for (int e = 0; e < kElems; ++e) tile[(c + e) * kRows + r] = x[e];
  }
}

// Max and sum over the 16 lanes of a row group (xor offsets below 16 stay inside it).
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int o = kLanesPerRow / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = kLanesPerRow / 2; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}


// ---- the two tile products ---------------------------------------------------------------
// s[r][c] = Σ_d Qᵀ[d][row0 + r] · Kᵀ[d][key0 + c]: per channel, one float4 of each
// (1 wavefront for Q's two distinct addresses per warp, 2 for K's 16) feed 16 FMAs.
template <int kHeadDim>
__device__ __forceinline__ void tile_scores(const float* qt_tile, const float* kt_tile, int row0,
                                            int key0, float (&s)[kRowsPerThread][kKeysPerThread]) {
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
    for (int c = 0; c < kKeysPerThread; ++c) s[r][c] = 0.f;
#pragma unroll 4
  for (int d = 0; d < kHeadDim; ++d) {
    const float4 q = load_float4(qt_tile + d * kBlockM + row0);
    const float4 k = load_float4(kt_tile + d * kBlockN + key0);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
      for (int c = 0; c < kKeysPerThread; ++c) s[r][c] = fmaf(comp(q, r), comp(k, c), s[r][c]);
  }
}

// o[r][s] += Σ_k P[row0 + r][k] · V[k][64s + 4t .. 64s + 4t + 3]: per 4 keys, 4 float4
// loads of P (one per row) and 4·kSlabs of V feed 64·kSlabs FMAs. On a tile the mask cuts
// (kCut), a key with P = 0 is skipped rather than multiplied: a NaN or Inf in a masked key's
// V must not reach the row (0 · NaN is NaN). Full tiles take the plain FMAs.
template <int kHeadDim, bool kCut>
__device__ __forceinline__ void accumulate_pv(const float* p_tile, const float* v_tile, int row0,
                                              int t, float4 (&o)[kRowsPerThread][kHeadDim / 64]) {
  constexpr int kSlabs = kHeadDim / kSlabChannels;
  const float* pr = p_tile + row0 * kBlockN;
  const float* v = v_tile + 4 * t;
  const int swz = p_swizzle(row0);  // the same for the thread's 4 rows
#pragma unroll 2
  for (int k = 0; k < kBlockN; k += 4) {
    float4 pv[kRowsPerThread];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) pv[r] = load_float4(pr + r * kBlockN + (k ^ swz));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int s = 0; s < kSlabs; ++s) {
        const float4 vv = load_float4(v + (k + kk) * kHeadDim + s * kSlabChannels);
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) {
          const float a = comp(pv[r], kk);
          if (!kCut || a != 0.f) axpy4(o[r][s], a, vv);
        }
      }
  }
}

}  // namespace flashlab::cuda::simt
