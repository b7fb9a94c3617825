// The one timing method of FlashLab: every time that `flashlab bench` prints comes from
// here, and no kernel has a timer of its own.
//
//   CPU   std::chrono::steady_clock around each call.
//   CUDA  a cudaEvent pair around each call on the benchmark's stream, so host overhead
//         between calls is not counted. The harness hands the timer several input sets
//         whose total size exceeds 2x the L2 cache, and the runs rotate among them: no
//         timed run finds its inputs left in L2 by the run before, as no real caller would.
//
// Both: the first run (the checked run, or a probe under --no-check) is timed alone; it
// also warms caches, clocks and lazy module loading. Then come the warm-up runs and the
// timed runs, and the median of the timed runs is reported (robust to a stray slow run).
//
// Slow runs shrink the plan rather than the user's patience. The timed runs are as many
// as fit in kTimingBudgetMs, but at least kMinTimedRuns (or the requested count, if
// smaller). When the first run took more than kSlowRunMs, it counts as the warm-up and
// the floor is one timed run; when it took more than kVerySlowRunMs, it is the one timed
// run (a warm-up cannot change a run that long). Any run longer than kProgressDelay
// shows a progress line on stderr.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flashlab/flashlab.h"

namespace flashlab::bench {

inline constexpr double kTimingBudgetMs = 10'000;
inline constexpr int kMinTimedRuns = 5;
inline constexpr double kSlowRunMs = 2'000;
inline constexpr double kVerySlowRunMs = 10'000;
inline constexpr std::chrono::milliseconds kProgressDelay{3'000};

// One call of the kernel under test on input set `set` (0 <= set < the number of sets).
using RunOnce = std::function<Status(int set)>;

// How many runs follow the first one.
struct RunPlan {
  int warmup = 0;                // untimed runs
  int timed = 0;                 // timed runs, all in the median
  bool first_is_sample = false;  // the first run is the (only) sample
};

// The plan for a kernel whose first run took `first_ms`, given the requested counts.
RunPlan plan_runs(double first_ms, int warmup, int iters);

struct Timing {
  double median_ms = 0;
  int warmup_runs = 0;  // untimed runs after the first run
  int timed_runs = 0;
  std::vector<double> samples_ms;
};

// A progress line on stderr for a run that takes longer than kProgressDelay:
//   "  cpu_reference: run 1/1 (14.2 s)..."
// refreshed in place on a terminal, printed once (then every kQuietRepeat) otherwise,
// and closed with the run's total time when it ends. Disabled: does nothing.
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void begin(std::string what);
  void end();

 private:
  void watch();
  void show_locked(double seconds);

  bool enabled_;
  bool tty_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread watcher_;
  bool quit_ = false;
  bool active_ = false;
  bool shown_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point since_;
  std::chrono::steady_clock::time_point last_shown_;
};

// Times calls on one device. `stream` is the cudaStream_t the calls are issued on (CUDA).
class Timer {
 public:
  Timer(Device device, void* stream, ProgressLine* progress)
      : device_(device), stream_(stream), progress_(progress) {}

  // Times one call on input set `set` (the checked run, or the probe).
  Status once(const RunOnce& run, int set, const std::string& label, double* ms);

  // The runs after a first run of `first_ms`: warm-up, then timed runs rotating over
  // `sets` input sets (starting after set 0, which the first run used).
  Status measure(const RunOnce& run, int warmup, int iters, int sets, double first_ms,
                 const std::string& label, Timing* out);

 private:
  Status run_untimed(const RunOnce& run, int count, int sets, int* next_set,
                     const std::string& label);
  Status run_timed(const RunOnce& run, int count, int sets, int* next_set,
                   const std::string& label, std::vector<double>* ms);
  Status run_timed_cuda_queued(const RunOnce& run, int count, int sets, int* next_set,
                               std::vector<double>* ms);
  Status wait_idle();

  Device device_;
  void* stream_;
  ProgressLine* progress_;
  bool slow_ = false;  // runs are long: wait for each one, so its progress line is true
};

// Bytes of L2 cache of CUDA device `device` (0 without CUDA).
Status l2_cache_bytes(int device, size_t* bytes);

}  // namespace flashlab::bench
