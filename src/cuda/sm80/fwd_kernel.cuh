// The CuTe FlashAttention-2 forward kernel (sm80 path): the layers wired to the CTA's warps,
// and the launch.
//   tile scheduler  cuda/cute_common.cuh  one CTA per (batch, head, query block), the longest
//                                         first, and the key tiles its rows can see
//                                         (cuda::schedule_fwd, shared with the Hopper forward)
//   mainloop        fwd_mainloop.cuh      Q, then K/V tiles: cp.async global → shared,
//                                         ldmatrix → registers, mma.sync
//   softmax         fwd_softmax.cuh       online softmax in exp2 units, masked only on the
//                                         tiles the mask cuts; softcap, dropout
//   epilogue        fwd_epilogue.cuh      normalize O, write LSE, O through shared memory
// Every compile-time choice comes from the traits (fwd_traits.h).
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

#include "common/constants.h"
#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/cute_common.cuh"
#include "cuda/sm80/collective_common.cuh"
#include "cuda/sm80/fwd_epilogue.cuh"
#include "cuda/sm80/fwd_instance.h"
#include "cuda/sm80/fwd_mainloop.cuh"
#include "cuda/sm80/fwd_softmax.cuh"
#include "cuda/sm80/fwd_traits.h"

namespace flashlab::sm80 {

using namespace cute;

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

  const cuda::FwdBlock blk = cuda::schedule_fwd<Tr::kBlockM, Tr::kBlockN>(p);
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
      if (softcap) softcap_scores(s, softcap_pre);
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
    gemm_pv<Element>(tiled_mma, acc_o, acc_s, tOrVt, tOsVt, smem_copy_v);
  }

  // A NaN or Inf in O may be a masked key's V reaching it through 0 · NaN in the MMA: such
  // rows are summed again from global memory (cuda/nonfinite.cuh). The coordinates of O's
  // values are built only inside that out-of-line call (cuda::redo_rows).
  {
    Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
    auto coords_of = [tid] {
      Tensor tOcO = typename Tr::TiledMma{}.get_thread_slice(tid).partition_C(
          make_identity_tensor(Shape<BlkM, HeadDim>{}));
      return make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));  // (rows, cols)
    };
    cuda::redo_nonfinite_rows<Tr>(p, blk, o, coords_of, softmax);
  }

  // ---- epilogue ----
  fwd_epilogue<Tr, kDropout>(p, blk, tid, tiled_mma, acc_o, softmax, scale_log2, sO, gO);
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

// The per-(dtype, head dim) entry points that dispatch.cu calls (fwd_instance.h); each
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
