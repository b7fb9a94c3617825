// flashlab — FlashLab's command-line tool.
//
//   flashlab bench [flags]   time kernels on one problem, each checked first against the
//                            fp64 reference; a table, or --json / --csv rows
//   flashlab bench --ladder  every GPU rung in ladder order, non-causal then causal
//   flashlab list            the kernel registry
//
// This file is the command line: flags, defaults and help. The measuring is the harness
// of include/flashlab/bench.h (src/bench/), the output formats are output.{h,cpp}. Only
// the public headers are used.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "flashlab/bench.h"
#include "flashlab/flashlab.h"
#include "output.h"

namespace {

using flashlab::DType;
using flashlab::Device;
using flashlab::bench::Problem;
using flashlab::bench::Report;
using flashlab::cli::kExitError;
using flashlab::cli::kExitOk;
using flashlab::cli::kExitUsage;

// Default problems and run counts, by device.
constexpr Problem kCpuDefault = {.batch = 1, .heads_q = 8, .heads_kv = 8, .seqlen_q = 4096,
                                 .seqlen_k = 4096, .head_dim = 128, .head_dim_v = 128,
                                 .dtype = DType::kF32, .device = Device::kCPU};
constexpr Problem kCudaDefault = {.batch = 4, .heads_q = 16, .heads_kv = 16, .seqlen_q = 4096,
                                  .seqlen_k = 4096, .head_dim = 128, .head_dim_v = 128,
                                  .dtype = DType::kBF16, .device = Device::kCUDA};
constexpr int kCpuWarmup = 1, kCpuIters = 5;
constexpr int kCudaWarmup = 5, kCudaIters = 30;
constexpr int kMaxDim = 1 << 30;

// A bad command line: the message is printed and flashlab exits with kExitUsage.
struct UsageError {
  std::string message;
};
// Flags are fine but the machine cannot do it (no CUDA device): kExitError.
struct EnvironmentError {
  std::string message;
};

// ---- help -------------------------------------------------------------------------------

constexpr const char* kMainHelp = R"(flashlab - FlashLab's command-line tool: benchmark and check attention kernels.

usage:
  flashlab bench [flags]      time kernels on one problem, each checked first against the
                              fp64 reference (cpu_reference); prints a table
  flashlab list               print the kernel registry: name, arch, passes, summary
  flashlab help [command]     this text, or a command's help (= flashlab <command> --help)

`flashlab bench --help` lists the benchmark's flags and explains its columns.

exit codes: 0 ok, 1 library/CUDA error or a kernel that did not run (one named with
  --kernel that refused the problem, or none of the device's kernels ran), 2 bad command
  line, 3 a kernel failed its check
)";

constexpr const char* kListHelp = R"(usage: flashlab list

Prints every kernel of this build's registry in registry order (for the GPU kernels, the
order of the ladder): its name (what --kernel and the API's `kernel` take), its arch
(cpu, sm80+, sm90a, ...), whether it has a forward and a backward pass, and its summary.
The last line says whether this build has CUDA kernels and sees a CUDA device.
)";

constexpr const char* kBenchHelp = R"(usage: flashlab bench [flags]

Runs one attention problem with each kernel of the registry that belongs to the device
(or those named by --kernel). For each kernel: one checked call (outputs poisoned with
NaN first, every element must be written, results compared with cpu_reference computed
in fp64 on the same inputs), then warm-up and timed calls. A kernel that does not
support the problem, or fails its check, gets a row with the reason and no time. Fresh
random inputs each run unless --seed.

defaults (--device auto picks the GPU when one is visible, else the CPU):
  CPU   batch 1, heads 8, seqlen 4096, head dim 128, fp32, no mask;
        kernels cpu_reference (the baseline, ~1 min) then cpu_flash
  CUDA  batch 4, heads 16, seqlen 4096, head dim 128, bf16, no mask;
        every CUDA kernel with the pass being timed (forward, or with --backward the
        backward), in registry order; the first that runs is the baseline

problem:
  --batch N          batch size
  --heads N          query heads
  --heads-kv N       key/value heads; must divide --heads (GQA/MQA) [= --heads]
  --seqlen N         query length, and key length unless --seqlen-k
  --seqlen-k N       key/value length [= --seqlen]
  --head-dim N       head dim of q and k
  --head-dim-v N     head dim of v and out [= --head-dim]
  --dtype T          fp32, fp16 or bf16 (the CPU computes all in fp32; tensor-core GPU
                     rungs take fp16/bf16 only)
  --causal           causal mask, aligned bottom-right as in FlashAttention >= 2.1
  --window L,R       sliding window: query i (diagonal key d = i + seqlen_k - seqlen)
                     sees keys d-L .. d+R; -1 = unbounded; with --causal, R is 0
  --softcap X        logits become X*tanh(logit/X); 0 = off [0]
  --quadratic-limit G  GiB of O(seqlen²) workspace that cpu_reference and naive may take
                     before they refuse the problem (the API's quadratic_workspace_limit) [4]
  --backward         time the backward pass (dq, dk, dv) instead of the forward; its out
                     and LSE come from the device's best forward kernel, run first

kernels and device:
  --kernel NAME      a kernel from `flashlab list`; repeat the flag or give a comma list
                     for several, in that order; `all` = every kernel of the device [all]
  --device D         auto, cpu or cuda [auto]; with named kernels, auto is their device
  --threads N        threads for CPU kernels and for the check [all hardware threads]
  --ladder           the GPU ladder: every CUDA kernel in registry (= ladder) order on
                     the CUDA default problem, non-causal then causal, in one table with
                     `vs prev`. A rung that also takes fp32 is timed in both dtypes and
                     shown in the faster (its shape column says which). Problem flags
                     change the problem (not --causal: the ladder runs both). Without a
                     GPU it ladders the CPU kernels on the CPU default problem.

timing and check:
  --iters N          timed calls, at most; the median is reported [CPU 5, CUDA 30]
  --warmup N         untimed calls before them, at least [CPU 1, CUDA 5]
  --warmup-ms MS     the warm-up also lasts at least this long [0]
  --budget S         seconds per kernel: a slow call means fewer calls [10]
  --rounds N         time the kernels in N alternating rounds, the order rotated each
                     round (budget / N each); a kernel's time is the median of its
                     rounds' medians [1: each kernel timed alone, one after the other]
  --seed N           seed of the random inputs [a fresh one each run; the footer says it]
  --no-check         skip the comparison with the reference (outputs are still checked
                     to be fully written)
  --check-gflops G   the fp64 reference's budget: larger problems are checked on a
                     slice (below) [80]

output:
  --json             one JSON object: device, check, timing, inputs, and "rows" with the
                     columns below as raw numbers (null where there is none)
  --csv              a header line, then one line per row (raw numbers; empty = none)
  -h, --help         this text

columns:
  kernel, shape      shape = batch x heads[/kv heads] x seqlen[/seqlen_k] x head_dim[/head_dim_v] dtype
  mask               none, causal, window(L,R), each +softcap(X) when on
  time ms            median time of one call
  runs               timed calls behind the median
  TFLOP/s            FLOPs / time. Forward FLOPs = 2*(head_dim + head_dim_v) for each
                     (query, key) pair the mask allows: 4*B*H*Sq*Sk*D with no mask, about
                     half causal, exact for windows. Backward = 2.5x its forward.
  extra mem          the kernel's workspace_size(). FlashLab never allocates: this is the
                     scratch memory the caller provides. Inputs and outputs not counted.
  err out, err lse   max abs error vs cpu_reference in fp64 (backward: err dq, dk, dv)
  vs base            speed-up over the first row that ran and passed (base time / time)
  vs prev            (--ladder) speed-up over the previous rung that ran and passed
  check              ok, or - when not compared (--no-check); a kernel that failed (an
                     error above tolerance, an output element not written) shows FAIL
                     and the reason instead of a time

tolerance (max abs error; unit-normal inputs, default softmax scale):
  fp32 1e-4 (out, lse), 2e-4 (dq, dk, dv); fp16 5e-3, 1e-2; bf16 2e-2, 4e-2.
  A gradient's tolerance is multiplied by max(1, max |reference gradient|): its
  rounding error grows with its size (GQA sums over heads, causal first keys).

check on a slice: a problem whose fp64 reference would cost more than --check-gflops is
  checked on batch entry 0, as many query heads as threads (backward: whole kv-head
  groups, as many as fit) and, if still too large, on the last query rows (which see
  exactly the keys they see in the full problem; the backward's dk and dv are then
  compared on the keys no earlier row sees); the footer says which.

timing: CPU std::chrono::steady_clock; CUDA a cudaEvent pair per call on one stream,
  rotating among input sets whose total exceeds 2x the L2 cache (capped at 4 GiB and
  1/4 of free memory). After the checked call: warm-up, then the median of the timed
  calls. Slow kernels get fewer calls (the runs column says how many): as many as fit
  the budget, at least 3 (or --iters if fewer), warm-up at most a quarter of it. A
  checked call longer than budget/8 may carry one-time work, so one more call is timed
  to plan the rest; a call over 10 s is its own one sample. Calls over 3 s show a
  progress line on stderr. docs/BENCHMARK.md describes the method.

exit codes: 0 ok, 1 library/CUDA error or a kernel that did not run (one named with
  --kernel that refused the problem, or none of the device's kernels ran), 2 bad command
  line, 3 a kernel failed its check
)";

// ---- flag parsing -----------------------------------------------------------------------

enum class Format { kTable, kJson, kCsv };

struct BenchFlags {
  std::optional<int> batch, heads, heads_kv, seqlen, seqlen_k, head_dim, head_dim_v;
  std::optional<DType> dtype;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  double quadratic_limit_gib = 4.0;
  bool backward = false;
  std::vector<std::string> kernels;  // empty = all
  std::string device = "auto";
  std::optional<int> iters, warmup;
  double warmup_ms = 0, budget_s = 10, check_gflops = 80;
  int rounds = 1;
  int threads = 0;
  std::optional<uint64_t> seed;
  bool check = true;
  bool ladder = false;
  std::optional<Format> format;
  bool help = false;
};

template <class T>
T parse_number(const std::string& flag, const std::string& text, T min, T max) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty())
    throw UsageError{flag + (std::is_integral_v<T> ? " takes an integer" : " takes a number") +
                     ", got '" + text + "'"};
  if (value < min || value > max)
    throw UsageError{flag + " must be in [" + std::to_string(min) + ", " + std::to_string(max) +
                     "], got " + text};
  return value;
}

int parse_int(const std::string& flag, const std::string& text, int min) {
  return parse_number<int>(flag, text, min, kMaxDim);
}

float parse_softcap(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(x) || x < 0)
    throw UsageError{flag + " takes a finite number >= 0 (0 = off), got '" + text + "'"};
  return float(x);
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "fp32") return DType::kF32;
  if (text == "fp16") return DType::kF16;
  if (text == "bf16") return DType::kBF16;
  throw UsageError{flag + " takes fp32, fp16 or bf16, got '" + text + "'"};
}

void parse_window(BenchFlags& f, const std::string& flag, const std::string& text) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos)
    throw UsageError{flag + " takes L,R (two integers, -1 = unbounded), got '" + text + "'"};
  f.window_left = parse_number<int>(flag + " L", text.substr(0, comma), -1, kMaxDim);
  f.window_right = parse_number<int>(flag + " R", text.substr(comma + 1), -1, kMaxDim);
}

void parse_kernels(BenchFlags& f, const std::string& flag, const std::string& text) {
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, comma - start);
    if (name.empty()) throw UsageError{flag + " has an empty kernel name in '" + text + "'"};
    if (name != "all") f.kernels.push_back(name);
    start = comma + 1;
  }
}

void set_format(BenchFlags& f, Format format) {
  if (f.format && *f.format != format) throw UsageError{"--json and --csv exclude each other"};
  f.format = format;
}

// One flag: its name, whether it takes a value, and what it sets.
struct FlagSpec {
  const char* name;
  bool takes_value;
  void (*apply)(BenchFlags& f, const std::string& flag, const std::string& value);
};

constexpr FlagSpec kBenchFlags[] = {
    {"--batch", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.batch = parse_int(n, v, 1); }},
    {"--heads", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.heads = parse_int(n, v, 1); }},
    {"--heads-kv", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.heads_kv = parse_int(n, v, 1); }},
    {"--seqlen", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.seqlen = parse_int(n, v, 1); }},
    {"--seqlen-k", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.seqlen_k = parse_int(n, v, 1); }},
    {"--head-dim", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.head_dim = parse_int(n, v, 1); }},
    {"--head-dim-v", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.head_dim_v = parse_int(n, v, 1); }},
    {"--dtype", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.dtype = parse_dtype(n, v); }},
    {"--causal", false, [](BenchFlags& f, const std::string&, const std::string&) { f.causal = true; }},
    {"--window", true, [](BenchFlags& f, const std::string& n, const std::string& v) { parse_window(f, n, v); }},
    {"--softcap", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.softcap = parse_softcap(n, v); }},
    {"--quadratic-limit", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       f.quadratic_limit_gib = parse_number<double>(n, v, 0.0, 1e6);
     }},
    {"--backward", false, [](BenchFlags& f, const std::string&, const std::string&) { f.backward = true; }},
    {"--kernel", true, [](BenchFlags& f, const std::string& n, const std::string& v) { parse_kernels(f, n, v); }},
    {"--device", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       if (v != "auto" && v != "cpu" && v != "cuda")
         throw UsageError{n + " takes auto, cpu or cuda, got '" + v + "'"};
       f.device = v;
     }},
    {"--threads", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.threads = parse_int(n, v, 1); }},
    {"--iters", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.iters = parse_int(n, v, 1); }},
    {"--warmup", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.warmup = parse_int(n, v, 0); }},
    {"--warmup-ms", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       f.warmup_ms = parse_number<double>(n, v, 0.0, 1e7);
     }},
    {"--budget", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       f.budget_s = parse_number<double>(n, v, 0.0, 1e6);
     }},
    {"--rounds", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.rounds = parse_int(n, v, 1); }},
    {"--seed", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       f.seed = parse_number<uint64_t>(n, v, 0, UINT64_MAX);
     }},
    {"--check-gflops", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       f.check_gflops = parse_number<double>(n, v, 0.0, 1e9);
     }},
    {"--no-check", false, [](BenchFlags& f, const std::string&, const std::string&) { f.check = false; }},
    {"--ladder", false, [](BenchFlags& f, const std::string&, const std::string&) { f.ladder = true; }},
    {"--json", false, [](BenchFlags& f, const std::string&, const std::string&) { set_format(f, Format::kJson); }},
    {"--csv", false, [](BenchFlags& f, const std::string&, const std::string&) { set_format(f, Format::kCsv); }},
    {"--help", false, [](BenchFlags& f, const std::string&, const std::string&) { f.help = true; }},
    {"-h", false, [](BenchFlags& f, const std::string&, const std::string&) { f.help = true; }},
};

const FlagSpec* find_flag(const std::string& name) {
  for (const FlagSpec& spec : kBenchFlags)
    if (name == spec.name) return &spec;
  return nullptr;
}

// Flags as `--name value` or `--name=value`.
BenchFlags parse_bench_flags(const std::vector<std::string>& args) {
  BenchFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = find_flag(name);
    if (!spec) throw UsageError{"unknown flag '" + name + "' (flashlab bench --help lists the flags)"};
    if (spec->takes_value && !value) {
      if (i + 1 >= args.size()) throw UsageError{name + " needs a value"};
      value = args[++i];
    }
    if (!spec->takes_value && value) throw UsageError{name + " takes no value"};
    spec->apply(f, name, value.value_or(""));
  }
  return f;
}

// ---- from flags to problems -------------------------------------------------------------

bool is_cpu_kernel(const flashlab::KernelInfo& k) { return k.arch == "cpu"; }

const flashlab::KernelInfo* find_kernel(const std::string& name) {
  for (const flashlab::KernelInfo& k : flashlab::kernels())
    if (k.name == name) return &k;
  return nullptr;
}

void check_kernel_names(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (find_kernel(name)) continue;
    std::string known;
    for (const flashlab::KernelInfo& k : flashlab::kernels())
      known += (known.empty() ? "" : ", ") + std::string(k.name);
    throw UsageError{"unknown kernel '" + name + "'; this build has: " + known};
  }
}

std::string no_cuda_reason() {
#if FLASHLAB_WITH_CUDA
  return "no CUDA device is visible";
#else
  return "this build of flashlab has no CUDA kernels (configure with -DFLASHLAB_CUDA=ON)";
#endif
}

Device cuda_or_throw(const std::string& why) {
  if (!flashlab::cuda_available()) throw EnvironmentError{why + ", but " + no_cuda_reason()};
  return Device::kCUDA;
}

// --device, or with auto: the device of the named kernels, else the GPU when present.
// `note` says so when auto falls back to the CPU.
Device resolve_device(const BenchFlags& f, std::string* note) {
  if (f.device == "cpu") return Device::kCPU;
  if (f.device == "cuda") return cuda_or_throw("--device cuda was asked for");
  if (!f.kernels.empty()) {
    const bool cpu = is_cpu_kernel(*find_kernel(f.kernels.front()));
    for (const std::string& name : f.kernels)
      if (is_cpu_kernel(*find_kernel(name)) != cpu)
        throw UsageError{"--kernel names both CPU and CUDA kernels; pick one device with --device"};
    return cpu ? Device::kCPU : cuda_or_throw("kernel '" + f.kernels.front() + "' runs on CUDA");
  }
  if (flashlab::cuda_available()) return Device::kCUDA;
  *note = no_cuda_reason() + ": running on the CPU" +
          (f.ladder ? " (--ladder ladders the CPU kernels)" : "");
  return Device::kCPU;
}

Problem make_problem(const BenchFlags& f, Device device) {
  Problem p = device == Device::kCPU ? kCpuDefault : kCudaDefault;
  p.batch = f.batch.value_or(p.batch);
  p.heads_q = f.heads.value_or(p.heads_q);
  p.heads_kv = f.heads_kv.value_or(p.heads_q);
  p.seqlen_q = f.seqlen.value_or(p.seqlen_q);
  p.seqlen_k = f.seqlen_k.value_or(p.seqlen_q);
  p.head_dim = f.head_dim.value_or(p.head_dim);
  p.head_dim_v = f.head_dim_v.value_or(p.head_dim);
  p.dtype = f.dtype.value_or(p.dtype);
  p.causal = f.causal;
  p.window_left = f.window_left;
  p.window_right = f.window_right;
  p.softcap = f.softcap;
  p.quadratic_workspace_limit = size_t(f.quadratic_limit_gib * double(size_t(1) << 30));
  p.backward = f.backward;
  if (p.heads_q % p.heads_kv != 0)
    throw UsageError{"--heads (" + std::to_string(p.heads_q) + ") must be a multiple of --heads-kv (" +
                     std::to_string(p.heads_kv) + ")"};
  return p;
}

// The named kernels, else every kernel of the device that has the pass being timed (a
// named kernel without it gets a row saying so).
std::vector<std::string> kernels_for(const BenchFlags& f, Device device) {
  if (!f.kernels.empty()) return f.kernels;
  std::vector<std::string> names;
  for (const flashlab::KernelInfo& k : flashlab::kernels())
    if (is_cpu_kernel(k) == (device == Device::kCPU) &&
        (f.backward ? k.has_backward : k.has_forward))
      names.emplace_back(k.name);
  return names;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

flashlab::bench::Options make_options(const BenchFlags& f, Device device) {
  flashlab::bench::Options o;
  o.kernels = kernels_for(f, device);
  const bool cpu = device == Device::kCPU;
  o.timing.warmup = f.warmup.value_or(cpu ? kCpuWarmup : kCudaWarmup);
  o.timing.iters = f.iters.value_or(cpu ? kCpuIters : kCudaIters);
  o.timing.warmup_ms = f.warmup_ms;
  o.timing.budget_ms = f.budget_s * 1e3;
  o.timing.rounds = f.rounds;
  o.check_flops = f.check_gflops * 1e9;
  o.threads = f.threads;
  o.seed = f.seed.value_or(fresh_seed());
  o.check = f.check;
  return o;
}

// ---- running ----------------------------------------------------------------------------

void throw_if_error(const flashlab::Status& s) {
  if (!s.ok()) throw EnvironmentError{s.message()};
}

// Every kernel named with --kernel must run the problem; without --kernel, at least one of
// the device's. Each one that refused is named on stderr; kExitError when the rule is
// broken, else `code` (the report's own exit code).
int with_refusals(const Report& report, bool named, int code) {
  bool any_ran = false;
  std::vector<const flashlab::bench::Row*> refused;
  for (const flashlab::bench::Row& r : report.rows) {
    if (r.status == flashlab::bench::RowStatus::kUnsupported)
      refused.push_back(&r);
    else
      any_ran = true;
  }
  if (any_ran && (!named || refused.empty())) return code;
  for (const flashlab::bench::Row* r : refused)
    std::fprintf(stderr, "flashlab: kernel '%s' did not run on %s, mask %s: %s\n", r->kernel.c_str(),
                 flashlab::bench::shape_string(r->problem).c_str(),
                 flashlab::bench::mask_string(r->problem).c_str(), r->reason.c_str());
  if (!any_ran) std::fprintf(stderr, "flashlab: no kernel ran\n");
  return code == kExitOk ? kExitError : code;
}

// ---- commands ---------------------------------------------------------------------------

int cmd_bench(const std::vector<std::string>& args) {
  const BenchFlags f = parse_bench_flags(args);
  if (f.help) {
    std::fputs(kBenchHelp, stdout);
    return kExitOk;
  }
  if (f.ladder && f.causal)
    throw UsageError{"--ladder runs non-causal and causal; drop --causal"};
  check_kernel_names(f.kernels);
  std::string note;
  const Device device = resolve_device(f, &note);
  const Problem p = make_problem(f, device);
  const flashlab::bench::Options o = make_options(f, device);
  if (!note.empty()) std::fprintf(stderr, "flashlab: %s\n", note.c_str());
  std::vector<size_t> groups = {0};
  Report report;
  if (f.ladder) {
    groups.clear();
    throw_if_error(flashlab::bench::run_ladder(p, o, &report, &groups));
  } else {
    throw_if_error(flashlab::bench::run_bench(p, o, &report));
  }
  const Format format = f.format.value_or(Format::kTable);
  if (format == Format::kJson)
    flashlab::cli::print_json(report);
  else if (format == Format::kCsv)
    flashlab::cli::print_csv(report);
  else
    flashlab::cli::print_table(report, groups, f.ladder);
  return with_refusals(report, !f.kernels.empty(), flashlab::cli::exit_code_of(report));
}

int cmd_list(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kListHelp, stdout);
      return kExitOk;
    }
    throw UsageError{"flashlab list takes no arguments, got '" + a + "'"};
  }
  flashlab::cli::Table t({"kernel", "arch", "fwd", "bwd", "summary"}, {false, false, false, false, false});
  for (const flashlab::KernelInfo& k : flashlab::kernels())
    t.add({std::string(k.name), std::string(k.arch), k.has_forward ? "yes" : "no",
           k.has_backward ? "yes" : "no", std::string(k.summary)});
  t.print(stdout);
  std::printf("\nCUDA kernels in this build: %s; CUDA device: %s\n", FLASHLAB_WITH_CUDA ? "yes" : "no",
              flashlab::cuda_available() ? "yes" : "none visible");
  return kExitOk;
}

int cmd_help(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kMainHelp, stdout);
    return kExitOk;
  }
  if (args[0] != "bench" && args[0] != "list")
    throw UsageError{"no help for '" + args[0] + "': the commands are bench and list"};
  std::fputs(args[0] == "bench" ? kBenchHelp : kListHelp, stdout);
  return kExitOk;
}

int dispatch(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kMainHelp, stderr);
    return kExitUsage;
  }
  const std::string& cmd = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "bench") return cmd_bench(rest);
  if (cmd == "list") return cmd_list(rest);
  if (cmd == "help") return cmd_help(rest);
  if (cmd == "--help" || cmd == "-h") return cmd_help({});
  throw UsageError{"unknown command '" + cmd + "': the commands are bench, list and help"};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flashlab: %s\n", e.message.c_str());
    return kExitUsage;
  } catch (const EnvironmentError& e) {
    std::fprintf(stderr, "flashlab: %s\n", e.message.c_str());
    return kExitError;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flashlab: out of host memory\n");
    return kExitError;
  }
}
