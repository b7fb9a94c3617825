// FlashLab public C++ API.
//
// One call computes exact attention  O = softmax(scale · Q Kᵀ + mask) V  for tensors in
// FlashAttention's layout [batch, seqlen, heads, head_dim] (or packed varlen
// [total_tokens, heads, head_dim] with cu_seqlens). Every entry point:
//   - never throws (all functions are noexcept; failures come back as a Status),
//   - takes no memory of its own for the computation: scratch space is the caller's
//     `workspace`, sized by workspace_size() for the same arguments. A successful call on
//     CPU tensors allocates nothing once one call has run (the first starts OpenMP's thread
//     pool); an error allocates its Status message, and "auto" on device tensors may
//     allocate the reason of a kernel that refuses the call,
//   - validates everything first; a bad argument gets a Status whose message names the
//     argument and the rule it broke, and nothing is read or written. The rules include
//     sizes that could overflow a kernel's arithmetic (element counts and extents beyond
//     int64, batch·heads_q beyond int32) and outputs that overlap an input, another output
//     or themselves.
//
// The header has no CUDA dependency: streams are passed as `void*` (a cudaStream_t).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace flashlab {

// ---------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    // an argument breaks a rule of the API (shape, dtype, pointer, ...)
  kUnsupported,        // valid, but no kernel (or not the named one) supports it
  kNotFound,           // the named kernel does not exist in this build
  kWorkspaceTooSmall,  // workspace_bytes < workspace_size(args)
  kCudaError,          // a CUDA runtime call or kernel launch failed
};

class Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const noexcept { return code_ == StatusCode::kOk; }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* to_string(StatusCode code) noexcept;

// ---------------------------------------------------------------------------------------
// Tensors: non-owning strided views. Shapes and strides are in elements.
// ---------------------------------------------------------------------------------------
enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI32 };
enum class Device : uint8_t { kCPU, kCUDA };

const char* to_string(DType dtype) noexcept;
const char* to_string(Device device) noexcept;
size_t dtype_size(DType dtype) noexcept;

inline constexpr int kMaxRank = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  int device_index = 0;
  int rank = 0;  // 0 = absent (for the maybe_* optionals)
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};

  bool present() const noexcept { return rank != 0; }
  // The product of the shape (0 when absent or empty), INT64_MAX when it does not fit.
  int64_t numel() const noexcept;

  // A row-major (contiguous) view of `shape`.
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                           Device device = Device::kCPU, int device_index = 0) noexcept;
  // A view with explicit strides (in elements).
  static Tensor strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> stride, Device device = Device::kCPU,
                        int device_index = 0) noexcept;
};

// ---------------------------------------------------------------------------------------
// Arguments (what the caller gives). Kernels never see these: validation turns them into
// plain-data Params first.
// ---------------------------------------------------------------------------------------
inline constexpr std::string_view kAutoKernel = "auto";

// The most CPU threads a call may ask for. OpenMP aborts the process when it cannot create
// a thread, so an unbounded count would end in a crash instead of a Status; the bound is
// fixed (not a multiple of this machine's threads) so that a call valid on one machine is
// valid on all. Under a tight process limit, pass fewer.
inline constexpr int kMaxThreads = 1024;

// The largest |softmax_scale| a backward takes below fp64. The gradients are recomputed from
// the forward's O (in the input dtype) and LSE (fp32), and D = rowsum(dO ∘ O) cancels
// against dO · v when a row's softmax is nearly one-hot: their rounding, times the scale,
// swamps the gradients long before the scores overflow. Models use 1/sqrt(head_dim) or a
// softcap's ~50; the CUDA kernels take no more in either pass.
inline constexpr float kMaxBackwardScale = 1024.f;

struct CommonArgs {
  // Varlen: both present or both absent. int32 [batch + 1], on the device of q, starting
  // at 0 and non-decreasing, the last entry at most the packed rows. With them q/k/v/out
  // are [total_tokens, heads, head_dim]. Host cu_seqlens are checked on every call; device
  // ones only with check_inputs, and without it kernels clamp them (offsets to the packed
  // rows, lengths to max_seqlen), so a bad array gives wrong rows, never a stray access.
  Tensor maybe_cu_seqlens_q;
  Tensor maybe_cu_seqlens_k;
  // Varlen only: at least the longest sequence in cu_seqlens_q/k. An over-estimate is
  // accepted, as FlashAttention accepts one; kernels see it bounded by total_q/total_k.
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;

  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  bool causal = false;                 // bottom-right aligned, as FlashAttention >= 2.1
  int window_left = -1;                // sliding window; -1 = unbounded
  int window_right = -1;
  float softcap = 0.f;                 // 0 = off; else logits = softcap·tanh(logits/softcap)
  // Dropout on the attention probabilities, in [0, 1). The mask is a pure function of
  // (seed, offset) and the element's place (src/common/dropout.h): the backward must get the
  // forward's three values to regenerate it.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;

  std::string_view kernel = kAutoKernel;  // "auto" or a name from kernels()
  void* stream = nullptr;                 // cudaStream_t for CUDA tensors
  void* workspace = nullptr;              // caller's scratch, on the tensors' device, 16-byte aligned
  size_t workspace_bytes = 0;
  int num_threads = 0;                    // CPU kernels: 0 = all hardware threads, at most kMaxThreads
  // Kernels whose workspace grows as seqlen_q·seqlen_k (cpu_reference, the naive GPU rung)
  // refuse calls that would need more than this; raise it to run them anyway.
  size_t quadratic_workspace_limit = size_t(4) << 30;
  // Copy device cu_seqlens to the host (on `stream`, which is synchronized) and check them
  // as host ones are checked. Costs a device round trip per call; off by default.
  bool check_inputs = false;
};

// Memory: outputs (out and maybe_lse; dq, dk and dv) must not share a byte with any input
// (q, k, v, cu_seqlens; in the backward also out, dout and lse) or with each other, and no
// two elements of an output may share memory. Inputs may alias each other (q = k), and
// views that interleave in one buffer without sharing a byte are accepted: the q, k, v of
// a packed qkv [batch, seqlen, 3, heads, head_dim], and the dq, dk, dv of a packed dqkv.

struct ForwardArgs : CommonArgs {
  Tensor q;          // [batch, seqlen_q, heads_q,  head_dim]
  Tensor k;          // [batch, seqlen_k, heads_kv, head_dim]
  Tensor v;          // [batch, seqlen_k, heads_kv, head_dim_v]
  Tensor out;        // [batch, seqlen_q, heads_q,  head_dim_v]   (written)
  Tensor maybe_lse;  // fp32 [batch, heads_q, seqlen_q]; varlen [heads_q, total_q] (written)
};

struct BackwardArgs : CommonArgs {
  Tensor q, k, v, out;  // as in ForwardArgs; out is the forward's output
  Tensor dout;          // like out
  Tensor lse;           // the forward's LSE (required)
  Tensor dq;            // like q  (written)
  Tensor dk;            // like k  (written; summed over the heads of a GQA group)
  Tensor dv;            // like v  (written)
  bool deterministic = false;
};

// Attention against a KV cache, with FlashAttention-2's flash_attn_with_kvcache semantics.
// Per sequence b, with L_b = cache_seqlens[b] + seqlen_new (seqlen_new = 0 without k_new):
//   1. with k_new/v_new, rows [cache_seqlens[b], L_b) of sequence b's cache are overwritten
//      with k_new[b]/v_new[b]; no other cache element changes;
//   2. q[b] attends to that sequence's cache rows [0, L_b) with the mask options of
//      CommonArgs, causal bottom-right aligned to L_b (query i sees keys j <= L_b − seqlen_q + i),
//      GQA as in forward(). A sequence with L_b = 0 gets out rows 0 and LSE −inf.
// A sequence's cache is k_cache[cache_batch_idx[b]] (contiguous), or with a block table the
// pages k_cache[block_table[b][j]], page j holding rows [j·page_size, (j + 1)·page_size).
// With cache_leftpad, sequence b's rows are cache rows [cache_leftpad[b], L_b): rows before
// them are not read, and causal and window masks count keys from the first of them (as
// FlashAttention-2's left-padded caches); new rows still go to cache_seqlens[b].
// Rotary (rotary_cos/rotary_sin, with k_new): before step 1, k_new[b] row t is rotated at
// position cache_seqlens[b] + t and q[b] row i at cache_seqlens[b] + i when causal or local
// (a window bound in [0, seqlen_cache), max_pages·page_size when paged), else every row of
// q[b] at cache_seqlens[b] (FlashAttention-2's rule; cache_leftpad does not move positions).
// Position p turns each pair (x_a, x_b) of the first rotary_dim channels into
// (x_a·cos − x_b·sin, x_a·sin + x_b·cos) with row p of the tables; pairs are (2i, 2i + 1)
// with rotary_interleaved, else (i, i + rotary_dim/2); the other channels are copied. fp32
// arithmetic (fp64 for fp64), rounded once to the dtype; the caller's q and k_new are not
// written. seqlen_ro must be at least the rows of a sequence's cache.
// Refused: dropout (dropout_p must be 0), varlen cu_seqlens, block_table together with
// cache_batch_idx or cache_leftpad, rotary without k_new.
// With k_new, k_cache and v_cache are outputs: they must not overlap q, k_new, v_new, out,
// lse, the tables or each other.
// CPU tensors: the call composes forward() per sequence. The int32 tables live on the host
// and are checked before anything is written: cache_seqlens[b] >= 0 and L_b within the
// sequence's cache (seqlen_cache, or max_pages·page_size), cache_batch_idx in
// [0, batch_cache), cache_leftpad[b] in [0, cache_seqlens[b]], the block_table entries
// of the pages rows [0, L_b) use in [0, num_pages), and every rotary position below
// seqlen_ro. The workspace holds a paged sequence's gathered K and V, the rotated q of a
// sequence, and the inner forward's own.
// CUDA tensors: one kernel (cute_fa2's split-KV) reads the caches in place, fp16/bf16, head
// dims 64/96/128/192/256 with head_dim_v = head_dim. The tables live on the device and are
// not read by the host: the kernel clamps each value before use, so a bad table gives wrong
// rows, never an access outside the tensors: cache_seqlens[b] to [0, seqlen_cache −
// seqlen_new] (max_pages·page_size for a paged cache), cache_batch_idx[b] to
// [0, batch_cache), block_table entries to [0, num_pages), cache_leftpad[b] to
// [0, cache_seqlens[b]], rotary positions to [0, seqlen_ro). cache_seqlens is required with
// k_new. The workspace holds the splits' partial O and LSE (fp32); the append and rotary
// need none (the attention kernel writes the new rows and rotates q in shared memory).
struct KvCacheArgs : CommonArgs {
  Tensor q;            // [batch, seqlen_q, heads_q, head_dim]
  Tensor k_cache;      // [batch_cache, seqlen_cache, heads_kv, head_dim]; paged: [num_pages, page_size, heads_kv, head_dim]
  Tensor v_cache;      // like k_cache with head_dim_v  (written when k_new is given)
  Tensor maybe_k_new;  // [batch, seqlen_new, heads_kv, head_dim]: appended at cache_seqlens[b]
  Tensor maybe_v_new;  // [batch, seqlen_new, heads_kv, head_dim_v]; both or neither
  Tensor maybe_cache_seqlens;    // int32 [batch]: tokens already in each sequence's cache (absent: all seqlen_cache)
  Tensor maybe_cache_batch_idx;  // int32 [batch]: the k_cache/v_cache row sequence b uses (absent: b)
  Tensor maybe_block_table;      // int32 [batch, max_pages]: paged cache; page j of sequence b is k_cache[block_table[b][j]]
  Tensor maybe_cache_leftpad;    // int32 [batch]: sequence b's rows start at cache row cache_leftpad[b] (absent: 0); contiguous caches only
  Tensor maybe_rotary_cos;       // [seqlen_ro, rotary_dim / 2], q's dtype: rotary (with k_new); rotary_dim even, <= head_dim
  Tensor maybe_rotary_sin;       // like rotary_cos; both or neither
  bool rotary_interleaved = true;   // pairs (2i, 2i + 1); false: (i, i + rotary_dim / 2)
  Tensor out;          // [batch, seqlen_q, heads_q, head_dim_v] (written)
  Tensor maybe_lse;    // fp32 [batch, heads_q, seqlen_q] (written)
  // CUDA: how many CTAs share each sequence's keys (split-KV, at most 128); 0 = chosen from
  // the SM count, batch, heads and cache length. The CPU path ignores it.
  int num_splits = 0;
};

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------
Status forward(const ForwardArgs& args) noexcept;
Status backward(const BackwardArgs& args) noexcept;
Status forward_kvcache(const KvCacheArgs& args) noexcept;

// Bytes of workspace the kernel that `args` selects needs (workspace fields are ignored).
Status workspace_size(const ForwardArgs& args, size_t* bytes) noexcept;
Status workspace_size(const BackwardArgs& args, size_t* bytes) noexcept;
Status workspace_size(const KvCacheArgs& args, size_t* bytes) noexcept;

// Which kernel "auto" (or the named kernel) would run, or why none can.
Status select_kernel(const ForwardArgs& args, std::string* name) noexcept;
Status select_kernel(const BackwardArgs& args, std::string* name) noexcept;

// ---------------------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------------------
struct KernelInfo {
  std::string_view name;      // what `kernel` takes
  std::string_view arch;      // "cpu", "sm80+", "sm90a", ...
  std::string_view summary;   // one line: what it is and what it supports
  bool has_forward = false;
  bool has_backward = false;
  bool has_kvcache = false;       // runs forward_kvcache on its device
  bool forward_dropout = false;   // its forward takes dropout_p > 0
  bool backward_dropout = false;  // its backward regenerates that mask
};

std::span<const KernelInfo> kernels() noexcept;

// True when this build has CUDA kernels and at least one CUDA device is visible.
bool cuda_available() noexcept;

}  // namespace flashlab
