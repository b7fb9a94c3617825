// The backward's epilogue (sm80 path): scale, round and store the gradients. dQ leaves in the
// postprocess, once every key block has added into its fp32 accumulator: each thread reads
// the float4s it held in the main kernel, scales them (dS came unscaled), rounds them to the
// input type, and the block leaves through shared memory as 16-byte row stores. dK and dV
// leave the main kernel once, after its last query block, the same way (the end of
// bwd_kernel.cuh's main kernel, where they are computed).
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_workspace.cuh"
#include "cuda/sm80/collective_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

// ---- dQ (the postprocess) ----------------------------------------------------------------
// One query block by the postprocess kernel's CTA (grid (ceil(seqlen_q / kBlockM), heads_q,
// batch), the main kernel's kNThreads threads): thread t's loads are the float4s it held
// (DqChunk: 512 contiguous bytes per warp load), rounded in the same dQ fragment layout;
// rows past the sequence's end are not stored.
template <class Tr>
__device__ __forceinline__ void store_dq(const BwdParams& p, const BwdWorkspace& ws) {
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
  store_rows(typename Tr::GmemTiledCopydKV{}, tid, sdQ, gdQ, rows);
}

}  // namespace flashlab::sm80
