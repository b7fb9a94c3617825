// Rung 5 — fa2_simt_bwd: FlashAttention-2's backward (Algorithm 2) on CUDA cores.
//
// The forward keeps only O and the LSE of each row; the backward recomputes everything
// else tile by tile, so it too needs no O(seqlen²) memory. Three kernels:
//   1. dot_do_o:  D_i = Σ_d dO_id · O_id (fp32, into the workspace), and the fp32 dQ
//                 accumulator of row i set to 0.                      one warp per (row, head)
//   2. main:      one thread block per (batch, kv head, block of 64 keys), looping over the
//                 query heads of its GQA group and the blocks of 64 query rows that can see
//                 its keys (MaskPolicy::block_key_*; the others are skipped):
//                   S = scale·Q Kᵀ → logits (softcap),  P = exp(logit − LSE)   (exp2, log2 units)
//                   dV += Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D) ∘ dlogit · scale
//                   dK += dSᵀ Q,   dQ += dS K   (fp32 atomicAdd into the accumulator)
//                 dK and dV stay in registers and are written once, in the output dtype.
//   3. dq_convert: the dQ accumulator → p.dtype.                      one warp per (row, head)
//
// Why this loop order (FlashAttention-2's): dK and dV of a key block are sums over all
// query rows, dQ of a row is a sum over all keys. Parallelizing over key blocks makes dK and
// dV private to one thread block (no synchronization, summed over the GQA group on chip);
// dQ is then shared between the key blocks of a row and goes through fp32 atomics, which
// is why the result is not bitwise deterministic (supports() refuses deterministic mode).
// Workspace: the dQ accumulator and D, heads_q · total_q · (head_dim + 1) floats: O(seqlen).
//
// Tiles (all fp32 in shared memory, converted on load; 256 threads; thread (g, t) with
// g = tid / 16 and t = tid % 16):
//   S, P, dP, dS  64 rows × 64 keys:  rows 4g..4g+3 × keys t, t+16, t+32, t+48
//   dK, dV        64 keys × D:        keys 4g..4g+3 × channels 64s + 4t .. 64s + 4t + 3
//   dQ            64 rows × D:        rows 4g..4g+3 × channels 64s + 4t .. 64s + 4t + 3
// S and dP reduce over head channels, stored contiguously in the row-major Q, K, dO and V
// tiles: each thread reads 4 channels of its 4 rows and 4 keys per step (8 float4 loads
// for 64 FMAs). dV, dK and dQ reduce over rows or keys, which index the tiles' rows: each
// step is an outer product of a float4 of P or dS and float4s of dO, Q or K.
//
// Measured on H100 80GB HBM3 (`flashlab bench --backward`, batch 4, heads 16, seqlen
// 4096, head dim 128, bf16): 52.2 ms, 26.3 TFLOP/s (causal 25.7), 129 MiB of workspace;
// ~0.09x PyTorch SDPA's FA2 tensor-core backward. ncu: the main kernel is 99.7 % of the
// time, FMA pipe 42.6 % busy, 1.61 G L2 reduction sectors of dQ atomics.
// docs/ladder/05-fa2-simt-bwd.md.
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
#include "cuda/ladder/simt_common.cuh"

namespace flashlab::cuda {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "rung 5: FlashAttention-2 backward on CUDA cores: D = rowsum(dO∘O), key-block-parallel main "
    "loop recomputing P from LSE, dQ through fp32 atomics, dK/dV written once; fp32/fp16/bf16, "
    "head dims <= 128, every mask, GQA, varlen; backward only";

using namespace simt;  // float4 helpers, loads and stores shared with rungs 2 and 3

// ---- compile-time shape ------------------------------------------------------------------
constexpr int kBlockM = 64;        // query rows per step of the main loop
constexpr int kBlockN = 64;        // keys per thread block
constexpr int kPerThread = 4;      // rows (or keys) per thread in every layout above
constexpr int kGroupLanes = 16;    // threads of a group g (consecutive lanes)
constexpr int kThreads = kBlockM / kPerThread * kGroupLanes;  // 256
constexpr int kWarpRows = 32 / kGroupLanes * kPerThread;      // 8 rows of S per warp
constexpr int kSlabChannels = 4 * kGroupLanes;                // 64 channels per slab
static_assert(kBlockN == kPerThread * kGroupLanes && kThreads == 256, "the layout above");

// The row kernels (dot_do_o, dq_convert): one warp per (row, head).
constexpr int kRowWarps = 8;
constexpr int kRowThreads = 32 * kRowWarps;

// kHeadDim is max(head_dim, head_dim_v) rounded up to 64 or 128 (zero-padded). Shared
// memory: K, V [kBlockN][kHeadDim], Q, dO [kBlockM][kHeadDim], P, dS [kBlockM][kBlockN],
// LSE and D [kBlockM], fp32: 96.5 KB at D = 64 (two blocks per H100 SM), 160.5 KB at
// D = 128 (one). D = 256 would need 288.5 KB.
constexpr int smem_bytes(int head_dim) {
  return int(sizeof(float)) *
         (2 * kBlockN * head_dim + 2 * kBlockM * head_dim + 2 * kBlockM * kBlockN + 2 * kBlockM);
}
constexpr int min_blocks_per_sm(int head_dim) { return head_dim == 64 ? 2 : 1; }

int head_dim_bucket(const BwdParams& p) {
  const int d = std::max(p.head_dim, p.head_dim_v);
  return d <= 64 ? 64 : d <= 128 ? 128 : 0;
}

// The workspace, fp32.
struct Workspace {
  float* dq;    // [heads_q, total_q, head_dim] the dQ accumulator (atomicAdd target)
  float* dsum;  // [heads_q, total_q] D_i = rowsum(dO ∘ O)
};

// Workspace row of query row i of (batch b, head h): the packed row b·seqlen_q + i (or
// cu_seqlens_q[b] + i) of head h.
__device__ __forceinline__ int64_t ws_row(const BwdParams& p, const SeqInfo& seq, int b, int h,
                                          int i) {
  return int64_t(h) * p.total_q + (p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q) + i;
}

// ---- shared-memory tiles -----------------------------------------------------------------
// Tiles are row-major fp32 [rows][cols] without padding. Element (row, col) lives at column
// col ^ swizzle(row): the XOR moves whole 4-float slots (bits 2-4 of the index) inside their
// 32-float span, so that the rows one warp reads at the same column fall into different
// banks. Two patterns, by how a tile is read at the same column:
//   kRowPairs  Q, dO, P, dS: the two groups of warp w read rows 8w + r and 8w + 4 + r; bit
//              2 of the row flips bit 4 of the column: 16 banks apart.
//   kRowsOf8   K, V: the 16 lanes of a group read keys t + 16c; rows r % 8 = 0..7 land in
//              8 different 4-bank slots (one wavefront per 8 lanes).
// Reads of a whole row (16 lanes × float4) stay conflict-free under either: the XOR only
// permutes the row's slots.
enum class Swizzle { kRowPairs, kRowsOf8 };

template <Swizzle kSwizzle>
__device__ __forceinline__ int swizzle(int row) {
  if constexpr (kSwizzle == Swizzle::kRowPairs) return (row & 4) << 2;
  else return (row & 7) << 2;
}

// acc + a · b (dot product of four).
__device__ __forceinline__ float dot4(float acc, const float4& a, const float4& b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// simt_common.cuh's load_tile into a [kRows][kCols] tile swizzled by kSwizzle.
template <class T, int kRows, int kCols, Swizzle kSwizzle>
__device__ __forceinline__ void load_tile(float* tile, const T* src, int64_t row_stride,
                                          int rows_valid, int cols_valid, int thread) {
  simt::load_tile<T, kRows, kCols, kThreads>(tile, src, row_stride, rows_valid, cols_valid,
                                             thread, [](int r) { return swizzle<kSwizzle>(r); });
}

// s[r][c] = A[row0 + r] · B[t + 16c] over kHeadDim channels, for A = Q, B = K (S) or
// A = dO, B = V (dP). The thread's 4 A rows share one swizzle value, and so do its 4 B rows.
template <int kHeadDim>
__device__ __forceinline__ void tile_dots(const float* a_tile, const float* b_tile, int row0, int t,
                                          float (&s)[kPerThread][kPerThread]) {
  const float* a = a_tile + row0 * kHeadDim;
  const float* bt = b_tile + t * kHeadDim;
  const int a_swz = swizzle<Swizzle::kRowPairs>(row0);
  const int b_swz = swizzle<Swizzle::kRowsOf8>(t);
#pragma unroll
  for (int r = 0; r < kPerThread; ++r)
#pragma unroll
    for (int c = 0; c < kPerThread; ++c) s[r][c] = 0.f;
#pragma unroll 1
  for (int d = 0; d < kHeadDim; d += 4) {
    float4 av[kPerThread], bv[kPerThread];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) av[r] = load_float4(a + r * kHeadDim + (d ^ a_swz));
#pragma unroll
    for (int c = 0; c < kPerThread; ++c)
      bv[c] = load_float4(bt + c * kGroupLanes * kHeadDim + (d ^ b_swz));
#pragma unroll
    for (int r = 0; r < kPerThread; ++r)
#pragma unroll
      for (int c = 0; c < kPerThread; ++c) s[r][c] = dot4(s[r][c], av[r], bv[c]);
  }
}

// ---- kernel 1: D = rowsum(dO ∘ O), dQ accumulator = 0 ---------------------------------------
// grid (ceil(seqlen_q / 8), heads_q, batch), 256 threads: warp w takes row 8·blockIdx.x + w.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    dot_do_o_kernel(const __grid_constant__ BwdParams p, const Workspace ws) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowWarps + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(p, b);
  if (i >= seq.len_q) return;  // warp-uniform; this kernel has no block barrier
  const int64_t row = seq.start_q + i;
  const T* o = static_cast<const T*>(p.out) + b * p.o_batch_stride + row * p.o_row_stride +
               h * p.o_head_stride;
  const T* dout = static_cast<const T*>(p.dout) + b * p.do_batch_stride + row * p.do_row_stride +
                  h * p.do_head_stride;
  float acc = 0.f;
  for (int d = lane; d < p.head_dim_v; d += 32) acc = fmaf(to_float(dout[d]), to_float(o[d]), acc);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFullMask, acc, off);
  const int64_t r = ws_row(p, seq, b, h, i);
  if (lane == 0) ws.dsum[r] = acc;
  for (int d = lane; d < p.head_dim; d += 32) ws.dq[r * p.head_dim + d] = 0.f;
}

// ---- kernel 2: the main loop over (key block; query heads of the group × query blocks) ----
// grid (ceil(seqlen_k / 64), heads_kv, batch), 256 threads, smem_bytes(kHeadDim) dynamic.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm(kHeadDim))
    fa2_simt_bwd_kernel(const __grid_constant__ BwdParams p, const Workspace ws) {
  constexpr int kSlabs = kHeadDim / kSlabChannels;
  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kBlockN;
  const SeqInfo seq = seq_info(p, b);
  const int len_q = seq.len_q, len_k = seq.len_k;
  if (j0 >= len_k) return;  // varlen: this sequence has fewer keys than the grid
  const int keys_valid = min(kBlockN, len_k - j0);
  const MaskPolicy mask = p.mask;

  extern __shared__ __align__(16) float smem[];
  float* k_tile = smem;                            // [kBlockN][kHeadDim]  kRowsOf8
  float* v_tile = k_tile + kBlockN * kHeadDim;     // [kBlockN][kHeadDim]  kRowsOf8
  float* q_tile = v_tile + kBlockN * kHeadDim;     // [kBlockM][kHeadDim]  kRowPairs
  float* do_tile = q_tile + kBlockM * kHeadDim;    // [kBlockM][kHeadDim]  kRowPairs
  float* p_tile = do_tile + kBlockM * kHeadDim;    // [kBlockM][kBlockN]   kRowPairs
  float* ds_tile = p_tile + kBlockM * kBlockN;     // [kBlockM][kBlockN]   kRowPairs
  float* lse_tile = ds_tile + kBlockM * kBlockN;   // [kBlockM] LSE (nats); +∞: the row adds nothing
  float* dsum_tile = lse_tile + kBlockM;           // [kBlockM] D

  const int tid = threadIdx.x, warp = tid / 32;
  const int quad0 = tid / kGroupLanes * kPerThread;  // rows of S and dQ, keys of dK and dV
  const int t = tid % kGroupLanes;                   // keys t + 16c of S; channels 64s + 4t + e

  // K and V of this block once; rows past len_k are zeros (finite scores, and no garbage
  // meets a zero of P). The first step's barriers publish them.
  load_tile<T, kBlockN, kHeadDim, Swizzle::kRowsOf8>(
      k_tile,
      static_cast<const T*>(p.k) + b * p.k_batch_stride + (seq.start_k + j0) * p.k_row_stride +
          hk * p.k_head_stride,
      p.k_row_stride, keys_valid, p.head_dim, tid);
  load_tile<T, kBlockN, kHeadDim, Swizzle::kRowsOf8>(
      v_tile,
      static_cast<const T*>(p.v) + b * p.v_batch_stride + (seq.start_k + j0) * p.v_row_stride +
          hk * p.v_head_stride,
      p.v_row_stride, keys_valid, p.head_dim_v, tid);

  float4 dk[kPerThread][kSlabs], dv[kPerThread][kSlabs];  // keys quad0 + c, channels 64s + 4t..
#pragma unroll
  for (int c = 0; c < kPerThread; ++c)
#pragma unroll
    for (int s = 0; s < kSlabs; ++s) {
      dk[c][s] = make_float4(0.f, 0.f, 0.f, 0.f);
      dv[c][s] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const int64_t ws_row0 = ws_row(p, seq, b, h, 0);
    const T* q_seq = static_cast<const T*>(p.q) + b * p.q_batch_stride +
                     seq.start_q * p.q_row_stride + h * p.q_head_stride;
    const T* do_seq = static_cast<const T*>(p.dout) + b * p.do_batch_stride +
                      seq.start_q * p.do_row_stride + h * p.do_head_stride;
    const float* lse_seq = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + seq.start_q;

    for (int i0 = 0; i0 < len_q; i0 += kBlockM) {
      const int rows_valid = min(kBlockM, len_q - i0);
      // Query blocks none of whose rows sees these keys are skipped (block-uniform).
      if (mask.block_key_end(i0, i0 + rows_valid, len_q, len_k) <= j0 ||
          mask.block_key_begin(i0, i0 + rows_valid, len_q, len_k) >= j0 + keys_valid)
        continue;

      __syncthreads();  // the previous step is done with Q, dO, P, dS, LSE and D
      load_tile<T, kBlockM, kHeadDim, Swizzle::kRowPairs>(
          q_tile, q_seq + i0 * p.q_row_stride, p.q_row_stride, rows_valid, p.head_dim, tid);
      load_tile<T, kBlockM, kHeadDim, Swizzle::kRowPairs>(
          do_tile, do_seq + i0 * p.do_row_stride, p.do_row_stride, rows_valid, p.head_dim_v, tid);
      if (tid < kBlockM) {
        // Rows past len_q, and rows that saw no key in the forward (LSE = −∞), get +∞:
        // P = 2^(logit − ∞) = 0, so they add nothing.
        const bool row_ok = tid < rows_valid;
        const float lse = row_ok ? lse_seq[i0 + tid] : -INFINITY;
        lse_tile[tid] = lse == -INFINITY ? INFINITY : lse;
        dsum_tile[tid] = row_ok ? ws.dsum[ws_row0 + i0 + tid] : 0.f;
      }
      __syncthreads();

      // S = Q Kᵀ (rows quad0 + r, keys t + 16c), then P, stored, and P·dlogit·scale, kept
      // for dS (so that S is dead before dP needs registers).
      float s[kPerThread][kPerThread];
      tile_dots<kHeadDim>(q_tile, k_tile, quad0, t, s);
      // Per-element mask only where the tile is cut for this warp's rows (warp-uniform).
      // Rows past len_q need none: their P is 0 through their LSE.
      const int wi0 = i0 + warp * kWarpRows, wi1 = min(wi0 + kWarpRows, len_q);
      const bool full = j0 + kBlockN <= len_k &&
                        (wi0 >= wi1 || mask.tile_is_full(wi0, wi1, j0, j0 + kBlockN, len_q, len_k));
      const int ps_swz = swizzle<Swizzle::kRowPairs>(quad0);
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        const int i = i0 + quad0 + r;
        const float lse_row = lse_tile[quad0 + r];
        // Allowed keys of row i, relative to this thread's first key j0 + t: key t + 16c
        // is allowed when lo <= 16c < hi.
        const int lo = full ? 0 : mask.key_begin(i, len_q, len_k) - j0 - t;
        const int hi = full ? kBlockN : mask.key_end(i, len_q, len_k) - j0 - t;
#pragma unroll
        for (int c = 0; c < kPerThread; ++c) {
          // P = e^(x·mul − lse) with x·mul the logit in nats, as the LSE is stored: one
          // fma and no log2 conversion keep rounding out of the cancellation against the
          // LSE (a peaked softmax amplifies it into dS). d logit / d(scaled score) comes
          // from the softcap.
          float x = s[r][c], mul = p.scale, dlogit = 1.f;
          if (mask.softcap > 0.f) {
            x = mask.logit(s[r][c] * p.scale);
            mul = 1.f;
            dlogit = mask.dlogit(x);
          }
          const bool allowed = c * kGroupLanes >= lo && c * kGroupLanes < hi;
          const float pij = allowed ? expf(fmaf(x, mul, -lse_row)) : 0.f;
          p_tile[(quad0 + r) * kBlockN + ((t + c * kGroupLanes) ^ ps_swz)] = pij;
          s[r][c] = pij * dlogit * p.scale;  // 0 where P is 0
        }
      }
      // dP = dO Vᵀ, then dS = P ∘ (dP − D) ∘ dlogit · scale.
      float dp[kPerThread][kPerThread];
      tile_dots<kHeadDim>(do_tile, v_tile, quad0, t, dp);
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        const float dsum = dsum_tile[quad0 + r];
#pragma unroll
        for (int c = 0; c < kPerThread; ++c)
          ds_tile[(quad0 + r) * kBlockN + ((t + c * kGroupLanes) ^ ps_swz)] = s[r][c] * (dp[r][c] - dsum);
      }
      __syncthreads();  // P and dS are complete

      // dV += Pᵀ dO and dK += dSᵀ Q (keys quad0 + c, channels 64s + 4t + e): a sum over the
      // 64 rows i of outer products P[i][keys] ⊗ dO[i][channels]. Row i's swizzle depends
      // on i % 8 only, a constant in the unrolled inner loop.
#pragma unroll 1
      for (int i8 = 0; i8 < kBlockM; i8 += 8) {
#pragma unroll
        for (int ii = 0; ii < 8; ++ii) {
          const int i = i8 + ii, swz = swizzle<Swizzle::kRowPairs>(ii);
          const float4 pc = load_float4(p_tile + i * kBlockN + (quad0 ^ swz));
          const float4 dsc = load_float4(ds_tile + i * kBlockN + (quad0 ^ swz));
#pragma unroll
          for (int sl = 0; sl < kSlabs; ++sl) {
            const int ch = (sl * kSlabChannels + 4 * t) ^ swz;
            const float4 dov = load_float4(do_tile + i * kHeadDim + ch);
            const float4 qv = load_float4(q_tile + i * kHeadDim + ch);
#pragma unroll
            for (int c = 0; c < kPerThread; ++c) {
              axpy4(dv[c][sl], comp(pc, c), dov);
              axpy4(dk[c][sl], comp(dsc, c), qv);
            }
          }
        }
      }

      // dQ += dS K (rows quad0 + r, channels 64s + 4t + e): a sum over the 64 keys j of
      // outer products dS[rows][j] ⊗ K[j][channels], dS read 4 keys at a time.
      float4 dq[kPerThread][kSlabs];
#pragma unroll
      for (int r = 0; r < kPerThread; ++r)
#pragma unroll
        for (int sl = 0; sl < kSlabs; ++sl) dq[r][sl] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
      for (int j8 = 0; j8 < kBlockN; j8 += 8) {
#pragma unroll
        for (int jj = 0; jj < 8; jj += 4) {
          float4 dsr[kPerThread];
#pragma unroll
          for (int r = 0; r < kPerThread; ++r)
            dsr[r] = load_float4(ds_tile + (quad0 + r) * kBlockN + ((j8 + jj) ^ ps_swz));
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const int j = j8 + jj + kk, swz = swizzle<Swizzle::kRowsOf8>(jj + kk);
#pragma unroll
            for (int sl = 0; sl < kSlabs; ++sl) {
              const float4 kv = load_float4(k_tile + j * kHeadDim + ((sl * kSlabChannels + 4 * t) ^ swz));
#pragma unroll
              for (int r = 0; r < kPerThread; ++r) axpy4(dq[r][sl], comp(dsr[r], kk), kv);
            }
          }
        }
      }
      // Other key blocks add to the same rows: fp32 atomics (RED.ADD) into the accumulator.
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) {
        const int i = i0 + quad0 + r;
        if (i >= len_q) continue;
        float* dq_row = ws.dq + (ws_row0 + i) * p.head_dim;
#pragma unroll
        for (int sl = 0; sl < kSlabs; ++sl)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int ch = sl * kSlabChannels + 4 * t + e;
            if (ch < p.head_dim) atomicAdd(dq_row + ch, comp(dq[r][sl], e));
          }
      }
    }
  }

  // dK and dV once, in the output dtype; keys no row sees get 0.
  T* dk_dst = static_cast<T*>(p.dk) + b * p.dk_batch_stride + (seq.start_k + j0) * p.dk_row_stride +
              hk * p.dk_head_stride;
  T* dv_dst = static_cast<T*>(p.dv) + b * p.dv_batch_stride + (seq.start_k + j0) * p.dv_row_stride +
              hk * p.dv_head_stride;
#pragma unroll
  for (int c = 0; c < kPerThread; ++c) {
    const int key = quad0 + c;
    if (key >= keys_valid) continue;
#pragma unroll
    for (int sl = 0; sl < kSlabs; ++sl) {
      const int ch = sl * kSlabChannels + 4 * t;
      if (ch < p.head_dim) store4(dk_dst + key * p.dk_row_stride + ch, dk[c][sl], p.head_dim - ch);
      if (ch < p.head_dim_v) store4(dv_dst + key * p.dv_row_stride + ch, dv[c][sl], p.head_dim_v - ch);
    }
  }
}

// ---- kernel 3: dQ accumulator → p.dtype -----------------------------------------------------
// grid (ceil(seqlen_q / 8), heads_q, batch), 256 threads: warp w takes row 8·blockIdx.x + w.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    dq_convert_kernel(const __grid_constant__ BwdParams p, const Workspace ws) {
  // The same warp-per-row start as dot_do_o_kernel: two short kernels, each read alone.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kRowWarps + warp, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(p, b);
  if (i >= seq.len_q) return;
  const float* src = ws.dq + ws_row(p, seq, b, h, i) * p.head_dim;
  T* dst = static_cast<T*>(p.dq) + b * p.dq_batch_stride + (seq.start_q + i) * p.dq_row_stride +
           h * p.dq_head_stride;
  for (int d = lane; d < p.head_dim; d += 32) dst[d] = from_float<T>(src[d]);
}

// ---- launch ------------------------------------------------------------------------------
constexpr size_t kWorkspaceAlign = 256;  // each workspace array starts on its own 256 bytes

size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
size_t dq_bytes(const BwdParams& p) {
  return align_up(size_t(p.heads_q) * size_t(p.total_q) * size_t(p.head_dim) * sizeof(float));
}
size_t dsum_bytes(const BwdParams& p) {
  return align_up(size_t(p.heads_q) * size_t(p.total_q) * sizeof(float));
}

// O(seqlen): heads_q · total_q · (head_dim + 1) floats (plus alignment).
size_t workspace(const BwdParams& p) { return dq_bytes(p) + dsum_bytes(p); }

template <class T, int kHeadDim>
Status launch(const BwdParams& p, const Workspace& ws) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const dim3 row_grid((p.seqlen_q + kRowWarps - 1) / kRowWarps, p.heads_q, p.batch);
  if (p.seqlen_q > 0) {
    dot_do_o_kernel<T><<<row_grid, kRowThreads, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  if (p.seqlen_k > 0) {
    const auto kernel = fa2_simt_bwd_kernel<T, kHeadDim>;
    constexpr int kSmem = smem_bytes(kHeadDim);
    FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    // Tiles go global → registers → shared; nothing is re-read through L1.
    FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    const dim3 grid((p.seqlen_k + kBlockN - 1) / kBlockN, p.heads_kv, p.batch);
    kernel<<<grid, kThreads, kSmem, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  if (p.seqlen_q > 0) {
    dq_convert_kernel<T><<<row_grid, kRowThreads, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  return {};
}

// Calls f.template operator()<T, kHeadDim>() for p's dtype and head-dim bucket (both
// already checked by supports()).
template <class F>
Status dispatch(const BwdParams& p, F&& f) {
  return dispatch_dtype(p.dtype, [&]<class T>() -> Status {
    return head_dim_bucket(p) == 64 ? f.template operator()<T, 64>() : f.template operator()<T, 128>();
  });
}

std::string supports(const BwdParams& p) {
  FL_REFUSE_IF(refuse_placement(p, Inputs::kFloat));
  if (p.deterministic) return "dQ uses fp32 atomics; deterministic mode is not supported by this rung";
  const int bucket = head_dim_bucket(p);
  if (bucket == 0)
    return "head_dim and head_dim_v must be <= 128 (run as 64 or 128 with zero padding; 256 "
           "would need " + std::to_string(smem_bytes(256)) + " bytes of shared memory), got " +
           std::to_string(p.head_dim) + " and " + std::to_string(p.head_dim_v);
  FL_REFUSE_IF(refuse_grid_heads_batch(p));
  const void* kernel = nullptr;
  dispatch(p, [&]<class T, int kHeadDim>() -> Status {
    kernel = reinterpret_cast<const void*>(&fa2_simt_bwd_kernel<T, kHeadDim>);
    return {};
  });
  return device_supports(p.device_index, smem_bytes(bucket), kernel);
}

Status run(const BwdParams& p) {
  if (reinterpret_cast<uintptr_t>(p.workspace) % sizeof(float) != 0)
    return {StatusCode::kInvalidArgument,
            "fa2_simt_bwd needs a 4-byte aligned workspace (fp32 accumulators and atomics)"};
  DeviceGuard guard(p.device_index);
  char* base = static_cast<char*>(p.workspace);
  const Workspace ws{reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + dq_bytes(p))};
  return dispatch(p, [&]<class T, int kHeadDim>() { return launch<T, kHeadDim>(p, ws); });
}

}  // namespace

// auto's GPU backward where cute_fa2 does not take the call (priority below its 40)
KernelEntry fa2_simt_bwd_entry() {
  return {.info = {"fa2_simt_bwd", "sm80+", kSummary},
          .auto_priority = 20, .supports_bwd = supports, .workspace_bwd = workspace,
          .run_bwd = run};
}

}  // namespace flashlab::cuda
