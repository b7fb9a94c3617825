// The Hopper backward's consumer step at wide head dims (BwdTraitsWide, bwd_traits_wide.h):
// S and dP unswapped (queries on the wgmma M side), dKᵀ and dVᵀ accumulated in registers
// from P and dS in shared memory, dQ in slabs added into the global fp32 accumulator with
// vector reductions. bwd_kernel.cuh's kernel calls bwd_consume_wide when Tr::kWide.
//
// One step (query block m of head h), per consumer warpgroup:
//   S = Q Kᵀ, dP = dO Vᵀ on its keys; P, dS in registers (BwdScores, the mask as in
//   bwd_consume); P and dS rounded and stored by stmatrix; one barrier: every warpgroup's
//   keys are in shared memory;
//   dVᵀ += dOᵀ P, dQ slab 0 = dS K[:, slab 0], dKᵀ += Qᵀ dS issued back to back;
//   when dV and slab 0 are done: dO's stage released, slab 0 reduced into global memory while
//   dK runs; each further slab issued into the same accumulator, waited for and reduced;
//   then Q's stage released (dK was its last reader).
// With two P/dS buffers one barrier per step is enough: buffer b is written again at step
// s + 2, after every warpgroup passed step s + 1's barrier, which each reaches only after
// its step-s MMAs (the last readers of buffer b) completed. With one buffer a second barrier
// before the stores keeps a warpgroup from overwriting P and dS that another still reads.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm90/bwd_scores.cuh"
#include "cuda/sm90/bwd_steps.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"  // warpgroup_gemm_issue, round_to

namespace flashlab::sm90 {

using namespace cute;

// Four fp32 values added into global memory by one 16-byte reduction (no return value).
__device__ __forceinline__ void red_add_v4(float* gmem, float a, float b, float c, float d) {
  asm volatile("red.global.v4.f32.add [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// kp: the kernel's BwdKernelParams<Tr> (bwd_kernel.cuh).
template <class Tr, bool kSoftcap, class KernelParams>
__device__ __forceinline__ void bwd_consume_wide(const KernelParams& kp, typename Tr::SharedStorage& ss,
                                                 typename Tr::PipelineQ& pipeline_q,
                                                 typename Tr::PipelineDo& pipeline_do, const BwdSteps& steps,
                                                 const cuda::SeqInfo& seq, int ctid) {
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kD = Tr::kHeadDim;
  const BwdParams& p = kp.p;
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  using cutlass::arch::NamedBarrier;
  const int n_block = bwd_n_block(kp.p), h_kv = blockIdx.y, b = blockIdx.z;
  const int len_k = seq.len_k;

  auto smem = [](auto* ptr, auto layout) { return make_tensor(make_smem_ptr(ptr), layout); };
  Tensor sQ = smem(ss.q.data(), typename Tr::SmemLayoutQ{});          // (BLK_M, D, STAGES)
  Tensor sDo = smem(ss.dout.data(), typename Tr::SmemLayoutDo{});     // (BLK_M, D, 1)
  Tensor sK = smem(ss.k.data(), typename Tr::SmemLayoutK{});          // (BLK_N, D)
  Tensor sV = smem(ss.v.data(), typename Tr::SmemLayoutV{});          // (BLK_N, D)
  Tensor sP = smem(ss.p.data(), typename Tr::SmemLayoutPdS{});        // (BLK_M, BLK_N, S)
  Tensor sDs = smem(ss.ds.data(), typename Tr::SmemLayoutPdS{});      // (BLK_M, BLK_N, S)
  Tensor sQt = smem(ss.q.data(), typename Tr::SmemLayoutQt{});        // (D, BLK_M, STAGES)
  Tensor sDot = smem(ss.dout.data(), typename Tr::SmemLayoutDot{});   // (D, BLK_M, 1)
  Tensor sKt = smem(ss.k.data(), typename Tr::SmemLayoutKt{});        // (D, BLK_N)
  Tensor sPt = smem(ss.p.data(), typename Tr::SmemLayoutPdSt{});      // (BLK_N, BLK_M, S)
  Tensor sDst = smem(ss.ds.data(), typename Tr::SmemLayoutPdSt{});    // (BLK_N, BLK_M, S)

  typename Tr::TiledMmaSdP mma_sdp;
  typename Tr::TiledMmaDkv mma_dkv;
  typename Tr::TiledMmaDq mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  auto thr_dkv = mma_dkv.get_thread_slice(ctid);
  // The shared-memory operands depend only on the warpgroup: from its first thread's slice,
  // the index broadcast from lane 0, they stay warp-uniform (no per-wgmma R2UR).
  const int wg = __shfl_sync(0xffffffffu, ctid / 128, 0);
  auto wg_sdp = mma_sdp.get_slice(wg * 128);
  auto wg_dkv = mma_dkv.get_slice(wg * 128);
  auto wg_dq = mma_dq.get_slice(wg * 128);
  // P's and dS's stores: the S accumulator's thread layout, rows of 8 keys by stmatrix.
  auto r2s = make_tiled_copy_C(Copy_Atom<typename Tr::StsmPdS, Element>{}, mma_sdp);
  auto r2s_thr = r2s.get_thread_slice(ctid);
  Tensor tSrQ = wg_sdp.partition_fragment_A(sQ);        // (MMA, MMA_M, MMA_D, STAGES)
  Tensor tSrDo = wg_sdp.partition_fragment_A(sDo);      // (MMA, MMA_M, MMA_D, 1)
  Tensor tSrK = wg_sdp.partition_fragment_B(sK);        // (MMA, MMA_N, MMA_D)
  Tensor tSrV = wg_sdp.partition_fragment_B(sV);        // (MMA, MMA_N, MMA_D)
  Tensor tDkvrQt = wg_dkv.partition_fragment_A(sQt);    // (MMA, MMA_D, MMA_M, STAGES)
  Tensor tDkvrDot = wg_dkv.partition_fragment_A(sDot);  // (MMA, MMA_D, MMA_M, 1)
  Tensor tDkvrPt = wg_dkv.partition_fragment_B(sPt);    // (MMA, MMA_N, MMA_M, S)
  Tensor tDkvrDst = wg_dkv.partition_fragment_B(sDst);  // (MMA, MMA_N, MMA_M, S)
  Tensor tDqrDs = wg_dq.partition_fragment_A(sDs);      // (MMA, MMA_M, MMA_N, S)
  // Where this thread's values of S sit, keys first: (key, query), as BwdScores reads them.
  Tensor tScS = thr_sdp.partition_C(
      make_coord_tensor(make_layout(Shape<BlkM, BlkN>{}, make_stride(E<1>{}, E<0>{}))));  // (MMA, MMA_M, MMA_N)
  // And of dKᵀ's and dVᵀ's, also keys first: (key, d) in the (D, BLK_N) tile.
  Tensor tDkvcDkv = thr_dkv.partition_C(
      make_coord_tensor(make_layout(Shape<HeadDim, BlkN>{}, make_stride(E<1>{}, E<0>{}))));  // (MMA, MMA_D, MMA_N)

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<HeadDim, BlkN>{});  // (MMA, MMA_D, MMA_N): dKᵀ
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<HeadDim, BlkN>{});  // dVᵀ
  clear(acc_dk);
  clear(acc_dv);
  // One dQ slab's accumulator, reused by every slab (separate ones let ptxas hoist the next
  // slab's MMA above the reductions and spill).
  Tensor acc_dq = partition_fragment_C(mma_dq, Shape<BlkM, typename Tr::SlabCols>{});  // (MMA, 1, 1)
  constexpr int kSlabValues = decltype(size(acc_dq))::value;
  static_assert(kSlabValues % 4 == 0 && kSlabValues * Tr::kDqSlabs * Tr::kNConsumerThreads == kM * kD,
                "the slabs cover the block, four values per reduction");
  // Slab j's B operand: Kᵀ's rows of the slab's columns, over all keys.
  auto slab_b = [&](int j) {
    return wg_dq.partition_fragment_B(local_tile(sKt, Shape<typename Tr::SlabCols, BlkN>{}, make_coord(j, 0)));
  };
  auto reduce_slab = [&](float* block, int j) {
    warpgroup_fence_operand(acc_dq);
    CUTE_UNROLL
    for (int e = 0; e < kSlabValues; e += 4)
      red_add_v4(block + Tr::dq_slot(ctid, j * kSlabValues + e), acc_dq(e), acc_dq(e + 1), acc_dq(e + 2),
                 acc_dq(e + 3));
    warpgroup_fence_operand(acc_dq);
  };

  typename Tr::PipelineQ::PipelineState state_q;     // stage 0, phase 0
  typename Tr::PipelineDo::PipelineState state_do;
  if (steps.total > 0) cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_kv, 0);
  if (p.varlen && steps.total > 0 && (n_block + 1) * kN > len_k) bwd_zero_rows<Tr>(len_k - n_block * kN, ctid, sK, sV);
  for (int s = 0; s < steps.total; ++s) {
    const int st_q = state_q.index(), st_do = state_do.index();
    const int pds = Tr::kStagesPdS == 2 ? s % 2 : 0;  // the P/dS buffer
    const int h = steps.head(s, h_kv, p.group), m = steps.m_block(s);
    // The A operands of this step's stages (the issue takes them by reference).
    Tensor tSrQ_st = tSrQ(_, _, _, st_q), tSrDo_st = tSrDo(_, _, _, st_do);            // (MMA, MMA_M, MMA_D)
    Tensor tDkvrQt_st = tDkvrQt(_, _, _, st_q), tDkvrDot_st = tDkvrDot(_, _, _, st_do);  // (MMA, MMA_D, MMA_M)
    Tensor tDqrDs_b = tDqrDs(_, _, _, pds);                                               // (MMA, MMA_M, MMA_N)
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<BlkM, BlkN>{});   // (MMA, MMA_M, MMA_N): S
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<BlkM, BlkN>{});  // dP
    pipeline_q.consumer_wait(state_q);
    if (const int i0 = m * kM; p.varlen && i0 + kM > seq.len_q) {  // a ragged last block
      pipeline_do.consumer_wait(state_do);
      bwd_zero_rows<Tr>(seq.len_q - i0, ctid, sQ(_, _, st_q), sDo(_, _, st_do));
    }
    warpgroup_gemm_issue<true>(mma_sdp, tSrQ_st, tSrK, acc_s);
    pipeline_do.consumer_wait(state_do);
    warpgroup_gemm_issue<true>(mma_sdp, tSrDo_st, tSrV, acc_dp);
    const BwdScores<Tr> scores(p, seq, ss.lse_log2.data() + st_q * kM, ss.dsum.data() + st_do * kM, m * kM,
                               n_block * kN);
    scores.template form<kSoftcap>(acc_s, acc_dp, tScS);
    Tensor rP = round_to<Element>(acc_s);    // (MMA, MMA_M, MMA_N)
    Tensor rDs = round_to<Element>(acc_dp);  // (MMA, MMA_M, MMA_N)

    // P and dS to shared memory, where every warpgroup's dKᵀ, dVᵀ and dQ read all keys.
    if constexpr (Tr::kStagesPdS == 1) NamedBarrier::sync(Tr::kNConsumerThreads, Tr::kDsBarrier);
    cute::copy(r2s, r2s_thr.retile_S(rP), r2s_thr.partition_D(sP(_, _, pds)));
    cute::copy(r2s, r2s_thr.retile_S(rDs), r2s_thr.partition_D(sDs(_, _, pds)));
    cutlass::arch::fence_view_async_shared();
    NamedBarrier::sync(Tr::kNConsumerThreads, Tr::kDsBarrier);

    // dVᵀ += dOᵀ P, dQ slab 0, dKᵀ += Qᵀ dS.
    warpgroup_gemm_issue<false>(mma_dkv, tDkvrDot_st, tDkvrPt(_, _, _, pds), acc_dv);
    warpgroup_gemm_issue<true>(mma_dq, tDqrDs_b, slab_b(0), acc_dq);
    warpgroup_gemm_issue<false>(mma_dkv, tDkvrQt_st, tDkvrDst(_, _, _, pds), acc_dk);

    warpgroup_wait_for<1>(acc_dq, acc_dv);  // dV (the last reader of dO) and slab 0 are done
    pipeline_do.consumer_release(state_do);
    ++state_do;
    float* block = kp.ws.dq_accum + (kp.ws.row(p, seq, b, h) + int64_t(m) * kM) * kD;
    reduce_slab(block, 0);  // while dK runs
    CUTE_UNROLL
    for (int j = 1; j < Tr::kDqSlabs; ++j) {
      warpgroup_gemm_issue<true>(mma_dq, tDqrDs_b, slab_b(j), acc_dq);
      warpgroup_wait_for<0>(acc_dq);
      reduce_slab(block, j);
    }
    warpgroup_wait_for<0>(acc_dk);  // dK (the last reader of Q) is done
    pipeline_q.consumer_release(state_q);
    ++state_q;
  }

  bwd_store_dkv<Tr>(p, seq, n_block, acc_dk, acc_dv, tDkvcDkv);  // dK = scale · Σ Qᵀ dS, dV
}

}  // namespace flashlab::sm90
