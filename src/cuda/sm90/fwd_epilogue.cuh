// Epilogue of the Hopper forward, per consumer warpgroup (no barrier across warpgroups):
// O normalized by ℓ, the LSE written by the lane that holds column 0 of a row, O rounded
// and staged through this warpgroup's 64 rows of Q's shared memory (which its own wgmma no
// longer reads and the other warpgroup never reads), then one TMA store of the warpgroup's
// (64, D) box issued by its first thread. Varlen packs the sequences one after another, so a
// partial tile there is written by the threads, 16-byte stores, rows past the sequence
// skipped.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/params.h"
#include "cuda/sm90/fwd_mainloop.cuh"
#include "cuda/sm90/fwd_scheduler.cuh"
#include "cuda/sm90/fwd_softmax.cuh"
#include "cuda/sm90/fwd_traits.h"

namespace flashlab::sm90 {

using namespace cute;

// What the epilogue needs from the host: O's tensor map (built per call in fwd_kernel.cuh)
// and the extents of the tensor it describes, (rows, D, heads, batch).
template <class Tr>
struct EpilogueParams {
  typename Tr::TmaO tma_o;
  int rows, batch;  // varlen: (total_q, 1); else (seqlen_q, batch)
};

// acc_o (MMA, MMA_M, MMA_D): this thread's O accumulator, already divided by ℓ; lse: its rows'
// LSE. ctid: the thread's index among the consumers (0 .. kNConsumerThreads − 1);
// wg = ctid / 128.
// On return this thread's reads and writes of Q's buffer are done; the thread that issued
// the TMA store (ctid % 128 == 0) has also waited for the copy engine's read of the staged
// rows, so once every thread of the warpgroup has returned the buffer is free.
template <class Tr, class AccO, int kRows>
__device__ __forceinline__ void store_output(const FwdParams& p, const EpilogueParams<Tr>& ep,
                                             const FwdBlock& blk, typename Tr::SharedStorage& ss,
                                             AccO const& acc_o, const float (&lse)[kRows],
                                             int ctid) {
  using Element = typename Tr::Element;
  using HeadDim = typename Tr::HeadDim;
  const int wg = ctid / 128;

  typename Tr::TiledMmaPV mma_pv;
  auto thr_pv = mma_pv.get_thread_slice(ctid);

  // ---- LSE ---- (the same lines as sm80/fwd_epilogue.cuh's fwd_epilogue, over a wgmma
  // accumulator; each epilogue keeps its copy so that it reads whole)
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<typename Tr::BlkM, HeadDim>{}));  // (MMA, MMA_M, MMA_D)
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));  // (rows, cols)
  if (p.lse != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {
    float* lse_row = p.lse + blk.b * p.lse_batch_stride + blk.h * p.lse_head_stride +
                     blk.seq.start_q + blk.i0;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int i = get<0>(tOcO_rc(r, 0));
      if (i < blk.rows) lse_row[i] = lse[r];
    }
  }

  // ---- O: registers → shared (this warpgroup's rows of sQ) ----
  Tensor sO = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutO{});  // (BLK_M, D)
  Tensor rO = round_to<Element>(acc_o);   // (MMA, MMA_M, MMA_D)
  Tensor tOsO = thr_pv.partition_C(sO);   // (MMA, MMA_M, MMA_D)
  copy(rO, tOsO);
  Tensor sO_wg = local_tile(sO, Shape<_64, HeadDim>{}, make_coord(wg, _0{}));  // (64, D)
  const int rows_valid = blk.rows - 64 * wg;  // of this warpgroup's 64 (may be <= 0)

  if (!p.varlen || rows_valid >= 64) {
    // ---- O: shared → global, one TMA store ----
    tma_store_fence();  // this thread's writes, before the copy engine reads them
    cutlass::arch::NamedBarrier::sync(128, Tr::kEpilogueBarrier + wg);
    if (ctid % 128 == 0 && rows_valid > 0) {
      const int bq = p.varlen ? 0 : blk.b;  // varlen: one packed "batch", offset by cu_seqlens
      Tensor mO = ep.tma_o.get_tma_tensor(
          make_shape(ep.rows, int(Tr::kHeadDim), p.heads_q, ep.batch));  // (rows, D, heads, batch)
      Tensor mO_seq = domain_offset(make_coord(int(blk.seq.start_q), _0{}), mO(_, _, blk.h, bq));  // (len_q, D)
      Tensor gO = local_tile(mO_seq, Shape<_64, HeadDim>{},
                             make_coord(blk.m_block * Tr::kNConsumerWarpgroups + wg, _0{}));  // (64, D)
      auto [tOgO_t, tOsO_t] = tma_partition(ep.tma_o, Int<0>{}, Layout<_1>{},
                                            group_modes<0, 2>(sO_wg), group_modes<0, 2>(gO));  // (TMA), (TMA)
      copy(ep.tma_o, tOsO_t, tOgO_t);
      tma_store_arrive();
      tma_store_wait<0>();  // the copy engine has read the staged rows
    }
    return;
  }

  // ---- O: shared → global, 16-byte chunks (varlen, a partial tile) ----
  cutlass::arch::NamedBarrier::sync(128, Tr::kEpilogueBarrier + wg);
  const int row0 = blk.i0 + 64 * wg;  // first row of this warpgroup in the sequence
  Element* o_ptr = static_cast<Element*>(p.out) + blk.b * p.o_batch_stride +
                   (blk.seq.start_q + row0) * p.o_row_stride + blk.h * p.o_head_stride;
  Tensor gO = make_tensor(make_gmem_ptr(o_ptr), make_shape(_64{}, HeadDim{}),
                          make_stride(p.o_row_stride, _1{}));  // (64, D)
  typename Tr::GmemTiledCopyO gmem_copy_o;
  auto gmem_thr_o = gmem_copy_o.get_thread_slice(ctid % 128);
  Tensor tOsO_g = gmem_thr_o.partition_S(sO_wg);  // (CPY, CPY_M, CPY_D)
  Tensor tOgO = gmem_thr_o.partition_D(gO);       // (CPY, CPY_M, CPY_D)
  Tensor tOcO_g = gmem_thr_o.partition_D(make_identity_tensor(Shape<_64, HeadDim>{}));  // (CPY, CPY_M, CPY_D)
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOgO); ++m)
    if (get<0>(tOcO_g(0, m, 0)) < rows_valid) copy(gmem_copy_o, tOsO_g(_, m, _), tOgO(_, m, _));
}

}  // namespace flashlab::sm90
