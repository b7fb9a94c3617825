// The timing method of timer.h: the run plan, warm-up (a count and a minimum duration),
// timed calls, medians, alternating rounds.
#include "bench/timer.h"

#include <algorithm>
#include <chrono>

#include "bench/memory.h"

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/check.cuh"
#endif

namespace flashlab::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Calls this long show a progress line each and, on the GPU, are waited for one by one.
constexpr double kSlowCallMs = 3'000;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string run_label(const std::string& label, const char* kind, int i, int n) {
  return label + ": " + kind + " " + std::to_string(i + 1) + "/" + std::to_string(n);
}

// Scoped progress: begin on construction, end on destruction (every return path).
class ProgressScope {
 public:
  ProgressScope(Progress* line, std::string what) : line_(line) {
    if (line_) line_->begin(std::move(what));
  }
  ~ProgressScope() {
    if (line_) line_->end();
  }
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  Progress* line_;
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
  Status elapsed_ms(size_t start, size_t stop, double* ms) const {
    float f = 0.f;
    FL_CUDA_CHECK(cudaEventElapsedTime(&f, events_[start], events_[stop]));
    *ms = f;
    return {};
  }

 private:
  std::vector<cudaEvent_t> events_;
};
#endif

}  // namespace

RunPlan plan_runs(double call_ms, const TimingOptions& o) {
  const int iters = std::max(o.iters, 1);
  const double budget = o.budget_ms / std::max(o.rounds, 1);
  if (!(call_ms < budget)) return {0, 1};
  const int fit = int(call_ms > 0 ? std::min(budget / call_ms, 1e9) : 1e9);
  return {std::min(std::max(o.warmup, 0), fit / 4),
          std::clamp(fit, std::min(iters, kMinTimedRuns), iters)};
}

double median(std::vector<double> xs) {
  if (xs.empty()) return kNaN;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

Status Timer::wait_idle() { return synchronize(device_, stream_); }

Status Timer::once(const Launch& run, int set, const std::string& label, double* ms) {
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
    return ev.elapsed_ms(0, 1, ms);
  }
#endif
  const auto t0 = Clock::now();
  if (Status s = run(set); !s.ok()) return s;
  *ms = ms_since(t0);
  return {};
}

Status Timer::call_cost(const Launch& run, double first_ms, const TimingOptions& o,
                        const std::string& label, double* call_ms) {
  *call_ms = first_ms;
  if (first_ms >= kSelfTimedMs || first_ms <= o.budget_ms / kProbeShare) return {};
  return once(run, next_set(), label + ": probe", call_ms);
}

Status Timer::warm_up(const Launch& run, int count, double min_ms, const std::string& label) {
  const auto t0 = Clock::now();
  for (int i = 0; i < count || (count > 0 && ms_since(t0) < min_ms); ++i) {
    ProgressScope scope(slow_ ? progress_ : nullptr, run_label(label, "warm-up", i, count));
    if (Status s = run(next_set()); !s.ok()) return s;
    // Past the count, the GPU's progress is what the minimum duration measures.
    if (slow_ || i + 1 >= count) {
      if (Status s = wait_idle(); !s.ok()) return s;
    }
  }
  return wait_idle();
}

Status Timer::timed_queued(const Launch& run, int count, std::vector<double>* ms) {
#if FLASHLAB_WITH_CUDA
  auto stream = static_cast<cudaStream_t>(stream_);
  Events ev;
  if (Status s = ev.create(2 * count); !s.ok()) return s;
  for (int i = 0; i < count; ++i) {
    FL_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
    if (Status s = run(next_set()); !s.ok()) return s;
    FL_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
  }
  FL_CUDA_CHECK(cudaEventSynchronize(ev[2 * count - 1]));
  for (int i = 0; i < count; ++i) {
    double t = 0;
    if (Status s = ev.elapsed_ms(2 * i, 2 * i + 1, &t); !s.ok()) return s;
    ms->push_back(t);
  }
  return {};
#else
  (void)run, (void)count, (void)ms;
  return {StatusCode::kCudaError, "this build of flashlab has no CUDA"};
#endif
}

Status Timer::timed(const Launch& run, int count, const std::string& label, std::vector<double>* ms) {
  if (device_ == Device::kCUDA && !slow_) return timed_queued(run, count, ms);
  for (int i = 0; i < count; ++i) {
    double t = 0;
    if (Status s = once(run, next_set(), run_label(label, "run", i, count), &t); !s.ok()) return s;
    ms->push_back(t);
  }
  return {};
}

void Timer::time_entries(std::span<Entry* const> entries, const TimingOptions& o) {
  std::vector<Entry*> live;
  for (Entry* e : entries) {
    if (!e->launch) continue;
    if (e->first_ms >= kSelfTimedMs) {  // its checked call is its one sample
      e->row.round_ms = {e->first_ms};
      e->row.timed_runs = 1;
      continue;
    }
    live.push_back(e);
  }
  const int rounds = std::max(o.rounds, 1);
  for (int r = 0; r < rounds && !live.empty(); ++r) {
    std::vector<Entry*> order(live.begin() + r % live.size(), live.end());
    order.insert(order.end(), live.begin(), live.begin() + r % live.size());
    for (Entry* e : order) {
      Row& row = e->row;
      const RunPlan plan = plan_runs(e->call_ms, o);
      slow_ = e->call_ms > kSlowCallMs;
      std::vector<double> samples;
      Status s = warm_up(e->launch, plan.warmup, o.warmup_ms, row.kernel);
      if (s.ok()) s = timed(e->launch, plan.timed, row.kernel, &samples);
      if (!s.ok()) {
        row.status = RowStatus::kError;
        row.reason = s.message();
        e->launch = nullptr;
        continue;
      }
      row.round_ms.push_back(median(samples));
      row.warmup_runs += plan.warmup;
      row.timed_runs += int(samples.size());
    }
    std::erase_if(live, [](Entry* e) { return !e->launch; });
  }
  for (Entry* e : entries) {
    Row& row = e->row;
    if (row.status == RowStatus::kError || row.round_ms.empty()) continue;
    row.time_ms = median(row.round_ms);
    row.tflops = row.flops / (row.time_ms * 1e-3) / 1e12;
  }
}

}  // namespace flashlab::bench
