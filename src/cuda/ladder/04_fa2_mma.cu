// Rung 4 — fa2_mma: FlashAttention-2's forward on tensor cores, written by hand in PTX.
//
// The algorithm is rung 3's (fa2_simt): a thread block owns 128 query rows, walks over
// the K/V tiles its rows can see, keeps O, the running max m and the running sum ℓ on
// chip, rescales O only when the max moves, normalizes once and writes O and LSE once.
// Softmax runs in log2 units (exp2 of logits scaled by scale·log2 e); tiles that the mask
// hides entirely are never visited, and only tiles the mask cuts are masked per element.
//
// What changes is who does the multiplications and how the operands get there:
//   - mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate): one warp instruction does a
//     16×8×16 product that costs 2048 FMAs on CUDA cores. Each warp owns 16 query rows,
//     exactly the M of one MMA, so S = Q Kᵀ, the softmax and O += P V stay inside a warp.
//   - ldmatrix loads the MMA operand fragments from shared memory, four 8×8 matrices per
//     instruction (.trans for V, whose fragment wants keys along k).
//   - cp.async copies K/V straight from global to shared memory without passing through
//     registers, into two stages: tile t+1 is in flight while tile t is computed.
//   - shared-memory rows are XOR-swizzled (16-byte chunk ^ row % 8), so both the cp.async
//     writes and the ldmatrix reads hit 32 different banks.
//   - P never leaves registers: the fp32 accumulator fragment of S = Q Kᵀ, rounded to
//     fp16/bf16 pairs, is already the A fragment of P V.
// The PTX wrappers are in mma_ptx.cuh. On the tiles the mask cuts, a masked key's NaN or
// Inf V reaches rows through 0 · NaN in the MMA: cuda/nonfinite.cuh says how those rows are
// found and summed again after the loop.
//
// Why: rung 3 spends its time in CUDA-core FMAs and shared-memory loads of scalars; an
// H100 has ~15x more fp16/bf16 throughput in its tensor cores, and mma.sync reaches it as
// long as the fragments arrive fast enough (ldmatrix, no bank conflicts) and global loads
// overlap the math (cp.async double buffering).
//
// Measured on H100 80GB HBM3 (`flashlab bench --ladder`, batch 4, heads 16, seqlen 4096,
// head dim 128, bf16):
// 1.77 ms, 310 TFLOP/s (causal 279 TFLOP/s, 1.80x faster per call), 9.35x fa2_simt; head
// dim 64: 273 TFLOP/s. ncu: HMMA pipe 48.8 % busy, 12.5 % of warps active, ~1.4 k smem
// bank conflicts (fa2_simt: ~295 k). docs/ladder/04-fa2-mma.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/ladder/mma_ptx.cuh"
#include "cuda/nonfinite.cuh"
#include "cuda/refusals.h"
#include "common/constants.h"
#include "common/registry.h"

namespace flashlab::cuda {
namespace {

using namespace mma_ptx;  // cuda/ladder/mma_ptx.cuh

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "rung 4: FlashAttention-2 forward on tensor cores by hand: mma.sync m16n8k16, ldmatrix, "
    "cp.async double-buffered K/V, swizzled smem, P in registers; fp16/bf16, head dim 64/128, "
    "every mask, GQA, varlen; forward only";

constexpr unsigned kFullMask = 0xffffffffu;

// ---- compile-time shape of the kernel ------------------------------------------------------
template <class T, int kHeadDim_>
struct Traits {
  static_assert(sizeof(T) == 2, "mma.sync m16n8k16 takes 16-bit inputs");
  using Elem = T;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;  // query rows per CTA
  static constexpr int kBlockN = 64;   // keys per K/V tile
  static constexpr int kWarps = 8;     // each owns 16 query rows: one MMA's M
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = kBlockM / kWarps;
  // Registers per thread: O (D/2 floats) + S (kBlockN/2 floats) + Q's A fragments (D/4
  // words) + operand fragments in flight + addresses. At D = 128 that is ~220: one CTA of
  // 8 warps per SM, Q held in registers for the whole loop. At D = 64, re-reading Q's
  // fragments from smem at each k-step (4 more ldmatrix per tile, against 32 for K and V)
  // brings it under 128, so two CTAs share an SM and hide each other's barriers.
  static constexpr bool kQInRegisters = kHeadDim > 64;
  static constexpr int kMinBlocksPerSm = kQInRegisters ? 1 : 2;

  static constexpr int kRowBytes = kHeadDim * int(sizeof(T));  // one row of a smem tile
  static constexpr int kChunksPerRow = kRowBytes / 16;          // 16-byte chunks per row
  static constexpr int kStages = 2;                             // K/V double buffer
  static constexpr int kQBytes = kBlockM * kRowBytes;           // Q tile, later O staging
  static constexpr int kKVTileBytes = kBlockN * kRowBytes;      // one K or V tile
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVTileBytes;

  static constexpr int kQkSteps = kHeadDim / 16;  // k-steps of S = Q Kᵀ (16 channels each)
  static constexpr int kSTiles = kBlockN / 8;     // n-tiles of S (8 keys each)
  static constexpr int kPvSteps = kBlockN / 16;   // k-steps of O += P V (16 keys each)
  static constexpr int kOTiles = kHeadDim / 8;    // n-tiles of O (8 channels each)

  static_assert(kWarpRows == 16, "one m16n8k16 M tile per warp");
  static_assert(kRowBytes % 128 == 0, "the swizzle permutes 8 chunks inside 128-byte lines");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "tiles are whole 16x16 blocks");
};

// ---- shared-memory layout ----------------------------------------------------------------
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRowBytes-long rows.
// The chunk index is XOR-ed with row % 8 (inside its 128-byte line): the 8 rows that one
// ldmatrix phase reads at the same logical chunk, and the 8 consecutive chunks of a row
// that one cp.async phase writes, fall into 8 different 16-byte bank groups.
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return uint32_t(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// The 16×16 block at (row0, chunk0) of a swizzled tile as four 8×8 matrices, in one of the
// two orders the fragments want (registers 0..3 of every lane):
//   kRowHalvesFirst: (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
//                    (rows 8-15, cols 8-15)  — an A fragment; with .trans, the B fragments
//                    of two n-tiles of a [k][n] tile (V)
//   kColHalvesFirst: (rows 0-7, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 0-7),
//                    (rows 8-15, cols 8-15)  — the B fragments of two n-tiles of an [n][k]
//                    tile (K), each b0, b1 pair in adjacent registers as mma wants them
enum class Order { kRowHalvesFirst, kColHalvesFirst };

template <int kRowBytes, Order kOrder, bool kTrans>
__device__ __forceinline__ void load_16x16(uint32_t tile, int row0, int chunk0, int lane,
                                           uint32_t (&r)[4]) {
  // Lane l addresses row l % 8 of matrix l / 8.
  const int matrix = lane >> 3;
  const int row_half = kOrder == Order::kRowHalvesFirst ? (matrix & 1) : (matrix >> 1);
  const int col_half = kOrder == Order::kRowHalvesFirst ? (matrix >> 1) : (matrix & 1);
  ldmatrix_x4<kTrans>(
      tile + swizzle<kRowBytes>(row0 + 8 * row_half + (lane & 7), chunk0 + col_half), r);
}

// Starts copying rows [row0, row0 + kRows) of a global tile (row r at gmem + r·row_stride,
// head_dim contiguous elements) into the same rows of a swizzled smem tile; kLoaders
// threads share the work, 16 bytes each at a time, a loader always the same chunk column.
// With kGuard, rows at or past rows_valid are zero-filled and read nothing (their source
// address is row 0, which always exists); without it every row must exist.
template <class T, int kRowBytes, int kRows, int kLoaders, bool kGuard>
__device__ __forceinline__ void load_rows(uint32_t tile, const T* gmem, int64_t row_stride,
                                          int row0, int rows_valid, int loader) {
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kElemsPerChunk = 16 / int(sizeof(T));
  constexpr int kRowStep = kLoaders / kChunksPerRow;  // rows between a loader's chunks
  static_assert(kLoaders % kChunksPerRow == 0 && kRows % kRowStep == 0,
                "every loader copies whole columns of chunks");
  const int chunk = loader % kChunksPerRow;
  const int r_first = row0 + loader / kChunksPerRow;
  const T* col = gmem + chunk * kElemsPerChunk;  // this loader's chunk column at row 0
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const int r = r_first + i * kRowStep;
    const bool valid = !kGuard || r < rows_valid;
    cp_async_16(tile + swizzle<kRowBytes>(r, chunk), col + (valid ? r * row_stride : 0), valid);
  }
}

// One thread's share of copying a whole tile (every row exists) with kLoaders threads:
// 16-byte chunk column c of rows r + i·kRowStep, for the thread's fixed (r, c). `dst` and
// `src` address chunk (r, c); the other rows follow at constant offsets, because kRowStep
// is a multiple of 8 and the swizzle repeats every 8 rows.
template <class T, int kRowBytes, int kRows, int kLoaders>
__device__ __forceinline__ void copy_whole_tile(uint32_t dst, const T* src, int64_t row_stride) {
  constexpr int kRowStep = kLoaders / (kRowBytes / 16);
  static_assert(kRowStep % 8 == 0 && kRows % kRowStep == 0, "rows repeat the swizzle");
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i)
    cp_async_16(dst + i * kRowStep * kRowBytes, src + i * kRowStep * row_stride, true);
}

// ---- the kernel --------------------------------------------------------------------------
// Which rows a CTA owns: batch entry b, query head h, rows [i0, i0 + rows) of the sequence.
struct RowBlock {
  int b, h, i0, rows;
  SeqInfo seq;
};

// Row blocks run in reverse: under a causal mask the last ones see the most keys, and
// starting the longest blocks first shortens the tail of the grid.
template <int kBlockM>
__device__ __forceinline__ RowBlock row_block(const FwdParams& p) {
  RowBlock rb;
  rb.b = blockIdx.z;
  rb.h = blockIdx.y;
  rb.i0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBlockM;
  rb.seq = seq_info(p, rb.b);
  rb.rows = min(kBlockM, rb.seq.len_q - rb.i0);  // <= 0: varlen, the sequence is shorter
  return rb;
}

// Epilogue of one warp: finish ℓ over the quad, normalize O once, write
// LSE = (m + log2 ℓ)·ln 2 and O. O goes out through the warp's own 16 Q rows of smem
// (only this warp ever read them), so that each global store writes 16 contiguous bytes
// of a row. The block's place is recomputed here (row_block, %laneid) rather than carried
// through the main loop in registers: at D = 64 that would cost spills.
template <class Tr>
__device__ __forceinline__ void store_output(const FwdParams& p, float (&o_acc)[Tr::kOTiles][4],
                                             const float (&row_max)[2], const float (&row_sum)[2],
                                             unsigned char* smem) {
  using T = typename Tr::Elem;
  constexpr int kRowBytes = Tr::kRowBytes;
  const RowBlock rb = row_block<Tr::kBlockM>(p);
  const int warp = threadIdx.x / 32, lane = lane_id();
  const int frag_row = lane / 4, frag_col = 2 * (lane % 4);
  const int warp_row0 = warp * Tr::kWarpRows;

  float lse[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = row_sum[hf];
    l += __shfl_xor_sync(kFullMask, l, 1);
    l += __shfl_xor_sync(kFullMask, l, 2);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key: O = 0
    lse[hf] = l > 0.f ? (row_max[hf] + log2f(l)) * kLn2 : -INFINITY;
#pragma unroll
    for (int dt = 0; dt < Tr::kOTiles; ++dt) {
      o_acc[dt][2 * hf] *= inv_l;
      o_acc[dt][2 * hf + 1] *= inv_l;
    }
  }
  if (p.lse && frag_col == 0) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = warp_row0 + frag_row + 8 * hf;
      if (r < rb.rows)
        p.lse[rb.b * p.lse_batch_stride + rb.h * p.lse_head_stride + rb.seq.start_q + rb.i0 + r] =
            lse[hf];
    }
  }

  __syncwarp();  // every lane's last ldmatrix of these Q rows comes before any O store
#pragma unroll
  for (int dt = 0; dt < Tr::kOTiles; ++dt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint32_t off =
          swizzle<kRowBytes>(warp_row0 + frag_row + 8 * hf, dt) + frag_col * int(sizeof(T));
      *reinterpret_cast<uint32_t*>(smem + off) =
          pack2<T>(o_acc[dt][2 * hf], o_acc[dt][2 * hf + 1]);
    }
  __syncwarp();
  T* o_seq = static_cast<T*>(p.out) + rb.b * p.o_batch_stride + rb.seq.start_q * p.o_row_stride +
             rb.h * p.o_head_stride;
  constexpr int kElemsPerChunk = 16 / int(sizeof(T));
#pragma unroll
  for (int i = 0; i < Tr::kWarpRows * Tr::kChunksPerRow / 32; ++i) {
    const int c = lane + 32 * i;
    const int r = warp_row0 + c / Tr::kChunksPerRow, chunk = c % Tr::kChunksPerRow;
    if (r < rb.rows)
      *reinterpret_cast<uint4*>(o_seq + (rb.i0 + r) * p.o_row_stride + chunk * kElemsPerChunk) =
          *reinterpret_cast<const uint4*>(smem + swizzle<kRowBytes>(r, chunk));
  }
}

// The lane's rows with bit hf of a.bad set (frag_row and frag_row + 8 of its warp), summed
// again from global memory over their visible keys only (cuda/nonfinite.cuh); a.o holds its
// columns 8·dt + frag_col + {0, 1} of each, a.m_log2 the rows' final max (log2 units). Out
// of line: the block's place and the tensors' addresses are recomputed here, where the
// compiler cannot merge them with the kernel's own copies and keep those live through the
// main loop.
template <class Tr, int kCols = 2 * Tr::kOTiles>
__device__ __noinline__ RowsAgain<2, kCols> redo_rows(const FwdParams& p, RowsAgain<2, kCols> a) {
  using T = typename Tr::Elem;
  const RowBlock rb = row_block<Tr::kBlockM>(p);
  const int lane = lane_id(), row_a = (threadIdx.x / 32) * Tr::kWarpRows + lane / 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    if (row_a + 8 * hf >= rb.rows) a.bad &= ~(1u << hf);  // past len_q: never stored
    a.row[hf] = rb.i0 + row_a + 8 * hf;
  }
  if (a.bad == 0) return a;
#pragma unroll
  for (int c = 0; c < kCols; ++c) a.col[c] = 8 * (c / 2) + 2 * (lane % 4) + c % 2;
  const int hk = rb.h / p.group;
  const T* q = static_cast<const T*>(p.q) + rb.b * p.q_batch_stride +
               rb.seq.start_q * p.q_row_stride + rb.h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + rb.b * p.k_batch_stride +
               rb.seq.start_k * p.k_row_stride + hk * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + rb.b * p.v_batch_stride +
               rb.seq.start_k * p.v_row_stride + hk * p.v_head_stride;
  return sum_rows_again<T, Tr::kHeadDim>(p, q, k, v, rb.seq.len_q, rb.seq.len_k, 0u, a);
}

// A NaN or Inf in O may be a masked key's V reaching it through 0 · NaN in the MMA: the
// lane's rows whose O values are not all finite go to redo_rows.
template <class Tr>
__device__ __forceinline__ void redo_nonfinite_rows(const FwdParams& p,
                                                    float (&o_acc)[Tr::kOTiles][4],
                                                    const float (&row_max)[2]) {
  constexpr int kCols = 2 * Tr::kOTiles;
  unsigned bad = 0;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    bool finite = true;
#pragma unroll
    for (int dt = 0; dt < Tr::kOTiles; ++dt)
      finite &= isfinite(o_acc[dt][2 * hf]) && isfinite(o_acc[dt][2 * hf + 1]);
    if (!finite) bad |= 1u << hf;
  }
  if (bad == 0) return;
  RowsAgain<2, kCols> a;
  a.bad = bad;
  a.m_log2[0] = row_max[0];
  a.m_log2[1] = row_max[1];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    a.o[0][c] = o_acc[c / 2][c % 2];
    a.o[1][c] = o_acc[c / 2][2 + c % 2];
  }
  a = redo_rows<Tr>(p, a);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    o_acc[c / 2][c % 2] = a.o[0][c];
    o_acc[c / 2][2 + c % 2] = a.o[1][c];
  }
}

// grid (ceil(seqlen_q / 128), heads_q, batch), 256 threads. Warp w owns query rows
// [16w, 16w + 16) of the block; in its fragments lane l holds rows g = l/4 and g + 8.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm)
    fa2_mma_kernel(const __grid_constant__ FwdParams p) {
  using T = typename Tr::Elem;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kRowBytes = Tr::kRowBytes;

  const RowBlock rb = row_block<kBlockM>(p);
  if (rb.rows <= 0) return;  // varlen: this sequence is shorter than the grid
  const int b = rb.b, h = rb.h, hk = h / p.group, i0 = rb.i0, rows_valid = rb.rows;
  const SeqInfo seq = rb.seq;
  const int len_q = seq.len_q, len_k = seq.len_k;
  const MaskPolicy mask = p.mask;

  // Only K/V tiles [n_lo, n_lo + n_blocks) hold keys that some row of the block sees.
  const int key_lo = mask.block_key_begin(i0, i0 + rows_valid, len_q, len_k);
  const int key_hi = mask.block_key_end(i0, i0 + rows_valid, len_q, len_k);
  const int n_lo = key_lo / kBlockN;
  const int n_blocks = key_hi > key_lo ? (key_hi + kBlockN - 1) / kBlockN - n_lo : 0;

  // Each rung addresses its tensors itself (alike in rung 3 on purpose).
  const T* q_tile = static_cast<const T*>(p.q) + b * p.q_batch_stride +
                    (seq.start_q + i0) * p.q_row_stride + h * p.q_head_stride;
  const T* k_seq = static_cast<const T*>(p.k) + b * p.k_batch_stride +
                   seq.start_k * p.k_row_stride + hk * p.k_head_stride;
  const T* v_seq = static_cast<const T*>(p.v) + b * p.v_batch_stride +
                   seq.start_k * p.v_row_stride + hk * p.v_head_stride;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem);                       // [kBlockM][D], later O
  const uint32_t sK = sQ + Tr::kQBytes;                     // [kStages][kBlockN][D]
  const uint32_t sV = sK + Tr::kStages * Tr::kKVTileBytes;  // [kStages][kBlockN][D]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int frag_row = lane / 4;       // fragment rows frag_row and frag_row + 8
  const int frag_col = 2 * (lane % 4);  // fragment columns frag_col and frag_col + 1
  const int warp_row0 = warp * Tr::kWarpRows;

  // Prologue: each warp copies its own 16 Q rows (no CTA barrier needed to read them
  // back), then the first K/V tile goes in flight into stage 0.
  load_rows<T, kRowBytes, Tr::kWarpRows, 32, true>(sQ, q_tile, p.q_row_stride, warp_row0,
                                                   rows_valid, lane);
  cp_async_commit();
  if (n_blocks > 0) {
    // The last tile of keys is the only one that can run past len_k: its missing rows
    // become zeros, so that P·V never meets garbage (0 · NaN would be NaN).
    const int j0 = (n_lo + n_blocks - 1) * kBlockN;
    load_rows<T, kRowBytes, kBlockN, Tr::kThreads, true>(
        sK, k_seq + j0 * p.k_row_stride, p.k_row_stride, 0, len_k - j0, threadIdx.x);
    load_rows<T, kRowBytes, kBlockN, Tr::kThreads, true>(
        sV, v_seq + j0 * p.v_row_stride, p.v_row_stride, 0, len_k - j0, threadIdx.x);
  }
  cp_async_commit();
  cp_async_wait<1>();  // this thread's Q chunks have landed
  __syncwarp();        // ... and the other lanes' are visible

  uint32_t q_frag[Tr::kQkSteps][4];  // A fragments of the warp's 16×D Q rows, per 16 channels
  auto load_q_frag = [&](int ks) {
    load_16x16<kRowBytes, Order::kRowHalvesFirst, false>(sQ, warp_row0, 2 * ks, lane, q_frag[ks]);
  };
  if constexpr (Tr::kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < Tr::kQkSteps; ++ks) load_q_frag(ks);
  }

  float o_acc[Tr::kOTiles][4];  // C fragments of the warp's 16×D output, per 8 channels
#pragma unroll
  for (int dt = 0; dt < Tr::kOTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[dt][e] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // rows frag_row, +8: running max (log2 units)
  float row_sum[2] = {0.f, 0.f};              // ... this lane's part of ℓ (quad-summed at end)

  // This warp's valid rows, for tile_is_full (a warp wholly past len_q writes nothing, so
  // what the test answers for it does not matter).
  const int warp_i0 = i0 + warp_row0, warp_i1 = min(warp_i0 + Tr::kWarpRows, len_q);

  // This thread's share of the later K/V tiles, which are all whole: chunk column
  // kv_chunk of rows kv_row + i·(kThreads / kChunksPerRow) (see copy_whole_tile).
  const int kv_row = threadIdx.x / Tr::kChunksPerRow, kv_chunk = threadIdx.x % Tr::kChunksPerRow;
  const uint32_t kv_dst = swizzle<kRowBytes>(kv_row, kv_chunk);
  const T* k_src = k_seq + kv_row * p.k_row_stride + kv_chunk * (16 / int(sizeof(T)));
  const T* v_src = v_seq + kv_row * p.v_row_stride + kv_chunk * (16 / int(sizeof(T)));

  // Main loop, last tile first: the tiles the diagonal cuts (and the ragged end of the
  // keys) come first, while the running max is still settling.
  for (int t = 0; t < n_blocks; ++t) {
    const int n = n_lo + n_blocks - 1 - t, stage = t & 1;
    cp_async_wait<0>();  // this thread's copies of tile n have landed
    // One barrier per tile: every thread's copies of tile n are visible, and every warp
    // has finished reading stage ^ 1 (tile n + 1), which the next copies overwrite.
    __syncthreads();
    if (t + 1 < n_blocks) {
      const int64_t j0 = int64_t(n - 1) * kBlockN;
      const uint32_t dst = (stage ^ 1) * Tr::kKVTileBytes + kv_dst;
      copy_whole_tile<T, kRowBytes, kBlockN, Tr::kThreads>(sK + dst, k_src + j0 * p.k_row_stride,
                                                            p.k_row_stride);
      copy_whole_tile<T, kRowBytes, kBlockN, Tr::kThreads>(sV + dst, v_src + j0 * p.v_row_stride,
                                                            p.v_row_stride);
      cp_async_commit();
    }
    const uint32_t sKs = sK + stage * Tr::kKVTileBytes;
    const uint32_t sVs = sV + stage * Tr::kKVTileBytes;

    // S = Q Kᵀ. K is stored [key][channel], which is Bᵀ row-major = B "col": ldmatrix
    // without .trans gives B fragments; one x4 covers 16 keys × 16 channels = 2 n-tiles.
    float s_acc[Tr::kSTiles][4];  // C fragments of the warp's 16×kBlockN scores, per 8 keys
#pragma unroll
    for (int nt = 0; nt < Tr::kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < Tr::kQkSteps; ++ks) {
      if constexpr (!Tr::kQInRegisters) load_q_frag(ks);  // see Traits::kQInRegisters
#pragma unroll
      for (int np = 0; np < Tr::kSTiles / 2; ++np) {
        uint32_t k_frag[4];  // b0, b1 of keys 16np + 0..7, then of keys + 8..15
        load_16x16<kRowBytes, Order::kColHalvesFirst, false>(sKs, 16 * np, 2 * ks, lane, k_frag);
        mma_16x8x16<T>(s_acc[2 * np], q_frag[ks], k_frag[0], k_frag[1]);
        mma_16x8x16<T>(s_acc[2 * np + 1], q_frag[ks], k_frag[2], k_frag[3]);
      }
    }

    // Logits in log2 units; the softcap transform works on the scaled score in nats.
    if (mask.softcap > 0.f) {
#pragma unroll
      for (int nt = 0; nt < Tr::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[nt][e] = mask.logit(s_acc[nt][e] * p.scale) * kLog2e;
    } else {
#pragma unroll
      for (int nt = 0; nt < Tr::kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[nt][e] *= p.scale_log2;
    }
    // Per-element mask only where the tile is cut (warp-uniform branch).
    const int j0 = n * kBlockN;
    if (j0 + kBlockN > len_k ||
        !mask.tile_is_full(warp_i0, warp_i1, j0, j0 + kBlockN, len_q, len_k)) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        // Keys row frag_row + 8hf sees, clamped to len_k (so keys past the end of the
        // sequence, zero-filled in smem, are outside too), recomputed per masked tile
        // rather than held through the loop, and shifted to this lane's first column so
        // that each element compares with a constant 8nt + e.
        const int i = warp_i0 + frag_row + 8 * hf, col0 = j0 + frag_col;
        const int lo = mask.key_begin(i, len_q, len_k) - col0;
        const int hi = mask.key_end(i, len_q, len_k) - col0;
#pragma unroll
        for (int nt = 0; nt < Tr::kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (8 * nt + e < lo || 8 * nt + e >= hi) s_acc[nt][2 * hf + e] = -INFINITY;
      }
    }

    // Online softmax. The 4 lanes of a quad hold the same two rows: reduce over them.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float m = row_max[hf];
#pragma unroll
      for (int nt = 0; nt < Tr::kSTiles; ++nt)
        m = fmaxf(m, fmaxf(s_acc[nt][2 * hf], s_acc[nt][2 * hf + 1]));
      m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));
      m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
      // A row that has seen no key yet keeps P = 0 and O = 0 instead of exp2(-inf + inf).
      const float m_ref = m == -INFINITY ? 0.f : m;
      const float rescale = exp2_sfu(row_max[hf] - m_ref);  // 0 on the first visible tile
      row_max[hf] = m;
      row_sum[hf] *= rescale;
#pragma unroll
      for (int dt = 0; dt < Tr::kOTiles; ++dt) {
        o_acc[dt][2 * hf] *= rescale;
        o_acc[dt][2 * hf + 1] *= rescale;
      }
#pragma unroll
      for (int nt = 0; nt < Tr::kSTiles; ++nt) {
        s_acc[nt][2 * hf] = exp2_sfu(s_acc[nt][2 * hf] - m_ref);
        s_acc[nt][2 * hf + 1] = exp2_sfu(s_acc[nt][2 * hf + 1] - m_ref);
        row_sum[hf] += s_acc[nt][2 * hf] + s_acc[nt][2 * hf + 1];
      }
    }

    // O += P V. The C fragments of S-tiles 2kk and 2kk+1 (keys 16kk + 0..7 and + 8..15)
    // are, element for element, the A fragment of k-step kk: P stays in registers.
    // V is stored [key][channel] = B row-major, so ldmatrix .trans gives B fragments.
#pragma unroll
    for (int kk = 0; kk < Tr::kPvSteps; ++kk) {
      const uint32_t p_frag[4] = {  // A fragment of P: 16 rows × keys 16kk..16kk+15
          pack2<T>(s_acc[2 * kk][0], s_acc[2 * kk][1]),
          pack2<T>(s_acc[2 * kk][2], s_acc[2 * kk][3]),
          pack2<T>(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1]),
          pack2<T>(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < Tr::kOTiles / 2; ++dp) {
        uint32_t v_frag[4];  // b0, b1 of channels 16dp + 0..7, then of channels + 8..15
        load_16x16<kRowBytes, Order::kRowHalvesFirst, true>(sVs, 16 * kk, 2 * dp, lane, v_frag);
        mma_16x8x16<T>(o_acc[2 * dp], p_frag, v_frag[0], v_frag[1]);
        mma_16x8x16<T>(o_acc[2 * dp + 1], p_frag, v_frag[2], v_frag[3]);
      }
    }
  }

  redo_nonfinite_rows<Tr>(p, o_acc, row_max);
  store_output<Tr>(p, o_acc, row_max, row_sum, smem);
}

// ---- launch ------------------------------------------------------------------------------
template <class Tr>
Status launch(const FwdParams& p) {
  const auto kernel = fa2_mma_kernel<Tr>;
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Tr::kSmemBytes));
  // Nothing is cached in L1 (cp.async.cg goes through L2 only): give the SM's unified
  // L1/shared storage to shared memory, so that kMinBlocksPerSm CTAs fit.
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  const dim3 grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads_q, p.batch);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, static_cast<cudaStream_t>(p.stream)>>>(p);
  FL_CUDA_CHECK_LAUNCH();
  return {};
}

template <class T>
Status launch_dtype(const FwdParams& p) {
  return p.head_dim == 64 ? launch<Traits<T, 64>>(p) : launch<Traits<T, 128>>(p);
}

int smem_bytes(int head_dim) {
  return head_dim == 64 ? Traits<__half, 64>::kSmemBytes : Traits<__half, 128>::kSmemBytes;
}

// The instantiation run() would launch for p (dtype and head dim already checked).
const void* kernel_for(const FwdParams& p) {
  if (p.dtype == DType::kF16)
    return p.head_dim == 64 ? reinterpret_cast<const void*>(fa2_mma_kernel<Traits<__half, 64>>)
                            : reinterpret_cast<const void*>(fa2_mma_kernel<Traits<__half, 128>>);
  return p.head_dim == 64
             ? reinterpret_cast<const void*>(fa2_mma_kernel<Traits<__nv_bfloat16, 64>>)
             : reinterpret_cast<const void*>(fa2_mma_kernel<Traits<__nv_bfloat16, 128>>);
}

std::string supports(const FwdParams& p) {
  FL_REFUSE_IF(refuse_placement(p, Inputs::kHalf, "the m16n8k16 tensor-core MMA"));
  FL_REFUSE_IF(refuse_unequal_head_dims(p));
  if (p.head_dim != 64 && p.head_dim != 128)
    return "head_dim must be 64 or 128, got " + std::to_string(p.head_dim);
  FL_REFUSE_IF(refuse_grid_heads_batch(p));
  return device_supports(p.device_index, smem_bytes(p.head_dim),
                         reinterpret_cast<const void*>(kernel_for(p)));
}

Status run(const FwdParams& p) {
  DeviceGuard guard(p.device_index);
  return p.dtype == DType::kF16 ? launch_dtype<__half>(p) : launch_dtype<__nv_bfloat16>(p);
}

}  // namespace

// auto's GPU forward where no CuTe kernel takes the call (priority below cute_fa2's 40)
KernelEntry fa2_mma_entry() {
  return {.info = {"fa2_mma", "sm80+", kSummary},
          .auto_priority = 30, .supports_fwd = supports, .run_fwd = run};
}

}  // namespace flashlab::cuda
