// Private to src/api: what validation (validate.cpp, memory.cpp, cu_seqlens.cpp) and
// dispatch (dispatch.cpp) share. Validation is the only code that reads Args: it checks
// every rule of the API, in the order the caller would fix them, and turns the Args into
// Params. A refusal names the argument and the rule; a success builds no string.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/params.h"
#include "flashlab/flashlab.h"

namespace flashlab::api {

inline Status invalid(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }

#define FL_CHECK(expr)       \
  do {                       \
    Status s_ = (expr);      \
    if (!s_.ok()) return s_; \
  } while (0)

// int64 arithmetic that says when the result does not fit instead of wrapping.
inline bool checked_mul(int64_t a, int64_t b, int64_t* r) { return !__builtin_mul_overflow(a, b, r); }
inline bool checked_add(int64_t a, int64_t b, int64_t* r) { return !__builtin_add_overflow(a, b, r); }

// "[2, 3, 4, 8]": the first `rank` entries of a shape or stride, for messages.
std::string dims_str(const std::array<int64_t, kMaxRank>& v, int rank);

// ---- validate.cpp -----------------------------------------------------------------------
// Args → Params with every rule checked. Nothing is read through a tensor's data pointer
// except host cu_seqlens (and device ones with check_inputs).
Status make_params(const ForwardArgs& a, FwdParams* p);
Status make_params(const BackwardArgs& a, BwdParams* p);
// The per-tensor rules the entry points share: rank, sizes, strides, pointer and extent of
// one view; dtype and device equal to q's; one extent equal to `want`.
Status check_view(const Tensor& t, const char* name, int rank, const char* layout);
Status check_same_placement(const Tensor& t, const char* name, const Tensor& q);
Status expect_dim(const Tensor& t, const char* name, int axis, int64_t want, const char* what);
// An int32 table (cu_seqlens, the KV cache's cache_seqlens, block_table...): its view, its
// dtype and q's device.
Status check_int32(const Tensor& t, const char* name, int rank, const char* layout, const Tensor& q);

// The dimensions every call shares, read off q/k/v/out and the varlen arguments.
struct Dims {
  bool varlen = false;
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, total_q = 0, total_k = 0;
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
};
// LSE, fp32 [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]) on q's device.
Status check_lse(const Tensor& lse, const char* name, const Tensor& q, const Dims& d);

// The shared steps of make_params, for entry points with Args of their own (kvcache.cpp):
// the scalar options (scale, mask, dropout, threads) and the sizes into Params; the
// pointers and strides of q, k, v and out ([B, S, H, D] views, or [T, H, D] for varlen);
// LSE's; the bound on sizes that keeps workspace formulas from wrapping; 16-byte alignment
// of a CUDA tensor's pointer and strides.
Status fill_common(const CommonArgs& a, const Dims& d, const Tensor& q, AttnParams* p);
void fill_qkvo(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, bool varlen,
               AttnParams* p);
void fill_lse(const Tensor& lse, bool varlen, AttnParams* p);
Status check_problem_size(const Dims& d);
Status check_cuda_alignment(const Tensor& t, const char* name);

// ---- dispatch.cpp -----------------------------------------------------------------------
// forward_kvcache on a device: the named kernel (or auto's choice) that runs p, its
// workspace checked; and that kernel's workspace size.
Status run_kvcache(const KvCacheParams& p, std::string_view kernel);
Status kvcache_workspace(const KvCacheParams& p, std::string_view kernel, size_t* bytes);

// ---- memory.cpp -------------------------------------------------------------------------
// The span of a view, 1 + Σ (shape_i − 1)·stride_i elements, must fit int64 in elements
// and in bytes, and its bytes must not run past the end of the address space, so that no
// kernel's offset arithmetic can wrap. Shapes and strides are already >= 0.
Status check_extent(const Tensor& t, const char* name);

struct NamedView {
  const Tensor* t;
  const char* name;
};
// No output shares a byte with an input or with another output, and no output repeats an
// element in memory (its layout is non-overlapping). Empty views touch nothing.
Status check_outputs_disjoint(std::span<const NamedView> outputs, std::span<const NamedView> inputs);

// ---- cu_seqlens.cpp ---------------------------------------------------------------------
// The contents of cu_seqlens: starts at 0, non-decreasing, no sequence longer than
// max_len, the last entry within the `total` rows of the packed tensors. Read on the host;
// device cu_seqlens only with a.check_inputs (copied on a.stream), else not read at all.
Status check_cu_contents(const CommonArgs& a, const Tensor& cu, const char* name, int64_t total,
                         int max_len, const char* max_name);

}  // namespace flashlab::api
