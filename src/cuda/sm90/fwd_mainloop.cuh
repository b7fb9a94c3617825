// Mainloop of the Hopper forward, both sides of the pipelines:
//   producer  one thread of warpgroup 0: per query tile, Q once and K(n) and V(n) for every
//             key tile, last to first, each a TMA copy into its ring stage completing on
//             that stage's mbarrier (PipelineTmaAsync: the producer waits for the stage to be
//             empty, arrives with the byte count it expects, the copy engine completes the
//             phase)
//   consumer  the other warpgroups: S = Q Kᵀ and O += P V on wgmma, operands in shared memory
//             (P in registers), releasing each stage once its wgmma has completed
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "common/params.h"
#include "cuda/sm90/fwd_scheduler.cuh"
#include "cuda/sm90/fwd_traits.h"

namespace flashlab::sm90 {

using namespace cute;

// What the mainloop needs from the host: the tensor maps (built per call in fwd_kernel.cuh)
// and the extents of the global tensors they describe, (rows, D, heads, batch).
template <class Tr>
struct MainloopParams {
  typename Tr::TmaQ tma_q;
  typename Tr::TmaKV tma_k;
  typename Tr::TmaKV tma_v;
  int q_rows, q_batch;    // varlen: (total_q, 1); else (seqlen_q, batch)
  int kv_rows, kv_batch;  // varlen: (total_k, 1); else (seqlen_k, batch)
};

// ---- producer --------------------------------------------------------------------------
// The parameters of a TMA pipeline (PipelineTmaAsync) whose producer is thread 0 alone and
// whose consumers are `consumers` threads, each stage landing `bytes`.
template <class Pipeline>
__device__ __forceinline__ typename Pipeline::Params tma_pipeline_params(bool producer, uint32_t bytes,
                                                                         int consumers) {
  typename Pipeline::Params pipe;
  pipe.transaction_bytes = bytes;
  pipe.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe.is_leader = threadIdx.x == 0;  // the one producer thread that issues copies
  pipe.num_consumers = consumers;
  return pipe;
}

// Issued by one thread. The tiles are in TMA coordinates, so the rows past the end of the
// tensor (a ragged last tile) arrive as zeros and still count toward the expected bytes.
// state_k, state_v: the rings' producer states, carried from tile to tile. before_q() runs
// right before Q's copy: the persistent kernel waits there for the consumers to be done
// with the previous tile's Q (and O) bytes, after the first K copy has gone out.
template <class Tr, class BeforeQ>
__device__ __forceinline__ void load(const MainloopParams<Tr>& mp, const FwdParams& p,
                                     const FwdBlock& blk, typename Tr::SharedStorage& ss,
                                     typename Tr::PipelineKV& pipeline_k,
                                     typename Tr::PipelineKV& pipeline_v,
                                     typename Tr::PipelineState& state_k,
                                     typename Tr::PipelineState& state_v, BeforeQ&& before_q) {
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;

  const int bq = p.varlen ? 0 : blk.b;  // varlen: one packed "batch", offset by cu_seqlens
  Tensor mQ = mp.tma_q.get_tma_tensor(
      make_shape(mp.q_rows, int(Tr::kHeadDim), p.heads_q, mp.q_batch));  // (rows, D, heads, batch)
  Tensor mK = mp.tma_k.get_tma_tensor(
      make_shape(mp.kv_rows, int(Tr::kHeadDim), p.heads_kv, mp.kv_batch));  // (rows, D, heads, batch)
  Tensor mV = mp.tma_v.get_tma_tensor(
      make_shape(mp.kv_rows, int(Tr::kHeadDim), p.heads_kv, mp.kv_batch));  // (rows, D, heads, batch)
  Tensor mQ_seq = domain_offset(make_coord(int(blk.seq.start_q), _0{}), mQ(_, _, blk.h, bq));   // (len_q, D)
  Tensor mK_seq = domain_offset(make_coord(int(blk.seq.start_k), _0{}), mK(_, _, blk.hk, bq));  // (len_k, D)
  Tensor mV_seq = domain_offset(make_coord(int(blk.seq.start_k), _0{}), mV(_, _, blk.hk, bq));  // (len_k, D)
  Tensor gQ = local_tile(mQ_seq, Shape<BlkM, HeadDim>{}, make_coord(blk.m_block, _0{}));  // (BLK_M, D)
  Tensor gK = local_tile(mK_seq, Shape<BlkN, HeadDim>{}, make_coord(_, _0{}));  // (BLK_N, D, n)
  Tensor gV = local_tile(mV_seq, Shape<BlkN, HeadDim>{}, make_coord(_, _0{}));  // (BLK_N, D, n)

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{});  // (BLK_M, D)
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});  // (BLK_N, D, STAGES)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutV{});  // (BLK_N, D, STAGES)

  // Each partition: mode 0 is one TMA copy's worth (TMA, TMA_ITER), then the rest.
  auto [tQgQ, tQsQ] = tma_partition(mp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));  // (TMA), (TMA)
  auto [tKgK, tKsK] = tma_partition(mp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));  // (TMA, n), (TMA, STAGES)
  auto [tVgV, tVsV] = tma_partition(mp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));  // (TMA, n), (TMA, STAGES)

  auto load_q = [&] {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_q, Tr::kTmaBytesQ);
    copy(mp.tma_q.with(ss.barrier_q), tQgQ, tQsQ);
  };

  // The copies go out in the order the consumers use them: with the intra-warpgroup overlap
  // K(n) is consumed together with V(n + 1), so K runs one tile ahead of V here too and a
  // K copy never waits behind a V stage that is still being read.
  auto load_k = [&](int n) {
    pipeline_k.producer_acquire(state_k);  // stage empty; expects kTmaBytesKV on its barrier
    copy(mp.tma_k.with(*pipeline_k.producer_get_barrier(state_k)), tKgK(_, n),
         tKsK(_, state_k.index()));
    ++state_k;
  };
  auto load_v = [&](int n) {
    pipeline_v.producer_acquire(state_v);
    copy(mp.tma_v.with(*pipeline_v.producer_get_barrier(state_v)), tVgV(_, n),
         tVsV(_, state_v.index()));
    ++state_v;
  };
  if constexpr (Tr::kPersistent) {
    load_k(blk.n_end - 1);
    before_q();
    load_q();
  } else {
    before_q();
    load_q();
    load_k(blk.n_end - 1);
  }
  if constexpr (Tr::kIntraOverlap) {
    for (int n = blk.n_end - 2; n >= blk.n_begin; --n) {
      load_k(n);
      load_v(n + 1);
    }
    load_v(blk.n_begin);
  } else {
    load_v(blk.n_end - 1);
    for (int n = blk.n_end - 2; n >= blk.n_begin; --n) {
      load_k(n);
      load_v(n);
    }
  }
}

// ---- consumer: warpgroup MMAs -------------------------------------------------------------
// Slice k of a tensor of shared-memory descriptors (MMA, MMA_X, MMA_K), its first
// descriptor made from the tensor's first by one 64-bit add. CuTe adds the offset to the low
// word alone; ptxas then rebuilds each wgmma's register pair with a UIADD3 and a UMOV of the
// unchanged high word, two uniform instructions per descriptor, where the 64-bit add is one
// UIADD3.64.
template <class T>
__device__ __forceinline__ auto desc_slice64(T const& t, int k) {
  auto slice = t(_, _, k);
  const GmmaDescriptor base = t.data().desc_;
  GmmaDescriptor d;
  d.desc_ = base.desc_ + uint64_t(slice.data().desc_.reg32_[0] - base.reg32_[0]);
  return make_tensor(GMMA::DescriptorIterator{d}, slice.layout());
}

// Issues acc (+)= A·B over all k-blocks as one wgmma batch and returns at once: the caller
// waits with warpgroup_wait<k> (k batches may stay in flight) and then fences acc (and a
// register A) before touching them.
//   tA (MMA, MMA_M, MMA_K): shared-memory descriptors, or registers (P)
//   tB (MMA, MMA_N, MMA_K): shared-memory descriptors; acc (MMA, MMA_M, MMA_N)
// The operand fences keep the compiler from moving register reads or writes of the
// accumulators (and of a register A) across the asynchronous MMA.
// kDesc64: the descriptors of each k-block by desc_slice64. The Hopper backward's steps use it
// (1-6% faster at head dim 64 on an H200, docs/sm90/bwd.md); the forward keeps CuTe's.
template <bool kZeroInit, bool kDesc64 = false, class TiledMma, class TA, class TB, class Acc>
__device__ __forceinline__ void warpgroup_gemm_issue(TiledMma& mma, TA& tA, TB const& tB,
                                                     Acc& acc) {
  constexpr bool kARegs = !is_same_v<typename TA::value_type, GMMA::DescriptorIterator::value_type>;  // P, not Q
  if constexpr (kARegs) warpgroup_fence_operand(tA);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    if constexpr (!kDesc64)
      gemm(mma, tA(_, _, k), tB(_, _, k), acc);
    else if constexpr (kARegs)
      gemm(mma, tA(_, _, k), desc_slice64(tB, k), acc);
    else
      gemm(mma, desc_slice64(tA, k), desc_slice64(tB, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  if constexpr (kARegs) warpgroup_fence_operand(tA);
}

// Waits until at most kInFlight of this warpgroup's wgmma batches are still running, then
// fences the registers the finished ones wrote (or read).
template <int kInFlight, class T>
__device__ __forceinline__ void warpgroup_wait_for(T& operand) {
  warpgroup_wait<kInFlight>();
  warpgroup_fence_operand(operand);
}
template <int kInFlight, class T, class U>
__device__ __forceinline__ void warpgroup_wait_for(T& operand, U& other) {
  warpgroup_wait<kInFlight>();
  warpgroup_fence_operand(operand);
  warpgroup_fence_operand(other);
}

// The accumulator of S = Q Kᵀ over keys (N) as the register A operand of O = P V over keys
// (K): two adjacent 8-key column blocks are one 16-key k-block, value for value.
// ((2, 2, N/8), MMA_M, MMA_N) → ((2, 2, 2), MMA_M, (N/16, MMA_N))
template <class Layout>
CUTE_HOST_DEVICE auto acc_as_a_operand(Layout acc) {
  static_assert(decltype(rank(get<0>(acc)))::value == 3, "a wgmma accumulator: (2, 2, N/8)");
  auto blocks = logical_divide(get<0, 2>(acc), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(blocks)), get<1>(acc),
                     coalesce(make_layout(get<0, 1>(blocks), get<2>(acc))));
}

// S = Q Kᵀ once more for one warp's 16 rows, on mma.sync from the same shared memory:
// kExpFirst's rare refill (fwd_softmax.cuh). One warp of a warpgroup may need it while the
// others do not, and wgmma is issued by the whole warpgroup. The m16n8 fragments of a warp
// hold the same (row, key) pairs in the same order as its part of the wgmma accumulator
// (rows lane / 4 and + 8, keys 2 · (lane % 4) + {0, 1} + 8 j), so the result goes straight
// into acc_s's registers. Sixteen keys at a time, the k-blocks in a rolled loop, so that one
// k-block's fragments are live at a time (fully unrolled, ptxas loaded them all ahead and
// the kernel spilled).
//   sQ (BLK_M, D), sK (BLK_N, D): one stage; acc_s (MMA, MMA_M, MMA_N) of TiledMmaQK
template <class Tr, class SQ, class SK, class Acc>
__device__ __forceinline__ void warp_qk(SQ const& sQ, SK const& sK, Acc& acc_s, int ctid) {
  using Element = typename Tr::Element;
  using Atom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                  SM80_16x8x16_F32F16F16F32_TN, SM80_16x8x16_F32BF16BF16F32_TN>;
  auto mma = make_tiled_mma(Atom{}, Layout<Shape<_1, _1, _1>>{}, Tile<_16, _16, _16>{});
  const int lane = ctid % 32;
  auto thr = mma.get_thread_slice(lane);
  auto copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto copy_k = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_q = copy_q.get_thread_slice(lane);
  auto thr_k = copy_k.get_thread_slice(lane);
  using Blk = Shape<_16, _16>;
  Tensor rQ = thr.partition_fragment_A(local_tile(sQ, Blk{}, make_coord(0, 0)));  // (MMA, 1, 1)
  Tensor rK = thr.partition_fragment_B(local_tile(sK, Blk{}, make_coord(0, 0)));  // (MMA, 2, 1)
  Tensor tQr = thr_q.retile_D(rQ);
  Tensor tKr = thr_k.retile_D(rK);
  using AccLayout = decltype(partition_fragment_C(mma, Blk{}).layout());  // ((2, 2), 1, 2)
  constexpr int kAccPer16Keys = decltype(cosize(AccLayout{}))::value;     // 8
  static_assert(decltype(size(acc_s))::value == kAccPer16Keys * Tr::kBlockN / 16,
                "one warp's share of S, 16 keys after 16 keys");
  CUTE_UNROLL
  for (int j = 0; j < Tr::kBlockN / 16; ++j) {
    Tensor acc = make_tensor(acc_s.data() + kAccPer16Keys * j, AccLayout{});  // keys [16j, +16)
    clear(acc);
#pragma unroll 1
    for (int k = 0; k < Tr::kHeadDim / 16; ++k) {
      copy(copy_q, thr_q.partition_S(local_tile(sQ, Blk{}, make_coord(ctid / 32, k))), tQr);
      copy(copy_k, thr_k.partition_S(local_tile(sK, Blk{}, make_coord(j, k))), tKr);
      gemm(mma, rQ, rK, acc);
    }
  }
}

using cuda::round_into;  // cuda/cute_common.cuh
using cuda::round_to;

}  // namespace flashlab::sm90
