// The CuTe FlashAttention-2 backward kernels (sm80 path), in layers:
//   preprocess   D = rowsum(dO ∘ O), LSE in log2 units, the fp32 dQ accumulator zeroed
//   scheduler    which keys a CTA owns and which query blocks see them
//   mainloop     per query block: S = Q Kᵀ → P (recomputed from the LSE), dP = dO Vᵀ,
//                dS = P ∘ (dP − D), dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K (fp32 atomics)
//   epilogue     dK and dV once, through shared memory, in the output dtype
//   postprocess  the dQ accumulator → the output dtype
// Every compile-time choice comes from the traits (bwd_traits.h); the launch is at the end.
//
// The algorithm is FlashAttention-2's (Algorithm 2), the same as rung 5's (fa2_simt_bwd) on
// tensor cores: a CTA owns kBlockN keys of one (batch, KV head) and walks the query blocks
// whose rows see them, for every query head of its GQA group, so dK and dV stay private to
// the CTA (summed over the group in registers) and only dQ, shared between key blocks, goes
// through memory: fp32 atomics into the workspace. In deterministic mode the key blocks add
// into each query block's rows in a fixed order (first key block first), taking turns on a
// counter per (batch, head, query block), so the sums are bitwise reproducible.
//
// Scales: S is scaled into log2 units inside the exp2's FMA against LSE·log2 e, as in the
// forward; dS carries softcap's d logit but not the softmax scale, which dK takes once in
// the epilogue and dQ in the postprocess (one multiply per element of dK and dQ instead of
// one per score): dK = scale · dSᵀ Q, dQ = scale · dS K. Dropout regenerates the forward's
// Philox mask per m16n8 fragment (one call each, common/dropout.h): dV sees P ∘ M / (1 − p),
// dS = P ∘ (dP ∘ M / (1 − p) − D).
//
// What it adds over fa2_simt_bwd: the five products on m16n8k16 tensor cores with ldmatrix
// (transposed for the products that reduce over rows or keys), Q/dO double-buffered so that
// the next block's cp.async loads land during this one's products, key blocks of 128 at head
// dims 64 and 128, head dims to 256, dropout, and the deterministic mode.
// Measured on H100 (bf16, B·S = 16k tokens, hidden 2048, same process, 2026-11-25): 1.00–1.07x
// SDPA's FlashAttention-2 backward (head dim 128, 8k: 320 against 306 TFLOP/s; session 6's
// kernel: 0.80–0.93x), after dQ's reductions were spread over dK's k-steps and held there
// (after()), the MMAs of a k-step ordered m-tile by m-tile (mma_k_step) and S's and dP's
// ldmatrix addresses computed per k-step (gemm_ss_lines). docs/sm80/bwd.md.
#pragma once

#include <cute/tensor.hpp>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cutlass/numeric_conversion.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_instance.h"
#include "cuda/sm80/bwd_traits.h"
#include "cuda/sm80/fwd_kernel.cuh"  // fragment views, round_to, copy_rows, gemm_ss, exp2_approx

namespace flashlab::sm80 {

using namespace cute;

// ---- workspace ---------------------------------------------------------------------------
// Row i of (batch b, head h) is packed row h·total_q + seq_start(b) + i of dsum and lse_log2,
// where seq_start(b) is cu_seqlens_q[b] (varlen) or b·seqlen_q.
//
// dq_accum is not row-major: each (head, batch entry, query block) owns a contiguous chunk of
// kBlockM · D floats in the order the main kernel's threads hold dQ (DqChunk below), so that
// a warp's vector reduction covers 512 contiguous bytes: four cache lines, where a row-major
// accumulator took eight lines for 256 bytes, and the load/store unit that also serves the
// ldmatrix reads spent four times the wavefronts on the adds. A sequence's chunks start at
// padded row seq_start(b) + b · kBlockM, so that its last, ragged block has a whole chunk.
struct BwdWorkspace {
  float* dq_accum;  // [heads_q, total_q + batch·kBlockM, D]  dQ in fp32 in DqChunk order
  float* dsum;      // [heads_q, total_q]     D_i = rowsum(dO ∘ O)
  float* lse_log2;  // [heads_q, total_q]     LSE·log2 e; +inf for rows that saw no key
  int* dq_turn;     // [batch, heads_q, m_blocks]  deterministic only: key blocks done, else null
};

// Byte offsets of the arrays in the caller's workspace, each on its own 256 bytes.
struct BwdWorkspaceLayout {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, dq_turn = 0, total = 0;
};

inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p, int block_m) {
  constexpr size_t kAlign = 256;
  auto aligned = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  const size_t rows = size_t(p.heads_q) * size_t(p.total_q);
  const size_t dq_rows = size_t(p.heads_q) * (size_t(p.total_q) + size_t(p.batch) * block_m);
  const size_t m_blocks = (size_t(p.seqlen_q) + block_m - 1) / block_m;
  BwdWorkspaceLayout l;
  l.dsum = aligned(dq_rows * size_t(p.head_dim) * sizeof(float));
  l.lse_log2 = l.dsum + aligned(rows * sizeof(float));
  l.dq_turn = l.lse_log2 + aligned(rows * sizeof(float));
  l.total = l.dq_turn + (p.deterministic ? aligned(size_t(p.batch) * size_t(p.heads_q) * m_blocks *
                                                   sizeof(int))
                                         : 0);
  return l;
}

__device__ __forceinline__ int64_t bwd_ws_row(const BwdParams& p, const cuda::SeqInfo& seq, int b,
                                              int h) {
  return int64_t(h) * p.total_q + (p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q);
}

// The dQ accumulator chunk of (batch b, head h, the query block starting at row i0): the
// main kernel's thread t holds float4 j of it at chunk + 4 · (j · kNThreads + t), float4 j
// being values 4j … 4j + 3 of its dQ = dS K accumulator (one m16n8 fragment). Rows past a
// ragged block's end fall in the chunk's padding, which only the main kernel adds into.
template <class Tr>
struct DqChunk {
  static constexpr int kFloats = Tr::kBlockM * Tr::kHeadDim;
  static constexpr int kQuadsPerThread = kFloats / (4 * Tr::kNThreads);
  static_assert(kFloats % (4 * Tr::kNThreads) == 0, "every thread holds whole float4s of dQ");
  __device__ __forceinline__ static float4* at(const BwdParams& p, const BwdWorkspace& ws,
                                               const cuda::SeqInfo& seq, int b, int h, int i0) {
    const int64_t rows_per_head = p.total_q + int64_t(p.batch) * Tr::kBlockM;
    const int64_t seq_start = p.varlen ? seq.start_q : int64_t(b) * p.seqlen_q;
    const int64_t row = int64_t(h) * rows_per_head + seq_start + int64_t(b) * Tr::kBlockM + i0;
    return reinterpret_cast<float4*>(ws.dq_accum + row * Tr::kHeadDim);
  }
};

constexpr int kRowKernelThreads = 256;  // preprocess
constexpr int kRowKernelWarps = kRowKernelThreads / 32;

// The preprocess moves 16 bytes per lane: a row of D elements is D/8 chunks of dO and O
// (8 to 32). A row is read by a group of kLanes lanes (the
// chunk count rounded up to a power of two, so that a warp holds 32/kLanes whole rows and
// few lanes idle), and a CTA's kBlockM rows take kPasses passes of its 8 warps. Every CUDA
// tensor's base and strides are multiples of 16 bytes (api.cpp), so the chunks are aligned.
template <class Tr>
struct RowChunks {
  static constexpr int kElems = 16 / int(sizeof(typename Tr::Element));  // elements per chunk
  static constexpr int kChunks = Tr::kHeadDim / kElems;                   // chunks per row
  static constexpr int kLanes = kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kRowsPerPass = kRowKernelWarps * (32 / kLanes);
  static constexpr int kPasses = Tr::kBlockM / kRowsPerPass;
  static_assert(Tr::kHeadDim % kElems == 0 && kChunks <= 32, "a warp covers a row in chunks");
  static_assert(Tr::kBlockM % kRowsPerPass == 0, "the passes cover the block's rows evenly");
  // This thread's row within pass 0, and its chunk of the row (valid when < kChunks).
  __device__ __forceinline__ static int row(int tid) { return tid / kLanes; }
  __device__ __forceinline__ static int chunk(int tid) { return tid % kLanes; }
};

// acc + Σ a[e]·b[e] over the 8 16-bit elements of two chunks.
template <class Element>
__device__ __forceinline__ float dot_chunk(const uint4& a, const uint4& b, float acc) {
  using Pair = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, __half2, __nv_bfloat162>;
  const Pair* x = reinterpret_cast<const Pair*>(&a);
  const Pair* y = reinterpret_cast<const Pair*>(&b);
  CUTE_UNROLL
  for (int i = 0; i < 4; ++i) {
    float2 fx, fy;
    if constexpr (std::is_same_v<Element, cutlass::half_t>) {
      fx = __half22float2(x[i]);
      fy = __half22float2(y[i]);
    } else {
      fx = __bfloat1622float2(x[i]);
      fy = __bfloat1622float2(y[i]);
    }
    acc = fmaf(fx.x, fy.x, fmaf(fx.y, fy.y, acc));
  }
  return acc;
}

// ---- preprocess --------------------------------------------------------------------------
// grid (ceil(seqlen_q / kBlockM), heads_q, batch): one CTA per query block of the main
// kernel, so it also resets that block's deterministic turn counter. A batch of passes has
// all its loads in flight before the first is used; the block's dQ accumulator chunk is
// zeroed (16-byte stores by all threads) while the first batch's loads are in flight.
template <class Tr>
__global__ void __launch_bounds__(kRowKernelThreads)
    bwd_preprocess_kernel(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
  using Element = typename Tr::Element;
  using Chunks = RowChunks<Tr>;
  const int m_block = int(blockIdx.x), h = int(blockIdx.y), b = int(blockIdx.z);
  const int tid = int(threadIdx.x), c = Chunks::chunk(tid);
  if (ws.dq_turn != nullptr && tid == 0)
    ws.dq_turn[(int64_t(b) * p.heads_q + h) * gridDim.x + m_block] = 0;
  const cuda::SeqInfo seq = cuda::seq_info(p, b);
  const int i0 = m_block * Tr::kBlockM;
  const int rows = min(Tr::kBlockM, seq.len_q - i0);
  if (rows <= 0) return;  // varlen: a shorter sequence; no barrier below
  const int64_t ws_row0 = bwd_ws_row(p, seq, b, h) + i0;
  const bool chunk_lane = c < Chunks::kChunks;
  auto row_of = [&](int pass) { return Chunks::row(tid) + pass * Chunks::kRowsPerPass; };

  // Passes in batches of up to 4 whose loads are in flight together (8 would hold 64
  // registers of chunks and halve the CTAs an SM holds, at head dims 192 and 256).
  constexpr int kBatch = Chunks::kPasses < 4 ? Chunks::kPasses : 4;
  static_assert(Chunks::kPasses % kBatch == 0, "whole batches");
  CUTE_UNROLL
  for (int pass0 = 0; pass0 < Chunks::kPasses; pass0 += kBatch) {
    uint4 dout_c[kBatch], o_c[kBatch];  // this lane's chunk of each pass's row
    CUTE_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      const int r = row_of(pass0 + i);
      if (r < rows && chunk_lane) {
        const int64_t row = seq.start_q + i0 + r;
        const char* o = static_cast<const char*>(p.out) +
                        (b * p.o_batch_stride + row * p.o_row_stride + h * p.o_head_stride) *
                            int64_t(sizeof(Element));
        const char* dout = static_cast<const char*>(p.dout) +
                           (b * p.do_batch_stride + row * p.do_row_stride + h * p.do_head_stride) *
                               int64_t(sizeof(Element));
        o_c[i] = reinterpret_cast<const uint4*>(o)[c];
        dout_c[i] = reinterpret_cast<const uint4*>(dout)[c];
      } else {
        o_c[i] = dout_c[i] = make_uint4(0, 0, 0, 0);
      }
    }
    if (pass0 == 0) {  // the zeroing stores go out while the first loads are in flight
      float4* dq = DqChunk<Tr>::at(p, ws, seq, b, h, i0);
      for (int e = tid; e < DqChunk<Tr>::kFloats / 4; e += kRowKernelThreads)
        dq[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    CUTE_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      float acc = dot_chunk<Element>(dout_c[i], o_c[i], 0.f);
      CUTE_UNROLL
      for (int off = Chunks::kLanes / 2; off > 0; off >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, off);  // within the row's lane group
      const int r = row_of(pass0 + i);
      if (c == 0 && r < rows) {
        const float lse =
            p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + seq.start_q + i0 + r];
        ws.dsum[ws_row0 + r] = acc;
        ws.lse_log2[ws_row0 + r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      }
    }
  }
}

// ---- postprocess -------------------------------------------------------------------------
// grid (ceil(seqlen_q / kBlockM), heads_q, batch), the main kernel's kNThreads threads: thread
// t reads the float4s it held in the main kernel (DqChunk: 512 contiguous bytes per warp
// load), scales them (dS is unscaled) and rounds them to the dtype in the same dQ fragment
// layout; the block leaves through shared memory as 16-byte row stores, rows past the
// sequence's end skipped.
template <class Tr>
__global__ void __launch_bounds__(Tr::kNThreads)
    bwd_postprocess_kernel(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using HeadDim = typename Tr::HeadDim;
  const int m_block = int(blockIdx.x), h = int(blockIdx.y), b = int(blockIdx.z);
  const int tid = int(threadIdx.x);
  const cuda::SeqInfo seq = cuda::seq_info(p, b);
  const int i0 = m_block * Tr::kBlockM;
  const int rows = min(Tr::kBlockM, seq.len_q - i0);
  if (rows <= 0) return;  // varlen: a shorter sequence; the whole CTA leaves

  typename Tr::TiledMmadQ mma_dq;
  Tensor acc = partition_fragment_C(mma_dq, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D) fp32
  static_assert(decltype(size(acc))::value == 4 * DqChunk<Tr>::kQuadsPerThread,
                "the postprocess holds what the main kernel's thread held");
  const float4* src = DqChunk<Tr>::at(p, ws, seq, b, h, i0) + tid;
  CUTE_UNROLL
  for (int j = 0; j < DqChunk<Tr>::kQuadsPerThread; ++j) {
    const float4 v = src[j * Tr::kNThreads];  // the main kernel's dS came unscaled
    acc(4 * j) = v.x * p.scale;
    acc(4 * j + 1) = v.y * p.scale;
    acc(4 * j + 2) = v.z * p.scale;
    acc(4 * j + 3) = v.w * p.scale;
  }
  Tensor rdQ = round_to<Element>(acc);  // (MMA, MMA_M, MMA_D)

  __shared__ __align__(128) Element smem_dq[cosize_v<typename Tr::SmemLayoutQdO>];
  Tensor sdQ = make_tensor(make_smem_ptr(smem_dq), typename Tr::SmemLayoutQdO{});  // (BLK_M, D)
  auto smem_copy = make_tiled_copy_C(typename Tr::SmemCopyAtomC{}, mma_dq);
  auto smem_thr = smem_copy.get_thread_slice(tid);
  copy(smem_copy, smem_thr.retile_S(rdQ), smem_thr.partition_D(sdQ));
  __syncthreads();

  Tensor gdQ = make_tensor(
      make_gmem_ptr(static_cast<Element*>(p.dq) + b * p.dq_batch_stride +
                    (seq.start_q + i0) * p.dq_row_stride + h * p.dq_head_stride),
      Shape<BlkM, HeadDim>{}, make_stride(p.dq_row_stride, _1{}));  // (BLK_M, D)
  typename Tr::GmemTiledCopydKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tdQsdQ = gmem_thr.partition_S(sdQ);  // (CPY, CPY_M, CPY_D)
  Tensor tdQgdQ = gmem_thr.partition_D(gdQ);  // (CPY, CPY_M, CPY_D)
  Tensor tdQcdQ = gmem_thr.partition_D(make_identity_tensor(Shape<BlkM, HeadDim>{}));
  Tensor staged = make_tensor<Element>(shape(tdQgdQ));
  copy(gmem_copy, tdQsdQ, staged);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tdQgdQ); ++m)
    if (get<0>(tdQcdQ(0, m, 0)) < rows) copy(gmem_copy, staged(_, m, _), tdQgdQ(_, m, _));
}

// ---- scheduler ---------------------------------------------------------------------------
// Keys [j0, j0 + keys) of batch entry b, KV head hk; the query blocks [m_begin, m_end) with
// a row that sees one of them (an interval: both ends of a row's key range grow with the row).
struct BwdBlock {
  int b, hk, n_block, j0, keys;
  int m_begin, m_end;
  cuda::SeqInfo seq;
};

// Rows [i0, i1) that see keys [key_begin, key_end) of their sequence, as one range.
struct RowBlock {
  int i0, rows, key_begin, key_end;
};

template <class Tr>
__device__ __forceinline__ RowBlock row_block(const MaskPolicy& mask, int m, int len_q,
                                              int len_k) {
  RowBlock r;
  r.i0 = m * Tr::kBlockM;
  r.rows = min(Tr::kBlockM, len_q - r.i0);
  r.key_begin = mask.block_key_begin(r.i0, r.i0 + r.rows, len_q, len_k);
  r.key_end = mask.block_key_end(r.i0, r.i0 + r.rows, len_q, len_k);
  return r;
}

template <class Tr>
__device__ __forceinline__ BwdBlock schedule_bwd(const BwdParams& p) {
  BwdBlock blk;
  blk.n_block = int(blockIdx.x);
  blk.hk = int(blockIdx.y);
  blk.b = int(blockIdx.z);
  blk.seq = cuda::seq_info(p, blk.b);
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k;
  blk.j0 = blk.n_block * Tr::kBlockN;
  blk.keys = min(Tr::kBlockN, len_k - blk.j0);
  const int m_blocks = blk.keys > 0 ? (len_q + Tr::kBlockM - 1) / Tr::kBlockM : 0;
  // Both ends of a block's key range grow with the block (MaskPolicy), so the blocks that
  // see a key of [j0, j0 + keys) are those from the first whose range ends past j0 up to the
  // first whose range begins at or past j0 + keys: two binary searches.
  auto first_true = [](int lo, int hi, auto pred) {  // pred false, then true, on [lo, hi)
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (pred(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  };
  blk.m_begin = first_true(0, m_blocks, [&](int m) {
    return row_block<Tr>(p.mask, m, len_q, len_k).key_end > blk.j0;
  });
  blk.m_end = first_true(blk.m_begin, m_blocks, [&](int m) {
    return row_block<Tr>(p.mask, m, len_q, len_k).key_begin >= blk.j0 + blk.keys;
  });
  return blk;
}

// ---- mainloop helpers ----------------------------------------------------------------------
// Zeroes the probabilities of (row, key) pairs the mask hides, and of keys at or past len_k.
// p and coords are (rows, cols) views of the P accumulator and of the tile's identity tensor;
// the tile starts at query row i0 and key j0.
template <class P, class C>
__device__ __forceinline__ void mask_probs(P& p, C const& coords, const MaskPolicy& mask, int i0,
                                           int j0, int len_q, int len_k) {
  CUTE_UNROLL
  for (int r = 0; r < size<0>(p); ++r) {
    const int i = i0 + get<0>(coords(r, 0));
    const int lo = mask.key_begin(i, len_q, len_k) - j0;
    const int hi = mask.key_end(i, len_q, len_k) - j0;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(p); ++c) {
      const int j = get<1>(coords(r, c));
      if (j < lo || j >= hi) p(r, c) = 0.f;
    }
  }
}

// The dropout factor of each probability: 1/(1 − p) where kept, 0 where dropped.
// keep (MMA, MMA_M, MMA_N) is shaped like the S accumulator; coords(0, m, n) is the
// (row, key) of value 0 of this thread's m16n8 fragment (m, n), whose four values are the
// four words of one Philox call (common/dropout.h).
template <class Keep, class C>
__device__ __forceinline__ void dropout_factors(Keep& keep, C const& coords,
                                                const DropoutPolicy& d, uint32_t bh, int i0,
                                                int j0) {
  static_assert(decltype(size<0>(keep))::value == 4, "an m16n8 C fragment holds 4 values");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(keep); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(keep); ++n) {
      const Philox4 bits =
          d.block_bits(bh, i0 + get<0>(coords(0, m, n)), j0 + get<1>(coords(0, m, n)));
      CUTE_UNROLL
      for (int v = 0; v < 4; ++v) keep(v, m, n) = bits.w[v] >= d.threshold ? d.rescale : 0.f;
    }
  }
}

// Device-scope acquire load and release add of a turn counter (deterministic mode).
__device__ __forceinline__ int load_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int* ptr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}

// *dst += (a, b, c, d) in global memory (dst 16-byte aligned): one vector reduction on
// sm_90, four scalar ones before. Written as `red` in PTX: atomicAdd on a vector compiles to
// an ATOMG whose (unused) result the warp still waits for, a long-scoreboard stall per add.
// No "memory" clobber: nothing in the kernel reads dQ back, and the deterministic mode's
// fence and barrier order the adds before its turn is passed on.
__device__ __forceinline__ void add_quad(float4* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d));
#else
  float* f = reinterpret_cast<float*>(dst);
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f), "f"(a));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f + 1), "f"(b));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f + 2), "f"(c));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f + 3), "f"(d));
#endif
}

// v, made to depend on dep without changing it: v | (dep & zero) bitwise, where zero is 0 at
// run time but unknown to the compiler (one LOP3). ptxas schedules an instruction as soon as
// its operands allow, so dQ's reductions, whose values are ready before dK's product starts,
// all issued at that product's first k-steps whatever the source order (the SASS: 8 of 8
// at head dim 64, 16 of 16 at 256), queueing behind each other and holding their source
// registers against the next loads. Tied to an accumulator of the k-step they follow, they
// cannot issue before it.
__device__ __forceinline__ float after(float v, float dep, uint32_t zero) {
  return __uint_as_float(__float_as_uint(v) | (__float_as_uint(dep) & zero));
}

// ---- the kernel --------------------------------------------------------------------------
// grid (ceil(seqlen_k / kBlockN), heads_kv, batch), kNThreads threads, kSmemBytes dynamic.
// Three variants, picked at launch: plain, kSoftcap, and kDropout (which also takes softcap,
// decided at run time), so that the plain kernel carries neither's registers.
template <class Tr, bool kSoftcap, bool kDropout>
__global__ void __launch_bounds__(Tr::kNThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;

  const BwdBlock blk = schedule_bwd<Tr>(p);
  if (blk.keys <= 0) return;  // varlen: this sequence has fewer keys than the grid
  const int tid = int(threadIdx.x);
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k, j0 = blk.j0;
  const MaskPolicy mask = p.mask;
  const uint32_t opaque_zero = uint32_t(p.batch) >> 31;  // batch >= 0: see after()

  // ---- global tensors: this CTA's keys, and the rows of every query block ----
  const int64_t kv_row0 = blk.seq.start_k + j0;
  auto key_tile = [&](auto* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
    return make_tensor(make_gmem_ptr(base + blk.b * batch_stride + kv_row0 * row_stride +
                                     blk.hk * head_stride),
                       Shape<BlkN, HeadDim>{}, make_stride(row_stride, _1{}));  // (BLK_N, D)
  };
  Tensor gK = key_tile(static_cast<const Element*>(p.k), p.k_batch_stride, p.k_row_stride,
                       p.k_head_stride);  // (BLK_N, D)
  Tensor gV = key_tile(static_cast<const Element*>(p.v), p.v_batch_stride, p.v_row_stride,
                       p.v_head_stride);  // (BLK_N, D)
  Tensor gdK = key_tile(static_cast<Element*>(p.dk), p.dk_batch_stride, p.dk_row_stride,
                        p.dk_head_stride);  // (BLK_N, D)
  Tensor gdV = key_tile(static_cast<Element*>(p.dv), p.dv_batch_stride, p.dv_row_stride,
                        p.dv_head_stride);  // (BLK_N, D)
  // Rows [m·kBlockM, m·kBlockM + kBlockM) of query head h.
  auto row_tile = [&](auto* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                      int h, int m) {
    return make_tensor(
        make_gmem_ptr(base + blk.b * batch_stride +
                      (blk.seq.start_q + int64_t(m) * kBlockM) * row_stride + h * head_stride),
        Shape<BlkM, HeadDim>{}, make_stride(row_stride, _1{}));  // (BLK_M, D)
  };

  // ---- shared tensors ----
  extern __shared__ __align__(128) unsigned char smem[];
  // Q's stages, dO's stages, K, V, P, dS. The Q and dO tensors below are stage 0's; stage s
  // is the same view kQdOStageElems · s elements on (at_stage).
  constexpr int kQdOBytes = Tr::kStagesQdO * Tr::kSmemQdOBytes;
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_do = reinterpret_cast<Element*>(smem + kQdOBytes);
  Element* smem_k = reinterpret_cast<Element*>(smem + 2 * kQdOBytes);
  Element* smem_v = reinterpret_cast<Element*>(smem + 2 * kQdOBytes + Tr::kSmemKVBytes);
  Element* smem_p = reinterpret_cast<Element*>(smem + 2 * kQdOBytes + 2 * Tr::kSmemKVBytes);
  Element* smem_ds = reinterpret_cast<Element*>(smem + 2 * kQdOBytes + 2 * Tr::kSmemKVBytes +
                                                Tr::kSmemPdSBytes);
  auto at_stage = [](auto const& t, int stage) {
    return make_tensor(t.data() + stage * Tr::kQdOStageElems, t.layout());
  };
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQdO{});     // (BLK_M, D)
  Tensor sdO = make_tensor(make_smem_ptr(smem_do), typename Tr::SmemLayoutQdO{});   // (BLK_M, D)
  Tensor sQt = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQdOt{});   // (D, BLK_M)
  Tensor sdOt = make_tensor(make_smem_ptr(smem_do), typename Tr::SmemLayoutQdOt{}); // (D, BLK_M)
  Tensor sQdOtNoSwizzle =
      make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQdOtNoSwizzle{});  // (D, BLK_M)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKV{});      // (BLK_N, D)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutKV{});      // (BLK_N, D)
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKt{});     // (D, BLK_N)
  Tensor sKtNoSwizzle =
      make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKtNoSwizzle{});    // (D, BLK_N)
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdS{});     // (BLK_M, BLK_N)
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Tr::SmemLayoutPdS{});   // (BLK_M, BLK_N)
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdSt{});   // (BLK_N, BLK_M)
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Tr::SmemLayoutPdSt{}); // (BLK_N, BLK_M)
  Tensor sPdStNoSwizzle =
      make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdStNoSwizzle{});  // (BLK_N, BLK_M)
  Tensor sdK = sK;  // dK and dV leave through K's and V's bytes: (BLK_N, D)
  Tensor sdV = sV;

  // ---- global → shared partitions (cp.async) ----
  typename Tr::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQsQ = gmem_thr.partition_D(sQ);     // (CPY, CPY_M, CPY_D)
  Tensor tdOsdO = gmem_thr.partition_D(sdO);  // (CPY, CPY_M, CPY_D)
  Tensor tKsK = gmem_thr.partition_D(sK);     // (CPY, CPY_N, CPY_D)
  Tensor tVsV = gmem_thr.partition_D(sV);     // (CPY, CPY_N, CPY_D)
  // Row coordinates of this thread's chunks, for the guarded (ragged) tiles.
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<BlkM, HeadDim>{}));   // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)

  // Q and dO of (head h, block m) into `stage`, two cp.async groups: Q first (S needs it
  // first).
  auto load_q_do = [&](int h, int m, int stage) {
    Tensor tQsQ_s = at_stage(tQsQ, stage);        // (CPY, CPY_M, CPY_D)
    Tensor tdOsdO_s = at_stage(tdOsdO, stage);    // (CPY, CPY_M, CPY_D)
    const int rows = min(kBlockM, len_q - m * kBlockM);
    Tensor tQgQ = gmem_thr.partition_S(row_tile(static_cast<const Element*>(p.q), p.q_batch_stride,
                                                p.q_row_stride, p.q_head_stride, h, m));
    Tensor tdOgdO = gmem_thr.partition_S(row_tile(static_cast<const Element*>(p.dout),
                                                  p.do_batch_stride, p.do_row_stride,
                                                  p.do_head_stride, h, m));  // (CPY, CPY_M, CPY_D)
    if (rows < kBlockM) {
      copy_rows<true>(gmem_copy, tQgQ, tQsQ_s, tQcQ, rows);
      cp_async_fence();
      copy_rows<true>(gmem_copy, tdOgdO, tdOsdO_s, tQcQ, rows);
    } else {
      copy_rows<false>(gmem_copy, tQgQ, tQsQ_s, tQcQ, rows);
      cp_async_fence();
      copy_rows<false>(gmem_copy, tdOgdO, tdOsdO_s, tQcQ, rows);
    }
    cp_async_fence();
  };

  // ---- tensor-core partitions and shared → register copies (ldmatrix) ----
  // S = Q Kᵀ, dP = dO Vᵀ: (BLK_M, BLK_N)
  typename Tr::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_D)
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO); // (MMA, MMA_M, MMA_D)
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);   // (MMA, MMA_N, MMA_D)
  auto copy_sdp_a = make_tiled_copy_A(typename Tr::SmemCopyAtom{}, mma_sdp);
  auto copy_sdp_b = make_tiled_copy_B(typename Tr::SmemCopyAtom{}, mma_sdp);
  Tensor tSsQ = copy_sdp_a.get_thread_slice(tid).partition_S(sQ);     // (CPY, CPY_M, CPY_D)
  Tensor tdPsdO = copy_sdp_a.get_thread_slice(tid).partition_S(sdO);  // (CPY, CPY_M, CPY_D)
  Tensor tSsK = copy_sdp_b.get_thread_slice(tid).partition_S(sK);     // (CPY, CPY_N, CPY_D)
  Tensor tdPsV = copy_sdp_b.get_thread_slice(tid).partition_S(sV);    // (CPY, CPY_N, CPY_D)
  // This thread's ldmatrix addresses of the first k-step of Q, dO (stage 0), K and V, for
  // gemm_ss_lines; stage s is kQdOStageBytes · s further.
  const uint32_t q_addr0 = cast_smem_ptr_to_uint(&tSsQ(0, 0, 0));
  const uint32_t do_addr0 = cast_smem_ptr_to_uint(&tdPsdO(0, 0, 0));
  const uint32_t k_addr0 = cast_smem_ptr_to_uint(&tSsK(0, 0, 0));
  const uint32_t v_addr0 = cast_smem_ptr_to_uint(&tdPsV(0, 0, 0));
  constexpr uint32_t kQdOStageBytes = uint32_t(Tr::kQdOStageElems * sizeof(Element));
  // S = Q Kᵀ and dP = dO Vᵀ: both operands (rows, D) in smem.
  auto gemm_sdp = [&](auto& acc, auto& rA, auto& rB, auto const& sA, auto const& sB,
                      uint32_t a0, uint32_t b0) {
    if constexpr (Tr::kLineAddressing)
      gemm_ss_lines<Tr::kQdOTileBytes, Tr::kQdOBlockBytes, Tr::kKVTileBytes, Tr::kKVBlockBytes>(
          mma_sdp, acc, rA, rB, a0, b0, copy_sdp_a, copy_sdp_b);
    else
      gemm_ss(mma_sdp, acc, rA, rB, sA, sB, copy_sdp_a, copy_sdp_b);
  };
  // (row, key) of each score this thread holds: (MMA, MMA_M, MMA_N) and as (rows, cols).
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlkM, BlkN>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  auto smem_copy_pds = make_tiled_copy_C(typename Tr::SmemCopyAtomC{}, mma_sdp);
  auto smem_thr_pds = smem_copy_pds.get_thread_slice(tid);
  Tensor tPsP = smem_thr_pds.partition_D(sP);     // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = smem_thr_pds.partition_D(sdS);  // (CPY, CPY_M, CPY_N)

  // dV = Pᵀ dO, dK = dSᵀ Q: (BLK_N, D), every operand read transposed
  typename Tr::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPdStNoSwizzle);   // (MMA, MMA_N, MMA_M)
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sQdOtNoSwizzle);  // (MMA, MMA_D, MMA_M)
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sPdStNoSwizzle);  // (MMA, MMA_N, MMA_M)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQdOtNoSwizzle);   // (MMA, MMA_D, MMA_M)
  auto copy_dkv_a = make_tiled_copy_A(typename Tr::SmemCopyAtomT{}, mma_dkv);
  auto copy_dkv_b = make_tiled_copy_B(typename Tr::SmemCopyAtomT{}, mma_dkv);
  Tensor tdVsPt = copy_dkv_a.get_thread_slice(tid).partition_S(sPt);    // (CPY, CPY_N, CPY_M)
  Tensor tdKsdSt = copy_dkv_a.get_thread_slice(tid).partition_S(sdSt);  // (CPY, CPY_N, CPY_M)
  Tensor tdVsdOt = copy_dkv_b.get_thread_slice(tid).partition_S(sdOt);  // (CPY, CPY_D, CPY_M)
  Tensor tdKsQt = copy_dkv_b.get_thread_slice(tid).partition_S(sQt);    // (CPY, CPY_D, CPY_M)
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<BlkN, HeadDim>{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<BlkN, HeadDim>{});  // (MMA, MMA_N, MMA_D)
  clear(acc_dk);
  clear(acc_dv);

  // dQ = dS K: (BLK_M, D), K read transposed
  typename Tr::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);          // (MMA, MMA_M, MMA_N)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtNoSwizzle);  // (MMA, MMA_D, MMA_N)
  auto copy_dq_a = make_tiled_copy_A(typename Tr::SmemCopyAtom{}, mma_dq);
  auto copy_dq_b = make_tiled_copy_B(typename Tr::SmemCopyAtomT{}, mma_dq);
  Tensor tdQsdS = copy_dq_a.get_thread_slice(tid).partition_S(sdS);  // (CPY, CPY_M, CPY_N)
  Tensor tdQsKt = copy_dq_b.get_thread_slice(tid).partition_S(sKt);  // (CPY, CPY_D, CPY_N)

  constexpr int kRowsS = decltype(size<0>(acc_rowcol(tScS.layout())))::value;
  // Softcap: logit = cap·tanh(s·scale / cap); P's exponent is tanh(·) scaled by cap·log2 e.
  const bool softcap = kSoftcap || (kDropout && mask.softcap > 0.f);
  const float scale_log2 = softcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = softcap ? p.scale / mask.softcap : 0.f;
  const int m_blocks_all = (p.seqlen_q + kBlockM - 1) / kBlockM;  // dq_turn's last extent
  const int h_begin = blk.hk * p.group, h_end = h_begin + p.group;
  // Dropout's P for dV is P ∘ M / (1 − p), known only once the mask is drawn with dP.
  constexpr bool kStorePEarly = Tr::kStorePEarly && !kDropout;

  // ---- mainloop ----
  // K and V once, with the first Q (one cp.async group), then the first dO (another).
  if (blk.m_begin < blk.m_end) {
    Tensor tKgK = gmem_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D)
    Tensor tVgV = gmem_thr.partition_S(gV);  // (CPY, CPY_N, CPY_D)
    if (blk.keys < kBlockN) {
      copy_rows<true>(gmem_copy, tKgK, tKsK, tKVcKV, blk.keys);
      copy_rows<true>(gmem_copy, tVgV, tVsV, tKVcKV, blk.keys);
    } else {
      copy_rows<false>(gmem_copy, tKgK, tKsK, tKVcKV, blk.keys);
      copy_rows<false>(gmem_copy, tVgV, tVsV, tKVcKV, blk.keys);
    }
    load_q_do(h_begin, blk.m_begin, 0);
  }
  int stage = 0;  // the Q/dO buffer of the current block

  for (int h = h_begin; h < h_end && blk.m_begin < blk.m_end; ++h) {
    const int64_t ws_row0 = bwd_ws_row(p, blk.seq, blk.b, h);
    const uint32_t bh = uint32_t(blk.b * p.heads_q + h);  // dropout's (batch, head) index
    for (int m = blk.m_begin; m < blk.m_end; ++m) {
      const RowBlock rb = row_block<Tr>(mask, m, len_q, len_k);
      const int i0 = rb.i0, rows = rb.rows;

      // LSE (log2 units) and D of this thread's rows; rows past the block's end get +inf
      // and 0, so that their P, and with it their dS, is 0.
      float lse_log2[kRowsS], dsum[kRowsS];
      CUTE_UNROLL
      for (int r = 0; r < kRowsS; ++r) {
        const int row = get<0>(tScS_rc(r, 0));
        lse_log2[r] = row < rows ? ws.lse_log2[ws_row0 + i0 + row] : INFINITY;
        dsum[r] = row < rows ? ws.dsum[ws_row0 + i0 + row] : 0.f;
      }

      // S = Q Kᵀ, while dO is still landing.
      Tensor acc_s = partition_fragment_C(mma_sdp, Shape<BlkM, BlkN>{});  // (MMA, MMA_M, MMA_N)
      clear(acc_s);
      cp_async_wait<1>();  // Q (and the first time K, V) have landed ...
      __syncthreads();     // ... for every thread, and every warp is done with the last block
      const bool last_m = m + 1 == blk.m_end;
      const bool has_next = !last_m || h + 1 < h_end;
      const int next_h = last_m ? h + 1 : h, next_m = last_m ? blk.m_begin : m + 1;
      if constexpr (Tr::kStagesQdO == 2) {
        // The next block's Q and dO land in the other buffer during this whole block; on
        // the last block two empty groups keep the wait counts below the same.
        if (has_next) {
          load_q_do(next_h, next_m, stage ^ 1);
        } else {
          cp_async_fence();
          cp_async_fence();
        }
      }
      gemm_sdp(acc_s, tSrQ, tSrK, at_stage(tSsQ, stage), tSsK, q_addr0 + stage * kQdOStageBytes,
               k_addr0);

      // P = 2^(logit·log2 e − LSE·log2 e), recomputed; d logit / d s for softcap.
      Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
      Tensor dlogit = make_tensor_like(s);                                // (rows, cols)
      if constexpr (kSoftcap || kDropout) {
        if (softcap) {
          CUTE_UNROLL
          for (int e = 0; e < size(s); ++e) {
            s(e) = tanhf(s(e) * softcap_pre);
            dlogit(e) = 1.f - s(e) * s(e);
          }
        }
      }
      CUTE_UNROLL
      for (int r = 0; r < kRowsS; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c)
          s(r, c) = exp2_approx(fmaf(s(r, c), scale_log2, -lse_log2[r]));
      }
      if (blk.keys < kBlockN || !mask.tile_is_full(i0, i0 + rows, j0, j0 + kBlockN, len_q, len_k))
        mask_probs(s, tScS_rc, mask, i0, j0, len_q, len_k);
      if constexpr (kStorePEarly) {  // its stores interleave with dP's products
        Tensor rP = round_to<Element>(acc_s);  // (MMA, MMA_M, MMA_N)
        copy(smem_copy_pds, smem_thr_pds.retile_S(rP), tPsP);
      }

      // dP = dO Vᵀ.
      Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<BlkM, BlkN>{});  // (MMA, MMA_M, MMA_N)
      clear(acc_dp);
      cp_async_wait<Tr::kStagesQdO == 2 ? 2 : 0>();  // dO has landed ...
      __syncthreads();  // ... for every thread, and every warp is done with the last dS
      gemm_sdp(acc_dp, tdPrdO, tdPrV, at_stage(tdPsdO, stage), tdPsV,
               do_addr0 + stage * kQdOStageBytes, v_addr0);

      // dS = P ∘ (dP − D) · d logit (the scale comes later), in dP's registers; P for dV
      // (dropped: 0).
      Tensor dp = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));  // (rows, cols)
      Tensor keep = make_tensor_like(acc_s);                                  // (MMA, MMA_M, MMA_N)
      Tensor keep_rc = make_tensor(keep.data(), acc_rowcol(keep.layout()));   // (rows, cols)
      if constexpr (kDropout) dropout_factors(keep, tScS, p.dropout, bh, i0, j0);
      CUTE_UNROLL
      for (int r = 0; r < kRowsS; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s); ++c) {
          float dpv = dp(r, c);
          if constexpr (kDropout) dpv *= keep_rc(r, c);
          float ds = s(r, c) * (dpv - dsum[r]);
          if constexpr (kSoftcap || kDropout) {
            if (softcap) ds *= dlogit(r, c);
          }
          dp(r, c) = ds;
          if constexpr (kDropout) s(r, c) *= keep_rc(r, c);
        }
      }
      if constexpr (!kStorePEarly) {
        Tensor rP = round_to<Element>(acc_s);    // (MMA, MMA_M, MMA_N)
        copy(smem_copy_pds, smem_thr_pds.retile_S(rP), tPsP);
      }
      Tensor rdS = round_to<Element>(acc_dp);  // (MMA, MMA_M, MMA_N)
      copy(smem_copy_pds, smem_thr_pds.retile_S(rdS), tdSsdS);
      __syncthreads();  // P and dS are complete

      // dQ += dS K: this key block's share, added to the fp32 accumulator while dK's product
      // runs. Order: dV = Pᵀ dO, dQ's product, then dK = dSᵀ Q with dQ's reductions spread
      // over its k-steps (and held there by after()), so each step's red.global waits under
      // the next step's MMAs (after dK, or issued in one batch, they stall on their source
      // registers: docs/sm80/bwd.md).
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D)
      // This thread's float4s of the block's accumulator chunk: a base address and constant
      // offsets. A ragged block's rows past the end add into the chunk's padding.
      float4* dq_chunk = DqChunk<Tr>::at(p, ws, blk.seq, blk.b, h, i0) + tid;
      constexpr int kQuads = DqChunk<Tr>::kQuadsPerThread;
      constexpr int kDkSteps = decltype(size<2>(tdKrdSt))::value;
      constexpr int kQuadsPerStep = (kQuads + kDkSteps - 1) / kDkSteps;

      gemm_ss(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, at_stage(tdVsdOt, stage), copy_dkv_a,
              copy_dkv_b);
      clear(acc_dq);
      gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, copy_dq_a, copy_dq_b);
      int* turn = nullptr;
      if (p.deterministic) {
        // Key blocks take turns on this query block, first key block first.
        turn = ws.dq_turn + (int64_t(blk.b) * p.heads_q + h) * m_blocks_all + m;
        const int mine = blk.n_block - rb.key_begin / kBlockN;
        if (tid == 0)
          while (load_acquire(turn) != mine) {
          }
        __syncthreads();
      }
      // The reductions after k-step k wait for its first accumulator (acc_dk(0), m-tile 0
      // and n-tile 0 of mma_k_step's order): see after().
      gemm_ss(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, at_stage(tdKsQt, stage), copy_dkv_a,
              copy_dkv_b, [&](int k) {
                const float dep = acc_dk(0);
                CUTE_UNROLL
                for (int j = k * kQuadsPerStep; j < (k + 1) * kQuadsPerStep && j < kQuads; ++j)
                  add_quad(dq_chunk + j * Tr::kNThreads, after(acc_dq(4 * j), dep, opaque_zero),
                           after(acc_dq(4 * j + 1), dep, opaque_zero),
                           after(acc_dq(4 * j + 2), dep, opaque_zero),
                           after(acc_dq(4 * j + 3), dep, opaque_zero));
              });
      if (p.deterministic) {
        __threadfence();
        __syncthreads();  // every thread's adds are done (and visible) ...
        if (tid == 0) add_release(turn, 1);  // ... before the next key block's turn
      }
      if constexpr (Tr::kStagesQdO == 1) {
        __syncthreads();  // every warp is done with Q and dO: the next block's may land
        if (has_next) load_q_do(next_h, next_m, 0);
      } else {
        stage ^= 1;
      }
    }
  }

  // ---- epilogue ----
  // dK and dV: registers → shared (K's and V's bytes) → 16-byte global stores; keys that
  // no row sees get 0.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;  // dS came unscaled
  Tensor rdK = round_to<Element>(acc_dk);  // (MMA, MMA_N, MMA_D)
  Tensor rdV = round_to<Element>(acc_dv);  // (MMA, MMA_N, MMA_D)
  auto smem_copy_dkv = make_tiled_copy_C(typename Tr::SmemCopyAtomC{}, mma_dkv);
  auto smem_thr_dkv = smem_copy_dkv.get_thread_slice(tid);
  __syncthreads();  // every warp's last read of K (the last dQ) is behind us
  copy(smem_copy_dkv, smem_thr_dkv.retile_S(rdK), smem_thr_dkv.partition_D(sdK));
  copy(smem_copy_dkv, smem_thr_dkv.retile_S(rdV), smem_thr_dkv.partition_D(sdV));
  __syncthreads();

  typename Tr::GmemTiledCopydKV gmem_copy_dkv;
  auto gmem_thr_dkv = gmem_copy_dkv.get_thread_slice(tid);
  Tensor tdKVcdKV = gmem_thr_dkv.partition_D(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)
  auto store_rows = [&](auto const& s_tile, auto& g_tile) {
    Tensor src = gmem_thr_dkv.partition_S(s_tile);  // (CPY, CPY_N, CPY_D)
    Tensor dst = gmem_thr_dkv.partition_D(g_tile);  // (CPY, CPY_N, CPY_D)
    Tensor staged = make_tensor<Element>(shape(dst));
    copy(gmem_copy_dkv, src, staged);
    CUTE_UNROLL
    for (int n = 0; n < size<1>(dst); ++n)
      if (get<0>(tdKVcdKV(0, n, 0)) < blk.keys) copy(gmem_copy_dkv, staged(_, n, _), dst(_, n, _));
  };
  store_rows(sdK, gdK);
  store_rows(sdV, gdV);
}

// ---- launch ------------------------------------------------------------------------------
template <class Tr, bool kSoftcap, bool kDropout>
Status launch_bwd(const BwdParams& p, const BwdWorkspace& ws) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const dim3 row_grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads_q, p.batch);
  if (p.seqlen_q > 0) {
    bwd_preprocess_kernel<Tr><<<row_grid, kRowKernelThreads, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  if (p.seqlen_k > 0) {
    const auto kernel = bwd_kernel<Tr, kSoftcap, kDropout>;
    if (Tr::kSmemBytes > 48 * 1024)
      FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Tr::kSmemBytes));
    const dim3 grid((p.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN, p.heads_kv, p.batch);
    kernel<<<grid, Tr::kNThreads, Tr::kSmemBytes, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  if (p.seqlen_q > 0) {
    bwd_postprocess_kernel<Tr><<<row_grid, Tr::kNThreads, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  return {};
}

// The per-(dtype, head dim) entry points that bwd_dispatch.cu calls (bwd_instance.h); each
// instantiations/bwd_hdim*_*.cu file instantiates one.
template <DType kDtype, int kHeadDim>
Status BwdInstance<kDtype, kHeadDim>::run(const BwdParams& p) {
  using Config = BwdConfig<kDtype, kHeadDim>;
  using Tr = typename Config::Traits;
  const BwdWorkspaceLayout l = bwd_workspace_layout(p, Tr::kBlockM);
  char* base = static_cast<char*>(p.workspace);
  const BwdWorkspace ws{reinterpret_cast<float*>(base + l.dq_accum),
                        reinterpret_cast<float*>(base + l.dsum),
                        reinterpret_cast<float*>(base + l.lse_log2),
                        p.deterministic ? reinterpret_cast<int*>(base + l.dq_turn) : nullptr};
  if (p.dropout.enabled()) return launch_bwd<Tr, false, true>(p, ws);
  if (p.mask.softcap > 0.f) return launch_bwd<Tr, true, false>(p, ws);
  if constexpr (Config::kHasLargeSmem) {
    using TrL = typename Config::TraitsLargeSmem;
    int smem_optin = 0;
    FL_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                         p.device_index));
    if (smem_optin >= TrL::kSmemBytes) return launch_bwd<TrL, false, false>(p, ws);
  }
  return launch_bwd<Tr, false, false>(p, ws);
}
template <DType kDtype, int kHeadDim>
size_t BwdInstance<kDtype, kHeadDim>::workspace_bytes(const BwdParams& p) {
  return bwd_workspace_layout(p, BwdConfig<kDtype, kHeadDim>::Traits::kBlockM).total;
}
template <DType kDtype, int kHeadDim>
const void* BwdInstance<kDtype, kHeadDim>::kernel() {
  return reinterpret_cast<const void*>(
      bwd_kernel<typename BwdConfig<kDtype, kHeadDim>::Traits, false, false>);
}
template <DType kDtype, int kHeadDim>
int BwdInstance<kDtype, kHeadDim>::smem_bytes() {
  return BwdConfig<kDtype, kHeadDim>::Traits::kSmemBytes;
}

}  // namespace flashlab::sm80
