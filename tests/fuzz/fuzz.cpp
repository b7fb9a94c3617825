// flashlab_fuzz — random valid and invalid calls against the public C++ API, each judged
// against the fp64 oracle (cpu_reference on fp64 copies, through the same API).
//
// It proves, call by call, that nothing the API accepts crashes, reads out of bounds or
// lies: invalid calls (a broken rule, an overlap of an output with an input or with itself,
// sizes and strides past int64) must get a non-ok Status; valid calls (every registered
// kernel, fp32/fp16/bf16/fp64, padded/permuted/broadcast strides, GQA/MQA, varlen with
// empty sequences, causal and windows of any size, softcap, dropout, NaN and Inf in q/k/v)
// get ok or kUnsupported with a reason, and when ok every output element is written and
// within docs/DESIGN.md's rule; the extreme ones (huge max_seqlen, num_threads,
// softmax_scale) may be refused but never accepted and wrong. execute.h lists the checks.
// Every run starts with the regression corpus (corpus.cpp), then random calls, each a pure
// function of (seed, iteration).
//
//   flashlab_fuzz [--seed S] [--seconds T | --iterations N] [--device cpu|cuda]
//                 [--iteration I] [--corpus N] [--no-corpus] [--verbose]
//
// --iteration I replays one random call, --corpus N one corpus case; --verbose prints each
// call before it runs (to tie a compute-sanitizer report to its call). Crashes and sanitizer
// reports end the process: its last words name the call. Exit status 1 on any failure, 77
// when --device cuda finds no device (or the build has no CUDA kernels).
//
// With --device cuda every tensor, cu_seqlens and workspace is its own exact-size cudaMalloc,
// so compute-sanitizer --tool memcheck sees any read past a view.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <unistd.h>

#include "corpus.h"
#include "execute.h"
#include "generate.h"

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

namespace flashlab::fuzz {
namespace {

struct Options {
  uint64_t seed = 0;
  double seconds = 10;
  int64_t iterations = -1;
  Device device = Device::kCPU;
  int64_t only_iteration = -1;
  int corpus_case = -1;
  bool corpus = true;
  bool verbose = false;
};

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--seed S] [--seconds T | --iterations N] [--device cpu|cuda]\n"
               "          [--iteration I] [--corpus N] [--no-corpus] [--verbose]\n",
               argv0);
  return 2;
}

// The call in flight, for the last words of a crash.
char g_now[8192];
void set_now(const std::string& s) { std::snprintf(g_now, sizeof g_now, "%s\n", s.c_str()); }
void last_words() {
  const char head[] = "\nfuzz: the process died during this call:\n  ";
  [[maybe_unused]] ssize_t n = write(2, head, sizeof head - 1);
  n = write(2, g_now, std::strlen(g_now));
}
void on_signal(int sig) {
  last_words();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct Tally {
  int64_t calls = 0, valid = 0, invalid = 0, passed = 0, out_of_reach = 0, unsupported = 0,
          refused = 0, not_run = 0;
  std::map<std::string, int64_t> failed;  // by class
  int64_t failures = 0;
  int printed = 0;
  struct Seen {
    int64_t count = 0;
    std::string first;  // label of the first call
  };
  std::map<std::string, Seen> by_kind;  // "class / kind"

  void note(const std::string& key, const std::string& label) {
    Seen& s = by_kind[key];
    if (s.count++ == 0) s.first = label;
  }

  int64_t count(const char* cls) const {
    auto it = failed.find(cls);
    return it == failed.end() ? 0 : it->second;
  }
  void add(const Call& c, const Outcome& o, const std::string& label, const std::string& replay) {
    ++calls;
    (c.expect == Expect::kValid ? valid : invalid)++;
    switch (o.kind) {
      case Outcome::kPassed: ++passed; return;
      case Outcome::kOutOfReach:
        ++out_of_reach;
        note(std::string("rule out of reach / ") + c.kind, label);
        return;
      case Outcome::kUnsupported: ++unsupported; return;
      case Outcome::kRefused: ++refused; return;
      case Outcome::kNotRun: ++not_run; return;
      case Outcome::kFailed: break;
    }
    ++failed[o.failure];
    ++failures;
    const std::string key = std::string(o.failure) + " / " + c.kind;
    note(key, label);
    if (by_kind[key].count > 2 || printed++ >= 60) return;  // the first two of each kind
    std::cout << "FAIL [" << o.failure << "] " << label << ": " << o.message
              << "\n  call: " << c.describe() << "\n  replay: " << replay << std::endl;
  }
};

// The exit status of --device cuda where no device is visible (CTest's skip code).
constexpr int kNoDevice = 77;

Env make_env(Device device, std::string* err) {
  Env env;
  env.device = device;
  for (const KernelInfo& k : kernels())
    if ((k.arch == "cpu") == (device == Device::kCPU)) env.kernels.push_back(k);
  if (device == Device::kCUDA) {
#if FLASHLAB_WITH_CUDA
    if (!cuda_available()) *err = "--device cuda: no CUDA device is visible";
    cudaStream_t s = nullptr;
    if (err->empty() && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
      *err = "cudaStreamCreate failed";
    cudaGetDevice(&env.device_index);
    env.stream = s;
#else
    *err = "--device cuda: this build has no CUDA kernels (FLASHLAB_CUDA=OFF)";
#endif
  }
  return env;
}

int run(const Options& o, const std::string& argv0) {
  std::string err;
  const Env env = make_env(o.device, &err);
  if (!err.empty()) {
    std::cerr << err << std::endl;
    return o.device == Device::kCUDA ? kNoDevice : 2;
  }
  if (__sanitizer_set_death_callback) {
    __sanitizer_set_death_callback(last_words);
  } else {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_signal);
  }
  const std::string dev = o.device == Device::kCUDA ? " --device cuda" : "";
  std::cout << "fuzz: device " << to_string(o.device) << ", kernels:";
  for (const KernelInfo& k : env.kernels) std::cout << " " << k.name;
  std::cout << "; replay with --seed " << o.seed << dev << std::endl;

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  Tally tally;
  auto one = [&](const Call& c, const std::string& label, const std::string& replay) {
    set_now(label + ": " + c.describe());
    if (o.verbose) std::cout << "call " << label << ": " << c.describe() << std::endl;
    const Outcome out = execute(c, env);
    tally.add(c, out, label, replay);
    return out;
  };

  if (o.corpus && o.only_iteration < 0) {
    int64_t before = tally.failures, n = 0;
    for (const CorpusCase& cc : corpus(env)) {
      if (o.corpus_case >= 0 && cc.number != o.corpus_case) continue;
      ++n;
      one(cc.call, "corpus case " + std::to_string(cc.number) + " (" + cc.what + ")",
          argv0 + " --corpus " + std::to_string(cc.number) + dev);
    }
    std::cout << "regression corpus: " << n << " calls, " << tally.failures - before << " failed"
              << std::endl;
  }
  int64_t iterations = 0;
  if (o.corpus_case < 0) {
    for (int64_t it = o.only_iteration >= 0 ? o.only_iteration : 0;; ++it) {
      if (o.only_iteration >= 0 ? it > o.only_iteration
                                : (o.iterations >= 0 ? it >= o.iterations : elapsed() >= o.seconds))
        break;
      std::mt19937_64 rng = rng_for(o.seed, uint64_t(it));
      const Call c = random_call(rng, env);
      const Outcome out = one(
          c, "seed " + std::to_string(o.seed) + " iteration " + std::to_string(it),
          argv0 + " --seed " + std::to_string(o.seed) + " --iteration " + std::to_string(it) + dev);
      ++iterations;
      if (out.kind == Outcome::kFailed && out.failure == std::string(kCudaError)) {
        std::cout << "fuzz: stopping after a CUDA error (the context may be lost)" << std::endl;
        break;
      }
    }
  }

  const int64_t wrong = tally.count(kWrongResult);
  if (!tally.by_kind.empty()) std::cout << "by class and call kind:" << std::endl;
  for (const auto& [key, seen] : tally.by_kind)
    std::cout << "  " << key << ": " << seen.count << " (first: " << seen.first << ")" << std::endl;
  std::cout << "fuzz: seed " << o.seed << " iterations " << iterations << " seconds "
            << int(elapsed() + 0.5) << "\n"
            << "calls made: " << tally.calls << "  (valid " << tally.valid << ", invalid "
            << tally.invalid << ")\n"
            << "crashes: 0   sanitizer reports: 0   invalid calls accepted: "
            << tally.count(kInvalidAccepted) << "   valid calls with wrong results: " << wrong
            << "\n"
            << "valid calls refused: " << tally.count(kValidRefused)
            << "   status disagreements: " << tally.count(kDisagreement)
            << "   CUDA errors: " << tally.count(kCudaError)
            << "   oracle failures: " << tally.count(kOracleFailure) << "\n"
            << "outcomes: " << tally.passed << " checked, " << tally.out_of_reach
            << " checked within 2x FlashAttention-2's rounding only, " << tally.unsupported
            << " unsupported, " << tally.refused << " refused, " << tally.not_run
            << " accepted but not run (workspace over 1 GiB)" << std::endl;
  return tally.failures ? 1 : 0;
}

}  // namespace
}  // namespace flashlab::fuzz

int main(int argc, char** argv) {
  using flashlab::fuzz::Options;
  Options o;
  bool seed_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--seed" && has_value)
      o.seed = std::strtoull(argv[++i], nullptr, 0), seed_given = true;
    else if (a == "--seconds" && has_value)
      o.seconds = std::atof(argv[++i]);
    else if (a == "--iterations" && has_value)
      o.iterations = std::atoll(argv[++i]);
    else if (a == "--iteration" && has_value)
      o.only_iteration = std::atoll(argv[++i]);
    else if (a == "--corpus" && has_value)
      o.corpus_case = std::atoi(argv[++i]);
    else if (a == "--no-corpus")
      o.corpus = false;
    else if (a == "--verbose")
      o.verbose = true;
    else if (a == "--device" && has_value) {
      const std::string d = argv[++i];
      if (d != "cpu" && d != "cuda") return flashlab::fuzz::usage(argv[0]);
      o.device = d == "cuda" ? flashlab::Device::kCUDA : flashlab::Device::kCPU;
    } else {
      return flashlab::fuzz::usage(argv[0]);
    }
  }
  if (!seed_given) {
    std::random_device rd;
    o.seed = (uint64_t(rd()) << 32 | rd()) % 1000000000;
  }
  return flashlab::fuzz::run(o, argv[0]);
}
