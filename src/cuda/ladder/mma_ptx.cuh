// The PTX that rung 4 (04_fa2_mma.cu) writes by hand: cp.async global → shared copies,
// ldmatrix fragment loads, the m16n8k16 tensor-core MMA, fp16/bf16 packing, %laneid and
// the SFU's exp2. Each wrapper is one instruction (or a fixed pair), so the rung's kernel
// reads as the algorithm while its fragments stay visible here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashlab::cuda::mma_ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 16-byte global → shared copy, cached in L2 only (each K/V tile is read once per CTA).
// With valid == false it reads nothing (src-size 0) and zero-fills the 16 bytes.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8×8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8, and
// register i of every lane receives 2 elements of matrix i (row lane/4, columns
// 2·(lane%4) and +1; with kTrans the matrix is transposed first).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a·b for one m16n8k16 tile, fp32 accumulate. Fragments (g = lane/4, c = 2·(lane%4)):
//   a (16×16): a0 = A[g][c..c+1], a1 = A[g+8][c..c+1], a2 = A[g][c+8..], a3 = A[g+8][c+8..]
//   b (16×8):  b0 = B[c..c+1][g], b1 = B[c+8..c+9][g]
//   d (16×8):  d0,d1 = D[g][c..c+1], d2,d3 = D[g+8][c..c+1]
template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to T, `lo` in the low half (the lower column, as fragments want).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&bits, &h, sizeof(bits));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &h, sizeof(bits));
  }
  return bits;
}

// %laneid through volatile asm: the compiler reads it afresh where it is used instead of
// keeping an earlier copy alive (see store_output).
__device__ __forceinline__ int lane_id() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
  return lane;
}

// 2^x on the special-function unit; 2^-inf = +0, which is what a masked logit needs.
__device__ __forceinline__ float exp2_sfu(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashlab::cuda::mma_ptx
