// The CuTe FlashAttention-2 forward kernel (sm80 path), in layers:
//   scheduler  which (batch, head, query block) a CTA owns and which key tiles it visits
//   mainloop   Q, then K/V tiles: cp.async global → shared, ldmatrix → registers, mma.sync
//   softmax    online softmax in exp2 units, masked only on the tiles the mask cuts
//   epilogue   normalize O, write LSE, stage O through shared memory, 16-byte stores
// Every compile-time choice comes from the traits (fwd_traits.h); the launch is at the end.
//
// The algorithm is FlashAttention-2's: a CTA owns kBlockM query rows and walks the K/V
// tiles its rows can see from the last to the first (the diagonal and the ragged end first,
// while the running max settles), keeping O, the row max m and the row sum ℓ in registers.
// S = Q Kᵀ is scaled into log2 units once (scale·log2 e folded into the exp2's FMA), P is
// rounded in registers into the A operand of O += P V, and O is normalized once at the end.
//
// What it adds over fa2_mma (rung 4): four warps of 32 query rows instead of eight of 16, so
// each K/V fragment read from shared memory feeds two MMAs; V's copy overlaps S = Q Kᵀ and
// the next K's the softmax and P V; every head dim from 64 to 256; dropout, with one Philox
// call per accumulator fragment (common/dropout.h).
// Measured on H100 (bf16, batch 4, heads 16, seqlen 4096, head dim 128): 333 TFLOP/s
// (causal 289), 1.08x fa2_mma (1.03x causal); head dim 64: 318, 1.15x. With lazy
// rescaling (cuda::OnlineSoftmax) 351 (causal 303), 1.02x SDPA flash. With Q Kᵀ's ldmatrix
// addresses one XOR each (gemm_ss_lines) and its MMAs m-tile by m-tile (mma_k_step), head
// dim 128 at B·S = 16k tokens (2k-16k): 363-379 TFLOP/s non-causal, 1.03-1.16x SDPA flash
// over two runs. docs/sm80/fwd.md.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include <cmath>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/cute_common.cuh"
#include "cuda/sm80/fwd_instance.h"
#include "cuda/sm80/fwd_traits.h"

namespace flashlab::sm80 {

using namespace cute;

using cuda::apply_mask;  // cuda/cute_common.cuh
using cuda::exp2_approx;
using cuda::FwdBlock;
using cuda::kLn2;
using cuda::kLog2e;
using cuda::OnlineSoftmax;
using cuda::round_to;

// ---- fragment views ------------------------------------------------------------------------
// An m16n8 accumulator fragment ((2 cols, 2 rows), MMA_M, MMA_N) seen as a matrix
// ((2 rows, MMA_M), (2 cols, MMA_N)): mode 0 walks this thread's rows, mode 1 its columns.
template <class Layout>
__device__ __forceinline__ auto acc_rowcol(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3, "(MMA, MMA_M, MMA_N)");
  auto l = logical_divide(acc, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// The accumulator of S = Q Kᵀ over keys (N) as the A operand of O = P V over keys (K): two
// adjacent 8-key n-tiles are one 16-key k-step, element for element.
// ((2, 2), MMA_M, MMA_N) → ((2, 2, 2), MMA_M, MMA_N / 2)
template <class Layout>
__device__ __forceinline__ auto acc_as_a_operand(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3, "(MMA, MMA_M, MMA_N)");
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// ---- copies ------------------------------------------------------------------------------
// A tile's rows global → shared through `tiled_copy` (partitions (CPY, CPY_ROWS, CPY_COLS)).
// With kGuard, rows at or past rows_valid are zero-filled in smem and read nothing:
// zeros, not garbage, so that P·V never meets 0·NaN. `coord` is the partitioned identity
// tensor of the tile, giving each chunk's row.
template <bool kGuard, class TiledCopy, class Src, class Dst, class Coord>
__device__ __forceinline__ void copy_rows(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                          Coord const& coord, int rows_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (!kGuard || get<0>(coord(0, m, 0)) < rows_valid)
      copy(tiled_copy, src(_, m, _), dst(_, m, _));
    else
      clear(dst(_, m, _));
  }
}

// One k-step of acc += A·B on register fragments, m-tile by m-tile: A(m) is dead after its
// row of n-tiles and B(n) is reused by every m-tile, so the next k-step's ldmatrix of each
// fragment can be issued about half a k-step (8 MMAs at 32 × 64) before it is needed.
// CuTe's gemm walks n-tiles in the outer loop, which keeps both A fragments live to the end
// of the k-step and leaves the next A load right before its first MMA. Measured alone on the
// H100 (docs/sm80/fwd.md, bwd.md): forward +3-8% at head dim 128, +1-3% at 64, -3 to +1%
// at 256; backward -0.8 to +1.7%.
//   rA (MMA, MMA_M), rB (MMA, MMA_N), acc (MMA, MMA_M, MMA_N)
template <class TiledMma, class Acc, class RA, class RB>
__device__ __forceinline__ void mma_k_step(TiledMma const& mma, Acc& acc, RA const& rA,
                                           RB const& rB) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(acc); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(acc); ++n) gemm(mma, rA(_, m), rB(_, n), acc(_, m, n));
  }
}

// acc += A·B with both operands in shared memory: the ldmatrix of k-step k + 1 is issued
// before the MMAs of k-step k, so the loads hide behind the tensor cores.
//   rA (MMA, MMA_M, MMA_K), rB (MMA, MMA_N, MMA_K): register fragments
//   sA, sB: the ldmatrix partitions of the smem tiles; acc (MMA, MMA_M, MMA_N)
// on_step(k), when given, runs after the MMAs of k-step k: work to interleave with them.
struct NoStep {
  __device__ __forceinline__ void operator()(int) const {}
};
template <class TiledMma, class Acc, class RA, class RB, class SA, class SB, class CopyA,
          class CopyB, class OnStep = NoStep>
__device__ __forceinline__ void gemm_ss(TiledMma const& mma, Acc& acc, RA& rA, RB& rB,
                                        SA const& sA, SB const& sB, CopyA const& copy_a,
                                        CopyB const& copy_b, OnStep const& on_step = {}) {
  Tensor rA_view = make_tensor(rA.data(), copy_a.retile(rA.layout()));  // (CPY, CPY_M, CPY_K)
  Tensor rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));  // (CPY, CPY_N, CPY_K)
  copy(copy_a, sA(_, _, _0{}), rA_view(_, _, _0{}));
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      copy(copy_a, sA(_, _, k + 1), rA_view(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    }
    mma_k_step(mma, acc, rA(_, _, k), rB(_, _, k));
    on_step(k);
  }
}

// ldmatrix .x4 (four 8 × 8 b16 matrices) from an explicit shared-memory address into the
// four 32-bit registers of `dst`.
template <class Frag>
__device__ __forceinline__ void ldsm_x4(uint32_t addr, Frag&& dst) {
  Tensor d = recast<uint32_t>(dst);
  static_assert(decltype(size(d))::value == 4, "one x4 ldmatrix fills four registers");
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d(0)), "=r"(d(1)), "=r"(d(2)), "=r"(d(3))
               : "r"(addr));
}

// gemm_ss for A·Bᵀ products whose operands are both stored (rows, k) in 64-element swizzle
// lines (S = Q Kᵀ here; S = Q Kᵀ and dP = dO Vᵀ in the backward): each k-step's ldmatrix
// addresses come from one base address per operand (line_address, fwd_traits.h) instead of
// CuTe's per-(tile, k-step) addresses. The compiler hoists those out of the key loop, 16
// registers at head dim 128 that the fragments then lack; here the bases are laundered (an
// empty asm the compiler must assume changes them) before every k-step, so each address is
// one XOR computed next to its load. Measured on the H100, with mma_k_step against neither:
// forward +5-11% at head dim 128, 0-3% at 64, -1 to +3% at 256; on top of mma_k_step in the
// backward (S and dP) -0.3 to +2.6%, and the spills at head dim 256 are gone.
// tests/gpu/sm80_line_address_test.cu checks the arithmetic against CuTe's partitions.
//   a0, b0: this thread's shared-memory address of A(m = 0, k = 0) and B(n = 0, k = 0)
//   kTileBytesA/B: bytes between a thread's m-tiles / n-pairs (16·warps along M / N lines)
//   kBlockBytesA/B: bytes between 64-column blocks (the tile's rows × 128)
template <int kTileBytesA, int kBlockBytesA, int kTileBytesB, int kBlockBytesB, class TiledMma,
          class Acc, class RA, class RB, class CopyA, class CopyB>
__device__ __forceinline__ void gemm_ss_lines(TiledMma const& mma, Acc& acc, RA& rA, RB& rB,
                                              uint32_t a0, uint32_t b0, CopyA const& copy_a,
                                              CopyB const& copy_b) {
  Tensor rA_view = make_tensor(rA.data(), copy_a.retile(rA.layout()));  // (CPY, CPY_M, CPY_K)
  Tensor rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));  // (CPY, CPY_N, CPY_K)
  auto load = [&](int k) {
    asm volatile("" : "+r"(a0), "+r"(b0));
    const uint32_t a = line_address(a0, k, kBlockBytesA);
    const uint32_t b = line_address(b0, k, kBlockBytesB);
    CUTE_UNROLL
    for (int m = 0; m < size<1>(rA_view); ++m) ldsm_x4(a + m * kTileBytesA, rA_view(_, m, k));
    CUTE_UNROLL
    for (int n = 0; n < size<1>(rB_view); ++n) ldsm_x4(b + n * kTileBytesB, rB_view(_, n, k));
  };
  load(0);
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) load(k + 1);
    mma_k_step(mma, acc, rA(_, _, k), rB(_, _, k));
  }
}

// acc += A·B with A already in registers (P) and B in shared memory (Vᵀ).
template <class TiledMma, class Acc, class RA, class RB, class SB, class CopyB>
__device__ __forceinline__ void gemm_rs(TiledMma const& mma, Acc& acc, RA const& rA, RB& rB,
                                        SB const& sB, CopyB const& copy_b) {
  Tensor rB_view = make_tensor(rB.data(), copy_b.retile(rB.layout()));  // (CPY, CPY_N, CPY_K)
  copy(copy_b, sB(_, _, _0{}), rB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) copy(copy_b, sB(_, _, k + 1), rB_view(_, _, k + 1));
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// ---- scheduler -------------------------------------------------------------------------
// One CTA per (batch, head, query block), the longest first: cuda::schedule_fwd
// (cuda/cute_common.cuh), shared with the Hopper forward.

// ---- softmax -----------------------------------------------------------------------------
// cuda::OnlineSoftmax (cuda/cute_common.cuh), shared with the Hopper forward.

// Zeroes the probabilities dropout drops (common/dropout.h); ℓ has already summed them, so
// O = (P ∘ M) V / ℓ and the epilogue's 1/(1 − p) complete the definition. acc (MMA, MMA_M,
// MMA_N) holds P; coords(0, m, n) is the (row, key) of value 0 of this thread's m16n8
// fragment (m, n). Its four values are rows {i, i + 8} × keys {j, j + 1} in the order
// (i, j), (i, j + 1), (i + 8, j), (i + 8, j + 1): the word order of one Philox call, so each
// fragment costs one call and no word is drawn twice.
template <class Acc, class C>
__device__ __forceinline__ void apply_dropout(Acc& acc, C const& coords, const DropoutPolicy& d,
                                              uint32_t bh, int i0, int j0) {
  static_assert(decltype(size<0>(acc))::value == 4, "an m16n8 C fragment holds 4 values");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(acc); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(acc); ++n) {
      const Philox4 bits =
          d.block_bits(bh, i0 + get<0>(coords(0, m, n)), j0 + get<1>(coords(0, m, n)));
      CUTE_UNROLL
      for (int v = 0; v < 4; ++v)
        if (bits.w[v] < d.threshold) acc(v, m, n) = 0.f;
    }
  }
}

// ---- the kernel --------------------------------------------------------------------------
// grid (ceil(seqlen_q / kBlockM), heads_q, batch), kNThreads threads. Three variants, picked
// at launch: plain, kSoftcap, and kDropout (which also takes softcap, decided at run time).
// They are compile-time switches because tanh's and Philox's temporaries next to O's 128
// accumulators would push the plain kernel past 255 registers.
template <class Tr, bool kSoftcap, bool kDropout>
__global__ void __launch_bounds__(Tr::kNThreads, Tr::kMinBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;

  const FwdBlock blk = cuda::schedule_fwd<Tr::kBlockM, Tr::kBlockN>(p);
  if (blk.rows <= 0) return;  // varlen: this sequence is shorter than the grid
  const int tid = int(threadIdx.x);
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k;
  const MaskPolicy mask = p.mask;

  // ---- global tensors of this (batch, head) ----
  const Element* q_ptr = static_cast<const Element*>(p.q) + blk.b * p.q_batch_stride +
                         blk.seq.start_q * p.q_row_stride + blk.h * p.q_head_stride;
  const Element* k_ptr = static_cast<const Element*>(p.k) + blk.b * p.k_batch_stride +
                         blk.seq.start_k * p.k_row_stride + blk.hk * p.k_head_stride;
  const Element* v_ptr = static_cast<const Element*>(p.v) + blk.b * p.v_batch_stride +
                         blk.seq.start_k * p.v_row_stride + blk.hk * p.v_head_stride;
  Element* o_ptr = static_cast<Element*>(p.out) + blk.b * p.o_batch_stride +
                   blk.seq.start_q * p.o_row_stride + blk.h * p.o_head_stride;
  Tensor mQ = make_tensor(make_gmem_ptr(q_ptr), make_shape(len_q, HeadDim{}),
                          make_stride(p.q_row_stride, _1{}));  // (len_q, D)
  Tensor mK = make_tensor(make_gmem_ptr(k_ptr), make_shape(len_k, HeadDim{}),
                          make_stride(p.k_row_stride, _1{}));  // (len_k, D)
  Tensor mV = make_tensor(make_gmem_ptr(v_ptr), make_shape(len_k, HeadDim{}),
                          make_stride(p.v_row_stride, _1{}));  // (len_k, D)
  Tensor mO = make_tensor(make_gmem_ptr(o_ptr), make_shape(len_q, HeadDim{}),
                          make_stride(p.o_row_stride, _1{}));  // (len_q, D)
  Tensor gQ = local_tile(mQ, Shape<BlkM, HeadDim>{}, make_coord(blk.m_block, 0));  // (BLK_M, D)
  Tensor gO = local_tile(mO, Shape<BlkM, HeadDim>{}, make_coord(blk.m_block, 0));  // (BLK_M, D)
  Tensor gK = local_tile(mK, Shape<BlkN, HeadDim>{}, make_coord(_, 0));  // (BLK_N, D, n)
  Tensor gV = local_tile(mV, Shape<BlkN, HeadDim>{}, make_coord(_, 0));  // (BLK_N, D, n)

  // ---- shared tensors ----
  extern __shared__ __align__(128) unsigned char smem[];
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_k = reinterpret_cast<Element*>(smem + Tr::kSmemQBytes);
  Element* smem_v = reinterpret_cast<Element*>(smem + Tr::kSmemQBytes + Tr::kSmemKVBytes);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQ{});    // (BLK_M, D)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKV{});   // (BLK_N, D)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutKV{});   // (BLK_N, D)
  Tensor sVt = make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutVt{});  // (D, BLK_N)
  Tensor sVtNoSwizzle =
      make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutVtNoSwizzle{});  // (D, BLK_N)
  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutO{});    // (BLK_M, D)

  // ---- global → shared partitions (cp.async) ----
  typename Tr::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr.partition_S(gQ);  // (CPY, CPY_M, CPY_D)
  Tensor tQsQ = gmem_thr.partition_D(sQ);  // (CPY, CPY_M, CPY_D)
  Tensor tKgK = gmem_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D, n)
  Tensor tKsK = gmem_thr.partition_D(sK);  // (CPY, CPY_N, CPY_D)
  Tensor tVgV = gmem_thr.partition_S(gV);  // (CPY, CPY_N, CPY_D, n)
  Tensor tVsV = gmem_thr.partition_D(sV);  // (CPY, CPY_N, CPY_D)
  // Row coordinates of this thread's chunks, for the guarded (ragged) tiles.
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<BlkM, HeadDim>{}));   // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)

  // ---- tensor-core partitions ----
  typename Tr::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);             // (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);             // (MMA, MMA_N, MMA_D)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);  // (MMA, MMA_D, MMA_N)
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D)
  clear(acc_o);

  // ---- shared → register partitions (ldmatrix) ----
  auto smem_copy_q = make_tiled_copy_A(typename Tr::SmemCopyAtomQK{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Tr::SmemCopyAtomQK{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Tr::SmemCopyAtomVt{}, tiled_mma);
  Tensor tSsQ = smem_copy_q.get_thread_slice(tid).partition_S(sQ);    // (CPY, CPY_M, CPY_D)
  Tensor tSsK = smem_copy_k.get_thread_slice(tid).partition_S(sK);    // (CPY, CPY_N, CPY_D)
  Tensor tOsVt = smem_copy_v.get_thread_slice(tid).partition_S(sVt);  // (CPY, CPY_D, CPY_N)
  // This thread's ldmatrix addresses of Q's and K's first k-step (gemm_ss_lines).
  const uint32_t q_addr0 = cast_smem_ptr_to_uint(&tSsQ(0, 0, 0));
  const uint32_t k_addr0 = cast_smem_ptr_to_uint(&tSsK(0, 0, 0));

  // (row, key) of each score this thread holds, as (rows, cols) like the scores themselves.
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<BlkM, BlkN>{}));  // (MMA, MMA_M, MMA_N)
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));         // (rows, cols)

  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax;
  // Softcap: logit = cap·tanh(s·scale / cap), so the softmax sees tanh(·) scaled by cap·log2 e.
  const bool softcap = kSoftcap || (kDropout && mask.softcap > 0.f);
  const float scale_log2 = softcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = softcap ? p.scale / mask.softcap : 0.f;
  const uint32_t bh = uint32_t(blk.b * p.heads_q + blk.h);  // dropout's (batch, head) index

  // ---- mainloop ----
  // One K and one V buffer, loads alternating one step ahead of the math: V(n) lands while
  // S = Q K(n)ᵀ is computed, K(n - 1) while the softmax and O += P V(n) are.
  const int n_begin = blk.n_begin, n_end = blk.n_end;
  if (n_end > n_begin) {
    if (blk.rows < Tr::kBlockM)
      copy_rows<true>(gmem_copy, tQgQ, tQsQ, tQcQ, blk.rows);
    else
      copy_rows<false>(gmem_copy, tQgQ, tQsQ, tQcQ, blk.rows);
    // Only the last tile of keys can run past len_k.
    const int last_rows = len_k - (n_end - 1) * Tr::kBlockN;
    if (last_rows < Tr::kBlockN)
      copy_rows<true>(gmem_copy, tKgK(_, _, _, n_end - 1), tKsK, tKVcKV, last_rows);
    else
      copy_rows<false>(gmem_copy, tKgK(_, _, _, n_end - 1), tKsK, tKVcKV, last_rows);
    cp_async_fence();
  }

  for (int n = n_end - 1; n >= n_begin; --n) {
    const int j0 = n * Tr::kBlockN;
    const int tile_rows = len_k - j0;  // keys of tile n that exist (> kBlockN: all)
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<BlkM, BlkN>{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);

    cp_async_wait<0>();  // K(n) (and Q) have landed ...
    __syncthreads();     // ... for every thread, and every warp is done reading V(n + 1)
    if (tile_rows < Tr::kBlockN)
      copy_rows<true>(gmem_copy, tVgV(_, _, _, n), tVsV, tKVcKV, tile_rows);
    else
      copy_rows<false>(gmem_copy, tVgV(_, _, _, n), tVsV, tKVcKV, tile_rows);
    cp_async_fence();

    if constexpr (Tr::kLineAddressing)
      gemm_ss_lines<Tr::kQTileBytes, Tr::kQBlockBytes, Tr::kKPairBytes, Tr::kKVBlockBytes>(
          tiled_mma, acc_s, tSrQ, tSrK, q_addr0, k_addr0, smem_copy_q, smem_copy_k);
    else
      gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, smem_copy_q, smem_copy_k);

    Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
    if constexpr (kSoftcap || kDropout) {
      if (softcap) {
        CUTE_UNROLL
        for (int e = 0; e < size(s); ++e) s(e) = tanhf(s(e) * softcap_pre);
      }
    }
    // Per-element masking only on the tiles the mask (or the end of the keys) cuts.
    if (tile_rows < Tr::kBlockN ||
        !mask.tile_is_full(blk.i0, blk.i0 + blk.rows, j0, j0 + Tr::kBlockN, len_q, len_k))
      apply_mask(s, tScS_rc, mask, blk.i0, j0, len_q, len_k);

    cp_async_wait<0>();  // V(n) has landed ...
    __syncthreads();     // ... for every thread, and every warp is done reading K(n)
    if (n > n_begin) {   // tiles before the last are whole
      copy_rows<false>(gmem_copy, tKgK(_, _, _, n - 1), tKsK, tKVcKV, Tr::kBlockN);
      cp_async_fence();
    }

    Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
    float rescale[kRows];
    softmax.update(s, scale_log2, rescale);
    OnlineSoftmax<kRows>::rescale_o(o, rescale);
    if constexpr (kDropout) apply_dropout(acc_s, tScS, p.dropout, bh, blk.i0, j0);

    // P stays in registers: rounded to Element, S's accumulator is P V's A operand.
    Tensor rP = round_to<Element>(acc_s);                                    // (MMA, MMA_M, MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_K)
    gemm_rs(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, smem_copy_v);
  }

  // ---- epilogue ----
  Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
  float lse[kRows];
  softmax.finish(o, scale_log2, kDropout ? p.dropout.rescale : 1.f, lse);

  // LSE: the lane holding column 0 of a row writes it.
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<BlkM, HeadDim>{}));  // (MMA, MMA_M, MMA_D)
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));          // (rows, cols)
  if (p.lse != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {
    float* lse_row = p.lse + blk.b * p.lse_batch_stride + blk.h * p.lse_head_stride +
                     blk.seq.start_q + blk.i0;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int i = get<0>(tOcO_rc(r, 0));
      if (i < blk.rows) lse_row[i] = lse[r];
    }
  }

  // O: registers → smem (Q's, which no warp reads any more) → 16-byte global stores.
  Tensor rO = round_to<Element>(acc_o);  // (MMA, MMA_M, MMA_D)
  auto smem_copy_o = make_tiled_copy_C(typename Tr::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_o = smem_copy_o.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_o.retile_S(rO);     // (CPY, CPY_M, CPY_D)
  Tensor taccOsO = smem_thr_o.partition_D(sO);  // (CPY, CPY_M, CPY_D)
  __syncthreads();  // every warp's last read of sQ is behind us
  copy(smem_copy_o, taccOrO, taccOsO);
  __syncthreads();

  typename Tr::GmemTiledCopyO gmem_copy_o;
  auto gmem_thr_o = gmem_copy_o.get_thread_slice(tid);
  Tensor tOsO = gmem_thr_o.partition_S(sO);  // (CPY, CPY_M, CPY_D)
  Tensor tOgO = gmem_thr_o.partition_D(gO);  // (CPY, CPY_M, CPY_D)
  Tensor tOcOg = gmem_thr_o.partition_D(make_identity_tensor(Shape<BlkM, HeadDim>{}));  // (CPY, CPY_M, CPY_D)
  Tensor tOrO = make_tensor<Element>(shape(tOgO));  // (CPY, CPY_M, CPY_D)
  copy(gmem_copy_o, tOsO, tOrO);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOgO); ++m)
    if (get<0>(tOcOg(0, m, 0)) < blk.rows) copy(gmem_copy_o, tOrO(_, m, _), tOgO(_, m, _));
}

// ---- launch ------------------------------------------------------------------------------
template <class Tr, bool kSoftcap, bool kDropout>
Status launch_fwd(const FwdParams& p) {
  const auto kernel = fwd_kernel<Tr, kSoftcap, kDropout>;
  if (Tr::kSmemBytes > 48 * 1024)
    FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Tr::kSmemBytes));
  const dim3 grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads_q, p.batch);
  kernel<<<grid, Tr::kNThreads, Tr::kSmemBytes, static_cast<cudaStream_t>(p.stream)>>>(p);
  FL_CUDA_CHECK_LAUNCH();
  return {};
}

// The per-(dtype, head dim) entry points that fwd_dispatch.cu calls (fwd_instance.h); each
// instantiations/fwd_hdim*_*.cu file instantiates one.
template <DType kDtype, int kHeadDim>
Status FwdInstance<kDtype, kHeadDim>::run(const FwdParams& p) {
  using Tr = typename FwdConfig<kDtype, kHeadDim>::Traits;
  if (p.dropout.enabled()) return launch_fwd<Tr, false, true>(p);
  return p.mask.softcap > 0.f ? launch_fwd<Tr, true, false>(p) : launch_fwd<Tr, false, false>(p);
}
template <DType kDtype, int kHeadDim>
const void* FwdInstance<kDtype, kHeadDim>::kernel() {
  return reinterpret_cast<const void*>(
      fwd_kernel<typename FwdConfig<kDtype, kHeadDim>::Traits, false, false>);
}
template <DType kDtype, int kHeadDim>
int FwdInstance<kDtype, kHeadDim>::smem_bytes() {
  return FwdConfig<kDtype, kHeadDim>::Traits::kSmemBytes;
}

}  // namespace flashlab::sm80
