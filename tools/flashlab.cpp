// flashlab — FlashLab's command-line tool.
//
//   flashlab bench [flags]   time kernels on one problem, each checked first against the
//                            fp64 reference; a table, or --json / --csv rows
//   flashlab bench --ladder  every GPU rung in ladder order, non-causal then causal
//   flashlab list            the kernel registry
//
// This file is the command line: flags, defaults, help, and the output formats. The
// measuring is tools/bench.{h,cpp} (the harness) and tools/timer.{h,cpp} (the one timing
// method). Results go to stdout; notes and progress lines go to stderr, so --json and
// --csv output stays machine-readable.
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
#include <vector>

#include "bench.h"
#include "flashlab/flashlab.h"

namespace {

using flashlab::DType;
using flashlab::Device;
using flashlab::bench::Problem;
using flashlab::bench::Report;
using flashlab::bench::Row;
using flashlab::bench::RowStatus;

// Exit codes (also in the help texts).
constexpr int kExitOk = 0;
constexpr int kExitError = 1;      // a library, CUDA or environment error
constexpr int kExitUsage = 2;      // a bad command line
constexpr int kExitCheckFail = 3;  // a kernel's result failed its check

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

exit codes: 0 ok, 1 library/CUDA error, 2 bad command line, 3 a kernel failed its check
)";

constexpr const char* kListHelp = R"(usage: flashlab list

Prints every kernel of this build's registry in registry order (for the GPU kernels, the
order of the ladder): its name (what --kernel and the API's `kernel` take), its arch
(cpu, sm80+, sm90a, ...), whether it has a forward and a backward pass, and its summary.
The last line says whether this build has CUDA kernels and sees a CUDA device.
)";

constexpr const char* kBenchHelp = R"(usage: flashlab bench [flags]

Runs one attention problem with each kernel of the registry that belongs to the device
(or those named by --kernel). For each kernel: one checked run (outputs poisoned with
NaN first, every element must be written, results compared with cpu_reference computed
in fp64 on the same inputs), then warm-up and timed runs. A kernel that does not support
the problem gets a row with its reason. Fresh random inputs each run unless --seed.

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
  --iters N          timed runs; the median is reported [CPU 5, CUDA 30]
  --warmup N         untimed runs before them [CPU 1, CUDA 5]
  --seed N           seed of the random inputs [a fresh one each run; the footer says it]
  --no-check         skip the comparison with the reference (outputs are still checked
                     to be fully written)

output:
  --json             one JSON object: device, check, timing, inputs, and "rows" with the
                     columns below as raw numbers (null where there is none)
  --csv              a header line, then one line per row (raw numbers; empty = none)
  -h, --help         this text

columns:
  kernel, shape      shape = batch x heads[/kv heads] x seqlen[/seqlen_k] x head_dim[/head_dim_v] dtype
  mask               none, causal, window(L,R), each +softcap(X) when on
  time ms            median time of one call
  runs               timed runs behind the median
  TFLOP/s            FLOPs / time. Forward FLOPs = 2*(head_dim + head_dim_v) for each
                     (query, key) pair the mask allows: 4*B*H*Sq*Sk*D with no mask, about
                     half causal, exact for windows. Backward = 2.5x its forward.
  extra mem          the kernel's workspace_size(). FlashLab never allocates: this is the
                     scratch memory the caller provides. Inputs and outputs not counted.
  err out, err lse   max abs error vs cpu_reference in fp64 (backward: err dq, dk, dv)
  vs base            speed-up over the first row that ran and passed (base time / time)
  vs prev            (--ladder) speed-up over the previous rung that ran and passed
  check              ok; FAIL (an error above tolerance, or an output element not
                     written: the reason follows the table); - when not compared

tolerance (max abs error; unit-normal inputs, default softmax scale):
  fp32 1e-4 (out, lse), 2e-4 (dq, dk, dv); fp16 5e-3, 1e-2; bf16 2e-2, 4e-2.
  A gradient's tolerance is multiplied by max(1, max |reference gradient|): its
  rounding error grows with its size (GQA sums over heads, causal first keys).

check on a slice: a problem whose fp64 reference would cost more than 80 GFLOP is
  checked on batch entry 0 and at most 2 query heads (backward: whole kv-head groups)
  and, if still too large, on the last query rows (which see exactly the keys they see
  in the full problem); the footer says which.

timing: CPU std::chrono::steady_clock; CUDA a cudaEvent pair per call on one stream,
  rotating among input sets whose total exceeds 2x the L2 cache (capped at 4 GiB and
  1/4 of free memory). After the checked run: warm-up, then the median of the timed
  runs. Slow kernels get fewer timed runs (the runs column says how many): as many as
  fit in 10 s, but at least 5 (or --iters if smaller); a run over 2 s needs only 1, the
  checked run serving as warm-up; a run over 10 s is timed once, by its checked run.
  Runs over 3 s show a progress line on stderr.

exit codes: 0 ok, 1 library/CUDA error, 2 bad command line, 3 a kernel failed its check
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
    throw UsageError{flag + " takes an integer, got '" + text + "'"};
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
    {"--seed", true, [](BenchFlags& f, const std::string& n, const std::string& v) {
       f.seed = parse_number<uint64_t>(n, v, 0, UINT64_MAX);
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
  o.warmup = f.warmup.value_or(cpu ? kCpuWarmup : kCudaWarmup);
  o.iters = f.iters.value_or(cpu ? kCpuIters : kCudaIters);
  o.threads = f.threads;
  o.seed = f.seed.value_or(fresh_seed());
  o.check = f.check;
  return o;
}

// ---- running ----------------------------------------------------------------------------

void run_or_throw(const Problem& p, const flashlab::bench::Options& o, Report* report) {
  const flashlab::Status s = flashlab::bench::run_bench(p, o, report);
  if (!s.ok()) throw EnvironmentError{s.message()};
}

// Adds `line` to a footer field unless it is there already (ladder problems share most).
void merge_line(std::string& field, const std::string& line) {
  if (line.empty() || field.find(line) != std::string::npos) return;
  field += (field.empty() ? "" : "\n  ") + line;
}

void merge_footer(Report& into, const Report& from) {
  merge_line(into.device, from.device);
  merge_line(into.checked, from.checked);
  merge_line(into.timing, from.timing);
  merge_line(into.inputs, from.inputs);
}

bool passed(const Row& r) { return r.timed() && r.status != RowStatus::kFail; }

// Keeps, for each kernel, the fp32 row where it passed and the other dtype's row did not,
// or was slower.
void keep_faster(std::vector<Row>& rows, const std::vector<Row>& fp32_rows) {
  for (size_t i = 0; i < rows.size() && i < fp32_rows.size(); ++i) {
    const Row& alt = fp32_rows[i];
    if (passed(alt) && (!passed(rows[i]) || alt.time_ms < rows[i].time_ms)) rows[i] = alt;
  }
}

// One mask of the ladder: the rungs in the problem's dtype, and on the GPU in fp32 too
// (the SIMT rungs can be faster in fp32, where they need no conversions).
void run_ladder_step(const Problem& p, const flashlab::bench::Options& o, Report* report) {
  Report step;
  run_or_throw(p, o, &step);
  if (p.device == Device::kCUDA && p.dtype != DType::kF32) {
    Problem p32 = p;
    p32.dtype = DType::kF32;
    Report alt;
    run_or_throw(p32, o, &alt);
    keep_faster(step.rows, alt.rows);
    merge_footer(step, alt);
    flashlab::bench::add_ratios(step.rows, 0, step.rows.size());
    merge_line(step.inputs, "ladder: rungs that take fp32 were timed in " +
                                std::string(flashlab::to_string(p.dtype)) +
                                " and fp32; each row shows the faster");
  }
  merge_footer(*report, step);
  for (Row& r : step.rows) report->rows.push_back(std::move(r));
}

Report run_ladder(Problem p, const flashlab::bench::Options& o, std::vector<size_t>* groups) {
  Report report;
  for (bool causal : {false, true}) {
    p.causal = causal;
    groups->push_back(report.rows.size());
    run_ladder_step(p, o, &report);
  }
  return report;
}

// ---- output -----------------------------------------------------------------------------

std::string printf_string(const char* fmt, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

std::string format_ms(double ms) {
  return printf_string(ms >= 1000 ? "%.0f" : ms >= 100 ? "%.1f" : ms >= 10 ? "%.2f" : "%.3f", ms);
}

// Three significant digits, without exponents: CPU rates read 0.0412, GPU rates 312.
std::string format_rate(double t) {
  return printf_string(t >= 100 ? "%.0f" : t >= 10 ? "%.1f" : t >= 1 ? "%.2f" : t >= 0.1 ? "%.3f" : "%.4f", t);
}

std::string format_err(double e) { return std::isnan(e) ? "-" : printf_string("%.1e", e); }
std::string format_ratio(double r) {
  return std::isnan(r) ? "-" : printf_string(r >= 10 ? "%.1fx" : "%.2fx", r);
}

std::string check_cell(const Row& r) {
  switch (r.status) {
    case RowStatus::kOk: return "ok";
    case RowStatus::kFail: return "FAIL";
    default: return "-";
  }
}

// A plain-text table: columns padded to their widest cell, numbers right-aligned. A row
// of a kernel that did not run shows its leading cells (kernel, shape, mask), then why.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right)
      : header_(std::move(header)), right_(std::move(right)) {}
  void add(std::vector<std::string> cells) { rows_.push_back({std::move(cells), ""}); }
  void add_reason(std::vector<std::string> lead, std::string reason) {
    rows_.push_back({std::move(lead), std::move(reason)});
  }
  void add_gap() { rows_.push_back({{}, ""}); }

  void print(FILE* out) const {
    std::vector<size_t> width(header_.size());
    for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
    for (const Line& l : rows_)
      for (size_t c = 0; c < l.cells.size() && c < width.size(); ++c)
        width[c] = std::max(width[c], l.cells[c].size());
    print_line(out, {header_, ""}, width);
    for (const Line& l : rows_) print_line(out, l, width);
  }

 private:
  struct Line {
    std::vector<std::string> cells;
    std::string reason;
  };

  void print_line(FILE* out, const Line& l, const std::vector<size_t>& width) const {
    for (size_t c = 0; c < l.cells.size(); ++c) {
      const bool last = c + 1 == header_.size() && l.reason.empty();
      const int w = right_[c] || !last ? int(width[c]) : 0;  // no trailing blanks
      std::fprintf(out, "%s", c == 0 ? "" : "  ");
      std::fprintf(out, right_[c] ? "%*s" : "%-*s", w, l.cells[c].c_str());
    }
    if (!l.reason.empty()) std::fprintf(out, "  %s", l.reason.c_str());
    std::fputc('\n', out);
  }

  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<Line> rows_;
};

Table make_table(bool backward, bool ladder) {
  std::vector<std::string> h = {"kernel", "shape", "mask", "time ms", "runs", "TFLOP/s", "extra mem"};
  if (backward)
    h.insert(h.end(), {"err dq", "err dk", "err dv"});
  else
    h.insert(h.end(), {"err out", "err lse"});
  h.push_back("vs base");
  if (ladder) h.push_back("vs prev");
  h.push_back("check");
  std::vector<bool> right(h.size(), true);
  right[0] = right[1] = right[2] = false;
  right.back() = false;
  return Table(std::move(h), std::move(right));
}

std::vector<std::string> row_cells(const Row& r, bool ladder) {
  std::vector<std::string> c = {r.kernel, flashlab::bench::shape_string(r.problem),
                                flashlab::bench::mask_string(r.problem), format_ms(r.time_ms),
                                std::to_string(r.timed_runs), format_rate(r.tflops),
                                flashlab::bench::format_bytes(r.workspace_bytes)};
  if (r.problem.backward)
    c.insert(c.end(), {format_err(r.err_dq), format_err(r.err_dk), format_err(r.err_dv)});
  else
    c.insert(c.end(), {format_err(r.err_out), format_err(r.err_lse)});
  c.push_back(format_ratio(r.vs_base));
  if (ladder) c.push_back(format_ratio(r.vs_prev));
  c.push_back(check_cell(r));
  return c;
}

void print_table(const Report& report, const std::vector<size_t>& groups, bool ladder) {
  const bool backward = !report.rows.empty() && report.rows.front().problem.backward;
  Table t = make_table(backward, ladder);
  for (size_t i = 0; i < report.rows.size(); ++i) {
    if (i > 0 && std::find(groups.begin(), groups.end(), i) != groups.end()) t.add_gap();
    const Row& r = report.rows[i];
    if (r.timed()) {
      t.add(row_cells(r, ladder));
      continue;
    }
    std::vector<std::string> lead = {r.kernel, flashlab::bench::shape_string(r.problem),
                                     flashlab::bench::mask_string(r.problem)};
    t.add_reason(std::move(lead), std::string(flashlab::bench::to_string(r.status)) + ": " + r.reason);
  }
  t.print(stdout);
  std::printf("\n");
  for (const Row& r : report.rows)
    if (r.status == RowStatus::kFail)
      std::printf("FAIL %s (%s, %s): %s\n", r.kernel.c_str(), flashlab::bench::shape_string(r.problem).c_str(),
                  flashlab::bench::mask_string(r.problem).c_str(), r.reason.c_str());
  std::printf("device: %s\n", report.device.c_str());
  std::printf("check:  %s\n", report.checked.c_str());
  std::printf("timing: %s\n", report.timing.c_str());
  std::printf("inputs: %s\n", report.inputs.c_str());
  std::printf("extra mem = workspace_size(): FlashLab never allocates; the caller provides it\n");
}

// Machine-readable fields of a row, in output order: (name, JSON value, CSV value).
struct Field {
  std::string name, json, csv;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += printf_string("\\u%04x", double(static_cast<unsigned char>(ch)));
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string csv_string(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

Field text_field(const std::string& name, const std::string& v) { return {name, json_string(v), csv_string(v)}; }
Field number_field(const std::string& name, double v) {
  if (!std::isfinite(v)) return {name, "null", ""};
  const std::string s = printf_string("%.9g", v);
  return {name, s, s};
}
Field bool_field(const std::string& name, bool v) {
  return {name, v ? "true" : "false", v ? "true" : "false"};
}

std::vector<Field> row_fields(const Row& r) {
  const Problem& p = r.problem;
  return {text_field("kernel", r.kernel),
          text_field("status", flashlab::bench::to_string(r.status)),
          text_field("reason", r.reason),
          text_field("device", flashlab::to_string(p.device)),
          text_field("pass", p.backward ? "backward" : "forward"),
          number_field("batch", p.batch), number_field("heads_q", p.heads_q),
          number_field("heads_kv", p.heads_kv), number_field("seqlen_q", p.seqlen_q),
          number_field("seqlen_k", p.seqlen_k), number_field("head_dim", p.head_dim),
          number_field("head_dim_v", p.head_dim_v), text_field("dtype", flashlab::to_string(p.dtype)),
          text_field("mask", flashlab::bench::mask_string(p)), bool_field("causal", p.causal),
          number_field("window_left", p.window_left), number_field("window_right", p.window_right),
          number_field("softcap", p.softcap), number_field("time_ms", r.time_ms),
          number_field("warmup_runs", r.warmup_runs), number_field("timed_runs", r.timed_runs),
          number_field("flops", r.flops), number_field("tflops", r.tflops),
          number_field("workspace_bytes", double(r.workspace_bytes)),
          number_field("err_out", r.err_out), number_field("err_lse", r.err_lse),
          number_field("err_dq", r.err_dq), number_field("err_dk", r.err_dk),
          number_field("err_dv", r.err_dv), number_field("vs_base", r.vs_base),
          number_field("vs_prev", r.vs_prev)};
}

void print_json(const Report& report) {
  std::printf("{\n  \"device\": %s,\n  \"check\": %s,\n  \"timing\": %s,\n  \"inputs\": %s,\n  \"rows\": [",
              json_string(report.device).c_str(), json_string(report.checked).c_str(),
              json_string(report.timing).c_str(), json_string(report.inputs).c_str());
  for (size_t i = 0; i < report.rows.size(); ++i) {
    std::printf("%s\n    {", i ? "," : "");
    const std::vector<Field> fields = row_fields(report.rows[i]);
    for (size_t j = 0; j < fields.size(); ++j)
      std::printf("%s\"%s\": %s", j ? ", " : "", fields[j].name.c_str(), fields[j].json.c_str());
    std::printf("}");
  }
  std::printf("\n  ]\n}\n");
}

void print_csv(const Report& report) {
  const std::vector<Field> header = row_fields(Row{});
  for (size_t j = 0; j < header.size(); ++j) std::printf("%s%s", j ? "," : "", header[j].name.c_str());
  std::printf("\n");
  for (const Row& r : report.rows) {
    const std::vector<Field> fields = row_fields(r);
    for (size_t j = 0; j < fields.size(); ++j) std::printf("%s%s", j ? "," : "", fields[j].csv.c_str());
    std::printf("\n");
  }
}

int exit_code_of(const Report& report) {
  bool fail = false;
  for (const Row& r : report.rows) {
    if (r.status == RowStatus::kError) return kExitError;
    fail |= r.status == RowStatus::kFail;
  }
  return fail ? kExitCheckFail : kExitOk;
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
  if (f.ladder)
    report = run_ladder(p, o, &groups);
  else
    run_or_throw(p, o, &report);
  const Format format = f.format.value_or(Format::kTable);
  if (format == Format::kJson)
    print_json(report);
  else if (format == Format::kCsv)
    print_csv(report);
  else
    print_table(report, groups, f.ladder);
  return exit_code_of(report);
}

int cmd_list(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kListHelp, stdout);
      return kExitOk;
    }
    throw UsageError{"flashlab list takes no arguments, got '" + a + "'"};
  }
  Table t({"kernel", "arch", "fwd", "bwd", "summary"}, {false, false, false, false, false});
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
