// The Hopper backward kernel (`cute_fa3`'s backward, sm_90a) and its launch: preprocess,
// main kernel, postprocess (bwd_rows.cuh), on the caller's stream.
//
// One CTA per (key block of 128 keys, KV head, batch entry; varlen: one per key block that
// exists, or in the deterministic mode per key block of the longest sequence: BwdTile in
// bwd_steps.cuh), at head dims up to 128: warpgroup 0's first thread
// loads K and V once (one mbarrier) and then, per step, Q and dO with their rows' LSE and D
// through two TMA rings; warpgroups 1 and 2 each own 64 of the keys and, per step, run the
// five MMAs of bwd_traits.h, keeping dK and dV in registers until the end. A step is one
// query block of one query head of the KV head's group (GQA: the group's heads one after
// another), and only the blocks whose rows see the CTA's keys (causal, windows). Each
// step's dQ goes through shared memory to warpgroup 0's second warp, which adds it to the
// fp32 accumulator with one bulk reduce-add per consumer warpgroup's half, each issued as
// soon as that half is stored; the postprocess scales and rounds it. P and dS from the
// scores, and the dK/dV epilogue: bwd_scores.cuh.
//
// Deterministic mode: the dQ warp adds each query block's partial sums in a fixed order of
// key blocks (ascending, or descending under a right bound), through a turn counter per
// (batch, head, query block) (bwd_steps.cuh).
//
// Head dims 192 and 256 (BwdTraitsWide) run another consumer step, bwd_consume_wide
// (bwd_wide.cuh): S and dP unswapped, P and dS through shared memory, dQ added from registers
// by vector reductions, so no dQ warp. What this version leaves out: head dims other than 64,
// 96, 128, 192 and 256, the deterministic mode at 192 and 256 (both refused in bwd_dispatch.cu)
// and dropout (the registry entry takes none, so the API's dispatch refuses it).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm90/bwd_instance.h"
#include "cuda/sm90/bwd_rows.cuh"
#include "cuda/sm90/bwd_scores.cuh"
#include "cuda/sm90/bwd_steps.cuh"
#include "cuda/sm90/bwd_traits.h"
#include "cuda/sm90/bwd_wide.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"  // warpgroup_gemm_issue, acc_as_a_operand, round_to

namespace flashlab::sm90 {

using namespace cute;

template <class Tr>
struct BwdKernelParams {
  BwdParams p;
  typename Tr::TmaQ tma_q;
  typename Tr::TmaQ tma_do;
  typename Tr::TmaK tma_k;
  typename Tr::TmaV tma_v;
  BwdRows ws;
  int q_rows, kv_rows, batch;  // the tensor maps' extents: varlen (total_q, total_k, 1)
};

// One bulk reduce-add of `bytes` from shared to global memory (fp32), in the issuing
// thread's bulk async-group.
__device__ __forceinline__ void bulk_reduce_add(float* gmem, const float* smem, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}

// ---- producer warp 0 (one thread): K and V once, then Q with its LSE and dO with its D ----
template <class Tr, class Tile>
__device__ __forceinline__ void bwd_load(const BwdKernelParams<Tr>& kp, typename Tr::SharedStorage& ss,
                                         typename Tr::PipelineQ& pipeline_q,
                                         typename Tr::PipelineDo& pipeline_do, const BwdSteps& steps,
                                         const cuda::SeqInfo& seq, const Tile& tile) {
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kM = Tr::kBlockM;
  const BwdParams& p = kp.p;
  const int n_block = tile.n_block(kp.p), h_kv = tile.h_kv(), b = tile.b();
  const int D = Tr::kHeadDim;
  // Varlen: every sequence packed in rows, one "batch", offset by the sequence's start.
  const int bq = p.varlen ? 0 : b;
  Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(kp.q_rows, D, p.heads_q, kp.batch));
  Tensor mDo = kp.tma_do.get_tma_tensor(make_shape(kp.q_rows, D, p.heads_q, kp.batch));
  Tensor mK = kp.tma_k.get_tma_tensor(make_shape(kp.kv_rows, D, p.heads_kv, kp.batch));
  Tensor mV = kp.tma_v.get_tma_tensor(make_shape(kp.kv_rows, D, p.heads_kv, kp.batch));
  Tensor mK_seq = domain_offset(make_coord(int(seq.start_k), _0{}), mK(_, _, h_kv, bq));  // (len_k, D)
  Tensor mV_seq = domain_offset(make_coord(int(seq.start_k), _0{}), mV(_, _, h_kv, bq));  // (len_k, D)
  Tensor gK = local_tile(mK_seq, Shape<BlkN, HeadDim>{}, make_coord(n_block, _0{}));  // (BLK_N, D)
  Tensor gV = local_tile(mV_seq, Shape<BlkN, HeadDim>{}, make_coord(n_block, _0{}));  // (BLK_N, D)

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{});      // (BLK_M, D, STAGES)
  Tensor sDo = make_tensor(make_smem_ptr(ss.dout.data()), typename Tr::SmemLayoutDo{});  // (BLK_M, D, STAGES)
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});      // (BLK_N, D)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutV{});      // (BLK_N, D)
  auto [tKgK, tKsK] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));  // (TMA), (TMA)
  auto [tVgV, tVsV] = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));  // (TMA), (TMA)

  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_kv, 2 * Tr::kTmaBytesKV);
  copy(kp.tma_k.with(ss.barrier_kv), tKgK, tKsK);
  copy(kp.tma_v.with(ss.barrier_kv), tVgV, tVsV);
  // K and V are the caller's; LSE and D are the preprocess's, which may still be running.
  cuda::wait_for_prior_grid();
  auto state_q = cutlass::make_producer_start_state<typename Tr::PipelineQ>();
  auto state_do = cutlass::make_producer_start_state<typename Tr::PipelineDo>();
  // One ring stage: a (BLK_M, D) tile by TMA and its rows' LSE (or D) by a bulk copy, both
  // on the stage's barrier.
  auto load = [&](auto& pipeline, auto& state, const auto& tma, const auto& src, const auto& dst,
                  const float* rows_src, float* rows_dst) {
    pipeline.producer_acquire(state);
    uint64_t* bar = pipeline.producer_get_barrier(state);
    copy(tma.with(*bar), src, dst(_, state.index()));
    SM90_BULK_COPY_G2S::copy(rows_src, bar, rows_dst + state.index() * kM, Tr::kRowBytes);
    ++state;
  };
  for (int s = 0; s < steps.total; ++s) {
    const int h = steps.head(s, h_kv, p.group), m = steps.m_block(s);
    Tensor mQ_seq = domain_offset(make_coord(int(seq.start_q), _0{}), mQ(_, _, h, bq));    // (len_q, D)
    Tensor mDo_seq = domain_offset(make_coord(int(seq.start_q), _0{}), mDo(_, _, h, bq));  // (len_q, D)
    Tensor gQ = local_tile(mQ_seq, Shape<BlkM, HeadDim>{}, make_coord(m, _0{}));    // (BLK_M, D)
    Tensor gDo = local_tile(mDo_seq, Shape<BlkM, HeadDim>{}, make_coord(m, _0{}));  // (BLK_M, D)
    auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(gQ));  // (TMA), (TMA, STAGES)
    auto [tDogDo, tDosDo] = tma_partition(kp.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sDo),
                                          group_modes<0, 2>(gDo));  // (TMA), (TMA, STAGES)
    const int64_t rows = kp.ws.row(p, seq, b, h) + int64_t(m) * kM;
    load(pipeline_q, state_q, kp.tma_q, tQgQ, tQsQ, kp.ws.lse_log2 + rows, ss.lse_log2.data());
    load(pipeline_do, state_do, kp.tma_do, tDogDo, tDosDo, kp.ws.dsum + rows, ss.dsum.data());
  }
}

// ---- producer warp 1: each step's dQ from shared memory into the fp32 accumulator -------
template <class Tr, class Tile>
__device__ __forceinline__ void bwd_store_dq(const BwdKernelParams<Tr>& kp, typename Tr::SharedStorage& ss,
                                             const BwdSteps& steps, const cuda::SeqInfo& seq,
                                             const Tile& tile) {
  using cutlass::arch::NamedBarrier;
  constexpr int kHalf = Tr::kDqHalf;  // floats of one consumer warpgroup's dQ
  const int n_block = tile.n_block(kp.p), h_kv = tile.h_kv(), b = tile.b();
  const bool leader = threadIdx.x % 32 == 0;
  const bool ordered = !Tile::kCompact && kp.ws.dq_turn != nullptr;  // the compact grid is never deterministic
  cuda::wait_for_prior_grid();  // the preprocess cleared the accumulator (and the turns)
  for (int wg = 0; wg < 2; ++wg) NamedBarrier::arrive(Tr::kDqBarrierThreads, Tr::dq_empty_barrier(wg));
  for (int s = 0; s < steps.total; ++s) {
    // The step's turn (deterministic), found while the consumers still compute its dQ.
    const int mine = ordered && leader ? bwd_turn(kp.p, seq, n_block, steps.m_block(s), Tr::kBlockM,
                                                  Tr::kBlockN)
                                       : 0;
    int* turn = nullptr;
    float* dst = nullptr;
    if (leader) {
      const int h = steps.head(s, h_kv, kp.p.group), m = steps.m_block(s);
      dst = kp.ws.dq_accum + (kp.ws.row(kp.p, seq, b, h) + int64_t(m) * Tr::kBlockM) * Tr::kHeadDim;
      turn = ordered ? kp.ws.turn(kp.p, seq, b, h, m) : nullptr;
      if (ordered) {  // wait for the earlier key blocks' adds to be done and visible
        while (cuda::load_acquire(turn) != mine) __nanosleep(64);
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
      }
    }
    // Each warpgroup's half as soon as it is there: one bulk reduce-add (one group) each.
    // The warp converges before each barrier (the leader may have spun on its turn).
    __syncwarp();
    for (int wg = 0; wg < 2; ++wg) {
      NamedBarrier::sync(Tr::kDqBarrierThreads, Tr::dq_full_barrier(wg));
      if (leader) {
        bulk_reduce_add(dst + wg * kHalf, ss.dq.data() + wg * kHalf, kHalf * int(sizeof(float)));
        tma_store_arrive();
      }
      __syncwarp();
    }
    // Each half free again once read: the first group, then both.
    if (leader) tma_store_wait<1>();
    __syncwarp();
    if (s + 1 < steps.total) NamedBarrier::arrive(Tr::kDqBarrierThreads, Tr::dq_empty_barrier(0));
    if (leader) tma_store_wait<0>();
    __syncwarp();
    if (s + 1 < steps.total) NamedBarrier::arrive(Tr::kDqBarrierThreads, Tr::dq_empty_barrier(1));
    if (ordered && leader) {  // this block's add is written before the next one may start
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
      asm volatile("fence.proxy.async.global;\n" ::: "memory");
      cuda::add_release(turn, 1);
    }
  }
  if (leader) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // and written
}

// ---- consumers: warpgroups 1 and 2 ----------------------------------------------------------
template <class Tr, bool kSoftcap, class Tile>
__device__ __forceinline__ void bwd_consume(const BwdKernelParams<Tr>& kp, typename Tr::SharedStorage& ss,
                                            typename Tr::PipelineQ& pipeline_q,
                                            typename Tr::PipelineQ& pipeline_do, const BwdSteps& steps,
                                            const cuda::SeqInfo& seq, const Tile& tile, int ctid) {
  using cutlass::arch::NamedBarrier;
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN;
  const BwdParams& p = kp.p;
  const int n_block = tile.n_block(kp.p);
  const int len_k = seq.len_k;

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{});       // (BLK_M, D, STAGES)
  Tensor sDo = make_tensor(make_smem_ptr(ss.dout.data()), typename Tr::SmemLayoutDo{});  // (BLK_M, D, STAGES)
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});       // (BLK_N, D)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutV{});       // (BLK_N, D)
  Tensor sDs = make_tensor(make_smem_ptr(ss.ds.data()), typename Tr::SmemLayoutDs{});    // (BLK_M, BLK_N, STAGES)
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQt{});     // (D, BLK_M, STAGES)
  Tensor sDot = make_tensor(make_smem_ptr(ss.dout.data()), typename Tr::SmemLayoutDot{});  // (D, BLK_M, STAGES)
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutKt{});     // (D, BLK_N)
  Tensor sDst = make_tensor(make_smem_ptr(ss.ds.data()), typename Tr::SmemLayoutDst{});  // (BLK_N, BLK_M, STAGES)

  typename Tr::TiledMmaSdP mma_sdp;
  typename Tr::TiledMmaDkv mma_dkv;
  typename Tr::TiledMmaDq mma_dq;
  // The shared-memory operands (descriptors) depend only on the warpgroup: built from its
  // first thread's slice, with the index broadcast from lane 0, the compiler sees a
  // warp-uniform value and keeps the descriptors in uniform registers (from a per-thread
  // index it builds them in vector registers and moves each one with R2UR before its wgmma).
  // The accumulators' slices stay per thread.
  const int wg = __shfl_sync(0xffffffffu, ctid / 128, 0);
  auto wg_sdp = mma_sdp.get_slice(wg * 128);
  auto wg_dkv = mma_dkv.get_slice(wg * 128);
  auto wg_dq = mma_dq.get_slice(wg * 128);  // both dQ splits put thread t in warpgroup t / 128
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  // dS's store: the Sᵀ accumulator's thread layout, transposed into shared memory by stmatrix.
  auto r2s_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_sdp);
  auto r2s_ds_thr = r2s_ds.get_thread_slice(ctid);
  Tensor tSrK = wg_sdp.partition_fragment_A(sK);     // (MMA, MMA_N, MMA_D)
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);     // (MMA, MMA_N, MMA_D)
  Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);     // (MMA, MMA_M, MMA_D, STAGES)
  Tensor tSrDo = wg_sdp.partition_fragment_B(sDo);   // (MMA, MMA_M, MMA_D, STAGES)
  Tensor tDkvrQt = wg_dkv.partition_fragment_B(sQt);    // (MMA, MMA_D, MMA_M, STAGES)
  Tensor tDkvrDot = wg_dkv.partition_fragment_B(sDot);  // (MMA, MMA_D, MMA_M, STAGES)
  Tensor tDqrDs = wg_dq.partition_fragment_A(sDs);      // (MMA, MMA_M, MMA_N, STAGES)
  Tensor tDqrKt = wg_dq.partition_fragment_B(sKt);      // (MMA, MMA_D, MMA_N)
  // Where this thread's values of Sᵀ sit: (key, query) in the (BLK_N, BLK_M) tile.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlkN, BlkM>{}));  // (MMA, MMA_N, MMA_M)

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<BlkN, HeadDim>{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<BlkN, HeadDim>{});
  clear(acc_dk);
  clear(acc_dv);

  typename Tr::PipelineState state_q, state_do;  // stage 0, phase 0
  if (steps.total > 0) cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_kv, 0);
  if (p.varlen && steps.total > 0 && (n_block + 1) * kN > len_k) bwd_zero_rows<Tr>(len_k - n_block * kN, ctid, sK, sV);
  // m_blk: the step's query block, steps.m_block(s) counted along (no division per step).
  const int m_last = steps.m_begin + steps.per_head - 1;
  for (int s = 0, m_blk = steps.m_begin; s < steps.total; ++s, m_blk = m_blk == m_last ? steps.m_begin : m_blk + 1) {
    const int st = state_q.index();  // the Q and dO rings advance together
    const int ds_st = s % Tr::kStages;
    const int i0 = m_blk * kM;
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<BlkN, BlkM>{});   // (MMA, MMA_N, MMA_M): Sᵀ
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<BlkN, BlkM>{});  // dPᵀ
    pipeline_q.consumer_wait(state_q);
    if (p.varlen && i0 + kM > seq.len_q) {  // a ragged last block
      pipeline_do.consumer_wait(state_do);
      bwd_zero_rows<Tr>(seq.len_q - i0, ctid, sQ(_, _, st), sDo(_, _, st));
    }
    warpgroup_gemm_issue<true, true>(mma_sdp, tSrK, tSrQ(_, _, _, st), acc_s);
    const BwdScores<Tr> scores(p, seq, ss.lse_log2.data() + st * kM, ss.dsum.data() + st * kM, i0, n_block * kN);
    float lse[Tr::kLseInRegisters ? decltype(size(acc_s))::value : 1];
    if constexpr (Tr::kLseInRegisters) scores.gather(scores.lse_log2, tScS, lse);  // while S runs
    pipeline_do.consumer_wait(state_do);
    warpgroup_gemm_issue<true, true>(mma_sdp, tSrV, tSrDo(_, _, _, st), acc_dp);
    if constexpr (Tr::kLseInRegisters) scores.template form<kSoftcap>(acc_s, acc_dp, tScS, lse);
    else scores.template form<kSoftcap>(acc_s, acc_dp, tScS);
    Tensor rP = round_to<Element>(acc_s);    // (MMA, MMA_N, MMA_M)
    Tensor rDs = round_to<Element>(acc_dp);  // (MMA, MMA_N, MMA_M)

    // dV += Pᵀ dO, Pᵀ from registers.
    Tensor tPrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));
    warpgroup_gemm_issue<false, true>(mma_dkv, tPrP, tDkvrDot(_, _, _, st), acc_dv);

    // dS to shared memory, where both warpgroups' dQ MMAs read all keys of it: stmatrix.trans,
    // four 8×8 tiles per instruction, each register tile's columns (8 keys of one query)
    // stored as one 16-byte row of the key-contiguous dS.
    Tensor tDssDs = r2s_ds_thr.partition_D(sDst(_, _, ds_st));  // (CPY, CPY_N, CPY_M)
    cute::copy(r2s_ds, r2s_ds_thr.retile_S(rDs), tDssDs);
    cutlass::arch::fence_view_async_shared();
    NamedBarrier::sync(Tr::kNConsumerThreads, Tr::kDsBarrier);

    // dQ = dS K (this warpgroup's half: of the head dim, or of the rows; bwd_traits.h), then
    // dK += dSᵀ Q.
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D)
    Tensor tDqrDs_st = tDqrDs(_, _, _, ds_st);  // (MMA, MMA_M, MMA_N)
    warpgroup_gemm_issue<true, true>(mma_dq, tDqrDs_st, tDqrKt, acc_dq);
    Tensor tDsrDs = make_tensor(rDs.data(), acc_as_a_operand(rDs.layout()));
    warpgroup_gemm_issue<false, true>(mma_dkv, tDsrDs, tDkvrQt(_, _, _, st), acc_dk);

    warpgroup_wait_for<1>(acc_dq);  // dV (the last reader of dO) and dQ are done
    pipeline_do.consumer_release(state_do);
    ++state_do;
    // dQ into this warpgroup's half of the shared stage (free once the dQ warp's last bulk
    // reduce of it has read it).
    NamedBarrier::sync(Tr::kDqBarrierThreads, Tr::dq_empty_barrier(wg));
    static_assert(decltype(size(acc_dq))::value % 4 == 0 && decltype(size(acc_dq))::value * 128 == Tr::kDqHalf);
    CUTE_UNROLL
    for (int e = 0; e < size(acc_dq); e += 4)
      *reinterpret_cast<float4*>(ss.dq.data() + Tr::dq_slot(ctid, e)) =
          make_float4(acc_dq(e), acc_dq(e + 1), acc_dq(e + 2), acc_dq(e + 3));
    cutlass::arch::fence_view_async_shared();
    NamedBarrier::arrive(Tr::kDqBarrierThreads, Tr::dq_full_barrier(wg));
    warpgroup_wait_for<0>(acc_dk);  // dK (the last reader of Q) is done
    pipeline_q.consumer_release(state_q);
    ++state_q;
  }

  // dK = scale · Σ dSᵀ Q and dV, staged in K's and V's tiles once both warpgroups' MMAs are done.
  NamedBarrier::sync(Tr::kNConsumerThreads, Tr::kEpilogueBarrier);
  bwd_store_dkv_staged<Tr>(p, seq, tile, n_block, acc_dk, acc_dv, mma_dkv, sK, sV, ctid);
}

// ---- the kernel --------------------------------------------------------------------------
// grid (ceil(seqlen_k / kBlockN), heads_kv, batch), or with kCompact (varlen, not
// deterministic) (bwd_varlen_blocks, heads_kv): one CTA per key block that exists
// (bwd_steps.cuh). kNThreads threads, one CTA per SM. Two kernels per grid, with and without
// softcap: a runtime branch between the two elementwise schedules kept both in the consumer
// loop, past its 240 registers at head dim 64.
template <class Tr, bool kSoftcap, bool kCompact = false>
__global__ void __launch_bounds__(Tr::kNThreads, 1)
    bwd_kernel(const __grid_constant__ BwdKernelParams<Tr> kp) {
  using PipelineQ = typename Tr::PipelineQ;
  extern __shared__ __align__(1024) unsigned char smem[];
  auto& ss = *reinterpret_cast<typename Tr::SharedStorage*>(smem);
  const auto tile = [&] {
    if constexpr (kCompact)
      return bwd_varlen_tile(kp.p, Tr::kBlockN);
    else
      return BwdGridTile{};
  }();
  if constexpr (kCompact)
    if (tile.b() < 0) return;  // past the real count of key blocks: the whole CTA, before any barrier
  const int warp_group = cutlass::canonical_warp_group_idx();
  const bool producer = warp_group == 0;
  const cuda::SeqInfo seq = cuda::seq_info(kp.p, tile.b());
  const BwdSteps steps(kp.p, seq, tile.n_block(kp.p), Tr::kBlockM, Tr::kBlockN);

  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_kv, 1);
    cuda::allow_dependents();  // the postprocess may be scheduled once every CTA here runs
    if (steps.total > 0) {  // the four tensor maps into the descriptor cache before their first copy
      cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
      cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    }
  }
  // A stage holds a tile and its rows' LSE (or D).
  constexpr uint32_t kStageBytes = Tr::kTmaBytesQ + Tr::kRowBytes;
  PipelineQ pipeline_q(ss.pipeline_q, tma_pipeline_params<PipelineQ>(producer, kStageBytes, Tr::kNConsumerThreads),
                       Shape<_1, _1, _1>{});
  typename Tr::PipelineDo pipeline_do(
      ss.pipeline_do, tma_pipeline_params<typename Tr::PipelineDo>(producer, kStageBytes, Tr::kNConsumerThreads),
      Shape<_1, _1, _1>{});
  __syncthreads();

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Tr::kProducerRegs>();
    const int warp = cutlass::canonical_warp_idx_sync();
    if (warp == 0 && threadIdx.x == 0) {
      if (steps.total > 0)
        bwd_load<Tr>(kp, ss, pipeline_q, pipeline_do, steps, seq, tile);
      else  // still wait: this grid's end then implies the preprocess's, which the postprocess relies on
        cuda::wait_for_prior_grid();
    }
    if constexpr (!Tr::kDqAtomic)
      if (warp == 1 && steps.total > 0) bwd_store_dq<Tr>(kp, ss, steps, seq, tile);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Tr::kConsumerRegs>();
    if constexpr (Tr::kWide)
      bwd_consume_wide<Tr, kSoftcap>(kp, ss, pipeline_q, pipeline_do, steps, seq, int(threadIdx.x) - 128);
    else
      bwd_consume<Tr, kSoftcap>(kp, ss, pipeline_q, pipeline_do, steps, seq, tile, int(threadIdx.x) - 128);
  }
}

// grid (ceil(seqlen_q / kBlockM), heads_q, batch), kNConsumerThreads threads: block m of
// the accumulator, read through the consumers' dq_slot map (16-byte loads), transposed to rows
// in shared memory, scaled and rounded into dQ, 8 values per 16-byte store where dQ's rows
// allow it. Past head dim 128 the staged tile would pass the 48 KiB of static shared memory,
// so it is staged in column parts: the fragment's repeats along the head dim, one part's
// (kParts of them) at a time.
template <class Tr>
__global__ void __launch_bounds__(Tr::kNConsumerThreads)
    bwd_postprocess_kernel(const __grid_constant__ BwdParams p, BwdRows ws) {
  using Element = typename Tr::Element;
  constexpr int kM = Tr::kBlockM, kD = Tr::kHeadDim, kThreads = Tr::kNConsumerThreads;
  // Column parts where the whole padded tile passes 48 KiB and the fragment's repeats along
  // the head dim split in two (256); else one part, unpadded if only that fits (192).
  constexpr int kStatic = 48 * 1024, kReps = kD / decltype(tile_size<1>(typename Tr::TiledMmaDq{}))::value;
  constexpr int kParts = kM * (kD + 4) * 4 > kStatic && kReps % 2 == 0 ? 2 : 1, kCols = kD / kParts;
  constexpr int kLd = kM * (kCols + 4) * 4 <= kStatic ? kCols + 4 : kCols;  // a staged row (16-byte aligned)
  __shared__ __align__(16) float tile[kM * kLd];
  cuda::wait_for_prior_grid();  // the main kernel's adds are done
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
  const cuda::SeqInfo seq = cuda::seq_info(p, b);
  if (m * kM >= seq.len_q) return;  // varlen: a sequence shorter than the longest
  typename Tr::TiledMmaDq mma_dq;
  Tensor c = mma_dq.get_thread_slice(t).partition_C(
      make_identity_tensor(Shape<typename Tr::BlkM, typename Tr::HeadDim>{}));  // (MMA, MMA_M, MMA_D)
  // Part q is the fragment's values [q, q + 1)·kPerPart: its repeats along the head dim that
  // cover columns [q·kCols, (q + 1)·kCols).
  constexpr int kPerPart = decltype(size(c))::value / kParts;
  static_assert(decltype(size<2>(c))::value % kParts == 0 &&
                    decltype(tile_size<1>(mma_dq))::value * (decltype(size<2>(c))::value / kParts) == kCols,
                "a part is whole repeats of the dQ MMA's columns");
  const float* acc = ws.dq_accum + (ws.row(p, seq, b, h) + int64_t(m) * kM) * kD;
  static_assert(kM * kCols / 8 % kThreads == 0, "every thread stores the same number of 8-value chunks");
  CUTE_UNROLL
  for (int part = 0; part < kParts; ++part) {
    if (part > 0) __syncthreads();  // the previous part has been stored
    CUTE_UNROLL
    for (int e = part * kPerPart; e < (part + 1) * kPerPart; e += 4) {
      const float4 v = *reinterpret_cast<const float4*>(acc + Tr::dq_slot(t, e));
      const int c0 = part * kCols;
      tile[get<0>(c(e)) * kLd + get<1>(c(e)) - c0] = v.x;
      tile[get<0>(c(e + 1)) * kLd + get<1>(c(e + 1)) - c0] = v.y;
      tile[get<0>(c(e + 2)) * kLd + get<1>(c(e + 2)) - c0] = v.z;
      tile[get<0>(c(e + 3)) * kLd + get<1>(c(e + 3)) - c0] = v.w;
    }
    __syncthreads();
    Element* dq = static_cast<Element*>(p.dq) + b * p.dq_batch_stride + seq.start_q * p.dq_row_stride +
                  h * p.dq_head_stride;
    const bool vec = reinterpret_cast<uintptr_t>(dq) % 16 == 0 && p.dq_row_stride % 8 == 0;
    CUTE_UNROLL
    for (int it = 0; it < kM * kCols / 8 / kThreads; ++it) {
      const int chunk = it * kThreads + t, r = chunk / (kCols / 8), c8 = chunk % (kCols / 8) * 8;
      const int i = m * kM + r;
      if (i >= seq.len_q) continue;
      alignas(16) Element out[8];
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) out[j] = Element(tile[r * kLd + c8 + j] * p.scale);
      Element* row = dq + int64_t(i) * p.dq_row_stride + part * kCols + c8;
      if (vec) {
        *reinterpret_cast<uint4*>(row) = *reinterpret_cast<const uint4*>(out);
      } else {
        CUTE_UNROLL
        for (int j = 0; j < 8; ++j) row[j] = out[j];
      }
    }
  }
}

// ---- launch ------------------------------------------------------------------------------
template <class Tr>
Status launch_bwd(const BwdParams& p) {
  using Element = typename Tr::Element;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const BwdRows ws = bwd_rows(p, Tr::kBlockM);
  const int rows_per_seq = (p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM * Tr::kBlockM;
  constexpr int kPreRows = BwdPreprocessShape<Tr::kHeadDim>::kRowsPerCta;
  const dim3 rows_grid((rows_per_seq + kPreRows - 1) / kPreRows, p.heads_q, p.batch);
  // Each kernel after the first is launched as the previous one's programmatic dependent
  // (bwd_rows.cuh) when there is a previous one of the three; the postprocess in stream order
  // after the compact grid, whose CTAs past the real count of key blocks exit without waiting
  // (the count can be 0 with a grid of CTAs, so its end need not imply the preprocess's).
  bool after = false;
  if (rows_per_seq > 0) {
    bwd_preprocess_kernel<Element, Tr::kHeadDim><<<rows_grid, 256, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
    after = true;
  }
  if (p.seqlen_k > 0) {
    // Varlen: all sequences packed in rows, one "batch" (the kernel offsets by cu_seqlens).
    const int q_rows = p.varlen ? int(p.total_q) : p.seqlen_q;
    const int kv_rows = p.varlen ? int(p.total_k) : p.seqlen_k;
    const int batch = p.varlen ? 1 : p.batch;
    // With no query row no Q or dO copy is issued, but the maps must still be valid ones:
    // they then describe K's memory.
    auto tensor = [&](const void* ptr, int rows, int64_t row_stride, int heads, int64_t head_stride,
                      int64_t batch_stride) {
      constexpr int64_t k16 = 16 / int64_t(sizeof(Element));
      auto fix = [](int extent, int64_t stride) { return extent == 1 ? k16 : stride; };
      return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)),
                         make_layout(make_shape(rows, int(Tr::kHeadDim), heads, batch),
                                     make_stride(fix(rows, row_stride), _1{}, fix(heads, head_stride),
                                                 fix(batch, batch_stride))));
    };
    auto k = tensor(p.k, kv_rows, p.k_row_stride, p.heads_kv, p.k_head_stride, p.k_batch_stride);
    auto v = tensor(p.v, kv_rows, p.v_row_stride, p.heads_kv, p.v_head_stride, p.v_batch_stride);
    const bool no_q = q_rows == 0;
    auto q = no_q ? k : tensor(p.q, q_rows, p.q_row_stride, p.heads_q, p.q_head_stride, p.q_batch_stride);
    auto dout = no_q ? k
                     : tensor(p.dout, q_rows, p.do_row_stride, p.heads_q, p.do_head_stride,
                              p.do_batch_stride);
    const BwdKernelParams<Tr> kp{p,
                                 make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Tr::SmemLayoutQ{})),
                                 make_tma_copy(SM90_TMA_LOAD{}, dout, take<0, 2>(typename Tr::SmemLayoutDo{})),
                                 make_tma_copy(SM90_TMA_LOAD{}, k, typename Tr::SmemLayoutK{}),
                                 make_tma_copy(SM90_TMA_LOAD{}, v, typename Tr::SmemLayoutV{}),
                                 ws,
                                 no_q ? kv_rows : q_rows,
                                 kv_rows,
                                 batch};
    // Varlen without the deterministic order: the compact grid, up to head dim 128 (the wide
    // step of head dims 192 and 256 runs varlen on the 3-D grid).
    const bool compact = !Tr::kWide && p.varlen && !p.deterministic;
    const bool softcap = p.mask.softcap > 0.f;
    auto kernel = softcap ? bwd_kernel<Tr, true> : bwd_kernel<Tr, false>;
    if constexpr (!Tr::kWide)
      if (compact) kernel = softcap ? bwd_kernel<Tr, true, true> : bwd_kernel<Tr, false, true>;
    FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Tr::kSmemBytes));
    const dim3 grid = compact ? dim3(unsigned(bwd_varlen_blocks(p, Tr::kBlockN)), p.heads_kv, 1)
                              : dim3((p.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN, p.heads_kv, p.batch);
    if (grid.x > 0) {
      BwdKernelParams<Tr> kp_arg = kp;
      void* args[] = {&kp_arg};
      FL_CUDA_CHECK(cuda::launch_after(reinterpret_cast<const void*>(kernel), grid, dim3(Tr::kNThreads),
                                       size_t(Tr::kSmemBytes), stream, args, after));
      after = !compact;
    }
  }
  if (p.seqlen_q > 0) {
    BwdParams p_arg = p;
    BwdRows ws_arg = ws;
    void* args[] = {&p_arg, &ws_arg};
    FL_CUDA_CHECK(cuda::launch_after(reinterpret_cast<const void*>(bwd_postprocess_kernel<Tr>),
                                     dim3((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads_q, p.batch),
                                     dim3(Tr::kNConsumerThreads), 0, stream, args, after));
  }
  return {};
}

template <DType kDtype, int kHeadDim>
Status BwdInstance<kDtype, kHeadDim>::run(const BwdParams& p) {
  return launch_bwd<typename BwdConfig<kDtype, kHeadDim>::Traits>(p);
}
template <DType kDtype, int kHeadDim>
const void* BwdInstance<kDtype, kHeadDim>::kernel() {
  // device_supports asks whether the binary has code for the device and what shared memory
  // it needs; the softcap variant is in the same binary with the same shared memory.
  return reinterpret_cast<const void*>(bwd_kernel<typename BwdConfig<kDtype, kHeadDim>::Traits, false>);
}
template <DType kDtype, int kHeadDim>
int BwdInstance<kDtype, kHeadDim>::smem_bytes() {
  return BwdConfig<kDtype, kHeadDim>::Traits::kSmemBytes;
}
template <DType kDtype, int kHeadDim>
size_t BwdInstance<kDtype, kHeadDim>::workspace_bytes(const BwdParams& p) {
  return bwd_rows_layout(p, BwdConfig<kDtype, kHeadDim>::Traits::kBlockM).total;
}

}  // namespace flashlab::sm90
