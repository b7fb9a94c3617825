// The Hopper forward kernel (`cute_fa3`, sm_90a): the layers wired to warpgroups, and the
// launch (tensor maps built on the host per call).
//   tile scheduler  fwd_scheduler.cuh   one CTA per (batch, head, query block), longest
//                                       first; or (the ablation cute_fa3_persistent) one
//                                       per SM taking tiles longest first as it frees up
//   mainloop        fwd_mainloop.cuh    TMA producer; wgmma consumers
//   softmax         fwd_softmax.cuh     online softmax in exp2 units, MaskPolicy
//   epilogue        fwd_epilogue.cuh    normalize, LSE, O through shared memory, TMA store
//
// What it adds over cute_fa2 (the sm80 path): the copy engine moves Q, K and V (one thread
// issues a whole tile; ragged tiles are zero-filled by the hardware), the tensor cores read
// both operands of S = Q Kᵀ and V of P V straight from shared memory (wgmma, a warpgroup of
// 128 threads per 64 × N instruction, no ldmatrix), and the roles are split: warpgroup 0
// only loads, the others (two or three) only compute, with registers moved to them by
// setmaxnreg.
// K and V stream through 2- or 3-stage rings on mbarriers, so loads run ahead of the math
// without any __syncthreads in the loop.
// The consumers' schedule has two switches in the traits, each measured by turning it off
// (docs/sm90/fwd.md): pingpong (the two warpgroups take turns on the tensor cores, so one's
// softmax hides under the other's GEMMs) and the intra-warpgroup overlap (S of the next tile
// is issued with P V of this one, and at head dims 128 and 256 its softmax runs while P V is
// still in flight: kSoftmaxUnderPv, which needs the loop rotated past ptxas, see consume).
// A third switch, kPersistent, picks the persistent tile scheduler (fwd_scheduler.cuh); it
// measured slower than one CTA per tile (session 15), so only its ablation turns it on.
// At head dim 128 each consumer warpgroup's own loop, not the tensor pipe, sets the pace;
// the tree row max and kPollKvEarly shorten it (docs/sm90/fwd.md, "The consumer loop sets
// the pace"), and so does the softmax's order (the traits' MaxOrder: the warp's vote before
// the max's shuffles, or the exponentials before the max; "The exponentials before the
// max", and session 16's "The exponent's argument in place"). Measured on H100 (bf16,
// session 16, same-process A/B against cuDNN): 4x4096x16x128 635 TFLOP/s, 1.065x;
// 2x8192x16x128 659, 1.09x (causal 615, 1.17x); 2x8192x8x256 764, 1.14x; 2x8192x32x64
// causal 456, 1.07x. docs/sm90/fwd.md has the sweep, ncu's cycle counts and what each
// technique adds.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm90/fwd_epilogue.cuh"
#include "cuda/sm90/fwd_instance.h"
#include "cuda/sm90/fwd_mainloop.cuh"
#include "cuda/sm90/fwd_scheduler.cuh"
#include "cuda/sm90/fwd_softmax.cuh"
#include "cuda/sm90/fwd_traits.h"

namespace flashlab::sm90 {

using namespace cute;

template <class Tr>
struct KernelParams {
  FwdParams p;
  MainloopParams<Tr> mainloop;
  EpilogueParams<Tr> epilogue;
  TileOrder order;     // the persistent kernel's tile order
  DynamicTiles tiles;  // and its hand-out (a counter in the workspace)
};

// ---- the consumer warpgroups --------------------------------------------------------------
// One query tile, once its Q has landed. ctid: the thread's index among the consumers;
// warpgroup ctid / 128 owns rows [64·(ctid / 128), +64) of the tile. state_k, state_v: the
// rings' consumer states, carried from tile to tile.
template <class Tr, bool kSoftcap>
__device__ __forceinline__ void consume(const FwdParams& p, const EpilogueParams<Tr>& ep,
                                        const FwdBlock& blk,
                                        typename Tr::SharedStorage& ss,
                                        typename Tr::PipelineKV& pipeline_k,
                                        typename Tr::PipelineKV& pipeline_v,
                                        typename Tr::PipelineState& state_k,
                                        typename Tr::PipelineState& state_v, int ctid) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Tr::SmemLayoutQ{});    // (BLK_M, D)
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Tr::SmemLayoutK{});    // (BLK_N, D, STAGES)
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Tr::SmemLayoutVt{});  // (D, BLK_N, STAGES)

  typename Tr::TiledMmaQK mma_qk;
  typename Tr::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(ctid);
  auto thr_pv = mma_pv.get_thread_slice(ctid);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_D): descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_D, STAGES)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_D, MMA_N, STAGES)
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D)
  clear(acc_o);

  // (row, key) of each score this thread holds, as (rows, cols) like the scores themselves.
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<BlkM, BlkN>{}));  // (MMA, MMA_M, MMA_N)
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));         // (rows, cols)

  constexpr int kRows = decltype(size<0>(acc_rowcol(acc_o.layout())))::value;
  Softmax<kRows> softmax;
  const MaskPolicy mask = p.mask;
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k;
  // Softcap: logit = cap·tanh(s·scale / cap), so the softmax sees tanh(·) scaled by cap·log2 e.
  const float scale_log2 = kSoftcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = kSoftcap ? p.scale / mask.softcap : 0.f;

  // Pingpong: warpgroup w issues its wgmma batches only in its turn (barrier
  // kSchedulerBarrier + w, 256 threads: its own 128 wait, the previous warpgroup's 128
  // arrive) and passes the turn on to w + 1 after issuing. The last warpgroup opens by
  // passing the first turn to warpgroup 0 and skips its last pass, so that every arrival
  // is matched by a wait.
  constexpr int kNWg = Tr::kNConsumerWarpgroups;
  const int wg = ctid / 128;
  auto take_turn = [&] {
    if constexpr (Tr::kPingpong) cutlass::arch::NamedBarrier::sync(256, Tr::kSchedulerBarrier + wg);
  };
  auto pass_turn = [&](bool last) {
    if constexpr (Tr::kPingpong) {
      if (!(last && wg == kNWg - 1))
        cutlass::arch::NamedBarrier::arrive(256, Tr::kSchedulerBarrier + (wg + 1) % kNWg);
    }
  };

  Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
  if (blk.n_end > blk.n_begin) {
    if constexpr (Tr::kPingpong) {
      if (wg == kNWg - 1) cutlass::arch::NamedBarrier::arrive(256, Tr::kSchedulerBarrier);
    }
    Tensor acc_s = partition_fragment_C(mma_qk, Shape<BlkM, BlkN>{});  // (MMA, MMA_M, MMA_N)
    // P, rounded to Element, is P V's register A operand: two adjacent 8-key accumulator
    // blocks are one 16-key k-block.
    Tensor rP = make_tensor_like<Element>(acc_s);                         // (MMA, MMA_M, MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_K)
    float rescale[kRows];
    bool moved = true;  // whether rescale may hold a factor other than 1 (warp-uniform)
    // The scores of key tile n in acc_s: softcap, then the mask.
    auto scores = [&](int n) {
      const int j0 = n * Tr::kBlockN;
      Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
      if constexpr (kSoftcap) {
        CUTE_UNROLL
        for (int e = 0; e < size(s); ++e) s(e) = tanhf(s(e) * softcap_pre);
      }
      // Per-element masking only on the tiles the mask (or the end of the keys) cuts.
      if (j0 + Tr::kBlockN > len_k ||
          !mask.tile_is_full(blk.i0, blk.i0 + blk.rows, j0, j0 + Tr::kBlockN, len_q, len_k))
        apply_mask(s, tScS_rc, mask, blk.i0, j0, len_q, len_k);
    };
    // The scores of key tile n → P (in place), and in rescale the factors O's rows need.
    // k_stage: the stage K(n) still holds, for kExpFirst's refill (fwd_softmax.cuh); -1 for
    // the block's first tile, where no row has a reference max yet.
    auto softmax_step = [&](int n, int k_stage) {
      scores(n);
      Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
      if constexpr (Tr::kMaxOrder == MaxOrder::kExpFirst) {
        if (k_stage < 0) {
          moved = softmax.update_voted(s, scale_log2, rescale);
        } else {
          moved = softmax.update_exp_first(s, scale_log2, rescale, [&] {
            warpgroup_fence_operand(acc_s);
            warp_qk<Tr>(sQ, sK(_, _, k_stage), acc_s, ctid);
            warpgroup_fence_operand(acc_s);
            scores(n);
          });
        }
      } else if constexpr (Tr::kMaxOrder == MaxOrder::kVoteFirst) {
        moved = softmax.update_voted(s, scale_log2, rescale);
      } else {
        softmax.template update</*kTreeMax=*/true>(s, scale_log2, rescale);
      }
    };
    // O's rows times rescale, skipped where no row of the warp moved its max.
    auto rescale_o = [&] {
      if constexpr (Tr::kMaxOrder == MaxOrder::kMaxFirst) {
        Softmax<kRows>::rescale_o(o, rescale);
      } else {
        Softmax<kRows>::rescale_o(o, rescale, moved);
      }
    };
    // kExpFirst keeps K(n) until its softmax is done (the refill may read it again).
    constexpr bool kHoldK = Tr::kMaxOrder == MaxOrder::kExpFirst;

    // K and V advance through their rings in the same order; with the overlap V lags K by
    // one tile.
    if constexpr (Tr::kIntraOverlap) {
      // Prologue: S of the last tile alone.
      pipeline_k.consumer_wait(state_k);
      take_turn();
      warpgroup_gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
      pass_turn(false);
      warpgroup_wait_for<0>(acc_s);
      pipeline_k.consumer_release(state_k);
      ++state_k;
      softmax_step(blk.n_end - 1, -1);  // O is still 0, so its first rescale changes nothing
      auto release_v = [&] {
        pipeline_v.consumer_release(state_v);
        ++state_v;  // the state goes on to the next tile (persistent)
      };
      // Steady state: S(n) and O += P(n+1) V(n+1) issued in one turn. Where the wait for
      // P V goes is Tr::kSoftmaxUnderPv. Under P V, the loop is rotated so that the wait
      // opens the next iteration: ptxas schedules within a basic block, and a wait written
      // after the softmax in the same block was moved up to the block's top, before the
      // softmax (CUDA 13.0: WARPGROUP.DEPBAR right after the mask's join). Written at the
      // top of the next iteration, past the back edge, the wait stays there (the SASS).
      // With Tr::kPollKvEarly, the barriers of the next turn's K and V tiles are tested
      // (without blocking) before the softmax; a tile found landed is then not waited for
      // again, so the barrier's round trip runs under the softmax instead of before the turn.
      cutlass::ConsumerToken k_landed{cutlass::BarrierStatus::WaitAgain};
      cutlass::ConsumerToken v_landed{cutlass::BarrierStatus::WaitAgain};
      for (int n = blk.n_end - 2; n >= blk.n_begin; --n) {
        if constexpr (Tr::kSoftmaxUnderPv) {
          warpgroup_wait_for<0>(acc_o, tOrP);  // P(n+2) V(n+2); none in the first iteration
          if (n != blk.n_end - 2) release_v();
        }
        rescale_o();                                  // O into S(n+1)'s max
        round_into(acc_s, rP);                        // P(n+1)
        pipeline_k.consumer_wait(state_k, k_landed);  // K(n)
        pipeline_v.consumer_wait(state_v, v_landed);  // V(n+1)
        take_turn();
        warpgroup_gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
        warpgroup_gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), acc_o);
        pass_turn(false);
        if constexpr (Tr::kSoftmaxUnderPv) {
          warpgroup_wait_for<1>(acc_s);  // S(n) is done; P V runs on under the softmax
        } else {
          warpgroup_wait_for<0>(acc_o, tOrP);  // both done
          warpgroup_fence_operand(acc_s);
          release_v();
        }
        const auto k_read = state_k;  // K(n)
        ++state_k;
        if constexpr (!kHoldK) pipeline_k.consumer_release(k_read);
        if constexpr (Tr::kPollKvEarly) {
          k_landed = pipeline_k.consumer_test_wait(state_k);  // K(n-1)
          // V(n). Under P V, V(n+1) is released only at the next iteration's top, so V(n)
          // is one past the state; otherwise V(n+1) has been released already.
          auto next_v = state_v;
          if constexpr (Tr::kSoftmaxUnderPv) ++next_v;
          v_landed = pipeline_v.consumer_test_wait(next_v);
        }
        softmax_step(n, k_read.index());
        if constexpr (kHoldK) pipeline_k.consumer_release(k_read);
      }
      // Epilogue of the loop: P V of the first tile.
      if constexpr (Tr::kSoftmaxUnderPv) {
        warpgroup_wait_for<0>(acc_o, tOrP);
        if (blk.n_end - blk.n_begin > 1) release_v();
      }
      rescale_o();
      round_into(acc_s, rP);
      pipeline_v.consumer_wait(state_v);
      take_turn();
      warpgroup_gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), acc_o);
      pass_turn(true);
      warpgroup_wait_for<0>(acc_o, tOrP);
      release_v();
    } else {
      // One tile at a time, each wgmma batch waited for in place.
      for (int n = blk.n_end - 1; n >= blk.n_begin; --n) {
        pipeline_k.consumer_wait(state_k);
        take_turn();
        warpgroup_gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
        pass_turn(false);
        warpgroup_wait_for<0>(acc_s);
        const auto k_read = state_k;  // K(n)
        ++state_k;
        if constexpr (!kHoldK) pipeline_k.consumer_release(k_read);
        softmax_step(n, n == blk.n_end - 1 ? -1 : int(k_read.index()));
        if constexpr (kHoldK) pipeline_k.consumer_release(k_read);
        rescale_o();
        round_into(acc_s, rP);
        pipeline_v.consumer_wait(state_v);
        take_turn();
        warpgroup_gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), acc_o);
        pass_turn(n == blk.n_begin);
        warpgroup_wait_for<0>(acc_o, tOrP);
        pipeline_v.consumer_release(state_v);
        ++state_v;
      }
    }
  }

  float lse[kRows];
  softmax.finish(o, scale_log2, 1.f, lse);
  store_output<Tr>(p, ep, blk, ss, acc_o, lse, ctid);
}

// ---- the kernel --------------------------------------------------------------------------
// kNThreads threads (a producer warpgroup and two or three consumers), one CTA per SM (the
// register cap at entry that setmaxnreg needs). Persistent: grid min(tiles, SMs), each CTA
// taking tiles of kp.order as it frees up; else grid (ceil(seqlen_q / kBlockM), heads_q,
// batch), one tile each. Two variants, picked at launch: plain and kSoftcap (tanh's
// temporaries stay out of the plain kernel).
//
// Q's barrier completes one phase per tile the CTA serves (with Q's bytes, or with none for
// a tile that sees no key), and a persistent CTA's producer publishes the tile's index in
// shared memory before its arrival, then one last phase with index -1 (no tile left). The
// consumers wait on every phase, so they never run ahead of the producer, and they arrive
// on Q's empty barrier once per tile, so they are never two phases ahead of its waits.
template <class Tr, bool kSoftcap>
__global__ void __launch_bounds__(Tr::kNThreads, 1)
    fwd_kernel(const __grid_constant__ KernelParams<Tr> kp) {
  using PipelineKV = typename Tr::PipelineKV;
  const FwdParams& p = kp.p;

  // The persistent order's tile t.
  auto block_of = [&](int t) {
    int b, h, m_block;
    kp.order.tile(t, p.heads_q, b, h, m_block);
    return cuda::fwd_block<Tr::kBlockM, Tr::kBlockN>(p, b, h, m_block);
  };

  extern __shared__ __align__(1024) unsigned char smem[];
  auto& ss = *reinterpret_cast<typename Tr::SharedStorage*>(smem);
  const int warp_group = cutlass::canonical_warp_group_idx();
  const bool producer = warp_group == 0;

  // Barriers: Q's (one arrival, the producer's, plus the bytes), Q's buffer free again
  // (every consumer thread, persistent only), and K's and V's rings (initialized by warp 0
  // inside the pipeline constructors, fenced there for the copy engine); the __syncthreads
  // publishes them before anyone waits or copies.
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_q, 1);
    cutlass::arch::ClusterBarrier::init(&ss.barrier_q_empty, Tr::kNConsumerThreads);
  }
  typename PipelineKV::Params pipe;
  pipe.transaction_bytes = Tr::kTmaBytesKV;
  pipe.role = producer ? PipelineKV::ThreadCategory::Producer
                       : PipelineKV::ThreadCategory::Consumer;
  pipe.is_leader = threadIdx.x == 0;  // the one producer thread that issues copies
  pipe.num_consumers = Tr::kNConsumerThreads;
  PipelineKV pipeline_k(ss.pipeline_k, pipe, Shape<_1, _1, _1>{});
  PipelineKV pipeline_v(ss.pipeline_v, pipe, Shape<_1, _1, _1>{});
  __syncthreads();

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Tr::kProducerRegs>();
    if (threadIdx.x != 0) return;
    auto state_k = cutlass::make_producer_start_state<PipelineKV>();
    auto state_v = state_k;
    // One tile's loads; before_q() runs right before Q's copy (or arrival).
    auto serve = [&](const FwdBlock& blk, auto&& before_q) {
      if (blk.n_end > blk.n_begin) {
        load<Tr>(kp.mainloop, p, blk, ss, pipeline_k, pipeline_v, state_k, state_v, before_q);
      } else {
        before_q();
        cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q);  // no key: no Q either
      }
    };
    if constexpr (Tr::kPersistent) {
      int served = 0;
      // Tile j's Q overwrites tile j − 1's Q and O, and its index the previous one: wait
      // for phase j − 1 of the consumers' barrier.
      auto wait_q_empty = [&] {
        if (served > 0)
          cutlass::arch::ClusterBarrier::wait(&ss.barrier_q_empty, (served - 1) & 1);
      };
      for (int t = int(blockIdx.x); t < kp.order.tiles();) {
        // The next tile is taken before this one's copies go out, so that its round trip
        // hides behind them. Taken after them (one register less through the loads) it was
        // exposed on short tiles: 8x2048x16x128 causal measured 366 TFLOP/s against 482.
        const int next = kp.tiles.take_next();
        const FwdBlock blk = block_of(t);
        if (blk.rows > 0) {  // varlen: a sequence shorter than the longest has no rows here
          serve(blk, [&] {
            wait_q_empty();
            DynamicTiles::publish(&ss.tile, t);
          });
          ++served;
        }
        t = next;
      }
      wait_q_empty();
      DynamicTiles::publish(&ss.tile, -1);
      cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q);
    } else {
      const FwdBlock blk = schedule<Tr>(p);
      if (blk.rows > 0) serve(blk, [] {});
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Tr::kConsumerRegs>();
    typename Tr::PipelineState state_k, state_v;  // stage 0, phase 0
    const int ctid = int(threadIdx.x) - 128;
    if constexpr (Tr::kPersistent) {
      for (int q_phase = 0;; q_phase ^= 1) {
        cutlass::arch::ClusterBarrier::wait(&ss.barrier_q, q_phase);
        // The tile index, shuffled from lane 0 so that ptxas can prove it warp-uniform: read
        // from shared memory as such, every value derived from it (the pipeline stages, the
        // shared-memory descriptors) went through per-thread registers and an R2UR before
        // each wgmma; the shuffle gained the kernel 5-7% (session 15, docs/sm90/fwd.md).
        const int t = __shfl_sync(0xffffffffu, DynamicTiles::read(&ss.tile), 0);
        if (t < 0) break;
        consume<Tr, kSoftcap>(p, kp.epilogue, block_of(t), ss, pipeline_k, pipeline_v, state_k,
                              state_v, ctid);
        // This thread's reads and writes of Q's bytes (the epilogue stages O there) are
        // done; the fence orders them before the copy engine's next write.
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::ClusterBarrier::arrive(&ss.barrier_q_empty);
      }
    } else {
      const FwdBlock blk = schedule<Tr>(p);
      if (blk.rows > 0) {
        cutlass::arch::ClusterBarrier::wait(&ss.barrier_q, 0);
        consume<Tr, kSoftcap>(p, kp.epilogue, blk, ss, pipeline_k, pipeline_v, state_k, state_v,
                              ctid);
      }
    }
  }
}

// ---- launch ------------------------------------------------------------------------------
// The tensor maps. TMA wants every stride but the head dim's a multiple of 16 bytes
// (supports() checks that) and nonzero; a mode of extent 1 is never stepped, so its stride
// is free and gets a harmless 16 bytes.
// Element: const for the loads (Q, K, V), mutable for the store (O).
template <class Tr, class Element = typename Tr::Element const, class Ptr>
auto gmem_tensor(Ptr* ptr, int rows, int64_t row_stride, int heads, int64_t head_stride,
                 int batch, int64_t batch_stride) {
  constexpr int64_t k16Bytes = 16 / int64_t(sizeof(Element));
  auto fix = [](int extent, int64_t stride) { return extent == 1 ? k16Bytes : stride; };
  return make_tensor(make_gmem_ptr(static_cast<Element*>(ptr)),
                     make_layout(make_shape(rows, int(Tr::kHeadDim), heads, batch),
                                 make_stride(fix(rows, row_stride), _1{}, fix(heads, head_stride),
                                             fix(batch, batch_stride))));
}

template <class Tr, bool kSoftcap>
Status launch_fwd(const FwdParams& p) {
  // Varlen: all sequences packed in rows, one "batch" (the kernel offsets by cu_seqlens).
  const int q_rows = p.varlen ? int(p.total_q) : p.seqlen_q;
  const int kv_rows = p.varlen ? int(p.total_k) : p.seqlen_k;
  const int batch = p.varlen ? 1 : p.batch;
  if (q_rows == 0) return {};  // no row to write
  auto q = gmem_tensor<Tr>(p.q, q_rows, p.q_row_stride, p.heads_q, p.q_head_stride, batch,
                           p.q_batch_stride);
  auto o = gmem_tensor<Tr, typename Tr::Element>(p.out, q_rows, p.o_row_stride, p.heads_q,
                                                p.o_head_stride, batch, p.o_batch_stride);
  // With no key at all no K/V copy is ever issued, but the maps must still be valid ones
  // (a tensor map has no empty extent): they then describe Q's memory.
  const bool no_keys = kv_rows == 0;
  auto k = no_keys ? q
                   : gmem_tensor<Tr>(p.k, kv_rows, p.k_row_stride, p.heads_kv, p.k_head_stride,
                                     batch, p.k_batch_stride);
  auto v = no_keys ? q
                   : gmem_tensor<Tr>(p.v, kv_rows, p.v_row_stride, p.heads_kv, p.v_head_stride,
                                     batch, p.v_batch_stride);
  // Grid: one CTA per tile, or (persistent) one per SM, at most one per tile.
  // supports() keeps m_blocks · heads_q · batch, the tile count, an int.
  const int m_blocks = int((int64_t(p.seqlen_q) + Tr::kBlockM - 1) / Tr::kBlockM);
  dim3 grid(m_blocks, p.heads_q, p.batch);
  TileOrder order;
  DynamicTiles tiles{static_cast<int*>(p.workspace)};
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if constexpr (Tr::kPersistent) {
    if (reinterpret_cast<uintptr_t>(p.workspace) % alignof(int) != 0)
      return {StatusCode::kInvalidArgument,
              "workspace must be 4-byte aligned (cute_fa3 keeps its tile counter there)"};
    int sms = 0;
    FL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device_index));
    const int64_t kv_bytes = int64_t(2) * p.seqlen_k * Tr::kHeadDim * int64_t(sizeof(typename Tr::Element));
    order = TileOrder::make(m_blocks, p.batch, p.heads_q, p.group, kv_bytes);
    grid = dim3(std::min(order.tiles(), sms));
    FL_CUDA_CHECK(cudaMemsetAsync(tiles.counter, 0, sizeof(int), stream));
  }
  const KernelParams<Tr> kp{
      p,
      {make_tma_copy(SM90_TMA_LOAD{}, q, typename Tr::SmemLayoutQ{}),
       make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename Tr::SmemLayoutK{})),
       make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(typename Tr::SmemLayoutV{})), q_rows, batch,
       kv_rows, batch},
      {make_tma_copy(SM90_TMA_STORE{}, o, typename Tr::SmemLayoutOWg{}), q_rows, batch},
      order,
      tiles};

  const auto kernel = fwd_kernel<Tr, kSoftcap>;
  FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Tr::kSmemBytes));
  kernel<<<grid, Tr::kNThreads, Tr::kSmemBytes, stream>>>(kp);
  FL_CUDA_CHECK_LAUNCH();
  return {};
}

// The per-(dtype, head dim) entry points that fwd_dispatch.cu calls (fwd_instance.h); each
// instantiations/fwd_hdim*_*.cu file instantiates one.
template <class Tr>
Status launch_fwd(const FwdParams& p) {
  return p.mask.softcap > 0.f ? launch_fwd<Tr, true>(p) : launch_fwd<Tr, false>(p);
}

// One kernel per instance: cute_fa3 runs one CTA per tile under every mask, and its ablation
// cute_fa3_persistent (bf16 head dim 128) the persistent kernel (FwdConfig::kPersistent).
template <DType kDtype, int kHeadDim, Schedule kSchedule>
Status FwdInstance<kDtype, kHeadDim, kSchedule>::run(const FwdParams& p) {
  return launch_fwd<typename FwdConfig<kDtype, kHeadDim, kSchedule>::Traits>(p);
}
template <DType kDtype, int kHeadDim, Schedule kSchedule>
const void* FwdInstance<kDtype, kHeadDim, kSchedule>::kernel() {
  return reinterpret_cast<const void*>(
      fwd_kernel<typename FwdConfig<kDtype, kHeadDim, kSchedule>::Traits, false>);
}
template <DType kDtype, int kHeadDim, Schedule kSchedule>
int FwdInstance<kDtype, kHeadDim, kSchedule>::smem_bytes() {
  return FwdConfig<kDtype, kHeadDim, kSchedule>::Traits::kSmemBytes;
}

}  // namespace flashlab::sm90
