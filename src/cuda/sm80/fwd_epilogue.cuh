// The forward's epilogue (sm80 path): normalize and store. O is divided by the row sums (and
// by 1 − p under dropout), each row's LSE is written by the lane holding its column 0, and O
// is rounded to the input type and leaves through shared memory (Q's bytes, which no warp
// reads any more) as 16-byte row stores: the C fragment's 4-byte pieces would otherwise be
// scattered stores.
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "cuda/cute_common.cuh"
#include "cuda/sm80/collective_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

// acc_o (MMA, MMA_M, MMA_D): O's accumulator; softmax: the rows' running max and sum;
// sO (BLK_M, D): the smem tile O is staged in; gO (BLK_M, D): this CTA's rows of O.
template <class Tr, bool kDropout, class TiledMma, class AccO, class Softmax, class SO, class GO>
__device__ __forceinline__ void fwd_epilogue(const FwdParams& p, const cuda::FwdBlock& blk,
                                             int tid, TiledMma const& tiled_mma, AccO& acc_o,
                                             Softmax& softmax, float scale_log2, SO& sO, GO& gO) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;

  Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
  float lse[kRows];
  softmax.finish(o, scale_log2, kDropout ? p.dropout.rescale : 1.f, lse);

  // LSE: the lane holding column 0 of a row writes it. sm90/fwd_epilogue.cuh's store_output
  // has the same lines over its wgmma accumulator, a different layout type behind the same
  // calls; each epilogue keeps its copy so that it reads whole.
  auto thr_mma = tiled_mma.get_thread_slice(tid);
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

  // O: registers → smem → 16-byte global stores.
  Tensor rO = round_to<Element>(acc_o);  // (MMA, MMA_M, MMA_D)
  auto smem_copy_o = make_tiled_copy_C(typename Tr::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_o = smem_copy_o.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_o.retile_S(rO);     // (CPY, CPY_M, CPY_D)
  Tensor taccOsO = smem_thr_o.partition_D(sO);  // (CPY, CPY_M, CPY_D)
  __syncthreads();  // every warp's last read of sQ is behind us
  copy(smem_copy_o, taccOrO, taccOsO);
  __syncthreads();

  store_rows(typename Tr::GmemTiledCopyO{}, tid, sO, gO, blk.rows);
}

}  // namespace flashlab::sm80
