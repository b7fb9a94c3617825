// The consumer warpgroups of the Hopper forward: one query tile's walk over its key tiles, as
// named steps. Consumer warpgroup w owns rows [64w, 64w + 64) of the tile; for each key tile
// n, last to first, it computes S(n) = Q K(n)ᵀ, turns S(n) into P(n) with the online softmax
// (fwd_softmax.cuh), and accumulates O += P(n) V(n), both products on wgmma
// (fwd_mainloop.cuh). With the intra-warpgroup overlap (Tr::kIntraOverlap) the walk is
// software-pipelined by one tile, so that each turn on the tensor cores issues both GEMMs:
//   first_tile       S(n_end − 1) alone, then its softmax
//   overlapped_tile  S(n) and O += P(n + 1) V(n + 1) in one turn, then S(n)'s softmax
//   last_pv          O += P(n_begin) V(n_begin)
// Without it, serial_tile runs each tile's S, softmax and P V in turn.
// The four steps are force-inlined into consume(). The helpers they share (Turns::take and
// pass; TileSoftmax's scores, softmax_step, rescale_o and release_v) are plain __device__
// functions, which the compiler optimizes alone and then inlines, and each helper struct
// holds references to just what its functions read. Forcing the helpers inline, widening
// what they reach, or taking n by value changes the order in which the compiler resolves the
// registers, and with it the instruction stream ptxas schedules (CUDA 13.0): a change here
// is worth a diff of the SASS.
#pragma once

#include <utility>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/constants.h"
#include "common/params.h"
#include "cuda/sm90/fwd_epilogue.cuh"
#include "cuda/sm90/fwd_mainloop.cuh"
#include "cuda/sm90/fwd_scheduler.cuh"
#include "cuda/sm90/fwd_softmax.cuh"
#include "cuda/sm90/fwd_traits.h"

namespace flashlab::sm90 {

using namespace cute;

// ---- pingpong ------------------------------------------------------------------------------
// Warpgroup w issues its wgmma batches only in its turn (barrier kSchedulerBarrier + w, 256
// threads: its own 128 wait, the previous warpgroup's 128 arrive) and passes the turn on to
// w + 1 after issuing. The last warpgroup opens by passing the first turn to warpgroup 0
// (consume) and skips its last pass, so that every arrival is matched by a wait.
template <class Tr>
struct Turns {
  static constexpr int kNWg = Tr::kNConsumerWarpgroups;
  const int& wg;  // this thread's consumer warpgroup

  __device__ void take() {
    if constexpr (Tr::kPingpong) cutlass::arch::NamedBarrier::sync(256, Tr::kSchedulerBarrier + wg);
  }
  __device__ void pass(bool last) {
    if constexpr (Tr::kPingpong) {
      if (!(last && wg == kNWg - 1))
        cutlass::arch::NamedBarrier::arrive(256, Tr::kSchedulerBarrier + (wg + 1) % kNWg);
    }
  }
};

// The register and shared-memory operands of one consumer thread, as consume() declares them.
template <class Tr>
struct ConsumerTypes {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  using TiledMmaQK = typename Tr::TiledMmaQK;
  using TiledMmaPV = typename Tr::TiledMmaPV;
  template <class Layout>
  using Smem = decltype(make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)), Layout{}));
  using SmemQ = Smem<typename Tr::SmemLayoutQ>;    // (BLK_M, D)
  using SmemK = Smem<typename Tr::SmemLayoutK>;    // (BLK_N, D, STAGES)
  using SmemVt = Smem<typename Tr::SmemLayoutVt>;  // (D, BLK_N, STAGES)
  using ThrQK = decltype(TiledMmaQK{}.get_thread_slice(0));
  using ThrPV = decltype(TiledMmaPV{}.get_thread_slice(0));
  // The MMAs' shared-memory operands, as wgmma descriptors.
  using DescQ = decltype(std::declval<ThrQK&>().partition_fragment_A(
      std::declval<SmemQ&>()));  // (MMA, MMA_M, MMA_D)
  using DescK = decltype(std::declval<ThrQK&>().partition_fragment_B(
      std::declval<SmemK&>()));  // (MMA, MMA_N, MMA_D, STAGES)
  using DescV = decltype(std::declval<ThrPV&>().partition_fragment_B(
      std::declval<SmemVt&>()));  // (MMA, MMA_D, MMA_N, STAGES)
  // The registers: S and O in fp32, P in Element; (rows, cols) views of O and of the
  // (row, key) of each score; P as the A operand of P V (two adjacent 8-key accumulator
  // blocks are one 16-key k-block).
  using AccS = decltype(partition_fragment_C(TiledMmaQK{}, Shape<BlkM, BlkN>{}));     // (MMA, MMA_M, MMA_N)
  using AccO = decltype(partition_fragment_C(TiledMmaPV{}, Shape<BlkM, HeadDim>{}));  // (MMA, MMA_M, MMA_D)
  using RegP = decltype(make_tensor_like<Element>(std::declval<AccS&>()));            // (MMA, MMA_M, MMA_N)
  template <class T>
  using RowCol =
      decltype(make_tensor(std::declval<T&>().data(), acc_rowcol(std::declval<T&>().layout())));
  using RowColO = RowCol<AccO>;  // (rows, cols)
  using CoordS = decltype(std::declval<ThrQK&>().partition_C(
      make_identity_tensor(Shape<BlkM, BlkN>{})));  // (MMA, MMA_M, MMA_N)
  using RowColCoordS = RowCol<CoordS>;                // (rows, cols)
  using OperandP = decltype(make_tensor(
      std::declval<RegP&>().data(),
      acc_as_a_operand(std::declval<RegP&>().layout())));  // (MMA, MMA_M, MMA_K)
  static constexpr int kRows = decltype(size<0>(acc_rowcol(std::declval<AccO&>().layout())))::value;
};

// What the steps below share: the scores and the softmax of a key tile, O's rescale and V's
// release. Members are references to consume()'s registers and to the kernel's pipelines, as
// a lambda's captures would be, and only those these functions read.
template <class Tr, bool kSoftcap>
struct TileSoftmax {
  using T = ConsumerTypes<Tr>;
  static constexpr int kRows = T::kRows;

  const FwdBlock& blk;
  typename Tr::PipelineKV& pipeline_v;
  typename Tr::PipelineState& state_v;
  const int& ctid;  // the thread's index among the consumers
  typename T::SmemQ& sQ;
  typename T::SmemK& sK;
  typename T::RowColO& o;
  typename T::RowColCoordS& tScS_rc;
  Softmax<kRows>& softmax;
  const MaskPolicy& mask;
  const int& len_q;
  const int& len_k;
  const float& scale_log2;
  const float& softcap_pre;
  typename T::AccS& acc_s;
  float (&rescale)[kRows];  // the factors O's rows need before the next P V
  bool& moved;              // whether rescale may hold a factor other than 1 (warp-uniform)

  // ---- the softmax between the GEMMs --------------------------------------------------------
  // acc_s (MMA, MMA_M, MMA_N): S(n) → the scores of key tile n: softcap, then the mask
  // (per element only on the tiles the mask, or the end of the keys, cuts).
  __device__ void scores(int n) {
    const int j0 = n * Tr::kBlockN;
    Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
    if constexpr (kSoftcap) {
      CUTE_UNROLL
      for (int e = 0; e < size(s); ++e) s(e) = tanhf(s(e) * softcap_pre);
    }
    if (j0 + Tr::kBlockN > len_k ||
        !mask.tile_is_full(blk.i0, blk.i0 + blk.rows, j0, j0 + Tr::kBlockN, len_q, len_k))
      apply_mask(s, tScS_rc, mask, blk.i0, j0, len_q, len_k);
  }
  // acc_s: S(n) → P(n) (in place, fp32); rescale[kRows], moved: the factors O's rows need.
  // k_stage: the stage K(n) still holds, for kExpFirst's refill (fwd_softmax.cuh); -1 for the
  // block's first tile, where no row has a reference max yet.
  __device__ void softmax_step(int n, int k_stage) {
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
    } else {
      moved = softmax.update_voted(s, scale_log2, rescale);
    }
  }
  // acc_o (MMA, MMA_M, MMA_D): O's rows times rescale, skipped where no row of the warp moved
  // its max.
  __device__ void rescale_o() { Softmax<kRows>::rescale_o(o, rescale, moved); }
  __device__ void release_v() {
    pipeline_v.consumer_release(state_v);
    ++state_v;  // the state goes on to the next tile (persistent)
  }
};

// The steps of one query tile, once its Q has landed, on consume()'s registers (references).
// state_k, state_v: the rings' consumer states, carried from tile to tile (the persistent
// kernel); turns: this warpgroup's pingpong turns; h: the shared helpers. n, the key tile,
// is consume()'s loop variable, read through a reference.
template <class Tr, bool kSoftcap>
struct TileSteps {
  using T = ConsumerTypes<Tr>;
  // kExpFirst keeps K(n) until its softmax is done (the refill may read it again).
  static constexpr bool kHoldK = Tr::kMaxOrder == MaxOrder::kExpFirst;

  // consume()'s registers and pipelines by reference, one line each: a lambda's captures
  // spelled out (what the steps reach decides the SASS; see the top of this file).
  const FwdBlock& blk;
  typename Tr::PipelineKV& pipeline_k;
  typename Tr::PipelineKV& pipeline_v;
  typename Tr::PipelineState& state_k;
  typename Tr::PipelineState& state_v;
  typename Tr::TiledMmaQK& mma_qk;
  typename Tr::TiledMmaPV& mma_pv;
  typename T::DescQ& tSrQ;
  typename T::DescK& tSrK;
  typename T::DescV& tOrV;
  typename T::AccO& acc_o;
  typename T::AccS& acc_s;
  typename T::RegP& rP;
  typename T::OperandP& tOrP;
  Turns<Tr>& turns;
  TileSoftmax<Tr, kSoftcap>& h;
  // With Tr::kPollKvEarly: whether the next turn's K and V tiles were found landed.
  cutlass::ConsumerToken& k_landed;
  cutlass::ConsumerToken& v_landed;


  // ---- with the intra-warpgroup overlap -------------------------------------------------------
  // K and V advance through their rings in the same order, V one tile behind K.
  // acc_s ← S(n_end − 1) = Q K(n_end − 1)ᵀ, issued alone; then P(n_end − 1) in acc_s. O is
  // still 0, so its first rescale changes nothing.
  __device__ __forceinline__ void first_tile() {
    pipeline_k.consumer_wait(state_k);
    turns.take();
    warpgroup_gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
    turns.pass(false);
    warpgroup_wait_for<0>(acc_s);
    pipeline_k.consumer_release(state_k);
    ++state_k;
    h.softmax_step(blk.n_end - 1, -1);
  }
  // acc_s holds P(n + 1) (fp32) on entry and P(n) on return; acc_o += P(n + 1) V(n + 1), and
  // under Tr::kSoftmaxUnderPv that product is still in flight on return.
  // Where the wait for P V goes is Tr::kSoftmaxUnderPv. Under P V, the loop is rotated so
  // that the wait opens the next iteration: ptxas schedules within a basic block, and a wait
  // written after the softmax in the same block was moved up to the block's top, before the
  // softmax (CUDA 13.0: WARPGROUP.DEPBAR right after the mask's join). Written at the top of
  // the next iteration, past the back edge, the wait stays there (the SASS).
  // With Tr::kPollKvEarly, the barriers of the next turn's K and V tiles are tested (without
  // blocking) before the softmax; a tile found landed is then not waited for again, so the
  // barrier's round trip runs under the softmax instead of before the turn.
  __device__ __forceinline__ void overlapped_tile(const int& n) {
    if constexpr (Tr::kSoftmaxUnderPv) {
      warpgroup_wait_for<0>(acc_o, tOrP);  // P(n+2) V(n+2); none in the first iteration
      if (n != blk.n_end - 2) h.release_v();
    }
    h.rescale_o();                                  // O into S(n+1)'s max
    round_into(acc_s, rP);                        // P(n+1)
    pipeline_k.consumer_wait(state_k, k_landed);  // K(n)
    pipeline_v.consumer_wait(state_v, v_landed);  // V(n+1)
    turns.take();
    warpgroup_gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
    warpgroup_gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), acc_o);
    turns.pass(false);
    if constexpr (Tr::kSoftmaxUnderPv) {
      warpgroup_wait_for<1>(acc_s);  // S(n) is done; P V runs on under the softmax
    } else {
      warpgroup_wait_for<0>(acc_o, tOrP);  // both done
      warpgroup_fence_operand(acc_s);
      h.release_v();
    }
    const auto k_read = state_k;  // K(n)
    ++state_k;
    if constexpr (!kHoldK) pipeline_k.consumer_release(k_read);
    if constexpr (Tr::kPollKvEarly) {
      k_landed = pipeline_k.consumer_test_wait(state_k);  // K(n-1)
      // V(n). Under P V, V(n+1) is released only at the next iteration's top, so V(n) is
      // one past the state; otherwise V(n+1) has been released already.
      auto next_v = state_v;
      if constexpr (Tr::kSoftmaxUnderPv) ++next_v;
      v_landed = pipeline_v.consumer_test_wait(next_v);
    }
    h.softmax_step(n, k_read.index());
    if constexpr (kHoldK) pipeline_k.consumer_release(k_read);
  }
  // acc_s holds P(n_begin) (fp32); acc_o += P(n_begin) V(n_begin), completed on return.
  __device__ __forceinline__ void last_pv() {
    if constexpr (Tr::kSoftmaxUnderPv) {
      warpgroup_wait_for<0>(acc_o, tOrP);
      if (blk.n_end - blk.n_begin > 1) h.release_v();
    }
    h.rescale_o();
    round_into(acc_s, rP);
    pipeline_v.consumer_wait(state_v);
    turns.take();
    warpgroup_gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), acc_o);
    turns.pass(true);
    warpgroup_wait_for<0>(acc_o, tOrP);
    h.release_v();
  }

  // ---- without it -----------------------------------------------------------------------------
  // Key tile n alone: acc_s ← S(n), then P(n); acc_o += P(n) V(n), each wgmma batch waited
  // for in place.
  __device__ __forceinline__ void serial_tile(const int& n) {
    pipeline_k.consumer_wait(state_k);
    turns.take();
    warpgroup_gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), acc_s);
    turns.pass(false);
    warpgroup_wait_for<0>(acc_s);
    const auto k_read = state_k;  // K(n)
    ++state_k;
    if constexpr (!kHoldK) pipeline_k.consumer_release(k_read);
    h.softmax_step(n, n == blk.n_end - 1 ? -1 : int(k_read.index()));
    if constexpr (kHoldK) pipeline_k.consumer_release(k_read);
    h.rescale_o();
    round_into(acc_s, rP);
    pipeline_v.consumer_wait(state_v);
    turns.take();
    warpgroup_gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, state_v.index()), acc_o);
    turns.pass(n == blk.n_begin);
    warpgroup_wait_for<0>(acc_o, tOrP);
    pipeline_v.consumer_release(state_v);
    ++state_v;
  }
};

// The consumer side of one query tile: its registers, the key tiles [n_begin, n_end) last to
// first (TileSteps), then the epilogue. A tile with no key stores O = 0 and LSE = −inf.
template <class Tr, bool kSoftcap>
__device__ __forceinline__ void consume(const FwdParams& p, const EpilogueParams<Tr>& ep,
                                        const FwdBlock& blk, typename Tr::SharedStorage& ss,
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
  // The consumer warpgroup, broadcast from lane 0 so that ptxas can prove it warp-uniform:
  // the shared-memory descriptors, built from the warpgroup's first thread's slice, and the
  // pingpong barrier ids then stay in uniform registers (from a per-thread index they are
  // built in vector registers and moved by R2UR before each use).
  const int wg = __shfl_sync(0xffffffffu, ctid / 128, 0);
  auto thr_qk = mma_qk.get_thread_slice(ctid);
  auto wg_qk = mma_qk.get_slice(wg * 128);
  auto wg_pv = mma_pv.get_slice(wg * 128);
  Tensor tSrQ = wg_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_D): descriptors
  Tensor tSrK = wg_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_D, STAGES)
  Tensor tOrV = wg_pv.partition_fragment_B(sVt);  // (MMA, MMA_D, MMA_N, STAGES)
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D)
  clear(acc_o);

  // (row, key) of each score this thread holds, as (rows, cols) like the scores themselves.
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<BlkM, BlkN>{}));  // (MMA, MMA_M, MMA_N)
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));         // (rows, cols)

  constexpr int kRows = ConsumerTypes<Tr>::kRows;
  Softmax<kRows> softmax;
  const MaskPolicy mask = p.mask;
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k;
  // Softcap: logit = cap·tanh(s·scale / cap), so the softmax sees tanh(·) scaled by cap·log2 e.
  const float scale_log2 = kSoftcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = kSoftcap ? p.scale / mask.softcap : 0.f;
  Turns<Tr> turns{wg};

  Tensor o = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));  // (rows, cols)
  if (blk.n_end > blk.n_begin) {
    if constexpr (Tr::kPingpong) {  // the first turn, to warpgroup 0
      if (wg == Turns<Tr>::kNWg - 1) cutlass::arch::NamedBarrier::arrive(256, Tr::kSchedulerBarrier);
    }
    Tensor acc_s = partition_fragment_C(mma_qk, Shape<BlkM, BlkN>{});     // (MMA, MMA_M, MMA_N)
    Tensor rP = make_tensor_like<Element>(acc_s);                         // (MMA, MMA_M, MMA_N)
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand(rP.layout()));  // (MMA, MMA_M, MMA_K)
    float rescale[kRows];
    bool moved = true;
    TileSoftmax<Tr, kSoftcap> helpers{blk,   pipeline_v, state_v,    ctid,        sQ,
                                      sK,    o,          tScS_rc,    softmax,     mask,
                                      len_q, len_k,      scale_log2, softcap_pre, acc_s,
                                      rescale, moved};
    cutlass::ConsumerToken k_landed{cutlass::BarrierStatus::WaitAgain};
    cutlass::ConsumerToken v_landed{cutlass::BarrierStatus::WaitAgain};
    TileSteps<Tr, kSoftcap> steps{blk,    pipeline_k, pipeline_v, state_k, state_v,  mma_qk,
                                  mma_pv, tSrQ,       tSrK,       tOrV,    acc_o,    acc_s,
                                  rP,     tOrP,       turns,      helpers, k_landed, v_landed};
    if constexpr (Tr::kIntraOverlap) {
      steps.first_tile();
      for (int n = blk.n_end - 2; n >= blk.n_begin; --n) steps.overlapped_tile(n);
      steps.last_pv();
    } else {
      for (int n = blk.n_end - 1; n >= blk.n_begin; --n) steps.serial_tile(n);
    }
  }

  // A NaN or Inf in O may be a masked key's V reaching it through 0 · NaN in the wgmma:
  // such rows are summed again from global memory (cuda/nonfinite.cuh). The coordinates of
  // O's values are built only inside that out-of-line call (cuda::redo_rows).
  auto coords_of = [ctid] {
    Tensor tOcO = typename Tr::TiledMmaPV{}.get_thread_slice(ctid).partition_C(
        make_identity_tensor(Shape<BlkM, HeadDim>{}));
    return make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));  // (rows, cols)
  };
  cuda::redo_nonfinite_rows<Tr>(p, blk, o, coords_of, softmax);

  // Hand-off to the epilogue: O / ℓ and each row's LSE (fwd_epilogue.cuh).
  float lse[kRows];
  softmax.finish(o, scale_log2, 1.f, lse);
  store_output<Tr>(p, ep, blk, ss, acc_o, lse, ctid);
}

}  // namespace flashlab::sm90
