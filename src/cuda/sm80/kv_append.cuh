// The KV cache's rows, read through clamped tables, and cute_fa2's append kernel (the first
// of kv_kernel.cuh's three): the new rows k_new/v_new written into the cache at
// cache_seqlens[b] and, with rotary, k_new rotated on the way and q rotated into the
// workspace (KvCacheParams::q_rot), where the split-KV kernel reads it. Rotary adds no
// launch: the append kernel runs whenever k_new is given, and FlashAttention-2 rotates only
// with k_new.
//
// Rotary (FlashAttention-2's apply_rotary_emb): position pos turns each pair (x_a, x_b) of
// the first rotary_dim channels into (x_a·cos − x_b·sin, x_a·sin + x_b·cos) with row pos of
// rotary_cos/rotary_sin; pairs (2i, 2i + 1) when interleaved, else (i, i + rotary_dim/2);
// channels past rotary_dim are copied. fp32 arithmetic without FMAs, rounded once to the
// dtype: python/flashlab/_rotary.py's result.
#pragma once

#include "common/params.h"
#include "cuda/common.cuh"

namespace flashlab::sm80 {

// ---- the cache, read through clamped tables ----------------------------------------------
struct CacheSeq {
  int cached;  // c_b: rows already in the cache, where the new ones go
  int start;   // s_b: the sequence's first row (cache_leftpad[b]); key j is row s_b + j
  int len;     // L_b − s_b: the keys attended to
  int row;     // the cache's batch_cache row (contiguous caches)
};

__device__ __forceinline__ int clamp_to(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

__device__ __forceinline__ CacheSeq cache_seq(const KvCacheParams& p, int b) {
  const int room = p.seqlen_k - p.seqlen_new;
  const int c = p.cache_seqlens ? clamp_to(p.cache_seqlens[b * p.cache_seqlens_stride], 0, room) : room;
  const int row = p.cache_batch_idx
                      ? clamp_to(p.cache_batch_idx[b * p.cache_batch_idx_stride], 0, p.cache_rows - 1)
                      : b;
  const int start = p.cache_leftpad ? clamp_to(p.cache_leftpad[b * p.cache_leftpad_stride], 0, c) : 0;
  return {c, start, c + p.seqlen_new - start, row};
}

// The page that holds cache row `pos` of sequence b (paged caches).
__device__ __forceinline__ int64_t page_of(const KvCacheParams& p, int b, int pos) {
  return clamp_to(p.block_table[b * p.block_table_batch_stride + (pos / p.page_size) * p.block_table_page_stride],
                  0, p.cache_rows - 1);
}

// Element offset of cache row `pos` (< seqlen_k; a row of the cache, not a key index) of
// sequence b, head 0, in a cache with these batch (or page) and row strides.
__device__ __forceinline__ int64_t cache_offset(const KvCacheParams& p, const CacheSeq& s, int b,
                                                int pos, int64_t batch_stride, int64_t row_stride) {
  if (p.block_table)
    return page_of(p, b, pos) * batch_stride + int64_t(pos % p.page_size) * row_stride;
  return s.row * batch_stride + int64_t(pos) * row_stride;
}

// ---- append ------------------------------------------------------------------------------
// `heads` head vectors of `dim` elements, src → dst (head strides in elements), turned at
// rotary position pos (clamped to the tables' rows) by the block's threads.
template <class Element>
__device__ __forceinline__ void rotate_heads(Element* dst, int64_t dst_head, const Element* src,
                                             int64_t src_head, int heads, int dim,
                                             const KvCacheParams& p, int pos) {
  pos = clamp_to(pos, 0, p.seqlen_ro - 1);
  const Element* cos = static_cast<const Element*>(p.rotary_cos) + int64_t(pos) * p.rotary_cos_stride;
  const Element* sin = static_cast<const Element*>(p.rotary_sin) + int64_t(pos) * p.rotary_sin_stride;
  const int half = p.rotary_dim / 2, rest = dim - p.rotary_dim;
  for (int e = threadIdx.x; e < heads * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    const int ia = p.rotary_interleaved ? 2 * i : i, ib = p.rotary_interleaved ? 2 * i + 1 : i + half;
    const float c = float(cos[i]), s = float(sin[i]);
    const float xa = float(src[h * src_head + ia]), xb = float(src[h * src_head + ib]);
    // Unfused (the _rn intrinsics are never contracted into FMAs): the rounding of the
    // Python reference's fp32 operations, bit for bit.
    dst[h * dst_head + ia] = Element(__fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)));
    dst[h * dst_head + ib] = Element(__fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c)));
  }
  for (int e = threadIdx.x; e < heads * rest; e += blockDim.x) {
    const int h = e / rest, d = p.rotary_dim + e % rest;
    dst[h * dst_head + d] = src[h * src_head + d];
  }
}

// The rows of a launch: the new rows, and with rotary q's rows too.
inline int kv_append_rows(const KvCacheParams& p) {
  return p.rotary_cos != nullptr && p.seqlen_q > p.seqlen_new ? p.seqlen_q : p.seqlen_new;
}

// grid (kv_append_rows, heads_kv, batch), 128 threads: row t of k_new/v_new → cache row c_b + t
// (k rotated at c_b + t with rotary), and with rotary row t of q's heads of KV head hk's
// group → q_rot, rotated at c_b + t (rotary_per_query) or c_b.
template <class Element>
__global__ void __launch_bounds__(128) kv_append_kernel(const __grid_constant__ KvCacheParams p) {
  cuda::wait_for_prior_grid();  // launched early (launch_after): the caller's writes first
  cuda::allow_dependents();     // the split-KV kernel may start; it waits for this one
  const int t = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const CacheSeq s = cache_seq(p, b);
  const bool rotary = p.rotary_cos != nullptr;
  if (t < p.seqlen_new) {
    const int pos = s.cached + t;
    Element* k = static_cast<Element*>(const_cast<void*>(p.k)) + hk * p.k_head_stride +
                 cache_offset(p, s, b, pos, p.k_batch_stride, p.k_row_stride);
    Element* v = static_cast<Element*>(const_cast<void*>(p.v)) + hk * p.v_head_stride +
                 cache_offset(p, s, b, pos, p.v_batch_stride, p.v_row_stride);
    const Element* kn = static_cast<const Element*>(p.k_new) + b * p.kn_batch_stride +
                        t * p.kn_row_stride + hk * p.kn_head_stride;
    const Element* vn = static_cast<const Element*>(p.v_new) + b * p.vn_batch_stride +
                        t * p.vn_row_stride + hk * p.vn_head_stride;
    if (rotary)
      rotate_heads(k, 0, kn, 0, 1, p.head_dim, p, pos);
    else
      for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) k[d] = kn[d];
    for (int d = threadIdx.x; d < p.head_dim_v; d += blockDim.x) v[d] = vn[d];
  }
  if (rotary && t < p.seqlen_q) {
    const int h0 = hk * p.group;
    const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride + t * p.q_row_stride +
                       h0 * p.q_head_stride;
    Element* q_rot = static_cast<Element*>(p.q_rot) + ((int64_t(b) * p.seqlen_q + t) * p.heads_q + h0) * p.head_dim;
    rotate_heads(q_rot, p.head_dim, q, p.q_head_stride, p.group, p.head_dim, p,
                 s.cached + (p.rotary_per_query ? t : 0));
  }
}

}  // namespace flashlab::sm80
