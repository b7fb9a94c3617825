// The one timing method (bench.h): every time that `flashlab bench` and
// `python -m flashlab.bench` print comes from here.
//
//   CPU   std::chrono::steady_clock around each call.
//   CUDA  a cudaEvent pair around each call on the harness's stream, queued back to back
//         so that the GPU never waits for the host between calls; host overhead between
//         calls is not counted.
// Calls rotate among the input sets, so that no timed call finds its inputs left in L2 by
// the call before, as no real caller would.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "flashlab/bench.h"

namespace flashlab::bench {

class Timer {
 public:
  Timer(Device device, void* stream, int sets, Progress* progress)
      : device_(device), stream_(stream), sets_(sets < 1 ? 1 : sets), progress_(progress) {}

  // One call on input set `set`, timed alone (the checked call).
  Status once(const Launch& run, int set, const std::string& label, double* ms);

  // What one call of an entry costs, from its checked call of `first_ms`: that call, or
  // when it may have carried one-time work (longer than budget / kProbeShare, shorter than
  // kSelfTimedMs) one more call, timed.
  Status call_cost(const Launch& run, double first_ms, const TimingOptions& o,
                   const std::string& label, double* call_ms);

  // Times the entries whose launch is set and fills their rows (time, runs, per-round
  // medians, TFLOP/s). With o.rounds > 1 each round times every entry once, the order
  // rotated round by round, each with budget / rounds; an entry's time is the median of
  // its rounds' medians. An entry whose call fails gets an error row and leaves the turns.
  void time_entries(std::span<Entry* const> entries, const TimingOptions& o);

 private:
  Status warm_up(const Launch& run, int count, double min_ms, const std::string& label);
  Status timed(const Launch& run, int count, const std::string& label, std::vector<double>* ms);
  Status timed_queued(const Launch& run, int count, std::vector<double>* ms);
  Status wait_idle();
  int next_set() {
    const int s = next_;
    next_ = (next_ + 1) % sets_;
    return s;
  }

  Device device_;
  void* stream_;
  int sets_;
  Progress* progress_;
  int next_ = 0;
  bool slow_ = false;  // calls are long: wait for each one, so its progress line is true
};

}  // namespace flashlab::bench
