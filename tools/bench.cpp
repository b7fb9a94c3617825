// The benchmark harness (see bench.h): buffers on the problem's device, random inputs,
// the fp64 check on a slice, and one row per kernel.
#include "bench.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <new>
#include <thread>

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/check.cuh"
#endif

#include "common/dtype.h"
#include "timer.h"

namespace flashlab::bench {
namespace {

constexpr size_t kHostAlign = 64;        // host buffers start on a cache line
constexpr double kBackwardFlopFactor = 2.5;
// The fp64 reference is checked on the full problem up to this much work (FLOPs by the
// formula above): the CPU default problem (69 GFLOP, tens of seconds) fits; larger
// problems are checked on a slice.
constexpr double kCheckBudgetFlops = 80e9;
constexpr int kMaxCheckedHeads = 2;      // query heads of a slice (forward)
constexpr int kSliceRefinements = 3;     // passes that shrink the checked rows to the budget
constexpr int kMaxInputSets = 32;        // input sets the CUDA timing rotates among
constexpr size_t kMaxRotationBytes = size_t(4) << 30;
constexpr int kFreeMemoryShare = 4;      // rotation uses at most 1/4 of free GPU memory
constexpr int64_t kFillChunk = int64_t(1) << 16;  // elements per independently seeded chunk
constexpr uint8_t kPoisonByte = 0xFF;    // all-ones is NaN in fp32, fp16 and bf16

#define BENCH_TRY(expr)           \
  do {                            \
    ::flashlab::Status s_ = (expr); \
    if (!s_.ok()) return s_;      \
  } while (0)

Status no_memory(const char* where, size_t bytes) {
  return {StatusCode::kUnsupported, std::string("cannot allocate ") + format_bytes(bytes) +
                                        " of " + where + " memory for the benchmark"};
}

// ---- buffers ----------------------------------------------------------------------------

// Owning memory on the host or the GPU.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  Status allocate(Device device, size_t bytes) {
    release();
    device_ = device;
    if (bytes == 0) return {};
    if (device == Device::kCPU) {
      data_ = ::operator new(bytes, std::align_val_t{kHostAlign}, std::nothrow);
      if (!data_) return no_memory("host", bytes);
    } else {
#if FLASHLAB_WITH_CUDA
      if (cudaMalloc(&data_, bytes) != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky; clear it
        data_ = nullptr;
        return no_memory("GPU", bytes);
      }
#else
      return no_memory("GPU", bytes);
#endif
    }
    bytes_ = bytes;
    return {};
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release() {
    if (data_ && device_ == Device::kCPU) ::operator delete(data_, std::align_val_t{kHostAlign});
#if FLASHLAB_WITH_CUDA
    if (data_ && device_ == Device::kCUDA) cudaFree(data_);
#endif
    data_ = nullptr;
    bytes_ = 0;
  }
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(device_, o.device_);
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::kCPU;
};

// Copies and fills go on the benchmark's stream, so they are ordered with the kernels.
Status upload(const Buffer& dst, const void* host, void* stream) {
  if (dst.device() == Device::kCPU) {
    std::memcpy(dst.data(), host, dst.bytes());
    return {};
  }
#if FLASHLAB_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  FL_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.bytes(), cudaMemcpyHostToDevice, s));
  FL_CUDA_CHECK(cudaStreamSynchronize(s));
#else
  (void)stream;
#endif
  return {};
}

Status download(const Buffer& src, void* host, void* stream) {
  if (src.device() == Device::kCPU) {
    std::memcpy(host, src.data(), src.bytes());
    return {};
  }
#if FLASHLAB_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  FL_CUDA_CHECK(cudaMemcpyAsync(host, src.data(), src.bytes(), cudaMemcpyDeviceToHost, s));
  FL_CUDA_CHECK(cudaStreamSynchronize(s));
#else
  (void)stream;
#endif
  return {};
}

Status poison(const Buffer& b, void* stream) {
  if (b.device() == Device::kCPU) {
    std::memset(b.data(), kPoisonByte, b.bytes());
    return {};
  }
#if FLASHLAB_WITH_CUDA
  FL_CUDA_CHECK(cudaMemsetAsync(b.data(), kPoisonByte, b.bytes(), static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
#endif
  return {};
}

Status synchronize(Device device, void* stream) {
#if FLASHLAB_WITH_CUDA
  if (device == Device::kCUDA) FL_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
#else
  (void)device;
  (void)stream;
#endif
  return {};
}

// ---- tensors of a problem ---------------------------------------------------------------

enum Slot : int { kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv, kSlots };

const char* slot_name(Slot s) {
  static constexpr const char* kNames[kSlots] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
  return kNames[s];
}

struct Shape4 {
  std::array<int64_t, 4> d{};
  int64_t numel() const { return d[0] * d[1] * d[2] * d[3]; }
};

// [batch, seqlen, heads, dim] for the activations; LSE is [batch, heads_q, seqlen_q] (x 1).
Shape4 shape_of(const Problem& p, Slot s) {
  switch (s) {
    case kQ: case kDq: return {{p.batch, p.seqlen_q, p.heads_q, p.head_dim}};
    case kK: case kDk: return {{p.batch, p.seqlen_k, p.heads_kv, p.head_dim}};
    case kV: case kDv: return {{p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v}};
    case kOut: case kDout: return {{p.batch, p.seqlen_q, p.heads_q, p.head_dim_v}};
    case kLse: return {{p.batch, p.heads_q, p.seqlen_q, 1}};
    case kSlots: break;
  }
  return {};
}

DType dtype_of(const Problem& p, Slot s) { return s == kLse ? DType::kF32 : p.dtype; }
size_t bytes_of(const Problem& p, Slot s) {
  return size_t(shape_of(p, s).numel()) * dtype_size(dtype_of(p, s));
}
bool used(const Problem& p, Slot s) { return p.backward || s <= kLse; }

// What the kernel under test writes, and what the harness fills with random values.
std::vector<Slot> outputs_of(const Problem& p) {
  return p.backward ? std::vector<Slot>{kDq, kDk, kDv} : std::vector<Slot>{kOut, kLse};
}
std::vector<Slot> random_inputs_of(const Problem& p) {
  return p.backward ? std::vector<Slot>{kQ, kK, kV, kDout} : std::vector<Slot>{kQ, kK, kV};
}

using TensorSet = std::array<Buffer, kSlots>;
using Pointers = std::array<void*, kSlots>;

Pointers pointers_of(const TensorSet& t) {
  Pointers ptr{};
  for (int s = 0; s < kSlots; ++s) ptr[s] = t[s].data();
  return ptr;
}

Tensor view(const Problem& p, Slot s, void* data) {
  const Shape4 sh = shape_of(p, s);
  if (s == kLse) return Tensor::contiguous(data, DType::kF32, {sh.d[0], sh.d[1], sh.d[2]}, p.device);
  return Tensor::contiguous(data, dtype_of(p, s), {sh.d[0], sh.d[1], sh.d[2], sh.d[3]}, p.device);
}

void set_common(const Problem& p, int threads, void* stream, CommonArgs* a) {
  a->causal = p.causal;
  a->window_left = p.window_left;
  a->window_right = p.window_right;
  a->softcap = p.softcap;
  a->num_threads = threads;
  a->stream = stream;
  a->quadratic_workspace_limit = p.quadratic_workspace_limit;
}

ForwardArgs forward_args(const Problem& p, const Pointers& ptr, int threads, void* stream) {
  ForwardArgs a;
  set_common(p, threads, stream, &a);
  a.q = view(p, kQ, ptr[kQ]);
  a.k = view(p, kK, ptr[kK]);
  a.v = view(p, kV, ptr[kV]);
  a.out = view(p, kOut, ptr[kOut]);
  a.maybe_lse = view(p, kLse, ptr[kLse]);
  return a;
}

BackwardArgs backward_args(const Problem& p, const Pointers& ptr, int threads, void* stream) {
  BackwardArgs a;
  set_common(p, threads, stream, &a);
  a.q = view(p, kQ, ptr[kQ]);
  a.k = view(p, kK, ptr[kK]);
  a.v = view(p, kV, ptr[kV]);
  a.out = view(p, kOut, ptr[kOut]);
  a.lse = view(p, kLse, ptr[kLse]);
  a.dout = view(p, kDout, ptr[kDout]);
  a.dq = view(p, kDq, ptr[kDq]);
  a.dk = view(p, kDk, ptr[kDk]);
  a.dv = view(p, kDv, ptr[kDv]);
  return a;
}

Status run_pass(const ForwardArgs& a) { return forward(a); }
Status run_pass(const BackwardArgs& a) { return backward(a); }

// ---- random inputs ----------------------------------------------------------------------

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sum of the four 16-bit uniforms in 64 random bits, shifted and scaled to mean 0 and
// variance 1: close to a normal, bounded (|x| < 3.47, so fp16 logits cannot overflow),
// and cheap.
float normalish(uint64_t bits) {
  constexpr int kTerms = 4, kBits = 16;
  constexpr uint64_t kMax = (uint64_t(1) << kBits) - 1;
  constexpr double kMean = kTerms * double(kMax) / 2;
  // Each term has variance ~ 2^32 / 12, so the sum has standard deviation 2^16 / sqrt(3).
  constexpr double kInvStd = 1.7320508075688772 / double(kMax + 1);
  int64_t sum = 0;
  for (int i = 0; i < kTerms; ++i) sum += int64_t((bits >> (kBits * i)) & kMax);
  return float((double(sum) - kMean) * kInvStd);
}

// n values of `dtype`, never zero after rounding. Chunks are seeded independently, so the
// values depend on the seed only, not on the number of threads.
void fill_normalish(void* dst, DType dtype, int64_t n, uint64_t seed) {
  const int64_t chunks = (n + kFillChunk - 1) / kFillChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t state = seed ^ (uint64_t(c) * 0xD1B54A32D192ED03ull);
    splitmix64(&state);
    const int64_t end = std::min(n, (c + 1) * kFillChunk);
    for (int64_t i = c * kFillChunk; i < end; ++i) {
      float x = 0.f;
      while (x == 0.f) x = round_to(dtype, normalish(splitmix64(&state)));
      store_from_double(dst, dtype, i, x);
    }
  }
}

uint64_t seed_for(uint64_t seed, int set, Slot slot) {
  uint64_t state = seed + uint64_t(set) * kSlots + uint64_t(slot);
  return splitmix64(&state);
}

// ---- the checked slice ------------------------------------------------------------------

// The part of the problem compared with the fp64 reference: batch entries [0, batches),
// query heads [0, heads_q) with their kv heads [0, heads_kv), query rows [row0, Sq).
// The last rows are taken because with bottom-right alignment a problem of the last
// `rows` queries and all keys masks exactly as the full one does.
struct Slice {
  int batches = 0, heads_q = 0, heads_kv = 0, row0 = 0, rows = 0;
  bool full = true;
};

Problem slice_problem(const Problem& p, const Slice& s) {
  Problem sub = p;
  sub.batch = s.batches;
  sub.heads_q = s.heads_q;
  sub.heads_kv = s.heads_kv;
  sub.seqlen_q = s.rows;
  sub.dtype = DType::kF64;
  sub.device = Device::kCPU;
  return sub;
}

double check_flops(const Problem& p, const Slice& s) { return pass_flops(slice_problem(p, s)); }

Slice choose_slice(const Problem& p) {
  Slice s{p.batch, p.heads_q, p.heads_kv, 0, p.seqlen_q, true};
  if (check_flops(p, s) <= kCheckBudgetFlops) return s;
  const int group = p.heads_q / p.heads_kv;
  s.full = false;
  s.batches = 1;
  if (p.backward) {
    // dk and dv sum over every query head of a kv head: take whole groups.
    s.heads_kv = group == 1 ? std::min(kMaxCheckedHeads, p.heads_kv) : 1;
    s.heads_q = s.heads_kv * group;
    return s;  // and every query row, for the same reason
  }
  s.heads_q = std::min(kMaxCheckedHeads, p.heads_q);
  s.heads_kv = (s.heads_q + group - 1) / group;
  for (int i = 0; i < kSliceRefinements; ++i) {
    const double f = check_flops(p, s);
    if (f <= kCheckBudgetFlops) break;
    s.rows = std::max(1, int(s.rows * (kCheckBudgetFlops / f)));
    s.row0 = p.seqlen_q - s.rows;
  }
  return s;
}

std::string range_string(int begin, int count) {
  return count == 1 ? std::to_string(begin)
                    : std::to_string(begin) + "-" + std::to_string(begin + count - 1);
}

std::string slice_string(const Problem& p, const Slice& s) {
  if (s.full) return "the full problem";
  std::string t = p.batch > 1 ? "batch 0 of " + std::to_string(p.batch) + ", " : "";
  t += "query heads " + range_string(0, s.heads_q) + " of " + std::to_string(p.heads_q) +
       " (kv heads " + range_string(0, s.heads_kv) + ")";
  if (s.rows < p.seqlen_q)
    t += ", query rows " + range_string(s.row0, s.rows) + " of " + std::to_string(p.seqlen_q);
  return t;
}

// A box of a tensor: begin and count per axis.
struct Box {
  std::array<int64_t, 4> begin{}, count{};
};

Box box_of(const Problem& p, const Slice& s, Slot slot) {
  Box b;
  b.count = shape_of(p, slot).d;
  b.count[0] = s.batches;
  switch (slot) {
    case kQ: case kOut: case kDout: case kDq:
      b.begin[1] = s.row0;
      b.count[1] = s.rows;
      b.count[2] = s.heads_q;
      break;
    case kK: case kV: case kDk: case kDv:
      b.count[2] = s.heads_kv;
      break;
    case kLse:
      b.count[1] = s.heads_q;
      b.begin[2] = s.row0;
      b.count[2] = s.rows;
      break;
    case kSlots: break;
  }
  return b;
}

// Calls f(index in the full tensor, index in the compact box) for every element of `box`.
template <class F>
void for_each_in_box(const Shape4& sh, const Box& box, F&& f) {
  int64_t c = 0;
  for (int64_t a0 = 0; a0 < box.count[0]; ++a0)
    for (int64_t a1 = 0; a1 < box.count[1]; ++a1)
      for (int64_t a2 = 0; a2 < box.count[2]; ++a2) {
        const int64_t row = ((box.begin[0] + a0) * sh.d[1] + box.begin[1] + a1) * sh.d[2] +
                            box.begin[2] + a2;
        const int64_t base = row * sh.d[3] + box.begin[3];
        for (int64_t a3 = 0; a3 < box.count[3]; ++a3) f(base + a3, c++);
      }
}

std::vector<double> gather_f64(const void* src, DType dtype, const Shape4& sh, const Box& box) {
  std::vector<double> out(size_t(box.count[0] * box.count[1] * box.count[2] * box.count[3]));
  for_each_in_box(sh, box, [&](int64_t i, int64_t c) { out[c] = load_as_double(src, dtype, i); });
  return out;
}

// Max |got - want| over the box. Equal infinities agree (a row that sees no key has LSE
// -inf in both); a NaN (an element never written) is an infinite error.
double max_abs_err(const void* got, DType dtype, const Shape4& sh, const Box& box,
                   const std::vector<double>& want) {
  double err = 0;
  for_each_in_box(sh, box, [&](int64_t i, int64_t c) {
    const double g = load_as_double(got, dtype, i), w = want[c];
    double d = g == w ? 0.0 : std::fabs(g - w);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    err = std::max(err, d);
  });
  return err;
}

// Elements still NaN from the poison, or non-finite where only LSE's -inf is legal.
int64_t count_unwritten(const void* data, DType dtype, int64_t n, bool lse) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = load_as_double(data, dtype, i);
    if (std::isnan(x) || (std::isinf(x) && !(lse && x < 0))) ++bad;
  }
  return bad;
}

double* error_field(Row* r, Slot s) {
  switch (s) {
    case kOut: return &r->err_out;
    case kLse: return &r->err_lse;
    case kDq: return &r->err_dq;
    case kDk: return &r->err_dk;
    case kDv: return &r->err_dv;
    default: return nullptr;
  }
}

std::string format_err(double e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", e);
  return buf;
}

// "kernel 'x' does not support this call: why" reads "does not support ..." in x's row.
std::string without_kernel_prefix(const std::string& msg, const std::string& name) {
  const std::string prefix = "kernel '" + name + "' ";
  return msg.rfind(prefix, 0) == 0 ? msg.substr(prefix.size()) : msg;
}

// ---- the harness ------------------------------------------------------------------------

class Bench {
 public:
  Bench(const Problem& p, const Options& opt) : p_(p), opt_(opt), progress_(opt.progress) {}
  ~Bench();
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  Status setup();
  Status run_kernel(const std::string& name, Row* row);
  void describe(Report* report) const;

 private:
  Status open_device();
  Status plan_sets();
  Status allocate_sets();
  Status fill_inputs();
  Status make_forward_outputs();
  Status compute_oracle();
  Status check_outputs(Row* row);
  Status checked_run(const std::string& name, const Buffer& ws, Row* row, double* first_ms);
  Status time_kernel(const std::string& name, const Buffer& ws, double first_ms, Row* row);
  const void* host_input(Slot s) const;

  // One call of kernel `name` on an input set: what the timer times.
  RunOnce runner(const std::string& name, const Buffer& ws) const {
    return [this, &name, &ws](int set) {
      return with_args(name, set, &ws, [](auto& a) { return run_pass(a); });
    };
  }

  // Builds the forward or backward arguments of input set `set` and calls f with them.
  template <class F>
  Status with_args(std::string_view kernel, int set, const Buffer* ws, F&& f) const {
    const Pointers ptr = pointers_of(sets_[set]);
    auto finish = [&](auto& a) {
      a.kernel = kernel;
      if (ws) {
        a.workspace = ws->data();
        a.workspace_bytes = ws->bytes();
      }
      return f(a);
    };
    if (p_.backward) {
      BackwardArgs a = backward_args(p_, ptr, opt_.threads, stream_);
      return finish(a);
    }
    ForwardArgs a = forward_args(p_, ptr, opt_.threads, stream_);
    return finish(a);
  }

  Problem p_;
  Options opt_;
  ProgressLine progress_;
  void* stream_ = nullptr;  // cudaStream_t of every copy, fill and kernel (CUDA)
  int set_count_ = 1;
  size_t set_bytes_ = 0;
  size_t l2_bytes_ = 0;
  std::vector<TensorSet> sets_;
  TensorSet mirror_;          // host copies of set 0's inputs, for the check (CUDA)
  std::string fwd_kernel_;    // backward: the kernel that wrote out and LSE
  std::string fwd_refusal_;   // backward: why no forward kernel could
  Slice slice_;
  bool oracle_ready_ = false;
  std::array<std::vector<double>, kSlots> want_;  // fp64 reference outputs of the slice
  // max(1, max |reference|) of each gradient: its tolerance scales with it, since a
  // gradient's rounding error does (dk, dv sum over a GQA group; causal first keys).
  std::array<double, kSlots> grad_scale_{};
};

Bench::~Bench() {
#if FLASHLAB_WITH_CUDA
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

Status Bench::open_device() {
  if (p_.device == Device::kCPU) return {};
#if FLASHLAB_WITH_CUDA
  FL_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s = nullptr;
  FL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  return {};
#else
  return {StatusCode::kUnsupported, "this build of flashlab has no CUDA kernels"};
#endif
}

// CUDA: enough input sets that one rotation exceeds 2x the L2 cache, within a memory cap.
Status Bench::plan_sets() {
  set_bytes_ = 0;
  for (int s = 0; s < kSlots; ++s)
    if (used(p_, Slot(s))) set_bytes_ += bytes_of(p_, Slot(s));
  set_count_ = 1;
  if (p_.device == Device::kCPU) return {};
#if FLASHLAB_WITH_CUDA
  BENCH_TRY(l2_cache_bytes(0, &l2_bytes_));
  size_t free_bytes = 0, total_bytes = 0;
  FL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t cap = std::min(kMaxRotationBytes, free_bytes / kFreeMemoryShare);
  const size_t per_set = std::max<size_t>(set_bytes_, 1);
  int n = int(std::min<size_t>(2 * l2_bytes_ / per_set + 1, kMaxInputSets));
  while (n > 1 && size_t(n) * per_set > cap) --n;
  set_count_ = std::max(n, 1);
#endif
  return {};
}

Status Bench::allocate_sets() {
  sets_.resize(size_t(set_count_));
  for (TensorSet& t : sets_)
    for (int s = 0; s < kSlots; ++s)
      if (used(p_, Slot(s))) BENCH_TRY(t[s].allocate(p_.device, bytes_of(p_, Slot(s))));
  return {};
}

// Every set gets its own fresh values; on CUDA they are made on the host and uploaded,
// and set 0's host copy stays for the check.
Status Bench::fill_inputs() {
  Buffer scratch;
  for (int set = 0; set < set_count_; ++set) {
    for (Slot s : random_inputs_of(p_)) {
      const Buffer& dst = sets_[set][s];
      const int64_t n = shape_of(p_, s).numel();
      const uint64_t seed = seed_for(opt_.seed, set, s);
      if (p_.device == Device::kCPU) {
        fill_normalish(dst.data(), p_.dtype, n, seed);
        continue;
      }
      Buffer* host = set == 0 ? &mirror_[s] : &scratch;
      if (host->bytes() != dst.bytes()) BENCH_TRY(host->allocate(Device::kCPU, dst.bytes()));
      fill_normalish(host->data(), p_.dtype, n, seed);
      BENCH_TRY(upload(dst, host->data(), stream_));
    }
  }
  return {};
}

// The backward needs the forward's out and LSE: the best forward kernel of the device
// ("auto"), else the highest rung of the registry that runs the problem.
Status Bench::make_forward_outputs() {
  std::vector<std::string> candidates = {std::string(kAutoKernel)};
  const auto infos = kernels();
  for (auto it = infos.rbegin(); it != infos.rend(); ++it)
    if (it->has_forward) candidates.emplace_back(it->name);
  const Problem fwd = [&] { Problem f = p_; f.backward = false; return f; }();
  std::string first_refusal;
  for (const std::string& name : candidates) {
    ForwardArgs a = forward_args(fwd, pointers_of(sets_[0]), opt_.threads, stream_);
    a.kernel = name;
    std::string chosen;
    const Status s = select_kernel(a, &chosen);
    if (s.ok()) {
      fwd_kernel_ = chosen;
      break;
    }
    if (first_refusal.empty()) first_refusal = s.message();
  }
  if (fwd_kernel_.empty()) {
    fwd_refusal_ = "no forward kernel to make out and LSE: " + first_refusal;
    return {};
  }
  for (TensorSet& t : sets_) {
    ForwardArgs a = forward_args(fwd, pointers_of(t), opt_.threads, stream_);
    a.kernel = fwd_kernel_;
    size_t bytes = 0;
    BENCH_TRY(workspace_size(a, &bytes));
    Buffer ws;
    BENCH_TRY(ws.allocate(p_.device, bytes));
    a.workspace = ws.data();
    a.workspace_bytes = ws.bytes();
    BENCH_TRY(forward(a));
    BENCH_TRY(synchronize(p_.device, stream_));
  }
  if (p_.device == Device::kCPU) return {};
  for (Slot s : {kOut, kLse}) {
    BENCH_TRY(mirror_[s].allocate(Device::kCPU, sets_[0][s].bytes()));
    BENCH_TRY(download(sets_[0][s], mirror_[s].data(), stream_));
  }
  return {};
}

Status Bench::setup() {
  BENCH_TRY(open_device());
  BENCH_TRY(plan_sets());
  BENCH_TRY(allocate_sets());
  BENCH_TRY(fill_inputs());
  if (p_.backward) BENCH_TRY(make_forward_outputs());
  slice_ = choose_slice(p_);
  return {};
}

const void* Bench::host_input(Slot s) const {
  return p_.device == Device::kCPU ? sets_[0][s].data() : mirror_[s].data();
}

// cpu_reference in fp64 on the slice of set 0's inputs (converted exactly to fp64).
Status Bench::compute_oracle() {
  const Problem sub = slice_problem(p_, slice_);
  std::array<std::vector<double>, kSlots> f64;
  std::vector<float> lse(size_t(shape_of(sub, kLse).numel()));
  std::vector<Slot> inputs = random_inputs_of(p_);
  if (p_.backward) inputs.push_back(kOut);
  for (Slot s : inputs)
    f64[s] = gather_f64(host_input(s), p_.dtype, shape_of(p_, s), box_of(p_, slice_, s));
  if (p_.backward) {
    const std::vector<double> l = gather_f64(host_input(kLse), DType::kF32, shape_of(p_, kLse),
                                             box_of(p_, slice_, kLse));
    std::copy(l.begin(), l.end(), lse.begin());
  }
  for (Slot s : outputs_of(p_))
    if (s != kLse) f64[s].assign(size_t(shape_of(sub, s).numel()), 0.0);
  Pointers ptr{};
  for (int s = 0; s < kSlots; ++s) ptr[s] = f64[s].data();
  ptr[kLse] = lse.data();

  auto run = [&](auto& a) -> Status {
    a.kernel = "cpu_reference";
    a.quadratic_workspace_limit = SIZE_MAX;  // the harness chose the slice to fit
    size_t bytes = 0;
    BENCH_TRY(workspace_size(a, &bytes));
    Buffer ws;
    BENCH_TRY(ws.allocate(Device::kCPU, bytes));
    a.workspace = ws.data();
    a.workspace_bytes = ws.bytes();
    ProgressLine* line = &progress_;
    line->begin("check: cpu_reference in fp64 on " + slice_string(p_, slice_));
    const Status s = run_pass(a);
    line->end();
    return s;
  };
  if (p_.backward) {
    BackwardArgs a = backward_args(sub, ptr, opt_.threads, nullptr);
    BENCH_TRY(run(a));
  } else {
    ForwardArgs a = forward_args(sub, ptr, opt_.threads, nullptr);
    BENCH_TRY(run(a));
    want_[kLse].assign(lse.begin(), lse.end());
  }
  for (Slot s : outputs_of(p_)) {
    if (s != kLse) want_[s] = std::move(f64[s]);
    if (!p_.backward) continue;
    grad_scale_[s] = 1.0;
    for (double x : want_[s]) grad_scale_[s] = std::max(grad_scale_[s], std::fabs(x));
  }
  oracle_ready_ = true;
  return {};
}

// Every output element written, and (with the check) the error of each output.
Status Bench::check_outputs(Row* row) {
  const Tolerance tol = tolerance_for(p_.dtype);
  for (Slot s : outputs_of(p_)) {
    const Buffer& b = sets_[0][s];
    Buffer host;
    const void* data = b.data();
    if (p_.device != Device::kCPU) {
      BENCH_TRY(host.allocate(Device::kCPU, b.bytes()));
      BENCH_TRY(download(b, host.data(), stream_));
      data = host.data();
    }
    const int64_t n = shape_of(p_, s).numel();
    const int64_t bad = count_unwritten(data, dtype_of(p_, s), n, s == kLse);
    if (bad > 0) {
      row->status = RowStatus::kFail;
      row->reason += std::string(row->reason.empty() ? "" : "; ") + slot_name(s) + ": " +
                     std::to_string(bad) + " of " + std::to_string(n) + " elements not written";
    }
    if (!opt_.check) continue;
    const double err = max_abs_err(data, dtype_of(p_, s), shape_of(p_, s), box_of(p_, slice_, s), want_[s]);
    *error_field(row, s) = err;
    const double limit = p_.backward ? tol.grad * grad_scale_[s] : tol.out;
    if (!(err <= limit)) {
      row->status = RowStatus::kFail;
      row->reason += std::string(row->reason.empty() ? "" : "; ") + slot_name(s) + " error " +
                     format_err(err) + " > " + format_err(limit);
    }
  }
  if (row->status == RowStatus::kOk && !opt_.check) row->status = RowStatus::kUnchecked;
  return {};
}

Status Bench::checked_run(const std::string& name, const Buffer& ws, Row* row, double* first_ms) {
  for (Slot s : outputs_of(p_)) BENCH_TRY(poison(sets_[0][s], stream_));
  Timer timer(p_.device, stream_, &progress_);
  const RunOnce run = runner(name, ws);
  const std::string label = name + (opt_.check ? ": checked run" : ": first run");
  BENCH_TRY(timer.once(run, 0, label, first_ms));
  BENCH_TRY(synchronize(p_.device, stream_));
  return check_outputs(row);
}

Status Bench::time_kernel(const std::string& name, const Buffer& ws, double first_ms, Row* row) {
  Timer timer(p_.device, stream_, &progress_);
  const RunOnce run = runner(name, ws);
  Timing t;
  BENCH_TRY(timer.measure(run, opt_.warmup, opt_.iters, set_count_, first_ms, name, &t));
  row->time_ms = t.median_ms;
  row->warmup_runs = t.warmup_runs;
  row->timed_runs = t.timed_runs;
  row->tflops = row->flops / (t.median_ms * 1e-3) / 1e12;
  return {};
}

Status Bench::run_kernel(const std::string& name, Row* row) {
  *row = Row{};
  row->kernel = name;
  row->problem = p_;
  row->flops = pass_flops(p_);
  auto refuse = [&](RowStatus status, const std::string& why) {
    row->status = status;
    row->reason = without_kernel_prefix(why, name);
    return Status{};
  };
  if (!fwd_refusal_.empty()) return refuse(RowStatus::kUnsupported, fwd_refusal_);
  std::string chosen;
  size_t bytes = 0;
  Status s = with_args(name, 0, nullptr, [&](auto& a) { return select_kernel(a, &chosen); });
  if (s.ok()) s = with_args(name, 0, nullptr, [&](auto& a) { return workspace_size(a, &bytes); });
  if (!s.ok())
    return refuse(s.code() == StatusCode::kUnsupported || s.code() == StatusCode::kNotFound
                      ? RowStatus::kUnsupported : RowStatus::kError,
                  s.message());
  row->workspace_bytes = bytes;
  // The reference is computed once, for the first kernel that runs; if it cannot be,
  // no kernel can be judged and the benchmark stops.
  if (opt_.check && !oracle_ready_) BENCH_TRY(compute_oracle());
  Buffer ws;
  if (Status a = ws.allocate(p_.device, bytes); !a.ok()) return refuse(RowStatus::kError, a.message());
  double first_ms = 0;
  if (Status c = checked_run(name, ws, row, &first_ms); !c.ok()) return refuse(RowStatus::kError, c.message());
  if (Status t = time_kernel(name, ws, first_ms, row); !t.ok()) return refuse(RowStatus::kError, t.message());
  return {};
}

void Bench::describe(Report* r) const {
  const int threads = opt_.threads > 0 ? opt_.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  r->device = device_description(p_.device, threads);
  const Tolerance tol = tolerance_for(p_.dtype);
  if (opt_.check) {
    r->checked = "max abs error vs cpu_reference in fp64 on the same inputs, on " +
                 slice_string(p_, slice_) + "; every output element checked written; tolerance (" +
                 to_string(p_.dtype) + ") " +
                 (p_.backward ? "dq/dk/dv " + format_err(tol.grad) + " x max(1, max |reference|)"
                              : "out/lse " + format_err(tol.out));
  } else {
    r->checked = "not compared (--no-check); every output element checked written";
  }
  const std::string plan = std::to_string(opt_.warmup) + " warm-up + median of " + std::to_string(opt_.iters) +
                           (opt_.iters == 1 ? " run" : " runs") + " after the " + (opt_.check ? "checked" : "first") +
                           " run; fewer for slow kernels (see runs: as many as fit in 10 s, at "
                           "least 5; runs > 2 s: at least 1; > 10 s: that run alone)";
  if (p_.device == Device::kCPU) {
    r->timing = "std::chrono::steady_clock; " + plan;
  } else {
    r->timing = "a cudaEvent pair per call on one stream; " + plan + "; rotating " +
                std::to_string(set_count_) + " input set" + (set_count_ > 1 ? "s" : "") + " of " +
                format_bytes(set_bytes_) + " (" +
                (set_count_ * set_bytes_ > 2 * l2_bytes_ ? "> 2x" : "capped; ") + " the " +
                format_bytes(l2_bytes_) + " L2)";
  }
  r->inputs = "unit-normal-ish random values, seed " + std::to_string(opt_.seed) +
              " (--seed to repeat)";
  if (!fwd_kernel_.empty()) r->inputs += "; out and LSE for the backward from " + fwd_kernel_;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

}  // namespace

// ---- public helpers ---------------------------------------------------------------------

MaskPolicy mask_of(const Problem& p) {
  MaskPolicy m;
  m.window_left = p.window_left >= p.seqlen_k ? -1 : p.window_left;
  m.window_right = p.window_right >= p.seqlen_k ? -1 : p.window_right;
  if (p.causal) m.window_right = 0;
  m.softcap = p.softcap;
  return m;
}

double forward_flops(const Problem& p) {
  const MaskPolicy m = mask_of(p);
  double pairs = 0;
  for (int i = 0; i < p.seqlen_q; ++i)
    pairs += std::max(0, m.key_end(i, p.seqlen_q, p.seqlen_k) - m.key_begin(i, p.seqlen_q, p.seqlen_k));
  return double(p.batch) * p.heads_q * pairs * 2.0 * (p.head_dim + p.head_dim_v);
}

double pass_flops(const Problem& p) {
  return forward_flops(p) * (p.backward ? kBackwardFlopFactor : 1.0);
}

std::string shape_string(const Problem& p) {
  auto pair = [](int a, int b) {
    return a == b ? std::to_string(a) : std::to_string(a) + "/" + std::to_string(b);
  };
  return std::to_string(p.batch) + "x" + pair(p.heads_q, p.heads_kv) + "x" +
         pair(p.seqlen_q, p.seqlen_k) + "x" + pair(p.head_dim, p.head_dim_v) + " " +
         to_string(p.dtype);
}

std::string mask_string(const Problem& p) {
  const MaskPolicy m = mask_of(p);
  std::string s = "none";
  if (m.window_left < 0 && m.window_right == 0)
    s = "causal";
  else if (m.is_local())
    s = "window(" + std::to_string(m.window_left) + "," + std::to_string(m.window_right) + ")";
  if (m.softcap > 0.f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "+softcap(%g)", double(m.softcap));
    s += buf;
  }
  return s;
}

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF16: return {5e-3, 1e-2};
    case DType::kBF16: return {2e-2, 4e-2};
    default: return {1e-4, 2e-4};
  }
}

const char* to_string(RowStatus s) {
  switch (s) {
    case RowStatus::kOk: return "ok";
    case RowStatus::kUnchecked: return "unchecked";
    case RowStatus::kFail: return "FAIL";
    case RowStatus::kUnsupported: return "unsupported";
    case RowStatus::kError: return "error";
  }
  return "?";
}

std::string format_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = double(bytes);
  int u = 0;
  while (x >= 1024 && u + 1 < int(std::size(kUnits))) {
    x /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else
    std::snprintf(buf, sizeof buf, x < 10 ? "%.2f %s" : x < 100 ? "%.1f %s" : "%.0f %s", x, kUnits[u]);
  return buf;
}

std::string device_description(Device device, int threads) {
  if (device == Device::kCPU) {
    const std::string model = cpu_model();
    return "CPU: " + (model.empty() ? std::string() : model + ", ") + std::to_string(threads) +
           " thread" + (threads == 1 ? "" : "s");
  }
#if FLASHLAB_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return "CUDA device 0";
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         format_bytes(size_t(prop.l2CacheSize)) + " L2, " + format_bytes(prop.totalGlobalMem) + ")";
#else
  return "CUDA device";
#endif
}

void add_ratios(std::vector<Row>& rows, size_t begin, size_t end) {
  double base = kNaN, prev = kNaN;
  for (size_t i = begin; i < end && i < rows.size(); ++i) {
    Row& r = rows[i];
    if (!r.timed()) continue;
    // A kernel that computes the wrong thing gets ratios but is nobody's reference.
    const bool reference = r.status != RowStatus::kFail;
    if (std::isnan(base) && reference) base = r.time_ms;
    r.vs_base = base / r.time_ms;
    r.vs_prev = prev / r.time_ms;
    if (reference) prev = r.time_ms;
  }
}

Status run_bench(const Problem& p, const Options& opt, Report* report) {
  Bench bench(p, opt);
  BENCH_TRY(bench.setup());
  const size_t first = report->rows.size();
  for (const std::string& name : opt.kernels) {
    Row row;
    BENCH_TRY(bench.run_kernel(name, &row));
    report->rows.push_back(std::move(row));
  }
  add_ratios(report->rows, first, report->rows.size());
  bench.describe(report);
  return {};
}

}  // namespace flashlab::bench
