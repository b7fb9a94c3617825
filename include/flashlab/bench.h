// FlashLab's benchmark harness: the one place that plans problems, counts FLOPs and
// bytes, checks a result against the fp64 reference and times calls. `flashlab bench` (the
// CLI, tools/) and `python -m flashlab.bench` (python/flashlab/bench.py, through the
// bindings) are both thin layers over it; no kernel has a timer of its own.
//
// An implementation is measured in a fixed order, so that no number is printed for one
// that computes the wrong thing:
//   1. supports?  a registry kernel is asked through select_kernel(); its refusal is the
//                 row's reason. A peer (any callable) that refuses says so itself.
//   2. check      outputs are poisoned (NaN), one call runs on input set 0 and is timed,
//                 every output element must be written, and each output is compared with
//                 cpu_reference run in fp64 on the same inputs (on a slice when large).
//   3. time       warm-up (a number of calls and a minimum duration), then timed calls
//                 rotating among input sets that together exceed 2x the L2 cache; the
//                 median. With rounds > 1 the entries of a problem take turns, and each
//                 entry's time is the median of its per-round medians.
// CPU calls are timed with std::chrono::steady_clock, CUDA calls with a cudaEvent pair
// on the harness's stream. A train problem (Problem::train) times a training step: every
// call runs the forward and then the backward from q, k, v and dout, and is checked on
// out, LSE and the gradients. A decode problem (Problem::decode) is a forward_kvcache call
// against a full KV cache, checked against a dense forward on the same keys and values
// and judged by the bytes of K and V it reads. A varlen problem (Problem::lengths) is one
// packed batch of documents with cu_seqlens, checked against cpu_reference on the same
// packing. docs/BENCHMARK.md describes the method and its limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/flashlab.h"

namespace flashlab::bench {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------
// FLOPs and bytes (docs/DESIGN.md, "FLOP counting")
// ---------------------------------------------------------------------------------------
inline constexpr double kBackwardFlopFactor = 2.5;  // five products against the forward's two
inline constexpr double kTrainFlopFactor = 1 + kBackwardFlopFactor;  // the forward, then the backward

// Forward FLOPs of a call: 2·(head_dim + head_dim_v) for every (query, key) pair the mask
// lets through, summed exactly row by row with the mask's key range (causal, windows,
// Sq != Sk). Padded and varlen layouts; varlen needs cu_seqlens on the host. Only shapes,
// dtypes and mask fields are read: data pointers may be null.
Status attention_flops(const ForwardArgs& args, double* forward_flops) noexcept;

// Bytes a forward call moves at least: q, k and v read once, out (and LSE, when present)
// written once.
struct Bytes {
  double q = 0, k = 0, v = 0, out = 0, lse = 0;
  double kv() const { return k + v; }
  double total() const { return q + k + v + out + lse; }
};
Status attention_bytes(const ForwardArgs& args, Bytes* bytes) noexcept;

// ---------------------------------------------------------------------------------------
// Problems
// ---------------------------------------------------------------------------------------
struct Problem {
  int batch = 1;
  int heads_q = 8, heads_kv = 8;
  int seqlen_q = 4096, seqlen_k = 4096;
  int head_dim = 128, head_dim_v = 128;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  bool causal = false;
  int window_left = -1;  // -1: unbounded
  int window_right = -1;
  float softcap = 0.f;   // 0: off
  bool backward = false; // the backward pass instead of the forward
  // A training step instead: every call runs the forward (out, LSE) and then the backward
  // (dq, dk, dv) on its out and LSE, from q, k, v and dout alone; `backward` is then
  // ignored. Checked on all five outputs; its FLOPs are kTrainFlopFactor x the forward's.
  bool train = false;
  // Decode: forward_kvcache instead of forward(). Every sequence attends to seqlen_k cache
  // rows (the cache length L): L - seqlen_new rows already in the cache (cache_seqlens)
  // and seqlen_new rows that each call appends (k_new/v_new; 0 = none). page_size > 0
  // pages the cache: batch·ceil(L / page_size) pages, each sequence's block table a
  // shuffled draw from the pool; 0 = one contiguous [batch, L, heads_kv, dim] cache.
  bool decode = false;
  int page_size = 0;
  int seqlen_new = 0;
  // Appending: rotary tables too, rotary_cos/rotary_sin of 1 and 0, [rows, head_dim / 2]
  // with a row per cache row of a sequence (seqlen_k; paged, its pages' rows).
  // The identity turn leaves every value as it was, so the call checks as without, while
  // the kernel does all of rotary's work, as at any angle.
  bool rotary = false;
  int num_splits = 0;  // the KV-cache call's num_splits: 0 = the kernel picks
  // Varlen: a packed batch of sequences of these lengths, queries and keys alike: q, k, v,
  // out and their gradients are [total, heads, dim], LSE [heads_q, total], with
  // cu_seqlens_q = cu_seqlens_k (int32, on the problem's device) and max_seqlen the
  // longest. batch is their count and seqlen_q = seqlen_k the longest (set_lengths keeps
  // them so). Empty: the padded layout.
  std::vector<int> lengths;
  // Kernels with O(seqlen²) workspace (cpu_reference, naive) refuse above this.
  size_t quadratic_workspace_limit = size_t(4) << 30;
};

// The forward arguments of `p` without data: what attention_flops and attention_bytes read.
// Varlen: cu_seqlens are present host views without data (pass_flops points them at
// cu_seqlens_of(p)).
ForwardArgs shape_args(const Problem& p);
// Makes `p` a varlen problem of these lengths (batch, seqlen_q and seqlen_k follow them);
// empty makes it padded again, with batch and seqlens left as they are.
void set_lengths(Problem& p, std::vector<int> lengths);
// {0, l0, l0 + l1, ...}: the cu_seqlens of a varlen problem; empty when padded.
std::vector<int32_t> cu_seqlens_of(const Problem& p);
// The documents of a packed varlen batch: lengths drawn uniformly from [lo, hi] with a
// generator seeded by `seed` until they fill `tokens`, the last cut to fill it exactly (so
// it is in [1, hi]). The same (tokens, lo, hi, seed) gives the same lengths on every
// machine. 1 <= lo <= hi and tokens >= 1, else kInvalidArgument.
Status document_lengths(int tokens, int lo, int hi, uint64_t seed, std::vector<int>* lengths);
double pass_flops(const Problem& p);  // the timed call: forward, backward (2.5x) or train (3.5x)
// Whether a call of `p` computes gradients (a backward or a training step): its inputs
// hold dout and its outputs dq, dk and dv.
inline bool computes_gradients(const Problem& p) { return p.backward || p.train; }
// K and V, read once: 2·batch·seqlen_k·heads_kv·head_dim·elem bytes (with Dv for V); what
// a decode call is judged by.
double kv_bytes(const Problem& p);

// "1x8x4096x128 fp32"; GQA, Sq != Sk and Dv != D add "/other": "2x8/2x512/1024x64 bf16";
// a decode problem adds " kvcache", " paged(P)" and " append(N)": "1x32/8x1/4096x128 bf16
// kvcache paged(256)"; a varlen one reads "varlen(9 docs, 16384 tokens, max 3977)x16x128 bf16".
std::string shape_string(const Problem& p);
// "none", "causal", "window(64,0)", each with "+softcap(30)" when on.
std::string mask_string(const Problem& p);

// The peer sweep: head dims x seqlens x masks at a fixed token count and hidden size
// (heads = hidden / head_dim, batch = tokens / seqlen), each problem as a forward, a
// backward and/or a training step; and decode problems (KV-cache calls), one query token
// against growing cache lengths (GQA).
struct Sweep {
  std::vector<int> head_dims = {64, 128, 256};
  std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<bool> causal = {false, true};
  bool forward = true, backward = true, train = false;
  int tokens = 16384, hidden = 2048;
  DType dtype = DType::kBF16;
  Device device = Device::kCUDA;
  std::vector<int> decode_seqlens = {4096, 16384, 65536};
  int decode_batch = 1, decode_heads_q = 32, decode_heads_kv = 8, decode_head_dim = 128;
  int decode_seqlen_q = 1, decode_page_size = 0, decode_seqlen_new = 0;
};
std::vector<Problem> sweep_problems(const Sweep& s);   // seqlens that do not divide tokens skipped
std::vector<Problem> decode_problems(const Sweep& s);  // decode = true, one per cache length
// The sweep's problems as one varlen problem per (head dim, causal, pass): documents
// of `lengths` (document_lengths at s.tokens) at the sweep's hidden size.
std::vector<Problem> varlen_problems(const Sweep& s, const std::vector<int>& lengths);

// ---------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------
struct TimingOptions {
  int warmup = 5;           // untimed calls before the timed ones, at least
  double warmup_ms = 0;     // and the warm-up lasts at least this long (GPU clocks)
  int iters = 30;           // timed calls, at most
  double budget_ms = 10'000;  // per entry: a slow call means fewer calls
  int rounds = 1;           // > 1: the entries of a problem are timed in turns
};

// A first call at least this long is the entry's one sample: no warm-up can change it.
inline constexpr double kSelfTimedMs = 10'000;
// A first call longer than budget / kProbeShare may carry one-time work (loading modules,
// a JIT compile): one more call is timed, and that one plans the runs.
inline constexpr double kProbeShare = 8;
// Timed calls: at least this many (or iters, if fewer) while the budget allows one call.
inline constexpr int kMinTimedRuns = 3;

struct RunPlan {
  int warmup = 0;
  int timed = 0;
};
// The runs of one entry in one round, given what one call costs; the round's budget is
// budget_ms / rounds. Warm-up takes at most a quarter of what fits in it.
RunPlan plan_runs(double call_ms, const TimingOptions& o);

double median(std::vector<double> xs);  // NaN when empty

// One call of an implementation on input set `set` (0 <= set < the number of sets), on the
// harness's stream (CUDA) or synchronously (CPU).
using Launch = std::function<Status(int set)>;

// ---------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------
enum class RowStatus {
  kOk,           // checked and within tolerance
  kUnchecked,    // ran, every output written, not compared (check off)
  kFail,         // error above tolerance, or an output element not written
  kUnsupported,  // the implementation refused the problem (reason says why)
  kError,        // a library, CUDA or Python error while running (reason has the message)
};
const char* to_string(RowStatus s);

struct Row {
  std::string kernel;  // a registry name, or a peer's name
  Problem problem;
  RowStatus status = RowStatus::kOk;
  std::string reason;  // unsupported / error / what failed the check
  double time_ms = kNaN;
  int warmup_runs = 0;
  int timed_runs = 0;
  std::vector<double> round_ms;  // the median of each round
  double flops = 0;
  double tflops = kNaN;
  double kv_bytes = 0;
  size_t workspace_bytes = 0;
  // Max abs error against the fp64 reference; NaN when not compared or not an output.
  double err_out = kNaN, err_lse = kNaN, err_dq = kNaN, err_dk = kNaN, err_dv = kNaN;
  double vs_base = kNaN;  // time of the group's first timed row that passed / this time
  double vs_prev = kNaN;  // time of the previous timed row that passed / this time

  bool timed() const { return status == RowStatus::kOk || status == RowStatus::kUnchecked; }
  // GB/s of K and V read (kv_bytes / time); NaN when not timed.
  double gbps() const { return timed() ? kv_bytes / (time_ms * 1e6) : kNaN; }
};

// An implementation being measured: its row, and how to launch one call. `launch` is
// empty when the entry is not to be timed (it refused, failed its check or broke).
struct Entry {
  Row row;
  Launch launch;
  double call_ms = kNaN;  // what one call costs: plans the runs
  double first_ms = kNaN; // the checked call
};

struct Report {
  std::vector<Row> rows;
  std::string device;   // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 50 MiB L2)" or "CPU: ..."
  std::string checked;  // what the check compared
  std::string timing;   // how the times were taken
  std::string inputs;   // seed, and where the backward's out/lse came from
};

// Max abs error allowed against the fp64 reference, by input dtype (inputs are unit
// normal-ish, the softmax scale the default).
struct Tolerance {
  double out = 0;   // out and lse
  double grad = 0;  // dq, dk, dv: times max(1, max |reference|) of that gradient
};
Tolerance tolerance_for(DType dtype);

// ---------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------
struct Options {
  std::vector<std::string> kernels;  // run_bench: the registry kernels, in row order
  TimingOptions timing;
  int threads = 0;                   // CPU kernels and the check; 0 = all hardware threads
  uint64_t seed = 0;
  bool check = true;                 // compare with the fp64 reference
  bool progress = true;              // progress lines on stderr for long calls
  double check_flops = 80e9;         // the fp64 reference's budget: larger problems are
                                     // checked on a slice
  void* stream = nullptr;            // CUDA: the stream of every call; null: the harness's own
};

// Progress on stderr: a line for a call longer than a few seconds (begin/end), and a
// counter for a sweep (step). Refreshed in place on a terminal, printed as lines otherwise.
class Progress {
 public:
  explicit Progress(bool enabled, int total = 0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void begin(std::string what);
  void end();
  void step(std::string_view what);  // one of `total` done

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The operands of a problem's input sets: q, k, v, and for the backward out, lse and dout
// (out and lse made by the device's best forward kernel); a train problem's are q, k, v
// and dout (out and lse are what each call writes). Decode: k and v are the caches (paged:
// [num_pages, page_size, heads_kv, dim]), with k_new/v_new when it appends, cache_seqlens
// (int32 [batch]) and, paged, the block table (int32 [batch, pages per sequence]). Varlen:
// cu_seqlens (int32 [batch + 1]), both cu_seqlens_q and cu_seqlens_k of every call. Rotary
// (Problem::rotary): the tables rotary_cos and rotary_sin.
enum class Operand : int {
  kQ, kK, kV, kOut, kLse, kDout,
  kKNew = 9, kVNew, kCacheSeqlens, kBlockTable, kCuSeqlens, kRotaryCos, kRotarySin
};

// What an implementation wrote; the present tensors are checked (any strides, any device).
struct Outputs {
  Tensor out, lse, dq, dk, dv;
};

// One problem on one device: input sets filled with random values, the fp64 reference
// (made on first use), and the entries measured on them.
class Bench {
 public:
  static Status create(const Problem& p, const Options& o, std::unique_ptr<Bench>* out);
  ~Bench();
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  const Problem& problem() const;
  const Options& options() const;
  int set_count() const;
  void* stream() const;
  // A view of one operand of input set `set` (absent when the pass has no such operand).
  Tensor input(int set, Operand which) const;

  // A registry kernel: supports, workspace, checked call. `e->launch` is set when it may
  // be timed. The Status is not OK only when the harness cannot go on.
  Status add_kernel(std::string_view name, Entry* e);
  // A registry kernel on a train problem runs the forward and then the backward by that
  // name (each pass through select_kernel, "auto" included), one workspace for both.
  // Any other implementation: launch(0) runs once, timed; then written() gives views of
  // the outputs that call wrote, which are checked as a kernel's are. The gradients of a
  // backward or train problem, and a train problem's out, must be among them.
  Status add(std::string name, Launch launch, const std::function<Status(Outputs*)>& written,
             Entry* e);
  // The row of an implementation that refused the problem (or broke before its first call).
  Entry refused(std::string name, std::string reason, RowStatus status = RowStatus::kUnsupported) const;
  // Times the entries whose launch is set (options().timing; in turns when rounds > 1)
  // and fills their rows.
  Status time(std::span<Entry* const> entries);
  // The report's footer: device, check, timing and inputs.
  void describe(Report* r) const;

 private:
  Bench();
  struct State;
  std::unique_ptr<State> s_;
};

// Every kernel of o.kernels on `p`: created, checked and timed (one after the other, or in
// turns with rounds > 1). Rows of kernels that refuse or fail are part of the report.
Status run_bench(const Problem& p, const Options& o, Report* report);

// run_bench on each problem in turn, one report (group starts in `groups`; footer lines
// that differ are kept one under the other).
Status run_problems(std::span<const Problem> ps, const Options& o, Report* report,
                    std::vector<size_t>* groups);

// The ladder: every kernel of o.kernels on `p`, non-causal then causal (group starts in
// `groups`); on the GPU a kernel that also takes fp32 is timed in both dtypes and shown in
// the faster.
Status run_ladder(const Problem& p, const Options& o, Report* report, std::vector<size_t>* groups);

// vs base / vs prev over consecutive rows [begin, end) that form one comparison. Rows that
// failed their check are compared but never compared against.
void add_ratios(std::vector<Row>& rows, size_t begin, size_t end);

// "CPU: AMD EPYC, 2 threads" or the CUDA device's name and size.
std::string device_description(Device device, int threads);
// "0 B", "230 KiB", "4.00 GiB".
std::string format_bytes(size_t bytes);

}  // namespace flashlab::bench
