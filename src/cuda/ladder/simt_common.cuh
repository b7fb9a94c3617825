// Helpers every CUDA-core (SIMT) rung shares: fp32 float4 arithmetic on shared-memory
// tiles, 16-byte global loads converted to fp32, and ragged 4-wide stores. Used by
// 02_fa1.cu, 03_fa2_simt.cu and 05_fa2_simt_bwd.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/common.cuh"

namespace flashlab::cuda::simt {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float4 load_float4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// Component i (a compile-time constant after unrolling) of v.
__device__ __forceinline__ float comp(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// acc += a · b, four lanes at a time.
__device__ __forceinline__ void axpy4(float4& acc, float a, const float4& b) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

// 16 bytes of T from global memory as floats; elements at or past `valid` read nothing
// and become 0 (the ragged end of a head dim that is not a multiple of the chunk).
template <class T>
__device__ __forceinline__ void load_chunk(const T* src, int valid, float (&dst)[16 / sizeof(T)]) {
  constexpr int kElems = 16 / int(sizeof(T));
  if (valid >= kElems) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    T elems[kElems];
    memcpy(elems, &raw, sizeof(raw));
#pragma unroll
    for (int e = 0; e < kElems; ++e) dst[e] = to_float(elems[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kElems; ++e) dst[e] = e < valid ? to_float(src[e]) : 0.f;
  }
}

// Copies kRows rows of global memory (row r at src + r·row_stride) into a [kRows][kCols]
// fp32 tile, column c of row r at r·kCols + (c ^ swizzle(r)): swizzle returns 0 for a
// row-major tile (rungs 2 and 3), a bank-spreading XOR of whole float4 slots in rung 5.
// Rows at or past rows_valid and columns at or past cols_valid become 0 (and are not
// read). kThreads_ threads share the copy, 16 bytes of global memory each at a time;
// consecutive threads take consecutive chunks of a row, so the loads are coalesced.
template <class T, int kRows, int kCols, int kThreads_, class Swizzle>
__device__ __forceinline__ void load_tile(float* tile, const T* src, int64_t row_stride,
                                          int rows_valid, int cols_valid, int thread,
                                          Swizzle swizzle) {
  constexpr int kElems = 16 / int(sizeof(T));
  constexpr int kChunksPerRow = kCols / kElems;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads_ == 0, "every thread copies the same number of chunks");
#pragma unroll 2
  for (int i = 0; i < kChunks / kThreads_; ++i) {
    const int chunk = thread + i * kThreads_;
    const int r = chunk / kChunksPerRow, c = chunk % kChunksPerRow * kElems;
    const bool row_ok = r < rows_valid;
    float x[kElems];
    load_chunk(src + (row_ok ? r * row_stride + c : 0), row_ok ? cols_valid - c : 0, x);
    const int swz = swizzle(r);
#pragma unroll
    for (int e = 0; e < kElems; e += 4)
      *reinterpret_cast<float4*>(tile + r * kCols + ((c + e) ^ swz)) =
          make_float4(x[e], x[e + 1], x[e + 2], x[e + 3]);
  }
}

// Four consecutive output elements; only the first `valid` are written when fewer than 4
// remain in the head. The vector store is aligned: channels start at multiples of 4 and
// rows at multiples of 16 bytes (the API's CUDA rule).
template <class T>
__device__ __forceinline__ void store4(T* dst, const float4& x, int valid) {
  if (valid >= 4) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float4*>(dst) = x;
    } else {
      const T elems[4] = {from_float<T>(x.x), from_float<T>(x.y), from_float<T>(x.z),
                          from_float<T>(x.w)};
      uint2 bits;
      memcpy(&bits, elems, sizeof(bits));
      *reinterpret_cast<uint2*>(dst) = bits;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 3; ++e)
      if (e < valid) dst[e] = from_float<T>(comp(x, e));
  }
}

}  // namespace flashlab::cuda::simt
