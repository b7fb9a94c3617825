// Rung 3 — fa2_simt: FlashAttention-2's forward on CUDA cores.
//
// Rung 2 (fa1) runs FlashAttention-1's Algorithm 1: K/V blocks in the outer loop, Q blocks
// in the inner one, so the running O, ℓ and m of every query row travel to HBM and back
// once per K/V block, and O is renormalized at every step. FlashAttention-2 swaps the loops:
//   - a thread block owns one Q block (64 rows of one (batch, head)) and walks over the
//     K/V tiles its rows can see; O, m and ℓ stay in registers the whole time,
//   - O is rescaled lazily, only by e^(m_old − m_new) when the running max moves, and
//     normalized once at the end; O and LSE are written once,
//   - the softmax runs in log2 units: exp2 of logits scaled by scale·log2(e)
//     (p.scale_log2), which is what the hardware's ex2 instruction computes,
//   - K/V tiles that the mask hides from every row of the block are never loaded, and only
//     the tiles the mask cuts are masked per element (MaskPolicy::tile_is_full).
// Tiles, thread layout and shared-memory layout are rung 2's, so the difference between
// the two rungs' numbers is the algorithm: the O/ℓ/m round trips (~20 bytes per score at
// head dim 128, bf16) disappear; what is left is reading K and V once per Q block (~8 bytes
// per score, mostly from L2).
//
// Thread layout (256 threads; a 64-row Q block against a 64-key tile):
//   thread (g, t): g = tid / 16 is its row group, t = tid % 16.
//   S = Q Kᵀ   rows 4g..4g+3 × keys 4t..4t+3                   (4×4 scores in registers)
//   O          rows 4g..4g+3 × channels 64s + 4t .. 64s + 4t + 3 of every 64-channel slab s
//   A row group is 16 consecutive lanes, so a row's max and sum are 4 __shfl_xor_sync away,
//   and a warp owns 8 rows (its two row groups) that no other warp touches: P goes through
//   shared memory between the two products with only a warp barrier.
//
// Measured on H100 80GB HBM3 (`flashlab bench --ladder`, batch 4, heads 16, seqlen 4096,
// head dim 128, bf16):
// 16.6 ms, 33.2 TFLOP/s (causal 31.3, 1.89x faster per call), 1.46x fa1, 0 B of workspace;
// ncu: HBM traffic down to 0.20 GB read / 0.06 GB written, FMA pipe 54 % busy.
// docs/ladder/03-fa2-simt.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/refusals.h"
#include "common/constants.h"
#include "common/registry.h"
#include "cuda/ladder/simt_fwd_tiles.cuh"

namespace flashlab::cuda {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "rung 3: FlashAttention-2 forward on CUDA cores: a block owns 64 query rows, O/m/ℓ in "
    "registers, lazy rescaling, exp2, masked tiles skipped; fp32/fp16/bf16, head dims <= 256, "
    "every mask, GQA, varlen; forward only";

using namespace simt;  // the tile layout shared with rung 2 (simt_fwd_tiles.cuh)

// ---- the kernel --------------------------------------------------------------------------
// grid (ceil(seqlen_q / 64), heads_q, batch), 256 threads, smem_bytes(kHeadDim) dynamic.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kHeadDim))
    fa2_simt_kernel(const __grid_constant__ FwdParams p) {
  constexpr int kSlabs = kHeadDim / kSlabChannels;
  const int b = blockIdx.z, h = blockIdx.y, hk = h / p.group;
  // Q blocks run last first: under a causal mask the last ones see the most keys, and
  // starting the longest blocks first shortens the tail of the grid.
  const int i0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBlockM;
  const SeqInfo seq = seq_info(p, b);
  const int len_q = seq.len_q, len_k = seq.len_k;
  if (i0 >= len_q) return;  // varlen: this sequence is shorter than the grid
  const int rows_valid = min(kBlockM, len_q - i0);
  const MaskPolicy mask = p.mask;

  // Only K/V tiles [n_begin, n_end) hold keys that some row of the block sees.
  const int key_lo = mask.block_key_begin(i0, i0 + rows_valid, len_q, len_k);
  const int key_hi = mask.block_key_end(i0, i0 + rows_valid, len_q, len_k);
  const int n_begin = key_lo / kBlockN;
  const int n_end = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_begin;

  extern __shared__ __align__(16) float smem[];
  float* qt_tile = smem;                          // [kHeadDim][kBlockM]  Qᵀ
  float* kt_tile = qt_tile + kHeadDim * kBlockM;  // [kHeadDim][kBlockN]  Kᵀ
  float* v_tile = kt_tile + kHeadDim * kBlockN;   // [kBlockN][kHeadDim]
  float* p_tile = v_tile + kBlockN * kHeadDim;    // [kBlockM][kBlockN]   swizzled

  const int tid = threadIdx.x, warp = tid / 32;
  const int row0 = tid / kLanesPerRow * kRowsPerThread;  // rows row0 .. row0 + 3 of the block
  const int t = tid % kLanesPerRow;                      // channels 64s + 4t .. 64s + 4t + 3
  const int key0 = t * kKeysPerThread;                   // keys key0 .. key0 + 3 of a tile

  // Alike in rung 4's kernel on purpose: each rung addresses its tensors itself, so that
  // each file reads on its own.
  const T* q_src = static_cast<const T*>(p.q) + b * p.q_batch_stride +
                   (seq.start_q + i0) * p.q_row_stride + h * p.q_head_stride;
  const T* k_seq = static_cast<const T*>(p.k) + b * p.k_batch_stride +
                   seq.start_k * p.k_row_stride + hk * p.k_head_stride;
  const T* v_seq = static_cast<const T*>(p.v) + b * p.v_batch_stride +
                   seq.start_k * p.v_row_stride + hk * p.v_head_stride;

  // Q once; the first tile's barrier makes it visible.
  load_tile_transposed<T, kBlockM, kHeadDim, kThreads>(qt_tile, q_src, p.q_row_stride, rows_valid,
                                                       p.head_dim, tid);

  float4 o[kRowsPerThread][kSlabs];  // unnormalized O: Σ_j 2^(s_j − m) v_j
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) o[r][s] = make_float4(0.f, 0.f, 0.f, 0.f);
  float row_max[kRowsPerThread], row_sum[kRowsPerThread];  // m (log2 units); this lane's part of ℓ
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.f;
  }

  // This warp's rows; a warp whose rows are all past len_q helps to load but skips the math.
  const int wi0 = i0 + warp * kWarpRows, wi1 = min(wi0 + kWarpRows, len_q);

  for (int n = n_begin; n < n_end; ++n) {
    const int j0 = n * kBlockN;
    __syncthreads();  // every warp is done with the previous tile (K, V and its P rows)
    // Rows past len_k (only in the last tile) become zeros: finite scores, and P·V never
    // meets garbage (0 · NaN would be NaN).
    load_tile_transposed<T, kBlockN, kHeadDim, kThreads>(
        kt_tile, k_seq + j0 * p.k_row_stride, p.k_row_stride, len_k - j0, p.head_dim, tid);
    load_tile<T, kBlockN, kHeadDim, kThreads>(v_tile, v_seq + j0 * p.v_row_stride, p.v_row_stride,
                                              len_k - j0, p.head_dim_v, tid);
    __syncthreads();  // the tile (and Q) is visible to every warp
    if (wi0 >= wi1) continue;

    float s[kRowsPerThread][kKeysPerThread];  // S = Q Kᵀ, then P
    tile_scores<kHeadDim>(qt_tile, kt_tile, row0, key0, s);

    // Logits in log2 units; the softcap transform works on the scaled score in nats.
    if (mask.softcap > 0.f) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int c = 0; c < kKeysPerThread; ++c) s[r][c] = mask.logit(s[r][c] * p.scale) * kLog2e;
    } else {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int c = 0; c < kKeysPerThread; ++c) s[r][c] *= p.scale_log2;
    }
    // Per-element mask only where the tile is cut for this warp's rows (warp-uniform).
    const bool cut =
        j0 + kBlockN > len_k || !mask.tile_is_full(wi0, wi1, j0, j0 + kBlockN, len_q, len_k);
    if (cut) mask_cut_tile(s, mask, i0 + row0, j0 + key0, len_q, len_k);

    // Online softmax with lazy rescaling: O and ℓ are multiplied by 2^(m_old − m_new)
    // and never divided until the end.
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const float m_tile = group_max(fmaxf(fmaxf(s[r][0], s[r][1]), fmaxf(s[r][2], s[r][3])));
      const float m_new = fmaxf(row_max[r], m_tile);
      // A row that has seen no key yet keeps P = 0 and O = 0 instead of 2^(-inf + inf).
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float rescale = exp2f(row_max[r] - m_ref);  // 0 on the row's first visible tile
      row_max[r] = m_new;
      row_sum[r] *= rescale;
#pragma unroll
      for (int sl = 0; sl < kSlabs; ++sl) {
        o[r][sl].x *= rescale;
        o[r][sl].y *= rescale;
        o[r][sl].z *= rescale;
        o[r][sl].w *= rescale;
      }
#pragma unroll
      for (int c = 0; c < kKeysPerThread; ++c) {
        s[r][c] = exp2f(s[r][c] - m_ref);
        row_sum[r] += s[r][c];
      }
    }

    // P through shared memory: O += P V needs every key of a row, which 16 lanes hold.
    // The rows are this warp's own, so a warp barrier is enough.
    const int p_col = key0 ^ p_swizzle(row0);  // one float4 slot per row
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      *reinterpret_cast<float4*>(p_tile + (row0 + r) * kBlockN + p_col) =
          make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
    __syncwarp();
    if (cut)
      accumulate_pv<kHeadDim, true>(p_tile, v_tile, row0, t, o);
    else
      accumulate_pv<kHeadDim, false>(p_tile, v_tile, row0, t, o);
  }

  // Epilogue: ℓ over the row group, O /= ℓ once, LSE = (m + log2 ℓ)·ln 2, one write each.
  if (wi0 >= wi1) return;
  float inv_l[kRowsPerThread], lse[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const float l = group_sum(row_sum[r]);
    inv_l[r] = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key: O = 0
    lse[r] = l > 0.f ? (row_max[r] + log2f(l)) * kLn2 : -INFINITY;
  }
  // The walk over this thread's rows and 64-channel slabs, alike in rung 5's dK/dV store
  // on purpose: the loop is the layout, and each store's destination and bounds differ.
  T* o_dst = static_cast<T*>(p.out) + b * p.o_batch_stride + (seq.start_q + i0) * p.o_row_stride +
             h * p.o_head_stride;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int row = row0 + r;
    if (row >= rows_valid) continue;
#pragma unroll
    for (int sl = 0; sl < kSlabs; ++sl) {
      const int ch = sl * kSlabChannels + 4 * t;
      if (ch >= p.head_dim_v) continue;
      const float4 v = make_float4(o[r][sl].x * inv_l[r], o[r][sl].y * inv_l[r],
                                   o[r][sl].z * inv_l[r], o[r][sl].w * inv_l[r]);
      store4(o_dst + row * p.o_row_stride + ch, v, p.head_dim_v - ch);
    }
    if (t == 0 && p.lse)
      p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + seq.start_q + i0 + row] = lse[r];
  }
}

// ---- launch ------------------------------------------------------------------------------
template <class T, int kHeadDim>
Status launch(const FwdParams& p) {
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads_q, p.batch);
  return launch_simt_fwd<kHeadDim>(fa2_simt_kernel<T, kHeadDim>, grid, p, p);
}

std::string supports(const FwdParams& p) {
  return supports_simt_fwd(p, []<class T, int kHeadDim>() {
    return reinterpret_cast<const void*>(&fa2_simt_kernel<T, kHeadDim>);
  });
}

Status run(const FwdParams& p) {
  DeviceGuard guard(p.device_index);
  return dispatch(p, [&]<class T, int kHeadDim>() { return launch<T, kHeadDim>(p); });
}

}  // namespace

// auto's GPU fallback: fp32 and head dims fa2_mma does not cover
KernelEntry fa2_simt_entry() {
  return {.info = {"fa2_simt", "sm80+", kSummary},
          .auto_priority = 20, .supports_fwd = supports, .run_fwd = run};
}

}  // namespace flashlab::cuda
