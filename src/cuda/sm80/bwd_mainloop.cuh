// The backward's collective mainloop (sm80 path): loads and MMAs. K and V once per CTA; per
// query block Q and dO by cp.async (double-buffered where shared memory allows, so that the
// next block's land during this one's products), and five products on mma.sync:
// S = Q Kᵀ and dP = dO Vᵀ (gemm_ss_lines or gemm_ss, collective_common.cuh), then
// dV += Pᵀ dO, dQ = dS K and dK += dSᵀ Q (gemm_ss), their operands read from shared memory
// by ldmatrix, transposed where a product reduces over rows or keys. The loop that issues
// them is bwd_kernel.cuh's. dK and dV stay in registers; dQ, shared between key blocks, goes
// into the workspace's fp32 accumulator by vector reductions (below), spread over dK's
// k-steps, and in deterministic mode one key block after another (turn counters).
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/sm80/collective_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

// ---- dQ's reductions ---------------------------------------------------------------------
// *dst += (a, b, c, d) in global memory (dst 16-byte aligned): one vector reduction on
// sm_90, four scalar ones before. Written as `red` in PTX: atomicAdd on a vector compiles to
// an ATOMG whose (unused) result the warp still waits for, a long-scoreboard stall per add.
// No "memory" clobber: nothing in the kernel reads dQ back, and the deterministic mode's
// fence and barrier order the adds before its turn is passed on.
__device__ __forceinline__ void add_quad(float4* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d));
#else
  float* f = reinterpret_cast<float*>(dst);
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f), "f"(a));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f + 1), "f"(b));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f + 2), "f"(c));
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(f + 3), "f"(d));
#endif
}

// v, made to depend on dep without changing it: v | (dep & zero) bitwise, where zero is 0 at
// run time but unknown to the compiler (one LOP3). ptxas schedules an instruction as soon as
// its operands allow, so dQ's reductions, whose values are ready before dK's product starts,
// all issued at that product's first k-steps whatever the source order (the SASS: 8 of 8
// at head dim 64, 16 of 16 at 256), queueing behind each other and holding their source
// registers against the next loads. Tied to an accumulator of the k-step they follow, they
// cannot issue before it.
__device__ __forceinline__ float after(float v, float dep, uint32_t zero) {
  return __uint_as_float(__float_as_uint(v) | (__float_as_uint(dep) & zero));
}

// The reductions that k-step k of dK's product carries: float4s [k·kPerStep, (k + 1)·kPerStep)
// of this thread's kQuads in its dQ accumulator chunk (DqChunk: float4 j at
// dq_chunk + j·kStride), each held after dep, an accumulator of k-step k (see after()).
template <int kQuads, int kPerStep, int kStride, class AccDq>
__device__ __forceinline__ void add_dq_quads(float4* dq_chunk, AccDq const& acc_dq, int k,
                                             float dep, uint32_t zero) {
  CUTE_UNROLL
  for (int j = k * kPerStep; j < (k + 1) * kPerStep && j < kQuads; ++j)
    add_quad(dq_chunk + j * kStride, after(acc_dq(4 * j), dep, zero),
             after(acc_dq(4 * j + 1), dep, zero), after(acc_dq(4 * j + 2), dep, zero),
             after(acc_dq(4 * j + 3), dep, zero));
}

// ---- deterministic mode: key blocks take turns on a query block ---------------------------

// The CTA waits until `turn` (the query block's counter, reset by the preprocess) reaches
// `mine`, its key block's place among those that see the query block: first key block first.
__device__ __forceinline__ void wait_turn(const int* turn, int mine, int tid) {
  if (tid == 0)
    while (cuda::load_acquire(turn) != mine) {
    }
  __syncthreads();
}
// Passes the turn on once every thread's adds are done and visible.
__device__ __forceinline__ void pass_turn(int* turn, int tid) {
  __threadfence();
  __syncthreads();  // every thread's adds are done (and visible) ...
  if (tid == 0) cuda::add_release(turn, 1);  // ... before the next key block's turn
}

}  // namespace flashlab::sm80
