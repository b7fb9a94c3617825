// The KV cache's rows, read through clamped tables, and the append: the new rows k_new/v_new
// written into the cache at cache_seqlens[b], k rotated on the way with rotary (HeldRow, which
// the split-KV kernel of kv_kernel.cuh reads early and writes late; append_row in line, for
// kv_append_kernel, which runs for a call with no query rows). FlashAttention-2 rotates only
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

// The page that holds cache row `pos` of sequence b (paged caches): the table's entry as
// written (page_entry), and clamped to the pool (page_of).
__device__ __forceinline__ int page_entry(const KvCacheParams& p, int b, int pos) {
  return p.block_table[b * p.block_table_batch_stride + (pos / p.page_size) * p.block_table_page_stride];
}
__device__ __forceinline__ int64_t page_of(const KvCacheParams& p, int b, int pos) {
  return clamp_to(page_entry(p, b, pos), 0, p.cache_rows - 1);
}

// Element offset of cache row `pos` (< seqlen_k; a row of the cache, not a key index) of
// sequence b, head 0, in a cache with these batch (or page) and row strides; `page` is
// page_of(p, b, pos) in a paged cache, read by the caller (unused otherwise).
__device__ __forceinline__ int64_t row_offset(const KvCacheParams& p, const CacheSeq& s, int64_t page,
                                              int pos, int64_t batch_stride, int64_t row_stride) {
  if (p.block_table) return page * batch_stride + int64_t(pos % p.page_size) * row_stride;
  return s.row * batch_stride + int64_t(pos) * row_stride;
}
__device__ __forceinline__ int64_t cache_offset(const KvCacheParams& p, const CacheSeq& s, int b,
                                                int pos, int64_t batch_stride, int64_t row_stride) {
  return row_offset(p, s, p.block_table ? page_of(p, b, pos) : 0, pos, batch_stride, row_stride);
}

// ---- append ------------------------------------------------------------------------------
// One rotary pair (x_a, x_b) → (x_a·cos − x_b·sin, x_a·sin + x_b·cos), unfused (the _rn
// intrinsics are never contracted into FMAs): the rounding of the Python reference's fp32
// operations, bit for bit. dst may alias src.
template <class Element>
__device__ __forceinline__ void rotate_pair(Element& da, Element& db, Element xa_in, Element xb_in,
                                            float c, float s) {
  const float xa = float(xa_in), xb = float(xb_in);
  da = Element(__fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)));
  db = Element(__fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c)));
}

// `heads` head vectors of `dim` elements, src → dst (head strides in elements), turned at
// rotary position pos (clamped to the tables' rows) by the block's threads.
template <class Element>
__device__ __forceinline__ void rotate_heads(Element* dst, int64_t dst_head, const Element* src,
                                             int64_t src_head, int heads, int dim,
                                             const KvCacheParams& p, int pos) {
  pos = clamp_to(pos, 0, p.seqlen_ro - 1);
  const Element* cos = static_cast<const Element*>(p.rotary_cos) + int64_t(pos) * p.rotary_cos_stride;
  const Element* sin = static_cast<const Element*>(p.rotary_sin) + int64_t(pos) * p.rotary_sin_stride;
  const int half = p.rotary_dim / 2;
  for (int h = 0; h < heads; ++h) {  // by head, so that no thread divides to find its pairs
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      const int ia = p.rotary_interleaved ? 2 * i : i, ib = p.rotary_interleaved ? 2 * i + 1 : i + half;
      rotate_pair(dst[h * dst_head + ia], dst[h * dst_head + ib], src[h * src_head + ia],
                  src[h * src_head + ib], float(cos[i]), float(sin[i]));
    }
    for (int d = p.rotary_dim + threadIdx.x; d < dim; d += blockDim.x) dst[h * dst_head + d] = src[h * src_head + d];
  }
}

// Row t of k_new/v_new, KV head hk, → cache row c_b + t of sequence b, k rotated at c_b + t
// with rotary; by the block's threads.
template <class Element>
__device__ __forceinline__ void append_row(const KvCacheParams& p, const CacheSeq& s, int b, int hk, int t) {
  const int pos = s.cached + t;
  Element* k = static_cast<Element*>(const_cast<void*>(p.k)) + hk * p.k_head_stride +
               cache_offset(p, s, b, pos, p.k_batch_stride, p.k_row_stride);
  Element* v = static_cast<Element*>(const_cast<void*>(p.v)) + hk * p.v_head_stride +
               cache_offset(p, s, b, pos, p.v_batch_stride, p.v_row_stride);
  const Element* kn = static_cast<const Element*>(p.k_new) + b * p.kn_batch_stride +
                      t * p.kn_row_stride + hk * p.kn_head_stride;
  const Element* vn = static_cast<const Element*>(p.v_new) + b * p.vn_batch_stride +
                      t * p.vn_row_stride + hk * p.vn_head_stride;
  if (p.rotary_cos != nullptr)
    rotate_heads(k, 0, kn, 0, 1, p.head_dim, p, pos);
  else
    for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) k[d] = kn[d];
  for (int d = threadIdx.x; d < p.head_dim_v; d += blockDim.x) v[d] = vn[d];
}

// Row t of k_new/v_new, KV head hk, read early and written late: the split-KV kernel's
// append, whose loads' latency then passes while the CTA's copies and math go on, where
// append_row waits for its loads in line (two round trips: k, then v, which may alias the
// cache as far as the compiler knows). Thread i holds pair slot i < head_dim / 2: k's
// columns (c_a, c_b), rotary pair i where i < rotary_dim / 2 and (2i, 2i + 1) past it, v's
// (2i, 2i + 1), with rotary the tables' entry i at the row's position, and in a paged cache
// the table's entry for the row's page, which the write clamps. The slots cover each column
// once in either rotary layout: pairs i < rotary_dim / 2 cover [0, rotary_dim). The same
// unfused rotation as append_row, so the same bits. kRotary: the call has rotary tables (the
// kernel's template flag, so that the test is not a parameter load).
template <class Element, bool kRotary>
struct HeldRow {
  Element ka, kb, va, vb, cs, sn;
  int t = -1, page = 0;  // t < 0: this thread holds nothing

  __device__ __forceinline__ int2 k_cols(const KvCacheParams& p, int i) const {
    if (kRotary && i < p.rotary_dim / 2)
      return p.rotary_interleaved ? make_int2(2 * i, 2 * i + 1) : make_int2(i, i + p.rotary_dim / 2);
    return make_int2(2 * i, 2 * i + 1);
  }
  __device__ __forceinline__ void read(const KvCacheParams& p, const CacheSeq& s, int b, int hk, int row) {
    const int i = int(threadIdx.x);
    if (row >= p.seqlen_new || 2 * i >= p.head_dim) return;
    t = row;
    const int pos = s.cached + t;
    const Element* kn = static_cast<const Element*>(p.k_new) + b * p.kn_batch_stride +
                        t * p.kn_row_stride + hk * p.kn_head_stride;
    const Element* vn = static_cast<const Element*>(p.v_new) + b * p.vn_batch_stride +
                        t * p.vn_row_stride + hk * p.vn_head_stride;
    const int2 c = k_cols(p, i);
    ka = kn[c.x], kb = kn[c.y], va = vn[2 * i], vb = vn[2 * i + 1];
    if (kRotary && i < p.rotary_dim / 2) {
      const int64_t r = clamp_to(pos, 0, p.seqlen_ro - 1);
      cs = static_cast<const Element*>(p.rotary_cos)[r * p.rotary_cos_stride + i];
      sn = static_cast<const Element*>(p.rotary_sin)[r * p.rotary_sin_stride + i];
    }
    if (p.block_table) page = page_entry(p, b, pos);
  }
  __device__ __forceinline__ void write(const KvCacheParams& p, const CacheSeq& s, int hk) const {
    if (t < 0) return;
    const int i = int(threadIdx.x), pos = s.cached + t;
    const int64_t pg = p.block_table ? clamp_to(page, 0, p.cache_rows - 1) : 0;
    Element* k = static_cast<Element*>(const_cast<void*>(p.k)) + hk * p.k_head_stride +
                 row_offset(p, s, pg, pos, p.k_batch_stride, p.k_row_stride);
    Element* v = static_cast<Element*>(const_cast<void*>(p.v)) + hk * p.v_head_stride +
                 row_offset(p, s, pg, pos, p.v_batch_stride, p.v_row_stride);
    const int2 c = k_cols(p, i);
    if (kRotary && i < p.rotary_dim / 2)
      rotate_pair(k[c.x], k[c.y], ka, kb, float(cs), float(sn));
    else
      k[c.x] = ka, k[c.y] = kb;
    v[2 * i] = va, v[2 * i + 1] = vb;
  }
};

// grid (seqlen_new, heads_kv, batch), 128 threads: row t of k_new/v_new → cache row c_b + t
// (k rotated at c_b + t with rotary). It runs only for a call with no query rows: otherwise
// the split-KV kernel appends (kv_kernel.cuh).
template <class Element>
__global__ void __launch_bounds__(128) kv_append_kernel(const __grid_constant__ KvCacheParams p) {
  cuda::wait_for_prior_grid();  // launched early (launch_after): the caller's writes first
  cuda::allow_dependents();
  const int t = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  append_row<Element>(p, cache_seq(p, b), b, hk, t);
}

}  // namespace flashlab::sm80
