// Validation and dispatch: the only place that reads Args. Every rule of the API is
// checked here, in the order the caller would fix them, and each failure names the
// argument and the rule. On success the Args become Params and one registry entry runs.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>

#include "common/params.h"
#include "common/registry.h"
#include "flashlab/flashlab.h"

namespace flashlab {

const char* to_string(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kWorkspaceTooSmall: return "workspace too small";
    case StatusCode::kCudaError: return "CUDA error";
  }
  return "unknown";
}

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "fp64";
    case DType::kI32: return "int32";
  }
  return "?";
}

const char* to_string(Device device) noexcept {
  return device == Device::kCPU ? "cpu" : "cuda";
}

size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
  }
  return 0;
}

int64_t Tensor::numel() const noexcept {
  if (rank == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

Tensor Tensor::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                          Device device, int device_index) noexcept {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  t.rank = int(std::min<size_t>(shape.size(), kMaxRank));
  int i = 0;
  for (int64_t s : shape) {
    if (i == kMaxRank) break;
    t.shape[i++] = s;
  }
  int64_t st = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = st;
    st *= t.shape[d];
  }
  return t;
}

Tensor Tensor::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> stride, Device device,
                       int device_index) noexcept {
  Tensor t = contiguous(data, dtype, shape, device, device_index);
  int i = 0;
  for (int64_t s : stride) {
    if (i == t.rank) break;
    t.stride[i++] = s;
  }
  return t;
}

namespace {

Status invalid(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }

std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

// Rank, sizes, strides and pointer of one tensor, with nothing about its neighbours.
Status check_view(const Tensor& t, const std::string& name, int rank, const char* layout) {
  if (t.rank != rank)
    return invalid(name + " must have rank " + std::to_string(rank) + " " + layout +
                   ", got rank " + std::to_string(t.rank));
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0)
      return invalid(name + ".shape[" + std::to_string(i) + "] is negative (" +
                     std::to_string(t.shape[i]) + ")");
    if (t.shape[i] > INT32_MAX)
      return invalid(name + ".shape[" + std::to_string(i) + "] exceeds 2^31 - 1");
    if (t.stride[i] < 0)
      return invalid(name + ".stride[" + std::to_string(i) + "] is negative; strides must be >= 0");
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    return invalid(name + " must be contiguous in its last dimension (stride[" +
                   std::to_string(rank - 1) + "] = " + std::to_string(t.stride[rank - 1]) +
                   ", must be 1)");
  if (t.numel() > 0 && t.data == nullptr) return invalid(name + ".data is null");
  return {};
}

Status check_same_placement(const Tensor& t, const std::string& name, const Tensor& q) {
  if (t.dtype != q.dtype)
    return invalid(name + ".dtype (" + to_string(t.dtype) + ") must match q.dtype (" +
                   to_string(q.dtype) + ")");
  if (t.device != q.device || t.device_index != q.device_index)
    return invalid(name + " is on " + to_string(t.device) + ":" +
                   std::to_string(t.device_index) + " but q is on " + to_string(q.device) +
                   ":" + std::to_string(q.device_index));
  return {};
}

Status expect_dim(const Tensor& t, const std::string& name, int axis, int64_t want,
                  const char* what) {
  if (t.shape[axis] != want)
    return invalid(name + ".shape[" + std::to_string(axis) + "] (" + what + ") must be " +
                   std::to_string(want) + ", got " + std::to_string(t.shape[axis]) + " in " +
                   name + " " + shape_str(t));
  return {};
}

// CUDA kernels load 16 bytes at a time: base pointers and every stride that matters
// (dimension size > 1) must be multiples of 16 bytes.
Status check_cuda_alignment(const Tensor& t, const std::string& name) {
  if (t.device != Device::kCUDA || t.numel() == 0) return {};
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return invalid(name + ".data must be 16-byte aligned for CUDA kernels");
  const int64_t es = int64_t(dtype_size(t.dtype));
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && (t.stride[i] * es) % 16 != 0)
      return invalid(name + ".stride[" + std::to_string(i) + "] (" + std::to_string(t.stride[i]) +
                     " elements = " + std::to_string(t.stride[i] * es) +
                     " bytes) must be a multiple of 16 bytes for CUDA kernels");
  }
  return {};
}

#define FL_CHECK(expr)            \
  do {                            \
    Status s_ = (expr);           \
    if (!s_.ok()) return s_;      \
  } while (0)

// The dimensions every call shares, read off q/k/v/out and the varlen arguments.
struct Dims {
  bool varlen = false;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, total_q = 0, total_k = 0;
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
};

Status check_cu_seqlens(const Tensor& cu, const std::string& name, const Tensor& q) {
  FL_CHECK(check_view(cu, name, 1, "[batch + 1]"));
  if (cu.dtype != DType::kI32)
    return invalid(name + ".dtype must be int32, got " + std::string(to_string(cu.dtype)));
  if (cu.device != q.device || cu.device_index != q.device_index)
    return invalid(name + " must be on the device of q (" + to_string(q.device) + ")");
  if (cu.shape[0] < 1) return invalid(name + " must have batch + 1 >= 1 entries, got 0");
  return {};
}

// cu_seqlens on the host can be read: check what GPU kernels must trust.
Status check_cu_contents(const Tensor& cu, const std::string& name, int64_t total, int max_len,
                         const char* max_name) {
  if (cu.device != Device::kCPU) return {};
  const int32_t* c = static_cast<const int32_t*>(cu.data);
  const int64_t n = cu.shape[0];
  if (c[0] != 0) return invalid(name + "[0] must be 0, got " + std::to_string(c[0]));
  for (int64_t b = 0; b + 1 < n; ++b) {
    const int64_t len = int64_t(c[b + 1]) - c[b];
    if (len < 0)
      return invalid(name + " must be non-decreasing: [" + std::to_string(b + 1) + "] = " +
                     std::to_string(c[b + 1]) + " < [" + std::to_string(b) +
                     "] = " + std::to_string(c[b]));
    if (len > max_len)
      return invalid(name + ": sequence " + std::to_string(b) + " has length " +
                     std::to_string(len) + " > " + max_name + " = " + std::to_string(max_len));
  }
  if (c[n - 1] > total)
    return invalid(name + "[" + std::to_string(n - 1) + "] = " + std::to_string(c[n - 1]) +
                   " exceeds the " + std::to_string(total) + " rows of the packed tensor");
  return {};
}

Status read_dims(const CommonArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, Dims* d) {
  const bool has_cq = a.maybe_cu_seqlens_q.present(), has_ck = a.maybe_cu_seqlens_k.present();
  if (has_cq != has_ck)
    return invalid("maybe_cu_seqlens_q and maybe_cu_seqlens_k must both be given (varlen) or "
                   "both be absent");
  d->varlen = has_cq;
  const int r = d->varlen ? 3 : 4;
  const char* lq = d->varlen ? "[total_q, heads_q, head_dim]" : "[batch, seqlen_q, heads_q, head_dim]";
  const char* lk = d->varlen ? "[total_k, heads_kv, head_dim]" : "[batch, seqlen_k, heads_kv, head_dim]";
  const char* lv = d->varlen ? "[total_k, heads_kv, head_dim_v]" : "[batch, seqlen_k, heads_kv, head_dim_v]";
  const char* lo = d->varlen ? "[total_q, heads_q, head_dim_v]" : "[batch, seqlen_q, heads_q, head_dim_v]";
  FL_CHECK(check_view(q, "q", r, lq));
  FL_CHECK(check_view(k, "k", r, lk));
  FL_CHECK(check_view(v, "v", r, lv));
  FL_CHECK(check_view(out, "out", r, lo));

  switch (q.dtype) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF64: break;
    default:
      return invalid(std::string("q.dtype must be fp16, bf16, fp32 or fp64, got ") +
                     to_string(q.dtype));
  }
  FL_CHECK(check_same_placement(k, "k", q));
  FL_CHECK(check_same_placement(v, "v", q));
  FL_CHECK(check_same_placement(out, "out", q));

  const int h = r - 2;  // heads axis
  if (d->varlen) {
    FL_CHECK(check_cu_seqlens(a.maybe_cu_seqlens_q, "maybe_cu_seqlens_q", q));
    FL_CHECK(check_cu_seqlens(a.maybe_cu_seqlens_k, "maybe_cu_seqlens_k", q));
    if (a.maybe_cu_seqlens_q.shape[0] != a.maybe_cu_seqlens_k.shape[0])
      return invalid("maybe_cu_seqlens_q and maybe_cu_seqlens_k must have the same length "
                     "(batch + 1), got " + std::to_string(a.maybe_cu_seqlens_q.shape[0]) +
                     " and " + std::to_string(a.maybe_cu_seqlens_k.shape[0]));
    if (a.max_seqlen_q < 0) return invalid("max_seqlen_q must be >= 0");
    if (a.max_seqlen_k < 0) return invalid("max_seqlen_k must be >= 0");
    d->batch = a.maybe_cu_seqlens_q.shape[0] - 1;
    d->seqlen_q = a.max_seqlen_q;
    d->seqlen_k = a.max_seqlen_k;
    d->total_q = q.shape[0];
    d->total_k = k.shape[0];
    FL_CHECK(expect_dim(v, "v", 0, d->total_k, "total_k"));
    FL_CHECK(expect_dim(out, "out", 0, d->total_q, "total_q"));
    FL_CHECK(check_cu_contents(a.maybe_cu_seqlens_q, "maybe_cu_seqlens_q", d->total_q,
                               a.max_seqlen_q, "max_seqlen_q"));
    FL_CHECK(check_cu_contents(a.maybe_cu_seqlens_k, "maybe_cu_seqlens_k", d->total_k,
                               a.max_seqlen_k, "max_seqlen_k"));
  } else {
    d->batch = q.shape[0];
    d->seqlen_q = q.shape[1];
    d->seqlen_k = k.shape[1];
    d->total_q = d->batch * d->seqlen_q;
    d->total_k = d->batch * d->seqlen_k;
    FL_CHECK(expect_dim(k, "k", 0, d->batch, "batch"));
    FL_CHECK(expect_dim(v, "v", 0, d->batch, "batch"));
    FL_CHECK(expect_dim(out, "out", 0, d->batch, "batch"));
    FL_CHECK(expect_dim(v, "v", 1, d->seqlen_k, "seqlen_k"));
    FL_CHECK(expect_dim(out, "out", 1, d->seqlen_q, "seqlen_q"));
  }
  d->heads_q = q.shape[h];
  d->heads_kv = k.shape[h];
  d->head_dim = q.shape[h + 1];
  d->head_dim_v = v.shape[h + 1];
  FL_CHECK(expect_dim(v, "v", h, d->heads_kv, "heads_kv"));
  FL_CHECK(expect_dim(out, "out", h, d->heads_q, "heads_q"));
  FL_CHECK(expect_dim(k, "k", h + 1, d->head_dim, "head_dim"));
  FL_CHECK(expect_dim(out, "out", h + 1, d->head_dim_v, "head_dim_v"));
  if (d->heads_q < 1) return invalid("heads_q (q.shape[" + std::to_string(h) + "]) must be >= 1");
  if (d->heads_kv < 1) return invalid("heads_kv (k.shape[" + std::to_string(h) + "]) must be >= 1");
  if (d->heads_q % d->heads_kv != 0)
    return invalid("heads_q (" + std::to_string(d->heads_q) + ") must be a multiple of heads_kv (" +
                   std::to_string(d->heads_kv) + ") for GQA/MQA");
  constexpr int64_t kMaxHeadDim = 1024;
  if (d->head_dim < 1 || d->head_dim > kMaxHeadDim)
    return invalid("head_dim must be in [1, 1024], got " + std::to_string(d->head_dim));
  if (d->head_dim_v < 1 || d->head_dim_v > kMaxHeadDim)
    return invalid("head_dim_v must be in [1, 1024], got " + std::to_string(d->head_dim_v));

  FL_CHECK(check_cuda_alignment(q, "q"));
  FL_CHECK(check_cuda_alignment(k, "k"));
  FL_CHECK(check_cuda_alignment(v, "v"));
  FL_CHECK(check_cuda_alignment(out, "out"));
  return {};
}

Status check_lse(const Tensor& lse, const std::string& name, const Tensor& q, const Dims& d) {
  if (d.varlen) {
    FL_CHECK(check_view(lse, name, 2, "[heads_q, total_q]"));
    FL_CHECK(expect_dim(lse, name, 0, d.heads_q, "heads_q"));
    FL_CHECK(expect_dim(lse, name, 1, d.total_q, "total_q"));
  } else {
    FL_CHECK(check_view(lse, name, 3, "[batch, heads_q, seqlen_q]"));
    FL_CHECK(expect_dim(lse, name, 0, d.batch, "batch"));
    FL_CHECK(expect_dim(lse, name, 1, d.heads_q, "heads_q"));
    FL_CHECK(expect_dim(lse, name, 2, d.seqlen_q, "seqlen_q"));
  }
  if (lse.dtype != DType::kF32)
    return invalid(name + ".dtype must be fp32, got " + std::string(to_string(lse.dtype)));
  if (lse.device != q.device || lse.device_index != q.device_index)
    return invalid(name + " must be on the device of q (" + to_string(q.device) + ")");
  if (lse.device == Device::kCUDA && reinterpret_cast<uintptr_t>(lse.data) % 4 != 0)
    return invalid(name + ".data must be 4-byte aligned");
  return {};
}

// Scale, mask and threads: the scalar options.
Status fill_common(const CommonArgs& a, const Dims& d, const Tensor& q, AttnParams* p) {
  if (a.softmax_scale && !std::isfinite(*a.softmax_scale))
    return invalid("softmax_scale must be finite, got " + std::to_string(*a.softmax_scale));
  if (a.window_left < -1)
    return invalid("window_left must be -1 (unbounded) or >= 0, got " + std::to_string(a.window_left));
  if (a.window_right < -1)
    return invalid("window_right must be -1 (unbounded) or >= 0, got " + std::to_string(a.window_right));
  if (!std::isfinite(a.softcap) || a.softcap < 0.f)
    return invalid("softcap must be finite and >= 0 (0 = off), got " + std::to_string(a.softcap));
  if (a.num_threads < 0) return invalid("num_threads must be >= 0 (0 = all hardware threads)");
  if (!(a.dropout_p >= 0.f && a.dropout_p < 1.f))
    return invalid("dropout_p must be in [0, 1), got " + std::to_string(a.dropout_p));

  p->dtype = q.dtype;
  p->device = q.device;
  p->device_index = q.device_index;
  p->batch = int(d.batch);
  p->seqlen_q = int(d.seqlen_q);
  p->seqlen_k = int(d.seqlen_k);
  p->heads_q = int(d.heads_q);
  p->heads_kv = int(d.heads_kv);
  p->head_dim = int(d.head_dim);
  p->head_dim_v = int(d.head_dim_v);
  p->group = int(d.heads_q / d.heads_kv);
  p->varlen = d.varlen;
  p->total_q = d.total_q;
  p->total_k = d.total_k;
  if (d.varlen) {
    p->cu_seqlens_q = static_cast<const int32_t*>(a.maybe_cu_seqlens_q.data);
    p->cu_seqlens_k = static_cast<const int32_t*>(a.maybe_cu_seqlens_k.data);
  }
  constexpr double kLog2e = 1.4426950408889634;
  p->scale = a.softmax_scale ? *a.softmax_scale : float(1.0 / std::sqrt(double(d.head_dim)));
  p->scale_log2 = float(double(p->scale) * kLog2e);

  // FlashAttention's normalization: a window wider than the keys is unbounded; causal
  // is the window (left, 0).
  int wl = a.window_left, wr = a.window_right;
  if (wl >= d.seqlen_k) wl = -1;
  if (wr >= d.seqlen_k) wr = -1;
  if (a.causal) wr = 0;
  p->mask.window_left = wl;
  p->mask.window_right = wr;
  p->mask.softcap = a.softcap;
  p->dropout = DropoutPolicy::make(a.dropout_p, a.dropout_seed, a.dropout_offset);

  p->workspace = a.workspace;
  p->workspace_bytes = a.workspace_bytes;
  p->stream = a.stream;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  p->num_threads = a.num_threads > 0 ? a.num_threads : int(hw);
  p->quadratic_workspace_limit = a.quadratic_workspace_limit;
  return {};
}

// (batch, row, head) strides of a [B, S, H, D] or [T, H, D] view.
void strides_of(const Tensor& t, bool varlen, int64_t* batch, int64_t* row, int64_t* head) {
  if (varlen) {
    *batch = 0;
    *row = t.stride[0];
    *head = t.stride[1];
  } else {
    *batch = t.stride[0];
    *row = t.stride[1];
    *head = t.stride[2];
  }
}

void fill_lse(const Tensor& lse, bool varlen, AttnParams* p) {
  p->lse = static_cast<float*>(lse.data);
  if (varlen) {
    p->lse_batch_stride = 0;
    p->lse_head_stride = lse.stride[0];
  } else {
    p->lse_batch_stride = lse.stride[0];
    p->lse_head_stride = lse.stride[1];
  }
}

Status make_fwd_params(const ForwardArgs& a, FwdParams* p) {
  Dims d;
  FL_CHECK(read_dims(a, a.q, a.k, a.v, a.out, &d));
  if (a.maybe_lse.present()) FL_CHECK(check_lse(a.maybe_lse, "maybe_lse", a.q, d));
  FL_CHECK(fill_common(a, d, a.q, p));
  p->q = a.q.data;
  p->k = a.k.data;
  p->v = a.v.data;
  p->out = a.out.data;
  strides_of(a.q, d.varlen, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
  strides_of(a.k, d.varlen, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
  strides_of(a.v, d.varlen, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
  strides_of(a.out, d.varlen, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
  if (a.maybe_lse.present()) fill_lse(a.maybe_lse, d.varlen, p);
  return {};
}

Status make_bwd_params(const BackwardArgs& a, BwdParams* p) {
  Dims d;
  FL_CHECK(read_dims(a, a.q, a.k, a.v, a.out, &d));
  const int r = d.varlen ? 3 : 4;
  const char* lo = d.varlen ? "[total_q, heads_q, head_dim_v]" : "[batch, seqlen_q, heads_q, head_dim_v]";
  FL_CHECK(check_view(a.dout, "dout", r, lo));
  FL_CHECK(check_view(a.dq, "dq", r, "(the shape of q)"));
  FL_CHECK(check_view(a.dk, "dk", r, "(the shape of k)"));
  FL_CHECK(check_view(a.dv, "dv", r, "(the shape of v)"));
  struct Like { const Tensor& t; const char* name; const Tensor& ref; const char* ref_name; };
  const Like likes[] = {{a.dout, "dout", a.out, "out"}, {a.dq, "dq", a.q, "q"},
                        {a.dk, "dk", a.k, "k"}, {a.dv, "dv", a.v, "v"}};
  for (const Like& l : likes) {
    FL_CHECK(check_same_placement(l.t, l.name, a.q));
    for (int i = 0; i < r; ++i)
      if (l.t.shape[i] != l.ref.shape[i])
        return invalid(std::string(l.name) + " " + shape_str(l.t) + " must have the shape of " +
                       l.ref_name + " " + shape_str(l.ref));
    FL_CHECK(check_cuda_alignment(l.t, l.name));
  }
  if (!a.lse.present()) return invalid("lse is required by the backward (the forward's LSE)");
  FL_CHECK(check_lse(a.lse, "lse", a.q, d));
  if (a.lse.numel() > 0 && a.lse.data == nullptr) return invalid("lse.data is null");
  FL_CHECK(fill_common(a, d, a.q, p));
  p->q = a.q.data;
  p->k = a.k.data;
  p->v = a.v.data;
  p->out = a.out.data;
  strides_of(a.q, d.varlen, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
  strides_of(a.k, d.varlen, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
  strides_of(a.v, d.varlen, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
  strides_of(a.out, d.varlen, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
  fill_lse(a.lse, d.varlen, p);
  p->dout = a.dout.data;
  p->dq = a.dq.data;
  p->dk = a.dk.data;
  p->dv = a.dv.data;
  strides_of(a.dout, d.varlen, &p->do_batch_stride, &p->do_row_stride, &p->do_head_stride);
  strides_of(a.dq, d.varlen, &p->dq_batch_stride, &p->dq_row_stride, &p->dq_head_stride);
  strides_of(a.dk, d.varlen, &p->dk_batch_stride, &p->dk_row_stride, &p->dk_head_stride);
  strides_of(a.dv, d.varlen, &p->dv_batch_stride, &p->dv_row_stride, &p->dv_head_stride);
  p->deterministic = a.deterministic;
  return {};
}

// Forward and backward differ only in which half of an entry they use.
template <class P>
struct Pass;
template <>
struct Pass<FwdParams> {
  static constexpr const char* kName = "forward";
  static bool has(const KernelEntry& e) { return e.run_fwd != nullptr; }
  static bool dropout(const KernelEntry& e) { return e.info.forward_dropout; }
  static std::string supports(const KernelEntry& e, const FwdParams& p) { return e.supports_fwd(p); }
  static size_t workspace(const KernelEntry& e, const FwdParams& p) {
    return e.workspace_fwd ? e.workspace_fwd(p) : 0;
  }
  static Status run(const KernelEntry& e, const FwdParams& p) { return e.run_fwd(p); }
};
template <>
struct Pass<BwdParams> {
  static constexpr const char* kName = "backward";
  static bool has(const KernelEntry& e) { return e.run_bwd != nullptr; }
  static bool dropout(const KernelEntry& e) { return e.info.backward_dropout; }
  static std::string supports(const KernelEntry& e, const BwdParams& p) { return e.supports_bwd(p); }
  static size_t workspace(const KernelEntry& e, const BwdParams& p) {
    return e.workspace_bwd ? e.workspace_bwd(p) : 0;
  }
  static Status run(const KernelEntry& e, const BwdParams& p) { return e.run_bwd(p); }
};

// What the registry's flags say, then what the kernel's own supports() says.
template <class P>
std::string why_not(const KernelEntry& e, const P& p) {
  if (p.dropout.enabled() && !Pass<P>::dropout(e))
    return "dropout_p > 0 is not supported (dropout_p = " + std::to_string(p.dropout.p) + ")";
  return Pass<P>::supports(e, p);
}

template <class P>
Status choose(std::string_view name, const P& p, const KernelEntry** chosen) {
  using X = Pass<P>;
  const auto entries = registry();
  if (name != kAutoKernel) {
    for (const KernelEntry& e : entries) {
      if (e.info.name != name) continue;
      if (!X::has(e))
        return {StatusCode::kUnsupported,
                "kernel '" + std::string(name) + "' has no " + X::kName + " pass"};
      std::string why = why_not(e, p);
      if (!why.empty())
        return {StatusCode::kUnsupported,
                "kernel '" + std::string(name) + "' does not support this call: " + why};
      *chosen = &e;
      return {};
    }
    std::string known;
    for (const KernelEntry& e : entries) known += (known.empty() ? "" : ", ") + std::string(e.info.name);
    return {StatusCode::kNotFound, "kernel '" + std::string(name) +
                                       "' is not in this build; known kernels: " + known};
  }
  const KernelEntry* best = nullptr;
  std::string reasons;
  for (const KernelEntry& e : entries) {
    if (e.auto_priority <= 0 || !X::has(e)) continue;
    std::string why = why_not(e, p);
    if (!why.empty()) {
      reasons += "\n  " + std::string(e.info.name) + ": " + why;
      continue;
    }
    if (!best || e.auto_priority > best->auto_priority) best = &e;
  }
  if (!best)
    return {StatusCode::kUnsupported,
            std::string("no kernel supports this ") + X::kName + " call:" + reasons};
  *chosen = best;
  return {};
}

bool nothing_to_write(const FwdParams& p) { return p.total_q == 0 || p.batch == 0; }
bool nothing_to_write(const BwdParams& p) {
  return p.batch == 0 || (p.total_q == 0 && p.total_k == 0);
}

template <class P>
Status run_checked(const P& p, std::string_view name) {
  const KernelEntry* e = nullptr;
  FL_CHECK(choose(name, p, &e));
  const size_t need = Pass<P>::workspace(*e, p);
  if (p.workspace_bytes < need)
    return {StatusCode::kWorkspaceTooSmall,
            "workspace_bytes (" + std::to_string(p.workspace_bytes) +
                ") is smaller than workspace_size() = " + std::to_string(need) + " for kernel '" +
                std::string(e->info.name) + "'"};
  if (need > 0 && p.workspace == nullptr)
    return invalid("workspace is null but kernel '" + std::string(e->info.name) + "' needs " +
                   std::to_string(need) + " bytes");
  if (nothing_to_write(p)) return {};
  return Pass<P>::run(*e, p);
}

template <class P>
Status size_checked(const P& p, std::string_view name, size_t* bytes) {
  if (!bytes) return invalid("bytes (the output pointer of workspace_size) is null");
  const KernelEntry* e = nullptr;
  FL_CHECK(choose(name, p, &e));
  *bytes = Pass<P>::workspace(*e, p);
  return {};
}

template <class P>
Status name_checked(const P& p, std::string_view name, std::string* out) {
  if (!out) return invalid("name (the output pointer of select_kernel) is null");
  const KernelEntry* e = nullptr;
  FL_CHECK(choose(name, p, &e));
  *out = std::string(e->info.name);
  return {};
}

}  // namespace

Status forward(const ForwardArgs& args) noexcept {
  FwdParams p;
  FL_CHECK(make_fwd_params(args, &p));
  return run_checked(p, args.kernel);
}

Status backward(const BackwardArgs& args) noexcept {
  BwdParams p;
  FL_CHECK(make_bwd_params(args, &p));
  return run_checked(p, args.kernel);
}

Status workspace_size(const ForwardArgs& args, size_t* bytes) noexcept {
  FwdParams p;
  FL_CHECK(make_fwd_params(args, &p));
  return size_checked(p, args.kernel, bytes);
}

Status workspace_size(const BackwardArgs& args, size_t* bytes) noexcept {
  BwdParams p;
  FL_CHECK(make_bwd_params(args, &p));
  return size_checked(p, args.kernel, bytes);
}

Status select_kernel(const ForwardArgs& args, std::string* name) noexcept {
  FwdParams p;
  FL_CHECK(make_fwd_params(args, &p));
  return name_checked(p, args.kernel, name);
}

Status select_kernel(const BackwardArgs& args, std::string* name) noexcept {
  BwdParams p;
  FL_CHECK(make_bwd_params(args, &p));
  return name_checked(p, args.kernel, name);
}

}  // namespace flashlab
