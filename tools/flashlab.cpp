// flashlab — FlashLab's command-line tool.
//
//   flashlab bench [flags]   time kernels on one problem, each checked first against the
//                            fp64 reference; a table, or --json / --csv rows
//   flashlab bench --ladder  every GPU rung in ladder order, non-causal then causal
//   flashlab bench --decode  the KV-cache call at one or more cache lengths (GB/s)
//   flashlab list            the kernel registry
//
// This file is the command line: flags and defaults (the help texts are help.h). The
// measuring is the harness of include/flashlab/bench.h (src/bench/), the output formats
// are output.{h,cpp}. Only the public headers are used.
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
#include "help.h"
#include "output.h"

namespace {

using flashlab::DType;
using flashlab::Device;
using flashlab::bench::Problem;
using flashlab::bench::Report;
using flashlab::cli::kExitError;
using flashlab::cli::kExitOk;
using flashlab::cli::kBenchHelp;
using flashlab::cli::kExitUsage;
using flashlab::cli::kListHelp;
using flashlab::cli::kMainHelp;

// Default problems and run counts, by device.
constexpr Problem kCpuDefault = {.batch = 1, .heads_q = 8, .heads_kv = 8, .seqlen_q = 4096,
                                 .seqlen_k = 4096, .head_dim = 128, .head_dim_v = 128,
                                 .dtype = DType::kF32, .device = Device::kCPU};
constexpr Problem kCudaDefault = {.batch = 4, .heads_q = 16, .heads_kv = 16, .seqlen_q = 4096,
                                  .seqlen_k = 4096, .head_dim = 128, .head_dim_v = 128,
                                  .dtype = DType::kBF16, .device = Device::kCUDA};
// --decode: one query row against a full cache, GQA; the CPU default runs in seconds.
constexpr Problem kCpuDecode = {.batch = 2, .heads_q = 8, .heads_kv = 2, .seqlen_q = 1,
                                .seqlen_k = 4096, .head_dim = 128, .head_dim_v = 128,
                                .dtype = DType::kF32, .device = Device::kCPU, .decode = true};
constexpr Problem kCudaDecode = {.batch = 1, .heads_q = 32, .heads_kv = 8, .seqlen_q = 1,
                                 .seqlen_k = 4096, .head_dim = 128, .head_dim_v = 128,
                                 .dtype = DType::kBF16, .device = Device::kCUDA, .decode = true};
constexpr int kCudaDecodeSeqlens[] = {4096, 16384, 65536};
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
  bool decode = false;
  std::vector<int> seqlens;  // --decode: cache lengths
  int page_size = 0, append = 0, num_splits = 0;
  bool rotary = false;
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

void parse_seqlens(BenchFlags& f, const std::string& flag, const std::string& text) {
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    f.seqlens.push_back(parse_int(flag, text.substr(start, comma - start), 1));
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
    {"--decode", false, [](BenchFlags& f, const std::string&, const std::string&) { f.decode = true; }},
    {"--seqlens", true, [](BenchFlags& f, const std::string& n, const std::string& v) { parse_seqlens(f, n, v); }},
    {"--page-size", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.page_size = parse_int(n, v, 0); }},
    {"--append", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.append = parse_int(n, v, 0); }},
    {"--num-splits", true, [](BenchFlags& f, const std::string& n, const std::string& v) { f.num_splits = parse_int(n, v, 0); }},
    {"--rotary", false, [](BenchFlags& f, const std::string&, const std::string&) { f.rotary = true; }},
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
  const bool cpu = device == Device::kCPU;
  Problem p = f.decode ? (cpu ? kCpuDecode : kCudaDecode) : (cpu ? kCpuDefault : kCudaDefault);
  p.batch = f.batch.value_or(p.batch);
  p.heads_q = f.heads.value_or(p.heads_q);
  p.heads_kv = f.heads_kv.value_or(f.heads || !f.decode ? p.heads_q : p.heads_kv);
  p.seqlen_q = f.seqlen.value_or(p.seqlen_q);
  p.seqlen_k = f.seqlen_k.value_or(f.decode ? p.seqlen_k : p.seqlen_q);
  p.page_size = f.page_size;
  p.seqlen_new = f.append;
  p.rotary = f.rotary;
  p.num_splits = f.num_splits;
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

// The problem at each cache length of --seqlens (--decode; CUDA's default: three), else
// the one problem.
std::vector<Problem> make_problems(const BenchFlags& f, Device device) {
  const Problem p = make_problem(f, device);
  std::vector<int> lengths = f.seqlens;
  if (lengths.empty() && f.decode && device == Device::kCUDA && !f.seqlen_k)
    lengths.assign(std::begin(kCudaDecodeSeqlens), std::end(kCudaDecodeSeqlens));
  if (lengths.empty()) return {p};
  std::vector<Problem> ps;
  for (int len : lengths) {
    ps.push_back(p);
    ps.back().seqlen_k = len;
  }
  return ps;
}

// The named kernels, else every kernel of the device that has the pass being timed (a
// named kernel without it gets a row saying so). The CPU's KV-cache call composes
// forward() per sequence, so its kernels are those with a forward.
std::vector<std::string> kernels_for(const BenchFlags& f, Device device) {
  if (!f.kernels.empty()) return f.kernels;
  std::vector<std::string> names;
  const bool cpu = device == Device::kCPU;
  for (const flashlab::KernelInfo& k : flashlab::kernels())
    if (is_cpu_kernel(k) == cpu &&
        (f.backward ? k.has_backward : f.decode && !cpu ? k.has_kvcache : k.has_forward))
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

// --seqlens, --page-size, --append, --num-splits and --rotary belong to --decode, which has no
// backward or ladder; --rotary turns the appended keys, so it needs --append.
void check_decode_flags(const BenchFlags& f) {
  if (!f.decode) {
    const char* flag = !f.seqlens.empty() ? "--seqlens"
                       : f.page_size      ? "--page-size"
                       : f.append         ? "--append"
                       : f.num_splits     ? "--num-splits"
                       : f.rotary         ? "--rotary"
                                          : nullptr;
    if (flag) throw UsageError{std::string(flag) + " belongs to --decode (the KV-cache call)"};
    return;
  }
  if (f.backward || f.ladder) throw UsageError{"--decode times the KV-cache forward: drop --backward and --ladder"};
  if (!f.seqlens.empty() && f.seqlen_k) throw UsageError{"--seqlen-k and --seqlens: give one"};
  if (f.rotary && f.append == 0) throw UsageError{"--rotary turns the appended keys: give --append N (N >= 1)"};
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
  check_decode_flags(f);
  check_kernel_names(f.kernels);
  std::string note;
  const Device device = resolve_device(f, &note);
  const std::vector<Problem> ps = make_problems(f, device);
  const flashlab::bench::Options o = make_options(f, device);
  if (!note.empty()) std::fprintf(stderr, "flashlab: %s\n", note.c_str());
  std::vector<size_t> groups;
  Report report;
  if (f.ladder)
    throw_if_error(flashlab::bench::run_ladder(ps.front(), o, &report, &groups));
  else
    throw_if_error(flashlab::bench::run_problems(ps, o, &report, &groups));
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
