// The Hopper forward kernel (`cute_fa3`, sm_90a): the layers wired to warpgroups, and the
// launch (tensor maps built on the host per call).
//   tile scheduler  fwd_scheduler.cuh   one CTA per (batch, head, query block), longest
//                                       first; or (the ablation cute_fa3_persistent) one
//                                       per SM taking tiles longest first as it frees up
//   mainloop        fwd_mainloop.cuh    TMA producer; wgmma issue and wait
//   consumer        fwd_consumer.cuh    a consumer warpgroup's walk over the key tiles
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
// (the ablations): pingpong (the warpgroups take turns on the tensor cores, so one's softmax
// hides under another's GEMMs) and the intra-warpgroup overlap (S of the next tile is issued
// with P V of this one, and at head dims 128 and 256 its softmax runs while P V is still in
// flight: kSoftmaxUnderPv, which needs the loop rotated past ptxas, see fwd_consumer.cuh).
// A third switch, kPersistent, picks the persistent tile scheduler (fwd_scheduler.cuh); it
// measured slower than one CTA per tile, so only its ablation turns it on.
// At head dim 128 each consumer warpgroup's own loop, not the tensor pipe, sets the pace;
// the tree row max, kPollKvEarly and the softmax's order (the traits' MaxOrder) shorten it
// (docs/sm90/fwd.md, "The consumer loop" and "The softmax"). Measured on H100 (bf16,
// alternating A/B against cuDNN in one process): 4x4096x16x128 635 TFLOP/s, 1.065x;
// 2x8192x16x128 659, 1.09x (causal 615, 1.17x); 2x8192x8x256 764, 1.14x; 2x8192x32x64
// causal 456, 1.07x. docs/sm90/fwd.md has the method, the sweep, ncu's cycle counts and
// what each technique adds.
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
#include "cuda/sm90/fwd_consumer.cuh"
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
  const auto pipe = tma_pipeline_params<PipelineKV>(producer, Tr::kTmaBytesKV, Tr::kNConsumerThreads);
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
        // shared-memory descriptors) goes through per-thread registers and an R2UR before
        // each wgmma, which costs 5-7% (H100, bf16 head dim 128).
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
