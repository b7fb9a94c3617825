// Params: what kernels see. Validation (src/api/validate.cpp) turns the caller's Args into
// these plain-data structs once: resolved scale, normalized mask, strides grouped by tensor.
// Kernels never re-validate and never read Args.
//
// Addressing is the same for padded and varlen problems:
//   element (b, i, h, d) of q is at
//     q + b·q_batch_stride + (seq_start_q(b) + i)·q_row_stride + h·q_head_stride + d
//   where seq_start_q(b) = cu_seqlens_q[b] for varlen (batch stride 0) and 0 otherwise.
//   LSE row (b, h, i) is at lse + b·lse_batch_stride + h·lse_head_stride + seq_start_q(b) + i.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashlab/flashlab.h"
#include "common/dropout.h"
#include "common/mask.h"

namespace flashlab {

struct AttnParams {
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  int device_index = 0;

  // Problem size. For varlen, seqlen_q/k are the caller's max_seqlen_q/k bounded by
  // total_q/k. Validation guarantees batch·heads_q < 2^31, every view's extent < 2^63 bytes
  // and 16·(head_dim + head_dim_v + 2)·(batch·heads_q·(seqlen_q + 1)·(seqlen_k + 1) +
  // heads_q·(total_q + total_k)) < 2^63, so workspace formulas within that bound cannot wrap.
  int batch = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;    // of q and k
  int head_dim_v = 0;  // of v and out
  int group = 1;       // heads_q / heads_kv (GQA/MQA)

  bool varlen = false;
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1], on `device`
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0;  // rows of q (varlen) or batch·seqlen_q
  int64_t total_k = 0;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  float* lse = nullptr;  // fp32, rows contiguous; may be null in the forward
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  float scale = 0.f;       // softmax scale applied to q·k
  float scale_log2 = 0.f;  // scale · log2(e), for exp2-based softmax
  MaskPolicy mask;         // window (causal folded in) and softcap
  DropoutPolicy dropout;   // off unless the caller's dropout_p > 0 (common/dropout.h)

  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;
  int num_threads = 1;  // resolved: 1 to kMaxThreads
  size_t quadratic_workspace_limit = 0;
};

struct FwdParams : AttnParams {};

struct BwdParams : AttnParams {
  const void* dout = nullptr;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  bool deterministic = false;
};

// forward_kvcache on a device (src/api/kvcache.cpp): q's rows attend to each sequence's
// cache rows [0, L_b) after seqlen_new new rows are written at cache_seqlens[b]. AttnParams'
// k and v are the caches, k/v_batch_stride the stride between caches (or pages), seqlen_k
// the rows a sequence's cache holds (seqlen_cache, or max_pages·page_size); varlen and
// dropout are off. The int32 tables live on the device, where the host cannot read them, so
// the kernels clamp every value they read before they use it (a bad table gives wrong rows,
// never an access outside the tensors):
//   c_b = cache_seqlens[b] clamped to [0, seqlen_k - seqlen_new] (absent: seqlen_k - seqlen_new);
//   L_b = c_b + seqlen_new;
//   the cache of sequence b: cache_batch_idx[b] clamped to [0, cache_rows) (absent: b);
//   its first row s_b: cache_leftpad[b] clamped to [0, c_b] (absent: 0); its keys are the
//   rows [s_b, L_b), key j at row s_b + j;
//   page j of sequence b: block_table[b][j] clamped to [0, cache_rows);
//   a rotary position (c_b + t for new row t; c_b + i for query i, or c_b for every query
//   without rotary_per_query) clamped to [0, seqlen_ro).
struct KvCacheParams : AttnParams {
  const void* k_new = nullptr;  // [batch, seqlen_new, heads_kv, head_dim]; null: no append
  const void* v_new = nullptr;
  int64_t kn_batch_stride = 0, kn_row_stride = 0, kn_head_stride = 0;
  int64_t vn_batch_stride = 0, vn_row_stride = 0, vn_head_stride = 0;
  int seqlen_new = 0;
  const int32_t* cache_seqlens = nullptr;    // [batch], element b at b·cache_seqlens_stride
  const int32_t* cache_batch_idx = nullptr;  // [batch], element b at b·cache_batch_idx_stride
  const int32_t* cache_leftpad = nullptr;    // [batch]: sequence b's first cache row (contiguous)
  int64_t cache_seqlens_stride = 0, cache_batch_idx_stride = 0, cache_leftpad_stride = 0;
  const int32_t* block_table = nullptr;      // [batch, max_pages]; non-null: paged
  int64_t block_table_batch_stride = 0, block_table_page_stride = 0;
  int page_size = 0;   // paged: rows per page
  int cache_rows = 0;  // batch_cache, or num_pages
  int num_splits = 0;  // 0: the kernel picks; else the caller's
  const void* rotary_cos = nullptr;  // [seqlen_ro, rotary_dim / 2] in the dtype; null: no rotary
  const void* rotary_sin = nullptr;
  int64_t rotary_cos_stride = 0, rotary_sin_stride = 0;  // between rows (columns are contiguous)
  int rotary_dim = 0, seqlen_ro = 0;
  bool rotary_interleaved = false;  // pairs (2i, 2i + 1), else (i, i + rotary_dim / 2)
  bool rotary_per_query = false;    // query i at c_b + i (causal or local), else all at c_b
};

// Sequence bounds of batch entry b, read on the host (CPU kernels only: GPU kernels read
// cu_seqlens on the device with the same formulas).
struct SeqBounds {
  int64_t start_q = 0, start_k = 0;
  int len_q = 0, len_k = 0;
};

inline SeqBounds host_seq_bounds(const AttnParams& p, int b) {
  SeqBounds s;
  if (p.varlen) {
    s.start_q = p.cu_seqlens_q[b];
    s.start_k = p.cu_seqlens_k[b];
    s.len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
  }
  return s;
}

}  // namespace flashlab
