// Rung 2 — fa1: FlashAttention-1's Algorithm 1, as the paper writes it, on CUDA cores.
//
//   O = 0, ℓ = 0, m = −∞ in HBM
//   for each K/V block j:                 (outer loop: K_j, V_j stay in shared memory)
//     for each Q block i:                 (inner loop)
//       load Q_i, O_i, ℓ_i, m_i from HBM
//       S = scale · Q_i K_jᵀ (masked, softcapped);  m̃ = rowmax S,  P̃ = e^(S − m̃),  ℓ̃ = rowsum P̃
//       m_new = max(m_i, m̃),  ℓ_new = e^(m_i − m_new) ℓ_i + e^(m̃ − m_new) ℓ̃
//       O_i ← diag(ℓ_new)⁻¹ (diag(ℓ_i) e^(m_i − m_new) O_i + e^(m̃ − m_new) P̃ V_j)
//       write O_i, ℓ_i = ℓ_new, m_i = m_new to HBM
//   finalize: out = O in the output dtype, LSE = m + log ℓ
//
// What it adds over rung 1 (naive): the score matrix never leaves the chip. A 64×64 tile
// of S lives in registers and shared memory, and the softmax is computed online (running
// max m and sum ℓ per row), so extra memory drops from O(seqlen_q·seqlen_k) to
// O(seqlen_q·head_dim): the running O (fp32: rounding it to the output dtype at every step
// would lose precision), m and ℓ, heads_q·total_q·(head_dim_v + 2) floats of workspace.
//
// What it still pays, and rung 3 (fa2_simt) removes: with K/V outside, every (Q block,
// K/V block) step reads and writes the running O, m, ℓ of its rows in HBM: at head dim 128
// and bf16, 64·128·4·2 bytes of O plus 64·128·2 of Q per 64×64 tile, ~20 bytes per score,
// more than naive's ~16. O is also renormalized (a division) at every step.
//
// Parallelism: the paper's inner loop iterations are independent (each owns its rows), so
// a (batch, head) is split over several thread blocks, each taking every n-th Q block
// (interleaved, so that under a causal mask each gets a fair share); each still streams
// the K/V blocks through shared memory in the outer loop. K/V blocks that none of a thread
// block's rows can see are skipped, and only tiles the mask cuts are masked per element.
//
// The work inside a step is a SIMT tile kernel that rung 3 reuses unchanged:
//   thread (g, t) of 256: g = tid / 16 is its row group, t = tid % 16.
//   S = Q Kᵀ   rows 4g..4g+3 × keys 4t..4t+3                   (4×4 scores in registers)
//   O          rows 4g..4g+3 × channels 64s + 4t .. 64s + 4t + 3 of every 64-channel slab s
//   A row group is 16 consecutive lanes, so a row's max and sum are 4 __shfl_xor_sync away,
//   and a warp owns 8 rows (its two row groups) that no other warp touches: P goes through
//   shared memory between the two products with only a warp barrier.
//
// Measured on H100 80GB HBM3 (`flashlab bench --ladder`, batch 4, heads 16, seqlen 4096,
// head dim 128, bf16):
// 24.3 ms, 22.7 TFLOP/s (causal 22.2), 24.7x naive, 130 MiB of workspace (O(seqlen)); ncu:
// 11.9 GB read and 8.3 GB written in HBM, the running O, ℓ, m round trips.
// docs/ladder/02-fa1.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/refusals.h"
#include "common/registry.h"
#include "cuda/ladder/simt_fwd_tiles.cuh"

namespace flashlab::cuda {
namespace {

using namespace simt;  // the tile layout shared with rung 3 (simt_fwd_tiles.cuh)

// The paper sizes its blocks from the SRAM size M (B_c = ⌈M/4d⌉, B_r = min(B_c, d)); here
// both are 64 (kBlockM = B_r, kBlockN = B_c) and the thread block, not one thread, works
// on a block.
//
// Thread blocks per SM the grid aims for (about 4 waves of 2 resident blocks), reached by
// splitting each (batch, head)'s Q blocks over several thread blocks.
constexpr int kTargetBlocksPerSm = 8;

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "rung 2: FlashAttention-1's Algorithm 1 on CUDA cores: K/V blocks outside, Q blocks inside, "
    "running O/m/ℓ through an O(seqlen) fp32 workspace in HBM; fp32/fp16/bf16, head dims <= 256, "
    "every mask, GQA, varlen; forward only";

// ---- the kernel --------------------------------------------------------------------------
// The workspace: running O, m, ℓ of every query row of every head, in HBM.
struct Workspace {
  float* o;  // [heads_q, total_q, ld] fp32; O is kept normalized, as Algorithm 1 does
  float* m;  // [heads_q, total_q] running max (nats)
  float* l;  // [heads_q, total_q] running sum
  int ld;    // head_dim_v rounded up to 4: rows start 16-byte aligned (float4 access)
};

// grid (splits, heads_q, batch), 256 threads, smem_bytes(kHeadDim) dynamic. Thread block
// `split` of a (batch, head) owns Q blocks split, split + splits, split + 2·splits, ...
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kHeadDim))
    fa1_kernel(const __grid_constant__ FwdParams p, const Workspace ws) {
  constexpr int kSlabs = kHeadDim / kSlabChannels;
  const int split = blockIdx.x, splits = gridDim.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const SeqInfo seq = seq_info(p, b);
  const int len_q = seq.len_q, len_k = seq.len_k, dv = p.head_dim_v;
  const int q_blocks = (len_q + kBlockM - 1) / kBlockM;
  if (split >= q_blocks) return;  // this sequence has fewer Q blocks than the grid
  const MaskPolicy mask = p.mask;

  const int tid = threadIdx.x, warp = tid / 32;
  const int row0 = tid / kLanesPerRow * kRowsPerThread;  // rows row0 .. row0 + 3 of a Q block
  const int t = tid % kLanesPerRow;                      // channels 64s + 4t .. 64s + 4t + 3
  const int key0 = t * kKeysPerThread;                   // keys key0 .. key0 + 3 of a K/V block

  // Workspace row of query row i of this (batch, head): ws_row0 + i.
  const int64_t ws_row0 = int64_t(h) * p.total_q + (p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q);

  // Line 2 of Algorithm 1: O = 0, ℓ = 0, m = −∞ for this thread block's rows. Each thread
  // sets the elements it updates later; the first barrier below publishes m and ℓ to the
  // other lanes of the row group.
  for (int qb = split; qb < q_blocks; qb += splits) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = qb * kBlockM + row0 + r;
      if (i >= len_q) continue;
#pragma unroll
      for (int sl = 0; sl < kSlabs; ++sl) {
        const int ch = sl * kSlabChannels + 4 * t;
        if (ch < dv)
          *reinterpret_cast<float4*>(ws.o + (ws_row0 + i) * ws.ld + ch) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      if (t == 0) {
        ws.m[ws_row0 + i] = -INFINITY;
        ws.l[ws_row0 + i] = 0.f;
      }
    }
  }

  // Does Q block qb have a row that sees a key of the K/V block at j0? (Both bounds of
  // the visible keys grow with the row, so the block's rows see one range.)
  auto block_sees = [&](int qb, int j0) {
    const int i0 = qb * kBlockM, i1 = min(i0 + kBlockM, len_q);
    return mask.block_key_end(i0, i1, len_q, len_k) > j0 &&
           mask.block_key_begin(i0, i1, len_q, len_k) < j0 + kBlockN;
  };
  // Keys that some row of this thread block sees: from the first row of its first Q
  // block to the last row of its last.
  const int last_qb = split + (q_blocks - 1 - split) / splits * splits;
  const int rows_begin = split * kBlockM, rows_end = min(len_q, (last_qb + 1) * kBlockM);
  const int key_lo = mask.block_key_begin(rows_begin, rows_end, len_q, len_k);
  const int key_hi = mask.block_key_end(rows_begin, rows_end, len_q, len_k);
  const int n_begin = key_lo / kBlockN;
  const int n_end = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN : n_begin;

  extern __shared__ __align__(16) float smem[];
  float* qt_tile = smem;                          // [kHeadDim][kBlockM]  Q_iᵀ
  float* kt_tile = qt_tile + kHeadDim * kBlockM;  // [kHeadDim][kBlockN]  K_jᵀ
  float* v_tile = kt_tile + kHeadDim * kBlockN;   // [kBlockN][kHeadDim]  V_j
  float* p_tile = v_tile + kBlockN * kHeadDim;    // [kBlockM][kBlockN]   P̃, swizzled

  const T* q_seq = static_cast<const T*>(p.q) + b * p.q_batch_stride +
                   seq.start_q * p.q_row_stride + h * p.q_head_stride;
  const T* k_seq = static_cast<const T*>(p.k) + b * p.k_batch_stride +
                   seq.start_k * p.k_row_stride + hk * p.k_head_stride;
  const T* v_seq = static_cast<const T*>(p.v) + b * p.v_batch_stride +
                   seq.start_k * p.v_row_stride + hk * p.v_head_stride;

  // Line 5: the outer loop over K/V blocks.
  for (int n = n_begin; n < n_end; ++n) {
    const int j0 = n * kBlockN;
    bool needed = false;  // interleaved Q blocks can leave gaps in a window's key range
    for (int qb = split; qb < q_blocks; qb += splits) needed = needed || block_sees(qb, j0);
    if (!needed) continue;

    __syncthreads();  // every warp is done with the previous K_j, V_j
    // Line 6: K_j, V_j to shared memory. Rows past len_k become zeros: finite scores,
    // and P̃·V never meets garbage (0 · NaN would be NaN).
    load_tile_transposed<T, kBlockN, kHeadDim, kThreads>(
        kt_tile, k_seq + j0 * p.k_row_stride, p.k_row_stride, len_k - j0, p.head_dim, tid);
    load_tile<T, kBlockN, kHeadDim, kThreads>(v_tile, v_seq + j0 * p.v_row_stride, p.v_row_stride,
                                              len_k - j0, dv, tid);

    // Line 7: the inner loop over this thread block's Q blocks.
    for (int qb = split; qb < q_blocks; qb += splits) {
      if (!block_sees(qb, j0)) continue;  // block-uniform: no barrier is skipped by some threads only
      const int i0 = qb * kBlockM, rows_valid = min(kBlockM, len_q - i0);
      __syncthreads();  // every warp is done with the previous Q_i (and K_j, V_j are visible)
      // Line 8: Q_i to shared memory (ℓ_i and m_i follow below, where they are used).
      load_tile_transposed<T, kBlockM, kHeadDim, kThreads>(
          qt_tile, q_seq + i0 * p.q_row_stride, p.q_row_stride, rows_valid, p.head_dim, tid);
      __syncthreads();

      // From here on each warp works on its own 8 rows: it skips rows past len_q and rows
      // that cannot see this K/V block.
      const int wi0 = i0 + warp * kWarpRows, wi1 = min(wi0 + kWarpRows, len_q);
      if (wi0 >= wi1 || mask.block_key_end(wi0, wi1, len_q, len_k) <= j0 ||
          mask.block_key_begin(wi0, wi1, len_q, len_k) >= j0 + kBlockN)
        continue;

      // Line 9: S = scale · Q_i K_jᵀ, as logits in nats (Algorithm 1 uses e^x).
      float s[kRowsPerThread][kKeysPerThread];
      tile_scores<kHeadDim>(qt_tile, kt_tile, row0, key0, s);
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int c = 0; c < kKeysPerThread; ++c) s[r][c] = mask.logit(s[r][c] * p.scale);
      // Per-element mask only where the block is cut for this warp's rows (warp-uniform).
      const bool cut =
          j0 + kBlockN > len_k || !mask.tile_is_full(wi0, wi1, j0, j0 + kBlockN, len_q, len_k);
      if (cut) mask_cut_tile(s, mask, i0 + row0, j0 + key0, len_q, len_k);

      // Line 8, continued: ℓ_i, m_i from HBM (rows past len_q: as if they had seen nothing).
      float m_old[kRowsPerThread], l_old[kRowsPerThread];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int i = i0 + row0 + r;
        m_old[r] = i < len_q ? ws.m[ws_row0 + i] : -INFINITY;
        l_old[r] = i < len_q ? ws.l[ws_row0 + i] : 0.f;
      }

      // Lines 10-11: block statistics and the new running ones. Line 12 is then
      //   O_i ← a·O_i + (b·P̃) V_j,  a = ℓ_i e^(m_i − m_new) / ℓ_new,  b = e^(m̃ − m_new) / ℓ_new:
      // b scales P̃ on its way to shared memory, a is applied when O_i is read back.
      float o_coef[kRowsPerThread];  // a
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const float m_blk = group_max(fmaxf(fmaxf(s[r][0], s[r][1]), fmaxf(s[r][2], s[r][3])));
        // A row that sees no key of this block: P̃ = 0 (not e^(−∞ + ∞)).
        const float m_blk_ref = m_blk == -INFINITY ? 0.f : m_blk;
        float l_blk = 0.f;
#pragma unroll
        for (int c = 0; c < kKeysPerThread; ++c) {
          s[r][c] = expf(s[r][c] - m_blk_ref);
          l_blk += s[r][c];
        }
        l_blk = group_sum(l_blk);
        const float m_new = fmaxf(m_old[r], m_blk);
        const float m_new_ref = m_new == -INFINITY ? 0.f : m_new;  // no key so far: all 0
        const float e_old = expf(m_old[r] - m_new_ref);  // e^(m_i − m_new), 0 if m_i = −∞
        const float e_blk = expf(m_blk - m_new_ref);     // e^(m̃ − m_new), 0 if m̃ = −∞
        const float l_new = e_old * l_old[r] + e_blk * l_blk;
        const float inv_l = l_new > 0.f ? 1.f / l_new : 0.f;
        o_coef[r] = e_old * l_old[r] * inv_l;
        const float pv_coef = e_blk * inv_l;  // b
#pragma unroll
        for (int c = 0; c < kKeysPerThread; ++c) s[r][c] *= pv_coef;
        m_old[r] = m_new;
        l_old[r] = l_new;
      }

      // b·P̃ goes through shared memory (a row's keys are spread over 16 lanes); the rows
      // are this warp's own, so a warp barrier is enough.
      const int p_col = key0 ^ p_swizzle(row0);  // one float4 slot per row
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
        *reinterpret_cast<float4*>(p_tile + (row0 + r) * kBlockN + p_col) =
            make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
      __syncwarp();  // ... and every lane has read m_i, ℓ_i: line 13 can overwrite them
      // Line 13: ℓ_i ← ℓ_new, m_i ← m_new.
      if (t == 0) {
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) {
          const int i = i0 + row0 + r;
          if (i < len_q) {
            ws.m[ws_row0 + i] = m_old[r];
            ws.l[ws_row0 + i] = l_old[r];
          }
        }
      }

      // Line 12: (b·P̃) V_j, plus a·O_i read from HBM, back to HBM. Each thread reads and
      // writes only its own elements of O.
      float4 pv[kRowsPerThread][kSlabs];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int sl = 0; sl < kSlabs; ++sl) pv[r][sl] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (cut)
        accumulate_pv<kHeadDim, true>(p_tile, v_tile, row0, t, pv);
      else
        accumulate_pv<kHeadDim, false>(p_tile, v_tile, row0, t, pv);
      // The walk over this thread's rows and slabs, alike in rung 5's dQ update on purpose:
      // the loop is the layout, what each writes differs.
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int i = i0 + row0 + r;
        if (i >= len_q) continue;
        float* o_row = ws.o + (ws_row0 + i) * ws.ld;
#pragma unroll
        for (int sl = 0; sl < kSlabs; ++sl) {
          const int ch = sl * kSlabChannels + 4 * t;
          if (ch >= dv) continue;
          float4 o = load_float4(o_row + ch);
          o.x = fmaf(o_coef[r], o.x, pv[r][sl].x);
          o.y = fmaf(o_coef[r], o.y, pv[r][sl].y);
          o.z = fmaf(o_coef[r], o.z, pv[r][sl].z);
          o.w = fmaf(o_coef[r], o.w, pv[r][sl].w);
          *reinterpret_cast<float4*>(o_row + ch) = o;
        }
      }
    }
  }

  // Finalize: O is already normalized; round it to the output dtype, LSE = m + log ℓ.
  // Each thread reads back only what it wrote itself (O elements; m, ℓ for t = 0).
  T* o_seq = static_cast<T*>(p.out) + b * p.o_batch_stride + seq.start_q * p.o_row_stride +
             h * p.o_head_stride;
  for (int qb = split; qb < q_blocks; qb += splits) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = qb * kBlockM + row0 + r;
      if (i >= len_q) continue;
      const float* o_row = ws.o + (ws_row0 + i) * ws.ld;
#pragma unroll
      for (int sl = 0; sl < kSlabs; ++sl) {
        const int ch = sl * kSlabChannels + 4 * t;
        if (ch < dv) store4(o_seq + i * p.o_row_stride + ch, load_float4(o_row + ch), dv - ch);
      }
      if (t == 0 && p.lse) {
        const float l = ws.l[ws_row0 + i];
        p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + seq.start_q + i] =
            l > 0.f ? ws.m[ws_row0 + i] + logf(l) : -INFINITY;  // a row that saw no key: −∞
      }
    }
  }
}

// ---- launch ------------------------------------------------------------------------------
constexpr size_t kWorkspaceAlign = 256;  // each workspace array starts on its own 256 bytes

size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
int workspace_ld(const FwdParams& p) { return (p.head_dim_v + 3) / 4 * 4; }
size_t o_bytes(const FwdParams& p) {
  return align_up(size_t(p.heads_q) * size_t(p.total_q) * size_t(workspace_ld(p)) * sizeof(float));
}
size_t row_bytes(const FwdParams& p) {
  return align_up(size_t(p.heads_q) * size_t(p.total_q) * sizeof(float));
}

// O(seqlen): heads_q · total_q · (head_dim_v + 2) floats (plus alignment).
size_t workspace(const FwdParams& p) { return o_bytes(p) + 2 * row_bytes(p); }

template <class T, int kHeadDim>
Status launch(const FwdParams& p, const Workspace& ws, int splits) {
  return launch_simt_fwd<kHeadDim>(fa1_kernel<T, kHeadDim>, dim3(splits, p.heads_q, p.batch), p,
                                   p, ws);
}

std::string supports(const FwdParams& p) {
  return supports_simt_fwd(p, []<class T, int kHeadDim>() {
    return reinterpret_cast<const void*>(&fa1_kernel<T, kHeadDim>);
  });
}

Status run(const FwdParams& p) {
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return {StatusCode::kInvalidArgument, "fa1 needs a 16-byte aligned workspace (it is read as float4)"};
  DeviceGuard guard(p.device_index);
  char* base = static_cast<char*>(p.workspace);
  const Workspace ws{reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + o_bytes(p)),
                     reinterpret_cast<float*>(base + o_bytes(p) + row_bytes(p)), workspace_ld(p)};
  int sms = 0;
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device_index));
  const int64_t heads = int64_t(p.batch) * p.heads_q;
  const int64_t q_blocks = (int64_t(p.seqlen_q) + kBlockM - 1) / kBlockM;
  const int splits = int(std::clamp<int64_t>((int64_t(kTargetBlocksPerSm) * sms + heads - 1) / heads,
                                             1, q_blocks));
  return dispatch(p, [&]<class T, int kHeadDim>() { return launch<T, kHeadDim>(p, ws, splits); });
}

}  // namespace

// auto_priority 0 (the default): a teaching rung, run only when named.
KernelEntry fa1_entry() {
  return {.info = {"fa1", "sm80+", kSummary},
          .supports_fwd = supports, .workspace_fwd = workspace, .run_fwd = run};
}

}  // namespace flashlab::cuda
