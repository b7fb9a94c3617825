// The timing method described in timer.h: steady_clock on the CPU, cudaEvent pairs on
// the GPU, a first run that plans the rest, warm-up, median, and a progress line for
// long runs.
#include "timer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/check.cuh"
#endif

namespace flashlab::bench {
namespace {

using Clock = std::chrono::steady_clock;

// How often the progress watcher looks at the clock, and, when stderr is not a terminal
// (a log file), how often a still-running run is reported again.
constexpr std::chrono::milliseconds kProgressTick{250};
constexpr std::chrono::seconds kQuietRepeat{30};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_of(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

std::string run_label(const std::string& label, const char* kind, int i, int n) {
  return label + ": " + kind + " " + std::to_string(i + 1) + "/" + std::to_string(n);
}

// Scoped progress: begin on construction, end on destruction (every return path).
class ProgressScope {
 public:
  ProgressScope(ProgressLine* line, std::string what) : line_(line) {
    if (line_) line_->begin(std::move(what));
  }
  ~ProgressScope() {
    if (line_) line_->end();
  }
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  ProgressLine* line_;
};

#if FLASHLAB_WITH_CUDA
// Events destroyed with their owner, whatever path leaves the function.
class Events {
 public:
  ~Events() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Status create(int count) {
    for (int i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      FL_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return {};
  }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

Status elapsed_ms(cudaEvent_t start, cudaEvent_t stop, double* ms) {
  float f = 0.f;
  FL_CUDA_CHECK(cudaEventElapsedTime(&f, start, stop));
  *ms = f;
  return {};
}
#endif

}  // namespace

RunPlan plan_runs(double first_ms, int warmup, int iters) {
  iters = std::max(iters, 1);
  if (first_ms > kVerySlowRunMs) return {0, 0, true};
  const double fit = first_ms > 0 ? std::min(kTimingBudgetMs / first_ms, double(iters)) : iters;
  if (first_ms > kSlowRunMs) return {0, std::max(1, int(fit)), false};
  return {std::max(warmup, 0), std::max(std::min(iters, kMinTimedRuns), int(fit)), false};
}

// ---- progress line ----------------------------------------------------------------------

ProgressLine::ProgressLine(bool enabled)
    : enabled_(enabled), tty_(isatty(fileno(stderr)) != 0) {}

ProgressLine::~ProgressLine() {
  if (!watcher_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  watcher_.join();
}

void ProgressLine::begin(std::string what) {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  if (!watcher_.joinable()) watcher_ = std::thread([this] { watch(); });
  what_ = std::move(what);
  since_ = Clock::now();
  active_ = true;
  shown_ = false;
  wake_.notify_all();
}

void ProgressLine::end() {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  if (shown_) {
    if (tty_) std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "  %s: %.1f s\n", what_.c_str(), seconds_since(since_));
    std::fflush(stderr);
  }
  active_ = false;
  shown_ = false;
}

void ProgressLine::watch() {
  std::unique_lock lock(mutex_);
  while (!quit_) {
    wake_.wait_for(lock, kProgressTick);
    if (quit_ || !active_) continue;
    const auto now = Clock::now();
    if (now - since_ < kProgressDelay) continue;
    if (tty_ || !shown_ || now - last_shown_ >= kQuietRepeat) show_locked(seconds_since(since_));
  }
}

void ProgressLine::show_locked(double seconds) {
  if (tty_)
    std::fprintf(stderr, "\r\033[K  %s (%.1f s)...", what_.c_str(), seconds);
  else
    std::fprintf(stderr, "  %s (%.1f s)...\n", what_.c_str(), seconds);
  std::fflush(stderr);
  shown_ = true;
  last_shown_ = Clock::now();
}

// ---- timer ------------------------------------------------------------------------------

Status Timer::wait_idle() {
#if FLASHLAB_WITH_CUDA
  if (device_ == Device::kCUDA) FL_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
  return {};
}

Status Timer::once(const RunOnce& run, int set, const std::string& label, double* ms) {
  ProgressScope scope(progress_, label);
#if FLASHLAB_WITH_CUDA
  if (device_ == Device::kCUDA) {
    auto stream = static_cast<cudaStream_t>(stream_);
    Events ev;
    if (Status s = ev.create(2); !s.ok()) return s;
    FL_CUDA_CHECK(cudaEventRecord(ev[0], stream));
    if (Status s = run(set); !s.ok()) return s;
    FL_CUDA_CHECK(cudaEventRecord(ev[1], stream));
    FL_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    return elapsed_ms(ev[0], ev[1], ms);
  }
#endif
  const auto t0 = Clock::now();
  if (Status s = run(set); !s.ok()) return s;
  *ms = seconds_since(t0) * 1e3;
  return {};
}

Status Timer::run_untimed(const RunOnce& run, int count, int sets, int* next_set,
                          const std::string& label) {
  for (int i = 0; i < count; ++i) {
    ProgressScope scope(slow_ ? progress_ : nullptr, run_label(label, "warm-up", i, count));
    if (Status s = run(*next_set); !s.ok()) return s;
    *next_set = (*next_set + 1) % sets;
    if (slow_) {
      if (Status s = wait_idle(); !s.ok()) return s;
    }
  }
  return wait_idle();
}

#if FLASHLAB_WITH_CUDA
// Fast runs are queued back to back with an event pair each, so the GPU never waits for
// the host between them; one wait at the end.
Status Timer::run_timed_cuda_queued(const RunOnce& run, int count, int sets, int* next_set,
                                    std::vector<double>* ms) {
  auto stream = static_cast<cudaStream_t>(stream_);
  Events ev;
  if (Status s = ev.create(2 * count); !s.ok()) return s;
  for (int i = 0; i < count; ++i) {
    FL_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
    if (Status s = run(*next_set); !s.ok()) return s;
    FL_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
    *next_set = (*next_set + 1) % sets;
  }
  FL_CUDA_CHECK(cudaEventSynchronize(ev[2 * count - 1]));
  for (int i = 0; i < count; ++i) {
    double t = 0;
    if (Status s = elapsed_ms(ev[2 * i], ev[2 * i + 1], &t); !s.ok()) return s;
    ms->push_back(t);
  }
  return {};
}
#else
Status Timer::run_timed_cuda_queued(const RunOnce&, int, int, int*, std::vector<double>*) {
  return {StatusCode::kCudaError, "this build of flashlab has no CUDA"};
}
#endif

Status Timer::run_timed(const RunOnce& run, int count, int sets, int* next_set,
                        const std::string& label, std::vector<double>* ms) {
  if (device_ == Device::kCUDA && !slow_) return run_timed_cuda_queued(run, count, sets, next_set, ms);
  for (int i = 0; i < count; ++i) {
    double t = 0;
    if (Status s = once(run, *next_set, run_label(label, "run", i, count), &t); !s.ok()) return s;
    ms->push_back(t);
    *next_set = (*next_set + 1) % sets;
  }
  return {};
}

Status Timer::measure(const RunOnce& run, int warmup, int iters, int sets, double first_ms,
                      const std::string& label, Timing* out) {
  const RunPlan plan = plan_runs(first_ms, warmup, iters);
  *out = Timing{};
  if (plan.first_is_sample) {
    out->samples_ms = {first_ms};
  } else {
    slow_ = first_ms > double(kProgressDelay.count());
    sets = std::max(sets, 1);
    int next_set = 1 % sets;
    if (Status s = run_untimed(run, plan.warmup, sets, &next_set, label); !s.ok()) return s;
    if (Status s = run_timed(run, plan.timed, sets, &next_set, label, &out->samples_ms); !s.ok())
      return s;
    out->warmup_runs = plan.warmup;
  }
  out->timed_runs = int(out->samples_ms.size());
  out->median_ms = median_of(out->samples_ms);
  return {};
}

Status l2_cache_bytes(int device, size_t* bytes) {
  *bytes = 0;
#if FLASHLAB_WITH_CUDA
  int l2 = 0;
  FL_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  *bytes = size_t(l2);
#else
  (void)device;
#endif
  return {};
}

}  // namespace flashlab::bench
