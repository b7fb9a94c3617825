// Validation: every rule of the API on the caller's Args, in the order the caller would fix
// them (each tensor alone, then how they agree, then memory, then the scalar options), and
// the Params kernels see. Sizes that kernels multiply are bounded here so that no product
// they form can wrap: element counts and extents fit int64, (batch, head) pairs fit int32,
// and the problem's workspace bound fits int64.
#include <algorithm>
#include <climits>
#include <cmath>
#include <thread>

#include "api/validate.h"
#include "common/constants.h"

namespace flashlab::api {

std::string dims_str(const std::array<int64_t, kMaxRank>& v, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

namespace {

using std::to_string;

int hardware_threads() {
  static const int n = int(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

}  // namespace

// Rank, sizes, strides, element count, pointer and extent of one tensor, with nothing
// about its neighbours.
Status check_view(const Tensor& t, const char* name, int rank, const char* layout) {
  const auto named = [name](const std::string& rest) { return invalid(name + rest); };
  if (t.rank != rank)
    return named(" must have rank " + to_string(rank) + " " + layout + ", got rank " + to_string(t.rank));
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0) return named(".shape[" + to_string(i) + "] is negative (" + to_string(t.shape[i]) + ")");
    if (t.shape[i] > INT32_MAX) return named(".shape[" + to_string(i) + "] exceeds 2^31 - 1");
    if (t.stride[i] < 0) return named(".stride[" + to_string(i) + "] is negative; strides must be >= 0");
  }
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    return named(" must be contiguous in its last dimension (stride[" + to_string(rank - 1) + "] = " +
                 to_string(t.stride[rank - 1]) + ", must be 1)");
  if (t.numel() == 0) return {};
  int64_t count = 1;
  for (int i = 0; i < rank; ++i)
    if (!checked_mul(count, t.shape[i], &count))
      return named(" has more than 2^63 - 1 elements (shape " + dims_str(t.shape, rank) + ")");
  if (t.data == nullptr) return named(".data is null");
  return check_extent(t, name);
}

Status check_same_placement(const Tensor& t, const char* name, const Tensor& q) {
  if (t.dtype != q.dtype)
    return invalid(std::string(name) + ".dtype (" + to_string(t.dtype) + ") must match q.dtype (" +
                   to_string(q.dtype) + ")");
  if (t.device != q.device || t.device_index != q.device_index)
    return invalid(std::string(name) + " is on " + to_string(t.device) + ":" +
                   to_string(t.device_index) + " but q is on " + to_string(q.device) + ":" +
                   to_string(q.device_index));
  return {};
}

Status expect_dim(const Tensor& t, const char* name, int axis, int64_t want, const char* what) {
  if (t.shape[axis] != want)
    return invalid(std::string(name) + ".shape[" + to_string(axis) + "] (" + what + ") must be " +
                   to_string(want) + ", got " + to_string(t.shape[axis]) + " in " + name + " " +
                   dims_str(t.shape, t.rank));
  return {};
}

// CUDA kernels load 16 bytes at a time: base pointers and every stride that matters
// (dimension size > 1) must be multiples of 16 bytes.
Status check_cuda_alignment(const Tensor& t, const char* name) {
  if (t.device != Device::kCUDA || t.numel() == 0) return {};
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    return invalid(std::string(name) + ".data must be 16-byte aligned for CUDA kernels");
  const int64_t es = int64_t(dtype_size(t.dtype));
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && (t.stride[i] * es) % 16 != 0)
      return invalid(std::string(name) + ".stride[" + to_string(i) + "] (" + to_string(t.stride[i]) +
                     " elements = " + to_string(t.stride[i] * es) +
                     " bytes) must be a multiple of 16 bytes for CUDA kernels");
  }
  return {};
}

Status check_int32(const Tensor& t, const char* name, int rank, const char* layout, const Tensor& q) {
  FL_CHECK(check_view(t, name, rank, layout));
  if (t.dtype != DType::kI32)
    return invalid(std::string(name) + ".dtype must be int32, got " + to_string(t.dtype));
  if (t.device != q.device || t.device_index != q.device_index)
    return invalid(std::string(name) + " must be on the device of q (" + to_string(q.device) + ")");
  return {};
}

namespace {

Status check_cu_seqlens(const Tensor& cu, const char* name, const Tensor& q) {
  FL_CHECK(check_int32(cu, name, 1, "[batch + 1]", q));
  if (cu.shape[0] < 1) return invalid(std::string(name) + " must have batch + 1 >= 1 entries, got 0");
  return {};
}

// batch, the sequence lengths and the packed totals of a varlen call. max_seqlen may
// over-estimate (FlashAttention takes that too); kernels get it bounded by the totals, the
// longest a sequence can be, so that nothing sized by it exceeds the tensors' own sizes.
Status read_varlen_dims(const CommonArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, Dims* d) {
  FL_CHECK(check_cu_seqlens(a.maybe_cu_seqlens_q, "cu_seqlens_q", q));
  FL_CHECK(check_cu_seqlens(a.maybe_cu_seqlens_k, "cu_seqlens_k", q));
  if (a.maybe_cu_seqlens_q.shape[0] != a.maybe_cu_seqlens_k.shape[0])
    return invalid("cu_seqlens_q and cu_seqlens_k must have the same length "
                   "(batch + 1), got " + to_string(a.maybe_cu_seqlens_q.shape[0]) + " and " +
                   to_string(a.maybe_cu_seqlens_k.shape[0]));
  if (a.max_seqlen_q < 0) return invalid("max_seqlen_q must be >= 0");
  if (a.max_seqlen_k < 0) return invalid("max_seqlen_k must be >= 0");
  d->batch = a.maybe_cu_seqlens_q.shape[0] - 1;
  d->total_q = q.shape[0];
  d->total_k = k.shape[0];
  d->seqlen_q = std::min<int64_t>(a.max_seqlen_q, d->total_q);
  d->seqlen_k = std::min<int64_t>(a.max_seqlen_k, d->total_k);
  FL_CHECK(expect_dim(v, "v", 0, d->total_k, "total_k"));
  FL_CHECK(expect_dim(out, "out", 0, d->total_q, "total_q"));
  FL_CHECK(check_cu_contents(a, a.maybe_cu_seqlens_q, "cu_seqlens_q", d->total_q,
                             a.max_seqlen_q, "max_seqlen_q"));
  return check_cu_contents(a, a.maybe_cu_seqlens_k, "cu_seqlens_k", d->total_k,
                           a.max_seqlen_k, "max_seqlen_k");
}

}  // namespace

// Kernels index (batch, head) pairs and size their workspaces with products of these
// dimensions: both must fit. batch·heads_kv <= batch·heads_q, as heads_kv divides heads_q.
// The workspace bound covers every kernel's formula (cpu_reference's O(seqlen_q·seqlen_k)
// fp64 scores per thread, at most one thread per (batch, head) pair, is the largest).
Status check_problem_size(const Dims& d) {
  int64_t pairs = 0;
  if (!checked_mul(d.batch, d.heads_q, &pairs) || pairs > INT32_MAX)
    return invalid("batch·heads_q = " + to_string(d.batch) + "·" + to_string(d.heads_q) + " = " +
                   to_string(d.batch * d.heads_q) +
                   " exceeds 2^31 - 1: kernels index (batch, head) pairs with int32");
  int64_t scores = 0, rows = 0, work = 0, bound = 0;
  const bool fits = checked_mul(pairs, d.seqlen_q + 1, &scores) &&
                    checked_mul(scores, d.seqlen_k + 1, &scores) &&
                    checked_mul(d.heads_q, d.total_q + d.total_k, &rows) &&
                    checked_add(scores, rows, &work) &&
                    checked_mul(work, 16 * (d.head_dim + d.head_dim_v + 2), &bound);
  if (!fits)
    return invalid("the problem is too large: its workspace bound 16·(head_dim + head_dim_v + 2)·"
                   "(batch·heads_q·(seqlen_q + 1)·(seqlen_k + 1) + heads_q·(total_q + total_k)) "
                   "bytes exceeds 2^63 - 1 (batch " + to_string(d.batch) + ", heads_q " +
                   to_string(d.heads_q) + ", seqlen_q " + to_string(d.seqlen_q) + ", seqlen_k " +
                   to_string(d.seqlen_k) + ")");
  return {};
}

namespace {

Status read_dims(const CommonArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, Dims* d) {
  const bool has_cq = a.maybe_cu_seqlens_q.present(), has_ck = a.maybe_cu_seqlens_k.present();
  if (has_cq != has_ck)
    return invalid("cu_seqlens_q and cu_seqlens_k must both be given (varlen) or "
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
      return invalid(std::string("q.dtype must be fp16, bf16, fp32 or fp64, got ") + to_string(q.dtype));
  }
  FL_CHECK(check_same_placement(k, "k", q));
  FL_CHECK(check_same_placement(v, "v", q));
  FL_CHECK(check_same_placement(out, "out", q));

  const int h = r - 2;  // heads axis
  if (d->varlen) {
    FL_CHECK(read_varlen_dims(a, q, k, v, out, d));
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
  if (d->heads_q < 1) return invalid("heads_q (q.shape[" + to_string(h) + "]) must be >= 1");
  if (d->heads_kv < 1) return invalid("heads_kv (k.shape[" + to_string(h) + "]) must be >= 1");
  if (d->heads_q % d->heads_kv != 0)
    return invalid("heads_q (" + to_string(d->heads_q) + ") must be a multiple of heads_kv (" +
                   to_string(d->heads_kv) + ") for GQA/MQA");
  constexpr int64_t kMaxHeadDim = 1024;
  if (d->head_dim < 1 || d->head_dim > kMaxHeadDim)
    return invalid("head_dim must be in [1, 1024], got " + to_string(d->head_dim));
  if (d->head_dim_v < 1 || d->head_dim_v > kMaxHeadDim)
    return invalid("head_dim_v must be in [1, 1024], got " + to_string(d->head_dim_v));
  FL_CHECK(check_problem_size(*d));

  FL_CHECK(check_cuda_alignment(q, "q"));
  FL_CHECK(check_cuda_alignment(k, "k"));
  FL_CHECK(check_cuda_alignment(v, "v"));
  return check_cuda_alignment(out, "out");
}

}  // namespace

Status check_lse(const Tensor& lse, const char* name, const Tensor& q, const Dims& d) {
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
    return invalid(std::string(name) + ".dtype must be fp32, got " + to_string(lse.dtype));
  if (lse.device != q.device || lse.device_index != q.device_index)
    return invalid(std::string(name) + " must be on the device of q (" + to_string(q.device) + ")");
  if (lse.device == Device::kCUDA && reinterpret_cast<uintptr_t>(lse.data) % 4 != 0)
    return invalid(std::string(name) + ".data must be 4-byte aligned");
  return {};
}

// Scale, mask, dropout and threads: the scalar options, and the Params every pass shares.
Status fill_common(const CommonArgs& a, const Dims& d, const Tensor& q, AttnParams* p) {
  if (a.softmax_scale && !std::isfinite(*a.softmax_scale))
    return invalid("softmax_scale must be finite, got " + to_string(*a.softmax_scale));
  if (a.window_left < -1)
    return invalid("window_left must be -1 (unbounded) or >= 0, got " + to_string(a.window_left));
  if (a.window_right < -1)
    return invalid("window_right must be -1 (unbounded) or >= 0, got " + to_string(a.window_right));
  if (!std::isfinite(a.softcap) || a.softcap < 0.f)
    return invalid("softcap must be finite and >= 0 (0 = off), got " + to_string(a.softcap));
  if (a.num_threads < 0) return invalid("num_threads must be >= 0 (0 = all hardware threads)");
  if (a.num_threads > kMaxThreads)
    return invalid("num_threads must be in [0, " + to_string(kMaxThreads) + "], got " +
                   to_string(a.num_threads));
  if (!(a.dropout_p >= 0.f && a.dropout_p < 1.f))
    return invalid("dropout_p must be in [0, 1), got " + to_string(a.dropout_p));

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
  p->scale = a.softmax_scale ? *a.softmax_scale : float(1.0 / std::sqrt(double(d.head_dim)));
  p->scale_log2 = float(double(p->scale) * kLog2eF64);
  p->mask = MaskPolicy::make(a.window_left, a.window_right, a.causal, d.seqlen_q, d.seqlen_k, a.softcap);
  p->dropout = DropoutPolicy::make(a.dropout_p, a.dropout_seed, a.dropout_offset);

  p->workspace = a.workspace;
  p->workspace_bytes = a.workspace_bytes;
  p->stream = a.stream;
  p->num_threads = a.num_threads > 0 ? a.num_threads : hardware_threads();
  p->quadratic_workspace_limit = a.quadratic_workspace_limit;
  return {};
}

// (batch, row, head) strides of a [B, S, H, D] or [T, H, D] view.
void strides_of(const Tensor& t, bool varlen, int64_t* batch, int64_t* row, int64_t* head) {
  *batch = varlen ? 0 : t.stride[0];
  *row = t.stride[varlen ? 0 : 1];
  *head = t.stride[varlen ? 1 : 2];
}

// The pointers and strides of q, k, v and out, which both passes read.
void fill_qkvo(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, bool varlen,
               AttnParams* p) {
  p->q = q.data;
  p->k = k.data;
  p->v = v.data;
  p->out = out.data;
  strides_of(q, varlen, &p->q_batch_stride, &p->q_row_stride, &p->q_head_stride);
  strides_of(k, varlen, &p->k_batch_stride, &p->k_row_stride, &p->k_head_stride);
  strides_of(v, varlen, &p->v_batch_stride, &p->v_row_stride, &p->v_head_stride);
  strides_of(out, varlen, &p->o_batch_stride, &p->o_row_stride, &p->o_head_stride);
}

void fill_lse(const Tensor& lse, bool varlen, AttnParams* p) {
  p->lse = static_cast<float*>(lse.data);
  p->lse_batch_stride = varlen ? 0 : lse.stride[0];
  p->lse_head_stride = lse.stride[varlen ? 0 : 1];
}

Status make_params(const ForwardArgs& a, FwdParams* p) {
  Dims d;
  FL_CHECK(read_dims(a, a.q, a.k, a.v, a.out, &d));
  if (a.maybe_lse.present()) FL_CHECK(check_lse(a.maybe_lse, "lse", a.q, d));
  const NamedView outputs[] = {{&a.out, "out"}, {&a.maybe_lse, "lse"}};
  const NamedView inputs[] = {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"},
                              {&a.maybe_cu_seqlens_q, "cu_seqlens_q"},
                              {&a.maybe_cu_seqlens_k, "cu_seqlens_k"}};
  FL_CHECK(check_outputs_disjoint(outputs, inputs));
  FL_CHECK(fill_common(a, d, a.q, p));
  fill_qkvo(a.q, a.k, a.v, a.out, d.varlen, p);
  if (a.maybe_lse.present()) fill_lse(a.maybe_lse, d.varlen, p);
  return {};
}

Status make_params(const BackwardArgs& a, BwdParams* p) {
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
        return invalid(std::string(l.name) + " " + dims_str(l.t.shape, r) + " must have the shape of " +
                       l.ref_name + " " + dims_str(l.ref.shape, r));
    FL_CHECK(check_cuda_alignment(l.t, l.name));
  }
  if (!a.lse.present()) return invalid("lse is required by the backward (the forward's LSE)");
  FL_CHECK(check_lse(a.lse, "lse", a.q, d));
  const NamedView outputs[] = {{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
  const NamedView inputs[] = {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.out, "out"},
                              {&a.dout, "dout"}, {&a.lse, "lse"},
                              {&a.maybe_cu_seqlens_q, "cu_seqlens_q"},
                              {&a.maybe_cu_seqlens_k, "cu_seqlens_k"}};
  FL_CHECK(check_outputs_disjoint(outputs, inputs));
  FL_CHECK(fill_common(a, d, a.q, p));
  if (a.q.dtype != DType::kF64 && !(std::fabs(p->scale) <= kMaxBackwardScale))
    return invalid("softmax_scale must be within [-" + to_string(int(kMaxBackwardScale)) + ", " +
                   to_string(int(kMaxBackwardScale)) + "] in a backward below fp64 "
                   "(the rounding of out and lse, times the scale, would swamp the gradients), "
                   "got " + to_string(p->scale));
  fill_qkvo(a.q, a.k, a.v, a.out, d.varlen, p);
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

}  // namespace flashlab::api
