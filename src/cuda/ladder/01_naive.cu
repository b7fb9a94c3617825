// Rung 1 — naive: attention as three kernels through global memory.
//
//   1. scores:  S = mask(logit(scale · Q Kᵀ))   one thread per (query, key), fp32 into HBM
//   2. softmax: P = softmax_rows(S), LSE        one block per row, P overwrites S in place
//   3. output:  O = P V                         one thread per (query, channel)
//
// What it shows: the textbook algorithm is memory-bound on the B·H·Sq·Sk score matrix.
// S is written once, read and written by the softmax, read again by PV: ~16 bytes of HBM
// traffic per score, against 4·D FLOPs. It also needs O(seqlen²) workspace, which is why
// it refuses (through supports()) calls above the caller's quadratic_workspace_limit.
// Every later rung removes some of that traffic.
//
// Measured on H100 80GB HBM3 (`flashlab bench --ladder`, batch 4, heads 16, seqlen 4096,
// head dim 128, bf16): 599 ms, 0.92 TFLOP/s (causal 0.84), 4.00 GiB of workspace; ncu: the
// three kernels move 17 GB through HBM. At seqlen 16384 it refuses (16 GiB > the 4 GiB
// default limit) unless the caller raises quadratic_workspace_limit. docs/ladder/01-naive.md.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "cuda/common.cuh"
#include "cuda/refusals.h"
#include "common/registry.h"

namespace flashlab::cuda {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "rung 1: three kernels (QKᵀ, softmax, PV) through an O(seqlen²) fp32 score matrix in HBM; "
    "fp32/fp16/bf16, every mask, GQA, varlen; forward only";

constexpr int kTileKeys = 32;     // scores kernel: keys per block (threadIdx.x)
constexpr int kTileQueries = 8;   // scores / output kernels: queries per block (threadIdx.y)
constexpr int kTileChannels = 32; // output kernel: channels of V per block (threadIdx.x)
constexpr int kSoftmaxThreads = 256;

// Score matrix of (b, h): [seqlen_q, seqlen_k] fp32, padded to the max lengths.
__device__ __forceinline__ float* score_row(const FwdParams& p, float* S, int bh, int i) {
  return S + (int64_t(bh) * p.seqlen_q + i) * p.seqlen_k;
}

template <class T>
__global__ void scores_kernel(const FwdParams p, float* S) {
  const int j = blockIdx.x * kTileKeys + threadIdx.x;
  const int i = blockIdx.y * kTileQueries + threadIdx.y;
  const int bh = blockIdx.z, b = bh / p.heads_q, h = bh % p.heads_q, hk = h / p.group;
  const SeqInfo s = seq_info(p, b);
  if (i >= s.len_q || j >= s.len_k) return;
  float* row = score_row(p, S, bh, i);
  if (!p.mask.allowed(i, j, s.len_q, s.len_k)) {
    row[j] = -INFINITY;
    return;
  }
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + (s.start_q + i) * p.q_row_stride +
               h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + (s.start_k + j) * p.k_row_stride +
               hk * p.k_head_stride;
  float acc = 0.f;
  for (int d = 0; d < p.head_dim; ++d) acc += to_float(q[d]) * to_float(k[d]);
  row[j] = p.mask.logit(acc * p.scale);
}

// Block-wide reduction of one float with op (max or sum); `identity` pads the last stage.
template <class Op>
__device__ float block_reduce(float x, Op op, float identity, float* smem) {
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < kSoftmaxThreads / 32 ? smem[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (lane == 0) smem[0] = x;
  }
  __syncthreads();
  x = smem[0];
  __syncthreads();  // smem is reused by the next reduction
  return x;
}

__global__ void softmax_kernel(const FwdParams p, float* S) {
  __shared__ float smem[kSoftmaxThreads / 32];
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / p.heads_q, h = bh % p.heads_q;
  const SeqInfo s = seq_info(p, b);
  if (i >= s.len_q) return;
  float* row = score_row(p, S, bh, i);

  float m = -INFINITY;
  for (int j = threadIdx.x; j < s.len_k; j += kSoftmaxThreads) m = fmaxf(m, row[j]);
  m = block_reduce(m, [](float a, float c) { return fmaxf(a, c); }, -INFINITY, smem);
  // A row that sees no key: P = 0, LSE = -inf (exp(-inf - -inf) would be NaN).
  const float m_safe = m == -INFINITY ? 0.f : m;
  float l = 0.f;
  for (int j = threadIdx.x; j < s.len_k; j += kSoftmaxThreads) l += expf(row[j] - m_safe);
  l = block_reduce(l, [](float a, float c) { return a + c; }, 0.f, smem);
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  for (int j = threadIdx.x; j < s.len_k; j += kSoftmaxThreads) row[j] = expf(row[j] - m_safe) * inv_l;
  if (threadIdx.x == 0 && p.lse)
    p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + s.start_q + i] =
        l > 0.f ? m + logf(l) : -INFINITY;
}

template <class T>
__global__ void output_kernel(const FwdParams p, const float* P) {
  const int d = blockIdx.x * kTileChannels + threadIdx.x;
  const int i = blockIdx.y * kTileQueries + threadIdx.y;
  const int bh = blockIdx.z, b = bh / p.heads_q, h = bh % p.heads_q, hk = h / p.group;
  const SeqInfo s = seq_info(p, b);
  if (i >= s.len_q || d >= p.head_dim_v) return;
  const float* row = P + (int64_t(bh) * p.seqlen_q + i) * p.seqlen_k;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + s.start_k * p.v_row_stride +
               hk * p.v_head_stride + d;
  // Only the keys the row sees: a masked key's P is 0, and 0 · NaN would carry a NaN or Inf
  // in its V into the row.
  const int j0 = p.mask.key_begin(i, s.len_q, s.len_k), j1 = p.mask.key_end(i, s.len_q, s.len_k);
  float acc = 0.f;
  for (int j = j0; j < j1; ++j) acc += row[j] * to_float(v[j * p.v_row_stride]);
  T* o = static_cast<T*>(p.out) + b * p.o_batch_stride + (s.start_q + i) * p.o_row_stride +
         h * p.o_head_stride;
  o[d] = from_float<T>(acc);
}

size_t workspace(const FwdParams& p) {
  return size_t(p.batch) * p.heads_q * size_t(p.seqlen_q) * size_t(p.seqlen_k) * sizeof(float);
}

std::string supports(const FwdParams& p) {
  FL_REFUSE_IF(refuse_placement(p, Inputs::kFloat));
  FL_REFUSE_IF(refuse_grid_batch_heads(p, 65535, "z"));
  if (p.seqlen_q > 65535 * kTileQueries) return "seqlen_q is too long for the grid";
  const size_t ws = workspace(p);
  if (ws > p.quadratic_workspace_limit)
    return "needs " + std::to_string(ws >> 20) +
           " MiB of O(seqlen_q·seqlen_k) workspace for S, above quadratic_workspace_limit (" +
           std::to_string(p.quadratic_workspace_limit >> 20) + " MiB); raise it to run";
  return "";
}

Status run(const FwdParams& p) {
  DeviceGuard guard(p.device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  float* S = static_cast<float*>(p.workspace);  // [batch·heads_q, seqlen_q, seqlen_k]
  const int bh = p.batch * p.heads_q;
  return dispatch_dtype(p.dtype, [&]<class T>() -> Status {
    if (p.seqlen_k > 0) {
      const dim3 grid((p.seqlen_k + kTileKeys - 1) / kTileKeys,
                      (p.seqlen_q + kTileQueries - 1) / kTileQueries, bh);
      scores_kernel<T><<<grid, dim3(kTileKeys, kTileQueries), 0, stream>>>(p, S);
      FL_CUDA_CHECK_LAUNCH();
    }
    softmax_kernel<<<dim3(p.seqlen_q, bh), kSoftmaxThreads, 0, stream>>>(p, S);
    FL_CUDA_CHECK_LAUNCH();
    const dim3 grid((p.head_dim_v + kTileChannels - 1) / kTileChannels,
                    (p.seqlen_q + kTileQueries - 1) / kTileQueries, bh);
    output_kernel<T><<<grid, dim3(kTileChannels, kTileQueries), 0, stream>>>(p, S);
    FL_CUDA_CHECK_LAUNCH();
    return {};
  });
}

}  // namespace

// auto_priority 0 (the default): a teaching rung, run only when named.
KernelEntry naive_entry() {
  return {.info = {"naive", "sm80+", kSummary},
          .supports_fwd = supports, .workspace_fwd = workspace, .run_fwd = run};
}

}  // namespace flashlab::cuda
