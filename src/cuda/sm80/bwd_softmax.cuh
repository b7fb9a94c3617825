// The backward's softmax (sm80 path): P recomputed from the forward's LSE instead of stored,
// and dS from it. The preprocess gives every query row D = rowsum(dO ∘ O) and LSE·log2 e
// (and zeroes the dQ accumulator while its loads are in flight); per query block the main
// kernel then turns S into P = 2^(S·scale·log2 e − LSE·log2 e), zeroes what the mask hides,
// draws dropout's factors, and forms dS = P ∘ (dP − D) in dP's registers.
#pragma once

#include <cute/tensor.hpp>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/constants.h"
#include "common/dropout.h"
#include "common/mask.h"
#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_workspace.cuh"
#include "cuda/sm80/collective_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

constexpr int kRowKernelThreads = 256;  // preprocess
constexpr int kRowKernelWarps = kRowKernelThreads / 32;

// The preprocess moves 16 bytes per lane: a row of D elements is D/8 chunks of dO and O
// (8 to 32). A row is read by a group of kLanes lanes (the chunk count rounded up to a power
// of two, so that a warp holds 32/kLanes whole rows and few lanes idle), and a CTA's kBlockM
// rows take kPasses passes of its 8 warps. Every CUDA tensor's base and strides are
// multiples of 16 bytes (api.cpp), so the chunks are aligned.
template <class Tr>
struct RowChunks {
  static constexpr int kElems = 16 / int(sizeof(typename Tr::Element));  // elements per chunk
  static constexpr int kChunks = Tr::kHeadDim / kElems;                   // chunks per row
  static constexpr int kLanes = kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kRowsPerPass = kRowKernelWarps * (32 / kLanes);
  static constexpr int kPasses = Tr::kBlockM / kRowsPerPass;
  static_assert(Tr::kHeadDim % kElems == 0 && kChunks <= 32, "a warp covers a row in chunks");
  static_assert(Tr::kBlockM % kRowsPerPass == 0, "the passes cover the block's rows evenly");
  // This thread's row within pass 0, and its chunk of the row (valid when < kChunks).
  __device__ __forceinline__ static int row(int tid) { return tid / kLanes; }
  __device__ __forceinline__ static int chunk(int tid) { return tid % kLanes; }
};

// acc + Σ a[e]·b[e] over the 8 16-bit elements of two chunks.
template <class Element>
__device__ __forceinline__ float dot_chunk(const uint4& a, const uint4& b, float acc) {
  using Pair = std::conditional_t<std::is_same_v<Element, cutlass::half_t>, __half2, __nv_bfloat162>;
  const Pair* x = reinterpret_cast<const Pair*>(&a);
  const Pair* y = reinterpret_cast<const Pair*>(&b);
  CUTE_UNROLL
  for (int i = 0; i < 4; ++i) {
    float2 fx, fy;
    if constexpr (std::is_same_v<Element, cutlass::half_t>) {
      fx = __half22float2(x[i]);
      fy = __half22float2(y[i]);
    } else {
      fx = __bfloat1622float2(x[i]);
      fy = __bfloat1622float2(y[i]);
    }
    acc = fmaf(fx.x, fy.x, fmaf(fx.y, fy.y, acc));
  }
  return acc;
}

// ---- preprocess --------------------------------------------------------------------------
// D and LSE·log2 e of one query block's rows, by the preprocess kernel's CTA
// (kRowKernelThreads threads, grid (ceil(seqlen_q / kBlockM), heads_q, batch)): one CTA per
// query block of the main kernel, so it also resets that block's deterministic turn counter.
// A batch of passes has all its loads in flight before the first is used; the block's dQ
// accumulator chunk is zeroed (16-byte stores by all threads) while the first batch's loads
// are in flight.
template <class Tr>
__device__ __forceinline__ void row_stats(const BwdParams& p, const BwdWorkspace& ws) {
  using Element = typename Tr::Element;
  using Chunks = RowChunks<Tr>;
  const int m_block = int(blockIdx.x), h = int(blockIdx.y), b = int(blockIdx.z);
  const int tid = int(threadIdx.x), c = Chunks::chunk(tid);
  if (ws.dq_turn != nullptr && tid == 0)
    ws.dq_turn[(int64_t(b) * p.heads_q + h) * gridDim.x + m_block] = 0;
  const cuda::SeqInfo seq = cuda::seq_info(p, b);
  const int i0 = m_block * Tr::kBlockM;
  const int rows = min(Tr::kBlockM, seq.len_q - i0);
  if (rows <= 0) return;  // varlen: a shorter sequence; no barrier below
  const int64_t ws_row0 = bwd_ws_row(p, seq, b, h) + i0;
  const bool chunk_lane = c < Chunks::kChunks;
  auto row_of = [&](int pass) { return Chunks::row(tid) + pass * Chunks::kRowsPerPass; };

  // Passes in batches of up to 4 whose loads are in flight together (8 would hold 64
  // registers of chunks and halve the CTAs an SM holds, at head dims 192 and 256).
  constexpr int kBatch = Chunks::kPasses < 4 ? Chunks::kPasses : 4;
  static_assert(Chunks::kPasses % kBatch == 0, "whole batches");
  CUTE_UNROLL
  for (int pass0 = 0; pass0 < Chunks::kPasses; pass0 += kBatch) {
    uint4 dout_c[kBatch], o_c[kBatch];  // this lane's chunk of each pass's row
    CUTE_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      const int r = row_of(pass0 + i);
      if (r < rows && chunk_lane) {
        const int64_t row = seq.start_q + i0 + r;
        const char* o = static_cast<const char*>(p.out) +
                        (b * p.o_batch_stride + row * p.o_row_stride + h * p.o_head_stride) *
                            int64_t(sizeof(Element));
        const char* dout = static_cast<const char*>(p.dout) +
                           (b * p.do_batch_stride + row * p.do_row_stride + h * p.do_head_stride) *
                               int64_t(sizeof(Element));
        o_c[i] = reinterpret_cast<const uint4*>(o)[c];
        dout_c[i] = reinterpret_cast<const uint4*>(dout)[c];
      } else {
        o_c[i] = dout_c[i] = make_uint4(0, 0, 0, 0);
      }
    }
    if (pass0 == 0) {  // the zeroing stores go out while the first loads are in flight
      float4* dq = DqChunk<Tr>::at(p, ws, seq, b, h, i0);
      for (int e = tid; e < DqChunk<Tr>::kFloats / 4; e += kRowKernelThreads)
        dq[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    CUTE_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      float acc = dot_chunk<Element>(dout_c[i], o_c[i], 0.f);
      CUTE_UNROLL
      for (int off = Chunks::kLanes / 2; off > 0; off >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, off);  // within the row's lane group
      const int r = row_of(pass0 + i);
      if (c == 0 && r < rows) {
        const float lse =
            p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + seq.start_q + i0 + r];
        ws.dsum[ws_row0 + r] = acc;
        ws.lse_log2[ws_row0 + r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      }
    }
  }
}

// ---- per query block ----------------------------------------------------------------------
// Zeroes the probabilities of (row, key) pairs the mask hides, and of keys at or past len_k.
// p and coords are (rows, cols) views of the P accumulator and of the tile's identity tensor;
// the tile starts at query row i0 and key j0.
template <class P, class C>
__device__ __forceinline__ void mask_probs(P& p, C const& coords, const MaskPolicy& mask, int i0,
                                           int j0, int len_q, int len_k) {
  CUTE_UNROLL
  for (int r = 0; r < size<0>(p); ++r) {
    const int i = i0 + get<0>(coords(r, 0));
    const int lo = mask.key_begin(i, len_q, len_k) - j0;
    const int hi = mask.key_end(i, len_q, len_k) - j0;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(p); ++c) {
      const int j = get<1>(coords(r, c));
      if (j < lo || j >= hi) p(r, c) = 0.f;
    }
  }
}

// The dropout factor of each probability: 1/(1 − p) where kept, 0 where dropped.
// keep (MMA, MMA_M, MMA_N) is shaped like the S accumulator; coords(0, m, n) is the
// (row, key) of value 0 of this thread's m16n8 fragment (m, n), whose four values are the
// four words of one Philox call (common/dropout.h).
// Walks the fragments as the forward's apply_dropout does (fwd_softmax.cuh); it keeps each
// factor for dS instead of zeroing P in place.
template <class Keep, class C>
__device__ __forceinline__ void dropout_factors(Keep& keep, C const& coords,
                                                const DropoutPolicy& d, uint32_t bh, int i0,
                                                int j0) {
  static_assert(decltype(size<0>(keep))::value == 4, "an m16n8 C fragment holds 4 values");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(keep); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<2>(keep); ++n) {
      const Philox4 bits =
          d.block_bits(bh, i0 + get<0>(coords(0, m, n)), j0 + get<1>(coords(0, m, n)));
      CUTE_UNROLL
      for (int v = 0; v < 4; ++v) keep(v, m, n) = bits.w[v] >= d.threshold ? d.rescale : 0.f;
    }
  }
}

// Softcap: s ← tanh(s · pre) (the logit over cap, pre = scale / cap) and dlogit ← 1 − tanh²,
// d logit / d s up to the factor scale that dK and dQ take at the end. s, dlogit (rows, cols).
template <class S, class DLogit>
__device__ __forceinline__ void softcap_scores(S& s, DLogit& dlogit, float pre) {
  CUTE_UNROLL
  for (int e = 0; e < size(s); ++e) {
    s(e) = tanhf(s(e) * pre);
    dlogit(e) = 1.f - s(e) * s(e);
  }
}

// P = 2^(s·scale_log2 − LSE·log2 e), recomputed over s (rows, cols); a row past the block's
// end has LSE +inf, so P = 0.
template <int kRows, class S>
__device__ __forceinline__ void probs_from_lse(S& s, float scale_log2,
                                               const float (&lse_log2)[kRows]) {
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s); ++c)
      s(r, c) = exp2_approx(fmaf(s(r, c), scale_log2, -lse_log2[r]));
  }
}

// dS = P ∘ (dP − D) · d logit over dP (the softmax scale comes later), and P for dV; with
// dropout, dP and P are taken through the factors keep (0 where dropped, else 1/(1 − p)).
// kSoftcap: softcap may be on (decided at run time by `softcap`). All (rows, cols) views.
template <bool kDropout, bool kSoftcap, int kRows, class DP, class S, class Keep, class DLogit>
__device__ __forceinline__ void ds_from_dp(DP& dp, S& s, Keep const& keep, DLogit const& dlogit,
                                           const float (&dsum)[kRows], bool softcap) {
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s); ++c) {
      float dpv = dp(r, c);
      if constexpr (kDropout) dpv *= keep(r, c);
      float ds = s(r, c) * (dpv - dsum[r]);
      if constexpr (kSoftcap) {
        if (softcap) ds *= dlogit(r, c);
      }
      dp(r, c) = ds;
      if constexpr (kDropout) s(r, c) *= keep(r, c);
    }
  }
}

}  // namespace flashlab::sm80
