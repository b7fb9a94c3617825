// forward_kvcache: attention against a KV cache (FlashAttention-2's flash_attn_with_kvcache).
// On a device, one registry kernel runs the whole call (cute_fa2's split-KV); on the CPU it
// is composed from forward() one sequence at a time, as below.
//
// Every rule is checked before anything is written: the tensors and the int32 tables
// (read on the host), then a dry run of each sequence's inner forward() through
// workspace_size(ForwardArgs), which applies forward()'s own rules (head dims, kernel
// support, the quadratic workspace limit) to the call that will run. Only then are the new
// rows appended and the sequences attended to. For sequence b, with L_b rows in its cache:
//   - contiguous cache: the inner K/V are strided views of k_cache[cache_batch_idx[b]] and
//     v_cache[...] cut to rows [cache_leftpad[b], L_b) (no copy);
//   - paged cache: the L_b rows are gathered from their pages into the workspace as
//     contiguous [1, L_b, heads_kv, head_dim] and [1, L_b, heads_kv, head_dim_v].
// With rotary, each new row is rotated as it is written into the cache, and q[b] is rotated
// into the workspace before its forward(), which reads it there (fp32 arithmetic, fp64 for
// fp64, rounded once to the dtype).
// Workspace layout: gathered K, gathered V (each sized for the longest sequence), the rotated
// q of one sequence [1, seqlen_q, heads_q, head_dim], each starting on a 256-byte boundary,
// then the inner forward's workspace, sized by the largest of the sequences'
// workspace_size(ForwardArgs).
#include <algorithm>
#include <climits>
#include <cstring>

#include "api/validate.h"
#include "common/dtype.h"

namespace flashlab {
namespace {

using api::check_same_placement;
using api::check_view;
using api::checked_mul;
using api::expect_dim;
using api::invalid;
using std::to_string;

// What validation reads off the arguments, and where the workspace's parts start.
struct Plan {
  bool paged = false, append = false, rotary = false;
  bool per_query = false;  // rotary: q row i at cache_seqlens[b] + i (else all at cache_seqlens[b])
  int64_t rotary_dim = 0, seqlen_ro = 0;
  int64_t batch = 0, seqlen_q = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  int64_t seqlen_new = 0;
  int64_t cache_rows = 0;  // batch_cache, or num_pages
  int64_t capacity = 0;    // rows a sequence's cache holds: seqlen_cache, or max_pages·page_size
  int64_t page_size = 0;
  int64_t max_len = 0;     // the largest L_b
  int64_t elem = 0;        // bytes per element of q, the caches and the new rows
  size_t v_offset = 0, q_offset = 0, inner_offset = 0;  // workspace: gathered V, rotated q, the inner forward's
};

int32_t at(const Tensor& t, int64_t i) { return static_cast<const int32_t*>(t.data)[i * t.stride[0]]; }
int32_t at(const Tensor& t, int64_t i, int64_t j) {
  return static_cast<const int32_t*>(t.data)[i * t.stride[0] + j * t.stride[1]];
}

// Tokens already in sequence b's cache (cache_seqlens[b], or the whole cache without them).
int64_t cached(const KvCacheArgs& a, const Plan& p, int64_t b) {
  return a.maybe_cache_seqlens.present() ? at(a.maybe_cache_seqlens, b) : p.capacity;
}

// Sequence b's first cache row (cache_leftpad[b], or 0 without them).
int64_t leftpad(const KvCacheArgs& a, int64_t b) {
  return a.maybe_cache_leftpad.present() ? at(a.maybe_cache_leftpad, b) : 0;
}

// Byte address of element [i0, i1, 0, ...] of a view.
char* at_bytes(const Tensor& t, int64_t i0, int64_t i1, int64_t elem) {
  return static_cast<char*>(t.data) + (i0 * t.stride[0] + i1 * t.stride[1]) * elem;
}

// Row `pos` of sequence b's cache in k_cache or v_cache (laid out alike).
char* cache_row(const KvCacheArgs& a, const Plan& p, const Tensor& cache, int64_t b, int64_t pos) {
  if (p.paged) return at_bytes(cache, at(a.maybe_block_table, b, pos / p.page_size), pos % p.page_size, p.elem);
  const int64_t r = a.maybe_cache_batch_idx.present() ? at(a.maybe_cache_batch_idx, b) : b;
  return at_bytes(cache, r, pos, p.elem);
}

// One row of heads_kv heads of `dim` elements, head strides in elements.
void copy_row(char* dst, int64_t dst_head, const char* src, int64_t src_head, const Plan& p, int64_t dim) {
  for (int64_t h = 0; h < p.heads_kv; ++h)
    std::memcpy(dst + h * dst_head * p.elem, src + h * src_head * p.elem, size_t(dim * p.elem));
}

// The view [1, ...] of index i along the first axis of a view.
Tensor slice(const Tensor& t, int64_t i, int64_t elem) {
  Tensor s = t;
  s.data = static_cast<char*>(t.data) + i * t.stride[0] * elem;
  s.shape[0] = 1;
  return s;
}

Status check_table(const Tensor& t, const char* name, int rank, const char* layout, const Tensor& q,
                   int64_t batch) {
  FL_CHECK(api::check_int32(t, name, rank, layout, q));
  return expect_dim(t, name, 0, batch, "batch");
}

// FlashAttention-2's rule for where q is rotated: at cache_seqlens[b] + i when causal or
// local, where a window bound is local when it is in [0, capacity) (a larger one cannot
// bind, and FlashAttention-2 drops it first); else every query at cache_seqlens[b].
bool rotary_per_query(const KvCacheArgs& a, int64_t capacity) {
  auto binds = [capacity](int w) { return w >= 0 && w < capacity; };
  return a.causal || binds(a.window_left) || binds(a.window_right);
}

// rotary_cos and rotary_sin: [seqlen_ro, rotary_dim / 2] in q's dtype and place, with k_new,
// rotary_dim <= head_dim, seqlen_ro at least a sequence's cache rows (as FlashAttention-2).
Status check_rotary(const KvCacheArgs& a, Plan* p) {
  const Tensor &cos = a.maybe_rotary_cos, &sin = a.maybe_rotary_sin;
  p->rotary = cos.present();
  if (p->rotary != sin.present()) return invalid("rotary_cos and rotary_sin must both be given or both be absent");
  if (!p->rotary) return {};
  if (!p->append)
    return invalid("rotary_cos/rotary_sin need k_new and v_new: the rotation applies to the appended keys "
                   "(as in FlashAttention-2)");
  FL_CHECK(check_view(cos, "rotary_cos", 2, "[seqlen_ro, rotary_dim / 2]"));
  FL_CHECK(check_view(sin, "rotary_sin", 2, "[seqlen_ro, rotary_dim / 2]"));
  FL_CHECK(check_same_placement(cos, "rotary_cos", a.q));
  FL_CHECK(check_same_placement(sin, "rotary_sin", a.q));
  FL_CHECK(expect_dim(sin, "rotary_sin", 0, cos.shape[0], "seqlen_ro, as rotary_cos"));
  FL_CHECK(expect_dim(sin, "rotary_sin", 1, cos.shape[1], "rotary_dim / 2, as rotary_cos"));
  p->rotary_dim = 2 * cos.shape[1];
  p->seqlen_ro = cos.shape[0];
  if (p->rotary_dim == 0 || p->rotary_dim > p->head_dim)
    return invalid("rotary_dim (2·rotary_cos.shape[1] = " + to_string(p->rotary_dim) + ") must be in [2, head_dim = " +
                   to_string(p->head_dim) + "]");
  if (p->seqlen_ro < p->capacity)
    return invalid("rotary_cos.shape[0] (seqlen_ro = " + to_string(p->seqlen_ro) + ") must be at least the " +
                   to_string(p->capacity) + " rows of a sequence's cache (" +
                   (p->paged ? "max_pages·page_size" : "seqlen_cache") + ")");
  p->per_query = rotary_per_query(a, p->capacity);
  return {};
}

// Each tensor alone, then how they agree: shapes, dtypes, devices, the tables' shapes.
Status check_tensors(const KvCacheArgs& a, Plan* p) {
  if (a.maybe_cu_seqlens_q.present() || a.maybe_cu_seqlens_k.present())
    return invalid("cu_seqlens_q and cu_seqlens_k must be absent: forward_kvcache takes a padded q "
                   "[batch, seqlen_q, heads_q, head_dim] and no varlen sequences");
  if (a.dropout_p != 0.f)
    return invalid("dropout_p must be 0 for forward_kvcache (no dropout at inference), got " +
                   to_string(a.dropout_p));
  p->paged = a.maybe_block_table.present();
  p->append = a.maybe_k_new.present();
  FL_CHECK(check_view(a.q, "q", 4, "[batch, seqlen_q, heads_q, head_dim]"));
  FL_CHECK(check_view(a.k_cache, "k_cache", 4,
                      p->paged ? "[num_pages, page_size, heads_kv, head_dim]"
                               : "[batch_cache, seqlen_cache, heads_kv, head_dim]"));
  FL_CHECK(check_view(a.v_cache, "v_cache", 4,
                      p->paged ? "[num_pages, page_size, heads_kv, head_dim_v]"
                               : "[batch_cache, seqlen_cache, heads_kv, head_dim_v]"));
  FL_CHECK(check_view(a.out, "out", 4, "[batch, seqlen_q, heads_q, head_dim_v]"));
  switch (a.q.dtype) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF64: break;
    default:
      return invalid(std::string("q.dtype must be fp16, bf16, fp32 or fp64, got ") + to_string(a.q.dtype));
  }
  FL_CHECK(check_same_placement(a.k_cache, "k_cache", a.q));
  FL_CHECK(check_same_placement(a.v_cache, "v_cache", a.q));
  FL_CHECK(check_same_placement(a.out, "out", a.q));
  if (p->append != a.maybe_v_new.present())
    return invalid("k_new and v_new must both be given (append) or both be absent");
  if (p->append) {
    FL_CHECK(check_view(a.maybe_k_new, "k_new", 4, "[batch, seqlen_new, heads_kv, head_dim]"));
    FL_CHECK(check_view(a.maybe_v_new, "v_new", 4, "[batch, seqlen_new, heads_kv, head_dim_v]"));
    FL_CHECK(check_same_placement(a.maybe_k_new, "k_new", a.q));
    FL_CHECK(check_same_placement(a.maybe_v_new, "v_new", a.q));
  }
  if (a.q.device == Device::kCUDA) {
    const api::NamedView views[] = {{&a.q, "q"}, {&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"},
                                    {&a.out, "out"}, {&a.maybe_k_new, "k_new"}, {&a.maybe_v_new, "v_new"}};
    for (const api::NamedView& v : views) FL_CHECK(api::check_cuda_alignment(*v.t, v.name));
  }
  if (a.num_splits < 0) return invalid("num_splits must be >= 0 (0 = chosen per call), got " + to_string(a.num_splits));

  p->elem = int64_t(dtype_size(a.q.dtype));
  p->batch = a.q.shape[0];
  p->seqlen_q = a.q.shape[1];
  p->heads_q = a.q.shape[2];
  p->head_dim = a.q.shape[3];
  p->heads_kv = a.k_cache.shape[2];
  p->head_dim_v = a.v_cache.shape[3];
  FL_CHECK(expect_dim(a.k_cache, "k_cache", 3, p->head_dim, "head_dim"));
  const char* cache_dims[] = {p->paged ? "num_pages" : "batch_cache", p->paged ? "page_size" : "seqlen_cache",
                              "heads_kv"};
  for (int i = 0; i < 3; ++i) FL_CHECK(expect_dim(a.v_cache, "v_cache", i, a.k_cache.shape[i], cache_dims[i]));
  FL_CHECK(expect_dim(a.out, "out", 0, p->batch, "batch"));
  FL_CHECK(expect_dim(a.out, "out", 1, p->seqlen_q, "seqlen_q"));
  FL_CHECK(expect_dim(a.out, "out", 2, p->heads_q, "heads_q"));
  FL_CHECK(expect_dim(a.out, "out", 3, p->head_dim_v, "head_dim_v"));
  if (p->heads_kv < 1) return invalid("heads_kv (k_cache.shape[2]) must be >= 1");
  if (p->heads_q % p->heads_kv != 0)
    return invalid("heads_q (" + to_string(p->heads_q) + ") must be a multiple of heads_kv (" +
                   to_string(p->heads_kv) + ") for GQA/MQA");
  if (p->append) {
    p->seqlen_new = a.maybe_k_new.shape[1];
    const Tensor& kn = a.maybe_k_new;
    const Tensor& vn = a.maybe_v_new;
    FL_CHECK(expect_dim(kn, "k_new", 0, p->batch, "batch"));
    FL_CHECK(expect_dim(kn, "k_new", 2, p->heads_kv, "heads_kv"));
    FL_CHECK(expect_dim(kn, "k_new", 3, p->head_dim, "head_dim"));
    FL_CHECK(expect_dim(vn, "v_new", 0, p->batch, "batch"));
    FL_CHECK(expect_dim(vn, "v_new", 1, p->seqlen_new, "seqlen_new"));
    FL_CHECK(expect_dim(vn, "v_new", 2, p->heads_kv, "heads_kv"));
    FL_CHECK(expect_dim(vn, "v_new", 3, p->head_dim_v, "head_dim_v"));
  }
  if (a.maybe_lse.present()) {
    api::Dims d;
    d.batch = p->batch, d.heads_q = p->heads_q, d.seqlen_q = p->seqlen_q;
    FL_CHECK(api::check_lse(a.maybe_lse, "lse", a.q, d));
  }

  p->cache_rows = a.k_cache.shape[0];
  if (p->paged) {
    if (a.maybe_cache_batch_idx.present())
      return invalid("cache_batch_idx and block_table must not be given together: a paged cache's "
                     "pages are chosen by block_table alone");
    if (a.maybe_cache_leftpad.present())
      return invalid("cache_leftpad and block_table must not be given together: left padding is "
                     "for contiguous caches (as in FlashAttention-2)");
    FL_CHECK(check_table(a.maybe_block_table, "block_table", 2, "[batch, max_pages]", a.q, p->batch));
    p->page_size = a.k_cache.shape[1];
    p->capacity = p->page_size * a.maybe_block_table.shape[1];  // both < 2^31
  } else {
    p->capacity = a.k_cache.shape[1];
    if (a.maybe_cache_batch_idx.present())
      FL_CHECK(check_table(a.maybe_cache_batch_idx, "cache_batch_idx", 1, "[batch]", a.q, p->batch));
    else
      FL_CHECK(expect_dim(a.k_cache, "k_cache", 0, p->batch, "batch_cache, which is batch without cache_batch_idx"));
  }
  if (a.maybe_cache_seqlens.present())
    FL_CHECK(check_table(a.maybe_cache_seqlens, "cache_seqlens", 1, "[batch]", a.q, p->batch));
  if (a.maybe_cache_leftpad.present())
    FL_CHECK(check_table(a.maybe_cache_leftpad, "cache_leftpad", 1, "[batch]", a.q, p->batch));
  FL_CHECK(check_rotary(a, p));
  // Kernels index a sequence's cache rows with int32.
  if (p->capacity > INT32_MAX)
    return invalid("the rows of a sequence's cache (" + std::string(p->paged ? "max_pages·page_size" : "seqlen_cache") +
                   " = " + to_string(p->capacity) + ") must be < 2^31");
  // A device table is clamped to the cache's rows, which needs one to exist.
  if (a.q.device != Device::kCPU && p->batch > 0 && p->capacity > 0 && p->cache_rows == 0)
    return invalid(std::string(p->paged ? "num_pages (k_cache.shape[0])" : "batch_cache (k_cache.shape[0])") +
                   " must be >= 1: the device tables are clamped to the cache's rows");
  return {};
}

// Memory: with k_new the caches are written, so they join out and lse as outputs.
Status check_memory(const KvCacheArgs& a, const Plan& p) {
  const api::NamedView k_cache{&a.k_cache, "k_cache"}, v_cache{&a.v_cache, "v_cache"};
  const api::NamedView outputs[] = {{&a.out, "out"}, {&a.maybe_lse, "lse"}, k_cache, v_cache};
  const api::NamedView inputs[] = {{&a.q, "q"}, {&a.maybe_k_new, "k_new"}, {&a.maybe_v_new, "v_new"},
                                   {&a.maybe_cache_seqlens, "cache_seqlens"},
                                   {&a.maybe_cache_batch_idx, "cache_batch_idx"},
                                   {&a.maybe_block_table, "block_table"},
                                   {&a.maybe_cache_leftpad, "cache_leftpad"},
                                   {&a.maybe_rotary_cos, "rotary_cos"}, {&a.maybe_rotary_sin, "rotary_sin"},
                                   k_cache, v_cache};
  return p.append ? api::check_outputs_disjoint(outputs, std::span(inputs, 9))
                  : api::check_outputs_disjoint(std::span(outputs, 2), inputs);
}

// "name[i]", for messages.
std::string element(const char* name, int64_t i) {
  return std::string(name).append("[").append(to_string(i)).append("]");
}

// The tables' contents, read on the host; sets max_len. Device tables are not read: the
// kernels clamp their values (KvCacheParams, common/params.h), and only what the shapes
// decide is checked here.
Status check_tables(const KvCacheArgs& a, Plan* p) {
  if (a.q.device != Device::kCPU) {
    if (p->seqlen_new > p->capacity)
      return invalid("seqlen_new (" + to_string(p->seqlen_new) + ") exceeds the " + to_string(p->capacity) +
                     " rows of a sequence's cache (" + (p->paged ? "max_pages·page_size" : "seqlen_cache") + ")");
    if (p->append && p->seqlen_new > 0 && !a.maybe_cache_seqlens.present())
      return invalid("cache_seqlens must be given with k_new: without it every sequence's cache is full");
    p->max_len = p->capacity;
    return {};
  }
  for (int64_t b = 0; b < p->batch; ++b) {
    const int64_t c = cached(a, *p, b), len = c + p->seqlen_new;
    if (c < 0) return invalid(element("cache_seqlens", b) + " must be >= 0, got " + to_string(c));
    const int64_t pad = leftpad(a, b);
    if (pad < 0 || pad > c)
      return invalid(element("cache_leftpad", b) + " = " + to_string(pad) + " must be in [0, cache_seqlens[" +
                     to_string(b) + "] = " + to_string(c) + "]");
    if (len > p->capacity)
      return invalid(element("cache_seqlens", b) + " + seqlen_new = " + to_string(c) + " + " +
                     to_string(p->seqlen_new) + " exceeds the " + to_string(p->capacity) +
                     " rows of the sequence's cache (" +
                     (p->paged ? "max_pages·page_size" : "seqlen_cache") + ")");
    // The new rows' positions are below len <= capacity <= seqlen_ro; q's may pass it.
    const int64_t q_last = c + (p->per_query ? p->seqlen_q - 1 : 0);
    if (p->rotary && p->seqlen_q > 0 && q_last >= p->seqlen_ro)
      return invalid("the rotary position of q[" + to_string(b) + "]'s last row, " + element("cache_seqlens", b) +
                     (p->per_query ? " + seqlen_q - 1 = " : " = ") + to_string(q_last) +
                     ", must be < seqlen_ro = " + to_string(p->seqlen_ro) + " (rotary_cos.shape[0])");
    if (a.maybe_cache_batch_idx.present()) {
      const int64_t r = at(a.maybe_cache_batch_idx, b);
      if (r < 0 || r >= p->cache_rows)
        return invalid(element("cache_batch_idx", b) + " = " + to_string(r) + " must be in [0, batch_cache = " +
                       to_string(p->cache_rows) + ")");
    }
    const int64_t pages = p->paged && len > 0 ? (len + p->page_size - 1) / p->page_size : 0;
    for (int64_t j = 0; j < pages; ++j) {
      const int64_t e = at(a.maybe_block_table, b, j);
      if (e < 0 || e >= p->cache_rows)
        return invalid(element("block_table", b) + "[" + to_string(j) + "] = " + to_string(e) +
                       " must be in [0, num_pages = " + to_string(p->cache_rows) +
                       "): the sequence's rows [0, " + to_string(len) + ") use that page");
    }
    p->max_len = std::max(p->max_len, len);
  }
  return {};
}

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

// Sequence b's inner forward over its first `len` cache rows; a paged sequence's rows and a
// rotated q are read from `gathered` (the workspace, where they are written before the call).
ForwardArgs inner(const KvCacheArgs& a, const Plan& p, int64_t b, int64_t len, void* gathered) {
  ForwardArgs f;
  static_cast<CommonArgs&>(f) = a;
  f.q = p.rotary ? Tensor::contiguous(static_cast<char*>(gathered) + p.q_offset, a.q.dtype,
                                      {1, p.seqlen_q, p.heads_q, p.head_dim})
                 : slice(a.q, b, p.elem);
  f.out = slice(a.out, b, p.elem);
  if (a.maybe_lse.present()) f.maybe_lse = slice(a.maybe_lse, b, 4);
  if (p.paged) {
    char* g = static_cast<char*>(gathered);
    f.k = Tensor::contiguous(g, a.q.dtype, {1, len, p.heads_kv, p.head_dim});
    f.v = Tensor::contiguous(g + p.v_offset, a.q.dtype, {1, len, p.heads_kv, p.head_dim_v});
  } else {
    const int64_t r = a.maybe_cache_batch_idx.present() ? at(a.maybe_cache_batch_idx, b) : b;
    const int64_t pad = leftpad(a, b);  // the sequence's rows are [pad, len)
    f.k = slice(a.k_cache, r, p.elem);
    f.v = slice(a.v_cache, r, p.elem);
    f.k.data = static_cast<char*>(f.k.data) + pad * f.k.stride[1] * p.elem;
    f.v.data = static_cast<char*>(f.v.data) + pad * f.v.stride[1] * p.elem;
    f.k.shape[1] = f.v.shape[1] = len - pad;
  }
  const bool fits = a.workspace != nullptr && a.workspace_bytes >= p.inner_offset;
  f.workspace = fits ? static_cast<char*>(a.workspace) + p.inner_offset : nullptr;
  f.workspace_bytes = fits ? a.workspace_bytes - p.inner_offset : 0;
  return f;
}

// An address no host tensor occupies (the upper half of the address space belongs to the
// operating system on every 64-bit platform), for the dry runs of paged sequences before
// any workspace is known: their gathered views then cannot meet the caller's tensors.
void* const kNowhere = reinterpret_cast<void*>(uintptr_t(1) << 63);

// A device call's Params: one kernel reads the caches in place (cute_fa2's split-KV,
// src/cuda/sm80/kv_kernel.cuh), the tables left on the device.
Status device_params(const KvCacheArgs& a, const Plan& pl, KvCacheParams* p) {
  api::Dims d;
  d.batch = pl.batch, d.seqlen_q = pl.seqlen_q, d.seqlen_k = pl.capacity;
  d.total_q = pl.batch * pl.seqlen_q, d.total_k = pl.cache_rows * a.k_cache.shape[1];
  d.heads_q = pl.heads_q, d.heads_kv = pl.heads_kv, d.head_dim = pl.head_dim, d.head_dim_v = pl.head_dim_v;
  FL_CHECK(api::check_problem_size(d));
  FL_CHECK(api::fill_common(a, d, a.q, p));
  api::fill_qkvo(a.q, a.k_cache, a.v_cache, a.out, false, p);
  if (a.maybe_lse.present()) api::fill_lse(a.maybe_lse, false, p);
  if (pl.append) {
    const Tensor &kn = a.maybe_k_new, &vn = a.maybe_v_new;
    p->k_new = kn.data, p->v_new = vn.data, p->seqlen_new = int(pl.seqlen_new);
    p->kn_batch_stride = kn.stride[0], p->kn_row_stride = kn.stride[1], p->kn_head_stride = kn.stride[2];
    p->vn_batch_stride = vn.stride[0], p->vn_row_stride = vn.stride[1], p->vn_head_stride = vn.stride[2];
  }
  auto table = [](const Tensor& t) { return static_cast<const int32_t*>(t.data); };
  if (a.maybe_cache_seqlens.present())
    p->cache_seqlens = table(a.maybe_cache_seqlens), p->cache_seqlens_stride = a.maybe_cache_seqlens.stride[0];
  if (a.maybe_cache_batch_idx.present())
    p->cache_batch_idx = table(a.maybe_cache_batch_idx),
    p->cache_batch_idx_stride = a.maybe_cache_batch_idx.stride[0];
  if (a.maybe_cache_leftpad.present())
    p->cache_leftpad = table(a.maybe_cache_leftpad), p->cache_leftpad_stride = a.maybe_cache_leftpad.stride[0];
  if (pl.rotary) {
    const Tensor &cos = a.maybe_rotary_cos, &sin = a.maybe_rotary_sin;
    p->rotary_cos = cos.data, p->rotary_sin = sin.data;
    p->rotary_cos_stride = cos.stride[0], p->rotary_sin_stride = sin.stride[0];
    p->rotary_dim = int(pl.rotary_dim), p->seqlen_ro = int(pl.seqlen_ro);
    p->rotary_interleaved = a.rotary_interleaved, p->rotary_per_query = pl.per_query;
  }
  if (pl.paged) {
    p->block_table = table(a.maybe_block_table);
    p->block_table_batch_stride = a.maybe_block_table.stride[0];
    p->block_table_page_stride = a.maybe_block_table.stride[1];
    p->page_size = int(pl.page_size);
  }
  p->cache_rows = int(pl.cache_rows);
  p->num_splits = a.num_splits;
  return {};
}

// Validates everything and sizes the workspace: the gathered rows plus the largest inner
// forward's need, each sequence's inner call checked by forward()'s own rules. A device
// call's workspace is its kernel's (through *params).
Status plan(const KvCacheArgs& a, Plan* p, size_t* need, KvCacheParams* params = nullptr) {
  FL_CHECK(check_tensors(a, p));
  FL_CHECK(check_memory(a, *p));
  FL_CHECK(check_tables(a, p));
  if (a.q.device != Device::kCPU) {
    KvCacheParams local;
    KvCacheParams* kp = params ? params : &local;
    FL_CHECK(device_params(a, *p, kp));
    return api::kvcache_workspace(*kp, a.kernel, need);
  }
  int64_t rows = 0, kbytes = 0, vbytes = 0;
  if (p->paged && !(checked_mul(p->max_len, p->heads_kv * p->elem, &rows) &&
                    checked_mul(rows, p->head_dim, &kbytes) && checked_mul(rows, p->head_dim_v, &vbytes) &&
                    kbytes < (int64_t(1) << 61) && vbytes < (int64_t(1) << 61)))
    return invalid("the gathered paged cache of the longest sequence (" + to_string(p->max_len) +
                   " rows) exceeds 2^61 bytes");
  int64_t qbytes = 0;  // a sequence's rotated q
  if (p->rotary && !(checked_mul(p->seqlen_q * p->heads_q, p->head_dim * p->elem, &qbytes) &&
                     qbytes < (int64_t(1) << 61)))
    return invalid("the rotated q of a sequence (seqlen_q·heads_q·head_dim elements) exceeds 2^61 bytes");
  p->v_offset = round_up(size_t(kbytes));
  p->q_offset = p->paged ? round_up(p->v_offset + size_t(vbytes)) : 0;
  p->inner_offset = p->rotary ? round_up(p->q_offset + size_t(qbytes)) : p->q_offset;
  size_t inner_max = 0;
  for (int64_t b = 0; b < p->batch; ++b) {
    size_t w = 0;
    FL_CHECK(workspace_size(inner(a, *p, b, cached(a, *p, b) + p->seqlen_new, kNowhere), &w));
    inner_max = std::max(inner_max, w);
  }
  *need = p->inner_offset + inner_max;
  return {};
}

// A product rounded to W on its own: the compiler may not fuse it into an FMA (which
// -march=native allows), so that a·c − b·s rounds as the Python reference's three
// operations do, bit for bit.
template <class W>
W product(W x, W y) {
  volatile W r = x * y;
  return r;
}

// One head's vector src turned by the rotary angles of position pos into dst (kvcache.cpp's
// header): W arithmetic, rounded once to the dtype; channels past rotary_dim copied.
template <class W>
void turn(char* dst, const char* src, const KvCacheArgs& a, const Plan& p, int64_t pos) {
  const DType t = a.q.dtype;
  const char* cos = at_bytes(a.maybe_rotary_cos, pos, 0, p.elem);
  const char* sin = at_bytes(a.maybe_rotary_sin, pos, 0, p.elem);
  const int64_t half = p.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t ia = a.rotary_interleaved ? 2 * i : i, ib = a.rotary_interleaved ? 2 * i + 1 : i + half;
    const W c = W(load_as_double(cos, t, i)), s = W(load_as_double(sin, t, i));
    const W xa = W(load_as_double(src, t, ia)), xb = W(load_as_double(src, t, ib));
    const W ra = product(xa, c) - product(xb, s), rb = product(xa, s) + product(xb, c);
    store_from_double(dst, t, ia, double(ra));
    store_from_double(dst, t, ib, double(rb));
  }
  const size_t done = size_t(p.rotary_dim * p.elem);
  std::memcpy(dst + done, src + done, size_t(p.head_dim * p.elem) - done);
}

// Rows of heads `heads` with head strides in elements, each head turned at position pos.
void rotate_row(char* dst, int64_t dst_head, const char* src, int64_t src_head, int64_t heads,
                const KvCacheArgs& a, const Plan& p, int64_t pos) {
  for (int64_t h = 0; h < heads; ++h) {
    char* d = dst + h * dst_head * p.elem;
    const char* s = src + h * src_head * p.elem;
    if (a.q.dtype == DType::kF64) turn<double>(d, s, a, p, pos);
    else turn<float>(d, s, a, p, pos);
  }
}

// q[b] rotated into the workspace as [1, seqlen_q, heads_q, head_dim], where inner() reads it.
void rotate_q(const KvCacheArgs& a, const Plan& p, int64_t b) {
  char* dst = static_cast<char*>(a.workspace) + p.q_offset;
  const int64_t c = cached(a, p, b), row = p.heads_q * p.head_dim * p.elem;
  for (int64_t i = 0; i < p.seqlen_q; ++i)
    rotate_row(dst + i * row, p.head_dim, at_bytes(a.q, b, i, p.elem), a.q.stride[2], p.heads_q, a, p,
               c + (p.per_query ? i : 0));
}

void append(const KvCacheArgs& a, const Plan& p, int64_t b, int64_t from) {
  const Tensor &kn = a.maybe_k_new, &vn = a.maybe_v_new;
  for (int64_t t = 0; t < p.seqlen_new; ++t) {
    if (p.rotary)
      rotate_row(cache_row(a, p, a.k_cache, b, from + t), a.k_cache.stride[2], at_bytes(kn, b, t, p.elem),
                 kn.stride[2], p.heads_kv, a, p, from + t);
    else
      copy_row(cache_row(a, p, a.k_cache, b, from + t), a.k_cache.stride[2], at_bytes(kn, b, t, p.elem),
               kn.stride[2], p, p.head_dim);
    copy_row(cache_row(a, p, a.v_cache, b, from + t), a.v_cache.stride[2], at_bytes(vn, b, t, p.elem),
             vn.stride[2], p, p.head_dim_v);
  }
}

void gather(const KvCacheArgs& a, const Plan& p, int64_t b, int64_t len) {
  char* gk = static_cast<char*>(a.workspace);
  char* gv = gk + p.v_offset;
  const int64_t krow = p.heads_kv * p.head_dim * p.elem, vrow = p.heads_kv * p.head_dim_v * p.elem;
  for (int64_t pos = 0; pos < len; ++pos) {
    copy_row(gk + pos * krow, p.head_dim, cache_row(a, p, a.k_cache, b, pos), a.k_cache.stride[2], p,
             p.head_dim);
    copy_row(gv + pos * vrow, p.head_dim_v, cache_row(a, p, a.v_cache, b, pos), a.v_cache.stride[2], p,
             p.head_dim_v);
  }
}

}  // namespace

Status forward_kvcache(const KvCacheArgs& a) noexcept {
  Plan p;
  size_t need = 0;
  if (a.q.device != Device::kCPU) {
    KvCacheParams kp;
    FL_CHECK(plan(a, &p, &need, &kp));
    return api::run_kvcache(kp, a.kernel);
  }
  FL_CHECK(plan(a, &p, &need));
  if (a.workspace_bytes < need)
    return {StatusCode::kWorkspaceTooSmall, "workspace_bytes (" + to_string(a.workspace_bytes) +
                                                ") is smaller than workspace_size() = " + to_string(need) +
                                                " for forward_kvcache"};
  if (need > 0 && a.workspace == nullptr)
    return invalid("workspace is null but forward_kvcache needs " + to_string(need) + " bytes");
  // A paged sequence's rows and a rotated q are written into the workspace before its
  // forward(): the workspace must not share a byte with any tensor of the call, or that
  // forward() would refuse the overlap only after earlier sequences' rows had been appended.
  if (p.inner_offset > 0) {
    const Tensor written = Tensor::contiguous(a.workspace, DType::kF32, {int64_t(p.inner_offset / 4)});
    const api::NamedView ws[] = {{&written, "workspace"}};
    const api::NamedView tensors[] = {{&a.q, "q"}, {&a.out, "out"}, {&a.maybe_lse, "lse"},
                                      {&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"},
                                      {&a.maybe_k_new, "k_new"}, {&a.maybe_v_new, "v_new"},
                                      {&a.maybe_cache_seqlens, "cache_seqlens"},
                                      {&a.maybe_cache_batch_idx, "cache_batch_idx"},
                                      {&a.maybe_block_table, "block_table"},
                                      {&a.maybe_cache_leftpad, "cache_leftpad"},
                                      {&a.maybe_rotary_cos, "rotary_cos"}, {&a.maybe_rotary_sin, "rotary_sin"}};
    FL_CHECK(api::check_outputs_disjoint(ws, tensors));
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t from = cached(a, p, b), len = from + p.seqlen_new;
    if (p.append) append(a, p, b, from);
    if (p.paged) gather(a, p, b, len);
    if (p.rotary) rotate_q(a, p, b);
    FL_CHECK(forward(inner(a, p, b, len, a.workspace)));
  }
  return {};
}

Status workspace_size(const KvCacheArgs& a, size_t* bytes) noexcept {
  if (!bytes) return invalid("bytes (the output pointer of workspace_size) is null");
  Plan p;
  size_t need = 0;
  FL_CHECK(plan(a, &p, &need));
  *bytes = need;
  return {};
}

}  // namespace flashlab
